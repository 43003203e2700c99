"""Replay of captures that span two devices: captured device k runs on the k-th --device, streams
and events live on their device, an event edge crosses devices, copies and kernels reach the
other device's memory (peer access), and default-stream work runs on the device it touches.
Skips on machines with fewer than two GPUs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_replay_gpu import AXPY, F32, FUNCTIONS, SCALE, f32, i32, ints

import replayfmt
from replayfmt.format import model as m
from replayfmt.replay import Replayer, ReplayOptions
from replayfmt.replay.plan import build_plan

pytestmark = pytest.mark.gpu
N = 1 << 16


@pytest.fixture(scope="module")
def two_gpus(kernels) -> dict[str, bytes]:
    from replayfmt.cuda.driver import check, driver

    count = check(driver().cuDeviceGetCount(), "cuDeviceGetCount")
    if count < 2:
        pytest.skip(f"needs two GPUs; this machine has {count}")
    return kernels


class TwoDeviceCapture:
    def __init__(self, path: Path, cubin: bytes) -> None:
        self.path = path
        self.w = replayfmt.CaptureWriter(path, threads=0)
        self.devices = [self.w.add_object(m.Device(name=f"gpu{k}", compute_capability=(9, 0))) for k in range(2)]
        payload = self.w.add_payload(cubin)
        self.exe = self.w.add_object(
            m.Executable(format=m.ExecutableFormat.CUBIN, payload=payload, functions=FUNCTIONS)
        )
        for device in self.devices:
            self.w.module_load(self.exe, device)

    def buffer(self, device: int) -> int:
        return self.w.add_object(m.Buffer(size=4 * N, device=self.devices[device], dtype=F32, shape=(N,)))

    def launch(self, kernel: m.Function, params: bytes, relocations, stream: int = 0) -> None:
        self.w.launch(
            executable=self.exe,
            function=FUNCTIONS.index(kernel),
            grid=(N // 256, 1, 1),
            block=(256, 1, 1),
            parameters=params,
            relocations=relocations,
            stream=stream,
        )

    def close(self) -> Path:
        self.w.close()
        return self.path


def replay(path: Path, devices: tuple[int, ...] = (0, 1)):
    with replayfmt.open(path) as cap, Replayer(build_plan(cap), ReplayOptions(devices=devices, verify=True)) as r:
        return r.run(2)


def axpy_params() -> bytes:
    return f32(2) + bytes(20) + i32(N) + bytes(4)


def event_edge_capture(tmp_path: Path, cubin: bytes) -> Path:
    x, y = ints(N, 11), ints(N, 12)
    c = TwoDeviceCapture(tmp_path / "two.kreplay", cubin)
    first, second = (c.w.add_object(m.Stream(device=d, flags=1)) for d in c.devices)
    done = c.w.add_object(m.Event(device=c.devices[0]))
    bx, by, bz = c.buffer(0), c.buffer(0), c.buffer(1)
    c.w.copy_h2d(dst_buffer=bx, data=x, stream=first)
    c.w.copy_h2d(dst_buffer=by, data=y, stream=first)
    c.launch(AXPY, axpy_params(), [m.Relocation(0, bx, 8, 0), m.Relocation(0, by, 16, 0)], stream=first)
    c.w.event_record(done, first)
    c.w.stream_wait_event(second, done)  # the second device waits for the first
    c.w.copy_d2d(src_buffer=by, dst_buffer=bz, size=4 * N, stream=second)  # across devices
    c.launch(SCALE, bytes(8) + f32(-0.5) + i32(N), [m.Relocation(0, bz, 0, 0)], stream=second)
    c.w.stream_synchronize(second)
    c.w.checkpoint({by: 2 * x + y, bz: (2 * x + y) * -0.5})
    return c.close()


def test_an_event_edge_and_a_copy_across_two_devices(tmp_path, two_gpus):
    path = event_edge_capture(tmp_path, two_gpus["replay_kernels"])
    for devices in ((0, 1), (1, 0)):  # either mapping reproduces the capture
        result = replay(path, devices)
        assert len(result.reports) == 2 and result.verified, [r.line() for r in result.reports]
        assert len(result.device_ms) == 2 and all(ms > 0 for ms in result.device_ms)
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "replayfmt_tools.run_replay",
            str(path),
            "--verify",
            "--device",
            "cuda:1",
            "--device",
            "cuda:0",
        ],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert (
        "#1 on cuda:1" in cli.stdout and "#2 on cuda:0" in cli.stdout and "verified: 2 range(s) compared" in cli.stdout
    )


def test_a_kernel_reads_the_other_devices_memory(tmp_path, two_gpus):
    x, y = ints(N, 13), ints(N, 14)
    c = TwoDeviceCapture(tmp_path / "peer.kreplay", two_gpus["replay_kernels"])
    stream = c.w.add_object(m.Stream(device=c.devices[1], flags=1))
    bx, by = c.buffer(0), c.buffer(1)
    c.w.copy_h2d(dst_buffer=bx, data=x)  # default stream, first device
    c.w.copy_h2d(dst_buffer=by, data=y)  # default stream, second device
    for device in c.devices:
        c.w.device_synchronize(device)
    c.launch(AXPY, axpy_params(), [m.Relocation(0, bx, 8, 0), m.Relocation(0, by, 16, 0)], stream=stream)
    c.w.stream_synchronize(stream)
    c.w.checkpoint({by: 2 * x + y})
    result = replay(c.close())
    assert result.verified and len(result.reports) > 0, [r.line() for r in result.reports]


def test_default_stream_work_runs_on_the_device_it_touches(tmp_path, two_gpus):
    y = ints(N, 15)
    c = TwoDeviceCapture(tmp_path / "default.kreplay", two_gpus["replay_kernels"])
    by = c.buffer(1)
    c.w.copy_h2d(dst_buffer=by, data=y)
    c.w.memset(buffer=by, value=0x40400000, count=1024, element_size=4)  # 3.0f
    c.launch(SCALE, bytes(8) + f32(4) + i32(N), [m.Relocation(0, by, 0, 0)])
    c.w.device_synchronize(c.devices[1])
    expected = y.copy()
    expected[:1024] = 3
    c.w.checkpoint({by: expected * 4})
    result = replay(c.close())
    assert result.verified and len(result.reports) > 0, [r.line() for r in result.reports]


def test_captured_devices_not_named_run_on_the_lowest_free_ordinals(tmp_path, two_gpus):
    path = event_edge_capture(tmp_path, two_gpus["replay_kernels"])
    result = replay(path, devices=(1,))  # captured device 1 then runs on cuda:0
    assert result.verified, [r.line() for r in result.reports]
