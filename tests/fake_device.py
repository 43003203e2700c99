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
    def __init__(self, *, can_hash: bool = True, can_scan: bool = False, can_stage: bool = False) -> None:
        self.memory: dict[int, bytearray] = {}
        self.can_hash = can_hash
        self.can_scan = can_scan  # finds stored-pointer candidates "on the device"
        self.can_stage = can_stage  # has device memory to copy snapshots aside into
        self.staged: list[tuple[int, int]] = []  # (address, size) of every stage handed out
        self.stages_freed: list[int] = []
        self.synchronized: list[int | None] = []
        self.hashed: list[tuple[int, int]] = []
        self.copies: list[tuple[int, int]] = []  # (device address, size) of every copy
        self.device_copies: list[tuple[int, int, int]] = []  # (destination, source, size): device to device
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
        for destination, source, size in self.queued[:marker]:
            if destination in self.memory or any(b <= destination < b + len(m) for b, m in self.memory.items()):
                self._write(destination, self.read(source, size))  # device to device
            else:
                ctypes.memmove(destination, self.read(source, size), size)
        self.queued = self.queued[marker:]

    def _write(self, address: int, data: bytes) -> None:
        for base, buffer in self.memory.items():
            if base <= address and address + len(data) <= base + len(buffer):
                buffer[address - base : address - base + len(data)] = data
                return
        raise AssertionError(f"write to unknown device memory {address:#x}")

    def candidates(self, frames: list[tuple[int, int]], low: int, high: int) -> list[Any] | None:
        if not self.can_scan:
            return None
        from replayfmt.capture.stored_pointers import candidate_words

        found = [candidate_words(self.read(a, n), 0, low, high) for a, n in frames]
        return [None if len(w) > 1024 else (w.sites, w.values) for w in found]

    def stage(self, size: int) -> int | None:
        if not self.can_stage:
            return None
        address = 0x7E00_0000_0000 + sum(n for _, n in self.staged) + (len(self.staged) << 20)
        self.memory[address] = bytearray(size)
        self.staged.append((address, size))
        return address

    def copy_device(self, destination: int, source: int, size: int) -> None:
        self.device_copies.append((destination, source, size))
        self.queued.append((destination, source, size))

    def free_stage(self, address: int) -> None:
        del self.memory[address]
        self.stages_freed.append(address)

    def sibling(self) -> FakeDevice:
        """The same device as another stream reaches it (the writer's thread)."""
        other = FakeDevice(can_hash=self.can_hash, can_scan=self.can_scan, can_stage=self.can_stage)
        other.memory, other.pinned_buffers, other.staged, other.stages_freed = (
            self.memory,
            self.pinned_buffers,
            self.staged,
            self.stages_freed,
        )
        return other

    def pinned(self, size: int) -> tuple[int, memoryview]:
        buffer = (ctypes.c_char * size)()
        address = ctypes.addressof(buffer)
        self.pinned_buffers[address] = buffer
        return address, memoryview(buffer).cast("B")

    def free_pinned(self, address: int) -> None:
        self.freed.append(address)

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------------------
# A stand-in for cuda-python's driver module, for running the Replayer on the CPU


DRIVER_DOORS = ("replayfmt.cuda.driver", "replayfmt.replay.devices", "replayfmt.replay.replayer")
"""The modules whose ``driver`` a test routes to a FakeDriver (monkeypatch.setattr(f"{door}.driver", ...))."""


class FakeError(int):
    """A CUresult other than success, with its name (``is_sticky`` reads it)."""

    def __new__(cls, name: str) -> FakeError:
        error = super().__new__(cls, 700)
        error.name = name
        return error


class _Constants:
    """Any enumeration of the driver (CUevent_flags, CUdevice_attribute, ...): a member is its name."""

    def __getattr__(self, name: str) -> str:
        return name


class _Struct:
    """A driver struct (CUlaunchConfig, CUlaunchAttribute): any field can be set, and nested
    values (attribute.value.clusterDim.x) made as they are reached."""

    def __getattr__(self, name: str) -> _Struct:
        value = _Struct()
        setattr(self, name, value)
        return value


class _Result:
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704


_OK = (0,)


def _ok(*args: Any) -> tuple[int]:
    return _OK


