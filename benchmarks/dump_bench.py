"""dump-replay speed (issue: dump-replay), measured on a generated capture in one run.

    python benchmarks/dump_bench.py [--operations 1000000] [--check]

Goals on a 1,000,000-operation capture: JSONL at >= 200,000 rows/s; the text summary in <= 1 s.
The capture mixes launches of a kernel with a known parameter layout (decoded in every row),
host-to-device copies, memsets and event edges, as a real model step does. Both commands run in
a subprocess, writing to /dev/null, exactly as a user would run them. Beside JSONL, in the same
run: the bare json library writing as many rows of the same shape (a launch row's dict built and
json.dumps'd per row, no file to read) from a subprocess to /dev/null. ``--check`` exits 1 when a
goal is missed.
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
                i = w.launch(
                    executable=exe,
                    function=0,
                    grid=(16, 1, 1),
                    block=(1024, 1, 1),
                    parameters=params,
                    relocations=relocations,
                    stream=s1,
                )
            i += 1


# The baseline: rows shaped like a launch row, built and encoded by the json library alone.
BARE_JSON = """
import json, sys
rows, out, pending = int(sys.argv[1]), sys.stdout, []
encode = json.JSONEncoder(separators=(",", ":")).encode
reloc = [{"site_buffer": 0, "site_offset": 8, "target_buffer": 5, "target_offset": 0, "kind": "pointer"},
         {"site_buffer": 0, "site_offset": 16, "target_buffer": 6, "target_offset": 0, "kind": "pointer"}]
for i in range(rows):
    pending.append(encode({"kind": "launch", "index": i, "executable": 7, "function": "saxpy",
        "function_index": 0, "stream": 2, "grid": [16, 1, 1], "block": [1024, 1, 1], "cluster": [0, 0, 0],
        "shared_memory": 0, "flags": 0, "parameters": {"a": i * 0.5, "x": {"buffer": 5, "offset": 0},
        "y": {"buffer": 6, "offset": 0}, "n": 4096}, "relocations": reloc}))
    if len(pending) >= 4096:
        out.write("\\n".join(pending) + "\\n")
        pending.clear()
out.write("\\n".join(pending) + "\\n")
"""


def timed(args: list[str]) -> float:
    start = time.perf_counter()
    with open("/dev/null", "wb") as sink:
        subprocess.run(args, stdout=sink, check=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operations", type=int, default=1_000_000)
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dump.kreplay"
        build(path, args.operations)
        with replayfmt.open(path) as cap:
            rows = 2 + cap.operation_count + cap.object_count
        dump = [sys.executable, "-m", "replayfmt_tools.dump_replay"]
        startup = timed([sys.executable, "-c", "import replayfmt_tools.dump_replay"])
        jsonl = timed([*dump, "--format=jsonl", str(path)])
        summary = timed([*dump, "--format=json", str(path)])
        text_summary = timed([*dump, "--summary", str(path)])
        bare = timed([sys.executable, "-c", BARE_JSON, str(rows)])
    rate, bare_rate = rows / jsonl, rows / bare
    print(f"capture: {args.operations:,} operations, {rows:,} JSONL rows; interpreter + import {startup:.2f} s")
    jsonl_ok, summary_ok, text_ok = rate >= 200_000, summary <= 1, text_summary <= 1
    print(
        f"  jsonl         {jsonl:6.2f} s {rate:>10,.0f} rows/s   goal >= 200,000 rows/s   "
        f"bare json {bare_rate:>9,.0f} rows/s   {'ok' if jsonl_ok else 'MISSED'}"
    )
    print(f"  json summary  {summary:6.2f} s   goal <= 1 s  {'ok' if summary_ok else 'MISSED'}")
    print(f"  text summary  {text_summary:6.2f} s   goal <= 1 s  {'ok' if text_ok else 'MISSED'}")
    if args.check and not (jsonl_ok and summary_ok and text_ok):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
