"""What the translator records of memory the program had before a region: each allocation's
contents at its first touch in a region (or kernel instance) become *state* (format 1.1: never a
copy the program made), with the pointers stored in those bytes (format 1.3 data relocations:
:mod:`stored_pointers`), and the region and each scope in it checkpoint what they touched.
A mixin of :class:`~replayfmt.capture.translate.Translator`, like ``MemoryEvents``.
"""

from __future__ import annotations

import contextlib
import struct
import threading
import time
from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from replayfmt.capture import events as ev
from replayfmt.capture.allocations import Allocation, AllocationTable
from replayfmt.capture.host_releases import host_released
from replayfmt.capture.live_buffers import LiveBuffers
from replayfmt.capture.live_types import LiveTypes, typed_tensors
from replayfmt.capture.options import CaptureMode, RecordOptions
from replayfmt.capture.stored_pointers import MAX_POINTERS, FrameWords, Resolved, Words, resolve
from replayfmt.errors import DeviceError
from replayfmt.format import model as m

if TYPE_CHECKING:
    from replayfmt.capture.device_memory import DeviceMemory
    from replayfmt.capture.device_objects import DeviceObjects
    from replayfmt.capture.report import Report
    from replayfmt.writer import CaptureWriter


_WORD = struct.Struct("<Q")
# checkpoints taken before frees in one capture, and their bytes: each waits for the device, and a
# step frees every temporary it made (a whole training loop, GBs of them); past either, what is freed
# before its scope ends goes unchecked (the report says so)
MAX_RELEASED_CHECKPOINTS = 4096
MAX_RELEASED_BYTES = 4 << 30


