import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from samples import compiled_cubin, write_sample

pytest_plugins = ["skip_summary"]  # one line per skip reason (see tests/skip_summary.py)


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    path = tmp_path / "sample.kreplay"
    write_sample(path, threads=0)
    return path


@pytest.fixture
def cubin() -> bytes:
    """The test kernels (container_kernels.cu) as a cubin; skips where nvcc is missing."""
    data = compiled_cubin("container_kernels.cu")
    if data is None:
        pytest.skip("nvcc not available")
    return data
