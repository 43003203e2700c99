"""CUDA graphs as the recorder follows them: a graph launch (cuGraphLaunch) is recorded as the
graph's nodes, in a topological order, on the launching stream, between scope markers named
``cuda_graph <handle>`` (so dump-replay lists a graph's nodes as the operations of that scope).

Which graph an executable graph runs is followed from its instantiation (and cuGraphExecUpdate);
the nodes are read from that graph with the driver's node queries at the launch, before it runs,
so the snapshots the nodes cause hold what the graph starts from. Node kinds read: kernel,
memcpy (1-D), memset (1-D), host function, event record, event wait, child graph and empty.

The driver is called through ctypes (the node parameter structs are read in place, as the
CUPTI source reads the parameters of the calls it records).
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from replayfmt.capture import events as ev
from replayfmt.capture.process_memory import MEMORY, u64

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
_KERNEL_PARAMS = struct.Struct(
    "<Q7I4xQQQQ"
)  # CUDA_KERNEL_NODE_PARAMS_v2: func, grid, block, smem, params, extra, kern, ctx
_MEMSET_PARAMS = struct.Struct("<QQIIQQ")  # CUDA_MEMSET_NODE_PARAMS: dst, pitch, value, elementSize, width, height
_MEMCPY_SIDE = struct.Struct("<QQQQI4xQQQQQQ")  # x, y, z, lod, memoryType, host, device, array, reserved, pitch, height
_MEMCPY_SIZE = 2 * _MEMCPY_SIDE.size + 24
_HOST, _DEVICE, _UNIFIED = 1, 2, 4  # CUmemorytype


# node parameter changes on an executable graph -> the call making the same change to a graph's node
EXEC_NODE_SETTERS = {
    "cuGraphExecKernelNodeSetParams": "cuGraphKernelNodeSetParams",
    "cuGraphExecKernelNodeSetParams_v2": "cuGraphKernelNodeSetParams_v2",
    "cuGraphExecMemsetNodeSetParams": "cuGraphMemsetNodeSetParams",
    "cuGraphExecMemcpyNodeSetParams": "cuGraphMemcpyNodeSetParams",
    "cuGraphExecNodeSetParams": "cuGraphNodeSetParams",
}


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

    def clone(self, graph: int) -> int:
        """A copy of ``graph`` (its nodes and their parameters), owned by the recorder."""
        copy = ctypes.c_void_p(0)
        self._call("cuGraphClone", ctypes.byref(copy), ctypes.c_void_p(graph))
        return int(copy.value or 0)

    def destroy(self, graph: int) -> None:
        self.lib.cuGraphDestroy(ctypes.c_void_p(graph))

    def set_in_copy(self, copy: int, node: int, setter: str, params: int) -> None:
        """Give the node of ``copy`` cloned from ``node`` the parameters at ``params``, through ``setter``."""
        found = ctypes.c_void_p(0)
        self._call("cuGraphNodeFindInClone", ctypes.byref(found), ctypes.c_void_p(node), ctypes.c_void_p(copy))
        self._call(setter, found, ctypes.c_void_p(params))

    def nodes_in_order(self, graph: int) -> list[tuple[int, int]]:
        """(node, type) of every node of ``graph``, dependencies first."""
        count = ctypes.c_size_t(0)
        self._call("cuGraphGetNodes", ctypes.c_void_p(graph), None, ctypes.byref(count))
        if not count.value:
            return []
        nodes = (ctypes.c_void_p * count.value)()
        self._call("cuGraphGetNodes", ctypes.c_void_p(graph), nodes, ctypes.byref(count))
        handles = [int(n or 0) for n in nodes[: count.value]]
        edges = ctypes.c_size_t(0)
        self._call("cuGraphGetEdges_v2", ctypes.c_void_p(graph), None, None, None, ctypes.byref(edges))
        pairs: list[tuple[int, int]] = []
        if edges.value:  # (arrays with a count of 0 are refused: CUDA_ERROR_INVALID_VALUE)
            sources = (ctypes.c_void_p * edges.value)()
            targets = (ctypes.c_void_p * edges.value)()
            # CUgraphEdgeData (8 bytes each): asked for, or a graph with programmatic edges (XLA's
            # command buffers) answers CUDA_ERROR_LOSSY_QUERY; every edge orders its nodes here
            data = (ctypes.c_uint8 * (8 * edges.value))()
            self._call("cuGraphGetEdges_v2", ctypes.c_void_p(graph), sources, targets, data, ctypes.byref(edges))
            pairs = [(int(sources[i] or 0), int(targets[i] or 0)) for i in range(edges.value)]
        kinds = {}
        for node in handles:
            kind = ctypes.c_int(0)
            self._call("cuGraphNodeGetType", ctypes.c_void_p(node), ctypes.byref(kind))
            kinds[node] = kind.value
        return [(node, kinds[node]) for node in topological_order(handles, pairs)]

    def events(self, graph: int, stream: int, call: str) -> Iterator[ev.Event]:
        """The events a launch of ``graph`` on ``stream`` amounts to, in order."""
        for node, kind in self.nodes_in_order(graph):
            if kind == KERNEL:
                yield self._kernel_node(node, stream)
            elif kind == MEMSET:
                yield self._memset_node(node, stream, call)
            elif kind == MEMCPY:
                yield self._memcpy_node(node, stream, call)
            elif kind == HOST:
                yield ev.HostFunction(stream, "graph host node")
            elif kind in (EVENT_RECORD, WAIT_EVENT):
                event = ctypes.c_void_p(0)
                name = "cuGraphEventRecordNodeGetEvent" if kind == EVENT_RECORD else "cuGraphEventWaitNodeGetEvent"
                self._call(name, ctypes.c_void_p(node), ctypes.byref(event))
                handle = int(event.value or 0)
                yield ev.EventRecorded(handle, stream) if kind == EVENT_RECORD else ev.StreamWaited(stream, handle)
            elif kind == GRAPH:
                child = ctypes.c_void_p(0)
                self._call("cuGraphChildGraphNodeGetGraph", ctypes.c_void_p(node), ctypes.byref(child))
                yield from self.events(int(child.value or 0), stream, call)
            elif kind != EMPTY:
                what = NODE_TYPE_NAMES.get(kind, f"type {kind}")
                yield ev.NotReproducible(call, f"a graph holds a {what} node, which is not recorded yet", stream)

    def _kernel_node(self, node: int, stream: int) -> ev.Event:
        params = ctypes.create_string_buffer(_KERNEL_PARAMS.size)
        self._call("cuGraphKernelNodeGetParams_v2", ctypes.c_void_p(node), params)
        func, gx, gy, gz, bx, by, bz, smem, kernel_params, extra, kern, _ctx = _KERNEL_PARAMS.unpack_from(params.raw)
        handle = func or kern
        name = ctypes.c_char_p()
        getter = "cuFuncGetName" if func else "cuKernelGetName"
        self._call(getter, ctypes.byref(name), ctypes.c_void_p(handle))
        name_pointer = ctypes.cast(name, ctypes.c_void_p).value or 0
        kernel = self._kernel(handle, name_pointer)
        return ev.LaunchBegin(
            kernel.kernel,
            (gx, gy, gz),
            (bx, by, bz),
            smem,
            stream,
            kernel.arguments(kernel_params, extra),
            call="cuGraphLaunch",
        )

    def _memset_node(self, node: int, stream: int, call: str) -> ev.Event:
        params = ctypes.create_string_buffer(_MEMSET_PARAMS.size)
        self._call("cuGraphMemsetNodeGetParams", ctypes.c_void_p(node), params)
        dst, _pitch, value, element_size, width, height = _MEMSET_PARAMS.unpack_from(params.raw)
        if height != 1 or element_size not in (1, 2, 4):
            return ev.NotReproducible(call, "a graph holds a 2-D memset node, which is not recorded yet", stream)
        return ev.Memset(dst, value, element_size, width, stream, "graph memset node")

    def _memcpy_node(self, node: int, stream: int, call: str) -> ev.Event:
        params = ctypes.create_string_buffer(_MEMCPY_SIZE)
        self._call("cuGraphMemcpyNodeGetParams", ctypes.c_void_p(node), params)
        return memcpy_event(params.raw, stream, call)


def memcpy_event(raw: bytes, stream: int, call: str) -> ev.Event:
    """A 1-D CUDA_MEMCPY3D as a copy event (a 2-D or 3-D or array copy: not reproducible)."""
    src = _MEMCPY_SIDE.unpack_from(raw, 0)
    dst = _MEMCPY_SIDE.unpack_from(raw, _MEMCPY_SIDE.size)
    width, height, depth = struct.unpack_from("<QQQ", raw, 2 * _MEMCPY_SIDE.size)
    src_side, dst_side = _side(src), _side(dst)
    if height > 1 or depth > 1 or src[1] or src[2] or dst[1] or dst[2] or src_side is None or dst_side is None:
        reason = "a graph holds a 2-D, 3-D or array memcpy node, which is not recorded yet"
        return ev.NotReproducible(call, reason, stream)
    (src_device, src_address), (dst_device, dst_address) = src_side, dst_side
    direction = ev.CopyDirection.DEFAULT
    if src_device is False:
        direction = ev.CopyDirection.H2D
    elif dst_device is False:
        direction = ev.CopyDirection.D2H
    elif src_device and dst_device:
        direction = ev.CopyDirection.D2D
    return ev.Copy(direction, dst_address + dst[0], src_address + src[0], width, stream, True, "graph memcpy node")


def _side(side: tuple[int, ...]) -> tuple[bool | None, int] | None:
    """(True: device, False: host, None: unified, decided by address; the address) of one side."""
    memory_type, host, device = side[4], side[5], side[6]
    if memory_type == _HOST:
        return False, host
    if memory_type == _DEVICE:
        return True, device
    if memory_type == _UNIFIED:
        return None, device
    return None  # an array


def topological_order(nodes: list[int], edges: list[tuple[int, int]]) -> list[int]:
    """``nodes`` with every edge's source before its target (Kahn; ties keep the given order)."""
    waiting = dict.fromkeys(nodes, 0)
    after: dict[int, list[int]] = {n: [] for n in nodes}
    for source, target in edges:
        if source in waiting and target in waiting:
            waiting[target] += 1
            after[source].append(target)
    ready = [n for n in nodes if waiting[n] == 0]
    order: list[int] = []
    while ready:
        node = ready.pop(0)
        order.append(node)
        for target in after[node]:
            waiting[target] -= 1
            if waiting[target] == 0:
                ready.append(target)
    if len(order) != len(nodes):
        raise ValueError("the graph has a cycle")
    return order


