"""Verification's cost on deterministic programs: today's `--verify` against the verification of
docs/VERIFY.md (pieces by dtype, candidates for poisoning looked up, a report), side by side in
one run on the same Replayer. Goal: at most 1.2x (a deterministic program pays for one replay).

    python benchmarks/verify_bench.py [--check] [--iterations N]

Captures: the quick start's recorded Triton softmax (examples/triton_softmax.kreplay), and, when
torch, Triton and cupti-python are present, the recorder's capture of examples/capture/triton_add.py
(1M-float buffers) and of a scoped step of examples/capture/torch_compile.py (taken after a
warm-up: it starts as it ends, so the verdict needs a poisoned replay, shown apart and compared
with --tolerance as tests/gpu verify it: that is the evidence, not overhead on a program whose
outputs change).

Baseline ("today"): Replayer.run(1) with verification on, every checkpoint compared byte for byte
(what run-replay --verify did for a program whose replay matched; its comparison is now one memcmp
where bytes match, so the baseline is faster than the code before this change, and the ratio is
strict). New: the same run observed by a Verification, finished and reported. Each line: both
medians and the ratio.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL = 1.2


def record(script: Path, out: Path, *flags: str) -> Path | None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run(
        [sys.executable, "-m", "replayfmt.capture", "-o", str(out), *flags, str(script)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    if result.returncode != 0:
        print(f"  (could not record {script.name}: {result.stderr.strip().splitlines()[-1:]})")
        return None
    return out


def measure(path: Path, iterations: int, *, tolerant: bool) -> tuple[float, float, str]:
    """(baseline median s, new median s, the new verdict's summary); ``tolerant``: --tolerance."""
    from replayfmt.execute import open_replay
    from replayfmt.replay.compare import Tolerance
    from replayfmt.replay.options import ReplayOptions
    from replayfmt.replay.verification import Verification

    tolerance = Tolerance(enabled=tolerant)
    with open_replay(path) as session:
        replayer = session.start(ReplayOptions(verify=True, tolerance=tolerance))
        replayer.run(1)  # warm: modules, caches
        base, new = [], []
        summary = ""
        for _ in range(iterations):
            started = time.perf_counter()
            result = replayer.run(1)
            if not result.verified:
                raise SystemExit(
                    f"{path.name}: today's verification fails: {[r.line() for r in result.mismatches][:2]}"
                )
            base.append(time.perf_counter() - started)
            started = time.perf_counter()
            verification = Verification(session.plan, tolerance=tolerance)
            verification.attach(replayer)
            verification.note_runs(replayer.run(1))
            verification.finish(replayer)
            report = verification.report()
            replayer.observer = None
            new.append(time.perf_counter() - started)
            summary = report.summary()
            if not report.verified:
                raise SystemExit(f"{path.name}: not verified: {report.problem()}")
    return statistics.median(base), statistics.median(new), summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a ratio is over the goal")
    parser.add_argument("--iterations", type=int, default=15)
    args = parser.parse_args()
    captures: list[tuple[str, Path, bool]] = [
        ("triton softmax (kernel mode)", ROOT / "examples/triton_softmax.kreplay", True)
    ]
    work = Path(tempfile.mkdtemp(prefix="verify-bench-"))
    if all(importlib.util.find_spec(m) for m in ("torch", "triton", "cupti")):
        add = record(ROOT / "examples/capture/triton_add.py", work / "add.kreplay")
        if add:
            captures.append(("triton add, 1M floats (region)", add, True))
        step = record(ROOT / "examples/capture/torch_compile.py", work / "compiled.kreplay", "--scope", "step")
        if step:
            captures.append(("torch.compile step after a warm-up (needs a poisoned replay)", step, False))
    missed = False
    print(f"{'capture':<62} {'today ms':>9} {'now ms':>9} {'ratio':>6}  goal <= {GOAL}x")
    for name, path, judged in captures:
        base, new, summary = measure(path, args.iterations, tolerant=not judged)
        ratio = new / base
        flag = "" if not judged else ("  ok" if ratio <= GOAL else "  MISSED")
        missed |= judged and ratio > GOAL
        print(f"{name:<62} {base * 1e3:>9.3f} {new * 1e3:>9.3f} {ratio:>6.2f}{flag}")
        print(f"    {summary}")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
