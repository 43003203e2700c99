"""Steps: the capture turned into driver calls ready to issue, in capture order.

Each :class:`Step` is one call (``fn(*args)``) with its kind and the index of the operation it
comes from; a run issues them one after another. Building them resolves streams, events,
buffers, staged uploads and packed launches, so issuing does no lookups: all at setup, or (the
first run of run-replay) a stretch at a time just before the run issues it.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, NamedTuple

from replayfmt.container.batches import collector_paused
from replayfmt.errors import ReplayUsageError
from replayfmt.format import model as m
from replayfmt.replay.buffers import PinnedSlabs
from replayfmt.replay.collectives import CollectiveRuntime
from replayfmt.replay.devices import Devices
from replayfmt.replay.graphs import GraphBuilder, PreparedGraph
from replayfmt.replay.launches import PreparedLaunch, launch_config_copy, prepare_launch
from replayfmt.replay.modules import Modules
from replayfmt.replay.plan import Plan, collective_upload, upload_key
from replayfmt.replay.staging import Staged
from replayfmt.replay.state import StateSetter
from replayfmt.replay.streams import Streams
from replayfmt.replay.verify import Verifier

_K = m.OperationKind


class StepKind(enum.Enum):
    """What a step does."""

    SET_CONTEXT = "set context"  # make another device's context current
    POINTER_SITE = "pointer site"  # write a relocated pointer that lives in device memory
    LAUNCH = "launch"  # cuLaunchKernel
    LAUNCH_EX = "launch with config"  # cuLaunchKernelEx: clusters, cooperative launches
    UPLOAD = "upload"  # from a staged copy (device or pinned host memory)
    DOWNLOAD = "download"
    CHECK_DOWNLOAD = "check download"  # compare a download with the captured bytes (verification)
    COPY = "copy"  # device to device
    MEMSET = "memset"
    EVENT_RECORD = "event record"
    STREAM_WAIT = "stream wait"
    SYNCHRONIZE = "synchronize"  # a captured host synchronisation (stream, event or device)
    CHECKPOINT = "checkpoint"  # compare or save buffers (verification, --save-output)
    STATE = "state"  # set the starting state of the region beginning here (not the program's work)
    NVTX_PUSH = "nvtx push"
    NVTX_POP = "nvtx pop"
    TAG = "tag"  # a host-side marker for the clock (CUPTI external correlation push or pop)
    GRAPH_LAUNCH = "graph launch"  # cuGraphLaunch of a graph rebuilt at setup (replay/graphs.py)
    COLLECTIVE = "collective"  # among the other ranks' replays, or its received bytes put in place
    COLLECTIVE_GROUP = "collective group"  # open or close a group of collectives


class Step(NamedTuple):
    """One call of a replay: ``fn(*args)``, from operation ``operation``. A named tuple: a replay
    builds one per call (700k for a large capture) and issues them with tuple unpacking."""

    kind: StepKind
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    operation: int

    def with_args(self, args: tuple[Any, ...]) -> Step:
        return self._replace(args=args)


@dataclass
class BuiltSteps:
    """The steps of a capture, and what they point into (kept alive as long as they are)."""

    steps: list[Step]
    launches: list[PreparedLaunch]
    kernel_names: dict[int, str]  # launch operation index -> kernel name
    op_streams: dict[int, Any]  # operation index -> the stream its steps run on
    graphs: dict[int, PreparedGraph] = dataclasses.field(default_factory=dict)  # graph launch index -> its graph
    graph_builder: GraphBuilder | None = None


class StepBuilder:
    """Turns the capture's operations into steps, in capture order: all at once (:meth:`finish`)
    or a stretch at a time (:meth:`extend`), so that a replay can issue the steps built so far
    while it builds the next ones (the device starts at once; building overlaps its work).

    Checkpoints are built only when verifying or saving, download checks only when verifying,
    NVTX ranges only with an ``nvtx`` library. Cheap per operation (a capture may hold 700k):
    one type test per record, no closure per operation, and launches that agree in everything
    but their index share one packed launch, extended ones their launch config too (its
    arguments are immutable: a shape change replaces a step's arguments, or its config with a
    copy, never what is shared). A failure while building is raised again by every later call:
    the steps stop where it happened."""

    def __init__(
        self,
        devices: Devices,
        plan: Plan,
        *,
        modules: Modules,
        addresses: dict[int, int],
        streams: Streams,
        staged: dict[Any, Staged],
        verifier: Verifier,
        state: StateSetter,
        verify: bool,
        save_output: bool,
        nvtx: Any | None,
        collectives: CollectiveRuntime | None = None,
    ) -> None:
        self.devices, self.plan, self.modules, self.addresses = devices, plan, modules, addresses
        self.collectives = collectives if collectives is not None else CollectiveRuntime(None)
        self._group = 0  # the group of collectives open at the last step built (0: none)
        self.streams, self.staged, self.verifier, self.state = streams, staged, verifier, state
        self.verify, self.save_output, self.nvtx = verify, save_output, nvtx
        self.built = BuiltSteps([], [], {}, {})
        self.built.graph_builder = GraphBuilder(devices, plan, modules, addresses, streams.events)
        self.done = False
        self._operations = plan.capture.iter_operations()
        self._packed: dict[tuple[Any, ...], PreparedLaunch] = {}  # (device, the launch but its index) -> packed
        self._current = 0  # the device whose context is current when the next step runs (runs start on the first)
        self._pinned = PinnedSlabs(devices)  # downloads' destinations, stored pointers' values
        self._failure: Exception | None = None
        self.seconds = 0.0  # spent building so far

    def finish(self) -> BuiltSteps:
        """Build every step not built yet; the steps, complete."""
        while self.extend(1 << 30):
            pass
        return self.built

    def check(self) -> None:
        """Raise again what stopped an earlier build (the steps end where it happened)."""
        if self._failure is not None:
            raise self._failure

    def extend(self, operations: int) -> bool:
        """Build the steps of up to ``operations`` more operations (appended to ``built.steps``);
        False once every operation's steps are built."""
        self.check()
        if self.done:
            return False
        started = time.perf_counter()
        try:
            with collector_paused():  # a record per operation, and no cycles (see container.batches)
                self._build(islice(self._operations, operations), operations)
        except Exception as exc:
            self._failure = exc
            raise
        finally:
            self.seconds += time.perf_counter() - started
        return not self.done

    def _build(self, operations: Iterator[m.Operation], wanted: int) -> None:
        devices, plan, modules, A, nvtx = self.devices, self.plan, self.modules, self.addresses, self.nvtx
        verify, save_output, staged, verifier, state = (
            self.verify,
            self.save_output,
            self.staged,
            self.verifier,
            self.state,
        )
        cu = devices.cu
        built = self.built
        append = built.steps.append
        op_streams = built.op_streams
        kernel_names = built.kernel_names
        graphs = built.graph_builder
        assert graphs is not None
        events, handles, defaults = self.streams.events, self.streams.handles, self.streams.defaults
        several = devices.several
        peers = self.collectives.peers is not None  # collectives issued among other ranks' replays
        overrides, host_waits = plan.overrides, plan.host_waits
        packed = self._packed
        launch_call, launch_ex_call, record_call, wait_call = (
            cu.cuLaunchKernel,
            cu.cuLaunchKernelEx,
            cu.cuEventRecord,
            cu.cuStreamWaitEvent,
        )
        current = self._current
        seen = 0
        for op in operations:
            seen += 1
            index = op.index
            cls = type(op)
            if index in plan.state:  # the starting state of the region beginning here (hoisted)
                append(Step(StepKind.STATE, state.apply, (index, plan.state[index]), index))
                current = 0  # it leaves the first device's context current
            gpu = devices.operation_device(op, plan, self.streams.device_of) if several else 0
            if gpu is not None and gpu != current:
                append(Step(StepKind.SET_CONTEXT, cu.cuCtxSetCurrent, (devices.gpus[gpu].ctx,), index))
                current = gpu
            if cls is m.CreateObject or cls is m.DestroyObject:  # done at setup (a program may make 200k events)
                continue
            group = op.group if cls is m.Collective and peers else 0  # alone, no groups to keep
            if group != self._group:  # a group of collectives ends where another operation follows
                if self._group:
                    append(Step(StepKind.COLLECTIVE_GROUP, self.collectives.group, (False,), index))
                if group:
                    append(Step(StepKind.COLLECTIVE_GROUP, self.collectives.group, (True,), index))
                self._group = group
            captured = getattr(op, "stream", 0)
            stream = op_streams[index] = handles[captured] if captured else defaults[gpu or 0]
            override = overrides.get(index) if cls is m.Launch else None
            if (override is not None and override.skip) or (cls is m.Launch and index in host_waits):
                pass  # --launch OP:skip, or a wait for a host write no replay makes: not run at all
            elif cls is m.Launch:
                key = (gpu, *op[1:])
                launch = packed.get(key) if override is None else None  # an overridden launch is its own
                if launch is None:
                    launch = prepare_launch(devices, plan, modules, A, op, stream, gpu or 0, self._pinned)
                    built.launches.append(launch)
                    if index not in overrides:
                        packed[key] = launch
                for site, value in launch.buffer_sites:
                    append(Step(StepKind.POINTER_SITE, cu.cuMemcpyHtoDAsync, (site, value, 8, stream), index))
                if nvtx is not None:
                    append(Step(StepKind.NVTX_PUSH, nvtx.push, (launch.name.encode(),), index))
                if launch.extended:
                    append(Step(StepKind.LAUNCH_EX, launch_ex_call, launch.args, index))
                else:
                    append(Step(StepKind.LAUNCH, launch_call, launch.args, index))
                if nvtx is not None:
                    append(Step(StepKind.NVTX_POP, nvtx.pop, (), index))
                kernel_names[index] = launch.name
            elif cls is m.EventRecord:
                append(Step(StepKind.EVENT_RECORD, record_call, (events[op.event], stream), index))
            elif cls is m.StreamWaitEvent:
                append(Step(StepKind.STREAM_WAIT, wait_call, (stream, events[op.event], 0), index))
            elif cls is m.Copy:
                if op.kind == _K.COPY_HOST_TO_DEVICE:
                    source = staged[upload_key(op)]
                    args = (A[op.dst_buffer] + op.dst_offset, source.address, op.size, stream)
                    append(Step(StepKind.UPLOAD, source.copy_call(cu), args, index))
                elif op.kind == _K.COPY_DEVICE_TO_HOST:
                    host = self._pinned.take(op.size, f"operation {index}")
                    args = (host, A[op.src_buffer] + op.src_offset, op.size, stream)
                    append(Step(StepKind.DOWNLOAD, cu.cuMemcpyDtoHAsync, args, index))
                    if op.payload and verify:
                        append(Step(StepKind.CHECK_DOWNLOAD, verifier.check_download, (op, host), index))
                        current = 0  # it synchronises every device
                else:
                    if several:  # between two devices' memory: peer to peer where they can, as programs copy
                        for buffer in (op.src_buffer, op.dst_buffer):
                            devices.peer_access(gpu or 0, devices.index(plan.buffers[buffer].device), op)
                    args = (A[op.dst_buffer] + op.dst_offset, A[op.src_buffer] + op.src_offset, op.size, stream)
                    append(Step(StepKind.COPY, cu.cuMemcpyDtoDAsync, args, index))
            elif cls is m.GraphLaunch:
                graph = graphs.prepared(op, gpu or 0)
                for site, value in (s for launch in graph.launches for s in launch.buffer_sites):
                    append(Step(StepKind.POINTER_SITE, cu.cuMemcpyHtoDAsync, (site, value, 8, stream), index))
                if nvtx is not None:
                    append(Step(StepKind.NVTX_PUSH, nvtx.push, (graph.name.encode(),), index))
                append(Step(StepKind.GRAPH_LAUNCH, cu.cuGraphLaunch, (graph.executable, stream), index))
                if nvtx is not None:
                    append(Step(StepKind.NVTX_POP, nvtx.pop, (), index))
                kernel_names[index] = graph.name
                built.graphs[index] = graph
            elif cls is m.Collective:
                collective = self._collective(op, stream)
                if collective is not None:
                    append(collective)
            elif cls is m.Memset:
                fn = {1: cu.cuMemsetD8Async, 2: cu.cuMemsetD16Async, 4: cu.cuMemsetD32Async}[op.element_size]
                append(Step(StepKind.MEMSET, fn, (A[op.buffer] + op.offset, op.value, op.count, stream), index))
            elif cls is m.StreamSynchronize:
                append(Step(StepKind.SYNCHRONIZE, cu.cuStreamSynchronize, (stream,), index))
            elif cls is m.DeviceSynchronize:
                append(Step(StepKind.SYNCHRONIZE, cu.cuCtxSynchronize, (), index))
            elif cls is m.EventSynchronize:
                append(Step(StepKind.SYNCHRONIZE, cu.cuEventSynchronize, (events[op.event],), index))
            elif cls is m.Checkpoint and (verify or save_output):
                append(Step(StepKind.CHECKPOINT, verifier.checkpoint, (op,), index))
                current = 0  # it synchronises every device
            elif cls is m.ScopeBegin and nvtx is not None:
                append(Step(StepKind.NVTX_PUSH, nvtx.push, (op.name.encode(),), index))
            elif cls is m.ScopeEnd and nvtx is not None:
                append(Step(StepKind.NVTX_POP, nvtx.pop, (), index))
            # create, destroy, module load: done at setup; scopes: markers only
        self._current = current
        if seen < wanted:
            self.done = True
            if self._group:
                append(Step(StepKind.COLLECTIVE_GROUP, self.collectives.group, (False,), built.steps[-1].operation))
                self._group = 0

    def _collective(self, op: m.Collective, stream: Any) -> Step | None:
        """A collective's step: among the peers (or, when the verification's own replays turn them
        off, its received bytes put in place); replayed alone, a plain upload the C loop issues
        (None for a call that receives nothing)."""
        A = self.addresses
        send = A[op.send_buffer] + op.send_offset if op.send_size else 0
        recv = A[op.recv_buffer] + op.recv_offset if op.recv_size else 0
        upload, upload_args = None, ()
        if op.recv_size:  # what it received, put in place on its stream
            source = self.staged[upload_key(collective_upload(op))]
            upload, upload_args = source.copy_call(self.devices.cu), (recv, source.address, op.recv_size, stream)
        if self.collectives.peers is None:
            return Step(StepKind.UPLOAD, upload, upload_args, op.index) if upload is not None else None
        args = (op, send, recv, stream, upload, upload_args)
        return Step(StepKind.COLLECTIVE, self.collectives.issue, args, op.index)


