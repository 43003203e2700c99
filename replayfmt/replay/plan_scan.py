"""What the plan's pass over the operations keeps as it goes: where each region of starting
state begins, and the span of operations each event is used in (repeats of launches, copies and
memsets come folded by the reader, so a capture of 700k operations is checked in a few records)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from replayfmt.format import model as m
from replayfmt.reader import EventUses

EVENT_OPERATIONS = frozenset({m.EventRecord, m.StreamWaitEvent, m.EventSynchronize})
_EVENT_RECORD = int(m.OperationKind.EVENT_RECORD)


class EventSpans(Mapping[int, list[Any]]):
    """The span of operations each event is used in, event id -> [first, last, first is a record]
    (the operation indices that record, wait on or synchronise with it; events first recorded
    whose spans do not overlap may share a CUDA event: replay.event_sharing).

    Uses are added in capture order, a batch's in bulk (:meth:`add_uses`) or one at a time
    (:meth:`add`), and kept as columns: a program may record a new event after every launch
    (Triton's persistent matmul: 226k), and the spans are worked out once, with numpy, when first
    asked for (:meth:`columns`, or as a mapping)."""

    def __init__(self) -> None:
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (events, indices, is a record)
        self._one_by_one: list[tuple[int, int, bool]] = []  # uses added one at a time, not yet a part
        self._columns: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    def add(self, op: m.EventRecord | m.StreamWaitEvent | m.EventSynchronize) -> None:
        """One use, after every use added before it."""
        self._one_by_one.append((op.event, op.index, type(op) is m.EventRecord))
        self._columns = None

    def add_uses(self, uses: EventUses) -> None:
        """A batch's uses, in bulk, after every use added before them."""
        self._seal()
        self._parts.append((uses.events, uses.indices, uses.kinds == _EVENT_RECORD))
        self._columns = None

    def _seal(self) -> None:
        if self._one_by_one:
            events, indices, records = zip(*self._one_by_one, strict=True)
            self._parts.append((np.array(events, np.int64), np.array(indices, np.int64), np.array(records, bool)))
            self._one_by_one = []

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(event ids, sorted; first use; last use; first use is a record), one row per event."""
        if self._columns is None:
            self._seal()
            if not self._parts:
                empty = np.zeros(0, np.int64)
                self._columns = (empty, empty, empty, np.zeros(0, bool))
            else:
                events, indices, records = (np.concatenate(c) for c in zip(*self._parts, strict=True))
                ids, first = np.unique(events, return_index=True)  # uses come in capture order
                last = len(events) - 1 - np.unique(events[::-1], return_index=True)[1]
                self._columns = (ids, indices[first], indices[last], records[first])
        return self._columns

    def _row(self, event: object) -> int | None:
        ids = self.columns()[0]
        if not isinstance(event, int | np.integer) or not len(ids):
            return None
        row = int(np.searchsorted(ids, event))  # ids are sorted
        return row if row < len(ids) and int(ids[row]) == event else None

    def __getitem__(self, event: int) -> list[Any]:
        row = self._row(event)
        if row is None:
            raise KeyError(event)
        _, first, last, recorded = self.columns()
        return [int(first[row]), int(last[row]), bool(recorded[row])]

    def __contains__(self, event: object) -> bool:
        return self._row(event) is not None

    def __iter__(self) -> Iterator[int]:
        return iter(self.columns()[0].tolist())

    def __len__(self) -> int:
        return len(self.columns()[0])


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
