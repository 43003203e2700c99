"""The snapshot pipeline (replayfmt.capture.snapshots) on a fake device: device hashing, only the
frames the file lacks copied, pinned slots reused only once written, host fallbacks."""

import numpy as np
import pytest
from fake_device import FakeDevice

import replayfmt
import replayfmt.capture.snapshots as snapshots_module
from replayfmt.capture.snapshots import Snapshotter
from replayfmt.capture.stored_pointers import FrameWords
from replayfmt.format.payloads import MIN_FRAME_SIZE, frame_hash

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


# -- large snapshots copied aside on the device, written behind the program --------------------


def staging_device(data: bytes, *, can_stage: bool = True) -> FakeDevice:
    device = FakeDevice(can_scan=True, can_stage=can_stage)
    device.memory[BASE] = bytearray(data)
    return device


def scanned(data: bytes) -> FrameWords:
    """What a host scan of every frame finds (the reference for the device's scan)."""
    words = FrameWords()
    words.begin(BASE, BASE + (1 << 30))
    for start in range(0, len(data), FRAME):
        frame = data[start : start + FRAME]
        words.learn(start, frame_hash(frame), frame)
    return words


def with_pointers(size: int, seed: int) -> bytes:
    array = np.frombuffer(bytearray(noise(size, seed)), dtype=np.uint64)
    array[:: FRAME // 8 + 3] = BASE + 64  # a stored pointer in every frame
    return array.tobytes()


@pytest.mark.parametrize("threads", [0, 3])
def test_a_large_snapshot_is_copied_aside_and_the_program_may_write_at_once(tmp_path, monkeypatch, threads):
    monkeypatch.setattr(snapshots_module, "STAGE_AT_LEAST", 2 * FRAME)
    data = with_pointers(6 * FRAME, 3)
    device = staging_device(data)
    snapshots = Snapshotter(device, slot_size=2 * FRAME, slots=2, background=device.sibling())
    words = FrameWords()
    words.begin(BASE, BASE + (1 << 30))
    path = tmp_path / "s.kreplay"
    with replayfmt.CaptureWriter(path, frame_size=FRAME, threads=threads) as w:
        pid = snapshots.snapshot(BASE, len(data), 0x5, w, frames=words)
        device.memory[BASE][:] = bytes(len(data))  # the program's next kernel overwrites it at once
    snapshots.close()
    assert device.copies == []  # nothing crossed from the program's memory: it was copied aside
    assert [(source, n) for _, source, n in device.device_copies] == [(BASE, len(data))]  # in one copy
    assert [n for _, n in device.staged] == [len(data)] and device.stages_freed == [device.staged[0][0]]
    assert snapshots.stats.copied_bytes == len(data)
    reference = scanned(data).words()
    assert np.array_equal(words.words().sites, reference.sites) and len(reference) == 6
    assert np.array_equal(words.words().values, reference.values)
    with replayfmt.open(path) as cap:
        assert cap.read_payload(pid) == data


def test_frames_set_aside_are_copied_in_one_run_per_stretch_the_file_lacks(tmp_path, monkeypatch):
    """The file holds frames 2 and 3 already: the other four are set aside in two copies (one per
    stretch that follows on), and the payload reads back whole."""
    monkeypatch.setattr(snapshots_module, "STAGE_AT_LEAST", 2 * FRAME)
    data = with_pointers(6 * FRAME, 5)
    device = staging_device(data)
    snapshots = Snapshotter(device, slot_size=2 * FRAME, slots=2, background=device.sibling())
    words = FrameWords()
    words.begin(BASE, BASE + (1 << 30))
    path = tmp_path / "s.kreplay"
    with replayfmt.CaptureWriter(path, frame_size=FRAME, threads=2) as w:
        w.add_payload(data[2 * FRAME : 4 * FRAME])
        pid = snapshots.snapshot(BASE, len(data), None, w, frames=words)
    snapshots.close()
    assert [(source - BASE, n) for _, source, n in device.device_copies] == [(0, 2 * FRAME), (4 * FRAME, 2 * FRAME)]
    assert snapshots.stats.copied_bytes == 4 * FRAME and snapshots.stats.set_aside == 1
    with replayfmt.open(path) as cap:
        assert cap.read_payload(pid) == data


def test_without_room_on_the_device_a_snapshot_is_written_through_the_slots(tmp_path, monkeypatch):
    monkeypatch.setattr(snapshots_module, "STAGE_AT_LEAST", 2 * FRAME)
    data = with_pointers(5 * FRAME, 4)
    device = staging_device(data, can_stage=False)
    snapshots = Snapshotter(device, slot_size=2 * FRAME, slots=2, background=device.sibling())
    words = FrameWords()
    words.begin(BASE, BASE + (1 << 30))
    with replayfmt.CaptureWriter(tmp_path / "s.kreplay", frame_size=FRAME, threads=2) as w:
        pid = snapshots.snapshot(BASE, len(data), None, w, frames=words)
    snapshots.close()
    assert sum(n for _, n in device.copies) == len(data) and not device.staged
    assert np.array_equal(words.words().sites, scanned(data).words().sites)  # each frame scanned once
    with replayfmt.open(tmp_path / "s.kreplay") as cap:
        assert cap.read_payload(pid) == data


def test_frames_with_too_many_candidates_for_the_device_are_scanned_as_they_cross(tmp_path, monkeypatch):
    monkeypatch.setattr(snapshots_module, "STAGE_AT_LEAST", 2 * FRAME)
    array = np.full(4 * FRAME // 8, BASE + 8, dtype=np.uint64)  # a pointer table: every word a candidate
    data = array.tobytes()
    device = staging_device(data)
    snapshots = Snapshotter(device, slot_size=2 * FRAME, slots=2, background=device.sibling())
    words = FrameWords()
    words.begin(BASE, BASE + (1 << 30))
    with replayfmt.CaptureWriter(tmp_path / "s.kreplay", frame_size=FRAME, threads=2) as w:
        snapshots.snapshot(BASE, len(data), None, w, frames=words)
    snapshots.close()
    assert not device.staged and sum(n for _, n in device.copies) == FRAME  # equal frames: one crossed
    # the crossed frame scanned on the host; its equal ones (held by the file, too dense to remember)
    # are left for the caller to read
    assert len(words.words()) == FRAME // 8 and [at for at, _ in words.unseen] == [FRAME, 2 * FRAME, 3 * FRAME]


def test_a_failure_writing_a_snapshot_set_aside_fails_the_writer_not_the_program(tmp_path, monkeypatch):
    monkeypatch.setattr(snapshots_module, "STAGE_AT_LEAST", 2 * FRAME)
    data = noise(4 * FRAME, 5)
    device = staging_device(data)
    background = device.sibling()

    def broken(host: int, address: int, size: int) -> None:
        raise RuntimeError("the copy to the host failed")

    background.copy = broken
    snapshots = Snapshotter(device, slot_size=2 * FRAME, slots=2, background=background)
    words = FrameWords()
    words.begin(BASE, BASE + (1 << 30))
    writer = replayfmt.CaptureWriter(tmp_path / "s.kreplay", frame_size=FRAME, threads=2)
    snapshots.snapshot(BASE, len(data), None, writer, frames=words)  # returns: the program goes on
    with pytest.raises(replayfmt.ReplayError, match="could not be delivered"):
        writer.close()
    snapshots.close()
    assert device.stages_freed == [device.staged[0][0]]


def test_a_writer_thread_that_cannot_reach_the_device_fails_the_writer_and_frees_the_stage(tmp_path, monkeypatch):
    monkeypatch.setattr(snapshots_module, "STAGE_AT_LEAST", 2 * FRAME)
    data = noise(4 * FRAME, 6)
    device = staging_device(data)

    def no_context() -> None:
        raise RuntimeError("cuCtxSetCurrent failed")

    snapshots = Snapshotter(device, slot_size=2 * FRAME, slots=2, background=device.sibling(), begin=no_context)
    words = FrameWords()
    words.begin(BASE, BASE + (1 << 30))
    writer = replayfmt.CaptureWriter(tmp_path / "s.kreplay", frame_size=FRAME, threads=2)
    snapshots.snapshot(BASE, len(data), None, writer, frames=words)
    with pytest.raises(replayfmt.ReplayError, match="could not be delivered"):
        writer.close()
    snapshots.close()  # returns: the stage was freed and handed back
    assert device.stages_freed == [device.staged[0][0]]
