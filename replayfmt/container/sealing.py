"""Sealed record batches on their way to the file: each is compressed and written, in order, by
one worker, only after every frame it may refer to is written, so that a file cut short by a
crash never refers to a frame written after the records that use it."""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from replayfmt.container.batches import OpenBatch
from replayfmt.format import records
from replayfmt.format.layout import ChunkKind
from replayfmt.format.payloads import FrameCompressor

AppendChunk = Callable[[ChunkKind, Any, bytes | memoryview, int], int]  # (kind, codec, body, logical) -> offset


class RecordSealer:
    """Writes sealed batches through ``append_chunk`` on ``executor`` (one worker, or inline).
    Thread-safe; :meth:`seal` is called with the writer's lock held."""

    def __init__(self, executor: Any, compressor: FrameCompressor, append_chunk: AppendChunk) -> None:
        self._pool = executor
        self._compressor = compressor
        self._append_chunk = append_chunk
        self._lock = threading.Lock()  # the entries, appended by the worker
        self._entries: list[tuple[int, ...]] = []  # (offset, first op, count, first obj, count, first payload, count)
        self._pending: list[cf.Future] = []

    def seal(self, batch: OpenBatch, frames: list[cf.Future]) -> cf.Future:
        """Encode ``batch`` now and write it once ``frames`` are written (a failed frame fails it)."""
        encoded = batch.encode()
        entry = (
            batch.first_operation,
            len(batch),
            batch.first_object,
            len(batch.objects),
            batch.first_payload,
            len(batch.payloads),
        )
        future = self._pool.submit(self._write, encoded, frames, entry)
        self._pending = [f for f in self._pending if not f.done()] + [future]
        return future

    def pending(self) -> list[cf.Future]:
        """Batches sealed and not yet known written (a failed one keeps its exception)."""
        return list(self._pending)

    def entries(self) -> np.ndarray:
        """Every written batch as the index's BatchEntry structs, in operation order."""
        with self._lock:
            rows = sorted(self._entries, key=lambda row: row[1])
        return np.array(rows, dtype=records.dtype("BatchEntry"))

    def _write(self, encoded: bytes, frames: list[cf.Future], entry: tuple[int, ...]) -> None:
        for future in frames:
            future.result()
        codec, stored = self._compressor.compress(encoded)
        offset = self._append_chunk(ChunkKind.RECORDS, codec, stored, len(encoded))
        with self._lock:
            self._entries.append((offset, *entry))
