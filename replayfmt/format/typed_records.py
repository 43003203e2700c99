"""(1.3) Typed tensors of a checkpoint <-> their FlatBuffers tables (``TypedTensor``)."""

from __future__ import annotations

from typing import Any

import flatbuffers
import numpy as np

from replayfmt.format import model as m
from replayfmt.format.fb import TypedTensor as FbTypedTensor


def encode_typed_tensor(b: flatbuffers.Builder, t: m.TypedTensor) -> int:
    """Write one typed tensor; returns its table's offset."""
    shape = b.CreateNumpyVector(np.asarray(t.shape, dtype="<i8")) if t.shape else 0
    strides = b.CreateNumpyVector(np.asarray(t.strides, dtype="<i8")) if t.strides else 0
    name = b.CreateString(t.name) if t.name else 0
    FbTypedTensor.Start(b)
    FbTypedTensor.AddBuffer(b, t.buffer)
    FbTypedTensor.AddOffset(b, t.offset)
    FbTypedTensor.AddSize(b, t.size)
    FbTypedTensor.AddDtype(b, int(t.dtype))
    if shape:
        FbTypedTensor.AddShape(b, shape)
    if strides:
        FbTypedTensor.AddStrides(b, strides)
    if name:
        FbTypedTensor.AddName(b, name)
    return FbTypedTensor.End(b)


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
