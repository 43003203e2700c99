"""GPU tests: they need a CUDA device, cuda-python and nvcc; without them they skip cleanly."""

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

if os.environ.get("PYTEST_XDIST_WORKER"):
    # workers share one GPU (pytest -n 4): a JAX program preallocates 75% of the device's memory
    # alone, so each takes a fifth here (inherited by the programs the tests capture and replay)
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.18")

KERNELS = Path(__file__).parent / "kernels"


@pytest.fixture(scope="session")
def gpu_arch() -> str:
    """The sm_XY of cuda:0; skips the test when there is no usable GPU or no nvcc."""
    from replayfmt.replay.devices import environment_ok

    reason = environment_ok()
    if reason is not None:
        pytest.skip(f"no GPU: {reason}")
    if shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists():
        pytest.skip("nvcc not available to build the test kernels")
    from replayfmt.cuda.driver import check, compute_capability, driver

    major, minor = compute_capability(check(driver().cuDeviceGet(0), "cuDeviceGet"))
    return f"sm_{major}{minor}"


@pytest.fixture(scope="session")
def kernels(gpu_arch) -> dict[str, bytes]:
    from samples import compiled_cubin

    return {p.stem: compiled_cubin(p, gpu_arch) for p in KERNELS.glob("*.cu")}
