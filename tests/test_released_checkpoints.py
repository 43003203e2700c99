"""What a region wrote into memory freed before its scope ends is still compared: the
translator checkpoints it before the free (a driver free, or a framework's block free such as
PyTorch's caching allocator's), and verification counts the comparison as evidence. Captures made
by the real translator from synthetic events, verified by the host-memory replayer."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from fake_replayer import HostReplayer
from test_capture_translate import MODULE, FakeMemory, kernel, record, saxpy_params

import replayfmt
from replayfmt.capture import events as ev
from replayfmt.capture.enrich import _install_torch_frees, torch_block_size
from replayfmt.capture.report import Report
from replayfmt.format import model as m
from replayfmt.replay.evidence import Evidence
from replayfmt.replay.plan import PlanOptions, build_plan
from replayfmt.replay.verification import Verification

X, Y, ARENA = 0x7F00_0000_0000, 0x7F00_0010_0000, 0x7F00_0100_0000
N = 256


def step_that_drops_its_result(mem: FakeMemory, *, free: str = "cuMemFreeAsync") -> list:
    """y = 2x + y into an allocation the step frees before it ends (its result dropped)."""
    x = np.arange(N, dtype=np.float32)
    y = np.ones(N, dtype=np.float32)
    mem.device[X] = bytearray(x.tobytes())
    mem.device[Y] = bytearray(y.tobytes())

    def run_kernel():  # the "device" computes y = 2x + y when the launch is enqueued
        mem.device[Y][:] = (2 * x + y).tobytes()
        return ev.LaunchEnd(0)

    return [
        ev.Allocation(X, x.nbytes),
        ev.Allocation(Y, y.nbytes),
        ev.LaunchBegin(kernel(), (1, 1, 1), (N, 1, 1), 0, 0, saxpy_params(2.0, X, Y, N)),
        run_kernel,
        ev.Free(Y, free),
    ]


def axpy(memory: dict[int, bytearray], y: int, x: int, *, wrong_at: int = -1) -> None:
    out = 2 * np.frombuffer(memory[x], np.float32) + np.frombuffer(memory[y], np.float32)
    if wrong_at >= 0:
        out[wrong_at] += 1
    memory[y][:] = out.astype(np.float32).tobytes()


def test_a_result_freed_inside_the_region_is_checkpointed_before_its_free(tmp_path, cubin):
    mem = FakeMemory()
    events = [ev.ModuleImage(MODULE, cubin, None, "cuModuleLoadData"), *step_that_drops_its_result(mem)]
    path, t = record(tmp_path, events, mem)
    assert not t.report.errors and t.report.released_checkpoints == 1
    with replayfmt.open(path) as cap:
        ops = list(cap.iter_operations())
        buffers = {o.address: o.id for o in cap.objects() if isinstance(o, m.Buffer)}
    checkpoints = [op for op in ops if isinstance(op, m.Checkpoint)]
    freed = next(op.index for op in ops if op.kind == m.OperationKind.DESTROY_OBJECT and op.object == buffers[Y])
    before, at_end = checkpoints
    assert before.index < freed and [e.buffer for e in before.entries] == [buffers[Y]]
    assert before.name == f"step (buffer {buffers[Y]} before cuMemFreeAsync)"
    assert [e.buffer for e in at_end.entries] == [buffers[X]]  # y is gone by the region's end
    with replayfmt.open(path) as cap:
        expected = np.frombuffer(cap.read_payload(before.entries[0].payload), np.float32)
    assert np.array_equal(expected, 2 * np.arange(N, dtype=np.float32) + 1)


def verify(path, run):
    with replayfmt.open(path) as cap:
        plan = build_plan(cap, PlanOptions())
        replayer = HostReplayer(plan, run)
        v = Verification(plan, replays=2)
        v.attach(replayer)
        v.note_runs(replayer.run(1))
        assert v.finish(replayer) == []
        return v.report(), {o.address: o.id for o in cap.objects() if isinstance(o, m.Buffer)}


def test_verification_counts_the_freed_result_as_evidence_and_fails_a_wrong_kernel(tmp_path, cubin):
    mem = FakeMemory()
    events = [ev.ModuleImage(MODULE, cubin, None, "cuModuleLoadData"), *step_that_drops_its_result(mem)]
    path, _ = record(tmp_path, events, mem)
    with replayfmt.open(path) as cap:
        ids = {o.address: o.id for o in cap.objects() if isinstance(o, m.Buffer)}
        first = next(op.index for op in cap.iter_operations() if isinstance(op, m.Checkpoint))

    def kernels(wrong_at: int = -1):
        def run(memory: dict[int, bytearray], checkpoint: int, _number: int) -> None:
            if checkpoint == first:  # the launch ran before the checkpoint taken at the free
                axpy(memory, ids[Y], ids[X], wrong_at=wrong_at)

        return run

    report, _ = verify(path, kernels())
    assert report.verified and report.evidence > 0, report.lines()
    freed = next(r for r in report.ranges if r.piece.buffer == ids[Y])
    assert freed.evidence is Evidence.COMPARED and freed.passed
    wrong, _ = verify(path, kernels(wrong_at=37))
    assert not wrong.verified and wrong.problem().startswith("1 of 2 compared range(s) failed")
    lines = wrong.lines()
    where = next(i for i, line in enumerate(lines) if f"buffer {ids[Y]} " in line and "FAIL" in line)
    assert lines[where + 2].split()[:3] == ["148", "75", "76"], lines  # element 37 (byte 148): 2*37 + 1, replayed 76


def test_a_framework_block_the_region_wrote_is_checkpointed_when_the_framework_frees_it(tmp_path, cubin):
    """PyTorch's caching allocator frees a block with no driver call: the recorder hears it from
    PyTorch (enrich) and checkpoints the block if the region's launches pointed into it."""
    mem = FakeMemory()
    mem.device[ARENA] = bytearray(1 << 20)
    mem.device[X] = bytearray(np.arange(N, dtype=np.float32).tobytes())
    out, untouched = ARENA + 0x2000, ARENA + 0x8000

    def run_kernel():
        mem.device[ARENA][0x2000 : 0x2000 + 4 * N] = np.full(N, 5, np.float32).tobytes()
        return ev.LaunchEnd(0)

    def framework_frees(t):
        t.release_block(untouched, 4 * N, "freed by torch")  # never pointed at by the region: not written
        t.release_block(out, 4 * N, "freed by torch")  # the step's result, dropped: no launch after it

    path = tmp_path / "c.kreplay"
    with replayfmt.CaptureWriter(path) as writer:
        from replayfmt.capture import RecordOptions, Translator
        from replayfmt.capture.hostfiles import HostFiles

        t = Translator(writer, RecordOptions(), mem, host_files=HostFiles(tmp_path / "no-maps"))
        t.start("step")
        for e in [
            ev.ModuleImage(MODULE, cubin, None, "cuModuleLoadData"),
            ev.Allocation(X, 4 * N),
            ev.Allocation(ARENA, 1 << 20),
            ev.LaunchBegin(kernel(), (1, 1, 1), (N, 1, 1), 0, 0, saxpy_params(2.0, X, out, N)),
            run_kernel,
        ]:
            t.handle(e() if callable(e) else e)
        framework_frees(t)
        t.stop()
    assert t.report.released_checkpoints == 1 and not t.report.errors
    with replayfmt.open(path) as cap:
        buffers = {o.address: o.id for o in cap.objects() if isinstance(o, m.Buffer)}
        released = next(op for op in cap.iter_operations() if isinstance(op, m.Checkpoint))
        (entry,) = released.entries
        assert (entry.buffer, entry.offset, entry.size) == (buffers[ARENA], 0x2000, 4 * N)
        assert np.array_equal(np.frombuffer(cap.read_payload(entry.payload), np.float32), np.full(N, 5, np.float32))
    assert released.name == f"step (buffer {buffers[ARENA]} freed by torch)"


