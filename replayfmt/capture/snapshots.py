"""Device snapshots limited by the bus, not by Python.

A snapshot of ``size`` bytes at a device address becomes a payload in four steps:

1. wait for the program's stream (the bytes must be what the next launch reads);
2. hash every frame on the device (XXH3-128, bit-exact with the host's ``frame_hash``: the
   ``replayfmt.cuda.digest`` kernel), so that content the file already holds (the same weights
   in every kernel instance, a buffer unchanged since its last snapshot) never crosses PCIe;
3. ask the writer which frames it lacks (``CaptureWriter.add_payload_frames``) and copy only
   those, on the recorder's own stream, into pinned slots, the next slot's copy running while
   the frames of the last one are handed over;
4. the writer's threads compress and write each frame straight from its pinned slot; a slot
   returns to the pool once all its frames are written.

The program is held only until the last missing frame has landed in pinned memory: compression
and writing go on behind it (bounded by the pool: a program that snapshots faster than the disk
takes waits for a free slot). Frames the device cannot hash (shorter than 241 bytes, or an
unaligned address) are hashed on the host after a small copy.

The device is reached through :class:`SnapshotDevice`, so the pipeline's logic is tested on the
CPU with a fake; :class:`CudaSnapshotDevice` is the real one (cuda.bindings).
"""

from __future__ import annotations

import collections
import ctypes
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from replayfmt.capture.stored_pointers import FrameWords, Words
from replayfmt.container.payload_store import Detached
from replayfmt.cuda.digest import SHORTEST, DeviceDigester
from replayfmt.cuda.driver import CudaCallError, check
from replayfmt.format.payloads import frame_hash

Inspect = Callable[[int, memoryview], None]  # (offset in the snapshot, the frame's bytes)
Found = tuple[np.ndarray, np.ndarray] | None  # a frame's candidate words found on the device, or too many
# Snapshots this large or larger are copied aside on the device and written behind the program
STAGE_AT_LEAST = 32 << 20
# cuMemHostAlloc flag: the memory is pinned for every context, not only the allocating one (the
# recorder copies from several devices into the same pinned buffers)
HOST_ALLOC_PORTABLE = 0x01


class SnapshotDevice(Protocol):
    """What the pipeline needs of a device (all calls from the recorder's thread)."""

    def synchronize(self, stream: int | None) -> None:
        """Wait for the program's ``stream`` (None: the whole context)."""

    def digests(self, frames: list[tuple[int, int]]) -> list[bytes] | None:
        """XXH3-128 of each (address, length) frame, hashed on the device; None when the
        device cannot (no kernel): the pipeline then hashes on the host."""

    def copy(self, host: int, address: int, size: int) -> None:
        """Queue a device-to-host copy into pinned memory on the recorder's own stream."""

    def mark(self) -> Any:
        """A marker after the copies queued so far (an event)."""

    def wait(self, marker: Any) -> None:
        """Wait until the copies before ``marker`` are done, then forget it."""

    def pinned(self, size: int) -> tuple[int, memoryview]:
        """``size`` bytes of pinned host memory: its address and a writable view of it."""

    def candidates(self, frames: list[tuple[int, int]], low: int, high: int) -> list[Found] | None:
        """Per (address, length) frame, its 8-byte words in [low, high) found on the device
        (offsets, values), or None for a frame with too many; None when the device cannot."""

    def stage(self, size: int) -> int | None:
        """``size`` bytes of the recorder's own device memory to copy frames aside into, or None
        when the device has no room to spare (the program's memory comes first)."""

    def copy_device(self, destination: int, source: int, size: int) -> None:
        """Queue a device-to-device copy on the recorder's own stream."""

    def free_stage(self, address: int) -> None: ...

    def free_pinned(self, address: int) -> None: ...


