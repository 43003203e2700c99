"""Crash safety: a writer killed at a random moment leaves every flushed record readable."""

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import replayfmt
from replayfmt.format import model as m

WRITER = textwrap.dedent(
    """
    import sys, numpy as np, replayfmt
    from replayfmt.format import model as m
    with replayfmt.CaptureWriter(sys.argv[1], batch_operations=int(sys.argv[2])) as w:
        exe = w.add_object(m.Executable(functions=(m.Function(name="k"),)))
        i = 0
        while True:
            w.launch(executable=exe, function=0, grid=(i, 1, 1), block=(1, 1, 1), parameters=i.to_bytes(8, "little"))
            if i % 97 == 0:
                w.checkpoint({exe: np.full(5000, i, np.int64)})
            i += 1
            if i % 50 == 0:
                w.flush()
                print(w.operation_count, flush=True)
    """
)


@pytest.mark.parametrize("seed", range(6))
def test_killed_writer_leaves_flushed_records_readable(tmp_path, seed):
    rng = random.Random(seed)
    path = tmp_path / "killed.kreplay"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(rng.choice([7, 64, 1000]))],
        stdout=subprocess.PIPE,
        text=True,
    )
    flushed = 0
    deadline = time.monotonic() + rng.uniform(0.3, 1.5)
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        flushed = int(line)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert flushed > 0, "the writer never flushed"
    with replayfmt.open(path) as cap:
        assert cap.recovered
        assert cap.operation_count >= flushed
        for op in cap:
            if op.kind == m.OperationKind.LAUNCH:
                assert op.grid[0] == int.from_bytes(op.parameters, "little")
            elif op.kind == m.OperationKind.CHECKPOINT:
                values = np.frombuffer(cap.read_payload(op.entries[0].payload), np.int64)
                assert (values == values[0]).all()


THREADED_WRITER = textwrap.dedent(
    """
    import os, signal, sys, threading, time, numpy as np, replayfmt
    from replayfmt.format import payloads
    path, threads, kill_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    compress = payloads.FrameCompressor.compress
    # slow compression (as on a loaded machine) keeps the workers busy and claims waiting long
    payloads.FrameCompressor.compress = lambda self, data: (time.sleep(0.002), compress(self, data))[1]
    w = replayfmt.CaptureWriter(path, frame_size=64 << 10, threads=2, flush_interval=0)
    lock = threading.Lock()
    shared = [np.random.default_rng(i).integers(0, 255, 1 << 20, dtype=np.uint8) for i in range(kill_at + 1)]

    def work(t):
        for i in range(kill_at + 1):
            # every thread stores the same content in round i (racing to claim its 16 frames),
            # and one payload of its own
            b = w.add_payload(np.full(70_000, t * 1000 + i, np.int64))
            a = w.add_payload(shared[i])
            w.flush()
            with lock:
                print(t, i, a, b, flush=True)
                if i == kill_at:  # killed the moment a flush returned
                    os.kill(os.getpid(), signal.SIGKILL)

    for t in range(threads):
        threading.Thread(target=work, args=(t,), daemon=True).start()
    threading.Event().wait()
    """
)


