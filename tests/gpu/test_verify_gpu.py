"""Verification that is evidence, on a GPU (docs/VERIFY.md): programs with atomics verify with
plain --verify; the same captures with a kernel carrying a planted bug substituted fail naming
the element; scoped captures taken after a warm-up fail when a kernel is skipped; and a
deterministic capture verifies exactly in one replay."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_capture_gpu import EXAMPLES, SCRIPTS, capture, capture_ready, dump, needs, run  # noqa: F401 - a fixture

pytestmark = pytest.mark.usefixtures("capture_ready")


def verify_json(path: Path, *flags: str) -> tuple[int, dict, str]:
    result = run([sys.executable, "-m", "replayfmt_tools.run_replay", "--verify", "--format=json", *flags, str(path)])
    try:
        data = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise AssertionError(
            f"not JSON (exit {result.returncode}): {result.stdout[-2000:]}{result.stderr[-3000:]}"
        ) from None
    return result.returncode, data["verification"], result.stderr


def executable_of(path: Path, kernel: str) -> int:
    rows = [json.loads(line) for line in dump(path, "--format=jsonl", "--kind=executable").splitlines()]
    ids = [r["id"] for r in rows if r.get("kind") == "executable" and any(kernel in f["name"] for f in r["functions"])]
    assert ids, f"no executable runs {kernel}"
    return ids[0]


def launches(path: Path) -> list[int]:
    rows = [json.loads(line) for line in dump(path, "--format=jsonl", "--kind=launch").splitlines()]
    return [r["index"] for r in rows if r.get("kind") == "launch"]


@pytest.mark.parametrize(
    ("script", "kernel"),
    [
        ("verify_scatter_add.py", "scatter_add_kernel"),
        ("verify_layer_norm.py", "layer_norm_backward"),
        ("verify_train_step.py", "scatter_rows_kernel"),
    ],
)
def test_programs_with_atomics_verify_and_a_planted_bug_fails_naming_the_element(tmp_path, script, kernel):
    needs("torch")
    needs("triton")
    out = tmp_path / "step.kreplay"
    capture(out, SCRIPTS / script, "--scope", "step", args=(str(tmp_path),))
    code, report, stderr = verify_json(out)
    print(script, json.dumps({k: v for k, v in report.items() if k != "ranges"}))
    assert code == 0 and report["verified"], stderr[-4000:]
    assert report["compared"] > 0 and report["evidence"] > 0
    assert any(r["dtype"] for r in report["ranges"]), "the framework's tensors typed the checkpoint"
    bug = f"--executable-substitution={executable_of(out, kernel)}={tmp_path / 'bug.cubin'}"
    code, report, stderr = verify_json(out, bug)
    wrong = [r for r in report["ranges"] if r["verdict"] == "wrong"]
    assert code == 1 and not report["verified"] and wrong, stderr[-4000:]
    first = wrong[0]["first"][0]
    print(script, "planted bug:", wrong[0]["dtype"], wrong[0]["name"], first)
    assert first["wrong"] and first["ulp_diff"] > 4 and wrong[0]["dtype"] is not None
    assert "<- wrong" in stderr and "NOT verified" in stderr


def test_a_scoped_capture_after_a_warm_up_fails_with_a_kernel_skipped(tmp_path):
    needs("torch")
    out = tmp_path / "compiled.kreplay"
    capture(out, EXAMPLES / "torch_compile.py", "--scope", "step")
    code, report, stderr = verify_json(out, "--tolerance")  # as test_capture_gpu verifies it
    assert code == 0 and report["verified"] and report["compared"] > 0, stderr[-4000:]
    evidence = {r["evidence"] for r in report["ranges"]}
    assert "proven" in evidence and report["poisoned_replays"] >= 1, report  # it started as expected
    indices = launches(out)
    assert indices
    for index in indices:
        code, report, stderr = verify_json(out, "--tolerance", f"--launch={index}:skip")
        assert code == 1 and not report["verified"], (index, stderr[-3000:])
        assert any(r["evidence"] in ("left", "unchanged") for r in report["ranges"]), report["ranges"]


def test_a_deterministic_capture_verifies_exactly_in_one_replay(tmp_path):
    needs("triton")
    out = tmp_path / "add.kreplay"
    capture(out, EXAMPLES / "triton_add.py")
    code, report, stderr = verify_json(out)
    assert code == 0 and report["verified"] and report["replays"] == 1, stderr[-4000:]
    assert {r["verdict"] for r in report["ranges"]} == {"exact"} and not report["nondeterministic"]


def test_verify_with_nothing_to_compare_says_so_and_fails(tmp_path):
    import replayfmt
    from replayfmt.format import model as m

    path = tmp_path / "none.kreplay"
    with replayfmt.CaptureWriter(path) as w:
        dev = w.add_object(m.Device(name="GPU", compute_capability=(9, 0)))
        buf = w.add_object(m.Buffer(size=256, device=dev))
        w.memset(buffer=buf, value=1, count=64, element_size=4)
    result = run([sys.executable, "-m", "replayfmt_tools.run_replay", "--verify", str(path)])
    assert result.returncode == 1
    assert "nothing was compared" in result.stderr
