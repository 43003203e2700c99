"""Container benchmarks (issue: the .kreplay container), measured side by side in one run.

    python benchmarks/format_bench.py [--launches 1000000] [--payload-mib 1024] [--dedup-mib 256] [--check]

1. write N launch records (4 parameters, 2 relocations each), open, iterate all
   (goals for N = 1,000,000: write <= 3 s, open <= 0.5 s, iterate <= 3 s), each beside a bare
   baseline in the same run: the same Python call per launch packing the same structs into a
   bytearray (no lock, no batches, no file), and struct.iter_unpack building the same records
   from those bytes (no file, no checks);
2. payload throughput writing and reading a mix of fp32 noise, bf16 weight-like data and
   ReLU-sparse activations, against bare zstandard at the same level on the same data
   (goal >= 0.8x both ways);
3. dedup: the same payload written 10 times grows the file by <= 1% after the first.

Every line prints the figure, the goal and the baseline; ``--check`` exits 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import gc
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zstandard

import replayfmt
from replayfmt.format import model as m

LEVEL = 3


def bench_launches(directory: Path, count: int) -> dict[str, float]:
    path = directory / "launches.kreplay"
    params = np.array([1.5], np.float32).tobytes() + bytes(4) + bytes(16) + np.int32(7).tobytes() + bytes(4)
    start = time.perf_counter()
    with replayfmt.CaptureWriter(path) as w:
        exe = w.add_object(m.Executable(functions=(m.Function(name="kernel"),)))
        x = w.add_object(m.Buffer(size=1 << 20))
        y = w.add_object(m.Buffer(size=1 << 20))
        relocations = (m.Relocation(0, x, 8, 0), m.Relocation(0, y, 16, 0))
        launch = w.launch
        for i in range(count):
            launch(
                executable=exe,
                function=0,
                grid=(i & 1023, 1, 1),
                block=(256, 1, 1),
                parameters=params,
                relocations=relocations,
            )
    write_s = time.perf_counter() - start
    start = time.perf_counter()
    cap = replayfmt.open(path)
    open_s = time.perf_counter() - start
    start = time.perf_counter()
    seen = 0
    for _ in cap.iter_operations():
        seen += 1
    iterate_s = time.perf_counter() - start
    cap.close()
    assert seen == count + 3
    return {"write_s": write_s, "open_s": open_s, "iterate_s": iterate_s, "file_mb": path.stat().st_size / 1e6}


def bench_bare_launches(count: int) -> dict[str, float]:
    """The floor under the launch figures: the same call per launch with the same arguments,
    packing the same LaunchRecord and Relocation structs into bytearrays; then the same records
    rebuilt from those bytes with struct.iter_unpack, one Python loop."""
    record, relocation = struct.Struct("<18I"), struct.Struct("<IIQQB7x")
    launches, relocation_bytes, parameter_bytes = bytearray(), bytearray(), bytearray()

    def launch(
        *,
        executable: int,
        function: int,
        grid: m.Dims,
        block: m.Dims,
        parameters: bytes = b"",
        relocations: tuple = (),
        stream: int = 0,
        cluster: m.Dims = (0, 0, 0),
        shared_memory: int = 0,
        flags: int = 0,
    ) -> int:
        launches.extend(
            record.pack(
                executable,
                function,
                stream,
                flags,
                *grid,
                *block,
                *cluster,
                shared_memory,
                len(parameter_bytes),
                len(parameters),
                len(relocation_bytes) // 32,
                len(relocations),
            )
        )
        parameter_bytes.extend(parameters)
        for r in relocations:
            relocation_bytes.extend(relocation.pack(*r))
        return 0

    params = np.array([1.5], np.float32).tobytes() + bytes(4) + bytes(16) + np.int32(7).tobytes() + bytes(4)
    relocations = (m.Relocation(0, 2, 8, 0), m.Relocation(0, 3, 16, 0))
    start = time.perf_counter()
    for i in range(count):
        launch(
            executable=1,
            function=0,
            grid=(i & 1023, 1, 1),
            block=(256, 1, 1),
            parameters=params,
            relocations=relocations,
        )
    write_s = time.perf_counter() - start
    gc.disable()  # as the reader does while it builds a batch's records
    start = time.perf_counter()
    rel = list(relocation.iter_unpack(relocation_bytes))
    ops = []
    for i, (exe, fn, stream, flags, gx, gy, gz, bx, by, bz, cx, cy, cz, smem, po, ps, ro, rc) in enumerate(
        record.iter_unpack(launches)
    ):
        group = tuple(m.Relocation(*r) for r in rel[ro : ro + rc])
        ops.append(
            m.Launch(
                i,
                exe,
                fn,
                stream,
                (gx, gy, gz),
                (bx, by, bz),
                (cx, cy, cz),
                smem,
                flags,
                bytes(parameter_bytes[po : po + ps]),
                group,
            )
        )
    iterate_s = time.perf_counter() - start
    gc.enable()
    assert len(ops) == count
    return {"write_s": write_s, "iterate_s": iterate_s}


def gpu_like_data(total_bytes: int, seed: int = 0) -> list[np.ndarray]:
    """Thirds of fp32 noise, bf16 weight-like values and ReLU-sparse fp32 activations."""
    rng = np.random.default_rng(seed)
    third = total_bytes // 3 // 4 * 4
    noise = rng.standard_normal(third // 4, dtype=np.float32)
    weights = (rng.standard_normal(third // 2, dtype=np.float32) * 0.02).view(np.uint32) >> 16
    weights = weights.astype(np.uint16)
    activations = np.maximum(rng.standard_normal(third // 4, dtype=np.float32) - 1.3, 0)
    return [noise, weights, activations]


def bench_payloads(directory: Path, total_bytes: int) -> dict[str, float]:
    parts = gpu_like_data(total_bytes)
    logical = sum(p.nbytes for p in parts)

    # bare zstandard: the whole buffer through one compressor using every core, then back
    cctx = zstandard.ZstdCompressor(level=LEVEL, threads=-1)
    start = time.perf_counter()
    packed = [cctx.compress(p) for p in parts]
    bare_write = time.perf_counter() - start
    dctx = zstandard.ZstdDecompressor()
    start = time.perf_counter()
    for blob, p in zip(packed, parts):
        out = dctx.decompress(blob, max_output_size=p.nbytes)
        assert len(out) == p.nbytes
    bare_read = time.perf_counter() - start
    bare_stored = sum(len(b) for b in packed)
    del packed

    path = directory / "payloads.kreplay"
    start = time.perf_counter()
    with replayfmt.CaptureWriter(path, compression=replayfmt.CompressionPolicy(level=LEVEL)) as w:
        ids = [w.add_payload(p) for p in parts]
    ours_write = time.perf_counter() - start
    with replayfmt.open(path) as cap:
        targets = [bytearray(p.nbytes) for p in parts]
        start = time.perf_counter()
        for pid, target in zip(ids, targets):
            cap.read_payload_into(pid, target)
        ours_read = time.perf_counter() - start
        stats = cap.payload_stats()
    for p, target in zip(parts, targets):
        assert memoryview(target) == memoryview(p).cast("B")
    return {
        "logical_mb": logical / 1e6,
        "bare_write_gbs": logical / bare_write / 1e9,
        "ours_write_gbs": logical / ours_write / 1e9,
        "bare_read_gbs": logical / bare_read / 1e9,
        "ours_read_gbs": logical / ours_read / 1e9,
        "bare_ratio": logical / bare_stored,
        "ours_ratio": logical / stats.stored_bytes,
    }


def bench_dedup(directory: Path, size: int) -> dict[str, float]:
    data = np.random.default_rng(5).standard_normal(size // 4, dtype=np.float32)
    path = directory / "dedup.kreplay"
    with replayfmt.CaptureWriter(path) as w:
        first = w.add_payload(data)
        w.flush()
        after_first = path.stat().st_size
        for _ in range(9):
            assert w.add_payload(data) == first
            w.copy_h2d(dst_buffer=0, payload=first, size=data.nbytes)
    final = path.stat().st_size
    return {
        "after_first_mb": after_first / 1e6,
        "final_mb": final / 1e6,
        "growth_pct": 100 * (final - after_first) / after_first,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=1_000_000)
    parser.add_argument("--payload-mib", type=int, default=1024)
    parser.add_argument("--dedup-mib", type=int, default=256)
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    args = parser.parse_args()
    missed: list[str] = []

    def verdict(name: str, ok: bool) -> str:
        if not ok:
            missed.append(name)
        return "ok" if ok else "MISSED"

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, zstd level {LEVEL}")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        directory = Path(tmp)
        bare = bench_bare_launches(args.launches)
        r = bench_launches(directory, args.launches)
        scale = args.launches / 1_000_000  # the goals are for a million launches
        print(f"\n{args.launches:,} launches (4 params, 2 relocations each), file {r['file_mb']:.1f} MB")
        print(f"  {'':8}{'replayfmt':>10}{'goal':>10}{'bare':>9}   (bare: the same call packing the same structs)")
        for name, figure, goal, base in (
            ("write", r["write_s"], 3 * scale, bare["write_s"]),
            ("open", r["open_s"], 0.5, None),
            ("iterate", r["iterate_s"], 3 * scale, bare["iterate_s"]),
        ):
            base_text = f"{base:7.2f} s" if base is not None else f"{'-':>9}"
            print(f"  {name:8}{figure:8.2f} s <= {goal:5.2f} s{base_text}   {verdict(name, figure <= goal)}")

        p = bench_payloads(directory, args.payload_mib << 20)
        write_ratio = p["ours_write_gbs"] / p["bare_write_gbs"]
        read_ratio = p["ours_read_gbs"] / p["bare_read_gbs"]
        print(f"\npayloads: {p['logical_mb']:.0f} MB of fp32 noise + bf16 weights + ReLU activations")
        print(f"  {'':10}{'bare zstd':>12}{'replayfmt':>12}{'ratio':>8}   goal")
        for name, bare, ours, ratio in (
            ("write", p["bare_write_gbs"], p["ours_write_gbs"], write_ratio),
            ("read", p["bare_read_gbs"], p["ours_read_gbs"], read_ratio),
        ):
            ok = verdict(f"payload {name}", ratio >= 0.8)
            print(f"  {name:10}{bare:>9.2f} GB/s{ours:>7.2f} GB/s{ratio:>7.2f}x   >= 0.8x {ok}")
        print(f"  {'size ratio':10}{p['bare_ratio']:>10.3f}x{p['ours_ratio']:>11.3f}x")

        d = bench_dedup(directory, args.dedup_mib << 20)
        print(f"\ndedup: {args.dedup_mib} MiB payload written 10 times")
        print(
            f"  file after first {d['after_first_mb']:.1f} MB, after ten {d['final_mb']:.1f} MB: "
            f"+{d['growth_pct']:.4f}%   goal <= 1% {verdict('dedup', d['growth_pct'] <= 1)}"
        )
    if missed:
        print(f"\nmissed: {', '.join(missed)}")
    return 1 if missed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
