"""CaptureWriter: streams a capture into a .kreplay file.

Memory stays flat however long the capture: operations are gathered into record batches that are
sealed every ``batch_operations`` operations or ``batch_bytes`` bytes (and by a background thread
once a batch is ``flush_interval`` seconds old) and written out, and at most ``2 * threads``
payload frames are in flight at once.

Concurrency: every method may be called from any thread; operations are numbered in the order
their calls take the writer's lock. Payload frames are hashed on the calling thread (identical
frames are recognised at once) or their digests given (add_payload_frames), then compressed and
written at their own reserved offsets by a pool of worker threads. Record batches are compressed
and written in order by one more worker, each only after the frames it refers to are on disk, so
a file cut short by a crash never refers to a frame written after the records that use it.

``flush()`` says what it promises (``durable=True``: an OS crash loses nothing recorded before it).

Errors while writing (a full disk, an I/O error) are ReplayErrors naming the file and offset. Every
chunk is written at an offset the writer owns, so a failed write leaves at most a torn last chunk
(the reader recovers the file up to it); a writer that fails before its metadata is down removes
the file and says so, so a retry is never refused as "already exists".
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import os
import struct
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from replayfmt.container.batches import OPERATION_BYTES, RELOCATION_STRUCT, LaunchTemplate, OpenBatch, PackedRelocations
from replayfmt.container.directory import frame_entries
from replayfmt.container.output import InlineExecutor, create_file, sync_file, write_all
from replayfmt.container.payload_store import FetchMissing, FrameStore, PayloadIds
from replayfmt.container.sealing import RecordSealer
from replayfmt.errors import ReplayError, ReplayUsageError
from replayfmt.format import layout, model as m, records, timings
from replayfmt.format.generated import fb
from replayfmt.format.graph_records import check_graph_within_limits
from replayfmt.format.layout import (
    FILE_HEADER_SIZE,
    FORMAT_MAJOR,
    FORMAT_MINOR,
    ChunkFlags,
    ChunkKind,
    Codec,
    FileHeader,
    align_up,
    pack_chunk_header,
    pack_file_header,
    pack_footer,
)
from replayfmt.format.payloads import (
    DEFAULT_FRAME_SIZE,
    MIN_FRAME_SIZE,
    CompressionPolicy,
    FrameCompressor,
    payload_hash,
)

BytesLike = bytes | bytearray | memoryview | np.ndarray
Checkpointed = Mapping[int, BytesLike] | Iterable[m.CheckpointEntry]

_K = m.OperationKind
_ZERO_PAD = bytes(8)
_RECORD_COMPRESSION = CompressionPolicy(level=3, min_saving=0.05)
# struct.Struct twins of the schema's LaunchRecord and Relocation (a test checks the layouts agree)
_LAUNCH_STRUCT = struct.Struct("<18I")
_RELOCATION_SHIFT = RELOCATION_STRUCT.size.bit_length() - 1  # 32-byte structs: a count is a shift away
_ID_OPERATION_STRUCT = struct.Struct("<II")


class CaptureWriter:
    """Writes one .kreplay capture. Use as a context manager, or call :meth:`close`.

    ``path`` must not exist unless ``overwrite=True``: nothing the user had is replaced silently.
    ``threads`` compress payload frames (default: one per core, at most 16; 0: on the calling thread)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        metadata: m.CaptureMetadata | None = None,
        overwrite: bool = False,
        compression: CompressionPolicy = CompressionPolicy(),
        frame_size: int = DEFAULT_FRAME_SIZE,
        threads: int | None = None,
        batch_operations: int = 8192,
        batch_bytes: int = 4 << 20,
        flush_interval: float = 1.0,
        durable: bool = False,
    ) -> None:
        if frame_size < MIN_FRAME_SIZE or frame_size > (64 << 20):
            raise ReplayUsageError(f"frame_size must be within [{MIN_FRAME_SIZE}, {64 << 20}] bytes")
        if not 1 <= batch_operations <= layout.MAX_BATCH_OPERATIONS:  # a reader refuses larger batches
            raise ReplayUsageError(f"batch_operations must be within [1, {layout.MAX_BATCH_OPERATIONS}]")
        fb.import_all()  # (50 ms) now, not at a first record, which a recorder may make inside a step
        self.path = Path(path)
        self._fd = create_file(self.path, overwrite=overwrite)
        self.frame_size = frame_size
        self.batch_operations = batch_operations
        self.batch_bytes = batch_bytes
        self.flush_interval = flush_interval
        self.durable = durable
        self._synced_directory = False
        self._record_compressor = FrameCompressor(_RECORD_COMPRESSION)
        threads = min(16, os.cpu_count() or 1) if threads is None else threads
        self._frame_pool: Any = (
            cf.ThreadPoolExecutor(threads, thread_name_prefix="kreplay-frames") if threads else InlineExecutor()
        )
        self._frame_store = FrameStore(
            policy=compression,
            threads=threads,
            frame_size=frame_size,
            reserve=self._reserve,
            write_at=self._write_at,
            executor=self._frame_pool,
        )
        self._record_pool: Any = (
            cf.ThreadPoolExecutor(1, thread_name_prefix="kreplay-records") if threads else InlineExecutor()
        )
        self._sealer = RecordSealer(self._record_pool, self._record_compressor, self._append_chunk)
        self._lock = threading.RLock()  # operations, objects, payload ids, the open batch
        self._file_lock = threading.Lock()  # the file end; taken by workers
        self._end = self._metadata_offset = 0  # the metadata's offset: set once it is down (a failed write says)
        self._closed = False
        self._next_operation = 0
        self._next_object = 1
        self._payloads = PayloadIds()
        self._batch = OpenBatch(0, 1, 1)
        self._relocation_cache = PackedRelocations()
        self._stopping = threading.Event()
        self._times = timings.TimesLog()  # scopes as they open and close; the original's times
        try:
            header = FileHeader(FORMAT_MAJOR, FORMAT_MINOR, FILE_HEADER_SIZE, 0)
            self._append_raw([pack_file_header(header)])
            meta = records.encode_metadata(metadata or m.CaptureMetadata())
            self._metadata_offset = self._append_chunk(ChunkKind.METADATA, Codec.RAW, meta, len(meta))
        except BaseException:
            os.close(self._fd)
            with contextlib.suppress(OSError):
                self.path.unlink()  # ours (created just now): nothing was recorded; a retry must not be refused
            raise
        if flush_interval > 0:
            threading.Thread(target=self._seal_stale_batches, name="kreplay-sealer", daemon=True).start()

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- low-level file output -------------------------------------------------------------

    def _append_raw(self, parts: list[bytes | memoryview]) -> int:
        with self._file_lock:
            offset = self._end
            self._end += self._write_at(parts, offset)
            return offset

    def _reserve(self, size: int, offset: int = -1) -> int:
        """``size`` bytes reserved at the file's end: their offset. ``size`` < 0 gives the range at
        ``offset`` back if it is still the last one (a torn frame: the next chunk goes over it)."""
        with self._file_lock:
            if size >= 0:
                offset, self._end = self._end, self._end + size
            elif self._end == offset - size:
                self._end = offset
            return offset

    def _write_at(self, parts: list[Any], offset: int) -> int:
        try:
            return write_all(self._fd, parts, offset)
        except OSError as exc:
            kept = f"nothing was recorded and {self.path} is removed"  # the header or metadata failed
            if self._metadata_offset:
                kept = "everything flushed before is kept (replayfmt.open recovers it)"
            where = f"{self.path}: cannot write {sum(len(p) for p in parts)} bytes at offset {offset}"
            raise ReplayError(f"{where}: {exc.strerror}; {kept}") from None

    def _append_chunk(self, kind: ChunkKind, codec: Codec, body: bytes | memoryview, size: int, flags: int = 0) -> int:
        header = pack_chunk_header(kind, flags, codec, body, size, bytes(16))  # size: logical (decoded) bytes
        pad = _ZERO_PAD[: align_up(len(body)) - len(body)]
        return self._append_raw([header, body, pad])

    def _check_open(self) -> None:
        if self._closed:
            raise ReplayUsageError(f"{self.path}: the writer is closed")

    # -- payloads --------------------------------------------------------------------------

    def add_payload(self, data: BytesLike) -> int:
        """Store bytes once (content-addressed; copied before this returns, so the caller may reuse its
        buffer) and return their payload id (from 1): the same content again stores nothing more."""
        self._check_open()
        view = memoryview(data)
        if not view.c_contiguous:
            raise ReplayUsageError("payload data must be C-contiguous")
        view = view.cast("B")
        return self._define_payload(len(view), self._frame_store.store(view))

    def add_payload_frames(self, size: int, digests: Sequence[bytes], fetch_missing: FetchMissing) -> int:
        """Store ``size`` bytes given their frames' digests (``frame_hash`` of each piece, computed
        elsewhere, e.g. on the device): the payload id add_payload would return. Only the frames the
        file lacks are fetched: see replayfmt.container.payload_store for ``fetch_missing``."""
        self._check_open()
        digests = list(digests)
        self._frame_store.store_precomputed(size, digests, fetch_missing)
        return self._define_payload(size, digests)

    def _define_payload(self, size: int, hashes: list[bytes]) -> int:
        identity = payload_hash(size, hashes)
        with self._lock:
            self._check_open()
            pid, new = self._payloads.assign(identity)
            if new:
                self._batch.payloads.append((identity, size, self.frame_size, tuple(hashes)))
                self._batch.extra_bytes += 64 + 16 * len(hashes)
                self._after_append()
            return pid

    # -- objects ---------------------------------------------------------------------------

    def add_object(self, obj: m.ObjectDef) -> int:
        """Define an object (a CreateObject operation) and return its id (dense from 1)."""
        if type(obj) not in m.OBJECT_TYPES.values():
            raise ReplayUsageError(f"cannot write an object of type {type(obj).__name__}")
        check_graph_within_limits(obj)  # refused now, not when sealed on another thread
        with self._lock:
            self._check_open()
            oid = self._next_object
            self._next_object += 1
            self._batch.objects.append(dataclasses.replace(obj, id=oid))
            self._batch.extra_bytes += 256
            self._append_table_op(m.CreateObject(self._next_operation, oid))
            return oid

    def destroy(self, object_id: int) -> int:
        return self._table_op(m.DestroyObject, object_id)

    # -- operations ------------------------------------------------------------------------

    def launch(
        self,
        *,
        executable: int,
        function: int,
        grid: m.Dims,
        block: m.Dims,
        parameters: bytes = b"",
        relocations: Iterable[m.Relocation | tuple[int, int, int, int, int]] = (),
        stream: int = 0,
        cluster: m.Dims = (0, 0, 0),
        shared_memory: int = 0,
        flags: int = 0,
    ) -> int:
        """Record a kernel launch; returns its operation index. ``function`` indexes the executable's
        ``functions``; each relocation re-points a pointer (in the parameters or a buffer) on replay."""
        if type(relocations) is not tuple:
            relocations = tuple(relocations)
        # The hot path: one struct pack, relocation sets packed once each.
        packed = self._relocation_cache.pack(relocations) if relocations else b""
        with self._lock:
            if self._closed:
                self._check_open()
            batch = self._batch
            index = self._next_operation
            self._next_operation = index + 1
            batch.kinds.append(8)  # OperationKind.LAUNCH
            batch_parameters, relocation_bytes = batch.parameters, batch.relocation_bytes
            where = (len(batch_parameters), len(parameters), len(relocation_bytes) >> _RELOCATION_SHIFT)
            shape = (executable, function, stream, flags, *grid, *block, *cluster, shared_memory)
            batch.launch_bytes += _LAUNCH_STRUCT.pack(*shape, *where, len(relocations))
            batch_parameters += parameters
            if packed:
                relocation_bytes += packed
            self._after_append()
            return index

    def launches(self, templates: Sequence[LaunchTemplate], which: np.ndarray, shapes: np.ndarray) -> int:
        """Record launch ``i`` as ``templates[which[i]]`` in the shape ``shapes[i]`` (OpenBatch.add_launches),
        as :meth:`launch` would one by one; returns the first one's operation index."""
        if shapes.shape != (count := len(which), 12):
            raise ReplayUsageError(f"launches: {shapes.shape} shapes for {count} launches, not ({count}, 12)")
        packed, which = [self._relocation_cache.pack(t.relocations) for t in templates], np.asarray(which, np.int64)
        sizes = np.cumsum(np.array([len(t.parameters) + OPERATION_BYTES for t in templates], np.int64)[which])
        with self._lock:
            self._check_open()
            first = done = self._next_operation
            while done < first + count:  # batch by batch, as launch() would seal them
                batch, at = self._batch, done - first
                spare = self.batch_bytes - batch.estimated_bytes()
                fits = int(np.searchsorted(sizes[at:] - (sizes[at - 1] if at else 0), spare, side="right"))
                room = max(1, min(self.batch_operations - len(batch.kinds), fits + 1))
                done += batch.add_launches(templates, packed, which[at : at + room], shapes[at : at + room])
                self._next_operation = done
                self._after_append()
            return first

    def copy_h2d(
        self,
        *,
        dst_buffer: int,
        data: BytesLike | None = None,
        payload: int = 0,
        size: int | None = None,
        src_file: int = 0,
        src_offset: int = 0,
        dst_offset: int = 0,
        stream: int = 0,
        flags: int = 0,
        relocations: Iterable[m.Relocation] = (),
    ) -> int:
        """A host-to-device copy from ``data`` (stored as a payload), a ``payload`` id, or ``size`` bytes
        of file reference ``src_file`` at ``src_offset``; ``relocations`` (1.3): pointers stored in them."""
        if data is not None:
            payload = self.add_payload(data)
            size = memoryview(data).nbytes
        if size is None:
            raise ReplayUsageError("copy_h2d needs data, or a size with payload or src_file")
        if bool(payload) == bool(src_file):
            raise ReplayUsageError("copy_h2d needs exactly one source: data/payload or src_file")
        row = (stream, 0, dst_buffer, payload, src_file, flags, src_offset, dst_offset, size)
        return self._append_row(_K.COPY_HOST_TO_DEVICE, row, relocations)

    def copy_d2h(
        self,
        *,
        src_buffer: int,
        size: int,
        src_offset: int = 0,
        expected: BytesLike | None = None,
        stream: int = 0,
        flags: int = 0,
    ) -> int:
        """Record a device-to-host copy; ``expected`` (optional) is what the program received."""
        payload = self.add_payload(expected) if expected is not None else 0
        row = (stream, src_buffer, 0, payload, 0, flags, src_offset, 0, size)
        return self._append_row(_K.COPY_DEVICE_TO_HOST, row)

    def copy_d2d(
        self,
        *,
        src_buffer: int,
        dst_buffer: int,
        size: int,
        src_offset: int = 0,
        dst_offset: int = 0,
        stream: int = 0,
        flags: int = 0,
    ) -> int:
        row = (stream, src_buffer, dst_buffer, 0, 0, flags, src_offset, dst_offset, size)
        return self._append_row(_K.COPY_DEVICE_TO_DEVICE, row)

    def _append_row(self, kind: m.OperationKind, row: tuple[int, ...], relocations: Iterable[m.Relocation] = ()) -> int:
        """A copy or memset: one struct row in the batch's column of its kind."""
        with self._lock:
            self._check_open()
            index = self._next_operation
            self._next_operation += 1
            self._batch.kinds.append(kind)
            self._batch.add_data_relocations(index, relocations)
            (self._batch.memsets if kind == _K.MEMSET else self._batch.copies).append(row)
            self._after_append()
            return index

    def memset(
        self, *, buffer: int, value: int, count: int, element_size: int = 1, offset: int = 0, stream: int = 0
    ) -> int:
        if element_size not in (1, 2, 4):
            raise ReplayUsageError(f"memset element_size must be 1, 2 or 4, not {element_size}")
        return self._append_row(_K.MEMSET, (stream, buffer, value, element_size, offset, count))

    def module_load(self, executable: int, device: int = 0) -> int:
        return self._table_op(m.ModuleLoad, executable, device)

    def event_record(self, event: int, stream: int = 0) -> int:
        return self._table_op(m.EventRecord, event, stream)

    def stream_wait_event(self, stream: int, event: int) -> int:
        return self._table_op(m.StreamWaitEvent, stream, event)

    def stream_synchronize(self, stream: int = 0) -> int:
        return self._table_op(m.StreamSynchronize, stream)

    def device_synchronize(self, device: int = 0) -> int:
        return self._table_op(m.DeviceSynchronize, device)

    def event_synchronize(self, event: int) -> int:
        return self._table_op(m.EventSynchronize, event)

    def host_function(self, stream: int = 0) -> int:
        """A host function the program ran in ``stream``'s order (replayed as a no-op host step)."""
        return self._table_op(m.HostFunction, stream)

    def graph_launch(self, graph: int, stream: int = 0) -> int:  # (1.2) one launch of Graph object ``graph``
        return self._table_op(m.GraphLaunch, graph, stream)

    def scope_begin(self, name: str) -> int:
        with self._lock:  # the scope's index and its place in the times log together
            return self._times.scope_begin(self._table_op(m.ScopeBegin, name))

    def scope_end(self, name: str) -> int:
        with self._lock:
            return self._times.scope_end(self._table_op(m.ScopeEnd, name))

    def set_original_times(self, operations: Iterable[timings.OperationTime], clock: str = timings.CUPTI_CLOCK) -> None:
        """The original program's device times of recorded operations, written at close as an
        optional TIMINGS chunk with each scope's device time (from the operations inside it)."""
        ops = {t.operation: t for t in operations}
        with self._lock:
            self._check_open()
            if any(i >= self._next_operation for i in ops):
                raise ReplayUsageError(f"a time for operation {max(ops)}, which is not recorded yet")
            self._times.set(clock, ops)

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Bracket the operations recorded inside the ``with`` block with named scope markers."""
        self.scope_begin(name)
        try:
            yield
        finally:
            self.scope_end(name)

    def checkpoint(self, expected: Checkpointed, *, name: str = "", types: Sequence[m.TypedTensor] = ()) -> int:
        """Record what buffers hold here (``{buffer_id: bytes}`` or CheckpointEntry rows), typed by ``types``."""
        if isinstance(expected, Mapping):
            entries = [m.CheckpointEntry(b, self.add_payload(d), 0, memoryview(d).nbytes) for b, d in expected.items()]
        else:
            entries = [m.CheckpointEntry(*e) for e in expected]
        return self._table_op(m.Checkpoint, name, *m.checked_checkpoint(name, tuple(entries), tuple(types)))

    def state(
        self,
        *,
        buffer: int,
        data: BytesLike | None = None,
        payload: int = 0,
        size: int | None = None,
        offset: int = 0,
        relocations: Iterable[m.Relocation] = (),
        flags: int = 0,
    ) -> int:
        """Record what ``buffer`` holds at ``offset`` when its region begins (1.1): starting state, never a
        copy the program made; ``flags`` (1.6): STATE_FLAG_UNDEFINED (docs/FORMAT.md 4.2); ``relocations`` (1.3)."""
        if data is not None:
            payload, size = self.add_payload(data), memoryview(data).nbytes
        if not payload or size is None:
            raise ReplayUsageError("state needs data, or a payload id with a size")
        return self._table_op(m.State, buffer, payload, offset, size, tuple(relocations), flags)

    def collective(self, call: m.Collective, received: BytesLike | None = None) -> int:
        """One rank's collective call (1.5); ``received``: its receive range's bytes after it."""
        data = memoryview(received if received is not None else b"")
        if data.nbytes != call.recv_size:
            raise ReplayUsageError(f"{call.describe()}: {data.nbytes} bytes received, its range holds {call.recv_size}")
        return self._table_op(m.Collective, *call.fields(), self.add_payload(data) if data.nbytes else 0)

    def unsupported(self, call: str, reason: str, stream: int = 0) -> int:
        """Record a call that cannot be reproduced: dump shows it, replay refuses the capture."""
        return self._table_op(m.Unsupported, call, reason, stream)

    def _table_op(self, cls: type, *fields: Any) -> int:
        with self._lock:
            self._check_open()
            return self._append_table_op(cls(self._next_operation, *fields))

    def _append_table_op(self, op: Any) -> int:
        index = self._next_operation
        self._next_operation += 1
        batch = self._batch
        batch.kinds.append(op.kind)
        if isinstance(op, m.State):
            batch.add_data_relocations(index, op.relocations)
        if op.kind in records.ID_OPERATIONS:
            batch.id_operations += _ID_OPERATION_STRUCT.pack(*records.id_operation_fields(op))
        else:
            batch.table_ops.append(op)
            batch.extra_bytes += 64
        self._after_append()
        return index

    # -- sealing, flushing, closing --------------------------------------------------------

    def _after_append(self) -> None:
        batch = self._batch
        if len(batch.kinds) >= self.batch_operations or batch.estimated_bytes() >= self.batch_bytes:
            self._seal()

    def _seal_stale_batches(self) -> None:
        """Background thread: seal a batch once it is ``flush_interval`` old, so that what was
        recorded before a crash is on disk even when the program stops recording for a while."""
        while not self._stopping.wait(self.flush_interval / 2):
            with self._lock:
                if self._closed:
                    return
                if not self._batch.empty() and time.monotonic() - self._batch.started >= self.flush_interval:
                    try:
                        self._seal()
                    except ReplayError:
                        return  # reported again by the next flush() or close()

    def _seal(self) -> cf.Future | None:
        """Hand the open batch to the record writer (called with the lock held)."""
        batch = self._batch
        if batch.empty():
            return None
        self._batch = OpenBatch(self._next_operation, self._next_object, self._payloads.next)
        future = self._sealer.seal(batch, self._frame_store.pending())
        if future.done() and future.exception() is not None:
            self._raise_worker_error(future.exception())
        return future

    def _raise_worker_error(self, exc: BaseException | None) -> None:
        if isinstance(exc, ReplayError):
            raise ReplayError(str(exc)) from exc
        raise ReplayError(f"{self.path}: writing the capture failed: {exc}") from exc

    def flush(self, *, durable: bool | None = None) -> None:
        """Write everything recorded so far to the file: a crash of the process then loses none of it.
        ``durable=True`` (default: the writer's option) also fsyncs it against an OS crash (milliseconds)."""
        with self._lock:
            self._check_open()
            self._seal()
            pending = self._sealer.pending() + self._frame_store.pending()
        for future in pending:
            if future.exception() is not None:
                self._raise_worker_error(future.exception())
        if self.durable if durable is None else durable:
            self._sync()

    def _sync(self) -> None:
        try:
            sync_file(self._fd, None if self._synced_directory else self.path.parent)
            self._synced_directory = True
        except OSError as exc:
            raise ReplayError(f"{self.path}: cannot make the capture durable (fsync): {exc.strerror}") from None

    @property
    def operation_count(self) -> int:
        return self._next_operation

    def close(self, *, partial: str = "") -> None:
        """Flush, write the index and footer, close. Idempotent. ``partial`` (1.3): why it stopped early."""
        if self._closed:
            return
        try:
            self.flush()
            with self._lock:
                self._closed = True
            self._write_index(partial)
            self._sync()
        finally:
            self._closed = True
            self._stopping.set()
            self._frame_store.close()  # detached snapshot frames first: they go through the frame pool
            for pool in (self._frame_pool, self._record_pool):
                pool.shutdown(wait=True)
            os.close(self._fd)

    def _write_index(self, partial: str) -> None:
        frames = frame_entries(self._frame_store.rows())
        batches = self._sealer.entries()
        timings_offset = self._write_original_times()
        body = records.encode_index(
            metadata_offset=self._metadata_offset,
            operation_count=self._next_operation,
            object_count=self._next_object - 1,
            payload_count=self._payloads.next - 1,
            batches=batches,
            frames=frames,
            timings_offset=timings_offset,
            partial=partial,
        )
        codec, stored = self._record_compressor.compress(body)
        index_offset = self._append_chunk(ChunkKind.INDEX, codec, stored, len(body))
        with self._file_lock:
            footer_offset = self._end
        self._append_raw([pack_footer(index_offset, footer_offset + 32)])
        try:
            os.ftruncate(self._fd, footer_offset + 32)  # the tail of a torn write, if any, goes
        except OSError as exc:
            raise ReplayError(f"{self.path}: cannot truncate the capture after its footer: {exc.strerror}") from None

    def _write_original_times(self) -> int:
        """The TIMINGS chunk (optional: older readers skip it), or 0 when there are no times."""
        body = self._times.encode()
        if body is None:
            return 0
        codec, stored = self._record_compressor.compress(body)
        return self._append_chunk(ChunkKind.TIMINGS, codec, stored, len(body), flags=ChunkFlags.OPTIONAL)
