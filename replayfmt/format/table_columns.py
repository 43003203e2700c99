"""The values of a column walk (replayfmt.format.decoder): a long vector of plain tables decoded
with numpy, field by field, kept as columns until a row is asked for.

A capture may hold 200k event objects; a dict per table, and another per event body, cost more
than the walk itself, and a reader that wants the columns (object_records.decode_objects) needs none.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np

from replayfmt.format.schema import NUMPY_CODES


class TableRows(Sequence[dict[str, Any]]):
    """A vector of tables walked column by column: a sequence of the dicts the table walk gives
    (made once, on first access), and ``columns``, field name -> the field's values in row order
    (a list, or a :class:`UnionColumn`), for a reader that wants them without a dict per row (a
    capture's 200k event objects)."""

    __slots__ = ("_rows", "columns", "length", "table")

    def __init__(self, table: str, columns: dict[str, list[Any] | UnionColumn], length: int) -> None:
        self.table = table
        self.columns = columns
        self.length = length
        self._rows: list[dict[str, Any]] | None = None

    def rows(self) -> list[dict[str, Any]]:
        if self._rows is None:
            values = [c.values() if isinstance(c, UnionColumn) else c for c in self.columns.values()]
            self._rows = row_builder(tuple(self.columns))(*values)
        return self._rows

    def __len__(self) -> int:
        return self.length

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        return self.rows()[index]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TableRows | list):
            return self.rows() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a sequence of dicts, as a list is

    def __repr__(self) -> str:
        return f"TableRows({self.table}, {self.length} rows)"


@dataclass(slots=True)
class UnionColumn:
    """A union field of tables walked by column: ``members``, member table name -> (the rows
    holding that member, its tables at those rows); ``absent`` rows have none (None) and
    ``unknown`` ones a member this reader does not know, (row, type code)."""

    count: int
    absent: list[int]
    members: dict[str, tuple[list[int], TableRows]] = field(default_factory=dict)
    unknown: list[tuple[int, int]] = field(default_factory=list)

    def values(self) -> list[Any]:
        """The field's value per row, as the table walk gives it: (member, dict), None or ("?", code)."""
        values: list[Any] = [None] * self.count
        for name, (rows, tables) in self.members.items():
            for k, table in zip(rows, tables.rows(), strict=True):
                values[k] = (name, table)
        for k, code in self.unknown:
            values[k] = ("?", code)
        return values


@functools.cache
def row_builder(keys: tuple[str, ...]) -> Any:
    """``f(*columns) -> [dict per row]`` of one table's fields: a dict display per row, which
    is four times as fast as ``dict(zip(keys, row))`` (a capture may hold 200k event objects).
    Made from the schema's field names, never from a file's bytes."""
    columns = [f"c{k}" for k in range(len(keys))]
    values = [f"v{k}" for k in range(len(keys))]
    display = ", ".join(f"{key!r}: {value}" for key, value in zip(keys, values, strict=True))
    source = (
        f"def rows({', '.join(columns)}):\n"
        f"    return [{{{display}}} for {', '.join(values)}, in zip({', '.join(columns)}, strict=True)]\n"
    )
    names: dict[str, Any] = {}
    exec(compile(source, "<replayfmt.format.table_columns: table rows>", "exec"), names)
    return names["rows"]


def gathered(raw: np.ndarray, at: np.ndarray, code: str) -> np.ndarray:
    """The little-endian values of numpy type ``code`` at each of ``at`` (any alignment)."""
    cells = np.ascontiguousarray(raw[at[:, None] + np.arange(np.dtype(code).itemsize)])
    return cells.view("<" + code).ravel()


def scalar_column(raw: np.ndarray, pos: np.ndarray, offsets: np.ndarray, scalar: str, default: Any) -> list[Any]:
    """A scalar field of tables at ``pos`` whose field offsets are ``offsets`` (0: absent, the default)."""
    present = offsets > 0
    values: list[Any] = [default] * len(pos)
    if bool(present.any()):
        read = gathered(raw, (pos + offsets)[present], NUMPY_CODES[scalar]).tolist()
        if bool(present.all()):
            return read
        for k, value in zip(np.flatnonzero(present).tolist(), read, strict=True):
            values[k] = value
    return values
