"""tune-replay on a real GPU: a grid-stride kernel, a block-size-dependent kernel, a faulting one."""

import subprocess
import sys

import numpy as np
import pytest
from test_replay_gpu import F32, Capture, f32, i32, ints

import replayfmt
from replayfmt.format import model as m
from replayfmt.measure.tune import Candidate, CsvLog, SearchSpace, Worker, WorkerConfig, find_targets, prune, search
from replayfmt.replay.plan import build_plan

pytestmark = pytest.mark.gpu
P = m.ParameterKind
N = 1 << 20
STRIDE = m.Function(
    name="stride_scale",
    parameters_known=True,
    parameters=(
        m.Parameter(offset=0, size=8, kind=P.POINTER),
        m.Parameter(offset=8, size=4, kind=P.VALUE, dtype=F32),
        m.Parameter(offset=12, size=4, kind=P.VALUE, dtype=m.DType.INT32),
    ),
)
REVERSE = m.Function(
    name="reverse_blocks",
    parameters_known=True,
    parameters=(
        m.Parameter(offset=0, size=8, kind=P.POINTER),
        m.Parameter(offset=8, size=4, kind=P.VALUE, dtype=m.DType.INT32),
    ),
)
FAULT = m.Function(name="fault_if_wide", parameters_known=True, parameters=REVERSE.parameters)


def tune_capture(tmp_path, kernels, function: m.Function, grid, block, expected) -> tuple:
    y = ints(N, 21)
    c = Capture(tmp_path / f"{function.name}.kreplay", kernels["tune_kernels"])
    exe = c.w.add_object(
        m.Executable(
            format=m.ExecutableFormat.CUBIN, payload=c.w.add_payload(kernels["tune_kernels"]), functions=(function,)
        )
    )
    buf = c.buffer(4 * N, dtype=F32, shape=(N,))
    c.w.copy_h2d(dst_buffer=buf, data=y)
    params = bytes(8) + (f32(2) + i32(N) if function is STRIDE else i32(N) + bytes(4))
    op = c.w.launch(
        executable=exe, function=0, grid=grid, block=block, parameters=params, relocations=[m.Relocation(0, buf, 0, 0)]
    )
    c.w.checkpoint({buf: expected(y)})
    return c.close(), op


def run_search(path, op, space: SearchSpace):
    with replayfmt.open(path) as cap:
        plan = build_plan(cap)
        targets = find_targets(plan, launch=op, kernel=None)
    valid, _ = prune(plan, targets, space.points())
    worker = Worker(WorkerConfig(capture=str(path), operations=targets.operations, plan={}, repetitions=5))
    try:
        results = list(search(worker, valid, done={}, log=CsvLog(None, targets), timeout=30))
    finally:
        worker.close()
    return results, worker


def test_grid_stride_kernel_has_many_valid_points_and_a_faster_one(tmp_path, kernels):
    path, op = tune_capture(tmp_path, kernels, STRIDE, (1, 1, 1), (32, 1, 1), lambda y: 2 * y)
    space = SearchSpace(grids=[(1, 1, 1), (132, 1, 1), (528, 1, 1)], blocks=[(32, 1, 1), (256, 1, 1), (1024, 1, 1)])
    results, _ = run_search(path, op, space)
    assert len(results) == 10 and all(r.ok and r.verified for r in results), [r.error for r in results if not r.ok]
    times = {r.candidate: r.median_ms for r in results}
    assert times[Candidate((528, 1, 1), (256, 1, 1))] < times[Candidate()] / 5  # 1 block of 32 threads is slow


