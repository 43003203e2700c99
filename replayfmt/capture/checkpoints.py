"""Checkpoints: what the region, each scope in it and each kernel instance left in the memory they
touched, so that a replay can be verified against it; what the region wrote into memory that
stops being its own before it ends (an allocation freed or remapped, a framework's block freed),
checkpointed before it goes; and, at a named region's end, what it wrote into memory its
framework calls free (:mod:`free_writes`). Ranges that held none of the program's data when the
region began get the bytes the region left there as their state, flagged undefined (format 1.6).
"""

from __future__ import annotations

import bisect
import struct
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from replayfmt.capture import events as ev, free_writes as fw
from replayfmt.capture.live_types import typed_tensors
from replayfmt.errors import DeviceError
from replayfmt.format import model as m

if TYPE_CHECKING:
    from replayfmt.capture.allocations import Allocation, AllocationTable
    from replayfmt.capture.device_memory import DeviceMemory
    from replayfmt.capture.live_types import LiveTypes
    from replayfmt.capture.regions import Region
    from replayfmt.capture.report import Report
    from replayfmt.capture.starting_state import SnapshotSpans
    from replayfmt.writer import CaptureWriter

_WORD = struct.Struct("<Q")
# checkpoints taken before frees in one capture, and their bytes: each waits for the device, and a
# step frees every temporary it made (a whole training loop, GBs of them); past either, what is freed
# before its scope ends goes unchecked (the report says so)
MAX_RELEASED_CHECKPOINTS = 4096
MAX_RELEASED_BYTES = 4 << 30


