"""benchmark-replay on a real GPU: restore semantics, graph mode, per-kernel times, traces."""

import json
import subprocess
import sys

import numpy as np
import pytest
from test_replay_gpu import AXPY, F32, SCALE, Capture, f32, i32, ints

import replayfmt
from replayfmt.format import model as m
from replayfmt.measure.benchmark import Benchmark, BenchmarkOptions, find_region
from replayfmt.replay import Replayer, ReplayOptions
from replayfmt.replay.plan import build_plan

pytestmark = pytest.mark.gpu
N = 1 << 20


def in_place_capture(tmp_path, kernels):
    """Upload y, then inside scope 'step': y *= 2 on stream 1; event; z = y + 3 * x on stream 2,
    with a stream synchronisation inside the scope. Each run of the scope changes y in place."""
    x, y = ints(N, 11), ints(N, 12)
    c = Capture(tmp_path / "bench.kreplay", kernels["replay_kernels"])
    s1 = c.w.add_object(m.Stream(device=c.dev, flags=1))
    s2 = c.w.add_object(m.Stream(device=c.dev, flags=1))
    ev = c.w.add_object(m.Event(device=c.dev))
    bx, by, bz = (c.buffer(4 * N, dtype=F32, shape=(N,)) for _ in range(3))
    c.w.copy_h2d(dst_buffer=bx, data=x, stream=s1)
    c.w.copy_h2d(dst_buffer=by, data=y, stream=s1)
    c.w.copy_h2d(dst_buffer=bz, data=y, stream=s1)
    c.w.stream_synchronize(s1)
    with c.w.scope("step"):
        c.launch(
            SCALE, (N // 256, 1, 1), (256, 1, 1), bytes(8) + f32(2) + i32(N), [m.Relocation(0, by, 0, 0)], stream=s1
        )
        c.w.event_record(ev, s1)
        c.w.stream_wait_event(s2, ev)
        c.w.copy_d2d(src_buffer=by, dst_buffer=bz, size=4 * N, stream=s2)
        c.launch(
            AXPY,
            (N // 256, 1, 1),
            (256, 1, 1),
            f32(3) + bytes(20) + i32(N) + bytes(4),
            [m.Relocation(0, bx, 8, 0), m.Relocation(0, bz, 16, 0)],
            stream=s2,
        )
        c.w.stream_synchronize(s2)
    return c.close(), (bx, by, bz), (x, y)


def read(replayer, buffer) -> np.ndarray:
    return np.frombuffer(replayer.read_back(buffer, 0, 4 * N), np.float32)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_every_iteration_starts_from_the_same_state(tmp_path, kernels, mode):
    path, (_, by, bz), (x, y) = in_place_capture(tmp_path, kernels)
    with replayfmt.open(path) as cap:
        plan = build_plan(cap)
        region = find_region(cap, "step")
        with Replayer(plan, ReplayOptions(uploads_from_host=True)) as r:
            bench = Benchmark(
                r, region, BenchmarkOptions(scope="step", warmup=2, repetitions=7, mode=mode, per_kernel=True)
            )
            result = bench.run()
            # restored before each of the 9 iterations: y was doubled exactly once, not 2**9 times
            assert np.array_equal(read(r, by), 2 * y)
            assert np.array_equal(read(r, bz), 2 * y + 3 * x)
    assert result.iterations == 7 and result.mode == mode
    assert result.device_ms.median > 0 and result.device_ms.min <= result.device_ms.median <= result.device_ms.p90
    names = [k.name for k in result.kernels]
    assert names == ["scale", "copy_d2d", "axpy"] and all(k.device_ms.median > 0 for k in result.kernels)


def test_timing_is_real_work(tmp_path, kernels):
    """A 4 MiB scale takes real time: at most the device's bandwidth, at least a microsecond."""
    path, _, _ = in_place_capture(tmp_path, kernels)
    with replayfmt.open(path) as cap:
        plan = build_plan(cap)
        with Replayer(plan, ReplayOptions(uploads_from_host=True)) as r:
            result = Benchmark(
                r, find_region(cap, "step"), BenchmarkOptions(repetitions=20, per_kernel=True, flush_l2=True)
            ).run()
    scale = result.kernels[0].device_ms.median
    assert scale > 1e-3 and (8 * N) / (scale * 1e-3) < 5e12


def test_cli_json_trace_and_compare(tmp_path, kernels):
    path, _, _ = in_place_capture(tmp_path, kernels)
    trace = tmp_path / "trace.json"
    run = [sys.executable, "-m", "replayfmt_tools.benchmark_replay", "--scope=step", "--repetitions=5"]
    base = subprocess.run(
        [*run, "--format=json", "--per-kernel", f"--trace={trace}", str(path)], capture_output=True, text=True
    )
    assert base.returncode == 0, base.stderr
    result = json.loads(base.stdout)
    assert result["scope"] == "step" and result["iterations"] == 5 and len(result["kernels"]) == 3
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["name"] for e in events} == {"scale", "copy_d2d", "axpy"} and len({e["tid"] for e in events}) == 2
    baseline = tmp_path / "base.json"
    baseline.write_text(base.stdout)
    graph = subprocess.run(
        [*run, "--mode=graph", "--per-kernel", f"--compare-to={baseline}", str(path)], capture_output=True, text=True
    )
    assert graph.returncode == 0, graph.stderr
    assert "graph mode" in graph.stdout and "speedup = baseline / now" in graph.stdout


class RecordedNvtx:
    """The real NVTX library, with every range the replay opens and closes written down."""

    def __init__(self, real) -> None:
        self.real = real
        self.calls: list[tuple[str, ...]] = []

    def push(self, name: bytes) -> None:
        self.calls.append(("push", name.decode()))
        self.real.push(name)

    def pop(self) -> None:
        self.calls.append(("pop",))
        self.real.pop()


def test_nvtx_ranges_wrap_scopes_and_launches(tmp_path, kernels, monkeypatch):
    """The ranges themselves, not only the exit codes: each benchmark iteration opens the scope's
    range around its launches' (the scope's range was opened once at setup and never closed)."""
    from replayfmt.cuda.nvtx import Nvtx
    from replayfmt.replay import replayer as replayer_module

    try:
        recorded = RecordedNvtx(Nvtx.load())
    except replayfmt.DeviceUnavailableError as exc:
        pytest.skip(str(exc))

    class Loader:
        @staticmethod
        def load() -> RecordedNvtx:
            return recorded

    monkeypatch.setattr(replayer_module, "Nvtx", Loader)
    path, _, _ = in_place_capture(tmp_path, kernels)
    one = [("push", "step"), ("push", "scale"), ("pop",), ("push", "axpy"), ("pop",), ("pop",)]
    with replayfmt.open(path) as cap:
        plan = build_plan(cap)
        with Replayer(plan, ReplayOptions(uploads_from_host=True, nvtx=True)) as r:
            bench = Benchmark(r, find_region(cap, "step"), BenchmarkOptions(scope="step", warmup=1, repetitions=3))
            assert recorded.calls == []  # setup opens no range
            bench.run()
            assert recorded.calls == one * 4, recorded.calls  # 1 warm-up + 3 timed iterations
            recorded.calls.clear()
            r.run(1)
            assert recorded.calls == one, recorded.calls
    for tool in ("benchmark_replay", "run_replay"):  # the tools, with the library itself
        flags = ["--scope=step", "--repetitions=3"] if tool == "benchmark_replay" else []
        result = subprocess.run(
            [sys.executable, "-m", f"replayfmt_tools.{tool}", "--nvtx", *flags, str(path)],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stderr


def test_a_counter_the_kernel_bumps_in_its_module_is_restored_every_iteration(tmp_path, gpu_arch):
    """tests/kernels/module_globals.cu's gather bumps the module global ``calls`` (named by no
    relocation): every iteration starts from the captured count, so after 2 + 5 iterations it
    holds 1, not 7."""
    from samples import compiled_cubin

    cubin = compiled_cubin("module_globals.cu", gpu_arch)
    if cubin is None:
        pytest.skip(f"no module_globals cubin for {gpu_arch} (nvcc, or tests/fixtures/cubins)")
    gather = m.Function(
        name="gather",
        parameters=(
            m.Parameter(offset=0, size=8, kind=m.ParameterKind.POINTER),
            m.Parameter(offset=8, size=4, kind=m.ParameterKind.VALUE),
        ),
        parameters_known=True,
    )
    path = tmp_path / "calls.kreplay"
    with replayfmt.CaptureWriter(path, threads=0) as w:
        dev = w.add_object(m.Device(name="test", compute_capability=(9, 0)))
        exe = w.add_object(
            m.Executable(format=m.ExecutableFormat.CUBIN, payload=w.add_payload(cubin), functions=(gather,))
        )
        calls = w.add_object(m.Global(executable=exe, symbol="calls", size=4))
        counter = w.add_object(m.Buffer(size=4, device=dev, module_global=calls))
        out = w.add_object(m.Buffer(size=64, device=dev))
        w.module_load(exe, dev)
        with w.scope("step"):
            w.state(buffer=counter, data=np.zeros(1, np.uint32))
            # n = 0: no element is gathered (base stays unread); thread 0 still bumps calls
            w.launch(
                executable=exe,
                function=0,
                grid=(1, 1, 1),
                block=(32, 1, 1),
                parameters=bytes(8) + np.int32(0).tobytes() + bytes(4),
                relocations=[m.Relocation(0, out, 0, 0)],
            )
    with replayfmt.open(path) as cap:
        plan = build_plan(cap)
        with Replayer(plan, ReplayOptions(uploads_from_host=True)) as r:
            Benchmark(r, find_region(cap, "step"), BenchmarkOptions(scope="step", warmup=2, repetitions=5)).run()
            assert np.frombuffer(r.read_back(counter, 0, 4), np.uint32)[0] == 1
