"""CUDA graph calls as the CUPTI source sees them: stream capture, instantiation, updates, launches.

A graph is read with the driver when it is instantiated (cuGraphInstantiate*: PyTorch destroys its
graph right after) and again when an executable graph is wholly updated (cuGraphExecUpdate);
single kernel-node updates (cuGraphExecKernelNodeSetParams) are read from the call's own
parameters. Graphs from stream capture and from the explicit API (cuGraphCreate, cuGraphAdd*Node)
are read the same way. Driver structs are read in place at their C layouts (x86-64), as the
other decoders do; what a node holds becomes :class:`events.GraphNodeInfo` values.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from typing import Any

from replayfmt.capture import events as ev
from replayfmt.capture.process_memory import MEMORY, read, u64
from replayfmt.format import model as m

_ENTER, _EXIT = 0, 1
# CUDA_KERNEL_NODE_PARAMS_v2: func, grid xyz, block xyz, sharedMemBytes, kernelParams, extra, kern, ctx
_KERNEL_V2 = struct.Struct("<Q7I4xQQQQ")
_KERNEL_V1 = struct.Struct("<Q7I4xQQ")
_MEMSET = struct.Struct("<QQIIQQ")  # CUDA_MEMSET_NODE_PARAMS: dst, pitch, value, elementSize, width, height
_MEMCPY3D_SIZE = 200
_MEMORY_HOST, _MEMORY_DEVICE, _MEMORY_UNIFIED = 1, 2, 4  # CUmemorytype
_MAX_DEPTH = 16  # child graphs nested deeper are refused
# CUgraphNodeType values
_KERNEL, _MEMCPY, _MEMSET_NODE, _HOST, _CHILD, _EMPTY, _WAIT, _RECORD = 0, 1, 2, 3, 4, 5, 6, 7
_NODE_NAMES = {8: "external semaphore signal", 9: "external semaphore wait", 10: "memory allocation",
               11: "memory free", 12: "batch memory operation", 13: "conditional"}  # fmt: skip

KernelCall = Callable[[int, int, int], tuple[ev.Kernel, bytes]]
"""(function or kernel handle, kernelParams, extra) -> the kernel and its argument block."""


def _check(cu: Any, result: Any, what: str) -> Any:
    """The values of a cuda-bindings result tuple; RuntimeError when the call failed (the
    source's callback turns it into a NotReproducible event naming the call)."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}: {getattr(err, 'name', err)}")
    return values[0] if len(values) == 1 else values


def _raw(struct_object: Any, size: int) -> bytes:
    """The C bytes of a cuda-bindings struct."""
    return read(int(struct_object.getPtr()), size)


def kernel_from_params(raw: bytes, kernel_call: KernelCall, v2: bool = True) -> ev.GraphKernel:
    """A kernel node's parameters (CUDA_KERNEL_NODE_PARAMS, v1 or v2 layout) as an event value.
    The context's CUfunction is named first: its module (or the library owning it) is what the
    program's eager launches resolved to; a node made from a CUkernel alone names that."""
    if v2:
        func, gx, gy, gz, bx, by, bz, smem, params, extra, kern, _ctx = _KERNEL_V2.unpack_from(raw)
    else:
        (func, gx, gy, gz, bx, by, bz, smem, params, extra), kern = _KERNEL_V1.unpack_from(raw), 0
    kernel, arguments = kernel_call(func or kern, params, extra)
    return ev.GraphKernel(kernel, (gx, gy, gz), (bx, by, bz), smem, arguments)


def _memcpy(raw: bytes) -> ev.GraphNodeInfo:
    src_x, src_y, src_z = struct.unpack_from("<QQQ", raw, 0)
    (src_kind,) = struct.unpack_from("<I", raw, 32)
    src_device, src_pitch, src_height = struct.unpack_from("<Q", raw, 48)[0], *struct.unpack_from("<QQ", raw, 72)
    dst_x, dst_y, dst_z = struct.unpack_from("<QQQ", raw, 88)
    (dst_kind,) = struct.unpack_from("<I", raw, 120)
    dst_device, dst_pitch, dst_height = struct.unpack_from("<Q", raw, 136)[0], *struct.unpack_from("<QQ", raw, 160)
    width, height, depth = struct.unpack_from("<QQQ", raw, 176)
    node = ev.GraphNodeInfo(m.GraphNodeKind.MEMCPY)
    device_kinds = (_MEMORY_DEVICE, _MEMORY_UNIFIED)
    if src_kind not in device_kinds or dst_kind not in device_kinds:
        node.unsupported = "a graph memcpy node to or from host memory or an array is not recorded yet"
    elif height > 1 or depth > 1:
        node.unsupported = "a 2D or 3D graph memcpy node is not recorded yet"
    node.src = src_device + src_x + src_y * src_pitch + src_z * src_pitch * src_height
    node.dst = dst_device + dst_x + dst_y * dst_pitch + dst_z * dst_pitch * dst_height
    node.size = width
    return node


class GraphWalker:
    """Reads graphs with driver ``cu``; kernel nodes are resolved through ``kernel_call``."""

    def __init__(self, cu: Any, kernel_call: KernelCall) -> None:
        self.cu = cu
        self.kernel_call = kernel_call

    def walk(self, graph: int, depth: int = 0) -> ev.GraphDescription:
        cu = self.cu
        count = _check(cu, cu.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")[-1]
        handles: list[int] = []
        if count:  # (node arrays with a count of 0 are refused: CUDA_ERROR_INVALID_VALUE)
            handles = [int(h) for h in _check(cu, cu.cuGraphGetNodes(graph, count), "cuGraphGetNodes")[0]][:count]
        index = {h: i for i, h in enumerate(handles)}
        nodes = [self._node(h, depth) for h in handles]
        edge_count = _check(cu, cu.cuGraphGetEdges(graph, 0), "cuGraphGetEdges")[-1]
        edges: list[tuple[int, int]] = []
        if edge_count:
            result = _check(cu, cu.cuGraphGetEdges(graph, edge_count), "cuGraphGetEdges")
            for src, dst in zip(result[0][:edge_count], result[1][:edge_count], strict=True):
                edges.append((index[int(src)], index[int(dst)]))
        return ev.GraphDescription(nodes, edges)

    def _node(self, handle: int, depth: int) -> ev.GraphNodeInfo:
        cu = self.cu
        kind = int(_check(cu, cu.cuGraphNodeGetType(handle), "cuGraphNodeGetType"))
        node: ev.GraphNodeInfo
        if kind == _KERNEL:
            params = _check(cu, cu.cuGraphKernelNodeGetParams(handle), "cuGraphKernelNodeGetParams")
            kernel = kernel_from_params(_raw(params, _KERNEL_V2.size), self.kernel_call)
            node = ev.GraphNodeInfo(m.GraphNodeKind.KERNEL, kernel=kernel)
        elif kind == _MEMCPY:
            params = _check(cu, cu.cuGraphMemcpyNodeGetParams(handle), "cuGraphMemcpyNodeGetParams")
            node = _memcpy(_raw(params, _MEMCPY3D_SIZE))
        elif kind == _MEMSET_NODE:
            params = _check(cu, cu.cuGraphMemsetNodeGetParams(handle), "cuGraphMemsetNodeGetParams")
            dst, pitch, value, element_size, width, height = _MEMSET.unpack_from(_raw(params, _MEMSET.size))
            node = ev.GraphNodeInfo(m.GraphNodeKind.MEMSET, dst=dst, value=value, element_size=element_size,
                                    width=width, height=max(1, height), pitch=pitch)  # fmt: skip
        elif kind in (_RECORD, _WAIT):
            get = cu.cuGraphEventRecordNodeGetEvent if kind == _RECORD else cu.cuGraphEventWaitNodeGetEvent
            event = int(_check(cu, get(handle), "cuGraphEvent*NodeGetEvent"))
            node_kind = m.GraphNodeKind.EVENT_RECORD if kind == _RECORD else m.GraphNodeKind.EVENT_WAIT
            node = ev.GraphNodeInfo(node_kind, event=event)
        elif kind == _CHILD:
            node = ev.GraphNodeInfo(m.GraphNodeKind.CHILD_GRAPH)
            if depth >= _MAX_DEPTH:
                node.unsupported = f"child graphs nested more than {_MAX_DEPTH} deep"
            else:
                child = _check(cu, cu.cuGraphChildGraphNodeGetGraph(handle), "cuGraphChildGraphNodeGetGraph")
                node.child = self.walk(int(child), depth + 1)
        elif kind == _EMPTY:
            node = ev.GraphNodeInfo(m.GraphNodeKind.EMPTY)
        elif kind == _HOST:
            node = ev.GraphNodeInfo(m.GraphNodeKind.HOST)
        else:
            name = _NODE_NAMES.get(kind, f"type {kind}")
            node = ev.GraphNodeInfo(m.GraphNodeKind.EMPTY, unsupported=f"a graph node of kind {name} is not recorded")
        node.handle = handle
        return node


# -- decoders: (source, callback site, functionParams, functionReturnValue, call name, symbol) -----


def _described(source: Any, graph: int, call: str) -> ev.GraphDescription:
    """The graph as the driver reports it; a graph that cannot be read becomes one refused node,
    so that its launches say why (instantiation usually happens outside any recorded region)."""
    try:
        return source.graph_walker().walk(graph)
    except Exception as exc:
        reason = f"{call}: the recorder could not read the graph ({type(exc).__name__}: {exc})"
        return ev.GraphDescription([ev.GraphNodeInfo(m.GraphNodeKind.EMPTY, unsupported=reason)], [])


def on_instantiate(source: Any, site: int, p: int, result: int, call: str, symbol: int) -> None:
    """cuGraphInstantiate*(CUgraphExec* out, CUgraph graph, ...): walk the graph once it succeeded."""
    if site == _EXIT and source.succeeded(result):
        out, graph = struct.unpack_from("<QQ", MEMORY, p)
        source.emit(ev.GraphInstantiated(u64(out), _described(source, graph, call)))


def on_exec_update(source: Any, site: int, p: int, result: int, call: str, symbol: int) -> None:
    """cuGraphExecUpdate(CUgraphExec exec, CUgraph graph, ...): the executable now runs ``graph``."""
    if site == _EXIT and source.succeeded(result):
        executable, graph = struct.unpack_from("<QQ", MEMORY, p)
        source.emit(ev.GraphInstantiated(executable, _described(source, graph, call)))


def on_exec_kernel_update(source: Any, site: int, p: int, result: int, call: str, symbol: int) -> None:
    """cuGraphExecKernelNodeSetParams(exec, node, const CUDA_KERNEL_NODE_PARAMS*): read while the
    caller's argument pointers are valid, sent once the call succeeded."""
    executable, node, params = struct.unpack_from("<QQQ", MEMORY, p)
    pending = source.pending_graph_updates
    if site == _ENTER:
        v2 = call.endswith("_v2")
        size = _KERNEL_V2.size if v2 else _KERNEL_V1.size
        kernel = kernel_from_params(read(params, size), source.kernel_call, v2)
        pending[threading.get_ident()] = ev.GraphKernelUpdated(executable, node, kernel)
        return
    update = pending.pop(threading.get_ident(), None)
    if update is not None and source.succeeded(result):
        source.emit(update)


def on_graph_launch(source: Any, site: int, p: int, result: int, call: str, symbol: int) -> None:
    if site == _ENTER:
        executable, stream = struct.unpack_from("<QQ", MEMORY, p)
        source.emit(ev.GraphLaunched(executable, stream))


def on_begin_capture(source: Any, site: int, p: int, result: int, call: str, symbol: int) -> None:
    """cuStreamBeginCapture*(CUstream stream, ...), cuStreamBeginCaptureToGraph included."""
    if site == _EXIT and source.succeeded(result):
        source.emit(ev.StreamCaptureBegan(u64(p)))


def on_end_capture(source: Any, site: int, p: int, result: int, call: str, symbol: int) -> None:
    if site == _EXIT:  # ended, whether or not the capture was valid
        source.emit(ev.StreamCaptureEnded(u64(p)))


def on_unrecorded_update(source: Any, site: int, p: int, result: int, call: str, symbol: int) -> None:
    if site == _ENTER:
        source.emit(ev.NotReproducible(call, "this update of an executable CUDA graph is not recorded yet"))


def _variants(*names: str) -> list[str]:
    return [n + suffix for n in names for suffix in ("", "_ptsz", "_ptds")]


_INSTANTIATE = ["cuGraphInstantiate", "cuGraphInstantiate_v2", "cuGraphInstantiateWithFlags",
                *_variants("cuGraphInstantiateWithParams")]  # fmt: skip
_UNRECORDED_UPDATES = [
    "cuGraphExecMemcpyNodeSetParams", "cuGraphExecMemsetNodeSetParams", "cuGraphExecHostNodeSetParams",
    "cuGraphExecChildGraphNodeSetParams", "cuGraphExecEventRecordNodeSetEvent", "cuGraphExecEventWaitNodeSetEvent",
    "cuGraphExecNodeSetParams", "cuGraphNodeSetEnabled", "cuGraphExecBatchMemOpNodeSetParams",
    "cuGraphExecExternalSemaphoresSignalNodeSetParams", "cuGraphExecExternalSemaphoresWaitNodeSetParams",
]  # fmt: skip
GRAPH_DECODERS: dict[str, Callable[..., None]] = {
    **dict.fromkeys(_INSTANTIATE, on_instantiate),
    **dict.fromkeys(["cuGraphExecUpdate", "cuGraphExecUpdate_v2"], on_exec_update),
    **dict.fromkeys(["cuGraphExecKernelNodeSetParams", "cuGraphExecKernelNodeSetParams_v2"], on_exec_kernel_update),
    **dict.fromkeys(_variants("cuGraphLaunch"), on_graph_launch),
    **dict.fromkeys(
        _variants("cuStreamBeginCapture", "cuStreamBeginCapture_v2", "cuStreamBeginCaptureToGraph"), on_begin_capture
    ),
    **dict.fromkeys(_variants("cuStreamEndCapture"), on_end_capture),
    **dict.fromkeys(_UNRECORDED_UPDATES, on_unrecorded_update),
}
"""Driver calls (by CUPTI callback name) this module decodes; the source routes them here."""
