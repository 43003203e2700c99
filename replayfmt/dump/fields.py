"""Names of what a row shows: enum labels and an operation's field names."""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Any


def label_of(value: Any) -> str:
    """The lower-case name of an enum value; ``unknown_N`` for a value from a newer writer."""
    if hasattr(value, "label"):
        return value.label
    if isinstance(value, enum.Enum):
        return value.name.lower()
    return f"unknown_{int(value)}"


@functools.cache
def _fields_of(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name != "index")


def field_names(op: Any) -> tuple[str, ...]:
    return _fields_of(type(op))


def typed_tensor_row(t: Any) -> dict[str, Any]:
    """A checkpoint's typed tensor (format 1.3) as JSON (docs/JSONL.md)."""
    shape, strides = list(t.shape), list(t.strides)
    return {
        "buffer": t.buffer,
        "offset": t.offset,
        "size": t.size,
        "dtype": label_of(t.dtype),
        "shape": shape,
        "strides": strides,
        "name": t.name,
    }
