"""dump-replay's rows in one decode of each record batch, in bounded memory.

The summary comes first and carries the plan's verdict, which reads every batch; the rows come
after it and read every batch again. Rather than decode each batch for the verdict, the summary
and the rows (a million-operation capture decoded three or four times, the batch cache holding a
million records meanwhile), :class:`OnePass` takes each batch the first time the reader decodes
it (``Capture.first_decodes``), whoever asked for it: it notes the summary's part of it
(``summary.sketch_batch``) and writes its rows to a spool file on disk, batch by batch; the rows
then come out of the spool in capture order. The reader keeps few batches decoded meanwhile
(``KEPT_RECORDS``), and the folded operations the plan's second pass asks for are kept from the
first decode (``container.first_decodes``, at most ``KEPT_GROUPS``): each batch is decoded once,
memory does not grow with the capture, the spool does.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import IO, Any

from replayfmt.dump.filters import DumpFilter
from replayfmt.dump.summary import BatchSketch, sketch_batch
from replayfmt.dump.views import Dumper
from replayfmt.errors import ReplayFormatError
from replayfmt.reader import Capture

KEPT_RECORDS = 1 << 17  # operations and objects the reader keeps decoded while the dump runs
KEPT_GROUPS = 1 << 16  # folded operations kept from a batch's first decode for the plan's second pass


class OnePass:
    """Takes each record batch of ``cap`` once, as it is first decoded: its summary sketch and
    the lines ``render(dumper)`` makes of its operations (the dumper's filter narrowed to them).
    Use as a context manager around whatever reads the capture (the plan's verdict), then
    :meth:`lines`; the spool file is removed on exit."""

    def __init__(self, cap: Capture, dumper: Dumper, render: Callable[[Dumper], Iterator[str]]) -> None:
        self.cap = cap
        self.dumper = dumper
        self.render = render
        self.sketches: dict[int, BatchSketch] = {}
        self._segments: dict[int, tuple[int, int]] = {}  # batch -> (spool offset, bytes)
        self._failed: dict[int, ReplayFormatError] = {}  # batch -> why its rows stopped
        self._spool: IO[bytes] | None = None
        self._filter = dumper.filter
        self._kept = cap.cache_records

    def __enter__(self) -> OnePass:
        self._spool = tempfile.TemporaryFile(prefix="dump-replay-")
        self.cap.first_decodes.listener = self._take
        self.cap.first_decodes.keep = KEPT_GROUPS
        self.cap.cache_records = KEPT_RECORDS
        return self

    def __exit__(self, *exc: object) -> None:
        self.cap.first_decodes.stop()
        self.cap.cache_records = self._kept
        if self._spool is not None:
            self._spool.close()

    def _narrowed(self, bi: int) -> DumpFilter | None:
        """The dumper's filter cut to batch ``bi``'s operations (None: it selects none of them)."""
        first = self.cap.directory.first_operation[bi]
        lo, hi = max(first, self._filter.start), first + self.cap.directory.operation_counts[bi]
        if self._filter.stop is not None:
            hi = min(hi, self._filter.stop)
        return replace(self._filter, start=lo, stop=hi) if lo < hi else None

    def _rendered(self, bi: int) -> Iterator[str]:
        narrowed = self._narrowed(bi)
        if narrowed is None:
            return
        self.dumper.filter = narrowed
        try:
            yield from self.render(self.dumper)
        finally:
            self.dumper.filter = self._filter

    def _take(self, bi: int, batch: Any) -> None:
        self.sketches[bi] = sketch_batch(batch)
        try:
            text = "".join(line + "\n" for line in self._rendered(bi)).encode()
        except ReplayFormatError as exc:  # the rows stop there, as a plain dump's would
            self._failed[bi] = exc
            return
        assert self._spool is not None, "OnePass is used inside its with block"
        self._spool.seek(0, 2)
        self._segments[bi] = (self._spool.tell(), len(text))
        self._spool.write(text)

    def lines(self) -> Iterator[str]:
        """Every row in capture order: from the spool, or rendered now for a batch that was not
        taken (decoded before, or never: the verdict stopped early); a damaged batch raises its
        error where its rows would begin."""
        self.cap.first_decodes.stop()
        for bi in range(self.cap.batch_count):
            if bi in self._failed:
                raise self._failed[bi]
            segment = self._segments.get(bi)
            if segment is None:
                yield from self._rendered(bi)
                continue
            offset, size = segment
            if size and self._spool is not None:
                self._spool.seek(offset)
                yield from self._spool.read(size).decode().splitlines()
