"""The writer's payload-frame helpers: frames whose digests were computed elsewhere (e.g. on the
device), for :meth:`CaptureWriter.add_payload_frames` (checking the digests, claiming the frames
the file lacks, delivering only those, written straight from the caller's memory); the sampled
compressor every frame goes through; writing at an offset.

The caller's ``fetch_missing(indices)`` yields ``(index, data, release)`` for each frame asked for,
in any order; ``data`` is any C-contiguous buffer (pinned host memory, say) that must stay valid
until the writer calls ``release()`` (when it is not None), which it does once the frame is
compressed and written, or once it is known not to be needed (an error). Nothing is copied out of
``data`` on the way: the compressor and ``os.pwritev`` read it where it lies.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import zstandard

from replayfmt.errors import ReplayUsageError
from replayfmt.format.layout import Codec
from replayfmt.format.payloads import CompressionPolicy, FrameCompressor

Release = Callable[[], None] | None
FrameData = Any  # a C-contiguous buffer: bytes, memoryview, numpy array
FetchMissing = Callable[[list[int]], Iterable[tuple[int, FrameData, Release]]]

_SAMPLES = 4  # pieces of a frame compressed to decide whether compressing all of it pays
_SAMPLE_SIZE = 32 << 10
_FAST_LEVEL = 1
_FAST_ENOUGH = 0.02  # the policy's level must save 2% more than level 1 on the samples to be used


class InlineExecutor:
    """Runs submitted work at once on the caller's thread (``threads=0``)."""

    def submit(self, fn: Any, *args: Any) -> cf.Future:
        future: cf.Future = cf.Future()
        try:
            future.set_result(fn(*args))
        except BaseException as exc:
            future.set_exception(exc)
        return future

    def shutdown(self, wait: bool = True) -> None:
        pass


def write_all(fd: int, parts: list[bytes | memoryview], offset: int | None = None) -> int:
    """Write every part, at the file position (``offset`` None) or at ``offset`` (pwritev: writers
    of disjoint reserved ranges then run in parallel). Returns the bytes written."""
    total = sum(len(p) for p in parts)
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        if offset is None:
            written = os.writev(fd, views)
        else:
            written = os.pwritev(fd, views, offset)
            offset += written
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]
    return total


def check_frame_digests(size: int, frame_size: int, digests: Sequence[bytes]) -> None:
    """A payload of ``size`` bytes has one 16-byte digest per ``frame_size`` frame."""
    expected = -(-size // frame_size) if size else 0
    if len(digests) != expected:
        raise ReplayUsageError(
            f"add_payload_frames: {len(digests)} digests for {size} bytes in frames of {frame_size} "
            f"(expected {expected})"
        )
    for i, digest in enumerate(digests):
        if type(digest) is not bytes or len(digest) != 16:
            raise ReplayUsageError(f"add_payload_frames: digest {i} is not 16 bytes")


def claim_missing(digests: Sequence[bytes], known: set[bytes]) -> list[int]:
    """Indices of the frames whose digests ``known`` lacks (the first of equal ones), which are
    added to ``known`` at once: a concurrent call with the same content asks for none of them.
    The caller holds the lock that guards ``known``."""
    missing = []
    for i, digest in enumerate(digests):
        if digest not in known:
            known.add(digest)
            missing.append(i)
    return missing


def unclaimer(digests: Sequence[bytes], known: set[bytes], lock: Any) -> Callable[[list[int]], None]:
    """What gives frames back after a failed delivery: their digests leave ``known`` (under
    ``lock``), so that the next writer of those bytes stores them."""

    def unclaim(indices: list[int]) -> None:
        with lock:
            known.difference_update(digests[i] for i in indices)

    return unclaim


def deliver(
    frame_size: int,
    size: int,
    missing: list[int],
    fetch_missing: FetchMissing,
    submit: Callable[[int, FrameData, Release], None],
    unclaim: Callable[[list[int]], None],
) -> None:
    """Ask ``fetch_missing`` for the missing frames and ``submit(index, data, release)`` each.

    Raises ReplayUsageError when it yields a frame that was not asked for or of the wrong size,
    or not every frame; on any error the frames not submitted are handed to ``unclaim`` first."""
    pending = set(missing)
    frames = fetch_missing(list(missing)) if missing else ()
    try:
        for index, data, release in frames:
            view = memoryview(data)
            expected = min(frame_size, size - index * frame_size) if 0 <= index * frame_size < size else -1
            if index not in pending or view.nbytes != expected:
                if release is not None:
                    release()
                what = "was not asked for" if index not in pending else f"has {view.nbytes} bytes, not {expected}"
                raise ReplayUsageError(f"add_payload_frames: fetch_missing's frame {index} {what}")
            pending.discard(index)
            submit(index, view, release)
        if pending:
            first = sorted(pending)[:4]
            raise ReplayUsageError(
                f"add_payload_frames: fetch_missing did not yield frames {first} ({len(pending)} in all)"
            )
    except BaseException:
        unclaim(sorted(pending))
        raise
    finally:
        close = getattr(frames, "close", None)
        if close is not None:
            close()  # a generator's own cleanup (its pinned slots) runs now


class SampledCompressor:
    """Compresses a frame as a few samples of it say pays: noise-like data (fp32 values, random
    bytes) is stored raw at copy speed instead of going through the compressor at a fraction of
    it, and data whose gain is all entropy coding (bf16 weights: the same ratio at level 1 as at
    3) is compressed at zstd's fast level 1, twice as fast. Otherwise ``policy`` applies as is."""

    def __init__(self, policy: CompressionPolicy) -> None:
        self.policy = policy
        self.frames = FrameCompressor(policy)
        fast = CompressionPolicy(level=min(policy.level, _FAST_LEVEL), min_saving=policy.min_saving)
        self.fast = FrameCompressor(fast) if fast.level != policy.level else self.frames
        self._local = threading.local()  # per thread: zstd contexts for the samples

    def _sampled_size(self, level: int, samples: list[memoryview]) -> int:
        contexts = self._local.__dict__.setdefault("contexts", {})
        ctx = contexts.get(level)
        if ctx is None:
            ctx = contexts[level] = zstandard.ZstdCompressor(level=level)
        return sum(len(ctx.compress(sample)) for sample in samples)

    def compress(self, data: FrameData) -> tuple[Codec, FrameData]:
        view = memoryview(data).cast("B")
        size = len(view)
        if size < 4 * _SAMPLES * _SAMPLE_SIZE:
            return self.frames.compress(view)
        step = size // _SAMPLES
        samples = [view[k * step : k * step + _SAMPLE_SIZE] for k in range(_SAMPLES)]
        fast = self._sampled_size(self.fast.policy.level, samples)
        whole = _SAMPLES * _SAMPLE_SIZE
        if fast > whole * (1.0 - self.policy.min_saving):
            return Codec.RAW, view  # the samples do not save what the policy asks: store raw
        if self.fast is not self.frames:
            slow = self._sampled_size(self.policy.level, samples)
            if slow > fast * (1.0 - _FAST_ENOUGH):
                return self.fast.compress(view)
        return self.frames.compress(view)