class StateEvents:
    """Starting state, snapshots and checkpoints; the translator provides the attributes declared here."""

    allocations: AllocationTable
    writer: CaptureWriter
    memory: DeviceMemory
    options: RecordOptions
    report: Report
    _region: int
    devices: DeviceObjects
    _frame_words: FrameWords
    _touched: list[Allocation]
    _scopes: list[tuple[str, dict[int, Allocation]]]
    live_buffers: LiveBuffers
    live_types: LiveTypes  # the frameworks' typed arrays, asked once per checkpoint
    _refused: set[int]  # allocations too large to snapshot blindly (reported once each)
    _checkpoints: int
    _recording: bool
    _region_name: str
    _pointed: set[int]  # the addresses the region's launches pointed at
    _released_blocks: list[tuple[int, int, str, int]]  # freed in the open scope: address, size, why, launches then
    _lock: threading.RLock
    # held around a framework's block free, outside the translator's lock: the recorder hands on
    # the launches its C library holds first (a checkpoint must follow the launches before it)
    settled: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext

    if TYPE_CHECKING:  # provided by the translator

        def _buffer(self, allocation: Allocation) -> int: ...
        def _state_from_load_time(self, allocation: Allocation, region: int) -> None: ...

    def _prepare_write(self, allocation: Allocation, offset: int, size: int, stream: int) -> None:
        """Before an operation writes ``size`` bytes at ``offset``: a write covering the whole
        allocation needs no snapshot of what it replaces."""
        self._buffer(allocation)
        self._note_scoped(allocation)
        if allocation.region == self._region:
            return
        if offset == 0 and size >= allocation.size:
            allocation.region, allocation.before = self._region, 0
            self._touched.append(allocation)
            return
        self._touch(allocation, stream, "")

    def _touch(self, allocation: Allocation, stream: int, kernel: str) -> None:
        """First touch in this region (or kernel instance): its contents become starting state,
        the live framework buffers in it only where a framework manages it (live_buffers)."""
        self._note_scoped(allocation)
        if allocation.region == self._region:
            return  # touched already, so its buffer is written too
        if allocation.module_global is not None and allocation.pristine_in == self._region:
            self._state_from_load_time(allocation, self._region)
            if self.options.mode == CaptureMode.REGION:
                self._touched.append(allocation)
            return
        buffer = self._buffer(allocation)
        allocation.region = self._region
        allocation.before = 0
        spans = self._spans(allocation, ("state", self._region), buffer)
        allocation.state_spans = spans if spans != [(0, allocation.size)] else None
        if spans is None:
            return
        # stored addresses are looked for in the buffers' own bytes, of those whose type can hold
        # one: padding and gaps between live buffers hold what earlier work (temporaries, pointer
        # tables of other steps) left there, and an int32 array's pairs look like addresses in an
        # arena at a low address
        held = self._address_spans(allocation, ("state", self._region))
        held = None if held == spans else held
        started = time.perf_counter()
        span = self.allocations.span() if self.scans_pointers else None
        for offset, size in spans:
            frames = self._frame_words if span is not None and offset % 8 == 0 else None
            if frames is not None:
                frames.begin(*span)
            try:
                payload = self.memory.snapshot(allocation.address + offset, size, stream, self.writer, frames=frames)
                relocations = (
                    self._snapshot_pointers(allocation, offset, size, stream, held) if frames is not None else ()
                )
            except DeviceError as exc:  # the state is missing: replay must refuse, saying which buffer
                self._snapshot_failed(allocation, buffer, offset, size, exc)
                break
            self.writer.state(buffer=buffer, payload=payload, size=size, offset=offset, relocations=relocations)
            if (offset, size) == (0, allocation.size):
                allocation.before = payload
            self.report.snapshot_bytes += size
            if kernel:
                self.report.kernel(kernel).bytes_stored += size
        self.report.snapshot_seconds += time.perf_counter() - started
        if self.options.mode == CaptureMode.REGION:
            self._touched.append(allocation)

    def _spans(
        self, allocation: Allocation, step: Hashable, buffer: int, *, exact: bool = False
    ) -> list[tuple[int, int]] | None:
        """(offset, size) of each part of the allocation to snapshot: its live framework buffers
        where a framework manages it (``exact``: their own bytes, without padding or gaps), else
        all of it; None (and an unsupported operation, once) when it is larger than
        options.max_snapshot and no framework says which bytes are live."""
        live = self._live_spans(allocation, step, exact=exact)
        if live is not None:
            return live
        if allocation.size <= self.options.max_snapshot:
            return [(0, allocation.size)] if allocation.size else []
        if allocation.address not in self._refused:  # written in either mode: replay must refuse it
            self._refused.add(allocation.address)
            reason = (
                f"buffer {buffer} ({allocation.size} bytes at {allocation.address:#x}, {allocation.call}) is larger "
                f"than --max-snapshot-gib={self.options.max_snapshot / (1 << 30):g} and no framework says which of "
                "its bytes are live; raise --max-snapshot-gib"
            )
            self.report.unsupported["snapshot"] = self.report.unsupported.get("snapshot", 0) + 1
            self.report.errors.append(reason)
            self.writer.unsupported("snapshot", reason, 0)
        return None

    def _live_spans(self, allocation: Allocation, step: Hashable, *, exact: bool) -> list[tuple[int, int]] | None:
        """(offset, size) of the live framework buffers in the allocation; None when no framework
        speaks for it (a buffer may cover all of it: that is a framework speaking)."""
        live = None
        if self.options.live_buffers and allocation.api == ev.MemoryApi.DEVICE:
            live = self.live_buffers.ranges(allocation.address, allocation.size, step)
        if live is None:
            return None
        ranges = live.exact if exact else live.ranges
        self.report.skipped_bytes += allocation.size - sum(r.size for r in ranges)
        self.report.live_sources.add(live.source)
        return [(r.start - allocation.address, r.size) for r in ranges]

    def _snapshot_failed(self, allocation: Allocation, buffer: int, offset: int, size: int, exc: Exception) -> None:
        """A snapshot the driver refused: the capture says which buffer and bytes, where they came
        from, and that replay cannot start from them (an unsupported operation)."""
        reason = (
            f"snapshot of buffer {buffer} failed: {size} bytes at offset {offset} of {allocation.size} bytes at "
            f"{allocation.address:#x} ({allocation.call}): {exc}"
        )
        self.report.unsupported["snapshot"] = self.report.unsupported.get("snapshot", 0) + 1
        self.report.errors.append(reason)
        self.writer.unsupported("snapshot", reason, 0)

    def _address_spans(self, allocation: Allocation, step: Hashable) -> list[tuple[int, int]] | None:
        """(offset, size) of the parts of the allocation that may hold device addresses (its
        framework's buffers of a type that can); None: all of it (no framework describes it)."""
        if not self.options.live_buffers or allocation.api != ev.MemoryApi.DEVICE:
            return None
        live = self.live_buffers.ranges(allocation.address, allocation.size, step)
        if live is None:
            return None
        ranges = live.exact if live.addresses is None else live.addresses
        return [(r.start - allocation.address, r.size) for r in ranges]

    def _note_scoped(self, allocation: Allocation) -> None:
        for _, touched in self._scopes:  # each open scope checkpoints it at its end
            touched[allocation.address] = allocation

    @property
    def scans_pointers(self) -> bool:
        """Whether captured data is searched for stored pointers (replay at the recorded
        addresses needs none relocated)."""
        return self.options.detect_pointers and not self.options.fixed_addresses

    def _snapshot_pointers(
        self, allocation: Allocation, offset: int, size: int, stream: int, held: list[tuple[int, int]] | None
    ) -> tuple[m.Relocation, ...]:
        """The stored pointers of the snapshot just taken at ``offset`` of the allocation: the
        frames that crossed the bus were scanned as they did; frames the file held are known
        by digest, or read again when they were stored unscanned (a checkpoint's, say). ``held``:
        (offset, size) in the allocation of the bytes its framework's buffers hold that can hold an
        address (None: all of it), the only ones taken."""
        frames = self._frame_words
        frame_size = self.writer.frame_size
        for at, digest in frames.unseen:
            length = min(frame_size, size - at)
            frames.learn(at, digest, self.memory.read(allocation.address + offset + at, length, stream))
        words = frames.words().shifted(offset)
        return self.stored_pointers(allocation, words if held is None else words.in_spans(held))

    def stored_pointers(self, holder: Allocation, words: Words) -> tuple[m.Relocation, ...]:
        """Data relocations of the candidate ``words`` (byte offsets in ``holder``); the targets
        become the holder's pointees, and words it cannot tell from data are reported."""
        if not len(words):
            return ()
        resolved = resolve(words, self.allocations, holder)
        relocations = []
        for site, offset, target in resolved.relocations:
            relocations.append(m.Relocation(holder.buffer, self._buffer(target), site, offset))
            if target is not holder:
                holder.pointees[target.address] = target
        if resolved.ambiguous or resolved.dropped:
            self._report_ambiguous(holder, resolved)
        self.report.stored_pointers += len(relocations)
        return tuple(relocations)

    def _report_ambiguous(self, holder: Allocation, resolved: Resolved) -> None:
        if holder.buffer in self.report.ambiguous_pointers:
            return
        if resolved.example is not None:
            site, value, target = resolved.example
            what = (
                f"{resolved.ambiguous} word(s) that point into recorded buffers or are pairs of integers, "
                f"e.g. {value:#x} at byte {site} (into buffer {self._buffer(target)})"
            )
        else:
            what = f"more than {MAX_POINTERS} stored pointers"
        self.report.ambiguous_pointers[holder.buffer] = f"buffer {holder.buffer} ({holder.call}) holds {what}"

    def _reached(self, holder: Allocation) -> list[Allocation]:
        """Live allocations reachable through the pointers stored in ``holder`` (and in those)."""
        reached: list[Allocation] = []
        seen = {holder.address}
        todo = list(holder.pointees.values())
        while todo:
            allocation = todo.pop()
            if allocation.address in seen or not self.allocations.is_live(allocation):
                continue
            seen.add(allocation.address)
            reached.append(allocation)
            todo += allocation.pointees.values()
        return reached

    def _launched(self, event: ev.LaunchBegin, relocations: tuple[m.Relocation, ...]) -> int:
        """A launch written: in a region, the addresses it points at are noted (a framework's block
        freed later in the region is checkpointed if one of them lies in it); its flags beyond
        the call's (LAUNCH_FLAG_HOST_RELEASED)."""
        if self._recording:
            size = len(event.parameters)
            self._pointed.update(
                _WORD.unpack_from(event.parameters, r.site_offset)[0]
                for r in relocations
                if r.site_buffer == 0 and r.site_offset + 8 <= size
            )
        return host_released(event.kernel.name, event.parameters, self.allocations, self.report)

    def points_at(self, address: int) -> bool:
        """Whether a launch of the open region pointed at ``address`` while a named scope is open
        (a framework's hook asks before it works out what it frees: release_block)."""
        return self._recording and bool(self._scopes or self._region_name) and address in self._pointed

    def release_block(self, address: int, size: int, why: str) -> None:
        """A framework frees its block [address, address + size) (PyTorch's caching allocator: the
        memory stays mapped and keeps its bytes until a later tensor is handed it). Inside a named
        scope, a block the scope's launches pointed into is held as the scope's result: when the
        scope ends with no launch after the free (a step whose result is dropped), it is
        checkpointed then, before the scope's own checkpoint, which compares only what is still
        live. A launch after the free makes it a temporary of the step (a workspace may be
        written only in part: its other bytes are no replay's), and it is let go."""
        with self.settled(), self._lock:
            if not self._recording or not (self._scopes or self._region_name):
                return
            if any(address <= p < address + size for p in self._pointed):
                self._released_blocks.append((address, size, why, self._launches_recorded()))

    def _launches_recorded(self) -> int:
        return sum(stats.captured for stats in self.report.kernels.values())

    def _checkpoint_dropped_results(self) -> None:
        """At a scope's end: the blocks freed after its last launch (see :meth:`release_block`)."""
        pending = self._released_blocks
        launches = self._launches_recorded() if pending else 0
        for address, size, why, then in pending:
            allocation = self.allocations.find(address)
            if then == launches and allocation is not None and allocation.api == ev.MemoryApi.DEVICE:
                offset = address - allocation.address
                spans = [(offset, min(size, allocation.size - offset))]
                self._checkpoint_released(allocation, spans, why, ending=True)
        pending.clear()

    def _checkpoint_released(
        self, allocation: Allocation, spans: list[tuple[int, int]] | None, why: str, *, ending: bool = False
    ) -> None:
        """Before what the region wrote into device memory stops being the region's (the
        allocation freed or remapped, a framework's block freed): a checkpoint of it now (of
        ``spans``, offsets in the allocation; None: its live buffers or all of it, as at a
        scope's end), named for the open scope. Host-visible memory is left alone: the host may
        have written it (XLA's autotuner semaphores), which no replay reproduces."""
        if (
            not (self._recording or ending)
            or allocation.region != self._region
            or allocation.api != ev.MemoryApi.DEVICE
        ):
            return
        if not allocation.buffer or not self.allocations.is_live(allocation):
            return
        if self.report.released_checkpoints >= MAX_RELEASED_CHECKPOINTS:
            self.report.released_dropped += 1
            return
        scope = self._scopes[-1][0] if self._scopes else (self._region_name or "region")
        name = f"{scope} (buffer {allocation.buffer} {why})"
        self._checkpoint([allocation], stream=None, name=name, only=spans, released=True)

    def _checkpoint(
        self,
        allocations: list[Allocation],
        *,
        stream: int | None,
        name: str,
        only: list[tuple[int, int]] | None = None,
        released: bool = False,
    ) -> None:
        """What the allocations hold now, for those still alive (their live framework buffers
        where a framework manages them; ``only`` those spans of the one allocation given):
        unchanged ones too (a step run again on the same inputs rewrites its outputs with the
        bytes they held), at no cost in the file, where their payload is their state's.
        ``released``: taken before the memory goes, and written only when it holds something."""
        if not released:
            self._checkpoint_dropped_results()
        entries: list[m.CheckpointEntry] = []
        types: list[m.TypedTensor] = []
        self._checkpoints += 1
        started = time.perf_counter()
        # what the frameworks say it holds, once (not for memory being freed: its arrays are gone)
        live = self.live_types.labels() if allocations and not released else []
        self.report.typing_seconds += time.perf_counter() - started
        for allocation in allocations:
            if not self.allocations.is_live(allocation):
                continue  # freed meanwhile
            step = ("checkpoint", self._checkpoints)
            spans = only if only is not None else self._live_spans(allocation, step, exact=True)
            if spans is None and allocation.state_spans is not None:
                # the state held only the live buffers of a framework that no longer speaks for this
                # memory (expandable segments released, say): the other bytes are undefined at
                # replay's start, so only the ranges the state set are compared. (A framework whose
                # one buffer fills the allocation still speaks: a 16 MiB output in its own segment)
                spans = allocation.state_spans
            elif spans is None:
                spans = self._spans(allocation, step, allocation.buffer, exact=True)
            if released and self.report.released_bytes + sum(n for _, n in spans or ()) > MAX_RELEASED_BYTES:
                self.report.released_dropped += 1
                return
            self.report.released_bytes += sum(n for _, n in spans or ()) if released else 0
            started = time.perf_counter()
            for offset, size in spans or ():
                try:
                    payload = self.memory.snapshot(allocation.address + offset, size, stream, self.writer)
                except DeviceError as exc:  # compared no more, and said so
                    self.report.errors.append(f"checkpoint {name!r}: buffer {allocation.buffer} not read: {exc}")
                    continue
                self.report.snapshot_bytes += size
                entries.append(m.CheckpointEntry(allocation.buffer, payload, offset, size))
            self.report.snapshot_seconds += time.perf_counter() - started
            labels = sorted([*live, *allocation.labels], key=lambda t: (t.address, -t.size))
            typed = typed_tensors(allocation.buffer, allocation.address, spans or (), labels)
            self.report.typed_bytes += sum(t.size for t in typed)
            self.report.checkpoint_bytes += sum(size for _, size in spans or ())
            types += typed
        if released and not entries:
            return
        self.report.released_checkpoints += released
        self.writer.checkpoint(entries, name=name, types=types)
