"""Collectives of a process that drives two devices (a sharded JAX step: one rank of a communicator
per device, each device's calls made from its own thread): NCCL's log read per device, each call's
results copied aside after its kernel on its stream and read back only once that copy ran, the
waits letting another thread record the peer's launch, and the calls written per device with their
ranks. Translated from synthetic events and NCCL 2.2x log lines, on the CPU."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest
from test_capture_collectives import FakeLog
from test_capture_translate import MODULE, A, B, FakeMemory, kernel, record, saxpy_params

import replayfmt
from replayfmt.capture import collective_events, events as ev
from replayfmt.capture.hostfiles import HostFiles
from replayfmt.capture.nccl_log import CollectiveLog, Communicator
from replayfmt.capture.options import RecordOptions
from replayfmt.capture.translate import Translator
from replayfmt.format import model as m
from replayfmt.replay.plan import PlanOptions, build_plan
from replayfmt.writer import CaptureWriter

GPU0, GPU1 = m.Device(ordinal=0, name="gpu0"), m.Device(ordinal=1, name="gpu1")
S0, S1 = 0x5A0, 0x5A1  # XLA's compute streams of cuda:0 and cuda:1
COMM_ID = b"0x7c1e9d40a5b3f211"
# the two communicators of one clique, made in one group by one process (NCCL 2.2x, subsystem INIT)
INIT0 = (
    b"gpu7:4321:4400 [0] NCCL INFO ncclCommInitRankConfig comm 0x5612a0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 "
    b"busId 18000 commId " + COMM_ID + b" - Init COMPLETE"
)
INIT1 = (
    b"gpu7:4321:4401 [1] NCCL INFO ncclCommInitRankConfig comm 0x5612b0 rank 1 nranks 2 cudaDev 1 nvmlDev 1 "
    b"busId 19000 commId " + COMM_ID + b" - Init COMPLETE"
)


def all_reduce(comm: bytes, buffer: int, stream: int, thread: bytes, dev: bytes, op_count: int = 0) -> bytes:
    return (
        b"gpu7:4321:" + thread + b" [" + dev + b"] NCCL INFO AllReduce: opCount " + str(op_count).encode()
        + b" sendbuff " + hex(buffer).encode() + b" recvbuff " + hex(buffer).encode()
        + b" count 256 datatype 7 op 0 root 0 comm " + comm + b" [nranks=2] stream " + hex(stream).encode()
    )  # fmt: skip


CALL0 = all_reduce(b"0x5612a0", A, S0, b"4402", b"0")
CALL1 = all_reduce(b"0x5612b0", B, S1, b"4403", b"1")


def test_the_log_gives_each_device_the_calls_of_its_own_communicators():
    log = CollectiveLog()
    log.read_lines([INIT0, INIT1])
    assert log.communicators == {
        0x5612A0: Communicator("nccl-0x7c1e9d40a5b3f211", 0, 2, device=0),
        0x5612B0: Communicator("nccl-0x7c1e9d40a5b3f211", 1, 2, device=1),
    }
    lines = [CALL1, CALL0, all_reduce(b"0x5612b0", B, S1, b"4403", b"1", 1)]  # interleaved by two threads
    fake = FakeLog([lines, []])
    fake.communicators = log.communicators
    first = fake.take(0)  # cuda:0's kernel carries cuda:0's call only
    assert [(c.communicator, c.stream) for c in first] == [(0x5612A0, S0)]
    second = fake.take(1)  # the rest waited for cuda:1's launch, in call order
    assert [(c.communicator, c.stream) for c in second] == [(0x5612B0, S1)] * 2
    assert (fake.seen_on(0), fake.seen_on(1), fake.take(0)) == (1, 2, [])


def test_communicators_without_nccl_id_are_named_alike_on_each_device():
    log = CollectiveLog()
    split = [line.replace(b"commId " + COMM_ID, b"parent 0x1 color 0 key 0") for line in (INIT0, INIT1)]
    log.read_lines(split)
    assert {c.identity for c in log.communicators.values()} == {"nccl-2-ranks-1"}


class AsideMemory(FakeMemory):
    """Device memory whose collectives run once both devices' kernels were launched (their
    results copied aside after them), with every call the recorder makes kept in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []
        self.asides: dict[int, tuple[int, int]] = {}  # stream -> (address, size) copied aside
        self.copies: dict[int, bytes] = {}  # stream -> what its copy holds, once it ran

    def read(self, address: int, size: int, stream: int | None) -> bytes:
        if stream in (S0, S1):
            self.calls.append(("read", stream))  # a wait for the program's stream
        return super().read(address, size, stream)

    def set_aside(self, address: int, size: int, stream: int) -> int:
        self.calls.append(("set_aside", stream))
        self.asides[stream] = (address, size)
        if len(self.asides) == 2:  # both kernels launched: the all-reduce runs, then the copies
            total = sum(np.frombuffer(bytes(self.device[a]), np.float32) for a, _ in self.asides.values())
            for s, (a, n) in self.asides.items():
                self.device[a][:] = total.astype(np.float32).tobytes()
                self.copies[s] = bytes(self.device[a][:n])
        return stream

    def set_aside_done(self, aside: int, timeout: float = 0.0) -> bool:
        return aside in self.copies

    def take_aside(self, aside: int) -> bytes:
        self.calls.append(("take_aside", aside))
        return self.copies.pop(aside)


