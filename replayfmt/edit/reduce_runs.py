"""Runs of equal values over the bytes of a buffer (who wrote each byte last, where its value is
kept), for reduce-replay: a launch that writes a 64 GiB arena costs one run, not 64 GiB of values."""

from __future__ import annotations

import bisect


class RunMap:
    """An int for every byte of ``[0, size)``, kept as sorted runs (who wrote each byte last)."""

    __slots__ = ("_starts", "_values", "size")

    def __init__(self, size: int, value: int) -> None:
        self.size = size
        self._starts = [0]
        self._values = [value]

    def _split(self, at: int) -> int:
        k = bisect.bisect_right(self._starts, at) - 1
        if self._starts[k] != at:
            self._starts.insert(k + 1, at)
            self._values.insert(k + 1, self._values[k])
            k += 1
        return k

    def set(self, lo: int, hi: int, value: int) -> None:
        lo, hi = max(0, lo), min(self.size, hi)
        if lo >= hi:
            return
        first = self._split(lo)
        last = self._split(hi) if hi < self.size else len(self._starts)
        self._starts[first:last] = [lo]
        self._values[first:last] = [value]

    def pieces(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
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
