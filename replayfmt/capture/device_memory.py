"""The recorder's own access to device memory (snapshots) and to the driver's allocation table,
through cuda.bindings. These calls run inside callbacks, so they are made under the recorder's
per-thread guard and are never recorded themselves. On a program that uses several devices each
device has its own stream and snapshot pipeline, run in a context of the device whose memory they
read (:mod:`replayfmt.capture.contexts`)."""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from replayfmt.capture.contexts import ProgramContexts
from replayfmt.capture.snapshots import HOST_ALLOC_PORTABLE, CudaSnapshotDevice, SnapshotStats, Snapshotter
from replayfmt.capture.stored_pointers import FrameWords
from replayfmt.container.batches import collector_paused
from replayfmt.cuda.driver import check, driver


class DeviceMemory(Protocol):
    """Device access the translator needs; the CUPTI source implements it with the driver."""

    def read(self, address: int, size: int, stream: int | None) -> bytes | memoryview:
        """``size`` bytes at ``address`` once ``stream`` (a raw handle; None: the whole device) is idle."""

    def host_bytes(self, address: int, size: int) -> bytes:
        """A copy of host memory the program handed to a copy."""

    def find_allocation(self, address: int) -> tuple[int, int] | None:
        """(base, size) of the device allocation holding ``address`` (one made before recording)."""

    def device_of(self, address: int) -> int | None:
        """The ordinal of the device whose memory holds ``address`` (None: not device memory)."""

    def reserve_aside(self, ordinal: int, size: int) -> bool:
        """Device ``ordinal``'s memory for copies (set_aside) made to hold ``size`` bytes at once,
        allocating more where it holds less (cuMemAlloc, which may wait for the device: asked
        only while no collective is pending), and what take_aside reads through (the recorder's
        stream and pinned staging there) made now, for the same reason. Whether it does."""

    def set_aside(self, address: int, size: int, stream: int) -> Any:
        """Queue on the program's ``stream`` a copy of ``size`` bytes at ``address`` into device
        memory of the recorder's own, and an event after it: what the stream's last work left
        there, whatever follows on the stream. Never allocates: returns what names it, or None
        where the memory reserved for copies on that device has no room."""

    def set_aside_done(self, aside: Any, timeout: float = 0.0) -> bool:
        """Whether the copy ``aside`` names has run, asked until ``timeout`` seconds passed."""

    def take_aside(self, aside: Any) -> bytes:
        """The bytes ``aside`` holds (once its copy ran: it waits for that)."""

    def release_aside(self, aside: Any) -> None:
        """``aside``'s memory kept for a later copy and its event destroyed (once its copy ran and
        no thread asks about it any more): never a cuMemFree, which would wait for the whole
        device, where a peer's NCCL kernel may wait for a launch yet to come."""

    def stream_idle(self, stream: int, timeout: float = 0.0) -> bool:
        """Whether the program's ``stream`` has run all its work, asked until ``timeout`` seconds passed."""


