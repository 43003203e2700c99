"""Replay allocations by memory kind: device memory, pinned host memory that kernels read
through its device address, and managed memory, each as the captured program had it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from replayfmt.cuda.driver import check
from replayfmt.format import model as m

_HOSTALLOC_PORTABLE, _HOSTALLOC_DEVICEMAP = 0x01, 0x02  # CU_MEMHOSTALLOC_*
_ATTACH_GLOBAL = 0x1  # CU_MEM_ATTACH_GLOBAL


def allocate(cu: Any, kind: m.MemoryKind, size: int, what: str) -> tuple[int, Callable[[], Any]]:
    """Allocate ``size`` bytes of ``kind`` in the current context: (device address, its free)."""
    if kind == m.MemoryKind.HOST_PINNED:
        host = check(
            cu.cuMemHostAlloc(size, _HOSTALLOC_PORTABLE | _HOSTALLOC_DEVICEMAP), f"{what}: cuMemHostAlloc({size})"
        )
        device = check(cu.cuMemHostGetDevicePointer(host, 0), f"{what}: cuMemHostGetDevicePointer")
        return int(device), lambda: cu.cuMemFreeHost(host)
    if kind == m.MemoryKind.MANAGED:
        ptr = check(cu.cuMemAllocManaged(size, _ATTACH_GLOBAL), f"{what}: cuMemAllocManaged({size})")
        return int(ptr), lambda: cu.cuMemFree(ptr)
    ptr = check(cu.cuMemAlloc(size), f"{what}: cuMemAlloc({size})")
    return int(ptr), lambda: cu.cuMemFree(ptr)
