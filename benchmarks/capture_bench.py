"""Recorder overhead and snapshot bandwidth, measured side by side in one process (needs a GPU,
torch, triton and cupti-python).

Goals (issue 29's lighter recorder): at most 10 us a launch over the bare program, a first touch
that holds the program at 10 GB/s or better (it waits for the device, not for the disk), and the
pipeline writing fresh data at 90% or more of a bare file write from pinned memory.

1. Per-launch host overhead with snapshots off: a Triton launch and torch ``add_`` are timed
   (wall clock over N launches, then one synchronisation) in a child process without the
   recorder, then here inside a recording region whose buffers were already touched (no more
   snapshots). The recorder listens before any kernel loads, as it must.
2. Snapshot copies: a 1 GiB allocation's first touch in a region, against a bare pinned
   cuMemcpyDtoH of the same size into a pinned buffer; where the program was held (its stream,
   hashing and scanning, copying aside, handing frames to the writer), and the time Python's
   cyclic collector ran during the touch and in the program's next 50 calls (the recorder puts
   off, to the program's next allocation, a full collection its snapshot would set off).
3. The snapshot pipeline end to end (sync, device hash, copy, compress, write: timed until the
   writer has written every frame), beside a bare file write from pinned memory of the same size
   in the same run: fresh fp32 noise and fresh bf16 weight-like data (random, --snapshot-mib
   each; goal >= 90% of the bare write), and content the file already holds (the same buffer
   again; goal >= 50 GB/s).

    python benchmarks/capture_bench.py [--launches 20000] [--snapshot-mib 1024] [--check]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import cProfile
import ctypes
import dataclasses
import gc
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

import replayfmt
import replayfmt.capture
from replayfmt.capture.snapshots import CudaSnapshotDevice, Snapshotter
from replayfmt.cuda.driver import check, driver


@triton.jit
def bump(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1, mask=mask)


class CollectorClock:
    """The seconds Python's cyclic collector runs from now until :meth:`stop`."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._began = 0.0
        gc.callbacks.append(self._tick)

    def _tick(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._began

    def stop(self) -> float:
        gc.callbacks.remove(self._tick)
        return self.seconds


def per_launch(fn, launches: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(launches):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / launches * 1e6


def pinned_d2h(size: int) -> float:
    cu = driver()
    src = torch.ones(size // 4, device="cuda")
    host = check(cu.cuMemHostAlloc(size, 0), "cuMemHostAlloc")
    check(cu.cuMemcpyDtoH(host, src.data_ptr(), size), "warm-up")
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        check(cu.cuMemcpyDtoH(host, src.data_ptr(), size), "cuMemcpyDtoH")
        best = min(best, time.perf_counter() - start)
    check(cu.cuMemFreeHost(host), "cuMemFreeHost")
    return size / best / 1e9


def file_write(size: int, directory: Path, threads: int, frame_size: int) -> float:
    """GB/s of writing ``size`` bytes from pinned memory into one new file in ``directory`` as the
    writer does (os.pwritev of ``frame_size`` pieces on ``threads`` threads): the ceiling that
    the file system puts on the pipeline, whatever happens before the write."""
    cu = driver()
    host = check(cu.cuMemHostAlloc(size, 0), "cuMemHostAlloc")
    view = memoryview((ctypes.c_char * size).from_address(host)).cast("B")
    ctypes.memset(host, 0x5A, size)  # touched once, as pinned slots are
    path = directory / "bare-write.bin"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    try:
        with cf.ThreadPoolExecutor(threads) as pool:
            start = time.perf_counter()
            for _ in pool.map(lambda at: os.pwritev(fd, [view[at : at + frame_size]], at), range(0, size, frame_size)):
                pass
            elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()
        view.release()
        check(cu.cuMemFreeHost(host), "cuMemFreeHost")
    return size / elapsed / 1e9


def snapshot_pipeline(size: int, directory: Path) -> list[tuple[str, float, str]]:
    """(what, GB/s, detail) for the snapshot pipeline alone, end to end into a CaptureWriter."""
    cu = driver()
    stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
    snapshots = Snapshotter(CudaSnapshotDevice(cu, stream))
    generator = torch.Generator(device="cuda").manual_seed(0)
    fp32 = torch.randn(size // 4, device="cuda", generator=generator)
    bf16 = (torch.randn(size // 2, device="cuda", generator=generator) * 0.02).to(torch.bfloat16)
    results = []
    with replayfmt.CaptureWriter(directory / "snapshots.kreplay") as writer:
        threads = min(16, os.cpu_count() or 1)  # the writer's default, as the recorder uses it
        warm = torch.randn(64 << 20, device="cuda", generator=generator)  # 256 MiB: loads the digest
        snapshots.snapshot(warm.data_ptr(), warm.numel() * 4, None, writer)  # kernel, fills the slots
        writer.flush()
        del warm
        for name, tensor in (("fresh fp32", fp32), ("fresh bf16", bf16), ("held (fp32 again)", fp32)):
            torch.cuda.synchronize()
            copied, hashed = snapshots.stats.copied_bytes, snapshots.stats.hash_seconds
            start = time.perf_counter()
            snapshots.snapshot(tensor.data_ptr(), size, None, writer)
            returned = time.perf_counter() - start
            writer.flush()  # every frame compressed and written
            total = time.perf_counter() - start
            detail = (
                f"{(snapshots.stats.copied_bytes - copied) >> 20} MiB crossed, device hash "
                f"{snapshots.stats.hash_seconds - hashed:.3f} s, program held {returned:.3f} s "
                f"({size / returned / 1e9:.1f} GB/s), {threads} writer threads"
            )
            results.append((name, size / total / 1e9, detail))
    snapshots.close()
    snapshots.device.close()
    cu.cuStreamDestroy(stream)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=20000)
    parser.add_argument("--snapshot-mib", type=int, default=1024)
    parser.add_argument("--bare", action="store_true", help="time without the recorder; print JSON")
    parser.add_argument(
        "--profile", action="store_true", help="also profile the recorded launches and the first touch (cProfile)"
    )
    parser.add_argument(
        "--no-original-times",
        action="store_true",
        help="record without the original program's device times (CUPTI activity records)",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    args = parser.parse_args()
    missed = []
    if not args.bare:
        child = [sys.executable, __file__, "--bare", "--launches", str(args.launches), "--snapshot-mib", "16"]
        bare = json.loads(subprocess.run(child, check=True, capture_output=True, text=True).stdout)
        tmp = tempfile.TemporaryDirectory()
        rec = replayfmt.capture.record(
            Path(tmp.name) / "bench.kreplay", start=False, original_times=not args.no_original_times
        )
    x = torch.zeros(4096, device="cuda")
    big = torch.rand(args.snapshot_mib << 18, device="cuda")  # random data: never time all-zero copies

    def triton_launch() -> None:
        bump[(4,)](x, 4096, BLOCK=1024)

    def torch_add() -> None:
        x.add_(1)

    for fn in (triton_launch, torch_add):
        per_launch(fn, 200)  # compile and warm up outside the measurement
    if args.bare:
        print(json.dumps({fn.__name__: per_launch(fn, args.launches) for fn in (triton_launch, torch_add)}))
        return
    bandwidth = pinned_d2h(big.numel() * 4)

    with tmp:
        with rec.region("bench"):
            triton_launch()
            torch_add()  # first touch: x is snapshotted once
            recorded = {fn.__name__: per_launch(fn, args.launches) for fn in (triton_launch, torch_add)}
            if args.profile:
                profiler = cProfile.Profile()
                profiler.runcall(lambda: [per_launch(fn, 2000) for fn in (triton_launch, torch_add)])
                pstats.Stats(profiler).sort_stats("tottime").print_stats(18)
            before = rec.memory.copy_seconds, rec.memory.copied, rec.report.snapshot_seconds
            stats_before = dataclasses.replace(rec.memory.snapshot_stats)
            touch_profile = cProfile.Profile() if args.profile else None
            collections = CollectorClock()
            started = time.perf_counter()
            if touch_profile is not None:
                touch_profile.enable()
            big.add_(1)  # first touch of 1 GiB: one snapshot
            if touch_profile is not None:
                touch_profile.disable()
            touched = time.perf_counter() - started
            in_touch = collections.seconds
            for _ in range(50):  # the program goes on: a collection put off by the recorder runs here
                torch_add()
            torch.cuda.synchronize()
            after_touch = collections.stop() - in_touch
            if touch_profile is not None:
                pstats.Stats(touch_profile).sort_stats("cumtime").print_stats(45)
            stats_after = rec.memory.snapshot_stats
            set_aside = stats_after.set_aside > stats_before.set_aside
            phases = {
                name: getattr(stats_after, f"{name}_seconds") - getattr(stats_before, f"{name}_seconds")
                for name in ("wait", "hash", "aside", "copy")
            }
            copy_seconds = rec.memory.copy_seconds - before[0]
            copied = rec.memory.copied - before[1]
            snapshot_seconds = rec.report.snapshot_seconds - before[2]
        report = rec.close()
        size = Path(tmp.name, "bench.kreplay").stat().st_size

    print(f"device: {torch.cuda.get_device_name()}, {args.launches} launches each")
    for name in bare:
        overhead = recorded[name] - bare[name]
        if overhead > 10:
            missed.append(f"{name} overhead")
        print(
            f"{name:>14}: bare {bare[name]:6.2f} us/launch, recorded {recorded[name]:6.2f} us/launch, "
            f"overhead {overhead:+6.2f} us ({recorded[name] / bare[name]:.2f}x)  [goal <= 10 us, a lighter recorder]"
        )
    if not copied:
        sys.exit(f"no snapshot was taken: {report.lines()}")
    held_rate = copied / copy_seconds / 1e9
    if held_rate < 10:
        missed.append("first touch held")
    path = "copied aside on the device" if set_aside else "NOT copied aside: through the pinned slots"
    print(
        f"recorder's first touch of {copied >> 20} MiB (pointer scan on, as by default): program held "
        f"{held_rate:.1f} GB/s [goal >= 10 GB/s] ({path}), whole snapshot "
        f"{copied / snapshot_seconds / 1e9:.1f} GB/s, first touch {copied / touched / 1e9:.1f} GB/s; "
        f"bare pinned cuMemcpyDtoH {bandwidth:.1f} GB/s"
    )
    print(
        f"  Python's cyclic collector: {1e3 * in_touch:.1f} ms during the touch, {1e3 * after_touch:.1f} ms in the "
        "program's next 50 calls (the recorder puts off a collection its snapshot would set off)"
    )
    print(
        f"  held for: the program's stream {1e3 * phases['wait']:.1f} ms, hashing and scanning on the device "
        f"{1e3 * phases['hash']:.1f} ms, copying aside {1e3 * phases['aside']:.1f} ms, handing the frames to the "
        f"writer {1e3 * (phases['copy'] - phases['aside']):.1f} ms"
    )
    print(f"capture: {report.operations} operations, {size >> 20} MiB on disk (compression ran on writer threads)")

    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        pipeline = snapshot_pipeline(args.snapshot_mib << 20, Path(tmp))
        threads = min(16, os.cpu_count() or 1)
        ceiling = file_write(args.snapshot_mib << 20, Path(tmp), threads, 4 << 20)
        print(
            f"snapshot pipeline end to end, {args.snapshot_mib} MiB each, into {tmp}; bare pinned copy "
            f"{bandwidth:.1f} GB/s, bare file write from pinned memory {ceiling:.1f} GB/s ({threads} threads, "
            "4 MiB pwritev, no recorder), this run:"
        )
        for name, rate, detail in pipeline:
            # content the file holds never reaches the disk; fresh content is written as fast as
            # the file system takes it (the program does not wait for it: see the first touch above)
            goal = 50 if name.startswith("held") else 0.9 * ceiling
            if rate < goal:
                missed.append(name)
            verdict = "ok" if rate >= goal else "MISSED"
            share = "" if name.startswith("held") else f", {rate / ceiling:.0%} of the bare file write"
            print(f"  {name:18} {rate:6.1f} GB/s  goal >= {goal:.1f} GB/s  {verdict}   ({detail}{share})")
    if missed:
        print(f"missed: {', '.join(missed)}")
        if args.check:
            sys.exit(1)


if __name__ == "__main__":
    main()
