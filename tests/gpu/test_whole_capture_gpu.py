"""benchmark-replay with no --scope on kernel-mode captures, as a new user first types it: the
region is the whole capture, and its starting state (inside each captured scope) is never timed.
The replay's GPU busy time beside the original program's (the capture's original_ns rows) and the
elapsed time without the state are timing goals, judged by benchmarks/timing_goals_bench.py
--check (nothing else on the GPU); here the behaviour: the whole capture is the region, every
scope's state is set outside the timed iterations, and the original's times come along."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from test_capture_gpu import SCRIPTS, capture, needs, run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def capture_ready(gpu_arch) -> str:
    if importlib.util.find_spec("cupti") is None:
        pytest.skip("cupti-python is not installed (pip install 'replayfmt[capture]')")
    return gpu_arch


def bench(path: Path, *flags: str) -> dict:
    result = run(
        [
            sys.executable,
            "-m",
            "replayfmt_tools.benchmark_replay",
            "--repetitions=100",
            "--format=json",
            *flags,
            str(path),
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def busy_beside_original(result: dict) -> tuple[float, float]:
    """The whole capture is the region, timed with CUPTI, and both busy times are there: the
    replay's from its own launches (every captured launch timed each iteration), the original's
    from the capture's rows."""
    assert result["scope"] is None and result["clock"] == "cupti", result["clock_note"]
    assert result["original"] is not None, "the capture carries no original_ns rows"
    assert result["busy_ms"]["median"] > 0 and result["original"]["busy_ns"] > 0, result
    assert result["original"]["timed"] > 0, result["original"]
    return result["busy_ms"]["median"], result["original"]["busy_ns"] / 1e6


def softmax_capture(tmp_path: Path, instances: int) -> Path:
    needs("triton")
    out = tmp_path / "softmax.kreplay"
    capture(
        out,
        SCRIPTS / "triton_softmax_repeated.py",
        "--mode=kernel",
        "--kernels=softmax_kernel",
        "--skip-first=5",
        f"--max-per-kernel={instances}",
        args=(str(5 + instances + 2),),
    )
    return out


def test_the_whole_kernel_mode_capture_times_the_kernel_not_its_state(tmp_path, capture_ready):
    """One captured launch, no --scope: busy time was 0.215 ms against the original's 0.0065 (33x),
    its 2 MiB of starting state timed as the region's work."""
    result = bench(softmax_capture(tmp_path, 1))
    busy, original = busy_beside_original(result)
    print(f"whole capture: replay busy {busy:.4f} ms, original {original:.4f} ms, elapsed {result['device_ms']}")


def test_a_region_over_several_captured_scopes_sets_their_state_untimed(tmp_path, capture_ready):
    """Four captured launches, no --scope: the later scopes' state is set every iteration, between
    the launches, outside the elapsed time and the busy time."""
    path = softmax_capture(tmp_path, 4)
    for clock in ("cupti", "events"):
        result = bench(path, f"--clock={clock}")
        assert result["scope"] is None and result["device_ms"]["median"] > 0, (clock, result)
        print(f"four scopes, {clock}: elapsed {result['device_ms']}")
    busy, original = busy_beside_original(bench(path))
    print(f"four scopes: replay busy {busy:.4f} ms, original {original:.4f} ms")


def test_the_quick_start_capture_times_like_the_original(capture_ready):
    """examples/triton_softmax.kreplay as the quick start gives it, with no --scope."""
    busy, original = busy_beside_original(bench(ROOT / "examples" / "triton_softmax.kreplay"))
    print(f"quick start: replay busy {busy:.4f} ms, original {original:.4f} ms")
