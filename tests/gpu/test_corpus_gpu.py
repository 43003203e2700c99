"""Programs users bring, on the GPU (issue 23): benchmarks/corpus.py takes each through capture,
verify and benchmark. Three rows stand for what failed before: JAX's training step with optax under
XLA's defaults (command buffers updated between launches, the preallocated arena), and two programs
with their own CUPTI client (Triton's profiler, torch.profiler) that must run under the recorder."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "benchmarks" / "corpus.py"


@pytest.fixture(scope="module")
def capture_ready(gpu_arch) -> str:
    if importlib.util.find_spec("cupti") is None:
        pytest.skip("cupti-python is not installed (pip install 'replayfmt[capture]')")
    return gpu_arch


def corpus(*programs: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, str(CORPUS), "--check", "--timeout", "120", "--only", *programs]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)


@pytest.mark.parametrize(
    ("program", "modules"),
    [
        ("jax_optax_adam", ("jax", "optax")),
        ("triton_persistent_matmul_proton", ("torch", "triton.profiler")),
        ("torch_profiler_step", ("torch",)),
    ],
)
def test_a_corpus_row_passes_capture_verify_and_benchmark(capture_ready, program, modules):
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            pytest.skip(f"{module} is not installed")
    result = corpus(program)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    row = next(line for line in result.stdout.splitlines() if line.startswith(program + " "))
    assert row.rstrip().endswith("pass") and " yes " in row, row
    assert "corpus: 1/1 rows pass all four steps" in result.stdout
