"""The translator's handling of NCCL's kernels: each call of a rank that works on one device is
recorded as a collective operation (format 1.5), with the bytes it left in its receive buffer, so
that the ranks' captures replay together with their collectives issued again among them, and each
rank's capture replays alone too, its collectives' results put in place where they ran.

NCCL's kernels cannot be replayed as kernels: they need NCCL's communicators, the peers' memory
mappings and proxy threads. When NCCL's log says which calls an NCCL kernel launch carries
(:mod:`replayfmt.capture.nccl_log`), the send range of each is touched as any read is, its receive
range prepared as any write is (earlier contents become starting state where the region needs
them), and, at the recorder's next event, once the collective has run, the receive range is read
back and the call written on its stream, in stream order: what follows on that stream, and
whatever waits on it, sees the same bytes. The calls one kernel launch carries were one group.

Refused, with the reason: a process that works on several devices (its ranks' collectives wait for
each other inside one process, and reading one back before the others were launched would never
end), an NCCL kernel no logged call explains, and operations this version does not know.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from replayfmt.capture import events as ev
from replayfmt.capture.allocations import Allocation, AllocationTable
from replayfmt.capture.nccl_log import Collective, CollectiveLog, Communicator
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


_O = m.CollectiveOperation
_OPERATIONS = {kind.label: kind for kind in _O if kind}
_ROOTED = {_O.BROADCAST, _O.REDUCE, _O.SEND, _O.RECV}


@dataclass(slots=True)
class _Received:
    """A collective launched, to be written once it ran (its receive range read back then)."""

    collective: Collective
    communicator: Communicator
    group: int  # shared by the calls of one kernel launch when it carries several (0: alone)
    send: tuple[Allocation, int] | None  # (allocation, offset) of its send range
    receive: tuple[Allocation, int] | None  # (allocation, offset) of its receive range
    size: int  # bytes received


class Collectives:
    """NCCL kernel launches. Owns NCCL's log of this process's calls (None: not read), the
    collectives awaiting their results and the count of groups of calls so far."""

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
        self._groups = 0  # groups of calls (those one NCCL kernel launch carries) so far

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
        group = 0
        if len(calls) > 1:
            self._groups += 1
            group = self._groups
        launched = []
        for call in calls:
            communicator = log.communicators.get(call.communicator) if log is not None else None
            if communicator is None:
                why = "NCCL's log did not say which rank of its communicator this process is (made before recording?)"
                what = f"{event.kernel.name} is a collective (NCCL) kernel: {call.describe()}: {why}"
                self._refusals.refuse(event.call, what, event.stream)
                return
            root = communicator.rank == call.root
            sent = 0 if call.operation == "Broadcast" and not root else call.sent or 0  # NCCL ignores them
            received = 0 if call.operation == "Reduce" and not root else call.received or 0
            send = self._range(call.sendbuff, sent)
            receive = self._range(call.recvbuff, received)
            if send is None or receive is None:
                which = "send" if send is None else "receive"
                self._refusals.refuse(
                    event.call, f"{call.describe()}: its {which} buffer is in no recorded allocation", 0
                )
                return
            launched.append(_Received(call, communicator, group, send or None, receive or None, received))
        for r in launched:
            if r.send is not None:  # read by the call: starting state where the region did not write it
                self._state.touch(r.send[0], r.collective.stream, "")
            if r.receive is not None:
                self._state.prepare_write(r.receive[0], r.receive[1], r.size, r.collective.stream)
        self._received += launched
        self._report.collectives += len(calls)

    def _range(self, address: int, size: int) -> tuple[Allocation, int] | tuple[()] | None:
        """(allocation, offset) of a call's range; () when it has none; None when no recorded
        allocation holds it."""
        if not size or not address:
            return ()
        allocation = self._allocations.device_allocation(address)
        if allocation is None or address + size > allocation.address + allocation.size:
            return None
        return allocation, address - allocation.address

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
        """Each collective launched since the last event, with the bytes it left (read once it ran)."""
        received, self._received = self._received, []
        for r in received:
            call, data = r.collective, None
            if r.receive is not None:
                allocation, offset = r.receive
                try:
                    data = self._memory.read(allocation.address + offset, r.size, call.stream)
                except DeviceError as exc:
                    self._refusals.refuse("ncclKernel", f"{call.describe()}: its result could not be read: {exc}", 0)
                    continue
            operation = _OPERATIONS[call.operation]
            send_buffer, send_offset = (r.send[0].buffer, r.send[1]) if r.send is not None else (0, 0)
            recv_buffer, recv_offset = (r.receive[0].buffer, r.receive[1]) if r.receive is not None else (0, 0)
            made = m.Collective(
                0,
                operation,
                call.datatype,
                call.reduction,
                self._streams.stream(call.stream),
                call.count,
                call.root if operation in _ROOTED else -1,
                call.ranks,
                r.communicator.rank,
                r.communicator.identity,
                r.group,
                send_buffer,
                send_offset,
                recv_buffer,
                recv_offset,
            )
            self._writer.collective(made, received=data)
