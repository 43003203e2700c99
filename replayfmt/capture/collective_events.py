"""The translator's handling of NCCL's kernels: each call is recorded as a collective operation
(format 1.5), with the bytes it left in its receive buffer, so that the ranks' captures replay
together with their collectives issued again among them, and each rank's capture replays alone
too, its collectives' results put in place where they ran. A process that drives several devices
(a sharded JAX step: one rank of a communicator per device) records each device's calls with its
rank, on its device's stream, in one capture.

NCCL's kernels cannot be replayed as kernels: they need NCCL's communicators, the peers' memory
mappings and proxy threads. When NCCL's log says which calls an NCCL kernel launch carries
(:mod:`replayfmt.capture.nccl_log`: the calls of the communicators on the launching device), the
send range of each is touched as any read is and its receive range prepared as any write is
(earlier contents become starting state where the region needs them). The calls one kernel
launch carries were one group, and are written together.

Reading a call's results back. In a process on one device (a DDP rank), at the recorder's next
event each call's receive range is read once its stream is idle, and the call written on its
stream. In a process on several devices that read could wait for ever (the kernel waits on the
device for a peer's kernel that another thread has yet to launch), so once the launch call
returns, a copy of each receive range into device memory of the recorder's own is queued on the
kernel's stream, with an event after it (``DeviceMemory.set_aside``): stream-ordered, so nothing
the program queues later on that stream changes what it holds. The calls are written once that
copy has run: at any later event when its event says so, and before any event that must follow
them in the capture: an event on the same stream (replay issues a stream's operations in the
file's order, and a payload is named by its bytes, so the call cannot be written before its bytes
are known), work that waits for it implicitly (on the legacy default stream for a call on a blocking
stream of its device, on a blocking stream for a call on the legacy one), a free of its buffers
(cuMemFree, cuMemUnmap, a framework's block free: the plan refuses a use after a free), a
synchronisation of its device, the end of a scope or region. Such a wait lets go of
the recorder's locks, so that the peer's launch is recorded meanwhile, and is bounded: after
COLLECTIVE_WAIT_SECONDS in all (one deadline for every copy it waits on) the calls are refused by
name and the program goes on. A region's end waits while the region still records. The copies
held at once are bounded by SET_ASIDE_BYTES (more is refused by name). Their memory is allocated
only while no NCCL kernel the recorder saw may be pending (cuMemAlloc and cuMemFree may wait for
the device, where a kernel may wait for a peer's launch that cannot come while this thread holds
the locks): each device's ASIDE_POOL_BYTES (or a launch's results, if more) at a region's start
for the devices whose communicators NCCL's log showed, and at an NCCL launch before its kernel is
queued when none is pending; a copy that finds no room there refuses its call by name. It is kept
for later copies and freed only at close. The recorder's stream and pinned staging that read
copies back are made then too, and from then on every read (a copy's, or a call's whose copy could
not be queued) runs in pieces of that staging. A copy is released only once no thread waits on any
copy (a waiter asks about copies another thread may read back meanwhile); a refused call's copy
once it ran. Where no copy was queued (the launch's return not seen yet), the receive range is
read once its stream is idle, waited for in the same way.

What remains: the wait runs inside the translator's ``handle`` (and so inside the source's
callback and the original times' sink, which hold the source's lock around it). While it lets go,
other threads' events are recorded and timed between this event's callback and its own record:
their operations are written before it, and the original times' order of calls is theirs first.
That order is a valid one (the waiting thread's event was not issued yet as far as the device is
concerned, since the waiting thread is blocked in the callback), but code that assumes a callback
runs whole under the lock (settle, stop, the C ring's take, RepeatedLaunches' batches) may see
another thread's events in between.

Refused, with the reason: an NCCL kernel no logged call explains, a call on a communicator the
log never showed made, and operations this version does not know (all-to-all).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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
_LEGACY = (0, 1)  # the legacy default stream (0, CU_STREAM_LEGACY)


# how long an event waits for collectives before it, whose kernels wait for their peers' (seconds)
COLLECTIVE_WAIT_SECONDS = 60.0
# the most bytes of collectives' results held aside on the devices at once
SET_ASIDE_BYTES = 1 << 30
# each device's memory for those copies, allocated while no collective is pending (a region's
# start, a launch with none before it): cuMemAlloc may wait for the device, where a peer's kernel
# may wait for a launch the waiting thread's peer has yet to make
ASIDE_POOL_BYTES = 256 << 20


@dataclass(slots=True)
class _Received:
    """One call of a launch, to be written once its results are read back."""

    collective: Collective
    communicator: Communicator
    group: int  # shared by the calls of one kernel launch when it carries several (0: alone)
    send: tuple[Allocation, int] | None  # (allocation, offset) of its send range
    receive: tuple[Allocation, int] | None  # (allocation, offset) of its receive range
    size: int  # bytes received
    aside: Any = None  # the copy of its received bytes queued after the kernel (None: none)


@dataclass(slots=True)
class _Launch:
    """The calls one NCCL kernel launch carried (one group), written together."""

    calls: list[_Received]
    stream: int  # the kernel's stream (a raw handle)
    stream_object: int  # its Stream object (made on the launching device, the stream's)
    device: int  # the ordinal it was launched on
    thread: int  # the thread that launched it
    returned: bool = False  # its launch call returned: the copies of its results were queued
    held: int = field(default=0)  # bytes of its copies held aside


def _unset(launch: _Launch) -> bool:
    """Whether a call of ``launch`` has results and no copy of them queued (read once its stream is idle)."""
    return any(r.receive is not None and r.aside is None for r in launch.calls)


class Collectives:
    """NCCL kernel launches. Owns NCCL's log of this process's calls (None: not read), the
    launches whose calls await being written, the bytes held aside for them and the count of
    groups of calls so far."""

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
        self._launches: list[_Launch] = []  # in launch order
        self._held = 0  # bytes held aside now
        self._abandoned: list[Any] = []  # copies of calls refused: released once they ran
        self._spent: list[Any] = []  # copies read back: released once no thread waits on any copy
        self._waiters = 0  # threads waiting now, with the locks let go, on copies they hold no claim to
        self._groups = 0  # groups of calls (those one NCCL kernel launch carries) so far
        self._refused: list[int] = []  # streams of NCCL kernels refused at their launch (they run all the same)

    @property
    def pending(self) -> bool:
        """Whether collectives launched await being written, or copies of their results release."""
        return bool(self._launches or self._abandoned or self._spent)

    def on_region_start(self) -> None:
        """A region opens: the memory for copies of collectives' results reserved on each device
        whose communicators NCCL's log showed made, while no collective is pending."""
        devices = self._log.devices() if self._log is not None and self._log.on else set()
        if len(devices) > 1:
            self._reserve(devices, 0)

    def _reserve(self, devices: set[int], size: int) -> None:
        """Each of ``devices``' memory for copies made to hold max(ASIDE_POOL_BYTES, ``size``)
        bytes at once, where no collective may be pending (nothing otherwise)."""
        reserve = getattr(self._memory, "reserve_aside", None)
        if reserve is None or self._busy():
            return
        for device in sorted(devices):
            try:
                reserve(device, max(ASIDE_POOL_BYTES, size))
            except DeviceError:
                pass  # its copies find no room: those calls are refused by name

    def _busy(self) -> bool:
        """Whether an NCCL kernel this recorder saw may still be pending on a device."""
        idle = getattr(self._memory, "stream_idle", None)
        self._refused = [s for s in self._refused if idle is None or not idle(s)]
        return self.pending or bool(self._refused)

    def on_launch(self, event: ev.LaunchBegin) -> None:
        """An NCCL kernel launched while recording: its calls kept, or refused saying why."""
        log = self._log
        device = self._devices.now()
        # taken outside regions too: they are past then
        calls = log.take(device) if log is not None else []
        if not self._region.recording:
            return
        why = self._collectives_refused(calls, log, device)
        if why:
            self._refused_launch(event.stream)
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
                self._refused_launch(event.stream)
                self._refusals.refuse(event.call, what, event.stream)
                return
            root = communicator.rank == call.root
            sent = 0 if call.operation == "Broadcast" and not root else call.sent or 0  # NCCL ignores them
            received = 0 if call.operation == "Reduce" and not root else call.received or 0
            send = self._range(call.sendbuff, sent)
            receive = self._range(call.recvbuff, received)
            if send is None or receive is None:
                which = "send" if send is None else "receive"
                self._refused_launch(event.stream)
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
        if launched and self._devices.several:  # before its kernel is queued: none may be pending
            devices = {c.device for c in log.communicators.values() if c.device >= 0} if log is not None else set()
            self._reserve(devices | {device}, sum(r.size for r in launched if r.receive is not None))
        if launched:
            stream = self._streams.stream(event.stream)
            self._launches.append(_Launch(launched, event.stream, stream, device, threading.get_ident()))
        self._report.collectives += len(calls)

    def on_launch_end(self, event: ev.LaunchEnd) -> None:
        """An NCCL kernel's launch call returned: on several devices, a copy of each call's results
        is queued after it (on one device they are read at the next event, as always)."""
        if not self._devices.several:
            return
        me = threading.get_ident()
        set_aside = getattr(self._memory, "set_aside", None)  # a plain reader reads once the stream is idle
        for launch in list(self._launches):
            if launch.thread != me or launch.returned:
                continue
            launch.returned = True
            if event.result or set_aside is None:
                continue
            size = sum(r.size for r in launch.calls if r.receive is not None)
            if self._held + size > SET_ASIDE_BYTES:
                self._write_ready(set())  # what has run frees its room
            why = ""
            if self._held + size > SET_ASIDE_BYTES:
                why = (
                    f"its results ({size} bytes) would hold more than {SET_ASIDE_BYTES} bytes aside on the "
                    "devices for collectives not read back yet"
                )
            for r in launch.calls if not why else ():
                if r.receive is not None:
                    allocation, offset = r.receive
                    try:
                        r.aside = set_aside(allocation.address + offset, r.size, launch.stream)
                    except DeviceError as exc:
                        why = f"its results could not be copied aside: {exc}"
                        break
                    if r.aside is None:
                        why = (
                            f"no room for a copy of its results ({r.size} bytes) in the memory reserved for them "
                            f"on device {launch.device} (more is allocated only while no collective is pending: "
                            "cuMemAlloc may wait for the device, where a kernel may wait for its peer's launch)"
                        )
                        break
                    launch.held += r.size
            self._held += launch.held
            if why:
                self._refuse(launch, why)
                self._launches.remove(launch)

    def before(self, event: object, unlocked: Callable[[], AbstractContextManager[object]]) -> None:
        """Before ``event`` is recorded: the collectives it must follow in the capture written (on
        several devices their copies waited for with the recorder's locks let go, ``unlocked``),
        and those whose copies ran."""
        if not self._devices.several:  # one device: each read at the next event, once its stream is idle
            self._write_all()
            return
        needs = self._needs(event)
        self._wait([launch for launch in self._launches if id(launch) in needs], unlocked)
        self._write_ready(needs)
        self._release()

    def write_received(self, unlocked: Callable[[], AbstractContextManager[object]] | None = None) -> None:
        """Every collective launched, with the bytes it left (a region or scope ends). On several
        devices waited for as ``before`` does, with the locks let go when ``unlocked`` is given
        (else only those that ran are written); those not ready by then are refused by name."""
        if not self._devices.several:
            self._write_all()
            return
        if unlocked is not None:
            self._wait(list(self._launches), unlocked)
        self._write_ready({id(launch) for launch in self._launches})
        self._release()

    def _refused_launch(self, stream: int) -> None:
        if self._devices.several:
            self._refused.append(stream)

    def _write_all(self) -> None:
        """One device: every launch's calls, each read once its stream is idle."""
        launches, self._launches = self._launches, []
        for launch in launches:
            self._write(launch)

    def _wait(self, launches: list[_Launch], unlocked: Callable[[], AbstractContextManager[object]]) -> None:
        """Until the copies of ``launches`` ran (or their streams are idle, where none was queued),
        at most COLLECTIVE_WAIT_SECONDS in all, with the recorder's locks let go: a peer's kernel
        may yet be launched by another thread. Copies are never released while a thread waits
        (another thread may write these launches meanwhile)."""
        memory = self._memory
        done = getattr(memory, "set_aside_done", None)
        idle = getattr(memory, "stream_idle", None)
        waits = [r.aside for launch in launches for r in launch.calls if r.aside is not None]
        waits = [aside for aside in waits if done is not None and not done(aside)]
        streams = [launch.stream for launch in launches if _unset(launch)] if idle is not None else []
        streams = [stream for stream in streams if not idle(stream)]
        if not waits and not streams:
            return
        self._waiters += 1
        try:
            with unlocked():
                deadline = time.monotonic() + COLLECTIVE_WAIT_SECONDS
                for aside in waits:
                    done(aside, max(0.0, deadline - time.monotonic()))
                for stream in streams:
                    idle(stream, max(0.0, deadline - time.monotonic()))
        finally:
            self._waiters -= 1

    def _needs(self, event: object) -> set[int]:
        """The launches ``event`` must follow in the capture (by id), on several devices."""
        if isinstance(event, ev.LaunchEnd):
            return set()  # not an operation
        if isinstance(event, ev.ContextSynchronized):
            device = self._devices.now()
            return {id(launch) for launch in self._launches if launch.device == device}
        if isinstance(event, (ev.Free, ev.Unmapped, ev.AddressFreed)):
            # a call's buffer given back: the call before it (the plan refuses a use after a free)
            start = event.address
            end = start + max(getattr(event, "size", 0), 1)
            return self.using(start, end)
        if isinstance(event, ev.RepeatedLaunches):
            streams = {int(s) for s in event.launches["stream"]}
        else:
            stream = getattr(event, "stream", None)
            streams = {stream} if stream is not None else set()
        needs = {id(launch) for launch in self._launches if launch.stream in streams}
        # the legacy default stream's work waits for the blocking streams' before it, and a
        # blocking stream's for the legacy stream's (replay issues them in the file's order)
        legacy = any(s in _LEGACY for s in streams)
        blocking = any(self._streams.blocking(s) for s in streams)
        if legacy or blocking:
            device = self._devices.now()
            for launch in self._launches:
                if launch.device != device:
                    continue
                if (legacy and self._streams.blocking(launch.stream)) or (blocking and launch.stream in _LEGACY):
                    needs.add(id(launch))
        return needs

    def using(self, start: int, end: int) -> set[int]:
        """The launches (by id) with a call whose send or receive buffer's allocation meets [start, end)."""
        found = set()
        for launch in self._launches:
            for r in launch.calls:
                for held in (r.send, r.receive):
                    if held is not None and held[0].address < end and start < held[0].address + held[0].size:
                        found.add(id(launch))
        return found

    def before_free(self, address: int, size: int, unlocked: Callable[[], AbstractContextManager[object]]) -> None:
        """Before a framework frees its block [address, address + size): the collectives that use
        it written first (waited for as ``before`` does)."""
        if not self._devices.several:
            self._write_all()
            return
        needs = self.using(address, address + max(size, 1))
        self._wait([launch for launch in self._launches if id(launch) in needs], unlocked)
        self._write_ready(needs)
        self._release()

    def _write_ready(self, needs: set[int]) -> None:
        """The launches in ``needs``, and any other whose copies ran, written in launch order (a
        launch after one that waits on its stream waits too); one in ``needs`` whose copies have not
        run (its stream not idle, where none was queued) is refused by name."""
        done = getattr(self._memory, "set_aside_done", None)
        idle = getattr(self._memory, "stream_idle", None)
        waiting: set[int] = set()
        kept = []
        for launch in self._launches:
            asides = [r.aside for r in launch.calls if r.aside is not None]
            ran = done is None or all(done(a) for a in asides)
            ready = launch.returned and len(asides) == sum(r.receive is not None for r in launch.calls)
            ready = ready and launch.stream not in waiting and ran
            if id(launch) in needs or ready:
                late = not ran or (idle is not None and _unset(launch) and not idle(launch.stream))
                if late:
                    self._refuse(launch, f"its results were not ready after {COLLECTIVE_WAIT_SECONDS:g} s")
                    continue
                self._write(launch)
            else:
                waiting.add(launch.stream)
                kept.append(launch)
        self._launches = kept

    def _release(self) -> None:
        """Copies read back, and refused ones that ran, released while no thread waits on a copy."""
        if self._waiters:
            return
        release = getattr(self._memory, "release_aside", None)
        done = getattr(self._memory, "set_aside_done", None)
        ran = [a for a in self._abandoned if done is not None and done(a)]
        self._abandoned = [a for a in self._abandoned if a not in ran]
        spent, self._spent = self._spent + ran, []
        for aside in spent if release is not None else ():
            try:
                release(aside)
            except DeviceError:
                pass

    def _refuse(self, launch: _Launch, why: str) -> None:
        """A launch's calls refused by name; its copies released once they ran."""
        for r in launch.calls:
            if r.aside is not None:
                self._abandoned.append(r.aside)
                r.aside = None
        self._held -= launch.held
        launch.held = 0
        self._refusals.refuse("ncclKernel", f"{launch.calls[0].collective.describe()}: {why}", launch.stream)

    def _range(self, address: int, size: int) -> tuple[Allocation, int] | tuple[()] | None:
        """(allocation, offset) of a call's range; () when it has none; None when no recorded
        allocation holds it."""
        if not size or not address:
            return ()
        allocation = self._allocations.device_allocation(address)
        if allocation is None or address + size > allocation.address + allocation.size:
            return None
        return allocation, address - allocation.address

    def _collectives_refused(self, calls: list[Collective], log: CollectiveLog | None, device: int) -> str:
        if log is None or not log.on:
            return (log.why_not if log is not None else "") or "the recorder did not read NCCL's log"
        if not calls:
            # a group's later kernels carry the calls its first kernel was given
            seen = log.seen_on(device) if self._devices.several else log.seen
            return "" if seen else "NCCL's log names no call for it (NCCL started before the recorder?)"
        unknown = [c for c in calls if c.received is None]
        return f"{unknown[0].describe()}: this version does not record it" if unknown else ""

    def _write(self, launch: _Launch) -> None:
        """A launch's calls, each with the bytes it left (read from its copy, or once its stream is idle)."""
        self._held -= launch.held
        launch.held = 0
        for r in launch.calls:
            call, data = r.collective, None
            if r.receive is not None:
                allocation, offset = r.receive
                try:
                    if r.aside is not None:
                        aside, r.aside = r.aside, None
                        self._spent.append(aside)  # released once no thread waits on it
                        data = self._memory.take_aside(aside)
                    else:
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
                launch.stream_object if self._devices.several else self._streams.stream(call.stream),
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
