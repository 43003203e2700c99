"""A rank's NCCL calls recorded as collective operations (format 1.5) with the bytes they left:
NCCL's log lines parsed (calls, and the communicators made with this rank and their id), the send
range touched and the receive range prepared before the kernel runs and read back, in stream
order, at the recorder's next event; and the refusals (no log, a kernel no call explains, an
unknown operation, a communicator never seen made). A process on several devices:
test_capture_collectives_devices.py.
Translated from synthetic events and real NCCL log lines, on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
from test_capture_translate import MODULE, A, B, FakeMemory, kernel, record, saxpy_params

import replayfmt
from replayfmt.capture import events as ev
from replayfmt.capture.nccl_log import Collective, CollectiveLog, Communicator, parse_init, parse_line
from replayfmt.format import model as m
from replayfmt.replay.plan import PlanOptions, build_plan

NCCL_STREAM = 0x5EED
# as NCCL 2.2x writes them (hostname:pid:tid [device] NCCL INFO ...)
ALL_REDUCE = (
    b"gpu7:1234:1299 [0] NCCL INFO AllReduce: opCount 3 sendbuff 0x7f0000100000 recvbuff 0x7f0000100000 "
    b"count 256 datatype 7 op 0 root 0 comm 0x55d0c0 [nranks=2] stream 0x5eed"
)
# the line NCCL writes (subsystem INIT) once the communicator the calls name is made
COMM_MADE = (
    b"gpu7:1234:1299 [0] NCCL INFO ncclCommInitRankConfig comm 0x55d0c0 rank 1 nranks 2 cudaDev 1 nvmlDev 1 "
    b"busId 19000 commId 0x9b4a3f1c2d7e8a55 - Init COMPLETE"
)
ALL_GATHER = (
    b"gpu7:1234:1299 [0] NCCL INFO AllGather: opCount 4 sendbuff 0x7f0000000000 recvbuff 0x7f0000100000 "
    b"count 64 datatype 9 op 0 root 0 comm 0x55d0c0 [nranks=4] stream (nil)"
)


def test_nccl_log_lines_are_read_as_calls():
    reduce = parse_line(ALL_REDUCE)
    assert reduce == Collective("AllReduce", B, B, 256, 7, 0, 0, 0x55D0C0, 2, NCCL_STREAM)
    assert reduce.received == 1024  # 256 float32
    gather = parse_line(ALL_GATHER)
    assert gather is not None and gather.stream == 0 and gather.received == 64 * 4 * 2  # bf16 from 4 ranks
    assert parse_line(b"gpu7:1234:1299 [0] NCCL INFO Init COMPLETE") is None
    send = Collective("Send", A, 0, 8, 7, 0, 1, 1, 2, 0)
    assert send.received == 0
    assert Collective("AllToAllv", A, B, 8, 7, 0, 0, 1, 2, 0).received is None  # not known: refused


class FakeLog(CollectiveLog):
    """NCCL's log as a list of lines handed out at each launch."""

    def __init__(self, batches: list[list[bytes]], *, on: bool = True) -> None:
        super().__init__()
        self._batches = batches
        self._on = on
        self.why_not = "" if on else "NCCL_DEBUG is set in the program's environment"

    @property
    def on(self) -> bool:  # type: ignore[override]
        return self._on

    def new_lines(self) -> list[bytes]:
        return self._batches.pop(0) if self._batches else []


