"""A SnapshotDevice over host memory, for testing the snapshot pipeline on the CPU.

Device memory is a dict of base address -> bytearray; "pinned" memory is ctypes buffers; copies
are queued and land only when a marker after them is waited for (as on a real stream), so a
pipeline that reads a slot before waiting sees stale bytes and fails its test.
"""

from __future__ import annotations

import ctypes
from typing import Any

from replayfmt.format.payloads import frame_hash


class FakeDevice:
    def __init__(self, *, can_hash: bool = True) -> None:
        self.memory: dict[int, bytearray] = {}
        self.can_hash = can_hash
        self.synchronized: list[int | None] = []
        self.hashed: list[tuple[int, int]] = []
        self.copies: list[tuple[int, int]] = []  # (device address, size) of every copy
        self.queued: list[tuple[int, int, int]] = []
        self.pinned_buffers: dict[int, Any] = {}
        self.freed: list[int] = []

    def read(self, address: int, size: int) -> bytes:
        for base, data in self.memory.items():
            if base <= address and address + size <= base + len(data):
                return bytes(data[address - base : address - base + size])
        raise AssertionError(f"read of unknown device memory {address:#x}+{size}")

    def synchronize(self, stream: int | None) -> None:
        self.synchronized.append(stream)

    def digests(self, frames: list[tuple[int, int]]) -> list[bytes] | None:
        if not self.can_hash:
            return None
        self.hashed += frames
        return [frame_hash(self.read(a, n)) for a, n in frames]

    def copy(self, host: int, address: int, size: int) -> None:
        assert any(base <= host and host + size <= base + len(buf) for base, buf in self.pinned_buffers.items())
        self.copies.append((address, size))
        self.queued.append((host, address, size))

    def mark(self) -> int:
        return len(self.queued)

    def wait(self, marker: int) -> None:
        for host, address, size in self.queued[:marker]:
            ctypes.memmove(host, self.read(address, size), size)
        self.queued = self.queued[marker:]

    def pinned(self, size: int) -> tuple[int, memoryview]:
        buffer = (ctypes.c_char * size)()
        address = ctypes.addressof(buffer)
        self.pinned_buffers[address] = buffer
        return address, memoryview(buffer).cast("B")

    def free_pinned(self, address: int) -> None:
        self.freed.append(address)

    def close(self) -> None:
        pass
