"""Fast JSON text for launch rows: per-function templates with a precompiled struct unpack."""

from __future__ import annotations

import json
import struct
from typing import Any

from replayfmt.format import model as m
from replayfmt.format.names import demangle

# ----------------------------------------------------------------------------------------------
# Rows

_DTYPE_FORMATS = {
    m.DType.BOOL: "?",
    m.DType.INT8: "b",
    m.DType.UINT8: "B",
    m.DType.INT16: "h",
    m.DType.UINT16: "H",
    m.DType.INT32: "i",
    m.DType.UINT32: "I",
    m.DType.INT64: "q",
    m.DType.UINT64: "Q",
    m.DType.FLOAT16: "e",
    m.DType.FLOAT32: "f",
    m.DType.FLOAT64: "d",
}
_SIZE_FORMATS = {1: "B", 2: "H", 4: "I", 8: "Q"}


_POINTER, _TENSOR_MAP = int(m.ParameterKind.POINTER), int(m.ParameterKind.TENSOR_MAP)


def _float_json(value: float) -> str:
    text = repr(value)
    return text if text[-1].isdigit() else f'"{text}"'  # "nan", "inf", "-inf": strict JSON has no such numbers


class LaunchTemplate:
    """Renders launch rows of one (executable, function) as JSON text quickly.

    When the function's parameter layout is known, one precompiled struct unpacks every parameter
    at once and each is written under its name: values typed by dtype, relocated pointers as
    {"buffer", "offset"}, other pointers as hex strings, opaque blobs (tensor maps) as hex.
    """

    def __init__(self, fn: m.Function | None, executable: int, function: int) -> None:
        self.name = fn.name if fn else ""
        readable = demangle(self.name)  # the raw symbol stays in "function": the driver looks it up so
        shown = f',"function_demangled":{json.dumps(readable)}' if readable != self.name else ""
        self.head = f',"executable":{executable},"function":{json.dumps(self.name)}{shown},"function_index":{function},'
        self.render: Any = None
        self.slots: list[tuple[str, int, int, str]] = []
        if fn is None or not fn.parameters_known:
            return
        fmt, end, seen = "<", 0, set()
        params = sorted(fn.parameters, key=lambda p: p.offset)
        for i, p in enumerate(params):
            if p.offset < end:
                return  # overlapping parameters: leave this function to the raw-bytes form
            if p.offset > end:
                fmt += f"{p.offset - end}x"  # a count, never the pad spelled out: offsets are the file's
            name = p.name if p.name and p.name not in seen else f"p{i}"
            seen.add(name)
            if p.kind == m.ParameterKind.POINTER and p.size == 8:
                code, conv = "Q", "pointer"
            elif p.dtype == m.DType.BFLOAT16 and p.size == 2:
                code, conv = "H", "bf16"
            elif p.dtype in _DTYPE_FORMATS and struct.calcsize("<" + _DTYPE_FORMATS[p.dtype]) == p.size:
                code = _DTYPE_FORMATS[p.dtype]
                conv = "float" if code in "efd" else ("bool" if code == "?" else "int")
            elif p.kind != m.ParameterKind.TENSOR_MAP and p.size in _SIZE_FORMATS:
                code, conv = _SIZE_FORMATS[p.size], "int"
            else:
                code, conv = f"{p.size}s", "hex"
            fmt += code
            end = p.offset + p.size
            self.slots.append((json.dumps(name) + ":", p.offset, int(p.kind), conv))
        self.render = _compile_renderer(struct.Struct(fmt), self.slots)

    def targets(self, relocations: tuple[m.Relocation, ...]) -> tuple[str | None, ...]:
        """What each pointer slot is relocated to, as JSON text (None: not relocated): worked
        out once per distinct relocation set, which repeats from launch to launch."""
        pointers = [offset for _, offset, kind, _ in self.slots if kind in (_POINTER, _TENSOR_MAP)]
        found: dict[int, m.Relocation] = {}
        for r in relocations:
            if not r[0] and r[2] in pointers:
                found[r[2]] = r  # the last relocation of a site wins
        return tuple(_target_json(found.get(offset)) for offset in pointers)


