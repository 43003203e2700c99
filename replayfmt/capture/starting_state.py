"""What the translator records of memory the program had before a region: each allocation's
contents at its first touch in a region (or kernel instance) become *state* (format 1.1: never a
copy the program made), with the pointers stored in those bytes (format 1.3 data relocations:
:mod:`stored_pointers`); host-visible memory is read again before each launch that uses it, and
uploaded when the host changed it; a module global skipped as pristine that kernels changed gets
its load-time bytes as state.

:class:`SnapshotSpans` says which bytes of an allocation a snapshot takes (the live framework
buffers where a framework manages it), for starting state and checkpoints alike.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import TYPE_CHECKING

from replayfmt.capture import events as ev
from replayfmt.capture.options import CaptureMode
from replayfmt.capture.stored_pointers import MAX_POINTERS, FrameWords, Resolved, Words, candidate_words, resolve
from replayfmt.errors import DeviceError
from replayfmt.format import model as m

if TYPE_CHECKING:
    from replayfmt.capture.allocations import Allocation, AllocationTable
    from replayfmt.capture.buffers import BufferObjects
    from replayfmt.capture.device_memory import DeviceMemory
    from replayfmt.capture.live_buffers import LiveBuffers, LiveRanges
    from replayfmt.capture.modules import Modules
    from replayfmt.capture.options import RecordOptions
    from replayfmt.capture.regions import Region
    from replayfmt.capture.report import Report
    from replayfmt.capture.stream_events import Streams
    from replayfmt.writer import CaptureWriter


class SnapshotSpans:
    """Which bytes of an allocation a snapshot takes: its live framework buffers where a framework
    manages it (``live_buffers``), else all of it, and none of one larger than
    ``--max-snapshot-gib`` that no framework describes (refused once, saying why)."""

    def __init__(
        self, options: RecordOptions, report: Report, writer: CaptureWriter, live_buffers: LiveBuffers
    ) -> None:
        self._options = options
        self._report = report
        self._writer = writer
        self._live_buffers = live_buffers
        self._refused: set[int] = set()  # allocations too large to snapshot blindly (reported once each)

    def spans(
        self, allocation: Allocation, step: Hashable, buffer: int, *, exact: bool = False
    ) -> list[tuple[int, int]] | None:
        """(offset, size) of each part of the allocation to snapshot: its live framework buffers
        where a framework manages it (``exact``: their own bytes, without padding or gaps), else
        all of it; None (and an unsupported operation, once) when it is larger than
        options.max_snapshot and no framework says which bytes are live."""
        live = self.live(allocation, step, exact=exact)
        if live is not None:
            return live
        if allocation.size <= self._options.max_snapshot:
            return [(0, allocation.size)] if allocation.size else []
        if allocation.address not in self._refused:  # written in either mode: replay must refuse it
            self._refused.add(allocation.address)
            reason = (
                f"buffer {buffer} ({allocation.size} bytes at {allocation.address:#x}, {allocation.call}) is larger "
                f"than --max-snapshot-gib={self._options.max_snapshot / (1 << 30):g} and no framework says which of "
                "its bytes are live; raise --max-snapshot-gib"
            )
            self._report.unsupported["snapshot"] = self._report.unsupported.get("snapshot", 0) + 1
            self._report.errors.append(reason)
            self._writer.unsupported("snapshot", reason, 0)
        return None

    def ranges(self, allocation: Allocation, step: Hashable) -> LiveRanges | None:
        """What the frameworks say of the allocation at ``step``; None when none speaks for it."""
        if not self._options.live_buffers or allocation.api != ev.MemoryApi.DEVICE:
            return None
        return self._live_buffers.ranges(allocation.address, allocation.size, step)

    def live(self, allocation: Allocation, step: Hashable, *, exact: bool) -> list[tuple[int, int]] | None:
        """(offset, size) of the live framework buffers in the allocation; None when no framework
        speaks for it (a buffer may cover all of it: that is a framework speaking)."""
        live = self.ranges(allocation, step)
        if live is None:
            return None
        ranges = live.exact if exact else live.ranges
        self._report.skipped_bytes += allocation.size - sum(r.size for r in ranges)
        self._report.live_sources.add(live.source)
        return [(r.start - allocation.address, r.size) for r in ranges]

    def addresses(self, allocation: Allocation, step: Hashable) -> list[tuple[int, int]] | None:
        """(offset, size) of the parts of the allocation that may hold device addresses (its
        framework's buffers of a type that can); None: all of it (no framework describes it)."""
        if not self._options.live_buffers or allocation.api != ev.MemoryApi.DEVICE:
            return None
        live = self._live_buffers.ranges(allocation.address, allocation.size, step)
        if live is None:
            return None
        ranges = live.exact if live.addresses is None else live.addresses
        return [(r.start - allocation.address, r.size) for r in ranges]


class StartingState:
    """First touches, their snapshots and stored pointers. Owns the stored-pointer candidates of
    snapshot frames (by digest: a frame the file holds already is not read again)."""

    def __init__(
        self,
        *,
        writer: CaptureWriter,
        memory: DeviceMemory,
        allocations: AllocationTable,
        options: RecordOptions,
        report: Report,
        region: Region,
        buffers: BufferObjects,
        modules: Modules,
        streams: Streams,
        spans: SnapshotSpans,
    ) -> None:
        self._writer = writer
        self._memory = memory
        self._allocations = allocations
        self._options = options
        self._report = report
        self._region = region
        self._buffers = buffers
        self._modules = modules
        self._streams = streams
        self._spans = spans
        self._frame_words = FrameWords()  # stored-pointer candidates of snapshot frames, by digest

    def prepare_write(self, allocation: Allocation, offset: int, size: int, stream: int) -> None:
        """Before an operation writes ``size`` bytes at ``offset``: a write covering the whole
        allocation needs no snapshot of what it replaces."""
        self._buffers.of(allocation)
        region = self._region
        region.note_scoped(allocation)
        if allocation.region == region.number:
            return
        if offset == 0 and size >= allocation.size:
            allocation.region, allocation.before, allocation.start_live = region.number, 0, None
            region.touched.append(allocation)
            return
        self.touch(allocation, stream, "")

    def touch(self, allocation: Allocation, stream: int, kernel: str) -> None:
        """First touch in this region (or kernel instance): its contents become starting state,
        the live framework buffers in it only where a framework manages it (live_buffers)."""
        region = self._region
        region.note_scoped(allocation)
        if allocation.region == region.number:
            return  # touched already, so its buffer is written too
        if allocation.module_global is not None and allocation.pristine_in == region.number:
            self._state_from_load_time(allocation, region.number)
            if self._options.mode == CaptureMode.REGION:
                region.touched.append(allocation)
            return
        buffer = self._buffers.of(allocation)
        allocation.region = region.number
        allocation.before = 0
        spans = self._spans.spans(allocation, ("state", region.number), buffer)
        allocation.state_spans = spans if spans != [(0, allocation.size)] else None
        live = self._spans.ranges(allocation, ("state", region.number))  # (the step's views, asked already)
        allocation.start_live = [(r.start - allocation.address, r.size) for r in live.exact] if live else None
        allocation.live_source = live.source if live else ""
        if spans is None:
            return
        # an allocation the named region made held none of the program's data when it began
        flags = m.STATE_FLAG_UNDEFINED if allocation.created_in == region.number else 0
        # stored addresses are looked for in the buffers' own bytes, of those whose type can hold
        # one: padding and gaps between live buffers hold what earlier work (temporaries, pointer
        # tables of other steps) left there, and an int32 array's pairs look like addresses in an
        # arena at a low address
        held = self._spans.addresses(allocation, ("state", region.number))
        held = None if held == spans else held
        started = time.perf_counter()
        span = self._allocations.span() if self._scans_pointers else None
        for offset, size in spans:
            frames = self._frame_words if span is not None and offset % 8 == 0 else None
            if frames is not None:
                frames.begin(*span)
            try:
                payload = self._memory.snapshot(allocation.address + offset, size, stream, self._writer, frames=frames)
                relocations = (
                    self._snapshot_pointers(allocation, offset, size, stream, held) if frames is not None else ()
                )
            except DeviceError as exc:  # the state is missing: replay must refuse, saying which buffer
                self._snapshot_failed(allocation, buffer, offset, size, exc)
                break
            self._writer.state(
                buffer=buffer, payload=payload, size=size, offset=offset, relocations=relocations, flags=flags
            )
            if (offset, size) == (0, allocation.size):
                allocation.before = payload
            self._report.snapshot_bytes += size
            if kernel:
                self._report.kernel(kernel).bytes_stored += size
        self._report.snapshot_seconds += time.perf_counter() - started
        if self._options.mode == CaptureMode.REGION:
            region.touched.append(allocation)

    def touch_for_launch(self, allocation: Allocation, stream: int, kernel: str) -> None:
        """Before a launch that uses the allocation: its first touch, or, for host-visible memory
        already uploaded, what the host may have written since."""
        if allocation.api == ev.MemoryApi.DEVICE or allocation.region != self._region.number:
            self.touch(allocation, stream, kernel)
            allocation.latest = allocation.before
            return
        started = time.perf_counter()
        try:
            data = self._memory.read(allocation.address, allocation.size, stream)
        except DeviceError as exc:  # the replay would start from stale bytes: it must refuse, saying which
            self._snapshot_failed(allocation, self._buffers.of(allocation), 0, allocation.size, exc)
            return
        self._report.snapshot_seconds += time.perf_counter() - started
        payload = self._writer.add_payload(data)
        if payload != allocation.latest:
            words = self.candidates(data, 0)
            self._writer.copy_h2d(
                dst_buffer=self._buffers.of(allocation),
                payload=payload,
                size=allocation.size,
                stream=self._streams.stream(stream),
                relocations=self.stored_pointers(allocation, words),
            )
            self._report.snapshot_bytes += allocation.size
            allocation.latest = payload

    def restore_changed_pristine_globals(self, region: int, touched: list[Allocation]) -> None:
        """At the end of a scope, and of a region of the file (the recorder's region, an
        outermost scope or the stretch before one in a whole-program capture, a kernel
        instance): a global skipped as pristine that kernels changed since (a counter) gets the
        load-time bytes it started from as state, in that region of the file (hoisted to its
        start, as all state is), and joins ``touched`` and the open scopes (checkpointed), so
        that replays repeated in one process each start from those bytes and what the kernels
        left is checked."""
        for allocation in self._modules.changed_pristine_globals(region):
            self._state_from_load_time(allocation, region)
            self._region.note_scoped(allocation)
            touched.append(allocation)

    def _state_from_load_time(self, allocation: Allocation, region: int) -> None:
        """A global skipped as pristine in ``region``, touched now: kernels may have changed it
        since, but it started from its load-time bytes, which become its state. From now on it
        is recorded like any global (touched at its module's launches, checkpointed)."""
        payload = self._writer.add_payload(allocation.module_global.initial)
        self._writer.state(buffer=self._buffers.of(allocation), payload=payload, size=allocation.size)
        allocation.region, allocation.before, allocation.pristine_in = region, payload, -1
        self._modules.recorded_now(allocation)

    def _snapshot_failed(self, allocation: Allocation, buffer: int, offset: int, size: int, exc: Exception) -> None:
        """A snapshot the driver refused: the capture says which buffer and bytes, where they came
        from, and that replay cannot start from them (an unsupported operation)."""
        reason = (
            f"snapshot of buffer {buffer} failed: {size} bytes at offset {offset} of {allocation.size} bytes at "
            f"{allocation.address:#x} ({allocation.call}): {exc}"
        )
        self._report.unsupported["snapshot"] = self._report.unsupported.get("snapshot", 0) + 1
        self._report.errors.append(reason)
        self._writer.unsupported("snapshot", reason, 0)

    @property
    def _scans_pointers(self) -> bool:
        """Whether captured data is searched for stored pointers (replay at the recorded
        addresses needs none relocated)."""
        return self._options.detect_pointers and not self._options.fixed_addresses

    def candidates(self, data: bytes | memoryview, first: int) -> Words:
        """Words of uploaded bytes (from byte ``first`` of their buffer) that may be stored pointers."""
        span = self._allocations.span() if self._scans_pointers else None
        return candidate_words(data, first, *span) if span is not None else Words()

    def _snapshot_pointers(
        self, allocation: Allocation, offset: int, size: int, stream: int, held: list[tuple[int, int]] | None
    ) -> tuple[m.Relocation, ...]:
        """The stored pointers of the snapshot just taken at ``offset`` of the allocation: the
        frames that crossed the bus were scanned as they did; frames the file held are known
        by digest, or read again when they were stored unscanned (a checkpoint's, say). ``held``:
        (offset, size) in the allocation of the bytes its framework's buffers hold that can hold an
        address (None: all of it), the only ones taken."""
        frames = self._frame_words
        frame_size = self._writer.frame_size
        for at, digest in frames.unseen:
            length = min(frame_size, size - at)
            frames.learn(at, digest, self._memory.read(allocation.address + offset + at, length, stream))
        words = frames.words().shifted(offset)
        return self.stored_pointers(allocation, words if held is None else words.in_spans(held))

    def stored_pointers(self, holder: Allocation, words: Words) -> tuple[m.Relocation, ...]:
        """Data relocations of the candidate ``words`` (byte offsets in ``holder``); the targets
        become the holder's pointees, and words it cannot tell from data are reported."""
        if not len(words):
            return ()
        resolved = resolve(words, self._allocations, holder)
        relocations = []
        for site, offset, target in resolved.relocations:
            relocations.append(m.Relocation(holder.buffer, self._buffers.of(target), site, offset))
            if target is not holder:
                holder.pointees[target.address] = target
        if resolved.ambiguous or resolved.dropped:
            self._report_ambiguous(holder, resolved)
        self._report.stored_pointers += len(relocations)
        return tuple(relocations)

    def _report_ambiguous(self, holder: Allocation, resolved: Resolved) -> None:
        if holder.buffer in self._report.ambiguous_pointers:
            return
        if resolved.example is not None:
            site, value, target = resolved.example
            what = (
                f"{resolved.ambiguous} word(s) that point into recorded buffers or are pairs of integers, "
                f"e.g. {value:#x} at byte {site} (into buffer {self._buffers.of(target)})"
            )
        else:
            what = f"more than {MAX_POINTERS} stored pointers"
        self._report.ambiguous_pointers[holder.buffer] = f"buffer {holder.buffer} ({holder.call}) holds {what}"

    def reached(self, holder: Allocation) -> list[Allocation]:
        """Live allocations reachable through the pointers stored in ``holder`` (and in those)."""
        reached: list[Allocation] = []
        seen = {holder.address}
        todo = list(holder.pointees.values())
        while todo:
            allocation = todo.pop()
            if allocation.address in seen or not self._allocations.is_live(allocation):
                continue
            seen.add(allocation.address)
            reached.append(allocation)
            todo += allocation.pointees.values()
        return reached
