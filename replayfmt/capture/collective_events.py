"""The translator's handling of NCCL's kernels: a collective of a rank that works on one device is
recorded as the bytes it left in its receive buffer, so that rank's capture replays alone on one
GPU, its collectives' results put in place where they ran.

NCCL's kernels cannot be replayed as kernels: they need NCCL's communicators, the peers' memory
mappings and proxy threads. When NCCL's log says which calls an NCCL kernel launch carries
(:mod:`replayfmt.capture.nccl_log`), the receive range of each is prepared as any write is (its
earlier contents become starting state where the region needs them) and, at the recorder's next
event, once the collective has run, read back and written as an upload on the collective's stream,
in stream order: what follows on that stream, and whatever waits on it, sees the same bytes.

Refused, with the reason: a process that works on several devices (its ranks' collectives wait for
each other inside one process, and reading one back before the others were launched would never
end), an NCCL kernel no logged call explains, and operations this version does not know.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from replayfmt.capture import events as ev
from replayfmt.capture.allocations import Allocation, AllocationTable
from replayfmt.capture.nccl_log import Collective, CollectiveLog
from replayfmt.errors import DeviceError
from replayfmt.format import model as m

if TYPE_CHECKING:
    from replayfmt.capture.device_memory import DeviceMemory
    from replayfmt.capture.device_objects import DeviceObjects
    from replayfmt.capture.regions import Refusals, Region
    from replayfmt.capture.report import Report
    from replayfmt.capture.starting_state import StartingState
    from replayfmt.capture.stream_events import Streams
    from replayfmt.writer import CaptureWriter


@dataclass(slots=True)
class _Received:
    """A collective's receive range, to be read back once it ran."""

    collective: Collective
    allocation: Allocation
    offset: int
    size: int
    stream: int  # the program's raw stream handle


class Collectives:
    """NCCL kernel launches. Owns NCCL's log of this process's calls (None: not read) and the
    collectives awaiting their results."""

    def __init__(
        self,
        log: CollectiveLog | None,
        *,
        writer: CaptureWriter,
        report: Report,
        allocations: AllocationTable,
        region: Region,
        memory: DeviceMemory,
        devices: DeviceObjects,
        refusals: Refusals,
        streams: Streams,
        state: StartingState,
    ) -> None:
        self._log = log
        self._writer = writer
        self._report = report
        self._allocations = allocations
        self._region = region
        self._memory = memory
        self._devices = devices
        self._refusals = refusals
        self._streams = streams
        self._state = state
        self._received: list[_Received] = []

    @property
    def pending(self) -> bool:
        """Whether collectives launched since the last event await their results."""
        return bool(self._received)

    def on_launch(self, event: ev.LaunchBegin) -> None:
        """An NCCL kernel launched while recording: its calls' results kept, or refused saying why."""
        log = self._log
        calls = log.take() if log is not None else []  # taken outside regions too: they are past then
        if not self._region.recording:
            return
        why = self._collectives_refused(calls, log)
        if why:
            self._refusals.refuse(event.call, f"{event.kernel.name} is a collective (NCCL) kernel: {why}", event.stream)
            return
        for call in calls:
            size = call.received
            if not size:
                continue
            allocation = self._allocations.device_allocation(call.recvbuff)
            if allocation is None or call.recvbuff + size > allocation.address + allocation.size:
                self._refusals.refuse(
                    event.call, f"{call.describe()}: its receive buffer is in no recorded allocation", 0
                )
                return
            offset = call.recvbuff - allocation.address
            self._state.prepare_write(allocation, offset, size, call.stream)
            self._received.append(_Received(call, allocation, offset, size, call.stream))
        self._report.collectives += len(calls)

    def _collectives_refused(self, calls: list[Collective], log: CollectiveLog | None) -> str:
        if log is None or not log.on:
            return (log.why_not if log is not None else "") or "the recorder did not read NCCL's log"
        if self._devices.several:
            return "this process works on several devices, whose collectives wait for each other"
        if not calls:
            # a group's later kernels carry the calls its first kernel was given
            return "" if log.seen else "NCCL's log names no call for it (NCCL started before the recorder?)"
        unknown = [c for c in calls if c.received is None]
        return f"{unknown[0].describe()}: this version does not record it" if unknown else ""

    def write_received(self) -> None:
        """Each collective launched since the last event, as the bytes it left (read once it ran)."""
        received, self._received = self._received, []
        for r in received:
            try:
                data = self._memory.read(r.allocation.address + r.offset, r.size, r.stream)
            except DeviceError as exc:
                self._refusals.refuse(
                    "ncclKernel", f"{r.collective.describe()}: its result could not be read: {exc}", 0
                )
                continue
            self._writer.copy_h2d(
                dst_buffer=r.allocation.buffer,
                data=data,
                dst_offset=r.offset,
                stream=self._streams.stream(r.stream),
                flags=m.COPY_FLAG_ASYNC,
            )