@dataclass
class SnapshotStats:
    """What the snapshots cost and moved, for the report and the benchmark."""

    @classmethod
    def total(cls, parts: list[SnapshotStats]) -> SnapshotStats:
        """The sum of several devices' stats."""
        out = cls()
        for part in parts:
            for name in cls.__dataclass_fields__:
                setattr(out, name, getattr(out, name) + getattr(part, name))
        return out

    snapshots: int = 0
    logical_bytes: int = 0  # bytes snapshotted
    copied_bytes: int = 0  # bytes that crossed the bus (the frames the file lacked)
    copy_seconds: float = 0.0  # the program was held for these copies
    hash_seconds: float = 0.0  # device hashing, digests included
    set_aside: int = 0  # snapshots copied aside on the device and written behind the program
    wait_seconds: float = 0.0  # waiting for the program's stream to finish what it queued
    aside_seconds: float = 0.0  # copying aside: the stage's allocation, the device copy and its wait


class _Slot:
    """One pinned buffer; returns to the pool when every frame handed out from it is written."""

    __slots__ = ("address", "frames", "lock", "pool", "refs", "view")

    def __init__(self, address: int, view: memoryview, pool: queue.SimpleQueue) -> None:
        self.address, self.view, self.pool = address, view, pool
        self.refs = 0
        self.frames: list[tuple[int, int, int]] = []  # (frame index, offset in slot, length)
        self.lock = threading.Lock()

    def release(self) -> None:
        with self.lock:
            self.refs -= 1
            done = self.refs == 0
        if done:
            self.frames = []
            self.pool.put(self)


