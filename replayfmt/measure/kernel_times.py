"""Per-operation device times and region GPU busy time from CUPTI activity records.

CUDA events around every operation cost about as much as a small kernel (2 µs Triton kernels
read 5-6 µs on an H100); CUPTI's kernel records are what Nsight Systems and torch.profiler show
and add nothing to the streams. :class:`CuptiClock` tags the driver calls of each timed iteration
(and, for per-operation times, of each operation) with CUPTI external correlation ids, so that
records are attributed to iterations and operations without any event between kernels. The tags
are host calls only (push and pop, well under a microsecond each).

Where CUPTI is absent (or taken by another client), :func:`choose_clock` says so and the caller
keeps CUDA events; the result's ``clock`` and ``clock_note`` say which clock produced the figures.
"""

from __future__ import annotations

import statistics
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import Any

from replayfmt.cuda.activity import ActivityBatch, ActivityKind, ExternalKind, KernelActivity, kernel_activity
from replayfmt.errors import DeviceError, ReplayUsageError
from replayfmt.format.timings import OriginalTimes, busy_ns
from replayfmt.replay.steps import Step, StepKind

CUPTI = "cupti"
EVENTS = "events"
CLOCK_NAMES = {CUPTI: "CUPTI activity records", EVENTS: "CUDA events"}
_ITERATION = ExternalKind.CUSTOM0  # tags every driver call of a timed iteration
_OPERATION = ExternalKind.CUSTOM1  # tags the driver calls of one operation
_FLUSH_EVERY = 256  # iterations between flushes, to bound the records held


@dataclass
class IterationTimes:
    """One iteration's device work as CUPTI saw it (ns)."""

    busy_ns: int = 0  # union of its kernels', copies' and memsets' intervals
    kernel_busy_ns: int = 0  # union of its kernels' intervals only
    kernels: int = 0  # kernel records
    span_ns: int = 0  # first start to last end
    operations: dict[int, tuple[int, int]] = field(default_factory=dict)  # op index -> (start, end)


class CuptiClock:
    """Tags and collects one benchmark's CUPTI records. ``per_operation``: also tag each operation."""

    def __init__(self, activity: KernelActivity, *, per_operation: bool) -> None:
        self.activity = activity
        self.per_operation = per_operation
        self.iterations: dict[int, IterationTimes] = {}
        self._batch = ActivityBatch()
        self._pending = 0
        self._open = False
        self._iteration = 0
        self.untagged_kernels = 0  # kernel records of no timed iteration (warm-up, setup, restores)

    def start(self) -> None:
        self.activity.start()

    def instrument(self, body: Sequence[Step]) -> list[Step]:
        """``body`` with each operation's steps tagged by its index (when timing operations), and
        every state step outside the iteration's tag (starting state is never timed)."""
        push, pop = self.activity.push, self.activity.pop
        out: list[Step] = []
        for i, step in enumerate(body):
            index = step.operation
            if self.per_operation and (i == 0 or body[i - 1].operation != index):
                out.append(Step(StepKind.TAG, push, (_OPERATION, index), index))
            if step.kind is StepKind.STATE:
                out += [
                    Step(StepKind.TAG, self.suspend, (), index),
                    step,
                    Step(StepKind.TAG, self.resume, (), index),
                ]
            else:
                out.append(step)
            if self.per_operation and (i + 1 == len(body) or body[i + 1].operation != index):
                out.append(Step(StepKind.TAG, pop, (_OPERATION,), index))
        return out

    def begin(self, iteration: int) -> None:
        """Tag what is issued from now to :meth:`end` as iteration ``iteration`` (from 1)."""
        self.activity.push(_ITERATION, iteration)
        self._open = True
        self._iteration = iteration

    def suspend(self) -> None:
        """Leave what is issued until :meth:`resume` out of the open iteration (starting state)."""
        if self._open:
            self.activity.pop(_ITERATION)

    def resume(self) -> None:
        if self._open:
            self.activity.push(_ITERATION, self._iteration)

    def end(self) -> None:
        if self._open:
            self.activity.pop(_ITERATION)
            self._open = False
            self._pending += 1
            if self._pending >= _FLUSH_EVERY:
                self.collect()

    def collect(self) -> None:
        """Flush CUPTI and attribute the records received (call after a synchronise)."""
        self.activity.flush()
        batch = self.activity.take()
        self._pending = 0
        self._batch.dropped = batch.dropped
        self.untagged_kernels += attribute(batch, self.iterations)

    def stop(self) -> None:
        try:
            self.collect()
        finally:
            self.activity.stop()

    @property
    def dropped(self) -> int:
        return self._batch.dropped


