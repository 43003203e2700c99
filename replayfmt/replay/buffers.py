"""Memory for a replay: the captured buffers on their devices (reallocated, those recorded near a
4 GiB boundary at their recorded address modulo 4 GiB, or all at their recorded addresses with
``--fixed-addresses``) and pinned host memory for staging and downloads."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
from typing import Any

from replayfmt.cuda.address_space import page_runs, steer_device_arena
from replayfmt.cuda.driver import check, initialised
from replayfmt.errors import DeviceError
from replayfmt.format import model as m
from replayfmt.format.boundaries import BOUNDARY, near_boundary
from replayfmt.replay.devices import Devices
from replayfmt.replay.memory_kinds import allocate
from replayfmt.replay.plan import Plan

_FIXED_PAGE = 2 << 20  # the VMM granularity of current GPUs; the real one is asked of the driver
_HUGE_PAGE = 2 << 20


def recorded_ranges(plan: Plan) -> list[tuple[int, int]]:
    """(recorded address, size) of every device buffer that has a recorded address (the ones
    ``--fixed-addresses`` places; host memory the driver pins keeps the host's addresses)."""
    return [
        (buf.address, buf.size)
        for buf in plan.buffers.values()
        if buf.address and buf.memory == m.MemoryKind.DEVICE and plan.module_global(buf) is None
    ]


def steer_fixed_arena(plan: Plan, ordinals: tuple[int, ...]) -> str | None:
    """For ``--fixed-addresses``, before CUDA starts in this process: arrange that the driver will
    grant the recorded range. None when arranged (or not needed), else why not (reported when the
    reservation then fails)."""
    if not plan.options.fixed_addresses or initialised():
        return None
    regions = page_runs(recorded_ranges(plan), _FIXED_PAGE)
    if not regions:
        return None
    low, high = regions[0][0], regions[-1][1]
    return steer_device_arena(low, high - low, ordinals[0] if ordinals else 0)


def allocate_buffers(devices: Devices, plan: Plan, arena_problem: str | None = None) -> dict[int, int]:
    """Allocate every captured buffer on its device; buffer id -> device address. Module
    globals' storage is not allocated: the loaded modules hold it (``Modules.global_storage``).

    ``arena_problem`` is what :func:`steer_fixed_arena` answered (named if the recorded range is refused).
    """
    if plan.options.fixed_addresses:
        return _allocate_fixed(devices, plan, arena_problem)
    return _allocate_anywhere(devices, {b: buf for b, buf in plan.buffers.items() if plan.module_global(buf) is None})


def _allocate_anywhere(devices: Devices, buffers: dict[int, m.Buffer]) -> dict[int, int]:
    """Each buffer where the driver puts it (its pointers relocated); a device buffer whose
    recorded range comes near a 4 GiB boundary (format/boundaries.py: a 4-byte field beside a
    stale high half that the recorder relocated may land there) at its recorded address modulo
    4 GiB, so that relocating such a word changes only its high half (a batch-norm reduction's
    size field beside a stale 0x7f26 half, relocated into a segment that starts on a boundary,
    keeps its value only so)."""
    cu = devices.cu
    addresses: dict[int, int] = {}
    current = 0
    for bid, buf in buffers.items():
        if devices.index(buf.device) != current:
            current = devices.index(buf.device)
            devices.use(current)
        size = max(buf.size, 1)
        if buf.memory == m.MemoryKind.DEVICE and near_boundary(buf.address, size):
            addresses[bid] = _allocate_congruent(devices, current, buf.address, size, f"buffer {bid}")
            continue
        extra = max(0, buf.alignment - 256)
        address, free = allocate(cu, buf.memory, size + extra, f"buffer {bid}")  # by memory kind
        devices.own(free)
        if extra:
            address = (address + buf.alignment - 1) // buf.alignment * buf.alignment
        addresses[bid] = address
    devices.use(0)
    return addresses


def _allocate_congruent(devices: Devices, gpu: int, recorded: int, size: int, what: str) -> int:
    """Device memory for ``size`` bytes at an address equal to ``recorded`` modulo 4 GiB: a
    reservation 4 GiB larger than the pages needed, and physical pages mapped at the one place
    inside it with the recorded low half (readable and writable by every replay device)."""
    cu = devices.cu
    prop, access, page = _physical(devices, gpu)
    into_page = recorded % page
    span = -(-(into_page + size) // page) * page
    reserved = span + BOUNDARY
    base = int(check(cu.cuMemAddressReserve(reserved, page, 0, 0), f"{what}: cuMemAddressReserve({reserved})"))
    devices.own(lambda: cu.cuMemAddressFree(base, reserved))
    start = base + (recorded - into_page - base) % BOUNDARY  # pages are powers of two dividing 4 GiB
    handle = check(cu.cuMemCreate(span, prop, 0), f"{what}: cuMemCreate({span})")
    devices.own(lambda: cu.cuMemRelease(handle))
    check(cu.cuMemMap(start, span, 0, handle, 0), f"{what}: cuMemMap at {start:#x}")
    devices.own(lambda: cu.cuMemUnmap(start, span))
    check(cu.cuMemSetAccess(start, span, access, len(access)), f"{what}: cuMemSetAccess at {start:#x}")
    return start + into_page


def _physical(devices: Devices, gpu: int) -> tuple[Any, list[Any], int]:
    """For mapping pages of device ``gpu``: the allocation properties, the access its own and
    every other replay device that can reach it get (peer access does not cover memory mapped
    this way; one that cannot reach it faults there, as it would on a buffer from cuMemAlloc),
    and the driver's page (allocation granularity)."""
    cu = devices.cu
    owner = devices.gpus[gpu]
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = owner.ordinal
    flags = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
    page = int(check(cu.cuMemGetAllocationGranularity(prop, flags), "cuMemGetAllocationGranularity"))
    readers = {owner.ordinal}
    for other in devices.gpus:
        if other.ordinal not in readers and check(
            cu.cuDeviceCanAccessPeer(other.handle, owner.handle), "cuDeviceCanAccessPeer"
        ):
            readers.add(other.ordinal)
    access = []
    for ordinal in sorted(readers):
        desc = cu.CUmemAccessDesc()
        desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = ordinal
        desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        access.append(desc)
    return prop, access, page


def _allocate_fixed(devices: Devices, plan: Plan, arena_problem: str | None) -> dict[int, int]:
    """Give every device buffer its recorded address, or fail (never run with other addresses).
    Pinned, registered and managed host memory is allocated by the driver after the device range
    is reserved, and relocated as in any replay (its host address cannot be chosen; the recorder
    looks for stored pointers to device memory only, so one stored to host memory goes stale, as
    it would without this flag). A host buffer marked for its recorded address is refused.

    One virtual range spanning all recorded buffers is reserved (the address is only a hint
    to the driver, so the result is checked), then physical memory is mapped into it, once per
    run of pages that buffers share (allocators place several tensors in one page).
    """
    cu = devices.cu
    prop, access, page = _physical(devices, 0)
    addresses: dict[int, int] = {}
    host_side: dict[int, m.Buffer] = {}
    for bid, buf in plan.buffers.items():
        if plan.module_global(buf) is not None:
            continue
        if buf.memory != m.MemoryKind.DEVICE:
            if buf.requires_fixed_address:
                raise DeviceError(
                    f"buffer {bid}: {buf.memory.name.lower()} memory is marked requires_fixed_address, and "
                    "host memory cannot be given its recorded address"
                )
            host_side[bid] = buf
            continue
        if buf.address == 0:
            raise DeviceError(f"buffer {bid} has no recorded address; it cannot be replayed with --fixed-addresses")
        addresses[bid] = buf.address
    regions = page_runs(recorded_ranges(plan), page)
    if not regions:
        return addresses | _allocate_anywhere(devices, host_side)
    low, high = regions[0][0], regions[-1][1]
    ptr = check(cu.cuMemAddressReserve(high - low, page, low, 0), "cuMemAddressReserve")
    devices.own(lambda: cu.cuMemAddressFree(ptr, high - low))
    if int(ptr) != low:
        why = f": {arena_problem}" if arena_problem else ""
        raise DeviceError(
            f"--fixed-addresses: the driver would not reserve the recorded range [{low:#x}, {high:#x}) (it "
            f"offered {int(ptr):#x}){why}. Capture and replay with the tools' --fixed-addresses (they run "
            "with address-space randomisation off), in a fresh process with nothing else on the device"
        )
    for start, end in regions:
        handle = check(cu.cuMemCreate(end - start, prop, 0), f"cuMemCreate({end - start}) at {start:#x}")
        devices.own(lambda h=handle: cu.cuMemRelease(h))
        check(cu.cuMemMap(start, end - start, 0, handle, 0), f"cuMemMap at {start:#x}")
        devices.own(lambda s=start, n=end - start: cu.cuMemUnmap(s, n))
        check(cu.cuMemSetAccess(start, end - start, access, len(access)), f"cuMemSetAccess at {start:#x}")
    return addresses | _allocate_anywhere(devices, host_side)  # after the range is ours


def pinned(devices: Devices, size: int, what: str) -> int:
    """Pinned host memory (portable: pinned for every device's context when there are several)."""
    cu = devices.cu
    portable = cu.CU_MEMHOSTALLOC_PORTABLE if devices.several else 0
    ptr = check(cu.cuMemHostAlloc(max(size, 1), portable), f"{what}: cuMemHostAlloc({size})")
    devices.own(lambda: cu.cuMemFreeHost(ptr))
    return int(ptr)


class PinnedSlabs:
    """Small pinned host buffers (downloads' destinations) handed out from a few slabs, each
    twice the last (from 1 MiB, at most 256 MiB, or the size asked): a page-locked allocation
    stops the device's streams from running concurrently around it, and steps built while a
    run issues them would otherwise make one per download."""

    _FIRST, _MOST, _ALIGN = 1 << 20, 256 << 20, 256

    def __init__(self, devices: Devices) -> None:
        self.devices = devices
        self._next_slab = self._FIRST
        self._free = 0  # address of the current slab's free part
        self._left = 0  # bytes left in it

    def take(self, size: int, what: str) -> int:
        """``size`` bytes of pinned host memory, for as long as the replay lives."""
        size = -(-max(size, 1) // self._ALIGN) * self._ALIGN
        if size > self._left:
            slab = max(size, self._next_slab)
            self._next_slab = min(2 * self._next_slab, self._MOST)
            self._free, self._left = pinned(self.devices, slab, what), slab
        address = self._free
        self._free += size
        self._left -= size
        return address


def pinned_large(devices: Devices, size: int, what: str) -> int:
    """Pinned memory for a large buffer: transparent huge pages registered with the driver
    pin in about half the time of cuMemHostAlloc (fewer pages to lock); cuMemHostAlloc when
    that is refused."""
    cu = devices.cu
    try:
        region = mmap.mmap(-1, size + _HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:
        return pinned(devices, size, what)
    with contextlib.suppress(AttributeError, OSError):
        region.madvise(mmap.MADV_HUGEPAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    address = (base + _HUGE_PAGE - 1) // _HUGE_PAGE * _HUGE_PAGE
    # faulted (and zeroed) here, so threads that pin side by side fault side by side: the
    # driver's pinning is serial
    for page in range(address - base, address - base + size, _HUGE_PAGE):
        region[page] = 0
    flags = cu.CU_MEMHOSTREGISTER_PORTABLE if devices.several else 0
    if cu.cuMemHostRegister(address, size, flags)[0] != cu.CUresult.CUDA_SUCCESS:
        region.close()
        return pinned(devices, size, what)
    devices.own(region.close)
    devices.own(lambda: cu.cuMemHostUnregister(address))
    return address
