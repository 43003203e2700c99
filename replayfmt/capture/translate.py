"""Turns recorded driver events into capture records: the recorder's logic, without CUPTI.

The translator tracks the program's allocations, modules, streams and events by their raw
handles, writes objects lazily (the first time an operation needs them), turns pointer-sized
parameter words that point into allocations into relocations, and takes snapshots through a
:class:`DeviceMemory` so that a capture is self-contained:

* region mode: the first time an operation touches an allocation inside the region its
  contents are uploaded (a snapshot copy), and the allocations written are checkpointed at the
  end of the region;
* kernel mode: each selected launch becomes a scope holding before-snapshots, the launch and a
  checkpoint of what it changed.

Snapshots synchronise only the launching stream (all the launch depends on has completed then).
"""

from __future__ import annotations

import bisect
import re
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from replayfmt.capture import events as ev
from replayfmt.capture.hostfiles import HostFiles
from replayfmt.capture.options import CaptureMode, RecordOptions
from replayfmt.capture.report import KernelStats, Report
from replayfmt.container.files import file_digest, identity_of
from replayfmt.container.writer import CaptureWriter
from replayfmt.format import model as m
from replayfmt.format.cubin import CubinError, detect_format, parse_cubin
from replayfmt.format.model import EXECUTABLE_FORMATS as _FORMATS

_POINTER_LOW = 1 << 32  # below this an 8-byte parameter word is taken for a number, not an address
_POINTER_HIGH = 1 << 57
_DEFAULT_STREAMS = (0, 1, 2)  # 0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
_COLLECTIVE = re.compile(r"^_?Z?\d*nccl|^ncclKernel|^ncclDevKernel")


class DeviceMemory(Protocol):
    """Device access the translator needs; the CUPTI source implements it with the driver."""

    def read(self, address: int, size: int, stream: int | None) -> bytes | memoryview:
        """``size`` bytes at ``address`` once ``stream`` (a raw handle; None: the whole device) is idle."""

    def host_bytes(self, address: int, size: int) -> bytes:
        """A copy of host memory the program handed to a copy."""

    def find_allocation(self, address: int) -> tuple[int, int] | None:
        """(base, size) of the device allocation holding ``address`` (one made before recording)."""


@dataclass(frozen=True, slots=True)
class TensorLabel:
    """What a framework knows about a tensor: used to type the buffer that holds it."""

    address: int
    size: int
    dtype: m.DType
    shape: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    name: str = ""


@dataclass(eq=False)
class _Allocation:
    address: int
    size: int
    api: ev.MemoryApi
    call: str
    buffer: int = 0  # object id once written
    region: int = -1  # the region in which it was last touched
    before: int = 0  # payload of its snapshot in that region (0: defined by the region itself)
    labels: list[TensorLabel] = field(default_factory=list)


@dataclass
class _Module:
    image: ev.ModuleImage
    payload: int = 0
    file: int = 0
    format: m.ExecutableFormat = m.ExecutableFormat.UNKNOWN
    arch: str = ""
    executables: dict[str, int] = field(default_factory=dict)  # function name -> executable id


@dataclass
class _Instance:
    """A kernel-mode launch waiting for its call to return."""

    scope: str
    stream: int
    targets: list[_Allocation]


@dataclass(slots=True)
class _KernelShape:
    """What every launch of one kernel shares, worked out at its first launch."""

    stats: KernelStats
    collective: bool  # an NCCL kernel: never reproducible alone
    tensor_maps: frozenset[int]  # offsets of its tensor-map parameters
    words: struct.Struct  # its parameter block as 8-byte words
    # the last launch's arguments and what they resolved to, while no allocation changed since
    last: tuple[bytes, int, tuple[m.Relocation, ...], list[_Allocation]] | None = None


