"""The translator's handling of the program's memory: allocations and frees of every API a
framework uses (cuMemAlloc*, stream-ordered pools, virtual memory management, pinned, registered
and managed memory), as a mixin of :class:`~replayfmt.capture.translate.Translator`.

Virtual memory management: a buffer covers a contiguous run of pieces mapped into one reserved
range (see :class:`MappedRanges`); when the run grows or shrinks its allocation ends and a new one
begins (the new one is snapshotted whole at its first touch, so a tensor that spans two pieces
stays inside one buffer).

Host-visible memory (pinned, registered, managed): kernels reach it through the addresses the
program holds, and the host may change it with no driver call in between, so before every
launch that uses it its contents are read again and uploaded when they changed.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from replayfmt.capture import events as ev
from replayfmt.capture.allocations import Allocation, AllocationTable, Extent
from replayfmt.capture.stored_pointers import Words, candidate_words
from replayfmt.errors import DeviceError
from replayfmt.format import model as m

if TYPE_CHECKING:
    from replayfmt.capture.device_memory import DeviceMemory
    from replayfmt.capture.file_references import FileReferences
    from replayfmt.capture.hostfiles import HostFiles
    from replayfmt.capture.report import Report
    from replayfmt.writer import CaptureWriter

MEMORY_KINDS = {
    ev.MemoryApi.DEVICE: m.MemoryKind.DEVICE,
    ev.MemoryApi.HOST_PINNED: m.MemoryKind.HOST_PINNED,
    ev.MemoryApi.MANAGED: m.MemoryKind.MANAGED,
}


class MemoryEvents:
    """Allocation event handlers; the translator provides the attributes declared here."""

    allocations: AllocationTable
    writer: CaptureWriter
    memory: DeviceMemory
    report: Report
    _recording: bool
    _region: int
    _host_files: HostFiles
    _file_references: FileReferences

    if TYPE_CHECKING:  # provided by the translator (real stubs here would shadow its mixins' methods)

        def _buffer(self, allocation: Allocation) -> int: ...
        def _stream(self, handle: int) -> int: ...
        def _touch(self, allocation: Allocation, stream: int, kernel: str) -> None: ...
        def _snapshot_failed(
            self, allocation: Allocation, buffer: int, offset: int, size: int, exc: Exception
        ) -> None: ...
        def stored_pointers(self, holder: Allocation, words: Words) -> tuple[m.Relocation, ...]: ...
        def _checkpoint_released(
            self, allocation: Allocation, spans: list[tuple[int, int]] | None, why: str
        ) -> None: ...

        @property
        def scans_pointers(self) -> bool: ...

    def _on_allocation(self, event: ev.Allocation) -> None:
        self.allocations.add(event.address, event.size, event.api, event.call)

    def _on_free(self, event: ev.Free) -> None:
        held = self.allocations.find(event.address)
        if held is not None and held.address == event.address:  # what the region wrote into it, before it goes
            self._checkpoint_released(held, None, f"before {event.call}")
        allocation = self.allocations.remove(event.address)
        if allocation is not None and allocation.buffer and self._recording:
            self.writer.destroy(allocation.buffer)
        alias = self.allocations.device_aliases.pop(event.address, None)
        if alias is not None:
            self._on_free(ev.Free(alias, event.call))

    def _on_host_device_pointer(self, event: ev.HostDevicePointer) -> None:
        """Registered host memory whose device address differs from its host address: kernels
        reach it there, so that range is the allocation they use (its bytes are the same)."""
        host = self.allocations.find(event.host)
        if host is None or host.api == ev.MemoryApi.DEVICE or event.device == event.host:
            return
        base = event.device - (event.host - host.address)
        if self.allocations.device_aliases.get(host.address) != base:
            self.allocations.device_aliases[host.address] = base
            self.allocations.add(base, host.size, host.api, event.call)

    def _on_address_reserved(self, event: ev.AddressReserved) -> None:
        self.allocations.mapped.reserve(event.address, event.size)

    def _on_address_freed(self, event: ev.AddressFreed) -> None:
        self.allocations.mapped.release(event.address)

    def _on_mapped(self, event: ev.Mapped) -> None:
        self._replace_extents(*self.allocations.mapped.map(event.address, event.size), event.call)

    def _on_unmapped(self, event: ev.Unmapped) -> None:
        self._replace_extents(*self.allocations.mapped.unmap(event.address, event.size), event.call)

    def _replace_extents(self, ended: list[Extent], began: list[Extent], call: str) -> None:
        for address, _size in ended:
            self._on_free(ev.Free(address, call))
        for address, size in began:
            self.allocations.add(address, size, ev.MemoryApi.DEVICE, call)

    def _copy_source(self, address: int, stream: int) -> Allocation | None:
        """The allocation a device-to-host copy reads, touched: device memory, or pinned,
        registered or managed memory the program made while the recorder listened (XLA copies
        its small pinned flags to the host), refreshed as for a launch; None when unknown."""
        allocation = self.allocations.kernel_allocation(address)
        if allocation is not None:
            self._touch_for_launch(allocation, stream, "")
            self._buffer(allocation)
        return allocation

    def _touch_for_launch(self, allocation: Allocation, stream: int, kernel: str) -> None:
        """Before a launch that uses the allocation: its first touch, or, for host-visible memory
        already uploaded, what the host may have written since."""
        if allocation.api == ev.MemoryApi.DEVICE or allocation.region != self._region:
            self._touch(allocation, stream, kernel)
            allocation.latest = allocation.before
            return
        started = time.perf_counter()
        try:
            data = self.memory.read(allocation.address, allocation.size, stream)
        except DeviceError as exc:  # the replay would start from stale bytes: it must refuse, saying which
            self._snapshot_failed(allocation, self._buffer(allocation), 0, allocation.size, exc)
            return
        self.report.snapshot_seconds += time.perf_counter() - started
        payload = self.writer.add_payload(data)
        if payload != allocation.latest:
            words = self._candidates(data, 0)
            self.writer.copy_h2d(
                dst_buffer=self._buffer(allocation),
                payload=payload,
                size=allocation.size,
                stream=self._stream(stream),
                relocations=self.stored_pointers(allocation, words),
            )
            self.report.snapshot_bytes += allocation.size
            allocation.latest = payload

    def _copy_from_host(self, event: ev.Copy, dst: Allocation, stream: int, flags: int) -> None:
        offset = event.dst - dst.address
        mapped = self._host_files.file_range(event.src, event.size) if event.size else None
        if mapped is not None:
            path, file_offset = mapped
            reference = self._file_references.for_copy(
                path, file_offset, event.size, lambda: self.memory.host_bytes(event.src, event.size)
            )
            if reference:
                self.writer.copy_h2d(
                    dst_buffer=dst.buffer,
                    src_file=reference,
                    src_offset=file_offset,
                    size=event.size,
                    dst_offset=offset,
                    stream=stream,
                    flags=flags,
                )
                return
        data = self.memory.host_bytes(event.src, event.size)
        words = self._candidates(data, offset)
        self.writer.copy_h2d(
            dst_buffer=dst.buffer,
            data=data,
            dst_offset=offset,
            stream=stream,
            flags=flags,
            relocations=self.stored_pointers(dst, words),
        )

    def _candidates(self, data: bytes | memoryview, first: int) -> Words:
        """Words of uploaded bytes (from byte ``first`` of their buffer) that may be stored pointers."""
        span = self.allocations.span() if self.scans_pointers else None
        return candidate_words(data, first, *span) if span is not None else Words()
