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

The :class:`Translator` is thin: it opens and closes regions and scopes, holds the lock, and routes
each event to the collaborator that owns its concern. Each collaborator owns its state and is
handed the few others it uses when it is made (none calls back into the translator):

=====================  ==============================================================================
``Region``             the open region: whether and where it records, what it and its scopes touched
``Refusals``           operations no replay can reproduce, written as Unsupported operations
``Streams``            Stream and Event objects of the program's handles; their operations
``Modules``            loaded modules, the executables of launched kernels, module globals
``BufferObjects``      the Buffer object of each allocation
``StartingState``      first touches and their snapshots (state), stored pointers, host-visible memory
``Checkpoints``        checkpoints of regions, scopes and instances; of memory freed in a scope
``ProgramMemory``      allocation events, into the shared :class:`AllocationTable`
``Copies``             copies and memsets
``KernelParameters``   which parameter words are pointers (relocations), by kernel shape
``Launches``           kernel launches, both modes
``LaunchRepeats``      launches armed for the C ring, and those it recorded
``GraphLaunches``      executable graphs and their launches
``Collectives``        NCCL's kernels, as collective operations with the bytes they left
=====================  ==============================================================================
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from replayfmt.capture import events as ev
from replayfmt.capture.allocations import AllocationTable, TensorLabel
from replayfmt.capture.buffers import BufferObjects
from replayfmt.capture.checkpoints import Checkpoints
from replayfmt.capture.collective_events import Collectives
from replayfmt.capture.copies import Copies
from replayfmt.capture.device_memory import DeviceMemory
from replayfmt.capture.device_objects import DeviceObjects
from replayfmt.capture.graph_events import GraphLaunches
from replayfmt.capture.hostfiles import HostFiles
from replayfmt.capture.labels import KernelAnnotation, KernelAnnotations
from replayfmt.capture.launch_ring import LaunchRing
from replayfmt.capture.launches import KernelParameters, Launches
from replayfmt.capture.live_buffers import LiveBuffers
from replayfmt.capture.live_types import LiveTypes
from replayfmt.capture.memory_events import ProgramMemory
from replayfmt.capture.modules import Modules
from replayfmt.capture.nccl_log import CollectiveLog
from replayfmt.capture.options import CaptureMode, RecordOptions
from replayfmt.capture.regions import Refusals, Region
from replayfmt.capture.repeat_events import LaunchRepeats
from replayfmt.capture.report import Report
from replayfmt.capture.starting_state import SnapshotSpans, StartingState
from replayfmt.capture.stream_events import Streams
from replayfmt.format import model as m
from replayfmt.writer import CaptureWriter


@contextlib.contextmanager
def released(lock: Any) -> Iterator[None]:
    """A reentrant ``lock`` this thread holds (at any depth) let go for the block, taken again as
    deep after it; nothing when this thread does not hold it."""
    depth = 0
    while True:
        try:
            lock.release()
        except RuntimeError:  # not (or no longer) held by this thread
            break
        depth += 1
    try:
        yield
    finally:
        for _ in range(depth):
            lock.acquire()


