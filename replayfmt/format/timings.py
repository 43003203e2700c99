"""The original program's device times: the TIMINGS chunk's model and its FlatBuffer, both ways.

The recorder measures, with CUPTI activity records, how long the device ran each launch, copy and
memset the program made while it was recorded, and writes those times once at close (activity
records arrive late, after the record batches holding the operations may be sealed). Scopes get
their device time from the operations inside them: the union of their device intervals (busy) and
first start to last end (span). No I/O here.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import flatbuffers
import numpy as np

from replayfmt.errors import ReplayFormatError
from replayfmt.format.generated import fb
from replayfmt.format.schema import load_schema

CUPTI_CLOCK = "cupti-activity"


@dataclass(frozen=True, slots=True)
class OperationTime:
    """How long the device ran one recorded operation in the original program (ns)."""

    operation: int
    start_ns: int  # CUPTI clock: only differences mean anything
    duration_ns: int

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.duration_ns


@dataclass(frozen=True, slots=True)
class ScopeTime:
    """A scope's device time in the original program: ``begin``/``end`` are its marker indices."""

    begin: int
    end: int
    busy_ns: int  # union of the device intervals of its timed operations
    span_ns: int  # first start to last end of those operations


@dataclass(frozen=True)
class OriginalTimes:
    """The original program's device times carried by a capture (empty when it has none)."""

    clock: str = ""
    operations: Mapping[int, OperationTime] = field(default_factory=dict)
    scopes: tuple[ScopeTime, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.operations)

    def duration_ns(self, operation: int) -> int | None:
        """The original device time of operation ``operation``, or None (not timed: a snapshot
        upload the recorder made, a host operation, or a capture without times)."""
        t = self.operations.get(operation)
        return None if t is None else t.duration_ns

    def region(self, start: int, stop: int, leave_out: Container[int] = ()) -> RegionTime | None:
        """Device time of the timed operations in ``[start, stop)`` but those in ``leave_out``
        (launches a replay skips); None when none is timed."""
        times = [t for i, t in self.operations.items() if start <= i < stop and i not in leave_out]
        if not times:
            return None
        return RegionTime(
            len(times),
            busy_ns((t.start_ns, t.end_ns) for t in times),
            max(t.end_ns for t in times) - min(t.start_ns for t in times),
        )

    def scope(self, begin: int) -> ScopeTime | None:
        """The stored time of the scope whose ScopeBegin is operation ``begin``."""
        for s in self.scopes:
            if s.begin == begin:
                return s
        return None


@dataclass(frozen=True, slots=True)
class RegionTime:
    """Device time of a run of operations: how many were timed, busy and span (ns)."""

    operations: int
    busy_ns: int
    span_ns: int


def busy_ns(intervals: Iterable[tuple[int, int]]) -> int:
    """Length of the union of [start, end) intervals."""
    total = 0
    lo = hi = -1
    for start, end in sorted(intervals):
        if start > hi:
            total += hi - lo
            lo, hi = start, end
        elif end > hi:
            hi = end
    return total + (hi - lo)


def scope_times(operations: Mapping[int, OperationTime], scopes: Iterable[tuple[int, int]]) -> list[ScopeTime]:
    """Each scope's (begin, end marker indices) device time from the operations inside it."""
    ordered = sorted(operations)
    out = []
    for begin, end in sorted(scopes):
        lo, hi = np.searchsorted(ordered, begin), np.searchsorted(ordered, end)
        inside = [operations[ordered[k]] for k in range(int(lo), int(hi))]
        if not inside:
            continue
        busy = busy_ns((t.start_ns, t.end_ns) for t in inside)
        span = max(t.end_ns for t in inside) - min(t.start_ns for t in inside)
        out.append(ScopeTime(begin, end, busy, span))
    return out


def _array(rows: list[tuple[int, ...]], struct_name: str) -> np.ndarray:
    dtype = load_schema().numpy_dtype(struct_name)
    return np.array(rows, dtype=dtype) if rows else np.zeros(0, dtype)


def _struct_vector(builder: flatbuffers.Builder, struct_name: str, array: np.ndarray) -> int:
    layout = load_schema().structs[struct_name]
    data = array.tobytes()
    builder.StartVector(layout.size, len(array), layout.alignment)
    builder.head -= len(data)
    builder.Bytes[builder.head : builder.head + len(data)] = data
    return builder.EndVector()


