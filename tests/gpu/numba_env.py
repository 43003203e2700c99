"""When a Numba example may be skipped: only when numba-cuda itself cannot compile or run here
(its toolchain, driver or NumPy bindings), never when the example's own check fails."""

from __future__ import annotations

import re
import subprocess

import pytest

# the final line of a traceback that says numba-cuda cannot work in this environment
ENVIRONMENT = re.compile(
    r"^(numba(\.[\w.]+)?\.\w+|\w*(Numba|Nvvm|NVVM|Cuda|CUDA|Linker|Driver)\w*(Error|Exception)|"
    r"ImportError|ModuleNotFoundError)\b"
)


def require_numba_runs(result: subprocess.CompletedProcess) -> None:
    """Skip when the plain run of a Numba example failed for numba-cuda's own reasons; fail the
    test when it failed otherwise (its assertion, a wrong answer, any other exception)."""
    if result.returncode == 0:
        return
    lines = result.stderr.strip().splitlines()
    last = lines[-1] if lines else f"exit {result.returncode} with no output"
    if ENVIRONMENT.match(last):
        pytest.skip(f"numba-cuda cannot run here: {last}")
    pytest.fail(f"the example itself failed (not numba-cuda's environment): {last}\n{result.stderr[-3000:]}")
