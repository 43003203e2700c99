"""What a benchmark restores before each iteration: the bytes of each buffer the region starts
from, not whole buffers.

A buffer that no operation before the region writes holds, when the region begins, only what
state operations put there; every other byte is undefined (docs/FORMAT.md 4.2), so restoring the
state ranges is enough. That is what makes a framework arena benchmarkable: XLA's arena is tens
of gigabytes, of which a step's state is a few megabytes. A buffer that operations before the
region do touch (a launch, copy or memset: their writes are not known byte by byte) is restored
whole, as are all buffers of a capture replayed at fixed addresses (raw pointers reach anything).
What an operation touches is the one table's (:mod:`replayfmt.format.uses`), a launch's module
globals included: a kernel that bumps a counter in its module would otherwise start every
iteration from the one before's count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from replayfmt.format import model as m
from replayfmt.format.uses import ModuleGlobals as ModuleGlobals, uses  # callers import it from here too


@dataclass(frozen=True, slots=True)
class Span:
    """Bytes [offset, offset + size) of a buffer."""

    buffer: int
    offset: int
    size: int


def buffers_of(op: m.Operation) -> set[int]:
    """The buffers an operation's device work reads or writes, as it names them (0, the launch's
    own parameters, left out; a launch's module globals: :class:`ModuleGlobals`)."""
    return set(uses(op).buffers)


def restore_spans(
    buffers: Iterable[int],
    sizes: dict[int, int],
    before: Iterable[object],
    states: Iterable[m.State],
    touched_by: Callable[[object], set[int]] = buffers_of,
) -> list[Span]:
    """The spans to restore of ``buffers`` (``sizes``: each one's size): whole where an operation
    in ``before`` (those before the region) touches it other than to set state, else the
    ranges ``states`` (the capture's state operations: more than the region's restores more, never
    less) give it, joined where they meet or overlap. A buffer with neither needs nothing restored.
    ``touched_by(op)`` names an operation's buffers (a caller that knows the capture's graphs
    passes one that sees into graph launches)."""
    wanted = set(buffers)
    whole: set[int] = set()
    for op in before:
        if not isinstance(op, m.State):
            whole |= touched_by(op) & wanted
    ranges: dict[int, list[tuple[int, int]]] = {}
    for state in states:
        if state.buffer in wanted and state.buffer not in whole and state.size:
            ranges.setdefault(state.buffer, []).append((state.offset, state.offset + state.size))
    spans = [Span(b, 0, max(sizes[b], 1)) for b in sorted(whole)]
    for buffer in sorted(ranges):
        joined: list[list[int]] = []
        for start, stop in sorted(ranges[buffer]):
            if joined and start <= joined[-1][1]:
                joined[-1][1] = max(joined[-1][1], stop)
            else:
                joined.append([start, stop])
        spans += [Span(buffer, start, stop - start) for start, stop in joined]
    return spans