class _Registry:
    def __init__(self) -> None:
        self.callback_list: list = []

    def add_callback(self, cb) -> None:
        self.callback_list.append(cb)

    def fire_callbacks(self, *args) -> None:
        for cb in self.callback_list:
            cb(*args)


def fake_torch(monkeypatch, segments: list[dict], registry_name: str = "MemoryDeallocationCallbacks") -> _Registry:
    """A PyTorch whose caching allocator's GPU trace fires as the real one does (the module and
    names torch.cuda._gpu_trace has: MemoryDeallocationCallbacks since PyTorch 2.1, before it
    CUDAMemoryDeallocationCallbacks), and whose memory_snapshot() returns ``segments``. The trace
    fires only once activated, as PyTorch's does."""
    import types

    registry = _Registry()
    trace = types.ModuleType("torch.cuda._gpu_trace")
    setattr(trace, registry_name, registry)
    trace.register_callback_for_memory_deallocation = registry.add_callback
    torch = types.ModuleType("torch")
    torch._C = types.SimpleNamespace(_activate_gpu_trace=lambda: setattr(registry, "active", True))
    torch.cuda = types.SimpleNamespace(memory_snapshot=lambda: segments, _gpu_trace=trace)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.cuda", torch.cuda)
    monkeypatch.setitem(sys.modules, "torch.cuda._gpu_trace", trace)
    return registry


