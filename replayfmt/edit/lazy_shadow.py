"""A :class:`~replayfmt.edit.shadow.Shadow` that reads payload bytes only when they are asked for.

A reduction walks a capture once per candidate, and a kernel-mode capture holds a state and a
checkpoint of every buffer at every launch: the plain shadow reads all of them into memory as it
goes. This one notes, for bytes a payload gives (a state, an upload, a checkpoint), which payload
and where, and reads them when :meth:`read` asks (or a device-to-device copy moves them), so a
walk costs what the candidate gives its work, not what the capture holds.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from replayfmt.edit.run_map import RunMap
from replayfmt.edit.shadow import ByteState, Shadow
from replayfmt.format import model as m

_PAGES = -1  # the bytes are in the shadow's pages (a memset, a copy, set_bytes)


class LazyShadow(Shadow):
    """The same answers as :class:`Shadow`, payload bytes read on demand (see the module docstring)."""

    def __init__(
        self,
        sizes: dict[int, int],
        read_payload: Callable[[int, np.ndarray, int], object],
        lookup: Callable[[int], m.ObjectDef],
    ) -> None:
        super().__init__(sizes, read_payload, lookup)
        self._sources = {b: RunMap(size, _PAGES) for b, size in sizes.items()}
        self._refs: list[tuple[int, int]] = []  # (payload, its offset that the buffer's byte 0 maps to)

    def set_payload(self, buffer: int, offset: int, payload: int, size: int, payload_offset: int = 0) -> None:
        b = self._range(buffer, offset, size)
        if b is None:
            return
        self._refs.append((payload, payload_offset - offset))
        self._sources[buffer].set(offset, offset + size, len(self._refs) - 1)
        b.status.set(offset, offset + size, ByteState.KNOWN)

    def set_bytes(self, buffer: int, offset: int, data: bytes | np.ndarray) -> None:
        super().set_bytes(buffer, offset, data)
        if buffer in self._sources:
            self._sources[buffer].set(offset, offset + len(memoryview(data).cast("B")), _PAGES)

    def memset(self, op: m.Memset) -> None:
        super().memset(op)
        if op.buffer in self._sources:
            self._sources[op.buffer].set(op.offset, op.offset + op.count * op.element_size, _PAGES)

    def _write(self, buffer: int, offset: int, data: np.ndarray) -> None:
        super()._write(buffer, offset, data)
        self._sources[buffer].set(offset, offset + len(data), _PAGES)

    def read(self, buffer: int, offset: int, size: int) -> np.ndarray:
        out = super().read(buffer, offset, size)
        for a, z, ref in self._sources[buffer].pieces(offset, offset + size):
            if ref != _PAGES:
                payload, base = self._refs[ref]
                self._read_payload(payload, out[a - offset : z - offset], base + a)
        return out
