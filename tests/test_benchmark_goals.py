"""Benchmarks prove what they claim (issue 25): every benchmark fails with --check on a missed
goal, the GPU suite runs each so, and each compares with a baseline measured in the same run."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
GPU_BENCHMARKS = [
    "replay_bench.py",
    "fidelity_bench.py",
    "fidelity_recorded.py",
    "tune_bench.py",
    "capture_bench.py",
    "timing_goals_bench.py",
]
sys.path.insert(0, str(BENCHMARKS))

from goals import Goals  # noqa: E402 - the benchmarks' own helper, beside them


def test_a_missed_goal_fails_only_with_check(capsys):
    goals = Goals()
    assert goals.judge("fast", True) == "ok" and goals.judge("faster", False) == "MISSED"
    assert goals.exit_status(check=False) == 0 and goals.exit_status(check=True) == 1
    assert "missed: faster" in capsys.readouterr().err
    met = Goals()
    met.judge("fast", True)
    assert met.exit_status(check=True) == 0
    assert Goals().exit_status(check=True) == 1  # nothing judged: nothing proven


def main_returns(tree: ast.Module) -> list[str]:
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
    return [ast.unparse(node.value) for node in ast.walk(main) if isinstance(node, ast.Return) and node.value]


@pytest.mark.parametrize("name", [*sorted(p.name for p in BENCHMARKS.glob("*_bench.py")), "fidelity_recorded.py"])
def test_every_benchmark_has_check_and_never_returns_a_bare_success(name):
    source = (BENCHMARKS / name).read_text()
    tree = ast.parse(source)
    assert "add_check(parser)" in source or '"--check"' in source, name
    returns = main_returns(tree)
    assert "args.check" in source and returns != ["0"], (name, returns)  # the flag decides the status
    assert source.count("MISSED") <= source.count("ok"), name  # every verdict printed can be judged


@pytest.mark.parametrize("name", GPU_BENCHMARKS)
def test_the_gpu_suite_runs_every_gpu_benchmark_with_check(name):
    suite = (ROOT / "scripts" / "run_gpu_suite.sh").read_text()
    assert re.search(rf"benchmarks/{re.escape(name)}[^\n]*--check", suite) or (
        name == "fidelity_recorded.py" and '"--check"' in (BENCHMARKS / "fidelity_bench.py").read_text()
    ), name


def test_tune_bench_measures_its_baseline_in_the_same_run():
    source = (BENCHMARKS / "tune_bench.py").read_text()
    assert "Mneme" not in source and "def bare_rate(" in source and "bare cuda-python evaluation" in source


def test_no_test_asserts_a_time():
    """Times belong to the benchmarks' goals (judged with --check, nothing else on the GPU): a
    test that asserts one fails whenever other work shares the machine."""
    timed = re.compile(
        r"assert[^\n]*(perf_counter\(\) - \w+ *<|monotonic\(\) - \w+ *<|\[\"median\"\] *<"
        r"|TOLERANCE \*|abs\(\w+ */ *\w+ *- *1\) *<=|< *ratio *<|\.seconds *< *[0-9]{1,2}\b)"
    )
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sorted((ROOT / "tests").rglob("test_*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if timed.search(line)
    ]
    assert not found, "\n".join(found)