class TranslatorStub:
    """What the PyTorch hook asks of the translator."""

    def __init__(self, pointed: int) -> None:
        self.pointed, self.released = pointed, []
        self.frees_heard: set[str] = set()
        self.step_hooks: list = []
        self.report = Report()
        self.in_named_region = False

    def points_at(self, address: int) -> bool:
        return address == self.pointed

    def release_block(self, address: int, size: int, why: str) -> None:
        self.released.append((address, size, why))


@pytest.mark.parametrize("registry_name", ["MemoryDeallocationCallbacks", "CUDAMemoryDeallocationCallbacks"])
def test_pytorch_block_frees_reach_the_recorder_with_the_size_the_tensor_asked(monkeypatch, registry_name):
    segments = [
        {
            "address": ARENA,
            "total_size": 1 << 20,
            "blocks": [
                {"address": ARENA, "size": 0x2000, "state": "active_allocated", "requested_size": 0x1F00},
                {"address": ARENA + 0x2000, "size": 1024, "state": "active_allocated", "requested_size": 1000},
                {"address": ARENA + 0x2400, "size": (1 << 20) - 0x2400, "state": "inactive"},
            ],
        }
    ]
    assert torch_block_size(segments, ARENA + 0x2000) == 1000 and torch_block_size(segments, ARENA + 0x2400) == 0
    registry = fake_torch(monkeypatch, segments, registry_name)
    translator = TranslatorStub(ARENA + 0x2000)
    remove = _install_torch_frees(translator)
    assert remove is not None and translator.frees_heard == {"torch"}
    # nothing is asked of PyTorch (its trace costs every allocation and free) until a step begins
    assert registry.callback_list == [] and not hasattr(registry, "active")
    for hook in list(translator.step_hooks) * 2:  # a second step: on already
        hook()
    assert len(registry.callback_list) == 1 and registry.active
    registry.fire_callbacks(ARENA)  # a block no launch of the region pointed at: not even sized
    registry.fire_callbacks(ARENA + 0x2000)
    assert translator.released == [(ARENA + 0x2000, 1000, "freed by PyTorch's caching allocator")]
    remove()
    assert registry.callback_list == [] and translator.frees_heard == set() and translator.step_hooks == []


def test_pytorch_imported_inside_a_step_hears_that_steps_frees(monkeypatch):
    registry = fake_torch(monkeypatch, [])
    translator = TranslatorStub(0)
    translator.in_named_region = True
    assert _install_torch_frees(translator) is not None
    assert len(registry.callback_list) == 1 and registry.active


def test_a_pytorch_without_the_gpu_trace_says_so_and_leaves_its_frees_unheard(monkeypatch):
    """Its dropped results are then compared as what the step wrote into free memory."""
    registry = fake_torch(monkeypatch, [], "SomethingElse")
    translator = TranslatorStub(0)
    assert _install_torch_frees(translator) is None and registry.callback_list == []
    assert translator.frees_heard == set() and "no memory-deallocation callbacks" in translator.report.notes[0]


def test_past_the_byte_budget_frees_go_unchecked_and_the_report_says_so(tmp_path, cubin, monkeypatch):
    from replayfmt.capture import checkpoints

    monkeypatch.setattr(checkpoints, "MAX_RELEASED_BYTES", 4 * N - 1)  # y is 4 N bytes: over it
    mem = FakeMemory()
    events = [ev.ModuleImage(MODULE, cubin, None, "cuModuleLoadData"), *step_that_drops_its_result(mem)]
    path, t = record(tmp_path, events, mem)
    assert (t.report.released_checkpoints, t.report.released_dropped) == (0, 1)
    with replayfmt.open(path) as cap:
        assert [op.name for op in cap.iter_operations() if isinstance(op, m.Checkpoint)] == ["step"]
    monkeypatch.setattr(checkpoints, "MAX_RELEASED_BYTES", 4 * N)
    again = FakeMemory()
    (tmp_path / "again").mkdir()
    _, t = record(tmp_path / "again", [ev.ModuleImage(MODULE, cubin, None), *step_that_drops_its_result(again)], again)
    assert (t.report.released_checkpoints, t.report.released_bytes) == (1, 4 * N)
    assert "checkpoints before frees: 1 (" in "\n".join(t.report.lines())


