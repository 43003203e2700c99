"""CUDA graphs at replay: each captured Graph rebuilt once, at setup, with its captured topology
(cuGraphCreate and cuGraphAdd*Node with the captured dependencies), its kernel nodes packed as
launches are (relocated parameters, substituted functions), instantiated once; a GraphLaunch
operation is then one cuGraphLaunch.

Node parameters go to the driver as C structs written in place (the layouts of cuda.h, x86-64),
wrapped by the bindings' struct types, as the recorder reads them.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from replayfmt.cuda.driver import check
from replayfmt.errors import DeviceError, ReplayUsageError, UnsupportedOperationError
from replayfmt.format import model as m
from replayfmt.format.model import GraphNode, GraphNodeKind
from replayfmt.replay.buffers import PinnedSlabs
from replayfmt.replay.devices import Devices
from replayfmt.replay.graph_plan import children_first, node_launch, topological_order
from replayfmt.replay.launches import PROGRAMMATIC_ARCH, PreparedLaunch, prepare_launch
from replayfmt.replay.modules import Modules
from replayfmt.replay.plan import Plan

_N = GraphNodeKind
_KERNEL = struct.Struct("<Q7I4xQQQQ")  # CUDA_KERNEL_NODE_PARAMS (v2)
_MEMSET = struct.Struct("<QQIIQQ")  # CUDA_MEMSET_NODE_PARAMS
_MEMCPY3D_SIZE = 200
_MEMORY_DEVICE = 2  # CUmemorytype


STREAM = object()
"""Stands for the stream in a :class:`NodeCall`'s arguments."""


@dataclass(frozen=True)
class NodeCall:
    """One node of a graph as the eager call doing its work on a stream (``STREAM`` in ``args``):
    per-kernel timing runs a graph node by node, in an order its edges allow."""

    label: str  # the kernel's name, or the node kind
    fn: Any
    args: tuple[Any, ...]
    kernel: bool
    node: str = ""  # which node: its index in the graph ("3"), in a child graph "3.0"

    def on(self, stream: Any) -> tuple[Any, ...]:
        return tuple(stream if a is STREAM else a for a in self.args)


@dataclass
class _Built:
    graph: Any  # CUgraph
    launches: list[PreparedLaunch] = field(default_factory=list)  # its kernel nodes, children's included
    calls: list[NodeCall] = field(default_factory=list)


@dataclass
class PreparedGraph:
    """One captured graph, instantiated on one device."""

    executable: Any  # CUgraphExec
    graph: Any  # the CUgraph it was instantiated from (a child node of a graph being captured)
    launches: list[PreparedLaunch]  # its kernel nodes (their pointer sites are written before each launch)
    calls: list[NodeCall]  # its nodes as eager calls, in topological order (children flattened)

    @property
    def name(self) -> str:
        return f"graph of {sum(c.kernel for c in self.calls)} kernels"


def _edge_data(cu: Any, edge: m.GraphEdgeData) -> Any:
    """The CUgraphEdgeData of an edge that is not a full dependency."""
    data = cu.CUgraphEdgeData()
    data.from_port, data.to_port, data.type = int(edge.from_port), int(edge.to_port), int(edge.type)
    return data


def _struct(cu: Any, type_name: str, raw: bytes, keep: list[Any]) -> Any:
    """A bindings struct over C bytes ``raw`` (kept alive in ``keep``)."""
    memory = ctypes.create_string_buffer(raw, len(raw))
    keep.append(memory)
    return getattr(cu, type_name)(ctypes.addressof(memory))


