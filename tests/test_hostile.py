"""Hostile inputs (tests/hostile.py) through the real command-line tools, each in a subprocess
capped at 1.5 GiB of address space: every run must end in 10 s with exit 0, 1 or 2, at most one
line on stderr and no traceback, peak memory under 1 GiB, nothing printed about host files the
capture does not hold, and nothing outside the request read or written."""

from __future__ import annotations

import concurrent.futures as cf
import os
import resource
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hostile import BUILDERS, Hostile

# the tree whose tools run (HOSTILE_TOOLS_ROOT: another checkout, to count what it fails)
ROOT = Path(os.environ.get("HOSTILE_TOOLS_ROOT") or Path(__file__).resolve().parent.parent)
TOOLS = {"dump-replay": "replayfmt.tools.dump_replay", "run-replay": "replayfmt.tools.run_replay"}
ADDRESS_SPACE = 3 << 29  # 1.5 GiB
TIME_LIMIT = 10.0
PEAK_LIMIT = 1 << 30


@dataclass
class Outcome:
    command: list[str]
    code: int
    seconds: float
    peak_bytes: int
    stdout: str
    stderr: str


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_tool(command: tuple[str, ...], path: Path, cwd: Path) -> Outcome:
    """One tool run in a fresh interpreter with a capped address space; its own peak RSS (from
    wait4, so that concurrent runs do not mix)."""
    tool, *args = command
    argv = [sys.executable, "-m", TOOLS[tool], *args, *([] if args and args[-1].endswith(".kreplay") else [str(path)])]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env,
                            preexec_fn=_limit)  # fmt: skip
    with cf.ThreadPoolExecutor(2) as readers:
        out, err = readers.submit(proc.stdout.read), readers.submit(proc.stderr.read)
        killer = threading.Timer(TIME_LIMIT * 2, proc.kill)
        killer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            killer.cancel()
        stdout, stderr = out.result(), err.result()
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stdout.close()
    proc.stderr.close()
    seconds = time.perf_counter() - started
    return Outcome(argv[3:], proc.returncode, seconds, usage.ru_maxrss * 1024, stdout.decode(errors="replace"),
                   stderr.decode(errors="replace"))  # fmt: skip


def check(outcome: Outcome, must_not_print: tuple[str, ...]) -> list[str]:
    """What is wrong with one run (empty: clean)."""
    problems = []
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    if outcome.code not in (0, 1, 2):
        problems.append(f"exit {outcome.code}")
    if "Traceback" in outcome.stderr or len(lines) > 1:
        problems.append(f"stderr is not one line: {outcome.stderr[-600:]!r}")
    if outcome.code != 0 and not lines:
        problems.append("failed without a message")
    if outcome.seconds > TIME_LIMIT:
        problems.append(f"took {outcome.seconds:.1f} s")
    if outcome.peak_bytes > PEAK_LIMIT:
        problems.append(f"peak memory {outcome.peak_bytes >> 20} MiB")
    for secret in must_not_print:
        if secret in outcome.stdout or secret in outcome.stderr:
            problems.append(f"printed {secret!r} about a host file")
    return problems


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple[Hostile, list[Outcome]]]:
    """Every hostile input built, and every command on it run, concurrently."""
    built = [build(tmp_path_factory.mktemp(build.__name__)) for build in BUILDERS]
    jobs = [(h, c) for h in built for c in h.commands]
    with cf.ThreadPoolExecutor(2 * (os.cpu_count() or 1)) as pool:
        ran = list(pool.map(lambda job: run_tool(job[1], job[0].path, job[0].path.parent), jobs))
    results: dict[str, tuple[Hostile, list[Outcome]]] = {h.name: (h, []) for h in built}
    for (h, _), outcome in zip(jobs, ran):
        results[h.name][1].append(outcome)
    clean = sum(not check(o, h.must_not_print) for h, o in zip((j[0] for j in jobs), ran))
    print(
        f"\nhostile inputs: {len(built)} files, {len(ran)} runs, {clean} clean; "
        f"slowest {max(o.seconds for o in ran):.1f} s, largest peak {max(o.peak_bytes for o in ran) >> 20} MiB"
    )
    return results


@pytest.mark.parametrize("build", BUILDERS, ids=lambda b: b.__name__)
def test_hostile_input_is_refused_cleanly(build, outcomes):
    hostile, runs = next(v for v in outcomes.values() if v[0].path.parent.name.startswith(build.__name__))
    report = []
    for outcome in runs:
        problems = check(outcome, hostile.must_not_print)
        if problems:
            report.append(f"{' '.join(outcome.command)}: {'; '.join(problems)}")
    for path, content in hostile.untouched.items():
        if path.read_bytes() != content:
            report.append(f"{path} was overwritten")
    assert not report, f"{hostile.name}:\n" + "\n".join(report)
