"""CUDA graphs in the translator: stream capture followed, graphs written, graph launches recorded.

While a stream captures (cuStreamBeginCapture .. cuStreamEndCapture) its work goes into a graph,
not to the device: launches, copies, memsets and event records on it, and on every stream that
joins the capture by waiting on an event recorded in it, are neither recorded nor snapshotted
(a snapshot would synchronise a capturing stream and break the program's capture).

An executable graph is described when it is instantiated (and when it is updated); at its first
launch in a region it becomes a :class:`model.Graph` object: kernel nodes with relocations worked
out exactly as for launches, copies and memsets with their buffers, events, child graphs, and the
dependency edges. A launch snapshots every allocation the graph touches (as a launch does) and
writes a GraphLaunch operation; the region's checkpoint covers what it wrote. An executable
changed since its last recorded launch, or one whose addresses may resolve differently because
allocations changed, is written again as a new Graph object when its nodes differ.

:class:`GraphTranslation` is a part of :class:`replayfmt.capture.translate.Translator`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from replayfmt.capture import events as ev
from replayfmt.capture.allocations import Allocation
from replayfmt.format import model as m

_N = m.GraphNodeKind
_STREAM_BOUND = (ev.LaunchBegin, ev.LaunchEnd, ev.Copy, ev.Memset, ev.GraphLaunched, ev.StreamSynchronized)


@dataclass
class _Executable:
    """An executable graph of the program, and what was last written for it."""

    description: ev.GraphDescription
    graph: int = 0  # the Graph object of its last recorded launch (0: write one before the next)
    epoch: int = -1  # the allocation table's epoch when ``graph`` was resolved
    written: m.Graph | None = None
    targets: list[Allocation] = field(default_factory=list)
    kernels: list[str] = field(default_factory=list)
    broken: str = ""  # why its launches cannot be replayed ("" when they can)


@dataclass
class GraphState:
    """The translator's view of the program's graphs and stream captures."""

    capturing: dict[int, int] = field(default_factory=dict)  # stream handle -> its capture's origin stream
    captured_events: dict[int, int] = field(default_factory=dict)  # event recorded in a capture -> origin
    executables: dict[int, _Executable] = field(default_factory=dict)  # CUgraphExec handle -> state


class _Unreplayable(Exception):
    """A graph node that cannot be written; the launch becomes an Unsupported operation."""


class GraphTranslation:
    """The graph half of the Translator (which provides the attributes used here)."""

    _graphs: GraphState
    allocations: Any
    writer: Any

    def _in_stream_capture(self, event: Any) -> bool:
        """Whether ``event`` is work captured into a graph (so not sent to the device now)."""
        state = self._graphs
        kind = type(event)
        if kind in _STREAM_BOUND:
            return event.stream in state.capturing
        if kind is ev.EventRecorded:
            origin = state.capturing.get(event.stream)
            if origin is None:
                state.captured_events.pop(event.event, None)  # recorded for real again
                return False
            state.captured_events[event.event] = origin
            return True
        if kind is ev.StreamWaited:
            if event.stream in state.capturing:
                return True
            origin = state.captured_events.get(event.event)
            if origin is None:
                return False
            state.capturing[event.stream] = origin  # the stream joins the capture
            return True
        return False

    def _on_capture_began(self, event: ev.StreamCaptureBegan) -> None:
        self._graphs.capturing[event.stream] = event.stream

    def _on_capture_ended(self, event: ev.StreamCaptureEnded) -> None:
        state = self._graphs
        origin = state.capturing.get(event.stream, event.stream)
        state.capturing = {s: o for s, o in state.capturing.items() if o != origin}
        state.captured_events = {e: o for e, o in state.captured_events.items() if o != origin}

    def _on_graph_instantiated(self, event: ev.GraphInstantiated) -> None:
        self._graphs.executables[event.executable] = _Executable(event.graph)

    def _on_graph_kernel_updated(self, event: ev.GraphKernelUpdated) -> None:
        executable = self._graphs.executables.get(event.executable)
        if executable is None:
            return
        for node in executable.description.nodes:
            if node.handle == event.node and node.kind == _N.KERNEL:
                node.kernel = event.kernel
                executable.graph = 0
                return
        executable.broken = f"cuGraphExecKernelNodeSetParams changed node {event.node:#x}, which is no kernel node"

    def _on_graph_launched(self, event: ev.GraphLaunched) -> None:
        if not self._recording:  # type: ignore[attr-defined]
            return
        executable = self._graphs.executables.get(event.executable)
        if executable is None or executable.broken:
            reason = executable.broken if executable is not None else (
                f"the executable graph {event.executable:#x} was instantiated before recording started; "
                "start the recorder first (python -m replayfmt.capture)")  # fmt: skip
            self._unsupported("cuGraphLaunch", reason, event.stream)  # type: ignore[attr-defined]
            return
        epoch = self.allocations.epoch
        if executable.graph == 0 or executable.epoch != epoch:
            try:
                graph, targets, kernels = self._graph_object(executable.description)
            except _Unreplayable as exc:
                self._unsupported("cuGraphLaunch", str(exc), event.stream)  # type: ignore[attr-defined]
                return
            if graph != executable.written:
                executable.graph, executable.written = self.writer.add_object(graph), graph
            executable.epoch, executable.targets, executable.kernels = epoch, targets, kernels
        for allocation in executable.targets:
            self._touch(allocation, event.stream, "")  # type: ignore[attr-defined]
        self.writer.graph_launch(executable.graph, self._stream(event.stream))  # type: ignore[attr-defined]
        for name in executable.kernels:
            stats = self.report.kernel(name)  # type: ignore[attr-defined]
            stats.occurrences += 1
            stats.captured += 1

    def _graph_object(self, description: ev.GraphDescription) -> tuple[m.Graph, list[Allocation], list[str]]:
        """The Graph object of a description (child graphs written first), the allocations its
        nodes touch and the names of its kernels."""
        nodes: list[m.GraphNode] = []
        targets: list[Allocation] = []
        kernels: list[str] = []
        for info in description.nodes:
            if info.unsupported:
                raise _Unreplayable(info.unsupported)
            node, touched = self._graph_node(info, targets, kernels)
            nodes.append(node)
            targets.extend(a for a in touched if a not in targets)
        device = self._device  # type: ignore[attr-defined]
        return m.Graph(device=device, nodes=tuple(nodes), edges=tuple(description.edges)), targets, kernels

    def _graph_node(
        self, info: ev.GraphNodeInfo, targets: list[Allocation], kernels: list[str]
    ) -> tuple[m.GraphNode, list[Allocation]]:
        kind = info.kind
        if kind == _N.KERNEL and info.kernel is not None:
            call = info.kernel
            shape = self._shape(call.kernel)  # type: ignore[attr-defined]
            if shape.collective:
                raise _Unreplayable(f"{call.kernel.name} is a collective (NCCL) kernel")
            function = self._function(call.kernel)  # type: ignore[attr-defined]
            if function is None:
                raise _Unreplayable(f"the module of {call.kernel.name} was not recorded")
            relocations, touched = self._relocations(call.parameters, shape)  # type: ignore[attr-defined]
            kernels.append(call.kernel.name)
            node = m.GraphNode(kind=kind, executable=function[0], function=function[1], grid=call.grid,
                               block=call.block, cluster=call.cluster, shared_memory=call.shared_memory,
                               parameters=call.parameters, relocations=relocations)  # fmt: skip
            return node, touched
        if kind == _N.MEMCPY:
            src, dst = self._graph_allocation(info.src), self._graph_allocation(info.dst)
            node = m.GraphNode(kind=kind, src_buffer=src.buffer, src_offset=info.src - src.address,
                               dst_buffer=dst.buffer, dst_offset=info.dst - dst.address, size=info.size)  # fmt: skip
            return node, [src, dst]
        if kind == _N.MEMSET:
            dst = self._graph_allocation(info.dst)
            node = m.GraphNode(kind=kind, dst_buffer=dst.buffer, dst_offset=info.dst - dst.address, value=info.value,
                               element_size=info.element_size, width=info.width, height=info.height,
                               pitch=info.pitch)  # fmt: skip
            return node, [dst]
        if kind in (_N.EVENT_RECORD, _N.EVENT_WAIT):
            return m.GraphNode(kind=kind, event=self._event(info.event)), []  # type: ignore[attr-defined]
        if kind == _N.CHILD_GRAPH and info.child is not None:
            child, touched, names = self._graph_object(info.child)
            kernels.extend(names)
            return m.GraphNode(kind=kind, graph=self.writer.add_object(child)), touched
        return m.GraphNode(kind=kind), []

    def _graph_allocation(self, address: int) -> Allocation:
        allocation = self.allocations.device_allocation(address)
        if allocation is None:
            raise _Unreplayable(f"a graph node uses address {address:#x}, in no recorded allocation")
        self._buffer(allocation)  # type: ignore[attr-defined]
        return allocation


GRAPH_HANDLERS = {
    ev.StreamCaptureBegan: GraphTranslation._on_capture_began,
    ev.StreamCaptureEnded: GraphTranslation._on_capture_ended,
    ev.GraphInstantiated: GraphTranslation._on_graph_instantiated,
    ev.GraphKernelUpdated: GraphTranslation._on_graph_kernel_updated,
    ev.GraphLaunched: GraphTranslation._on_graph_launched,
}
"""The Translator's handlers for graph events (merged into its dispatch table)."""
