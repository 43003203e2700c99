"""A step whose result is dropped inside a framework's memory (XLA's arena, a caching-allocator
segment) is still verified: at a named region's end the translator checkpoints what its launches
wrote outside the buffers live at its start and end, with that range's starting state flagged
undefined (format 1.6), and verification proves it with a poisoned replay; a wrong or skipped
kernel fails naming the element. Captures made by the real translator from synthetic events,
verified by the host-memory replayer."""

from __future__ import annotations

import numpy as np
import pytest
from fake_replayer import HostReplayer
from test_capture_translate import MODULE, FakeMemory, kernel, saxpy_params

import replayfmt
from replayfmt.capture import RecordOptions, Translator, events as ev, free_writes as fw
from replayfmt.capture.free_writes import free_spans, within_budget
from replayfmt.capture.hostfiles import HostFiles
from replayfmt.capture.live_buffers import ByteRange, LiveBuffers, LiveView, merge
from replayfmt.format import model as m
from replayfmt.replay.evidence import Evidence
from replayfmt.replay.plan import PlanOptions, build_plan
from replayfmt.replay.plan_options import LaunchOverride
from replayfmt.replay.verification import Verification

MiB = 1 << 20
ARENA = 0x7F00_0000_0000
N = 256
X, OUT = ARENA, ARENA + MiB  # an input array, live throughout; where the step's result is placed
Y = ARENA + 2 * MiB  # an array some steps update in place


def test_free_spans_run_from_each_pointer_to_the_next_pointer_or_live_buffer_within_the_tail():
    live = [(0, 100), (5000, 100)]
    # 50: inside a live buffer (compared as that buffer); 1000 -> the next pointer, 2000, and on
    # within the tail (the live buffer at 5000 is further); 6000 -> the tail; 9990 -> the end
    assert free_spans([50, 1000, 2000, 6000, 9990], 10_000, live, tail=1024) == [
        (1000, 2024),
        (6000, 1024),
        (9990, 10),
    ]
    assert free_spans([2000], 10_000, live, tail=1 << 20) == [(2000, 3000)]  # up to the live buffer
    assert free_spans([], 10_000, live) == [] and free_spans([20_000], 10_000, []) == []


def test_the_budget_keeps_the_most_recently_pointed_at_first():
    candidates = [(1, "old", 0, 600), (9, "new", 0, 600), (5, "mid", 0, 300)]
    assert within_budget(candidates, 1000) == ([("new", 0, 600), ("mid", 0, 300)], 1)


class Framework:
    """A framework's view of the arena: ``live`` at the region's start, ``after`` once the step ran."""

    def __init__(self, name: str, live: list[ByteRange], after: list[ByteRange], donates: bool = False) -> None:
        self.name, self.live, self.after, self.calls = name, live, after, 0
        self.donates = donates

    def view(self) -> LiveView | None:
        self.calls += 1
        live = tuple(merge(self.live if self.calls == 1 else self.after))
        return LiveView(self.name, live, managed=(ByteRange(ARENA, ARENA + 4 * MiB),))


def arena(x: np.ndarray) -> FakeMemory:
    memory = FakeMemory()
    memory.device[ARENA] = bytearray(4 * MiB)
    memory.device[ARENA][1 * MiB : 1 * MiB + 64] = b"\xab" * 64  # what an earlier step left where OUT goes
    memory.device[ARENA][: x.nbytes] = x.tobytes()
    return memory