def encode_timings(times: OriginalTimes) -> bytes:
    """The TIMINGS chunk body: a FlatBuffer ``Timings``."""
    ops = _array(
        [(t.operation, t.start_ns, t.duration_ns) for _, t in sorted(times.operations.items())], "OperationTime"
    )
    scopes = _array(
        [(s.begin, s.end, s.busy_ns, s.span_ns) for s in sorted(times.scopes, key=lambda s: s.begin)], "ScopeTime"
    )
    b = flatbuffers.Builder(256 + ops.nbytes + scopes.nbytes)
    clock = b.CreateString(times.clock)
    op_vec = _struct_vector(b, "OperationTime", ops)
    scope_vec = _struct_vector(b, "ScopeTime", scopes)
    fb.Timings.Start(b)
    fb.Timings.AddClock(b, clock)
    fb.Timings.AddOperations(b, op_vec)
    fb.Timings.AddScopes(b, scope_vec)
    b.Finish(fb.Timings.End(b))
    return bytes(b.Output())


def decode_timings(
    d: dict[str, Any],
    operation_count: int,
    *,
    path: str | None = None,
    offset: int | None = None,
    rows: bool = True,
) -> OriginalTimes:
    """OriginalTimes from a verified-decoded ``Timings`` table; operations must exist in the file.
    ``rows=False`` checks the table whole and returns its clock alone (no object per row)."""
    schema = load_schema()
    ops = d["operations"].to_numpy(schema.numpy_dtype("OperationTime")) if d.get("operations") else None
    scopes = d["scopes"].to_numpy(schema.numpy_dtype("ScopeTime")) if d.get("scopes") else None

    def fail(message: str) -> ReplayFormatError:
        return ReplayFormatError(message, path=path, offset=offset, record="TIMINGS chunk")

    # checked whole, with numpy, before one row becomes an object: a time per operation at most
    timed = 0 if ops is None else len(ops)
    if timed > operation_count or (scopes is not None and len(scopes) > operation_count):
        raise fail(
            f"{timed} operation times and {0 if scopes is None else len(scopes)} scope times, "
            f"but the capture holds {operation_count} operations"
        )
    if timed:
        index = ops["operation"].astype(np.int64)
        if int(index.max()) >= operation_count:
            raise fail(f"a time for operation {int(index.max())}, but the capture holds {operation_count} operations")
    if scopes is not None and len(scopes):
        begin, end = scopes["begin"].astype(np.int64), scopes["end"].astype(np.int64)
        if int(end.max()) >= operation_count or bool((begin > end).any()):
            raise fail(f"a scope's markers are not two of the capture's {operation_count} operations in order")
    if not rows:
        return OriginalTimes(d.get("clock") or "")
    operations = (
        {}
        if ops is None
        else {
            i: OperationTime(i, start, duration)
            for i, start, duration in zip(
                ops["operation"].tolist(), ops["start_ns"].tolist(), ops["duration_ns"].tolist(), strict=True
            )
        }
    )
    scope_rows = (
        ()
        if scopes is None
        else tuple(
            ScopeTime(*row)
            for row in zip(*(scopes[name].tolist() for name in ("begin", "end", "busy_ns", "span_ns")), strict=True)
        )
    )
    return OriginalTimes(d.get("clock") or "", operations, scope_rows)


class TimesLog:
    """What a writer keeps for the TIMINGS chunk: scopes as they open and close (their device time
    is that of the operations inside them) and the original program's operation times."""

    def __init__(self) -> None:
        self._open: list[int] = []  # ScopeBegin indices of open scopes
        self._scopes: list[tuple[int, int]] = []  # (ScopeBegin, ScopeEnd) indices of closed ones
        self._times: OriginalTimes | None = None

    def scope_begin(self, index: int) -> int:
        """Note a ScopeBegin at ``index`` (returned)."""
        self._open.append(index)
        return index

    def scope_end(self, index: int) -> int:
        """Note a ScopeEnd at ``index`` (returned), closing the innermost open scope."""
        if self._open:
            self._scopes.append((self._open.pop(), index))
        return index

    def set(self, clock: str, operations: dict[int, OperationTime]) -> None:
        self._times = OriginalTimes(clock, operations)

    def encode(self) -> bytes | None:
        """The TIMINGS body, or None when no times were given."""
        if not self._times:
            return None
        times = self._times
        return encode_timings(
            OriginalTimes(times.clock, times.operations, tuple(scope_times(times.operations, self._scopes)))
        )
