"""Hand-made captures for extract-replay and diff-replay, built with the real writer.

``step_capture`` is a small program as the recorder's region mode writes it: uploads before the
region, a ``step`` scope whose buffers' starting state is a State row, nested scopes with their
checkpoints, a device-to-device copy, a launch whose pointer table lives in device memory, and
after it a kernel-mode style scope. The expected contents (``Expected``) are worked out here with
numpy, as the kernels would compute them (saxpy: y = a*x + y; gather: out[i] = tables[i&1][idx[i]]).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from samples import SAXPY

import replayfmt
from replayfmt.format import model as m
from replayfmt.format.timings import OperationTime

N = 256
GATHER = m.Function(
    name="gather",
    parameters=(
        m.Parameter(offset=0, size=8, kind=m.ParameterKind.POINTER, name="tables"),
        m.Parameter(offset=8, size=8, kind=m.ParameterKind.POINTER, name="index"),
        m.Parameter(offset=16, size=8, kind=m.ParameterKind.POINTER, name="out"),
        m.Parameter(offset=24, size=4, kind=m.ParameterKind.VALUE, name="n", dtype=m.DType.INT32),
    ),
    parameters_known=True,
)


def saxpy_params(a: float, fill: int = 0) -> bytes:
    return np.float32(a).tobytes() + bytes(4) + bytes([fill]) * 16 + np.int32(N).tobytes() + bytes(4)


def gather_params() -> bytes:
    return bytes(24) + np.int32(N).tobytes() + bytes(4)


@dataclass
class Expected:
    ids: dict[str, int] = field(default_factory=dict)
    ops: dict[str, int] = field(default_factory=dict)  # operation indices by role
    data: dict[str, np.ndarray] = field(default_factory=dict)  # buffer contents by role
    times: dict[int, int] = field(default_factory=dict)  # operation -> original ns


def step_capture(path: Path, cubin: bytes, *, checkpoints: bool = True) -> Expected:
    """The capture the module docstring describes; ``checkpoints=False`` leaves out the nested
    scopes' checkpoints (so bytes the step's launches wrote are not in the capture)."""
    rng = np.random.default_rng(3)
    e = Expected()
    X = rng.standard_normal(N).astype(np.float32)
    Y0 = rng.standard_normal(N).astype(np.float32)
    IDX = rng.integers(0, N, N).astype(np.int32)
    Y1 = (2.0 * X + Y0).astype(np.float32)
    Z1 = np.zeros(N, np.float32)
    Z1[: N // 2] = Y1[: N // 2]
    tables = (X, Y1)
    Z2 = np.array([tables[i & 1][IDX[i]] for i in range(N)], np.float32)
    Y3 = (0.5 * Z2 + Y1).astype(np.float32)
    X4, Y4 = X, (3.0 * X + Y3).astype(np.float32)
    e.data.update(X=X, Y0=Y0, IDX=IDX, Y1=Y1, Z1=Z1, Z2=Z2, Y3=Y3, Y4=Y4)
    ids, ops = e.ids, e.ops
    meta = m.CaptureMetadata(
        tool="tests", tool_version="1", command_line=("python", "step.py"), properties=(("k", "v"),)
    )
    with replayfmt.CaptureWriter(path, metadata=meta, threads=0) as w:
        ids["device"] = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        ids["stream"] = w.add_object(m.Stream(device=ids["device"], label="s"))
        buf = {
            "x": m.Buffer(size=4 * N, device=ids["device"], dtype=m.DType.FLOAT32, label="x"),
            "y": m.Buffer(size=4 * N, device=ids["device"], dtype=m.DType.FLOAT32, label="y"),
            "z": m.Buffer(size=4 * N, device=ids["device"], dtype=m.DType.FLOAT32, label="z"),
            "t": m.Buffer(size=16, device=ids["device"], label="tables"),
            "idx": m.Buffer(size=4 * N, device=ids["device"], dtype=m.DType.INT32, label="idx"),
            "unused": m.Buffer(size=4096, device=ids["device"], label="unused"),
        }
        for role, b in buf.items():
            ids[role] = w.add_object(b)
        image = w.add_payload(cubin)
        ids["exe"] = w.add_object(
            m.Executable(format=m.ExecutableFormat.CUBIN, target_arch="sm_90", payload=image, functions=(SAXPY, GATHER))
        )
        ids["spare"] = w.add_object(
            m.Executable(format=m.ExecutableFormat.CUBIN, target_arch="sm_90", payload=image, functions=(SAXPY,))
        )
        s = ids["stream"]
        w.copy_h2d(dst_buffer=ids["x"], data=X, stream=s)
        w.memset(buffer=ids["z"], value=0, count=N, element_size=4, stream=s)
        w.copy_h2d(dst_buffer=ids["t"], data=bytes(16), stream=s)
        w.copy_h2d(dst_buffer=ids["idx"], data=IDX, stream=s)
        w.copy_h2d(dst_buffer=ids["unused"], data=bytes(range(256)) * 16, stream=s)

        def saxpy(a: float, x: int, y: int) -> int:
            relocs = [m.Relocation(0, x, 8, 0), m.Relocation(0, y, 16, 0)]
            return w.launch(
                executable=ids["exe"],
                function=0,
                grid=(1, 1, 1),
                block=(N, 1, 1),
                parameters=saxpy_params(a),
                relocations=relocs,
                stream=s,
            )

        with w.scope("step"):
            w.state(buffer=ids["y"], data=Y0)
            with w.scope("layer0"):
                ops["saxpy0"] = saxpy(2.0, ids["x"], ids["y"])
                if checkpoints:
                    w.checkpoint({ids["x"]: X, ids["y"]: Y1}, name="layer0")
            ops["copy"] = w.copy_d2d(src_buffer=ids["y"], dst_buffer=ids["z"], size=2 * N, stream=s)
            with w.scope("act"):
                relocs = [
                    m.Relocation(0, ids["t"], 0, 0),
                    m.Relocation(0, ids["idx"], 8, 0),
                    m.Relocation(0, ids["z"], 16, 0),
                    m.Relocation(ids["t"], ids["x"], 0, 0),  # the pointer table lives in buffer t
                    m.Relocation(ids["t"], ids["y"], 8, 0),
                ]
                ops["gather"] = w.launch(
                    executable=ids["exe"],
                    function=1,
                    grid=(1, 1, 1),
                    block=(N, 1, 1),
                    parameters=gather_params(),
                    relocations=relocs,
                    stream=s,
                )
                if checkpoints:
                    w.checkpoint(
                        {ids["z"]: Z2, ids["x"]: X, ids["y"]: Y1, ids["t"]: bytes(16), ids["idx"]: IDX}, name="act"
                    )
            ops["saxpy1"] = saxpy(0.5, ids["z"], ids["y"])
            w.checkpoint({ids["x"]: X, ids["y"]: Y3, ids["z"]: Z2, ids["t"]: bytes(16), ids["idx"]: IDX}, name="step")
        with w.scope("saxpy#2"):  # a kernel-mode style region: its own state, the launch, a checkpoint
            w.state(buffer=ids["x"], data=X)
            w.state(buffer=ids["y"], data=Y3)
            ops["saxpy2"] = saxpy(3.0, ids["x"], ids["y"])
            w.checkpoint({ids["x"]: X4, ids["y"]: Y4}, name="saxpy#2")
        e.times = {
            ops["saxpy0"]: 30_000,
            ops["copy"]: 2_000,
            ops["gather"]: 5_000,
            ops["saxpy1"]: 31_000,
            ops["saxpy2"]: 29_000,
        }
        start = 1_000_000
        times = []
        for index, ns in sorted(e.times.items()):
            times.append(OperationTime(index, start, ns))
            start += ns + 1_000
        w.set_original_times(times)
    return e


@dataclass(frozen=True)
class Variant:
    """How a diff test's second capture differs from the first."""

    insert_gather: bool = False  # one more gather launch after the first saxpy
    last_grid: int = 1  # the last saxpy's grid
    gather_image: bytes = b""  # appended to the gather executable's image (a recompiled kernel)
    saxpy_scale: float = 1.0  # saxpy launches' original times scaled
    first_a: float = 2.0  # the first saxpy's scalar parameter
    pointer_fill: int = 0  # the byte the parameter blocks hold at relocated pointer sites


