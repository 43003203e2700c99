"""Comparing replayed buffer contents with a capture's expected bytes.

Exact byte comparison by default. For floating-point buffers whose dtype is known, a tolerance
``|actual - expected| <= atol + rtol * |expected|`` (numpy's isclose rule; NaN equals NaN only at
the same places) can be asked for, with per-dtype defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replayfmt.format import model as m

NUMPY_DTYPES: dict[m.DType, str] = {
    m.DType.BOOL: "?",
    m.DType.INT8: "i1",
    m.DType.UINT8: "u1",
    m.DType.INT16: "<i2",
    m.DType.UINT16: "<u2",
    m.DType.INT32: "<i4",
    m.DType.UINT32: "<u4",
    m.DType.INT64: "<i8",
    m.DType.UINT64: "<u8",
    m.DType.FLOAT16: "<f2",
    m.DType.FLOAT32: "<f4",
    m.DType.FLOAT64: "<f8",
    m.DType.COMPLEX64: "<c8",
    m.DType.COMPLEX128: "<c16",
}
FLOATING = {
    m.DType.FLOAT16,
    m.DType.BFLOAT16,
    m.DType.FLOAT32,
    m.DType.FLOAT64,
    m.DType.COMPLEX64,
    m.DType.COMPLEX128,
    m.DType.FLOAT8_E4M3FN,
    m.DType.FLOAT8_E5M2,
}
# (rtol, atol) used with --tolerance when --rtol/--atol are not given
DEFAULT_TOLERANCES: dict[m.DType, tuple[float, float]] = {
    m.DType.FLOAT16: (1e-3, 1e-3),
    m.DType.BFLOAT16: (1e-2, 1e-2),
    m.DType.FLOAT32: (1e-5, 1e-6),
    m.DType.FLOAT64: (1e-12, 1e-12),
    m.DType.COMPLEX64: (1e-5, 1e-6),
    m.DType.COMPLEX128: (1e-12, 1e-12),
    m.DType.FLOAT8_E4M3FN: (1.25e-1, 1e-2),
    m.DType.FLOAT8_E5M2: (2.5e-1, 1e-2),
}


@dataclass(frozen=True)
class Tolerance:
    """None values mean: the dtype's default. ``enabled=False``: exact bytes."""

    enabled: bool = False
    rtol: float | None = None
    atol: float | None = None


@dataclass(frozen=True)
class BufferReport:
    operation: int  # the checkpoint (or download) operation
    buffer: int
    label: str
    dtype: str
    mode: str  # "bytes" or "rtol=..,atol=.."
    elements: int
    mismatches: int
    max_abs_error: float
    max_rel_error: float
    first_mismatch: int | None  # element index (byte index in bytes mode)

    @property
    def passed(self) -> bool:
        return self.mismatches == 0

    def line(self) -> str:
        name = f"buffer {self.buffer}" + (f" ({self.label})" if self.label else "")
        verdict = "ok" if self.passed else "MISMATCH"
        text = (
            f"op {self.operation:>6} {name}: {verdict} {self.elements} {self.dtype} compared ({self.mode}), "
            f"{self.mismatches} mismatching"
        )
        if self.max_abs_error or self.max_rel_error:
            text += f", max abs err {self.max_abs_error:.3g}, max rel err {self.max_rel_error:.3g}"
        if self.first_mismatch is not None:
            text += f", first at index {self.first_mismatch}"
        return text


