"""benchmark-replay fidelity, on a GPU with torch and Triton (issue: benchmark-replay).

    python benchmarks/fidelity_bench.py [--recorded | --only-recorded] [--check]

1. For three Triton kernels (a matmul, a softmax, a memory-bound copy), the median device time
   measured with CUDA events inside the original program (torch, the L2 flushed before each
   call, as triton.testing.do_bench does) against the median of benchmark-replay on a capture of
   the same launch (--flush-l2). Goal: within +-5%.
2. Graph mode: per-launch device time of 1000 empty-kernel launches replayed with --mode=graph,
   against a CUDA graph of the same launches captured natively. Goal: <= 2x.

The captures are written with the writer from the compiled kernels (cubin, launch shape, parameter
bytes laid out as the loaded function reports them), as the recorder would write them.

3. Recorded captures of real programs (``--recorded``, or ``--only-recorded``): a torch.compile'd
   ResNet-18 step (cuDNN, cuBLAS and Triton kernels) under a scope, and Triton's fused softmax in
   kernel mode, each recorded, measured and replayed in a process of its own by
   benchmarks/fidelity_recorded.py: replay against the original with CUPTI on both sides.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl
from goals import Goals, add_check

import replayfmt
from replayfmt.cuda.driver import check, driver
from replayfmt.format import model as m
from replayfmt.measure.benchmark import Benchmark, BenchmarkOptions, find_region
from replayfmt.replay import Replayer, ReplayOptions
from replayfmt.replay.plan import build_plan

ITERATIONS = 50


@triton.jit(do_not_specialize=["n"])
def copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


@triton.jit(do_not_specialize=["in_stride", "out_stride", "n_cols"])
def softmax_kernel(out, inp, in_stride, out_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(inp + row * in_stride + offs, mask=mask, other=-float("inf"))
    x = x - tl.max(x, 0)
    num = tl.exp(x)
    tl.store(out + row * out_stride + offs, num / tl.sum(num, 0), mask=mask)


@triton.jit(do_not_specialize=["M", "N", "K", "sam", "sak", "sbk", "sbn", "scm", "scn"])
def matmul_kernel(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a_tile = tl.load(a + rm[:, None] * sam + (k + rk)[None, :] * sak)
        b_tile = tl.load(b + (k + rk)[:, None] * sbk + rn[None, :] * sbn)
        acc += tl.dot(a_tile, b_tile)
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(tl.float16))


def compiled_of(kernel, handle):
    """The CompiledKernel of the launch just made (the call's return value in Triton 3.x)."""
    if hasattr(handle, "asm"):
        return handle
    for cache in getattr(kernel, "device_caches", {}).values():
        for compiled in cache[0].values():
            return compiled
    raise RuntimeError("cannot find the compiled Triton kernel")


def original_median(launch) -> float:
    """The kernel timed with CUDA events inside the program, the L2 flushed before each call."""
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    for _ in range(5):
        launch()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(ITERATIONS)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(ITERATIONS)]
    for s, e in zip(starts, ends):
        flush.zero_()
        s.record()
        launch()
        e.record()
    torch.cuda.synchronize()
    return float(np.median([s.elapsed_time(e) for s, e in zip(starts, ends)]))


def param_layout(cubin: bytes, name: str) -> list[tuple[int, int]]:
    cu = driver()
    module = check(cu.cuModuleLoadData(cubin), "load")
    function = check(cu.cuModuleGetFunction(module, name.encode()), "function")
    layout = []
    for i in range(256):
        err, offset, size = cu.cuFuncGetParamInfo(function, i)
        if err != cu.CUresult.CUDA_SUCCESS:
            break
        layout.append((offset, size))
    check(cu.cuModuleUnload(module), "unload")
    return layout


