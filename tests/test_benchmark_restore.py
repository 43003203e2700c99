"""What benchmark-replay restores before each iteration (replayfmt.measure.restore): state ranges
of buffers nothing before the region writes, whole buffers otherwise, nothing for the rest."""

from __future__ import annotations

from replayfmt.format import model as m
from replayfmt.measure.restore import Span, buffers_of, restore_spans

GiB = 1 << 30


def launch(index: int, *targets: int) -> m.Launch:
    relocations = tuple(m.Relocation(0, t, 8 * i, 0) for i, t in enumerate(targets))
    return m.Launch(index, 1, 0, 0, (1, 1, 1), (1, 1, 1), (0, 0, 0), 0, 0, bytes(8 * len(targets)), relocations)


def test_buffers_of_each_kind_of_operation():
    assert buffers_of(launch(0, 3, 4)) == {3, 4}
    copy = m.Copy(1, m.OperationKind.COPY_DEVICE_TO_DEVICE, 0, 5, 6, 0, 0, 0, 0, 0, 16)
    assert buffers_of(copy) == {5, 6}
    assert buffers_of(m.Memset(2, 0, 7, 0, 4, 0, 4)) == {7}
    assert buffers_of(m.State(3, 8, 1, 0, 16)) == {8}
    assert buffers_of(m.ScopeBegin(4, "step")) == set()


def test_an_arena_is_restored_by_its_state_ranges_alone():
    arena, output, touched_before = 2, 3, 4
    sizes = {arena: 60 * GiB, output: 1 << 20, touched_before: 4096}
    states = [
        m.State(10, arena, 1, 4 << 20, 8192),
        m.State(11, arena, 2, 1 << 20, 4096),
        m.State(12, arena, 3, (1 << 20) + 4096, 100),  # meets the one before: one copy
        m.State(13, touched_before, 4, 0, 4096),
        m.State(14, 9, 5, 0, 64),  # a buffer the region does not touch
    ]
    before = [launch(0, touched_before), m.State(13, touched_before, 4, 0, 4096), m.Memset(1, 0, 9, 0, 4, 0, 1)]
    spans = restore_spans([arena, output, touched_before], sizes, before, states)
    assert spans == [
        Span(touched_before, 0, 4096),  # written before the region: whole
        Span(arena, 1 << 20, 4196),
        Span(arena, 4 << 20, 8192),
    ]  # the output, written by the region before it reads it, needs nothing
    assert sum(s.size for s in spans) < 1 << 20


def test_with_nothing_before_the_region_every_buffer_with_whole_state_is_restored_whole():
    sizes = {2: 1000, 3: 0}
    states = [m.State(5, 2, 1, 0, 1000)]
    assert restore_spans([2, 3], sizes, [], states) == [Span(2, 0, 1000)]
    assert restore_spans([3], sizes, [m.Memset(0, 0, 3, 0, 1, 0, 0)], states) == [Span(3, 0, 1)]


def test_a_launchs_module_globals_are_restored_though_it_names_none():
    """A kernel that bumps a counter in its module (tests/kernels/module_globals.cu's ``calls``)
    names no buffer for it: the restore found nothing to restore, and every iteration started from
    the one before's count. Now a launch touches its image's globals (replayfmt.format.uses)."""
    from replayfmt.measure.restore import ModuleGlobals

    exe, other_exe, calls, other, counter, unrelated, out = 2, 3, 4, 5, 6, 7, 8
    objects = {
        exe: m.Executable(id=exe, payload=11),
        other_exe: m.Executable(id=other_exe, payload=12),
        calls: m.Global(id=calls, executable=exe, symbol="calls", size=4),
        other: m.Global(id=other, executable=other_exe, symbol="calls", size=4),
        counter: m.Buffer(id=counter, size=4, module_global=calls),
        unrelated: m.Buffer(id=unrelated, size=4, module_global=other),
        out: m.Buffer(id=out, size=64),
    }
    globals_of = ModuleGlobals([counter, unrelated, out], objects.get)
    bump = launch(20, out)._replace(executable=exe)
    assert buffers_of(bump) == {out}  # what the launch names
    assert globals_of.of({exe}) == {counter} and globals_of.of({other_exe}) == {unrelated}

    def touched(op):
        return buffers_of(op) | (globals_of.of({op.executable}) if isinstance(op, m.Launch) else set())

    states = [m.State(9, counter, 1, 0, 4)]
    sizes = {counter: 4, unrelated: 4, out: 64}
    region = touched(bump)
    assert restore_spans(region, sizes, [], states, touched) == [Span(counter, 0, 4)]
    # a launch of the same module before the region: the counter is restored whole
    before = [launch(1, out)._replace(executable=exe)]
    assert restore_spans(region, sizes, before, states, touched) == [Span(counter, 0, 4), Span(out, 0, 64)]


def test_the_benchmark_restores_the_counter_its_kernel_bumps(tmp_path):
    """The same through the benchmark's own lookup (Benchmark._buffers_of) on a real plan of a
    capture written by the real writer: the region's launch names only its output."""
    from types import SimpleNamespace

    import numpy as np
    from samples import SAXPY

    import replayfmt
    from replayfmt.measure.benchmark import Benchmark
    from replayfmt.replay.plan import build_plan

    path = tmp_path / "g.kreplay"
    with replayfmt.CaptureWriter(path) as w:
        dev = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        image = w.add_payload(b"\x7fELF" + bytes(252))
        exe = w.add_object(
            m.Executable(format=m.ExecutableFormat.CUBIN, target_arch="sm_90", payload=image, functions=(SAXPY,))
        )
        calls = w.add_object(m.Global(executable=exe, symbol="calls", size=4))
        counter = w.add_object(m.Buffer(size=4, device=dev, module_global=calls))
        out = w.add_object(m.Buffer(size=64, device=dev))
        w.module_load(exe, dev)
        with w.scope("step"):
            w.state(buffer=counter, data=np.zeros(1, np.uint32))
            w.launch(
                executable=exe,
                function=0,
                grid=(1, 1, 1),
                block=(32, 1, 1),
                parameters=bytes(32),
                relocations=[m.Relocation(0, out, 8, 0)],
            )
    with replayfmt.open(path) as cap:
        plan = build_plan(cap)
        op = next(o for o in cap.iter_operations() if isinstance(o, m.Launch))
        bench = SimpleNamespace(r=SimpleNamespace(plan=plan), _globals=None)
        assert buffers_of(op) == {out}
        assert Benchmark._buffers_of(bench, op) == {out, counter}  # type: ignore[arg-type]