def _as_float(data: bytes, dtype: m.DType) -> np.ndarray | None:
    if dtype == m.DType.BFLOAT16:
        raw = np.frombuffer(data[: len(data) // 2 * 2], "<u2").astype(np.uint32) << 16
        return raw.view("<f4").astype(np.float64)
    code = NUMPY_DTYPES.get(dtype)
    if code is None:
        return None
    itemsize = np.dtype(code).itemsize
    return np.frombuffer(data[: len(data) // itemsize * itemsize], code)


def segments(buffer: m.Buffer, offset: int, size: int) -> list[tuple[int, int, m.DType]]:
    """Bytes [offset, offset + size) of a buffer as (start, end, dtype) runs relative to offset:
    its typed ranges where it has them (UNKNOWN between them), else one run of its dtype."""
    if not buffer.ranges:
        return [(0, size, buffer.dtype)]
    out: list[tuple[int, int, m.DType]] = []
    pos = 0
    for r in sorted(buffer.ranges):
        a, b = max(r.offset - offset, pos), min(r.offset + r.size - offset, size)
        if b <= a:
            continue
        if a > pos:
            out.append((pos, a, m.DType.UNKNOWN))
        out.append((a, b, r.dtype))
        pos = b
    if pos < size:
        out.append((pos, size, m.DType.UNKNOWN))
    return out


def mismatch_mask(
    expected: bytes, actual: bytes, *, buffer: m.Buffer, offset: int = 0, tolerance: Tolerance = Tolerance()
) -> tuple[np.ndarray, str]:
    """A boolean mask of the bytes judged wrong, and the comparison's mode: each typed run is
    compared by its dtype with tolerances (when enabled and floating), every other byte exactly."""
    a = np.frombuffer(expected, np.uint8)
    b = np.frombuffer(actual, np.uint8)
    wrong = a != b
    modes = {"exact"}
    if not tolerance.enabled:
        return wrong, "exact"
    for start, end, dtype in segments(buffer, offset, len(a)):
        want, have = _as_float(expected[start:end], dtype), _as_float(actual[start:end], dtype)
        if dtype not in FLOATING or want is None or have is None or not len(want):
            continue
        rtol, atol = tolerances(dtype, tolerance)
        close = np.isclose(
            have.astype(np.complex128 if have.dtype.kind == "c" else np.float64),
            want.astype(np.complex128 if want.dtype.kind == "c" else np.float64),
            rtol=rtol,
            atol=atol,
            equal_nan=True,
        )
        itemsize = (end - start) // len(want)
        wrong[start : start + len(want) * itemsize] = np.repeat(~close, itemsize)
        modes.add(f"{dtype.name.lower()} rtol={rtol:g},atol={atol:g}")
    return wrong, "; ".join(sorted(modes - {"exact"})) + ("; others exact" if len(modes) > 1 else "exact")


def tolerances(dtype: m.DType, tolerance: Tolerance) -> tuple[float, float]:
    """(rtol, atol) for a floating dtype: the asked values, else the dtype's defaults."""
    rtol_default, atol_default = DEFAULT_TOLERANCES[dtype]
    rtol = rtol_default if tolerance.rtol is None else tolerance.rtol
    return rtol, atol_default if tolerance.atol is None else tolerance.atol


def compare(
    expected: bytes, actual: bytes, *, buffer: m.Buffer, operation: int, tolerance: Tolerance, offset: int = 0
) -> BufferReport:
    """Compare one buffer range (starting ``offset`` bytes into the buffer); never raises on a
    mismatch (the caller decides). A buffer with typed ranges is compared range by range."""
    if buffer.ranges and tolerance.enabled:
        wrong, mode = mismatch_mask(expected, actual, buffer=buffer, offset=offset, tolerance=tolerance)
        bad = np.flatnonzero(wrong)
        return BufferReport(
            operation,
            buffer.id,
            buffer.label,
            "bytes of typed ranges",
            mode,
            len(wrong),
            len(bad),
            0.0,
            0.0,
            int(bad[0]) if len(bad) else None,
        )
    dtype = buffer.dtype
    if tolerance.enabled and dtype in FLOATING and (values := _as_float(expected, dtype)) is not None:
        got = _as_float(actual, dtype)
        assert got is not None
        rtol, atol = tolerances(dtype, tolerance)
        want, have = (
            values.astype(np.complex128 if values.dtype.kind == "c" else np.float64),
            got.astype(np.complex128 if got.dtype.kind == "c" else np.float64),
        )
        close = np.isclose(have, want, rtol=rtol, atol=atol, equal_nan=True)
        diff = np.abs(have - want)
        finite = np.isfinite(diff)
        max_abs = float(diff[finite].max()) if finite.any() else 0.0
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(np.abs(want) > 0, diff / np.abs(want), 0.0)
        max_rel = float(rel[np.isfinite(rel)].max()) if np.isfinite(rel).any() else 0.0
        bad = np.flatnonzero(~close)
        return BufferReport(
            operation,
            buffer.id,
            buffer.label,
            dtype.name.lower(),
            f"rtol={rtol:g},atol={atol:g}",
            len(want),
            len(bad),
            max_abs,
            max_rel,
            int(bad[0]) if len(bad) else None,
        )
    if expected == actual:  # one memcmp: the common case costs no mask
        return BufferReport(operation, buffer.id, buffer.label, "bytes", "exact", len(expected), 0, 0.0, 0.0, None)
    a = np.frombuffer(expected, np.uint8)
    b = np.frombuffer(actual, np.uint8)
    bad = np.flatnonzero(a != b)
    return BufferReport(
        operation,
        buffer.id,
        buffer.label,
        "bytes",
        "exact",
        len(a),
        len(bad),
        0.0,
        0.0,
        int(bad[0]) if len(bad) else None,
    )
