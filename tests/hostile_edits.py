"""Hostile inputs, round three (issue 46): forged files against what formats 1.3 and 1.4 added
(data relocations, typed checkpoints, module globals, events as columns, row hashing) and
against extract-replay and diff-replay, built at test time. Each builder writes one file under
``root`` and returns its path: cross-references that name nothing, sizes that claim far more
than the file holds, and work that a naive walk makes quadratic.

Files are written by the real writer where it writes the lie as asked, by its batch encoder
(``OpenBatch``) where the writer refuses it, and with zstd where a small file must claim much."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import zstandard
from craft import FileBuilder
from samples import compiled_cubin

import replayfmt
from replayfmt.container.batches import RELOCATION_STRUCT, OpenBatch
from replayfmt.format import model as m, records
from replayfmt.format.layout import ChunkKind, Codec
from replayfmt.format.payloads import frame_hash, payload_hash

_K = m.OperationKind
_N = m.GraphNodeKind
KERNEL = m.Function(
    name="k",
    parameters=(m.Parameter(offset=0, size=8, kind=m.ParameterKind.POINTER, name="p"),),
    parameters_known=True,
)
IMAGE = b"\x7fELF" + bytes(124)  # an image only the driver would judge: the plan loads nothing


def _capture(
    name: str, body: Callable[[replayfmt.CaptureWriter, dict[str, int]], None], **writer: object
) -> Callable[[Path], Path]:
    """A builder: a device, a stream, a 4 KiB buffer and an executable of one kernel, then ``body``."""

    def build(root: Path) -> Path:
        path = root / f"{name}.kreplay"
        with replayfmt.CaptureWriter(path, threads=0, **writer) as w:  # type: ignore[arg-type]
            ids = {"device": w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))}
            ids["stream"] = w.add_object(m.Stream(device=ids["device"]))
            ids["buffer"] = w.add_object(m.Buffer(size=4096, device=ids["device"], address=0x7F0000000000))
            ids["exe"] = w.add_object(
                m.Executable(format=m.ExecutableFormat.CUBIN, payload=w.add_payload(IMAGE), functions=(KERNEL,))
            )
            body(w, ids)
        return path

    build.__name__ = name.replace("-", "_")
    return build


def _launch(w: replayfmt.CaptureWriter, ids: dict[str, int], **fields: object) -> int:
    values: dict[str, object] = {
        "executable": ids["exe"],
        "function": 0,
        "grid": (1, 1, 1),
        "block": (32, 1, 1),
        "parameters": bytes(8),
        "relocations": (m.Relocation(0, ids["buffer"], 0, 0),),
        "stream": ids["stream"],
    }
    values.update(fields)
    return w.launch(**values)  # type: ignore[arg-type]


# -- cross-references that name nothing ------------------------------------------------------------


def _memset_3gib(w: replayfmt.CaptureWriter, ids: dict[str, int]) -> None:
    big = w.add_object(m.Buffer(size=3 << 30, device=ids["device"]))
    w.memset(buffer=big, value=7, count=3 << 30, element_size=1, stream=ids["stream"])
    _launch(w, ids, relocations=(m.Relocation(0, big, 0, 0),))


def _memset_element_3(w: replayfmt.CaptureWriter, ids: dict[str, int]) -> None:
    w._append_row(_K.MEMSET, (ids["stream"], ids["buffer"], 7, 3, 0, 16))  # the writer refuses 3: forged
    _launch(w, ids)


def _state_dedup_tib(w: replayfmt.CaptureWriter, ids: dict[str, int]) -> None:
    size = 1 << 40
    zero = bytes(w.frame_size)
    digest = frame_hash(zero)
    payload = w.add_payload_frames(
        size, [digest] * (size // w.frame_size), lambda wanted: [(k, zero, None) for k in wanted]
    )
    big = w.add_object(m.Buffer(size=size, device=ids["device"]))
    with w.scope("step"):
        w.state(buffer=big, payload=payload, size=size)
        _launch(w, ids, relocations=(m.Relocation(0, big, 0, 0),))


def _module_global(symbol: str, size: int) -> Callable[[replayfmt.CaptureWriter, dict[str, int]], None]:
    def body(w: replayfmt.CaptureWriter, ids: dict[str, int]) -> None:
        cubin = compiled_cubin("module_globals.cu")
        assert cubin is not None
        exe = w.add_object(m.Executable(format=m.ExecutableFormat.CUBIN, payload=w.add_payload(cubin), functions=()))
        glob = w.add_object(m.Global(executable=exe, symbol=symbol, size=size))
        storage = w.add_object(m.Buffer(size=size, device=ids["device"], module_global=glob))
        _launch(w, ids, relocations=(m.Relocation(0, storage, 0, 0),))

    return body


def _global_payload_missing(w: replayfmt.CaptureWriter, ids: dict[str, int]) -> None:
    cubin = compiled_cubin("module_globals.cu")
    assert cubin is not None
    exe = w.add_object(m.Executable(format=m.ExecutableFormat.CUBIN, payload=w.add_payload(cubin), functions=()))
    glob = w.add_object(m.Global(executable=exe, symbol="scale", size=16, initial_payload=999))
    storage = w.add_object(m.Buffer(size=16, device=ids["device"], module_global=glob))
    _launch(w, ids, relocations=(m.Relocation(0, storage, 0, 0),))


STRUCTURE: tuple[Callable[[Path], Path], ...] = (
    _capture("memset-3gib", _memset_3gib),
    _capture("memset-element-3", _memset_element_3),
    _capture("relocation-names-nothing", lambda w, ids: _launch(w, ids, relocations=(m.Relocation(0, 999, 0, 0),))),
    _capture(
        "relocation-site-names-nothing",
        lambda w, ids: _launch(w, ids, relocations=(m.Relocation(0, ids["buffer"], 0, 0), m.Relocation(998, 1, 0, 0))),
    ),
    _capture(
        "data-relocation-names-nothing",
        lambda w, ids: (
            w.copy_h2d(dst_buffer=ids["buffer"], data=bytes(64), relocations=(m.Relocation(ids["buffer"], 999, 8, 0),)),
            _launch(w, ids),
        ),
    ),
    _capture(
        "copy-source-names-nothing",
        lambda w, ids: (w.copy_d2d(src_buffer=999, dst_buffer=ids["buffer"], size=64), _launch(w, ids)),
    ),
    _capture(
        "global-names-nothing",
        lambda w, ids: _launch(
            w, ids, relocations=(m.Relocation(0, w.add_object(m.Buffer(size=64, module_global=999)), 0, 0),)
        ),
    ),
    _capture(
        "child-graph-names-nothing",
        lambda w, ids: w.graph_launch(w.add_object(m.Graph(nodes=(m.GraphNode(kind=_N.CHILD_GRAPH, graph=999),)))),
    ),
    _capture("state-dedup-1tib", _state_dedup_tib, frame_size=64 << 20),
    _capture(
        "executable-payload-missing",
        lambda w, ids: _launch(
            w,
            ids,
            executable=w.add_object(m.Executable(format=m.ExecutableFormat.CUBIN, payload=999, functions=(KERNEL,))),
        ),
    ),
    _capture("launch-of-missing-executable", lambda w, ids: _launch(w, ids, executable=999)),
    _capture("global-symbol-missing", _module_global("no_such_symbol", 16)),
    _capture("global-declared-larger", _module_global("scale", 4096)),
    _capture("global-payload-missing", _global_payload_missing),
    _capture("legal-global", _module_global("scale", 16)),  # a control: replayable
    _capture("legal-launch", lambda w, ids: _launch(w, ids)),  # a control: replayable
)


def _create(batch: OpenBatch, index: int, oid: int) -> None:
    batch.kinds.append(_K.CREATE_OBJECT)
    batch.id_operations += struct.pack("<II", *records.id_operation_fields(m.CreateObject(index, oid)))


def create_names_object_0(root: Path) -> Path:
    """A CreateObject whose object id is 0 (no object has it), then a launch: forged in a batch."""
    batch = OpenBatch(0, 1, 1)
    batch.objects.append(m.Buffer(id=1, size=64))
    for index, oid in enumerate((1, 0)):
        _create(batch, index, oid)
    fb = FileBuilder()
    fb.batch(batch.encode(), 0, 2, objs=1)
    return fb.finish(root / "create-object-0.kreplay")


# -- many of a thing: counts and walks --------------------------------------------------------------


def _checkpointed(w: replayfmt.CaptureWriter, ids: dict[str, int]) -> None:
    """A checkpoint of the 4 KiB buffer after the work: extract then has what the work leaves."""
    w.checkpoint({ids["buffer"]: bytes(4096)}, name="after")


def _many_launches(count: int) -> Callable[[replayfmt.CaptureWriter, dict[str, int]], None]:
    def body(w: replayfmt.CaptureWriter, ids: dict[str, int]) -> None:
        for _ in range(count):
            _launch(w, ids)
        _checkpointed(w, ids)

    return body


def _typed_checkpoint(count: int) -> Callable[[replayfmt.CaptureWriter, dict[str, int]], None]:
    def body(w: replayfmt.CaptureWriter, ids: dict[str, int]) -> None:
        payload = w.add_payload(bytes(64))
        buffers = [w.add_object(m.Buffer(size=64, device=ids["device"])) for _ in range(count)]
        _launch(w, ids)
        _checkpointed(w, ids)
        entries = [m.CheckpointEntry(b, payload, 0, 64) for b in buffers]
        types = [m.TypedTensor(b, 0, 64, m.DType.FLOAT32, (16,), (1,)) for b in buffers]
        w.checkpoint(entries, name="typed", types=types)

    return body


def _copy_chain(count: int) -> Callable[[replayfmt.CaptureWriter, dict[str, int]], None]:
    def body(w: replayfmt.CaptureWriter, ids: dict[str, int]) -> None:
        w.copy_h2d(dst_buffer=ids["buffer"], data=bytes(range(256)) * 16, stream=ids["stream"])
        for k in range(count):  # each copy moves the bytes the one before wrote, a little further
            w.copy_d2d(
                src_buffer=ids["buffer"], dst_buffer=ids["buffer"], size=64, src_offset=k % 63, dst_offset=(k + 1) % 63
            )
        _launch(w, ids)
        _checkpointed(w, ids)

    return body


def _memsets(count: int, *, alike: bool) -> Callable[[replayfmt.CaptureWriter, dict[str, int]], None]:
    def body(w: replayfmt.CaptureWriter, ids: dict[str, int]) -> None:
        for k in range(count):  # alike: rows equal but for their value (the row hash must still tell them apart)
            w.memset(buffer=ids["buffer"], value=k & 0xFF if alike else 0, count=16, offset=(k * 16) % 4080)
        _launch(w, ids)
        _checkpointed(w, ids)

    return body


def _fixed_spans(count: int) -> Callable[[replayfmt.CaptureWriter, dict[str, int]], None]:
    def body(w: replayfmt.CaptureWriter, ids: dict[str, int]) -> None:
        first = None
        for k in range(count):
            b = w.add_object(
                m.Buffer(size=256, device=ids["device"], address=0x7E0000000000 + 512 * k, requires_fixed_address=True)
            )
            first = first or b
        _launch(w, ids, relocations=(m.Relocation(0, first, 0, 0),))
        w.checkpoint({first: bytes(256)}, name="after")

    return body


def _globals(count: int) -> Callable[[replayfmt.CaptureWriter, dict[str, int]], None]:
    def body(w: replayfmt.CaptureWriter, ids: dict[str, int]) -> None:
        for k in range(count):
            w.add_object(m.Global(executable=ids["exe"], symbol=f"g{k}", size=8))
        _launch(w, ids)
        _checkpointed(w, ids)

    return body


def _graph_relaunched(nodes: int, pairs: int) -> Callable[[replayfmt.CaptureWriter, dict[str, int]], None]:
    """A graph of ``nodes`` memset nodes launched ``pairs`` times, an unrelated object destroyed
    before each launch (what passed the plan's checks is forgotten at a destroy)."""

    def body(w: replayfmt.CaptureWriter, ids: dict[str, int]) -> None:
        node = m.GraphNode(kind=_N.MEMSET, dst_buffer=ids["buffer"], element_size=4, width=4, height=1, pitch=16)
        graph = w.add_object(m.Graph(nodes=(node,) * nodes))
        spare = [w.add_object(m.Event(device=ids["device"])) for _ in range(pairs)]
        for event in spare:
            w.destroy(event)
            w.graph_launch(graph, ids["stream"])
        _checkpointed(w, ids)

    return body


MANY: tuple[Callable[[Path], Path], ...] = (
    _capture("launches-20k-one-kernel", _many_launches(20_000)),
    _capture("typed-checkpoint-20k", _typed_checkpoint(20_000)),
    _capture("copy-chain-20k", _copy_chain(20_000)),
    _capture("memsets-100k", _memsets(100_000, alike=False)),
    _capture("memsets-200k-alike", _memsets(200_000, alike=True)),
    _capture("fixed-spans-15k", _fixed_spans(15_000)),
    _capture("globals-60k", _globals(60_000)),
    _capture("graph-relaunched-20k", _graph_relaunched(30_000, 20_000)),
)


# -- a small file that claims much -------------------------------------------------------------------


def _zstd_batch(batch: OpenBatch, path: Path, *, ops: int, objects: int = 0, payloads: int = 0) -> Path:
    body = batch.encode()
    fb = FileBuilder()
    packed = zstandard.ZstdCompressor(level=3).compress(body)
    offset = fb.chunk(ChunkKind.RECORDS, packed, codec=Codec.ZSTD, logical=len(body))
    fb.batches.append((offset, 0, ops, 1, objects, 1, payloads))
    return fb.finish(path)


def relocations_7m(root: Path) -> Path:
    """One launch holding 7 million relocations (a pointer at one site, over and over): 224 MB of
    records in a 0.3 MB compressed chunk, within the reader's expansion cap."""
    batch = OpenBatch(0, 1, 1)
    batch.objects += [m.Buffer(id=1, size=64), m.Executable(id=2, payload=0, functions=(KERNEL,))]
    for index, oid in enumerate((1, 2)):
        _create(batch, index, oid)
    count = 7_000_000
    one = RELOCATION_STRUCT.pack(0, 1, 0, 0, 0)  # (site buffer 0: the parameters) -> buffer 1
    batch.kinds.append(_K.LAUNCH)
    shape = (
        2,
        0,
        0,
        0,
        1,
        1,
        1,
        32,
        1,
        1,
        0,
        0,
        0,
        0,
    )  # executable, function, stream, flags, grid, block, cluster, smem
    batch.launch_bytes += struct.pack("<18I", *shape, 0, 8, 0, count)
    batch.parameters += bytes(8)
    table = np.frombuffer(one * count, np.uint8).reshape(count, len(one)).copy()
    # every 24th target offset random: the chunk stays within the reader's expansion cap (1024x)
    rng = np.random.default_rng(7)
    table[::24, 16:20] = rng.integers(0, 256, (len(table[::24]), 4), dtype=np.uint8)
    batch.relocation_bytes += table.tobytes()
    return _zstd_batch(batch, root / "relocations-7m.kreplay", ops=3, objects=2)


def payload_frames_2m(root: Path) -> Path:
    """A payload of 2 million 64 KiB frames (128 GiB logical), most of them one zero frame: 32 MB
    of frame hashes in a 0.5 MB compressed record batch, within the reader's expansion cap."""
    batch = OpenBatch(0, 1, 1)
    count, frame_size = 2_000_000, 64 << 10
    zero = bytes(frame_size)
    table = np.frombuffer(frame_hash(zero) * count, np.uint8).reshape(count, 16).copy()
    # every 64th frame another (random) one: the chunk stays within the reader's expansion cap
    table[::64] = np.random.default_rng(3).integers(0, 256, (len(table[::64]), 16), dtype=np.uint8)
    hashes = [table.tobytes()]  # one bytes object: the encoder joins them
    batch.payloads.append((payload_hash(count * frame_size, hashes), count * frame_size, frame_size, hashes))
    batch.objects.append(m.Buffer(id=1, size=count * frame_size))
    _create(batch, 0, 1)
    batch.kinds.append(_K.COPY_HOST_TO_DEVICE)
    batch.copies.append((0, 0, 1, 1, 0, 0, 0, 0, count * frame_size))
    fb = FileBuilder()
    fb.frame(frame_hash(zero), zstandard.ZstdCompressor().compress(zero), codec=Codec.ZSTD, logical=frame_size)
    body = batch.encode()
    packed = zstandard.ZstdCompressor(level=3).compress(body)
    offset = fb.chunk(ChunkKind.RECORDS, packed, codec=Codec.ZSTD, logical=len(body))
    fb.batches.append((offset, 0, 2, 1, 1, 1, 1))
    return fb.finish(root / "payload-frames-2m.kreplay")


def events_claimed_1m(root: Path) -> Path:
    """A record batch whose index entry claims a million event objects (their creates too)."""
    batch = OpenBatch(0, 1, 1)
    batch.objects.append(m.Event(id=1))
    _create(batch, 0, 1)
    fb = FileBuilder()
    body = batch.encode()
    offset = fb.chunk(ChunkKind.RECORDS, zstandard.ZstdCompressor().compress(body), codec=Codec.ZSTD, logical=len(body))
    fb.batches.append((offset, 0, 1_000_000, 1, 1_000_000, 1, 0))
    return fb.finish(root / "events-claimed-1m.kreplay")


AMPLIFY: tuple[Callable[[Path], Path], ...] = (relocations_7m, payload_frames_2m, events_claimed_1m)

BUILDERS: tuple[Callable[[Path], Path], ...] = (*STRUCTURE, create_names_object_0, *MANY, *AMPLIFY)
# what a replay takes as it is (every other file is refused by the verdict)
REPLAYABLE = {
    "legal_global",
    "legal_launch",
    "launches_20k_one_kernel",
    "typed_checkpoint_20k",
    "copy_chain_20k",
    "memsets_100k",
    "memsets_200k_alike",
    "memset_3gib",  # a 3 GiB buffer set: a replay does it (extract must not allocate it)
    "state_dedup_1tib",  # the dry run cannot know a device's memory: a replay fails to allocate it
    "globals_60k",
    "graph_relaunched_20k",
}
