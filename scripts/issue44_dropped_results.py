"""On a GPU: steps whose result is dropped (and kept) verify with evidence, and a planted
wrong kernel fails naming the element. For the lead's device runs; prints what it finds and exits
1 when a case misses (a case whose framework is not installed is skipped, said so).

    python scripts/issue44_dropped_results.py [--only diffrax mlp ...] [--out DIR]

Each case: the program captured with --scope step; run-replay --verify --format=json must exit 0,
verified, with N > 0 ranges compared with evidence ('N with evidence' in its summary), and, where
the result is dropped, some of them in what the step wrote into memory freed or free at its end
(the checkpoints named 'step (written into free memory)', 'step (buffer N freed by ...)' or
'step (buffer N before cuMem...)'). Then launches that point into a range with evidence are made
wrong in turn, latest first, the dropped result's ranges first where the result is dropped: each
one's grid halved, then the launch skipped; run-replay --verify must exit 1 naming a wrong
element. A launch pointing into a range may only read it, so up to 3 launches a range and 4 in all
are tried, each try printed; a range written only by kernels of CUDA graphs (which --launch cannot
change) is passed over, said so. The capture's checkpoints are listed against what the step's last
launch points at, for diagnosis.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "gpu" / "capture_scripts"
TRIES, MAX_TRIES = 3, 4  # launches made wrong: pointing into one range (latest first), in all
DROPPED = ("(written into free memory)", "freed by", "before cu")  # names of dropped-result checkpoints
CASES = {  # name: (program, its arguments, modules it needs)
    "diffrax": ("dropped_diffrax_step.py", (), ("jax", "diffrax")),
    "diffrax-kept": ("dropped_diffrax_step.py", ("keep",), ("jax", "diffrax")),
    "diffrax-platform": ("dropped_diffrax_step.py", (), ("jax", "diffrax")),  # XLA_PYTHON_CLIENT_ALLOCATOR=platform
    "mlp": ("dropped_compiled_mlp.py", (), ("torch", "triton")),
    "mlp-kept": ("dropped_compiled_mlp.py", ("keep",), ("torch", "triton")),
}


def run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env or {}), PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env, timeout=1800)


def tool(name: str, *args: str) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", f"replayfmt_tools.{name}", *args])


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in tool("dump_replay", "--format=jsonl", str(path)).stdout.splitlines()]


def verify(path: Path, *flags: str) -> tuple[int, dict, str]:
    result = tool("run_replay", "--verify", "--format=json", *flags, str(path))
    try:
        report = json.loads(result.stdout)["verification"] or {}
    except (json.JSONDecodeError, KeyError):
        report = {}
    return result.returncode, report, result.stderr


def diagnose(dumped: list[dict]) -> None:
    """What the capture checkpointed, against what the scope's last launch points at."""
    checkpoints = [r for r in dumped if r["kind"] == "checkpoint"]
    for c in checkpoints:
        entries = ", ".join(f"buffer {e['buffer']} {e['offset']}+{e['size']}" for e in c["entries"][:8])
        print(f"    checkpoint op {c['index']} {c['name']!r}: {entries}{' ...' if len(c['entries']) > 8 else ''}")
    launches = [r for r in dumped if r["kind"] == "launch"]
    if launches:
        last = launches[-1]
        held = {(e["buffer"]) for c in checkpoints for e in c["entries"]}
        targets = [(r["target_buffer"], r["target_offset"], r["kind"]) for r in last["relocations"]]
        print(f"    last launch op {last['index']} {last['function'][:60]} grid {last['grid']} points at {targets}")
        print(f"    of those buffers, checkpointed: {sorted({b for b, _, _ in targets} & held)}")


def with_evidence(report: dict) -> list[dict]:
    return [r for r in report.get("ranges", []) if r["evidence"] in ("compared", "proven") and r["passed"]]


def dropped_ranges(dumped: list[dict], ranges: list[dict]) -> list[dict]:
    """Of ``ranges``, those of the checkpoints that hold what the step wrote into memory freed or free."""
    names = {r["index"]: r["name"] for r in dumped if r["kind"] == "checkpoint"}
    return [r for r in ranges if any(mark in names.get(r["operation"], "") for mark in DROPPED)]


