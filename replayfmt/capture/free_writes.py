"""What a named region wrote into memory its framework calls free: a step's dropped result (JAX
frees an array the program drops with no driver call and no hook), and its temporaries.

XLA's arena and PyTorch's caching-allocator segments stay mapped when the framework frees a
buffer, and keep its bytes until a later buffer is placed there. Their starting state holds only
the buffers live when the region began (:mod:`live_buffers`), and their checkpoints only those
live when it ends: a result the program drops was compared nowhere. At a named region's end the
translator takes, in each framework allocation the region touched, the bytes its launches pointed
into outside every buffer live at its start or end: from each pointer to the next pointer or live
buffer, at most :data:`FREE_WRITE_TAIL` bytes (a pointer says where a kernel writes, not how far).
Such a range held none of the program's data when the region began, so its starting state is the
recorder's choice: the bytes the region left there, written as state flagged
``STATE_FLAG_UNDEFINED`` (format 1.6) with a checkpoint of the same bytes. Verification then
replays it poisoned (docs/VERIFY.md): the bytes the region writes over the poison are proven,
the rest (a tail past the buffer's end) are unchanged by the region and prove nothing.

PyTorch's frees are heard (its GPU trace: ``release_block``), so its blocks are compared as the
step's dropped results exactly and its temporaries are let go; these free writes are for the
frameworks whose frees the recorder does not hear (``Translator.frees_heard``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import TypeVar

FREE_WRITE_TAIL = 4 << 20  # past its last pointer, a free write runs at most this far
MAX_FREE_WRITE_BYTES = 1 << 30  # a capture's free writes in all (each is read from the device and stored)
T = TypeVar("T")


def merged(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """(offset, size) spans, sorted and joined where they meet or overlap."""
    out: list[tuple[int, int]] = []
    for start, size in sorted(s for s in spans if s[1] > 0):
        if out and start <= out[-1][0] + out[-1][1]:
            last_start, last_size = out[-1]
            out[-1] = (last_start, max(last_size, start + size - last_start))
        else:
            out.append((start, size))
    return out


def free_spans(
    pointers: Sequence[int], size: int, live: Sequence[tuple[int, int]], tail: int = FREE_WRITE_TAIL
) -> list[tuple[int, int]]:
    """The (offset, size) spans of an allocation of ``size`` bytes that launches pointed into
    (``pointers``: offsets in it) outside the ``live`` spans: from each pointer to the next
    pointer, the next live span or the allocation's end, at most ``tail`` bytes; sorted, joined
    where they meet."""
    live = merged(live)
    starts = [start for start, _ in live]
    bounds = sorted({*pointers, *starts, size})
    spans = []
    for p in sorted(set(pointers)):
        if not 0 <= p < size:
            continue
        i = bisect.bisect_right(starts, p) - 1
        if i >= 0 and p < live[i][0] + live[i][1]:
            continue  # inside a live buffer: compared (or set) as that buffer
        end = min(bounds[bisect.bisect_right(bounds, p)], p + tail)
        spans.append((p, end - p))
    return merged(spans)


def within_budget(candidates: list[tuple[int, T, int, int]], budget: int) -> tuple[list[tuple[T, int, int]], int]:
    """Of ``candidates`` (recency, holder, offset, size), the most recently pointed at first, those
    that fit in ``budget`` bytes; and how many did not."""
    kept, dropped = [], 0
    for _, holder, offset, size in sorted(candidates, key=lambda c: -c[0]):
        if size <= budget:
            kept.append((holder, offset, size))
            budget -= size
        else:
            dropped += 1
    return kept, dropped
