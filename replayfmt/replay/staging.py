"""Staging: every uploaded payload (or file range) brought close to the device once, at setup.

When device memory allows, each upload gets a pristine copy on the device: upload lanes (a
thread, a stream and two pinned slots each) read frames (raw: preadv; zstd: decompressed in
place), check them against their hash and copy each up as soon as it is read, so reading and
uploading overlap; the frames are then checked where they landed, by a kernel. Every run's
uploads are then device-to-device copies. Otherwise the bytes stay in pinned host memory and runs
copy them up.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from replayfmt.container.files import open_regular
from replayfmt.cuda.digest import SHORTEST as DIGEST_SHORTEST, DeviceDigester
from replayfmt.cuda.driver import CudaCallError, check
from replayfmt.errors import FileMismatchError, ReplayError
from replayfmt.format import model as m
from replayfmt.replay.buffers import pinned, pinned_large
from replayfmt.replay.devices import Devices
from replayfmt.replay.plan import Plan, UploadKey, captured_file_range

_UPLOAD_PIECE = 8 << 20  # bytes an upload lane reads at a time (whole frames: one frame at least)
_UPLOAD_LANES = 16  # at most: more contend for memory bandwidth
_UPLOAD_PINNED = 256 << 20  # pinned bytes the lanes may take together (pinning costs ~0.3 s/GiB)
_DEVICE_HEADROOM = 1 << 30  # device memory left free when deciding on pristine copies
_MAX_FRAMES_PER_READ = 256  # one preadv

Reader = Callable[[memoryview], None]
Piece = tuple[int, int, Reader]  # (offset in the upload, length, fills a view of that length)


class FrameCheck(StrEnum):
    """Where payload frames were checked against their recorded hashes while staged."""

    DEVICE = "on the device"  # a kernel hashed each frame where it landed
    HOST = "on the host"  # hashed as read (several devices, a driver too old for the kernel, host staging)
    NONE = "no"  # --no-payload-checks


@dataclass
class StagingStats:
    """How the capture's uploads were brought to the device at setup."""

    bytes: int = 0
    setup_seconds: float = 0.0  # thread pool, pinned upload lanes, the digest kernel's load
    seconds: float = 0.0  # reading, uploading and checking, once set up
    check_seconds: float = 0.0  # of which checking frames on the device, after the uploads
    on_device: bool = False  # pristine copies on the device (else pinned host memory)
    checked: FrameCheck = FrameCheck.NONE

    @property
    def gbs(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds else 0.0

    def line(self) -> str:
        where = "on the device" if self.on_device else "in pinned host memory"
        return (
            f"{self.bytes / 2**20:.1f} MiB staged {where} in {self.seconds:.3f} s ({self.gbs:.1f} GB/s), "
            f"after {self.setup_seconds:.3f} s of setup; frames checked: {self.checked}"
            + (f" ({self.check_seconds * 1e3:.0f} ms)" if self.check_seconds else "")
        )


@dataclass(frozen=True)
class Staged:
    """The bytes of one upload, staged once: a device address (pristine copy) or pinned host memory."""

    address: int
    size: int
    on_device: bool

    def copy_call(self, cu: Any) -> Callable[..., Any]:
        """The async copy that puts these bytes into a buffer: device to device, or host to device."""
        return cu.cuMemcpyDtoDAsync if self.on_device else cu.cuMemcpyHtoDAsync


@dataclass
class Staging:
    """What staging made: where each upload source's bytes are, and how it went."""

    staged: dict[UploadKey, Staged] = field(default_factory=dict)
    stats: StagingStats = field(default_factory=StagingStats)


def stage_uploads(devices: Devices, plan: Plan, *, from_host: bool, check_payloads: bool) -> Staging:
    """Stage every upload source of ``plan`` once (pristine device copies unless ``from_host`` or
    they do not fit; frames checked against their hashes when ``check_payloads``)."""
    sources = plan.uploads
    if not sources:
        return Staging()
    cu = devices.cu
    started = time.perf_counter()
    workers = min(32, os.cpu_count() or 4)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kreplay-stage")
    devices.own(lambda: pool.shutdown(wait=True, cancel_futures=True))
    total = sum(size for _, size in sources.values())
    per_gpu: dict[int, int] = {}
    for op, size in sources.values():
        k = devices.index(plan.buffers[op.dst_buffer].device)
        per_gpu[k] = per_gpu.get(k, 0) + size
    fits = True
    for k, size in per_gpu.items():
        devices.use(k)
        free, _ = check(cu.cuMemGetInfo(), "cuMemGetInfo")
        fits &= size <= free - _DEVICE_HEADROOM
    devices.use(0)
    on_device = not from_host and fits
    stager = _Stager(devices, plan, pool, workers, Staging(stats=StagingStats(bytes=total, on_device=on_device)))
    if on_device:
        stager.on_device(check_payloads, started)
    else:
        stager.on_host(check_payloads, started)
    return stager.result


@dataclass
class _Stager:
    devices: Devices
    plan: Plan
    pool: ThreadPoolExecutor
    workers: int
    result: Staging

    def on_host(self, check_payloads: bool, started: float) -> None:
        stats = self.result.stats
        stats.checked = FrameCheck.HOST if check_payloads else FrameCheck.NONE
        stats.setup_seconds = time.perf_counter() - started
        started = time.perf_counter()
        readers = _Readers(self.plan)
        for key, (op, size) in self.plan.uploads.items():
            address = pinned(self.devices, size, f"operation {op.index}")
            view = memoryview((ctypes.c_char * max(size, 1)).from_address(address)).cast("B")[:size]
            jobs = [
                lambda s=s, n=n, read=read, view=view: read(view[s : s + n])
                for s, n, read in readers.pieces(op, size, _UPLOAD_PIECE, check_frames=check_payloads)
            ]
            for future in [self.pool.submit(job) for job in jobs]:
                future.result()
            self.result.staged[key] = Staged(address, size, on_device=False)
        stats.seconds = time.perf_counter() - started

    def on_device(self, check_payloads: bool, started: float) -> None:
        devices, plan, pool, stats = self.devices, self.plan, self.pool, self.result.stats
        cu, cap, sources = devices.cu, plan.capture, plan.uploads
        frame_sizes = [n for op, _ in sources.values() if not op.src_file for _, n in cap.frame_ranges(op.payload)]
        slot_size = max([_UPLOAD_PIECE, *frame_sizes])
        # frames are checked where they land, on the device, when the digest kernel loads there
        on_device_check = check_payloads and not devices.several
        loading = pool.submit(_load_digester, devices) if on_device_check else None
        pristine: dict[UploadKey, int] = {}
        for key, (op, size) in sources.items():
            devices.use(devices.index(plan.buffers[op.dst_buffer].device))  # next to the buffers it restores
            address = int(check(cu.cuMemAlloc(max(size, 1)), f"operation {op.index}: pristine copy of {size} bytes"))
            devices.own(lambda p=address: cu.cuMemFree(p))
            self.result.staged[key] = Staged(address, size, on_device=True)
            pristine[key] = address
        devices.use(0)
        pieces_at_least = -(-stats.bytes // slot_size)
        count = max(1, min(_UPLOAD_LANES, self.workers, pieces_at_least, _UPLOAD_PINNED // (_SLOTS * slot_size)))
        lanes = UploadLanes(devices, pool, lanes=count, slot_size=slot_size)
        digester = loading.result() if loading is not None else None
        if digester is not None:
            stats.checked = FrameCheck.DEVICE
        elif check_payloads:
            stats.checked = FrameCheck.HOST
        readers = _Readers(plan)
        jobs: list[tuple[int, int, Reader]] = []
        for key, (op, size) in sources.items():
            pieces = readers.pieces(op, size, slot_size, check_frames=stats.checked == FrameCheck.HOST)
            jobs += [(pristine[key] + offset, length, read) for offset, length, read in pieces]
        stats.setup_seconds = time.perf_counter() - started
        started = time.perf_counter()
        lanes.upload(jobs)
        if digester is not None:
            checking = time.perf_counter()
            _check_frames_on_device(plan, digester, pristine)
            stats.check_seconds = time.perf_counter() - checking
        stats.seconds = time.perf_counter() - started


def _load_digester(devices: Devices) -> DeviceDigester | None:
    check(devices.cu.cuCtxSetCurrent(devices.gpus[0].ctx), "frame digests")
    try:
        digester = DeviceDigester(devices.cu)
    except (CudaCallError, OSError):
        return None  # a driver older than the kernel's PTX (or no PTX): frames are hashed on the host
    devices.own(digester.close)
    return digester


def _check_frames_on_device(plan: Plan, digester: DeviceDigester, pristine: dict[UploadKey, int]) -> None:
    """Compare every staged payload frame's digest, computed where it landed, with the
    recorded one (frames of 240 bytes or less, which XXH3 hashes otherwise, on the host)."""
    cap = plan.capture
    frames: list[tuple[int, int]] = []
    names: list[tuple[int, int, bytes]] = []  # (payload, frame index, recorded digest) of each
    for key, (op, _) in plan.uploads.items():
        if op.src_file:
            continue
        recorded = cap.payload(op.payload).frames
        for k, (offset, length) in enumerate(cap.frame_ranges(op.payload)):
            address = pristine[key] + offset
            if length >= DIGEST_SHORTEST and address % 8 == 0:
                frames.append((address, length))
                names.append((op.payload, k, recorded[k]))
            else:
                cap.read_frame_into(op.payload, k, bytearray(length))  # re-read and hashed on the host
    for (payload, k, expected), digest in zip(names, digester.digests(frames), strict=True):
        if digest != expected:
            cap.check_frame_digest(payload, k, digest)  # raises the reader's error, naming the frame


class _Readers:
    """Reads an upload's source bytes: payload frames from the capture, or file ranges."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def pieces(self, op: m.Copy, size: int, chunk: int, *, check_frames: bool) -> list[Piece]:
        """(offset, length, reader) pieces of an upload's source: file chunks, or runs of whole
        payload frames of up to ``chunk`` bytes (one frame at least, 256 at most: one preadv),
        hashed as they are read when ``check_frames``."""
        cap = self.plan.capture
        if op.src_file:
            return [
                (s, min(chunk, size - s), lambda view, s=s: self.read_file_range(op, view, s))
                for s in range(0, size, chunk)
            ]
        pieces: list[Piece] = []
        frames = cap.frame_ranges(op.payload)
        first = 0
        while first < len(frames):
            start, length = frames[first]
            count = 1
            while (
                first + count < len(frames)
                and count < _MAX_FRAMES_PER_READ
                and length + frames[first + count][1] <= chunk
            ):
                length += frames[first + count][1]
                count += 1

            def read(view: memoryview, k: int = first, n: int = count) -> None:
                cap.read_frames_into(op.payload, k, n, view, check=check_frames)

            pieces.append((start, length, read))
            first += count
        return pieces

    def read_file_range(self, op: m.Copy, target: memoryview, skip: int = 0) -> None:
        """Fill ``target`` with the copy's file bytes starting ``skip`` bytes into its range."""
        resolved = self.plan.files[op.src_file]
        ref = resolved.reference
        start = op.src_offset + skip
        if resolved.path is not None:
            fd = open_regular(resolved.path)  # validated at plan time; still only a regular file now
            try:
                got = os.preadv(fd, [target], start)
            finally:
                os.close(fd)
            if got != len(target):
                raise FileMismatchError(
                    f"operation {op.index}: {resolved.path} is shorter than the captured read "
                    f"(bytes [{op.src_offset}, {op.src_offset + op.size}))"
                )
            return
        if ref.policy == m.FilePolicy.CAPTURE_ALL:
            self.plan.capture.read_payload_into(ref.payload, target, start)
            return
        captured = captured_file_range(ref, op.src_offset, op.size)
        if captured is None:
            raise FileMismatchError(f"operation {op.index}: file bytes at {op.src_offset} were not captured")
        self.plan.capture.read_payload_into(captured.payload, target, start - captured.offset)


_SLOTS = 2


@dataclass
class _Lane:
    """One upload lane's own stream and pinned slots, with an event per slot marking its copy done."""

    stream: Any
    slots: list[int]
    done: list[Any]


class UploadLanes:
    """Upload lanes: each is a worker thread with its own stream and two pinned slots. A lane takes
    the next piece, reads it into a slot whose previous copy is done, and copies it up from its
    own thread, so lanes never wait on one another: one ring fed in order by the main thread would
    hold every copy behind the slowest read (half the rate). Every lane is
    pinned before any reads: while the driver pins memory it holds back other threads' driver
    calls, so lanes that pinned as they started would stall each other's copies (half the rate)."""

    SLOTS = _SLOTS

    def __init__(self, devices: Devices, pool: ThreadPoolExecutor, *, lanes: int, slot_size: int) -> None:
        self.devices = devices
        self.cu = devices.cu
        self.pool = pool
        self.slot_size = slot_size
        self.context = devices.gpus[0].ctx
        self.lanes = list(pool.map(self._make_lane, range(lanes)))  # each faults its pages in its own thread

    def _make_lane(self, index: int) -> _Lane:
        cu, own = self.cu, self.devices.own
        check(cu.cuCtxSetCurrent(self.context), "staging lane")
        base = pinned_large(self.devices, self.SLOTS * self.slot_size, f"staging lane {index}")
        stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "staging stream")
        own(lambda: cu.cuStreamDestroy(stream))
        done = [check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "event") for _ in range(self.SLOTS)]
        for event in done:
            own(lambda e=event: cu.cuEventDestroy(e))
        return _Lane(stream, [base + k * self.slot_size for k in range(self.SLOTS)], done)

    def upload(self, jobs: list[tuple[int, int, Reader]]) -> None:
        """Run every (device address, length, reader) job; raises the first failure (a damaged
        frame raises ReplayFormatError here, before anything runs) once every lane has stopped."""
        queue = deque(jobs)
        failed = threading.Event()
        futures = [self.pool.submit(self._run_lane, lane, queue, failed) for lane in self.lanes]
        errors = []
        for future in futures:
            try:
                future.result()
            except BaseException as exc:  # re-raised below, once every lane has stopped
                errors.append(exc)
        if errors:
            raise next((e for e in errors if isinstance(e, ReplayError)), errors[0])

    def _run_lane(self, lane: _Lane, queue: deque, failed: threading.Event) -> None:
        cu = self.cu
        check(cu.cuCtxSetCurrent(self.context), "staging lane")
        try:
            turn = 0
            while not failed.is_set():
                try:
                    target, length, read = queue.popleft()
                except IndexError:
                    break
                slot = turn % self.SLOTS
                if turn >= self.SLOTS:  # the slot's previous copy must be done before it is overwritten
                    check(cu.cuEventSynchronize(lane.done[slot]), "staging upload")
                turn += 1
                read(memoryview((ctypes.c_char * length).from_address(lane.slots[slot])).cast("B"))
                check(cu.cuMemcpyHtoDAsync(target, lane.slots[slot], length, lane.stream), "staging upload")
                check(cu.cuEventRecord(lane.done[slot], lane.stream), "staging upload")
            check(cu.cuStreamSynchronize(lane.stream), "staging upload")
        except BaseException:
            failed.set()
            cu.cuStreamSynchronize(lane.stream)  # its slots must not be freed under a copy still reading them
            raise
