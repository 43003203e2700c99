"""Names of what a row shows: enum labels and an operation's field names."""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
from typing import Any

from replayfmt.format import model as m

_LAUNCH_FLAGS = (
    (m.LAUNCH_FLAG_COOPERATIVE, "cooperative"),
    (m.LAUNCH_FLAG_HOST_RELEASED, "host-released"),
    (m.LAUNCH_FLAG_PROGRAMMATIC, "programmatic"),
)


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


def launch_flags_text(flags: int) -> str:
    """`` flags=cooperative,programmatic``: a launch's flags by name (bits a newer writer set, in
    hex); "" for none."""
    if not flags:
        return ""
    names = [name for bit, name in _LAUNCH_FLAGS if flags & bit]
    unknown = flags & ~m.LAUNCH_FLAGS_KNOWN
    return " flags=" + ",".join(names + ([f"{unknown:#x}"] if unknown else []))


def stored_pointers_text(relocations: tuple[Any, ...]) -> str:
    """`` pointers=N (@site->buffer#B+offset, ...)``: the pointers stored in a state's or an
    upload's bytes (1.3 data relocations; sites are offsets in the written buffer); "" for none."""
    if not relocations:
        return ""
    shown = ", ".join(f"@{r.site_offset}->buffer#{r.target_buffer}+{r.target_offset}" for r in relocations[:4])
    more = f", and {len(relocations) - 4} more" if len(relocations) > 4 else ""
    return f" pointers={len(relocations)} ({shown}{more})"


def stored_pointers_rows(relocations: tuple[Any, ...]) -> list[dict[str, Any]]:
    """The pointers stored in a state's or an upload's bytes as JSONL rows (the launch rows' keys)."""
    return [
        {
            "site_buffer": r.site_buffer,
            "site_offset": r.site_offset,
            "target_buffer": r.target_buffer,
            "target_offset": r.target_offset,
            "kind": "pointer",
        }
        for r in relocations
    ]


def stored_pointers_json(relocations: tuple[Any, ...]) -> str:
    """``,"relocations":[...]`` for a state or upload holding pointers; "" for none."""
    if not relocations:
        return ""
    return ',"relocations":' + json.dumps(stored_pointers_rows(relocations), separators=(",", ":"))


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