class Snapshotter:
    """Snapshots device memory into a writer, hashing on the device and copying only the frames
    the file lacks. ``slot_size`` bytes per pinned slot (a multiple of the writer's frame size),
    ``slots`` slots (at least 2: one copying while the last is handed over)."""

    def __init__(
        self,
        device: SnapshotDevice,
        *,
        slot_size: int = 64 << 20,
        slots: int = 4,
        background: SnapshotDevice | None = None,
        begin: Callable[[], None] | None = None,
    ) -> None:
        """``background``: the device as the writer's thread reaches it (its own stream); with it,
        a snapshot of :data:`STAGE_AT_LEAST` bytes or more whose frames were scanned on the device
        is copied aside on the device and handed to the writer behind the program, which then
        waits for a device-to-device copy, not for the disk. ``begin`` runs first on that thread."""
        if slots < 2:
            raise ValueError("the snapshot pipeline needs at least 2 pinned slots")
        self.device = device
        self.background = background
        self._begin = begin
        self.slot_size = slot_size
        self.slot_count = slots
        self._pool: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        self._slots: list[_Slot] = []
        self._staged = threading.Semaphore(0)  # released by each staged snapshot once its frames are handed over
        self._staged_count = 0
        self.stats = SnapshotStats()

    def _slot(self) -> _Slot:
        if self._pool.empty() and len(self._slots) < self.slot_count:
            address, view = self.device.pinned(self.slot_size)
            slot = _Slot(address, view, self._pool)
            self._slots.append(slot)
            return slot
        return self._pool.get()

    def snapshot(
        self,
        address: int,
        size: int,
        stream: int | None,
        writer: Any,
        inspect: Inspect | None = None,
        *,
        frames: FrameWords | None = None,
    ) -> int:
        """The payload id of the ``size`` bytes at device ``address``, once ``stream`` is done.
        ``inspect(offset, frame)`` sees each frame that crosses the bus (the file lacked it), on
        this thread, before the writer does. ``frames`` (instead of ``inspect``) learns every
        frame's stored-pointer candidates: found on the device where it can, else from the
        frame's bytes when they cross the bus, else by digest (the file held the frame)."""
        started = time.perf_counter()
        self.device.synchronize(stream)
        self.stats.wait_seconds += time.perf_counter() - started
        frame_size = writer.frame_size
        if size and self.slot_size % frame_size:
            raise ValueError(f"slot size {self.slot_size} is not a multiple of the frame size {frame_size}")
        pieces = [(address + start, min(frame_size, size - start)) for start in range(0, size, frame_size)]
        started = time.perf_counter()
        digests = self._digests(pieces)
        # candidates found on the device only where the snapshot may be set aside (a kernel launch
        # and two waits: more than a small snapshot's host scan costs)
        large = self.background is not None and size >= STAGE_AT_LEAST
        found = self._found(pieces, frames) if frames is not None and large else None
        self.stats.hash_seconds += time.perf_counter() - started
        self.stats.snapshots += 1
        self.stats.logical_bytes += size
        started = time.perf_counter()
        learned: set[int] = set()
        if frames is not None:
            scan = frames

            def inspect(offset: int, view: memoryview) -> None:
                if offset not in learned:  # (a frame the device scanned is not scanned again)
                    learned.add(offset)
                    scan.visit(offset, digests[offset // frame_size], view)

            for index, words in enumerate(found or ()):
                if words is not None:  # found on the device: the frame's bytes need not cross the bus
                    scan.learn_words(index * frame_size, digests[index], Words(*words), pieces[index][1])
                    learned.add(index * frame_size)

        def fetch(missing: list[int]) -> Any:
            # frames whose bytes must be looked at as they cross the bus are fetched now; the others
            # may be copied aside on the device and written behind the program
            looked_at = inspect is not None and (frames is None or any(i * frame_size not in learned for i in missing))
            return (None if looked_at else self._staged_fetch(pieces, missing)) or self._fetch(pieces, missing, inspect)

        try:
            payload = writer.add_payload_frames(size, digests, fetch)
        finally:
            self.stats.copy_seconds += time.perf_counter() - started
        if frames is not None:
            for index, digest in enumerate(digests):
                if index * frame_size not in learned:
                    frames.visit(index * frame_size, digest, None)
        return payload

    def _found(self, pieces: list[tuple[int, int]], frames: FrameWords) -> list[Found] | None:
        """The frames' candidate words, found on the device (None: it cannot here)."""
        if not pieces or any(address % 8 for address, _ in pieces):
            return None
        return self.device.candidates(pieces, frames.low, frames.high)

    def _staged_fetch(self, pieces: list[tuple[int, int]], missing: list[int]) -> Detached | None:
        """The missing frames copied aside into the recorder's own device memory, to be copied to
        the host and written behind the program (None: too small, or no room on the device)."""
        total = sum(pieces[i][1] for i in missing)
        if self.background is None or total < STAGE_AT_LEAST:
            return None
        started = time.perf_counter()
        try:
            return self._set_aside(pieces, missing, total)
        finally:
            self.stats.aside_seconds += time.perf_counter() - started

    def _set_aside(self, pieces: list[tuple[int, int]], missing: list[int], total: int) -> Detached | None:
        stage = self.device.stage(total)
        if stage is None:
            return None
        aside: dict[int, tuple[int, int]] = {}
        runs: list[list[int]] = []  # [stage offset, source, length]: frames that follow on, one copy each
        at = 0
        for i in missing:
            source, length = pieces[i]
            aside[i] = (stage + at, length)
            if runs and runs[-1][1] + runs[-1][2] == source:  # (a fresh snapshot: one copy in all)
                runs[-1][2] += length
            else:
                runs.append([at, source, length])
            at += length
        for offset, source, length in runs:  # few driver calls: each lets the writer's threads take the GIL
            self.device.copy_device(stage + offset, source, length)
        try:
            self.device.wait(self.device.mark())
        except BaseException:
            self.device.free_stage(stage)
            raise
        self.stats.copied_bytes += total
        self.stats.set_aside += 1
        self._staged_count += 1
        staged = [aside.get(i, piece) for i, piece in enumerate(pieces)]
        return Detached(self._drain(stage, staged, missing))

    def _drain(
        self, stage: int, staged: list[tuple[int, int]], missing: list[int]
    ) -> Iterator[tuple[int, memoryview, Any]]:
        """On the writer's thread: the staged frames through the pinned slots to the writer."""
        try:
            if self._begin is not None:
                self._begin()  # the program's context, the recorder's guard
            yield from self._fetch(staged, missing, None, device=self.background, count=False)
        finally:
            assert self.background is not None
            self.background.free_stage(stage)
            self._staged.release()

    def _digests(self, frames: list[tuple[int, int]]) -> list[bytes]:
        on_device = [f for f in frames if f[1] >= SHORTEST and f[0] % 8 == 0]
        hashed = self.device.digests(on_device) if on_device else []
        if hashed is None:  # no kernel on this device: every frame through the host
            hashed, on_device = [], []
        by_frame = dict(zip(on_device, hashed, strict=True))
        digests = []
        for frame in frames:
            digest = by_frame.get(frame)
            if digest is None:
                digest = frame_hash(self._read_small(*frame))
            digests.append(digest)
        return digests

    def _read_small(self, address: int, size: int) -> bytes:
        """A frame the device cannot hash, read through one slot (copied out: it is hashed now and
        fetched later only if missing)."""
        slot = self._slot()
        try:
            done = 0
            out = bytearray()
            while done < size:
                n = min(self.slot_size, size - done)
                self.device.copy(slot.address, address + done, n)
                self.device.wait(self.device.mark())
                out += slot.view[:n]
                done += n
            self.stats.copied_bytes += size
            return bytes(out)
        finally:
            self._pool.put(slot)

    def _fetch(
        self,
        frames: list[tuple[int, int]],
        missing: list[int],
        inspect: Inspect | None,
        *,
        device: SnapshotDevice | None = None,
        count: bool = True,
    ) -> Iterator[tuple[int, memoryview, Any]]:
        """Copy the missing frames into pinned slots, one slot copying while the frames of the
        previous one are handed to the writer; each frame's release() returns its share.
        ``device``: whose stream copies (default the recorder's); ``count``: add to the bytes
        that crossed the bus (a staged snapshot counted them when it was copied aside)."""
        device = device or self.device
        in_flight: collections.deque[tuple[_Slot, Any]] = collections.deque()
        pending = collections.deque(missing)
        current: _Slot | None = None
        unhanded = 0
        try:
            while pending or in_flight:
                if pending:
                    slot = self._slot()
                    used = 0
                    while pending and used + frames[pending[0]][1] <= self.slot_size:
                        index = pending.popleft()
                        slot.frames.append((index, used, frames[index][1]))
                        used += frames[index][1]
                    try:
                        self._queue_copies(slot, frames, device)
                        in_flight.append((slot, device.mark()))
                    except BaseException:  # copies queued on it land before it is reused
                        try:
                            device.wait(device.mark())
                        finally:
                            slot.frames = []
                            self._pool.put(slot)
                        raise
                    if len(in_flight) < 2 and pending:
                        continue  # keep one slot copying while the last one is handed over
                current, marker = in_flight.popleft()
                device.wait(marker)
                current.refs = unhanded = len(current.frames)  # before any frame can come back
                frame_size = frames[0][1]
                for index, offset, length in list(current.frames):
                    if count:
                        self.stats.copied_bytes += length
                    view = current.view[offset : offset + length]
                    if inspect is not None:
                        inspect(index * frame_size, view)
                    unhanded -= 1
                    yield index, view, current.release
                current = None
        finally:
            # an error (or the writer stopping early): copies still queued must land before
            # their slots are reused; frames never handed over give their shares back now
            for slot, marker in in_flight:
                device.wait(marker)
                slot.frames = []
                self._pool.put(slot)
            if current is not None:
                for _ in range(unhanded):
                    current.release()

    def _queue_copies(self, slot: _Slot, frames: list[tuple[int, int]], device: SnapshotDevice) -> None:
        """One copy per run of consecutive frames."""
        run_start = run_host = run_length = None
        for index, offset, length in slot.frames:
            address = frames[index][0]
            if run_start is not None and run_start + run_length == address and run_host + run_length == offset:
                run_length += length
                continue
            if run_start is not None:
                device.copy(slot.address + run_host, run_start, run_length)
            run_start, run_host, run_length = address, offset, length
        if run_start is not None:
            device.copy(slot.address + run_host, run_start, run_length)

    def close(self) -> None:
        """Free the pinned slots, once the writer has written every frame handed out from them
        (it releases each one, whatever happens to the write)."""
        for _ in range(self._staged_count):  # every staged snapshot handed over (its stage freed)
            self._staged.acquire()
        self._staged_count = 0
        for _ in self._slots:
            self._pool.get()  # every slot back: no writer thread still reads from one
        for slot in self._slots:
            self.device.free_pinned(slot.address)
        self._slots = []


class CudaSnapshotDevice:
    """:class:`SnapshotDevice` through cuda.bindings: copies and hashing on the recorder's own
    non-blocking stream, the digest kernel loaded on first use."""

    def __init__(self, cu: Any, stream: Any) -> None:
        self.cu = cu
        self.stream = stream
        self._digester: DeviceDigester | bool | None = False  # False: not loaded yet

    def synchronize(self, stream: int | None) -> None:
        cu = self.cu
        if stream is None:
            check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        else:
            check(cu.cuStreamSynchronize(cu.CUstream(stream)), "cuStreamSynchronize (launching stream)")

    def _kernels(self) -> DeviceDigester | None:
        if self._digester is False:
            try:
                self._digester = DeviceDigester(self.cu)
            except CudaCallError:
                self._digester = None  # a driver older than the kernel's PTX: hash on the host
        return self._digester if isinstance(self._digester, DeviceDigester) else None

    def digests(self, frames: list[tuple[int, int]]) -> list[bytes] | None:
        kernels = self._kernels()
        return None if kernels is None else kernels.digests(frames, stream=self.stream)

    def candidates(self, frames: list[tuple[int, int]], low: int, high: int) -> list[Found] | None:
        kernels = self._kernels()
        return None if kernels is None else kernels.candidates(frames, low, high, stream=self.stream)

    def stage(self, size: int) -> int | None:
        cu = self.cu
        err, free, total = cu.cuMemGetInfo()
        if err != cu.CUresult.CUDA_SUCCESS or free < size + max(1 << 30, total // 10):
            return None  # the program's memory comes first: a tight device writes through the slots
        err, address = cu.cuMemAlloc(size)
        return int(address) if err == cu.CUresult.CUDA_SUCCESS else None

    def copy_device(self, destination: int, source: int, size: int) -> None:
        check(self.cu.cuMemcpyDtoDAsync(destination, source, size, self.stream), "cuMemcpyDtoDAsync (snapshot aside)")

    def free_stage(self, address: int) -> None:
        check(self.cu.cuMemFree(address), "cuMemFree (snapshot aside)")

    def copy(self, host: int, address: int, size: int) -> None:
        check(self.cu.cuMemcpyDtoHAsync(host, address, size, self.stream), "cuMemcpyDtoHAsync (snapshot)")

    def mark(self) -> Any:
        cu = self.cu
        event = check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate (snapshot)")
        check(cu.cuEventRecord(event, self.stream), "cuEventRecord (snapshot)")
        return event

    def wait(self, marker: Any) -> None:
        try:
            check(self.cu.cuEventSynchronize(marker), "cuEventSynchronize (snapshot)")
        finally:
            self.cu.cuEventDestroy(marker)

    def pinned(self, size: int) -> tuple[int, memoryview]:
        address = int(check(self.cu.cuMemHostAlloc(size, HOST_ALLOC_PORTABLE), f"cuMemHostAlloc({size})"))
        return address, memoryview((ctypes.c_char * size).from_address(address)).cast("B")

    def free_pinned(self, address: int) -> None:
        self.cu.cuMemFreeHost(address)

    def close(self) -> None:
        if isinstance(self._digester, DeviceDigester):
            self._digester.close()
        self._digester = False
