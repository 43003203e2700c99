"""CUDA graphs in the translator: executable graphs followed from their instantiation, graph
launches written as Graph objects and GraphLaunch operations.

An executable graph is described when it is instantiated, and again when cuGraphExecUpdate
gives it another graph; a node update (cuGraphExecKernelNodeSetParams and kin, a child graph
swapped in by cuGraphExecChildGraphNodeSetParams, an event changed) replaces the node it names,
and a node disabled with cuGraphNodeSetEnabled is written as an empty node until enabled again.
At its first launch in a region it becomes a :class:`model.Graph` object: kernel nodes
with relocations worked out exactly as for launches, copies and memsets with their buffers,
events, child graphs (written first) and the dependency edges. A launch snapshots every
allocation the graph touches first (as a launch does, before the launch runs) and writes a
GraphLaunch operation; the region's checkpoint covers what it wrote. An executable changed since
its last recorded launch, or one whose addresses may resolve differently because allocations
changed, is written again as a new Graph object when its nodes differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from replayfmt.capture import events as ev
from replayfmt.errors import ReplayUsageError
from replayfmt.format import model as m
from replayfmt.format.graph_records import check_graph_within_limits
from replayfmt.format.model import GraphNode, GraphNodeKind

if TYPE_CHECKING:
    from replayfmt.capture.allocations import Allocation, AllocationTable
    from replayfmt.capture.buffers import BufferObjects
    from replayfmt.capture.checkpoints import Checkpoints
    from replayfmt.capture.device_objects import DeviceObjects
    from replayfmt.capture.launches import KernelParameters
    from replayfmt.capture.modules import Modules
    from replayfmt.capture.regions import Refusals, Region
    from replayfmt.capture.report import Report
    from replayfmt.capture.starting_state import StartingState
    from replayfmt.capture.stream_events import Streams
    from replayfmt.writer import CaptureWriter

_N = GraphNodeKind


@dataclass
class GraphExecutable:
    """An executable graph of the program, and what was last written for it."""

    description: ev.GraphDescription
    graph: int = 0  # the Graph object of its last recorded launch (0: resolve it again at the next)
    epoch: int = -1  # the allocation table's epoch when ``graph`` was resolved
    targets: list[Allocation] = field(default_factory=list)
    kernels: list[ev.Kernel] = field(default_factory=list)  # one per kernel node
    broken: str = ""  # why its launches cannot be replayed ("" when they can)
    disabled: set[int] = field(default_factory=set)  # node handles disabled (cuGraphNodeSetEnabled): run as empty
    pointed: frozenset[int] = frozenset()  # the addresses its kernel nodes' parameters point at


class Unrecordable(Exception):
    """A graph node that cannot be written; the launch becomes an Unsupported operation."""


class GraphLaunches:
    """Graph events. Owns the program's executable graphs (by CUgraphExec handle: what each runs)
    and the Graph objects written (by value: an unchanged graph is written once)."""

    def __init__(
        self,
        *,
        writer: CaptureWriter,
        report: Report,
        allocations: AllocationTable,
        devices: DeviceObjects,
        region: Region,
        refusals: Refusals,
        streams: Streams,
        buffers: BufferObjects,
        modules: Modules,
        parameters: KernelParameters,
        state: StartingState,
        checkpoints: Checkpoints,
    ) -> None:
        self._writer = writer
        self._report = report
        self._allocations = allocations
        self._devices = devices
        self._region = region
        self._refusals = refusals
        self._streams = streams
        self._buffers = buffers
        self._modules = modules
        self._parameters = parameters
        self._state = state
        self._checkpoints = checkpoints
        self._executables: dict[int, GraphExecutable] = {}
        self._graph_ids: dict[m.Graph, int] = {}

    def on_graph_instantiated(self, event: ev.GraphInstantiated) -> None:
        self._executables[event.graph_exec] = GraphExecutable(event.graph)

    def on_graph_exec_destroyed(self, event: ev.GraphExecDestroyed) -> None:
        self._executables.pop(event.graph_exec, None)

    def on_graph_kernel_updated(self, event: ev.GraphKernelUpdated) -> None:
        info = ev.GraphNodeInfo(_N.KERNEL, kernel=event.kernel)
        missing = f"cuGraphExecKernelNodeSetParams changed node {event.node:#x}, no kernel node of it"
        self._update_node(event.graph_exec, event.node, info, missing)

    def on_graph_node_updated(self, event: ev.GraphNodeUpdated) -> None:
        missing = f"a {event.info.kind.name.lower()} node update named node {event.node:#x}, no such node"
        self._update_node(event.graph_exec, event.node, event.info, missing)

    def on_graph_node_enabled(self, event: ev.GraphNodeEnabled) -> None:
        """A disabled node is written as an empty node (its edges still order the others)."""
        executable = self._executables.get(event.graph_exec)
        if executable is None:
            return
        if not any(node.handle == event.node for node in executable.description.nodes):
            executable.broken = f"cuGraphNodeSetEnabled named node {event.node:#x}, no node of the executable graph"
            return
        before = set(executable.disabled)
        if event.enabled:
            executable.disabled.discard(event.node)
        else:
            executable.disabled.add(event.node)
        if executable.disabled != before:
            executable.graph = 0

    def _update_node(self, graph_exec: int, handle: int, info: ev.GraphNodeInfo, missing: str) -> None:
        """Node ``handle`` of the executable's graph becomes ``info`` (its graph is written again at
        the next launch); an update the recorder cannot read, or of no such node, refuses its
        later launches with the reason."""
        executable = self._executables.get(graph_exec)
        if executable is None:
            return
        if info.unsupported:
            executable.broken = info.unsupported
            return
        if _replace(executable.description, handle, info):
            executable.graph = 0
            return
        # a node the description does not hold: inside a node the recorder cannot read (a
        # conditional node's body: XLA's while loops), whose reason says more than the handle
        executable.broken = _unsupported_reason(executable.description) or missing

    def on_graph_launched(self, event: ev.GraphLaunched) -> None:
        if not self._region.recording:
            return
        executable = self._executables.get(event.graph_exec)
        if executable is None or executable.broken:
            reason = (
                executable.broken
                if executable is not None
                else f"the executable graph {event.graph_exec:#x} was instantiated before the recorder started"
            )
            self._refusals.refuse("cuGraphLaunch", reason, event.stream)
            return
        epoch = self._allocations.epoch
        if executable.graph == 0 or executable.epoch != epoch:
            try:
                graph, targets, kernels = self._graph_object(executable.description, executable.disabled)
            except Unrecordable as exc:
                self._refusals.refuse("cuGraphLaunch", str(exc), event.stream)
                return
            executable.graph = self._graph_id(graph)
            executable.epoch, executable.targets, executable.kernels = epoch, targets, kernels
            at = {a.buffer: a.address for a in targets}
            executable.pointed = frozenset(
                at[r.target_buffer] + r.target_offset
                for node in graph.nodes
                for r in node.relocations
                if r.site_buffer == 0 and r.target_buffer in at
            )
        self._checkpoints.pointed(executable.pointed)  # a framework's block free checkpoints what they wrote
        modules = {kernel.module: kernel for kernel in executable.kernels}  # their globals: asked at every launch
        module_globals = [a for kernel in modules.values() for a in self._modules.module_globals(kernel, event.stream)]
        for allocation in (*executable.targets, *module_globals):  # snapshots first: what the graph starts from
            self._state.touch_for_launch(allocation, event.stream, "")
            for reached in self._state.reached(allocation) if allocation.pointees else ():  # through stored pointers
                self._state.touch_for_launch(reached, event.stream, "")
        self._writer.graph_launch(executable.graph, self._streams.stream(event.stream))
        self._report.graph_launches += 1
        for kernel in executable.kernels:
            stats = self._report.kernel(kernel.name)
            stats.occurrences += 1
            stats.captured += 1

    def _graph_object(
        self, description: ev.GraphDescription, disabled: set[int] | None = None
    ) -> tuple[m.Graph, list[Allocation], list[ev.Kernel]]:
        """The Graph object of a description (child graphs written first), the allocations its
        nodes touch and its kernels (one per kernel node); ``disabled`` nodes (by
        handle) become empty nodes."""
        nodes: list[GraphNode] = []
        targets: list[Allocation] = []
        kernels: list[ev.Kernel] = []
        unsettled: list[tuple[int, ev.GraphNodeInfo, tuple[Allocation, ...]]] = []
        for info in description.nodes:
            if disabled and info.handle in disabled:
                nodes.append(GraphNode(kind=_N.EMPTY))
                continue
            if info.unsupported:
                raise Unrecordable(info.unsupported)
            node, touched, left = self._graph_node(info, kernels)
            if left:
                unsettled.append((len(nodes), info, left))
            nodes.append(node)
            targets.extend(a for a in touched if a not in targets)
        for at, info, left in unsettled:  # a later node reached what an earlier one left: again
            if any(a.buffer for a in left):
                nodes[at], touched, _ = self._graph_node(info, [])
                targets.extend(a for a in touched if a not in targets)
        edge_data = description.edge_data
        if disabled and edge_data:  # an empty node has no ports: its edges order it as full dependencies
            gone = {i for i, info in enumerate(description.nodes) if info.handle in disabled}
            edge_data = [
                m.FULL_DEPENDENCY if src in gone or dst in gone else data
                for (src, dst), data in zip(description.edges, edge_data, strict=True)
            ]
        graph = m.Graph(
            device=self._devices.current,
            nodes=tuple(nodes),
            edges=tuple(description.edges),
            edge_data=m.kept_edge_data(edge_data),
        )
        try:
            check_graph_within_limits(graph)  # more nodes or edges than a reader decodes: the launch is refused
        except ReplayUsageError as exc:
            raise Unrecordable(str(exc)) from None
        return graph, targets, kernels

    def _graph_node(
        self, info: ev.GraphNodeInfo, kernels: list[ev.Kernel]
    ) -> tuple[GraphNode, list[Allocation], tuple[Allocation, ...]]:
        """A node of the Graph object, the allocations it touches, and those a kernel node's
        words that may be data point into but nothing reached yet (ParameterPointers.unsettled)."""
        kind = info.kind
        if kind == _N.KERNEL and info.kernel is not None:
            call = info.kernel
            shape = self._parameters.shape(call.kernel)
            if shape.collective:
                raise Unrecordable(f"{call.kernel.name} is a collective (NCCL) kernel")
            if self._modules.loaded(call.kernel.module) is None:  # (checked here: function() would refuse a launch)
                raise Unrecordable(f"the module of {call.kernel.name} was loaded before the recorder started")
            function = self._modules.function(call.kernel)
            if function is None:
                raise Unrecordable(f"the module of {call.kernel.name} was not recorded")
            relocations, touched, unsettled = self._parameters.pointers(call.parameters, shape)
            kernels.append(call.kernel)
            node = GraphNode(
                kind=kind,
                executable=function[0],
                function=function[1],
                grid=call.grid,
                block=call.block,
                cluster=call.cluster,
                shared_memory=call.shared_memory,
                parameters=call.parameters,
                relocations=relocations,
            )
            return node, touched, unsettled
        if kind == _N.MEMCPY:
            src, dst = self._node_allocation(info.src, False), self._node_allocation(info.dst, False)
            node = GraphNode(
                kind=kind,
                src_buffer=src.buffer,
                src_offset=info.src - src.address,
                dst_buffer=dst.buffer,
                dst_offset=info.dst - dst.address,
                size=info.size,
            )
            return node, [src, dst], ()
        if kind == _N.MEMSET:
            dst = self._node_allocation(info.dst, True)
            node = GraphNode(
                kind=kind,
                dst_buffer=dst.buffer,
                dst_offset=info.dst - dst.address,
                value=info.value,
                element_size=info.element_size,
                width=info.width,
                height=info.height,
                pitch=info.pitch,
            )
            return node, [dst], ()
        if kind in (_N.EVENT_RECORD, _N.EVENT_WAIT):
            return GraphNode(kind=kind, event=self._streams.event(info.event)), [], ()
        if kind == _N.CHILD_GRAPH and info.child is not None:
            child, touched, names = self._graph_object(info.child)
            kernels.extend(names)
            return GraphNode(kind=kind, graph=self._graph_id(child)), touched, ()
        return GraphNode(kind=kind), [], ()

    def _graph_id(self, graph: m.Graph) -> int:
        gid = self._graph_ids.get(graph)
        if gid is None:
            gid = self._graph_ids[graph] = self._writer.add_object(graph)
            self._report.graphs += 1
        return gid

    def _node_allocation(self, address: int, host_visible: bool) -> Allocation:
        table = self._allocations
        allocation = table.kernel_allocation(address) if host_visible else table.device_allocation(address)
        if allocation is None:
            raise Unrecordable(f"a graph node uses address {address:#x}, in no recorded allocation")
        self._buffers.of(allocation)
        return allocation


def _replace(description: ev.GraphDescription, handle: int, info: ev.GraphNodeInfo) -> bool:
    """Put ``info`` in place of node ``handle`` of the same kind, in ``description`` or in one of
    its child graphs (a node of a child graph can be updated through the executable too)."""
    for index, node in enumerate(description.nodes):
        if node.handle == handle and node.kind == info.kind:
            info.handle = handle
            if node.kernel is not None and info.kernel is not None and not any(info.kernel.cluster):
                info.kernel.cluster = node.kernel.cluster  # a launch attribute: new parameters keep it
            description.nodes[index] = info
            return True
    return any(node.child is not None and _replace(node.child, handle, info) for node in description.nodes)


def _unsupported_reason(description: ev.GraphDescription) -> str:
    for node in description.nodes:
        if node.unsupported:
            return node.unsupported
        if node.child is not None and (reason := _unsupported_reason(node.child)):
            return reason
    return ""