def set_launch_shape(cu: Any, steps: list[Step], index: int, grid: m.Dims, block: m.Dims, shared_memory: int) -> None:
    """Change the shape of launch operation ``index`` in ``steps`` (for tuning); ``cu``: the
    driver module (an extended launch gets a config of its own)."""
    for k, step in enumerate(steps):
        if step.operation != index:
            continue
        if step.kind is StepKind.LAUNCH:
            handle, *_, stream, params, extra = step.args
            steps[k] = step.with_args((handle, *grid, *block, shared_memory, stream, params, extra))
            return
        if step.kind is StepKind.LAUNCH_EX:  # the config may be shared with other launches: a copy
            config = launch_config_copy(cu, step.args[0], shape=(grid, block, shared_memory))
            steps[k] = step.with_args((config, *step.args[1:]))
            return
    raise ReplayUsageError(f"operation {index} is not a launch of this replay")


def reshape_graph_node(built: BuiltSteps, graph: int, node: int, grid: m.Dims, block: m.Dims, smem: int) -> None:
    """Change the shape of kernel node ``node`` of Graph object ``graph`` (for tuning): the
    graphs are built and instantiated again and their launch steps run the new executables."""
    if built.graph_builder is None:
        raise ReplayUsageError(f"graph {graph} is launched nowhere in this replay")
    rebuilt = built.graph_builder.reshape(graph, node, grid, block, smem)
    for k, step in enumerate(built.steps):
        if step.kind is StepKind.GRAPH_LAUNCH and step.operation in rebuilt:
            prepared = built.graphs[step.operation] = rebuilt[step.operation]
            built.steps[k] = step.with_args((prepared.executable, *step.args[1:]))


