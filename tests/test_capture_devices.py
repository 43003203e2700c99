"""The recorder follows a program that works on several devices from one process: every object is
written on the device it lives on (buffers on their memory's device, streams, events and graphs on
the device of the context that made them), peer copies are recorded as device-to-device copies, and
the plan of such a capture needs as many GPUs. Translated from synthetic events, on the CPU."""

from __future__ import annotations

import numpy as np
from test_capture_translate import MODULE, A, B, C, FakeMemory, kernel, record, saxpy_params

import replayfmt
from replayfmt.capture import events as ev
from replayfmt.capture.contexts import DeviceTracker
from replayfmt.format import model as m
from replayfmt.replay.plan import PlanOptions, build_plan

GPU0, GPU1 = m.Device(ordinal=0, name="gpu0"), m.Device(ordinal=1, name="gpu1")
STREAM1 = 0x5151


def two_device_pipeline(cubin: bytes, mem: FakeMemory) -> list:
    """Stage one on cuda:0 computes into A, its result is copied to B on cuda:1 (cuMemcpyPeerAsync),
    stage two runs on cuda:1 on a stream of its own; C on cuda:1 was allocated before recording."""
    x = np.arange(256, dtype=np.float32)
    mem.device[A] = bytearray(x.tobytes())
    mem.device[B] = bytearray(1024)
    mem.device[C] = bytearray(np.ones(256, dtype=np.float32).tobytes())
    mem.before_allocation[C] = 1024
    mem.devices[C] = 1

    def peer_copy():
        mem.device[B][:] = mem.device[A]
        return ev.Copy(ev.CopyDirection.D2D, B, A, 1024, STREAM1, True, "cuMemcpyPeerAsync")

    def stage_two():
        mem.device[C][:] = (2 * np.frombuffer(bytes(mem.device[B]), np.float32) + 1).astype(np.float32).tobytes()
        return ev.LaunchBegin(kernel(), (1, 1, 1), (256, 1, 1), 0, STREAM1, saxpy_params(2.0, B, C, 256))

    return [
        ev.DeviceChanged(GPU0),
        ev.ModuleImage(MODULE, cubin, None, "cuModuleLoadData"),
        ev.Allocation(A, 1024),
        ev.LaunchBegin(kernel(), (1, 1, 1), (256, 1, 1), 0, 0, saxpy_params(1.0, A, A, 256)),
        ev.LaunchEnd(0),
        ev.DeviceChanged(GPU1),
        ev.StreamCreated(STREAM1),
        ev.EventCreated(0xE1),
        ev.Allocation(B, 1024),
        peer_copy,
        stage_two,
        ev.LaunchEnd(STREAM1),
        ev.EventRecorded(0xE1, 0),  # on cuda:1's default stream
        ev.DeviceChanged(GPU0),
        ev.StreamWaited(0, 0xE1),
        ev.ContextSynchronized(),
    ]


def test_each_object_is_written_on_its_own_device(tmp_path, cubin):
    mem = FakeMemory()
    path, t = record(tmp_path, two_device_pipeline(cubin, mem), mem)
    assert not t.report.errors and not t.report.partial
    with replayfmt.open(path) as cap:
        objects = list(cap.objects())
        devices = {o.ordinal: o.id for o in objects if isinstance(o, m.Device)}
        assert sorted(devices) == [0, 1]
        buffers = {o.address: o for o in objects if isinstance(o, m.Buffer)}
        assert buffers[A].device == devices[0]
        assert buffers[B].device == devices[1]
        assert buffers[C].device == devices[1]  # allocated before recording: its memory's device, asked
        streams = {(o.device, o.captured_handle): o for o in objects if isinstance(o, m.Stream)}
        # once the program works on two devices each device's default stream is a stream of its own
        assert sorted(streams) == sorted([(devices[1], 0), (devices[1], STREAM1), (devices[0], 0)])
        events = [o for o in objects if isinstance(o, m.Event)]
        assert [e.device for e in events] == [devices[1]]
        ops = list(cap.iter_operations())
        copy = next(op for op in ops if isinstance(op, m.Copy))
        assert (copy.src_buffer, copy.dst_buffer) == (buffers[A].id, buffers[B].id)
        # the record on cuda:1's default stream and the wait on cuda:0's stay on their devices
        recorded = next(op for op in ops if isinstance(op, m.EventRecord))
        wait = next(op for op in ops if isinstance(op, m.StreamWaitEvent))
        assert (recorded.stream, wait.stream) == (streams[devices[1], 0].id, streams[devices[0], 0].id)
        assert wait.event == recorded.event
        launches = [op for op in ops if isinstance(op, m.Launch)]
        assert launches[0].stream == 0  # before the program worked on a second device: stream 0
        sync = next(op for op in ops if isinstance(op, m.DeviceSynchronize))
        assert sync.device == devices[0]  # the context synchronised was cuda:0's
        plan = build_plan(cap, PlanOptions())
        assert not plan.problems
        assert len(plan.devices) == 2  # replay needs two GPUs, one for each captured device


def test_a_single_device_program_writes_one_device(tmp_path, cubin):
    mem = FakeMemory()
    events = [e for e in two_device_pipeline(cubin, mem) if not (isinstance(e, ev.DeviceChanged) and e.device is GPU1)]
    mem.devices.clear()
    path, _ = record(tmp_path, events, mem)
    with replayfmt.open(path) as cap:
        assert len([o for o in cap.objects() if isinstance(o, m.Device)]) == 1


class _Contexts:
    """ProgramContexts' answers for three contexts: two on cuda:0, one on cuda:1."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def device_of_context(self, context: int) -> m.Device | None:
        self.asked.append(context)
        return {0: None, 0xC0: GPU0, 0xC2: GPU0, 0xC1: GPU1}[context]


def test_the_source_says_when_the_calling_device_changes():
    contexts = _Contexts()
    tracker = DeviceTracker(contexts)  # type: ignore[arg-type]
    moves = [tracker.moved(c) for c in (0xC0, 0xC0, 0, 0xC2, 0xC1, 0xC1, 0xC0)]
    # a second context on the same device, and a call with no context, move nothing
    assert moves == [GPU0, None, None, None, GPU1, None, GPU0]
    assert contexts.asked == [0xC0, 0, 0xC2, 0xC1, 0xC0]  # a repeated context is not asked again
    assert DeviceTracker(None).moved(0xC1) is None  # a stand-in source follows no device


def test_a_rank_on_its_own_device_writes_that_device_alone(tmp_path, cubin):
    """A torchrun rank starts the recorder while cuda:0 is current, then works on cuda:1 alone."""
    mem = FakeMemory()
    events = [e for e in two_device_pipeline(cubin, mem) if not isinstance(e, ev.DeviceChanged)]
    mem.devices.clear()
    path, t = record(tmp_path, [ev.DeviceChanged(GPU1), *events], mem)
    assert not t.devices.several
    with replayfmt.open(path) as cap:
        devices = [o for o in cap.objects() if isinstance(o, m.Device)]
        assert [d.ordinal for d in devices] == [1]
        assert not [
            o for o in cap.objects() if isinstance(o, m.Stream) and o.captured_handle == 0
        ]  # stream 0 is its own
