"""run-replay speed, on a GPU (issue: run-replay), measured side by side in one run.

    python benchmarks/replay_bench.py [--launches 20000] [--upload-mib 1024]

1. Host overhead per launch: a 20,000-launch capture of an empty kernel replayed by the Replayer,
   against raw cuda-python cuLaunchKernel with pre-packed parameters over the same launches
   (goal: <= 1.25x). Both are timed from the first launch to the end of a final synchronisation.
2. Upload bandwidth: a 1 GiB payload taken from the capture file (in the page cache) to the
   device: frames read in parallel into a ring of pinned slots, each uploaded as it arrives,
   against a bare pinned cuMemcpyHtoD of the same bytes (goal for payloads stored raw: >= 50%).
   Printed: the staging pipeline's rate (with and without hashing each frame), the same
   including setup (thread pool, pinned ring) and the first run, and the rate of later runs.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import replayfmt
from replayfmt import model as m
from replayfmt.cuda import check, compute_capability, driver
from replayfmt.execute import Replayer, ReplayOptions
from replayfmt.plan import build_plan

HERE = Path(__file__).resolve().parent
EMPTY = m.Function(
    name="empty",
    parameters=(m.Parameter(offset=0, size=8, kind=m.ParameterKind.POINTER),
                m.Parameter(offset=8, size=4, kind=m.ParameterKind.VALUE, dtype=m.DType.INT32)),
    parameters_known=True,
)  # fmt: skip


def compile_empty(arch: str) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "empty.cubin"
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        subprocess.run(
            [nvcc, "-cubin", f"-arch={arch}", "-o", str(out), str(HERE / "kernels" / "empty.cu")], check=True
        )
        return out.read_bytes()


def device_arch() -> str:
    major, minor = compute_capability(check(driver().cuDeviceGet(0), "cuDeviceGet"))
    return f"sm_{major}{minor}"


def bench_launches(directory: Path, cubin: bytes, count: int) -> dict[str, float]:
    path = directory / "launches.kreplay"
    with replayfmt.CaptureWriter(path) as w:
        dev = w.add_object(m.Device(name="bench"))
        stream = w.add_object(m.Stream(device=dev, flags=1))
        buf = w.add_object(m.Buffer(size=256, device=dev))
        exe = w.add_object(
            m.Executable(format=m.ExecutableFormat.CUBIN, payload=w.add_payload(cubin), functions=(EMPTY,))
        )
        for i in range(count):
            w.launch(
                executable=exe,
                function=0,
                grid=(1, 1, 1),
                block=(32, 1, 1),
                stream=stream,
                parameters=bytes(8) + i.to_bytes(4, "little") + bytes(4),
                relocations=[m.Relocation(0, buf, 0, 0)],
            )
    cu = driver()
    with replayfmt.open(path) as cap:
        plan = build_plan(cap)
        with Replayer(plan, ReplayOptions()) as replayer:
            replayer.run(1)  # warm-up
            # raw: the same launches, pre-packed, straight through cuda-python
            function = replayer.functions[(exe, 0)]
            raw_stream = replayer.streams[stream]
            device_ptr = replayer.addresses[buf]
            packed = [device_ptr.to_bytes(8, "little") + i.to_bytes(4, "little") + bytes(4) for i in range(count)]
            blocks = [np.frombuffer(b, np.uint8).copy() for b in packed]
            arrays = [np.array([b.ctypes.data, b.ctypes.data + 8], np.uint64) for b in blocks]
            params = [a.ctypes.data for a in arrays]
            launch = cu.cuLaunchKernel
            for p in params[:100]:
                launch(function, 1, 1, 1, 32, 1, 1, 0, raw_stream, p, 0)
            check(cu.cuCtxSynchronize(), "sync")
            ratios = []
            raw_times, replay_times = [], []
            for _ in range(5):
                start = time.perf_counter()
                for p in params:
                    (err,) = launch(function, 1, 1, 1, 32, 1, 1, 0, raw_stream, p, 0)
                    if err != cu.CUresult.CUDA_SUCCESS:
                        raise RuntimeError(err)
                check(cu.cuCtxSynchronize(), "sync")
                raw = time.perf_counter() - start
                start = time.perf_counter()
                replayer.run(1)
                replay = time.perf_counter() - start
                raw_times.append(raw)
                replay_times.append(replay)
                ratios.append(replay / raw)
    return {"raw_us": 1e6 * min(raw_times) / count, "replay_us": 1e6 * min(replay_times) / count,
            "ratio": float(np.median(ratios))}  # fmt: skip


def bench_upload(directory: Path, size: int) -> dict[str, float]:
    cu = driver()
    # the process keeps its CUDA context, as a program that uses CUDA does: context creation is
    # not upload time (each Replayer would otherwise create and destroy the primary context)
    device = check(cu.cuDeviceGet(0), "cuDeviceGet")
    check(cu.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
    try:
        return _bench_upload(directory, size)
    finally:
        cu.cuDevicePrimaryCtxRelease(device)


def _bench_upload(directory: Path, size: int) -> dict[str, float]:
    cu = driver()
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 2**32, size // 4, dtype=np.uint32)  # stored raw (incompressible)
    sparse = np.maximum(rng.standard_normal(size // 4, dtype=np.float32) - 1.3, 0)  # stored zstd
    results: dict[str, float] = {}
    for name, data in (("raw", noise), ("zstd", sparse)):
        path = directory / f"upload_{name}.kreplay"
        with replayfmt.CaptureWriter(path, overwrite=True) as w:
            dev = w.add_object(m.Device(name="bench"))
            buf = w.add_object(m.Buffer(size=data.nbytes, device=dev))
            w.copy_h2d(dst_buffer=buf, data=data)
        os.sync()
        with replayfmt.open(path) as cap:
            plan = build_plan(cap)
            for checked in (True, False):
                start = time.perf_counter()
                replayer = Replayer(plan, ReplayOptions(check_payloads=checked))
                with replayer:
                    replayer.run(1)
                    first = time.perf_counter() - start  # file to device: setup (read + upload) and one run
                    suffix = "" if checked else "_unchecked"
                    results[f"{name}{suffix}_pipeline_gbs"] = replayer.staging.gbs
                    results[f"{name}{suffix}_end_to_end_gbs"] = data.nbytes / first / 1e9
                    phases = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in replayer.setup_seconds.items())
                    ring_ms = replayer.staging.setup_seconds * 1e3
                    print(f"  [{name}{suffix}] setup: {phases}; staging ring and pool {ring_ms:.0f} ms; "
                          f"first run {first * 1e3:.0f} ms in all")  # fmt: skip
                    if not checked:
                        continue
                    copy_ms = min(replayer.run(1).device_ms[0] for _ in range(3))  # later runs: staged copy only
                    host = check(cu.cuMemHostAlloc(data.nbytes, 0), "pinned")
                    ctypes.memmove(host, data.ctypes.data, data.nbytes)
                    bare = []
                    for _ in range(3):
                        start = time.perf_counter()
                        check(cu.cuMemcpyHtoD(replayer.addresses[buf], host, data.nbytes), "bare copy")
                        bare.append(time.perf_counter() - start)
                    check(cu.cuMemFreeHost(host), "free")
        results[f"{name}_copy_gbs"] = data.nbytes / (copy_ms / 1e3) / 1e9
        results["bare_gbs"] = data.nbytes / min(bare) / 1e9
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=20_000)
    parser.add_argument("--upload-mib", type=int, default=1024)
    args = parser.parse_args()
    arch = device_arch()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        directory = Path(tmp)
        r = bench_launches(directory, compile_empty(arch), args.launches)
        verdict = "ok" if r["ratio"] <= 1.25 else "MISSED"
        print(f"{arch}, {args.launches:,} launches of an empty kernel")
        print(f"  raw cuLaunchKernel (pre-packed)  {r['raw_us']:.2f} us/launch")
        print(f"  Replayer.run                     {r['replay_us']:.2f} us/launch")
        print(f"  ratio (median of 5)              {r['ratio']:.3f}x   goal <= 1.25x  {verdict}")
        u = bench_upload(directory, args.upload_mib << 20)
        print(f"\nupload of {args.upload_mib} MiB (bare pinned cuMemcpyHtoD: {u['bare_gbs']:.1f} GB/s)")
        bare = u["bare_gbs"]
        for name in ("raw", "zstd"):
            for suffix, how in (("", "frames hashed"), ("_unchecked", "--no-payload-checks")):
                pipeline, total = u[f"{name}{suffix}_pipeline_gbs"], u[f"{name}{suffix}_end_to_end_gbs"]
                goal = ("   goal >= 50%  " + ("ok" if pipeline >= 0.5 * bare else "MISSED")) if name == "raw" else ""
                print(f"  stored {name:4}, {how:19}: staging {pipeline:5.1f} GB/s = {pipeline / bare:4.0%} of bare"
                      f"{goal}; with setup and first run {total:5.1f} GB/s = {total / bare:4.0%}")  # fmt: skip
            print(f"  stored {name:4}: later runs (from the device-resident copy) {u[f'{name}_copy_gbs']:.0f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
