"""CaptureWriter.add_payload_frames: payloads from precomputed frame digests, where only the frames
the file lacks are fetched (and written straight from the caller's buffers)."""

import threading

import numpy as np
import pytest

import replayfmt
from replayfmt.errors import ReplayUsageError
from replayfmt.format.payloads import MIN_FRAME_SIZE, frame_hash

FRAME = MIN_FRAME_SIZE


def frames_of(data: bytes) -> list[bytes]:
    return [data[i : i + FRAME] for i in range(0, len(data), FRAME)]


class Source:
    """Frames served from a bytes object, recording what was fetched and what was released."""

    def __init__(self, data: bytes) -> None:
        self.frames = frames_of(data)
        self.digests = [frame_hash(f) for f in self.frames]
        self.fetched: list[int] = []
        self.released: list[int] = []
        self.lock = threading.Lock()

    def fetch(self, indices: list[int]):
        for i in indices:
            with self.lock:
                self.fetched.append(i)
            yield i, memoryview(bytearray(self.frames[i])), (lambda i=i: self._release(i))

    def _release(self, i: int) -> None:
        with self.lock:
            self.released.append(i)


def noise(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).standard_normal(size // 4, dtype=np.float32).tobytes()


def weights(size: int, seed: int) -> bytes:
    """bf16-like: compressible by its exponent bytes, so stored compressed."""
    values = (np.random.default_rng(seed).standard_normal(size // 2, dtype=np.float32) * 0.02).view(np.uint32)
    return (values >> 16).astype(np.uint16).tobytes()


@pytest.mark.parametrize("make", [noise, weights, lambda size, seed: bytes(size)], ids=["noise", "bf16", "zeros"])
@pytest.mark.parametrize("threads", [0, 3])
def test_round_trip_matches_add_payload(tmp_path, make, threads):
    data = make(5 * FRAME + 1000, 1)
    source = Source(data)
    path = tmp_path / "f.kreplay"
    with replayfmt.CaptureWriter(path, frame_size=FRAME, threads=threads) as w:
        pid = w.add_payload_frames(len(data), source.digests, source.fetch)
        assert w.add_payload(data) == pid  # the same identity as the bytes themselves
    first_of_each = sorted({d: i for i, d in reversed(list(enumerate(source.digests)))}.values())
    assert sorted(source.fetched) == first_of_each  # equal frames (zeros) are fetched once
    assert sorted(source.released) == first_of_each
    with replayfmt.open(path) as cap:
        assert cap.read_payload(pid) == data
        assert cap.payload(pid).frames == tuple(source.digests)


def test_only_missing_frames_are_fetched(tmp_path):
    old, new = noise(3 * FRAME, 2), noise(FRAME, 3)
    data = old[:FRAME] + new + old[2 * FRAME :]  # frame 1 changed since the last snapshot
    path = tmp_path / "f.kreplay"
    with replayfmt.CaptureWriter(path, frame_size=FRAME, threads=2) as w:
        first = w.add_payload(old)
        source = Source(data)
        second = w.add_payload_frames(len(data), source.digests, source.fetch)
        assert source.fetched == [1]
        held = Source(old)
        assert w.add_payload_frames(len(old), held.digests, held.fetch) == first
        assert held.fetched == []  # everything already in the file: nothing crosses
    with replayfmt.open(path) as cap:
        assert cap.read_payload(first) == old
        assert cap.read_payload(second) == data


def test_equal_frames_within_one_payload_are_fetched_once(tmp_path):
    block = noise(FRAME, 4)
    data = block * 4 + block[:300]
    source = Source(data)
    with replayfmt.CaptureWriter(tmp_path / "f.kreplay", frame_size=FRAME) as w:
        pid = w.add_payload_frames(len(data), source.digests, source.fetch)
    assert source.fetched == [0, 4]
    with replayfmt.open(tmp_path / "f.kreplay") as cap:
        assert cap.read_payload(pid) == data


def test_concurrent_snapshots_of_the_same_content_fetch_each_frame_once(tmp_path):
    data = weights(8 * FRAME, 5)
    sources = [Source(data) for _ in range(6)]
    ids = []
    with replayfmt.CaptureWriter(tmp_path / "f.kreplay", frame_size=FRAME, threads=4) as w:
        barrier = threading.Barrier(len(sources))

        def snapshot(source: Source) -> None:
            barrier.wait()
            ids.append(w.add_payload_frames(len(data), source.digests, source.fetch))

        threads = [threading.Thread(target=snapshot, args=(s,)) for s in sources]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(set(ids)) == 1
    assert sorted(i for s in sources for i in s.fetched) == list(range(8))
    with replayfmt.open(tmp_path / "f.kreplay") as cap:
        assert cap.read_payload(ids[0]) == data


def test_wrong_digest_count_is_refused(tmp_path):
    expected = r"2 digests for 300000 bytes in frames of 65536 \(expected 5\)"
    with (
        replayfmt.CaptureWriter(tmp_path / "f.kreplay", frame_size=FRAME) as w,
        pytest.raises(ReplayUsageError, match=expected),
    ):
        w.add_payload_frames(300000, [bytes(16)] * 2, lambda indices: iter(()))


def test_a_fetch_that_fails_leaves_its_frames_unclaimed(tmp_path):
    data = noise(3 * FRAME, 6)
    source = Source(data)

    def failing(indices):
        yield from source.fetch(indices[:1])
        raise OSError("device lost")

    path = tmp_path / "f.kreplay"
    with replayfmt.CaptureWriter(path, frame_size=FRAME, threads=2) as w:
        with pytest.raises(OSError, match="device lost"):
            w.add_payload_frames(len(data), source.digests, failing)
        retry = Source(data)
        pid = w.add_payload_frames(len(data), retry.digests, retry.fetch)
        assert retry.fetched == [1, 2]  # frame 0 was written by the failed call; the rest are asked again
    with replayfmt.open(path) as cap:
        assert cap.read_payload(pid) == data


@pytest.mark.parametrize(
    ("frames", "message"),
    [
        (lambda s: iter([(2, s.frames[0], None)]), "fetch_missing's frame 2 was not asked for"),
        (lambda s: iter([(0, s.frames[0][:10], None)]), f"fetch_missing's frame 0 has 10 bytes, not {FRAME}"),
        (lambda s: iter(()), r"fetch_missing did not yield frames \[0\] \(1 in all\)"),
    ],
)
def test_a_fetch_that_misbehaves_is_refused(tmp_path, frames, message):
    data = noise(FRAME, 7)
    source = Source(data)
    with replayfmt.CaptureWriter(tmp_path / "f.kreplay", frame_size=FRAME) as w:
        with pytest.raises(ReplayUsageError, match=message):
            w.add_payload_frames(len(data), source.digests, lambda indices: frames(source))
        pid = w.add_payload(data)  # unclaimed: stored by the next writer of the same bytes
    with replayfmt.open(tmp_path / "f.kreplay") as cap:
        assert cap.read_payload(pid) == data


def test_incompressible_frames_are_stored_raw_and_compressible_ones_compressed(tmp_path):
    fp32, bf16 = noise(2 * FRAME, 8), weights(2 * FRAME, 9)
    path = tmp_path / "f.kreplay"
    with replayfmt.CaptureWriter(path, frame_size=FRAME) as w:
        ids = [w.add_payload_frames(len(d), Source(d).digests, Source(d).fetch) for d in (fp32, bf16)]
    with replayfmt.open(path) as cap:
        codecs = [{cap.frame_location(h)[3] for h in cap.payload(pid).frames} for pid in ids]
        assert codecs == [{0}, {1}]  # raw, zstd
        assert cap.read_payload(ids[0]) == fp32 and cap.read_payload(ids[1]) == bf16
