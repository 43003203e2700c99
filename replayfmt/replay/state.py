"""Starting state (format 1.1 ``State`` operations), hoisted: before the region that begins at an
operation, its state is set on the legacy stream joined with every captured stream, between two
timed events, so that a run can leave that interval out of the program's device time."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from replayfmt.cuda.driver import check
from replayfmt.format import model as m
from replayfmt.replay.devices import Devices
from replayfmt.replay.plan import upload_key
from replayfmt.replay.staging import Staged
from replayfmt.replay.streams import Streams


@dataclass(frozen=True)
class PoisonWrite:
    """Bytes written over ``buffer`` at ``offset`` right after its region's starting state is set
    (verification's poisoned replays: docs/VERIFY.md)."""

    buffer: int
    offset: int
    data: bytes


class StateSetter:
    """Applies a region's starting state; remembers the timed events of what it applied since
    :meth:`begin` so that :meth:`elapsed_ms` can say how long setting it took."""

    def __init__(self, devices: Devices, streams: Streams, staged: dict[Any, Staged], addresses: dict[int, int]):
        self.devices = devices
        self.streams = streams
        self.staged = staged
        self.addresses = addresses
        self._events: dict[int, tuple[Any, Any]] = {}  # region start -> events around its state
        self.applied: list[tuple[Any, Any]] = []  # since the repetition began
        # region start -> bytes written over ranges once its state is set (poisoned replays)
        self.poison: dict[int, list[PoisonWrite]] = {}
        self._poison_hosts: list[Any] = []  # host copies of the poison, alive while copies may run

    def begin(self) -> None:
        """A repetition starts: nothing applied yet (the previous one has finished its copies)."""
        self.applied = []
        self._poison_hosts = []

    def apply(self, index: int, copies: list[m.Copy]) -> None:
        """Set the starting state of the region beginning at operation ``index``: after all work
        before it, before any of its own."""
        cu = self.devices.cu
        self.devices.use(0)  # its events and the legacy stream it joins belong to the first device
        events = self._events.get(index)
        if events is None:
            events = self._events[index] = (
                check(cu.cuEventCreate(0), f"operation {index} (state): cuEventCreate"),
                check(cu.cuEventCreate(0), f"operation {index} (state): cuEventCreate"),
            )
            for event in events:
                self.devices.own(lambda e=event: cu.cuEventDestroy(e))
        self.streams.join(events[0])
        for copy in copies:
            source = self.staged[upload_key(copy)]
            fn = source.copy_call(cu)
            target = self.addresses[copy.dst_buffer] + copy.dst_offset
            check(fn(target, source.address, copy.size, self.streams.timing_stream), f"operation {copy.index} (state)")
        for write in self.poison.get(index, ()):
            host = (ctypes.c_char * len(write.data)).from_buffer_copy(write.data)
            self._poison_hosts.append(host)
            target = self.addresses[write.buffer] + write.offset
            where = f"operation {index} (poisoning buffer {write.buffer} at byte {write.offset})"
            check(
                cu.cuMemcpyHtoDAsync(target, ctypes.addressof(host), len(write.data), self.streams.timing_stream), where
            )
        self.streams.fork(events[1])
        self.applied.append(events)

    def elapsed_ms(self) -> float:
        """Device time spent setting state since :meth:`begin` (call after synchronising)."""
        cu = self.devices.cu
        return sum(check(cu.cuEventElapsedTime(a, b), "cuEventElapsedTime") for a, b in self.applied)
