"""Verification as evidence: a checkpointed range whose starting state already holds the expected
bytes proves nothing by matching them, so it is replayed *poisoned* (docs/VERIFY.md).

Here, with no GPU: the pieces of a compared range (typed where the capture says what they hold),
the poison written over a piece (every byte the complement of the expected byte, so that no
poisoned byte can equal the answer and a byte equal to the answer was written by the region), and
what a poisoned replay's bytes say about a piece (:func:`classify`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from replayfmt.format import model as m
from replayfmt.replay.compare import segments
from replayfmt.replay.judge import judged_dtype, part_size


@dataclass(frozen=True)
class Piece:
    """Bytes [offset, offset + size) of a buffer, compared at one operation, of one dtype (or
    untyped); ``start`` is where it begins in the compared range's bytes."""

    operation: int
    buffer: int
    label: str
    offset: int
    size: int
    start: int
    dtype: m.DType
    shape: tuple[int, ...] = ()
    name: str = ""
    # "checkpoint" (the framework, at capture), "buffer", "kernel parameter" (a launch's pointer), "" (untyped)
    typed_by: str = ""

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.operation, self.buffer, self.offset)

    @property
    def typed(self) -> bool:
        return bool(self.typed_by)


def pieces(
    operation: int,
    buffer: m.Buffer,
    offset: int,
    size: int,
    types: tuple[m.TypedTensor, ...],
    source: str = "checkpoint",
) -> list[Piece]:
    """The compared range [offset, offset + size) of ``buffer`` cut into typed and untyped pieces:
    by the checkpoint's typed tensors when it has them, else by the buffer's dtype or typed ranges.
    A typed run's tail that is no whole element is left untyped."""
    runs: list[tuple[int, int, m.DType, tuple[int, ...], str, str]] = []  # start, end, dtype, shape, name, by
    if types:
        pos = 0
        for t in sorted(types, key=lambda t: t.offset):
            a, b = max(t.offset - offset, pos), min(t.offset + t.size - offset, size)
            if b <= a:
                continue
            if a > pos:
                runs.append((pos, a, m.DType.UNKNOWN, (), "", ""))
            exact = a == t.offset - offset and b == t.offset + t.size - offset
            by = "kernel parameter" if t.name == "(a kernel parameter's type)" else source
            runs.append((a, b, t.dtype, t.shape if exact else (), t.name, by))
            pos = b
        if pos < size:
            runs.append((pos, size, m.DType.UNKNOWN, (), "", ""))
    else:
        whole = not buffer.ranges and offset == buffer.element_offset and buffer.shape
        for a, b, dtype in segments(buffer, offset, size):
            runs.append((a, b, dtype, buffer.shape if whole else (), "", "buffer"))
    out: list[Piece] = []
    for a, b, dtype, shape, name, by in runs:
        if not judged_dtype(dtype):
            by, shape = "", ()
        lane = part_size(dtype) if by else 1
        whole = (b - a) // lane * lane
        if whole:
            out.append(Piece(operation, buffer.id, buffer.label, offset + a, whole, a, dtype, shape, name, by))
        if whole < b - a:
            out.append(
                Piece(operation, buffer.id, buffer.label, offset + a + whole, b - a - whole, a + whole, m.DType.UNKNOWN)
            )
    return _merge_untyped(out)


def _merge_untyped(out: list[Piece]) -> list[Piece]:
    """Adjacent untyped pieces as one."""
    merged: list[Piece] = []
    for p in out:
        last = merged[-1] if merged else None
        if last is not None and not last.typed and not p.typed and last.offset + last.size == p.offset:
            merged[-1] = Piece(
                last.operation, last.buffer, last.label, last.offset, last.size + p.size, last.start, m.DType.UNKNOWN
            )
        else:
            merged.append(p)
    return merged


@dataclass(frozen=True)
class Poison:
    """How a piece starts in a poisoned replay. Floats (``gentle=False``): every byte the
    complement of the expected byte (another number or a NaN, which spreads through whatever reads
    it). Integers and untyped bytes (``gentle=True``): the lowest bit of each element flipped, so
    that an index stays within one of its value (never a fault) and still is not the answer.
    Either way no element of the poison is the expected one."""

    lane: int  # bytes per element (4 for untyped bytes: the common element size of GPU data)
    gentle: bool

    def of(self, expected: bytes) -> bytes:
        data = np.frombuffer(expected, np.uint8)
        if not self.gentle:
            return np.invert(data).tobytes()
        flipped = data.copy()
        flipped[:: self.lane] ^= 1  # little-endian: the first byte of an element holds its lowest bit
        return flipped.tobytes()


def poison(expected: bytes, how: Poison = Poison(1, False)) -> bytes:
    """The bytes a piece starts with in a poisoned replay (see :class:`Poison`)."""
    return how.of(expected)


class Evidence(enum.Enum):
    """What a compared piece proves."""

    COMPARED = "compared"  # its starting state differs from the expected bytes: matching them is evidence
    PROVEN = "proven"  # started poisoned, and the region wrote the expected values over the poison
    UNCHANGED = "unchanged by the region"  # started poisoned and stayed so: the region never writes it
    UNPROVEN = "could not be proven"  # the region reads it before writing it (poison in, poison out)
    LEFT = "left as it started"  # the captured kernels write it; this replay did not (a failure)
    TAINTED = "tainted"  # (internal) written from poisoned inputs: poisoned again alone


@dataclass(frozen=True)
class Classified:
    """A poisoned replay's bytes of a piece: which bytes the region wrote, and whether it wrote
    the expected values."""

    evidence: Evidence
    written: np.ndarray  # bool per byte: the byte is no longer the poison
    written_bytes: int


def classify(
    expected: bytes, actual: bytes, *, how: Poison = Poison(1, False), judge_ok: bool | None = None
) -> Classified:
    """A piece as a poisoned replay left it, element by element (``how.lane`` bytes): an element
    still all poison was left, any other was written. ``judge_ok``: for a piece whose replays
    vary, whether its written values (the rest taken as expected) are within run-to-run
    variation; None: they must be the expected bytes exactly."""
    want = np.frombuffer(expected, np.uint8)
    got = np.frombuffer(actual, np.uint8)
    left = got == np.frombuffer(how.of(expected), np.uint8)
    whole = len(left) // how.lane * how.lane
    if how.lane > 1 and whole:
        left[:whole] = np.repeat(left[:whole].reshape(-1, how.lane).all(axis=1), how.lane)
    written = ~left
    count = int(written.sum())
    if count == 0:
        return Classified(Evidence.UNCHANGED, written, 0)
    correct = bool(np.array_equal(got[written], want[written])) if judge_ok is None else judge_ok
    return Classified(Evidence.PROVEN if correct else Evidence.TAINTED, written, count)


def patched(expected: bytes, actual: bytes, written: np.ndarray) -> bytes:
    """The replay's bytes where it wrote, the expected bytes where the poison was left (to judge
    the written values alone)."""
    want = np.frombuffer(expected, np.uint8)
    got = np.frombuffer(actual, np.uint8)
    return np.where(written, got, want).tobytes()
