"""tune-replay speed, on a GPU (issue: tune-replay): candidates per second on a small kernel,
beside a bare evaluation of the same candidates measured in the same run.

    python benchmarks/tune_bench.py [--candidates 50] [--check]

A grid-stride kernel over 1 Mi floats; every candidate is replayed, verified against the
checkpoint and timed (2 warm-up + 10 timed repetitions), in the worker process. Goal: >= 50
candidates/s. The baseline does the same work per candidate with cuda-python alone, in this
process, with nothing around it: restore the input from a device copy, launch, download and
compare once; then 12 times restore, launch between CUDA events. Its rate is what evaluating a
candidate costs before any replay, verification bookkeeping or fault isolation.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from goals import Goals, add_check

import replayfmt
from replayfmt.cuda.driver import check, compute_capability, driver
from replayfmt.format import model as m
from replayfmt.measure.tune import CsvLog, SearchSpace, Worker, WorkerConfig, find_targets, prune, search
from replayfmt.replay.plan import build_plan

KERNELS = Path(__file__).resolve().parent.parent / "tests" / "gpu" / "kernels" / "tune_kernels.cu"
N = 1 << 20
STRIDE = m.Function(
    name="stride_scale",
    parameters_known=True,
    parameters=(
        m.Parameter(offset=0, size=8, kind=m.ParameterKind.POINTER),
        m.Parameter(offset=8, size=4, kind=m.ParameterKind.VALUE, dtype=m.DType.FLOAT32),
        m.Parameter(offset=12, size=4, kind=m.ParameterKind.VALUE, dtype=m.DType.INT32),
    ),
)


def bare_rate(cubin: bytes, y: np.ndarray, shapes: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> float:
    """Candidates per second evaluated with cuda-python alone (the module docstring's baseline)."""
    cu = driver()
    check(cu.cuInit(0), "cuInit")
    context = check(cu.cuDevicePrimaryCtxRetain(check(cu.cuDeviceGet(0), "cuDeviceGet")), "retain")
    check(cu.cuCtxSetCurrent(context), "set current")
    module = check(cu.cuModuleLoadData(cubin), "load")
    function = check(cu.cuModuleGetFunction(module, b"stride_scale"), "function")
    size = y.nbytes
    live, pristine = check(cu.cuMemAlloc(size), "alloc"), check(cu.cuMemAlloc(size), "alloc")
    check(cu.cuMemcpyHtoD(pristine, y.ctypes.data, size), "upload")
    stream = check(cu.cuStreamCreate(1), "stream")
    start, end = check(cu.cuEventCreate(0), "event"), check(cu.cuEventCreate(0), "event")
    args = [np.array([int(live)], np.uint64), np.array([2.0], np.float32), np.array([y.size], np.int32)]
    pointers = np.array([a.ctypes.data for a in args], np.uint64)
    expected, out = 2 * y, np.empty_like(y)

    def launch(grid: tuple[int, ...], block: tuple[int, ...]) -> None:
        check(cu.cuMemcpyDtoDAsync(live, pristine, size, stream), "restore")
        check(
            cu.cuLaunchKernel(function, *grid, *block, 0, stream, pointers.ctypes.data, 0),
            "launch",
        )

    began = time.perf_counter()
    wrong = 0
    for grid, block in shapes:
        launch(grid, block)
        check(cu.cuMemcpyDtoHAsync(out.ctypes.data, live, size, stream), "download")
        check(cu.cuStreamSynchronize(stream), "sync")
        wrong += not np.array_equal(out, expected)
        times = []
        for _ in range(2 + 10):
            check(cu.cuEventRecord(start, stream), "record")
            launch(grid, block)
            check(cu.cuEventRecord(end, stream), "record")
            check(cu.cuStreamSynchronize(stream), "sync")
            times.append(check(cu.cuEventElapsedTime(start, end), "elapsed"))
    elapsed = time.perf_counter() - began
    if wrong:
        raise RuntimeError(f"the bare baseline computed {wrong} wrong answers")
    for pointer in (live, pristine):
        check(cu.cuMemFree(pointer), "free")
    check(cu.cuModuleUnload(module), "unload")
    return len(shapes) / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=50)
    add_check(parser)
    args = parser.parse_args()
    goals = Goals()
    major, minor = compute_capability(check(driver().cuDeviceGet(0), "cuDeviceGet"))
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        subprocess.run([nvcc, "-cubin", f"-arch=sm_{major}{minor}", "-o", str(cubin), str(KERNELS)], check=True)
        path = Path(tmp) / "tune.kreplay"
        y = np.random.default_rng(0).integers(1, 100, N).astype(np.float32)
        with replayfmt.CaptureWriter(path) as w:
            dev = w.add_object(m.Device(name="bench"))
            buf = w.add_object(m.Buffer(size=4 * N, device=dev, dtype=m.DType.FLOAT32, shape=(N,)))
            exe = w.add_object(
                m.Executable(
                    format=m.ExecutableFormat.CUBIN, payload=w.add_payload(cubin.read_bytes()), functions=(STRIDE,)
                )
            )
            w.copy_h2d(dst_buffer=buf, data=y)
            op = w.launch(
                executable=exe,
                function=0,
                grid=(64, 1, 1),
                block=(128, 1, 1),
                parameters=bytes(8) + np.float32(2).tobytes() + np.int32(N).tobytes(),
                relocations=[m.Relocation(0, buf, 0, 0)],
            )
            w.checkpoint({buf: 2 * y})
        with replayfmt.open(path) as cap:
            plan = build_plan(cap)
            targets = find_targets(plan, launch=op, kernel=None)
        blocks = [(b, 1, 1) for b in (64, 128, 256, 512, 1024)]
        grids = [(g, 1, 1) for g in range(66, 66 * 40, 66)]
        space = SearchSpace(grids=grids, blocks=blocks)
        valid, _ = prune(plan, targets, space.points())
        valid = valid[: args.candidates]
        bare = bare_rate(cubin.read_bytes(), y, [(c.grid or targets.grid, c.block or targets.block) for c in valid[1:]])
        worker = Worker(WorkerConfig(capture=str(path), operations=targets.operations, plan={}))
        start = time.perf_counter()
        worker.evaluate(valid[0], 60)  # starts the worker: not counted
        startup = time.perf_counter() - start
        start = time.perf_counter()
        results = list(search(worker, valid[1:], done={}, log=CsvLog(None, targets), timeout=30))
        elapsed = time.perf_counter() - start
        worker.close()
    ok = sum(r.ok for r in results)
    rate = len(results) / elapsed
    print(
        f"sm_{major}{minor}: {len(results)} candidates ({ok} verified) in {elapsed:.2f} s after a {startup:.2f} s "
        f"worker start: {rate:.1f} candidates/s, bare cuda-python evaluation of the same candidates "
        f"{bare:.1f}/s ({rate / bare:.2f}x of bare)   goal >= 50/s  {goals.judge('candidates per second', rate >= 50)}"
    )
    goals.judge("every candidate verified", ok == len(results))
    return goals.exit_status(args.check)


if __name__ == "__main__":
    sys.exit(main())