def sharded_step(cubin: bytes, mem: AsideMemory) -> list:
    """cuda:0's thread launches its all-reduce and goes on with a kernel on the same stream, while
    cuda:1's thread has yet to launch its own (it does so while the first waits)."""
    mem.device[A] = bytearray(np.arange(256, dtype=np.float32).tobytes())
    mem.device[B] = bytearray(np.full(256, 10, dtype=np.float32).tobytes())
    mem.devices[B] = 1
    nccl = ev.Kernel(0xACC, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", MODULE, ((0, 8),))
    return [
        ev.DeviceChanged(GPU0),
        ev.ModuleImage(MODULE, cubin, None, "cuModuleLoadData"),
        ev.Allocation(A, 1024),
        ev.StreamCreated(S0, 1),
        ev.DeviceChanged(GPU1),
        ev.Allocation(B, 1024),
        ev.StreamCreated(S1, 1),
        ev.DeviceChanged(GPU0),
        ev.LaunchBegin(nccl, (2, 1, 1), (512, 1, 1), 0, S0, bytes(8), call="cuLaunchKernelEx"),
        ev.LaunchEnd(S0),
        ev.LaunchBegin(kernel(), (1, 1, 1), (256, 1, 1), 0, S0, saxpy_params(2.0, A, A, 256)),
    ], [
        ev.DeviceChanged(GPU1),
        ev.LaunchBegin(nccl, (2, 1, 1), (512, 1, 1), 0, S1, bytes(8), call="cuLaunchKernelEx"),
        ev.LaunchEnd(S1),
    ]


def peer_thread_meanwhile(t, events: list, waited: list) -> None:
    """The translator's ``unlocked``: while an event waits, another thread records ``events``
    (it could not if the translator kept its lock: the join would time out)."""

    @contextlib.contextmanager
    def unlocked():
        waited.append(True)
        peer = threading.Thread(target=lambda: [t.handle(e) for e in events])
        peer.start()
        peer.join(timeout=10)
        assert not peer.is_alive(), "the peer's launch could not be recorded while the first thread waited"
        yield

    t.unlocked = unlocked


def record_meanwhile(tmp_path, mem, first: list, peer: list, lines=None, *, name: str = "c.kreplay", made=None):
    """``first`` (cuda:0's thread) recorded in region "step" while another thread records ``peer``
    once the first waits (:func:`peer_thread_meanwhile`); NCCL's log gives ``lines`` (both
    communicators made, then both calls). ``made(translator)`` runs before any event. The file,
    the translator, and whether the first thread waited."""
    lines = lines if lines is not None else [[INIT0, INIT1, CALL1, CALL0], []]
    waited: list = []
    path = tmp_path / name
    with CaptureWriter(path) as writer:
        t = Translator(
            writer, RecordOptions(), mem, host_files=HostFiles(tmp_path / "no-maps"), collectives=FakeLog(lines)
        )
        if made is not None:
            made(t)
        peer_thread_meanwhile(t, peer, waited)
        t.start("step")
        for e in first:
            t.handle(e)
        t.stop()
    return path, t, waited


def test_each_device_s_calls_are_written_with_its_rank_once_the_peer_launched(tmp_path, cubin):
    mem = AsideMemory()
    first, peer = sharded_step(cubin, mem)
    path, t, waited = record_meanwhile(tmp_path, mem, first, peer)
    assert waited == [True] and not t.report.errors and not t.report.unsupported and t.report.collectives == 2
    # no wait for a program's stream; cuda:0's result read back only after cuda:1's kernel was launched
    assert mem.calls == [("set_aside", S0), ("set_aside", S1), ("take_aside", S0), ("take_aside", S1)]
    with replayfmt.open(path) as cap:
        objects = list(cap.objects())
        devices = {o.id: o.ordinal for o in objects if isinstance(o, m.Device)}
        streams = {o.id: (devices[o.device], o.captured_handle) for o in objects if isinstance(o, m.Stream)}
        ops = list(cap.iter_operations())
        calls = [op for op in ops if isinstance(op, m.Collective)]
        assert [(c.rank, c.ranks, streams[c.stream], c.group) for c in calls] == [
            (0, 2, (0, S0), 0),
            (1, 2, (1, S1), 0),
        ]
        assert {c.communicator for c in calls} == {"nccl-0x7c1e9d40a5b3f211"}
        expected = np.arange(256, dtype=np.float32) + 10
        for c in calls:
            assert np.array_equal(np.frombuffer(cap.read_payload(c.received), np.float32), expected)
        # cuda:0's call precedes the kernel that follows it on its stream
        launch = next(i for i, op in enumerate(ops) if op.kind == m.OperationKind.LAUNCH)
        assert ops.index(calls[0]) < launch
        assert not build_plan(cap, PlanOptions()).problems  # replayed alone: results put in place


def test_a_peer_that_never_launches_is_refused_by_name_and_the_program_goes_on(tmp_path, cubin, monkeypatch):
    monkeypatch.setattr(collective_events, "COLLECTIVE_WAIT_SECONDS", 0.01)
    mem = AsideMemory()
    first, _ = sharded_step(cubin, mem)
    path, t = record(tmp_path, first, mem, collectives=FakeLog([[INIT0, INIT1, CALL1, CALL0]]))
    assert t.report.unsupported == {"ncclKernel": 1} and not t.report.partial
    assert ("read", S0) not in mem.calls  # never a wait for the program's stream
    with replayfmt.open(path) as cap:
        refused = next(op for op in cap.iter_operations() if op.kind == m.OperationKind.UNSUPPORTED)
        assert "not ready after 0.01 s" in refused.reason and "AllReduce" in refused.reason


def test_results_beyond_the_bound_held_aside_are_refused_by_name(tmp_path, cubin, monkeypatch):
    monkeypatch.setattr(collective_events, "SET_ASIDE_BYTES", 512)
    mem = AsideMemory()
    first, _ = sharded_step(cubin, mem)
    path, t = record(tmp_path, first, mem, collectives=FakeLog([[INIT0, INIT1, CALL1, CALL0]]))
    assert t.report.unsupported == {"ncclKernel": 1} and mem.calls == []
    with replayfmt.open(path) as cap:
        refused = next(op for op in cap.iter_operations() if op.kind == m.OperationKind.UNSUPPORTED)
        assert "would hold more than 512 bytes aside" in refused.reason


def test_a_wait_lets_go_of_a_lock_held_at_any_depth_and_takes_it_again_as_deep():
    """The source's lock is held by its callback and again around the translator (original times)."""
    from replayfmt.capture.translate import released

    lock = threading.RLock()
    with lock, lock:
        with released(lock):
            other = threading.Thread(target=lambda: lock.acquire() and lock.release())
            other.start()
            other.join(timeout=10)
            assert not other.is_alive(), "another thread could not take the lock while this one waited"
        lock.release()  # held twice again: both releases are this thread's
        lock.release()
        with pytest.raises(RuntimeError):
            lock.release()
        lock.acquire()
        lock.acquire()
    with released(lock):  # not held: nothing to let go
        pass


class IdleMemory(AsideMemory):
    """Device memory where no copy can be set aside (a launch's return never seen): the program's
    stream is idle once the peer's kernel was launched (the all-reduce ran)."""

    peer_launched = False

    def stream_idle(self, stream: int, timeout: float = 0.0) -> bool:
        self.calls.append(("idle?", stream))
        if self.peer_launched and not self.copies:
            total = np.frombuffer(bytes(self.device[A]), np.float32) + np.frombuffer(bytes(self.device[B]), np.float32)
            for base in (A, B):
                self.device[base][:] = total.astype(np.float32).tobytes()
            self.copies[0] = b"ran"
        return self.peer_launched


def test_without_its_return_a_call_is_read_once_its_stream_is_idle_waiting_with_the_locks_let_go(tmp_path, cubin):
    mem = IdleMemory()
    first, peer = sharded_step(cubin, mem)
    first = [e for e in first if not isinstance(e, ev.LaunchEnd)]
    peer = [e for e in peer if not isinstance(e, ev.LaunchEnd)]
    waited: list = []
    path = tmp_path / "c.kreplay"
    with CaptureWriter(path) as writer:
        log = FakeLog([[INIT0, INIT1, CALL1, CALL0], []])
        t = Translator(writer, RecordOptions(), mem, host_files=HostFiles(tmp_path / "no-maps"), collectives=log)
        peer_thread_meanwhile(t, [*peer, lambda: setattr(mem, "peer_launched", True)], waited)
        t.handle = (lambda handle: lambda e: e() if callable(e) else handle(e))(t.handle)
        t.start("step")
        for e in first:
            t.handle(e)
        t.stop()
    assert waited == [True] and not t.report.unsupported and t.report.collectives == 2
    assert mem.calls.index(("read", S0)) > mem.calls.index(("idle?", S0))  # read once idle, never before
    with replayfmt.open(path) as cap:
        call = next(op for op in cap.iter_operations() if isinstance(op, m.Collective))
        assert call.rank == 0
        assert np.array_equal(np.frombuffer(cap.read_payload(call.received), np.float32), np.arange(256) + 10)


def test_without_its_return_a_peer_that_never_launches_is_refused_by_name(tmp_path, cubin, monkeypatch):
    monkeypatch.setattr(collective_events, "COLLECTIVE_WAIT_SECONDS", 0.01)
    mem = IdleMemory()
    first, _ = sharded_step(cubin, mem)
    first = [e for e in first if not isinstance(e, ev.LaunchEnd)]
    _, t = record(tmp_path, first, mem, collectives=FakeLog([[INIT0, INIT1, CALL1, CALL0]]))
    assert t.report.unsupported == {"ncclKernel": 1} and ("read", S0) not in mem.calls


class ReleasingMemory(AsideMemory):
    """Copies as the driver keeps them: asked about and read until released, never after."""

    def __init__(self) -> None:
        super().__init__()
        self.released: list[int] = []

    def set_aside_done(self, aside: int, timeout: float = 0.0) -> bool:
        assert aside not in self.released, "a copy asked about after it was released"
        return aside in self.copies

    def take_aside(self, aside: int) -> bytes:
        assert aside not in self.released, "a copy read after it was released"
        self.calls.append(("take_aside", aside))
        return self.copies[aside]

    def release_aside(self, aside: int) -> None:
        self.released.append(aside)

    def stream_idle(self, stream: int, timeout: float = 0.0) -> bool:
        self.calls.append(("idle?", stream))
        return True


def test_one_device_reads_each_call_once_its_stream_is_idle_as_before(tmp_path, cubin):
    """A DDP rank (one device): no copy aside, no wait with the locks let go, the reads of a plain
    reader in the same order, whatever the memory offers."""
    from test_capture_collectives import ALL_REDUCE, COMM_MADE, NCCL_STREAM, ddp_step

    def recorded(mem):
        events, lines = ddp_step(cubin, mem, [COMM_MADE, ALL_REDUCE])
        at = next(i for i, e in enumerate(events) if isinstance(e, ev.LaunchBegin)) + 1
        events.insert(at, ev.LaunchEnd(NCCL_STREAM))  # the NCCL kernel's exit reaches the recorder
        path = tmp_path / f"{type(mem).__name__}.kreplay"
        waited: list = []
        with CaptureWriter(path) as writer:
            t = Translator(
                writer, RecordOptions(), mem, host_files=HostFiles(tmp_path / "m"), collectives=FakeLog([lines])
            )
            t.unlocked = lambda: waited.append(True) or contextlib.nullcontext()
            t.start("step")
            for e in events:
                t.handle(e() if callable(e) else e)
            t.stop()
        assert not t.report.unsupported and t.report.collectives == 1
        return waited

    plain, offered = FakeMemory(), ReleasingMemory()
    assert recorded(plain) == [] and recorded(offered) == []
    assert offered.calls == [] and offered.released == []  # no copy aside, no idle query
    assert offered.reads == plain.reads and (B, 1024, NCCL_STREAM) in plain.reads


def test_a_copy_another_thread_read_back_is_released_only_once_no_thread_waits_on_it(tmp_path, cubin):
    mem = ReleasingMemory()
    first, peer = sharded_step(cubin, mem)
    # the peer thread's own event after its launch writes cuda:0's call while cuda:0's thread waits on it
    _, t, waited = record_meanwhile(tmp_path, mem, first, [*peer, ev.EventCreated(0xE5)])
    assert waited == [True] and not t.report.unsupported and not t.report.partial
    assert ("take_aside", S0) in mem.calls and sorted(mem.released) == [S0, S1]  # each released once, after


def test_a_region_end_waits_with_the_locks_let_go_and_records_the_peer_launched_meanwhile(tmp_path, cubin):
    mem = ReleasingMemory()
    first, peer = sharded_step(cubin, mem)
    first = first[: first.index(ev.LaunchEnd(S0)) + 1]  # the region ends right after cuda:0's launch
    path, t, waited = record_meanwhile(tmp_path, mem, first, peer)
    assert waited == [True] and not t.report.unsupported and t.report.collectives == 2
    with replayfmt.open(path) as cap:
        assert sorted(op.rank for op in cap.iter_operations() if isinstance(op, m.Collective)) == [0, 1]
    assert sorted(mem.released) == [S0, S1]


def test_a_region_end_whose_peer_never_launches_refuses_by_name_within_the_bound(tmp_path, cubin, monkeypatch):
    monkeypatch.setattr(collective_events, "COLLECTIVE_WAIT_SECONDS", 0.01)
    mem = ReleasingMemory()
    first, _ = sharded_step(cubin, mem)
    first = first[: first.index(ev.LaunchEnd(S0)) + 1]
    _, t = record(tmp_path, first, mem, collectives=FakeLog([[INIT0, INIT1, CALL1, CALL0]]))
    assert t.report.unsupported == {"ncclKernel": 1} and not t.report.partial
    assert mem.released == []  # its copy never ran: its memory is not reused


def test_one_deadline_bounds_a_wait_on_several_copies(tmp_path, cubin, monkeypatch):
    import time

    monkeypatch.setattr(collective_events, "COLLECTIVE_WAIT_SECONDS", 0.2)
    timeouts: list[float] = []

    class SlowMemory(ReleasingMemory):
        def set_aside_done(self, aside: int, timeout: float = 0.0) -> bool:
            timeouts.append(timeout)
            time.sleep(timeout)
            return False

    mem = SlowMemory()
    first, _ = sharded_step(cubin, mem)
    # one kernel carrying two of cuda:0's calls (a group): two copies, waited for by the kernel after it
    log = FakeLog([[INIT0, INIT1, CALL0, all_reduce(b"0x5612a0", A, S0, b"4402", b"0", 1)]])
    _, t = record(tmp_path, first, mem, collectives=log)
    assert t.report.unsupported == {"ncclKernel": 1}
    waits = [w for w in timeouts if w > 0.01]  # the quick checks ask with no timeout
    assert len(waits) == 1 and waits[0] <= 0.2  # the second copy got what the first left of one deadline


def test_a_copy_the_driver_refuses_to_queue_refuses_its_call_by_name(tmp_path, cubin):
    from replayfmt.errors import DeviceError

    class FailingMemory(ReleasingMemory):
        def set_aside(self, address: int, size: int, stream: int) -> int:
            raise DeviceError("cuMemcpyDtoDAsync (collective's result aside): CUDA_ERROR_INVALID_VALUE")

    mem = FailingMemory()
    first, _ = sharded_step(cubin, mem)
    path, t = record(tmp_path, first, mem, collectives=FakeLog([[INIT0, INIT1, CALL1, CALL0]]))
    assert t.report.unsupported == {"ncclKernel": 1} and not t.report.partial
    with replayfmt.open(path) as cap:
        refused = next(op for op in cap.iter_operations() if op.kind == m.OperationKind.UNSUPPORTED)
        assert "could not be copied aside" in refused.reason and "AllReduce" in refused.reason


def recorded_after_the_call(tmp_path, cubin, after, blocking=False):
    """cuda:0's all-reduce, then ``after`` (instead of the kernel on its stream) while cuda:1's
    thread has yet to launch its own: the operations written, in order."""
    mem = ReleasingMemory()
    first, peer = sharded_step(cubin, mem)
    first = [*first[:-1], after]
    if blocking:  # S0 made without CU_STREAM_NON_BLOCKING
        first = [ev.StreamCreated(S0, 0) if e == ev.StreamCreated(S0, 1) else e for e in first]
    path, t, _ = record_meanwhile(tmp_path, mem, first, peer, name=f"blocking-{blocking}.kreplay")
    assert not t.report.unsupported and not t.report.errors
    with replayfmt.open(path) as cap:
        return list(cap.iter_operations()), build_plan(cap, PlanOptions()).problems


def first_collective_and(ops: list, kind) -> tuple[int, int]:
    return next(i for i, op in enumerate(ops) if isinstance(op, m.Collective)), next(
        i for i, op in enumerate(ops) if op.kind == kind
    )


def test_a_free_of_a_pending_call_s_buffer_writes_the_call_first(tmp_path, cubin):
    ops, problems = recorded_after_the_call(tmp_path, cubin, ev.Free(A))
    call, freed = first_collective_and(ops, m.OperationKind.DESTROY_OBJECT)
    assert call < freed and not problems


def test_a_framework_block_free_of_a_pending_call_s_buffer_writes_the_call_first(tmp_path, cubin):
    mem = ReleasingMemory()
    first, peer = sharded_step(cubin, mem)
    waited: list = []
    path = tmp_path / "c.kreplay"
    with CaptureWriter(path) as writer:
        log = FakeLog([[INIT0, INIT1, CALL1, CALL0], []])
        t = Translator(writer, RecordOptions(), mem, host_files=HostFiles(tmp_path / "no-maps"), collectives=log)
        peer_thread_meanwhile(t, peer, waited)
        t.start("step")
        for e in first[:-1]:
            t.handle(e)
        written = []
        t._checkpoints.release_block = lambda *a: written.append(t.report.collectives and len(t._collectives._launches))
        t.release_block(A, 1024, "freed by PyTorch's caching allocator")
        t.stop()
    assert waited == [True] and written == [0]  # no call of cuda:0 left unwritten at the free


def test_work_on_the_legacy_default_stream_writes_a_blocking_stream_s_pending_call_first(tmp_path, cubin):
    launch = ev.LaunchBegin(kernel(), (1, 1, 1), (256, 1, 1), 0, 0, saxpy_params(2.0, A, A, 256))
    ops, _ = recorded_after_the_call(tmp_path, cubin, launch, blocking=True)
    call, launched = first_collective_and(ops, m.OperationKind.LAUNCH)
    assert call < launched
    # on a non-blocking stream, the legacy stream's work does not wait for it: not forced
    ops, _ = recorded_after_the_call(tmp_path, cubin, launch)
    call, launched = first_collective_and(ops, m.OperationKind.LAUNCH)
    assert launched < call


class PoolMemory(ReleasingMemory):
    """Copies' memory as DriverMemory keeps it: reserved per device (never while a collective is
    pending: the fake fails the test), a copy without room there answered None."""

    def __init__(self, room: int | None = None) -> None:
        super().__init__()
        self.reserved: dict[int, int] = {}
        self.room = room  # what a reservation gets (None: what it asks)
        self.translator = None

    def reserve_aside(self, ordinal: int, size: int) -> bool:
        t = self.translator
        assert t is None or not t._collectives._launches, "copies' memory allocated while a collective is pending"
        self.calls.append(("reserve", ordinal))
        self.reserved[ordinal] = max(self.reserved.get(ordinal, 0), size if self.room is None else self.room)
        return True

    def set_aside(self, address: int, size: int, stream: int) -> int | None:
        if self.reserved.get(self.devices.get(address, 0), 0) < size:
            self.calls.append(("no room", stream))
            return None
        return super().set_aside(address, size, stream)


def record_pooled(tmp_path, cubin, mem: PoolMemory, lines: list) -> Translator:
    first, peer = sharded_step(cubin, mem)
    _, t, _ = record_meanwhile(tmp_path, mem, first, peer, lines, made=lambda t: setattr(mem, "translator", t))
    return t


def test_copies_memory_is_reserved_on_each_device_at_a_region_s_start(tmp_path, cubin):
    mem = PoolMemory()
    t = record_pooled(tmp_path, cubin, mem, [[INIT0, INIT1, CALL1, CALL0], []])
    assert not t.report.unsupported and t.report.collectives == 2
    assert mem.calls[:2] == [("reserve", 0), ("reserve", 1)]  # at the start: both before any launch
    assert mem.reserved == {0: collective_events.ASIDE_POOL_BYTES, 1: collective_events.ASIDE_POOL_BYTES}


def test_communicators_made_inside_the_region_reserve_at_the_first_launch_before_its_kernel(tmp_path, cubin):
    mem = PoolMemory()
    t = record_pooled(tmp_path, cubin, mem, [[], [INIT0, INIT1, CALL1, CALL0], []])
    assert not t.report.unsupported and t.report.collectives == 2
    assert mem.calls[:3] == [("reserve", 0), ("reserve", 1), ("set_aside", S0)]


def test_a_copy_without_room_reserved_refuses_its_call_by_name(tmp_path, cubin):
    mem = PoolMemory(room=0)  # the driver had no memory to give
    t = record_pooled(tmp_path, cubin, mem, [[INIT0, INIT1, CALL1, CALL0], []])
    assert t.report.unsupported == {"ncclKernel": 1} and not t.report.partial
    assert ("read", S0) not in mem.calls and ("no room", S0) in mem.calls
    with replayfmt.open(tmp_path / "c.kreplay") as cap:
        refused = next(op for op in cap.iter_operations() if op.kind == m.OperationKind.UNSUPPORTED)
        assert "no room for a copy of its results" in refused.reason and "device 0" in refused.reason


def test_the_aside_pool_hands_out_room_first_fit_and_joins_what_comes_back():
    from replayfmt.capture.device_memory import AsidePool

    pool = AsidePool()
    assert pool.take(1) is None  # nothing reserved: never an allocation here
    pool.grow(0x1000, 4096)
    a, b, c = pool.take(1000), pool.take(1024), pool.take(2048)
    assert (a, b, c) == ((0x1000, 1024), (0x1400, 1024), (0x1800, 2048)) and pool.take(1) is None
    pool.give(*a)
    pool.give(*c)
    assert pool.largest == 2048
    pool.give(*b)  # joins both neighbours
    assert pool.largest == 4096 and pool.arenas == [(0x1000, 4096)]


def driver_memory(monkeypatch, **calls):
    """A DriverMemory whose driver is a fake of ``calls`` (beside quiet defaults), every address on
    device 1."""
    import types

    from replayfmt.capture import device_memory
    from replayfmt.cuda import driver

    quiet = {
        "cuStreamCreate": lambda flags: (0, 9),
        "cuMemHostAlloc": lambda n, flags: (0, 0x7000),
        "cuMemcpyDtoDAsync": lambda dst, src, n, s: (0,),
        "cuStreamSynchronize": lambda s: (0,),
        "cuEventCreate": lambda flags: (0, 7),
        "cuEventRecord": lambda e, s: (0,),
        "cuEventSynchronize": lambda e: (0,),
        "cuEventDestroy": lambda e: (0,),
    }
    cu = types.SimpleNamespace(
        CUresult=types.SimpleNamespace(CUDA_SUCCESS=0, CUDA_ERROR_NOT_READY=600),
        CUevent_flags=types.SimpleNamespace(CU_EVENT_DISABLE_TIMING=2),
        CUstream_flags=types.SimpleNamespace(CU_STREAM_NON_BLOCKING=1),
        CUstream=lambda s: s,
        **{**quiet, **calls},
    )

    class Contexts:
        def ordinal_of(self, address):
            return 1

        def context_of_device(self, ordinal):
            return ordinal

        def pushed(self, context):
            return contextlib.nullcontext()

    monkeypatch.setattr(device_memory, "driver", lambda: cu)
    monkeypatch.setattr(driver, "driver", lambda: cu)  # check() asks it for CUresult
    return device_memory.DriverMemory(threading.local(), Contexts())


def test_driver_memory_allocates_copies_memory_only_when_reserved(monkeypatch):
    """set_aside never calls cuMemAlloc (it runs right after an NCCL kernel was queued)."""
    calls: list = []
    mem = driver_memory(
        monkeypatch,
        cuMemAlloc=lambda n: calls.append(("cuMemAlloc", n)) or (0, 0x10000),
        cuMemcpyDtoDAsync=lambda dst, src, n, s: calls.append(("copy", dst, n)) or (0,),
    )
    assert mem.set_aside(0xA000, 512, 5) is None and calls == []
    assert mem.reserve_aside(1, 4096) and calls == [("cuMemAlloc", 4096)]
    aside = mem.set_aside(0xA000, 512, 5)
    assert aside.ordinal == 1 and calls[-1] == ("copy", 0x10000, 512)
    assert mem.reserve_aside(1, 1024) and len(calls) == 2  # room enough: no allocation
    mem.release_aside(aside)
    assert mem.set_aside(0xA000, 4096, 5).address == 0x10000


def test_driver_memory_reads_copies_back_without_making_anything(monkeypatch):
    """take_aside runs with the recorder's locks held while a peer's collective may be pending:
    the stream and pinned staging it reads through are made at reserve_aside, and a copy larger
    than the staging is read in pieces of it, as is every read from then on (no cuMemHostAlloc,
    cuMemFreeHost or cuStreamCreate)."""
    import ctypes

    device_bytes = bytes(range(256)) * 64 * 1024  # 16 MiB the copy aside holds: twice the staging
    staging = ctypes.create_string_buffer(8 << 20)
    calls: list = []

    def host_alloc(size, flags):
        calls.append(("cuMemHostAlloc", size))
        assert size <= len(staging)
        return 0, ctypes.addressof(staging)

    def copy_to_host(dst, src, n, stream):
        calls.append(("cuMemcpyDtoHAsync", n))
        ctypes.memmove(dst, device_bytes[src - 0x10000 : src - 0x10000 + n], n)
        return (0,)

    mem = driver_memory(
        monkeypatch,
        cuMemAlloc=lambda n: calls.append(("cuMemAlloc", n)) or (0, 0x10000),
        cuMemHostAlloc=host_alloc,
        cuMemFreeHost=lambda p: calls.append(("cuMemFreeHost",)) or (0,),
        cuStreamCreate=lambda flags: calls.append(("cuStreamCreate",)) or (0, 9),
        cuMemcpyDtoHAsync=copy_to_host,
    )
    assert mem.reserve_aside(1, len(device_bytes))
    made = [c[0] for c in calls]
    assert made == ["cuStreamCreate", "cuMemHostAlloc", "cuMemAlloc"]
    aside = mem.set_aside(0xA000, len(device_bytes), 5)
    del calls[:]
    assert mem.take_aside(aside) == device_bytes
    assert [c[0] for c in calls] == ["cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync"]  # two pieces, nothing made
    del calls[:]  # a call read where no copy was queued: the same pieces, nothing made either
    assert mem.read(0x10000, len(device_bytes), 5) == device_bytes
    assert [c[0] for c in calls] == ["cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync"]
