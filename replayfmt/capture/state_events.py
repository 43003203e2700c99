"""What the translator records of memory the program had before a region: each allocation's
contents at its first touch in a region (or kernel instance) become *state* (format 1.1: never a
copy the program made), a snapshot that crossed the bus is scanned for stored device addresses
(which force --fixed-addresses), and the region and each scope in it checkpoint what they touched.
A mixin of :class:`~replayfmt.capture.translate.Translator`, like ``MemoryEvents``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Hashable
from typing import TYPE_CHECKING

from replayfmt.capture import events as ev
from replayfmt.capture.allocations import Allocation, AllocationTable
from replayfmt.capture.live_buffers import LiveBuffers
from replayfmt.capture.live_types import LiveTypes, typed_tensors
from replayfmt.capture.options import CaptureMode, RecordOptions
from replayfmt.format import model as m

if TYPE_CHECKING:
    from replayfmt.capture.device_memory import DeviceMemory
    from replayfmt.capture.report import Report
    from replayfmt.writer import CaptureWriter


class StateEvents:
    """Starting state, snapshots and checkpoints; the translator provides the attributes declared here."""

    allocations: AllocationTable
    writer: CaptureWriter
    memory: DeviceMemory
    options: RecordOptions
    report: Report
    _region: int
    _device: int
    _marked_fixed: bool
    _touched: list[Allocation]
    _scopes: list[tuple[str, dict[int, Allocation]]]
    live_buffers: LiveBuffers
    live_types: LiveTypes  # the frameworks' typed arrays, asked once per checkpoint
    _refused: set[int]  # allocations too large to snapshot blindly (reported once each)
    _checkpoints: int

    if TYPE_CHECKING:  # provided by the translator

        def _buffer(self, allocation: Allocation) -> int: ...

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
        buffer = self._buffer(allocation)
        allocation.region = self._region
        allocation.before = 0
        spans = self._spans(allocation, ("state", self._region), buffer)
        allocation.state_spans = spans if spans != [(0, allocation.size)] else None
        if spans is None:
            return
        started = time.perf_counter()
        scan = self.options.detect_pointers and not self.options.fixed_addresses and not self._marked_fixed
        for offset, size in spans:
            inspect = functools.partial(self._look_for_stored_pointers, allocation, offset) if scan else None
            payload = self.memory.snapshot(allocation.address + offset, size, stream, self.writer, inspect)
            self.writer.state(buffer=buffer, payload=payload, size=size, offset=offset)
            if (offset, size) == (0, allocation.size):
                allocation.before = payload
            self.report.snapshot_bytes += size
            if kernel:
                self.report.kernel(kernel).bytes_stored += size
        self.report.snapshot_seconds += time.perf_counter() - started
        if self.options.mode == CaptureMode.REGION:
            self._touched.append(allocation)

    def _spans(self, allocation: Allocation, step: Hashable, buffer: int) -> list[tuple[int, int]] | None:
        """(offset, size) of each part of the allocation to snapshot: its live framework buffers
        where a framework manages it, else all of it; None (and an unsupported operation, once)
        when it is larger than options.max_snapshot and no framework says which bytes are live."""
        live = None
        if self.options.live_buffers and allocation.api == ev.MemoryApi.DEVICE:
            live = self.live_buffers.ranges(allocation.address, allocation.size, step)
        if live is not None:
            self.report.skipped_bytes += allocation.size - live.size
            self.report.live_sources.add(live.source)
            return [(r.start - allocation.address, r.size) for r in live.ranges]
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

    def _note_scoped(self, allocation: Allocation) -> None:
        for _, touched in self._scopes:  # each open scope checkpoints it at its end
            touched[allocation.address] = allocation

    def _look_for_stored_pointers(
        self, allocation: Allocation, base: int, offset: int, data: bytes | memoryview
    ) -> None:
        """Device memory holding addresses of allocations (pointer arrays, cuBLAS workspaces)
        cannot be relocated: mark the capture as needing --fixed-addresses. ``data``: the bytes
        at ``base + offset`` in the allocation (each frame of a snapshot, taken at ``base``, that
        crossed the bus)."""
        found = None if self._marked_fixed else self.allocations.stored_device_address(data)
        if found is None:
            return
        value, where, target = found
        where += base + offset
        self._marked_fixed = True
        holder, target_buffer = allocation.buffer, self._buffer(target)
        reason = f"buffer {holder} holds the address {value:#x} (of buffer {target_buffer}) at byte {where}"
        self.report.needs_fixed_addresses = reason
        # objects are immutable once written: one alias buffer marks the whole capture
        marker = m.Buffer(
            size=allocation.size,
            device=self._device,
            address=allocation.address,
            requires_fixed_address=True,
            label=f"fixed-address marker: {reason}",
        )
        self.writer.add_object(marker)

    def _checkpoint(self, allocations: list[Allocation], *, stream: int | None, name: str) -> None:
        """What the allocations hold now, for those still alive (their live framework buffers
        where a framework manages them): unchanged ones too (a step run again on the same inputs
        rewrites its outputs with the bytes they held), at no cost in the file, where their
        payload is their state's."""
        entries: list[m.CheckpointEntry] = []
        types: list[m.TypedTensor] = []
        self._checkpoints += 1
        started = time.perf_counter()
        live = self.live_types.labels() if allocations else []  # what the frameworks say it holds, once
        self.report.typing_seconds += time.perf_counter() - started
        for allocation in allocations:
            if not self.allocations.is_live(allocation):
                continue  # freed meanwhile
            spans = self._spans(allocation, ("checkpoint", self._checkpoints), allocation.buffer)
            if spans == [(0, allocation.size)] and allocation.state_spans is not None:
                # the state held only the live buffers of a framework that no longer speaks for this
                # memory (expandable segments released, say): the other bytes are undefined at
                # replay's start, so only the ranges the state set are compared
                spans = allocation.state_spans
            started = time.perf_counter()
            for offset, size in spans or ():
                payload = self.memory.snapshot(allocation.address + offset, size, stream, self.writer)
                self.report.snapshot_bytes += size
                entries.append(m.CheckpointEntry(allocation.buffer, payload, offset, size))
            self.report.snapshot_seconds += time.perf_counter() - started
            labels = sorted([*live, *allocation.labels], key=lambda t: (t.address, -t.size))
            typed = typed_tensors(allocation.buffer, allocation.address, spans or (), labels)
            self.report.typed_bytes += sum(t.size for t in typed)
            self.report.checkpoint_bytes += sum(size for _, size in spans or ())
            types += typed
        self.writer.checkpoint(entries, name=name, types=types)