@dataclass(frozen=True)
class KernelAnnotation:
    """Names and kinds of a kernel's parameters, from a framework (Triton's launcher)."""

    names: tuple[str, ...] = ()
    kinds: tuple[m.ParameterKind, ...] = ()
    dtypes: tuple[m.DType, ...] = ()
    tensor_maps: bool = False  # its 128-byte parameters are tensor maps (Triton tensor descriptors)


class Translator:
    """Consumes :mod:`events` in program order and writes them to ``writer``. Thread-safe."""

    def __init__(
        self,
        writer: CaptureWriter,
        options: RecordOptions,
        memory: DeviceMemory,
        *,
        device: m.Device | None = None,
        host_files: HostFiles | None = None,
    ) -> None:
        self.writer = writer
        self.options = options
        self.memory = memory
        self.report = Report(path=str(writer.path))
        self._lock = threading.RLock()
        self._host_files = host_files or HostFiles()
        self._device = writer.add_object(device or m.Device())
        self._starts: list[int] = []
        self._allocations: dict[int, _Allocation] = {}
        self._not_pointers: set[int] = set()  # words the driver said are no allocation
        self._modules: dict[tuple[str, int], _Module] = {}
        self._streams: dict[int, int] = {}
        self._stream_info: dict[int, ev.StreamCreated] = {}
        self._events: dict[int, int] = {}
        self._event_flags: dict[int, int] = {}
        self._files: dict[tuple[str, int], int] = {}  # (path, policy) -> file reference id
        self._annotations: dict[tuple[tuple[str, int] | None, str], KernelAnnotation] = {}
        self._pending_labels: list[TensorLabel] = []
        self._kernel_filter = re.compile(options.kernels) if options.kernels else None
        self._seen: dict[str, int] = {}
        self._shapes: dict[tuple[int, str, tuple[str, int] | None], _KernelShape] = {}
        self._epoch = 0  # changes whenever the allocation table does
        self._instances: dict[int, _Instance] = {}  # thread id -> instance awaiting its LaunchEnd
        self._region = 0
        self._recording = False
        self._region_name = ""
        self._touched: list[_Allocation] = []
        self._pending_d2h: dict[int, tuple[int, _Allocation, int, int, int]] = {}
        self._marked_fixed = False

    # -- regions ---------------------------------------------------------------------------

    @property
    def recording(self) -> bool:
        return self._recording

    def start(self, name: str = "") -> None:
        """Open a region: operations are recorded and first touches snapshotted until stop()."""
        with self._lock:
            if self._recording or self.options.mode != CaptureMode.REGION:
                return
            self._region += 1
            self._recording = True
            self._region_name = name
            self._touched = []
            if name:
                self.writer.scope_begin(name)

    def stop(self) -> None:
        """Close the region: checkpoint every allocation it wrote that is still alive."""
        with self._lock:
            if not self._recording:
                return
            self._recording = False
            self._checkpoint(self._touched, stream=None, name=self._region_name or "region")
            if self._region_name:
                self.writer.scope_end(self._region_name)
            self._touched = []

    def scope_begin(self, name: str) -> None:
        with self._lock:
            if name in self.options.region_scopes:
                self.start(name)
            elif self._recording:
                self.writer.scope_begin(name)

    def scope_end(self, name: str) -> None:
        with self._lock:
            if self._recording and name == self._region_name and name in self.options.region_scopes:
                self.stop()
            elif self._recording:
                self.writer.scope_end(name)

    # -- enrichment ------------------------------------------------------------------------

    def annotate_kernel(self, module: tuple[str, int] | None, name: str, annotation: KernelAnnotation) -> None:
        with self._lock:
            self._annotations[(module, name)] = annotation
            self._shapes.clear()  # tensor-map parameters may be known now

    def label_tensor(self, label: TensorLabel) -> None:
        """Type the allocation holding a tensor (used when its buffer object is written)."""
        with self._lock:
            allocation = self._find(label.address)
            if allocation is not None and allocation.buffer == 0:
                allocation.labels.append(label)

    # -- events ----------------------------------------------------------------------------

    def handle(self, event: ev.Event) -> None:
        """Record one event; problems are kept in the report, never raised into the program."""
        with self._lock:
            try:
                self._dispatch[type(event)](self, event)
            except Exception as exc:  # a callback must never break the program
                self.report.errors.append(f"{type(event).__name__}: {type(exc).__name__}: {exc}")

    def _on_module(self, event: ev.ModuleImage) -> None:
        self._modules[event.key] = _Module(event)

    def _on_module_unload(self, event: ev.ModuleUnload) -> None:
        self._modules.pop(event.key, None)

    def _on_allocation(self, event: ev.Allocation) -> None:
        self._add_allocation(event.address, event.size, event.api, event.call)
        if event.api == ev.MemoryApi.MANAGED and self._recording:
            self._unsupported(event.call, "managed memory cannot be replayed", 0)

    def _add_allocation(self, address: int, size: int, api: ev.MemoryApi, call: str) -> _Allocation:
        self._remove(address)
        allocation = _Allocation(address, size, api, call)
        bisect.insort(self._starts, address)
        self._allocations[address] = allocation
        self._not_pointers.clear()
        self._epoch += 1
        return allocation

    def _remove(self, address: int) -> _Allocation | None:
        allocation = self._allocations.pop(address, None)
        if allocation is not None:
            del self._starts[bisect.bisect_left(self._starts, address)]
            self._epoch += 1
        return allocation

    def _on_free(self, event: ev.Free) -> None:
        allocation = self._remove(event.address)
        if allocation is not None and allocation.buffer and self._recording:
            self.writer.destroy(allocation.buffer)

    def _on_launch(self, event: ev.LaunchBegin) -> None:
        kernel = event.kernel
        shape = self._shape(kernel)
        shape.stats.occurrences += 1
        if self.options.mode == CaptureMode.KERNEL:
            self._kernel_instance(event)
            return
        if not self._recording:
            return
        if shape.collective:
            self._unsupported(event.call, f"{kernel.name} is a collective (NCCL) kernel", event.stream)
            return
        function = self._function(kernel)
        if function is None:
            return
        last = shape.last
        if last is not None and last[0] == event.parameters and last[1] == self._epoch:
            relocations, targets = last[2], last[3]  # a loop launching on the same buffers
        else:
            relocations, targets = self._relocations(event.parameters, shape)
            shape.last = (event.parameters, self._epoch, relocations, targets)
        for allocation in targets:
            self._touch(allocation, event.stream, kernel.name)
        self._write_launch(event, function, relocations)
        shape.stats.captured += 1

    def _shape(self, kernel: ev.Kernel) -> _KernelShape:
        key = (kernel.handle, kernel.name, kernel.module)
        shape = self._shapes.get(key)
        if shape is None:
            maps = frozenset(o for o, size in kernel.layout if self._tensor_map(kernel, o, size))
            end = max((o + size for o, size in kernel.layout), default=0)
            shape = self._shapes[key] = _KernelShape(
                self.report.kernel(kernel.name),
                bool(_COLLECTIVE.search(kernel.name)),
                maps,
                struct.Struct(f"<{end // 8}Q"),
            )
        return shape

    def _kernel_instance(self, event: ev.LaunchBegin) -> None:
        name = event.kernel.name
        if self._kernel_filter is not None and not self._kernel_filter.search(name):
            return
        seen = self._seen[name] = self._seen.get(name, 0) + 1
        stats = self.report.kernel(name)
        if seen <= self.options.skip_first:
            return
        if self.options.max_per_kernel is not None and stats.captured >= self.options.max_per_kernel:
            return
        function = self._function(event.kernel)
        if function is None:
            return
        relocations, targets = self._relocations(event.parameters, self._shape(event.kernel))
        scope = f"{name}#{seen - 1}"
        self.writer.scope_begin(scope)
        self._region += 1  # each instance uploads everything it reads
        for allocation in targets:
            self._touch(allocation, event.stream, name)
        self._write_launch(event, function, relocations)
        stats.captured += 1
        self._instances[threading.get_ident()] = _Instance(scope, event.stream, targets)

    def _on_launch_end(self, event: ev.LaunchEnd) -> None:
        instance = self._instances.pop(threading.get_ident(), None)
        if instance is None:
            return
        if event.result == 0:
            self._checkpoint(instance.targets, stream=instance.stream, name=instance.scope)
        else:
            self.report.errors.append(f"{instance.scope}: the program's launch failed (CUresult {event.result})")
        self.writer.scope_end(instance.scope)

    def _write_launch(
        self, event: ev.LaunchBegin, function: tuple[int, int], relocations: tuple[m.Relocation, ...]
    ) -> None:
        self.writer.launch(
            executable=function[0],
            function=function[1],
            grid=event.grid,
            block=event.block,
            cluster=event.cluster,
            shared_memory=event.shared_memory,
            stream=self._stream(event.stream),
            parameters=event.parameters,
            relocations=relocations,
            flags=m.LAUNCH_FLAG_COOPERATIVE if event.cooperative else 0,
        )

    def _on_copy(self, event: ev.Copy) -> None:
        if not self._recording:
            return
        dst = self._device_allocation(event.dst)
        src = self._device_allocation(event.src)
        direction = event.direction
        if direction == ev.CopyDirection.DEFAULT:
            direction = {(True, False): ev.CopyDirection.H2D, (False, True): ev.CopyDirection.D2H}.get(
                (dst is not None, src is not None), ev.CopyDirection.D2D
            )
        stream = self._stream(event.stream)
        flags = m.COPY_FLAG_ASYNC if event.asynchronous else 0
        if direction == ev.CopyDirection.H2D:
            if dst is None:
                return self._unsupported(event.call, f"destination {event.dst:#x} is in no recorded allocation", 0)
            self._prepare_write(dst, event.dst - dst.address, event.size, event.stream)
            self._copy_from_host(event, dst, stream, flags)
        elif direction == ev.CopyDirection.D2H:
            if src is None:
                return self._unsupported(event.call, f"source {event.src:#x} is in no recorded allocation", 0)
            self._touch(src, event.stream, "")
            if event.asynchronous:
                self.writer.copy_d2h(src_buffer=src.buffer, size=event.size, src_offset=event.src - src.address,
                                     stream=stream, flags=flags)  # fmt: skip
            else:  # written once the call returns, with the bytes the program received
                self._pending_d2h[threading.get_ident()] = (event.dst, src, event.src - src.address, event.size, stream)
        else:
            if dst is None or src is None:
                where = event.dst if dst is None else event.src
                return self._unsupported(event.call, f"address {where:#x} is in no recorded allocation", 0)
            self._touch(src, event.stream, "")
            self._prepare_write(dst, event.dst - dst.address, event.size, event.stream)
            self.writer.copy_d2d(src_buffer=src.buffer, dst_buffer=dst.buffer, size=event.size,
                                 src_offset=event.src - src.address, dst_offset=event.dst - dst.address,
                                 stream=stream, flags=flags)  # fmt: skip
        return None

    def _copy_from_host(self, event: ev.Copy, dst: _Allocation, stream: int, flags: int) -> None:
        offset = event.dst - dst.address
        mapped = self._host_files.file_range(event.src, event.size) if event.size else None
        if mapped is not None:
            reference, file_offset = self._file_source(*mapped, event)
            if reference:
                self.writer.copy_h2d(dst_buffer=dst.buffer, src_file=reference, src_offset=file_offset,
                                     size=event.size, dst_offset=offset, stream=stream, flags=flags)  # fmt: skip
                return
        self.writer.copy_h2d(dst_buffer=dst.buffer, data=self.memory.host_bytes(event.src, event.size),
                             dst_offset=offset, stream=stream, flags=flags)  # fmt: skip

    def _file_source(self, path: str, offset: int, event: ev.Copy) -> tuple[int, int]:
        """A file reference for bytes the program copied from a file mapping, by the file policy."""
        policy = self.options.file_policy
        if policy == m.FilePolicy.CAPTURE_RANGES:
            payload = self.writer.add_payload(self.memory.host_bytes(event.src, event.size))
            ranges = (m.FileRange(offset=offset, size=event.size, payload=payload),)
            return self._file_reference(path, policy, ranges=ranges, key_extra=payload), offset
        return self._file_reference(path, policy), offset

    def _file_reference(
        self, path: str, policy: m.FilePolicy, *, ranges: tuple[m.FileRange, ...] = (), key_extra: int = 0
    ) -> int:
        key = (path, int(policy) << 48 | key_extra)
        existing = self._files.get(key)
        if existing:
            return existing
        identity = identity_of(path)
        validation = self.options.file_validation
        digest = file_digest(path) if validation == m.FileValidation.DIGEST else None
        payload = 0
        if policy == m.FilePolicy.CAPTURE_ALL:
            with open(path, "rb") as f:
                payload = self.writer.add_payload(f.read())
        ref = self.writer.add_object(
            m.FileReference(path=path, policy=policy, validation=validation, digest=digest, ranges=ranges,
                            payload=payload, **identity)
        )  # fmt: skip
        self._files[key] = ref
        return ref

    def _on_copy_done(self, event: ev.CopyDone) -> None:
        pending = self._pending_d2h.pop(threading.get_ident(), None)
        if pending is None:
            return
        dst, src, src_offset, size, stream = pending
        self.writer.copy_d2h(src_buffer=src.buffer, size=size, src_offset=src_offset, stream=stream,
                             expected=self.memory.host_bytes(dst, size))  # fmt: skip

    def _on_memset(self, event: ev.Memset) -> None:
        if not self._recording:
            return
        allocation = self._device_allocation(event.address)
        if allocation is None:
            return self._unsupported(event.call, f"address {event.address:#x} is in no recorded allocation", 0)
        offset = event.address - allocation.address
        self._prepare_write(allocation, offset, event.count * event.element_size, event.stream)
        self.writer.memset(buffer=allocation.buffer, value=event.value, count=event.count,
                           element_size=event.element_size, offset=offset,
                           stream=self._stream(event.stream))  # fmt: skip
        return None

    def _on_stream_created(self, event: ev.StreamCreated) -> None:
        self._stream_info[event.handle] = event
        self._streams.pop(event.handle, None)  # a reused handle is a new stream

    def _on_event_created(self, event: ev.EventCreated) -> None:
        self._event_flags[event.handle] = event.flags
        self._events.pop(event.handle, None)

    def _on_event_recorded(self, event: ev.EventRecorded) -> None:
        if self._recording:
            self.writer.event_record(self._event(event.event), self._stream(event.stream))

    def _on_stream_waited(self, event: ev.StreamWaited) -> None:
        if self._recording:
            self.writer.stream_wait_event(self._stream(event.stream), self._event(event.event))

    def _on_stream_synchronized(self, event: ev.StreamSynchronized) -> None:
        if self._recording:
            self.writer.stream_synchronize(self._stream(event.stream))

    def _on_context_synchronized(self, event: ev.ContextSynchronized) -> None:
        if self._recording:
            self.writer.device_synchronize(self._device)

    def _on_event_synchronized(self, event: ev.EventSynchronized) -> None:
        if self._recording:
            self.writer.event_synchronize(self._event(event.event))

    def _on_not_reproducible(self, event: ev.NotReproducible) -> None:
        if self._recording:
            self._unsupported(event.call, event.reason, event.stream)

    def _unsupported(self, call: str, reason: str, stream: int) -> None:
        self.report.unsupported[call] = self.report.unsupported.get(call, 0) + 1
        if self._recording:
            self.writer.unsupported(call, reason, self._stream(stream))

    # -- objects ---------------------------------------------------------------------------

    def _stream(self, handle: int) -> int:
        if handle in _DEFAULT_STREAMS:
            return 0
        sid = self._streams.get(handle)
        if sid is None:
            info = self._stream_info.get(handle, ev.StreamCreated(handle))
            sid = self._streams[handle] = self.writer.add_object(
                m.Stream(device=self._device, flags=info.flags, priority=info.priority, captured_handle=handle)
            )
        return sid

    def _event(self, handle: int) -> int:
        eid = self._events.get(handle)
        if eid is None:
            flags = self._event_flags.get(handle, 0)
            eid = self._events[handle] = self.writer.add_object(m.Event(device=self._device, flags=flags))
        return eid

    def _buffer(self, allocation: _Allocation) -> int:
        if allocation.buffer:
            return allocation.buffer
        dtype, shape, strides, label = m.DType.UNKNOWN, (), (), ""
        whole = [t for t in allocation.labels if t.address == allocation.address and t.size >= allocation.size]
        if whole:
            dtype, shape, strides, label = whole[-1].dtype, whole[-1].shape, whole[-1].strides, whole[-1].name
        elif allocation.labels and len({t.dtype for t in allocation.labels}) == 1:
            dtype = allocation.labels[0].dtype  # every tensor seen in it has one dtype
            label = ", ".join(sorted({t.name for t in allocation.labels if t.name}))[:200]
        allocation.buffer = self.writer.add_object(m.Buffer(
            size=allocation.size, device=self._device, address=allocation.address, dtype=dtype,
            shape=shape, strides=strides, label=label or allocation.call,
            requires_fixed_address=self.options.fixed_addresses,
        ))  # fmt: skip
        return allocation.buffer

    def _function(self, kernel: ev.Kernel) -> tuple[int, int] | None:
        """(executable id, 0) for a launched kernel: one executable per kernel of a module,
        sharing the module's payload (replay loads each image once)."""
        module = self._modules.get(kernel.module) if kernel.module is not None else None
        if module is None:
            self._unsupported(
                "cuLaunchKernel",
                f"the module of {kernel.name} was loaded before recording started; start the recorder first "
                "(python -m replayfmt.capture, or replayfmt.capture.record(..., start=False) at the top of "
                "the program)",
                0,
            )
            return None
        eid = module.executables.get(kernel.name)
        if eid is None:
            self._store_module(module)
            annotation = self._annotation(kernel)
            parameters = []
            for i, (offset, size) in enumerate(kernel.layout):
                tensor_map = self._tensor_map(kernel, offset, size)
                kind = m.ParameterKind.TENSOR_MAP if tensor_map else m.ParameterKind.UNKNOWN
                if i < len(annotation.kinds) and annotation.kinds[i] != m.ParameterKind.UNKNOWN:
                    kind = annotation.kinds[i]
                name = annotation.names[i] if i < len(annotation.names) else ""
                dtype = annotation.dtypes[i] if i < len(annotation.dtypes) else m.DType.UNKNOWN
                parameters.append(m.Parameter(offset=offset, size=size, kind=kind, name=name, dtype=dtype))
            eid = module.executables[kernel.name] = self.writer.add_object(m.Executable(
                format=module.format, target_arch=module.arch, payload=module.payload, file=module.file,
                functions=(m.Function(name=kernel.name, parameters=tuple(parameters), parameters_known=True),),
                label=module.image.path or module.image.call,
            ))  # fmt: skip
        return eid, 0

    def _store_module(self, module: _Module) -> None:
        if module.payload or module.file:
            return
        image = module.image
        data = image.data
        if data is None and image.path is not None:
            policy = self.options.file_policy
            if policy in (m.FilePolicy.REFERENCE, m.FilePolicy.FAIL):
                module.file = self._file_reference(image.path, policy)
            with open(image.path, "rb") as f:
                data = f.read()
        if data is None:
            raise ValueError(f"module {image.key} has no image")
        try:
            module.format = _FORMATS[detect_format(data)]
        except CubinError:
            module.format = m.ExecutableFormat.UNKNOWN
        if module.format == m.ExecutableFormat.CUBIN:
            try:
                module.arch = f"sm_{parse_cubin(data).arch}"
            except CubinError:
                pass
        if not module.file:
            module.payload = self.writer.add_payload(data)
        module.image = ev.ModuleImage(image.key, None, image.path, image.call)  # the bytes are stored now

    # -- addresses and snapshots -----------------------------------------------------------

    def _find(self, address: int) -> _Allocation | None:
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0:
            allocation = self._allocations[self._starts[i]]
            if address < allocation.address + max(allocation.size, 1):
                return allocation
        return None

    def _device_allocation(self, address: int) -> _Allocation | None:
        """The device allocation holding ``address``, asking the driver about ones made before
        recording; None for host memory."""
        allocation = self._find(address)
        if allocation is None and _POINTER_LOW <= address < _POINTER_HIGH and address not in self._not_pointers:
            found = self.memory.find_allocation(address)
            if found is None:
                self._not_pointers.add(address)
            else:
                allocation = self._add_allocation(found[0], found[1], ev.MemoryApi.DEVICE, "allocated before recording")
        if allocation is None or allocation.api != ev.MemoryApi.DEVICE:
            return None
        return allocation

    def _annotation(self, kernel: ev.Kernel) -> KernelAnnotation:
        return self._annotations.get((kernel.module, kernel.name)) or self._annotations.get(
            (None, kernel.name), KernelAnnotation()
        )

    def _tensor_map(self, kernel: ev.Kernel, offset: int, size: int) -> bool:
        """A 128-byte parameter is a tensor map when 64-aligned (CUtensorMap's alignment) or
        when the framework says the kernel takes tensor descriptors."""
        return size == 128 and (offset % 64 == 0 or self._annotation(kernel).tensor_maps)

    def _relocations(
        self, parameters: bytes, shape: _KernelShape
    ) -> tuple[tuple[m.Relocation, ...], list[_Allocation]]:
        """Every 8-byte-aligned parameter word that points into a device allocation becomes a
        relocation (structs passed by value hold pointers too); in a tensor map parameter only
        the first word, its global address, is one (a tensor-map relocation)."""
        relocations: list[m.Relocation] = []
        targets: list[_Allocation] = []
        words = shape.words.unpack_from(parameters) if len(parameters) >= shape.words.size else ()
        maps = shape.tensor_maps
        skip_until = -1
        for i, value in enumerate(words):
            if value < _POINTER_LOW or value >= _POINTER_HIGH:
                continue
            site = i * 8
            if site < skip_until:
                continue
            kind = m.RelocationKind.POINTER
            if site in maps:
                kind = m.RelocationKind.TENSOR_MAP
                skip_until = site + 128
            allocation = self._device_allocation(value)
            if allocation is None:
                continue
            relocations.append(m.Relocation(0, self._buffer(allocation), site, value - allocation.address, kind))
            if allocation not in targets:
                targets.append(allocation)
        return tuple(relocations), targets

    def _prepare_write(self, allocation: _Allocation, offset: int, size: int, stream: int) -> None:
        """Before an operation writes ``size`` bytes at ``offset``: a write covering the whole
        allocation needs no snapshot of what it replaces."""
        self._buffer(allocation)
        if allocation.region == self._region:
            return
        if offset == 0 and size >= allocation.size:
            allocation.region, allocation.before = self._region, 0
            self._touched.append(allocation)
            return
        self._touch(allocation, stream, "")

    def _touch(self, allocation: _Allocation, stream: int, kernel: str) -> None:
        """First touch in this region (or kernel instance): upload the allocation's contents."""
        if allocation.region == self._region:
            return  # touched already, so its buffer is written too
        buffer = self._buffer(allocation)
        allocation.region = self._region
        started = time.perf_counter()
        data = self.memory.read(allocation.address, allocation.size, stream)
        self.report.snapshot_seconds += time.perf_counter() - started
        allocation.before = self.writer.add_payload(data)
        self.writer.copy_h2d(dst_buffer=buffer, payload=allocation.before, size=allocation.size,
                             stream=self._stream(stream))  # fmt: skip
        self.report.snapshot_bytes += allocation.size
        if kernel:
            self.report.kernel(kernel).bytes_stored += allocation.size
        if self.options.mode == CaptureMode.REGION:
            self._touched.append(allocation)
        if self.options.detect_pointers and not self.options.fixed_addresses and not self._marked_fixed:
            self._look_for_stored_pointers(allocation, data)

    def _look_for_stored_pointers(self, allocation: _Allocation, data: bytes | memoryview) -> None:
        """Device memory holding addresses of allocations (pointer arrays, cuBLAS workspaces)
        cannot be relocated: mark the capture as needing --fixed-addresses."""
        if not self._starts or len(data) < 8:
            return
        words = np.frombuffer(data, dtype=np.uint64, count=len(data) // 8)
        low = self._starts[0]
        last = self._allocations[self._starts[-1]]
        candidates = words[(words >= low) & (words < last.address + last.size)]
        if candidates.size == 0:
            return
        for value in np.unique(candidates)[:4096].tolist():
            target = self._find(value)
            if target is not None and target.api == ev.MemoryApi.DEVICE:
                where = int(np.flatnonzero(words == value)[0]) * 8
                self._marked_fixed = True
                reason = (
                    f"buffer {allocation.buffer} holds the address {value:#x} (of buffer "
                    f"{self._buffer(target)}) at byte {where}"
                )
                self.report.needs_fixed_addresses = reason
                # objects are immutable once written: one alias buffer marks the whole capture
                self.writer.add_object(m.Buffer(size=allocation.size, device=self._device,
                                                address=allocation.address, requires_fixed_address=True,
                                                label=f"fixed-address marker: {reason}"))  # fmt: skip
                return

    def _checkpoint(self, allocations: list[_Allocation], *, stream: int | None, name: str) -> None:
        """What the allocations hold now, for those that changed and are still alive."""
        entries = []
        for allocation in allocations:
            if self._allocations.get(allocation.address) is not allocation:
                continue  # freed meanwhile
            started = time.perf_counter()
            data = self.memory.read(allocation.address, allocation.size, stream)
            self.report.snapshot_seconds += time.perf_counter() - started
            self.report.snapshot_bytes += allocation.size
            payload = self.writer.add_payload(data)
            if payload != allocation.before:
                entries.append(m.CheckpointEntry(allocation.buffer, payload, 0, allocation.size))
        self.writer.checkpoint(entries, name=name)

    _dispatch = {
        ev.ModuleImage: _on_module,
        ev.ModuleUnload: _on_module_unload,
        ev.Allocation: _on_allocation,
        ev.Free: _on_free,
        ev.LaunchBegin: _on_launch,
        ev.LaunchEnd: _on_launch_end,
        ev.Copy: _on_copy,
        ev.CopyDone: _on_copy_done,
        ev.Memset: _on_memset,
        ev.StreamCreated: _on_stream_created,
        ev.EventCreated: _on_event_created,
        ev.EventRecorded: _on_event_recorded,
        ev.StreamWaited: _on_stream_waited,
        ev.StreamSynchronized: _on_stream_synchronized,
        ev.ContextSynchronized: _on_context_synchronized,
        ev.EventSynchronized: _on_event_synchronized,
        ev.NotReproducible: _on_not_reproducible,
    }