def planted(path: Path, dumped: list[dict], report: dict, dropped: bool) -> tuple[bool, str]:
    """A launch that points into a range with evidence, made wrong: must fail naming an element.
    Ranges are aimed at latest first, the dropped result's first where the result is dropped."""
    proven = with_evidence(report)
    order = [*(dropped_ranges(dumped, proven)[::-1] if dropped else []), *proven[::-1]]
    tried: list[str] = []
    aimed, launches = set(), 0
    for target in order:
        key = (target["operation"], target["buffer"], target["offset"])
        if key in aimed or launches >= MAX_TRIES:
            continue
        aimed.add(key)
        low, high = target["offset"], target["offset"] + target["size"]
        writers = [
            r
            for r in dumped
            if r["kind"] == "launch"
            and r["index"] < target["operation"]
            and any(
                x["target_buffer"] == target["buffer"] and low <= x["target_offset"] < high for x in r["relocations"]
            )
        ]
        aim = f"buffer {target['buffer']} bytes {low}+{target['size']} (op {target['operation']})"
        if not writers:  # written by kernels of CUDA graphs only, which --launch cannot change
            tried.append(f"no launch outside a CUDA graph points into {aim}")
            continue
        for launch in writers[::-1][: min(TRIES, MAX_TRIES - launches)]:
            launches += 1
            caught, what = make_wrong(path, launch)
            if caught:
                return True, f"aimed at {aim}: {what}"
            tried.append(f"aimed at {aim}: {what}")
    return False, "; ".join(tried) or "no range with evidence to aim at"


def make_wrong(path: Path, launch: dict) -> tuple[bool, str]:
    """``launch`` on half its grid (a persistent kernel may still cover it all), then skipped."""
    grid = launch["grid"]
    changes = []
    if grid[0] > 1 or grid[1] > 1:
        halved = (grid[0] // 2, grid[1], grid[2]) if grid[0] > 1 else (grid[0], grid[1] // 2, grid[2])
        changes.append(f"{launch['index']}:grid={','.join(map(str, halved))}")
    changes.append(f"{launch['index']}:skip")
    tried = []
    for change in changes:
        code, wrong, stderr = verify(path, f"--launch={change}")
        named = [r for r in wrong.get("ranges", []) if (r["verdict"] == "wrong" or not r["passed"]) and r["first"]]
        if code == 1 and named:
            first = named[0]["first"][0]
            what = f"buffer {named[0]['buffer']} ({named[0]['name'] or 'bytes'}) first wrong {first}"
            return True, f"--launch={change} ({launch['function'][:40]}): exit 1, {what}"
        summary = next((line for line in stderr.splitlines() if "with evidence" in line), stderr.strip()[-300:])
        tried.append(f"--launch={change} ({launch['function'][:40]}): exit {code}, not caught: {summary.strip()}")
    return False, "; ".join(tried)


def case(name: str, out: Path) -> bool | None:
    program, args, modules = CASES[name]
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        print(f"{name}: skipped ({', '.join(missing)} not installed)")
        return None
    env = {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"} if name.endswith("-platform") else None
    path = out / f"{name}.kreplay"
    recorded = run(
        [sys.executable, "-m", "replayfmt.capture", "-o", str(path), "--scope", "step", str(SCRIPTS / program), *args],
        env,
    )
    report_lines = [line for line in recorded.stderr.splitlines() if line.startswith("  ") or "replayable" in line]
    print(f"{name}: capture exit {recorded.returncode}\n" + "\n".join(report_lines[-12:]))
    if recorded.returncode != 0 or not path.exists():
        print(recorded.stderr[-3000:])
        return False
    dumped = rows(path)
    diagnose(dumped)
    code, report, stderr = verify(path)
    summary = next((line for line in stderr.splitlines() if "with evidence" in line), stderr.strip()[-300:])
    evidence = report.get("evidence", 0)
    ok = code == 0 and bool(report.get("verified")) and evidence > 0
    print(f"  verify: exit {code}, {evidence} with evidence: {summary.strip()}  {'ok' if ok else 'MISSED'}")
    if "keep" not in args:  # the dropped result itself must be among the ranges with evidence
        dropped = dropped_ranges(dumped, with_evidence(report))
        where = sorted({(r["operation"], r["buffer"]) for r in dropped})
        print(
            f"  dropped result compared with evidence: {len(dropped)} range(s) {where}  {'ok' if dropped else 'MISSED'}"
        )
        ok = ok and bool(dropped)
    if not ok:
        return False
    caught, what = planted(path, dumped, report, dropped="keep" not in args)
    print(f"  planted wrong kernel: {what}  {'ok' if caught else 'MISSED'}")
    return caught


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(CASES))
    parser.add_argument("--out", type=Path, help="keep the captures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        results = {name: case(name, out) for name in args.only or CASES}
    missed = [name for name, ok in results.items() if ok is False]
    print(f"missed: {', '.join(missed)}" if missed else "every case that ran: ok")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
