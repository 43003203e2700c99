"""CUDA graphs as the recorder follows them (the CUPTI source's half; the translator's is
:mod:`replayfmt.capture.graph_events`).

A graph is read with the driver's node queries when it is instantiated (cuGraphInstantiate*:
PyTorch destroys its graph right after) and again when an executable graph is wholly updated
(cuGraphExecUpdate); a single node update (cuGraphExecKernelNodeSetParams and kin; a child graph
swapped in by cuGraphExecChildGraphNodeSetParams, as XLA's command buffers do between launches;
an event changed; a node disabled or enabled again) is read from the call's own parameters while
the caller's pointers are valid. What a graph holds
becomes an :class:`events.GraphDescription` (nodes with their parameters, dependency edges), so
a launch (cuGraphLaunch) is recorded as a Graph object and a GraphLaunch operation. Graphs made
by stream capture and by the explicit API are read the same way. Node kinds read: kernel,
memcpy (1-D, device to device), memset, host function, event record, event wait, child graph
and empty; any other kind makes the graph's launches unsupported, with the reason.

While a stream captures, the work enqueued in it is recorded into a graph, not run: it is no
operation of the program's (its graph's launches are), so it is not delivered.

The driver is called through ctypes (the node parameter structs are read in place, as the
CUPTI source reads the parameters of the calls it records).
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from replayfmt.capture import events as ev
from replayfmt.capture.launch_ring import LaunchRing
from replayfmt.capture.process_memory import MEMORY, read, u64
from replayfmt.format import model as m
from replayfmt.format.model import GraphNodeKind

ENTER, EXIT = 0, 1  # CUPTI callback sites

# CUgraphNodeType
KERNEL, MEMCPY, MEMSET, HOST, GRAPH, EMPTY, WAIT_EVENT, EVENT_RECORD = range(8)
NODE_TYPE_NAMES = {
    8: "external semaphore signal",
    9: "external semaphore wait",
    10: "memory allocation",
    11: "memory free",
    12: "batch memory operation",
    13: "conditional",
}
MAX_DEPTH = 16  # child graphs nested deeper are refused
# CUDA_KERNEL_NODE_PARAMS_v2: func, grid, block, smem, params, extra, kern, ctx (v1 ends after extra)
KERNEL_PARAMS = struct.Struct("<Q7I4xQQQQ")
_KERNEL_PARAMS_V1 = struct.Struct("<Q7I4xQQ")
_MEMSET_PARAMS = struct.Struct("<QQIIQQ")  # CUDA_MEMSET_NODE_PARAMS: dst, pitch, value, elementSize, width, height
_MEMCPY_SIDE = struct.Struct("<QQQQI4xQQQQQQ")  # x, y, z, lod, memoryType, host, device, array, reserved, pitch, height
_MEMCPY_SIZE = 2 * _MEMCPY_SIDE.size + 24
_HOST, _DEVICE, _UNIFIED = 1, 2, 4  # CUmemorytype
_N = GraphNodeKind
_ATTRIBUTE_CLUSTER_DIMENSION = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION (a CUkernelNodeAttrID too)
_ATTRIBUTE_VALUE_SIZE = 64  # sizeof(CUlaunchAttributeValue)


class GraphReader:
    """Reads graphs through libcuda; ``kernel(handle, name_pointer)`` gives the source's kernel
    (its event and argument reader) for a function or kernel handle."""

    def __init__(self, kernel: Callable[[int, int], Any], lib: Any = None) -> None:
        self.lib = lib or ctypes.CDLL("libcuda.so.1")
        self._kernel = kernel

    def _call(self, name: str, *args: Any) -> None:
        result = getattr(self.lib, name)(*args)
        if result != 0:
            raise RuntimeError(f"{name} failed (CUresult {result})")

    def describe(self, graph: int, depth: int = 0) -> ev.GraphDescription:
        """``graph``'s nodes (with their parameters; child graphs described in place) and its
        dependency edges as node indices."""
        count = ctypes.c_size_t(0)
        self._call("cuGraphGetNodes", ctypes.c_void_p(graph), None, ctypes.byref(count))
        handles: list[int] = []
        if count.value:  # (arrays with a count of 0 are refused: CUDA_ERROR_INVALID_VALUE)
            nodes = (ctypes.c_void_p * count.value)()
            self._call("cuGraphGetNodes", ctypes.c_void_p(graph), nodes, ctypes.byref(count))
            handles = [int(n or 0) for n in nodes[: count.value]]
        index = {h: i for i, h in enumerate(handles)}
        edges = ctypes.c_size_t(0)
        self._call("cuGraphGetEdges_v2", ctypes.c_void_p(graph), None, None, None, ctypes.byref(edges))
        pairs: list[tuple[int, int]] = []
        kinds: list[m.GraphEdgeData] = []
        if edges.value:
            sources = (ctypes.c_void_p * edges.value)()
            targets = (ctypes.c_void_p * edges.value)()
            # CUgraphEdgeData (8 bytes each: from_port, to_port, type, reserved): XLA's command
            # buffers chain kernels with programmatic edges, which let a kernel start before the one
            # it depends on has ended; a replay that made them full dependencies would run slower
            data = (ctypes.c_uint8 * (8 * edges.value))()
            self._call("cuGraphGetEdges_v2", ctypes.c_void_p(graph), sources, targets, data, ctypes.byref(edges))
            pairs = [(index[int(sources[i] or 0)], index[int(targets[i] or 0)]) for i in range(edges.value)]
            kinds = [m.GraphEdgeData.of(*data[8 * i : 8 * i + 3]) for i in range(edges.value)]
        return ev.GraphDescription([self._node(h, depth) for h in handles], pairs, list(m.kept_edge_data(kinds)))

    def _node(self, handle: int, depth: int) -> ev.GraphNodeInfo:
        kind = ctypes.c_int(0)
        self._call("cuGraphNodeGetType", ctypes.c_void_p(handle), ctypes.byref(kind))
        node = self._parameters(handle, kind.value, depth)
        node.handle = handle
        return node

    def _parameters(self, handle: int, kind: int, depth: int) -> ev.GraphNodeInfo:
        node = ctypes.c_void_p(handle)
        if kind == KERNEL:
            params = ctypes.create_string_buffer(KERNEL_PARAMS.size)
            self._call("cuGraphKernelNodeGetParams_v2", node, params)
            kernel = self.kernel(params.raw)
            kernel.cluster = self._cluster(node)
            return ev.GraphNodeInfo(_N.KERNEL, kernel=kernel)
        if kind == MEMSET:
            params = ctypes.create_string_buffer(_MEMSET_PARAMS.size)
            self._call("cuGraphMemsetNodeGetParams", node, params)
            return memset_node(params.raw)
        if kind == MEMCPY:
            params = ctypes.create_string_buffer(_MEMCPY_SIZE)
            self._call("cuGraphMemcpyNodeGetParams", node, params)
            return memcpy_node(params.raw)
        if kind in (EVENT_RECORD, WAIT_EVENT):
            event = ctypes.c_void_p(0)
            name = "cuGraphEventRecordNodeGetEvent" if kind == EVENT_RECORD else "cuGraphEventWaitNodeGetEvent"
            self._call(name, node, ctypes.byref(event))
            return ev.GraphNodeInfo(_N.EVENT_RECORD if kind == EVENT_RECORD else _N.EVENT_WAIT, event=event.value or 0)
        if kind == GRAPH:
            if depth >= MAX_DEPTH:
                return ev.GraphNodeInfo(_N.CHILD_GRAPH, unsupported=f"child graphs nested more than {MAX_DEPTH} deep")
            child = ctypes.c_void_p(0)
            self._call("cuGraphChildGraphNodeGetGraph", node, ctypes.byref(child))
            return ev.GraphNodeInfo(_N.CHILD_GRAPH, child=self.describe(int(child.value or 0), depth + 1))
        if kind == HOST:
            return ev.GraphNodeInfo(_N.HOST)
        if kind == EMPTY:
            return ev.GraphNodeInfo(_N.EMPTY)
        what = NODE_TYPE_NAMES.get(kind, f"type {kind}")
        return ev.GraphNodeInfo(_N.EMPTY, unsupported=f"a graph holds a {what} node, which is not recorded yet")

    def _cluster(self, node: ctypes.c_void_p) -> m.Dims:
        """A kernel node's cluster dimensions (a launch attribute, not in its parameters: cuDNN's
        sm_90 kernels in XLA's graphs run in clusters and fault without them); (0, 0, 0) when it
        has none, or one of a single block."""
        value = ctypes.create_string_buffer(_ATTRIBUTE_VALUE_SIZE)
        if self.lib.cuGraphKernelNodeGetAttribute(node, _ATTRIBUTE_CLUSTER_DIMENSION, value) != 0:
            return (0, 0, 0)
        dims = struct.unpack_from("<III", value.raw)
        return (0, 0, 0) if all(d <= 1 for d in dims) else (max(1, dims[0]), max(1, dims[1]), max(1, dims[2]))

    def kernel(self, raw: bytes, v2: bool = True) -> ev.GraphKernel:
        """A kernel node's parameters (CUDA_KERNEL_NODE_PARAMS, v2 or v1 layout) as an event
        value. The CUfunction is named first: its module is what the program's eager launches
        resolved to; a node made from a CUkernel alone names that."""
        if v2:
            func, gx, gy, gz, bx, by, bz, smem, kernel_params, extra, kern, _ctx = KERNEL_PARAMS.unpack_from(raw)
        else:
            (func, gx, gy, gz, bx, by, bz, smem, kernel_params, extra), kern = _KERNEL_PARAMS_V1.unpack_from(raw), 0
        handle = func or kern
        name = ctypes.c_char_p()
        self._call("cuFuncGetName" if func else "cuKernelGetName", ctypes.byref(name), ctypes.c_void_p(handle))
        kernel = self._kernel(handle, ctypes.cast(name, ctypes.c_void_p).value or 0)
        return ev.GraphKernel(kernel.kernel, (gx, gy, gz), (bx, by, bz), smem, kernel.arguments(kernel_params, extra))


def memset_node(raw: bytes, offset: int = 0) -> ev.GraphNodeInfo:
    """A CUDA_MEMSET_NODE_PARAMS (v1, or the first fields of v2) as a memset node."""
    dst, pitch, value, element_size, width, height = _MEMSET_PARAMS.unpack_from(raw, offset)
    shape = {"element_size": element_size, "width": width, "height": max(1, height), "pitch": pitch}
    return ev.GraphNodeInfo(_N.MEMSET, dst=dst, value=value, **shape)


def memcpy_node(raw: bytes) -> ev.GraphNodeInfo:
    """A CUDA_MEMCPY3D as a memcpy node: 1-D, device (or unified) memory on both sides; any
    other copy is a node the Graph object cannot hold (the reason says which)."""
    src = _MEMCPY_SIDE.unpack_from(raw, 0)
    dst = _MEMCPY_SIDE.unpack_from(raw, _MEMCPY_SIDE.size)
    width, height, depth = struct.unpack_from("<QQQ", raw, 2 * _MEMCPY_SIDE.size)
    node = ev.GraphNodeInfo(_N.MEMCPY, size=width)
    device = (_DEVICE, _UNIFIED)
    if src[4] not in device or dst[4] not in device:
        node.unsupported = "a graph holds a memcpy node to or from host memory or an array, which is not recorded yet"
    elif height > 1 or depth > 1 or src[1] or src[2] or dst[1] or dst[2]:
        node.unsupported = "a graph holds a 2-D or 3-D memcpy node, which is not recorded yet"
    node.src, node.dst = src[6] + src[0], dst[6] + dst[0]
    return node


class GraphCalls:
    """The CUPTI source's decoders for graphs and stream capture (a mixin of
    :class:`~replayfmt.capture.cupti_source.CuptiSource`, which provides what is declared here)."""

    _graphs: GraphReader | None
    _captures: int
    ring: LaunchRing | None
    _launch_results: bool
    _sink: Callable[[ev.Event], None]
    _deliver: Callable[[ev.Event], None]
    _pending_updates: dict[int, ev.Event]  # thread id -> the node update its call makes

    if TYPE_CHECKING:  # provided by the CUPTI source

        def _kernel(self, handle: int, symbol: int) -> Any: ...

        @staticmethod
        def _succeeded(result: int) -> bool: ...

    def _reader(self) -> GraphReader:
        if self._graphs is None:
            self._graphs = GraphReader(self._kernel)
        return self._graphs

    def _described(self, graph: int, call: str) -> ev.GraphDescription:
        """The graph as the driver reports it; a graph that cannot be read becomes one refused
        node, so that its launches say why (instantiation often happens before any region)."""
        try:
            return self._reader().describe(graph)
        except Exception as exc:
            reason = f"{call}: the recorder could not read the graph ({type(exc).__name__}: {exc})"
            return ev.GraphDescription([ev.GraphNodeInfo(_N.EMPTY, unsupported=reason)], [])

    def _on_graph_instantiate(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == EXIT and self._succeeded(result):  # (CUgraphExec* out, CUgraph graph, ...)
            out, graph = struct.unpack_from("<QQ", MEMORY, p)
            self._sink(ev.GraphInstantiated(u64(out), self._described(graph, call)))

    def _on_graph_exec_update(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == EXIT and self._succeeded(result):  # (CUgraphExec exec, CUgraph graph, ...): runs ``graph`` now
            graph_exec, graph = struct.unpack_from("<QQ", MEMORY, p)
            self._sink(ev.GraphInstantiated(graph_exec, self._described(graph, call)))

    def _on_graph_node_update(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        """cuGraphExec{Kernel,Memset,Memcpy}NodeSetParams / cuGraphExecNodeSetParams
        (exec, node, const params*, ...): a node of an executable graph changed (XLA's command
        buffers change theirs between launches). Read at entry (the parameters and the kernel's
        argument pointers are the caller's), sent once the call succeeded; a kind of change the
        recorder cannot read makes the executable's later launches refused."""
        graph_exec, node, params = struct.unpack_from("<QQQ", MEMORY, p)
        thread = threading.get_ident()
        if site == ENTER:
            if params:  # (a null pointer: the driver refuses the call, and reading it would fault)
                self._pending_updates[thread] = self._node_update(graph_exec, node, params, call)
            return
        update = self._pending_updates.pop(thread, None)
        if update is not None and self._succeeded(result):
            self._sink(update)

    def _node_update(self, graph_exec: int, node: int, params: int, call: str) -> ev.Event:
        if call.startswith("cuGraphExecKernelNodeSetParams"):
            v2 = call.endswith("_v2")
            raw = read(params, KERNEL_PARAMS.size if v2 else _KERNEL_PARAMS_V1.size)
            return ev.GraphKernelUpdated(graph_exec, node, self._reader().kernel(raw, v2))
        if call == "cuGraphExecMemsetNodeSetParams":
            return ev.GraphNodeUpdated(graph_exec, node, memset_node(read(params, _MEMSET_PARAMS.size)))
        if call == "cuGraphExecMemcpyNodeSetParams":
            return ev.GraphNodeUpdated(graph_exec, node, memcpy_node(read(params, _MEMCPY_SIZE)))
        # CUgraphNodeParams: the node's type, 12 bytes reserved, then the type's parameters
        kind = struct.unpack("<i", read(params, 4))[0]
        if kind == KERNEL:
            return ev.GraphKernelUpdated(graph_exec, node, self._reader().kernel(read(params + 16, KERNEL_PARAMS.size)))
        if kind == MEMSET:
            return ev.GraphNodeUpdated(graph_exec, node, memset_node(read(params + 16, _MEMSET_PARAMS.size)))
        if kind == MEMCPY:  # CUDA_MEMCPY_NODE_PARAMS: flags, reserved, copyCtx, then the CUDA_MEMCPY3D
            return ev.GraphNodeUpdated(graph_exec, node, memcpy_node(read(params + 32, _MEMCPY_SIZE)))
        if kind == GRAPH:  # CUDA_CHILD_GRAPH_NODE_PARAMS: the graph whose copy the node runs now
            return ev.GraphNodeUpdated(graph_exec, node, self._child(u64(params + 16), call))
        if kind in (EVENT_RECORD, WAIT_EVENT):  # CUDA_EVENT_RECORD_NODE_PARAMS / _WAIT_: the event
            event_kind = _N.EVENT_RECORD if kind == EVENT_RECORD else _N.EVENT_WAIT
            return ev.GraphNodeUpdated(graph_exec, node, ev.GraphNodeInfo(event_kind, event=u64(params + 16)))
        if kind == HOST:  # a host function is not recorded (its node replays as a no-op): nothing changes
            return ev.GraphNodeUpdated(graph_exec, node, ev.GraphNodeInfo(_N.HOST))
        what = NODE_TYPE_NAMES.get(kind, f"type {kind}")
        reason = f"{call} changed a {what} node, which the recorder does not follow yet"
        return ev.GraphNodeUpdated(graph_exec, node, ev.GraphNodeInfo(_N.EMPTY, unsupported=reason))

    def _child(self, graph: int, call: str) -> ev.GraphNodeInfo:
        """A child-graph node that now runs a copy of ``graph`` (read now: the caller may change
        or destroy ``graph`` once the call returned)."""
        return ev.GraphNodeInfo(_N.CHILD_GRAPH, child=self._described(graph, call))

    def _on_graph_node_change(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        """The node changes whose parameters are handles, not pointers to structs:
        cuGraphExecChildGraphNodeSetParams (exec, node, child graph: XLA's command buffers update
        their nested command buffers so), cuGraphExec{EventRecord,EventWait}NodeSetEvent (exec,
        node, event), cuGraphExecHostNodeSetParams (exec, node, params) and cuGraphNodeSetEnabled
        (exec, node, enabled). Read at entry, sent once the call succeeded."""
        graph_exec, node, value = struct.unpack_from("<QQQ", MEMORY, p)
        thread = threading.get_ident()
        if site == ENTER:
            update: ev.Event
            if call == "cuGraphExecChildGraphNodeSetParams":
                update = ev.GraphNodeUpdated(graph_exec, node, self._child(value, call))
            elif call == "cuGraphExecEventRecordNodeSetEvent":
                update = ev.GraphNodeUpdated(graph_exec, node, ev.GraphNodeInfo(_N.EVENT_RECORD, event=value))
            elif call == "cuGraphExecEventWaitNodeSetEvent":
                update = ev.GraphNodeUpdated(graph_exec, node, ev.GraphNodeInfo(_N.EVENT_WAIT, event=value))
            elif call == "cuGraphExecHostNodeSetParams":
                update = ev.GraphNodeUpdated(graph_exec, node, ev.GraphNodeInfo(_N.HOST))
            else:  # cuGraphNodeSetEnabled (hGraphExec, hNode, unsigned int isEnabled)
                update = ev.GraphNodeEnabled(graph_exec, node, (value & 0xFFFFFFFF) != 0)
            self._pending_updates[thread] = update
            return
        pending = self._pending_updates.pop(thread, None)
        if pending is not None and self._succeeded(result):
            self._sink(pending)

    def _on_graph_exec_destroy(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == ENTER:
            self._sink(ev.GraphExecDestroyed(u64(p)))

    def _on_graph_launch(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site != ENTER:
            return
        graph_exec, stream = struct.unpack_from("<QQ", MEMORY, p)
        if self._launch_results:
            self._sink(ev.NotReproducible(call, "kernel mode does not reach into graphs yet", stream))
            return
        self._sink(ev.GraphLaunched(graph_exec, stream))

    def _on_capture_begin(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == EXIT and self._succeeded(result):
            self._captures += 1
            self._sink = self._unless_captured
            if self.ring is not None:  # launches in a capturing stream go into its graph: none is armed
                self.ring.enabled = False
                self.ring.withdraw()

    def _on_capture_end(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == EXIT:  # the capture ends even when it failed
            self._captures = max(0, self._captures - 1)
            if not self._captures:
                self._sink = self._deliver
                if self.ring is not None:
                    self.ring.enabled = True

    def _unless_captured(self, event: ev.Event) -> None:
        """While a stream capture runs: work enqueued in a capturing stream is recorded into a
        graph, not run, so it is no operation of the program's (its graph's launches are)."""
        stream = getattr(event, "stream", None)
        if stream is not None:
            status = ctypes.c_int(0)
            lib = self._reader().lib
            if lib.cuStreamIsCapturing(ctypes.c_void_p(stream), ctypes.byref(status)) == 0 and status.value:
                return
        self._deliver(event)


GRAPH_NODE_UPDATES = [
    "cuGraphExecKernelNodeSetParams",
    "cuGraphExecKernelNodeSetParams_v2",
    "cuGraphExecMemsetNodeSetParams",
    "cuGraphExecMemcpyNodeSetParams",
    "cuGraphExecNodeSetParams",
]
"""Changes to an executable graph's nodes the recorder follows (as new versions of its graph)."""

GRAPH_NODE_CHANGES = [
    "cuGraphExecChildGraphNodeSetParams",
    "cuGraphExecEventRecordNodeSetEvent",
    "cuGraphExecEventWaitNodeSetEvent",
    "cuGraphExecHostNodeSetParams",
    "cuGraphNodeSetEnabled",
]
"""Changes to an executable graph's nodes given by handle, followed too (``_on_graph_node_change``)."""

GRAPH_UPDATES_NOT_FOLLOWED: list[str] = []
"""Changes to an executable graph's nodes the recorder does not follow (refused at the call): none
that the driver offers today; a new one is refused here until it is read."""
