"""dump-replay speed (issue: dump-replay), measured on a generated capture in one run.

    python benchmarks/dump_bench.py [--operations 1000000]

Goals on a 1,000,000-operation capture: JSONL at >= 200,000 rows/s; the text summary in <= 1 s.
The capture mixes launches of a kernel with a known parameter layout (decoded in every row),
host-to-device copies, memsets and event edges, as a real model step does. Both commands run in
a subprocess, writing to /dev/null, exactly as a user would run them.
"""

from __future__ import annotations

import argparse
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import replayfmt
from replayfmt.format import model as m

SAXPY = m.Function(
    name="saxpy",
    parameters=(
        m.Parameter(offset=0, size=4, kind=m.ParameterKind.VALUE, name="a", dtype=m.DType.FLOAT32),
        m.Parameter(offset=8, size=8, kind=m.ParameterKind.POINTER, name="x"),
        m.Parameter(offset=16, size=8, kind=m.ParameterKind.POINTER, name="y"),
        m.Parameter(offset=24, size=4, kind=m.ParameterKind.VALUE, name="n", dtype=m.DType.INT32),
    ),
    parameters_known=True,
)


def build(path: Path, operations: int) -> None:
    tail = bytes(16) + np.int32(4096).tobytes() + bytes(4)
    with replayfmt.CaptureWriter(path) as w:
        dev = w.add_object(m.Device(name="bench"))
        s1, s2 = w.add_object(m.Stream(device=dev)), w.add_object(m.Stream(device=dev))
        ev = w.add_object(m.Event(device=dev))
        x = w.add_object(m.Buffer(size=1 << 16, device=dev, dtype=m.DType.FLOAT32, shape=(1 << 14,)))
        y = w.add_object(m.Buffer(size=1 << 16, device=dev, dtype=m.DType.FLOAT32, shape=(1 << 14,)))
        exe = w.add_object(
            m.Executable(format=m.ExecutableFormat.CUBIN, payload=w.add_payload(b"\x7fELF"), functions=(SAXPY,))
        )
        upload = w.add_payload(np.arange(1 << 14, dtype=np.float32))
        relocations = (m.Relocation(0, x, 8, 0), m.Relocation(0, y, 16, 0))
        i = w.operation_count
        while i < operations:
            phase = i % 16
            if phase == 0:
                i = w.copy_h2d(dst_buffer=x, payload=upload, size=1 << 16, stream=s1)
            elif phase == 1:
                i = w.memset(buffer=y, value=0, count=1 << 14, element_size=4, stream=s1)
            elif phase == 14:
                i = w.event_record(ev, s1)
            elif phase == 15:
                i = w.stream_wait_event(s2, ev)
            else:
                params = struct.pack("<f4x", i * 0.5) + tail  # a different value in every launch
                i = w.launch(executable=exe, function=0, grid=(16, 1, 1), block=(1024, 1, 1), parameters=params,
                             relocations=relocations, stream=s1)  # fmt: skip
            i += 1


def timed(args: list[str]) -> float:
    start = time.perf_counter()
    with open("/dev/null", "wb") as sink:
        subprocess.run(args, stdout=sink, check=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operations", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dump.kreplay"
        build(path, args.operations)
        with replayfmt.open(path) as cap:
            rows = 2 + cap.operation_count + cap.object_count
        dump = [sys.executable, "-m", "replayfmt.tools.dump_replay"]
        startup = timed([sys.executable, "-c", "import replayfmt.tools.dump_replay"])
        jsonl = timed([*dump, "--format=jsonl", str(path)])
        summary = timed([*dump, "--format=json", str(path)])
        text_summary = timed([*dump, "--summary", str(path)])
    rate = rows / jsonl
    print(f"capture: {args.operations:,} operations, {rows:,} JSONL rows; interpreter + import {startup:.2f} s")
    verdict = "ok" if rate >= 200_000 else "MISSED"
    print(f"  jsonl         {jsonl:6.2f} s   {rate:>10,.0f} rows/s   goal >= 200,000 rows/s  {verdict}")
    print(f"  json summary  {summary:6.2f} s   goal <= 1 s  {'ok' if summary <= 1 else 'MISSED'}")
    print(f"  text summary  {text_summary:6.2f} s   goal <= 1 s  {'ok' if text_summary <= 1 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
