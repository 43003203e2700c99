"""Hand-built .kreplay files for rejection tests: valid framing around hostile content."""

from __future__ import annotations

from pathlib import Path

import flatbuffers
import numpy as np

from replayfmt.format import model as m, records
from replayfmt.format.layout import (
    FILE_HEADER_SIZE,
    FORMAT_MAJOR,
    FORMAT_MINOR,
    ChunkKind,
    Codec,
    FileHeader,
    align_up,
    pack_chunk_header,
    pack_file_header,
    pack_footer,
)


class FileBuilder:
    def __init__(self, major: int = FORMAT_MAJOR, minor: int = FORMAT_MINOR) -> None:
        self.data = bytearray(pack_file_header(FileHeader(major, minor, FILE_HEADER_SIZE, 0)))
        self.batches: list[tuple[int, ...]] = []
        self.frames: list[tuple[int, ...]] = []
        self.metadata_offset = self.chunk(ChunkKind.METADATA, records.encode_metadata(m.CaptureMetadata(tool="craft")))

    def chunk(
        self,
        kind: int,
        body: bytes,
        *,
        codec: int = Codec.RAW,
        logical: int | None = None,
        key: bytes = bytes(16),
        flags: int = 0,
    ) -> int:
        offset = len(self.data)
        logical = len(body) if logical is None else logical
        self.data += pack_chunk_header(kind, flags, codec, body, logical, key) + body
        self.data += bytes(align_up(len(self.data)) - len(self.data))
        return offset

    def frame(self, key: bytes, body: bytes, *, codec: int = Codec.RAW, logical: int | None = None) -> int:
        offset = self.chunk(ChunkKind.FRAME, body, codec=codec, logical=logical, key=key)
        self.frames.append(
            (
                int.from_bytes(key[:8], "little"),
                int.from_bytes(key[8:], "little"),
                offset,
                len(body),
                len(body) if logical is None else logical,
                codec,
            )
        )
        return offset

    def batch(
        self,
        body: bytes,
        first_op: int,
        ops: int,
        first_obj: int = 1,
        objs: int = 0,
        first_payload: int = 1,
        payloads: int = 0,
    ) -> int:
        offset = self.chunk(ChunkKind.RECORDS, body)
        self.batches.append((offset, first_op, ops, first_obj, objs, first_payload, payloads))
        return offset

    def finish(self, path: Path, *, index: bool = True, batches: list[tuple[int, ...]] | None = None) -> Path:
        if index:
            rows = self.batches if batches is None else batches
            frames = np.zeros(len(self.frames), dtype=records.dtype("FrameEntry"))
            for i, (lo, hi, off, stored, logical, codec) in enumerate(self.frames):
                frames[i] = ((lo, hi), off, stored, logical, codec)
            ops = sum(r[2] for r in rows)
            body = records.encode_index(
                metadata_offset=self.metadata_offset,
                operation_count=ops,
                object_count=sum(r[4] for r in rows),
                payload_count=sum(r[6] for r in rows),
                batches=np.array(rows, dtype=records.dtype("BatchEntry")),
                frames=frames,
            )
            index_offset = self.chunk(ChunkKind.INDEX, body)
            self.data += pack_footer(index_offset, len(self.data) + 32)
        path.write_bytes(bytes(self.data))
        return path


def record_batch(**overrides) -> bytes:
    fields = {
        "first_operation": 0,
        "first_object": 1,
        "first_payload": 1,
        "kinds": b"",
        "launches": np.zeros(0, records.dtype("LaunchRecord")),
        "copies": np.zeros(0, records.dtype("CopyRecord")),
        "memsets": np.zeros(0, records.dtype("MemsetRecord")),
        "table_ops": [],
        "id_operations": np.zeros(0, records.dtype("IdOperationRecord")),
        "relocations": np.zeros(0, records.dtype("Relocation")),
        "parameter_bytes": b"",
        "objects": [],
        "payloads": [],
    }
    fields.update(overrides)
    return records.encode_record_batch(**fields)


def amplifying_executable_batch(fanout: int) -> bytes:
    """A RecordBatch whose objects, functions and parameters all share one offset, fanout times
    at each level: tiny on disk, fanout**3 tables if walked naively."""
    from replayfmt.format.fb import Executable, Function, Object, Parameter, RecordBatch

    b = flatbuffers.Builder(1024)
    Parameter.Start(b)
    Parameter.AddSize(b, 8)
    param = Parameter.End(b)
    b.StartVector(4, fanout, 4)
    for _ in range(fanout):
        b.PrependUOffsetTRelative(param)
    params = b.EndVector()
    name = b.CreateString("f")
    Function.Start(b)
    Function.AddName(b, name)
    Function.AddParameters(b, params)
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
    b.StartVector(4, fanout, 4)
    for _ in range(fanout):
        b.PrependUOffsetTRelative(obj)
    objs = b.EndVector()
    RecordBatch.Start(b)
    RecordBatch.AddObjects(b, objs)
    b.Finish(RecordBatch.End(b))
    return bytes(b.Output())
