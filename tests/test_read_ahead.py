"""Reading the next record batch ahead (replayfmt.container.read_ahead) while one is decoded: a
scan in order gives what reading batch by batch gives, and what a batch's read raises is raised
where that batch is asked for, naming it, never earlier."""

from __future__ import annotations

import threading

import pytest

import replayfmt
from replayfmt.container.read_ahead import ReadAhead
from replayfmt.format import model as m
from replayfmt.format.layout import CHUNK_HEADER_SIZE

FN = m.Function(name="k", parameters=(m.Parameter(offset=0, size=4),), parameters_known=True)


def _capture(path) -> None:
    """About 40 batches of launches with parameters that differ (nothing folds away)."""
    with replayfmt.CaptureWriter(path, threads=0, batch_operations=50) as w:
        dev = w.add_object(m.Device(name="d"))
        exe = w.add_object(m.Executable(payload=w.add_payload(b"\x7fELF"), functions=(FN,)))
        stream = w.add_object(m.Stream(device=dev))
        for i in range(2000):
            w.launch(
                executable=exe, function=0, stream=stream, grid=(1 + i % 7, 1, 1), block=(32, 1, 1),
                parameters=i.to_bytes(4, "little"),
            )  # fmt: skip


def _batch(capture, bi: int) -> list[m.Operation]:
    """Batch ``bi``'s operations."""
    first = capture.directory.first_operation[bi]
    return list(capture.iter_operations(first, first + capture.directory.operation_counts[bi]))


def test_a_scan_in_order_reads_what_a_scan_backwards_reads(tmp_path, monkeypatch):
    path = tmp_path / "c.kreplay"
    _capture(path)
    taken: list[int] = []  # offsets whose body the read-ahead handed over
    take = ReadAhead.take

    def counted(self: ReadAhead, offset: int) -> bytes | None:
        body = take(self, offset)
        if body is not None:
            taken.append(offset)
        return body

    monkeypatch.setattr(ReadAhead, "take", counted)
    with replayfmt.open(path) as forward, replayfmt.open(path) as backward:
        assert forward.batch_count > 30
        ahead = list(forward.iter_operations())  # in order: each next batch read ahead
        behind = [_batch(backward, bi) for bi in reversed(range(backward.batch_count))]  # never ahead
        assert ahead == [op for ops in reversed(behind) for op in ops]
        assert sum(isinstance(op, m.Launch) for op in ahead) == 2000
        assert len(taken) == forward.batch_count - 1  # every batch after the first was read ahead


def test_a_damaged_batch_is_reported_where_it_is_asked_for(tmp_path):
    """The body of batch 5 is damaged: batches 0 to 4 read in order (batch 5's read ahead fails
    meanwhile, unseen), and batch 5 raises the checksum error at its own offset."""
    path = tmp_path / "c.kreplay"
    _capture(path)
    with replayfmt.open(path) as capture:
        offset = capture.directory.entry(5).offset
    data = bytearray(path.read_bytes())
    data[offset + CHUNK_HEADER_SIZE + 3] ^= 0xFF
    path.write_bytes(bytes(data))
    with replayfmt.open(path) as capture:
        for bi in range(5):
            assert _batch(capture, bi)
        with pytest.raises(replayfmt.ReplayFormatError, match=rf"offset {offset}: .*checksum mismatch"):
            _batch(capture, 5)
        assert _batch(capture, 6)  # the batches after it still read


def test_read_ahead_hands_over_its_body_or_error_once():
    started = threading.Event()

    def read(offset: int) -> bytes:
        started.set()
        if offset == 13:
            raise replayfmt.ReplayFormatError("damaged", offset=13)
        return bytes([offset])

    ahead = ReadAhead(read)
    assert ahead.take(8) is None  # nothing begun
    ahead.start(8)
    assert ahead.take(16) is None  # begun elsewhere: the caller reads it itself
    assert ahead.take(8) == b"\x08"
    assert ahead.take(8) is None  # taken once
    ahead.start(13)
    with pytest.raises(replayfmt.ReplayFormatError, match="damaged"):
        ahead.take(13)
    ahead.start(24)
    started.wait(5)
    ahead.close()  # waits for the read in flight and drops it
    assert ahead.take(24) is None


def test_nothing_is_read_ahead_once_closed():
    ahead = ReadAhead(lambda offset: bytes(8))
    ahead.close()
    ahead.start(8)  # (another thread decoding as the reader closes)
    assert ahead.take(8) is None
    assert not [t for t in threading.enumerate() if t.name.startswith("replayfmt read-ahead")]


def test_an_unclosed_capture_is_freed_with_its_last_reference(tmp_path):
    """The read-ahead holds no reference back to its capture: dropping an unclosed, scanned
    capture frees it (its file and batches) without waiting for the cyclic collector."""
    import gc
    import weakref

    path = tmp_path / "c.kreplay"
    _capture(path)
    capture = replayfmt.open(path)
    list(capture.iter_operations())
    gone = weakref.ref(capture)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del capture
        assert gone() is None
    finally:
        if enabled:
            gc.enable()
