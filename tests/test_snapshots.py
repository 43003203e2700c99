"""The snapshot pipeline (replayfmt.capture.snapshots) on a fake device: device hashing, only the
frames the file lacks copied, pinned slots reused only once written, host fallbacks."""

import numpy as np
import pytest
from fake_device import FakeDevice

import replayfmt
from replayfmt.capture.snapshots import Snapshotter
from replayfmt.format.payloads import MIN_FRAME_SIZE

FRAME = MIN_FRAME_SIZE
BASE = 0x7F00_0000_0000


def device_with(data: bytes) -> FakeDevice:
    device = FakeDevice()
    device.memory[BASE] = bytearray(data)
    return device


def noise(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).standard_normal(size // 4, dtype=np.float32).tobytes()


@pytest.mark.parametrize("threads", [0, 4])
def test_fresh_snapshot_round_trips_and_copies_every_frame_once(tmp_path, threads):
    data = noise(7 * FRAME + 4096, 1)
    device = device_with(data)
    snapshots = Snapshotter(device, slot_size=2 * FRAME, slots=2)
    path = tmp_path / "s.kreplay"
    with replayfmt.CaptureWriter(path, frame_size=FRAME, threads=threads) as w:
        pid = snapshots.snapshot(BASE, len(data), 0x77, w)
    snapshots.close()
    assert device.synchronized == [0x77]
    assert len(device.hashed) == 8  # every frame hashed on the device
    assert sum(n for _, n in device.copies) == len(data)
    assert snapshots.stats.copied_bytes == len(data)
    assert sorted(device.freed) == sorted(device.pinned_buffers)  # both slots, reused, then freed
    with replayfmt.open(path) as cap:
        assert cap.read_payload(pid) == data


def test_content_the_file_holds_never_crosses(tmp_path):
    data = noise(6 * FRAME, 2)
    device = device_with(data)
    snapshots = Snapshotter(device, slot_size=4 * FRAME, slots=2)
    with replayfmt.CaptureWriter(tmp_path / "s.kreplay", frame_size=FRAME, threads=2) as w:
        first = snapshots.snapshot(BASE, len(data), None, w)
        copied = list(device.copies)
        assert snapshots.snapshot(BASE, len(data), None, w) == first
        assert device.copies == copied  # unchanged since its last snapshot: nothing copied
        device.memory[BASE][2 * FRAME + 5] ^= 0xFF  # one byte of frame 2 changes
        second = snapshots.snapshot(BASE, len(data), None, w)
        assert device.copies[len(copied) :] == [(BASE + 2 * FRAME, FRAME)]
    snapshots.close()
    with replayfmt.open(tmp_path / "s.kreplay") as cap:
        assert cap.read_payload(first) == data
        assert cap.read_payload(second) == bytes(device.memory[BASE])


def test_consecutive_missing_frames_are_copied_in_one_run(tmp_path):
    data = noise(4 * FRAME, 3)
    device = device_with(data)
    snapshots = Snapshotter(device, slot_size=4 * FRAME, slots=2)
    with replayfmt.CaptureWriter(tmp_path / "s.kreplay", frame_size=FRAME) as w:
        snapshots.snapshot(BASE, len(data), None, w)
    snapshots.close()
    assert device.copies == [(BASE, 4 * FRAME)]


@pytest.mark.parametrize("size", [100, FRAME + 100, 3 * FRAME])
@pytest.mark.parametrize("can_hash", [True, False], ids=["kernel", "no-kernel"])
def test_frames_the_device_cannot_hash_are_hashed_on_the_host(tmp_path, size, can_hash):
    data = noise(size + 4, 4)[:size]
    device = device_with(data)
    device.can_hash = can_hash
    snapshots = Snapshotter(device, slot_size=FRAME, slots=2)
    with replayfmt.CaptureWriter(tmp_path / "s.kreplay", frame_size=FRAME) as w:
        pid = snapshots.snapshot(BASE, len(data), None, w)
        assert w.add_payload(data) == pid
    snapshots.close()
    frames = [(BASE + s, min(FRAME, size - s)) for s in range(0, size, FRAME)]
    assert device.hashed == ([f for f in frames if f[1] > 240] if can_hash else [])
    with replayfmt.open(tmp_path / "s.kreplay") as cap:
        assert cap.read_payload(pid) == data


def test_slots_are_reused_only_after_their_frames_are_written(tmp_path):
    """Many frames through two one-frame slots and four writer threads: a slot overwritten
    before its frame was written would put the wrong bytes in the file."""
    data = noise(24 * FRAME, 5)
    device = device_with(data)
    snapshots = Snapshotter(device, slot_size=FRAME, slots=2)
    with replayfmt.CaptureWriter(tmp_path / "s.kreplay", frame_size=FRAME, threads=4) as w:
        pid = snapshots.snapshot(BASE, len(data), None, w)
    snapshots.close()
    assert len(device.pinned_buffers) == 2
    with replayfmt.open(tmp_path / "s.kreplay") as cap:
        assert cap.read_payload(pid) == data


def test_inspect_sees_exactly_the_frames_that_crossed(tmp_path):
    data = noise(3 * FRAME, 6)
    device = device_with(data)
    snapshots = Snapshotter(device, slot_size=2 * FRAME, slots=2)
    seen = []
    with replayfmt.CaptureWriter(tmp_path / "s.kreplay", frame_size=FRAME) as w:
        w.add_payload(data[FRAME : 2 * FRAME])  # the file holds frame 1 already
        snapshots.snapshot(BASE, len(data), None, w, lambda offset, frame: seen.append((offset, bytes(frame))))
    snapshots.close()
    assert seen == [(0, data[:FRAME]), (2 * FRAME, data[2 * FRAME :])]


def test_a_failing_inspection_fails_the_snapshot_and_returns_every_slot(tmp_path):
    data = noise(5 * FRAME, 7)
    device = device_with(data)
    snapshots = Snapshotter(device, slot_size=FRAME, slots=2)

    def inspect(offset, frame):
        if offset == 2 * FRAME:
            raise RuntimeError("scan failed")

    with replayfmt.CaptureWriter(tmp_path / "s.kreplay", frame_size=FRAME, threads=2) as w:
        with pytest.raises(RuntimeError, match="scan failed"):
            snapshots.snapshot(BASE, len(data), None, w, inspect)
        pid = snapshots.snapshot(BASE, len(data), None, w)  # the frames not written are asked again
    snapshots.close()  # would wait forever for a slot that never came back
    with replayfmt.open(tmp_path / "s.kreplay") as cap:
        assert cap.read_payload(pid) == data


def test_a_slot_pool_of_one_is_refused():
    with pytest.raises(ValueError, match="at least 2 pinned slots"):
        Snapshotter(FakeDevice(), slots=1)
