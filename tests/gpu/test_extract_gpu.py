"""extract-replay and diff-replay on a GPU, on captures of a torch.compile'd program
(tests/gpu/capture_scripts/compiled_layers.py, recorded under --scope step):

* one GEMM of the step cut out: under 5% of the step capture's size, verifies, benchmarks alone
  and carries the original's time (that its busy time agrees within 2% with the launch's inside
  the step's replay is a timing goal: benchmarks/timing_goals_bench.py --only extract --check);
* the program compiled two ways (default and max-autotune-no-cudagraphs): diff-replay names the
  kernels that changed.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from test_capture_gpu import SCRIPTS, capture, capture_ready, needs, run, verified  # noqa: F401 - a fixture

import replayfmt
from replayfmt.format import model as m
from replayfmt.format.names import demangle

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("capture_ready")]
LAYERS = 64  # a step of 64 weights of 16 MiB (fp32); one GEMM reads one of them
SCRIPT = SCRIPTS / "compiled_layers.py"


def tool(name: str, *args: str) -> str:
    result = run([sys.executable, "-m", f"replayfmt_tools.{name}", *args])
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result.stdout


def longest_launch(path: Path) -> tuple[int, str, int, int]:
    """(operation, kernel name, occurrence among that name's launches, original ns) of the middle
    one of the step's longest-running launches (a GEMM)."""
    with replayfmt.open(path) as cap:
        times = cap.original_times()
        launches = [op for op in cap if op.kind == m.OperationKind.LAUNCH]
        names = {op.index: cap.object(op.executable).functions[op.function].name for op in launches}
    longest = max(times.duration_ns(op.index) or 0 for op in launches)
    long_ones = [op.index for op in launches if (times.duration_ns(op.index) or 0) >= 0.8 * longest]
    index = long_ones[len(long_ones) // 2]
    name = names[index]
    occurrence = sum(1 for op in launches if op.index < index and names[op.index] == name)
    return index, name, occurrence, times.duration_ns(index) or 0


def test_one_gemm_cut_out_of_a_compiled_step(tmp_path):
    needs("torch")
    step = tmp_path / "step.kreplay"
    capture(step, SCRIPT, "--scope", "step", args=("default", str(LAYERS), "float32"))
    index, name, occurrence, original_ns = longest_launch(step)
    assert original_ns > 0, "the step's launches carry no original times"
    one = tmp_path / "gemm.kreplay"
    pattern = f"^{re.escape(name)}$#{occurrence}"
    report = json.loads(tool("extract_replay", "--kernel", pattern, "--format=json", "-o", str(one), str(step)))
    print("extract:", json.dumps(report))
    print(tool("dump_replay", str(one))[:3000])
    assert report["source_operations"] == [index, index]
    assert report["state_source"] == "gpu-replay"  # the GEMM's input was written by the step's relu before it
    assert report["size_ratio"] < 0.05, report
    verified(one)
    scope = report["scope"]
    alone = json.loads(tool("benchmark_replay", f"--scope={scope}", "--clock=cupti", "--format=json", str(one)))
    inside = json.loads(
        tool("benchmark_replay", "--scope=step", "--per-kernel", "--clock=cupti", "--format=json", str(step))
    )
    in_step = next(k for k in inside["kernels"] if k["operation"] == index)
    busy_alone = alone["busy_ms"]["median"]
    in_step_ms = in_step["device_ms"]["median"]
    print(
        f"{demangle(name)[:60]}: alone {busy_alone:.4f} ms, inside the step {in_step_ms:.4f} ms, "
        f"original {original_ns / 1e6:.4f} ms"
    )
    assert busy_alone > 0 and in_step_ms > 0 and alone["original"] is not None, alone
    # the original program's time came along, renumbered
    with replayfmt.open(one) as cap:
        assert sorted(cap.original_times().operations.values(), key=lambda t: t.operation)[0].duration_ns == original_ns
        assert dict(cap.metadata.properties)["extract.source_operations"] == f"{index}..{index}"


def test_diff_names_the_kernels_max_autotune_changed(tmp_path):
    needs("torch")
    default, tuned = tmp_path / "default.kreplay", tmp_path / "tuned.kreplay"
    capture(default, SCRIPT, "--scope", "step", args=("default", "4", "bfloat16"))
    capture(tuned, SCRIPT, "--scope", "step", args=("max-autotune-no-cudagraphs", "4", "bfloat16"))
    result = run([sys.executable, "-m", "replayfmt_tools.diff_replay", "--format=jsonl", str(default), str(tuned)])
    assert result.returncode in (0, 1), result.stderr[-3000:]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    summary = rows[0]
    print("diff:", json.dumps(summary)[:2000])
    text = run([sys.executable, "-m", "replayfmt_tools.diff_replay", str(default), str(tuned)]).stdout
    print(text[-4000:])
    changed = summary["kernels_only_a"] + summary["kernels_only_b"]
    changed += [r["name"] for r in rows if r["kind"] == "kernel" and (r["executable_changes"] or r["shape_changes"])]
    # max-autotune picks Triton GEMM templates (or other cuBLAS configurations) for the mm: some kernel changed
    assert changed, text
    assert result.returncode == 1 and summary["verdict"] == "different"
    assert all(name in text for name in summary["kernels_only_b"][:3])
