"""Launches that repeat: arming a launch for the recorder's C ring, and writing the launches the
ring recorded (:mod:`replayfmt.capture.launch_ring`).

A launch is armed when it repeated the one before it (same arguments, no allocation changed)
and its next repeat would need nothing but its record: every allocation it reaches is device
memory touched in this region, and none holds pointers the kernel may follow. Host-visible
memory is read again at each launch in case the host wrote it, so a launch that reaches it is
never armed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from replayfmt.capture import events as ev
from replayfmt.capture.launch_ring import LAUNCH_FLAGS, ArmedLaunch
from replayfmt.format import model as m
from replayfmt.writer import LaunchTemplate

if TYPE_CHECKING:
    from replayfmt.capture.allocations import Allocation
    from replayfmt.capture.launch_ring import LaunchRing
    from replayfmt.capture.regions import Region
    from replayfmt.capture.report import KernelStats
    from replayfmt.capture.stream_events import Streams
    from replayfmt.writer import CaptureWriter

_FEW_REPEATS = 16  # ring launches written one by one up to this many, at once above


class LaunchRepeats:
    """The translator's half of the launch ring (None where the C library is not built, or in
    kernel mode: then nothing is armed)."""

    def __init__(self, writer: CaptureWriter, ring: LaunchRing | None, region: Region, streams: Streams) -> None:
        self._writer = writer
        self._ring = ring
        self._region = region
        self._streams = streams

    def withdraw(self) -> None:
        """Disarm every launch (what armed them is about to change: a kernel's annotation)."""
        if self._ring is not None:
            self._ring.withdraw()

    def arm(
        self,
        kernel: ev.Kernel,
        function: tuple[int, int],
        parameters: bytes,
        relocations: tuple[m.Relocation, ...],
        targets: list[Allocation],
        stats: KernelStats,
    ) -> None:
        """Arm a launch just written (``function``: its executable and function index) that
        repeated the one before it, when its next repeats need nothing but their records."""
        if self._ring is not None and self._needs_nothing_again(targets):
            self._ring.arm(ArmedLaunch(kernel, LaunchTemplate(*function, parameters, relocations), stats))

    def _needs_nothing_again(self, targets: list[Allocation]) -> bool:
        """Whether a launch on these allocations, repeated now, needs no more than its record:
        every one device memory touched in this region, none holding pointers to follow
        (host-visible memory is read again at each launch, in case the host wrote it)."""
        region = self._region.number
        return all(a.api == ev.MemoryApi.DEVICE and a.region == region and not a.pointees for a in targets)

    def on_repeated_launches(self, event: ev.RepeatedLaunches) -> None:
        """Launches the C library recorded, each a repeat of one armed here, in program order:
        written at once (CaptureWriter.launches)."""
        if not self._region.recording:  # (the recorder takes the ring before a region ends)
            return
        ring = event.launches
        handles, stream_of = np.unique(ring["stream"], return_inverse=True)
        streams = [self._streams.stream(h) for h in handles.tolist()]  # before any launch: new streams' objects first
        if len(ring) <= _FEW_REPEATS:  # one by one: cheaper than setting up the arrays
            launch, first = self._writer.launch, -1
            for at, (_, _, _, grid, block, cluster, shared, flags, _, _, arming) in enumerate(ring.tolist()):
                what = event.armed[arming]
                template = what.template
                index = launch(
                    executable=template.executable,
                    function=template.function,
                    grid=tuple(grid),
                    block=tuple(block),
                    cluster=tuple(cluster),
                    shared_memory=shared,
                    stream=streams[stream_of[at]],
                    parameters=template.parameters,
                    relocations=template.relocations,
                    flags=flags & LAUNCH_FLAGS,
                )
                first = index if first < 0 else first
                what.stats.occurrences += 1
                what.stats.captured += 1
            event.first = first
            return
        arms, which = np.unique(ring["armed"], return_inverse=True)
        armed = [event.armed[int(a)] for a in arms.tolist()]
        shapes = np.empty((len(ring), 12), dtype=np.uint32)
        shapes[:, 0] = np.array(streams, dtype=np.uint32)[stream_of]
        shapes[:, 1] = ring["flags"] & LAUNCH_FLAGS
        shapes[:, 2:5], shapes[:, 5:8], shapes[:, 8:11] = ring["grid"], ring["block"], ring["cluster"]
        shapes[:, 11] = ring["shared_memory"]
        event.first = self._writer.launches([a.template for a in armed], which, shapes)
        for launch, count in zip(armed, np.bincount(which, minlength=len(armed)).tolist(), strict=True):
            launch.stats.occurrences += count
            launch.stats.captured += count
