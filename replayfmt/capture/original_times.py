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

import threading
from collections.abc import Callable
from typing import Any

from replayfmt.capture import events as ev
from replayfmt.capture.report import Report
from replayfmt.container.writer import CaptureWriter
from replayfmt.cuda.activity import DEVICE_WORK, ActivityRecord, KernelActivity
from replayfmt.errors import ReplayError
from replayfmt.format.timings import OperationTime

_DEVICE_EVENTS = (ev.LaunchBegin, ev.Copy, ev.CopyDone, ev.Memset)


class OriginalTimes:
    """Binds program operations to CUPTI correlation ids and writes their device times at close.

    ``library``: the libcupti the callbacks use. Set :attr:`correlation` to the CUPTI source's
    ``correlation_id`` (the id of the driver call whose callback runs on this thread). ``lock``
    serialises every call into the translator that writes operations, so that the operation
    written last is the one just handled.
    """

    def __init__(self, writer: CaptureWriter, report: Report, library: Any = None, *, activity: Any = None) -> None:
        self.writer = writer
        self.report = report
        self.correlation: Callable[[], int] = lambda: 0
        self.lock = threading.RLock()
        self._bound: dict[int, int] = {}  # correlation id -> operation index
        self.activity: KernelActivity | None = None
        self.note = ""
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
        writer, report, bound, lock = self.writer, self.report, self._bound, self.lock

        def sink(event: ev.Event) -> None:
            with lock:
                if not isinstance(event, _DEVICE_EVENTS):
                    handle(event)
                    return
                before = writer.operation_count
                refused = sum(report.unsupported.values())
                stats = report.kernels.get(event.kernel.name) if isinstance(event, ev.LaunchBegin) else None
                captured = stats.captured if stats is not None else 0
                handle(event)
                if writer.operation_count == before or sum(report.unsupported.values()) != refused:
                    return
                if isinstance(event, ev.LaunchBegin):
                    stats = report.kernels.get(event.kernel.name)
                    if stats is None or stats.captured == captured:
                        return
                # the program's operation is the last one the translator wrote (objects and
                # snapshots it needed come first); a synchronous D2H is rebound at its CopyDone
                bound[self.correlation()] = writer.operation_count - 1

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
        times = operation_times(batch.records, self._bound)
        if times:
            self.writer.set_original_times(times)
        lost = f", {batch.dropped} records dropped by CUPTI" if batch.dropped else ""
        self.report.timing = f"original device times: {len(times)} operations timed with CUPTI{lost}"


def operation_times(records: list[ActivityRecord], bound: dict[int, int]) -> list[OperationTime]:
    """One time per bound operation: its records' first start to last end (a call that issued
    several records, such as a copy split by the driver, spans them all)."""
    spans: dict[int, tuple[int, int]] = {}
    for record in records:
        index = bound.get(record.correlation_id)
        if index is None:
            continue
        span = spans.get(index)
        spans[index] = (
            (record.start_ns, record.end_ns)
            if span is None
            else (min(span[0], record.start_ns), max(span[1], record.end_ns))
        )
    return [OperationTime(i, start, end - start) for i, (start, end) in sorted(spans.items())]
