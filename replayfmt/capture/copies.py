"""The program's copies and memsets in a region: host to device (with the pointers stored in the
bytes it uploads, or a reference to the file the bytes came from), device to host (synchronous
ones with the bytes the program received, for verification), device to device, and memsets. What
they read becomes starting state at its first touch; a write covering an allocation whole needs
no snapshot of what it replaces."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from replayfmt.capture import events as ev
from replayfmt.capture.file_references import FileReferences
from replayfmt.format import model as m

if TYPE_CHECKING:
    from replayfmt.capture.allocations import Allocation, AllocationTable
    from replayfmt.capture.buffers import BufferObjects
    from replayfmt.capture.device_memory import DeviceMemory
    from replayfmt.capture.hostfiles import HostFiles
    from replayfmt.capture.options import RecordOptions
    from replayfmt.capture.regions import Refusals, Region
    from replayfmt.capture.starting_state import StartingState
    from replayfmt.capture.stream_events import Streams
    from replayfmt.writer import CaptureWriter


class Copies:
    """Copy and memset events. Owns the synchronous device-to-host copies awaiting their call's
    return (by thread), and the file references of uploads from mapped files."""

    def __init__(
        self,
        *,
        writer: CaptureWriter,
        options: RecordOptions,
        memory: DeviceMemory,
        allocations: AllocationTable,
        region: Region,
        streams: Streams,
        refusals: Refusals,
        buffers: BufferObjects,
        state: StartingState,
        host_files: HostFiles,
    ) -> None:
        self._writer = writer
        self._memory = memory
        self._allocations = allocations
        self._region = region
        self._streams = streams
        self._refusals = refusals
        self._buffers = buffers
        self._state = state
        self._host_files = host_files
        self._file_references = FileReferences(writer, options)
        self._pending_d2h: dict[int, tuple[int, Allocation, int, int, int]] = {}

    def on_copy(self, event: ev.Copy) -> None:
        if not self._region.recording:
            return
        dst = self._allocations.device_allocation(event.dst)
        src = self._allocations.device_allocation(event.src)
        direction = event.direction
        if direction == ev.CopyDirection.DEFAULT:
            direction = {(True, False): ev.CopyDirection.H2D, (False, True): ev.CopyDirection.D2H}.get(
                (dst is not None, src is not None), ev.CopyDirection.D2D
            )
        stream = self._streams.stream(event.stream)
        flags = m.COPY_FLAG_ASYNC if event.asynchronous else 0
        if direction == ev.CopyDirection.H2D:
            if dst is None:
                return self._refusals.refuse(event.call, f"destination {event.dst:#x} is in no recorded allocation", 0)
            self._state.prepare_write(dst, event.dst - dst.address, event.size, event.stream)
            self._copy_from_host(event, dst, stream, flags)
        elif direction == ev.CopyDirection.D2H:
            src = self._copy_source(event.src, event.stream)  # device, or host memory the program pinned
            if src is None:
                return self._refusals.refuse(event.call, f"source {event.src:#x} is in no recorded allocation", 0)
            if event.asynchronous:
                self._writer.copy_d2h(
                    src_buffer=src.buffer,
                    size=event.size,
                    src_offset=event.src - src.address,
                    stream=stream,
                    flags=flags,
                )
            else:  # written once the call returns, with the bytes the program received
                self._pending_d2h[threading.get_ident()] = (event.dst, src, event.src - src.address, event.size, stream)
        else:
            if dst is None or src is None:
                where = event.dst if dst is None else event.src
                return self._refusals.refuse(event.call, f"address {where:#x} is in no recorded allocation", 0)
            self._state.touch(src, event.stream, "")
            self._state.prepare_write(dst, event.dst - dst.address, event.size, event.stream)
            self._writer.copy_d2d(
                src_buffer=src.buffer,
                dst_buffer=dst.buffer,
                size=event.size,
                src_offset=event.src - src.address,
                dst_offset=event.dst - dst.address,
                stream=stream,
                flags=flags,
            )
        return None

    def on_copy_done(self, event: ev.CopyDone) -> None:
        pending = self._pending_d2h.pop(threading.get_ident(), None)
        if pending is None:
            return
        dst, src, src_offset, size, stream = pending
        self._writer.copy_d2h(
            src_buffer=src.buffer,
            size=size,
            src_offset=src_offset,
            stream=stream,
            expected=self._memory.host_bytes(dst, size),
        )

    def on_memset(self, event: ev.Memset) -> None:
        if not self._region.recording:
            return
        allocation = self._allocations.kernel_allocation(event.address)
        if allocation is None:
            return self._refusals.refuse(event.call, f"address {event.address:#x} is in no recorded allocation", 0)
        offset = event.address - allocation.address
        self._state.prepare_write(allocation, offset, event.count * event.element_size, event.stream)
        self._writer.memset(
            buffer=allocation.buffer,
            value=event.value,
            count=event.count,
            element_size=event.element_size,
            offset=offset,
            stream=self._streams.stream(event.stream),
        )
        return None

    def _copy_source(self, address: int, stream: int) -> Allocation | None:
        """The allocation a device-to-host copy reads, touched: device memory, or pinned,
        registered or managed memory the program made while the recorder listened (XLA copies
        its small pinned flags to the host), refreshed as for a launch; None when unknown."""
        allocation = self._allocations.kernel_allocation(address)
        if allocation is not None:
            self._state.touch_for_launch(allocation, stream, "")
            self._buffers.of(allocation)
        return allocation

    def _copy_from_host(self, event: ev.Copy, dst: Allocation, stream: int, flags: int) -> None:
        offset = event.dst - dst.address
        mapped = self._host_files.file_range(event.src, event.size) if event.size else None
        if mapped is not None:
            path, file_offset = mapped
            reference = self._file_references.for_copy(
                path, file_offset, event.size, lambda: self._memory.host_bytes(event.src, event.size)
            )
            if reference:
                self._writer.copy_h2d(
                    dst_buffer=dst.buffer,
                    src_file=reference,
                    src_offset=file_offset,
                    size=event.size,
                    dst_offset=offset,
                    stream=stream,
                    flags=flags,
                )
                return
        data = self._memory.host_bytes(event.src, event.size)
        words = self._state.candidates(data, offset)
        self._writer.copy_h2d(
            dst_buffer=dst.buffer,
            data=data,
            dst_offset=offset,
            stream=stream,
            flags=flags,
            relocations=self._state.stored_pointers(dst, words),
        )
