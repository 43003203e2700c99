"""Which device each of the program's CUDA contexts runs on, and which device holds an address.

A program may work on several GPUs from one process (a pipeline with a stage per device, a JAX
mesh). The translator must know the device of every object it writes (buffers, streams, events,
graphs), and the recorder's own device work (hashing, pointer scans, copies aside) must run in the
context of the memory it reads: a kernel of ours launched on one device over another device's
memory faults, and a fault poisons the program's context too. These calls run inside callbacks,
under the recorder's per-thread guard, so they are never recorded themselves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from replayfmt.cuda.driver import check, compute_capability
from replayfmt.format import model as m


def describe_device(cu: Any, ordinal: int) -> m.Device:
    """The capture's description of CUDA device ``ordinal``."""
    attribute = cu.CUdevice_attribute
    sms = check(cu.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, ordinal), "attr")
    name = check(cu.cuDeviceGetName(256, ordinal), "cuDeviceGetName")
    uuid = check(cu.cuDeviceGetUuid(ordinal), "cuDeviceGetUuid")
    total = check(cu.cuDeviceTotalMem(ordinal), "cuDeviceTotalMem")
    version = check(cu.cuDriverGetVersion(), "cuDriverGetVersion")
    return m.Device(
        ordinal=ordinal,
        name=bytes(name).split(b"\0")[0].decode(),
        uuid=bytes(uuid.bytes),
        compute_capability=compute_capability(ordinal),
        total_memory=int(total),
        driver_version=int(version),
        multiprocessor_count=int(sms),
    )


class ProgramContexts:
    """The program's contexts and devices as the driver reports them, asked once each.

    Primary contexts this object retains (to work on a device whose memory it was handed while
    another context was current) are released by :meth:`close`."""

    def __init__(self, cu: Any) -> None:
        self.cu = cu
        self._device_of_context: dict[int, m.Device] = {}
        self._descriptions: dict[int, m.Device] = {}
        self._primary: dict[int, Any] = {}  # ordinal -> primary context this object retained

    def device(self, ordinal: int) -> m.Device:
        """The description of device ``ordinal`` (asked of the driver once)."""
        found = self._descriptions.get(ordinal)
        if found is None:
            found = self._descriptions[ordinal] = describe_device(self.cu, ordinal)
        return found

    def device_of_context(self, context: int) -> m.Device | None:
        """The device ``context`` (a raw CUcontext) runs on; None for no context."""
        if not context:
            return None
        found = self._device_of_context.get(context)
        if found is None:
            with self.pushed(self.cu.CUcontext(context)):
                ordinal = int(check(self.cu.cuCtxGetDevice(), "cuCtxGetDevice"))
            found = self._device_of_context[context] = self.device(ordinal)
        return found

    def ordinal_of(self, address: int) -> int | None:
        """The device of the context that allocated ``address`` (memory from cuMemAlloc and the
        pools); None for host memory, no allocation, or memory mapped with virtual memory
        management, which has no context (the caller then works in the current context, from
        which the program reaches it: a peer's memory that NCCL mapped here may be reachable from
        this device alone). Not through CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: the bindings answered
        0 for cuda:1's memory."""
        cu = self.cu
        attribute = cu.CUpointer_attribute
        err, kind = cu.cuPointerGetAttribute(attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address)
        if err != cu.CUresult.CUDA_SUCCESS or kind != cu.CUmemorytype.CU_MEMORYTYPE_DEVICE:
            return None
        err, context = cu.cuPointerGetAttribute(attribute.CU_POINTER_ATTRIBUTE_CONTEXT, address)
        if err != cu.CUresult.CUDA_SUCCESS or not int(context):
            return None
        device = self.device_of_context(int(context))
        return device.ordinal if device is not None else None

    def context_of_device(self, ordinal: int) -> Any:
        """A context to work on device ``ordinal`` in: the current one when it runs there, else
        the device's primary context (the one PyTorch, JAX and the runtime API use)."""
        cu = self.cu
        err, current = cu.cuCtxGetCurrent()
        if err == cu.CUresult.CUDA_SUCCESS and int(current):
            here = self.device_of_context(int(current))
            if here is not None and here.ordinal == ordinal:
                return current
        primary = self._primary.get(ordinal)
        if primary is None:
            device = check(cu.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")
            primary = self._primary[ordinal] = check(
                cu.cuDevicePrimaryCtxRetain(device), f"cuda:{ordinal}: cuDevicePrimaryCtxRetain"
            )
        return primary

    @contextlib.contextmanager
    def pushed(self, context: Any) -> Iterator[None]:
        """``context`` current on this thread for the block (and the caller's afterwards)."""
        cu = self.cu
        check(cu.cuCtxPushCurrent(context), "cuCtxPushCurrent")
        try:
            yield
        finally:
            cu.cuCtxPopCurrent()

    def close(self) -> None:
        cu = self.cu
        for ordinal in self._primary:
            cu.cuDevicePrimaryCtxRelease(check(cu.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})"))
        self._primary.clear()


class DeviceTracker:
    """The device the program's calls run on, followed call by call from their contexts (none
    followed without ``contexts``: a test's stand-in source)."""

    def __init__(self, contexts: ProgramContexts | None) -> None:
        self._contexts = contexts
        self._context = 0
        self._ordinal = -1

    def forget(self) -> None:
        """The next call says its device again (other threads' calls ran in between unseen)."""
        self._context = 0
        self._ordinal = -1

    def moved(self, context: int) -> m.Device | None:
        """The device a call in ``context`` runs on when it is not the previous call's, else None
        (a call with no context, such as cuInit, moves nothing)."""
        if context == self._context or self._contexts is None:
            return None
        device = self._contexts.device_of_context(context)
        if device is None:
            return None
        self._context = context
        if device.ordinal == self._ordinal:
            return None
        self._ordinal = device.ordinal
        return device
