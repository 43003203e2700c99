"""Two sequences of kernel names aligned as ``diff --patience`` aligns lines, in bounded time.

``difflib.SequenceMatcher`` (no junk heuristic) looks at every pair of equal elements: two
captures of 20,000 launches of one kernel cost it minutes. Here a common prefix and suffix are
matched first (two captures of one program are mostly that: linear), then the names that occur
exactly once on each side of the stretch between them anchor it (their longest increasing
subsequence, ``n log n``), and the stretches between anchors are aligned the same way, at most
``MAX_DEPTH`` levels down. A stretch with no anchor left goes to difflib when it is small
(``SMALL``), else it is handed back as ``replace``: the diff pairs the k-th launch of a name on
each side there (diff.align), which is linear too.
"""

from __future__ import annotations

import bisect
import difflib
from collections.abc import Sequence

MAX_DEPTH = 32  # levels of anchoring; below it a stretch is left to the k-th-occurrence pairing
SMALL = 1 << 18  # a stretch without anchors of at most this many pairs of positions goes to difflib

Opcode = tuple[str, int, int, int, int]  # ("equal" | "replace", i1, i2, j1, j2), as difflib's


def opcodes(a: Sequence[str], b: Sequence[str]) -> list[Opcode]:
    """``a[i1:i2]`` and ``b[j1:j2]`` equal or to be replaced, covering both sequences in order
    (a ``replace`` may have one side empty: inserted or removed launches)."""
    out: list[Opcode] = []
    # iterative (no recursion limit): a stack of pieces in reverse order, each to emit ("equal",
    # "replace") or to align ("align", at a depth); the one on top is always the next in order
    stack: list[tuple[str, int, int, int, int, int]] = [("align", 0, len(a), 0, len(b), 0)]
    while stack:
        what, i1, i2, j1, j2, depth = stack.pop()
        if what != "align":
            out.append((what, i1, i2, j1, j2))
            continue
        head = 0
        while i1 + head < i2 and j1 + head < j2 and a[i1 + head] == b[j1 + head]:
            head += 1
        out.append(("equal", i1, i1 + head, j1, j1 + head))
        i1, j1 = i1 + head, j1 + head
        tail = 0
        while i2 - tail > i1 and j2 - tail > j1 and a[i2 - tail - 1] == b[j2 - tail - 1]:
            tail += 1
        pieces: list[tuple[str, int, int, int, int, int]] = []
        anchors = _anchored(a, b, i1, i2 - tail, j1, j2 - tail) if depth < MAX_DEPTH else []
        ci, cj = i1, j1
        for ai, bj in anchors:
            pieces.append(("align", ci, ai, cj, bj, depth + 1))
            pieces.append(("equal", ai, ai + 1, bj, bj + 1, 0))
            ci, cj = ai + 1, bj + 1
        if anchors:
            pieces.append(("align", ci, i2 - tail, cj, j2 - tail, depth + 1))
        else:
            pieces += _small(a, b, ci, i2 - tail, cj, j2 - tail)
        pieces.append(("equal", i2 - tail, i2, j2 - tail, j2, 0))
        stack.extend(reversed(pieces))
    return _merged(out)


def _small(
    a: Sequence[str], b: Sequence[str], i1: int, i2: int, j1: int, j2: int
) -> list[tuple[str, int, int, int, int, int]]:
    """A stretch without anchors: difflib's longest matching blocks where it is small enough for
    their quadratic search (SMALL), else all of it replaced."""
    if (i2 - i1) * (j2 - j1) > SMALL or i1 == i2 or j1 == j2:
        return [("replace", i1, i2, j1, j2, 0)]
    matcher = difflib.SequenceMatcher(None, a[i1:i2], b[j1:j2], autojunk=False)
    return [
        (tag if tag == "equal" else "replace", i1 + x1, i1 + x2, j1 + y1, j1 + y2, 0)
        for tag, x1, x2, y1, y2 in matcher.get_opcodes()
    ]


def _anchored(a: Sequence[str], b: Sequence[str], i1: int, i2: int, j1: int, j2: int) -> list[tuple[int, int]]:
    """(i, j) of names unique on both sides of the stretches, in an order both keep (the longest
    increasing subsequence of their positions on the right)."""
    if i1 >= i2 or j1 >= j2:
        return []
    left: dict[str, int] = {}
    for i in range(i1, i2):
        left[a[i]] = -1 if a[i] in left else i
    right: dict[str, int] = {}
    for j in range(j1, j2):
        right[b[j]] = -1 if b[j] in right else j
    common = [(i, right[a[i]]) for i in range(i1, i2) if left[a[i]] == i and right.get(a[i], -1) >= 0]
    if not common:
        return []
    # longest increasing subsequence of the right positions (patience sorting)
    tails: list[int] = []  # right position ending the best run of each length
    ends: list[int] = []  # index into common of that run's last element
    back = [-1] * len(common)
    for k, (_, j) in enumerate(common):
        at = bisect.bisect_left(tails, j)
        back[k] = ends[at - 1] if at else -1
        if at == len(tails):
            tails.append(j)
            ends.append(k)
        else:
            tails[at], ends[at] = j, k
    chain = []
    k = ends[-1]
    while k >= 0:
        chain.append(common[k])
        k = back[k]
    return chain[::-1]


def _merged(ops: list[Opcode]) -> list[Opcode]:
    """Adjacent pieces of one tag joined, empty ones dropped."""
    out: list[Opcode] = []
    for tag, i1, i2, j1, j2 in ops:
        if i1 == i2 and j1 == j2:
            continue
        if out and out[-1][0] == tag and out[-1][2] == i1 and out[-1][4] == j1:
            out[-1] = (tag, out[-1][1], i2, out[-1][3], j2)
        else:
            out.append((tag, i1, i2, j1, j2))
    return out
