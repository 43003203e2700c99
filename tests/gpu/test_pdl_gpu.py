"""Programmatic dependent launch (PDL) on a GPU (sm_90 and newer): launches a program made with
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION are recorded flagged programmatic (repeats
the recorder's C ring answers included), a programmatic event is recorded as an event record after
its launch, dump-replay shows both, and run-replay --verify replays them (with the attribute) and
verifies the results, and benchmark-replay times them eager and as a CUDA graph (stream capture
turns them into programmatic edges) (capture_scripts/pdl_chain.py); a Triton kernel launched with
launch_pdl=True too (capture_scripts/triton_pdl.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_capture_gpu import SCRIPTS, capture, capture_ready, dump, needs, run, verified  # noqa: F401 - a fixture

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("capture_ready")]


@pytest.fixture(scope="module")
def pdl(tmp_path_factory, gpu_arch) -> tuple[Path, list[dict]]:
    if int(gpu_arch[3:]) < 90:
        pytest.skip(f"programmatic dependent launch needs sm_90 or newer, not {gpu_arch}")
    out = tmp_path_factory.mktemp("pdl") / "pdl.kreplay"
    capture(out, SCRIPTS / "pdl_chain.py", "--scope", "step", args=(gpu_arch,))
    return out, [json.loads(line) for line in dump(out, "--format=jsonl").splitlines()]


def test_each_launch_that_allowed_pdl_is_flagged_and_its_event_recorded_after_it(pdl):
    path, rows = pdl
    rows = [r for r in rows if "index" in r]  # operation rows
    launches = [r for r in rows if r["kind"] == "launch"]
    assert [r["flags"] for r in launches] == [4] * 13 + [0], [(r["function"], r["flags"]) for r in launches]
    after = [r for r in rows if r["index"] > launches[12]["index"] and r["kind"] != "create"]
    assert after[0]["kind"] == "event_record" and after[0]["stream"] == launches[12]["stream"]
    assert after[1]["kind"] == "stream_wait_event" and after[1]["event"] == after[0]["event"]
    assert after[1]["stream"] == launches[13]["stream"] != launches[12]["stream"]
    assert dump(path, "--kind=launch").count(" flags=programmatic ") == 13


def test_run_replay_replays_them_with_pdl_and_verifies(pdl):
    path, _ = pdl
    text = verified(path)
    assert "programmatic dependent launch" not in text  # sm_90 and newer: no note on the device line


@pytest.mark.parametrize("mode", ["eager", "graph"])  # graph: the eager steps captured into one CUDA graph
def test_benchmark_replay_times_them_eager_and_as_a_graph(pdl, mode):
    path, _ = pdl
    result = run(
        [
            sys.executable,
            "-m",
            "replayfmt_tools.benchmark_replay",
            "--scope=step",
            "--repetitions=5",
            f"--mode={mode}",
            "--format=json",
            str(path),
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["iterations"] == 5


def test_a_triton_kernel_launched_with_launch_pdl_is_flagged_and_verifies(tmp_path, gpu_arch):
    needs("torch")
    needs("triton")
    if int(gpu_arch[3:]) < 90:
        pytest.skip(f"programmatic dependent launch needs sm_90 or newer, not {gpu_arch}")
    out = tmp_path / "triton_pdl.kreplay"
    capture(out, SCRIPTS / "triton_pdl.py", "--scope", "step")
    rows = [json.loads(line) for line in dump(out, "--format=jsonl", "--kind=launch").splitlines()[2:]]
    assert [(r["function"], r["flags"]) for r in rows] == [("axpy_pdl", 4)] * 8
    verified(out)
