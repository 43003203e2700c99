"""CUDA graph launches as the recorder follows them, without a GPU: a stand-in for libcuda's
graph queries answers through the same ctypes arguments, and the translator writes the nodes
between 'cuda_graph' scope markers."""

from __future__ import annotations

import ctypes
import struct

import pytest
from test_capture_source import SAXPY, SAXPY_ARGS, FakeDriver, Keep, callback_data, source_with
from test_capture_translate import MODULE, FakeMemory, kernel, record, saxpy_params

import replayfmt
from replayfmt.capture import events as ev
from replayfmt.capture.cupti_api import DOMAIN_DRIVER_API
from replayfmt.capture.graphs import GraphReader, memcpy_event, topological_order
from replayfmt.format import model as m
from replayfmt.replay.plan import PlanOptions, build_plan

A, B = 0x7F00_0000_0000, 0x7F00_0010_0000
GRAPH, CHILD, EXEC = 0x6000, 0x6100, 0x7000


def memcpy3d(src: tuple[int, int], dst: tuple[int, int], width: int, height: int = 1) -> bytes:
    """A CUDA_MEMCPY3D: (memory type, address) per side; host addresses go in the host field."""
    side = struct.Struct("<QQQQI4xQQQQQQ")

    def one(kind: int, address: int) -> bytes:
        return side.pack(0, 0, 0, 0, kind, address if kind == 1 else 0, 0 if kind == 1 else address, 0, 0, 0, 0)

    return one(*src) + one(*dst) + struct.pack("<QQQ", width, height, 1)


def test_topological_order_puts_dependencies_first_and_refuses_cycles():
    assert topological_order([1, 2, 3, 4], [(3, 1), (1, 2), (4, 2)]) == [3, 4, 1, 2]
    with pytest.raises(ValueError, match="cycle"):
        topological_order([1, 2], [(1, 2), (2, 1)])


def test_memcpy_nodes_become_copies_by_memory_type():
    h2d = memcpy_event(memcpy3d((1, 0x1000), (2, A), 64), 5, "cuGraphLaunch")
    assert h2d == ev.Copy(ev.CopyDirection.H2D, A, 0x1000, 64, 5, True, "graph memcpy node")
    d2d = memcpy_event(memcpy3d((2, A), (2, B), 64), 5, "cuGraphLaunch")
    assert d2d.direction == ev.CopyDirection.D2D and (d2d.src, d2d.dst) == (A, B)
    unified = memcpy_event(memcpy3d((4, A), (1, 0x2000), 64), 5, "cuGraphLaunch")
    assert unified.direction == ev.CopyDirection.D2H
    flat = memcpy_event(memcpy3d((2, A), (2, B), 64, height=4), 5, "cuGraphLaunch")
    assert isinstance(flat, ev.NotReproducible) and "2-D" in flat.reason