class FakeDriver:
    """The calls a replay makes, answered at once with success and plausible handles.

    Device memory is an address counter (nothing is stored there: copies, launches and memsets do
    nothing); pinned host memory is real (the replay writes relocated pointers into it). Launches
    of a function take the parameter layout given in ``layouts`` (function name -> (offset,
    size) per parameter). One device, sm_90, 80 GB free. The hot calls (launches, copies, event
    records, waits) are one Python call each, which is what a host-pace measurement compares."""

    CUresult = _Result
    CUevent_flags = CUdevice_attribute = CUfunction_attribute = CUstream_flags = _Constants()
    CUjit_option = CUlaunchAttributeID = _Constants()
    CUlaunchConfig = CUlaunchAttribute = CUmemAllocationProp = CUmemAccessDesc = _Struct
    CUmemAllocationType = CUmemLocationType = CUmemAllocationGranularity_flags = CUmemAccess_flags = _Constants()
    CU_MEMHOSTALLOC_PORTABLE = CU_MEMHOSTREGISTER_PORTABLE = 1

    cuLaunchKernel = cuLaunchKernelEx = cuEventRecord = cuStreamWaitEvent = staticmethod(_ok)
    cuMemcpyHtoDAsync = cuMemcpyDtoDAsync = cuMemcpyDtoHAsync = cuMemcpyHtoD = cuMemcpyDtoH = staticmethod(_ok)
    cuMemsetD8Async = cuMemsetD16Async = cuMemsetD32Async = cuGraphLaunch = staticmethod(_ok)
    cuStreamSynchronize = cuEventSynchronize = cuCtxSynchronize = cuCtxSetCurrent = staticmethod(_ok)
    cuInit = cuEventDestroy = cuStreamDestroy = cuMemFree = cuMemFreeHost = cuModuleUnload = staticmethod(_ok)
    cuDevicePrimaryCtxRelease = cuFuncSetAttribute = cuCtxEnablePeerAccess = staticmethod(_ok)

    def __init__(self, layouts: dict[str, list[tuple[int, int]]] | None = None) -> None:
        self.layouts = layouts or {}
        self.handles = 0
        self.next_address = 0x7F00_0000_0000
        self.next_reservation = 0x7E00_1240_0000
        self.reserved: list[tuple[int, int]] = []
        self.mapped: list[tuple[int, int]] = []
        self.released: list[tuple[int, int]] = []
        self.pinned: dict[int, Any] = {}
        self.calls: dict[str, int] = {}
        self.module_globals: dict[str, int] = {}  # symbol -> size, in every loaded module

    def _handle(self) -> int:
        self.handles += 1
        return self.handles

    @staticmethod
    def CUstream(value: int = 0) -> int:
        return value

    def cuDeviceGetCount(self) -> tuple[int, int]:
        return 0, 1

    def cuDeviceGet(self, ordinal: int) -> tuple[int, int]:
        return 0, ordinal

    def cuDevicePrimaryCtxRetain(self, device: int) -> tuple[int, str]:
        return 0, f"context {device}"

    def cuDeviceGetName(self, size: int, device: int) -> tuple[int, bytes]:
        return 0, b"Fake H100\0"

    def cuDeviceGetAttribute(self, attribute: str, device: int) -> tuple[int, int]:
        values = {"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR": 9, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR": 0}
        return 0, values.get(attribute, 227 * 1024)  # sm_90; the shared-memory opt-in of an H100

    def cuDeviceCanAccessPeer(self, a: int, b: int) -> tuple[int, int]:
        return 0, 1

    def cuMemGetInfo(self) -> tuple[int, int, int]:
        return 0, 80 << 30, 80 << 30

    def cuMemAlloc(self, size: int) -> tuple[int, int]:
        address = self.next_address
        self.next_address += (size + 0xFFFF) & ~0xFFFF
        return 0, address

    cuMemAllocManaged = cuMemAlloc

    def cuMemHostAlloc(self, size: int, flags: int = 0) -> tuple[int, int]:
        buffer = (ctypes.c_char * size)()
        address = ctypes.addressof(buffer)
        self.pinned[address] = buffer
        return 0, address

    def cuMemHostGetDevicePointer(self, host: int, flags: int) -> tuple[int, int]:
        return 0, host

    def cuMemHostRegister(self, address: int, size: int, flags: int) -> tuple[int]:
        return _OK

    cuMemHostUnregister = cuMemSetAccess = cuMemRelease = staticmethod(_ok)

    # virtual memory: reservations from an address 2 MiB aligned but not 4 GiB aligned; ``reserved``
    # and ``mapped`` list (address, size) of each reservation and mapping, ``released`` of each
    # one unmapped or freed
    def cuMemGetAllocationGranularity(self, prop: Any, flags: str) -> tuple[int, int]:
        return 0, 2 << 20

    def cuMemAddressReserve(self, size: int, alignment: int, hint: int, flags: int) -> tuple[int, int]:
        address = self.next_reservation
        self.next_reservation += -(-size // (2 << 20)) * (2 << 20)
        self.reserved.append((address, size))
        return 0, address

    def cuMemAddressFree(self, address: int, size: int) -> tuple[int]:
        self.released.append((address, size))
        return _OK

    cuMemUnmap = cuMemAddressFree

    def cuMemCreate(self, size: int, prop: Any, flags: int) -> tuple[int, str]:
        return 0, f"physical {self._handle()}"

    def cuMemMap(self, address: int, size: int, offset: int, handle: str, flags: int) -> tuple[int]:
        self.mapped.append((address, size))
        return _OK

    def cuModuleLoadData(self, image: bytes) -> tuple[int, str]:
        return 0, f"module {self._handle()}"

    def cuModuleGetFunction(self, module: str, name: bytes) -> tuple[int, str]:
        return 0, name.decode()

    def cuModuleGetGlobal(self, module: str, name: bytes) -> tuple[int, int, int]:
        """A global of ``self.module_globals`` (name -> size) at an address of the module's own."""
        size = self.module_globals.get(name.decode())
        if size is None:
            return FakeError("CUDA_ERROR_NOT_FOUND"), 0, 0
        return 0, 0x6000_0000_0000 + 0x1000 * sorted(self.module_globals).index(name.decode()), size

    def cuFuncGetParamInfo(self, function: str, index: int) -> tuple[int, int, int]:
        layout = self.layouts.get(function, [])
        return (0, *layout[index]) if index < len(layout) else (1, 0, 0)

    def cuFuncGetAttribute(self, attribute: int, function: str) -> tuple[int, int]:
        return 0, 1024

    def cuStreamCreate(self, flags: int) -> tuple[int, int]:
        return 0, 0x5000 + self._handle()

    def cuStreamCreateWithPriority(self, flags: int, priority: int) -> tuple[int, int]:
        return 0, 0x5000 + self._handle()

    def cuEventCreate(self, flags: int) -> tuple[int, int]:
        self.calls["cuEventCreate"] = self.calls.get("cuEventCreate", 0) + 1
        return 0, 0xE000_0000 + self._handle()

    def cuEventElapsedTime(self, start: int, end: int) -> tuple[int, float]:
        return 0, 0.0

    def cuGetErrorString(self, err: int) -> tuple[int, bytes]:
        return 0, b"fake error"
