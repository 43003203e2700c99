"""Turns recorded driver events into capture records: the recorder's logic, without CUPTI.

The translator tracks the program's allocations, modules, streams and events by their raw
handles, writes objects lazily (the first time an operation needs them), turns pointer-sized
parameter words that point into allocations into relocations, and takes snapshots through a
:class:`DeviceMemory` so that a capture is self-contained:

* region mode: the first time an operation touches an allocation inside the region its
  contents are recorded as starting state (a ``state`` operation: what it held when the region
  began, never a copy the program made), and the allocations written are checkpointed at the
  end of the region and at the end of every scope inside it;
* kernel mode: each selected launch becomes a scope holding its starting state, the launch and a
  checkpoint of what it changed. Snapshots synchronise only the launching stream.
"""

from __future__ import annotations

import re
import struct
import threading
from dataclasses import dataclass

from replayfmt.capture import events as ev
from replayfmt.capture.allocations import POINTER_HIGH, Allocation, AllocationTable, TensorLabel
from replayfmt.capture.collective_events import CollectiveEvents
from replayfmt.capture.device_memory import DeviceMemory
from replayfmt.capture.device_objects import DeviceObjects
from replayfmt.capture.file_references import FileReferences
from replayfmt.capture.graph_events import GraphEvents, GraphExecutable
from replayfmt.capture.hostfiles import HostFiles
from replayfmt.capture.labels import KernelAnnotation, typed_ranges
from replayfmt.capture.launch_ring import LaunchRing
from replayfmt.capture.live_buffers import LiveBuffers
from replayfmt.capture.live_types import LiveTypes
from replayfmt.capture.memory_events import MEMORY_KINDS, MemoryEvents
from replayfmt.capture.modules import Module, ModuleEvents
from replayfmt.capture.nccl_log import CollectiveLog
from replayfmt.capture.options import CaptureMode, RecordOptions
from replayfmt.capture.parameter_words import (
    ParameterPointers,
    maybe_data,
    not_a_struct_pointer,
    start_is_pointer,
    struct_words,
)
from replayfmt.capture.repeat_events import RepeatEvents
from replayfmt.capture.report import KernelStats, Report
from replayfmt.capture.state_events import StateEvents
from replayfmt.capture.stored_pointers import FrameWords
from replayfmt.capture.stream_events import StreamEvents
from replayfmt.format import model as m
from replayfmt.format.names import matches_kernel
from replayfmt.writer import CaptureWriter

_COLLECTIVE = re.compile(r"^_?Z?\d*nccl|^ncclKernel|^ncclDevKernel")


@dataclass
class _Instance:
    """A kernel-mode launch waiting for its call to return."""

    scope: str
    stream: int
    targets: list[Allocation]
    region: int  # the instance's own region (state and checkpoint are per instance)


@dataclass(slots=True)
class _KernelShape:
    """What every launch of one kernel shares, worked out at its first launch."""

    stats: KernelStats
    collective: bool  # an NCCL kernel: never reproducible alone
    tensor_maps: frozenset[int]  # offsets of its tensor-map parameters
    struct_words: frozenset[int]  # offsets of the 8-byte words inside parameters larger than a pointer
    words: struct.Struct  # its parameter block as 8-byte words
    layout: tuple[tuple[int, int], ...]  # the layout these were worked out from
    # the last launch's arguments and what they resolved to, while no allocation changed since
    last: tuple[bytes, int, ParameterPointers] | None = None