def program_capture(path: Path, image: bytes, variant: Variant = Variant()) -> None:
    """saxpy, gather, saxpy, saxpy in a ``step`` scope, each with an original time."""
    with replayfmt.CaptureWriter(path, threads=0) as w:
        dev = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        x = w.add_object(m.Buffer(size=4 * N, device=dev))
        y = w.add_object(m.Buffer(size=4 * N, device=dev))
        s_exe = w.add_object(
            m.Executable(format=m.ExecutableFormat.CUBIN, payload=w.add_payload(image), functions=(SAXPY,))
        )
        g_exe = w.add_object(
            m.Executable(
                format=m.ExecutableFormat.CUBIN,
                payload=w.add_payload(image + variant.gather_image),
                functions=(GATHER,),
            )
        )
        times: list[OperationTime] = []

        def saxpy(a: float, grid: int = 1) -> None:
            relocs = [m.Relocation(0, x, 8, 0), m.Relocation(0, y, 16, 0)]
            i = w.launch(
                executable=s_exe,
                function=0,
                grid=(grid, 1, 1),
                block=(N, 1, 1),
                parameters=saxpy_params(a, variant.pointer_fill),
                relocations=relocs,
            )
            times.append(OperationTime(i, 100_000 * i, int(20_000 * variant.saxpy_scale)))

        def gather() -> None:
            relocs = [m.Relocation(0, x, 0, 0), m.Relocation(0, y, 8, 0), m.Relocation(0, y, 16, 0)]
            i = w.launch(
                executable=g_exe,
                function=0,
                grid=(1, 1, 1),
                block=(N, 1, 1),
                parameters=gather_params(),
                relocations=relocs,
            )
            times.append(OperationTime(i, 100_000 * i, 4_000))

        with w.scope("step"):
            saxpy(variant.first_a)
            if variant.insert_gather:
                gather()
            gather()
            saxpy(0.5)
            saxpy(1.5, grid=variant.last_grid)
        w.set_original_times(times)