def record_step(
    tmp_path,
    memory: FakeMemory,
    source: Framework,
    *,
    name: str = "step",
    heard: frozenset = frozenset(),
    gap: int = 0,
    y: bytes = b"",
):
    """One launch, out = 2 x + 1 at OUT, inside region ``name``; the program drops the result. (In
    int32 arithmetic: a gently poisoned x, one bit flipped, then gives an out that is neither the
    answer nor its poison, as most kernels' outputs are.) ``y``: what the kernel also writes at Y."""
    x = np.frombuffer(bytes(memory.device[ARENA][: 4 * N]), np.int32)

    def run_kernel():
        memory.device[ARENA][MiB : MiB + 4 * N] = (2 * x + 1).astype(np.int32).tobytes()
        memory.device[ARENA][Y - ARENA : Y - ARENA + len(y)] = y
        return ev.LaunchEnd(0)

    path = tmp_path / "c.kreplay"
    with replayfmt.CaptureWriter(path) as writer:
        live = LiveBuffers([source], min_size=MiB, gap=gap)
        t = Translator(writer, RecordOptions(), memory, host_files=HostFiles(tmp_path / "no-maps"), live_buffers=live)
        t.frees_heard |= set(heard)
        t.handle(ev.ModuleImage(MODULE, CUBIN[0], None, "cuModuleLoadData"))
        t.handle(ev.Allocation(ARENA, 4 * MiB))
        t.start(name)
        t.handle(ev.LaunchBegin(kernel(), (1, 1, 1), (N, 1, 1), 0, 0, saxpy_params(2.0, X, OUT, N)))
        t.handle(run_kernel())
        t.stop()
    return path, t


CUBIN: list[bytes] = []  # the saxpy cubin of the suite's fixture, for every capture here


@pytest.fixture(autouse=True)
def _cubin(cubin):
    CUBIN[:] = [cubin]


def inputs() -> np.ndarray:
    return np.arange(N, dtype=np.int32)


