"""Pointers the program stored in memory: which 8-byte words of captured data (starting state and
host-to-device copies) are addresses inside the program's allocations, so that replay writes the
replay's addresses there (format 1.3 data relocations).

Programs store pointers in device memory: tables of pointers that grouped and batched GEMMs read
(Triton's grouped GEMM, cuBLAS's pointer-array batched calls), MoE routing tables, linked
structures. Replay allocates every buffer at a new address, so such a word must be relocated like
a pointer parameter, or the kernel reads the capture's addresses and faults.

A word is a stored pointer when it is aligned to 8 bytes in its buffer and its value lies inside
a recorded allocation. Data that merely looks like a pointer is the risk, and the rule is the one
kernel parameters inside structs follow (:mod:`parameter_words`): a word whose low half reads as a
small signed integer (or INT32_MIN) may be two 32-bit integers that happen to pair into an address
inside an allocation that spans a 4 GiB boundary; unless it is an allocation's own start, it is
left as captured and reported (``Ambiguity``): the recorder cannot tell, and ``--fixed-addresses``
replays such a capture at its recorded addresses.

Snapshots are content-addressed: a frame the file already holds never crosses the bus again, so
:class:`FrameWords` remembers the candidate words of every frame it saw by the frame's digest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replayfmt.capture.allocations import POINTER_HIGH, POINTER_LOW, Allocation, AllocationTable
from replayfmt.capture.parameter_words import integer_pair
from replayfmt.format import model as m

MAX_POINTERS = 1 << 20  # stored pointers kept per operation: more are reported, not relocated
Word = tuple[int, int]  # (byte offset, value)
_ARENA = 1 << 32  # an allocation this large spans 4 GiB boundaries
_SMALL_HIGH = 1 << 16
_POINTER_DTYPES = frozenset({m.DType.UNKNOWN, m.DType.INT64, m.DType.UINT64})


def candidate_words(data: bytes | memoryview, first: int, *, low: int = POINTER_LOW) -> list[Word]:
    """(byte offset in the buffer, value) of each word of ``data`` aligned to 8 bytes in its
    buffer (``data`` starts at byte ``first`` of it) whose value could be an address: in
    [low, POINTER_HIGH). Floats, small integers and text fall outside; what remains is resolved
    against the allocation table by :func:`resolve`."""
    skip = (-first) % 8
    count = max(0, (len(data) - skip) // 8)
    if not count:
        return []
    words = np.frombuffer(data, "<u8", count, skip)
    hits = np.flatnonzero((words >= np.uint64(low)) & (words < np.uint64(POINTER_HIGH)))
    base = first + skip
    return list(zip((base + 8 * hits).tolist(), words[hits].tolist(), strict=True))


@dataclass(frozen=True, slots=True)
class Ambiguity:
    """A word that points into an allocation or is two small integers: left as captured."""

    site: int  # byte offset in the holding buffer
    value: int
    target: Allocation


@dataclass
class Resolved:
    """What the candidate words of one operation's bytes turned out to be."""

    relocations: list[tuple[int, int, Allocation]]  # (site, offset in the target, target)
    ambiguous: list[Ambiguity]
    dropped: int = 0  # pointers past MAX_POINTERS, left as captured


def resolve(words: list[Word], allocations: AllocationTable, holder: Allocation) -> Resolved:
    """Which candidate words of ``holder``'s bytes point into a recorded allocation (see the
    module docstring). Words inside tensors the framework typed as anything but 64-bit integers
    are data; in an allocation of 4 GiB or more (an arena: XLA's spans tens of GB from
    0x3_0000_0000), any (integer, small integer) pair reads as an address, so a word there whose
    high half is small is ambiguous unless it is the allocation's start."""
    out = Resolved([], [])
    typed = [
        (t.address - holder.address, t.address - holder.address + t.size)
        for t in holder.labels
        if t.dtype not in _POINTER_DTYPES
    ]
    for site, value in words:
        target = allocations.find(value)
        if target is None or any(start <= site < end for start, end in typed):
            continue
        pair = integer_pair(value) or (target.size >= _ARENA and value >> 32 < _SMALL_HIGH)
        if pair and value != target.address:
            out.ambiguous.append(Ambiguity(site, value, target))
        elif len(out.relocations) < MAX_POINTERS:
            out.relocations.append((site, value - target.address, target))
        else:
            out.dropped += 1
    return out


class FrameWords:
    """Candidate words of snapshot frames, remembered by frame digest (frames the file holds are
    never copied again, so their words come from here). Frames never seen are listed in
    ``unseen`` (offset in the snapshot, digest) for the caller to read and :meth:`learn`."""

    def __init__(self, low: int = POINTER_LOW) -> None:
        self.low = low
        self._known: dict[bytes, tuple[Word, ...]] = {}
        self.words: list[Word] = []
        self.unseen: list[tuple[int, bytes]] = []

    def begin(self) -> None:
        """A new snapshot: nothing gathered yet."""
        self.words, self.unseen = [], []

    def learn(self, offset: int, digest: bytes, frame: bytes | memoryview) -> None:
        """The frame at ``offset`` of the snapshot holds ``frame`` (its digest: ``digest``)."""
        words = tuple(candidate_words(frame, 0, low=self.low))
        self._known[digest] = words
        self.words += [(offset + site, value) for site, value in words]

    def visit(self, offset: int, digest: bytes, frame: memoryview | None) -> None:
        """A :data:`~replayfmt.capture.snapshots.FrameVisitor`."""
        if frame is not None:
            self.learn(offset, digest, frame)
            return
        words = self._known.get(digest)
        if words is None:
            self.unseen.append((offset, digest))
        else:
            self.words += [(offset + site, value) for site, value in words]