def write_capture(path: Path, kernel, compiled, args: list, grid: tuple[int, int, int]) -> None:
    """One launch of ``compiled`` with the program's own argument values, inside scope 'kernel'."""
    meta = compiled.metadata
    if getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0):
        raise RuntimeError("kernels that need Triton scratch memory are not handled by this benchmark")
    name = meta.name
    layout = param_layout(compiled.asm["cubin"], name)
    user = [a for a, p in zip(args, kernel.params) if not p.is_constexpr]
    if len(layout) < len(user):
        raise RuntimeError(f"{name}: {len(layout)} parameters, {len(user)} arguments")
    with replayfmt.CaptureWriter(path, overwrite=True) as w:
        dev = w.add_object(m.Device(name=torch.cuda.get_device_name()))
        buffers = {}
        for a in user:
            if isinstance(a, torch.Tensor) and a.data_ptr() not in buffers:
                host = a.detach().contiguous().cpu().view(torch.uint8).numpy()
                buffers[a.data_ptr()] = w.add_object(m.Buffer(size=host.nbytes, device=dev))
                w.copy_h2d(dst_buffer=buffers[a.data_ptr()], data=host)
        params = bytearray(max(o + s for o, s in layout))
        relocations = []
        for (offset, size), value in zip(layout, user):
            if isinstance(value, torch.Tensor):
                relocations.append(m.Relocation(0, buffers[value.data_ptr()], offset, 0))
            elif isinstance(value, float):
                params[offset : offset + size] = np.float32(value).tobytes()
            else:
                params[offset : offset + size] = int(value).to_bytes(size, "little", signed=True)
        function = m.Function(name=name, parameters_known=False)
        exe = w.add_object(
            m.Executable(
                format=m.ExecutableFormat.CUBIN, payload=w.add_payload(compiled.asm["cubin"]), functions=(function,)
            )
        )
        num_ctas = getattr(meta, "num_ctas", 1)
        with w.scope("kernel"):
            w.launch(
                executable=exe,
                function=0,
                grid=(grid[0] * num_ctas, grid[1], grid[2]),
                block=(32 * meta.num_warps, 1, 1),
                shared_memory=meta.shared,
                parameters=bytes(params),
                relocations=relocations,
                cluster=(num_ctas, 1, 1) if num_ctas > 1 else (0, 0, 0),
            )


def replay_median(path: Path, mode: str = "eager") -> float:
    with replayfmt.open(path) as cap:
        plan = build_plan(cap)
        with Replayer(plan, ReplayOptions(uploads_from_host=True)) as r:
            options = BenchmarkOptions(scope="kernel", warmup=5, repetitions=ITERATIONS, flush_l2=True, mode=mode)
            return Benchmark(r, find_region(cap, "kernel"), options).run().device_ms.median


