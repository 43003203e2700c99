"""Pointers the program stored in memory: which 8-byte words of captured data (starting state and
host-to-device copies) are addresses inside the program's allocations, so that replay writes the
replay's addresses there (format 1.3 data relocations).

Programs store pointers in device memory: tables of pointers that grouped and batched GEMMs read
(Triton's grouped GEMM, cuBLAS's pointer-array batched calls), MoE routing tables, linked
structures. Replay allocates every buffer at a new address, so such a word must be relocated like
a pointer parameter, or the kernel reads the capture's addresses and faults.

A word is a stored pointer when it is aligned to 8 bytes in its buffer and its value lies inside
a recorded allocation. Data that merely looks like a pointer is the risk. A word whose low half
reads as a small signed integer (or INT32_MIN) may be two 32-bit integers that happen to pair into
an address inside an allocation that spans a 4 GiB boundary; unless it is an allocation's own
start, or lies in a tensor the framework typed as 64-bit integers (one integer, not two), it is
left as captured and reported (``Ambiguity``): the recorder cannot tell, and ``--fixed-addresses``
replays such a capture at its recorded addresses. This is stricter than the rule for kernel
parameters (:mod:`parameter_words`), which takes such a word for a pointer where its high half is
2**12 or more and the capture holds, or the launch otherwise reaches, its allocation: a struct's
fields are counts and addresses, while memory holds arbitrary data (a tensor of int32 token ids
pairs into 0x7fxx addresses as often as its ids reach 32,512).

Candidates are the words whose values lie between the lowest and highest recorded address (most
data falls outside: floats have high exponent bits, small integers are below any address), and
they are resolved against the allocation table all at once (numpy), so that data which does
look like addresses (int32 pairs inside a 60 GB arena) costs no Python per word. Snapshots are
content-addressed: a frame the file already holds never crosses the bus again, so
:class:`FrameWords` remembers the candidate words of every frame it saw by the frame's digest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from replayfmt.capture.allocations import Allocation, AllocationTable
from replayfmt.format import model as m
from replayfmt.format.boundaries import SMALL_INT, small_low_halves

MAX_POINTERS = 1 << 20  # stored pointers kept per operation: more are reported, not relocated
_ARENA = 1 << 32  # an allocation this large spans 4 GiB boundaries
_TOP = (1 << 64) - 1
_POINTER_DTYPES = frozenset({m.DType.UNKNOWN, m.DType.INT64, m.DType.UINT64})
_NO_SITES = np.zeros(0, dtype=np.int64)
_NO_VALUES = np.zeros(0, dtype=np.uint64)


@dataclass
class Words:
    """Candidate words: their byte offsets in the buffer and their values (parallel arrays)."""

    sites: np.ndarray = field(default_factory=lambda: _NO_SITES)
    values: np.ndarray = field(default_factory=lambda: _NO_VALUES)

    def __len__(self) -> int:
        return len(self.sites)

    @staticmethod
    def join(parts: list[Words]) -> Words:
        parts = [p for p in parts if len(p)]
        if len(parts) < 2:
            return parts[0] if parts else Words()
        return Words(np.concatenate([p.sites for p in parts]), np.concatenate([p.values for p in parts]))

    def shifted(self, by: int) -> Words:
        return Words(self.sites + by, self.values) if by else self

    def in_spans(self, spans: list[tuple[int, int]]) -> Words:
        """The words whose 8 bytes lie inside one of ``spans`` ((offset, size) in the buffer)."""
        if not spans:
            return Words()
        ordered = sorted(spans)
        starts = np.array([o for o, _ in ordered], dtype=np.int64)
        ends = np.maximum.accumulate(np.array([o + n for o, n in ordered], dtype=np.int64))
        # the spans starting at or before each word: the furthest end among them must cover it
        last = np.searchsorted(starts, self.sites, side="right") - 1
        keep = (last >= 0) & (self.sites + 8 <= ends[np.maximum(last, 0)])
        return self if bool(keep.all()) else Words(self.sites[keep], self.values[keep])

    def within(self, low: int, high: int) -> Words:
        keep = (self.values >= np.uint64(low)) & (self.values < np.uint64(high))
        return self if bool(keep.all()) else Words(self.sites[keep], self.values[keep])


def candidate_words(data: bytes | memoryview, first: int, low: int, high: int) -> Words:
    """The words of ``data`` aligned to 8 bytes in their buffer (``data`` starts at byte ``first``
    of it) whose values lie in [low, high): the span of the recorded allocations. The values are
    copied (``data`` may be a pinned slot about to be reused)."""
    skip = (-first) % 8
    count = max(0, (len(data) - skip) // 8)
    if not count or low >= high:
        return Words()
    words = np.frombuffer(data, "<u8", count, skip)
    hits = np.flatnonzero((words >= np.uint64(low)) & (words < np.uint64(min(high, _TOP))))
    if not hits.size:
        return Words()
    return Words(first + skip + 8 * hits.astype(np.int64), words[hits])


@dataclass
class Resolved:
    """What the candidate words of one operation's bytes turned out to be."""

    relocations: list[tuple[int, int, Allocation]]  # (site, offset in the target, target)
    ambiguous: int = 0  # words that point into an allocation or are two integers: left as captured
    example: tuple[int, int, Allocation] | None = None  # the first of them: (site, value, target)
    dropped: int = 0  # pointers past MAX_POINTERS, left as captured


