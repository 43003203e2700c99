"""The recorder's half of format/host_waits.py: a launch of a kernel that waits for the host is
marked LAUNCH_FLAG_HOST_RELEASED when its semaphore pointer points into pinned host memory, and the
report counts what it marked."""

from __future__ import annotations

import struct

from replayfmt.capture import events as ev
from replayfmt.capture.allocations import AllocationTable
from replayfmt.capture.report import Report
from replayfmt.format import model as m
from replayfmt.format.host_waits import host_wait

_WORD = struct.Struct("<Q")


def host_released(kernel: str, parameters: bytes, allocations: AllocationTable, report: Report) -> int:
    """LAUNCH_FLAG_HOST_RELEASED when this launch of ``kernel`` waits for a host write (counted in
    ``report.host_waits``), else 0."""
    wait = host_wait(kernel)
    if wait is None or len(parameters) < wait.semaphore_offset + 8:
        return 0
    allocation = allocations.kernel_allocation(_WORD.unpack_from(parameters, wait.semaphore_offset)[0])
    if allocation is None or allocation.api != ev.MemoryApi.HOST_PINNED:
        return 0  # a kernel of that name on device memory: not the wait we know
    report.host_waits.append(wait.what)
    return m.LAUNCH_FLAG_HOST_RELEASED