def cases():
    n = 64 << 20
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    yield ("copy 256 MiB", copy_kernel, [src, dst, n, 4096], (triton.cdiv(n, 4096), 1, 1))
    rows, cols = 16384, 4096
    x = torch.randn(rows, cols, device="cuda")
    y = torch.empty_like(x)
    yield ("softmax 16384x4096", softmax_kernel, [y, x, x.stride(0), y.stride(0), cols, 4096], (rows, 1, 1))
    size = 4096
    a = torch.randn(size, size, device="cuda", dtype=torch.float16)
    b = torch.randn(size, size, device="cuda", dtype=torch.float16)
    c = torch.empty(size, size, device="cuda", dtype=torch.float16)
    yield (
        "matmul 4096^3 fp16",
        matmul_kernel,
        [
            a,
            b,
            c,
            size,
            size,
            size,
            a.stride(0),
            a.stride(1),
            b.stride(0),
            b.stride(1),
            c.stride(0),
            c.stride(1),
            128,
            128,
            64,
        ],
        (size // 128, size // 128, 1),
    )


def graph_overhead(directory: Path) -> tuple[float, float]:
    """Per-launch device time: benchmark-replay --mode=graph vs a natively captured CUDA graph."""
    sys.path.insert(0, str(Path(__file__).parent))
    from replay_bench import EMPTY, compile_empty, device_arch

    cubin = compile_empty(device_arch())
    launches = 1000
    path = directory / "graph.kreplay"
    with replayfmt.CaptureWriter(path, overwrite=True) as w:
        dev = w.add_object(m.Device(name="bench"))
        stream = w.add_object(m.Stream(device=dev, flags=1))
        buf = w.add_object(m.Buffer(size=256, device=dev))
        exe = w.add_object(
            m.Executable(format=m.ExecutableFormat.CUBIN, payload=w.add_payload(cubin), functions=(EMPTY,))
        )
        with w.scope("launches"):
            for _ in range(launches):
                w.launch(
                    executable=exe,
                    function=0,
                    grid=(1, 1, 1),
                    block=(32, 1, 1),
                    stream=stream,
                    parameters=bytes(12) + bytes(4),
                    relocations=[m.Relocation(0, buf, 0, 0)],
                )
    cu = driver()
    with replayfmt.open(path) as cap:
        plan = build_plan(cap)
        with Replayer(plan, ReplayOptions()) as r:
            options = BenchmarkOptions(scope="launches", warmup=3, repetitions=20, mode="graph")
            ours = Benchmark(r, find_region(cap, "launches"), options).run().device_ms.median / launches
            # native: the same kernel, 1000 launches captured straight from cuda-python
            function = r.functions[(exe, 0)]
            native_stream = check(cu.cuStreamCreate(1), "stream")
            block = np.frombuffer(r.addresses[buf].to_bytes(8, "little") + bytes(8), np.uint8).copy()
            pointers = np.array([block.ctypes.data, block.ctypes.data + 8], np.uint64)
            check(
                cu.cuStreamBeginCapture(native_stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL), "capture"
            )
            for _ in range(launches):
                check(
                    cu.cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, native_stream, pointers.ctypes.data, 0), "launch"
                )
            graph = check(cu.cuStreamEndCapture(native_stream), "capture")
            executable = check(cu.cuGraphInstantiate(graph, 0), "instantiate")
            start, end = check(cu.cuEventCreate(0), "event"), check(cu.cuEventCreate(0), "event")
            times = []
            for _ in range(23):
                check(cu.cuEventRecord(start, native_stream), "record")
                check(cu.cuGraphLaunch(executable, native_stream), "graph")
                check(cu.cuEventRecord(end, native_stream), "record")
                check(cu.cuStreamSynchronize(native_stream), "sync")
                times.append(check(cu.cuEventElapsedTime(start, end), "elapsed"))
            native = float(np.median(times[3:])) / launches
    return ours, native


def recorded(goals: Goals) -> None:
    """Section 3: each program in a process of its own (the recorder must listen first)."""
    script = Path(__file__).with_name("fidelity_recorded.py")
    for program in ("resnet", "softmax"):
        done = subprocess.run([sys.executable, str(script), program, "--check"])
        goals.judge(f"{program} (fidelity_recorded.py)", done.returncode == 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recorded", action="store_true", help="also replay recorded captures of real programs")
    parser.add_argument("--only-recorded", action="store_true", help="only the recorded captures (section 3)")
    add_check(parser)
    args = parser.parse_args()
    goals = Goals()
    if not args.only_recorded:
        synthetic(goals)
    if args.recorded or args.only_recorded:
        recorded(goals)
    return goals.exit_status(args.check)


def synthetic(goals: Goals) -> None:
    torch.cuda.init()
    print(f"{torch.cuda.get_device_name()}, triton {triton.__version__}, {ITERATIONS} timed iterations each")
    print(f"  {'kernel':<22}{'original ms':>12}{'replay ms':>12}{'diff':>9}   goal within +-5%")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        for label, kernel, args, grid in cases():
            handle = kernel[grid](*args)
            compiled = compiled_of(kernel, handle)
            original = original_median(lambda kernel=kernel, args=args, grid=grid: kernel[grid](*args))
            path = directory / "k.kreplay"
            write_capture(path, kernel, compiled, args, grid)
            replayed = replay_median(path)
            diff = 100 * (replayed - original) / original
            verdict = goals.judge(label, abs(diff) <= 5)
            print(f"  {label:<22}{original:>12.4f}{replayed:>12.4f}{diff:>8.1f}%   {verdict}")
        ours, native = graph_overhead(directory)
    ratio = ours / native
    print(
        f"\ngraph mode, 1000 empty launches: {1e3 * ours:.3f} us/launch replayed, {1e3 * native:.3f} us/launch "
        f"native graph: {ratio:.2f}x   goal <= 2x  {goals.judge('graph mode', ratio <= 2)}"
    )


if __name__ == "__main__":
    sys.exit(main())