def jax_like(*, merged_gap: bool = False) -> Framework:
    x = ByteRange(X, X + 4 * N)
    z = ByteRange(ARENA + MiB + MiB // 2, ARENA + MiB + MiB // 2 + 512)  # another live array
    return Framework("jax", [x, z] if merged_gap else [x], [x, z] if merged_gap else [x], donates=True)


def operations(path):
    with replayfmt.open(path) as cap:
        return list(cap.iter_operations()), {o.address: o.id for o in cap.objects() if isinstance(o, m.Buffer)}


def test_a_dropped_result_in_a_framework_arena_is_checkpointed_with_an_undefined_state(tmp_path):
    path, t = record_step(tmp_path, arena(inputs()), jax_like())
    assert not t.report.errors and t.report.free_writes == 1
    ops, ids = operations(path)
    (written,) = [op for op in ops if isinstance(op, m.Checkpoint) and op.name == "step (written into free memory)"]
    (entry,) = written.entries
    # from the pointer to the arena's end (no other pointer, no live buffer after it), within the tail
    assert (entry.buffer, entry.offset, entry.size) == (ids[ARENA], MiB, 3 * MiB)
    states = [op for op in ops if isinstance(op, m.State)]
    undefined = [s for s in states if s.undefined]
    assert [(s.offset, s.size, s.payload) for s in undefined] == [(MiB, 3 * MiB, entry.payload)]
    assert [(s.offset, s.size) for s in states if not s.undefined] == [(0, 4 * N)]  # x, live at the start
    with replayfmt.open(path) as cap:
        got = np.frombuffer(cap.read_payload(entry.payload, 0, 4 * N), np.int32)
    assert np.array_equal(got, 2 * inputs() + 1)
    lines = "\n".join(t.report.lines())
    assert "written into free memory: 1 ranges" in lines
    assert "outside live buffers (jax): undefined at replay's start, compared only where a step wrote them" in lines


class AxpyAtOut:
    """The step's kernel as the host replayer runs it: before the capture's first checkpoint,
    out = 2 x + 1 (``wrong_at``: one element off by one; ``runs=False``: left out)."""

    def __init__(self, *, wrong_at: int = -1, runs: bool = True) -> None:
        self.wrong_at, self.runs = wrong_at, runs
        self.ids: dict[int, int] = {}
        self.first = -1

    def __call__(self, memory, checkpoint: int, _number: int) -> None:
        if checkpoint != self.first or not self.runs:
            return
        x = np.frombuffer(bytes(memory[self.ids[ARENA]][: 4 * N]), np.int32)
        out = (2 * x + 1).astype(np.int32)
        if self.wrong_at >= 0:
            out[self.wrong_at] += 1
        memory[self.ids[ARENA]][MiB : MiB + 4 * N] = out.tobytes()


def verify(path, program, *, skipped: bool = False, reference=None):
    ops, ids = operations(path)
    first = next(op.index for op in ops if isinstance(op, m.Checkpoint))
    for p in (program, reference):
        if isinstance(p, AxpyAtOut):
            p.ids, p.first = ids, first
    with replayfmt.open(path) as cap:
        plan = build_plan(cap, PlanOptions())
        if skipped:
            plan.options = PlanOptions(launch_overrides=(LaunchOverride(0, skip=True),))  # kernels were changed
        v = Verification(plan, replays=2)
        replayer = HostReplayer(plan, program)
        v.attach(replayer)
        v.note_runs(replayer.run(1))
        assert v.finish(replayer) == []
        if reference is not None:
            assert v.wants_reference
            v.apply_reference(v.reference_written(HostReplayer(plan, reference)))
        return v.report(), ids


def written_range(report, ids):
    return next(r for r in report.ranges if r.piece.buffer == ids[ARENA] and r.piece.offset == MiB)


def test_the_dropped_result_is_proven_by_a_poisoned_replay(tmp_path):
    path, _ = record_step(tmp_path, arena(inputs()), jax_like())
    report, ids = verify(path, AxpyAtOut())
    assert report.verified and report.evidence > 0, report.lines()
    out = written_range(report, ids)
    assert out.evidence is Evidence.PROVEN and out.passed
    assert f"{4 * N} of {3 * MiB} bytes written, the rest unchanged" in out.note


def test_a_wrong_kernel_into_the_dropped_result_fails_naming_the_element(tmp_path):
    path, _ = record_step(tmp_path, arena(inputs()), jax_like())
    report, ids = verify(path, AxpyAtOut(wrong_at=37))
    out = written_range(report, ids)
    assert not report.verified and not out.passed
    assert out.as_dict()["first"][0]["position"] == [37 * 4]  # untyped: its byte; captured 75, replayed 76


def test_a_skipped_kernel_into_the_dropped_result_fails_naming_the_element(tmp_path):
    """The range starts as the capture expects it to end: only the poisoned replays, against the
    unmodified capture's, see the kernel left out; the report names the first element left."""
    path, _ = record_step(tmp_path, arena(inputs()), jax_like())
    report, ids = verify(path, AxpyAtOut(runs=False), skipped=True, reference=AxpyAtOut())
    out = written_range(report, ids)
    assert out.evidence is Evidence.LEFT and not out.passed and not report.verified
    first = out.as_dict()["first"][0]
    assert first["position"] == [0] and first["wrong"] and out.judgement.wrong == N
    assert "FAIL wrong" in out.line() and "left as it started" in out.line()


def test_an_undefined_state_set_over_a_gap_of_the_starting_state_takes_precedence(tmp_path):
    """Live arrays less than the merge gap apart are snapshotted as one state, the free memory
    between them too (what an earlier step left there): the free write's state, set after it,
    is what the region starts from, so the range starts as expected and is proven."""
    path, _ = record_step(tmp_path, arena(inputs()), jax_like(merged_gap=True), gap=2 * MiB)
    ops, ids = operations(path)
    states = [(s.offset, s.size, s.undefined) for s in ops if isinstance(s, m.State)]
    assert (0, MiB + MiB // 2 + 512, False) in states and (MiB, MiB // 2, True) in states  # the write: up to z
    report, ids = verify(path, AxpyAtOut())
    out = written_range(report, ids)
    assert out.evidence is Evidence.PROVEN and report.verified


def test_untyped_free_writes_are_poisoned_even_when_other_ranges_are_evidence(tmp_path):
    """Integers and untyped bytes are poisoned only when nothing else is evidence (they may be
    locks a kernel waits on), but a free write held none of the program's data."""
    source = jax_like()
    y = ByteRange(Y, Y + 64)  # a live array the step updates in place: evidence of its own
    source.live.append(y)
    source.after.append(y)
    path, _ = record_step(tmp_path, arena(inputs()), source, y=bytes(range(64)))

    class UpdatesY(AxpyAtOut):
        def __call__(self, memory_, checkpoint: int, number: int) -> None:
            super().__call__(memory_, checkpoint, number)
            if checkpoint == self.first:
                memory_[self.ids[ARENA]][Y - ARENA : Y - ARENA + 64] = bytes(range(64))

    report, ids = verify(path, UpdatesY())
    assert any(r.evidence is Evidence.COMPARED for r in report.ranges)
    assert written_range(report, ids).evidence is Evidence.PROVEN


def test_frameworks_whose_frees_are_heard_write_none(tmp_path):
    """PyTorch's frees are heard: its dropped blocks are compared exactly (release_block), its
    temporaries let go; no free writes for its segments."""
    source = Framework("torch", [ByteRange(X, X + 4 * N)], [ByteRange(X, X + 4 * N)])
    _, t = record_step(tmp_path, arena(inputs()), source, heard={"torch"})
    assert t.report.free_writes == 0 and not t.report.errors


def test_a_whole_program_region_writes_none(tmp_path):
    """No named step: the region is the whole program, whose temporaries are no step's result."""
    _, t = record_step(tmp_path, arena(inputs()), jax_like(), name="")
    assert t.report.free_writes == 0


def test_past_the_budget_free_writes_go_unchecked_and_the_report_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(fw, "MAX_FREE_WRITE_BYTES", 3 * MiB - 1)
    path, t = record_step(tmp_path, arena(inputs()), jax_like())
    assert (t.report.free_writes, t.report.free_writes_dropped) == (0, 1)
    assert "1 more past the limit went unchecked" in "\n".join(t.report.lines())
    ops, _ = operations(path)
    assert not [op for op in ops if isinstance(op, m.State) and op.undefined]


def test_the_tail_bounds_a_free_write(tmp_path, monkeypatch):
    monkeypatch.setattr(fw, "FREE_WRITE_TAIL", 4096)
    path, _ = record_step(tmp_path, arena(inputs()), jax_like())
    ops, _ = operations(path)
    (written,) = [op for op in ops if isinstance(op, m.Checkpoint) and "free memory" in op.name]
    assert [(e.offset, e.size) for e in written.entries] == [(MiB, 4096)]


def test_a_released_block_not_live_at_the_start_gets_an_undefined_state(tmp_path):
    """A PyTorch block the step's result was placed in, freed after its last launch: compared at
    the step's end from a defined start (the bytes it left), and proven."""
    source = Framework("torch", [ByteRange(X, X + 4 * N)], [ByteRange(X, X + 4 * N)])
    memory = arena(inputs())
    x = inputs()

    def run_kernel():
        memory.device[ARENA][MiB : MiB + 4 * N] = (2 * x + 1).astype(np.int32).tobytes()
        return ev.LaunchEnd(0)

    path = tmp_path / "c.kreplay"
    with replayfmt.CaptureWriter(path) as writer:
        live = LiveBuffers([source], min_size=MiB, gap=0)
        t = Translator(writer, RecordOptions(), memory, host_files=HostFiles(tmp_path / "no-maps"), live_buffers=live)
        t.frees_heard.add("torch")
        for e in [ev.ModuleImage(MODULE, CUBIN[0], None, "cuModuleLoadData"), ev.Allocation(ARENA, 4 * MiB)]:
            t.handle(e)
        t.start("step")
        t.handle(ev.LaunchBegin(kernel(), (1, 1, 1), (N, 1, 1), 0, 0, saxpy_params(2.0, X, OUT, N)))
        t.handle(run_kernel())
        t.release_block(OUT, 4 * N, "freed by torch")
        t.stop()
    assert t.report.released_checkpoints == 1 and t.report.free_writes == 0
    ops, ids = operations(path)
    assert [(s.offset, s.size) for s in ops if isinstance(s, m.State) and s.undefined] == [(MiB, 4 * N)]
    report, ids = verify(path, AxpyAtOut())
    out = written_range(report, ids)
    assert out.evidence is Evidence.PROVEN and report.verified


def test_an_allocation_a_named_step_makes_has_an_undefined_state(tmp_path):
    """Its bytes at its first touch are none of the program's data (memory a platform allocator
    handed out, reused from an earlier step perhaps); in a whole-program region too little is
    known of what the program relies on, and nothing is flagged."""
    for name in ("step", ""):
        memory = FakeMemory()
        memory.device[0x7F10_0000_0000] = bytearray(4096)
        path = tmp_path / f"c{name}.kreplay"
        with replayfmt.CaptureWriter(path) as writer:
            t = Translator(writer, RecordOptions(), memory, host_files=HostFiles(tmp_path / "no-maps"))
            t.start(name)
            for e in [ev.Allocation(0x7F10_0000_0000, 4096), ev.Memset(0x7F10_0000_0000 + 64, 0, 4, 16)]:
                t.handle(e)
            t.stop()
        ops, _ = operations(path)
        (state,) = [op for op in ops if isinstance(op, m.State)]
        assert state.undefined == (name == "step")


def test_a_skipped_kernel_is_seen_where_reused_memory_already_held_its_result(tmp_path):
    """An allocation the step made (XLA's platform allocator) held, when first touched, what the
    same step left there when it ran before: part of the range starts as it ends, part not, so the
    range is no candidate for poisoning; but it held none of the program's data, so with kernels
    changed it is poisoned whatever its start, and the kernel left out is seen and named."""
    out = np.arange(64, dtype=np.int32) * 3
    leftover = out.copy()
    leftover[:8] = 0  # what the earlier run left differs here (a kernel of this step writes it again)
    path = tmp_path / "c.kreplay"
    with replayfmt.CaptureWriter(path) as w:
        dev = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        buf = w.add_object(m.Buffer(size=out.nbytes, device=dev, label="made by the step"))
        with w.scope("step"):
            w.state(buffer=buf, data=leftover, flags=m.STATE_FLAG_UNDEFINED)
            w.checkpoint({buf: out.tobytes()}, name="step")

    def kernels(*, second: bool):
        def run(memory, _checkpoint, _number):
            memory[buf][:32] = out[:8].tobytes()  # the first kernel
            if second:  # the second kernel: its bytes already held its result
                memory[buf][32:] = out[8:].tobytes()

        return run

    with replayfmt.open(path) as cap:
        plan = build_plan(cap, PlanOptions())
        assert plan.undefined_state
        plan.options = PlanOptions(launch_overrides=(LaunchOverride(0, skip=True),))  # kernels were changed
        v = Verification(plan)
        assert not v.candidates and v.undefined
        replayer = HostReplayer(plan, kernels(second=False))
        v.attach(replayer)
        v.note_runs(replayer.run(1))
        v.finish(replayer)
        v.apply_reference(v.reference_written(HostReplayer(plan, kernels(second=True))))
        report = v.report()
    (piece,) = report.ranges
    assert piece.evidence is Evidence.LEFT and not report.verified
    first = piece.as_dict()["first"][0]
    assert first["position"] == [32] and first["captured"] == 24  # element 8: 3 * 8, left as its poison


def test_an_array_live_at_the_start_is_no_free_write_even_when_gone_at_the_end(tmp_path):
    """A step that donates its input (JAX deletes it once the step is dispatched) reads what its
    state holds there: those bytes are the program's data, never given the bytes the step left."""
    x = ByteRange(X, X + 4 * N)
    donated = Framework("jax", [x], [], donates=True)
    path, _ = record_step(tmp_path, arena(inputs()), donated)
    ops, _ = operations(path)
    (written,) = [op for op in ops if isinstance(op, m.Checkpoint) and "free memory" in op.name]
    assert [(e.offset, e.size) for e in written.entries] == [(MiB, 3 * MiB)]  # the result only, not x
    assert [(s.offset, s.size) for s in ops if isinstance(s, m.State) and not s.undefined] == [(0, 4 * N)]
