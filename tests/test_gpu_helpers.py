"""The GPU suite's own judgement, on the CPU: a Numba example's failure is skipped only when
numba-cuda cannot work here, and fails the test when the example's own check fails (issue 25:
both used to skip)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))

from numba_env import require_numba_runs


def failed(last_line: str) -> subprocess.CompletedProcess:
    stderr = f'Traceback (most recent call last):\n  File "numba_kernel.py", line 25, in <module>\n{last_line}\n'
    return subprocess.CompletedProcess(["python", "numba_kernel.py"], 1, "", stderr)


def test_the_examples_own_assertion_fails_the_test():
    with pytest.raises(pytest.fail.Exception, match="the example itself failed"):
        require_numba_runs(failed("AssertionError"))
    with pytest.raises(pytest.fail.Exception, match="ValueError: wrong shape"):
        require_numba_runs(failed("ValueError: wrong shape"))


@pytest.mark.parametrize(
    "last_line",
    [
        "numba.cuda.cudadrv.error.NvvmSupportError: libNVVM cannot be found",
        "numba.core.errors.TypingError: Failed in cuda mode pipeline",
        "CudaSupportError: Error at driver init",
        "ModuleNotFoundError: No module named 'numba.cuda'",
    ],
)
def test_numba_cudas_own_failures_skip(last_line):
    with pytest.raises(pytest.skip.Exception, match="numba-cuda cannot run here"):
        require_numba_runs(failed(last_line))


def test_a_clean_run_passes():
    require_numba_runs(subprocess.CompletedProcess(["python"], 0, "", ""))
