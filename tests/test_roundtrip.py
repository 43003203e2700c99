"""Writer -> file -> reader round trips on real data."""

import os
import threading

import numpy as np
import pytest
from samples import SAXPY, compiled_cubin, write_sample

import replayfmt
from replayfmt.format import model as m


def test_sample_round_trips_every_object_and_operation(tmp_path):
    path = tmp_path / "s.kreplay"
    ids = write_sample(path, threads=2)
    with replayfmt.open(path) as cap:
        assert not cap.recovered
        assert cap.metadata.tool == "replayfmt-tests"
        assert cap.metadata.command_line == ("python", "sample.py")
        assert cap.metadata.properties == (("purpose", "sample"),)
        ops = list(cap)
        assert [op.index for op in ops] == list(range(cap.operation_count))
        kinds = [op.kind for op in ops]
        for kind in m.OperationKind:
            if kind != m.OperationKind.NONE:
                assert kind in kinds, kind
        device = cap.object(ids["device"])
        assert device == m.Device(
            id=ids["device"],
            ordinal=0,
            name="NVIDIA H100",
            uuid=bytes(range(16)),
            compute_capability=(9, 0),
            total_memory=80 << 30,
            driver_version=13000,
            multiprocessor_count=132,
        )
        x = cap.object(ids["x"])
        assert (x.dtype, x.shape, x.strides, x.label, x.address) == (
            m.DType.FLOAT32,
            (1024,),
            (1,),
            "x",
            0x7F0000000000,
        )
        exe = cap.object(ids["exe"])
        assert exe.functions == (SAXPY,)
        ref = cap.object(ids["file"])
        assert ref.digest == bytes(range(16, 32)) and ref.validation == m.FileValidation.DIGEST
        launch = next(op for op in ops if op.kind == m.OperationKind.LAUNCH)
        assert launch.grid == (4, 1, 1) and launch.block == (256, 1, 1)
        assert launch.relocations == (m.Relocation(0, ids["x"], 8, 0), m.Relocation(0, ids["y"], 16, 0))
        assert np.frombuffer(launch.parameters[:4], np.float32)[0] == 2.0
        checkpoint = next(op for op in ops if op.kind == m.OperationKind.CHECKPOINT)
        (entry,) = checkpoint.entries
        expected = np.frombuffer(cap.read_payload(entry.payload), np.float32)
        assert expected.shape == (1024,) and np.isfinite(expected).all()
        assert [op.name for op in ops if op.kind == m.OperationKind.SCOPE_BEGIN] == ["step"]
        unsupported = next(op for op in ops if op.kind == m.OperationKind.UNSUPPORTED)
        assert unsupported.call == "cuLaunchHostFunc"
        host = next(op for op in ops if op.kind == m.OperationKind.HOST_FUNCTION)
        assert host == m.HostFunction(host.index, ids["stream"]) and host.kind.label == "host_function"


def test_random_access_matches_iteration(tmp_path):
    path = tmp_path / "many.kreplay"
    with replayfmt.CaptureWriter(path, batch_operations=100, threads=0) as w:
        exe = w.add_object(m.Executable(functions=(m.Function(name="k"),)))
        for i in range(1000):
            w.launch(executable=exe, function=0, grid=(i, 1, 1), block=(32, 1, 1), parameters=i.to_bytes(4, "little"))
    with replayfmt.open(path) as cap:
        assert cap.batch_count > 5
        assert cap.operation_count == 1001
        for i in (1, 100, 101, 555, 1000):
            op = cap.operation(i)
            assert op.index == i and op.grid[0] == i - 1
            assert int.from_bytes(op.parameters, "little") == i - 1
        assert [op.index for op in cap.iter_operations(95, 205)] == list(range(95, 205))
        with pytest.raises(IndexError):
            cap.operation(1001)


def test_identical_payloads_are_stored_once(tmp_path):
    path = tmp_path / "dedup.kreplay"
    data = np.random.default_rng(1).standard_normal(300_000).astype(np.float32)
    with replayfmt.CaptureWriter(path, frame_size=256 << 10, threads=2) as w:
        ids = {w.add_payload(data) for _ in range(5)}
        other = w.add_payload(data[:-1])  # shares all frames but the last
    assert len(ids) == 1 and other not in ids
    with replayfmt.open(path) as cap:
        stats = cap.payload_stats()
        assert stats.payloads == 2
        assert stats.dedup_saved_bytes >= data.nbytes - (256 << 10) * 2
        assert cap.read_payload(other) == data[:-1].tobytes()


