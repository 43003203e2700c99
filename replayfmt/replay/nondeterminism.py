"""Telling nondeterminism apart from a wrong answer.

A program with atomics (a backward pass accumulating with atomic adds, split-K reductions) does
not reproduce its own bytes run to run, so a checkpoint taken from one run fails byte comparison
against another, and tolerances fail too where the dtype is unknown. Replaying the same capture
more than once shows which bytes vary: a :class:`NondeterminismTracker` watches every compared
range over the replays and reports, per range, the bytes that differ between replays as
nondeterministic (count and ranges) and judges only the bytes outside them against the capture.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from replayfmt.format import model as m
from replayfmt.replay.compare import NUMPY_DTYPES, Tolerance, mismatch_mask, segments

_SHOWN_RANGES = 4


def byte_ranges(mask: np.ndarray) -> list[tuple[int, int]]:
    """The [start, end) runs of True in a boolean mask."""
    if not mask.any():
        return []
    padded = np.concatenate(([False], mask, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist()))


def whole_elements(mask: np.ndarray, buffer: m.Buffer, offset: int) -> np.ndarray:
    """A byte mask widened to whole elements: of each typed run's dtype, 4-byte words where the
    dtype is unknown (the common element size of GPU data)."""
    out = mask.copy()
    for start, end, dtype in segments(buffer, offset, len(mask)):
        code = NUMPY_DTYPES.get(dtype)
        size = 2 if dtype == m.DType.BFLOAT16 else (np.dtype(code).itemsize if code else 4)
        whole = (end - start) // size * size
        if size > 1 and whole:
            words = mask[start : start + whole].reshape(-1, size).any(axis=1)
            out[start : start + whole] = np.repeat(words, size)
    return out


@dataclass
class RangeVerdict:
    """One compared range over every replay: what varied between replays, what is wrong."""

    operation: int
    buffer: int
    label: str
    offset: int
    size: int
    mode: str
    replays: int
    varying: list[tuple[int, int]] = field(default_factory=list)  # byte ranges, relative to offset
    varying_bytes: int = 0
    mismatching_bytes: int = 0  # differing from the capture, outside the varying bytes
    first_mismatch: int | None = None  # byte offset in the range

    @property
    def passed(self) -> bool:
        return self.mismatching_bytes == 0

    def line(self) -> str:
        name = f"buffer {self.buffer}" + (f" ({self.label})" if self.label else "")
        verdict = "ok" if self.passed else "MISMATCH"
        text = f"op {self.operation:>6} {name}: {verdict} over {self.replays} replays ({self.mode})"
        if self.varying_bytes:
            shown = ", ".join(f"[{a}, {b})" for a, b in self.varying[:_SHOWN_RANGES])
            more = f" and {len(self.varying) - _SHOWN_RANGES} more" if len(self.varying) > _SHOWN_RANGES else ""
            text += (
                f", {self.varying_bytes} of {self.size} bytes nondeterministic (differ between replays) "
                f"in {len(self.varying)} range(s): {shown}{more}"
            )
        text += f", {self.mismatching_bytes} mismatching bytes outside them"
        if self.first_mismatch is not None:
            text += f", first at byte {self.first_mismatch}"
        return text


@dataclass
class _Observed:
    buffer: m.Buffer
    offset: int
    first: np.ndarray  # the first replay's bytes
    varying: np.ndarray  # bytes that differed between replays so far
    wrong: np.ndarray  # bytes judged wrong against the capture in some replay
    mode: str
    replays: int = 1


class NondeterminismTracker:
    """Collects the compared ranges of several replays of one capture (attach to a Replayer as
    its ``observer``), then judges them with :meth:`verdicts`."""

    def __init__(self, tolerance: Tolerance = Tolerance()) -> None:
        self.tolerance = tolerance
        self._ranges: dict[tuple[int, int, int], _Observed] = {}

    def observe(self, operation: int, buffer: m.Buffer, offset: int, expected: bytes, actual: bytes) -> None:
        """One replay's bytes of one compared range (a checkpoint entry or an expected download)."""
        got = np.frombuffer(actual, np.uint8)
        wrong, mode = mismatch_mask(expected, actual, buffer=buffer, offset=offset, tolerance=self.tolerance)
        key = (operation, buffer.id, offset)
        seen = self._ranges.get(key)
        if seen is None:
            self._ranges[key] = _Observed(buffer, offset, got.copy(), np.zeros(len(got), bool), wrong, mode)
            return
        seen.varying |= seen.first != got
        seen.wrong |= wrong
        seen.replays += 1

    @property
    def replays(self) -> int:
        """How many replays every range was seen in (the fewest)."""
        return min((o.replays for o in self._ranges.values()), default=0)

    def verdicts(self) -> list[RangeVerdict]:
        """Each range judged: an element with a varying byte varies whole (its other bytes can
        agree between replays and still differ from the capture's run)."""
        out = []
        for (operation, buffer_id, offset), o in self._ranges.items():
            varying_mask = whole_elements(o.varying, o.buffer, offset)
            bad = np.flatnonzero(o.wrong & ~varying_mask)
            varying = byte_ranges(varying_mask)
            out.append(
                RangeVerdict(
                    operation,
                    buffer_id,
                    o.buffer.label,
                    offset,
                    len(o.first),
                    o.mode,
                    o.replays,
                    varying,
                    int(varying_mask.sum()),
                    len(bad),
                    int(bad[0]) if len(bad) else None,
                )
            )
        return out