def resolve(words: Words, allocations: AllocationTable, holder: Allocation) -> Resolved:
    """Which candidate words of ``holder``'s bytes point into a recorded allocation (see the
    module docstring). Words inside tensors the framework typed as anything but 64-bit integers
    are data, and those inside tensors typed as 64-bit integers are never two 32-bit integers; in
    an allocation of 4 GiB or more (an arena: XLA's spans tens of GB from 0x3_0000_0000), any
    (integer, small integer) pair reads as an address, so a word there whose high half is small
    is ambiguous unless it is the allocation's start or typed as a 64-bit integer."""
    if not len(words):
        return Resolved([])
    starts, ends, table = allocations.bounds()
    sites, values = words.sites, words.values
    index = np.searchsorted(starts, values, side="right").astype(np.int64) - 1
    inside = index >= 0
    index = np.maximum(index, 0)
    inside &= values < ends[index] if len(ends) else False
    one_integer = np.zeros(len(sites), dtype=bool)  # words of 64-bit integer tensors
    for tensor in holder.labels:
        start = tensor.address - holder.address
        within = (sites >= start) & (sites < start + tensor.size)
        if tensor.dtype not in _POINTER_DTYPES:
            inside &= ~within
        elif tensor.dtype != m.DType.UNKNOWN:
            one_integer |= within
    sites, values, index, one_integer = sites[inside], values[inside], index[inside], one_integer[inside]
    target_starts = starts[index]
    pair = small_low_halves(values)
    arena = ((ends[index] - target_starts) >= np.uint64(_ARENA)) & ((values >> np.uint64(32)) < np.uint64(SMALL_INT))
    ambiguous = (pair | arena) & ~one_integer & (values != target_starts)
    out = Resolved([], ambiguous=int(ambiguous.sum()))
    if out.ambiguous:
        k = int(np.flatnonzero(ambiguous)[0])
        out.example = (int(sites[k]), int(values[k]), table[int(index[k])])
    good = np.flatnonzero(~ambiguous)
    out.dropped = max(0, len(good) - MAX_POINTERS)
    good = good[:MAX_POINTERS]
    offsets = (values[good] - target_starts[good]).tolist()
    targets = [table[i] for i in index[good].tolist()]
    out.relocations = list(zip(sites[good].tolist(), offsets, targets, strict=True))
    return out


_DENSE = 4  # a frame with more than 1 candidate in this many words (and more than _FEW) is not remembered
_FEW = 4096
_REMEMBERED = 1 << 22  # candidate words remembered across all frames (64 MiB of arrays)


@dataclass
class _Known:
    low: int
    high: int
    words: Words | None  # offsets within the frame; None: too many to remember (read it again)


class FrameWords:
    """Candidate words of snapshot frames, remembered by frame digest (frames the file holds are
    never copied again, so their words come from here). Frames never seen, or seen while the
    recorded allocations spanned less, are listed in ``unseen`` (offset in the snapshot, digest)
    for the caller to read and :meth:`learn`."""

    def __init__(self) -> None:
        self._known: dict[bytes, _Known] = {}
        self._remembered = 0  # candidate words held by _known
        self._parts: list[Words] = []
        self.unseen: list[tuple[int, bytes]] = []
        self.low, self.high = 0, 0

    def begin(self, low: int, high: int) -> None:
        """A new snapshot, with candidates in [low, high) (the recorded allocations' span)."""
        self._parts, self.unseen = [], []
        self.low, self.high = low, high

    def learn(self, offset: int, digest: bytes, frame: bytes | memoryview) -> None:
        """The frame at ``offset`` of the snapshot holds ``frame`` (its digest: ``digest``)."""
        self.learn_words(offset, digest, candidate_words(frame, 0, self.low, self.high), len(frame))

    def learn_words(self, offset: int, digest: bytes, words: Words, length: int) -> None:
        """The frame at ``offset`` (``length`` bytes) holds these candidate words, found elsewhere
        (on the device: the frame never crossed the bus)."""
        # data that looks like addresses (int32 pairs in an arena) is not remembered: memory stays bounded
        few = len(words) <= _FEW or len(words) * _DENSE <= length // 8
        keep = few and self._remembered + len(words) <= _REMEMBERED
        self._known[digest] = _Known(self.low, self.high, words if keep else None)
        self._remembered += len(words) if keep else 0
        self._parts.append(words.shifted(offset))

    def visit(self, offset: int, digest: bytes, frame: memoryview | None) -> None:
        """What a snapshot calls for each frame, in order: ``frame`` its bytes, or None for a frame
        the file holds already (its words then come from an earlier frame of that digest, or the
        frame is listed in ``unseen`` to be read)."""
        if frame is not None:
            self.learn(offset, digest, frame)
            return
        known = self._known.get(digest)
        if known is None or known.words is None or known.low > self.low or known.high < self.high:
            self.unseen.append((offset, digest))
        else:
            self._parts.append(known.words.within(self.low, self.high).shifted(offset))

    def words(self) -> Words:
        """The candidates gathered since :meth:`begin`, offsets from the snapshot's start."""
        return Words.join(self._parts)
