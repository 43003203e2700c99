import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from samples import write_sample

pytest_plugins = ["skip_summary"]  # one line per skip reason (see tests/skip_summary.py)


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    path = tmp_path / "sample.kreplay"
    write_sample(path, threads=0)
    return path