class Translator:
    """Consumes :mod:`events` in program order and writes them to ``writer``. Thread-safe: its
    collaborators are not, and each is used under the translator's lock. Besides its methods,
    ``report``, ``devices``, ``allocations`` and ``modules`` are for reading (the translator
    changes them), ``settled`` is the recorder's to set (see release_block), and a framework's
    hook (enrich) adds to ``frees_heard`` the frameworks whose buffer frees it tells and to
    ``step_hooks`` what to run as each named region or scope begins."""

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
        self.options = options
        self.memory = memory
        self.report = report = Report(path=str(writer.path))
        self._lock = threading.RLock()
        # held around a framework's block free, outside the translator's lock: the recorder hands on
        # the launches its C library holds first (a checkpoint must follow the launches before it)
        self.settled: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext
        # the source's lock let go for a block (the recorder's to set): while an event waits for a
        # collective whose kernel waits for a peer's that another thread has yet to launch
        self.unlocked: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext
        self.frees_heard: set[str] = set()  # their memory gets no free writes (checkpoints)
        self.step_hooks: list[Callable[[], None]] = []  # a framework's hook that costs only inside steps
        devices = self.devices = DeviceObjects(writer, device or m.Device())
        allocations = self.allocations = AllocationTable(
            memory.find_allocation, device_of=memory.device_of, device_now=devices.now
        )
        # which bytes of large allocations hold live framework buffers (JAX, PyTorch), asked once per step
        self.live_buffers = live_buffers if live_buffers is not None else LiveBuffers(problems=report.errors)
        self.live_types = LiveTypes(enabled=options.type_checkpoints, problems=report.errors)

        region = self._region = Region()
        streams = Streams(writer, devices, region)
        refusals = Refusals(report, writer, region, streams.stream)
        self._annotations = KernelAnnotations()
        modules = self.modules = Modules(writer, memory, allocations, self._annotations, refusals, region)
        buffers = BufferObjects(writer, devices, modules, options)
        spans = SnapshotSpans(options, report, writer, self.live_buffers)
        state = self._state = StartingState(
            writer=writer,
            memory=memory,
            allocations=allocations,
            options=options,
            report=report,
            region=region,
            buffers=buffers,
            modules=modules,
            streams=streams,
            spans=spans,
        )
        checkpoints = self._checkpoints = Checkpoints(
            writer=writer,
            memory=memory,
            allocations=allocations,
            report=report,
            region=region,
            spans=spans,
            live_types=self.live_types,
            frees_heard=self.frees_heard,
        )
        memory_events = ProgramMemory(allocations, writer, region, checkpoints)
        copies = Copies(
            writer=writer,
            options=options,
            memory=memory,
            allocations=allocations,
            region=region,
            streams=streams,
            refusals=refusals,
            buffers=buffers,
            state=state,
            host_files=host_files or HostFiles(),
        )
        parameters = self._parameters = KernelParameters(self._annotations, report, allocations, buffers)
        repeats = self._repeats = LaunchRepeats(writer, ring, region, streams)
        nccl = self._collectives = Collectives(
            collectives,
            writer=writer,
            report=report,
            allocations=allocations,
            region=region,
            memory=memory,
            devices=devices,
            refusals=refusals,
            streams=streams,
            state=state,
        )
        launches = self._launches = Launches(
            writer=writer,
            options=options,
            report=report,
            allocations=allocations,
            region=region,
            streams=streams,
            parameters=parameters,
            modules=modules,
            state=state,
            checkpoints=checkpoints,
            repeats=repeats,
            collective=nccl.on_launch,
            collective_end=nccl.on_launch_end,
        )
        graphs = GraphLaunches(
            writer=writer,
            report=report,
            allocations=allocations,
            devices=devices,
            region=region,
            refusals=refusals,
            streams=streams,
            buffers=buffers,
            modules=modules,
            parameters=parameters,
            state=state,
            checkpoints=checkpoints,
        )
        self._dispatch: dict[type, Callable[[Any], None]] = {
            ev.ModuleImage: modules.on_module,
            ev.ModuleUnload: modules.on_module_unload,
            ev.ModuleGlobals: modules.on_module_globals,
            ev.Allocation: memory_events.on_allocation,
            ev.Free: memory_events.on_free,
            ev.HostDevicePointer: memory_events.on_host_device_pointer,
            ev.AddressReserved: memory_events.on_address_reserved,
            ev.AddressFreed: memory_events.on_address_freed,
            ev.Mapped: memory_events.on_mapped,
            ev.Unmapped: memory_events.on_unmapped,
            ev.LaunchBegin: launches.on_launch,
            ev.RepeatedLaunches: repeats.on_repeated_launches,
            ev.LaunchEnd: launches.on_launch_end,
            ev.Copy: copies.on_copy,
            ev.CopyDone: copies.on_copy_done,
            ev.Memset: copies.on_memset,
            ev.StreamCreated: streams.on_stream_created,
            ev.EventCreated: streams.on_event_created,
            ev.EventRecorded: streams.on_event_recorded,
            ev.StreamWaited: streams.on_stream_waited,
            ev.StreamSynchronized: streams.on_stream_synchronized,
            ev.ContextSynchronized: streams.on_context_synchronized,
            ev.EventSynchronized: streams.on_event_synchronized,
            ev.HostFunction: streams.on_host_function,
            ev.GraphInstantiated: graphs.on_graph_instantiated,
            ev.GraphKernelUpdated: graphs.on_graph_kernel_updated,
            ev.GraphNodeUpdated: graphs.on_graph_node_updated,
            ev.GraphNodeEnabled: graphs.on_graph_node_enabled,
            ev.GraphExecDestroyed: graphs.on_graph_exec_destroyed,
            ev.GraphLaunched: graphs.on_graph_launched,
            ev.NotReproducible: refusals.on_not_reproducible,
            ev.DeviceChanged: lambda event: devices.switch(event.device),
        }

    # -- regions ---------------------------------------------------------------------------

    @property
    def recording(self) -> bool:
        return self._region.recording

    @property
    def in_named_region(self) -> bool:
        """Whether a named region, or a named scope inside a region, is being recorded (a step)."""
        return self._region.recording and self._region.named

    def start(self, name: str = "") -> None:
        """Open a region: operations are recorded and first touches snapshotted until stop()."""
        with self._lock:
            if self._region.recording or self.options.mode != CaptureMode.REGION:
                return
            name = self._region.open(name)
            self._checkpoints.region_opened()
            self._collectives.on_region_start()
            if self.options.live_buffers:  # what the program holds now: a step may donate it
                self.live_buffers.hold(("state", self._region.number))
            if name:
                self.writer.scope_begin(name)
                self._step_begins()

    def stop(self) -> None:
        """Close the region: checkpoint every allocation it wrote that is still alive."""
        with self._lock:
            region = self._region
            if not region.recording:
                return
            if self._collectives.pending:  # waited for while the region records (a peer's launch may come)
                self._collectives.write_received(self._unlocked)
            while region.scopes:  # scopes the program left open
                self.scope_end(region.scopes[-1][0])
            touched = region.close()
            if self._collectives.pending:  # collectives launched last: their results before the checkpoint
                self._collectives.write_received()
            self._state.restore_changed_pristine_globals(region.number, touched)
            # a named region (a step) also compares what it wrote into memory its framework calls free
            self._checkpoints.checkpoint(
                touched, stream=None, name=region.name or "region", free_writes=bool(region.name)
            )
            if region.name:
                self.writer.scope_end(region.name)

    def scope_begin(self, name: str) -> None:
        with self._lock:
            region = self._region
            if name in self.options.region_scopes:
                self.start(name)
            elif region.recording:
                if not region.scopes and not region.name:  # the file's region before it ends
                    self._state.restore_changed_pristine_globals(region.number, region.touched)
                self.writer.scope_begin(name)
                region.scopes.append((name, {}))
                self._step_begins()

    def _step_begins(self) -> None:
        for hook in list(self.step_hooks):
            try:
                hook()
            except Exception as exc:  # never break the program
                self.report.errors.append(f"{getattr(hook, '__qualname__', hook)}: {type(exc).__name__}: {exc}")

    def scope_end(self, name: str) -> None:  # a scope in a region checkpoints what it wrote
        with self._lock:
            region = self._region
            if region.recording and name == region.name and name in self.options.region_scopes:
                self.stop()
            elif region.recording:
                if self._collectives.pending:  # collectives launched last: their results before the checkpoint
                    self._collectives.write_received(self._unlocked)
                if region.scopes and region.scopes[-1][0] == name:  # (state: inside its region of the file)
                    self._state.restore_changed_pristine_globals(region.number, region.touched)
                    touched = region.scopes.pop()[1]
                    self._checkpoints.checkpoint(list(touched.values()), stream=None, name=name)
                self.writer.scope_end(name)

    # -- enrichment ------------------------------------------------------------------------

    def annotate_kernel(self, module: tuple[str, int] | None, name: str, annotation: KernelAnnotation) -> None:
        with self._lock:
            self._annotations.add(module, name, annotation)
            self._parameters.forget()  # tensor-map parameters may be known now
            self._repeats.withdraw()  # armed launches were read without it (those in the ring were before it)

    def label_tensor(self, label: TensorLabel) -> None:
        """Type the allocation holding a tensor (used when its buffer object is written)."""
        with self._lock:
            allocation = self.allocations.find(label.address)
            if allocation is not None and allocation.buffer == 0:
                allocation.labels.append(label)

    def points_at(self, address: int) -> bool:
        """Whether a launch of the open region pointed at ``address`` while a named scope is open
        (a framework's hook asks before it works out what it frees: release_block). Unlocked: one
        set lookup for every block the program frees."""
        return self._checkpoints.points_at(address)

    def release_block(self, address: int, size: int, why: str) -> None:
        """A framework frees its block [address, address + size): see
        :meth:`Checkpoints.release_block <replayfmt.capture.checkpoints.Checkpoints.release_block>`."""
        with self.settled(), self._lock:
            if self._collectives.pending:  # a collective using the block is written before its free
                self._collectives.before_free(address, size, self._unlocked)
            self._checkpoints.release_block(address, size, why)

    # -- events ----------------------------------------------------------------------------

    def handle(self, event: ev.Event) -> None:
        """Record one event; problems are kept in the report, never raised into the program. The
        first problem stops the recording: what follows it would be recorded without the event
        it lost, so the capture is partial (``report.partial``) and nothing more is written."""
        with self._lock:
            if self.report.partial:
                return
            try:
                if self._collectives.pending:  # collectives launched before: written where it follows them
                    self._collectives.before(event, self._unlocked)
                self._dispatch[type(event)](event)
            except Exception as exc:  # a callback must never break the program
                problem = f"{type(event).__name__}: {type(exc).__name__}: {exc}"
                self.report.errors.append(problem)
                self.report.partial = f"the recorder stopped at its first error: {problem}"
                self._region.abort()

    @contextlib.contextmanager
    def _unlocked(self) -> Iterator[None]:
        """The translator's lock and the source's let go for the block (this thread holds them,
        inside handle): other threads' events are recorded meanwhile."""
        device = self.devices.current_ordinal  # this event's, whatever other threads' events say
        try:
            with released(self._lock), self.unlocked():
                yield
        finally:
            self.devices.current_ordinal = device

    @property
    def in_progress(self) -> bool:
        """Whether work is being recorded now (a region open, a kernel instance awaiting its end)."""
        return self._region.recording or self._launches.awaiting_end
