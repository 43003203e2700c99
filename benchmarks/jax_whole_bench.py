"""A whole JAX program, captured with no --scope, benchmarked against the original:
jax-ml-style kernel least squares (tests/gpu/capture_scripts/jax_kernel_lsq.py), its XLA
autotuner's DelayKernels included (the replay releases them: neither side times them).

    python benchmarks/jax_whole_bench.py [--n 1024] [--check]

Three processes, one after the other, nothing else on the GPU:
1. the original: the program run under CUPTI activity records (the clock Nsight Systems reads),
   every kernel, copy and memset from its start to its end; its GPU busy time is the union of
   their intervals, the delay kernels left out (each lasted as long as the host took to queue the
   work it precedes: host time, not the program's work);
2. the recorder: ``python -m replayfmt.capture`` on the same program, no --scope;
3. benchmark-replay on the capture (--clock=cupti): the replay's GPU busy time, beside the
   original's as the recorder stored it.

Goals: the replay's busy time within 2% of the original's (1); the capture's wall time (2, the
recorder's self-check included) at most twice the program's own, run alone first. The recorder's stored figure is
printed beside for reference (it runs under the recorder).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from goals import Goals, add_check

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tests" / "gpu" / "capture_scripts" / "jax_kernel_lsq.py"
GOAL = 0.02
CAPTURE_GOAL = 2.0  # the capture's wall time over the program's own


def original(n: int) -> dict:
    """In this process (a child of the bench): the program's GPU busy time with CUPTI."""
    from replayfmt.cuda.activity import KernelActivity
    from replayfmt.format.host_waits import host_wait
    from replayfmt.format.timings import busy_ns

    spec = importlib.util.spec_from_file_location("jax_kernel_lsq", PROGRAM)
    assert spec is not None and spec.loader is not None
    program = importlib.util.module_from_spec(spec)
    activity = KernelActivity()
    with activity:  # before JAX starts: every kernel it loads and launches is seen
        spec.loader.exec_module(program)
        program.main(n)  # (it ends on a value read back: the device is done)
    records = activity.take().records
    released = [r for r in records if host_wait(r.name) is not None]
    kept = [(r.start_ns, r.end_ns) for r in records if host_wait(r.name) is None]
    return {"busy_ms": busy_ns(kept) / 1e6, "records": len(kept), "delay_kernels": len(released)}


def run(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")])
    )
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env, timeout=1800)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1024, help="training points (the Gram matrix is n x n)")
    parser.add_argument("--original", action="store_true", help=argparse.SUPPRESS)  # the child of step 1
    add_check(parser)
    args = parser.parse_args()
    if args.original:
        print(json.dumps(original(args.n)))
        return 0
    goals = Goals()
    began = time.perf_counter()
    alone = run([sys.executable, str(PROGRAM), str(args.n)])  # the program's own wall time, nothing around it
    program_s = time.perf_counter() - began
    if alone.returncode != 0:
        print(f"the program did not run: {alone.stderr[-2000:]}")
        return goals.exit_status(args.check)
    measured = run([sys.executable, __file__, "--original", f"--n={args.n}"])
    if measured.returncode != 0:
        print(f"the original did not run: {measured.stderr[-2000:]}")
        return goals.exit_status(args.check)
    first = json.loads(measured.stdout.strip().splitlines()[-1])
    print(
        f"original: GPU busy {first['busy_ms']:.3f} ms over {first['records']} kernels, copies and memsets "
        f"({first['delay_kernels']} XLA autotuner delay kernels left out)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel_lsq.kreplay"
        began = time.perf_counter()
        recorded = run([sys.executable, "-m", "replayfmt.capture", "-o", str(path), str(PROGRAM), str(args.n)])
        capture_s = time.perf_counter() - began
        print("\n".join(line for line in recorded.stderr.splitlines() if "host waits" in line or "replayable" in line))
        if recorded.returncode != 0:
            print(f"capture failed: {recorded.stderr[-2000:]}")
            goals.judge("capture", False)
            return goals.exit_status(args.check)
        slowdown = capture_s / program_s
        verdict = goals.judge(f"capture within {CAPTURE_GOAL:g}x of the program's time", slowdown <= CAPTURE_GOAL)
        print(
            f"capture: {capture_s:.1f} s (the recorder's self-check included) against the program's own "
            f"{program_s:.1f} s: {slowdown:.2f}x (goal {CAPTURE_GOAL:g}x)  {verdict}"
        )
        bench = run(
            [
                sys.executable,
                "-m",
                "replayfmt_tools.benchmark_replay",
                "--clock=cupti",
                "--repetitions=5",
                "--format=json",
                str(path),
            ]
        )
        if bench.returncode != 0:
            print(f"benchmark-replay failed: {bench.stderr[-2000:]}")
            goals.judge("benchmark-replay", False)
            return goals.exit_status(args.check)
        result = json.loads(bench.stdout)
    busy = result["busy_ms"]["median"]
    stored = result["original"]["busy_ns"] / 1e6 if result["original"] else float("nan")
    ratio = busy / first["busy_ms"]
    verdict = goals.judge("replay busy within 2% of the original's", abs(ratio - 1) <= GOAL)
    print(f"replay: GPU busy {busy:.3f} ms ({result['released'] or 'nothing released'})")
    print(f"recorded original (under the recorder): {stored:.3f} ms")
    print(f"replay / original: {ratio:.4f}  (goal within {GOAL:.0%})  {verdict}")
    return goals.exit_status(args.check)


if __name__ == "__main__":
    sys.exit(main())
