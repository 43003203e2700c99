"""Hostile inputs (tests/hostile.py) through the real command-line tools, the commands on each
file in one subprocess capped at 1.5 GiB of address space: every run must end in 10 s with exit
0, 1 or 2, at most one line on stderr and no traceback, peak memory under 1 GiB, nothing printed
about host files the capture does not hold, and nothing outside the request read or written."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hostile import BUILDERS, Hostile

# the tree whose tools run (HOSTILE_TOOLS_ROOT: another checkout, to count what it fails)
ROOT = Path(os.environ.get("HOSTILE_TOOLS_ROOT") or Path(__file__).resolve().parent.parent)
TOOLS = {"dump-replay": "replayfmt_tools.dump_replay", "run-replay": "replayfmt_tools.run_replay"}
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


DRIVER = """
import contextlib, io, json, sys, time, traceback, resource
from replayfmt_tools.dump_replay import main as dump
from replayfmt_tools.run_replay import main as run
from replayfmt_tools.extract_replay import main as extract
from replayfmt_tools.diff_replay import main as diff
mains = {"dump-replay": dump, "run-replay": run, "extract-replay": extract, "diff-replay": diff}
for command in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            mains[command[0]].main(command[1:], prog_name=command[0], standalone_mode=False)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps([command, code, time.perf_counter() - started, peak, out.getvalue(), err.getvalue()]),
          file=sys.__stdout__, flush=True)
"""


def run_tools(commands: list[list[str]], cwd: Path) -> list[Outcome]:
    """The commands run one after another in one fresh interpreter (imports paid once) with a
    capped address space; each reports its exit code, time, output and the peak RSS so far. A
    run killed or timed out shows as an outcome with that exit status."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, json.dumps(commands)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=env,
        preexec_fn=_limit,
    )
    try:
        out, err = proc.communicate(timeout=TIME_LIMIT * len(commands) + 10)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    outcomes = [Outcome(*json.loads(line)) for line in out.decode().splitlines()]
    if len(outcomes) < len(commands):  # the interpreter itself died (a signal, the limit) or hung
        command = commands[len(outcomes)]
        outcomes.append(
            Outcome(
                command,
                proc.returncode or 1,
                time.perf_counter() - started,
                0,
                "",
                err.decode(errors="replace") or "(killed)\n(no message)",
            )
        )
    return outcomes


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
    """Every hostile input built, and the commands on each run (files concurrently)."""
    built = [build(tmp_path_factory.mktemp(build.__name__)) for build in BUILDERS]

    def commands(h: Hostile) -> list[list[str]]:
        return [[*c, *([] if c[-1].endswith(".kreplay") else [str(h.path)])] for c in h.commands]

    with cf.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        ran_by_file = list(pool.map(lambda h: run_tools(commands(h), h.path.parent), built))
    results: dict[str, tuple[Hostile, list[Outcome]]] = {h.name: (h, o) for h, o in zip(built, ran_by_file)}
    jobs = [(h, None) for h, o in zip(built, ran_by_file) for _ in o]
    ran = [o for outcomes in ran_by_file for o in outcomes]
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
