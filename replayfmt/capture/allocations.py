"""The program's live allocations as the recorder sees them: an address-ordered table that finds
the allocation holding an address, asks the driver about allocations made before recording, and
counts its changes (an epoch) so that callers can cache what they resolved against it."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from replayfmt.capture import events as ev
from replayfmt.format import model as m

POINTER_LOW = 1 << 32  # below this an 8-byte parameter word is taken for a number, not an address
POINTER_HIGH = 1 << 57


@dataclass(frozen=True, slots=True)
class TensorLabel:
    """What a framework knows about a tensor: used to type the buffer that holds it."""

    address: int
    size: int
    dtype: m.DType
    shape: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    name: str = ""


@dataclass(frozen=True, slots=True)
class ModuleGlobal:
    """What makes an allocation a module global's storage: its module, its symbol, and the
    bytes a fresh load of the module gives it (None: not known)."""

    module: tuple[str, int]
    symbol: str
    initial: bytes | None = None


@dataclass(eq=False)
class Allocation:
    """One live allocation of the program, and what the capture has written about it."""

    address: int
    size: int
    api: ev.MemoryApi
    call: str
    buffer: int = 0  # object id once written
    device: int = -1  # ordinal of the device whose memory it is (-1: unknown)
    region: int = -1  # the region in which it was last touched
    before: int = 0  # payload of its snapshot in that region (0: defined by the region itself)
    latest: int = 0  # host-visible memory: payload of its contents when last uploaded or read
    labels: list[TensorLabel] = field(default_factory=list)
    # (offset, size) of the live framework buffers its state covered in that region; None: all of it
    state_spans: list[tuple[int, int]] | None = None
    # (offset, size) of the framework buffers live in it when that region began, their own bytes;
    # None: no framework spoke for it then (its state is all of it, or the region wrote all of it)
    start_live: list[tuple[int, int]] | None = None
    live_source: str = ""  # the frameworks that spoke for it then ("jax", "torch", "jax+torch")
    created_in: int = -1  # the named region during which the program made it (its bytes were none of its data)
    # allocations its captured bytes point into (pointers stored in it), by address: a kernel that
    # reads it may follow them, so their contents are captured with it
    pointees: dict[int, Allocation] = field(default_factory=dict)
    # set when this is a module global's storage, not an allocation: replay finds it in the
    # loaded module (kernels reach it by the module's own address)
    module_global: ModuleGlobal | None = None
    pristine_in: int = -1  # a module global: the region whose start found it as a module load leaves it


class AllocationTable:
    """Live allocations by address. ``find_unknown(address)`` answers (base, size) for device
    memory allocated before recording started, or None; ``device_of(address)`` the ordinal of the
    device that memory is on (None: unknown), and ``device_now()`` the device the program works on
    now, which an allocation made while recording is on."""

    def __init__(
        self,
        find_unknown: Callable[[int], tuple[int, int] | None],
        *,
        device_of: Callable[[int], int | None] = lambda address: None,
        device_now: Callable[[], int] = lambda: -1,
    ) -> None:
        self._find_unknown = find_unknown
        self._device_of = device_of
        self._device_now = device_now
        self._starts: list[int] = []
        self._by_address: dict[int, Allocation] = {}
        self._not_pointers: set[int] = set()  # words the driver said are no allocation
        self.epoch = 0  # changes whenever the table does
        self.mapped = MappedRanges()  # virtual memory management: reserved ranges and mapped pieces
        self.device_aliases: dict[int, int] = {}  # host allocation -> its device address, where they differ
        # parameter words below this are numbers: POINTER_LOW, or lower where host memory that kernels
        # read lies lower (a non-PIE interpreter's heap, registered with cuMemHostRegister)
        self.pointer_low = POINTER_LOW
        self._bounds: tuple[int, np.ndarray, np.ndarray, list[Allocation]] | None = None  # epoch, starts, ends, ...

    def add(self, address: int, size: int, api: ev.MemoryApi, call: str) -> Allocation:
        self.remove(address)
        allocation = Allocation(address, size, api, call, device=self._device_now())
        bisect.insort(self._starts, address)
        self._by_address[address] = allocation
        self._not_pointers.clear()
        self.epoch += 1
        if api != ev.MemoryApi.DEVICE:
            self.pointer_low = min(self.pointer_low, address)
        return allocation

    def remove(self, address: int) -> Allocation | None:
        allocation = self._by_address.pop(address, None)
        if allocation is not None:
            del self._starts[bisect.bisect_left(self._starts, address)]
            self.epoch += 1
            if address == self.pointer_low:
                hosts = [a.address for a in self._by_address.values() if a.api != ev.MemoryApi.DEVICE]
                self.pointer_low = min([POINTER_LOW, *hosts])
        return allocation

    def is_live(self, allocation: Allocation) -> bool:
        return self._by_address.get(allocation.address) is allocation

    def find(self, address: int) -> Allocation | None:
        """The allocation holding ``address`` (a zero-size one holds its own address)."""
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0:
            allocation = self._by_address[self._starts[i]]
            if address < allocation.address + max(allocation.size, 1):
                return allocation
        return None

    def device_allocation(self, address: int) -> Allocation | None:
        """The device allocation holding ``address``, asking the driver about ones made before
        recording; None for host memory or a number that is no address."""
        allocation = self.find(address)
        if allocation is None and POINTER_LOW <= address < POINTER_HIGH and address not in self._not_pointers:
            found = self._find_unknown(address)
            if found is None:
                self._not_pointers.add(address)
            else:
                allocation = self.add(found[0], found[1], ev.MemoryApi.DEVICE, "allocated before recording")
                owner = self._device_of(found[0])  # maybe not the device working now (peer access)
                if owner is not None:
                    allocation.device = owner
        if allocation is None or allocation.api != ev.MemoryApi.DEVICE:
            return None
        return allocation

    def kernel_allocation(self, address: int) -> Allocation | None:
        """The allocation a kernel reaches through ``address``: device memory (as
        :meth:`device_allocation`), or pinned, registered or managed memory the program made
        while the recorder listened (kernels read those through the same addresses)."""
        allocation = self.find(address)
        if allocation is not None and allocation.api != ev.MemoryApi.DEVICE:
            return allocation
        return self.device_allocation(address)

    def bounds(self) -> tuple[np.ndarray, np.ndarray, list[Allocation]]:
        """Every live allocation as sorted ``starts`` and ``ends`` (uint64 arrays; a zero-size one
        holds its own address) and the allocations in that order: :meth:`find` for many
        addresses at once. Worked out again only when the table changed."""
        cached = self._bounds
        if cached is None or cached[0] != self.epoch:
            allocations = [self._by_address[a] for a in self._starts]
            starts = np.array(self._starts, dtype=np.uint64)
            ends = np.array([a.address + max(a.size, 1) for a in allocations], dtype=np.uint64)
            cached = self._bounds = (self.epoch, starts, ends, allocations)
        return cached[1], cached[2], cached[3]

    def span(self) -> tuple[int, int] | None:
        """[lowest start, highest end) over every live allocation, or None when there is none."""
        if not self._starts:
            return None
        last = self._by_address[self._starts[-1]]
        return self._starts[0], last.address + last.size


Extent = tuple[int, int]  # (address, size)


class MappedRanges:
    """Virtual memory management as the recorder follows it: reserved ranges, and the pieces of
    physical memory mapped into them. A replay buffer covers one contiguous run of mapped pieces
    inside one reservation (an *extent*): pieces mapped next to each other, as an allocator
    grows a range, make one extent, so an access that spans two pieces stays inside one buffer.

    ``map`` and ``unmap`` answer which extents ended and which began (an extent that grows is one
    that ends and a larger one that begins: buffers are immutable once written)."""

    def __init__(self) -> None:
        self._reserved: dict[int, int] = {}  # base -> size
        self._pieces: dict[int, int] = {}  # mapped address -> size

    def reserve(self, address: int, size: int) -> None:
        self._reserved[address] = size

    def release(self, address: int) -> None:
        self._reserved.pop(address, None)

    def map(self, address: int, size: int) -> tuple[list[Extent], list[Extent]]:
        """Record a mapping; (extents that ended, extents that began)."""
        before = self._extents(address)
        self._pieces[address] = size
        return self._changes(before, self._extents(address))

    def unmap(self, address: int, size: int) -> tuple[list[Extent], list[Extent]]:
        """Remove ``[address, address + size)`` from the mapped pieces (splitting any it cuts)."""
        before = self._extents(address)
        end = address + size
        for start, length in list(self._pieces.items()):
            stop = start + length
            if stop <= address or start >= end:
                continue
            del self._pieces[start]
            if start < address:
                self._pieces[start] = address - start
            if stop > end:
                self._pieces[end] = stop - end
        return self._changes(before, self._extents(address))

    def _reservation(self, address: int) -> Extent | None:
        for base, size in self._reserved.items():
            if base <= address < base + size:
                return base, size
        return None

    def _extents(self, address: int) -> list[Extent]:
        """The extents in the reservation holding ``address`` (every piece when none is known:
        a range reserved before recording started)."""
        reservation = self._reservation(address)
        if reservation is None:
            pieces = sorted(p for p in self._pieces.items() if self._reservation(p[0]) is None)
        else:
            low, high = reservation[0], reservation[0] + reservation[1]
            pieces = sorted(p for p in self._pieces.items() if low <= p[0] < high)
        extents: list[Extent] = []
        for start, size in pieces:
            if extents and extents[-1][0] + extents[-1][1] == start:
                extents[-1] = (extents[-1][0], extents[-1][1] + size)
            else:
                extents.append((start, size))
        return extents

    @staticmethod
    def _changes(before: list[Extent], after: list[Extent]) -> tuple[list[Extent], list[Extent]]:
        old, new = set(before), set(after)
        return sorted(old - new), sorted(new - old)
