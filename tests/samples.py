"""Captures built with the real writer, shared by the tests."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

import replayfmt
from replayfmt.format import model as m
from replayfmt.format.model import GraphNode, GraphNodeKind

KERNELS = Path(__file__).parent / "kernels"


ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "cubins"  # made by scripts/make_test_cubins.py


def find_nvcc() -> str | None:
    """nvcc for the GPU tests' kernels of other architectures (the CPU tests use the fixtures)."""
    return shutil.which("nvcc") or shutil.which("/usr/local/cuda/bin/nvcc")


def _fixture(path: Path, arch: str) -> bytes | None:
    """The checked-in cubin of ``path`` for ``arch``, or None when none is checked in; a fixture
    built from another version of its source fails loudly instead of testing stale code."""
    if not path.is_relative_to(ROOT):
        return None
    manifest = json.loads((FIXTURES / "MANIFEST.json").read_text())["outputs"]
    source = path.relative_to(ROOT).as_posix()
    for out, entry in manifest.items():
        if entry["kind"] == "cubin" and entry["source"] == source and entry["arch"] == arch:
            if hashlib.sha256(path.read_bytes()).hexdigest() != entry["source_sha256"]:
                raise AssertionError(f"{out} is stale ({source} changed): run python scripts/make_test_cubins.py")
            return (ROOT / out).read_bytes()
    return None


@functools.cache
def compiled_cubin(source: str | Path = "container_kernels.cu", arch: str = "sm_90") -> bytes | None:
    """A cubin of one of the repo's .cu files: the checked-in fixture where there is one (the CPU
    tests need no nvcc), else compiled with nvcc (None when nvcc is missing). ``source`` is a file
    name under tests/kernels, or a path."""
    path = (source if isinstance(source, Path) else KERNELS / source).resolve()
    fixture = _fixture(path, arch)
    if fixture is not None:
        return fixture
    nvcc = find_nvcc()
    if nvcc is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "k.cubin"
        subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-O3", "-o", str(out), str(path)], check=True)
        return out.read_bytes()


SAXPY = m.Function(
    name="saxpy",
    parameters=(
        m.Parameter(offset=0, size=4, kind=m.ParameterKind.VALUE, name="a", dtype=m.DType.FLOAT32),
        m.Parameter(offset=8, size=8, kind=m.ParameterKind.POINTER, name="x"),
        m.Parameter(offset=16, size=8, kind=m.ParameterKind.POINTER, name="y"),
        m.Parameter(offset=24, size=4, kind=m.ParameterKind.VALUE, name="n", dtype=m.DType.INT32),
    ),
    parameters_known=True,
    registers=16,
    max_threads_per_block=1024,
)


