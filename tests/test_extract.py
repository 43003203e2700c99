"""extract-replay without a GPU: selection, closure, starting state and checkpoints from the
capture's own data, refusals, provenance, and the result replaying like a kernel-mode capture
(run-replay --dry-run, dump-replay's verdict). Captures from tests/edit_captures.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from edit_captures import step_capture

import replayfmt
from replayfmt.edit import ExtractOptions, Selection, StateSource, extract
from replayfmt.edit.snapshots import Snapshots
from replayfmt.errors import DeviceUnavailableError, ReplayUsageError
from replayfmt.format import model as m
from replayfmt_tools.dump_replay import main as dump_main
from replayfmt_tools.extract_replay import main as extract_main
from replayfmt_tools.run_replay import main as run_main

_K = m.OperationKind
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture
def step(tmp_path, cubin):
    path = tmp_path / "step.kreplay"
    return path, step_capture(path, cubin)


def contents(path):
    """(objects by kind, state rows, checkpoint rows, ops) of a capture, with bytes read out."""
    with replayfmt.open(path) as cap:
        objects = list(cap.objects())
        ops = list(cap)
        labels = {o.id: o.label for o in objects}
        states = {labels[op.buffer]: (op.offset, cap.read_payload(op.payload)) for op in ops if op.kind == _K.STATE}
        checkpoints = [
            (op.name, {labels[e.buffer]: (e.offset, cap.read_payload(e.payload)) for e in op.entries})
            for op in ops
            if op.kind == _K.CHECKPOINT
        ]
        return objects, states, checkpoints, ops, cap.metadata, cap.original_times()


def test_extract_by_index_keeps_exactly_the_launch_and_its_buffers(step, tmp_path):
    path, e = step
    out = tmp_path / "one.kreplay"
    result = extract(path, Selection.operation(e.ops["saxpy0"]), out, ExtractOptions(allow_gpu=False))
    objects, states, checkpoints, ops, meta, times = contents(out)
    # the closure: the device, the stream, x and y, the executable it launches (not the spare one, not z/t/idx/unused)
    assert sorted((type(o).__name__, o.label) for o in objects) == [
        ("Buffer", "x"),
        ("Buffer", "y"),
        ("Device", ""),
        ("Executable", ""),
        ("Stream", "s"),
    ]
    assert result.kept == {"buffer": 2, "device": 1, "executable": 1, "stream": 1}
    assert [op.kind.label for op in ops] == ["create"] * 5 + [
        "scope_begin",
        "state",
        "state",
        "launch",
        "checkpoint",
        "scope_end",
    ]
    assert ops[5].name == "saxpy#0" == result.scope
    # starting state: x as uploaded before the step, y as the step's State row says
    assert states == {"x": (0, e.data["X"].tobytes()), "y": (0, e.data["Y0"].tobytes())}
    # the checkpoint: what the capture's layer0 checkpoint says right after the launch
    assert checkpoints == [("saxpy#0", {"x": (0, e.data["X"].tobytes()), "y": (0, e.data["Y1"].tobytes())})]
    assert result.state_source == result.checkpoint_source == StateSource.CAPTURE
    # the original's time, renumbered to the launch's new index
    launch = next(op for op in ops if op.kind == _K.LAUNCH)
    assert times.duration_ns(launch.index) == 30_000 and len(times.operations) == 1
    assert times.scope(ops[5].index).busy_ns == 30_000
    props = dict(meta.properties)
    assert props["extract.source_operations"] == f"{e.ops['saxpy0']}..{e.ops['saxpy0']}"
    assert props["extract.source_digest"].startswith("xxh3-128:") and len(props["extract.source_digest"]) == 9 + 32
    assert props["extract.state"] == "capture" and props["k"] == "v"
    assert meta.tool == "replayfmt extract-replay" and meta.command_line == ("python", "step.py")


def test_state_rebuilt_from_copies_and_checkpoints_is_what_a_replay_sees(step, tmp_path):
    """gather reads z after a memset and a device-to-device copy of half of y (which saxpy0 wrote
    and the layer0 checkpoint gives): the CPU simulation must give the bytes a replay would."""
    path, e = step
    out = tmp_path / "g.kreplay"
    result = extract(path, Selection.kernel("gath"), out, ExtractOptions(allow_gpu=False))
    objects, states, checkpoints, ops, _, _ = contents(out)
    replay_sees_z = np.zeros(256, np.float32)
    replay_sees_z[:128] = e.data["Y1"][:128]  # memset to 0, then y[0:512 bytes] copied in
    assert states["z"] == (0, replay_sees_z.tobytes())
    assert states["y"] == (0, e.data["Y1"].tobytes()) and states["tables"] == (0, bytes(16))
    assert sorted(o.label for o in objects if isinstance(o, m.Buffer)) == ["idx", "tables", "x", "y", "z"]
    assert checkpoints[0][1]["z"] == (0, e.data["Z2"].tobytes())
    # the pointer table's relocations (sites inside buffer t) moved with it
    launch = next(op for op in ops if op.kind == _K.LAUNCH)
    ids = {o.label: o.id for o in objects}
    assert {(r.site_buffer, r.target_buffer) for r in launch.relocations} >= {
        (ids["tables"], ids["x"]),
        (ids["tables"], ids["y"]),
    }
    assert result.scope == "gather#0"


def test_extract_by_pattern_with_occurrence(step, tmp_path):
    path, e = step
    out = tmp_path / "s1.kreplay"
    result = extract(path, Selection.kernel("sax.y#1"), out, ExtractOptions(allow_gpu=False))
    assert (result.first, result.last, result.scope) == (e.ops["saxpy1"], e.ops["saxpy1"], "saxpy#1")
    _, states, checkpoints, _, _, times = contents(out)
    assert states == {"y": (0, e.data["Y1"].tobytes()), "z": (0, e.data["Z2"].tobytes())}
    assert checkpoints[0][1]["y"] == (0, e.data["Y3"].tobytes())
    assert next(iter(times.operations.values())).duration_ns == 31_000


def test_kernel_pattern_refusals_name_the_choices(step, tmp_path):
    path, _ = step
    with pytest.raises(ReplayUsageError, match=r"matches 3 launches .*'saxpy#K', K from 0 to 2"):
        extract(path, Selection.kernel("saxpy"), tmp_path / "a.kreplay", ExtractOptions(allow_gpu=False))
    with pytest.raises(ReplayUsageError, match=r"#5 does not exist"):
        extract(path, Selection.kernel("saxpy#5"), tmp_path / "a.kreplay", ExtractOptions(allow_gpu=False))
    with pytest.raises(ReplayUsageError, match=r"no launch's kernel matches 'gemm' \(kernels: gather, saxpy\)"):
        extract(path, Selection.kernel("gemm"), tmp_path / "a.kreplay", ExtractOptions(allow_gpu=False))
    assert not (tmp_path / "a.kreplay").exists()


def test_extract_a_whole_scope_with_its_inner_scopes(step, tmp_path):
    path, e = step
    out = tmp_path / "step-only.kreplay"
    result = extract(path, Selection.scope("step"), out, ExtractOptions(allow_gpu=False))
    objects, states, checkpoints, ops, _, times = contents(out)
    assert states == {
        "x": (0, e.data["X"].tobytes()),
        "y": (0, e.data["Y0"].tobytes()),
        "z": (0, bytes(1024)),
        "tables": (0, bytes(16)),
        "idx": (0, e.data["IDX"].tobytes()),
    }
    assert [name for name, _ in checkpoints] == ["layer0", "act", "step"]
    assert checkpoints[-1][1]["y"] == (0, e.data["Y3"].tobytes())
    kinds = [op.kind.label for op in ops if op.kind not in (_K.CREATE_OBJECT, _K.STATE, _K.CHECKPOINT)]
    assert kinds == [
        "scope_begin",
        "scope_begin",
        "launch",
        "scope_end",
        "copy_d2d",
        "scope_begin",
        "launch",
        "scope_end",
        "launch",
        "scope_end",
    ]
    assert "unused" not in {o.label for o in objects} and len(times.operations) == 4
    assert result.timed_operations == 4


def test_extract_a_kernel_mode_scope(step, tmp_path):
    path, e = step
    out = tmp_path / "k.kreplay"
    result = extract(path, Selection.scope("saxpy#2"), out, ExtractOptions(allow_gpu=False))
    _, states, checkpoints, _, _, _ = contents(out)
    assert states == {"x": (0, e.data["X"].tobytes()), "y": (0, e.data["Y3"].tobytes())}
    assert checkpoints == [("saxpy#2", {"x": (0, e.data["X"].tobytes()), "y": (0, e.data["Y4"].tobytes())})]
    assert result.scope == "saxpy#2"


def test_without_the_capture_data_no_gpu_refuses_naming_the_buffer(tmp_path, cubin):
    path = tmp_path / "bare.kreplay"
    e = step_capture(path, cubin, checkpoints=False)
    with pytest.raises(ReplayUsageError) as err:
        extract(path, Selection.kernel("gather"), tmp_path / "g.kreplay", ExtractOptions(allow_gpu=False))
    text = str(err.value)
    assert f"buffer {e.ids['x']} bytes [0, 1024) before operation {e.ops['gather']}" in text
    assert f"operation {e.ops['saxpy0']} (launch of saxpy) wrote them" in text and "drop --no-gpu" in text
    assert not (tmp_path / "g.kreplay").exists()


def test_gpu_snapshots_fill_what_the_capture_lacks(tmp_path, cubin):
    """The GPU path's plumbing, with the prefix replay's reads given (tests/gpu runs the real one)."""
    path = tmp_path / "bare.kreplay"
    e = step_capture(path, cubin, checkpoints=False)
    asked = {}

    def snapshot(source, first, last, reads, writes):
        asked.update(first=first, last=last, reads=reads, writes=writes)
        fill = {e.ids["y"]: e.data["Y1"].tobytes(), e.ids["z"]: e.data["Z1"].tobytes()}
        before = {(b, lo, hi): fill.get(b, bytes(hi - lo)) for b, rs in reads.items() for lo, hi in rs}
        after = {
            (b, lo, hi): (e.data["Z2"].tobytes() if b == e.ids["z"] else before[(b, lo, hi)])
            for b, rs in writes.items()
            for lo, hi in rs
        }
        return Snapshots("NVIDIA H100", before, after)

    out = tmp_path / "g.kreplay"
    result = extract(path, Selection.kernel("gather"), out, snapshot=snapshot)
    assert asked["first"] == asked["last"] == e.ops["gather"]
    assert set(asked["reads"]) == {e.ids[r] for r in ("x", "y", "z", "t", "idx")}
    assert result.state_source == StateSource.GPU and result.gpu_device == "NVIDIA H100"
    _, states, checkpoints, _, meta, _ = contents(out)
    assert states["y"] == (0, e.data["Y1"].tobytes()) and checkpoints[0][1]["z"] == (0, e.data["Z2"].tobytes())
    assert dict(meta.properties)["extract.state"] == "gpu-replay (NVIDIA H100)"


def test_refusals(step, tmp_path):
    path, e = step
    out = tmp_path / "o.kreplay"
    out.write_bytes(b"mine")
    with pytest.raises(ReplayUsageError, match="exists; pass --force"):
        extract(path, Selection.operation(e.ops["saxpy0"]), out)
    assert out.read_bytes() == b"mine"
    with pytest.raises(ReplayUsageError, match="span regions"):
        extract(path, Selection.range(e.ops["saxpy1"], e.ops["saxpy2"]), tmp_path / "r.kreplay")
    with pytest.raises(ReplayUsageError, match="holds no device work"):
        extract(path, Selection.range(0, 3), tmp_path / "r.kreplay")
    with pytest.raises(ReplayUsageError, match=r"no such scope \(scopes: act, layer0, saxpy#2, step\)"):
        extract(path, Selection.scope("nope"), tmp_path / "r.kreplay")
    with pytest.raises(ReplayUsageError, match="outside the capture"):
        extract(path, Selection.operation(10_000), tmp_path / "r.kreplay")
    with pytest.raises(ReplayUsageError, match="is the source capture"):
        extract(path, Selection.operation(e.ops["saxpy0"]), path, ExtractOptions(overwrite=True))


def test_cli_output_replays_like_a_kernel_mode_capture(step, tmp_path):
    path, _e = step
    out = tmp_path / "cli.kreplay"
    runner = CliRunner()
    r = runner.invoke(extract_main, ["--kernel", "gather#0", "--no-gpu", "-o", str(out), str(path)])
    assert r.exit_code == 0, r.output
    assert "state      " in r.output and "from capture" in r.output and "scope      gather#0" in r.output
    r = runner.invoke(run_main, ["--dry-run", str(out)])
    assert r.exit_code == 0 and "dry run: plan OK" in r.output, r.output
    r = runner.invoke(dump_main, ["--format=json", str(out)])
    summary = json.loads(r.output)
    assert r.exit_code == 0 and summary["replayable"] is True, r.output
    # no silent replacement; --force replaces; a JSON report for scripts
    r = runner.invoke(extract_main, ["--kernel", "gather", "-o", str(out), str(path)])
    assert r.exit_code == 2 and "exists; pass --force" in r.output
    r = runner.invoke(extract_main, ["--scope", "step", "--force", "--format=json", "-o", str(out), str(path)])
    report = json.loads(r.output)
    assert r.exit_code == 0 and report["state_source"] == "capture" and report["source_operations"] == [15, 28]
    r = runner.invoke(
        extract_main, ["--kernel", "gather", "--scope", "step", "-o", str(tmp_path / "x.kreplay"), str(path)]
    )
    assert r.exit_code == 2 and "exactly one of" in r.output
    r = runner.invoke(extract_main, ["--operations", "9-3", "-o", str(tmp_path / "x.kreplay"), str(path)])
    assert r.exit_code == 2 and "FIRST..LAST" in r.output


class FakeGpu:
    """Buffers in host memory and a 'kernel' run by numpy: out[0:n] = in[a:a+n] + in[b:b+n] (in
    buffer 1, out buffer 2), as the zeroed reruns of the narrowing see it."""

    def __init__(self, a: int, b: int, n: int) -> None:
        self.a, self.b, self.n = a, b, n
        self.mem = {1: np.zeros(8192, np.uint8), 2: np.zeros(4096, np.uint8)}
        self.reruns = 0

    def read(self, buffer, size):
        return self.mem[buffer][:size].copy()

    def write(self, buffer, data):
        self.mem[buffer][:] = data

    def synchronize(self):
        pass

    def execute_steps(self, steps):
        self.reruns += 1
        x = self.mem[1].view(np.float32)
        y = self.mem[2].view(np.float32)
        a, b, n = self.a // 4, self.b // 4, self.n // 4
        y[:n] = x[a : a + n] + x[b : b + n]


def test_narrowing_keeps_the_validated_windows_only():
    from replayfmt.edit.prefix import changed_ranges, narrow_kept
    from replayfmt.edit.snapshots import Narrowing

    gpu = FakeGpu(a=1024, b=4096, n=1024)
    rng = np.random.default_rng(1)
    gpu.mem[1][:] = rng.integers(1, 255, 8192, dtype=np.uint8)
    gpu.mem[2][:] = 7
    before = {b: gpu.read(b, len(v)) for b, v in gpu.mem.items()}
    gpu.execute_steps([])
    after = {b: gpu.read(b, len(v)) for b, v in gpu.mem.items()}
    changed = {b: changed_ranges(before[b], after[b]) for b in before}
    assert changed == {1: [], 2: [(0, 1024)]}
    whole = {1: [(0, 8192)], 2: [(0, 4096)]}
    # tier 1: the pointer at 1024 reaches the next target (2048), the one at 4096 keeps 4 KiB -> too little
    # for neither; tier 2 (to the end) reproduces; then each buffer is lowered to tier 1 where it still does
    tiers = ({1: [(1024, 2048), (4096, 8192)], 2: [(0, 256)]}, {1: [(1024, 8192), (4096, 8192)], 2: [(0, 4096)]})
    kept, words = narrow_kept(gpu, gpu, [], Narrowing(tiers), before, after, changed, whole, whole)
    assert kept == {1: [(1024, 2048), (4096, 8192)], 2: [(0, 1024)]}
    assert words.startswith("6144 of 12288 bytes") and gpu.reruns == 4
    # a window that misses bytes the kernel reads is refused: whole buffers then
    short = ({1: [(1024, 1536)], 2: [(0, 256)]}, {1: [(1024, 1536)], 2: [(0, 256)]})
    kept, words = narrow_kept(gpu, gpu, [], Narrowing(short), before, after, changed, whole, whole)
    assert kept == whole and words.startswith("whole buffers")
    # buffers holding pointers are never narrowed
    kept, _ = narrow_kept(gpu, gpu, [], Narrowing(tiers, frozenset({1})), before, after, changed, whole, whole)
    assert kept == {1: [(0, 8192)], 2: [(0, 1024)]}


def test_no_gpu_writes_the_checkpoint_the_capture_holds_and_lists_the_rest(tmp_path):
    """The saxpy example checkpoints only y after the launch: x (which the launch may write) is
    left unchecked, and said so; the starting state comes from the uploads."""
    out = tmp_path / "s.kreplay"
    result = extract(EXAMPLES / "saxpy.kreplay", Selection.operation(9), out, ExtractOptions(allow_gpu=False))
    _, states, checkpoints, _, _, _ = contents(out)
    assert set(states) == {"x", "y"} and [set(c) for _, c in checkpoints] == [{"y"}]
    assert len(result.unchecked) == 1 and result.unchecked[0].startswith("buffer 3 bytes [0, 16384) after operation 9")
    r = CliRunner().invoke(
        extract_main,
        ["--operation", "9", "--no-gpu", "-o", str(tmp_path / "t.kreplay"), str(EXAMPLES / "saxpy.kreplay")],
    )
    assert r.exit_code == 0 and "unchecked  buffer 3 bytes [0, 16384) after operation 9" in r.output


def test_without_a_gpu_the_error_says_what_the_gpu_was_for(tmp_path, cubin):
    path = tmp_path / "bare.kreplay"
    step_capture(path, cubin, checkpoints=False)

    def no_gpu(*args, **kwargs):
        raise DeviceUnavailableError("no CUDA driver")

    with pytest.raises(DeviceUnavailableError, match=r"does not hold buffer \d+ bytes .* needs a GPU: no CUDA driver"):
        extract(path, Selection.kernel("gather"), tmp_path / "g.kreplay", snapshot=no_gpu)
    assert not (tmp_path / "g.kreplay").exists()


def test_a_graph_launch_brings_its_graph_executable_and_event(sample, tmp_path):
    """tests/samples.py's graph launch (a memset, a kernel and an event record node): the graph
    object moves with its nodes' ids renumbered; its state comes from the (given) GPU read-back."""

    def snapshot(source, first, last, reads, writes):
        before = {(b, lo, hi): bytes(range(256)) * ((hi - lo) // 256) for b, rs in reads.items() for lo, hi in rs}
        return Snapshots("NVIDIA H100", before, dict(before))

    out = tmp_path / "graph.kreplay"
    result = extract(sample, Selection.operation(28), out, snapshot=snapshot)
    objects, states, checkpoints, ops, _, _ = contents(out)
    assert [set(c) for _, c in checkpoints] == [{"x", "y"}]
    kinds = sorted(type(o).__name__ for o in objects)
    assert kinds == ["Buffer", "Buffer", "Device", "Event", "Executable", "Global", "Graph", "Stream"]
    graph = next(o for o in objects if isinstance(o, m.Graph))
    ids = {type(o).__name__: o.id for o in objects if not isinstance(o, m.Buffer)}
    by_label = {o.label: o.id for o in objects if isinstance(o, m.Buffer)}
    kernel = graph.nodes[1]
    assert kernel.executable == ids["Executable"] and graph.nodes[2].event == ids["Event"]
    assert {r.target_buffer for r in kernel.relocations} == {by_label["x"], by_label["y"]}
    assert graph.nodes[0].dst_buffer == by_label["y"] and graph.edges == ((0, 1), (1, 2))
    assert [op.kind.label for op in ops if op.kind not in (_K.CREATE_OBJECT,)] == [
        "scope_begin",
        "state",
        "state",
        "graph_launch",
        "checkpoint",
        "scope_end",
    ]
    assert set(states) == {"x", "y"} and result.state_source == StateSource.GPU


def test_shadow_intervals_against_a_byte_array():
    """The run-length states agree with one flag per byte under random sets (a 64 GiB arena
    dirtied by a launch must cost one run)."""
    from replayfmt.edit.shadow import ByteState, Intervals

    rng = np.random.default_rng(5)
    size = 1000
    runs_ = Intervals(size)
    flags = np.zeros(size, np.uint8)
    for _ in range(400):
        lo, hi = sorted(rng.integers(0, size + 1, 2))
        state = ByteState(int(rng.integers(0, 3)))
        runs_.set(int(lo), int(hi), state)
        flags[lo:hi] = state
        lo, hi = sorted(int(v) for v in rng.integers(0, size + 1, 2))
        rebuilt = np.zeros(hi - lo, np.uint8)
        for a, b, s in runs_.pieces(lo, hi):
            rebuilt[a - lo : b - lo] = s
        assert np.array_equal(rebuilt, flags[lo:hi])
    big = Intervals(64 << 30)
    big.set(0, 64 << 30, ByteState.DIRTY)
    big.set(4096, 8192, ByteState.KNOWN)
    assert big.pieces(0, 64 << 30) == [
        (0, 4096, ByteState.DIRTY),
        (4096, 8192, ByteState.KNOWN),
        (8192, 64 << 30, ByteState.DIRTY),
    ]


def test_gpu_read_back_is_bounded(tmp_path, cubin):
    path = tmp_path / "bare.kreplay"
    step_capture(path, cubin, checkpoints=False)
    r = CliRunner().invoke(
        extract_main, ["--kernel", "gather", "--max-read-gib", "0.000001", "-o", str(tmp_path / "g.kreplay"), str(path)]
    )
    assert (
        r.exit_code == 2
        and "reads the 5 buffers the work uses whole" in r.output
        and "4112 bytes (buffer 3: 1024), over --max-read-gib (1073 bytes)" in r.output
    )


def test_a_range_keeps_the_scopes_wholly_inside_it(step, tmp_path):
    """layer0 ... act: both inner scopes are whole in the range, so both stay (the extract's own
    scope is named after the range); the step's markers are outside it."""
    path, e = step
    first, last = e.ops["saxpy0"] - 1, e.ops["gather"] + 2  # layer0's begin .. act's end
    out = tmp_path / "r.kreplay"
    result = extract(path, Selection.range(first, last), out, ExtractOptions(allow_gpu=False))
    _, _, checkpoints, ops, _, _ = contents(out)
    names = [(op.kind.label, op.name) for op in ops if op.kind in (_K.SCOPE_BEGIN, _K.SCOPE_END)]
    assert names == [
        ("scope_begin", f"operations {first}..{last}"),
        ("scope_begin", "layer0"),
        ("scope_end", "layer0"),
        ("scope_begin", "act"),
        ("scope_end", "act"),
        ("scope_end", f"operations {first}..{last}"),
    ]
    assert result.scope == f"operations {first}..{last}" and [n for n, _ in checkpoints][-1] == result.scope


def test_an_extract_needing_a_buffer_that_stores_pointers_is_refused(tmp_path, cubin):
    """Pointers stored in memory (1.3 data relocations) would be rebuilt as plain bytes: refused."""
    from edit_captures import SAXPY, saxpy_params

    path = tmp_path / "p.kreplay"
    with replayfmt.CaptureWriter(path) as w:
        dev = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        x = w.add_object(m.Buffer(size=4096, device=dev, label="x"))
        y = w.add_object(m.Buffer(size=4096, device=dev, label="y"))
        exe = w.add_object(
            m.Executable(
                format=m.ExecutableFormat.CUBIN, target_arch="sm_90", payload=w.add_payload(cubin), functions=(SAXPY,)
            )
        )
        w.copy_h2d(dst_buffer=x, data=bytes(4096), relocations=[m.Relocation(x, y, 0, 0)])  # x[0] points at y
        with w.scope("step"):
            launch = w.launch(
                executable=exe,
                function=0,
                grid=(1, 1, 1),
                block=(32, 1, 1),
                parameters=saxpy_params(2.0),
                relocations=[m.Relocation(0, x, 8, 0), m.Relocation(0, y, 16, 0)],
            )
    with pytest.raises(replayfmt.UnsupportedOperationError, match="stores 1 pointer"):
        extract(path, Selection.operation(launch), tmp_path / "one.kreplay", ExtractOptions(allow_gpu=False))
    assert not (tmp_path / "one.kreplay").exists()
