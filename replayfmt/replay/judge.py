"""Judging a capture's expected values against several replays: the rule of docs/VERIFY.md.

A compared range is a checkpoint entry cut into typed pieces (a dtype from the capture's typed
checkpoint entries or its buffer) and untyped pieces. Each replay's bytes of a piece are folded
into a :class:`RangeObservation` (per element: the smallest and largest value the replays
produced, NaN counts), so that memory does not grow with the number of replays, and
:meth:`RangeObservation.judge` answers one of three verdicts:

* **exact**: every replay reproduced the captured bytes;
* **within run-to-run variation**: each captured element lies inside the replays' [min, max] for
  that element, widened by the largest spread seen anywhere in the piece (absolute) or by a few
  ulps of the dtype (:data:`ULP_WIDENING`, only when the program showed nondeterminism at all);
* **wrong**: some element lies outside that.

Values are compared in their own type through *ordered keys*: a float's bits mapped to an integer
that grows with the value, so that the ulp distance of two floats is the difference of their keys
(+0 and -0 share a key; NaN is handled apart: a captured NaN needs a NaN in some replay).
Untyped pieces are judged by their buffer's 4-byte words: a word may differ from the capture
where it varied between replays, or, in a program shown nondeterministic, where it reads as a
normal float32 number in the capture and in every replay and lies within the float32 widening of
the replays' values, or within what float words near it varied by (at most 2**16 ulps of its own
value, or, for a word of their scale, 2**-10 of the largest float near it and 2**19 ulps of its
own). Float32 is what most GPU memory holds; the integers kernels index with are never normal
float32 bit patterns below 2**23, so an index off by one is still wrong.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from replayfmt.format import model as m

D = m.DType
# (bytes, mantissa bits, exponent bits) of each float dtype; complex as its parts
_FLOATS: dict[m.DType, tuple[int, int, int]] = {
    D.FLOAT16: (2, 10, 5),
    D.BFLOAT16: (2, 7, 8),
    D.FLOAT32: (4, 23, 8),
    D.FLOAT64: (8, 52, 11),
    D.COMPLEX64: (4, 23, 8),
    D.COMPLEX128: (8, 52, 11),
    D.FLOAT8_E4M3FN: (1, 3, 4),
    D.FLOAT8_E5M2: (1, 2, 5),
}
_INTEGERS: dict[m.DType, str] = {
    D.BOOL: "u1",
    D.INT8: "i1",
    D.UINT8: "u1",
    D.INT16: "<i2",
    D.UINT16: "<u2",
    D.INT32: "<i4",
    D.UINT32: "<u4",
    D.INT64: "<i8",
    D.UINT64: "<u8",
}
# How many ulps a captured float may lie outside the replays' values when the program is shown to
# be nondeterministic: low bits that vary can agree by chance in every replay and still differ in
# the captured run. Small on purpose (docs/VERIFY.md says why a real bug is larger).
ULP_WIDENING: dict[m.DType, int] = {
    D.FLOAT64: 4,
    D.FLOAT32: 4,
    D.COMPLEX64: 4,
    D.COMPLEX128: 4,
    D.FLOAT16: 2,
    D.BFLOAT16: 2,
    D.FLOAT8_E4M3FN: 1,
    D.FLOAT8_E5M2: 1,
}
# How many times its piece's largest spread a captured float may lie outside the replays' values
# (never more than _NEIGHBOUR_CAP_ULPS of its own value) when the program is shown to vary: the
# captured run ran beside the recorder, in another order of atomics than a few replays show (a
# float32 index_add_ sum can lie 8 times the replays' spread outside them).
SPREAD_FACTOR = 16
WORD = 4  # untyped bytes vary by 4-byte words (the common element size of GPU data)
NEIGHBOURHOOD = 1024  # untyped words whose replays' spread allows a word's difference: 4 KiB blocks
_BINADE = 1 << 23  # float32 keys in one power of two: a float's replays that vary by more are no float's spread
# The most the neighbours' spread forgives a float32 word: 2**16 ulps, a relative 2**-7 (0.8%) of
# its value. Numbers the neighbours' variation cannot excuse: integers read as tiny floats moved
# by millions, a constant 1% off.
_NEIGHBOUR_CAP_ULPS = 1 << 16
# Beyond that cap, a float32 word of its neighbourhood's scale (at least 2**-20 of the largest
# float near it: no integer read as a tiny float) may differ by the neighbours' spread up to 2**-10
# of that scale: a sum that cancelled to a small value keeps the error of its terms, not of itself.
# A block may hold a steady tensor of small values beside a noisy one of large values: never more
# than 2**19 ulps (6%) of its own value, so that a steady value off by 40% stays wrong (review).
_SCALE_FLOOR = 2.0**-20
_SCALE_SHARE = 2.0**-10
_SCALE_CAP_ULPS = 1 << 19
SHOWN = 5  # differing elements listed per range


def judged_dtype(dtype: m.DType) -> bool:
    """Whether values of this dtype are judged as values (else as bytes)."""
    return dtype in _FLOATS or dtype in _INTEGERS


def part_size(dtype: m.DType) -> int:
    """Bytes of one judged lane: an element, or one part of a complex element."""
    if dtype in _FLOATS:
        return _FLOATS[dtype][0]
    return np.dtype(_INTEGERS[dtype]).itemsize


def _unsigned(width: int) -> str:
    return {1: "u1", 2: "<u2", 4: "<u4", 8: "<u8"}[width]


def ordered_keys(data: bytes | np.ndarray, dtype: m.DType) -> tuple[np.ndarray, np.ndarray]:
    """(keys, nan): int64 keys ordered like the values (their difference is the ulp distance for
    floats), and a mask of NaNs. ``data`` holds whole lanes of ``dtype``."""
    raw = np.frombuffer(data, np.uint8) if isinstance(data, bytes | bytearray | memoryview) else data
    if dtype in _INTEGERS:
        values = raw.view(_INTEGERS[dtype])
        if dtype == D.UINT64:
            keys = (values.view(np.int64) ^ np.int64(-(2**63))).astype(np.int64)
        else:
            keys = values.astype(np.int64)
        return keys, np.zeros(len(keys), bool)
    width, mantissa, exponent = _FLOATS[dtype]
    bits = raw.view(_unsigned(width)).astype(np.uint64)
    sign_bit = np.uint64(1) << np.uint64(width * 8 - 1)
    magnitude = bits & ~sign_bit & np.uint64((1 << (width * 8)) - 1)
    keys = magnitude.astype(np.int64)
    keys = np.where(bits & sign_bit, -keys, keys)
    exp_mask = ((1 << exponent) - 1) << mantissa
    man_mask = (1 << mantissa) - 1
    if dtype == D.FLOAT8_E4M3FN:  # no infinities: S.1111.111 is NaN
        nan = (magnitude & np.uint64(0x7F)) == np.uint64(0x7F)
    else:
        nan = ((magnitude & np.uint64(exp_mask)) == np.uint64(exp_mask)) & ((magnitude & np.uint64(man_mask)) != 0)
    return keys, nan


def _fp8_table(mantissa: int, exponent: int, *, finite_max: bool) -> np.ndarray:
    """The float64 value of each of the 128 non-negative fp8 encodings."""
    bias = (1 << (exponent - 1)) - 1
    out = np.empty(128)
    for code in range(128):
        e, f = code >> mantissa, code & ((1 << mantissa) - 1)
        if e == (1 << exponent) - 1 and not finite_max:
            out[code] = np.inf if f == 0 else np.nan
        elif e == 0:
            out[code] = f / (1 << mantissa) * 2.0 ** (1 - bias)
        else:
            out[code] = (1 + f / (1 << mantissa)) * 2.0 ** (e - bias)
    if finite_max:
        out[127] = np.nan
    return out


_FP8 = {
    D.FLOAT8_E4M3FN: _fp8_table(3, 4, finite_max=True),
    D.FLOAT8_E5M2: _fp8_table(2, 5, finite_max=False),
}


def key_values(keys: np.ndarray, dtype: m.DType) -> np.ndarray:
    """The float64 values of ordered keys (NaN keys give meaningless numbers: mask them apart)."""
    keys = np.asarray(keys, np.int64)
    if dtype in _INTEGERS:
        if dtype == D.UINT64:
            return (keys ^ np.int64(-(2**63))).view(np.uint64).astype(np.float64)
        return keys.astype(np.float64)
    width = _FLOATS[dtype][0]
    negative = keys < 0
    magnitude = np.abs(keys).astype(np.uint64)
    if dtype in _FP8:
        values = _FP8[dtype][np.minimum(magnitude, 127).astype(np.intp)]
    elif dtype == D.BFLOAT16:
        values = (magnitude.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    else:
        code = {2: "<f2", 4: "<f4", 8: "<f8"}[width]
        values = magnitude.astype(_unsigned(width)).view(code).astype(np.float64)
    return np.where(negative, -values, values)


class ValueVerdict(enum.Enum):
    EXACT = "exact"
    VARIES = "within run-to-run variation"
    WRONG = "wrong"


@dataclass(frozen=True)
class ElementDiff:
    """One differing element: its index in the piece (``position``: as a multi-dimensional index
    when the shape is known), the captured value and the replays' smallest and largest, and the
    largest absolute and ulp difference between the captured value and a replay."""

    index: int
    position: tuple[int, ...]
    captured: float
    replay_min: float
    replay_max: float
    abs_diff: float
    ulp_diff: int
    wrong: bool

    def as_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "position": list(self.position),
            "captured": _json_float(self.captured),
            "replay_min": _json_float(self.replay_min),
            "replay_max": _json_float(self.replay_max),
            "abs_diff": _json_float(self.abs_diff),
            "ulp_diff": self.ulp_diff,
            "wrong": self.wrong,
        }


def _json_float(x: float) -> float | str:
    return x if np.isfinite(x) else str(x)


@dataclass
class PieceJudgement:
    """The verdict on one piece of a compared range over every replay."""

    verdict: ValueVerdict
    dtype: str  # "float32", ...; "bytes" for untyped pieces
    typed: bool
    elements: int
    differing: int  # elements differing from the capture in some replay
    wrong: int
    largest_abs_diff: float = 0.0
    largest_ulp_diff: int = 0
    spread_abs: float = 0.0  # the largest difference between two replays of one element
    spread_ulps: int = 0
    widening_ulps: int = 0
    shown: list[ElementDiff] = field(default_factory=list)


class RangeObservation:
    """Every replay of one piece (bytes [start, start + size) of a checkpoint entry, of one dtype
    or untyped), folded per element (per 4-byte word when untyped); :meth:`judge` gives the verdict."""

    def __init__(self, expected: bytes, dtype: m.DType, shape: tuple[int, ...] = (), phase: int = 0) -> None:
        self.typed = judged_dtype(dtype)
        self.dtype = dtype if self.typed else D.UNKNOWN
        self.expected = expected
        # untyped: where the piece starts within a 4-byte word of its buffer (words are the
        # buffer's, so a float split by the piece's start is still one word)
        self.phase = 0 if self.typed else phase % WORD
        self.lanes = lanes_of(self.dtype, len(expected), self.phase)
        self.shape = shape if self.typed and shape and int(np.prod(shape)) == self.lanes else ()
        self.replays = 0
        self.identical = True  # every replay reproduced the captured bytes
        self.lo = self.hi = np.empty(0, np.int64)
        self.nan_count = np.zeros(self.lanes if self.typed else 0, np.int32)
        if self.typed:
            self.captured_keys, self.captured_nan = ordered_keys(expected[: self.lanes * part_size(dtype)], dtype)
        else:
            self.captured_words = _as_words(expected, self.phase)
            self.captured_keys, _ = ordered_keys(self.captured_words, D.FLOAT32)
            self.first_words = np.empty(0, np.uint32)
            self.word_varied = np.zeros(self.lanes, bool)  # differed between two replays
            self.word_differs = np.zeros(self.lanes, bool)  # differed from the capture in a replay

    def copy(self) -> RangeObservation:
        """An independent observation with the same replays folded in."""
        other = RangeObservation.__new__(RangeObservation)
        other.__dict__.update(self.__dict__)
        for name in ("lo", "hi", "nan_count", "first_words", "word_varied", "word_differs"):
            if name in self.__dict__:
                setattr(other, name, getattr(self, name).copy())
        return other

    def add(self, actual: bytes) -> None:
        """One replay's bytes of the piece."""
        if len(actual) != len(self.expected):
            raise ValueError(f"a replay gave {len(actual)} bytes for a piece of {len(self.expected)}")
        self.replays += 1
        self.identical = self.identical and actual == self.expected
        if self.typed:
            keys, nan = ordered_keys(actual[: self.lanes * part_size(self.dtype)], self.dtype)
            self.nan_count += nan
            lo = np.where(nan, np.iinfo(np.int64).max, keys)
            hi = np.where(nan, np.iinfo(np.int64).min, keys)
        else:
            words = _as_words(actual, self.phase)
            self.word_differs |= words != self.captured_words
            if self.replays == 1:
                self.first_words = words
            else:
                self.word_varied |= words != self.first_words
            lo = hi = ordered_keys(words, D.FLOAT32)[0]
        if self.replays == 1:
            self.lo, self.hi = lo, hi.copy()
        else:
            np.minimum(self.lo, lo, out=self.lo)
            np.maximum(self.hi, hi, out=self.hi)

    @property
    def varies(self) -> bool:
        """Whether the replays disagreed with each other anywhere in the piece."""
        if not self.typed:
            return bool(self.word_varied.any())
        numbers = self.nan_count < self.replays
        mixed = (self.nan_count > 0) & numbers
        return bool(np.any(numbers & (self.lo != self.hi)) or mixed.any())

    def judge(self, *, nondeterministic: bool, tolerance: tuple[float, float] | None = None) -> PieceJudgement:
        """The verdict; ``nondeterministic``: the program showed run-to-run variation somewhere,
        which allows the dtype's ulp widening (never for integers, nor for untyped words that do
        not read as floats). ``tolerance``: (rtol, atol) asked for with --tolerance, also allowed
        for floats."""
        name = self.dtype.name.lower() if self.typed else "bytes"
        if self.replays == 0:
            raise ValueError("a piece must be observed in at least one replay before it is judged")
        if self.identical:
            return PieceJudgement(ValueVerdict.EXACT, name, self.typed, self.lanes, 0, 0)
        if not self.typed:
            return self._judge_words(nondeterministic)
        c, c_nan, lo, hi = self.captured_keys, self.captured_nan, self.lo, self.hi
        has_number = self.nan_count < self.replays
        has_nan = self.nan_count > 0
        number_spread = np.where(has_number, hi - lo, 0)
        values_lo, values_hi = key_values(lo, self.dtype), key_values(hi, self.dtype)
        captured = key_values(c, self.dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            spread_values = np.where(has_number, values_hi - values_lo, 0.0)
        finite_spread = spread_values[np.isfinite(spread_values)]
        spread_abs = float(finite_spread.max()) if finite_spread.size else 0.0
        spread_ulps = int(number_spread.max()) if number_spread.size else 0
        inside = np.where(c_nan, has_nan, has_number & (lo <= c) & (c <= hi))
        differs = c_nan & (self.nan_count < self.replays) | ~c_nan & (has_nan | (has_number & ((lo != c) | (hi != c))))
        widening = ULP_WIDENING.get(self.dtype, 0) if nondeterministic else 0
        below = np.where(has_number & (c < lo), lo - c, 0)
        above = np.where(has_number & (c > hi), c - hi, 0)
        ulp_out = np.maximum(below, above)
        edge = np.where(c < lo, values_lo, values_hi)
        with np.errstate(invalid="ignore", over="ignore"):
            abs_out = np.abs(captured - edge)
        abs_out = np.where(np.isnan(abs_out), np.inf, abs_out)
        tolerated = (ulp_out <= widening) | (abs_out <= spread_abs)
        if nondeterministic and self.dtype in _FLOATS:  # the captured run varied beside the recorder
            tolerated |= (abs_out <= SPREAD_FACTOR * spread_abs) & (ulp_out <= _NEIGHBOUR_CAP_ULPS)
        if tolerance is not None and self.dtype in _FLOATS:
            with np.errstate(invalid="ignore", over="ignore"):
                tolerated |= abs_out <= tolerance[1] + tolerance[0] * np.abs(captured)
        # a NaN where no replay gave one, or a number where every replay gave NaN: wrong
        wrong = ~inside & (c_nan | ~has_number | ~tolerated)
        with np.errstate(invalid="ignore", over="ignore"):
            abs_diff = np.maximum(np.abs(captured - values_lo), np.abs(captured - values_hi))
        abs_diff = np.where(c_nan | ~has_number | np.isnan(abs_diff), np.where(differs, np.inf, 0.0), abs_diff)
        abs_diff = np.where(differs, abs_diff, 0.0)
        ulp_diff = np.where(differs & has_number & ~c_nan, np.maximum(np.abs(c - lo), np.abs(c - hi)), 0)
        shown_values = (
            np.where(c_nan, np.nan, captured),
            np.where(has_number, values_lo, np.nan),
            np.where(has_number, values_hi, np.nan),
        )
        return self._judgement(
            name, differs, wrong, abs_diff, ulp_diff, shown_values, (spread_abs, spread_ulps, widening)
        )

    def _judge_words(self, nondeterministic: bool) -> PieceJudgement:
        """Untyped words: a word that differs must have varied between replays, or read as normal
        float32 numbers (capture and replays) within the float32 widening, or within the spread of
        the float words that varied near it (:data:`NEIGHBOURHOOD`) and :data:`_NEIGHBOUR_CAP_ULPS`,
        where the program varied."""
        c, lo, hi = self.captured_keys, self.lo, self.hi
        differs = self.word_differs
        whole = np.ones(self.lanes, bool)
        if self.lanes and self.phase:
            whole[0] = False  # a padded head or tail is no float32
        if self.lanes and (self.phase + len(self.expected)) % WORD:
            whole[-1] = False
        floats = whole & _normal_float32(c) & _normal_float32(lo) & _normal_float32(hi)
        widening = ULP_WIDENING[D.FLOAT32] if nondeterministic else 0
        ulp_out = np.maximum(np.maximum(lo - c, c - hi), 0)
        # the spread of a float that varied: its replays share its sign and lie within a binade's
        # width of each other (a word that is no float, varying, is nothing to measure against)
        same_sign = (lo > 0) == (hi > 0)
        varied_floats = self.word_varied & whole & _normal_float32(lo) & _normal_float32(hi) & same_sign
        varied_floats &= hi - lo <= _BINADE
        spread_ulps_of = np.where(varied_floats, hi - lo, 0)
        as_float = (key_values(c, D.FLOAT32), key_values(lo, D.FLOAT32), key_values(hi, D.FLOAT32))
        with np.errstate(invalid="ignore", over="ignore"):  # infinities: inf - inf
            spread_values = np.where(varied_floats, as_float[2] - as_float[1], 0.0)
            abs_out = np.abs(as_float[0] - np.where(c < lo, as_float[1], as_float[2]))
        # within what the floats near it varied by (their values: a sum cancelling near zero varies
        # by many ulps), and never by more than a small fraction of its own value, or of its
        # neighbourhood's scale where it is a number of that scale (a sum of that tensor's terms
        # that cancelled to a small value, such as a 7e-7 sum amid 4e-5 terms that vary by 2.4e-7,
        # differs from the capture by a share of its neighbours' scale while replays agree)
        near = _neighbourhood_max(spread_values)
        magnitude = np.abs(as_float[0])
        with np.errstate(invalid="ignore"):
            scale = _neighbourhood_max(np.where(floats & np.isfinite(magnitude), magnitude, 0.0))
            of_scale = (magnitude >= scale * _SCALE_FLOOR) & (abs_out <= scale * _SCALE_SHARE)
        of_scale &= ulp_out <= _SCALE_CAP_ULPS
        by_neighbours = (abs_out <= near) & ((ulp_out <= _NEIGHBOUR_CAP_ULPS) | of_scale)
        tolerated = floats & ((ulp_out <= widening) | by_neighbours)
        wrong = differs & ~self.word_varied & ~tolerated
        # shown as float32 values where the words read as floats, else as unsigned integers
        lo_words, hi_words = _key_words(lo), _key_words(hi)
        as_int = (self.captured_words.astype(np.float64), lo_words.astype(np.float64), hi_words.astype(np.float64))
        captured, low, high = (np.where(floats, f, i) for f, i in zip(as_float, as_int, strict=True))
        with np.errstate(invalid="ignore", over="ignore"):
            abs_diff = np.where(differs, np.maximum(np.abs(captured - low), np.abs(captured - high)), 0.0)
        abs_diff = np.where(np.isnan(abs_diff), np.inf, abs_diff)
        int_ulps = np.maximum(np.abs(as_int[0] - as_int[1]), np.abs(as_int[0] - as_int[2])).astype(np.int64)
        ulp_diff = np.where(differs, np.where(floats, np.maximum(np.abs(c - lo), np.abs(c - hi)), int_ulps), 0)
        spread_abs = float(spread_values.max()) if self.lanes else 0.0
        spread_ulps = int(spread_ulps_of.max()) if self.lanes else 0
        return self._judgement(
            "bytes", differs, wrong, abs_diff, ulp_diff, (captured, low, high), (spread_abs, spread_ulps, widening)
        )

    def _judgement(
        self,
        name: str,
        differs: np.ndarray,
        wrong: np.ndarray,
        abs_diff: np.ndarray,
        ulp_diff: np.ndarray,
        shown_values: tuple[np.ndarray, np.ndarray, np.ndarray],
        spread: tuple[float, int, int],
    ) -> PieceJudgement:
        n_wrong = int(wrong.sum())
        verdict = ValueVerdict.WRONG if n_wrong else ValueVerdict.VARIES
        pick = np.flatnonzero(wrong if n_wrong else differs)[:SHOWN]
        captured, low, high = shown_values
        shown = [
            ElementDiff(
                int(i),
                self._position(int(i)),
                float(captured[i]),
                float(low[i]),
                float(high[i]),
                float(abs_diff[i]),
                int(ulp_diff[i]),
                bool(wrong[i]),
            )
            for i in pick
        ]
        finite = abs_diff[np.isfinite(abs_diff)]
        largest_abs = float(abs_diff.max()) if abs_diff.size else 0.0
        if finite.size and not np.isfinite(largest_abs):
            largest_abs = float("inf")
        spread_abs, spread_ulps, widening = spread
        return PieceJudgement(
            verdict,
            name,
            self.typed,
            self.lanes,
            int(differs.sum()),
            n_wrong,
            largest_abs,
            int(ulp_diff.max()) if ulp_diff.size else 0,
            spread_abs,
            spread_ulps,
            widening,
            shown,
        )

    def _position(self, lane: int) -> tuple[int, ...]:
        """Where a lane is: its index (multi-dimensional with a shape), or an untyped word's byte offset."""
        if not self.typed:
            return (max(0, lane * WORD - self.phase),)
        if self.shape:
            return tuple(int(x) for x in np.unravel_index(lane, self.shape))
        return (lane,)


def lanes_of(dtype: m.DType, size: int, phase: int = 0) -> int:
    """The judged lanes of ``size`` bytes: elements (parts of complex ones) of a judged dtype, or
    the 4-byte words of its buffer that untyped bytes starting ``phase`` bytes into a word touch."""
    if judged_dtype(dtype):
        return size // part_size(dtype)
    return -(-(size + phase % WORD) // WORD)


def _neighbourhood_max(spread: np.ndarray) -> np.ndarray:
    """Per word, the largest spread among the words of its block of :data:`NEIGHBOURHOOD` words
    and the two blocks beside it: untyped memory holds many tensors, each laid out contiguously,
    and a word's nondeterminism is that of its own tensor, not of the largest one in the piece."""
    if not spread.size:
        return spread
    blocks = -(-spread.size // NEIGHBOURHOOD)
    padded = np.zeros(blocks * NEIGHBOURHOOD, spread.dtype)
    padded[: spread.size] = spread
    per_block = padded.reshape(blocks, NEIGHBOURHOOD).max(axis=1)
    near = per_block.copy()
    near[1:] = np.maximum(near[1:], per_block[:-1])
    near[:-1] = np.maximum(near[:-1], per_block[1:])
    return np.repeat(near, NEIGHBOURHOOD)[: spread.size]


def _as_words(data: bytes, phase: int = 0) -> np.ndarray:
    """Untyped bytes that start ``phase`` bytes into a word, as little-endian 4-byte words (a
    partial head and tail padded with zeros)."""
    tail = -(len(data) + phase) % WORD
    if phase or tail:
        data = bytes(phase) + bytes(data) + bytes(tail)
    return np.frombuffer(data, "<u4")


def _normal_float32(keys: np.ndarray) -> np.ndarray:
    """Whether float32 ordered keys are normal numbers (not zero, subnormal, infinite or NaN)."""
    exponent = (np.abs(keys) >> 23) & 0xFF
    return (exponent != 0) & (exponent != 0xFF)


def _key_words(keys: np.ndarray) -> np.ndarray:
    """The float32 bit patterns (as unsigned words) of ordered keys."""
    magnitude = np.abs(keys).astype(np.uint32)
    return np.where(keys < 0, magnitude | np.uint32(0x80000000), magnitude).astype(np.uint32)