def nccl_kernel() -> ev.Kernel:
    return ev.Kernel(0xACC, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", MODULE, ((0, 8),))


def ddp_step(cubin: bytes, mem: FakeMemory, log_lines: list[bytes]) -> list:
    """A gradient in B all-reduced on NCCL's stream (the peer's half added: all ones), then read by saxpy."""
    grad = np.arange(256, dtype=np.float32)
    mem.device[A] = bytearray(np.ones(256, dtype=np.float32).tobytes())
    mem.device[B] = bytearray(grad.tobytes())

    def all_reduce_runs():  # the collective runs on the device while the host goes on
        mem.device[B][:] = (grad + 1).astype(np.float32).tobytes()
        return ev.EventRecorded(0xE1, NCCL_STREAM)

    return [
        ev.ModuleImage(MODULE, cubin, None, "cuModuleLoadData"),
        ev.Allocation(A, 1024),
        ev.Allocation(B, 1024),
        ev.StreamCreated(NCCL_STREAM, 1),
        ev.EventCreated(0xE1),
        ev.LaunchBegin(nccl_kernel(), (2, 1, 1), (512, 1, 1), 0, NCCL_STREAM, bytes(8), call="cuLaunchKernelEx"),
        all_reduce_runs,
        ev.StreamWaited(0, 0xE1),
        ev.LaunchBegin(kernel(), (1, 1, 1), (256, 1, 1), 0, 0, saxpy_params(2.0, B, A, 256)),
        ev.LaunchEnd(0),
    ], log_lines


def test_a_communicator_made_is_read_with_this_rank_and_its_id():
    log = CollectiveLog()
    assert log.read_lines([COMM_MADE, ALL_REDUCE]) == [parse_line(ALL_REDUCE)]
    assert log.communicators == {0x55D0C0: Communicator("nccl-0x9b4a3f1c2d7e8a55", 1, 2, device=1)}
    # without NCCL's id (a split), the communicators of one size are named in the order they were made
    split = COMM_MADE.replace(b"commId 0x9b4a3f1c2d7e8a55", b"parent 0x1 color 0 key 1").replace(b"0x55d0c0", b"0x77")
    log.read_lines([split])
    assert log.communicators[0x77] == Communicator("nccl-2-ranks-1", 1, 2, device=1)
    assert parse_init(b"gpu7:1234:1299 [0] NCCL INFO Channel 00/02 : 0 1") is None


def test_a_collective_is_kept_with_the_bytes_it_left_in_stream_order(tmp_path, cubin):
    mem = FakeMemory()
    events, lines = ddp_step(cubin, mem, [COMM_MADE, ALL_REDUCE])
    path, t = record(tmp_path, events, mem, collectives=FakeLog([lines]))
    assert not t.report.errors and not t.report.unsupported and t.report.collectives == 1
    with replayfmt.open(path) as cap:
        ops = list(cap.iter_operations())
        buffers = {o.address: o for o in cap.objects() if isinstance(o, m.Buffer)}
        streams = {o.captured_handle: o.id for o in cap.objects() if isinstance(o, m.Stream)}
        kinds = [op.kind for op in ops]
        assert m.OperationKind.LAUNCH in kinds and kinds.count(m.OperationKind.LAUNCH) == 1  # no NCCL kernel
        call = next(op for op in ops if isinstance(op, m.Collective))
        assert (call.operation, call.count, call.datatype, call.reduction) == (
            m.CollectiveOperation.ALL_REDUCE,
            256,
            7,
            0,
        )
        assert (call.rank, call.ranks, call.communicator, call.group) == (1, 2, "nccl-0x9b4a3f1c2d7e8a55", 0)
        assert (call.send_buffer, call.send_offset, call.recv_buffer, call.recv_offset) == (buffers[B].id, 0) * 2
        assert call.stream == streams[NCCL_STREAM] and call.root == -1
        assert np.array_equal(np.frombuffer(cap.read_payload(call.received), np.float32), np.arange(256) + 1)
        # in stream order: after the collective's place, before the event the compute stream waits on
        assert ops.index(call) < next(i for i, op in enumerate(ops) if op.kind == m.OperationKind.EVENT_RECORD)
        # what it sends is starting state: the region did not write it before the call
        sent = [op for op in ops if isinstance(op, m.State) and op.buffer == buffers[B].id]
        assert [(s.offset, s.size) for s in sent] == [(0, 1024)]
        assert np.array_equal(np.frombuffer(cap.read_payload(sent[0].payload), np.float32), np.arange(256))
        plan = build_plan(cap, PlanOptions())
        assert not plan.problems  # one rank replays alone: what it received is staged as an upload
        assert ("payload", call.received, 0) in plan.uploads


def test_the_calls_of_one_kernel_are_one_group_and_a_reduce_leaves_nothing_off_its_root(tmp_path, cubin):
    mem = FakeMemory()
    reduce = ALL_REDUCE.replace(b"AllReduce", b"Reduce").replace(b"root 0", b"root 0")  # this process is rank 1
    events, lines = ddp_step(cubin, mem, [COMM_MADE, ALL_REDUCE, reduce])
    path, t = record(tmp_path, events, mem, collectives=FakeLog([lines]))
    assert not t.report.unsupported and t.report.collectives == 2
    with replayfmt.open(path) as cap:
        calls = [op for op in cap.iter_operations() if isinstance(op, m.Collective)]
        assert [c.operation.label for c in calls] == ["AllReduce", "Reduce"]
        assert calls[0].group == calls[1].group == 1
        assert calls[1].root == 0 and calls[1].recv_size == 0 and calls[1].received == 0  # only the root receives
        assert not build_plan(cap, PlanOptions()).problems


def test_a_call_on_a_communicator_never_seen_made_is_refused(tmp_path, cubin):
    mem = FakeMemory()
    events, lines = ddp_step(cubin, mem, [ALL_REDUCE])
    _, t = record(tmp_path, events, mem, collectives=FakeLog([lines]))
    assert t.report.unsupported == {"cuLaunchKernelEx": 1} and t.report.collectives == 0


@pytest.mark.parametrize(
    ("log", "reason"),
    [
        (FakeLog([[ALL_REDUCE]], on=False), "NCCL_DEBUG is set"),
        (FakeLog([[]]), "NCCL's log names no call for it"),
        (FakeLog([[ALL_REDUCE.replace(b"AllReduce", b"AllToAllv")]]), "this version does not record it"),
        (FakeLog([[ALL_REDUCE]]), "which rank of its communicator"),
    ],
)
def test_a_collective_that_cannot_be_kept_is_refused_saying_why(tmp_path, cubin, log, reason):
    mem = FakeMemory()
    events, _ = ddp_step(cubin, mem, [])
    path, t = record(tmp_path, events, mem, collectives=log)
    assert t.report.unsupported == {"cuLaunchKernelEx": 1}
    with replayfmt.open(path) as cap:
        refused = next(op for op in cap.iter_operations() if op.kind == m.OperationKind.UNSUPPORTED)
        assert "collective (NCCL) kernel" in refused.reason and reason in refused.reason
