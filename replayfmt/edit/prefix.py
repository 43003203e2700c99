"""Buffer contents the capture does not hold, produced on a GPU: replay every operation before the
extracted range (the prefix), read the buffers the range uses, replay the range, read them again.
Used only where :mod:`replayfmt.edit.shadow` finds bytes the capture cannot give.

**Narrowing.** A launch's footprint is whole buffers (a pointer says where a tensor starts, not
where it ends), and a framework's allocation holds many tensors: a caching-allocator segment of
20 MiB for one 4 MiB input. So the kept bytes of each buffer are narrowed to the bytes the work
changed (found by comparing it before and after) plus, for each pointer into it, a window from
the pointer's target to the next pointer target in that buffer anywhere in the capture (tier 1;
4 KiB where there is none) or to the buffer's end (tier 2). A choice is used only when the work,
run again from the kept bytes with every other byte of its buffers set to zero, leaves exactly the
same bytes in every kept range: all buffers at tier 2 first (else whole buffers, always right),
then each buffer lowered to tier 1 alone. Buffers that hold pointers (relocation sites) are never
narrowed, so the zeroed run never follows a zeroed pointer. The kept bytes become the extract's
state and checkpoint; the other bytes are undefined there (docs/FORMAT.md 4.2).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

from replayfmt.cuda.driver import check
from replayfmt.edit.shadow import merge, runs
from replayfmt.edit.snapshots import Narrowing, Ranges, Snapshots
from replayfmt.execute import open_replay
from replayfmt.format.layout import DEFAULT_LIMITS, Limits
from replayfmt.replay.options import ReplayOptions
from replayfmt.replay.plan_options import PlanOptions
from replayfmt.replay.steps import StepKind

_GRAIN = 256  # changed bytes are kept in 256-byte aligned pieces (the recorder's widening)


def changed_ranges(before: np.ndarray, after: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) ranges where two byte arrays differ, widened to 256-byte pieces."""
    diff = before != after
    if not diff.any():
        return []
    pieces = np.zeros((len(diff) + _GRAIN - 1) // _GRAIN, bool)
    np.logical_or.at(pieces, np.flatnonzero(diff) // _GRAIN, True)
    return [(lo * _GRAIN, min(len(diff), hi * _GRAIN)) for lo, hi in runs(pieces)]


class DeviceBuffers:
    """The replay's buffers as host arrays, and the two ways to move them."""

    def __init__(self, replayer: Any) -> None:
        self.r = replayer

    def read(self, buffer: int, size: int) -> np.ndarray:
        return np.frombuffer(self.r.read_back(buffer, 0, size), np.uint8)

    def write(self, buffer: int, data: np.ndarray) -> None:
        host = np.ascontiguousarray(data)
        if host.size:
            pointer = host.ctypes.data_as(ctypes.c_void_p).value
            check(self.r.cu.cuMemcpyHtoD(self.r.addresses[buffer], pointer, host.size), f"restoring buffer {buffer}")


def replay_snapshots(
    path: str | os.PathLike[str],
    first: int,
    last: int,
    reads: Ranges,
    writes: Ranges,
    plan_options: PlanOptions | None = None,
    *,
    narrowing: Narrowing | None = None,
    sizes: dict[int, int] | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> Snapshots:
    """Replay the capture at ``path`` up to operation ``first`` (exclusive) and then ``first..last``;
    the bytes of ``reads`` before and of ``writes`` after, or (with ``narrowing`` and the buffers'
    ``sizes``) of the narrowed ranges of both. The starting state of the region holding ``first``
    is set before the first read, as a replay sets it before the range. Needs a GPU."""
    out = Snapshots()
    with open_replay(path, plan_options or PlanOptions(), limits=limits) as session:
        replayer = session.start(ReplayOptions())
        out.device = replayer.device_name

        def before_range(operation: int, kind: StepKind) -> bool:
            # a region's hoisted state carries its first operation's index: it belongs before the
            # range even when the range begins the region
            return operation < first or (kind == StepKind.STATE and operation == first)

        prefix = [s for s in replayer.steps if before_range(s.operation, s.kind)]
        body = [s for s in replayer.steps if not before_range(s.operation, s.kind) and s.operation <= last]
        replayer.execute_steps(prefix)
        replayer.synchronize()
        if narrowing is None or sizes is None:
            out.before = {(b, lo, hi): replayer.read_back(b, lo, hi - lo) for b, rs in reads.items() for lo, hi in rs}
            replayer.execute_steps(body)
            replayer.synchronize()
            out.after = {(b, lo, hi): replayer.read_back(b, lo, hi - lo) for b, rs in writes.items() for lo, hi in rs}
            return out
        dev = DeviceBuffers(replayer)
        used = sorted(set(reads) | set(writes))
        before = {b: dev.read(b, sizes[b]) for b in used}
        replayer.execute_steps(body)
        replayer.synchronize()
        after = {b: dev.read(b, sizes[b]) for b in used}
        changed = {b: changed_ranges(before[b], after[b]) for b in used}
        kept, out.narrowed = narrow_kept(dev, replayer, body, narrowing, before, after, changed, reads, writes)
        out.before = {(b, lo, hi): before[b][lo:hi].tobytes() for b in used for lo, hi in kept[b] if b in reads}
        out.after = {(b, lo, hi): after[b][lo:hi].tobytes() for b in used for lo, hi in kept[b]}
    return out


def narrow_kept(
    dev: DeviceBuffers,
    replayer: Any,
    body: list[Any],
    narrowing: Narrowing,
    before: dict[int, np.ndarray],
    after: dict[int, np.ndarray],
    changed: Ranges,
    reads: Ranges,
    writes: Ranges,
) -> tuple[Ranges, str]:
    """Per buffer, the narrowest tier with which a zeroed rerun reproduces every kept byte: all
    buffers at the widest tier first, then each buffer lowered alone (whole buffers when even the
    widest tier fails)."""
    whole = {b: [(0, len(before[b]))] for b in before}

    def ranges(b: int, level: int) -> list[tuple[int, int]]:
        if b in narrowing.whole:
            return whole[b]
        # copies and memsets name exact ranges; launches get the tier's windows; what changed
        exact = [r for r in (reads.get(b, []) + writes.get(b, [])) if r != (0, len(before[b]))]
        return merge([*narrowing.tiers[level].get(b, []), *changed[b], *exact])

    def reproduces(kept: Ranges) -> bool:
        for b in before:
            staged = np.zeros_like(before[b])
            for lo, hi in kept[b]:
                staged[lo:hi] = before[b][lo:hi]
            dev.write(b, staged)
        replayer.synchronize()
        replayer.execute_steps(body)
        replayer.synchronize()
        again = {b: dev.read(b, len(before[b])) for b in before}
        return all(np.array_equal(again[b][lo:hi], after[b][lo:hi]) for b in before for lo, hi in kept[b])

    if not narrowing.tiers:
        return whole, ""
    widest = len(narrowing.tiers) - 1
    kept = {b: ranges(b, widest) for b in before}
    if kept != whole and not reproduces(kept):  # whole buffers need no check: they are the replay's own
        return whole, "whole buffers (no narrower choice reproduced the work)"
    for b in before:
        for level in range(widest):
            trial = {**kept, b: ranges(b, level)}
            if trial[b] != kept[b] and reproduces(trial):
                kept = trial
                break
    if kept == whole:
        return whole, ""
    kept_bytes = sum(hi - lo for rs in kept.values() for lo, hi in rs)
    total = sum(len(v) for v in before.values())
    return kept, f"{kept_bytes} of {total} bytes of the buffers it uses, validated by a rerun with the rest zeroed"