def write_sample(path: Path, *, n: int = 1024, cubin: bytes | None = None, **writer_options) -> dict[str, int]:
    """A capture that uses every object kind and every operation kind; returns the ids."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    meta = m.CaptureMetadata(
        tool="replayfmt-tests",
        tool_version="1",
        created_unix_ns=1_700_000_000_000_000_000,
        host="testhost",
        gpu="NVIDIA H100",
        driver="13.0",
        command_line=("python", "sample.py"),
        properties=(("purpose", "sample"),),
    )
    ids: dict[str, int] = {}
    with replayfmt.CaptureWriter(path, metadata=meta, **writer_options) as w:
        ids["device"] = w.add_object(
            m.Device(
                ordinal=0,
                name="NVIDIA H100",
                uuid=bytes(range(16)),
                compute_capability=(9, 0),
                total_memory=80 << 30,
                driver_version=13000,
                multiprocessor_count=132,
            )
        )
        ids["stream"] = w.add_object(m.Stream(device=ids["device"], label="main"))
        ids["stream2"] = w.add_object(m.Stream(device=ids["device"], priority=-1, label="side"))
        ids["event"] = w.add_object(m.Event(device=ids["device"]))
        ids["x"] = w.add_object(
            m.Buffer(
                size=4 * n,
                device=ids["device"],
                address=0x7F0000000000,
                dtype=m.DType.FLOAT32,
                shape=(n,),
                strides=(1,),
                label="x",
                ranges=(m.TypedRange(0, 2 * n, m.DType.FLOAT32), m.TypedRange(2 * n, 2 * n, m.DType.FLOAT32)),
            )
        )
        ids["y"] = w.add_object(
            m.Buffer(
                size=4 * n,
                device=ids["device"],
                address=0x7F0000010000,
                dtype=m.DType.FLOAT32,
                shape=(n,),
                strides=(1,),
                label="y",
            )
        )
        image = cubin if cubin is not None else b"\x7fELF" + bytes(252)
        ids["exe"] = w.add_object(
            m.Executable(
                format=m.ExecutableFormat.CUBIN, target_arch="sm_90", payload=w.add_payload(image), functions=(SAXPY,)
            )
        )
        ids["global"] = w.add_object(
            m.Global(
                executable=ids["exe"], symbol="counter", size=4, initial_payload=w.add_payload(b"\x01\x00\x00\x00")
            )
        )
        ids["file"] = w.add_object(
            m.FileReference(
                path="/data/weights.bin",
                size=4 * n,
                device=2049,
                inode=1234,
                mtime_ns=1_600_000_000_000_000_000,
                digest=bytes(range(16, 32)),
                validation=m.FileValidation.DIGEST,
            )
        )
        w.module_load(ids["exe"], ids["device"])
        w.copy_h2d(dst_buffer=ids["x"], data=x, stream=ids["stream"])
        w.copy_h2d(dst_buffer=ids["y"], data=y, stream=ids["stream"])
        w.memset(buffer=ids["y"], value=0, count=16, element_size=4, offset=0, stream=ids["stream"])
        with w.scope("step"):
            w.state(buffer=ids["x"], data=x)  # what x holds when the step begins (uploaded above)
            params = np.float32(2.0).tobytes() + bytes(4) + bytes(16) + np.int32(n).tobytes() + bytes(4)
            relocations = [m.Relocation(0, ids["x"], 8, 0), m.Relocation(0, ids["y"], 16, 0)]
            w.launch(
                executable=ids["exe"],
                function=0,
                grid=((n + 255) // 256, 1, 1),
                block=(256, 1, 1),
                parameters=params,
                relocations=relocations,
                stream=ids["stream"],
            )
            w.event_record(ids["event"], ids["stream"])
            w.stream_wait_event(ids["stream2"], ids["event"])
            w.copy_d2d(src_buffer=ids["y"], dst_buffer=ids["x"], size=4 * n, stream=ids["stream2"])
        expected = 2.0 * x + np.where(np.arange(n) < 16, 0, y).astype(np.float32)
        w.stream_synchronize(ids["stream2"])
        w.event_synchronize(ids["event"])
        w.checkpoint({ids["y"]: expected.astype(np.float32)}, name="after-step")
        w.copy_d2h(src_buffer=ids["y"], size=4 * n, expected=expected.astype(np.float32), stream=ids["stream"])
        w.device_synchronize(ids["device"])
        w.host_function(ids["stream"])
        w.unsupported("cuLaunchHostFunc", "host callbacks cannot be replayed", stream=ids["stream"])
        nodes = (
            GraphNode(kind=GraphNodeKind.MEMSET, dst_buffer=ids["y"], value=0, element_size=4, width=16, height=1),
            GraphNode(
                kind=GraphNodeKind.KERNEL,
                executable=ids["exe"],
                grid=((n + 255) // 256, 1, 1),
                block=(256, 1, 1),
                parameters=params,
                relocations=tuple(relocations),
            ),
            GraphNode(kind=GraphNodeKind.EVENT_RECORD, event=ids["event"]),
        )
        graph = m.Graph(device=ids["device"], label="step graph", nodes=nodes, edges=((0, 1), (1, 2)))
        ids["graph"] = w.add_object(graph)
        w.graph_launch(ids["graph"], ids["stream"])
        w.destroy(ids["event"])
        summed = m.Collective(0, m.CollectiveOperation.ALL_REDUCE, 7, 0, ids["stream"], n, -1, 2, 0, "nccl-1", 0)
        w.collective(dataclasses.replace(summed, send_buffer=ids["y"], recv_buffer=ids["y"]), received=2 * expected)
    return ids
