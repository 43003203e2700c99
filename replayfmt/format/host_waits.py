"""Kernels that wait for the host: they spin on a word in pinned host memory until the program
writes a release value there from the CPU (or a timeout passes). A replay runs no such host code,
so each would spin to its timeout and be timed as the program's work.

The one known today is XLA's autotuner ``DelayKernel`` (xla/stream_executor/cuda/
delay_kernel_cuda.cu.cc): ``DelayKernel(volatile GpuSemaphoreState* semaphore, GpuSemaphoreState
target)``, one thread, launched before the autotuner's start event so that the candidates it times
are all queued before any runs. It reads ``*semaphore`` until it equals ``target`` (``kRelease``,
1), which the host writes once it has queued the timed work, or until about 100 ms of clock cycles
pass; on a timeout it writes ``kTimedOut`` (2) into the semaphore, for the host to warn about. The
semaphore is a 4-byte pinned allocation of its own (``GpuSemaphore::Create``). So the kernel
writes no device memory and no other kernel reads its semaphore: its one effect on the work after
it is the wait, which lasted in the program only as long as the host took to queue that work.
A replay therefore skips it (writing the release first would still launch a kernel and time it).

The recorder marks a launch it recognises (by the demangled name, and the semaphore parameter
pointing into pinned host memory) with ``LAUNCH_FLAG_HOST_RELEASED``; the replay skips launches
so marked, and those of captures recorded before the mark by the same two checks.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

from replayfmt.format.names import demangle


class HostWait(NamedTuple):
    """A kernel known to wait for a host write: what it is, where its semaphore pointer lies in
    the parameter block, and the value the host writes to release it."""

    what: str  # as reports name it: "XLA autotuner delay kernel"
    semaphore_offset: int  # byte offset of the pointer to the semaphore in the parameters
    release: int  # the value the host writes (XLA's GpuSemaphoreState::kRelease)


XLA_DELAY_KERNEL = HostWait("XLA autotuner delay kernel", 0, 1)
# demangled; the raw symbol where no demangler is present (ROCm's variant takes two more words)
_KNOWN: tuple[tuple[re.Pattern[str], HostWait], ...] = (
    (
        re.compile(r"^stream_executor::(?:[\w()\s]+::)*DelayKernel\(stream_executor::GpuSemaphoreState"),
        XLA_DELAY_KERNEL,
    ),
    (re.compile(r"^_ZN15stream_executor.*11DelayKernelEPVNS_17GpuSemaphoreState"), XLA_DELAY_KERNEL),
)


@functools.lru_cache(maxsize=4096)
def host_wait(symbol: str) -> HostWait | None:
    """The known host wait ``symbol`` (a kernel's mangled name) is, or None."""
    if "DelayKernel" not in symbol:  # every known one: one substring test on the launch path
        return None
    name = demangle(symbol)
    return next((wait for pattern, wait in _KNOWN if pattern.search(name) or pattern.search(symbol)), None)


def released_counts(whats: list[str]) -> str:
    """'3 XLA autotuner delay kernels released' and so on, for reports ('' when none)."""
    counts: dict[str, int] = {}
    for what in whats:
        counts[what] = counts.get(what, 0) + 1
    return ", ".join(f"{n} {what}{'s' if n != 1 else ''} released" for what, n in sorted(counts.items()))