class GraphBuilder:
    """Builds the plan's graphs for one replay; each (graph, device) is built once."""

    def __init__(
        self, devices: Devices, plan: Plan, modules: Modules, addresses: dict[int, int], events: dict[int, Any]
    ) -> None:
        self.devices = devices
        self.plan = plan
        self.modules = modules
        self.addresses = addresses
        self.events = events
        self._graphs: dict[tuple[int, int], _Built] = {}  # (graph id, gpu) -> its CUgraph
        self._prepared: dict[tuple[int, int], PreparedGraph] = {}
        self._keep: list[Any] = []
        self._launched: dict[int, tuple[m.GraphLaunch, int]] = {}  # graph launch index -> (operation, gpu)
        self._shapes: dict[tuple[int, int], tuple[m.Dims, m.Dims, int]] = {}  # (graph, node) -> tuned shape
        self._host = PinnedSlabs(devices)  # the values of pointers stored in device memory

    def prepared(self, op: m.GraphLaunch, gpu: int) -> PreparedGraph:
        """The instantiated graph that operation ``op`` launches on device ``gpu``."""
        key = (op.graph, gpu)
        self._launched[op.index] = (op, gpu)
        prepared = self._prepared.get(key)
        if prepared is None:
            cu = self.devices.cu
            built = self._graph(op.graph, op.index, gpu)
            where = f"operation {op.index}: graph {op.graph}"
            executable = check(cu.cuGraphInstantiate(built.graph, 0), f"{where}: cuGraphInstantiate")
            self.devices.own(lambda: cu.cuGraphExecDestroy(executable))
            prepared = self._prepared[key] = PreparedGraph(executable, built.graph, built.launches, built.calls)
        return prepared

    def reshape(
        self, graph_id: int, node: int, grid: m.Dims, block: m.Dims, shared_memory: int
    ) -> dict[int, PreparedGraph]:
        """Give kernel node ``node`` of Graph ``graph_id`` another shape (tuning): every graph is
        built and instantiated again; the graph each launch operation runs now, by its index."""
        graph = self.plan.graphs.get(graph_id)
        if graph is None or not 0 <= node < len(graph.nodes) or graph.nodes[node].kind != _N.KERNEL:
            raise ReplayUsageError(f"graph {graph_id} has no kernel node {node} in this replay")
        self._shapes[(graph_id, node)] = (grid, block, shared_memory)
        self._graphs.clear()
        self._prepared.clear()
        return {index: self.prepared(op, gpu) for index, (op, gpu) in self._launched.items()}

    def _graph(self, graph_id: int, index: int, gpu: int) -> _Built:
        """The CUgraph of a checked graph on ``gpu``: its child graphs are built first, each once
        (an iterative walk, bounded as the plan checked it), so no build recurses."""
        built = self._graphs.get((graph_id, gpu))
        if built is not None:
            return built
        built_here = {g for g, on in self._graphs if on == gpu}
        for gid in children_first(self.plan.graphs, graph_id, built_here, self.plan.capture.limits):
            self._build(gid, index, gpu)
        return self._graphs[(graph_id, gpu)]

    def _build(self, graph_id: int, index: int, gpu: int) -> None:
        key = (graph_id, gpu)
        cu = self.devices.cu
        graph_def = self.plan.graphs[graph_id]
        where = f"operation {index}: graph {graph_id}"
        built = _Built(check(cu.cuGraphCreate(0), f"{where}: cuGraphCreate"))
        graph = built.graph
        self.devices.own(lambda: cu.cuGraphDestroy(graph))
        handles: dict[int, Any] = {}
        waits_for: dict[int, list[int]] = {}
        # edges with their own data (programmatic ones) are added once both nodes exist; a device
        # before sm_90 has no programmatic dependent launch: there they order their nodes fully
        # (the same results, without the overlap), as plain launches do (replay.launches)
        edges_with_data: list[tuple[int, int, m.GraphEdgeData]] = []
        with_data = self.devices.gpus[gpu].arch >= PROGRAMMATIC_ARCH
        for k, (src, dst) in enumerate(graph_def.edges):
            edge = graph_def.edge_kind(k)
            if edge.full or not with_data:
                waits_for.setdefault(dst, []).append(src)
            else:
                edges_with_data.append((src, dst, edge))
        for i in topological_order(graph_def):
            node = graph_def.nodes[i]
            deps = [handles[d] for d in waits_for.get(i, [])]
            start = len(built.calls)
            added = self._add(built, deps, node, index, gpu, self._shapes.get((graph_id, i)))
            handles[i] = check(added, f"{where} node {i} ({node.label})")
            built.calls[start:] = [replace(c, node=f"{i}.{c.node}" if c.node else str(i)) for c in built.calls[start:]]
        if edges_with_data:
            data = [_edge_data(cu, edge) for _, _, edge in edges_with_data]
            sources = [handles[src] for src, _, _ in edges_with_data]
            targets = [handles[dst] for _, dst, _ in edges_with_data]
            added = cu.cuGraphAddDependencies(graph, sources, targets, data, len(data))
            check(added, f"{where}: {len(data)} edge(s) with their edge data (programmatic)")
        self._graphs[key] = built

    def _add(
        self,
        built: _Built,
        deps: list[Any],
        node: GraphNode,
        index: int,
        gpu: int,
        shape: tuple[m.Dims, m.Dims, int] | None,
    ) -> Any:
        cu = self.devices.cu
        A = self.addresses
        kind = node.kind
        graph, calls = built.graph, built.calls
        if kind == _N.KERNEL:
            as_launch = node_launch(index, node)
            if shape is not None:
                as_launch = as_launch._replace(grid=shape[0], block=shape[1], shared_memory=shape[2])
            launch = prepare_launch(self.devices, self.plan, self.modules, A, as_launch, None, gpu, self._host)
            built.launches.append(launch)
            self._keep.append(launch.keepalive)
            if launch.extended:  # a cluster launch: the node's shape from its config, its cluster an attribute
                config, handle, params, _extra = launch.args
                gx, gy, gz = config.gridDimX, config.gridDimY, config.gridDimZ
                bx, by, bz, smem = config.blockDimX, config.blockDimY, config.blockDimZ, config.sharedMemBytes
                calls.append(NodeCall(launch.name, _launch_with(cu, config), (handle, params, STREAM), True))
            else:
                handle, gx, gy, gz, bx, by, bz, smem, _stream, params, _extra = launch.args
                calls.append(NodeCall(launch.name, cu.cuLaunchKernel, (*launch.args[:8], STREAM, params, 0), True))
            raw = _KERNEL.pack(int(handle), gx, gy, gz, bx, by, bz, smem, params, 0, 0, 0)
            added = cu.cuGraphAddKernelNode(
                graph, deps, len(deps), _struct(cu, "CUDA_KERNEL_NODE_PARAMS", raw, self._keep)
            )
            if launch.extended and added[0] == cu.CUresult.CUDA_SUCCESS:
                _set_node_attributes(cu, added[1], launch.args[0], f"operation {index}: {launch.name}")
            return added
        ctx = self.devices.gpus[gpu].ctx
        if kind == _N.MEMCPY:
            src, dst = A[node.src_buffer] + node.src_offset, A[node.dst_buffer] + node.dst_offset
            calls.append(NodeCall("memcpy", cu.cuMemcpyDtoDAsync, (dst, src, node.size, STREAM), False))
            raw = bytearray(_MEMCPY3D_SIZE)
            struct.pack_into("<I", raw, 32, _MEMORY_DEVICE)
            struct.pack_into("<Q", raw, 48, A[node.src_buffer] + node.src_offset)
            struct.pack_into("<I", raw, 120, _MEMORY_DEVICE)
            struct.pack_into("<Q", raw, 136, A[node.dst_buffer] + node.dst_offset)
            struct.pack_into("<QQQ", raw, 176, node.size, 1, 1)
            params = _struct(cu, "CUDA_MEMCPY3D", bytes(raw), self._keep)
            return cu.cuGraphAddMemcpyNode(graph, deps, len(deps), params, ctx)
        if kind == _N.MEMSET:
            dst = A[node.dst_buffer] + node.dst_offset
            calls.append(_memset_call(cu, node, dst))
            raw = _MEMSET.pack(dst, node.pitch, node.value, node.element_size, node.width, node.height)
            params = _struct(cu, "CUDA_MEMSET_NODE_PARAMS", raw, self._keep)
            return cu.cuGraphAddMemsetNode(graph, deps, len(deps), params, ctx)
        if kind == _N.EVENT_RECORD:
            event = self.events[node.event]
            calls.append(NodeCall("event_record", cu.cuEventRecord, (event, STREAM), False))
            return cu.cuGraphAddEventRecordNode(graph, deps, len(deps), event)
        if kind == _N.EVENT_WAIT:
            event = self.events[node.event]
            calls.append(NodeCall("event_wait", cu.cuStreamWaitEvent, (STREAM, event, 0), False))
            return cu.cuGraphAddEventWaitNode(graph, deps, len(deps), event)
        if kind == _N.CHILD_GRAPH:
            child = self._graphs[(node.graph, gpu)]  # built before its parent (children_first)
            built.launches.extend(child.launches)
            calls.extend(child.calls)
            return cu.cuGraphAddChildGraphNode(graph, deps, len(deps), child.graph)
        return cu.cuGraphAddEmptyNode(graph, deps, len(deps))  # empty and host-function nodes