def _bf16_json(value: int) -> str:
    return _float_json(struct.unpack("<f", (value << 16).to_bytes(4, "little"))[0])


def _target_json(relocation: m.Relocation | None) -> str | None:
    return f'{{"buffer":{relocation[1]},"offset":{relocation[3]}}}' if relocation else None


def _hex_json(value: int | bytes) -> str:
    return f'"{value:#x}"' if isinstance(value, int) else f'"{value.hex()}"'


def _compile_renderer(unpack: struct.Struct, slots: list[tuple[str, int, int, str]]) -> Any:
    """Build, once per kernel signature, ``render(raw, targets, lead, index, middle, tail)``:
    the text ``lead``, ``index``, ``middle``, the "parameters" object, ``tail`` (``targets``:
    :meth:`LaunchTemplate.targets` of the launch's relocations), a whole launch row built once.

    Unrolled code (one unpack, one f-string) is several times faster than interpreting the layout
    for every launch: this is what keeps JSONL fast. The generated code holds no string literals:
    every string it joins comes from the namespace below.
    """
    values = ", ".join(f"v{i}" for i in range(len(slots)))
    pointers = [i for i, (_, _, kind, _) in enumerate(slots) if kind in (_POINTER, _TENSOR_MAP)]
    floats = [i for i, slot in enumerate(slots) if slot[3] == "float" and slot[2] not in (_POINTER, _TENSOR_MAP)]
    namespace: dict[str, Any] = {
        "UNPACK": unpack.unpack_from,
        "ERROR": struct.error,
        "FLOAT": _float_json,
        "BF16": _bf16_json,
        "HEX": _hex_json,
        "TRUE": "true",
        "FALSE": "false",
        "HEAD": '"parameters":',
        "TAIL": "}",
        "EMPTY": "{}",
    }
    for i, (key, *_) in enumerate(slots):
        namespace[f"K{i}"] = ("{" if i == 0 else ",") + key
    lines = []
    # Two renderers: "render" assumes finite floats (repr() is then valid JSON and the f-string
    # calls it in C) and hands a launch with inf or nan (v - v is nan) to "careful", which spells
    # those out as strings.
    for name, finite in (("careful", False), ("render", True)):
        lines += [
            f"def {name}(raw, targets, lead, index, middle, tail):",
            "    try:",
            f"        ({values},) = UNPACK(raw)" if slots else "        UNPACK(raw)",  # () = ... for no parameter
            "    except ERROR:",
            "        return None  # shorter than the layout: the caller shows the raw bytes",
        ]
        if finite and floats:
            lines += [f"    if {' or '.join(f'v{i} - v{i} != 0.0' for i in floats)}:"]
            lines += ["        return careful(raw, targets, lead, index, middle, tail)"]
        if pointers:
            lines.append(f"    ({', '.join(f't{i}' for i in pointers)},) = targets")
        pieces = ["lead", "index", "middle", "HEAD"]  # one f-string: one BUILD_STRING, no intermediate strings
        for i, (_key, _offset, kind, conv) in enumerate(slots):
            if kind in (_POINTER, _TENSOR_MAP):
                value = f"(t{i} or HEX(v{i}))"
            elif conv == "float":
                value = f"v{i}!r" if finite else f"FLOAT(v{i})"
            else:
                value = {
                    "int": f"v{i}",  # an int formats as str() spells it
                    "bool": f"(TRUE if v{i} else FALSE)",
                    "bf16": f"BF16(v{i})",
                }.get(conv, f"HEX(v{i})")
            pieces += [f"K{i}", value]
        pieces += ["TAIL" if slots else "EMPTY", "tail"]
        lines.append("    return f'" + "".join(f"{{{piece}}}" for piece in pieces) + "'")
    exec("\n".join(lines), namespace)
    return namespace["render"]