@pytest.mark.parametrize("seed", range(3))
def test_killed_threaded_writer_keeps_every_flushed_payload(tmp_path, seed):
    """Several threads store the same frames at once; killed right after a flush returns, every
    payload flushed so far reads back (it used to lose the frame another thread was writing)."""
    rng = random.Random(seed)
    path = tmp_path / "threads.kreplay"
    args = [str(path), str(rng.choice([3, 4, 6])), str(rng.randint(0, 3))]
    proc = subprocess.run([sys.executable, "-c", THREADED_WRITER, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    flushed = [tuple(map(int, line.split())) for line in proc.stdout.splitlines()]
    assert flushed, "the writer never flushed"
    with replayfmt.open(path) as cap:
        assert cap.recovered
        for t, i, a, b in flushed:
            shared = np.random.default_rng(i).integers(0, 255, 1 << 20, dtype=np.uint8)
            assert cap.read_payload(a) == shared.tobytes(), f"thread {t} round {i}: shared payload {a} lost"
            assert (np.frombuffer(cap.read_payload(b), np.int64) == t * 1000 + i).all()


def _disk_fills_after(monkeypatch, room: int) -> list[int]:
    """Make positioned writes fail with ENOSPC once ``room`` bytes are written (a torn write
    first writes what still fits). Returns a one-item list: the room left, to refill it."""
    import errno

    from replayfmt.container import output

    left = [room]
    real = os.pwritev

    def pwritev(fd, buffers, offset):
        want = sum(len(b) for b in buffers)
        if want <= left[0]:
            left[0] -= want
            return real(fd, buffers, offset)
        if left[0] > 0:
            part = bytes(b"".join(bytes(b) for b in buffers)[: left[0]])
            left[0] = 0
            return real(fd, [part], offset)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(output.os, "pwritev", pwritev)
    return left


def test_full_disk_at_start_leaves_no_file_and_the_retry_works(tmp_path, monkeypatch):
    path = tmp_path / "full.kreplay"
    left = _disk_fills_after(monkeypatch, 40)  # the header fits, the metadata chunk does not
    with pytest.raises(replayfmt.ReplayError) as info:
        replayfmt.CaptureWriter(path)
    message = str(info.value)
    assert "\n" not in message and type(info.value) is replayfmt.ReplayError
    assert message.startswith(f"{path}: cannot write ") and "No space left on device" in message
    # the one true thing: not also "everything flushed before is kept"
    assert message.endswith(f"No space left on device; nothing was recorded and {path} is removed")
    assert "kept" not in message
    assert not path.exists()
    left[0] = 1 << 30  # space freed: the retry is not refused as "already exists"
    with replayfmt.CaptureWriter(path) as w:
        w.add_payload(b"ok" * 1000)
    with replayfmt.open(path) as cap:
        assert cap.read_payload(1) == b"ok" * 1000


@pytest.mark.parametrize("threads", [0, 3])
def test_full_disk_mid_capture_keeps_what_was_flushed(tmp_path, monkeypatch, threads):
    path = tmp_path / "mid.kreplay"
    left = _disk_fills_after(monkeypatch, 1 << 30)
    w = replayfmt.CaptureWriter(path, frame_size=64 << 10, threads=threads, flush_interval=0)
    data = [np.random.default_rng(i).integers(0, 1 << 31, 50_000, dtype=np.int32) for i in range(15)]
    kept = [w.add_payload(d) for d in data[:5]]
    w.flush()
    left[0] = 1_000_000  # room for about half of what comes next; one chunk is torn
    with pytest.raises(replayfmt.ReplayError, match=r"cannot write \d+ bytes at offset \d+: No space left on device"):
        for d in data[5:]:
            w.add_payload(d)
        w.flush()
    with pytest.raises(replayfmt.ReplayError, match="No space left on device"):
        w.close()
    with replayfmt.open(path) as cap:
        assert cap.recovered and cap.payload_count >= len(kept)
        for d, pid in zip(data, kept):
            assert cap.read_payload(pid) == d.tobytes()


def test_a_torn_write_is_overwritten_by_the_next_chunk(tmp_path, monkeypatch):
    """A write that fails half-way leaves its bytes past the writer's end: the next chunk is
    written over them (not after them), so the file stays a clean chain of chunks."""
    path = tmp_path / "torn.kreplay"
    left = _disk_fills_after(monkeypatch, 1 << 30)
    w = replayfmt.CaptureWriter(path, frame_size=64 << 10, threads=0, flush_interval=0)
    w.add_payload(np.arange(20_000, dtype=np.int64))
    w.flush()
    left[0] = 1000
    with pytest.raises(replayfmt.ReplayError, match="No space left on device"):
        w.add_payload(np.random.default_rng(0).bytes(100_000))
        w.flush()
    left[0] = 1 << 30
    w.add_payload(np.arange(10, dtype=np.int64))  # its frame lands where the torn one began
    with pytest.raises(replayfmt.ReplayError, match="No space left on device"):
        w.close()  # the batch naming the lost frame fails: it is never written
    with replayfmt.open(path) as cap:
        assert cap.recovered and cap.payload_count == 1
        assert (np.frombuffer(cap.read_payload(1), np.int64) == np.arange(20_000)).all()
        assert len(cap.directory.frames) == 4  # three of the first payload, and the last one's


def test_durable_flush_fsyncs_the_file_and_once_its_directory(tmp_path, monkeypatch):
    from replayfmt.container import output

    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(output.os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    with replayfmt.CaptureWriter(tmp_path / "d.kreplay", flush_interval=0) as w:
        w.add_payload(b"x" * 100)
        w.flush()
        assert synced == []  # a plain flush promises survival of a process crash only
        w.flush(durable=True)
        assert len(synced) == 2  # the file and its directory
        w.flush(durable=True)
        assert len(synced) == 3
    with replayfmt.CaptureWriter(tmp_path / "e.kreplay", flush_interval=0, durable=True) as w:
        before = len(synced)
        w.add_payload(b"y" * 100)
        w.flush()
        assert len(synced) == before + 2


FSIZE_WRITER = textwrap.dedent(
    """
    import resource, signal, sys, numpy as np, replayfmt
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit, writes fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))
    w = replayfmt.CaptureWriter(sys.argv[1], frame_size=64 << 10, threads=2, flush_interval=0)
    try:
        for i in range(100):
            w.add_payload(np.random.default_rng(i).bytes(40_000))
            w.flush()
            print(i, flush=True)
    except replayfmt.ReplayError as exc:
        print("error:", exc, flush=True)
    try:
        w.close()
    except replayfmt.ReplayError:
        pass
    """
)


def test_a_real_file_size_limit_is_a_one_line_error_and_keeps_what_was_flushed(tmp_path):
    """RLIMIT_FSIZE makes the kernel refuse writes (EFBIG) as a full disk would (ENOSPC)."""
    path = tmp_path / "fsize.kreplay"
    result = subprocess.run([sys.executable, "-c", FSIZE_WRITER, str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    *flushed, error = result.stdout.splitlines()
    assert error.startswith(f"error: {path}: cannot write ") and error.endswith(
        "File too large; everything flushed before is kept (replayfmt.open recovers it)"
    )
    assert len(flushed) >= 5 and path.stat().st_size <= 300_000
    with replayfmt.open(path) as cap:
        assert cap.recovered
        for i in map(int, flushed):
            assert cap.read_payload(i + 1) == np.random.default_rng(i).bytes(40_000)
