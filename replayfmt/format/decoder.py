"""Verified decoding of FlatBuffers records.

The Python ``flatbuffers`` package has no verifier: its accessors trust every offset (negative
ones wrap, string slices truncate silently, out-of-range ones raise struct.error). So replayfmt
never hands file bytes to generated accessors. :func:`decode_buffer` walks a buffer against the
parsed schema (replayfmt/schema.fbs), checks every offset, vtable, vector, string (bounds, NUL
terminator, UTF-8) and union before using it, bounds the nesting depth, and returns plain values.

Budget (docs/FORMAT.md §5.1): every table, vector or string reached costs one object and every
value produced costs its bytes, charged at each reference; a chunk may spend ``Limits``'
``decode_expansion`` x its body (+64 KiB) in bytes and one object per 4 bytes of body. A table,
vector or string reached through an offset seen before is not decoded again: the value decoded
the first time is reused (and charged again), so offsets shared many times over cost neither
work nor memory beyond the budget. Long vectors of plain tables (200k event objects) are walked
column by column with numpy: the same checks, values and charges (anything else: table by
table), kept as columns (a :class:`TableRows`) until a row is asked for. The values:

* table      -> dict of field name -> value (absent scalars take the schema default)
* scalar     -> int / bool / float
* string     -> str
* struct     -> bytes (the struct's raw little-endian bytes)
* [struct]   -> StructVector (raw bytes + count; read it with numpy and the schema's dtype)
* [scalar]   -> numpy array (little-endian, read-only)
* [string]   -> list of str;  [table] -> list of dict, or a TableRows (a sequence of the same
                dicts, made on first access, whose ``columns`` hold the values field by field)
* union      -> (member table name, dict), or None, or ("?", type code) for a member this
                reader does not know (written by a newer minor version)
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from replayfmt.errors import ReplayFormatError
from replayfmt.format.layout import DEFAULT_LIMITS, Limits
from replayfmt.format.schema import NUMPY_CODES, SCALAR_SIZES, Schema, TableDef, load_schema
from replayfmt.format.table_columns import TableRows, UnionColumn, gathered, scalar_column

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_STRUCT_CODES = {
    "u1": "B",
    "i1": "b",
    "u2": "H",
    "i2": "h",
    "u4": "I",
    "i4": "i",
    "u8": "Q",
    "i8": "q",
    "f4": "f",
    "f8": "d",
}
_SCALAR_STRUCTS = {name: struct.Struct("<" + _STRUCT_CODES[code]) for name, code in NUMPY_CODES.items()}


@dataclass(frozen=True, slots=True)
class StructVector:
    """A verified vector of fixed-size structs: ``count`` records of ``struct`` in ``data``."""

    struct: str
    data: bytes
    count: int

    def to_numpy(self, dtype: np.dtype) -> np.ndarray:
        return np.frombuffer(self.data, dtype=dtype, count=self.count)


class _Failure(Exception):
    def __init__(self, pos: int, what: str) -> None:
        self.pos = pos
        self.what = what


class _Decoder:
    def __init__(self, buf: bytes, schema: Schema, max_depth: int, limits: Limits) -> None:
        self.buf = buf
        self.n = len(buf)
        self.schema = schema
        self.max_depth = max_depth
        self.bytes_left = limits.decode_expansion * self.n + (64 << 10)
        self.objects_left = min(limits.max_decode_objects, self.n // 4 + 64)
        # (position, type) -> (value, bytes it cost): shared offsets are decoded once
        self.memo: dict[tuple[int, str], tuple[Any, int]] = {}
        # kind -> the positions of its memo entries: a vector's tables are checked against them
        # in one pass, however much was decoded before
        self.memo_positions: dict[str, set[int]] = {}
        # table name -> position -> (TableRows, row) of the tables walked by column: their memo,
        # filled from ``unindexed`` (positions in row order, TableRows) only when the kind is next
        # looked up or checked against (most never are: no entry per table)
        self.walked: dict[str, dict[int, tuple[TableRows, int]]] = {}
        self.unindexed: dict[str, list[tuple[list[int], TableRows]]] = {}
        self.caps = limits.vector_caps()
        self.compiled: dict[str, Any] = compile_tables() if schema is load_schema() else {}
        self.layouts: dict[tuple[int, str], tuple[int, ...]] = {}  # (vtable, table) -> layout()

    def u32(self, pos: int) -> int:
        if pos < 0 or pos + 4 > self.n:
            raise _Failure(pos, "offset out of bounds")
        return _U32.unpack_from(self.buf, pos)[0]

    def charge(self, pos: int, nbytes: int, objects: int = 1) -> None:
        self.bytes_left -= nbytes
        self.objects_left -= objects
        if self.bytes_left < 0:
            raise _Failure(pos, "decoding produces more than the decode budget allows (shared offsets amplify it)")
        if self.objects_left < 0:
            raise _Failure(pos, "too many references (shared offsets amplify the work)")

    def layout(self, pos: int, vtable: int, table: str, fields: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
        """A vtable checked once for the compiled tables (FlatBuffers share one vtable among tables
        alike: 200k objects, a few vtables): (table size, then per (slot, size) of ``fields`` its
        offset in the table, 0 when absent, -1 when it lies outside the table, which the table's
        function raises when it reaches that field, as the schema walk does). Raises what the
        schema walk raises for the vtable itself, naming the table at ``pos``."""
        buf, n = self.buf, self.n
        if vtable < 0 or vtable % 2 or vtable + 4 > n:
            raise _Failure(pos, f"{table} vtable offset out of bounds")
        vsize, tsize = _U16.unpack_from(buf, vtable)[0], _U16.unpack_from(buf, vtable + 2)[0]
        if vsize < 4 or vsize % 2 or vtable + vsize > n:
            raise _Failure(vtable, f"{table} vtable size {vsize} invalid")
        if tsize < 4:
            raise _Failure(pos, f"{table} table size {tsize} out of bounds")
        offsets = [tsize]
        for slot, size in fields:
            entry = 4 + 2 * slot
            voff = _U16.unpack_from(buf, vtable + entry)[0] if entry < vsize else 0
            offsets.append(-1 if voff and (voff < 4 or voff + size > tsize) else voff)
        layout = self.layouts[(vtable, table)] = tuple(offsets)
        return layout

    def check_count(self, pos: int, table: str, name: str) -> None:
        """A vector whose element count ``Limits`` caps: refused before any element is decoded."""
        most, limit = self.caps[(table, name)]
        count = self.u32(pos)
        if count > most:
            raise _Failure(pos, f"{table}.{name} declares {count} elements, over Limits.{limit} ({most})")

    def shared(self, pos: int, kind: str, decode: Any, *args: Any) -> Any:
        """``decode(*args)``, the value at ``pos``, once; later references reuse it and are charged
        its cost (no closure per call: a large capture's objects are 200k tables)."""
        key = (pos, kind)
        hit = self.memo.get(key)
        if hit is None and kind in self.walked:
            found = self._walked(kind).get(pos)
            hit = None if found is None else (found[0][found[1]], 0)  # a row: it cost no bytes
        if hit is not None:
            self.charge(pos, hit[1])
            return hit[0]
        before = self.bytes_left
        self.charge(pos, 0)
        value = decode(*args)
        self.memo[key] = (value, before - self.bytes_left)
        self.memo_positions.setdefault(kind, set()).add(pos)
        return value

    def _walked(self, kind: str) -> dict[int, tuple[TableRows, int]]:
        """The tables of ``kind`` walked by column, by position: each vector indexed once, when
        first needed (work in proportion to the tables, however many lookups there are)."""
        index = self.walked[kind]
        for positions, rows in self.unindexed.pop(kind, ()):
            index.update(zip(positions, zip(repeat(rows), range(len(positions)))))
        return index

    def table(self, pos: int, table: TableDef, depth: int) -> dict[str, Any]:
        if depth > self.max_depth:
            raise _Failure(pos, f"tables nested deeper than {self.max_depth}")
        return self.shared(pos, table.name, self._table, pos, table, depth)

    def _table(self, pos: int, table: TableDef, depth: int) -> dict[str, Any]:
        compiled = self.compiled.get(table.name)
        return compiled(self, pos, depth) if compiled is not None else self._table_by_schema(pos, table, depth)

    def _table_by_schema(self, pos: int, table: TableDef, depth: int) -> dict[str, Any]:
        """The reference walk of a table, field by field from the schema (:func:`compile_tables`
        makes the same walk into one function per table: what a decode runs)."""
        buf = self.buf
        if pos % 4 or pos + 4 > self.n:
            raise _Failure(pos, f"{table.name} table offset out of bounds or misaligned")
        vtable = pos - _I32.unpack_from(buf, pos)[0]
        if vtable < 0 or vtable % 2 or vtable + 4 > self.n:
            raise _Failure(pos, f"{table.name} vtable offset out of bounds")
        vsize = _U16.unpack_from(buf, vtable)[0]
        tsize = _U16.unpack_from(buf, vtable + 2)[0]
        if vsize < 4 or vsize % 2 or vtable + vsize > self.n:
            raise _Failure(vtable, f"{table.name} vtable size {vsize} invalid")
        if tsize < 4 or pos + tsize > self.n:
            raise _Failure(pos, f"{table.name} table size {tsize} out of bounds")

        def field_pos(slot: int, size: int) -> int | None:
            entry = 4 + 2 * slot
            if entry >= vsize:
                return None
            voff = _U16.unpack_from(buf, vtable + entry)[0]
            if voff == 0:
                return None
            if voff < 4 or voff + size > tsize:
                raise _Failure(pos, f"{table.name} field slot {slot} lies outside its table")
            return pos + voff

        schema = self.schema
        out: dict[str, Any] = {}
        for f in table.fields:
            base = f.type.base
            if f.type.vector:
                fp = field_pos(f.slot, 4)
                if fp is not None and (table.name, f.name) in self.caps:
                    self.check_count(fp + self.u32(fp), table.name, f.name)
                out[f.name] = None if fp is None else self.vector(fp + self.u32(fp), base, depth)
            elif base in schema.unions:
                tp = field_pos(f.slot - 1, 1)
                vp = field_pos(f.slot, 4)
                code = _U8.unpack_from(buf, tp)[0] if tp is not None else 0
                members = schema.unions[base]
                if code == 0:
                    out[f.name] = None
                elif vp is None:
                    raise _Failure(pos, f"{table.name}.{f.name} has a type but no value")
                elif code <= len(members):
                    member = members[code - 1]
                    value = self.table(vp + self.u32(vp), schema.tables[member], depth + 1)
                    out[f.name] = (member, value)
                else:
                    out[f.name] = ("?", code)
            elif base == "string":
                fp = field_pos(f.slot, 4)
                out[f.name] = "" if fp is None else self.string(fp + self.u32(fp))
            elif base in schema.tables:
                fp = field_pos(f.slot, 4)
                out[f.name] = None if fp is None else self.table(fp + self.u32(fp), schema.tables[base], depth + 1)
            elif base in schema.structs:
                size = schema.structs[base].size
                fp = field_pos(f.slot, size)
                if fp is not None:
                    self.charge(fp, size, 0)
                out[f.name] = None if fp is None else bytes(buf[fp : fp + size])
            else:
                scalar = schema.scalar_of(base)
                if scalar is None:
                    raise _Failure(pos, f"schema type {base} unknown to the decoder")
                fp = field_pos(f.slot, SCALAR_SIZES[scalar])
                if fp is None:
                    out[f.name] = f.default
                else:
                    value = _SCALAR_STRUCTS[scalar].unpack_from(buf, fp)[0]
                    out[f.name] = bool(value) if scalar == "bool" else value
        return out

    # -- tables column by column -----------------------------------------------------------------
    # A vector of many tables of one plain kind (200k event objects: an id, no label, an Event
    # body of two scalars) is walked column by column with numpy: every check the table-by-table
    # walk makes, made on all the tables at once, and the same values and charges; remembered as
    # the memo remembers a table (self.walked), without an entry per table.
    # Anything it does not handle, or any check that fails, returns None: the vector is then
    # walked table by table, which decodes it or raises what is wrong, where.

    def _tables_by_column(self, data: int, count: int, table: TableDef, depth: int) -> TableRows | None:
        slots = np.frombuffer(self.buf, "<u4", count=count, offset=data).astype(np.int64)
        decoded: list[tuple[list[int], str, TableRows]] = []  # (positions, table, values) to remember
        out = self._tables_at(data + 4 * np.arange(count, dtype=np.int64) + slots, table, depth, decoded)
        tables = sum(len(values) for _, _, values in decoded)
        if out is None or self.objects_left - tables < 0:
            return None  # (over the budget: the walk raises it at the table where it runs out)
        self.objects_left -= tables  # one object a table, as the walk charges it, and no bytes
        for positions, name, values in decoded:
            self.walked.setdefault(name, {})
            self.unindexed.setdefault(name, []).append((positions, values))
        return out

    def _tables_at(
        self, pos: np.ndarray, table: TableDef, depth: int, decoded: list[tuple[list[int], str, TableRows]]
    ) -> TableRows | None:
        """The tables at ``pos`` decoded as the compiled walk decodes each, or None; each table
        decoded is added to ``decoded`` (charged and remembered only once all of them are)."""
        name, n, count = table.name, self.n, len(pos)
        walk = self.compiled.get(name)
        if walk is None or depth > self.max_depth or name not in _plain_tables() or not table.fields:
            return None
        if not _distinct(pos) or bool(((pos % 4) != 0).any()) or bool((pos + 4 > n).any()):
            return None
        positions = pos.tolist()
        remembered = self.memo_positions.get(name)
        walked = self._walked(name) if name in self.walked else {}
        if (remembered and not remembered.isdisjoint(positions)) or not walked.keys().isdisjoint(positions):
            return None  # referenced before (by the walk or by column): the walk charges it as a repeat
        words = np.frombuffer(self.buf, "<i4", count=n // 4)
        vtables = pos - words[pos // 4]
        if bool((vtables == vtables[0]).all()):  # tables alike share one vtable: the usual case
            distinct, which = vtables[:1], np.zeros(count, np.int64)
        else:
            distinct, which = np.unique(vtables, return_inverse=True)
        layouts = []
        for k, vtable in enumerate(distinct.tolist()):
            layout = self.layouts.get((vtable, name))
            if layout is None:
                try:
                    layout = self.layout(int(pos[int(np.argmax(which == k))]), vtable, name, walk.fields)
                except _Failure:
                    return None
            if min(layout[1:], default=0) < 0:
                return None  # a field outside its table: the walk raises it
            layouts.append(layout)
        grid = np.array(layouts, dtype=np.int64)[which.ravel()]  # per table: its size, then each field's offset
        if bool((pos + grid[:, 0] > n).any()):
            return None
        raw = np.frombuffer(self.buf, np.uint8)
        columns: list[list[Any] | UnionColumn] = []
        at = 1  # the layout's column of the next field read
        for f in table.fields:
            base = f.type.base
            if base == "string":
                if bool(grid[:, at].any()):
                    return None  # a label present: strings are walked table by table
                columns.append([""] * count)
                at += 1
            elif base in self.schema.unions:
                column = self._union_column(raw, pos, grid[:, at], grid[:, at + 1], base, depth, decoded)
                if column is None:
                    return None
                columns.append(column)
                at += 2
            else:
                scalar = self.schema.scalar_of(base)
                values = scalar_column(raw, pos, grid[:, at], scalar, f.default)
                columns.append([bool(v) for v in values] if scalar == "bool" else values)
                at += 1
        out = TableRows(name, dict(zip((f.name for f in table.fields), columns, strict=True)), count)
        decoded.append((positions, name, out))
        return out

    def _union_column(
        self,
        raw: np.ndarray,
        pos: np.ndarray,
        type_at: np.ndarray,
        value_at: np.ndarray,
        union: str,
        depth: int,
        decoded: list[tuple[list[int], str, TableRows]],
    ) -> UnionColumn | None:
        """A union field of the tables at ``pos`` (its type and value fields' offsets), or None."""
        members = self.schema.unions[union]
        codes = np.where(type_at > 0, raw[pos + type_at], 0)
        if bool(((codes > 0) & (value_at == 0)).any()):
            return None  # a type but no value: the walk raises it
        column = UnionColumn(len(pos), np.flatnonzero(codes == 0).tolist())
        present = np.flatnonzero(np.bincount(codes.astype(np.int64), minlength=1))  # codes are bytes: no sort
        for code in present[present > 0].tolist():
            chosen = np.flatnonzero(codes == code)
            if code > len(members):
                column.unknown += [(k, code) for k in chosen.tolist()]
                continue
            slot = pos[chosen] + value_at[chosen]
            member = self.schema.tables[members[code - 1]]
            where = slot + gathered(raw, slot, "u4").astype(np.int64)
            tables = self._tables_at(where, member, depth + 1, decoded)
            if tables is None:
                return None
            column.members[member.name] = (chosen.tolist(), tables)
        return column

    def string(self, pos: int) -> str:
        return self.shared(pos, "string", self._string, pos)

    def _string(self, pos: int) -> str:
        length = self.u32(pos)
        end = pos + 4 + length
        if end + 1 > self.n:
            raise _Failure(pos, f"string of {length} bytes runs past the buffer")
        self.charge(pos, length, 0)
        if self.buf[end] != 0:
            raise _Failure(end, "string is not NUL-terminated")
        try:
            return bytes(self.buf[pos + 4 : end]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Failure(pos, f"string is not valid UTF-8 ({exc.reason})") from None

    def vector(self, pos: int, base: str, depth: int) -> Any:
        return self.shared(pos, "[" + base + "]", self._vector, pos, base, depth)

    def _vector(self, pos: int, base: str, depth: int) -> Any:
        count = self.u32(pos)
        data = pos + 4
        schema = self.schema
        if base == "string" or base in schema.tables:
            esize = 4
        elif base in schema.structs:
            esize = schema.structs[base].size
        else:
            scalar = schema.scalar_of(base)
            if scalar is None:
                raise _Failure(pos, f"schema type {base} unknown to the decoder")
            esize = SCALAR_SIZES[scalar]
        end = data + count * esize
        if end > self.n:
            raise _Failure(pos, f"vector of {count} x {esize} bytes runs past the buffer")
        self.charge(pos, count * esize, 0)
        if base == "string":
            return [self.string(data + 4 * i + self.u32(data + 4 * i)) for i in range(count)]
        if base in schema.tables:
            table = schema.tables[base]
            if count >= _COLUMNS_FROM and self.compiled:
                walked = self._tables_by_column(data, count, table, depth + 1)
                if walked is not None:
                    return walked
            return [self.table(data + 4 * i + self.u32(data + 4 * i), table, depth + 1) for i in range(count)]
        if base in schema.structs:
            return StructVector(base, bytes(self.buf[data:end]), count)
        array = np.frombuffer(self.buf, dtype="<" + NUMPY_CODES[scalar], count=count, offset=data)
        return array


_COLUMNS_FROM = 32  # table vectors at least this long are tried column by column first


def _distinct(pos: np.ndarray) -> bool:
    """No position twice (a builder lays a vector's tables out in order: sorted is the quick answer)."""
    steps = np.diff(pos)
    return bool((steps < 0).all() or (steps > 0).all()) or len(np.unique(pos)) == len(pos)


@functools.cache
def _plain_tables() -> frozenset[str]:
    """The schema's tables walked by column: every field a scalar, a string or a union (whose
    members are walked by column in turn, or the whole vector table by table)."""
    schema = load_schema()
    return frozenset(
        table.name
        for table in schema.tables.values()
        if all(
            not f.type.vector
            and (f.type.base == "string" or f.type.base in schema.unions or schema.scalar_of(f.type.base) is not None)
            for f in table.fields
        )
    )


@functools.cache
def compile_tables() -> dict[str, Any]:
    """One decoding function per table of replayfmt/schema.fbs, ``f(decoder, pos, depth) -> dict``:
    the walk of ``_Decoder._table_by_schema`` unrolled field by field (the same checks, in the same
    order, with the same messages), made once per process. A capture may hold 200k objects of a
    few fields each, and the generic walk spends most of its time deciding what each field is."""
    schema = load_schema()
    names: dict[str, Any] = {"_Failure": _Failure, "_U8": _U8.unpack_from, "_U16": _U16.unpack_from}
    names["_I32"] = _I32.unpack_from
    source: list[str] = []
    for table in schema.tables.values():
        source += _table_source(schema, table, names)
    code = compile("\n".join(source), "<replayfmt.format.decoder: compiled tables>", "exec")
    exec(code, names)  # source made above from the parsed schema, never from a file's bytes
    for name in schema.tables:  # the (slot, size) of each field read: the layout cache's key part
        names[f"_t_{name}"].fields = names[f"_F_{name}"]
    return {name: names[f"_t_{name}"] for name in schema.tables}


def _table_source(schema: Schema, table: TableDef, names: dict[str, Any]) -> list[str]:
    """The lines of one table's decoding function (``names``: the constants it reads, filled in)."""
    t = table.name
    lines = [
        f"def _t_{t}(d, pos, depth):",
        "    buf = d.buf; n = d.n",
        "    if pos % 4 or pos + 4 > n:",
        f"        raise _Failure(pos, {t + ' table offset out of bounds or misaligned'!r})",
        "    vtable = pos - _I32(buf, pos)[0]",
        f"    layout = d.layouts.get((vtable, {t!r}))",
        "    if layout is None:",
        f"        layout = d.layout(pos, vtable, {t!r}, _F_{t})",
        "    tsize = layout[0]",
        "    if pos + tsize > n:",
        f"        raise _Failure(pos, f'{t} table size {{tsize}} out of bounds')",
        "    out = {}",
    ]
    fields: list[tuple[int, int]] = []  # (vtable slot, size) of each field position read, in order

    def field_pos(var: str, slot: int, size: int) -> None:  # var = the field's position, or None
        fields.append((slot, size))
        lines.extend(
            [
                f"    voff = layout[{len(fields)}]",
                "    if voff < 0:",
                f"        raise _Failure(pos, {f'{t} field slot {slot} lies outside its table'!r})",
                f"    {var} = pos + voff if voff else None",
            ]
        )

    for k, f in enumerate(table.fields):
        base, key = f.type.base, repr(f.name)
        if f.type.vector:
            field_pos("fp", f.slot, 4)
            if (t, f.name) in DEFAULT_LIMITS.vector_caps():  # the same fields whatever the limits
                lines += ["    if fp is not None:", f"        d.check_count(fp + d.u32(fp), {t!r}, {key})"]
            lines.append(f"    out[{key}] = None if fp is None else d.vector(fp + d.u32(fp), {base!r}, depth)")
        elif base in schema.unions:
            field_pos("tp", f.slot - 1, 1)
            field_pos("vp", f.slot, 4)
            members = schema.unions[base]
            names[f"_M_{t}_{k}"] = tuple(members)
            names[f"_MT_{t}_{k}"] = tuple(schema.tables[mem] for mem in members)
            lines += [
                "    code = _U8(buf, tp)[0] if tp is not None else 0",
                "    if code == 0:",
                f"        out[{key}] = None",
                "    elif vp is None:",
                f"        raise _Failure(pos, {f'{t}.{f.name} has a type but no value'!r})",
                f"    elif code <= {len(members)}:",
                f"        member = d.table(vp + d.u32(vp), _MT_{t}_{k}[code - 1], depth + 1)",
                f"        out[{key}] = (_M_{t}_{k}[code - 1], member)",
                "    else:",
                f"        out[{key}] = ('?', code)",
            ]
        elif base == "string":
            field_pos("fp", f.slot, 4)
            lines.append(f"    out[{key}] = '' if fp is None else d.string(fp + d.u32(fp))")
        elif base in schema.tables:
            names[f"_T_{t}_{k}"] = schema.tables[base]
            field_pos("fp", f.slot, 4)
            lines.append(f"    out[{key}] = None if fp is None else d.table(fp + d.u32(fp), _T_{t}_{k}, depth + 1)")
        elif base in schema.structs:
            size = schema.structs[base].size
            field_pos("fp", f.slot, size)
            lines += [
                "    if fp is not None:",
                f"        d.charge(fp, {size}, 0)",
                f"    out[{key}] = None if fp is None else bytes(buf[fp : fp + {size}])",
            ]
        else:
            scalar = schema.scalar_of(base)
            if scalar is None:
                lines.append(f"    raise _Failure(pos, {f'schema type {base} unknown to the decoder'!r})")
                continue
            names[f"_S_{t}_{k}"] = _SCALAR_STRUCTS[scalar].unpack_from
            names[f"_D_{t}_{k}"] = f.default
            field_pos("fp", f.slot, SCALAR_SIZES[scalar])
            value = f"_S_{t}_{k}(buf, fp)[0]"
            value = f"bool({value})" if scalar == "bool" else value
            lines.append(f"    out[{key}] = _D_{t}_{k} if fp is None else {value}")
    lines += ["    return out", ""]
    names[f"_F_{t}"] = tuple(fields)
    return lines


def decode_buffer(
    buf: bytes,
    root_table: str,
    *,
    max_depth: int,
    limits: Limits = DEFAULT_LIMITS,
    path: str | None = None,
    offset: int | None = None,
    record: str = "record",
    compiled: bool = True,
) -> dict[str, Any]:
    """Verify ``buf`` as a FlatBuffer rooted at ``root_table`` and return its decoded root table.

    ``limits`` sets the decoding budget (its ``decode_expansion`` and ``max_decode_objects``).
    Raises ReplayFormatError naming ``offset`` (the file offset of the chunk the buffer came
    from) and the byte position inside the (decompressed) buffer where the problem lies.
    ``compiled=False`` walks each table field by field from the schema instead of through
    :func:`compile_tables`: the reference the compiled walk is tested against.
    """
    schema = load_schema()
    decoder = _Decoder(buf, schema, max_depth, limits)
    if not compiled:
        decoder.compiled = {}
    try:
        if len(buf) < 8:
            raise _Failure(0, "buffer too small for a FlatBuffer")
        return decoder.table(decoder.u32(0), schema.tables[root_table], 0)
    except _Failure as failure:
        raise ReplayFormatError(
            failure.what, path=path, offset=offset, record=f"{record}, byte {failure.pos} of its body"
        ) from None
