"""On a GPU: steps whose result is dropped (and kept) verify with evidence, and a planted
wrong kernel fails naming the element. For the lead's device runs; prints what it finds and exits
1 when a case misses (a case whose framework is not installed is skipped, said so).

    python scripts/issue44_dropped_results.py [--only diffrax mlp ...] [--out DIR]

Each case: the program captured with --scope step; run-replay --verify --format=json must exit 0,
verified, with N > 0 ranges compared with evidence ('N with evidence' in its summary); then the
launch that wrote the last range compared with evidence is made wrong (its grid halved, or
skipped when it is one block) and run-replay --verify must exit 1 naming a wrong element. The
kept variants also list what the capture checkpointed against what the step's last launch
wrote (the kept output must be compared), for diagnosis.
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


def planted(path: Path, dumped: list[dict], report: dict) -> tuple[bool, str]:
    """The launch that wrote the last range compared with evidence, made wrong: must fail naming an element."""
    proven = [r for r in report.get("ranges", []) if r["evidence"] in ("compared", "proven")]
    if not proven:
        return False, "no range with evidence to aim at"
    target = proven[-1]
    writers = [
        r
        for r in dumped
        if r["kind"] == "launch"
        and r["index"] < target["operation"]
        and any(x["target_buffer"] == target["buffer"] for x in r["relocations"])
    ]
    if not writers:
        return False, f"no launch points into buffer {target['buffer']}"
    launch = writers[-1]
    grid = launch["grid"]
    changes = []
    if grid[0] > 1 or grid[1] > 1:  # the same kernel on half its grid (a persistent kernel may still cover it all)
        halved = (grid[0] // 2, grid[1], grid[2]) if grid[0] > 1 else (grid[0], grid[1] // 2, grid[2])
        changes.append(f"{launch['index']}:grid={','.join(map(str, halved))}")
    changes.append(f"{launch['index']}:skip")
    tried = []
    for change in changes:
        code, wrong, stderr = verify(path, f"--launch={change}")
        bad = [r for r in wrong.get("ranges", []) if r["verdict"] == "wrong" or not r["passed"]]
        if code == 1 and bad:
            first = (bad[0]["first"] or [{}])[0]
            what = f"buffer {bad[0]['buffer']} ({bad[0]['name'] or 'bytes'}) first wrong {first}"
            return True, f"--launch={change}: exit 1, {what}"
        tried.append(f"--launch={change}: exit {code}, not caught: {stderr.strip()[-600:]}")
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
    if not ok:
        return False
    caught, what = planted(path, dumped, report)
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
