"""Replay on a real GPU: captures written with the writer from kernels compiled from the repo's own
.cu sources, replayed with the Replayer and with run-replay, verified against checkpoints."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from driver_refusals import skip_when_the_range_is_refused

import replayfmt
from replayfmt.execute import open_replay
from replayfmt.format import model as m
from replayfmt.replay import Replayer, ReplayOptions, StepKind
from replayfmt.replay.compare import Tolerance
from replayfmt.replay.plan import build_plan
from replayfmt.replay.plan_options import PlanOptions, Substitution

pytestmark = pytest.mark.gpu

P = m.ParameterKind
F32 = m.DType.FLOAT32


def fn(name: str, *params: tuple[int, int, m.ParameterKind, m.DType]) -> m.Function:
    return m.Function(
        name=name,
        parameters=tuple(m.Parameter(offset=o, size=s, kind=k, dtype=d) for o, s, k, d in params),
        parameters_known=True,
    )


AXPY = fn("axpy", (0, 4, P.VALUE, F32), (8, 8, P.POINTER, 0), (16, 8, P.POINTER, 0), (24, 4, P.VALUE, m.DType.INT32))
SCALE = fn("scale", (0, 8, P.POINTER, 0), (8, 4, P.VALUE, F32), (12, 4, P.VALUE, m.DType.INT32))
GATHER = fn("gather_tables", (0, 8, P.POINTER, 0), (8, 8, P.POINTER, 0), (16, 4, P.VALUE, m.DType.INT32))
REVERSE = fn("reverse_in_shared", (0, 8, P.POINTER, 0), (8, 8, P.POINTER, 0), (16, 4, P.VALUE, m.DType.INT32))
CLUSTER = fn("cluster_ranks", (0, 8, P.POINTER, 0))
FAULT = fn("write_through", (0, 8, P.POINTER, 0))
FUNCTIONS = (AXPY, SCALE, GATHER, REVERSE, CLUSTER, FAULT)


def ints(n: int, seed: int) -> np.ndarray:
    """Integer-valued float32 data: exact under any summation order or FMA contraction, never zero."""
    values = np.random.default_rng(seed).integers(1, 60, n).astype(np.float32)
    return values * np.where(np.arange(n) % 3 == 0, -1, 1).astype(np.float32)


def i32(v: int) -> bytes:
    return int(v).to_bytes(4, "little", signed=True)


def f32(v: float) -> bytes:
    return np.float32(v).tobytes()


class Capture:
    """Writes a capture whose first executable holds every test kernel."""

    def __init__(self, path: Path, cubin: bytes, **writer_options) -> None:
        self.path = path
        self.w = replayfmt.CaptureWriter(path, threads=0, **writer_options)
        self.dev = self.w.add_object(m.Device(name="test", compute_capability=(9, 0)))
        self.exe = self.w.add_object(
            m.Executable(format=m.ExecutableFormat.CUBIN, payload=self.w.add_payload(cubin), functions=FUNCTIONS)
        )
        self.w.module_load(self.exe, self.dev)

    def buffer(self, size: int, **kw) -> int:
        return self.w.add_object(m.Buffer(size=size, device=self.dev, **kw))

    def launch(self, kernel: m.Function, grid, block, params: bytes, relocations=(), **kw) -> int:
        return self.w.launch(
            executable=self.exe,
            function=FUNCTIONS.index(kernel),
            grid=grid,
            block=block,
            parameters=params,
            relocations=relocations,
            **kw,
        )

    def close(self) -> Path:
        self.w.close()
        return self.path


def replay(path: Path, *, verify: bool = True, tolerance: Tolerance = Tolerance(), repetitions: int = 1, **plan_kw):
    with replayfmt.open(path) as cap:
        plan = build_plan(cap, PlanOptions(**plan_kw))
        with Replayer(plan, ReplayOptions(verify=verify, tolerance=tolerance)) as r:
            return r.run(repetitions)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "replayfmt_tools.run_replay", *args], capture_output=True, text=True)


def test_multi_stream_with_event_edges_memset_and_copies(tmp_path, kernels):
    n = 1 << 16
    x, y = ints(n, 1), ints(n, 2)
    c = Capture(tmp_path / "streams.kreplay", kernels["replay_kernels"])
    s1 = c.w.add_object(m.Stream(device=c.dev, flags=1))
    s2 = c.w.add_object(m.Stream(device=c.dev, flags=1))
    ev = c.w.add_object(m.Event(device=c.dev))
    bx, by, bz = (c.buffer(4 * n, dtype=F32, shape=(n,)) for _ in range(3))
    c.w.copy_h2d(dst_buffer=bx, data=x, stream=s1)
    c.w.copy_h2d(dst_buffer=by, data=y, stream=s1)
    c.w.memset(buffer=by, value=0x40400000, count=1024, element_size=4, stream=s1)  # 3.0f
    c.launch(
        AXPY,
        (n // 256, 1, 1),
        (256, 1, 1),
        f32(2) + bytes(20) + i32(n) + bytes(4),
        [m.Relocation(0, bx, 8, 0), m.Relocation(0, by, 16, 0)],
        stream=s1,
    )
    c.w.event_record(ev, s1)
    c.w.stream_wait_event(s2, ev)
    c.w.copy_d2d(src_buffer=by, dst_buffer=bz, size=4 * n, stream=s2)
    c.launch(
        SCALE, (n // 256, 1, 1), (256, 1, 1), bytes(8) + f32(-0.5) + i32(n), [m.Relocation(0, bz, 0, 0)], stream=s2
    )
    c.w.stream_synchronize(s2)
    y_after = y.copy()
    y_after[:1024] = 3.0
    expected_y = 2 * x + y_after
    c.w.checkpoint({by: expected_y, bz: expected_y * -0.5})
    result = replay(c.close())
    assert len(result.reports) == 2 and result.verified, [r.line() for r in result.reports]
    assert all(r.elements == 4 * n for r in result.reports)  # exact bytes


def test_pointers_inside_buffers_are_relocated(tmp_path, kernels):
    n = 4096
    a, b = ints(n, 3), ints(n, 4)
    c = Capture(tmp_path / "tables.kreplay", kernels["replay_kernels"])
    ba, bb, out = (c.buffer(4 * n, dtype=F32, shape=(n,)) for _ in range(3))
    tables = c.buffer(16)
    c.w.copy_h2d(dst_buffer=ba, data=a)
    c.w.copy_h2d(dst_buffer=bb, data=b)
    c.w.copy_h2d(dst_buffer=tables, data=np.array([0xDEAD0000, 0xBEEF0000], np.uint64))  # captured addresses
    c.launch(
        GATHER,
        (n // 128, 1, 1),
        (128, 1, 1),
        bytes(16) + i32(n) + bytes(4),
        [
            m.Relocation(0, tables, 0, 0),
            m.Relocation(0, out, 8, 0),
            m.Relocation(tables, ba, 0, 0),
            m.Relocation(tables, bb, 8, 0),
        ],
    )
    c.w.checkpoint({out: a + 2 * b})
    result = replay(c.close())
    assert result.verified and len(result.reports) > 0, [r.line() for r in result.reports]


def test_dynamic_shared_memory_over_48_kib(tmp_path, kernels):
    per_block, blocks = 24 * 1024, 8  # 96 KiB of dynamic shared memory per block
    data = ints(per_block * blocks, 5)
    c = Capture(tmp_path / "smem.kreplay", kernels["replay_kernels"])
    src, dst = (c.buffer(data.nbytes, dtype=F32, shape=(data.size,)) for _ in range(2))
    c.w.copy_h2d(dst_buffer=src, data=data)
    c.launch(
        REVERSE,
        (blocks, 1, 1),
        (512, 1, 1),
        bytes(16) + i32(per_block) + bytes(4),
        [m.Relocation(0, src, 0, 0), m.Relocation(0, dst, 8, 0)],
        shared_memory=4 * per_block,
    )
    c.w.checkpoint({dst: data.reshape(blocks, per_block)[:, ::-1].ravel()})
    result = replay(c.close())
    assert result.verified and len(result.reports) > 0, [r.line() for r in result.reports]


def test_cluster_launch_keeps_its_cluster_dimensions(tmp_path, kernels):
    blocks = 16
    c = Capture(tmp_path / "cluster.kreplay", kernels["replay_kernels"])
    out = c.buffer(4 * blocks, dtype=m.DType.INT32, shape=(blocks,))
    c.w.memset(buffer=out, value=0xFF, count=4 * blocks)
    c.launch(CLUSTER, (blocks, 1, 1), (32, 1, 1), bytes(8), [m.Relocation(0, out, 0, 0)], cluster=(4, 1, 1))
    c.w.checkpoint({out: (np.arange(blocks) % 4 + 400).astype(np.int32)})
    result = replay(c.close())
    assert result.verified and len(result.reports) > 0, [r.line() for r in result.reports]


def _axpy_capture(tmp_path: Path, kernels, *, expected_scale: float = 2.0) -> tuple[Path, int]:
    n = 1 << 14
    x, y = ints(n, 6), ints(n, 7)
    c = Capture(tmp_path / "axpy.kreplay", kernels["replay_kernels"])
    bx, by = c.buffer(4 * n, dtype=F32, shape=(n,)), c.buffer(4 * n, dtype=F32, shape=(n,))
    c.w.copy_h2d(dst_buffer=bx, data=x)
    c.w.copy_h2d(dst_buffer=by, data=y)
    with c.w.scope("axpy"):
        c.launch(
            AXPY,
            (n // 256, 1, 1),
            (256, 1, 1),
            f32(2) + bytes(20) + i32(n) + bytes(4),
            [m.Relocation(0, bx, 8, 0), m.Relocation(0, by, 16, 0)],
        )
    c.w.checkpoint({by: expected_scale * x + y})
    return c.close(), c.exe


def test_replays_issue_from_c_where_the_loop_was_built(tmp_path, kernels):
    """pip builds replayfmt/replay/issue.c: the device's replays issue their launches, copies and
    event records from it (every replay of this suite does), and a replay through it verifies."""
    path, _ = _axpy_capture(tmp_path, kernels)
    with replayfmt.open(path) as cap, Replayer(build_plan(cap), ReplayOptions(verify=True)) as r:
        assert r.issue_compiled, "the C issue loop was not built or found no driver entry points"
        result = r.run(3)
    assert result.verified and len(result.device_ms) == 3 and all(t > 0 for t in result.device_ms)


def test_substitution_with_the_same_abi_runs_and_verifies(tmp_path, kernels):
    path, exe = _axpy_capture(tmp_path, kernels)
    sub = tmp_path / "same.cubin"
    sub.write_bytes(kernels["replay_kernels_same_abi"])
    # the capture's executable holds six functions; the substitute must hold the ones launched
    result = replay(path, substitutions=(Substitution(exe, sub),))
    assert result.verified and len(result.reports) > 0


def test_a_substitute_that_computes_another_answer_is_what_runs(tmp_path, kernels):
    """Substitution of an ordinary launch takes effect: a substitute computing a * x + y + 1 makes
    the checkpoint mismatch from its first element on (a substitute computing the same answer
    proves nothing about which code ran). Exact comparison counts bytes: adding 1.0 leaves some
    bytes of a float as they were."""
    path, exe = _axpy_capture(tmp_path, kernels)
    sub = tmp_path / "wrong.cubin"
    sub.write_bytes(kernels["replay_kernels_wrong"])
    result = replay(path, substitutions=(Substitution(exe, sub),))
    compared = [r for r in result.reports if r.elements]
    assert compared and all(not r.passed and r.mismatches and r.first_mismatch < 4 for r in compared), [
        r.line() for r in compared
    ]
    assert not result.verified
    cli = run_cli("--verify", f"--executable-substitution={exe}={sub}", str(path))
    said = cli.stdout + cli.stderr
    assert cli.returncode == 1 and f"FAIL wrong: {1 << 14} of {1 << 14} elements wrong" in said, said[-2000:]
    assert run_cli("--verify", str(path)).returncode == 0  # the captured code computes the captured answer


def test_substitution_with_another_abi_is_refused(tmp_path, kernels):
    path, exe = _axpy_capture(tmp_path, kernels)
    sub = tmp_path / "other.cubin"
    sub.write_bytes(kernels["replay_kernels_other_abi"])
    result = run_cli(f"--executable-substitution={exe}={sub}", str(path))
    assert result.returncode == 1 and "function axpy has another ABI" in result.stderr


def test_verification_mismatch_is_reported_per_buffer(tmp_path, kernels):
    path, _ = _axpy_capture(tmp_path, kernels, expected_scale=2.001)
    result = run_cli("--verify", "--tolerance", "--rtol=1e-6", str(path))
    assert result.returncode == 1
    assert "FAIL wrong" in result.stdout and "<- wrong" in result.stdout and "replay min" in result.stdout
    assert "verification: 1 of" in result.stderr
    result = run_cli("--verify", "--rtol=1e-2", str(path))
    assert result.returncode == 0, result.stderr


def test_verification_is_chosen_per_run(tmp_path, kernels):
    path, _ = _axpy_capture(tmp_path, kernels, expected_scale=3.0)  # the checkpoint cannot match
    with open_replay(path) as session:
        r = session.start(ReplayOptions(verify=True))
        assert [s.kind for s in r.steps].count(StepKind.CHECKPOINT) == 1
        result = r.run(1)
        assert not result.verified and len(result.mismatches) == 1
        with pytest.raises(replayfmt.VerificationError, match="verification failed for 1 buffer range"):
            result.require_verified()
        assert r.run(2, verify=False).reports == []  # no read-back, no comparison
    with replayfmt.open(path) as cap, Replayer(build_plan(cap), ReplayOptions()) as r:
        assert StepKind.CHECKPOINT not in {s.kind for s in r.steps}
        with pytest.raises(replayfmt.ReplayUsageError, match=r"ReplayOptions\(verify=True\)"):
            r.run(1, verify=True)


def test_repetitions_and_save_output(tmp_path, kernels):
    path, _ = _axpy_capture(tmp_path, kernels)
    out = tmp_path / "out"
    result = run_cli("--verify", "--repetitions=3", f"--save-output={out}", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("ms device time") == 3 and "verified: 1" in result.stdout
    saved = list(out.glob("*.npy"))
    assert len(saved) == 1 and np.load(saved[0]).shape == (1 << 14,)  # saved once, from the first repetition


def test_files_are_read_after_remapping(tmp_path, kernels):
    from replayfmt.container.files import identity_of

    n = 4096
    data = ints(n, 8)
    root = tmp_path / "moved"
    root.mkdir()
    (root / "w.bin").write_bytes(data.tobytes())
    c = Capture(tmp_path / "file.kreplay", kernels["replay_kernels"])
    buf = c.buffer(4 * n, dtype=F32, shape=(n,))
    ref = c.w.add_object(m.FileReference(path="/original/w.bin", **identity_of(str(root / "w.bin"))))
    c.w.copy_h2d(dst_buffer=buf, src_file=ref, size=4 * n)
    c.w.checkpoint({buf: data})
    path = c.close()
    result = run_cli("--verify", f"--file-remap=/original={root}", str(path))
    assert result.returncode == 0, result.stderr
    os.utime(root / "w.bin", ns=(5, 5))
    result = run_cli("--verify", f"--file-remap=/original={root}", str(path))
    assert result.returncode == 1 and "not the captured file" in result.stderr


def test_unsupported_operation_is_refused(tmp_path, kernels):
    path = tmp_path / "u.kreplay"
    c = Capture(path, kernels["replay_kernels"])
    c.w.unsupported("cuLaunchHostFunc", "host callbacks cannot be replayed")
    result = run_cli(str(c.close()))
    assert result.returncode == 1 and "operation 3: cuLaunchHostFunc cannot be replayed" in result.stderr


def test_corrupted_payload_is_refused(tmp_path, kernels):
    path, _ = _axpy_capture(tmp_path, kernels)
    with replayfmt.open(path) as cap:
        pid = next(op.payload for op in cap if op.kind == m.OperationKind.COPY_HOST_TO_DEVICE)
        frame = cap.frame_location(cap.payload(pid).frames[0])[0]
    data = bytearray(path.read_bytes())
    data[frame + 64 + 100] ^= 0x55
    path.write_bytes(bytes(data))
    result = run_cli("--verify", str(path))
    assert result.returncode == 2 and "checksum mismatch" in result.stderr and f"payload {pid}" in result.stderr
    assert result.stderr.count("\n") == 1


def test_faulting_kernel_gives_a_clean_error_naming_the_launch(tmp_path, kernels):
    c = Capture(tmp_path / "fault.kreplay", kernels["replay_kernels"])
    index = c.launch(FAULT, (1, 1, 1), (32, 1, 1), (0x10).to_bytes(8, "little"))  # a null-page pointer
    c.w.device_synchronize(c.dev)
    path = c.close()
    result = run_cli(str(path))
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "ILLEGAL_ADDRESS" in result.stderr and f"operation {index} (write_through)" in result.stderr
    # in the library the error says it is sticky (tune-replay's worker restarts on it); in a child
    # process, since the context it poisons is unusable afterwards
    script = (
        "import sys, replayfmt\n"
        "from replayfmt.replay import Replayer, build_plan\n"
        "with replayfmt.open(sys.argv[1]) as cap, Replayer(build_plan(cap)) as r:\n"
        "    try:\n"
        "        r.run(1)\n"
        "    except replayfmt.DeviceError as exc:\n"
        "        print('sticky' if exc.sticky else 'not sticky', exc)\n"
    )
    child = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True)
    assert child.stdout.startswith("sticky ") and "ILLEGAL_ADDRESS" in child.stdout, child.stdout + child.stderr


def test_cubin_for_another_architecture_is_refused_before_running(tmp_path, kernels, gpu_arch):
    from samples import compiled_cubin

    other = "sm_80" if gpu_arch != "sm_80" else "sm_90"
    path, exe = _axpy_capture(tmp_path, kernels)
    sub = tmp_path / "other_arch.cubin"
    sub.write_bytes(compiled_cubin(Path(__file__).parent / "kernels" / "replay_kernels_same_abi.cu", other))
    result = run_cli(f"--executable-substitution={exe}={sub}", str(path))
    assert result.returncode == 1 and f"cubin for {other}" in result.stderr and "cannot run it" in result.stderr


PROBE = """
from replayfmt.cuda.driver import check, driver
cu = driver()
ctx = check(cu.cuDevicePrimaryCtxRetain(check(cu.cuDeviceGet(0), "dev")), "ctx")
check(cu.cuCtxSetCurrent(ctx), "ctx")
print(int(check(cu.cuMemAddressReserve(1 << 24, 1 << 21, 0x600000000000, 0), "reserve")))
"""


def test_fixed_addresses_reproduce_unrelocatable_pointers(tmp_path, kernels):
    # The driver grants an address hint only inside its own per-process range, which address-space
    # randomisation moves: the capturing and the replaying process both run without it (setarch -R).
    if shutil.which("setarch") is None:
        pytest.skip("setarch is needed to run without address-space randomisation")
    norandom = ["setarch", os.uname().machine, "-R"]
    base = int(
        subprocess.run([*norandom, sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    )
    n = 1 << 14
    x, y = ints(n, 9), ints(n, 10)
    c = Capture(tmp_path / "fixed.kreplay", kernels["replay_kernels"])
    bx = c.buffer(4 * n, dtype=F32, shape=(n,), address=base, requires_fixed_address=True)
    by = c.buffer(4 * n, dtype=F32, shape=(n,), address=base + (1 << 21), requires_fixed_address=True)
    c.w.copy_h2d(dst_buffer=bx, data=x)
    c.w.copy_h2d(dst_buffer=by, data=y)
    raw = f32(2) + bytes(4) + base.to_bytes(8, "little") + (base + (1 << 21)).to_bytes(8, "little") + i32(n) + bytes(4)
    c.launch(AXPY, (n // 256, 1, 1), (256, 1, 1), raw)  # no relocations: the pointers must stay valid
    # pinned host memory the kernel reads: its host address cannot be chosen, so it is relocated
    pinned_x = c.buffer(4 * n, dtype=F32, shape=(n,), address=0x7F12_3400_0000, memory=m.MemoryKind.HOST_PINNED)
    bz = c.buffer(4 * n, dtype=F32, shape=(n,), address=base + (2 << 21), requires_fixed_address=True)
    c.w.copy_h2d(dst_buffer=pinned_x, data=x)
    c.w.copy_h2d(dst_buffer=bz, data=x)
    raw = f32(3) + bytes(20) + i32(n) + bytes(4)
    moved = (m.Relocation(0, pinned_x, 8, 0), m.Relocation(0, bz, 16, 0))
    c.launch(AXPY, (n // 256, 1, 1), (256, 1, 1), raw, moved)
    c.w.checkpoint({by: 2 * x + y, bz: 4 * x})
    path = c.close()
    result = run_cli("--verify", str(path))
    assert result.returncode == 1 and "--fixed-addresses" in result.stderr
    result = subprocess.run(
        [*norandom, sys.executable, "-m", "replayfmt_tools.run_replay", "--verify", "--fixed-addresses", str(path)],
        capture_output=True,
        text=True,
    )
    skip_when_the_range_is_refused(result)
    assert result.returncode == 0, result.stderr
    assert "verified: 2" in result.stdout


def test_a_field_beside_a_stale_half_relocated_into_a_buffer_on_a_boundary_keeps_its_value(tmp_path, kernels):
    """A buffer recorded on a 4 GiB boundary is placed at its recorded address modulo 4 GiB: the
    recorder takes a small int beside the stale high half of an old pointer for a pointer into it
    (here axpy's element count, with 0x7f26 in the padding after it), and relocating that word
    must change only its high half, while a real pointer into the same buffer still follows it."""
    n = 1 << 14
    x, y = ints(n, 11), ints(n, 12)
    on_boundary = 0x7F26_0000_0000
    c = Capture(tmp_path / "boundary.kreplay", kernels["replay_kernels"])
    bx = c.buffer(4 << 20, address=on_boundary)
    by = c.buffer(4 * n, dtype=F32, shape=(n,), address=0x7F25_4000_0000)
    c.w.copy_h2d(dst_buffer=bx, data=x)
    c.w.copy_h2d(dst_buffer=by, data=y)
    count_and_stale_half = i32(n) + (on_boundary >> 32).to_bytes(4, "little")
    raw = f32(2) + bytes(4) + on_boundary.to_bytes(8, "little") + (0x7F25_4000_0000).to_bytes(8, "little")
    relocations = (m.Relocation(0, bx, 8, 0), m.Relocation(0, by, 16, 0), m.Relocation(0, bx, 24, n))
    c.launch(AXPY, (n // 256, 1, 1), (256, 1, 1), raw + count_and_stale_half, relocations)
    c.w.checkpoint({by: 2 * x + y})
    with replayfmt.open(c.close()) as cap:
        plan = build_plan(cap, PlanOptions())
        with Replayer(plan, ReplayOptions(verify=True)) as r:
            placed = r.addresses[bx]
            result = r.run(1)
    assert placed % (1 << 32) == on_boundary % (1 << 32)
    assert result.verified, [r.line() for r in result.reports]


def test_example_capture_replays_and_verifies(gpu_arch):
    example = Path(__file__).resolve().parents[2] / "examples" / "saxpy.kreplay"
    result = run_cli("--verify", str(example))
    assert result.returncode == 0, result.stderr
    assert "verified: 1 range(s) compared" in result.stdout


def _many_frames_capture(tmp_path: Path, kernels) -> tuple[Path, list[np.ndarray]]:
    """Three uploads cut into 64 KiB frames (raw noise and zstd-compressible data, ~400 frames in
    all), so that every upload lane carries many pieces, each checked by a checkpoint."""
    rng = np.random.default_rng(11)
    arrays = [
        rng.integers(1, 2**32, (9 << 20) // 4, dtype=np.uint32),
        np.repeat(np.arange(1, (6 << 20) // 64 + 1, dtype=np.uint32), 16),
        rng.integers(1, 2**32, (11 << 20) // 4 + 7, dtype=np.uint32),
    ]
    c = Capture(tmp_path / "frames.kreplay", kernels["replay_kernels"], frame_size=64 << 10)
    buffers = [c.buffer(a.nbytes) for a in arrays]
    for buffer, array in zip(buffers, arrays, strict=True):
        c.w.copy_h2d(dst_buffer=buffer, data=array)
    c.w.checkpoint(dict(zip(buffers, arrays, strict=True)))
    return c.close(), arrays


def test_many_frames_upload_through_every_lane_and_verify(tmp_path, kernels):
    path, arrays = _many_frames_capture(tmp_path, kernels)
    with replayfmt.open(path) as cap:
        uploads = [op for op in cap if op.kind == m.OperationKind.COPY_HOST_TO_DEVICE]
        assert sum(len(cap.payload(op.payload).frames) for op in uploads) > 300
        with Replayer(build_plan(cap), ReplayOptions(verify=True)) as r:
            assert r.pristine_on_device and r.staging.bytes == sum(a.nbytes for a in arrays)
            assert r.run(2).verified


def test_a_damaged_frame_among_many_stops_every_lane(tmp_path, kernels):
    path, _ = _many_frames_capture(tmp_path, kernels)
    with replayfmt.open(path) as cap:
        pid = [op.payload for op in cap if op.kind == m.OperationKind.COPY_HOST_TO_DEVICE][2]
        frame = cap.frame_location(cap.payload(pid).frames[97])[0]
    data = bytearray(path.read_bytes())
    data[frame + 64 + 1000] ^= 0x01
    path.write_bytes(bytes(data))
    result = run_cli("--verify", str(path))
    assert result.returncode == 2 and "checksum mismatch" in result.stderr
    assert f"payload {pid} frame 97" in result.stderr
    assert result.stderr.count("\n") == 1


def test_frames_are_checked_on_the_device_or_else_on_the_host(tmp_path, kernels, monkeypatch):
    path, _ = _many_frames_capture(tmp_path, kernels)
    with replayfmt.open(path) as cap, Replayer(build_plan(cap), ReplayOptions(verify=True)) as r:
        assert r.staging.checked == "on the device" and r.run(1).verified
    with replayfmt.open(path) as cap, Replayer(build_plan(cap), ReplayOptions(check_payloads=False)) as r:
        assert r.staging.checked == "no"
    data = bytearray(path.read_bytes())
    with replayfmt.open(path) as cap:
        pid = [op.payload for op in cap if op.kind == m.OperationKind.COPY_HOST_TO_DEVICE][1]  # zstd frames
        frame = cap.frame_location(cap.payload(pid).frames[40])[0]
    data[frame + 64 + 10] ^= 0x08
    path.write_bytes(bytes(data))
    import replayfmt.replay.staging as staging
    from replayfmt.cuda.driver import CudaCallError

    def refused(cu):
        raise CudaCallError("frame digests: cuModuleLoadData: CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "x")

    for fallback in (False, True):
        if fallback:  # a driver too old for the kernel's PTX: the host hashes instead
            monkeypatch.setattr(staging, "DeviceDigester", refused)
        with replayfmt.open(path) as cap, pytest.raises(replayfmt.ReplayFormatError, match=f"payload {pid} frame 40"):
            Replayer(build_plan(cap), ReplayOptions())
