"""Steps whose results die inside their scope are still verified, on a GPU: memory freed
with cuMemFree before the scope ends, and a PyTorch result dropped at once (the caching
allocator's block free), are checkpointed before they go; a JAX result dropped at once (freed in
XLA's arena unheard) is compared as what the step wrote into free memory; run-replay --verify
compares each with evidence, and a wrong launch fails naming the element. The diffrax and
torch.compile max-autotune programs: scripts/issue44_dropped_results.py."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from test_capture_gpu import SCRIPTS, capture, capture_ready, dump, run  # noqa: F401 - a fixture

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("capture_ready")]


def verify_json(path: Path, *flags: str) -> tuple[int, dict, str]:
    result = run([sys.executable, "-m", "replayfmt_tools.run_replay", "--verify", "--format=json", *flags, str(path)])
    return result.returncode, json.loads(result.stdout)["verification"], result.stderr


@pytest.fixture(scope="module")
def freed(tmp_path_factory, gpu_arch) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("freed") / "freed.kreplay"
    report = capture(out, SCRIPTS / "freed_result.py", "--scope", "step", args=(gpu_arch,))
    assert "checkpoints before frees:" in report.stderr, report.stderr[-3000:]
    return out, [json.loads(line) for line in dump(out, "--format=jsonl").splitlines()]


def released(rows: list[dict], why: str) -> list[dict]:
    return [r for r in rows if r["kind"] == "checkpoint" and why in r["name"]]


def largest_released(rows: list[dict], why: str) -> dict:
    """Of the checkpoints taken before frees, the one of the largest block (a step frees its
    temporaries too: the dropped result is the largest)."""
    found = released(rows, why)
    assert found, f"no checkpoint {why!r}"
    return max(found, key=lambda r: max(e["size"] for e in r["entries"]))


def test_memory_freed_in_the_step_is_checkpointed_before_the_free_and_compared_with_evidence(freed):
    path, rows = freed
    (before,) = released(rows, "before cuMemFree")
    destroyed = [r["index"] for r in rows if r["kind"] == "destroy" and r["object"] == before["entries"][0]["buffer"]]
    assert destroyed and before["index"] < destroyed[0]
    code, report, stderr = verify_json(path)
    assert code == 0 and report["verified"] and report["evidence"] > 0, stderr[-3000:]
    ranges = [r for r in report["ranges"] if r["operation"] == before["index"]]
    assert ranges and all(r["passed"] for r in ranges) and {r["evidence"] for r in ranges} & {"compared", "proven"}
    assert " with evidence (" in stderr


def test_a_wrong_launch_into_the_freed_memory_fails_naming_the_element(freed):
    path, rows = freed
    (before,) = released(rows, "before cuMemFree")
    saxpy = next(r for r in rows if r["kind"] == "launch" and r["function"] == "saxpy")
    half = saxpy["grid"][0] // 2
    code, report, stderr = verify_json(path, f"--launch={saxpy['index']}:grid={half},1,1")
    wrong = [r for r in report["ranges"] if r["operation"] == before["index"] and not r["passed"]]
    assert code == 1 and wrong, stderr[-3000:]
    first = wrong[0]["first"][0]
    assert first["wrong"] and first["index"] >= half * 256  # the half the launch no longer computes
    assert "<- wrong" in stderr


def launches_into(rows: list[dict], entry: dict, before: int) -> list[dict]:
    """The launches before operation ``before`` that point into a checkpoint entry's bytes."""
    low, high = entry["offset"], entry["offset"] + entry["size"]
    return [
        r
        for r in rows
        if r["kind"] == "launch"
        and r["index"] < before
        and any(x["target_buffer"] == entry["buffer"] and low <= x["target_offset"] < high for x in r["relocations"])
    ]


def failing_named(report: dict, operation: int) -> list[dict]:
    return [r for r in report["ranges"] if r["operation"] == operation and not r["passed"] and r["first"]]


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_a_dropped_pytorch_result_is_checkpointed_when_the_caching_allocator_frees_it(freed):
    path, rows = freed
    dropped = largest_released(rows, "freed by PyTorch's caching allocator")
    code, report, stderr = verify_json(path, "--tolerance")
    assert code == 0 and report["verified"], stderr[-3000:]
    ranges = [r for r in report["ranges"] if r["operation"] == dropped["index"]]
    assert ranges and all(r["passed"] for r in ranges) and {r["evidence"] for r in ranges} & {"compared", "proven"}


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_a_wrong_launch_into_a_dropped_pytorch_result_fails_naming_the_element(freed):
    path, rows = freed
    # the step's last launch is the relu whose result is dropped at once; the blocks PyTorch frees
    # in the step are all of one size, so the checkpoint is found by what failed, not by its size
    relu = [r for r in rows if r["kind"] == "launch"][-1]
    dropped = {r["index"] for r in released(rows, "freed by PyTorch's caching allocator")}
    code, report, stderr = verify_json(path, "--tolerance", f"--launch={relu['index']}:skip")
    named = [r for operation in sorted(dropped) for r in failing_named(report, operation)]
    assert code == 1 and named, stderr[-3000:]
    assert named[0]["first"][0]["wrong"]


@pytest.fixture(scope="module")
def dropped_jax(tmp_path_factory, gpu_arch) -> tuple[Path, list[dict]]:
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    out = tmp_path_factory.mktemp("jax") / "step.kreplay"
    report = capture(out, SCRIPTS / "dropped_jax_step.py", "--scope", "step")
    assert "written into free memory:" in report.stderr, report.stderr[-3000:]
    return out, [json.loads(line) for line in dump(out, "--format=jsonl").splitlines()]


def test_a_dropped_jax_result_is_compared_as_what_the_step_wrote_into_free_memory(dropped_jax):
    """XLA frees a dropped array in its arena unheard: what the step's launches wrote outside the
    arrays live at its start and end is checkpointed with an undefined starting state, and a
    poisoned replay proves the step writes it."""
    path, rows = dropped_jax
    (written,) = released(rows, "(written into free memory)")
    undefined = {(r["buffer"], r["offset"], r["size"]) for r in rows if r["kind"] == "state" and r.get("undefined")}
    assert {(e["buffer"], e["offset"], e["size"]) for e in written["entries"]} <= undefined
    code, report, stderr = verify_json(path, "--tolerance")
    assert code == 0 and report["verified"], stderr[-3000:]
    ranges = [r for r in report["ranges"] if r["operation"] == written["index"]]
    assert any(r["evidence"] == "proven" for r in ranges) and all(r["passed"] for r in ranges), ranges


def test_a_skipped_launch_into_a_dropped_jax_result_fails_naming_the_element(dropped_jax):
    path, rows = dropped_jax
    (written,) = released(rows, "(written into free memory)")
    last = [r for r in rows if r["kind"] == "launch"][-1]  # the step's last kernel writes its result
    assert any(launches_into([last], e, written["index"]) for e in written["entries"]), last
    code, report, stderr = verify_json(path, "--tolerance", f"--launch={last['index']}:skip")
    assert code == 1 and failing_named(report, written["index"]), stderr[-3000:]
