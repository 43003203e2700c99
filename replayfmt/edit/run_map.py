"""Runs of equal values over the bytes of a buffer (a byte's state, who wrote it last, where its
value is kept): a launch that writes a 64 GiB arena costs one run, not 64 GiB of values."""

from __future__ import annotations

import bisect
from typing import Generic, TypeVar

V = TypeVar("V")


class RunMap(Generic[V]):
    """A value for every byte of ``[0, size)``, kept as sorted runs: run k covers
    ``[starts[k], starts[k + 1])`` (the last: to ``size``)."""

    __slots__ = ("_starts", "_values", "size")
    join = False  # whether a set joins its run with equal neighbours

    def __init__(self, size: int, value: V) -> None:
        self.size = size
        self._starts = [0]
        self._values = [value]

    def _split(self, at: int) -> int:
        """The index of the run that begins at ``at`` (splitting the run holding it)."""
        k = bisect.bisect_right(self._starts, at) - 1
        if self._starts[k] != at:
            self._starts.insert(k + 1, at)
            self._values.insert(k + 1, self._values[k])
            k += 1
        return k

    def set(self, lo: int, hi: int, value: V) -> None:
        lo, hi = max(0, lo), min(self.size, hi)
        if lo >= hi:
            return
        first = self._split(lo)
        last = self._split(hi) if hi < self.size else len(self._starts)
        self._starts[first:last] = [lo]
        self._values[first:last] = [value]
        if self.join:
            if first + 1 < len(self._values) and self._values[first + 1] == value:
                del self._starts[first + 1], self._values[first + 1]
            if first > 0 and self._values[first - 1] == value:
                del self._starts[first], self._values[first]

    def pieces(self, lo: int, hi: int) -> list[tuple[int, int, V]]:
        """(start, end, value) of the runs within ``[lo, hi)``, clipped to it."""
        out = []
        k = max(0, bisect.bisect_right(self._starts, lo) - 1)
        while k < len(self._starts) and self._starts[k] < hi:
            end = self._starts[k + 1] if k + 1 < len(self._starts) else self.size
            a, b = max(lo, self._starts[k]), min(hi, end)
            if a < b:
                out.append((a, b, self._values[k]))
            k += 1
        return out
