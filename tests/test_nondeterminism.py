"""Nondeterminism told apart from a wrong answer, on synthetic replays (no GPU), and typed
sub-ranges compared each by its dtype."""

from __future__ import annotations

import numpy as np

from replayfmt.format import model as m
from replayfmt.replay.compare import Tolerance, compare, mismatch_mask, segments
from replayfmt.replay.nondeterminism import NondeterminismTracker, byte_ranges

RNG = np.random.default_rng(3)


def test_byte_ranges():
    mask = np.zeros(20, bool)
    mask[[0, 1, 2, 7, 19]] = True
    assert byte_ranges(mask) == [(0, 3), (7, 8), (19, 20)]
    assert byte_ranges(np.zeros(4, bool)) == []


def replays(expected: np.ndarray, count: int, *, varying: slice, wrong: list[int]) -> list[bytes]:
    """``count`` replays: bytes in ``varying`` differ from replay to replay (atomics), bytes at
    ``wrong`` are the same wrong value in every replay (a wrong answer)."""
    out = []
    for _ in range(count):
        got = expected.copy()
        got[varying] = RNG.integers(0, 256, got[varying].size, dtype=np.uint8)
        got[wrong] ^= 0xFF
        out.append(got.tobytes())
    return out


def test_bytes_that_differ_between_replays_are_nondeterministic_not_mismatches():
    expected = RNG.integers(0, 256, 4096, dtype=np.uint8)
    buffer = m.Buffer(id=3, size=4096, label="segment")
    tracker = NondeterminismTracker()
    for actual in replays(expected, 3, varying=slice(1024, 1536), wrong=[]):
        tracker.observe(12, buffer, 0, expected.tobytes(), actual)
    (verdict,) = tracker.verdicts()
    assert verdict.passed and verdict.replays == 3 and verdict.mismatching_bytes == 0
    assert verdict.varying == [(1024, 1536)]  # whole 4-byte words (the dtype is unknown)
    assert verdict.varying_bytes == 512
    assert "nondeterministic (differ between replays)" in verdict.line() and " ok over 3 replays" in verdict.line()


def test_a_wrong_answer_outside_the_varying_bytes_still_fails():
    expected = RNG.integers(0, 256, 4096, dtype=np.uint8)
    buffer = m.Buffer(id=3, size=4096)
    tracker = NondeterminismTracker()
    for actual in replays(expected, 2, varying=slice(0, 64), wrong=[100, 3000]):
        tracker.observe(12, buffer, 256, expected.tobytes(), actual)
    (verdict,) = tracker.verdicts()
    assert not verdict.passed and verdict.mismatching_bytes == 2 and verdict.first_mismatch == 100
    assert verdict.offset == 256 and verdict.line().endswith("2 mismatching bytes outside them, first at byte 100")


def test_identical_replays_report_nothing_nondeterministic():
    expected = bytes(range(256))
    tracker = NondeterminismTracker()
    for _ in range(2):
        tracker.observe(1, m.Buffer(id=2, size=256), 0, expected, expected)
    (verdict,) = tracker.verdicts()
    assert verdict.passed and verdict.varying_bytes == 0 and "nondeterministic" not in verdict.line()


def typed_buffer() -> m.Buffer:
    return m.Buffer(
        id=4, size=512, ranges=(m.TypedRange(0, 256, m.DType.FLOAT32), m.TypedRange(384, 128, m.DType.INT32))
    )


def test_segments_cover_typed_ranges_and_gaps():
    assert segments(typed_buffer(), 0, 512) == [
        (0, 256, m.DType.FLOAT32),
        (256, 384, m.DType.UNKNOWN),
        (384, 512, m.DType.INT32),
    ]
    assert segments(typed_buffer(), 128, 256) == [(0, 128, m.DType.FLOAT32), (128, 256, m.DType.UNKNOWN)]
    assert segments(m.Buffer(size=8, dtype=m.DType.FLOAT16), 0, 8) == [(0, 8, m.DType.FLOAT16)]


def test_typed_ranges_are_compared_each_by_its_dtype():
    floats = np.linspace(1, 2, 64, dtype=np.float32)
    ints = np.arange(32, dtype=np.int32)
    expected = floats.tobytes() + bytes(128) + ints.tobytes()
    noisy = (floats * np.float32(1 + 1e-6)).astype(np.float32)
    buffer = typed_buffer()
    close = noisy.tobytes() + bytes(128) + ints.tobytes()
    report = compare(expected, close, buffer=buffer, operation=5, tolerance=Tolerance(enabled=True))
    assert report.passed and report.dtype == "bytes of typed ranges" and "float32 rtol=1e-05" in report.mode
    assert not compare(expected, close, buffer=buffer, operation=5, tolerance=Tolerance()).passed  # exact bytes
    wrong_int = bytearray(close)
    wrong_int[384 + 8] ^= 1  # an int32 is compared exactly, whatever the tolerance
    wrong, _ = mismatch_mask(expected, bytes(wrong_int), buffer=buffer, tolerance=Tolerance(enabled=True))
    assert np.flatnonzero(wrong).tolist() == [392]
    report = compare(expected, bytes(wrong_int), buffer=buffer, operation=5, tolerance=Tolerance(enabled=True))
    assert (report.mismatches, report.first_mismatch) == (1, 392)


def test_an_element_varies_whole():
    """Replays agree on a float's high byte that still differs from the capture's run: the
    element varies (its low bytes differ between replays), so no byte of it is a mismatch."""
    expected = np.zeros(16, np.uint8)
    first, second = expected.copy(), expected.copy()
    first[[4, 5]], second[[4, 5]] = (1, 9), (2, 9)  # byte 5 agrees between replays, not with the capture
    for dtype, varying in ((m.DType.UNKNOWN, [(4, 8)]), (m.DType.FLOAT16, [(4, 6)]), (m.DType.FLOAT64, [(0, 8)])):
        tracker = NondeterminismTracker()
        for actual in (first, second):
            tracker.observe(1, m.Buffer(id=2, size=16, dtype=dtype), 0, expected.tobytes(), actual.tobytes())
        (verdict,) = tracker.verdicts()
        assert verdict.passed and verdict.varying == varying, dtype
