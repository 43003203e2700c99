"""The directory of a capture: where its record batches and payload frames lie, and how operation,
object and payload ids are numbered across batches. Built from the index chunk, or from a scan of
the chunks when the file has no valid footer; its arithmetic is checked before anything uses it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from replayfmt.container.batches import BatchEntry
from replayfmt.errors import ReplayFormatError
from replayfmt.format import model as m, records
from replayfmt.format.layout import CHUNK_HEADER_SIZE, FILE_HEADER_SIZE

FrameRow = tuple[int, int, int, int, int, int]  # hash lo, hash hi, offset, stored size, logical size, codec


def frame_entries(rows: Iterable[FrameRow]) -> np.ndarray:
    """FrameEntry structs (the index's frame table) from rows, in the order given."""
    rows = list(rows)
    frames = np.zeros(len(rows), dtype=records.dtype("FrameEntry"))
    if rows:
        table = np.array(rows, dtype=np.uint64)
        frames["hash"]["lo"], frames["hash"]["hi"] = table[:, 0], table[:, 1]
        frames["offset"], frames["stored_size"] = table[:, 2], table[:, 3]
        frames["logical_size"], frames["codec"] = table[:, 4], table[:, 5]
    return frames


@dataclass(frozen=True)
class Directory:
    """Batch columns as plain lists (for bisecting) and the frame table with a digest lookup."""

    batch_offsets: list[int]
    first_operation: list[int]
    operation_counts: list[int]
    first_object: list[int]
    object_counts: list[int]
    first_payload: list[int]
    payload_counts: list[int]
    frames: np.ndarray
    frame_row: dict[bytes, int]  # 16-byte digest -> row of ``frames``
    operation_count: int
    object_count: int
    payload_count: int

    def entry(self, i: int) -> BatchEntry:
        return BatchEntry(
            i,
            self.batch_offsets[i],
            self.first_operation[i],
            self.operation_counts[i],
            self.first_object[i],
            self.object_counts[i],
            self.first_payload[i],
            self.payload_counts[i],
        )


def build_directory(
    batches: np.ndarray,
    frames: np.ndarray,
    operation_count: int,
    object_count: int,
    payload_count: int,
    *,
    file_size: int,
    error: Callable[[str], ReplayFormatError],
) -> Directory:
    """Check the directory's arithmetic (ids dense and contiguous, offsets inside the file, no
    frame listed twice) and keep it as plain arrays."""
    first = batches["first_operation"].astype(np.int64)
    count = batches["operation_count"].astype(np.int64)
    expected_first = np.concatenate(([0], np.cumsum(count)[:-1])) if len(count) else first
    if len(batches) and not np.array_equal(first, expected_first):
        raise error("index: record batches do not number operations contiguously from 0")
    if int(count.sum()) != operation_count:
        raise error(f"index: batches hold {int(count.sum())} operations, the index says {operation_count}")
    for what, first_name, count_name, total in (
        ("object", "first_object", "object_count", object_count),
        ("payload", "first_payload", "payload_count", payload_count),
    ):
        starts = batches[first_name].astype(np.int64)
        counts = batches[count_name].astype(np.int64)
        expected = np.concatenate(([1], 1 + np.cumsum(counts)[:-1])) if len(counts) else starts
        if not np.array_equal(starts, expected) or int(counts.sum()) != total:
            raise error(f"index: {what} ids are not dense from 1")
    offsets = batches["offset"].astype(np.int64)
    if len(offsets) and (offsets.min() < FILE_HEADER_SIZE or offsets.max() > file_size - CHUNK_HEADER_SIZE):
        raise error("index: a record batch offset lies outside the file")
    # work stays proportional to the file: every entry is a distinct chunk of >= 64 bytes, and
    # batches (written in order) are distinct and hold something
    if len(batches) + len(frames) > file_size // CHUNK_HEADER_SIZE:
        raise error(f"index: lists {len(batches) + len(frames)} chunks, more than a {file_size}-byte file can hold")
    if len(offsets) > 1 and not bool((np.diff(offsets) > 0).all()):
        raise error("index: record batches are not listed in file order (or one chunk is listed twice)")
    if len(batches) and not bool(((count + batches["payload_count"].astype(np.int64)) > 0).all()):
        raise error("index: a record batch holds no operation and no payload")
    digests = np.ascontiguousarray(frames["hash"]).tobytes()  # Hash128 (lo, hi) is the 16-byte digest
    frame_row = {digests[16 * i : 16 * i + 16]: i for i in range(len(frames))}
    if len(frame_row) != len(frames):
        raise error("index: a payload frame is listed twice")

    def column(name: str) -> list[int]:
        return batches[name].astype(np.int64).tolist()

    return Directory(
        offsets.tolist(),
        first.tolist(),
        count.tolist(),
        column("first_object"),
        column("object_count"),
        column("first_payload"),
        column("payload_count"),
        frames,
        frame_row,
        operation_count,
        object_count,
        payload_count,
    )


@dataclass(frozen=True, slots=True)
class PayloadStats:
    """Byte accounting over all payloads of a capture."""

    payloads: int
    logical_bytes: int  # sum of distinct payloads' sizes
    frame_bytes: int  # logical bytes of distinct stored frames
    stored_bytes: int  # bytes the frames occupy in the file
    dedup_saved_bytes: int  # logical bytes not stored again thanks to frame dedup
    missing_frames: int  # frames referred to but absent (a capture cut short)

    @property
    def compression_ratio(self) -> float:
        return self.frame_bytes / self.stored_bytes if self.stored_bytes else 1.0


def payload_stats(payloads: Iterable[m.PayloadInfo], directory: Directory, count: int) -> PayloadStats:
    """Logical vs stored bytes over ``payloads`` (``count`` of them), by the frames ``directory`` lists."""
    logical = referenced = 0
    seen: set[bytes] = set()
    missing: set[bytes] = set()
    for info in payloads:
        logical += info.size
        for k, digest in enumerate(info.frames):
            length = min(info.frame_size, info.size - k * info.frame_size)
            referenced += length
            if digest not in directory.frame_row:
                missing.add(digest)
            seen.add(digest)
    present = [directory.frame_row[d] for d in seen if d in directory.frame_row]
    frames = directory.frames[present] if present else directory.frames[:0]
    frame_bytes = int(frames["logical_size"].astype(np.int64).sum())
    stored = int(frames["stored_size"].astype(np.int64).sum())
    return PayloadStats(count, logical, frame_bytes, stored, max(0, referenced - frame_bytes), len(missing))