def retarget_functions(steps: list[Step], old_to_new: dict[int, Any]) -> None:
    """Point launches at other functions: ``id(old handle) -> new handle`` (a re-JITted module)."""
    for k, step in enumerate(steps):
        if step.kind is StepKind.LAUNCH and id(step.args[0]) in old_to_new:
            steps[k] = step.with_args((old_to_new[id(step.args[0])], *step.args[1:]))
        elif step.kind is StepKind.LAUNCH_EX and id(step.args[1]) in old_to_new:
            steps[k] = step.with_args((step.args[0], old_to_new[id(step.args[1])], *step.args[2:]))


def wrap_with_events(steps: list[Step], index: int, stream: Any, before: Any, after: Any, record: Any) -> None:
    """Record ``before``/``after`` on ``stream`` around operation ``index``'s steps (``record``:
    cuEventRecord)."""
    positions = [k for k, step in enumerate(steps) if step.operation == index]
    if not positions:
        raise ReplayUsageError(f"operation {index} has no device work to time")
    steps.insert(positions[-1] + 1, Step(StepKind.EVENT_RECORD, record, (after, stream), index))
    steps.insert(positions[0], Step(StepKind.EVENT_RECORD, record, (before, stream), index))


def bracket_with_events(
    steps: Sequence[Step], events: dict[int, tuple[Any, Any]], streams: dict[int, Any], record: Any
) -> list[Step]:
    """``steps`` with each run of steps of an operation in ``events`` bracketed by recording its
    (before, after) events on the operation's stream (``record``: cuEventRecord)."""
    out = []
    for i, step in enumerate(steps):
        index = step.operation
        pair = events.get(index)
        first = pair is not None and (i == 0 or steps[i - 1].operation != index)
        last = pair is not None and (i + 1 == len(steps) or steps[i + 1].operation != index)
        if first:
            out.append(Step(StepKind.EVENT_RECORD, record, (pair[0], streams.get(index)), index))
        out.append(step)
        if last:
            out.append(Step(StepKind.EVENT_RECORD, record, (pair[1], streams.get(index)), index))
    return out
