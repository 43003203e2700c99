"""A reader for the subset of the FlatBuffers schema language that replayfmt/schema.fbs uses.

It gives two things the generated Python code cannot: the exact byte layout of every struct (so
hot records are read as numpy structured arrays), and the shape of every table (so the verifier
can bounds-check a buffer before any generated accessor touches it). Keeping schema.fbs the single
source of truth means the verifier and the numpy layouts can never drift from the schema.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schema.fbs"  # replayfmt/schema.fbs: the format's front door

SCALAR_SIZES = {
    "bool": 1,
    "byte": 1,
    "ubyte": 1,
    "int8": 1,
    "uint8": 1,
    "short": 2,
    "ushort": 2,
    "int16": 2,
    "uint16": 2,
    "int": 4,
    "uint": 4,
    "int32": 4,
    "uint32": 4,
    "float": 4,
    "float32": 4,
    "long": 8,
    "ulong": 8,
    "int64": 8,
    "uint64": 8,
    "double": 8,
    "float64": 8,
}
NUMPY_CODES = {
    "bool": "u1",
    "byte": "i1",
    "ubyte": "u1",
    "int8": "i1",
    "uint8": "u1",
    "short": "i2",
    "ushort": "u2",
    "int16": "i2",
    "uint16": "u2",
    "int": "i4",
    "uint": "u4",
    "int32": "i4",
    "uint32": "u4",
    "float": "f4",
    "float32": "f4",
    "long": "i8",
    "ulong": "u8",
    "int64": "i8",
    "uint64": "u8",
    "double": "f8",
    "float64": "f8",
}

_TOKEN = re.compile(r"\s*(?:(//[^\n]*)|([A-Za-z_][A-Za-z0-9_.]*)|(-?\d+)|(.))", re.S)


@dataclass(frozen=True)
class FieldType:
    """A field's type: base is a scalar, 'string', or a struct/table/union/enum name."""

    base: str
    vector: bool = False


@dataclass
class StructField:
    name: str
    type: str  # scalar or struct name (enums resolved to their scalar)
    offset: int = 0
    size: int = 0


@dataclass
class StructDef:
    name: str
    fields: list[StructField] = field(default_factory=list)
    size: int = 0
    alignment: int = 1


@dataclass
class TableField:
    name: str
    type: FieldType
    slot: int  # vtable slot; unions take two (the _type slot then the value slot)
    default: int | float | bool = 0  # value of an absent scalar field


@dataclass
class TableDef:
    name: str
    fields: list[TableField] = field(default_factory=list)


@dataclass
class Schema:
    enums: dict[str, tuple[str, dict[str, int]]]  # name -> (underlying scalar, members)
    unions: dict[str, list[str]]  # name -> member tables, type code = position + 1
    structs: dict[str, StructDef]
    tables: dict[str, TableDef]

    def scalar_of(self, name: str) -> str | None:
        """The scalar type a name stands for (itself, or an enum's underlying type)."""
        if name in SCALAR_SIZES:
            return name
        if name in self.enums:
            return self.enums[name][0]
        return None

    def numpy_dtype(self, struct_name: str) -> np.dtype:
        """The little-endian numpy dtype with exactly the struct's FlatBuffers layout."""
        struct = self.structs[struct_name]
        names, formats, offsets = [], [], []
        for f in struct.fields:
            names.append(f.name)
            scalar = self.scalar_of(f.type)
            formats.append("<" + NUMPY_CODES[scalar] if scalar else self.numpy_dtype(f.type))
            offsets.append(f.offset)
        return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": struct.size})