class Checkpoints:
    """Checkpoint operations. Owns what decides the checkpoints taken before memory goes: the
    addresses the region's launches pointed at (with when: a count of the launches that noted
    theirs), and the framework blocks freed in the open scope (address, size, why, launches
    recorded then). ``frees_heard``: the frameworks whose buffer frees a hook tells (the
    translator's set, filled by enrich): their memory gets no free writes."""

    def __init__(
        self,
        *,
        writer: CaptureWriter,
        memory: DeviceMemory,
        allocations: AllocationTable,
        report: Report,
        region: Region,
        spans: SnapshotSpans,
        live_types: LiveTypes,
        frees_heard: set[str],
    ) -> None:
        self._writer = writer
        self._memory = memory
        self._allocations = allocations
        self._report = report
        self._region = region
        self._spans = spans
        self._live_types = live_types  # the frameworks' typed arrays, asked once per checkpoint
        self._frees_heard = frees_heard
        self._count = 0
        self._pointed: dict[int, int] = {}  # the addresses the region's launches pointed at -> when
        self._pointing = 0  # launches that noted what they point at
        self._released_blocks: list[tuple[int, int, str, int]] = []

    def region_opened(self) -> None:
        self._pointed = {}

    def launched(self, parameters: bytes, relocations: tuple[m.Relocation, ...]) -> None:
        """A launch written in a region: the addresses it points at are noted (a framework's block
        freed later in the region is checkpointed if one of them lies in it; free writes)."""
        size = len(parameters)
        self._pointing += 1
        pointing, pointed = self._pointing, self._pointed
        for r in relocations:
            if r.site_buffer == 0 and r.site_offset + 8 <= size:
                pointed[_WORD.unpack_from(parameters, r.site_offset)[0]] = pointing

    def pointed(self, addresses: Iterable[int]) -> None:
        """Addresses a graph launch's kernel nodes point at, noted as a launch's are."""
        self._pointing += 1
        self._pointed.update(dict.fromkeys(addresses, self._pointing))

    def points_at(self, address: int) -> bool:
        """Whether a launch of the open region pointed at ``address`` while a named scope is open
        (a framework's hook asks before it works out what it frees: release_block)."""
        return self._region.recording and self._region.named and address in self._pointed

    def release_block(self, address: int, size: int, why: str) -> None:
        """A framework frees its block [address, address + size) (PyTorch's caching allocator: the
        memory stays mapped and keeps its bytes until a later tensor is handed it). Inside a named
        scope, a block the scope's launches pointed into is held as the scope's result: when the
        scope ends with no launch after the free (a step whose result is dropped), it is
        checkpointed then, before the scope's own checkpoint, which compares only what is still
        live. A launch after the free makes it a temporary of the step (a workspace may be
        written only in part: its other bytes are no replay's), and it is let go."""
        if not self._region.recording or not self._region.named:
            return
        if any(address <= p < address + size for p in self._pointed):
            self._released_blocks.append((address, size, why, self._launches_recorded()))

    def _launches_recorded(self) -> int:
        return sum(stats.captured for stats in self._report.kernels.values())

    def _checkpoint_dropped_results(self) -> None:
        """At a scope's end: the blocks freed after its last launch (see :meth:`release_block`)."""
        pending = self._released_blocks
        launches = self._launches_recorded() if pending else 0
        for address, size, why, then in pending:
            allocation = self._allocations.find(address)
            if then == launches and allocation is not None and allocation.api == ev.MemoryApi.DEVICE:
                offset = address - allocation.address
                spans = [(offset, min(size, allocation.size - offset))]
                self.released(allocation, spans, why, ending=True)
        pending.clear()

    def released(
        self, allocation: Allocation, spans: list[tuple[int, int]] | None, why: str, *, ending: bool = False
    ) -> None:
        """Before what the region wrote into device memory stops being the region's (the
        allocation freed or remapped, a framework's block freed): a checkpoint of it now (of
        ``spans``, offsets in the allocation; None: its live buffers or all of it, as at a
        scope's end), named for the open scope. Host-visible memory is left alone: the host may
        have written it (XLA's autotuner semaphores), which no replay reproduces."""
        region = self._region
        if (
            not (region.recording or ending)
            or allocation.region != region.number
            or allocation.api != ev.MemoryApi.DEVICE
        ):
            return
        if not allocation.buffer or not self._allocations.is_live(allocation):
            return
        if self._report.released_checkpoints >= MAX_RELEASED_CHECKPOINTS:
            self._report.released_dropped += 1
            return
        name = f"{region.scope_name} (buffer {allocation.buffer} {why})"
        self.checkpoint([allocation], stream=None, name=name, only=spans, released=True)

    def checkpoint(
        self,
        allocations: list[Allocation],
        *,
        stream: int | None,
        name: str,
        only: list[tuple[int, int]] | None = None,
        released: bool = False,
        free_writes: bool = False,
    ) -> None:
        """What the allocations hold now, for those still alive (their live framework buffers
        where a framework manages them; ``only`` those spans of the one allocation given):
        unchanged ones too (a step run again on the same inputs rewrites its outputs with the
        bytes they held), at no cost in the file, where their payload is their state's.
        ``released``: taken before the memory goes, and written only when it holds something; its
        bytes that held none of the program's data when the region began get the bytes they hold
        now as their state (STATE_FLAG_UNDEFINED). ``free_writes``: a named region's end, which
        first checkpoints what its launches wrote into memory their framework calls free."""
        if not released:
            self._checkpoint_dropped_results()
        entries: list[m.CheckpointEntry] = []
        types: list[m.TypedTensor] = []
        self._count += 1
        started = time.perf_counter()
        # what the frameworks say it holds, once (not for memory being freed: its arrays are gone)
        live = self._live_types.labels() if allocations and not released else []
        self._report.typing_seconds += time.perf_counter() - started
        pointed = sorted(self._pointed.items()) if free_writes else []
        written: list[tuple[int, Allocation, int, int]] = []  # free writes: (recency, allocation, offset, size)
        for allocation in allocations:
            if not self._allocations.is_live(allocation):
                continue  # freed meanwhile
            step = ("checkpoint", self._count)
            spans = only if only is not None else self._spans.live(allocation, step, exact=True)
            if free_writes and spans is not None:
                written += self._free_writes(allocation, spans, pointed)
            if spans is None and allocation.state_spans is not None:
                # the state held only the live buffers of a framework that no longer speaks for this
                # memory (expandable segments released, say): the other bytes are undefined at
                # replay's start, so only the ranges the state set are compared. (A framework whose
                # one buffer fills the allocation still speaks: a 16 MiB output in its own segment)
                spans = allocation.state_spans
            elif spans is None:
                spans = self._spans.spans(allocation, step, allocation.buffer, exact=True)
            parts = (
                self._split_undefined(allocation, spans or []) if released else [(o, n, False) for o, n in spans or ()]
            )
            if released and self._report.released_bytes + sum(n for _, n, _ in parts) > MAX_RELEASED_BYTES:
                self._report.released_dropped += 1
                return
            self._report.released_bytes += sum(n for _, n, _ in parts) if released else 0
            started = time.perf_counter()
            for offset, size, undefined in parts:
                try:
                    payload = self._memory.snapshot(allocation.address + offset, size, stream, self._writer)
                except DeviceError as exc:  # compared no more, and said so
                    self._report.errors.append(f"checkpoint {name!r}: buffer {allocation.buffer} not read: {exc}")
                    continue
                self._report.snapshot_bytes += size
                if undefined:
                    flags = m.STATE_FLAG_UNDEFINED
                    self._writer.state(buffer=allocation.buffer, payload=payload, size=size, offset=offset, flags=flags)
                entries.append(m.CheckpointEntry(allocation.buffer, payload, offset, size))
            self._report.snapshot_seconds += time.perf_counter() - started
            labels = sorted([*live, *allocation.labels], key=lambda t: (t.address, -t.size))
            typed = typed_tensors(allocation.buffer, allocation.address, spans or (), labels)
            self._report.typed_bytes += sum(t.size for t in typed)
            self._report.checkpoint_bytes += sum(size for _, size in spans or ())
            types += typed
        if released and not entries:
            return
        if written:
            self._write_free_writes(written, name)
        self._report.released_checkpoints += released
        self._writer.checkpoint(entries, name=name, types=types)

    def _split_undefined(self, allocation: Allocation, spans: list[tuple[int, int]]) -> list[tuple[int, int, bool]]:
        """``spans`` cut where they leave the buffers live when the region began, each part with
        whether it held none of the program's data then (framework memory outside them)."""
        if allocation.start_live is None or allocation.region != self._region.number:
            return [(o, n, False) for o, n in spans]
        out = []
        for offset, size in spans:
            end, at = offset + size, offset
            for start, length in allocation.start_live:
                low, high = max(start, offset), min(start + length, end)
                if low >= high:
                    continue
                if at < low:
                    out.append((at, low - at, True))
                out.append((low, high - low, False))
                at = high
            if at < end:
                out.append((at, end - at, True))
        return out

    def _free_writes(
        self, allocation: Allocation, live_end: list[tuple[int, int]], pointed: list[tuple[int, int]]
    ) -> list[tuple[int, Allocation, int, int]]:
        """The free writes of one allocation at a named region's end (:mod:`free_writes`):
        (recency, allocation, offset, size), for framework memory whose frees go unheard."""
        if (
            allocation.start_live is None
            or allocation.region != self._region.number
            or not set(allocation.live_source.split("+")) - self._frees_heard
        ):
            return []
        base, end = allocation.address, allocation.address + allocation.size
        inside = pointed[bisect.bisect_left(pointed, (base, -1)) : bisect.bisect_left(pointed, (end, -1))]
        offsets = [address - base for address, _ in inside]
        out = []
        live = [*allocation.start_live, *live_end]
        for offset, size in fw.free_spans(offsets, allocation.size, live, fw.FREE_WRITE_TAIL):
            first, last = bisect.bisect_left(offsets, offset), bisect.bisect_left(offsets, offset + size)
            out.append((max(serial for _, serial in inside[first:last]), allocation, offset, size))
        return out

    def _write_free_writes(self, written: list[tuple[int, Allocation, int, int]], name: str) -> None:
        """The free writes that fit in the capture's budget, the most recently pointed at first:
        each as state flagged undefined and a checkpoint of the same bytes, before the region's."""
        report = self._report
        kept, dropped = fw.within_budget(written, fw.MAX_FREE_WRITE_BYTES - report.free_write_bytes)
        report.free_writes_dropped += dropped
        entries = []
        started = time.perf_counter()
        for allocation, offset, size in sorted(kept, key=lambda k: (k[0].buffer, k[1])):
            try:
                payload = self._memory.snapshot(allocation.address + offset, size, None, self._writer)
            except DeviceError as exc:
                report.errors.append(f"free writes of {name!r}: buffer {allocation.buffer} not read: {exc}")
                continue
            flags = m.STATE_FLAG_UNDEFINED
            self._writer.state(buffer=allocation.buffer, payload=payload, size=size, offset=offset, flags=flags)
            entries.append(m.CheckpointEntry(allocation.buffer, payload, offset, size))
            report.snapshot_bytes += size
            report.free_writes += 1
            report.free_write_bytes += size
        report.snapshot_seconds += time.perf_counter() - started
        if entries:
            self._writer.checkpoint(entries, name=f"{name} (written into free memory)")
