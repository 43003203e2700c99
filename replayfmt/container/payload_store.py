"""Payload frames on their way to the file (:class:`FrameStore`, the writer's frame side): each
distinct frame, by its XXH3-128 digest, claimed by one thread and made pending in the same step,
compressed on a pool by the sampled compressor and written at an offset reserved from the file's
end. Frames whose digests were computed elsewhere (e.g. on the device) come through
:meth:`FrameStore.store_precomputed`: only the frames the file lacks are fetched, and written
straight from the caller's memory.

The caller's ``fetch_missing(indices)`` yields ``(index, data, release)`` for each frame asked for,
in any order; ``data`` is any C-contiguous buffer (pinned host memory, say) that must stay valid
until the writer calls ``release()`` (when it is not None), which it does once the frame is
compressed and written, or once it is known not to be needed (an error). Nothing is copied out of
``data`` on the way: the compressor and ``os.pwritev`` read it where it lies.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import zstandard

from replayfmt.errors import ReplayUsageError
from replayfmt.format.layout import DEFAULT_LIMITS, ChunkKind, Codec, align_up, pack_chunk_header
from replayfmt.format.payloads import CompressionPolicy, FrameCompressor, frame_hash

Release = Callable[[], None] | None
FrameData = Any  # a C-contiguous buffer: bytes, memoryview, numpy array
FetchMissing = Callable[[list[int]], Iterable[tuple[int, FrameData, Release]]]

_SAMPLES = 4  # pieces of a frame compressed to decide whether compressing all of it pays
_SAMPLE_SIZE = 32 << 10
_FAST_LEVEL = 1
_FAST_ENOUGH = 0.02  # the policy's level must save 2% more than level 1 on the samples to be used


def check_frame_count(size: int, frame_size: int) -> None:
    """A reader refuses a payload of more than ``Limits.max_payload_frames`` frames: so does a writer."""
    frames = -(-size // frame_size) if size else 0
    if frames > DEFAULT_LIMITS.max_payload_frames:
        raise ReplayUsageError(
            f"a payload of {size} bytes in frames of {frame_size} has {frames} frames, over "
            f"Limits.max_payload_frames ({DEFAULT_LIMITS.max_payload_frames}): write it with a larger frame_size"
        )


def check_frame_digests(size: int, frame_size: int, digests: Sequence[bytes]) -> None:
    """A payload of ``size`` bytes has one 16-byte digest per ``frame_size`` frame."""
    check_frame_count(size, frame_size)
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


class Detached:
    """What a ``fetch_missing`` returns for frames that no longer depend on the caller's memory
    (copied aside first: into device memory of the recorder's own, say): they are delivered on the
    store's own thread after the call returns. The payload is defined at once; flushing and
    closing the writer wait for its frames, and a failure to deliver them fails the writer there."""

    def __init__(self, frames: Iterable[tuple[int, FrameData, Release]]):
        self.frames = frames


def deliver(
    frame_size: int,
    size: int,
    missing: list[int],
    frames: Iterable[tuple[int, FrameData, Release]],
    submit: Callable[[int, FrameData, Release], None],
    unclaim: Callable[[list[int]], None],
) -> None:
    """``submit(index, data, release)`` each of the missing frames ``frames`` yields.

    Raises ReplayUsageError when it yields a frame that was not asked for or of the wrong size,
    or not every frame; on any error the frames not submitted are handed to ``unclaim`` first."""
    pending = set(missing)
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


FrameRow = tuple[int, int, int, int, int, int]  # hash lo, hash hi, offset, stored size, logical size, codec


class FrameStore:
    """The frames of a capture being written. ``reserve(n)`` returns the offset of ``n`` bytes
    reserved at the file's end (``reserve(-n, offset)`` gives them back when nothing was reserved
    after them); ``write_at(parts, offset)`` writes there (raising ReplayError).
    Thread-safe: a frame is claimed and made pending under one lock, so that :meth:`pending`,
    read after any record that refers to a frame, always includes a frame still being written."""

    def __init__(
        self,
        *,
        policy: CompressionPolicy,
        threads: int,
        frame_size: int,
        reserve: Callable[..., int],
        write_at: Callable[[list[Any], int], int],
        executor: Any,
    ) -> None:
        self.frame_size = frame_size
        self._sampled = SampledCompressor(policy)  # raw, level 1 or the policy's, by samples
        self._pool = executor
        self._slots = threading.BoundedSemaphore(max(2, 2 * threads))  # frames in flight (memory)
        self._reserve = reserve
        self._write_at = write_at
        self._lock = threading.Lock()
        self._keys: set[bytes] = set()  # frames claimed by a thread (written, or being written)
        self._pending: set[cf.Future] = set()
        self._rows: list[FrameRow] = []
        # detached frames (Detached), one payload after another, beside the compressing pool
        self._detached = cf.ThreadPoolExecutor(1, thread_name_prefix="replayfmt-detached")

    def store(self, view: memoryview) -> list[bytes]:
        """The digests of ``view``'s frames; the frames the file lacks are copied and stored."""
        check_frame_count(len(view), self.frame_size)
        hashes = []
        for start in range(0, len(view), self.frame_size):
            part = view[start : start + self.frame_size]
            digest = frame_hash(part)
            hashes.append(digest)
            with self._lock:
                claim = None if digest in self._keys else self._claim(digest)
            if claim is not None:
                self._submit(digest, bytes(part), None, claim)
        return hashes

    def store_precomputed(self, size: int, digests: list[bytes], fetch_missing: FetchMissing) -> None:
        """Store a payload of ``size`` bytes given its frames' digests: only the frames the file
        lacks are fetched (see the module's docstring for ``fetch_missing``)."""
        check_frame_digests(size, self.frame_size, digests)
        with self._lock:
            missing = claim_missing(digests, self._keys)
            claims = {i: self._pend() for i in missing}

        def submit(index: int, data: Any, release: Release) -> None:
            self._submit(digests[index], data, release, claims[index])

        def unclaim(indices: list[int]) -> None:  # never fetched: nothing refers to them
            with self._lock:
                self._keys.difference_update(digests[i] for i in indices)
            for i in indices:
                claims[i].set_result(None)

        try:
            frames = fetch_missing(list(missing)) if missing else ()
        except BaseException:
            unclaim(missing)
            raise
        if isinstance(frames, Detached):
            self._detached.submit(self._deliver_detached, size, missing, frames, submit, claims)
            return
        deliver(self.frame_size, size, missing, frames, submit, unclaim)

    def _deliver_detached(
        self, size: int, missing: list[int], frames: Detached, submit: Any, claims: dict[int, cf.Future]
    ) -> None:
        """On the store's own thread: a payload is defined already, so frames that cannot be
        delivered fail their claims (the writer's flush and close raise), never vanish."""

        def fail(indices: list[int]) -> None:
            problem = ReplayUsageError(f"a snapshot's frames {indices[:4]} could not be delivered")
            for i in indices:
                if not claims[i].done():
                    claims[i].set_exception(problem)

        with contextlib.suppress(BaseException):  # deliver failed the claims of frames it did not hand over
            deliver(self.frame_size, size, missing, frames.frames, submit, fail)

    def close(self) -> None:
        """Wait for the detached frames to be handed over (the pool writes them)."""
        self._detached.shutdown(wait=True)

    def pending(self) -> list[cf.Future]:
        """Frames claimed and not yet written (a failed one stays, with its exception)."""
        with self._lock:
            return list(self._pending)

    def rows(self) -> list[FrameRow]:
        """Every written frame, by offset: the index's frame table."""
        with self._lock:
            return sorted(self._rows, key=lambda row: row[2])

    def _claim(self, digest: bytes) -> cf.Future:
        self._keys.add(digest)
        return self._pend()

    def _pend(self) -> cf.Future:
        """A new pending claim (called with the lock held)."""
        claim: cf.Future = cf.Future()
        self._pending.add(claim)
        claim.add_done_callback(self._done)
        return claim

    def _done(self, future: cf.Future) -> None:
        if future.exception() is None:
            with self._lock:
                self._pending.discard(future)

    def _submit(self, digest: bytes, data: Any, release: Release, claim: cf.Future) -> None:
        self._slots.acquire()
        try:
            self._pool.submit(self._write, digest, data, release, claim)
        except BaseException as exc:
            self._slots.release()
            if release is not None:
                release()
            claim.set_exception(exc)
            raise

    def _write(self, digest: bytes, data: Any, release: Release, claim: cf.Future) -> None:
        try:
            codec, stored = self._sampled.compress(data)
            header = pack_chunk_header(ChunkKind.FRAME, 0, codec, stored, len(data), digest)
            pad = bytes(align_up(len(stored)) - len(stored))
            size = len(header) + len(stored) + len(pad)
            offset = self._reserve(size)
            try:
                self._write_at([header, stored, pad], offset)  # frames are written in parallel
            except BaseException:
                self._reserve(-size, offset)  # a torn last chunk: the next one is written over it
                raise
            lo, hi = int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little")
            with self._lock:
                self._rows.append((lo, hi, offset, len(stored), len(data), int(codec)))
        except BaseException as exc:
            claim.set_exception(exc)
        else:
            claim.set_result(None)
        finally:
            self._slots.release()
            if release is not None:
                release()


class PayloadIds:
    """Payload ids by identity (XXH3-128 over the size and frame hashes), dense from 1: the same
    content is the same payload however often it is stored."""

    def __init__(self) -> None:
        self._ids: dict[bytes, int] = {}
        self.next = 1  # the id the next new content gets

    def assign(self, identity: bytes) -> tuple[int, bool]:
        """(its id, whether it is new)."""
        found = self._ids.get(identity)
        if found is not None:
            return found, False
        pid = self._ids[identity] = self.next
        self.next += 1
        return pid, True