def _tokens(text: str) -> list[str]:
    out = []
    for m in _TOKEN.finditer(text):
        comment, ident, number, punct = m.groups()
        if comment is not None:
            continue
        tok = ident or number or punct
        if tok and not tok.isspace():
            out.append(tok)
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.pos = 0

    def peek(self) -> str | None:
        return self.toks[self.pos] if self.pos < len(self.toks) else None

    def next(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ValueError("unexpected end of schema")
        self.pos += 1
        return tok

    def expect(self, tok: str) -> None:
        got = self.next()
        if got != tok:
            raise ValueError(f"schema: expected {tok!r}, got {got!r}")

    def skip_attributes(self) -> None:
        if self.peek() == "(":
            while self.next() != ")":
                pass

    def field_type(self) -> FieldType:
        if self.peek() == "[":
            self.next()
            base = self.next()
            self.expect("]")
            return FieldType(base, vector=True)
        return FieldType(self.next())


def parse_schema(text: str) -> Schema:
    p = _Parser(text)
    enums: dict[str, tuple[str, dict[str, int]]] = {}
    unions: dict[str, list[str]] = {}
    raw_structs: dict[str, list[tuple[str, str]]] = {}
    raw_tables: dict[str, list[tuple[str, FieldType, str | None]]] = {}
    while (tok := p.peek()) is not None:
        p.next()
        if tok in ("namespace", "root_type", "file_identifier", "include", "attribute"):
            while p.next() != ";":
                pass
        elif tok == "enum":
            name = p.next()
            p.expect(":")
            underlying = p.next()
            p.skip_attributes()
            p.expect("{")
            members: dict[str, int] = {}
            value = 0
            while (t := p.next()) != "}":
                if t == ",":
                    continue
                if p.peek() == "=":
                    p.next()
                    value = int(p.next())
                members[t] = value
                value += 1
            enums[name] = (underlying, members)
        elif tok == "union":
            name = p.next()
            p.expect("{")
            unions[name] = [t for t in iter(p.next, "}") if t != ","]
        elif tok in ("struct", "table"):
            name = p.next()
            p.skip_attributes()
            p.expect("{")
            fields = []
            while p.peek() != "}":
                fname = p.next()
                p.expect(":")
                ftype = p.field_type()
                default = None
                if p.peek() == "=":
                    p.next()
                    default = p.next()
                p.skip_attributes()
                p.expect(";")
                fields.append((fname, ftype, default))
            p.expect("}")
            if tok == "struct":
                raw_structs[name] = [(n, t.base) for n, t, _ in fields]
            else:
                raw_tables[name] = fields
        else:
            raise ValueError(f"schema: unexpected token {tok!r}")

    schema = Schema(enums, unions, {}, {})
    for name, sfields in raw_structs.items():
        schema.structs[name] = _layout_struct(schema, name, sfields, raw_structs)
    for name, tfields in raw_tables.items():
        table = TableDef(name)
        slot = 0
        for fname, ftype, default in tfields:
            if ftype.base in unions and not ftype.vector:
                slot += 1  # the hidden <name>_type slot
            value = _default_value(enums, ftype.base, default)
            table.fields.append(TableField(fname, ftype, slot, value))
            slot += 1
        schema.tables[name] = table
    return schema


def _default_value(enums: dict[str, tuple[str, dict[str, int]]], base: str, literal: str | None) -> int | float | bool:
    if literal is None:
        return False if base == "bool" else 0
    if literal in ("true", "false"):
        return literal == "true"
    if base in enums and literal in enums[base][1]:
        return enums[base][1][literal]
    return float(literal) if "." in literal else int(literal)


def _layout_struct(
    schema: Schema, name: str, fields: list[tuple[str, str]], raw: dict[str, list[tuple[str, str]]]
) -> StructDef:
    if name in schema.structs:
        return schema.structs[name]
    struct = StructDef(name)
    offset = 0
    for fname, ftype in fields:
        scalar = schema.scalar_of(ftype)
        if scalar:
            size = align = SCALAR_SIZES[scalar]
        else:
            inner = _layout_struct(schema, ftype, raw[ftype], raw)
            schema.structs[ftype] = inner
            size, align = inner.size, inner.alignment
        offset = (offset + align - 1) // align * align
        struct.fields.append(StructField(fname, ftype, offset, size))
        offset += size
        struct.alignment = max(struct.alignment, align)
    struct.size = (offset + struct.alignment - 1) // struct.alignment * struct.alignment
    return struct


@functools.cache
def load_schema() -> Schema:
    """The parsed replayfmt/schema.fbs (parsed once per process)."""
    return parse_schema(SCHEMA_PATH.read_text(encoding="utf-8"))
