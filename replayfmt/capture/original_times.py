"""The original program's device times, taken while recording (CUPTI activity records).

CUPTI gives every driver call a correlation id, in its callback data and in the activity record of
the kernel, copy or memset the call issued. :class:`OriginalTimes` sits between the CUPTI source and
the translator: after the translator has written a launch, copy or memset the program made, it
binds the call's correlation id to that operation's index. At close it flushes the records and
hands the writer each bound operation's device start and duration. Records of the recorder's own
calls (snapshot reads) have no binding and are dropped; so are the snapshot uploads the recorder
writes, which the program never made.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Callable
from itertools import repeat
from typing import Any, NamedTuple

from replayfmt.capture import events as ev
from replayfmt.capture.report import Report
from replayfmt.cuda.activity import DEVICE_WORK, ActivityKind, ActivityRecord, KernelActivity
from replayfmt.errors import ReplayError
from replayfmt.format.timings import OperationTime
from replayfmt.writer import CaptureWriter

_DEVICE_EVENTS = (ev.LaunchBegin, ev.Copy, ev.CopyDone, ev.Memset)


class OriginalTimes:
    """Binds program operations to CUPTI correlation ids and writes their device times at close.

    ``library``: the libcupti the callbacks use. Set :attr:`correlation` to the CUPTI source's
    ``correlation_id`` (the id of the driver call whose callback runs on this thread). ``lock``
    serialises every call into the translator that writes operations, so that the operation
    written last is the one just handled.
    """

    def __init__(
        self, writer: CaptureWriter, report: Report, library: Any = None, *, activity: Any = None, enabled: bool = True
    ) -> None:
        self.writer = writer
        self.report = report
        self.correlation: Callable[[], int] = lambda: 0
        # the id of the runtime call (cudaLaunchKernel...) around the driver call, where the host
        # tracks one (a program recorded through the injection library): CUPTI gives the work a
        # runtime call issues the runtime call's id, so an operation is bound under both
        self.outer_correlation: Callable[[], int] = lambda: 0
        self.lock = threading.RLock()
        # correlation id -> (operation index, the record kind it issues, kernel name or bytes)
        self._bound: dict[int, tuple[int, ActivityKind, str | int]] = {}
        self._graphs: dict[int, int] = {}  # correlation id of a cuGraphLaunch -> its GraphLaunch operation
        # every bound operation in the order the program issued it, with CUPTI's clock at its call:
        # where CUPTI gives many calls one correlation id, the records are matched by order and time
        self._issued: list[Issued] = []
        self.activity: KernelActivity | None = None
        self.note = ""
        if not enabled:
            return
        try:
            self.activity = activity if activity is not None else KernelActivity(library, kinds=DEVICE_WORK)
        except (ReplayError, OSError, AttributeError) as exc:
            self.note = f"the original program's device times are not recorded: {exc}"

    def start(self) -> None:
        """Start the activity records: once the CUPTI subscription succeeded, so that a refused
        recorder never touches another client's (torch.profiler's) activity settings."""
        if self.activity is None:
            return
        try:
            self.activity.start()
        except (ReplayError, OSError) as exc:
            self.activity = None
            self.note = f"the original program's device times are not recorded: {exc}"

    def wrap(self, handle: Callable[[ev.Event], None]) -> Callable[[ev.Event], None]:
        """``handle`` (the translator's), binding the operations it writes for the program."""
        if self.activity is None:
            return handle
        writer, report, bound, graphs, lock = self.writer, self.report, self._bound, self._graphs, self.lock
        kernels, unsupported = report.kernels, report.unsupported
        launch, repeated, kernel_kind = ev.LaunchBegin, ev.RepeatedLaunches, ActivityKind.CONCURRENT_KERNEL
        issued, clock = self._issued, self.activity.timestamp
        copy_began = threading.local()  # a synchronous copy is written at its CopyDone: its call began earlier

        def sink(event: ev.Event) -> None:
            with lock:
                if type(event) is launch:  # the hot path: only a launch written raises `captured`
                    name = event.kernel.name  # type: ignore[attr-defined]
                    stats = kernels.get(name)
                    captured = stats.captured if stats is not None else 0
                    handle(event)
                    stats = kernels.get(name)
                    if stats is not None and stats.captured != captured:
                        bind((writer.operation_count - 1, kernel_kind, name))
                    return
                if type(event) is repeated:  # launches the C library recorded: ids and clock in the ring
                    handle(event)
                    if event.first >= 0:  # type: ignore[attr-defined]
                        bind_repeats(event.first, event)  # type: ignore[attr-defined, arg-type]
                    return
                if type(event) is ev.GraphLaunched:  # its nodes' records carry the launch's correlation id
                    launches = report.graph_launches
                    handle(event)
                    if report.graph_launches != launches:
                        graphs[self.correlation()] = writer.operation_count - 1
                    return
                if not isinstance(event, _DEVICE_EVENTS):
                    handle(event)
                    return
                before, refused = writer.operation_count, sum(unsupported.values())
                handle(event)
                if type(event) is ev.Copy:  # after the recorder's own reads of its source: the copy is still to come
                    copy_began.at = clock()
                if writer.operation_count != before and sum(unsupported.values()) == refused:
                    # the program's operation is the last one the translator wrote (objects and
                    # snapshots it needed come first); a synchronous D2H is rebound at its CopyDone
                    kind, size = _expected(event)
                    since = getattr(copy_began, "at", 0) if type(event) is ev.CopyDone else 0
                    bind((writer.operation_count - 1, kind, size), since)

        last_id: list[int | None] = [None]

        def bind_repeats(first: int, event: ev.RepeatedLaunches) -> None:
            """Bind the ring's launches, written from operation ``first`` on, to their ids, with
            CUPTI's clock at each call (the ring read it)."""
            ring = event.launches
            names = [event.armed[a].kernel.name for a in ring["armed"].tolist()]
            operations = range(first, first + len(names))
            entries = list(zip(operations, repeat(kernel_kind), names))
            correlations = ring["correlation"].tolist()
            bound.update(zip(correlations, entries))
            bound.update((outer, entry) for outer, entry in zip(ring["outer"].tolist(), entries) if outer)
            issued.extend(map(Issued._make, zip(operations, repeat(kernel_kind), names, ring["timestamp"].tolist())))
            last_id[0] = correlations[-1]

        def bind(entry: tuple[int, ActivityKind, str | int], since: int = 0) -> None:
            correlation = self.correlation()
            bound[correlation] = entry
            outer = self.outer_correlation()
            if outer:
                bound[outer] = entry
            # CUPTI's clock at the call (its work starts later), read only where the ids may bind
            # nothing (the first operation, and each that repeats the one before's id): not a
            # clock call on every launch of a program whose ids are distinct
            if not since and (correlation == last_id[0] or not issued):
                since = clock()
            last_id[0] = correlation
            issued.append(Issued(*entry, since))

        return sink

    def close(self) -> None:
        """Flush CUPTI's records and give the writer the bound operations' times (before it closes)."""
        activity = self.activity
        if activity is None:
            if self.note:
                self.report.timing = self.note
            return
        self.activity = None
        try:
            activity.stop()
            batch = activity.take()
        except ReplayError as exc:
            self.report.timing = f"the original program's device times are not recorded: {exc}"
            return
        work = [r for r in batch.records if not r.graph_node]
        ids = Counter(r.correlation_id for r in work)
        # degenerate: fewer ids than half the operations, and one id on most records (heavy record
        # drops also leave few ids, each on few records: the ids still bind those)
        if ids and len(ids) * 2 < len(self._issued) and ids.most_common(1)[0][1] * 2 > len(work):
            # CUPTI numbered many calls alike (in a CUDA-injected program it may give every record
            # id 1): the ids bind nothing, the order and the clock do
            times = issued_times(work, self._issued)  # (graph launches, bound by id, stay untimed)
        else:
            by_id = operation_times(batch.records, self._bound)
            in_order = runtime_call_times(batch.records, self._bound, {t.operation for t in by_id}, set(self._graphs))
            times = by_id + in_order + graph_times(batch.records, self._graphs)
        times.sort(key=lambda t: t.operation)
        if times:
            self.writer.set_original_times(times)
        lost = f", {batch.dropped} records dropped by CUPTI" if batch.dropped else ""
        operations = {entry.operation for entry in self._issued} | set(self._graphs.values())
        untimed = len(operations - {t.operation for t in times})
        if untimed:  # say how far off, so that a missing time can be traced (a CUPTI host, a lost record)
            seen = sum(1 for r in batch.records if r.kind in DEVICE_WORK)
            lost += f"; {untimed} untimed: no record of their kind and name among CUPTI's {seen}"
        self.report.timing = f"original device times: {len(times)} operations timed with CUPTI{lost}"


def _expected(event: ev.Event) -> tuple[ActivityKind, int]:
    if isinstance(event, ev.Memset):
        return ActivityKind.MEMSET, event.count * event.element_size
    return ActivityKind.MEMCPY, event.size  # type: ignore[attr-defined]


def operation_times(
    records: list[ActivityRecord], bound: dict[int, tuple[int, ActivityKind, str | int]]
) -> list[OperationTime]:
    """One time per bound operation: the record its call issued. The recorder's own work inside
    the callback (snapshot reads) shares the call's correlation id, so a record must match the
    operation's kind and kernel name or byte count; of several, the program's is the last to start
    (the callback runs before the call it reports)."""
    chosen: dict[int, ActivityRecord] = {}
    for record in records:
        entry = bound.get(record.correlation_id)
        if entry is None:
            continue
        index, kind, key = entry
        if record.kind != kind or _key(record) != key:
            continue
        best = chosen.get(index)
        if best is None or record.start_ns > best.start_ns:
            chosen[index] = record
    return [OperationTime(i, r.start_ns, r.duration_ns) for i, r in sorted(chosen.items())]


class Issued(NamedTuple):
    """A program operation the recorder wrote: what its record must be, and when its call was made."""

    operation: int
    kind: ActivityKind
    key: str | int  # the kernel's name, or the bytes copied or set
    since_ns: int  # CUPTI's clock at the call (its work starts later); 0 where ids bind it


def issued_times(records: list[ActivityRecord], issued: list[Issued]) -> list[OperationTime]:
    """Times by issue order, for records whose correlation ids bind nothing: each operation, in
    the order the program issued it, takes the earliest record of its kind and kernel name or byte
    count not taken yet that started after its call (work issued before the region, a warm-up of
    the same kernel, started earlier; the recorder's own reads differ in kind or name)."""
    by_key: dict[tuple[ActivityKind, str | int], list[ActivityRecord]] = {}
    for record in sorted(records, key=lambda r: r.start_ns):
        by_key.setdefault((record.kind, _key(record)), []).append(record)
    at: dict[tuple[ActivityKind, str | int], int] = {}
    out: list[OperationTime] = []
    for entry in issued:
        key = (entry.kind, entry.key)
        candidates = by_key.get(key, [])
        k = at.get(key, 0)
        while k < len(candidates) and candidates[k].start_ns < entry.since_ns:
            k += 1
        if k < len(candidates):
            out.append(OperationTime(entry.operation, candidates[k].start_ns, candidates[k].duration_ns))
            k += 1
        at[key] = k
    return out


# How many correlation ids before a driver call its runtime call's id may lie: the runtime makes a
# few driver calls of its own (context, stream queries) before the one that issues the work
_RUNTIME_WINDOW = 64


def runtime_call_times(
    records: list[ActivityRecord],
    bound: dict[int, tuple[int, ActivityKind, str | int]],
    timed: set[int],
    graph_calls: set[int],
) -> list[OperationTime]:
    """Times of bound operations that no record matched by their driver call's correlation id.

    Work a runtime call issues (cudaLaunchKernel, cudaMemcpyAsync) carries the runtime call's
    correlation id, and where the recorder saw only the driver call inside it (CUPTI tells only
    some hosts about runtime calls), no id binds it. CUPTI numbers runtime and driver calls with one
    counter, so the runtime call's id is a little below its driver call's: an unmatched operation
    takes the nearest unclaimed record of its kind and kernel name or byte count whose id lies
    within :data:`_RUNTIME_WINDOW` below its own (never a record of an earlier or later call's work:
    each record is taken once, nearest first)."""
    claimed = set(bound) | graph_calls
    waiting: dict[int, list[ActivityRecord]] = {}
    for record in records:
        if record.correlation_id not in claimed and not record.graph_node:
            waiting.setdefault(record.correlation_id, []).append(record)
    ids = sorted(waiting)
    out: list[OperationTime] = []
    for driver_id, (index, kind, key) in sorted(bound.items()):
        if index in timed:
            continue
        at = bisect.bisect_left(ids, driver_id)
        for j in range(at - 1, -1, -1):
            if ids[j] < driver_id - _RUNTIME_WINDOW:
                break
            candidates = waiting[ids[j]]
            match = next((r for r in candidates if r.kind == kind and _key(r) == key), None)
            if match is not None:
                candidates.remove(match)
                out.append(OperationTime(index, match.start_ns, match.duration_ns))
                timed.add(index)
                break
    return out


def _key(record: ActivityRecord) -> str | int:
    """What a record is matched on beside its kind: a kernel's name, or the bytes copied or set."""
    return record.name if record.kind == ActivityKind.CONCURRENT_KERNEL else record.bytes


def graph_times(records: list[ActivityRecord], graphs: dict[int, int]) -> list[OperationTime]:
    """One time per bound graph launch, from the records of its nodes (``graph_node`` set; the
    recorder's own snapshot work in the launch's callback has none): it starts with its first node,
    and its duration is the time some node of it ran (the union of their intervals), so that the
    region's busy time counts the device's work and not the gaps between nodes."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for record in records:
        index = graphs.get(record.correlation_id)
        if index is not None and record.graph_node and record.kind in DEVICE_WORK:
            spans.setdefault(index, []).append((record.start_ns, record.end_ns))
    times = []
    for index, intervals in sorted(spans.items()):
        intervals.sort()
        busy, reach = 0, intervals[0][0]
        for start, end in intervals:
            if end > reach:
                busy += end - max(start, reach)
                reach = end
        times.append(OperationTime(index, intervals[0][0], busy))
    return times
