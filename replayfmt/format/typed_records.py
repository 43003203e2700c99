"""(1.3) Typed tensors of a checkpoint <-> their FlatBuffers tables (``TypedTensor``)."""

from __future__ import annotations

from typing import Any

import flatbuffers
import numpy as np

from replayfmt.format import model as m
from replayfmt.format.generated import fb


def encode_typed_tensor(b: flatbuffers.Builder, t: m.TypedTensor) -> int:
    """Write one typed tensor; returns its table's offset."""
    shape = b.CreateNumpyVector(np.asarray(t.shape, dtype="<i8")) if t.shape else 0
    strides = b.CreateNumpyVector(np.asarray(t.strides, dtype="<i8")) if t.strides else 0
    name = b.CreateString(t.name) if t.name else 0
    fb.TypedTensor.Start(b)
    fb.TypedTensor.AddBuffer(b, t.buffer)
    fb.TypedTensor.AddOffset(b, t.offset)
    fb.TypedTensor.AddSize(b, t.size)
    fb.TypedTensor.AddDtype(b, int(t.dtype))
    if shape:
        fb.TypedTensor.AddShape(b, shape)
    if strides:
        fb.TypedTensor.AddStrides(b, strides)
    if name:
        fb.TypedTensor.AddName(b, name)
    return fb.TypedTensor.End(b)


def decode_typed_tensor(v: dict[str, Any]) -> m.TypedTensor:
    """One decoded TypedTensor table as the model's; a dtype this reader does not know is UNKNOWN
    (its range is then compared as bytes)."""
    try:
        dtype = m.DType(v["dtype"])
    except ValueError:
        dtype = m.DType.UNKNOWN
    return m.TypedTensor(
        buffer=v["buffer"],
        offset=v["offset"],
        size=v["size"],
        dtype=dtype,
        shape=tuple(int(x) for x in v["shape"]) if v["shape"] is not None else (),
        strides=tuple(int(x) for x in v["strides"]) if v["strides"] is not None else (),
        name=v["name"] or "",
    )
