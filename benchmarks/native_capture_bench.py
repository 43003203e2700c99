"""The recorder's cost for a C++ program (issue 28), measured side by side in one run (needs a
GPU, nvcc and cupti-python):

1. Host overhead per launch: tests/gpu/native/launch_loop.cu times N launches of a small kernel
   (host clock from the first launch to the synchronisation after the last, after 50 warm-up
   launches) bare, then under ``capture-replay --scope timed`` (the recorder hosted in the
   program through CUDA's injection entry point, writing every launch). Goal: <= 20 us a launch.
2. Fidelity: benchmark-replay on that capture prints the region's GPU busy time (CUPTI activity
   records) beside the original program's, which the recorder stored (CUPTI both sides).
   Goal: the replay within 2% of the original.

    python benchmarks/native_capture_bench.py [--launches 5000] [--runs 5] [--check]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "gpu" / "native" / "launch_loop.cu"
OVERHEAD_GOAL_US = 20.0
BUSY_GOAL = 0.02
_PER_LAUNCH = re.compile(r"per_launch_us=([0-9.]+)")


def arch() -> str:
    from replayfmt.cuda.driver import check, compute_capability, driver

    cu = driver()
    check(cu.cuInit(0), "cuInit")
    major, minor = compute_capability(check(cu.cuDeviceGet(0), "cuDeviceGet"))
    return f"sm_{major}{minor}"


def per_launch(output: str) -> float:
    found = _PER_LAUNCH.search(output)
    if found is None:
        raise SystemExit(f"launch_loop printed no per_launch_us: {output[-500:]}")
    return float(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=5000)
    parser.add_argument("--elements", type=int, default=1 << 20, help="floats the kernel updates")
    parser.add_argument("--runs", type=int, default=5, help="bare and captured runs (medians are compared)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    args = parser.parse_args()
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    with tempfile.TemporaryDirectory(prefix="native-bench-") as tmp:
        folder = Path(tmp)
        program = folder / "launch_loop"
        subprocess.run(
            [nvcc, f"-arch={arch()}", "-O2", "-o", str(program), str(SOURCE), f"-I{SOURCE.parent}", "-ldl"],
            check=True,
        )
        command = [str(program), str(args.launches), str(args.elements)]
        bare, captured = [], []
        for i in range(args.runs):  # interleaved, so drift hits both sides alike
            bare.append(per_launch(subprocess.run(command, capture_output=True, text=True, check=True).stdout))
            out = folder / f"loop{i}.kreplay"
            result = subprocess.run(
                [sys.executable, "-m", "replayfmt.capture", "-o", str(out), "--scope", "timed", *command],
                capture_output=True,
                text=True,
            )
            if result.returncode != 0 or "replayable: yes" not in result.stderr:
                print(result.stdout + result.stderr)
                return 1
            captured.append(per_launch(result.stdout))
        b, c = statistics.median(bare), statistics.median(captured)
        overhead = c - b
        print(
            f"host time per launch, {args.launches} launches of a {args.elements}-float kernel (median of {args.runs})"
        )
        print(f"  bare program      {b:8.2f} us   runs {', '.join(f'{x:.2f}' for x in bare)}")
        print(f"  under the recorder{c:8.2f} us   runs {', '.join(f'{x:.2f}' for x in captured)}")
        print(
            f"  overhead per launch {overhead:6.2f} us (goal <= {OVERHEAD_GOAL_US:.0f} us)  "
            f"ratio captured/bare {c / b:.2f}x"
        )
        timing = [line.strip() for line in result.stderr.splitlines() if "original device times" in line]
        print(f"  the recorder: {timing[0] if timing else 'no original device times'}")
        capture = folder / f"loop{args.runs - 1}.kreplay"
        result_json = folder / "bench.json"
        bench = subprocess.run(
            [
                sys.executable,
                "-m",
                "replayfmt_tools.benchmark_replay",
                "--scope=timed",
                "--repetitions=10",
                "--format=json",
                f"--output={result_json}",
                str(capture),
            ],
            capture_output=True,
            text=True,
        )
        if bench.returncode != 0:
            print(bench.stdout + bench.stderr)
            return 1
        data = json.loads(result_json.read_text())
        busy = (data.get("busy_ms") or {}).get("median")
        original = data.get("original") or {}
        if busy is None or not original.get("busy_ns"):
            print(f"GPU busy: not measured (clock {data.get('clock')}; original times stored: {bool(original)})")
            return 1 if args.check else 0
        original_ms = original["busy_ns"] / 1e6
        if original.get("untimed_device_ops"):
            print(
                f"note: the original's times cover {original.get('timed')} of the scope's device operations "
                f"({original['untimed_device_ops']} without one): the busy-time comparison is not meaningful"
            )
        deviation = busy / original_ms - 1
        print(f"GPU busy of the scope 'timed' ({args.launches + 50} launches), CUPTI both sides")
        print(f"  original program  {original_ms:9.4f} ms (stored by the recorder)")
        ratio = busy / original_ms
        print(f"  replay (median)   {busy:9.4f} ms   replay/original {ratio:.4f} (goal within {BUSY_GOAL:.0%})")
    missed = overhead > OVERHEAD_GOAL_US or abs(deviation) > BUSY_GOAL
    if missed:
        print("goal missed")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
