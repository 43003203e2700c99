"""A generator of hostile inputs (issue 15): small files that try to make the tools read, write,
allocate or spend more than the file is worth, built at test time with the real encoders and
writer plus byte surgery. Each builder writes its file(s) under ``root`` and returns a ``Hostile``:
the file, the commands to run on it, and what must not leak.

Categories: FlatBuffers amplification (shared tables, strings, vectors), zstd bombs within the
caps (index, records, metadata, launch parameters), deduplicated payloads of 1 GiB and 1 TiB
logical, index floods (batch and frame entries pointing at one chunk), host-path tricks (a
device, a FIFO, a remap escape, a secret file's size and digest), planted files in an export
directory, and a file that shrinks while it is read (tests/test_hostile.py).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import flatbuffers
import numpy as np
import zstandard
from craft import FileBuilder, amplifying_executable_batch

import replayfmt
from replayfmt.container.batches import OpenBatch
from replayfmt.format import model as m, records
from replayfmt.format.layout import ChunkKind, Codec
from replayfmt.format.payloads import frame_hash, payload_hash

# the text summary, and JSONL rows with payloads inlined (which decodes everything plain JSONL does)
DUMPS = (("dump-replay",), ("dump-replay", "--format=jsonl", "--payloads=hex"))
DRY_RUN = (("run-replay", "--dry-run", "--continue-on-error"),)
ALL = DUMPS + DRY_RUN


@dataclass
class Hostile:
    name: str
    path: Path
    commands: tuple[tuple[str, ...], ...] = ALL
    must_not_print: tuple[str, ...] = ()  # facts about host files the capture must not reveal
    untouched: dict[Path, bytes] = field(default_factory=dict)  # files outside the request: content kept


def _zstd_of_zeros(size: int, prefix: bytes = b"") -> bytes:
    """A zstd frame of ``prefix`` + zeros, ``size`` bytes in all, compressed without ever holding
    them (streamed 1 MiB at a time): the bomb costs the generator nothing."""
    out = zstandard.ZstdCompressor(level=1).compressobj(size=size)
    parts = [out.compress(prefix)]
    block = bytes(1 << 20)
    left = size - len(prefix)
    while left:
        n = min(left, len(block))
        parts.append(out.compress(block[:n]))
        left -= n
    parts.append(out.flush())
    return b"".join(parts)


def _scope_batch(first_op: int = 0) -> bytes:
    batch = OpenBatch(first_op, 1, 1)
    batch.kinds.append(m.OperationKind.SCOPE_BEGIN)
    batch.table_ops.append(m.ScopeBegin(first_op, "x"))
    return batch.encode()


def _id_op(batch: OpenBatch, op: m.Operation) -> None:
    batch.kinds.append(op.kind)
    batch.id_operations += struct.pack("<II", *records.id_operation_fields(op))


# -- FlatBuffers amplification ---------------------------------------------------------------


def amplified_tables(root: Path) -> Hostile:
    """400 objects sharing one executable sharing 400 functions sharing 400 parameters: 64
    million tables if walked naively, from 20 KB."""
    fb = FileBuilder()
    fb.chunk(ChunkKind.RECORDS, amplifying_executable_batch(400))
    fb.batch(_scope_batch(), 0, 1)
    return Hostile("amplified-tables", fb.finish(root / "amp-tables.kreplay", batches=fb.batches))


def _shared_name_batch(fanout: int, name_size: int) -> bytes:
    """One executable whose ``fanout`` functions all share one ``name_size``-byte name string."""
    from replayfmt.format.fb import Executable, Function, Object, RecordBatch

    b = flatbuffers.Builder(name_size + 64 * fanout)
    name = b.CreateString("k" * name_size)
    Function.Start(b)
    Function.AddName(b, name)
    fn = Function.End(b)
    b.StartVector(4, fanout, 4)
    for _ in range(fanout):
        b.PrependUOffsetTRelative(fn)
    fns = b.EndVector()
    Executable.Start(b)
    Executable.AddFunctions(b, fns)
    exe = Executable.End(b)
    Object.Start(b)
    Object.AddId(b, 1)
    Object.AddBodyType(b, int(m.ObjectKind.EXECUTABLE))
    Object.AddBody(b, exe)
    obj = Object.End(b)
    b.StartVector(4, 1, 4)
    b.PrependUOffsetTRelative(obj)
    objs = b.EndVector()
    kinds = b.CreateByteVector(bytes([m.OperationKind.CREATE_OBJECT]))
    RecordBatch.Start(b)
    RecordBatch.AddFirstObject(b, 1)
    RecordBatch.AddFirstPayload(b, 1)
    RecordBatch.AddOperationKinds(b, kinds)
    RecordBatch.AddObjects(b, objs)
    b.Finish(RecordBatch.End(b))
    return bytes(b.Output())


def amplified_strings(root: Path) -> Hostile:
    """20,000 functions named by one shared 60 KB string: 1.2 GB of names from 140 KB."""
    fb = FileBuilder()
    fb.batch(_shared_name_batch(20_000, 60_000), 0, 1, 1, 1)
    return Hostile("amplified-strings", fb.finish(root / "amp-strings.kreplay"))


def amplified_strings_zstd(root: Path) -> Hostile:
    """The same, zstd-compressed: 1.2 GB of names from a few KB."""
    body = _shared_name_batch(20_000, 60_000)
    fb = FileBuilder()
    offset = fb.chunk(ChunkKind.RECORDS, zstandard.ZstdCompressor().compress(body), codec=Codec.ZSTD, logical=len(body))
    fb.batches.append((offset, 0, 1, 1, 1, 1, 0))
    return Hostile("amplified-strings-zstd", fb.finish(root / "amp-strings-zstd.kreplay"))


# -- zstd bombs within the caps --------------------------------------------------------------


def zstd_index_bomb(root: Path) -> Hostile:
    """An INDEX chunk of ~40 KB declaring 512 MiB (under max_index_size)."""
    fb = FileBuilder()
    fb.batch(_scope_batch(), 0, 1)
    index = fb.chunk(ChunkKind.INDEX, _zstd_of_zeros(512 << 20), codec=Codec.ZSTD, logical=512 << 20)
    from replayfmt.format.layout import pack_footer

    fb.data += pack_footer(index, len(fb.data) + 32)
    path = root / "zstd-index.kreplay"
    path.write_bytes(bytes(fb.data))
    return Hostile("zstd-index-bomb", path)


def zstd_records_bomb(root: Path) -> Hostile:
    """A RECORDS chunk of ~10 KB declaring 250 MiB (under max_record_batch_size)."""
    fb = FileBuilder()
    body = _zstd_of_zeros(250 << 20, _scope_batch())
    offset = fb.chunk(ChunkKind.RECORDS, body, codec=Codec.ZSTD, logical=250 << 20)
    fb.batches.append((offset, 0, 1, 1, 0, 1, 0))
    return Hostile("zstd-records-bomb", fb.finish(root / "zstd-records.kreplay"))


def zstd_metadata_bomb(root: Path) -> Hostile:
    """The METADATA chunk (the first one) declaring its 16 MiB cap of zeros."""
    fb = FileBuilder()
    fb.data = fb.data[: fb.metadata_offset]
    fb.metadata_offset = fb.chunk(ChunkKind.METADATA, _zstd_of_zeros(16 << 20), codec=Codec.ZSTD, logical=16 << 20)
    fb.batch(_scope_batch(), 0, 1)
    return Hostile("zstd-metadata-bomb", fb.finish(root / "zstd-metadata.kreplay"))


def spread_bomb(root: Path) -> Hostile:
    """3,000 RECORDS chunks of ~600 bytes, each a valid batch padded to 16 MiB (within the per-
    chunk slack): 48 GB to decompress from 2 MB, unless the file as a whole is bounded too. No
    index: the recovery scan decodes every chunk."""
    body = _zstd_of_zeros(16 << 20, _scope_batch())
    fb = FileBuilder()
    for _ in range(3000):
        fb.chunk(ChunkKind.RECORDS, body, codec=Codec.ZSTD, logical=16 << 20)
    return Hostile("spread-bomb", fb.finish(root / "spread.kreplay", index=False))


def parameter_bomb(root: Path) -> Hostile:
    """200 launches whose parameters all span one 16 MiB block: 3.2 GB of parameter copies
    from a ~20 KB zstd RECORDS chunk."""
    batch = OpenBatch(0, 1, 1)
    batch.objects.append(m.Executable(id=1, functions=(m.Function(name="k"),)))
    _id_op(batch, m.CreateObject(0, 1))
    for _ in range(200):
        batch.kinds.append(m.OperationKind.LAUNCH)
        batch.launch_bytes += struct.pack("<18I", 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 16 << 20, 0, 0)
    batch.parameters += bytes(16 << 20)
    body = batch.encode()
    fb = FileBuilder()
    offset = fb.chunk(ChunkKind.RECORDS, zstandard.ZstdCompressor().compress(body), codec=Codec.ZSTD, logical=len(body))
    fb.batches.append((offset, 0, 201, 1, 1, 1, 0))
    return Hostile("parameter-bomb", fb.finish(root / "params.kreplay"))


# -- deduplicated payloads -------------------------------------------------------------------


def _dedup_capture(path: Path, size: int, frame_size: int) -> Path:
    """An executable and a buffer upload whose payload is ``size`` bytes of one zero frame
    referenced over and over: a few KB on disk."""
    zero = bytes(frame_size)
    digest = frame_hash(zero)
    count = -(-size // frame_size)
    frames = (digest,) * count
    if size % frame_size:  # the last, shorter frame
        frames = (*frames[:-1], frame_hash(bytes(size % frame_size)))
    batch = OpenBatch(0, 1, 1)
    kernel = m.Function(name="k")
    batch.objects += [
        m.Executable(id=1, format=m.ExecutableFormat.CUBIN, payload=1, functions=(kernel,)),
        m.Buffer(id=2, size=size),
    ]
    _id_op(batch, m.CreateObject(0, 1))
    _id_op(batch, m.CreateObject(1, 2))
    batch.kinds.append(m.OperationKind.COPY_HOST_TO_DEVICE)
    batch.copies.append((0, 0, 2, 1, 0, 0, 0, 0, size))
    batch.payloads.append((payload_hash(size, frames), size, frame_size, frames))
    fb = FileBuilder()
    fb.frame(digest, zstandard.ZstdCompressor().compress(zero), codec=Codec.ZSTD, logical=frame_size)
    body = batch.encode()
    offset = fb.chunk(ChunkKind.RECORDS, zstandard.ZstdCompressor().compress(body), codec=Codec.ZSTD, logical=len(body))
    fb.batches.append((offset, 0, 3, 1, 2, 1, 1))
    return fb.finish(path)


def dedup_gib(root: Path) -> Hostile:
    return Hostile("dedup-1GiB", _dedup_capture(root / "dedup-gib.kreplay", 1 << 30, 4 << 20))


def dedup_tib(root: Path) -> Hostile:
    return Hostile("dedup-1TiB", _dedup_capture(root / "dedup-tib.kreplay", 1 << 40, 64 << 20))


def dedup_real_writer(root: Path) -> Hostile:
    """1 GiB of zeros stored by the real writer (one frame, deduplicated 256 times)."""
    path = root / "dedup-writer.kreplay"
    with replayfmt.CaptureWriter(path, threads=0) as w:
        buf = w.add_object(m.Buffer(size=1 << 30))
        w.copy_h2d(dst_buffer=buf, data=np.zeros(1 << 30, np.uint8))  # calloc'd: never touched
    return Hostile("dedup-real-writer", path)


# -- index floods ----------------------------------------------------------------------------


def _index_file(path: Path, batches: np.ndarray, frames: np.ndarray, fb: FileBuilder, zstd: bool) -> Path:
    from replayfmt.format.layout import pack_footer

    ops = int(batches["operation_count"].sum())
    body = records.encode_index(
        metadata_offset=fb.metadata_offset,
        operation_count=ops,
        object_count=0,
        payload_count=0,
        batches=batches,
        frames=frames,
    )
    if zstd:
        index = fb.chunk(
            ChunkKind.INDEX, zstandard.ZstdCompressor().compress(body), codec=Codec.ZSTD, logical=len(body)
        )
    else:
        index = fb.chunk(ChunkKind.INDEX, body)
    fb.data += pack_footer(index, len(fb.data) + 32)
    path.write_bytes(bytes(fb.data))
    return path


def index_flood(root: Path) -> Hostile:
    """A ~30 KB zstd index of a million batch entries all pointing at one chunk."""
    fb = FileBuilder()
    offset = fb.batch(_scope_batch(), 0, 1)
    batches = np.zeros(1_000_000, records.dtype("BatchEntry"))
    batches["offset"], batches["first_object"], batches["first_payload"] = offset, 1, 1
    batches["operation_count"][0] = 1
    batches["first_operation"][1:] = 1
    frames = np.zeros(0, records.dtype("FrameEntry"))
    return Hostile("index-flood", _index_file(root / "flood.kreplay", batches, frames, fb, True))


def index_flood_raw(root: Path) -> Hostile:
    """A raw index of 20,000 batch entries pointing at one chunk (under 2x the file's size)."""
    fb = FileBuilder()
    offset = fb.batch(_scope_batch(), 0, 1)
    batches = np.zeros(20_000, records.dtype("BatchEntry"))
    batches["offset"], batches["first_object"], batches["first_payload"] = offset, 1, 1
    batches["operation_count"][0] = 1
    batches["first_operation"][1:] = 1
    frames = np.zeros(0, records.dtype("FrameEntry"))
    return Hostile("index-flood-raw", _index_file(root / "flood-raw.kreplay", batches, frames, fb, False))


def frame_flood(root: Path) -> Hostile:
    """20,000 frame entries of distinct hashes, all pointing at one FRAME chunk."""
    fb = FileBuilder()
    offset = fb.frame(frame_hash(b"x"), b"x")
    fb.batch(_scope_batch(), 0, 1)
    rng = np.random.default_rng(0)
    frames = np.zeros(20_000, records.dtype("FrameEntry"))
    frames["hash"]["lo"] = rng.integers(0, 1 << 63, 20_000, dtype=np.uint64)
    frames["hash"]["hi"] = rng.integers(0, 1 << 63, 20_000, dtype=np.uint64)
    frames["offset"], frames["stored_size"], frames["logical_size"] = offset, 1, 1
    batches = np.array(fb.batches, dtype=records.dtype("BatchEntry"))
    return Hostile("frame-flood", _index_file(root / "frames.kreplay", batches, frames, fb, False))


# -- host paths ------------------------------------------------------------------------------


def _reference_capture(path: Path, ref: m.FileReference) -> Path:
    with replayfmt.CaptureWriter(path, threads=0) as w:
        buf = w.add_object(m.Buffer(size=4096))
        rid = w.add_object(ref)
        w.copy_h2d(dst_buffer=buf, src_file=rid, src_offset=0, size=4096)
    return path


def reference_to_device(root: Path) -> Hostile:
    # a device's st_size is 0: recorded as 0, a size check passes and the digest reads forever
    ref = m.FileReference(path="/dev/zero", size=0, validation=m.FileValidation.DIGEST, digest=bytes(16))
    return Hostile("reference-dev-zero", _reference_capture(root / "dev-zero.kreplay", ref), DRY_RUN)


def reference_to_fifo(root: Path) -> Hostile:
    fifo = root / "fifo"
    os.mkfifo(fifo)
    ref = m.FileReference(path=str(fifo), size=0, validation=m.FileValidation.DIGEST, digest=bytes(16))
    return Hostile("reference-fifo", _reference_capture(root / "fifo.kreplay", ref), DRY_RUN)


def remap_escape(root: Path) -> Hostile:
    safe = root / "safe"
    safe.mkdir()
    ref = m.FileReference(path="/data/../../../../../../etc/passwd", size=4096)
    path = _reference_capture(root / "escape.kreplay", ref)
    return Hostile(
        "remap-escape", path, (("run-replay", "--dry-run", "--continue-on-error", f"--file-remap=/data={safe}"),)
    )


def secret_digest(root: Path) -> Hostile:
    """A capture naming a host file it does not hold (a stand-in for /etc/shadow), with digest
    validation: neither the file's size nor its digest may be printed."""
    secret = root / "shadow"
    secret.write_bytes(b"root:$6$secret-hash:19000:0:99999:7:::\n" * 7)
    ref = m.FileReference(path=str(secret), size=4096, validation=m.FileValidation.DIGEST, digest=bytes(16))
    path = _reference_capture(root / "secret.kreplay", ref)
    ref2 = m.FileReference(
        path=str(secret), size=secret.stat().st_size, validation=m.FileValidation.DIGEST, digest=bytes(16)
    )
    path2 = _reference_capture(root / "secret2.kreplay", ref2)
    from replayfmt.container.files import file_digest
    from replayfmt.format.payloads import hash_hex

    size = str(secret.stat().st_size)
    hidden = (f" {size} ", f"{size} bytes", hash_hex(file_digest(str(secret))))
    return Hostile(
        "secret-digest",
        path,
        (*DRY_RUN, ("run-replay", "--dry-run", "--continue-on-error", str(path2))),
        must_not_print=hidden,
    )


# -- export directories ----------------------------------------------------------------------


def _payload_capture(path: Path) -> tuple[Path, str]:
    data = np.arange(100_000, dtype=np.int32)
    with replayfmt.CaptureWriter(path, threads=0) as w:
        buf = w.add_object(m.Buffer(size=data.nbytes))
        w.copy_h2d(dst_buffer=buf, data=data)
    with replayfmt.open(path) as cap:
        return path, cap.payload(1).hash_hex


def planted_symlink(root: Path) -> Hostile:
    path, digest = _payload_capture(root / "symlink.kreplay")
    out = root / "export-link"
    out.mkdir()
    victim = root / "victim.txt"
    victim.write_bytes(b"the user's file")
    (out / f"{digest}.bin").symlink_to(victim)
    (out / f"{digest}.tmp").symlink_to(victim)  # where the old exporter wrote its temporary
    return Hostile(
        "planted-symlink",
        path,
        (("dump-replay", "--format=jsonl", f"--payloads=files:{out}"),),
        untouched={victim: victim.read_bytes()},
    )


def planted_other_content(root: Path) -> Hostile:
    path, digest = _payload_capture(root / "other.kreplay")
    out = root / "export-other"
    out.mkdir()
    existing = out / f"{digest}.bin"
    existing.write_bytes(bytes(400_000))  # the payload's size, other bytes
    return Hostile(
        "planted-other-content",
        path,
        (("dump-replay", "--format=jsonl", f"--payloads=files:{out}"),),
        untouched={existing: existing.read_bytes()},
    )


BUILDERS: tuple[Callable[[Path], Hostile], ...] = (
    amplified_tables,
    amplified_strings,
    amplified_strings_zstd,
    zstd_index_bomb,
    zstd_records_bomb,
    zstd_metadata_bomb,
    spread_bomb,
    parameter_bomb,
    dedup_gib,
    dedup_tib,
    dedup_real_writer,
    index_flood,
    index_flood_raw,
    frame_flood,
    reference_to_device,
    reference_to_fifo,
    remap_escape,
    secret_digest,
    planted_symlink,
    planted_other_content,
)
