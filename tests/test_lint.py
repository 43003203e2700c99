"""The tree stays ruff clean (ruff is a test dependency)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ruff() -> str | None:
    beside = Path(sys.executable).parent / "ruff"
    return shutil.which("ruff") or (str(beside) if beside.exists() else None)


@pytest.mark.skipif(_ruff() is None, reason="ruff not installed")
@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]])
def test_ruff_clean(args):
    result = subprocess.run([_ruff(), *args], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