class FakeGraphs:
    """libcuda's graph queries over a table: graph -> [(node, type)], edges, node parameters."""

    def __init__(self, keep: Keep) -> None:
        self.keep = keep
        self.nodes = {
            GRAPH: [(11, 0), (12, 2), (13, 4), (14, 7), (15, 5), (16, 4)],
            CHILD: [(21, 3), (22, 10)],
            CHILD + 5: [(31, 5)],
        }
        self.edges = {GRAPH: [(14, 11), (11, 12), (12, 13)], CHILD: [(21, 22)], CHILD + 5: []}
        arguments = [keep.put(a) for a in SAXPY_ARGS]
        self.kernel_params = keep.put(struct.pack("<4Q", *arguments))
        self.name = ctypes.c_char_p(b"saxpy")
        self.capturing: set[int] = set()
        self.destroyed: list[int] = []
        self.programmatic = {GRAPH, GRAPH + 1}  # graphs whose edges carry edge data
        self.updated: dict[int, bytes] = {}  # node -> kernel parameters set on the recorder's copy

    def cuGraphClone(self, out, graph):
        out._obj.value = graph.value + 1  # the recorder's copy: same nodes
        self.nodes[graph.value + 1] = self.nodes[graph.value]
        self.edges[graph.value + 1] = self.edges[graph.value]

    def cuGraphDestroy(self, graph):
        self.destroyed.append(graph.value)

    def cuGraphGetNodes(self, graph, out, count):
        nodes = self.nodes[graph.value]
        count._obj.value = len(nodes)
        if out is not None:
            for i, (node, _) in enumerate(nodes):
                out[i] = node

    def cuGraphGetEdges_v2(self, graph, sources, targets, data, count):
        edges = self.edges[graph.value]
        if sources is not None and not count._obj.value:
            return 1  # as libcuda: arrays with a count of 0 are an invalid value
        if sources is not None and data is None and graph.value in self.programmatic:
            return 402  # CUDA_ERROR_LOSSY_QUERY: edges with data (XLA's programmatic edges), asked without
        count._obj.value = len(edges)
        if sources is not None:
            for i, (s, t) in enumerate(edges):
                sources[i], targets[i] = s, t

    def cuGraphNodeGetType(self, node, kind):
        kind._obj.value = dict(n for nodes in self.nodes.values() for n in nodes)[node.value]

    def cuGraphKernelNodeGetParams_v2(self, node, params):
        data = struct.pack("<Q7I4xQQQQ", 0xF00, 4, 1, 1, 256, 1, 1, 0, self.kernel_params, 0, 0, 0)
        data = self.updated.get(node.value, data)
        ctypes.memmove(params, data, len(data))

    def cuGraphNodeFindInClone(self, out, node, clone):
        if node.value not in dict(self.nodes[clone.value]):
            return 400  # CUDA_ERROR_INVALID_HANDLE
        out._obj.value = node.value  # (the stand-in's copies share node ids)

    def cuGraphKernelNodeSetParams_v2(self, node, params):
        self.updated[node.value] = ctypes.string_at(params.value, 56)

    def cuFuncGetName(self, name, handle):
        name._obj.value = self.name.value

    def cuGraphMemsetNodeGetParams(self, node, params):
        data = struct.pack("<QQIIQQ", B, 0, 7, 4, 16, 1)
        ctypes.memmove(params, data, len(data))

    def cuGraphChildGraphNodeGetGraph(self, node, out):
        out._obj.value = CHILD if node.value == 13 else CHILD + 5  # a child with one node and no edges

    def cuGraphEventRecordNodeGetEvent(self, node, out):
        out._obj.value = 0x30

    def cuStreamIsCapturing(self, stream, status):
        status._obj.value = int((stream.value or 0) in self.capturing)
        return 0

    def __getattr__(self, name):
        raise AttributeError(name)


class Lib:
    """Wraps FakeGraphs so that each query returns CUDA_SUCCESS, as libcuda's functions do."""

    def __init__(self, fake: FakeGraphs) -> None:
        self.fake = fake

    def __getattr__(self, name):
        method = getattr(self.fake, name)

        def call(*args):
            result = method(*args)
            return 0 if result is None else result

        return call


IDS = {
    "cuGraphExecDestroy": 955,
    "cuGraphInstantiateWithFlags": 950,
    "cuGraphLaunch": 951,
    "cuStreamBeginCapture_v2": 952,
    "cuStreamEndCapture": 953,
    "cuLaunchKernel": 307,
    "cuGraphExecKernelNodeSetParams_v2": 954,
}


def graph_source():
    keep = Keep()
    source, seen = source_with(FakeDriver(SAXPY, module=1))
    source.route(IDS)
    fake = FakeGraphs(keep)
    source._graphs = GraphReader(source._kernel, lib=Lib(fake))
    return keep, source, seen, fake


