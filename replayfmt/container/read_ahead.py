"""Reading a record batch ahead: while the caller decodes one batch, the next one's body is read,
checksummed and decompressed on a thread of its own (``pread`` and zstd let Python run meanwhile).
A replay scans its capture's batches in order (the plan's pass, then the steps'), and reading and
decompressing are about a tenth of a batch's cost.

What a read ahead raises is raised where its body is taken, as if it were read there; a body never
taken is kept until the next read ahead begins, or the reader closes."""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Callable


class ReadAhead:
    """One body at a time, read by ``read(offset)`` on a thread of its own."""

    def __init__(self, read: Callable[[int], bytes]) -> None:
        self._read = read
        self._lock = threading.Lock()
        self._pool: cf.ThreadPoolExecutor | None = None
        self._pending: tuple[int, cf.Future[bytes]] | None = None
        self._closed = False

    def start(self, offset: int) -> None:
        """Begin reading the body at ``offset`` (in place of one begun before and not taken)."""
        with self._lock:
            if self._closed or (self._pending is not None and self._pending[0] == offset):
                return  # (closed: another thread's decoding after the reader closed begins nothing)
            if self._pool is None:
                self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="replayfmt read-ahead")
            self._pending = (offset, self._pool.submit(self._read, offset))

    def take(self, offset: int) -> bytes | None:
        """The body read ahead at ``offset`` (what its read raised, raised here), or None where
        none was begun there."""
        with self._lock:
            if self._pending is None or self._pending[0] != offset:
                return None
            _, future = self._pending
            self._pending = None
        return future.result()

    def close(self) -> None:
        """Wait for a read in flight (the file it reads is closed next) and drop what was read."""
        with self._lock:
            pool, self._pool, self._pending, self._closed = self._pool, None, None, True
        if pool is not None:
            pool.shutdown(wait=True)