def launch_into_capture(cu: Any, graph: Any, stream: Any, what: str) -> None:
    """What cuGraphLaunch does on ``stream`` while the stream is being captured, where the driver
    refuses cuGraphLaunch: ``graph`` joins the graph being captured as a child-graph node that
    depends on what the stream's next work would, and becomes the stream's one dependency.
    ``what`` names the graph launch in errors (each names the driver call that failed)."""
    # cuda-bindings 13: (result, status, id, graph, dependencies, edge data, count); check drops the result
    status, _, captured, dependencies, _, count = check(
        cu.cuStreamGetCaptureInfo(stream), f"{what}: cuStreamGetCaptureInfo"
    )
    if status != cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE:
        raise DeviceError(f"{what}: the stream is not capturing ({status!r}): an earlier step invalidated the capture")
    count = int(count)
    node = check(
        cu.cuGraphAddChildGraphNode(captured, list(dependencies or ())[:count], count, graph),
        f"{what}: cuGraphAddChildGraphNode",
    )
    flags = cu.CUstreamUpdateCaptureDependencies_flags.CU_STREAM_SET_CAPTURE_DEPENDENCIES
    check(
        cu.cuStreamUpdateCaptureDependencies(stream, [node], None, 1, flags),
        f"{what}: cuStreamUpdateCaptureDependencies",
    )


