"""benchmarks/corpus.py without a GPU: its programs are there and marked, a target that fails
gives one row with its step and one line, the summary counts it, and --check says so."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "benchmarks" / "corpus"


def test_thirty_or_more_programs_each_marking_its_step():
    programs = sorted(CORPUS.glob("*.py"))
    assert len(programs) >= 30
    families = {p.stem.split("_")[0] for p in programs}
    assert {"jax", "flax", "equinox", "numpyro", "triton", "torchvision", "timm", "transformers"} <= families
    assert {"torch", "cupy", "numba"} <= families
    for program in programs:
        source = program.read_text()
        assert ast.get_docstring(ast.parse(source)), program.name
        assert 'scope("step")' in source, f"{program.name} marks no step"


def test_a_failing_target_is_one_row_and_check_fails():
    """/bin/true: no Python program, and no GPU work; its row fails in one line."""
    command = [sys.executable, str(ROOT / "benchmarks" / "corpus.py"), "--check", "--timeout", "60", "--only"]
    result = subprocess.run([*command, "/bin/true"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 1
    rows = [line for line in result.stdout.splitlines() if line.startswith("true ")]
    assert rows and all("FAIL: " in row for row in rows)  # (it does no GPU work: no step after the capture can pass)
    assert rows[-1].count("\n") == 0 and "Traceback" not in rows[-1]
    assert "corpus: 0/1 rows pass all four steps" in result.stdout
    assert "is under 90%" in result.stderr


def test_shards_split_the_programs():
    command = [sys.executable, str(ROOT / "benchmarks" / "corpus.py"), "--list"]
    every = subprocess.run(command, capture_output=True, text=True, check=True).stdout.splitlines()
    halves = [
        subprocess.run([*command, "--shard", f"{k}/2"], capture_output=True, text=True, check=True).stdout.splitlines()
        for k in (1, 2)
    ]
    assert sorted(halves[0] + halves[1]) == sorted(every) and not set(halves[0]) & set(halves[1])
