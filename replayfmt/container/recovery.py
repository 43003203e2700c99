"""Crash recovery: a file without a valid footer (the writer was killed) is scanned chunk by chunk
from the start; everything up to the first damaged chunk is kept, with the longest run of record
batches that continues the operation, object and payload numbering."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replayfmt.container.chunks import ChunkReader
from replayfmt.errors import ReplayFormatError
from replayfmt.format import model as m, records
from replayfmt.format.layout import KNOWN_CHUNK_KINDS, ChunkFlags, ChunkKind, Limits


@dataclass(frozen=True)
class Recovered:
    """What a scan found: the directory's rows and counts, and how much was discarded."""

    batches: np.ndarray  # BatchEntry structs
    frame_rows: list[tuple[int, int, int, int, int, int]]
    operation_count: int
    object_count: int
    payload_count: int
    metadata: m.CaptureMetadata
    timings_offset: int
    end: int  # where the scan stopped
    stop_reason: str  # why it stopped before the end of the file ("" when it reached it)


def scan(chunks: ChunkReader, start: int, limits: Limits) -> Recovered:
    """Scan the chunks from ``start``; stop at the first damaged one. A chunk of an unknown kind
    that is not marked OPTIONAL is a newer writer's: refused, not dropped as damage."""
    offset = start
    batch_rows: list[tuple[int, ...]] = []
    frame_rows: list[tuple[int, int, int, int, int, int]] = []
    metadata: m.CaptureMetadata | None = None
    timings_offset = 0
    stop_reason = ""
    unknown = 0
    while offset < chunks.size:
        try:
            header = chunks.header(offset, "chunk")
            if header.kind == ChunkKind.FRAME:
                chunks.check_body(header)
                lo, hi = int.from_bytes(header.key[:8], "little"), int.from_bytes(header.key[8:], "little")
                frame_rows.append((lo, hi, offset, header.stored_size, header.logical_size, header.codec))
            elif header.kind == ChunkKind.RECORDS:
                body = bytes(chunks.body(header, limits.max_record_batch_size, "RECORDS chunk"))
                d = chunks.decode_body(body, "RecordBatch", offset, "RECORDS chunk")
                kinds = d["operation_kinds"]
                count = 0 if kinds is None else len(kinds)
                objects, payloads = len(d["objects"] or ()), len(d["payloads"] or ())
                batch_rows.append(
                    (offset, d["first_operation"], count, d["first_object"], objects, d["first_payload"], payloads)
                )
            elif header.kind == ChunkKind.METADATA and metadata is None:
                meta = chunks.decode(offset, ChunkKind.METADATA, "CaptureMetadata", limits.max_metadata_size)
                metadata = records.decode_metadata(meta)
            elif header.kind == ChunkKind.TIMINGS:
                timings_offset = offset
            elif header.kind not in KNOWN_CHUNK_KINDS and not header.flags & ChunkFlags.OPTIONAL:
                unknown = header.kind
                break
        except ReplayFormatError as exc:
            stop_reason = exc.message
            break
        offset = header.end
    if unknown:
        raise chunks.error(f"unknown chunk kind {unknown} is not optional (upgrade replayfmt)", offset)
    if metadata is None:
        raise chunks.error("no readable capture metadata: the file holds nothing recoverable", offset)
    kept, next_op, next_obj, next_payload = [], 0, 1, 1
    for row in sorted(batch_rows, key=lambda r: r[1]):
        if (row[1], row[3], row[5]) != (next_op, next_obj, next_payload):
            break
        kept.append(row)
        next_op, next_obj, next_payload = row[1] + row[2], row[3] + row[4], row[5] + row[6]
    dt = records.dtype("BatchEntry")
    batches = np.array(kept, dtype=dt) if kept else np.zeros(0, dt)
    return Recovered(
        batches, frame_rows, next_op, next_obj - 1, next_payload - 1, metadata, timings_offset, offset, stop_reason
    )