def test_kernel_correct_for_one_block_size_fails_verification_elsewhere(tmp_path, kernels):
    def expected(y):
        return y.reshape(-1, 256)[:, ::-1].ravel()

    path, op = tune_capture(tmp_path, kernels, REVERSE, (N // 256, 1, 1), (256, 1, 1), expected)
    space = SearchSpace(blocks=[(128, 1, 1), (256, 1, 1), (512, 1, 1)])
    results, _ = run_search(path, op, space)
    by_block = {r.candidate.block: r for r in results}
    assert by_block[None].ok and by_block[(256, 1, 1)].ok
    assert by_block[(128, 1, 1)].verified is False and "wrong result" in by_block[(128, 1, 1)].error
    assert by_block[(512, 1, 1)].verified is False


def test_faulting_shapes_are_isolated_and_the_search_finishes(tmp_path, kernels):
    path, op = tune_capture(tmp_path, kernels, FAULT, (132, 1, 1), (128, 1, 1), lambda y: 2 * y)
    space = SearchSpace(blocks=[(64, 1, 1), (512, 1, 1), (256, 1, 1), (1024, 1, 1), (128, 1, 1)])
    results, worker = run_search(path, op, space)
    by_block = {r.candidate.block: r for r in results}
    assert "ILLEGAL" in by_block[(512, 1, 1)].error and "ILLEGAL" in by_block[(1024, 1, 1)].error
    assert by_block[(64, 1, 1)].ok and by_block[(256, 1, 1)].ok and by_block[(128, 1, 1)].ok
    assert worker.restarts >= 2


def test_cli_csv_plot_and_winning_flags(tmp_path, kernels):
    path, op = tune_capture(tmp_path, kernels, STRIDE, (1, 1, 1), (32, 1, 1), lambda y: 2 * y)
    csv_path, plot_path = tmp_path / "t.csv", tmp_path / "t.png"
    args = [
        sys.executable,
        "-m",
        "replayfmt_tools.tune_replay",
        f"--launch={op}",
        "--grid=1;132;264",
        "--block=64;256;2048",
        f"--csv={csv_path}",
        f"--plot={plot_path}",
        str(path),
    ]
    result = subprocess.run(args, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "pruned" in result.stdout and "run-replay --launch=" in result.stdout and plot_path.exists()
    winner = result.stdout.strip().splitlines()[-1].split()
    replay = subprocess.run(
        [sys.executable, "-m", "replayfmt_tools.run_replay", *winner[1:]], capture_output=True, text=True
    )
    assert replay.returncode == 0, replay.stderr
    # 3 grids x 3 blocks, the 2048-thread blocks pruned: 6 candidates and the captured shape
    assert len(np.loadtxt(csv_path, delimiter=",", dtype=str, skiprows=1, usecols=0, ndmin=1)) == 7


def test_register_caps_re_jit_the_ptx(tmp_path, gpu_arch):
    import shutil
    import tempfile
    from pathlib import Path

    from replayfmt.cuda.driver import check, driver

    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        source = Path(__file__).parent / "kernels" / "tune_kernels.cu"
        subprocess.run(
            [nvcc, "-ptx", f"-arch={gpu_arch.replace('sm', 'compute')}", "-o", str(ptx), str(source)], check=True
        )
        text = ptx.read_bytes()
    y = ints(N, 31)
    path = tmp_path / "ptx.kreplay"
    with replayfmt.CaptureWriter(path) as w:
        exe = w.add_object(
            m.Executable(format=m.ExecutableFormat.PTX, payload=w.add_payload(text), functions=(STRIDE,))
        )
        buf = w.add_object(m.Buffer(size=4 * N, dtype=F32, shape=(N,)))
        w.copy_h2d(dst_buffer=buf, data=y)
        op = w.launch(
            executable=exe,
            function=0,
            grid=(264, 1, 1),
            block=(256, 1, 1),
            parameters=bytes(8) + f32(2) + i32(N),
            relocations=[m.Relocation(0, buf, 0, 0)],
        )
        w.checkpoint({buf: 2 * y})
    results, _ = run_search(path, op, SearchSpace(max_registers=[16, 32, 64]))
    assert len(results) == 4 and all(r.ok and r.verified for r in results), [r.error for r in results]
    # the cap is real: a 16-register JIT of the kernel reports at most 16 registers
    cu = driver()
    check(cu.cuCtxSetCurrent(check(cu.cuDevicePrimaryCtxRetain(check(cu.cuDeviceGet(0), "dev")), "ctx")), "ctx")
    option = cu.CUjit_option.CU_JIT_MAX_REGISTERS
    module = check(cu.cuModuleLoadDataEx(text + b"\0", 1, [option], [16]), "jit")
    function = check(cu.cuModuleGetFunction(module, b"stride_scale"), "function")
    attribute = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS
    assert check(cu.cuFuncGetAttribute(attribute, function), "registers") <= 16
