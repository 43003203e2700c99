"""Kernels that wait for a host write, on a GPU: XLA's autotuner DelayKernel, as its
GpuTimer queues it (capture_scripts/xla_delay_kernel.py), is recognised by the recorder, not run by
run-replay or benchmark-replay (it would spin its 100 ms timeout each time: no replay writes the
release), said so in each report, and left out of both sides of the busy time. That the replay's
busy time is then within 2% of the original's is a timing goal
(benchmarks/timing_goals_bench.py --only host_waits --check)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_capture_gpu import SCRIPTS, capture, capture_ready, run, verified  # noqa: F401 - a fixture

import replayfmt
from replayfmt.format import model as m

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("capture_ready")]
RELEASED = "3 XLA autotuner delay kernels released"


@pytest.fixture(scope="module")
def timed_candidates(tmp_path_factory, gpu_arch) -> Path:
    out = tmp_path_factory.mktemp("host_waits") / "autotune.kreplay"
    report = capture(out, SCRIPTS / "xla_delay_kernel.py", args=(gpu_arch,))
    assert f"host waits: {RELEASED} at replay" in report.stderr, report.stderr[-3000:]
    return out


def test_the_recorder_marks_each_delay_kernel_and_nothing_else(timed_candidates):
    with replayfmt.open(timed_candidates) as cap:
        launches = [op for op in cap.iter_operations() if op.kind == m.OperationKind.LAUNCH]
        names = [cap.object(op.executable).functions[op.function].name for op in launches]
    marked = [n for op, n in zip(launches, names, strict=True) if op.flags & m.LAUNCH_FLAG_HOST_RELEASED]
    assert len(marked) == 3 and all("DelayKernel" in n for n in marked), names
    assert names.count("scale_add") == 12


def test_run_replay_skips_them_and_says_so(timed_candidates):
    text = verified(timed_candidates)
    assert f"host waits    {RELEASED}: not run" in text, text[-3000:]
    result = run([sys.executable, "-m", "replayfmt_tools.run_replay", "--format=json", str(timed_candidates)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert set(json.loads(result.stdout)["released"].values()) == {"XLA autotuner delay kernel"}


def test_benchmark_replay_times_neither_side_of_them(timed_candidates):
    result = run(
        [
            sys.executable,
            "-m",
            "replayfmt_tools.benchmark_replay",
            "--repetitions=5",
            "--per-kernel",
            "--format=json",
            str(timed_candidates),
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    bench = json.loads(result.stdout)
    assert bench["released"] == RELEASED, bench
    timed = [k["name"] for k in bench["kernels"]]
    assert not any("DelayKernel" in name for name in timed) and timed.count("scale_add") == 12, timed
    assert bench["original"] is not None and bench["original"]["timed"] >= 12, bench["original"]
    text = run([sys.executable, "-m", "replayfmt_tools.benchmark_replay", "--repetitions=5", str(timed_candidates)])
    assert f"host waits    {RELEASED}: not run and not timed" in text.stdout, text.stdout[-3000:]
