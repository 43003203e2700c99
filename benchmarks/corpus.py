"""The corpus: third-party programs run through capture, replay, verify and benchmark (needs a GPU
and the frameworks the programs import: JAX, flax, optax, equinox, numpyro, Triton, torchvision,
timm, transformers, torch_geometric, CuPy, Numba-CUDA).

    python benchmarks/corpus.py [--only GLOB ...] [--shard K/N] [--timeout 120] [--budget SECONDS] [--check]
    python benchmarks/corpus.py --list

The whole corpus takes about 11 minutes on an H100 (some 20 s a program, most of it the programs'
own start: importing JAX or PyTorch, XLA's compile and autotuning, twice); ``--shard 1/2`` and
``--shard 2/2`` split it for machines that limit one command's time.

Each program under benchmarks/corpus/ is small and marks the work worth replaying with
``replayfmt.capture.scope("step")`` (its docstring says what it runs). For each one, serially
(programs run in parallel would distort each other's times), one row:

1. the program alone (``program s``: its wall time);
2. ``capture-replay --scope step`` (``capture s``, and the recorder's verdict);
3. ``run-replay --verify`` (judged by docs/VERIFY.md: the number of buffer ranges compared, or the first error;
   ``(fixed)`` when run-replay asked for ``--fixed-addresses``, which the retry and the benchmark
   then use: the capture holds addresses it could not relocate; where the recorded range cannot be
   had in the replay's process, the program is captured again with ``--fixed-addresses``, as
   run-replay then says);
4. ``benchmark-replay --scope step --format json`` (``busy r/o``: the scope's GPU busy time in the
   replay over the original program's, both from CUPTI activity records).

A row passes when all four steps did: exit 0, ``replayable: yes``, at least one range verified, a
busy-time ratio measured. A failing step's cell holds the last line its tool printed. A target
that is no Python program goes to capture-replay all the same and its one-line error is the row.
The summary line counts the passing rows; ``--check`` exits 1 when under 90% pass. Every step has
its own timeout (``--timeout``); ``--budget`` starts no program after that many seconds (the rows
left are listed as not run).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus"
PASS_SHARE = 0.9
SCOPE = "step"


@dataclass
class Row:
    name: str
    program_s: float | None = None
    capture_s: float | None = None
    verdict: str = ""
    verify: str = ""
    ratio: float | None = None
    error: str = ""  # the first failing step's last line
    passed: bool = False
    runnable: bool = True  # False: the program fails alone on this machine (its image, not the recorder)

    def cells(self) -> list[str]:
        def seconds(value: float | None) -> str:
            return "-" if value is None else f"{value:.1f}"

        ratio = "-" if self.ratio is None else f"{self.ratio:.3f}"
        slow = f"{self.capture_s / self.program_s:.1f}x" if self.capture_s is not None and self.program_s else "-"
        return [
            self.name,
            seconds(self.program_s),
            seconds(self.capture_s),
            slow,
            self.verdict or "-",
            self.verify or "-",
            ratio,
            "pass" if self.passed else (f"FAIL: {self.error}" if self.runnable else f"n/a: {self.error}"),
        ]


HEADER = ["program", "program s", "capture s", "capt/prog", "verdict", "verify", "busy r/o", "result"]


@dataclass
class Step:
    code: int
    seconds: float
    out: str

    @property
    def last_line(self) -> str:
        lines = [line.strip() for line in self.out.splitlines() if line.strip()]
        errors = [line for line in lines if "error" in line.lower()]
        text = (errors or lines or ["(no output)"])[-1]
        return text if len(text) <= 160 else text[:157] + "..."


def run_step(command: list[str], timeout: float, env: dict[str, str] | None = None) -> Step:
    began = time.perf_counter()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return Step(124, time.perf_counter() - began, out + f"\ntimed out after {timeout:.0f} s")
    return Step(done.returncode, time.perf_counter() - began, done.stdout + done.stderr)


def tool(name: str) -> list[str]:
    """A replayfmt console script, run with this interpreter (so it works from a source checkout)."""
    modules = {
        "capture-replay": "replayfmt.capture",
        "run-replay": "replayfmt_tools.run_replay",
        "benchmark-replay": "replayfmt_tools.benchmark_replay",
    }
    return [sys.executable, "-m", modules[name]]


def one(program: Path, work: Path, timeout: float, logs: Path | None = None) -> Row:
    row = Row(program.stem)
    env = dict(os.environ, PYTHONUNBUFFERED="1")

    def run(command: list[str], step: str) -> Step:
        done = run_step(command, timeout, env)
        if logs is not None:
            (logs / f"{program.stem}.{step}.log").write_text(f"$ {' '.join(command)}\n{done.out}\nexit {done.code}\n")
        return done

    alone = run([sys.executable, str(program)] if program.suffix == ".py" else [str(program)], "program")
    if alone.code != 0:  # nothing of replayfmt ran: the row says why and is not counted
        row.error, row.runnable = f"the program alone: {alone.last_line}", False
        return row
    row.program_s = alone.seconds
    capture = work / f"{program.stem}.kreplay"
    captured = run([*tool("capture-replay"), "-o", str(capture), "--scope", SCOPE, str(program)], "capture")
    row.capture_s = captured.seconds
    verdict = re.search(r"replayable: (\S+)", captured.out)
    row.verdict = verdict.group(1).rstrip(";,") if verdict else ""
    if captured.code != 0 or not capture.exists():
        row.error = f"capture: {captured.last_line}"
        return row
    fixed: list[str] = []
    verified = run([*tool("run-replay"), "--verify", str(capture)], "verify")
    if verified.code != 0 and "replay it with --fixed-addresses" in verified.out:
        fixed = ["--fixed-addresses"]  # as run-replay says: the capture holds addresses it cannot relocate
        verified = run([*tool("run-replay"), "--verify", *fixed, str(capture)], "verify-fixed")
        if verified.code != 0 and "Capture and replay with the tools' --fixed-addresses" in verified.out:
            # the recorded addresses are taken in this process: capture again with them fixed, as it says
            capture.unlink(missing_ok=True)
            again = [*tool("capture-replay"), "-o", str(capture), "--scope", SCOPE, *fixed, str(program)]
            recaptured = run(again, "capture-fixed")
            if recaptured.code != 0 or not capture.exists():
                row.error = f"capture --fixed-addresses: {recaptured.last_line}"
                return row
            verified = run([*tool("run-replay"), "--verify", *fixed, str(capture)], "verify-fixed")
    count = re.search(r"^verified: (\d+) range\(s\) compared", verified.out, re.M)
    row.verify = (f"{count.group(1)} ranges" if count else "no") + (" (fixed)" if fixed else "")
    if verified.code != 0 or not count or int(count.group(1)) == 0:
        row.error = f"verify: {verified.last_line}"
        return row
    result = work / f"{program.stem}.json"
    bench = [*tool("benchmark-replay"), "--scope", SCOPE, "--format", "json", "--output", str(result)]
    timed = run([*bench, "--warmup", "1", "--min-time", "0.2", *fixed, str(capture)], "benchmark")
    if timed.code != 0 or not result.exists():
        row.error = f"benchmark: {timed.last_line}"
        return row
    data = json.loads(result.read_text())
    busy, original = data.get("busy_ms") or {}, data.get("original") or {}
    if busy.get("median") and original.get("busy_ns"):
        row.ratio = busy["median"] * 1e6 / original["busy_ns"]
    else:
        row.error = "benchmark: no busy time of the replay and the original (CUPTI) to compare"
        return row
    row.passed = True
    return row


def programs(patterns: list[str]) -> list[Path]:
    found = sorted(p for p in CORPUS.iterdir() if p.is_file() and not p.name.startswith(("_", ".")))
    if not patterns:
        return [p for p in found if p.suffix == ".py"]
    chosen = []
    for pattern in patterns:
        path = Path(pattern)
        if path.exists() and path.is_file():  # a target given by path: anything, Python or not
            chosen.append(path.resolve())
            continue
        chosen += [p for p in found if fnmatch.fnmatch(p.stem, pattern) or fnmatch.fnmatch(p.name, pattern)]
    return list(dict.fromkeys(chosen))


def shard(text: str) -> tuple[int, int]:
    """K/N with 1 <= K <= N."""
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: expected K/N, e.g. 1/2") from None
    if not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: K must be between 1 and N")
    return k, n


def table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=[], metavar="GLOB", help="programs by name glob, or paths")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per step (default 120)")
    parser.add_argument("--budget", type=float, default=0.0, help="start no program after this many seconds")
    parser.add_argument("--workdir", type=Path, help="keep captures and results here (default: a temporary dir)")
    parser.add_argument("--logs", type=Path, help="write each step's output to LOGS/PROGRAM.STEP.log")
    parser.add_argument(
        "--shard",
        type=shard,
        metavar="K/N",
        help="run every N-th program from the K-th (a run over one device call's time limit, split)",
    )
    parser.add_argument("--list", action="store_true", help="list the programs and exit")
    parser.add_argument(
        "--check", action="store_true", help=f"exit 1 when under {round(PASS_SHARE * 100)}%% of rows pass"
    )
    args = parser.parse_args()
    chosen = programs(args.only)
    if args.shard:
        k, n = args.shard
        chosen = chosen[k - 1 :: n]
    if args.list:
        for program in chosen:
            doc = ([*program.read_text(errors="replace").split('"""'), "", ""])[1].strip().splitlines()
            print(f"{program.stem:<34} {doc[0] if doc else ''}")
        return 0
    if not chosen:
        print(f"corpus: no program matches {args.only}", file=sys.stderr)
        return 2
    began = time.perf_counter()
    rows: list[Row] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="corpus-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.logs is not None:
            args.logs.mkdir(parents=True, exist_ok=True)
        print("  ".join(HEADER), flush=True)
        for program in chosen:
            if args.budget and time.perf_counter() - began > args.budget:
                skipped.append(program.stem)
                continue
            row = one(program, work, args.timeout, args.logs)
            rows.append(row)
            print("  ".join(row.cells()), flush=True)
    print()
    for line in table([HEADER] + [r.cells() for r in rows]):
        print(line)
    passed = sum(r.passed for r in rows)
    alone = [r.name for r in rows if not r.runnable]
    total = len(rows) - len(alone) + len(skipped)
    elapsed = time.perf_counter() - began
    print(f"corpus: {passed}/{total} rows pass all four steps ({elapsed:.0f} s)")
    if skipped:
        print(f"corpus: not run (--budget {args.budget:.0f} s): {', '.join(skipped)}")
    if alone:  # not the recorder's rows: the program does not run on this machine at all
        print(f"corpus: not counted (the program fails without replayfmt here): {', '.join(alone)}")
    if args.check and passed < PASS_SHARE * total:
        print(f"corpus: FAIL: {passed}/{total} is under {PASS_SHARE:.0%}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
