"""Build examples/saxpy.kreplay: saxpy compiled from examples/kernels/saxpy.cu, with its inputs,
one launch inside a "saxpy" scope, and the expected output as a checkpoint.

    python examples/make_saxpy_capture.py [--arch sm_90] [--force]

Needs nvcc (no GPU): the capture is written with the writer, as a recorder would write it. The
result replays on any GPU that can run the chosen architecture (sm_90: H100, H200).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import replayfmt
from replayfmt.format import model as m

HERE = Path(__file__).resolve().parent
N = 1 << 12
A = 2.5


def compile_cubin(arch: str) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "saxpy.cubin"
        subprocess.run(
            ["nvcc", "-cubin", f"-arch={arch}", "-O3", "-o", str(out), str(HERE / "kernels" / "saxpy.cu")], check=True
        )
        return out.read_bytes()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--output", type=Path, default=HERE / "saxpy.kreplay")
    parser.add_argument("--force", action="store_true", help="replace an existing output file")
    args = parser.parse_args()
    if args.output.exists() and not args.force:  # before the compile: say so at once
        parser.exit(2, f"{parser.prog}: error: {args.output} already exists; pass --force to replace it\n")
    arch = re.fullmatch(r"sm_(\d+)(\d)a?", args.arch)
    if arch is None:
        parser.exit(2, f"{parser.prog}: error: --arch {args.arch!r}: expected sm_XY, e.g. sm_90\n")
    capability = (int(arch[1]), int(arch[2]))
    if shutil.which("nvcc") is None:
        parser.exit(2, f"{parser.prog}: error: nvcc is not on PATH (install the CUDA toolkit; no GPU is needed)\n")
    try:
        cubin = compile_cubin(args.arch)
    except subprocess.CalledProcessError as exc:
        parser.exit(1, f"{parser.prog}: error: nvcc failed (exit {exc.returncode}) for -arch={args.arch}\n")
    rng = np.random.default_rng(2024)
    # integer-valued inputs: a * x + y is exact with or without FMA contraction, so the replay can
    # be verified bit for bit on any GPU
    x = rng.integers(-1000, 1000, N).astype(np.float32)
    y = rng.integers(-1000, 1000, N).astype(np.float32)
    expected = (np.float32(A) * x + y).astype(np.float32)
    saxpy = m.Function(
        name="saxpy",
        parameters=(
            m.Parameter(offset=0, size=4, kind=m.ParameterKind.VALUE, name="a", dtype=m.DType.FLOAT32),
            m.Parameter(offset=8, size=8, kind=m.ParameterKind.POINTER, name="x"),
            m.Parameter(offset=16, size=8, kind=m.ParameterKind.POINTER, name="y"),
            m.Parameter(offset=24, size=4, kind=m.ParameterKind.VALUE, name="n", dtype=m.DType.INT32),
        ),
        parameters_known=True,
    )
    meta = m.CaptureMetadata(
        tool="examples/make_saxpy_capture.py", tool_version=replayfmt.__version__, command_line=tuple(sys.argv)
    )
    with replayfmt.CaptureWriter(args.output, metadata=meta, overwrite=args.force) as w:
        dev = w.add_object(m.Device(ordinal=0, name=f"any {args.arch} device", compute_capability=capability))
        stream = w.add_object(m.Stream(device=dev, label="main"))
        bx = w.add_object(
            m.Buffer(size=x.nbytes, device=dev, dtype=m.DType.FLOAT32, shape=(N,), strides=(1,), label="x")
        )
        by = w.add_object(
            m.Buffer(size=y.nbytes, device=dev, dtype=m.DType.FLOAT32, shape=(N,), strides=(1,), label="y")
        )
        image = w.add_payload(cubin)
        exe = w.add_object(
            m.Executable(format=m.ExecutableFormat.CUBIN, target_arch=args.arch, payload=image, functions=(saxpy,))
        )
        w.module_load(exe, dev)
        w.copy_h2d(dst_buffer=bx, data=x, stream=stream)
        w.copy_h2d(dst_buffer=by, data=y, stream=stream)
        params = np.float32(A).tobytes() + bytes(4) + bytes(16) + np.int32(N).tobytes() + bytes(4)
        with w.scope("saxpy"):
            w.launch(
                executable=exe,
                function=0,
                grid=(N // 256, 1, 1),
                block=(256, 1, 1),
                parameters=params,
                relocations=[m.Relocation(0, bx, 8, 0), m.Relocation(0, by, 16, 0)],
                stream=stream,
            )
        w.stream_synchronize(stream)
        w.checkpoint({by: expected}, name="y")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