def _launch_with(cu: Any, config: Any) -> Callable[..., Any]:
    """cuLaunchKernelEx with ``config`` on the stream it is called with (a node timed alone)."""

    def launch(handle: Any, params: Any, stream: Any) -> Any:
        config.hStream = stream
        return cu.cuLaunchKernelEx(config, handle, params, 0)

    return launch


def _set_node_attributes(cu: Any, node: Any, config: Any, where: str) -> None:
    """A launch config's attributes (cluster dimensions) on the kernel node made from it."""
    for k in range(config.numAttrs):
        attribute = config.attrs[k]
        node_id = cu.CUkernelNodeAttrID(int(attribute.id))  # the same numbers as CUlaunchAttributeID
        value = cu.CUkernelNodeAttrValue()
        if int(attribute.id) == int(cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION):
            value.clusterDim.x = attribute.value.clusterDim.x
            value.clusterDim.y = attribute.value.clusterDim.y
            value.clusterDim.z = attribute.value.clusterDim.z
        else:
            raise UnsupportedOperationError(
                f"{where}: a kernel node with launch attribute {attribute.id} is not replayed"
            )
        check(cu.cuGraphKernelNodeSetAttribute(node, node_id, value), f"{where}: cuGraphKernelNodeSetAttribute")


def _memset_call(cu: Any, node: GraphNode, dst: int) -> NodeCall:
    size = {1: "8", 2: "16", 4: "32"}[node.element_size]
    if node.height <= 1:
        fn = getattr(cu, f"cuMemsetD{size}Async")
        return NodeCall("memset", fn, (dst, node.value, node.width, STREAM), False)
    fn = getattr(cu, f"cuMemsetD2D{size}Async")
    return NodeCall("memset", fn, (dst, node.pitch, node.value, node.width, node.height, STREAM), False)