@pytest.mark.parametrize("threads", [0, 4])
def test_multi_frame_payload_ranges(tmp_path, threads):
    path = tmp_path / "frames.kreplay"
    rng = np.random.default_rng(2)
    data = np.concatenate([rng.integers(0, 255, 700_000, dtype=np.uint8), np.zeros(900_000, np.uint8)])
    with replayfmt.CaptureWriter(path, frame_size=64 << 10, threads=threads) as w:
        pid = w.add_payload(data)
        empty = w.add_payload(b"")
    with replayfmt.open(path) as cap:
        info = cap.payload(pid)
        assert info.size == data.nbytes and len(info.frames) == -(-data.nbytes // (64 << 10))
        assert cap.read_payload(pid) == data.tobytes()
        for start, size in ((0, 1), (65535, 2), (123_456, 500_000), (data.nbytes - 10, 10)):
            assert cap.read_payload(pid, start, size) == data[start : start + size].tobytes()
        assert cap.read_payload(empty) == b""
        stats = cap.payload_stats()
        assert stats.stored_bytes < stats.frame_bytes  # zeros compress; noise is stored raw
        with pytest.raises(replayfmt.ReplayUsageError):
            cap.read_payload(pid, data.nbytes - 1, 2)


def _mixed_frames(tmp_path):
    """A payload of 64 KiB frames: noise (raw, stored back to back), a repeated frame (stored
    once, so out of order) and zeros (zstd), with a short last frame."""
    rng = np.random.default_rng(5)
    frame = 64 << 10
    noise = rng.integers(0, 256, 5 * frame, dtype=np.uint8)
    data = np.concatenate([noise, noise[:frame], np.zeros(2 * frame, np.uint8), noise[frame : 2 * frame], noise[:999]])
    path = tmp_path / "mixed.kreplay"
    with replayfmt.CaptureWriter(path, frame_size=frame, threads=0) as w:
        pid = w.add_payload(data)
    return path, pid, data, frame


@pytest.mark.parametrize("check", [True, False])
def test_frames_read_in_runs_match_the_payload(tmp_path, monkeypatch, check):
    path, pid, data, frame = _mixed_frames(tmp_path)
    calls = []
    preadv = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, offset: calls.append(len(bufs)) or preadv(fd, bufs, offset))
    with replayfmt.open(path) as cap:
        cap.read_frames_into(pid, 0, 5, bytearray(5 * frame), check=check)
        assert calls == [9]  # five raw frames stored back to back: one call (their four headers in between)
        frames = len(cap.payload(pid).frames)
        for first, count in ((0, frames), (0, 5), (3, 4), (frames - 2, 2), (4, 1)):
            start, stop = first * frame, min(data.nbytes, (first + count) * frame)
            out = bytearray(stop - start)
            cap.read_frames_into(pid, first, count, out, check=check)
            assert out == data[start:stop].tobytes()
        with pytest.raises(replayfmt.ReplayUsageError, match="not the frames' total"):
            cap.read_frames_into(pid, 0, 2, bytearray(frame), check=check)
        with pytest.raises(replayfmt.ReplayUsageError, match="do not exist"):
            cap.read_frames_into(pid, frames - 1, 2, bytearray(2 * frame), check=check)


def test_a_damaged_frame_in_a_run_is_named(tmp_path):
    path, pid, data, frame = _mixed_frames(tmp_path)
    with replayfmt.open(path) as cap:
        offset = cap.frame_location(cap.payload(pid).frames[3])[0]
    raw = bytearray(path.read_bytes())
    raw[offset + 64 + 5] ^= 0x40
    path.write_bytes(bytes(raw))
    with replayfmt.open(path) as cap:
        with pytest.raises(replayfmt.ReplayFormatError, match=f"payload {pid} frame 3.*checksum mismatch"):
            cap.read_frames_into(pid, 0, 5, bytearray(5 * frame))
        out = bytearray(5 * frame)
        cap.read_frames_into(pid, 0, 5, out, check=False)  # unchecked: the damage goes unseen
        assert out != data[: 5 * frame].tobytes()


def test_noise_is_stored_raw_and_structured_data_compressed(tmp_path):
    path = tmp_path / "codec.kreplay"
    noise = np.random.default_rng(3).integers(0, 2**32, 100_000, dtype=np.uint32)
    with replayfmt.CaptureWriter(path, threads=0) as w:
        noisy, zeros = w.add_payload(noise), w.add_payload(np.zeros(100_000, np.float32))
    with replayfmt.open(path) as cap:
        assert cap.frame_location(cap.payload(noisy).frames[0])[3] == 0  # raw
        assert cap.frame_location(cap.payload(zeros).frames[0])[3] == 1  # zstd


def test_concurrent_writers_number_every_operation_once(tmp_path):
    path = tmp_path / "threads.kreplay"
    with replayfmt.CaptureWriter(path, batch_operations=64) as w:
        exe = w.add_object(m.Executable(functions=(m.Function(name="k"),)))
        indices: list[int] = []
        lock = threading.Lock()

        def work(t: int) -> None:
            for i in range(500):
                index = w.launch(executable=exe, function=0, grid=(t, i, 1), block=(1, 1, 1))
                if i % 50 == 0:
                    w.add_payload(np.full(1000, t * 1000 + i, np.int64))
                with lock:
                    indices.append(index)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(indices) == list(range(1, 2001))
    with replayfmt.open(path) as cap:
        launches = [op for op in cap if op.kind == m.OperationKind.LAUNCH]
        assert sorted((op.grid[0], op.grid[1]) for op in launches) == [(t, i) for t in range(4) for i in range(500)]
        assert cap.payload_count == 40
        for pid in range(1, 41):
            values = np.frombuffer(cap.read_payload(pid), np.int64)
            assert (values == values[0]).all()


def test_writer_refuses_to_overwrite(tmp_path, sample):
    before = sample.read_bytes()
    with pytest.raises(replayfmt.ReplayUsageError, match="already exists"):
        replayfmt.CaptureWriter(sample)
    assert sample.read_bytes() == before
    with replayfmt.CaptureWriter(sample, overwrite=True):
        pass
    with replayfmt.open(sample) as cap:
        assert cap.operation_count == 0


def test_closed_writer_refuses_more_records(tmp_path):
    w = replayfmt.CaptureWriter(tmp_path / "c.kreplay")
    w.close()
    w.close()  # idempotent
    with pytest.raises(replayfmt.ReplayUsageError, match="closed"):
        w.scope_begin("late")


def test_real_cubin_payload_round_trips(tmp_path):
    cubin = compiled_cubin()  # the checked-in fixture
    path = tmp_path / "cubin.kreplay"
    ids = write_sample(path, cubin=cubin)
    with replayfmt.open(path) as cap:
        exe = cap.object(ids["exe"])
        image = cap.read_payload(exe.payload)
        assert image == cubin and image[:4] == b"\x7fELF"
        assert b"saxpy" in image
