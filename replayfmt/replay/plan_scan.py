"""What the plan's pass over the operations keeps as it goes: where each region of starting
state begins, and the span of operations each event is used in (repeats of launches, copies and
memsets come folded by the reader, so a capture of 700k operations is checked in a few records)."""

from __future__ import annotations

from typing import Any

import numpy as np

from replayfmt.format import model as m
from replayfmt.reader import EventUses

EVENT_OPERATIONS = frozenset({m.EventRecord, m.StreamWaitEvent, m.EventSynchronize})


def track_event(spans: dict[int, list[Any]], op: m.EventRecord | m.StreamWaitEvent | m.EventSynchronize) -> None:
    """Extend the span of ``op``'s event: [first, last, first is a record] operation indices
    that use it (events first recorded whose spans do not overlap may share a CUDA event)."""
    span = spans.get(op.event)
    if span is None:
        spans[op.event] = [op.index, op.index, isinstance(op, m.EventRecord)]
    else:
        span[1] = op.index


def track_event_uses(spans: dict[int, list[Any]], uses: EventUses) -> None:
    """``track_event`` of each of a batch's uses of events, in bulk (they come in capture order)."""
    column, count = uses.events, len(uses)
    distinct, first = np.unique(column, return_index=True)
    last = count - 1 - np.unique(column[::-1], return_index=True)[1]
    recorded = uses.kinds[first] == int(m.OperationKind.EVENT_RECORD)
    events, ends = distinct.tolist(), uses.indices[last].tolist()
    seen = spans.keys() & events  # used in an earlier batch: only its span's end moves
    if seen:
        for event, end in zip(events, ends, strict=True):
            if event in seen:
                spans[event][1] = end
    fresh = zip(events, map(list, zip(uses.indices[first].tolist(), ends, recorded.tolist(), strict=True)), strict=True)
    if seen:
        fresh = ((event, span) for event, span in fresh if event not in seen)
    spans.update(fresh)  # one C call for the many events a batch makes and uses


class RegionTracker:
    """Where the region of each operation begins, for hoisting state (docs/FORMAT.md 4.2).

    A region is an outermost scope (it begins at its ScopeBegin) or a stretch of operations
    outside every scope (it begins at its first operation, just after the previous outermost
    scope ends, or at the capture's start). Feed operations in order to :meth:`step`: every
    scope marker and every operation whose region matters (a repeat folded away need not be)."""

    def __init__(self) -> None:
        self.depth = 0
        self.begin: int | None = None  # where the current region began

    def note(self, index: int) -> None:
        """Step past operation ``index``, known to be no scope marker, whose region does not matter."""
        if self.depth == 0 and self.begin is None:
            self.begin = index

    def step(self, op: m.Operation) -> int:
        """The index at which ``op``'s region begins."""
        if isinstance(op, m.ScopeBegin):
            if self.depth == 0:
                self.begin = op.index
            self.depth += 1
        elif self.depth == 0 and self.begin is None:
            self.begin = op.index  # a stretch outside every scope
        begin = self.begin if self.begin is not None else op.index
        if isinstance(op, m.ScopeEnd) and self.depth > 0:
            self.depth -= 1
            if self.depth == 0:
                self.begin = op.index + 1  # the next operation begins a new region (stepped or not)
        return begin