def attribute(batch: ActivityBatch, into: dict[int, IterationTimes]) -> int:
    """Add ``batch``'s device records to the iterations (and operations) their tags name; returns
    how many kernel records no iteration claimed."""
    iterations = batch.external.get(_ITERATION, {})
    operations = batch.external.get(_OPERATION, {})
    grouped: dict[int, list[tuple[int, int]]] = {}
    kernels: dict[int, list[tuple[int, int]]] = {}
    untagged = 0
    for record in batch.records:
        iteration = iterations.get(record.correlation_id)
        if iteration is None:
            untagged += record.kind == ActivityKind.CONCURRENT_KERNEL
            continue  # warm-up, restores, the recorder's own work
        grouped.setdefault(iteration, []).append((record.start_ns, record.end_ns))
        if record.kind == ActivityKind.CONCURRENT_KERNEL:
            kernels.setdefault(iteration, []).append((record.start_ns, record.end_ns))
        index = operations.get(record.correlation_id)
        if index is not None:
            times = into.setdefault(iteration, IterationTimes()).operations
            start, end = times.get(index, (record.start_ns, record.end_ns))
            times[index] = (min(start, record.start_ns), max(end, record.end_ns))
    for iteration, intervals in grouped.items():
        entry = into.setdefault(iteration, IterationTimes())
        entry.busy_ns = busy_ns(intervals)
        entry.kernel_busy_ns = busy_ns(kernels.get(iteration, ()))
        entry.kernels = len(kernels.get(iteration, ()))
        entry.span_ns = max(e for _, e in intervals) - min(s for s, _ in intervals)
    return untagged


def choose_clock(requested: str, *, per_operation: bool) -> tuple[CuptiClock | None, str]:
    """A CUPTI clock, or None and why (the caller then uses CUDA events and prints the note).

    ``requested``: ``auto`` (CUPTI when available), ``cupti`` (required: no CUPTI is an error)
    or ``events``.
    """
    if requested not in ("auto", CUPTI, EVENTS):
        raise ReplayUsageError(f"--clock {requested!r}: expected auto, cupti or events")
    if requested == EVENTS:
        return None, ""
    activity, why = kernel_activity(external=True)
    if activity is None:
        if requested == CUPTI:
            raise ReplayUsageError(f"--clock=cupti: {why}; use --clock=events")
        return None, f"CUPTI is not available ({why}): per-operation times come from CUDA events"
    clock = CuptiClock(activity, per_operation=per_operation)
    try:
        clock.start()
    except DeviceError as exc:
        if requested == CUPTI:
            raise ReplayUsageError(f"--clock=cupti: {exc}; use --clock=events") from None
        return None, f"CUPTI cannot be used ({exc}): per-operation times come from CUDA events"
    return clock, ""


def trace_events(iterations: dict[int, IterationTimes], names: dict[int, tuple[str, str, int]]) -> list[dict[str, Any]]:
    """Chrome/Perfetto trace events of the last iteration whose operations were timed."""
    tagged = [n for n, entry in iterations.items() if entry.operations]
    if not tagged:
        return []
    operations = iterations[max(tagged)].operations
    origin = min(start for start, _ in operations.values())
    events = []
    for index, (start, end) in sorted(operations.items()):
        name, category, stream = names.get(index, ("?", "?", 0))
        events.append(
            {
                "name": name,
                "cat": category,
                "ph": "X",
                "ts": round((start - origin) / 1e3, 3),
                "dur": round((end - start) / 1e3, 3),
                "pid": 1,
                "tid": stream,
                "args": {"operation": index},
            }
        )
    return events


# -- the original program's times beside the replay's ----------------------------------------


@dataclass(frozen=True)
class OriginalSide:
    """The original program's device times for a benchmarked region (from the capture)."""

    busy_ns: int  # union of the timed operations' intervals in the original
    span_ns: int  # first start to last end: includes the recorder's own work between operations
    timed: int  # operations in the region with an original time
    untimed_device_ops: int  # device operations the original never ran (the recorder's snapshot uploads)
    operations: dict[int, int] = field(default_factory=dict)  # op index -> original ns


