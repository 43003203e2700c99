"""Kernel times from CUPTI activity records on a real GPU, and the original's times a recorded
capture carries (dump-replay shows them, benchmark-replay prints them beside the replay's)."""

from __future__ import annotations

import json
import statistics
import sys

import numpy as np
import pytest
from test_capture_gpu import EXAMPLES, capture, dump, run

from replayfmt.cuda.activity import ActivityKind, ExternalKind, KernelActivity, kernel_activity
from replayfmt.cuda.driver import check, driver

pytestmark = pytest.mark.gpu
LAUNCHES = 200


@pytest.fixture(scope="module")
def cupti(gpu_arch) -> None:
    activity, why = kernel_activity()
    if activity is None:
        pytest.skip(f"no CUPTI: {why}")


def _scale_kernel(cubin: bytes):
    cu = driver()
    check(cu.cuInit(0), "cuInit")
    device = check(cu.cuDeviceGet(0), "cuDeviceGet")
    context = check(cu.cuDevicePrimaryCtxRetain(device), "retain")
    check(cu.cuCtxSetCurrent(context), "set current")
    module = check(cu.cuModuleLoadData(cubin), "load")
    return cu, module, check(cu.cuModuleGetFunction(module, b"scale"), "function")


def test_cupti_times_a_small_kernel_below_events_around_it(kernels, cupti):
    cu, module, function = _scale_kernel(kernels["replay_kernels"])
    n = 4096
    y = check(cu.cuMemAlloc(4 * n), "alloc")
    args = [np.array([int(y)], np.uint64), np.array([1.0], np.float32), np.array([n], np.int32)]
    pointers = np.array([a.ctypes.data for a in args], np.uint64)
    stream = check(cu.cuStreamCreate(1), "stream")
    events = [(check(cu.cuEventCreate(0), "event"), check(cu.cuEventCreate(0), "event")) for _ in range(LAUNCHES)]

    def launch():
        check(cu.cuLaunchKernel(function, n // 256, 1, 1, 256, 1, 1, 0, stream, pointers.ctypes.data, 0), "launch")

    for _ in range(10):
        launch()
    check(cu.cuStreamSynchronize(stream), "sync")
    activity = KernelActivity(external=True)
    with activity:
        activity.push(ExternalKind.CUSTOM0, 7)
        for start, end in events:
            check(cu.cuEventRecord(start, stream), "record")
            launch()
            check(cu.cuEventRecord(end, stream), "record")
        activity.pop(ExternalKind.CUSTOM0)
        check(cu.cuStreamSynchronize(stream), "sync")
    batch = activity.take()
    kernels_seen = [r for r in batch.records if r.kind == ActivityKind.CONCURRENT_KERNEL]
    assert len(kernels_seen) == LAUNCHES and {r.name for r in kernels_seen} == {"scale"}
    assert len({r.correlation_id for r in kernels_seen}) == LAUNCHES
    assert all(batch.external_id(ExternalKind.CUSTOM0, r.correlation_id) == 7 for r in kernels_seen)
    cupti_us = statistics.median(r.duration_ns / 1e3 for r in kernels_seen)
    event_us = statistics.median(check(cu.cuEventElapsedTime(a, b), "elapsed") * 1e3 for a, b in events)
    print(f"scale({n}): CUPTI {cupti_us:.2f} us, events {event_us:.2f} us")
    # not a speed goal: each event pair encloses its kernel on the stream, so CUPTI's kernel
    # interval lies inside it however busy the GPU is
    assert 0 < cupti_us < event_us
    # a second activity in the same process may start once the first has stopped
    with KernelActivity() as again:
        launch()
        check(cu.cuStreamSynchronize(stream), "sync")
    assert [r.name for r in again.take().records] == ["scale"]
    check(cu.cuMemFree(y), "free")
    check(cu.cuModuleUnload(module), "unload")


def test_a_recorded_capture_carries_the_original_times(tmp_path, cupti):
    pytest.importorskip("triton")
    pytest.importorskip("cupti")
    out = tmp_path / "add.kreplay"
    report = capture(out, EXAMPLES / "triton_add.py").stderr
    assert "original device times: " in report and "operations timed with CUPTI" in report, report
    rows = [json.loads(line) for line in dump(out, "--format=jsonl").splitlines()]
    launches = [r for r in rows if r.get("kind") == "launch"]
    assert launches and all(isinstance(r["original_ns"], int) and r["original_ns"] > 0 for r in launches)
    uploads = [r for r in rows if r.get("kind") == "copy_h2d"]
    assert all(r["original_ns"] is None for r in uploads)  # snapshots the recorder added
    assert " original=" in dump(out)
    bench = run(
        [sys.executable, "-m", "replayfmt_tools.benchmark_replay", "--per-kernel", "--repetitions", "20", str(out)]
    )
    assert bench.returncode == 0, bench.stderr[-3000:]
    text = bench.stdout
    print(text)
    assert "GPU busy" in text and "clock: CUPTI activity records" in text
    assert "beside the original program's" in text
    events = run(
        [
            sys.executable,
            "-m",
            "replayfmt_tools.benchmark_replay",
            "--per-kernel",
            "--clock=events",
            "--repetitions",
            "5",
            str(out),
        ]
    )
    assert events.returncode == 0 and "per operation (median device ms, CUDA events)" in events.stdout