class Translator(ModuleEvents, MemoryEvents, GraphEvents, StateEvents, RepeatEvents, CollectiveEvents, StreamEvents):
    """Consumes :mod:`events` in program order and writes them to ``writer``. Thread-safe."""

    def __init__(
        self,
        writer: CaptureWriter,
        options: RecordOptions,
        memory: DeviceMemory,
        *,
        device: m.Device | None = None,
        host_files: HostFiles | None = None,
        live_buffers: LiveBuffers | None = None,
        ring: LaunchRing | None = None,
        collectives: CollectiveLog | None = None,
    ) -> None:
        self.writer = writer
        self._ring = ring  # where launches that repeat are armed for the C library (launch_ring)
        self.options = options
        self.memory = memory
        self.report = Report(path=str(writer.path))
        self._lock = threading.RLock()
        self._host_files = host_files or HostFiles()
        devices = self.devices = DeviceObjects(writer, device or m.Device())
        self.allocations = AllocationTable(memory.find_allocation, device_of=memory.device_of, device_now=devices.now)
        self._modules: dict[tuple[str, int], Module] = {}
        self._streams: dict[int, int] = {}
        self._stream_info: dict[int, ev.StreamCreated] = {}
        self._events: dict[int, int] = {}
        self._event_flags: dict[int, int] = {}
        self._file_references = FileReferences(writer, options)
        self._annotations: dict[tuple[tuple[str, int] | None, str], KernelAnnotation] = {}
        self._pending_labels: list[TensorLabel] = []
        self._kernel_filter = re.compile(options.kernels) if options.kernels else None
        self._seen: dict[str, int] = {}
        self._shapes: dict[tuple[int, str, tuple[str, int] | None], _KernelShape] = {}
        self._instances: dict[int, _Instance] = {}  # thread id -> instance awaiting its LaunchEnd
        self._region = 0
        self._recording = False
        self._region_name = ""
        self._touched: list[Allocation] = []
        self._pointed: set[int] = set()  # what the region's launches point at (block frees checkpoint those)
        self._released_blocks: list[tuple[int, int, str, int]] = []  # freed in the open scope (state_events)
        self._scopes: list[tuple[str, dict[int, Allocation]]] = []  # open scopes in a region: what they touch
        self._pending_d2h: dict[int, tuple[int, Allocation, int, int, int]] = {}
        self.collectives, self._received = collectives, []  # NCCL's log; collectives awaiting their results
        self._collective_groups = 0  # groups of collectives (calls one NCCL kernel launch carries) so far
        self._frame_words = FrameWords()  # stored-pointer candidates of snapshot frames, by digest
        self._executables: dict[int, GraphExecutable] = {}
        self._graph_ids: dict[m.Graph, int] = {}
        # which bytes of large allocations hold live framework buffers (JAX, PyTorch), asked once per step
        self.live_buffers = live_buffers if live_buffers is not None else LiveBuffers(problems=self.report.errors)
        self._refused: set[int] = set()
        self._checkpoints = 0
        self.live_types = LiveTypes(enabled=options.type_checkpoints, problems=self.report.errors)

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
            name = name or (f"region#{self._region}" if self._region > 1 else "")  # where its state applies
            self._region_name = name
            self._touched, self._pointed = [], set()
            if self.options.live_buffers:  # what the program holds now: a step may donate it
                self.live_buffers.hold(("state", self._region))
            if name:
                self.writer.scope_begin(name)

    def stop(self) -> None:
        """Close the region: checkpoint every allocation it wrote that is still alive."""
        with self._lock:
            if not self._recording:
                return
            while self._scopes:  # scopes the program left open
                self.scope_end(self._scopes[-1][0])
            self._recording = False
            if self._received:  # collectives launched last: their results before the checkpoint
                self._write_received()
            self._restore_changed_pristine_globals(self._region, self._touched)
            self._checkpoint(self._touched, stream=None, name=self._region_name or "region")
            if self._region_name:
                self.writer.scope_end(self._region_name)
            self._touched = []

    def scope_begin(self, name: str) -> None:
        with self._lock:
            if name in self.options.region_scopes:
                self.start(name)
            elif self._recording:
                if not self._scopes and not self._region_name:  # the file's region before it ends
                    self._restore_changed_pristine_globals(self._region, self._touched)
                self.writer.scope_begin(name)
                self._scopes.append((name, {}))

    def scope_end(self, name: str) -> None:  # a scope in a region checkpoints what it wrote
        with self._lock:
            if self._recording and name == self._region_name and name in self.options.region_scopes:
                self.stop()
            elif self._recording:
                if self._received:  # collectives launched last: their results before the checkpoint
                    self._write_received()
                if self._scopes and self._scopes[-1][0] == name:  # (state: inside its region of the file)
                    self._restore_changed_pristine_globals(self._region, self._touched)
                    touched = self._scopes.pop()[1]
                    self._checkpoint(list(touched.values()), stream=None, name=name)
                self.writer.scope_end(name)

    # -- enrichment ------------------------------------------------------------------------

    def annotate_kernel(self, module: tuple[str, int] | None, name: str, annotation: KernelAnnotation) -> None:
        with self._lock:
            self._annotations[(module, name)] = annotation
            self._shapes.clear()  # tensor-map parameters may be known now
            if self._ring is not None:  # armed launches were read without it (those in the ring were before it)
                self._ring.withdraw()

    def label_tensor(self, label: TensorLabel) -> None:
        """Type the allocation holding a tensor (used when its buffer object is written)."""
        with self._lock:
            allocation = self.allocations.find(label.address)
            if allocation is not None and allocation.buffer == 0:
                allocation.labels.append(label)

    # -- events ----------------------------------------------------------------------------

    def handle(self, event: ev.Event) -> None:
        """Record one event; problems are kept in the report, never raised into the program. The
        first problem stops the recording: what follows it would be recorded without the event
        it lost, so the capture is partial (``report.partial``) and nothing more is written."""
        with self._lock:
            if self.report.partial:
                return
            try:
                if self._received:  # collectives launched before this event have run by now
                    self._write_received()
                self._dispatch[type(event)](self, event)
            except Exception as exc:  # a callback must never break the program
                problem = f"{type(event).__name__}: {type(exc).__name__}: {exc}"
                self.report.errors.append(problem)
                self.report.partial = f"the recorder stopped at its first error: {problem}"
                self._recording = False
                self._scopes.clear()

    @property
    def in_progress(self) -> bool:
        """Whether work is being recorded now (a region open, a kernel instance awaiting its end)."""
        return self._recording or bool(self._instances)

    def _on_launch(self, event: ev.LaunchBegin) -> None:
        kernel = event.kernel
        shape = self._shape(kernel)
        shape.stats.occurrences += 1
        if self.options.mode == CaptureMode.KERNEL:
            self._kernel_instance(event)
            return
        if shape.collective:
            return self._on_collective_launch(event)
        if not self._recording:
            return
        function = self._function(kernel)
        if function is None:
            return
        last = shape.last
        if repeated := (
            last is not None
            and last[0] == event.parameters
            and last[1] == self.allocations.epoch
            and not any(a.buffer for a in last[2].unsettled)
        ):
            pointers = last[2]  # a loop launching on the same buffers
        else:
            pointers = self._relocations(event.parameters, shape)
            shape.last = (event.parameters, self.allocations.epoch, pointers)
        relocations, targets = pointers.relocations, pointers.targets
        for allocation in (*targets, *self._module_globals(kernel, event.stream)):
            self._touch_for_launch(allocation, event.stream, kernel.name)
            if allocation.pointees:  # the kernel may follow the pointers stored in it
                for reached in self._reached(allocation):
                    self._touch_for_launch(reached, event.stream, kernel.name)
        self._write_launch(event, function, relocations)
        shape.stats.captured += 1
        if repeated and not pointers.unsettled:  # a loop on the same buffers: its next repeats may go into the C ring
            self._arm(kernel, function, event.parameters, relocations, targets, shape.stats)

    def _shape(self, kernel: ev.Kernel) -> _KernelShape:
        key = (kernel.handle, kernel.name, kernel.module)
        shape = self._shapes.get(key)
        # a new layout under the same key: a module unloaded and another loaded at its handle (XLA's autotuner)
        if shape is None or shape.layout is not kernel.layout:
            maps = frozenset(o for o, size in kernel.layout if self._tensor_map(kernel, o, size))
            end = max((o + size for o, size in kernel.layout), default=0)
            shape = self._shapes[key] = _KernelShape(
                self.report.kernel(kernel.name),
                bool(_COLLECTIVE.search(kernel.name)),
                maps,
                struct_words(kernel.layout),
                struct.Struct(f"<{end // 8}Q"),
                kernel.layout,
            )
        return shape

    def _kernel_instance(self, event: ev.LaunchBegin) -> None:
        name = event.kernel.name
        if self._kernel_filter is not None and not matches_kernel(self._kernel_filter, name):
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
        relocations, targets, _ = self._relocations(event.parameters, self._shape(event.kernel))
        scope = f"{name}#{seen - 1}"
        self.writer.scope_begin(scope)
        self._region += 1  # each instance uploads everything it reads
        targets += [a for a in self._module_globals(event.kernel, event.stream) if a not in targets]
        for allocation in list(targets):
            self._touch(allocation, event.stream, name)
            for reached in self._reached(allocation) if allocation.pointees else ():
                if reached not in targets:  # reached through stored pointers: checkpointed too
                    targets.append(reached)
                self._touch(reached, event.stream, name)
        self._write_launch(event, function, relocations)
        stats.captured += 1
        self._instances[threading.get_ident()] = _Instance(scope, event.stream, targets, self._region)

    def _on_launch_end(self, event: ev.LaunchEnd) -> None:
        instance = self._instances.pop(threading.get_ident(), None)
        if instance is None:
            return
        if event.result == 0:
            self._restore_changed_pristine_globals(instance.region, instance.targets)
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
            flags=(m.LAUNCH_FLAG_COOPERATIVE if event.cooperative else 0) | self._launched(event, relocations),
        )

    def _on_copy(self, event: ev.Copy) -> None:
        if not self._recording:
            return
        dst = self.allocations.device_allocation(event.dst)
        src = self.allocations.device_allocation(event.src)
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
            src = self._copy_source(event.src, event.stream)  # device, or host memory the program pinned
            if src is None:
                return self._unsupported(event.call, f"source {event.src:#x} is in no recorded allocation", 0)
            if event.asynchronous:
                self.writer.copy_d2h(
                    src_buffer=src.buffer,
                    size=event.size,
                    src_offset=event.src - src.address,
                    stream=stream,
                    flags=flags,
                )
            else:  # written once the call returns, with the bytes the program received
                self._pending_d2h[threading.get_ident()] = (event.dst, src, event.src - src.address, event.size, stream)
        else:
            if dst is None or src is None:
                where = event.dst if dst is None else event.src
                return self._unsupported(event.call, f"address {where:#x} is in no recorded allocation", 0)
            self._touch(src, event.stream, "")
            self._prepare_write(dst, event.dst - dst.address, event.size, event.stream)
            self.writer.copy_d2d(
                src_buffer=src.buffer,
                dst_buffer=dst.buffer,
                size=event.size,
                src_offset=event.src - src.address,
                dst_offset=event.dst - dst.address,
                stream=stream,
                flags=flags,
            )
        return None

    def _on_copy_done(self, event: ev.CopyDone) -> None:
        pending = self._pending_d2h.pop(threading.get_ident(), None)
        if pending is None:
            return
        dst, src, src_offset, size, stream = pending
        self.writer.copy_d2h(
            src_buffer=src.buffer,
            size=size,
            src_offset=src_offset,
            stream=stream,
            expected=self.memory.host_bytes(dst, size),
        )

    def _on_memset(self, event: ev.Memset) -> None:
        if not self._recording:
            return
        allocation = self.allocations.kernel_allocation(event.address)
        if allocation is None:
            return self._unsupported(event.call, f"address {event.address:#x} is in no recorded allocation", 0)
        offset = event.address - allocation.address
        self._prepare_write(allocation, offset, event.count * event.element_size, event.stream)
        self.writer.memset(
            buffer=allocation.buffer,
            value=event.value,
            count=event.count,
            element_size=event.element_size,
            offset=offset,
            stream=self._stream(event.stream),
        )
        return None

    def _on_not_reproducible(self, event: ev.NotReproducible) -> None:
        if self._recording:
            self._unsupported(event.call, event.reason, event.stream)

    def _unsupported(self, call: str, reason: str, stream: int) -> None:
        self.report.unsupported[call] = self.report.unsupported.get(call, 0) + 1
        if self._recording:
            self.writer.unsupported(call, reason, self._stream(stream))

    # -- objects ---------------------------------------------------------------------------

    def _buffer(self, allocation: Allocation) -> int:
        if allocation.buffer:
            return allocation.buffer
        dtype, shape, strides, label = m.DType.UNKNOWN, (), (), ""
        whole = [t for t in allocation.labels if t.address == allocation.address and t.size >= allocation.size]
        if whole:
            dtype, shape, strides, label = whole[-1].dtype, whole[-1].shape, whole[-1].strides, whole[-1].name
        elif allocation.labels and len({t.dtype for t in allocation.labels}) == 1:
            dtype = allocation.labels[0].dtype  # every tensor seen in it has one dtype
            label = ", ".join(sorted({t.name for t in allocation.labels if t.name}))[:200]
        allocation.buffer = self.writer.add_object(
            m.Buffer(
                size=allocation.size,
                device=self.devices.of(allocation.device),
                address=allocation.address,
                dtype=dtype,
                shape=shape,
                strides=strides,
                label=label or allocation.call,
                ranges=typed_ranges(allocation),
                # host memory keeps the host's addresses: the driver cannot be asked for them; a
                # module global's address is the loaded module's
                requires_fixed_address=self.options.fixed_addresses
                and MEMORY_KINDS[allocation.api] == m.MemoryKind.DEVICE
                and allocation.module_global is None,
                memory=MEMORY_KINDS[allocation.api],
                module_global=self._global_object(allocation),
            )
        )
        return allocation.buffer

    # -- addresses and snapshots -----------------------------------------------------------

    def _annotation(self, kernel: ev.Kernel) -> KernelAnnotation:
        return self._annotations.get((kernel.module, kernel.name)) or self._annotations.get(
            (None, kernel.name), KernelAnnotation()
        )

    def _tensor_map(self, kernel: ev.Kernel, offset: int, size: int) -> bool:
        """A 128-byte parameter is a tensor map when 64-aligned (CUtensorMap's alignment) or
        when the framework says the kernel takes tensor descriptors."""
        return size == 128 and (offset % 64 == 0 or self._annotation(kernel).tensor_maps)

    def _relocations(self, parameters: bytes, shape: _KernelShape) -> ParameterPointers:
        """Every 8-byte-aligned parameter word that points into a device allocation becomes a
        relocation (structs passed by value hold pointers too; see :mod:`parameter_words`); in a
        tensor map parameter only the first word, its global address, is one (a tensor-map
        relocation). A struct word that may be data beside a stale half is one only into an
        allocation the capture holds or this launch reaches through another word."""
        relocations: list[m.Relocation] = []
        targets: list[Allocation] = []
        undecided: list[tuple[int, int, Allocation]] = []
        words = shape.words.unpack_from(parameters) if len(parameters) >= shape.words.size else ()
        maps, low = shape.tensor_maps, self.allocations.pointer_low
        skip_until = -1
        for i, value in enumerate(words):
            site = i * 8
            if site < skip_until:
                continue
            allocation = self.allocations.kernel_allocation(value) if low <= value < POINTER_HIGH else None
            if allocation is None:
                # (a 128-byte parameter whose first word is no address is a struct, not a tensor
                # map: its other words are struct words, as cuDNN's winograd kernels need)
                continue
            kind = m.RelocationKind.POINTER
            if site in maps:
                kind = m.RelocationKind.TENSOR_MAP
                skip_until = site + 128
            elif site in shape.struct_words and not (value == allocation.address and start_is_pointer(value)):
                if not_a_struct_pointer(value, allocation.size):
                    continue
                # replay keeps device buffers' low halves near a 4 GiB boundary (placed modulo 4 GiB:
                # near_boundary), never host memory's or a module's globals' (maybe_data)
                kept = allocation.api == ev.MemoryApi.DEVICE and allocation.module_global is None
                if maybe_data(value, low_half_kept=kept):
                    undecided.append((site, value, allocation))
                    continue
            relocations.append(m.Relocation(0, self._buffer(allocation), site, value - allocation.address, kind))
            if allocation not in targets:
                targets.append(allocation)
        # every target has its buffer by now (_buffer): "held" covers what this launch reaches
        decided = [(site, value, a) for site, value, a in undecided if a.buffer]
        for site, value, allocation in decided:
            relocations.append(m.Relocation(0, allocation.buffer, site, value - allocation.address))
            if allocation not in targets:
                targets.append(allocation)
        if decided:
            relocations.sort(key=lambda r: r.site_offset)
        unsettled = tuple({id(a): a for _, _, a in undecided if not a.buffer}.values())
        return ParameterPointers(tuple(relocations), targets, unsettled)

    _dispatch = {
        ev.ModuleImage: ModuleEvents._on_module,
        ev.ModuleUnload: ModuleEvents._on_module_unload,
        ev.ModuleGlobals: ModuleEvents._on_module_globals,
        ev.Allocation: MemoryEvents._on_allocation,
        ev.Free: MemoryEvents._on_free,
        ev.HostDevicePointer: MemoryEvents._on_host_device_pointer,
        ev.AddressReserved: MemoryEvents._on_address_reserved,
        ev.AddressFreed: MemoryEvents._on_address_freed,
        ev.Mapped: MemoryEvents._on_mapped,
        ev.Unmapped: MemoryEvents._on_unmapped,
        ev.LaunchBegin: _on_launch,
        ev.RepeatedLaunches: RepeatEvents._on_repeated_launches,
        ev.LaunchEnd: _on_launch_end,
        ev.Copy: _on_copy,
        ev.CopyDone: _on_copy_done,
        ev.Memset: _on_memset,
        ev.StreamCreated: StreamEvents._on_stream_created,
        ev.EventCreated: StreamEvents._on_event_created,
        ev.EventRecorded: StreamEvents._on_event_recorded,
        ev.StreamWaited: StreamEvents._on_stream_waited,
        ev.StreamSynchronized: StreamEvents._on_stream_synchronized,
        ev.ContextSynchronized: StreamEvents._on_context_synchronized,
        ev.EventSynchronized: StreamEvents._on_event_synchronized,
        ev.HostFunction: StreamEvents._on_host_function,
        ev.GraphInstantiated: GraphEvents._on_graph_instantiated,
        ev.GraphKernelUpdated: GraphEvents._on_graph_kernel_updated,
        ev.GraphNodeUpdated: GraphEvents._on_graph_node_updated,
        ev.GraphNodeEnabled: GraphEvents._on_graph_node_enabled,
        ev.GraphExecDestroyed: GraphEvents._on_graph_exec_destroyed,
        ev.GraphLaunched: GraphEvents._on_graph_launched,
        ev.NotReproducible: _on_not_reproducible,
        ev.DeviceChanged: lambda self, event: self.devices.switch(event.device),
    }