class GraphCalls:
    """The CUPTI source's decoders for graphs and stream capture (a mixin of
    :class:`~replayfmt.capture.cupti_source.CuptiSource`, which provides what is declared here)."""

    _graph_of: dict[int, int]
    _graphs: GraphReader | None
    _captures: int
    _launch_results: bool
    _sink: Callable[[ev.Event], None]
    _deliver: Callable[[ev.Event], None]

    if TYPE_CHECKING:  # provided by the CUPTI source

        def _kernel(self, handle: int, symbol: int) -> Any: ...

        @staticmethod
        def _succeeded(result: int) -> bool: ...

    def _reader(self) -> GraphReader:
        if self._graphs is None:
            self._graphs = GraphReader(self._kernel)
        return self._graphs

    def _follow(self, graph_exec: int, graph: int) -> None:
        """Keep a copy of the graph an executable graph runs: programs destroy the graph once it
        is instantiated (PyTorch does)."""
        reader = self._reader()
        old = self._graph_of.pop(graph_exec, None)
        if old is not None:
            reader.destroy(old)
        self._graph_of[graph_exec] = reader.clone(graph)

    def _on_graph_instantiate(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == EXIT and self._succeeded(result):  # (CUgraphExec* out, CUgraph graph, ...)
            out, graph = struct.unpack_from("<QQ", MEMORY, p)
            self._follow(u64(out), graph)

    def _on_graph_exec_update(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == EXIT and self._succeeded(result):  # (CUgraphExec exec, CUgraph graph, ...)
            graph_exec, graph = struct.unpack_from("<QQ", MEMORY, p)
            self._follow(graph_exec, graph)

    def _on_graph_exec_destroy(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == ENTER:
            copy = self._graph_of.pop(u64(p), None)
            if copy is not None:
                self._reader().destroy(copy)

    def _on_exec_node_set_params(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        """(CUgraphExec exec, CUgraphNode node, params*, ...): the same change made to the
        recorder's copy of the graph, so that its next launch is read with it (XLA's command
        buffers update their kernels' arguments between launches)."""
        if site != EXIT or not self._succeeded(result):
            return
        graph_exec, node, params = struct.unpack_from("<QQQ", MEMORY, p)
        copy = self._graph_of.get(graph_exec)
        if copy is None:
            return  # instantiated before recording: its launches are refused already
        try:
            self._reader().set_in_copy(copy, node, EXEC_NODE_SETTERS[call], params)
        except RuntimeError as exc:
            self._sink(ev.NotReproducible(call, f"the recorder could not follow the change ({exc})"))

    def _on_graph_launch(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site != ENTER:
            return
        graph_exec, stream = struct.unpack_from("<QQ", MEMORY, p)
        graph = self._graph_of.get(graph_exec)
        if graph is None:
            self._sink(ev.NotReproducible(call, "the graph was instantiated before recording started", stream))
            return
        if self._launch_results:
            self._sink(ev.NotReproducible(call, "kernel mode does not reach into graphs yet", stream))
            return
        events = list(self._reader().events(graph, stream, call))  # read all before writing any
        self._sink(ev.GraphLaunchBegin(graph_exec, stream))
        for event in events:
            self._sink(event)
        self._sink(ev.GraphLaunchEnd(graph_exec, stream))

    def _on_capture_begin(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == EXIT and self._succeeded(result):
            self._captures += 1
            self._sink = self._unless_captured

    def _on_capture_end(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == EXIT:  # the capture ends even when it failed
            self._captures = max(0, self._captures - 1)
            if not self._captures:
                self._sink = self._deliver

    def _unless_captured(self, event: ev.Event) -> None:
        """While a stream capture runs: work enqueued in a capturing stream is recorded into a
        graph, not run, so it is no operation of the program's (its graph's launches are)."""
        stream = getattr(event, "stream", None)
        if stream is not None:
            status = ctypes.c_int(0)
            if self._graphs is None:
                self._graphs = GraphReader(self._kernel)
            if (
                self._graphs.lib.cuStreamIsCapturing(ctypes.c_void_p(stream), ctypes.byref(status)) == 0
                and status.value
            ):
                return
        self._deliver(event)
