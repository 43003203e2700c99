"""The CPU suite needs no nvcc (issue 25: 46 tests that only parse cubins skipped without it, and
CI has none, so they never ran while the suite read green). The tests that once needed it run here
again with nvcc hidden from PATH, and none may skip; conftest.py fails any CPU test that skips for
nvcc, and .ci/run runs the whole suite with nvcc hidden."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ONCE_NEEDED_NVCC = [
    "tests/test_capture_source.py::test_a_cubin_a_library_loads_lazily_is_found_by_the_kernel_name",
    "tests/test_roundtrip.py::test_real_cubin_payload_round_trips",
    "tests/test_first_hour.py::test_a_cubin_for_another_architecture_fails_the_dry_run",
    "tests/test_device_digest.py::test_shipped_ptx_is_what_its_source_compiles_to",
    "tests/test_run_replay_cpu.py::test_dry_run_plans_without_a_gpu",
    "tests/test_capture_verdict.py::test_a_clean_capture_is_replayable_and_needs_nothing_from_the_host",
    "tests/test_benchmark_cpu.py::test_a_region_spanning_two_captured_regions_sets_the_second_ones_state_untimed",
]


def path_without_nvcc(scratch: Path) -> str:
    """PATH with every nvcc left out (a directory holding one is replaced by links to the rest)."""
    out = []
    for k, entry in enumerate(os.environ.get("PATH", "").split(os.pathsep)):
        directory = Path(entry)
        if not (directory / "nvcc").exists():
            out.append(entry)
            continue
        farm = scratch / f"path{k}"
        farm.mkdir()
        for item in directory.iterdir():
            if item.name != "nvcc":
                (farm / item.name).symlink_to(item)
        out.append(str(farm))
    return os.pathsep.join([str(Path(sys.executable).parent), *out])


def test_the_tests_that_parse_cubins_run_without_nvcc(tmp_path):
    path = path_without_nvcc(tmp_path)
    assert shutil.which("nvcc", path=path) is None
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ONCE_NEEDED_NVCC],
        cwd=ROOT,
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    last = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0 and f"{len(ONCE_NEEDED_NVCC)} passed" in last and "skipped" not in last, done.stdout


def test_the_fixtures_are_built_from_todays_sources():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_test_cubins.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    sizes = [p.stat().st_size for p in (ROOT / "tests" / "fixtures" / "cubins").glob("*.cubin")]
    assert len(sizes) >= 6 and max(sizes) < 100 << 10