def original_side(
    times: OriginalTimes, start: int, stop: int, device_ops: Sequence[int], leave_out: Container[int] = ()
) -> OriginalSide | None:
    """The original's figures for operations ``[start, stop)`` but ``leave_out`` (what the replay
    skips: its work is compared with the same operations'); None when the capture has none."""
    region = times.region(start, stop, leave_out) if times else None
    if region is None:
        return None
    operations = {i: d for i in device_ops if (d := times.duration_ns(i)) is not None}
    untimed = sum(1 for i in device_ops if i not in operations)
    return OriginalSide(region.busy_ns, region.span_ns, region.operations, untimed, operations)


def ratio(replay: float, original: float) -> str:
    return f"{replay / original:.3f}x" if original > 0 else "-"


def median_ms(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


ORIGINAL_ELAPSED_ABSENT = (
    "the original's elapsed time is not shown: measured under the recorder, it includes the recorder's own "
    "work between operations; GPU busy compares like with like"
)


def side_by_side_lines(
    *,
    elapsed_ms: float,
    busy_ms: float | None,
    original: OriginalSide | None,
    kernel_busy_ms: float | None = None,
    clock: str,
    clock_note: str,
) -> list[str]:
    """The region's replay figures beside the original program's, with their ratio. Only what the
    recorder measured faithfully is shown: the original's device busy time, never its elapsed time
    (the recorder's own work between operations inflates it; a note says so)."""
    lines = []
    if clock_note:
        lines.append(f"note: {clock_note}")
    if busy_ms is None and original is None:
        return lines
    lines.append(f"{'region':<13} {'replay ms':>11} {'original ms':>12} {'replay/original':>16}")
    replay_busy = f"{busy_ms:11.4f}" if busy_ms is not None else f"{'-':>11}"
    orig = f"{original.busy_ns / 1e6:12.4f}" if original else f"{'-':>12}"
    both = busy_ms is not None and original is not None
    lines.append(f"{'GPU busy':<13} {replay_busy} {orig} {ratio(busy_ms, original.busy_ns / 1e6) if both else '-':>16}")
    if kernel_busy_ms is not None and busy_ms is not None and kernel_busy_ms < busy_ms:
        lines.append(f"{'  kernels':<13} {kernel_busy_ms:11.4f} {'':>12} {'':>16}  (busy time of the kernels alone)")
    lines.append(f"{'elapsed':<13} {elapsed_ms:11.4f} {'-':>12} {'-':>16}")
    if busy_ms is not None and elapsed_ms > busy_ms:
        lines.append(
            f"{'':<13} {elapsed_ms - busy_ms:11.4f} {'':>12}"
            "  device idle inside the region (host launch gaps, synchronisations)"
        )
    if original is not None:
        lines.append(f"note: {ORIGINAL_ELAPSED_ABSENT}")
        if busy_ms is None:
            lines.append("note: the replay's GPU busy time needs CUPTI (--clock=auto or cupti)")
        if original.untimed_device_ops:
            n = original.untimed_device_ops
            verb = "has" if n == 1 else "have"
            what = f"{n} device operation{'' if n == 1 else 's'} of the region {verb} no original time"
            lines.append(
                f"note: {what} (uploads of starting state the recorder added); the replay's busy time includes them"
            )
    lines.append(f"clock: {CLOCK_NAMES.get(clock, clock)}")
    return lines


def operation_lines(rows: Sequence[tuple[int, str, float, int | None]], clock: str) -> list[str]:
    """Per-operation medians: (index, name, replay ms, original ns or None) -> text lines."""
    if not rows:
        return []
    with_original = any(o is not None for *_, o in rows)
    head = f"per operation (median device ms, {CLOCK_NAMES.get(clock, clock)})"
    if not with_original:
        return [head + ":"] + [f"  op {i:>7} {name:<40} {ms:.4f}" for i, name, ms, _ in rows]
    lines = [
        head + ", beside the original program's:",
        f"  {'op':>10} {'name':<40} {'replay':>9} {'original':>9} {'ratio':>8}",
    ]
    for i, name, ms, original in rows:
        short = name if len(name) <= 40 else name[:37] + "..."
        if original is None:
            lines.append(f"  op {i:>7} {short:<40} {ms:9.4f} {'-':>9} {'-':>8}")
        else:
            lines.append(f"  op {i:>7} {short:<40} {ms:9.4f} {original / 1e6:9.4f} {ratio(ms, original / 1e6):>8}")
    return lines
