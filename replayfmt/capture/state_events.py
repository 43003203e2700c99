"""What the translator records of memory the program had before a region: each allocation's
contents at its first touch in a region (or kernel instance) become *state* (format 1.1: never a
copy the program made), a snapshot that crossed the bus is scanned for stored device addresses
(which force --fixed-addresses), and the region and each scope in it checkpoint what they touched.
A mixin of :class:`~replayfmt.capture.translate.Translator`, like ``MemoryEvents``.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING

from replayfmt.capture.allocations import Allocation, AllocationTable
from replayfmt.capture.options import CaptureMode, RecordOptions
from replayfmt.format import model as m

if TYPE_CHECKING:
    from replayfmt.capture.device_memory import DeviceMemory
    from replayfmt.capture.report import Report
    from replayfmt.container.writer import CaptureWriter


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
        """First touch in this region (or kernel instance): its contents become starting state."""
        self._note_scoped(allocation)
        if allocation.region == self._region:
            return  # touched already, so its buffer is written too
        buffer = self._buffer(allocation)
        allocation.region = self._region
        started = time.perf_counter()
        scan = self.options.detect_pointers and not self.options.fixed_addresses and not self._marked_fixed
        inspect = functools.partial(self._look_for_stored_pointers, allocation) if scan else None
        allocation.before = self.memory.snapshot(allocation.address, allocation.size, stream, self.writer, inspect)
        self.report.snapshot_seconds += time.perf_counter() - started
        self.writer.state(buffer=buffer, payload=allocation.before, size=allocation.size)
        self.report.snapshot_bytes += allocation.size
        if kernel:
            self.report.kernel(kernel).bytes_stored += allocation.size
        if self.options.mode == CaptureMode.REGION:
            self._touched.append(allocation)

    def _note_scoped(self, allocation: Allocation) -> None:
        for _, touched in self._scopes:  # each open scope checkpoints it at its end
            touched[allocation.address] = allocation

    def _look_for_stored_pointers(self, allocation: Allocation, offset: int, data: bytes | memoryview) -> None:
        """Device memory holding addresses of allocations (pointer arrays, cuBLAS workspaces)
        cannot be relocated: mark the capture as needing --fixed-addresses. ``data``: the bytes
        at ``offset`` in the allocation (each frame of a snapshot that crossed the bus)."""
        found = None if self._marked_fixed else self.allocations.stored_device_address(data)
        if found is None:
            return
        value, where, target = found
        where += offset
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
        """What the allocations hold now, for those still alive: unchanged ones too (a step run
        again on the same inputs rewrites its outputs with the bytes they held), at no cost in
        the file, where their payload is their state's."""
        entries = []
        for allocation in allocations:
            if not self.allocations.is_live(allocation):
                continue  # freed meanwhile
            started = time.perf_counter()
            payload = self.memory.snapshot(allocation.address, allocation.size, stream, self.writer)
            self.report.snapshot_seconds += time.perf_counter() - started
            self.report.snapshot_bytes += allocation.size
            entries.append(m.CheckpointEntry(allocation.buffer, payload, 0, allocation.size))
        self.writer.checkpoint(entries, name=name)
