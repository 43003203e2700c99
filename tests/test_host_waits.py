"""Kernels that wait for a host write (XLA's autotuner DelayKernel): recognised at capture
(marked LAUNCH_FLAG_HOST_RELEASED), skipped at replay and left out of both sides of a benchmark's
busy time, and said so in every report. Captures written by the real writer and translator."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
from click.testing import CliRunner
from samples import SAXPY
from test_capture_translate import MODULE, FakeMemory, record

import replayfmt
from replayfmt.capture import events as ev
from replayfmt.format import model as m
from replayfmt.format.host_waits import XLA_DELAY_KERNEL, host_wait, released_counts
from replayfmt.format.timings import OperationTime, OriginalTimes
from replayfmt.measure import kernel_times as kt
from replayfmt.replay.plan import PlanOptions, build_plan
from replayfmt_tools.run_replay import main as run_replay

# XLA's own symbol: stream_executor::gpu::(anonymous namespace)::DelayKernel(GpuSemaphoreState volatile*, ...)
DELAY = "_ZN15stream_executor3gpu12_GLOBAL__N_111DelayKernelEPVNS_17GpuSemaphoreStateES2_"
DELAY_PARAMETERS = (
    m.Parameter(offset=0, size=8, kind=m.ParameterKind.POINTER, name="semaphore"),
    m.Parameter(offset=8, size=4, kind=m.ParameterKind.VALUE, name="target"),
)
HOST = 0x7F10_0000_0000  # the semaphore: pinned host memory
DEVICE = 0x7F00_0000_0000


def test_xla_delay_kernels_are_known_by_name_and_nothing_else_is():
    assert host_wait(DELAY) == XLA_DELAY_KERNEL and XLA_DELAY_KERNEL.release == 1  # GpuSemaphoreState::kRelease
    assert host_wait(DELAY + "ll") == XLA_DELAY_KERNEL  # ROCm's and newer CUDA variants: two more words
    assert host_wait("_ZN15stream_executor3gpu11DelayKernelEPVNS_17GpuSemaphoreStateES1_") == XLA_DELAY_KERNEL
    assert host_wait("_Z11DelayKernelPi") is None and host_wait("DelayKernel") is None  # another program's
    assert host_wait("_Z5saxpyfPKfPfi") is None
    assert released_counts(["a", "b", "a"]) == "2 as released, 1 b released" and released_counts([]) == ""


def written(path: Path, *, flagged: bool, memory: m.MemoryKind = m.MemoryKind.HOST_PINNED) -> dict[str, int]:
    """An autotuner's timing, as XLA queues it: the delay kernel on its semaphore, the timed saxpy,
    twice; original times for every launch (the delay kernels spun 5 ms, the host queueing)."""
    n = 256
    ids: dict[str, int] = {}
    with replayfmt.CaptureWriter(path, threads=0) as w:
        w.add_object(m.Device(name="test", compute_capability=(9, 0)))
        ids["sem"] = w.add_object(m.Buffer(size=4, memory=memory, address=HOST))
        ids["x"] = w.add_object(m.Buffer(size=4 * n, dtype=m.DType.FLOAT32, shape=(n,)))
        functions = (
            m.Function(name=DELAY, parameters=DELAY_PARAMETERS, parameters_known=True),
            m.Function(name="saxpy", parameters=SAXPY.parameters, parameters_known=True),
        )
        payload = w.add_payload(b"\x7fELF" + bytes(60))
        ids["exe"] = w.add_object(
            m.Executable(format=m.ExecutableFormat.CUBIN, target_arch="sm_90", payload=payload, functions=functions)
        )
        w.copy_h2d(dst_buffer=ids["x"], data=np.ones(n, np.float32))
        w.copy_h2d(dst_buffer=ids["sem"], data=np.zeros(1, np.int32))
        flags = m.LAUNCH_FLAG_HOST_RELEASED if flagged else 0
        for k in range(2):
            ids[f"delay{k}"] = w.launch(
                executable=ids["exe"],
                function=0,
                grid=(1, 1, 1),
                block=(1, 1, 1),
                parameters=bytes(8) + struct.pack("<i", 1) + bytes(4),
                relocations=[m.Relocation(0, ids["sem"], 0, 0)],
                flags=flags,
            )
            ids[f"saxpy{k}"] = w.launch(
                executable=ids["exe"],
                function=1,
                grid=(1, 1, 1),
                block=(n, 1, 1),
                parameters=struct.pack("<f4xQQi4x", 2.0, 0, 0, n),
                relocations=[m.Relocation(0, ids["x"], 8, 0), m.Relocation(0, ids["x"], 16, 0)],
            )
        w.checkpoint({ids["x"]: np.full(n, 9, np.float32)})
    return ids


def test_marked_delay_kernels_are_not_run_and_the_plan_says_so(tmp_path):
    ids = written(tmp_path / "c.kreplay", flagged=True)
    with replayfmt.open(tmp_path / "c.kreplay") as cap:
        plan = build_plan(cap, PlanOptions())
    assert plan.host_waits == {ids["delay0"]: "XLA autotuner delay kernel", ids["delay1"]: "XLA autotuner delay kernel"}
    assert "host waits    2 XLA autotuner delay kernels released: not run" in "\n".join(plan.describe())
    result = CliRunner().invoke(run_replay, ["--dry-run", str(tmp_path / "c.kreplay")])
    assert result.exit_code == 0 and "2 XLA autotuner delay kernels released" in result.stdout, result.output


def test_captures_recorded_before_the_mark_are_recognised_by_name_and_pinned_semaphore(tmp_path):
    ids = written(tmp_path / "old.kreplay", flagged=False)
    with replayfmt.open(tmp_path / "old.kreplay") as cap:
        assert set(build_plan(cap, PlanOptions()).host_waits) == {ids["delay0"], ids["delay1"]}
    written(tmp_path / "device.kreplay", flagged=False, memory=m.MemoryKind.DEVICE)
    with replayfmt.open(tmp_path / "device.kreplay") as cap:  # a semaphore in device memory: no host writes it
        assert build_plan(cap, PlanOptions()).host_waits == {}


def test_the_original_side_leaves_out_what_the_replay_skips():
    """Both sides of the busy time hold the same work: the delay kernels' 5 ms spins are the
    host's queueing, not the program's work, and the replay never runs them."""
    spin, work = 5_000_000, 10_000
    times = OriginalTimes(
        "cupti",
        {
            3: OperationTime(3, 0, spin),
            4: OperationTime(4, spin, work),
            5: OperationTime(5, spin + work, spin),
            6: OperationTime(6, 2 * spin + work, work),
        },
    )
    whole = kt.original_side(times, 0, 10, [3, 4, 5, 6])
    assert whole is not None and whole.busy_ns == 2 * (spin + work)
    side = kt.original_side(times, 0, 10, [4, 6], leave_out={3, 5})
    assert side is not None and (side.busy_ns, side.timed) == (2 * work, 2)


def test_the_recorder_marks_a_delay_kernel_on_pinned_memory_and_reports_it(tmp_path, cubin):
    mem = FakeMemory()
    mem.device[DEVICE] = bytearray(1024)
    delay = ev.Kernel(0xD00, DELAY, MODULE, ((0, 8), (8, 4)))
    on_device = ev.Kernel(0xD01, DELAY, MODULE, ((0, 8), (8, 4)))  # same name, device memory: not marked
    params = struct.pack("<Qi4x", HOST, 1)
    events = [
        ev.ModuleImage(MODULE, cubin, None, "cuModuleLoadData"),
        ev.Allocation(HOST, 4, ev.MemoryApi.HOST_PINNED, "cuMemHostAlloc"),
        ev.Allocation(DEVICE, 1024),
        ev.LaunchBegin(delay, (1, 1, 1), (1, 1, 1), 0, 0, params),
        ev.LaunchEnd(0),
        ev.LaunchBegin(on_device, (1, 1, 1), (1, 1, 1), 0, 0, struct.pack("<Qi4x", DEVICE, 1)),
        ev.LaunchEnd(0),
    ]
    mem.device[HOST] = bytearray(4)  # pinned memory reads as the device sees it
    path, t = record(tmp_path, events, mem)
    assert not t.report.errors, t.report.errors
    with replayfmt.open(path) as cap:
        launches = [op for op in cap.iter_operations() if op.kind == m.OperationKind.LAUNCH]
    assert [op.flags & m.LAUNCH_FLAG_HOST_RELEASED for op in launches] == [m.LAUNCH_FLAG_HOST_RELEASED, 0]
    assert t.report.host_waits == ["XLA autotuner delay kernel"]
    assert any("host waits: 1 XLA autotuner delay kernel released at replay" in line for line in t.report.lines())
