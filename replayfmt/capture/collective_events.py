"""The translator's handling of NCCL's kernels: a collective of a rank that works on one device is
recorded as the bytes it left in its receive buffer, so that rank's capture replays alone on one
GPU, its collectives' results put in place where they ran (a mixin of
:class:`~replayfmt.capture.translate.Translator`).

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
    from replayfmt.capture.report import Report
    from replayfmt.writer import CaptureWriter


@dataclass(slots=True)
class _Received:
    """A collective's receive range, to be read back once it ran."""

    collective: Collective
    allocation: Allocation
    offset: int
    size: int
    stream: int  # the program's raw stream handle


class CollectiveEvents:
    """NCCL kernel launches; the translator provides the attributes declared here."""

    allocations: AllocationTable
    writer: CaptureWriter
    memory: DeviceMemory
    report: Report
    devices: DeviceObjects
    collectives: CollectiveLog | None
    _received: list[_Received]
    _recording: bool

    if TYPE_CHECKING:  # provided by the translator (real stubs here would shadow its mixins' methods)

        def _unsupported(self, call: str, reason: str, stream: int) -> None: ...
        def _stream(self, handle: int) -> int: ...
        def _prepare_write(self, allocation: Allocation, offset: int, size: int, stream: int) -> None: ...

    def _on_collective_launch(self, event: ev.LaunchBegin) -> None:
        """An NCCL kernel launched while recording: its calls' results kept, or refused saying why."""
        log = self.collectives
        calls = log.take() if log is not None else []  # taken outside regions too: they are past then
        if not self._recording:
            return
        why = self._collectives_refused(calls, log)
        if why:
            self._unsupported(event.call, f"{event.kernel.name} is a collective (NCCL) kernel: {why}", event.stream)
            return
        for call in calls:
            size = call.received
            if not size:
                continue
            allocation = self.allocations.device_allocation(call.recvbuff)
            if allocation is None or call.recvbuff + size > allocation.address + allocation.size:
                self._unsupported(event.call, f"{call.describe()}: its receive buffer is in no recorded allocation", 0)
                return
            offset = call.recvbuff - allocation.address
            self._prepare_write(allocation, offset, size, call.stream)
            self._received.append(_Received(call, allocation, offset, size, call.stream))
        self.report.collectives += len(calls)

    def _collectives_refused(self, calls: list[Collective], log: CollectiveLog | None) -> str:
        if log is None or not log.on:
            return (log.why_not if log is not None else "") or "the recorder did not read NCCL's log"
        if self.devices.several:
            return "this process works on several devices, whose collectives wait for each other"
        if not calls:
            # a group's later kernels carry the calls its first kernel was given
            return "" if log.seen else "NCCL's log names no call for it (NCCL started before the recorder?)"
        unknown = [c for c in calls if c.received is None]
        return f"{unknown[0].describe()}: this version does not record it" if unknown else ""

    def _write_received(self) -> None:
        """Each collective launched since the last event, as the bytes it left (read once it ran)."""
        received, self._received = self._received, []
        for r in received:
            try:
                data = self.memory.read(r.allocation.address + r.offset, r.size, r.stream)
            except DeviceError as exc:
                self._unsupported("ncclKernel", f"{r.collective.describe()}: its result could not be read: {exc}", 0)
                continue
            self.writer.copy_h2d(
                dst_buffer=r.allocation.buffer,
                data=data,
                dst_offset=r.offset,
                stream=self._stream(r.stream),
                flags=m.COPY_FLAG_ASYNC,
            )
