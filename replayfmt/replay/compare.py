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


def compare(expected: bytes, actual: bytes, *, buffer: m.Buffer, operation: int, tolerance: Tolerance) -> BufferReport:
    """Compare one buffer range; never raises on a mismatch (the caller decides)."""
    dtype = buffer.dtype
    if tolerance.enabled and dtype in FLOATING and (values := _as_float(expected, dtype)) is not None:
        got = _as_float(actual, dtype)
        assert got is not None
        rtol_default, atol_default = DEFAULT_TOLERANCES[dtype]
        rtol = rtol_default if tolerance.rtol is None else tolerance.rtol
        atol = atol_default if tolerance.atol is None else tolerance.atol
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
