"""Reading .kreplay files: random access, lazy verified decoding, crash recovery.

:func:`open_capture` (exported as ``replayfmt.open``) opens the file and reads its header, footer
and index: time proportional to the index, not the file. Record batches are decoded (and
verified) on first use and cached; payloads are decompressed lazily, frame by frame, in parallel
threads, and every frame is checked against its hash. A file without a valid footer (the writer
was killed) is recovered by scanning its chunks: everything up to the first damaged chunk is
readable, and ``recovered`` / ``discarded_bytes`` say so.

Hostile files (docs/FORMAT.md §5.3): bytes are read with pread, never through a mapping (a file that
shrinks while open is an error, not SIGBUS); every declared size is checked against ``Limits``
before anything is allocated or decompressed.

Thread-safety: a Capture may be read from several threads at once.
"""

from __future__ import annotations

import bisect
import concurrent.futures as cf
import functools
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from replayfmt.container.batches import (
    DecodedBatch,
    EventUses,
    collector_paused,
    decode_batch,
    distinct_operations,
    materialize,
)
from replayfmt.container.bounded import BoundedFile, ChunkGaps
from replayfmt.container.chunks import ChunkReader
from replayfmt.container.directory import Directory, PayloadStats, build_directory, frame_entries, payload_stats
from replayfmt.container.first_decodes import FirstDecodes
from replayfmt.container.graph_budget import GraphBudget
from replayfmt.container.read_ahead import ReadAhead
from replayfmt.container.recovery import scan
from replayfmt.errors import MissingRecordError, ReplayFormatError, ReplayUsageError
from replayfmt.format import model as m, records
from replayfmt.format.layout import (
    ALIGNMENT,
    CHUNK_HEADER_SIZE,
    DEFAULT_LIMITS,
    FILE_HEADER_SIZE,
    FOOTER_SIZE,
    ChunkHeader,
    ChunkKind,
    Codec,
    FileHeader,
    Limits,
    align_up,
    checksum64,
    unpack_file_header,
    unpack_footer,
)
from replayfmt.format.object_columns import ObjectTable
from replayfmt.format.payloads import decompress_into, frame_hash, hash_hex
from replayfmt.format.timings import OriginalTimes, decode_timings

# Decoded record batches are kept while they hold at most this many records (operations and
# objects) together, most recently used first: a replay reads a capture three times (the plan's
# objects and operations, then the steps), and decoding a batch again costs far more than the
# columns it keeps (about 150 bytes a record; a 700k-operation capture is read once this way).
_CACHED_RECORDS = 1_500_000