class _DeviceSide:
    """The recorder's own work on one device: the context it runs in, its stream and its
    snapshot pipeline (made at first use)."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.stream: Any = None
        self.snapshots: Snapshotter | None = None
        self.asides = AsidePool()  # the device memory reserved for copies of collectives' results


_ALIGN = 256


class AsidePool:
    """One device's memory reserved for copies of collectives' results: blocks (arenas) allocated
    while no collective is pending, handed out first-fit and given back, adjacent free ranges
    joined. Never allocates or frees device memory itself."""

    def __init__(self) -> None:
        self.arenas: list[tuple[int, int]] = []  # (address, size) allocated
        self._free: list[tuple[int, int]] = []  # (address, size), by address

    @property
    def largest(self) -> int:
        """The most bytes one copy can take now."""
        return max((size for _, size in self._free), default=0)

    def grow(self, address: int, size: int) -> None:
        self.arenas.append((address, size))
        self.give(address, size)

    def take(self, size: int) -> tuple[int, int] | None:
        """(address, bytes taken) of room for ``size`` bytes; None: none."""
        need = max(_ALIGN, -(-size // _ALIGN) * _ALIGN)
        for i, (address, room) in enumerate(self._free):
            if room >= need:
                if room == need:
                    del self._free[i]
                else:
                    self._free[i] = (address + need, room - need)
                return address, need
        return None

    def give(self, address: int, size: int) -> None:
        free = self._free
        i = 0
        while i < len(free) and free[i][0] < address:
            i += 1
        free.insert(i, (address, size))
        if i + 1 < len(free) and address + size == free[i + 1][0]:  # joins the next
            free[i] = (address, size + free.pop(i + 1)[1])
        if i > 0 and free[i - 1][0] + free[i - 1][1] == address:  # and the previous
            start, before = free[i - 1]
            free[i - 1] = (start, before + free.pop(i)[1])


@dataclass(frozen=True, slots=True)
class _Aside:
    """A copy of a collective's results queued after it on the program's stream (set_aside)."""

    address: int  # the recorder's own device memory holding it
    size: int
    event: Any  # recorded on the program's stream after the copy
    capacity: int  # bytes of that memory
    ordinal: int  # the device it is on


class DriverMemory:
    """Device and host memory access for snapshots, through cuda.bindings. Device reads land in
    a reused pinned buffer (DMA at full speed) and are copied out once."""

    def __init__(self, guard: threading.local, contexts: ProgramContexts | None = None) -> None:
        self.cu = driver()
        self._guard = guard
        self.contexts = contexts if contexts is not None else ProgramContexts(self.cu)
        self._sides: dict[int, _DeviceSide] = {}  # device ordinal -> the recorder's work there
        self._pinned = 0
        self._pinned_size = 0
        # once copies of collectives' results are reserved, every read runs in pieces of the staging
        # made then: a read may run with the recorder's locks held while a peer's collective is
        # pending (a call whose copy could not be queued), where cuMemHostAlloc and cuMemFreeHost
        # may wait for the device
        self._staging_fixed = False
        self.copy_seconds = 0.0
        self.copied = 0

    @contextlib.contextmanager
    def _unrecorded(self) -> Iterator[None]:
        """The recorder's own driver calls: never recorded, and the caller's guard state is
        restored (these run inside callbacks, which hold the guard already)."""
        guard = self._guard
        previous = getattr(guard, "busy", False)
        guard.busy = True
        try:
            yield
        finally:
            guard.busy = previous

    @contextlib.contextmanager
    def _device_holding(self, address: int) -> Iterator[_DeviceSide]:
        """The recorder's side of the device whose memory holds ``address``, its context current
        for the block (the caller's context afterwards); the current context's device where the
        driver names no allocating context (host memory, virtual memory management: the program's
        own calls in this context reach it)."""
        contexts = self.contexts
        ordinal = contexts.ordinal_of(address)
        if ordinal is None:
            here = contexts.device_of_context(int(check(self.cu.cuCtxGetCurrent(), "cuCtxGetCurrent")))
            ordinal = here.ordinal if here is not None else 0
        with self._device(ordinal) as side:
            yield side

    @contextlib.contextmanager
    def _device(self, ordinal: int) -> Iterator[_DeviceSide]:
        """The recorder's side of device ``ordinal``, its context current for the block."""
        side = self._sides.get(ordinal)
        if side is None:
            side = self._sides[ordinal] = _DeviceSide(self.contexts.context_of_device(ordinal))
        with self.contexts.pushed(side.context):
            yield side

    def _own_stream(self, side: _DeviceSide) -> Any:
        if side.stream is None:
            cu = self.cu
            side.stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        return side.stream

    def _staging(self, size: int) -> int:
        if size > self._pinned_size:
            cu = self.cu
            if self._pinned:
                check(cu.cuMemFreeHost(self._pinned), "cuMemFreeHost")
                self._pinned = 0
            grown = max(size, min(2 * self._pinned_size, 1 << 30), 8 << 20)
            # portable: pinned for every context, since each device's copies land here
            pinned = check(cu.cuMemHostAlloc(grown, HOST_ALLOC_PORTABLE), f"cuMemHostAlloc({grown})")
            self._pinned = int(pinned)
            self._pinned_size = grown
        return self._pinned

    def read(self, address: int, size: int, stream: int | None) -> bytes:
        cu = self.cu
        with self._unrecorded(), self._device_holding(address) as side:
            if stream is None:
                check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
            else:
                check(cu.cuStreamSynchronize(cu.CUstream(stream)), "cuStreamSynchronize (launching stream)")
            return self._copy_out(side, address, size)

    def _copy_out(self, side: _DeviceSide, address: int, size: int, *, grow: bool = True) -> bytes:
        """``size`` bytes at ``address`` copied to the host on the recorder's own stream; without
        ``grow``, in pieces of the staging buffer already made (no driver call that may wait for
        the device: see :meth:`reserve_aside`)."""
        if size == 0:
            return b""
        cu = self.cu
        own = self._own_stream(side)
        grow = (grow and not self._staging_fixed) or not self._pinned_size
        chunk = min(size, 1 << 30) if grow else min(size, self._pinned_size)
        staging = self._staging(chunk)
        out = bytearray(size) if size > chunk else None
        for start in range(0, size, chunk):
            n = min(chunk, size - start)
            began = time.perf_counter()
            check(cu.cuMemcpyDtoHAsync(staging, address + start, n, own), "cuMemcpyDtoHAsync (snapshot)")
            check(cu.cuStreamSynchronize(own), "cuStreamSynchronize (snapshot)")
            self.copy_seconds += time.perf_counter() - began
            self.copied += n
            if out is None:
                return ctypes.string_at(staging, n)
            ctypes.memmove((ctypes.c_char * n).from_buffer(out, start), staging, n)
        return bytes(out or b"")

    def snapshot(
        self,
        address: int,
        size: int,
        stream: int | None,
        writer: Any,
        *,
        frames: FrameWords | None = None,
    ) -> int:
        """The payload id of ``size`` bytes of device memory at ``address`` once ``stream`` (None:
        every stream) is done: hashed on the device, only the frames the file lacks copied, and
        compressed and written from pinned memory by the writer's threads (replayfmt.capture.snapshots);
        large ones copied aside on the device first and written behind the program. ``frames``
        learns every frame's stored-pointer candidates (see :meth:`Snapshotter.snapshot`)."""
        with self._unrecorded(), self._device_holding(address) as side:
            if side.snapshots is None:
                cu = self.cu
                # the writer's thread copies snapshots set aside on a stream of its own
                background = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
                side.snapshots = Snapshotter(
                    CudaSnapshotDevice(cu, self._own_stream(side)),
                    background=CudaSnapshotDevice(cu, background),
                    begin=lambda context=side.context: self._enter_writer_thread(context),
                )
            snapshots = side.snapshots
            stats = snapshots.stats
            copied, began = stats.copied_bytes, time.perf_counter()
            try:
                # with Python's cyclic collector paused: handing a large snapshot's frames to the
                # writer makes a thousand small objects, enough to set off the full collection the
                # recorder's and the program's objects have made due (0.1 s, most of a 1 GiB first
                # touch), which the program would wait for before its kernel ran; it runs at the
                # program's next allocation instead
                with collector_paused():
                    return snapshots.snapshot(address, size, stream, writer, frames=frames)
            finally:
                self.copy_seconds += time.perf_counter() - began
                self.copied += stats.copied_bytes - copied

    @property
    def snapshot_stats(self) -> SnapshotStats:
        """What the snapshots cost and moved so far (where the program was held, and how)."""
        return SnapshotStats.total([side.snapshots.stats for side in self._sides.values() if side.snapshots])

    def _enter_writer_thread(self, context: Any) -> None:
        """On the writer's thread, before it copies a snapshot set aside: the context of the
        device it was set aside on, and the recorder's guard (its driver calls are the
        recorder's own, never recorded)."""
        self._guard.busy = True
        check(self.cu.cuCtxSetCurrent(context), "cuCtxSetCurrent (snapshot writer)")

    def set_aside(self, address: int, size: int, stream: int) -> _Aside | None:
        cu = self.cu
        with self._unrecorded(), self._device_holding(address) as side:
            ordinal = next(o for o, d in self._sides.items() if d is side)
            room = side.asides.take(size)
            if room is None:
                return None  # no cuMemAlloc here: a collective is pending (its own kernel at least)
            copy, capacity = room
            queued = False
            event = None
            try:
                on = cu.CUstream(stream)
                check(cu.cuMemcpyDtoDAsync(copy, address, size, on), "cuMemcpyDtoDAsync (collective's result aside)")
                queued = True
                event = check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
                check(cu.cuEventRecord(event, on), "cuEventRecord (collective's result aside)")
            except BaseException:
                if event is not None:
                    cu.cuEventDestroy(event)
                if not queued:  # a copy queued without its event may yet run: that memory is not reused
                    side.asides.give(copy, capacity)
                raise
            return _Aside(copy, size, event, capacity, ordinal)

    def set_aside_done(self, aside: _Aside, timeout: float = 0.0) -> bool:
        return self._until(
            lambda: self.cu.cuEventQuery(aside.event), timeout, "cuEventQuery (collective's result aside)"
        )

    def stream_idle(self, stream: int, timeout: float = 0.0) -> bool:
        return self._until(lambda: self.cu.cuStreamQuery(self.cu.CUstream(stream)), timeout, "cuStreamQuery")

    def _until(self, query: Any, timeout: float, what: str) -> bool:
        """Whether ``query`` (a driver call) answers success before ``timeout`` seconds passed."""
        cu = self.cu
        deadline = time.monotonic() + timeout
        with self._unrecorded():
            while True:
                (err,) = query()
                if err == cu.CUresult.CUDA_SUCCESS:
                    return True
                if err != cu.CUresult.CUDA_ERROR_NOT_READY:
                    check((err,), what)
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.0005)

    def take_aside(self, aside: _Aside) -> bytes:
        cu = self.cu
        with self._unrecorded(), self._device_holding(aside.address) as side:
            check(cu.cuEventSynchronize(aside.event), "cuEventSynchronize (collective's result aside)")
            return self._copy_out(side, aside.address, aside.size, grow=False)

    def release_aside(self, aside: _Aside) -> None:
        with self._unrecorded():
            self.cu.cuEventDestroy(aside.event)
            side = self._sides.get(aside.ordinal)
            if side is not None:
                side.asides.give(aside.address, aside.capacity)

    def reserve_aside(self, ordinal: int, size: int) -> bool:
        cu = self.cu
        with self._unrecorded(), self._device(ordinal) as side:
            # take_aside runs with the recorder's locks held while a peer's collective may be
            # pending: its stream and pinned staging are made here, at this safe moment, since
            # cuStreamCreate and cuMemHostAlloc may wait for the device
            self._own_stream(side)
            self._staging(1)
            self._staging_fixed = True
            if side.asides.largest >= size:
                return True
            err, made = cu.cuMemAlloc(size)
            if err != cu.CUresult.CUDA_SUCCESS:
                return False  # the program's memory comes first
            side.asides.grow(int(made), size)
            return True

    def host_bytes(self, address: int, size: int) -> bytes:
        return ctypes.string_at(address, size)

    def find_allocation(self, address: int) -> tuple[int, int] | None:
        cu = self.cu
        with self._unrecorded():
            err, kind = cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address)
            if err != cu.CUresult.CUDA_SUCCESS or kind != cu.CUmemorytype.CU_MEMORYTYPE_DEVICE:
                return None
            err, base, size = cu.cuMemGetAddressRange(address)
            if err != cu.CUresult.CUDA_SUCCESS:
                return None
            return int(base), int(size)

    def device_of(self, address: int) -> int | None:
        with self._unrecorded():
            return self.contexts.ordinal_of(address)

    def close(self) -> None:
        """Free the recorder's pinned memory and streams (after the writer has closed: the
        writer's threads read snapshot frames from the pinned slots until then)."""
        cu = self.cu
        with self._unrecorded():
            for side in self._sides.values():
                with self.contexts.pushed(side.context):
                    if side.snapshots is not None:
                        side.snapshots.close()  # waits for the snapshots set aside to be handed over
                        side.snapshots.device.close()
                        if side.snapshots.background is not None:
                            cu.cuStreamDestroy(side.snapshots.background.stream)
                    if side.stream is not None:
                        cu.cuStreamDestroy(side.stream)
                    for address, _ in side.asides.arenas:  # the recorder stops: no collective waits on it
                        cu.cuMemFree(address)
            self._sides.clear()
            if self._pinned:
                cu.cuMemFreeHost(self._pinned)
                self._pinned = 0
            self.contexts.close()
