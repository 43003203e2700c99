"""Pointers stored in device memory (format 1.3 data relocations) on replay.

Buffers are allocated at new addresses, so a pointer the program stored in memory (a table of
pointers that a grouped GEMM reads, a linked structure) must hold the replay's address of the
buffer it points into. The capture says where such pointers lie in the bytes that starting state
and uploads write; :func:`relocate_staged` writes the replay's addresses into those staged bytes
once, at setup, so every run uploads them already relocated (no per-run cost).

Checkpoints of such buffers hold the captured addresses: :class:`ReplayedAddresses` lets the
verifier take a word that points into buffer B at offset o in the capture, and into B at o in
the replay, as equal (kernels that build pointer tables on the device write the replay's
addresses too).
"""

from __future__ import annotations

import ctypes

import numpy as np

from replayfmt.cuda.driver import check
from replayfmt.format import model as m
from replayfmt.replay.devices import Devices
from replayfmt.replay.plan import Plan
from replayfmt.replay.staging import Staging


def _runs(values: dict[int, int]) -> list[tuple[int, list[int]]]:
    """Consecutive 8-byte words as (first byte offset, values) runs: one write per run."""
    runs: list[tuple[int, list[int]]] = []
    for offset in sorted(values):
        if runs and runs[-1][0] + 8 * len(runs[-1][1]) == offset:
            runs[-1][1].append(values[offset])
        else:
            runs.append((offset, [values[offset]]))
    return runs


def relocate_staged(devices: Devices, plan: Plan, staging: Staging, addresses: dict[int, int]) -> int:
    """Write the replay's addresses over the stored pointers of every staged upload that holds
    some (device copies, or pinned host memory); the number of pointers written."""
    cu = devices.cu
    written = 0
    for key, (op, _) in plan.uploads.items():
        if not op.relocations:
            continue
        staged = staging.staged[key]
        values = {r.site_offset - op.dst_offset: addresses[r.target_buffer] + r.target_offset for r in op.relocations}
        if staged.on_device:
            devices.use(devices.index(plan.buffers[op.dst_buffer].device))
        for start, words in _runs(values):
            data = np.array(words, dtype="<u8")
            if staged.on_device:
                what = f"operation {op.index} ({op.kind.label}): writing {len(words)} stored pointer(s)"
                check(cu.cuMemcpyHtoD(staged.address + start, data.ctypes.data, data.nbytes), what)
            else:
                ctypes.memmove(staged.address + start, data.ctypes.data, data.nbytes)
        written += len(values)
    devices.use(0)
    return written


class ReplayedAddresses:
    """Every buffer's captured address range beside its replay address, to recognise pointers in
    expected bytes (see the module docstring)."""

    def __init__(self, buffers: dict[int, m.Buffer], addresses: dict[int, int]) -> None:
        known = [(i, b) for i, b in buffers.items() if b.address and i in addresses]
        rows = sorted((b.address, max(b.size, 1), addresses[i]) for i, b in known)
        self._starts = np.array([r[0] for r in rows], dtype=np.uint64)
        self._ends = np.array([r[0] + r[1] for r in rows], dtype=np.uint64)
        self._replayed = np.array([r[2] for r in rows], dtype=np.uint64)
        self.moved = any(r[0] != r[2] for r in rows)

    def align(self, expected: bytes, actual: bytes, offset: int) -> bytes:
        """``expected`` with each 8-byte word (aligned in its buffer, which starts at ``offset``
        before these bytes) that points into a buffer as captured, where ``actual`` holds the same
        place in the replay's buffer, replaced by the replay's word."""
        if not self.moved or len(expected) != len(actual) or expected == actual:
            return expected
        skip = (-offset) % 8
        count = max(0, (len(expected) - skip) // 8)
        if not count:
            return expected
        want = np.frombuffer(expected, "<u8", count, skip)
        have = np.frombuffer(actual, "<u8", count, skip)
        differ = np.flatnonzero(want != have)
        if not differ.size:
            return expected
        words = want[differ]
        holder = np.searchsorted(self._starts, words, side="right").astype(np.int64) - 1
        inside = holder >= 0
        holder = np.maximum(holder, 0)
        inside &= words < self._ends[holder]
        replayed = words - self._starts[holder] + self._replayed[holder]  # wraps where not inside: masked
        same = inside & (have[differ] == replayed)
        if not same.any():
            return expected
        out = want.copy()
        out[differ[same]] = have[differ[same]]
        return expected[:skip] + out.tobytes() + expected[skip + 8 * count :]
