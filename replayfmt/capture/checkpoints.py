"""Checkpoints: what the region, each scope in it and each kernel instance left in the memory they
touched, so that a replay can be verified against it; and what the region wrote into memory that
stops being its own before it ends (an allocation freed or remapped, a framework's block freed),
checkpointed before it goes.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from replayfmt.capture import events as ev
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
    addresses the region's launches pointed at, and the framework blocks freed in the open scope
    (address, size, why, launches recorded then)."""

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
    ) -> None:
        self._writer = writer
        self._memory = memory
        self._allocations = allocations
        self._report = report
        self._region = region
        self._spans = spans
        self._live_types = live_types  # the frameworks' typed arrays, asked once per checkpoint
        self._count = 0
        self._pointed: set[int] = set()  # the addresses the region's launches pointed at
        self._released_blocks: list[tuple[int, int, str, int]] = []

    def region_opened(self) -> None:
        self._pointed = set()

    def launched(self, parameters: bytes, relocations: tuple[m.Relocation, ...]) -> None:
        """A launch written in a region: the addresses it points at are noted (a framework's block
        freed later in the region is checkpointed if one of them lies in it)."""
        size = len(parameters)
        self._pointed.update(
            _WORD.unpack_from(parameters, r.site_offset)[0]
            for r in relocations
            if r.site_buffer == 0 and r.site_offset + 8 <= size
        )

    def pointed(self, addresses: Iterable[int]) -> None:
        """Addresses a graph launch's kernel nodes point at, noted as a launch's are."""
        self._pointed.update(addresses)

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
        self._count += 1
        started = time.perf_counter()
        # what the frameworks say it holds, once (not for memory being freed: its arrays are gone)
        live = self._live_types.labels() if allocations and not released else []
        self._report.typing_seconds += time.perf_counter() - started
        for allocation in allocations:
            if not self._allocations.is_live(allocation):
                continue  # freed meanwhile
            step = ("checkpoint", self._count)
            spans = only if only is not None else self._spans.live(allocation, step, exact=True)
            if spans is None and allocation.state_spans is not None:
                # the state held only the live buffers of a framework that no longer speaks for this
                # memory (expandable segments released, say): the other bytes are undefined at
                # replay's start, so only the ranges the state set are compared. (A framework whose
                # one buffer fills the allocation still speaks: a 16 MiB output in its own segment)
                spans = allocation.state_spans
            elif spans is None:
                spans = self._spans.spans(allocation, step, allocation.buffer, exact=True)
            if released and self._report.released_bytes + sum(n for _, n in spans or ()) > MAX_RELEASED_BYTES:
                self._report.released_dropped += 1
                return
            self._report.released_bytes += sum(n for _, n in spans or ()) if released else 0
            started = time.perf_counter()
            for offset, size in spans or ():
                try:
                    payload = self._memory.snapshot(allocation.address + offset, size, stream, self._writer)
                except DeviceError as exc:  # compared no more, and said so
                    self._report.errors.append(f"checkpoint {name!r}: buffer {allocation.buffer} not read: {exc}")
                    continue
                self._report.snapshot_bytes += size
                entries.append(m.CheckpointEntry(allocation.buffer, payload, offset, size))
            self._report.snapshot_seconds += time.perf_counter() - started
            labels = sorted([*live, *allocation.labels], key=lambda t: (t.address, -t.size))
            typed = typed_tensors(allocation.buffer, allocation.address, spans or (), labels)
            self._report.typed_bytes += sum(t.size for t in typed)
            self._report.checkpoint_bytes += sum(size for _, size in spans or ())
            types += typed
        if released and not entries:
            return
        self._report.released_checkpoints += released
        self._writer.checkpoint(entries, name=name, types=types)
