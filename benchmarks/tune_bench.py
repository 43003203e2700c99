"""tune-replay speed, on a GPU (issue: tune-replay): candidates per second on a small kernel.

    python benchmarks/tune_bench.py [--candidates 50]

A grid-stride kernel over 1 Mi floats; every candidate is replayed, verified against the
checkpoint and timed (2 warm-up + 10 timed repetitions), in the worker process. Goal: >= 50
candidates/s (Mneme's documentation shows about 11 configurations per second).
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=50)
    args = parser.parse_args()
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
        f"worker start: {rate:.1f} candidates/s   goal >= 50  {'ok' if rate >= 50 else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