def test_a_block_a_graphs_kernel_node_wrote_is_checkpointed_when_freed(tmp_path, cubin):
    """XLA's command buffers and PyTorch's CUDA graphs launch kernels as graph nodes: what their
    parameters point at counts as the region's too."""
    from test_capture_graphs import description, graph_memory, setup_events
    from test_capture_translate import B

    mem = graph_memory()

    def run_graph():
        mem.device[B][:] = (2 * np.arange(64) + 1).astype(np.float32).tobytes()
        return ev.StreamSynchronized(0x5000)

    events = [*setup_events(cubin), ev.GraphInstantiated(0xE0E0, description()), ev.GraphLaunched(0xE0E0, 0x5000)]
    path = tmp_path / "c.kreplay"
    with replayfmt.CaptureWriter(path) as writer:
        from replayfmt.capture import RecordOptions, Translator
        from replayfmt.capture.hostfiles import HostFiles

        t = Translator(writer, RecordOptions(), mem, host_files=HostFiles(tmp_path / "no-maps"))
        t.start("step")
        for e in [*events, run_graph]:
            t.handle(e() if callable(e) else e)
        assert t.points_at(B) and not t.points_at(B + 4)
        t.release_block(B, 256, "freed by torch")
        t.stop()
    assert t.report.released_checkpoints == 1 and not t.report.errors
    with replayfmt.open(path) as cap:
        released = next(op for op in cap.iter_operations() if isinstance(op, m.Checkpoint))
        (entry,) = released.entries
        expected = (2 * np.arange(64) + 1).astype(np.float32)
        assert np.array_equal(np.frombuffer(cap.read_payload(entry.payload), np.float32), expected)


def test_a_block_freed_before_another_launch_of_the_scope_is_a_temporary_and_let_go(tmp_path, cubin):
    """A workspace a kernel used and the framework freed before the next launch: it may be written
    only in part (its other bytes are no replay's), so it is not compared."""
    mem = FakeMemory()
    mem.device[ARENA] = bytearray(1 << 20)
    mem.device[X] = bytearray(np.arange(N, dtype=np.float32).tobytes())
    workspace, out = ARENA + 0x2000, ARENA + 0x4000
    launch = [
        ev.LaunchBegin(kernel(), (1, 1, 1), (N, 1, 1), 0, 0, saxpy_params(2.0, X, workspace, N)),
        ev.LaunchEnd(0),
    ]
    then = [ev.LaunchBegin(kernel(), (1, 1, 1), (N, 1, 1), 0, 0, saxpy_params(3.0, X, out, N)), ev.LaunchEnd(0)]
    path = tmp_path / "c.kreplay"
    with replayfmt.CaptureWriter(path) as writer:
        from replayfmt.capture import RecordOptions, Translator
        from replayfmt.capture.hostfiles import HostFiles

        t = Translator(writer, RecordOptions(), mem, host_files=HostFiles(tmp_path / "no-maps"))
        t.start("step")
        for e in [ev.ModuleImage(MODULE, cubin, None), ev.Allocation(X, 4 * N), ev.Allocation(ARENA, 1 << 20), *launch]:
            t.handle(e)
        t.release_block(workspace, 4 * N, "freed by torch")
        for e in then:
            t.handle(e)
        t.release_block(out, 4 * N, "freed by torch")
        t.stop()
    assert t.report.released_checkpoints == 1
    with replayfmt.open(path) as cap:
        (released,) = [op for op in cap.iter_operations() if isinstance(op, m.Checkpoint) and "freed" in op.name]
        assert [(e.offset, e.size) for e in released.entries] == [(0x4000, 4 * N)]


def test_without_a_named_scope_a_framework_free_is_not_even_sized(tmp_path, cubin):
    """A whole program recorded with no scope: its frees cost nothing (no memory_snapshot each)."""
    mem = FakeMemory()
    mem.device[ARENA] = bytearray(1 << 20)
    mem.device[X] = bytearray(4 * N)
    path = tmp_path / "c.kreplay"
    with replayfmt.CaptureWriter(path) as writer:
        from replayfmt.capture import RecordOptions, Translator
        from replayfmt.capture.hostfiles import HostFiles

        t = Translator(writer, RecordOptions(), mem, host_files=HostFiles(tmp_path / "no-maps"))
        t.start()  # the whole program: no name
        launch = ev.LaunchBegin(kernel(), (1, 1, 1), (N, 1, 1), 0, 0, saxpy_params(2.0, X, ARENA, N))
        for e in [ev.ModuleImage(MODULE, cubin, None), ev.Allocation(X, 4 * N), ev.Allocation(ARENA, 1 << 20), launch]:
            t.handle(e)
        assert not t.points_at(ARENA)
        t.scope_begin("step")
        assert t.points_at(ARENA)
        t.scope_end("step")
        t.stop()