class Capture:
    """An open .kreplay file. Create with :func:`replayfmt.open`; close with :meth:`close` or
    use as a context manager. Owns the file mapping."""

    def __init__(self, path: str | os.PathLike[str], *, limits: Limits = DEFAULT_LIMITS) -> None:
        self.path = str(path)
        self.limits = limits
        self._lock = threading.Lock()
        self._cache: OrderedDict[int, DecodedBatch] = OrderedDict()
        self._cached_records = 0  # operations and objects of the batches in _cache
        self.cache_records = _CACHED_RECORDS  # at most this many kept decoded (one batch at least)
        self.first_decodes = FirstDecodes()  # each batch, the first time it is decoded (dump-replay)
        self._pool: cf.ThreadPoolExecutor | None = None
        self._last_materialized: tuple[int, list[m.Operation]] | None = None
        self._file = BoundedFile(self.path)
        self._fd = self._file.fd
        self.size = self._file.size
        self.recovered = False
        self.partial = ""
        self.discarded_bytes = 0
        self.recovery_reason = ""
        self._timings_offset = 0  # the TIMINGS chunk (the original program's device times), if any
        self.timings_problem = ""  # why an invalid (OPTIONAL) TIMINGS chunk was dropped, if it was
        self._graphs = GraphBudget(limits)  # every graph of the file together, charged as decoded
        self._chunks = ChunkReader(self._file, self.path, self.limits)
        # (reads through the chunk reader, not a method of this object: no cycle keeps an
        # unclosed capture, its file and its batches alive after its last reference goes)
        self._read_ahead = ReadAhead(
            functools.partial(self._chunks.read, kind=ChunkKind.RECORDS, limit=self.limits.max_record_batch_size)
        )
        self._last_decoded = -1  # the batch decoded last: the next one is read ahead in a scan
        try:
            self.header: FileHeader = unpack_file_header(self._file.read(0, FILE_HEADER_SIZE), self.path)
            tail = self._file.read(self.size - FOOTER_SIZE, FOOTER_SIZE) if self.size >= FOOTER_SIZE else b""
            footer = unpack_footer(tail) if tail else None
            if footer is None or footer[1] != self.size:
                self._recover("no valid footer (the writer did not close the file)")
            else:
                self._load_index(footer[0])
        except BaseException:
            self.close()
            raise

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> Capture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the file and threads. Idempotent; data already returned stays valid."""
        self._read_ahead.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._cache.clear()
        self._cached_records = 0
        self._last_materialized = None
        self._file.close()
        self._fd = -1

    # -- index and recovery ----------------------------------------------------------------

    def _load_index(self, index_offset: int) -> None:
        # the index lists chunks of this file (>= 64 bytes each, <= 48 bytes of entry each)
        limit = min(self.limits.max_index_size, 2 * self.size + (64 << 10))
        index = self._chunks.decode(index_offset, ChunkKind.INDEX, "Index", limit)
        batches = records.struct_array(index["batches"], "BatchEntry")
        frames = records.struct_array(index["frames"], "FrameEntry")
        self.metadata = self._read_metadata(index["metadata_offset"])
        self.partial = str(index.get("partial") or "")  # (1.3) why the capture stopped early; "" complete
        self._timings_offset = int(index.get("timings_offset") or 0)
        self._set_directory(batches, frames, index["operation_count"], index["object_count"], index["payload_count"])
        self._check_unlisted(index["metadata_offset"], index_offset)

    def _check_unlisted(self, metadata_offset: int, index_offset: int) -> None:
        """Chunks the index does not list must be of a kind marked OPTIONAL (FORMAT.md §3.2)."""
        self._gaps = ChunkGaps(
            self._directory.frames,
            self._directory.batch_offsets,
            metadata_offset,
            index_offset,
            self.size,
            self._chunks.header,
            self.path,
        )
        self._gaps.check(align_up(self.header.header_size), self._chunks.header(metadata_offset, "METADATA chunk").end)

    def _read_metadata(self, offset: int) -> m.CaptureMetadata:
        meta = self._chunks.decode(offset, ChunkKind.METADATA, "CaptureMetadata", self.limits.max_metadata_size)
        return records.decode_metadata(meta)

    def _recover(self, reason: str) -> None:
        """Rebuild the directory by scanning chunks (see :mod:`replayfmt.container.recovery`)."""
        self.recovered = True
        found = scan(self._chunks, align_up(self.header.header_size), self.limits)
        self.discarded_bytes = max(0, self.size - found.end)
        stopped = f"; scan stopped at offset {found.end}: {found.stop_reason}" if found.stop_reason else ""
        self.recovery_reason = reason + stopped
        self.metadata = found.metadata
        self._timings_offset = found.timings_offset
        frames = frame_entries(found.frame_rows)
        self._set_directory(found.batches, frames, found.operation_count, found.object_count, found.payload_count)

    def _set_directory(
        self, batches: np.ndarray, frames: np.ndarray, operation_count: int, object_count: int, payload_count: int
    ) -> None:
        d = build_directory(
            batches, frames, operation_count, object_count, payload_count, file_size=self.size, error=self._chunks.error
        )
        self._directory = d
        self.operation_count, self.object_count, self.payload_count = operation_count, object_count, payload_count

    @property
    def chunks(self) -> ChunkReader:
        """Chunk-level access to the file (headers, verified bodies), for inspection and tests."""
        return self._chunks

    @property
    def directory(self) -> Directory:
        """Where the record batches and payload frames lie (from the index, or recovered)."""
        return self._directory

    # -- record batches --------------------------------------------------------------------

    @property
    def batch_count(self) -> int:
        return len(self._directory.batch_offsets)

    def batch(self, i: int) -> DecodedBatch:
        """Record batch ``i`` decoded, its columns as they are stored (``kinds``, ``copies``,
        ``table_ops``, ``objects``, ...): for views that walk every batch without making an
        operation object each (dump's summary). Cached; raises ReplayFormatError where damaged."""
        refused = self._graphs.refusal(i)
        if refused is not None:  # over the capture's graph budget: refused again, never decoded again
            raise refused
        with self._lock:
            cached = self._cache.get(i)
            if cached is not None:
                self._cache.move_to_end(i)
                return cached
        with collector_paused():  # decoding makes many small records and no cycles (see batches)
            batch = self._decode_batch(i)
        with self._lock:
            # batches holding graphs too: charged once to the graph budget (GraphBudget), they
            # count against the cache's records like any other and are decoded again if dropped
            if i not in self._cache:
                self._cache[i] = batch
                self._cached_records += len(batch.kinds) + len(batch.objects)
            while len(self._cache) > 1 and self._cached_records > self.cache_records:
                _, dropped = self._cache.popitem(last=False)
                self._cached_records -= len(dropped.kinds) + len(dropped.objects)
        self.first_decodes.note(i, batch)
        return batch

    def _decode_batch(self, i: int) -> DecodedBatch:
        entry = self._directory.entry(i)
        records = entry.operation_count + entry.object_count
        if records > self.limits.max_batch_records:  # before its body is read or decompressed
            raise self._chunks.error(
                f"holds {records} operations and objects, over Limits.max_batch_records "
                f"({self.limits.max_batch_records})",
                entry.offset,
                f"record batch {i}",
            )
        body = self._read_ahead.take(entry.offset)
        if body is None:
            body = self._chunks.read(entry.offset, ChunkKind.RECORDS, self.limits.max_record_batch_size)
        sequential, self._last_decoded = i == self._last_decoded + 1, i
        if sequential and i + 1 < self.batch_count:  # a scan in order: the next body is read meanwhile
            ahead = self._directory.entry(i + 1).offset
            with self._lock:
                cached = i + 1 in self._cache
            if not cached:
                self._read_ahead.start(ahead)
        d = self._chunks.decode_body(body, "RecordBatch", entry.offset, "RECORDS chunk")
        if not self.recovered:  # the gap after a batch (its end is known once its header is read)
            self._gaps.walk(self._chunks.header(entry.offset, f"record batch {i}").end)
        batch = decode_batch(
            d, entry, self.limits, lambda message, record: self._chunks.error(message, entry.offset, record)
        )
        graphs = [o for o in batch.objects.others if isinstance(o, m.Graph)]  # (events are never graphs)
        self._graphs.charge(i, graphs, lambda message: self._chunks.error(message, entry.offset, f"record batch {i}"))
        return batch

    def _batch_of_operation(self, index: int) -> int:
        if not 0 <= index < self.operation_count:
            raise IndexError(f"operation {index} out of range (the capture has {self.operation_count})")
        return bisect.bisect_right(self._directory.first_operation, index) - 1

    # -- operations ------------------------------------------------------------------------

    def operation(self, index: int) -> m.Operation:
        """The operation numbered ``index`` (0-based, capture order)."""
        bi = self._batch_of_operation(index)
        return self._batch_operations(bi)[index - self._directory.first_operation[bi]]

    def iter_operations(self, start: int = 0, stop: int | None = None) -> Iterator[m.Operation]:
        """Operations ``start`` (inclusive) to ``stop`` (exclusive), in capture order."""
        stop = self.operation_count if stop is None else min(stop, self.operation_count)
        start = max(0, start)
        if start >= stop:
            return
        bi = self._batch_of_operation(start)
        while bi < self.batch_count and self._directory.first_operation[bi] < stop:
            first = self._directory.first_operation[bi]
            lo, hi = max(0, start - first), min(self._directory.operation_counts[bi], stop - first)
            ops = self._batch_operations(bi)
            yield from ops[lo:hi] if lo or hi < len(ops) else ops
            bi += 1

    def distinct_operations(self) -> Iterator[tuple[m.Operation | EventUses, int]]:
        """Every operation in capture order, except that a launch, copy, memset or id operation equal
        to an earlier one of its record batch in all but index (a launch's parameter values aside) is
        folded into it, a batch's creates come as its first one, and its uses of events as one
        ``EventUses`` of columns (see ``container.batches.distinct_operations``): ``(operation, how
        many it stands for)``. What a checker looks at once (the replay plan): a million launches of
        a few shapes are a few records."""
        for bi in range(self.batch_count):
            groups = self.first_decodes.take(bi)  # worked out when the batch was first decoded
            if groups is None:
                batch = self.batch(bi)
                with collector_paused():
                    groups = distinct_operations(batch)
            yield from groups

    def __iter__(self) -> Iterator[m.Operation]:
        return self.iter_operations()

    def _batch_operations(self, bi: int) -> list[m.Operation]:
        """Every operation of batch ``bi`` as model objects, built column-wise and cached."""
        last = self._last_materialized
        if last is not None and last[0] == bi:
            return last[1]
        b = self.batch(bi)
        with collector_paused():
            ops = materialize(b)
        self._last_materialized = (bi, ops)  # one batch only: many live records slow the GC
        return ops

    def operation_kinds(self) -> np.ndarray:
        """The kind code of every operation, as one uint8 array (decodes every batch)."""
        if not self.batch_count:
            return np.zeros(0, np.uint8)
        return np.concatenate([self.batch(i).kinds for i in range(self.batch_count)])

    def original_times(self) -> OriginalTimes:
        """The original program's device times (the recorder's CUPTI records); empty when none.

        The TIMINGS chunk is OPTIONAL: an invalid one is dropped (empty times), and
        ``timings_problem`` says why, for the tools to warn; it never fails the read."""
        return self._original_times(rows=True)

    def check_original_times(self) -> str:
        """Why the original program's times are dropped (``timings_problem``), or "" when they are
        valid or absent: the TIMINGS chunk checked whole, without an object per row."""
        self._original_times(rows=False)
        return self.timings_problem

    def _original_times(self, *, rows: bool) -> OriginalTimes:
        at = self._timings_offset
        if not at or self.timings_problem:
            return OriginalTimes()
        try:
            d = self._chunks.decode(at, ChunkKind.TIMINGS, "Timings", self.limits.max_index_size)
            return decode_timings(d, self.operation_count, path=self.path, offset=at, rows=rows)
        except ReplayFormatError as exc:
            self.timings_problem = f"the original program's times (TIMINGS chunk) were dropped: {exc}"
            return OriginalTimes()

    # -- objects ---------------------------------------------------------------------------

    def object(self, object_id: int) -> m.ObjectDef:
        """The object with this id (ids are dense from 1)."""
        if not 1 <= object_id <= self.object_count:
            raise MissingRecordError(f"object {object_id} does not exist (the capture has {self.object_count})")
        bi = bisect.bisect_right(self._directory.first_object, object_id) - 1
        while self._directory.object_counts[bi] == 0:  # batches without objects share a first_object
            bi -= 1
        return self.batch(bi).objects[object_id - self._directory.first_object[bi]]

    def objects(self) -> Iterator[m.ObjectDef]:
        """Every object, in order of id."""
        for bi in range(self.batch_count):
            if self._directory.object_counts[bi]:
                yield from self.batch(bi).objects

    def object_table(self) -> ObjectTable:
        """Every object by id, its events kept as columns (a capture may hold 200k events, and
        none is made into an object unless it is asked for)."""
        counts = self._directory.object_counts
        return ObjectTable.gather(self.batch(bi).objects for bi in range(self.batch_count) if counts[bi])

    # -- payloads --------------------------------------------------------------------------

    def payload(self, payload_id: int) -> m.PayloadInfo:
        if not 1 <= payload_id <= self.payload_count:
            raise MissingRecordError(f"payload {payload_id} does not exist (the capture has {self.payload_count})")
        bi = bisect.bisect_right(self._directory.first_payload, payload_id) - 1
        while self._directory.payload_counts[bi] == 0:
            bi -= 1
        return self.batch(bi).payloads[payload_id - self._directory.first_payload[bi]]

    def payloads(self) -> Iterator[m.PayloadInfo]:
        for bi in range(self.batch_count):
            if self._directory.payload_counts[bi]:
                yield from self.batch(bi).payloads

    def frame_location(self, digest: bytes) -> tuple[int, int, int, int] | None:
        """(offset, stored_size, logical_size, codec) of a stored frame, or None if absent."""
        row = self._directory.frame_row.get(digest)
        if row is None:
            return None
        f = self._directory.frames[row]
        return int(f["offset"]), int(f["stored_size"]), int(f["logical_size"]), int(f["codec"])

    def payload_stored_size(self, info: m.PayloadInfo) -> int:
        """Bytes the payload's distinct frames occupy in the file."""
        total = 0
        for digest in set(info.frames):
            loc = self.frame_location(digest)
            total += loc[1] if loc else 0
        return total

    def frame_ranges(self, payload_id: int) -> list[tuple[int, int]]:
        """(offset, length) of each frame of a payload: the units that read in parallel."""
        info = self.payload(payload_id)
        return [
            (k * info.frame_size, min(info.frame_size, info.size - k * info.frame_size))
            for k in range(len(info.frames))
        ]

    def read_frame_into(self, payload_id: int, k: int, target: Any, *, check: bool = True) -> None:
        """Decode frame ``k`` of a payload straight into ``target`` (exactly the frame's length),
        with no intermediate copy: raw frames are read with preadv, zstd frames decompressed in
        place. Releases the GIL for the heavy parts, so frames read in parallel threads.
        ``check=False`` skips hashing the content (faster; a corrupted frame then goes unseen,
        except that a damaged zstd frame still fails to decompress)."""
        self.read_frames_into(payload_id, k, 1, target, check=check)

    def read_frames_into(self, payload_id: int, first: int, count: int, target: Any, *, check: bool = True) -> None:
        """Decode frames ``first .. first + count - 1`` of a payload into ``target`` (exactly their
        total length), as :meth:`read_frame_into` does one. Raw frames stored back to back are
        read with a single preadv (the chunk headers between them land in a scratch buffer):
        every call releases and retakes the GIL, and with many reading threads those hand-offs,
        not the copying, bound the rate."""
        info = self.payload(payload_id)
        view = memoryview(target).cast("B")
        if first < 0 or count < 1 or first + count > len(info.frames):
            raise ReplayUsageError(f"payload {payload_id}: frames {first}..{first + count - 1} do not exist")
        frames = [self._frame_header(info, k) for k in range(first, first + count)]
        if len(view) != sum(header.logical_size for header, _, _ in frames):
            raise ReplayUsageError(f"payload {payload_id}: target holds {len(view)} bytes, not the frames' total")
        start = 0
        run: list[tuple[ChunkHeader, bytes, str, memoryview]] = []  # raw frames stored back to back
        for header, digest, record in frames:
            part = view[start : start + header.logical_size]
            start += header.logical_size
            if header.codec != Codec.RAW:
                self._read_raw_run(run, check)
                run = []
                self._decompress_frame(header, digest, record, part, check)
                continue
            if run and run[-1][0].end != header.offset:
                self._read_raw_run(run, check)
                run = []
            run.append((header, digest, record, part))
        self._read_raw_run(run, check)

    def check_frame_digest(self, payload_id: int, k: int, digest: bytes) -> None:
        """Raise the reader's checksum-mismatch error for frame ``k`` of a payload unless
        ``digest`` (its content's XXH3-128, computed elsewhere: on a device) is the recorded one."""
        header, expected, record = self._frame_header(self.payload(payload_id), k)
        if digest != expected:
            raise self._frame_mismatch(header, record)

    def _read_raw_run(self, run: list[tuple[ChunkHeader, bytes, str, memoryview]], check: bool) -> None:
        if not run:
            return
        gap = memoryview(bytearray(CHUNK_HEADER_SIZE + ALIGNMENT))  # alignment padding, then the next header
        buffers = [run[0][3]]
        for (before, _, _, _), (header, _, _, part) in pairwise(run):
            buffers += [gap[: header.body_offset - (before.body_offset + before.stored_size)], part]
        first, last = run[0][0], run[-1][0]
        position, wanted = first.body_offset, last.body_offset + last.stored_size - first.body_offset
        while wanted:
            n = os.preadv(self._fd, buffers, position)
            if n <= 0:
                raise self._chunks.error(
                    "frame ends early (the file shrank while it was read)", first.offset, run[0][2]
                )
            position, wanted = position + n, wanted - n
            while buffers and n >= len(buffers[0]):  # a short read: go on where it stopped
                n -= len(buffers.pop(0))
            if n:
                buffers[0] = buffers[0][n:]
        if check:
            for header, digest, record, part in run:
                if frame_hash(part) != digest:
                    raise self._frame_mismatch(header, record)

    def _decompress_frame(self, header: ChunkHeader, digest: bytes, record: str, view: memoryview, check: bool) -> None:
        stored = self._file.read(header.body_offset, header.stored_size, record)
        if check and checksum64(stored) != header.body_checksum:
            raise self._chunks.error("body checksum mismatch (the file is corrupted)", header.offset, record)
        decompress_into(stored, view, path=self.path, offset=header.offset, record=record)
        if check and frame_hash(view) != digest:
            raise self._frame_mismatch(header, record)

    def _frame_mismatch(self, header: ChunkHeader, record: str) -> ReplayFormatError:
        return self._chunks.error(
            "frame content does not match its hash (checksum mismatch: the file is corrupted)", header.offset, record
        )

    def _frame_header(self, info: m.PayloadInfo, k: int) -> tuple[ChunkHeader, bytes, str]:
        digest = info.frames[k]
        record = f"payload {info.id} frame {k}"
        expected = min(info.frame_size, info.size - k * info.frame_size)
        loc = self.frame_location(digest)
        if loc is None:
            raise self._chunks.error(
                f"frame {hash_hex(digest)} is not in the file (the capture was cut short before "
                "it was written); recapture, or skip what needs this payload",
                None,
                record,
            )
        header = self._chunks.header(loc[0], record)
        if header.kind != ChunkKind.FRAME or header.key != digest:
            raise self._chunks.error("the index points at a chunk that is not this frame", loc[0], record)
        if header.logical_size != expected:
            raise self._chunks.error(
                f"frame holds {header.logical_size} bytes, the payload expects {expected}", loc[0], record
            )
        if header.logical_size > self.limits.max_frame_size:
            raise self._chunks.error(f"declares {header.logical_size} bytes, over the frame limit", loc[0], record)
        return header, digest, record

    def check_frames(self, payload_id: int) -> None:
        """Check, without decompressing, that every frame of a payload is in the file as the
        index says: a FRAME chunk with this key, holding the bytes the payload expects, within
        the frame limit (ReplayFormatError naming the payload, frame and offset)."""
        info = self.payload(payload_id)
        seen: set[bytes] = set()
        for k, digest in enumerate(info.frames):  # a frame repeated (deduplicated) is looked at once
            if digest not in seen or k == len(info.frames) - 1:  # (the last may be shorter)
                seen.add(digest)
                self._frame_header(info, k)

    def _read_frame(self, info: m.PayloadInfo, k: int) -> bytes | memoryview:
        header, digest, record = self._frame_header(info, k)
        data = self._chunks.body(header, self.limits.max_frame_size, record)
        if frame_hash(data) != digest:
            raise self._frame_mismatch(header, record)
        return data

    def read_payload(
        self, payload_id: int, offset: int = 0, size: int | None = None, *, threads: int | None = None
    ) -> bytes:
        """Bytes ``[offset, offset + size)`` of a payload, decompressing only the frames needed."""
        info = self.payload(payload_id)
        size = info.size - offset if size is None else size
        if size > self.limits.max_read_size:
            raise ReplayUsageError(
                f"payload {payload_id}: {size} bytes are more than read_payload returns at once "
                f"(Limits.max_read_size {self.limits.max_read_size}); read it in pieces with read_payload_into"
            )
        out = bytearray(max(0, size))
        self.read_payload_into(payload_id, out, offset, threads=threads)
        return bytes(out)

    def read_payload_into(self, payload_id: int, out: Any, offset: int = 0, *, threads: int | None = None) -> int:
        """Fill the writable buffer ``out`` with payload bytes from ``offset``; frames are
        decompressed and verified in parallel threads. Returns the number of bytes written."""
        info = self.payload(payload_id)
        target = memoryview(out).cast("B")
        size = len(target)
        if offset < 0 or offset + size > info.size:
            raise ReplayUsageError(
                f"payload {payload_id}: range [{offset}, {offset + size}) is outside its {info.size} bytes"
            )
        if size == 0:
            return 0
        fs = info.frame_size
        first, last = offset // fs, (offset + size - 1) // fs

        def fill(k: int) -> None:
            frame_start = k * fs
            frame_end = min(frame_start + fs, info.size)
            if offset <= frame_start and frame_end <= offset + size:  # whole frame: decode in place
                self.read_frame_into(payload_id, k, target[frame_start - offset : frame_end - offset])
                return
            data = memoryview(self._read_frame(info, k)).cast("B")
            lo = max(offset, frame_start)
            hi = min(offset + size, frame_start + len(data))
            target[lo - offset : hi - offset] = data[lo - frame_start : hi - frame_start]

        frames = range(first, last + 1)
        if len(frames) == 1 or threads == 1:
            for k in frames:
                fill(k)
        else:
            for future in [self._executor(threads).submit(fill, k) for k in frames]:
                future.result()
        return size

    def _executor(self, threads: int | None) -> cf.ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = cf.ThreadPoolExecutor(
                    threads or min(16, os.cpu_count() or 1), thread_name_prefix="kreplay-read"
                )
            return self._pool

    def payload_stats(self) -> PayloadStats:
        """Logical vs stored bytes over every payload (decodes every batch that defines one)."""
        return payload_stats(self.payloads(), self._directory, self.payload_count)


def open_capture(path: str | os.PathLike[str], *, limits: Limits = DEFAULT_LIMITS) -> Capture:
    """Open a .kreplay file for reading (exported as ``replayfmt.open``)."""
    return Capture(Path(path), limits=limits)