def test_a_graph_launch_is_its_nodes_in_order_with_child_graphs_inlined():
    keep, source, seen, fake = graph_source()

    def call(name: str, site: int, params: bytes) -> None:
        source._callback(None, DOMAIN_DRIVER_API, IDS[name], callback_data(keep, site, keep.put(params)))

    call("cuGraphLaunch", 0, struct.pack("<QQ", EXEC, 0x10))  # instantiated before recording: refused
    out = keep.put(struct.pack("<Q", EXEC))
    call("cuGraphInstantiateWithFlags", 1, struct.pack("<QQQ", out, GRAPH, 0))
    del fake.nodes[GRAPH]  # the program destroys its graph once instantiated: the recorder's copy remains
    call("cuGraphLaunch", 0, struct.pack("<QQ", EXEC, 0x10))
    # the program changes a kernel node's grid on the executable graph (XLA's command buffers do,
    # between launches): the recorder's copy follows, and the next launch is read with it
    changed = keep.put(struct.pack("<Q7I4xQQQQ", 0xF00, 8, 1, 1, 256, 1, 1, 0, fake.kernel_params, 0, 0, 0))
    call("cuGraphExecKernelNodeSetParams_v2", 0, struct.pack("<QQQ", EXEC, 11, changed))  # entry: nothing yet
    call("cuGraphExecKernelNodeSetParams_v2", 1, struct.pack("<QQQ", EXEC, 11, changed))
    call("cuGraphLaunch", 0, struct.pack("<QQ", EXEC, 0x10))
    call("cuGraphExecKernelNodeSetParams_v2", 1, struct.pack("<QQQ", EXEC, 99, changed))  # no such node
    call("cuGraphExecDestroy", 0, struct.pack("<Q", EXEC))
    assert fake.destroyed == [GRAPH + 1]
    assert isinstance(seen[0], ev.NotReproducible) and "before recording started" in seen[0].reason
    graph, again = seen[1:8], seen[8:15]
    assert [type(e).__name__ for e in again] == [type(e).__name__ for e in graph]
    assert again[2].grid == (8, 1, 1) and again[2].parameters == graph[2].parameters
    assert [type(e).__name__ for e in graph] == [
        "GraphLaunchBegin",
        "EventRecorded",
        "LaunchBegin",
        "Memset",
        "HostFunction",
        "NotReproducible",
        "GraphLaunchEnd",
    ]
    launch = graph[2]
    assert launch.kernel.name == "saxpy" and launch.grid == (4, 1, 1) and launch.stream == 0x10
    assert launch.parameters == SAXPY_ARGS[0] + bytes(4) + b"".join(SAXPY_ARGS[1:])
    assert graph[3] == ev.Memset(B, 7, 4, 16, 0x10, "graph memset node")
    assert "memory allocation node" in graph[5].reason
    assert len(seen) == 16 and seen[-1] == ev.NotReproducible(
        "cuGraphExecKernelNodeSetParams_v2",
        "the recorder could not follow the change (cuGraphNodeFindInClone failed (CUresult 400))",
    )


def test_work_enqueued_in_a_capturing_stream_is_not_recorded():
    keep, source, seen, fake = graph_source()
    function = 0xF00
    arguments = keep.put(struct.pack("<4Q", *[keep.put(a) for a in SAXPY_ARGS]))

    def launch(stream: int) -> None:
        params = keep.put(struct.pack("<Q7I4xQQQ", function, 1, 1, 1, 32, 1, 1, 0, stream, arguments, 0))
        source._callback(None, DOMAIN_DRIVER_API, IDS["cuLaunchKernel"], callback_data(keep, 0, params, symbol="saxpy"))

    def capture(name: str) -> None:
        source._callback(
            None, DOMAIN_DRIVER_API, IDS[name], callback_data(keep, 1, keep.put(struct.pack("<QI4x", 0x10, 0)))
        )

    fake.capturing.add(0x10)
    capture("cuStreamBeginCapture_v2")
    launch(0x10)  # captured into a graph: not run now
    launch(0x20)  # another stream runs it
    fake.capturing.clear()
    capture("cuStreamEndCapture")
    launch(0x10)
    assert [(type(e).__name__, e.stream) for e in seen] == [("LaunchBegin", 0x20), ("LaunchBegin", 0x10)]


def test_graph_nodes_are_written_inside_a_cuda_graph_scope(tmp_path):
    from samples import compiled_cubin

    cubin = compiled_cubin("container_kernels.cu")
    if cubin is None:
        pytest.skip("nvcc not available")
    mem = FakeMemory()
    mem.device[A] = bytearray(64)
    mem.device[B] = bytearray(64)
    events = [
        ev.ModuleImage(MODULE, cubin, None),
        ev.Allocation(A, 64),
        ev.Allocation(B, 64),
        ev.GraphLaunchBegin(EXEC, 0x10),
        ev.LaunchBegin(kernel(), (1, 1, 1), (16, 1, 1), 0, 0x10, saxpy_params(2.0, A, B, 16)),
        ev.Memset(B, 0, 4, 16, 0x10),
        ev.GraphLaunchEnd(EXEC, 0x10),
    ]
    path, _ = record(tmp_path, events, mem)
    with replayfmt.open(path) as cap:
        ops = [op for op in cap.iter_operations() if op.kind.label not in ("create", "copy_h2d", "state")]
        assert [(op.kind.label, getattr(op, "name", "")) for op in ops][1:5] == [
            ("scope_begin", f"cuda_graph {EXEC:#x}"),
            ("launch", ""),
            ("memset", ""),
            ("scope_end", f"cuda_graph {EXEC:#x}"),
        ]
        assert not build_plan(cap, PlanOptions()).problems
        assert m.OperationKind.LAUNCH in {op.kind for op in ops}
