"""Each record batch handed over the first time it is decoded (``Capture.first_decodes``).

A reader that wants every batch once (dump-replay's rows, taken while the plan reads the capture
for its verdict) listens here instead of asking for every batch again after the plan is done.
The plan reads a batch twice: its objects first (every object of the capture before any operation
is checked), then its operations folded (``batches.distinct_operations``); with few batches kept
decoded, the second read would decode it again. So, while someone listens, the folded operations
of each batch are worked out at its first decode too and kept, up to ``keep`` records in all,
until the plan takes them: a batch is then decoded once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from replayfmt.container.batches import DecodedBatch, collector_paused, distinct_operations

Listener = Callable[[int, DecodedBatch], None]


class FirstDecodes:
    """The listener (None: nobody listens, nothing is kept) and the folded operations kept."""

    def __init__(self) -> None:
        self.listener: Listener | None = None
        self.keep = 0  # records (folded operations, event uses) kept for the plan at most
        self._seen: set[int] = set()
        self._kept: dict[int, list[tuple[Any, int]]] = {}
        self._held = 0
        self._lock = threading.Lock()

    def note(self, index: int, batch: DecodedBatch) -> None:
        """Batch ``index`` was decoded: the first time, keep its folded operations (within
        ``keep``) and hand it to the listener."""
        listener = self.listener
        with self._lock:
            if listener is None or index in self._seen:
                return
            self._seen.add(index)
        if self.keep:
            with collector_paused():
                groups = distinct_operations(batch)
            with self._lock:
                if self._held + len(groups) <= self.keep:
                    self._kept[index] = groups
                    self._held += len(groups)
        listener(index, batch)

    def take(self, index: int) -> list[tuple[Any, int]] | None:
        """The folded operations kept for batch ``index`` (then forgotten), or None."""
        with self._lock:
            groups = self._kept.pop(index, None)
            if groups is not None:
                self._held -= len(groups)
            return groups

    def stop(self) -> None:
        """Nobody listens any more: what was kept is dropped."""
        with self._lock:
            self.listener, self.keep = None, 0
            self._kept.clear()
            self._held = 0
