"""The program's memory as the translator follows it: allocations and frees of every API a
framework uses (cuMemAlloc*, stream-ordered pools, virtual memory management, pinned, registered
and managed memory), kept in the shared :class:`AllocationTable`.

Virtual memory management: a buffer covers a contiguous run of pieces mapped into one reserved
range (see :class:`MappedRanges`); when the run grows or shrinks its allocation ends and a new one
begins (the new one is snapshotted whole at its first touch, so a tensor that spans two pieces
stays inside one buffer).

Host-visible memory (pinned, registered, managed): kernels reach it through the addresses the
program holds, and the host may change it with no driver call in between, so before every
launch that uses it its contents are read again and uploaded when they changed
(:meth:`StartingState.touch_for_launch <replayfmt.capture.starting_state.StartingState.touch_for_launch>`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replayfmt.capture import events as ev

if TYPE_CHECKING:
    from replayfmt.capture.allocations import Allocation, AllocationTable, Extent
    from replayfmt.capture.checkpoints import Checkpoints
    from replayfmt.capture.regions import Region
    from replayfmt.writer import CaptureWriter


class ProgramMemory:
    """Allocation events: what they add to and remove from the table; a free destroys the
    allocation's Buffer object in the open region, after a checkpoint of what the region wrote."""

    def __init__(
        self, allocations: AllocationTable, writer: CaptureWriter, region: Region, checkpoints: Checkpoints
    ) -> None:
        self._allocations = allocations
        self._writer = writer
        self._region = region
        self._checkpoints = checkpoints

    def on_allocation(self, event: ev.Allocation) -> None:
        self._allocated(self._allocations.add(event.address, event.size, event.api, event.call))

    def _allocated(self, allocation: Allocation) -> None:
        """An allocation the program made now: inside a named region, none of its bytes are the
        program's data when the region began (its state is flagged so: STATE_FLAG_UNDEFINED)."""
        if self._region.recording and self._region.named:
            allocation.created_in = self._region.number

    def on_free(self, event: ev.Free) -> None:
        held = self._allocations.find(event.address)
        if held is not None and held.address == event.address:  # what the region wrote into it, before it goes
            self._checkpoints.released(held, None, f"before {event.call}")
        allocation = self._allocations.remove(event.address)
        if allocation is not None and allocation.buffer and self._region.recording:
            self._writer.destroy(allocation.buffer)
        alias = self._allocations.device_aliases.pop(event.address, None)
        if alias is not None:
            self.on_free(ev.Free(alias, event.call))

    def on_host_device_pointer(self, event: ev.HostDevicePointer) -> None:
        """Registered host memory whose device address differs from its host address: kernels
        reach it there, so that range is the allocation they use (its bytes are the same)."""
        host = self._allocations.find(event.host)
        if host is None or host.api == ev.MemoryApi.DEVICE or event.device == event.host:
            return
        base = event.device - (event.host - host.address)
        if self._allocations.device_aliases.get(host.address) != base:
            self._allocations.device_aliases[host.address] = base
            self._allocations.add(base, host.size, host.api, event.call)

    def on_address_reserved(self, event: ev.AddressReserved) -> None:
        self._allocations.mapped.reserve(event.address, event.size)

    def on_address_freed(self, event: ev.AddressFreed) -> None:
        self._allocations.mapped.release(event.address)

    def on_mapped(self, event: ev.Mapped) -> None:
        self._replace_extents(*self._allocations.mapped.map(event.address, event.size), event.call)

    def on_unmapped(self, event: ev.Unmapped) -> None:
        self._replace_extents(*self._allocations.mapped.unmap(event.address, event.size), event.call)

    def _replace_extents(self, ended: list[Extent], began: list[Extent], call: str) -> None:
        for address, _size in ended:
            self.on_free(ev.Free(address, call))
        for address, size in began:
            self._allocated(self._allocations.add(address, size, ev.MemoryApi.DEVICE, call))
