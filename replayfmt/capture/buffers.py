"""The capture's Buffer object of each allocation the program's work touches: written the first
time an operation needs it, typed from what frameworks said about the tensors in it, on the device
whose memory it is, naming the module global it is when it is one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from replayfmt.capture import events as ev
from replayfmt.capture.labels import typed_ranges
from replayfmt.format import model as m

if TYPE_CHECKING:
    from replayfmt.capture.allocations import Allocation
    from replayfmt.capture.device_objects import DeviceObjects
    from replayfmt.capture.modules import Modules
    from replayfmt.capture.options import RecordOptions
    from replayfmt.writer import CaptureWriter

MEMORY_KINDS = {
    ev.MemoryApi.DEVICE: m.MemoryKind.DEVICE,
    ev.MemoryApi.HOST_PINNED: m.MemoryKind.HOST_PINNED,
    ev.MemoryApi.MANAGED: m.MemoryKind.MANAGED,
}


class BufferObjects:
    """Buffer objects of allocations (the id is kept on the :class:`Allocation`)."""

    def __init__(self, writer: CaptureWriter, devices: DeviceObjects, modules: Modules, options: RecordOptions) -> None:
        self._writer = writer
        self._devices = devices
        self._modules = modules
        self._options = options

    def of(self, allocation: Allocation) -> int:
        """The allocation's Buffer object, written now if it has none yet."""
        if allocation.buffer:
            return allocation.buffer
        dtype, shape, strides, label = m.DType.UNKNOWN, (), (), ""
        whole = [t for t in allocation.labels if t.address == allocation.address and t.size >= allocation.size]
        if whole:
            dtype, shape, strides, label = whole[-1].dtype, whole[-1].shape, whole[-1].strides, whole[-1].name
        elif allocation.labels and len({t.dtype for t in allocation.labels}) == 1:
            dtype = allocation.labels[0].dtype  # every tensor seen in it has one dtype
            label = ", ".join(sorted({t.name for t in allocation.labels if t.name}))[:200]
        allocation.buffer = self._writer.add_object(
            m.Buffer(
                size=allocation.size,
                device=self._devices.of(allocation.device),
                address=allocation.address,
                dtype=dtype,
                shape=shape,
                strides=strides,
                label=label or allocation.call,
                ranges=typed_ranges(allocation),
                # host memory keeps the host's addresses: the driver cannot be asked for them; a
                # module global's address is the loaded module's
                requires_fixed_address=self._options.fixed_addresses
                and MEMORY_KINDS[allocation.api] == m.MemoryKind.DEVICE
                and allocation.module_global is None,
                memory=MEMORY_KINDS[allocation.api],
                module_global=self._modules.global_object(allocation),
            )
        )
        return allocation.buffer
