"""CUDA graphs in the recorder, without a GPU: a stand-in for libcuda's graph queries answers
through the same ctypes arguments, so the source reads graphs into descriptions at their
instantiation; the translator, fed graph events, writes Graph objects and GraphLaunch operations
with their snapshots, and a new graph version after an update."""

from __future__ import annotations

import ctypes
import struct

import numpy as np
from test_capture_source import SAXPY, SAXPY_ARGS, FakeDriver, Keep, callback_data, source_with
from test_capture_translate import MODULE, A, B, C, FakeMemory, kernel, record, saxpy_params

import replayfmt
from replayfmt.capture import events as ev
from replayfmt.capture.cupti_api import DOMAIN_DRIVER_API
from replayfmt.capture.graphs import GraphReader, memcpy_node
from replayfmt.format import model as m
from replayfmt.format.model import GraphNodeKind
from replayfmt.replay.plan import PlanOptions, build_plan

GRAPH, CHILD, EXEC = 0x6000, 0x6100, 0x7000
_N = GraphNodeKind


def memcpy3d(src: tuple[int, int], dst: tuple[int, int], width: int, height: int = 1) -> bytes:
    """A CUDA_MEMCPY3D: (memory type, address) per side; host addresses go in the host field."""
    side = struct.Struct("<QQQQI4xQQQQQQ")

    def one(kind: int, address: int) -> bytes:
        return side.pack(0, 0, 0, 0, kind, address if kind == 1 else 0, 0 if kind == 1 else address, 0, 0, 0, 0)

    return one(*src) + one(*dst) + struct.pack("<QQQ", width, height, 1)


def test_memcpy_nodes_hold_device_copies_and_name_what_they_cannot_hold():
    d2d = memcpy_node(memcpy3d((2, A), (4, B), 64))
    assert (d2d.kind, d2d.src, d2d.dst, d2d.size, d2d.unsupported) == (_N.MEMCPY, A, B, 64, "")
    h2d = memcpy_node(memcpy3d((1, 0x1000), (2, A), 64))
    assert "to or from host memory" in h2d.unsupported
    flat = memcpy_node(memcpy3d((2, A), (2, B), 64, height=4))
    assert "2-D or 3-D" in flat.unsupported


class FakeGraphs:
    """libcuda's graph queries over a table: graph -> [(node, type)], edges, node parameters."""

    def __init__(self, keep: Keep) -> None:
        self.keep = keep
        self.nodes = {
            GRAPH: [(11, 0), (12, 2), (13, 4), (14, 7), (15, 5), (16, 4), (17, 1), (18, 6)],
            CHILD: [(21, 3), (22, 10)],
            CHILD + 5: [(31, 5)],
        }
        self.edges = {GRAPH: [(14, 11), (11, 12), (12, 13), (11, 17), (17, 18)], CHILD: [(21, 22)], CHILD + 5: []}
        self.edge_data = {(11, 17): bytes([1, 0, 1])}  # CUgraphEdgeData: from_port, to_port, type (programmatic)
        arguments = [keep.put(a) for a in SAXPY_ARGS]
        self.kernel_params = keep.put(struct.pack("<4Q", *arguments))
        self.name = ctypes.c_char_p(b"saxpy")
        self.capturing: set[int] = set()
        self.clusters = {11: (2, 1, 1)}  # a kernel node launched in clusters of two blocks (an attribute)

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
        count._obj.value = len(edges)
        if sources is not None:
            for i, (s, t) in enumerate(edges):
                sources[i], targets[i] = s, t
                data[8 * i : 8 * i + 3] = list(self.edge_data.get((s, t), bytes(3)))

    def cuGraphNodeGetType(self, node, kind):
        kind._obj.value = dict(n for nodes in self.nodes.values() for n in nodes)[node.value]

    def cuGraphKernelNodeGetParams_v2(self, node, params):
        data = struct.pack("<Q7I4xQQQQ", 0xF00, 4, 1, 1, 256, 1, 1, 0, self.kernel_params, 0, 0, 0)
        ctypes.memmove(params, data, len(data))

    def cuGraphKernelNodeGetAttribute(self, node, attribute, value):
        assert attribute == 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        dims = self.clusters.get(node.value, (0, 0, 0))
        ctypes.memmove(value, struct.pack("<III", *dims), 12)

    def cuFuncGetName(self, name, handle):
        name._obj.value = self.name.value

    def cuGraphMemsetNodeGetParams(self, node, params):
        data = struct.pack("<QQIIQQ", B, 0, 7, 4, 16, 1)
        ctypes.memmove(params, data, len(data))

    def cuGraphMemcpyNodeGetParams(self, node, params):
        data = memcpy3d((2, B), (2, C), 64)
        ctypes.memmove(params, data, len(data))

    def cuGraphEventWaitNodeGetEvent(self, node, out):
        out._obj.value = 0x31

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
    "cuGraphExecUpdate_v2": 956,
    "cuGraphExecMemsetNodeSetParams": 957,
    "cuGraphExecChildGraphNodeSetParams": 958,
    "cuGraphExecEventWaitNodeSetEvent": 959,
    "cuGraphNodeSetEnabled": 960,
    "cuGraphExecNodeSetParams": 961,
}


def graph_source():
    keep = Keep()
    source, seen = source_with(FakeDriver(SAXPY, module=1))
    source.route(IDS)
    fake = FakeGraphs(keep)
    source._graphs = GraphReader(source._kernel, lib=Lib(fake))
    return keep, source, seen, fake


def caller(keep: Keep, source):
    def call(name: str, site: int, params: bytes, result: int = 0) -> None:
        data = callback_data(keep, site, keep.put(params), result=result)
        source._callback(None, DOMAIN_DRIVER_API, IDS[name], data)

    return call


def test_a_graph_is_read_when_instantiated_with_its_nodes_edges_and_children():
    keep, source, seen, fake = graph_source()
    call = caller(keep, source)
    out = keep.put(struct.pack("<Q", EXEC))  # the CUgraphExec the call wrote
    call("cuGraphInstantiateWithFlags", 1, struct.pack("<QQQ", out, GRAPH, 0))
    del fake.nodes[GRAPH]  # the program destroys its graph once instantiated: the description remains
    call("cuGraphLaunch", 0, struct.pack("<QQ", EXEC, 0x10))
    call("cuGraphExecDestroy", 0, struct.pack("<Q", EXEC))
    instantiated, launched, destroyed = seen
    assert launched == ev.GraphLaunched(EXEC, 0x10) and destroyed == ev.GraphExecDestroyed(EXEC)
    assert instantiated.graph_exec == EXEC
    graph = instantiated.graph
    kinds = [n.kind for n in graph.nodes]
    expected = ["KERNEL", "MEMSET", "CHILD_GRAPH", "EVENT_RECORD", "EMPTY", "CHILD_GRAPH", "MEMCPY", "EVENT_WAIT"]
    assert kinds == [_N[name] for name in expected]
    assert [n.handle for n in graph.nodes] == [11, 12, 13, 14, 15, 16, 17, 18]
    assert graph.edges == [(3, 0), (0, 1), (1, 2), (0, 6), (6, 7)]  # node handles become indices
    programmatic = m.GraphEdgeData(m.GraphEdgePort.PROGRAMMATIC, 0, m.GraphEdgeType.PROGRAMMATIC)
    assert graph.edge_data == [m.FULL_DEPENDENCY] * 3 + [
        programmatic,
        m.FULL_DEPENDENCY,
    ]  # (11 -> 17) read as the driver gives it
    kernel_node = graph.nodes[0].kernel
    assert kernel_node.cluster == (2, 1, 1)
    assert kernel_node.kernel.name == "saxpy" and kernel_node.grid == (4, 1, 1) and kernel_node.block == (256, 1, 1)
    assert kernel_node.parameters == SAXPY_ARGS[0] + bytes(4) + b"".join(SAXPY_ARGS[1:])
    memset = graph.nodes[1]
    assert (memset.dst, memset.value, memset.element_size, memset.width, memset.height) == (B, 7, 4, 16, 1)
    assert (graph.nodes[3].event, graph.nodes[7].event) == (0x30, 0x31)
    assert (graph.nodes[6].src, graph.nodes[6].dst, graph.nodes[6].size) == (B, C, 64)
    child = graph.nodes[2].child
    assert [n.kind for n in child.nodes] == [_N.HOST, _N.EMPTY] and child.edges == [(0, 1)]
    assert child.edge_data == []  # every edge a full dependency: none kept
    assert child.nodes[1].unsupported == "a graph holds a memory allocation node, which is not recorded yet"
    assert [n.kind for n in graph.nodes[5].child.nodes] == [_N.EMPTY]


def test_updates_become_events_and_an_unreadable_graph_says_why():
    keep, source, seen, _ = graph_source()
    call = caller(keep, source)
    pointers = keep.put(struct.pack("<4Q", *[keep.put(a) for a in SAXPY_ARGS]))
    params = keep.put(struct.pack("<Q7I4xQQQQ", 0xF00, 8, 1, 1, 128, 1, 1, 0, pointers, 0, 0, 0))
    update = struct.pack("<QQQ", EXEC, 11, params)
    call("cuGraphExecKernelNodeSetParams_v2", 0, update)
    call("cuGraphExecKernelNodeSetParams_v2", 1, update)
    call("cuGraphExecKernelNodeSetParams_v2", 0, update)
    call("cuGraphExecKernelNodeSetParams_v2", 1, update, result=1)  # it failed: no event
    memset = keep.put(struct.pack("<QQIIQQ", 0xA000, 0, 9, 4, 16, 1))  # CUDA_MEMSET_NODE_PARAMS
    call("cuGraphExecMemsetNodeSetParams", 0, struct.pack("<QQQ", EXEC, 12, 0))  # null: refused by the driver
    call("cuGraphExecMemsetNodeSetParams", 1, struct.pack("<QQQ", EXEC, 12, 0), result=1)
    call("cuGraphExecMemsetNodeSetParams", 0, struct.pack("<QQQ", EXEC, 12, memset))
    call("cuGraphExecMemsetNodeSetParams", 1, struct.pack("<QQQ", EXEC, 12, memset))
    call("cuGraphExecUpdate_v2", 1, struct.pack("<QQQ", EXEC, CHILD + 5, 0))
    call("cuGraphExecUpdate_v2", 1, struct.pack("<QQQ", EXEC, 0xBAD, 0))  # a graph the stand-in does not know
    updated, refused, replaced, unreadable = seen
    assert isinstance(updated, ev.GraphKernelUpdated) and (updated.graph_exec, updated.node) == (EXEC, 11)
    assert updated.kernel.grid == (8, 1, 1) and updated.kernel.block == (128, 1, 1)
    assert refused == ev.GraphNodeUpdated(
        EXEC, 12, ev.GraphNodeInfo(_N.MEMSET, dst=0xA000, value=9, element_size=4, width=16, height=1)
    )
    assert replaced.graph_exec == EXEC and [n.kind for n in replaced.graph.nodes] == [_N.EMPTY]
    (node,) = unreadable.graph.nodes
    assert node.unsupported.startswith("cuGraphExecUpdate_v2: the recorder could not read the graph (KeyError")


def test_child_graph_event_and_enable_changes_become_events():
    """XLA's command buffers swap the graph a child node runs between launches
    (cuGraphExecChildGraphNodeSetParams): the new child is read at the call, as are a changed
    event, a node disabled, and a child graph given through cuGraphExecNodeSetParams."""
    keep, source, seen, _ = graph_source()
    call = caller(keep, source)
    swap = struct.pack("<QQQ", EXEC, 13, CHILD + 5)
    call("cuGraphExecChildGraphNodeSetParams", 0, swap)
    call("cuGraphExecChildGraphNodeSetParams", 1, swap)
    call("cuGraphExecChildGraphNodeSetParams", 0, swap)
    call("cuGraphExecChildGraphNodeSetParams", 1, swap, result=1)  # it failed: no event
    call("cuGraphExecEventWaitNodeSetEvent", 0, struct.pack("<QQQ", EXEC, 18, 0x32))
    call("cuGraphExecEventWaitNodeSetEvent", 1, struct.pack("<QQQ", EXEC, 18, 0x32))
    call("cuGraphNodeSetEnabled", 0, struct.pack("<QQI4x", EXEC, 11, 0))
    call("cuGraphNodeSetEnabled", 1, struct.pack("<QQI4x", EXEC, 11, 0))
    generic = keep.put(struct.pack("<i12xQ", 4, CHILD) + bytes(64))  # CUgraphNodeParams of a child graph
    call("cuGraphExecNodeSetParams", 0, struct.pack("<QQQ", EXEC, 16, generic))
    call("cuGraphExecNodeSetParams", 1, struct.pack("<QQQ", EXEC, 16, generic))
    swapped, waited, disabled, nested = seen
    assert (swapped.graph_exec, swapped.node, swapped.info.kind) == (EXEC, 13, _N.CHILD_GRAPH)
    assert [n.kind for n in swapped.info.child.nodes] == [_N.EMPTY]
    assert waited == ev.GraphNodeUpdated(EXEC, 18, ev.GraphNodeInfo(_N.EVENT_WAIT, event=0x32))
    assert disabled == ev.GraphNodeEnabled(EXEC, 11, False)
    assert [n.kind for n in nested.info.child.nodes] == [_N.HOST, _N.EMPTY]


def test_kernel_mode_refuses_graph_launches():
    keep, source, seen, _ = graph_source()
    source._launch_results = True
    caller(keep, source)("cuGraphLaunch", 0, struct.pack("<QQ", EXEC, 0x10))
    (refused,) = seen
    assert refused == ev.NotReproducible("cuGraphLaunch", "kernel mode does not reach into graphs yet", 0x10)


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


# -- the translator ------------------------------------------------------------------------------


def description(a: float = 2.0) -> ev.GraphDescription:
    """memset C; saxpy y = a*x + y on (A, B); copy B -> C; event record. Edges 0->2, 1->2, 2->3."""
    k = ev.GraphKernel(kernel(), (1, 1, 1), (64, 1, 1), 0, saxpy_params(a, A, B, 64))
    return ev.GraphDescription(
        [
            ev.GraphNodeInfo(_N.MEMSET, handle=0x10, dst=C, value=0, element_size=4, width=64),
            ev.GraphNodeInfo(_N.KERNEL, handle=0x11, kernel=k),
            ev.GraphNodeInfo(_N.MEMCPY, handle=0x12, src=B, dst=C, size=256),
            ev.GraphNodeInfo(_N.EVENT_RECORD, handle=0x13, event=0xE1),
        ],
        [(0, 2), (1, 2), (2, 3)],
    )


def graph_memory() -> FakeMemory:
    mem = FakeMemory()
    mem.device[A] = bytearray(np.arange(64, dtype=np.float32).tobytes())
    mem.device[B] = bytearray(np.ones(64, dtype=np.float32).tobytes())
    mem.device[C] = bytearray(256)
    return mem


def setup_events(cubin: bytes, stream: int = 0x5000) -> list:
    return [
        ev.ModuleImage(MODULE, cubin, None, "cuModuleLoadData"),
        ev.StreamCreated(stream, 1),
        ev.Allocation(A, 256),
        ev.Allocation(B, 256),
        ev.Allocation(C, 256),
    ]


def test_graph_launches_write_the_graph_once_snapshot_first_and_checkpoint(tmp_path, cubin):
    mem = graph_memory()

    def run_graph():  # the device runs the graph after its launch
        mem.device[B][:] = (2 * np.arange(64) + 1).astype(np.float32).tobytes()
        mem.device[C][:] = mem.device[B]
        return ev.StreamSynchronized(0x5000)

    launch = ev.GraphLaunched(0xE0E0, 0x5000)
    events = [*setup_events(cubin), ev.GraphInstantiated(0xE0E0, description()), launch, run_graph, launch]
    path, t = record(tmp_path, events, mem)
    assert not t.report.errors and t.report.kernels["saxpy"].captured == 2
    assert (t.report.graph_launches, t.report.graphs) == (2, 1)
    assert "  CUDA graphs: 2 launches recorded as graph launches of 1 graph objects" in t.report.lines()
    with replayfmt.open(path) as cap:
        ops = list(cap.iter_operations())
        (graph,) = [o for o in cap.objects() if isinstance(o, m.Graph)]
        buffers = {o.address: o.id for o in cap.objects() if isinstance(o, m.Buffer)}
        assert [n.kind for n in graph.nodes] == [_N.MEMSET, _N.KERNEL, _N.MEMCPY, _N.EVENT_RECORD]
        assert graph.edges == ((0, 2), (1, 2), (2, 3))
        memset, kernel_node, memcpy, record_node = graph.nodes
        assert (memset.dst_buffer, memset.width, memset.element_size) == (buffers[C], 64, 4)
        relocated = {(r.site_offset, r.target_buffer) for r in kernel_node.relocations}
        assert relocated == {(8, buffers[A]), (16, buffers[B])}
        assert (memcpy.src_buffer, memcpy.dst_buffer, memcpy.size) == (buffers[B], buffers[C], 256)
        assert isinstance(cap.object(record_node.event), m.Event)
        launches = [op for op in ops if op.kind == m.OperationKind.GRAPH_LAUNCH]
        assert [(op.graph, cap.object(op.stream).captured_handle) for op in launches] == [(graph.id, 0x5000)] * 2
        first = ops.index(launches[0])
        state = [op.buffer for op in ops[:first] if op.kind == m.OperationKind.STATE]
        assert sorted(state) == sorted(buffers.values())  # every buffer the graph touches, before it runs
        (checkpoint,) = [op for op in ops if op.kind == m.OperationKind.CHECKPOINT]
        assert sorted(e.buffer for e in checkpoint.entries) == sorted(buffers.values())
        plan = build_plan(cap, PlanOptions())
        assert set(plan.graphs) == {graph.id} and plan.launches_of[(kernel_node.executable, 0)] == 1


def test_updates_write_new_graph_versions_and_a_bad_update_refuses_the_launch(tmp_path, cubin):
    k3 = ev.GraphKernel(kernel(), (1, 1, 1), (64, 1, 1), 0, saxpy_params(3.0, A, B, 64))
    launch = ev.GraphLaunched(0xE0E0, 0x5000)
    events = [
        *setup_events(cubin),
        ev.GraphInstantiated(0xE0E0, description()),
        launch,
        ev.GraphKernelUpdated(0xE0E0, 0x11, k3),
        launch,
        ev.GraphInstantiated(0xE0E0, description(2.0)),  # cuGraphExecUpdate back to the first graph
        launch,
        ev.GraphKernelUpdated(0xE0E0, 0x10, k3),  # node 0x10 is the memset
        launch,
    ]
    path, t = record(tmp_path, events, graph_memory())
    with replayfmt.open(path) as cap:
        graphs = [o for o in cap.objects() if isinstance(o, m.Graph)]
        ops = list(cap.iter_operations())
        assert len(graphs) == 2 and t.report.graphs == 2
        a = [np.frombuffer(g.nodes[1].parameters[:4], np.float32)[0] for g in graphs]
        assert a == [2.0, 3.0]
        launched = [op.graph for op in ops if op.kind == m.OperationKind.GRAPH_LAUNCH]
        assert launched == [graphs[0].id, graphs[1].id, graphs[0].id]  # an unchanged graph is written once
        (refused,) = [op for op in ops if op.kind == m.OperationKind.UNSUPPORTED]
        assert refused.reason == "cuGraphExecKernelNodeSetParams changed node 0x10, no kernel node of it"


def test_unrecordable_graphs_become_unsupported_operations(tmp_path, cubin):
    host_copy = ev.GraphDescription([ev.GraphNodeInfo(_N.MEMCPY, unsupported="a host copy")], [])
    outside = ev.GraphDescription([ev.GraphNodeInfo(_N.MEMSET, dst=0x1234, element_size=1, width=4)], [])
    unknown = ev.GraphKernel(ev.Kernel(0xF01, "early", ("module", 0x999), SAXPY), (1, 1, 1), (1, 1, 1), 0, bytes(32))
    early = ev.GraphDescription([ev.GraphNodeInfo(_N.KERNEL, kernel=unknown)], [])
    events = [
        *setup_events(cubin),
        ev.GraphInstantiated(1, host_copy),
        ev.GraphInstantiated(2, outside),
        ev.GraphLaunched(1, 0x5000),
        ev.GraphLaunched(2, 0x5000),
        ev.GraphLaunched(3, 0x5000),
        ev.GraphExecDestroyed(2),
        ev.GraphLaunched(2, 0x5000),
        ev.GraphInstantiated(4, early),
        ev.GraphLaunched(4, 0x5000),
    ]
    path, t = record(tmp_path, events, graph_memory())
    with replayfmt.open(path) as cap:
        reasons = [op.reason for op in cap.iter_operations() if op.kind == m.OperationKind.UNSUPPORTED]
    assert reasons[0] == "a host copy"
    assert reasons[1] == "a graph node uses address 0x1234, in no recorded allocation"
    assert reasons[2] == "the executable graph 0x3 was instantiated before the recorder started"
    assert reasons[3] == "the executable graph 0x2 was instantiated before the recorder started"
    assert reasons[4] == "the module of early was loaded before the recorder started"
    assert t.report.unsupported == {"cuGraphLaunch": 5} and t.report.graph_launches == 0


def test_memset_and_memcpy_node_updates_write_new_versions_and_an_unread_change_refuses(tmp_path, cubin):
    """XLA's command buffers change memset and memcpy nodes between launches, as kernel nodes."""
    launch = ev.GraphLaunched(0xE0E0, 0x5000)
    new_memset = ev.GraphNodeInfo(_N.MEMSET, dst=C, value=7, element_size=4, width=32)
    new_memcpy = ev.GraphNodeInfo(_N.MEMCPY, src=A, dst=C, size=128)
    unread = ev.GraphNodeInfo(_N.EMPTY, unsupported="cuGraphExecNodeSetParams changed a conditional node")
    events = [
        *setup_events(cubin),
        ev.GraphInstantiated(0xE0E0, description()),
        launch,
        ev.GraphNodeUpdated(0xE0E0, 0x10, new_memset),
        ev.GraphNodeUpdated(0xE0E0, 0x12, new_memcpy),
        launch,
        ev.GraphNodeUpdated(0xE0E0, 0x11, new_memset),  # node 0x11 is the kernel: no memset of that handle
        launch,
        ev.GraphInstantiated(0xE0E0, description()),
        ev.GraphNodeUpdated(0xE0E0, 0x12, unread),
        launch,
    ]
    path, _ = record(tmp_path, events, graph_memory())
    with replayfmt.open(path) as cap:
        graphs = [o for o in cap.objects() if isinstance(o, m.Graph)]
        buffers = {o.address: o.id for o in cap.objects() if isinstance(o, m.Buffer)}
        ops = list(cap.iter_operations())
        assert len(graphs) == 2
        memset, _, memcpy, _ = graphs[1].nodes
        assert (memset.value, memset.width) == (7, 32)
        assert (memcpy.src_buffer, memcpy.dst_buffer, memcpy.size) == (buffers[A], buffers[C], 128)
        launched = [op.graph for op in ops if op.kind == m.OperationKind.GRAPH_LAUNCH]
        assert launched == [graphs[0].id, graphs[1].id]
        refusals = [op.reason for op in ops if op.kind == m.OperationKind.UNSUPPORTED]
        assert refusals == [
            "a memset node update named node 0x11, no such node",
            "cuGraphExecNodeSetParams changed a conditional node",
        ]


def test_a_swapped_child_graph_and_a_disabled_node_write_new_graph_versions(tmp_path, cubin):
    """A child node's graph swapped between launches (XLA's command buffers) and a node disabled:
    each launch runs the graph as it was then, and enabling the node again returns to the first."""
    k = ev.GraphKernel(kernel(), (1, 1, 1), (64, 1, 1), 0, saxpy_params(2.0, A, B, 64))
    k3 = ev.GraphKernel(kernel(), (1, 1, 1), (64, 1, 1), 0, saxpy_params(3.0, A, B, 64))

    def child(node: ev.GraphKernel) -> ev.GraphDescription:
        return ev.GraphDescription([ev.GraphNodeInfo(_N.KERNEL, handle=0x21, kernel=node)], [])

    outer = ev.GraphDescription(
        [
            ev.GraphNodeInfo(_N.CHILD_GRAPH, handle=0x30, child=child(k)),
            ev.GraphNodeInfo(_N.MEMSET, handle=0x31, dst=C, value=0, element_size=4, width=64),
        ],
        [(0, 1)],
    )
    launch = ev.GraphLaunched(0xE0E0, 0x5000)
    events = [
        *setup_events(cubin),
        ev.GraphInstantiated(0xE0E0, outer),
        launch,
        ev.GraphNodeUpdated(0xE0E0, 0x30, ev.GraphNodeInfo(_N.CHILD_GRAPH, child=child(k3))),
        launch,
        ev.GraphNodeEnabled(0xE0E0, 0x31, False),
        launch,
        ev.GraphNodeEnabled(0xE0E0, 0x31, True),
        launch,
        ev.GraphNodeEnabled(0xE0E0, 0x99, False),  # no such node: later launches are refused
        launch,
    ]
    path, t = record(tmp_path, events, graph_memory())
    assert not t.report.errors
    with replayfmt.open(path) as cap:
        objects = {o.id: o for o in cap.objects() if isinstance(o, m.Graph)}
        ops = list(cap.iter_operations())
        launched = [objects[op.graph] for op in ops if op.kind == m.OperationKind.GRAPH_LAUNCH]
        assert len(launched) == 4
        children = [objects[g.nodes[0].graph] for g in launched]
        a = [np.frombuffer(c.nodes[0].parameters[:4], np.float32)[0] for c in children]
        assert a == [2.0, 3.0, 3.0, 3.0]
        assert [g.nodes[1].kind for g in launched] == [_N.MEMSET, _N.MEMSET, _N.EMPTY, _N.MEMSET]
        assert launched[3] is not launched[2] and launched[3].id == launched[1].id  # written once per version
        (refused,) = [op for op in ops if op.kind == m.OperationKind.UNSUPPORTED]
        assert refused.reason == "cuGraphNodeSetEnabled named node 0x99, no node of the executable graph"


def test_a_node_of_a_child_graph_is_updated_and_an_unreadable_body_says_why(tmp_path, cubin):
    k2 = ev.GraphKernel(kernel(), (1, 1, 1), (64, 1, 1), 0, saxpy_params(2.0, A, B, 64))
    k5 = ev.GraphKernel(kernel(), (1, 1, 1), (64, 1, 1), 0, saxpy_params(5.0, A, B, 64))
    child = ev.GraphDescription([ev.GraphNodeInfo(_N.KERNEL, handle=0x21, kernel=k2)], [])
    nested = ev.GraphDescription([ev.GraphNodeInfo(_N.CHILD_GRAPH, handle=0x30, child=child)], [])
    loop = ev.GraphDescription([ev.GraphNodeInfo(_N.EMPTY, handle=0x40, unsupported="a conditional node")], [])
    events = [
        *setup_events(cubin),
        ev.GraphInstantiated(1, nested),
        ev.GraphKernelUpdated(1, 0x21, k5),  # a node inside the child graph
        ev.GraphLaunched(1, 0x5000),
        ev.GraphInstantiated(2, loop),
        ev.GraphNodeUpdated(2, 0x77, ev.GraphNodeInfo(_N.MEMCPY, src=A, dst=B, size=4)),  # in the loop's body
        ev.GraphLaunched(2, 0x5000),
    ]
    path, _t = record(tmp_path, events, graph_memory())
    with replayfmt.open(path) as cap:
        graphs = {o.id: o for o in cap.objects() if isinstance(o, m.Graph)}
        ops = list(cap.iter_operations())
        (launch,) = [op for op in ops if op.kind == m.OperationKind.GRAPH_LAUNCH]
        inner = graphs[graphs[launch.graph].nodes[0].graph]
        assert np.frombuffer(inner.nodes[0].parameters[:4], np.float32)[0] == 5.0
        (refused,) = [op for op in ops if op.kind == m.OperationKind.UNSUPPORTED]
        assert refused.reason == "a conditional node"


def test_a_clustered_kernel_node_is_written_with_its_cluster_and_keeps_it_through_an_update(tmp_path, cubin):
    """cuDNN's sm_90 kernels in XLA's graphs run in clusters, a node attribute that
    cuGraphExecKernelNodeSetParams does not carry: the node keeps it (replayed without it, the
    kernel hit an illegal instruction on the H100)."""
    clustered = description()
    clustered.nodes[1].kernel.cluster, clustered.nodes[1].kernel.grid = (2, 1, 1), (2, 1, 1)
    k3 = ev.GraphKernel(kernel(), (2, 1, 1), (64, 1, 1), 0, saxpy_params(3.0, A, B, 64))  # no cluster: params only
    launch = ev.GraphLaunched(0xE0E0, 0x5000)
    events = [*setup_events(cubin), ev.GraphInstantiated(0xE0E0, clustered), launch]
    events += [ev.GraphKernelUpdated(0xE0E0, 0x11, k3), launch]
    path, _ = record(tmp_path, events, graph_memory())
    with replayfmt.open(path) as cap:
        graphs = [o for o in cap.objects() if isinstance(o, m.Graph)]
        assert [(g.nodes[1].cluster, g.nodes[1].grid) for g in graphs] == [((2, 1, 1), (2, 1, 1))] * 2
        build_plan(cap, PlanOptions())  # replayed: no refusal of clustered kernel nodes


def test_a_graph_node_whose_word_may_be_data_is_resolved_after_the_nodes_that_reach_its_allocation(tmp_path, cubin):
    """A kernel node's struct word that may be data (an unaligned float beside a stale half, or a
    view's address that reads as one) is a pointer where the capture reaches its allocation,
    whichever node comes first: a later node's pointer into the same allocation settles it."""
    mem = FakeMemory()
    segment, size = 0x7F27_3F80_0000, 4 << 20
    mem.device[segment] = bytearray(size)
    below = segment + 0xE38E4  # (1.1111, 0x7f27)
    layout = ((0, 16),)  # one 16-byte struct
    first = ev.GraphKernel(ev.Kernel(5, "gemm", MODULE, layout), (1, 1, 1), (1, 1, 1), 0, struct.pack("<2Q", below, 0))
    second = ev.GraphKernel(
        ev.Kernel(6, "gemm", MODULE, layout), (1, 1, 1), (1, 1, 1), 0, struct.pack("<2Q", segment + 0x1000, 0)
    )
    description = ev.GraphDescription(
        [
            ev.GraphNodeInfo(_N.KERNEL, handle=0x11, kernel=first),
            ev.GraphNodeInfo(_N.KERNEL, handle=0x12, kernel=second),
        ],
        [(0, 1)],
    )
    events = [
        ev.ModuleImage(MODULE, cubin, None, "cuModuleLoadData"),
        ev.StreamCreated(0x5000, 1),
        ev.Allocation(segment, size),
        ev.GraphInstantiated(0xE0E0, description),
        ev.GraphLaunched(0xE0E0, 0x5000),
    ]
    path, t = record(tmp_path, events, mem)
    assert not t.report.errors
    with replayfmt.open(path) as cap:
        (graph,) = [o for o in cap.objects() if isinstance(o, m.Graph)]
        (buffer,) = [o.id for o in cap.objects() if isinstance(o, m.Buffer)]
        found = [[(r.site_offset, r.target_buffer, r.target_offset) for r in n.relocations] for n in graph.nodes]
    assert found == [[(0, buffer, below - segment)], [(0, buffer, 0x1000)]]


def test_a_programmatic_edge_is_recorded_and_a_disabled_end_of_it_orders_fully(tmp_path, cubin):
    """XLA chains its command buffers' kernels with programmatic edges: the recorder keeps how each
    edge orders its nodes. A disabled kernel is written as an empty node, which has no ports: its
    edges are written as full dependencies (the plan refuses a programmatic edge to an empty node)."""
    k = ev.GraphKernel(kernel(), (1, 1, 1), (64, 1, 1), 0, saxpy_params(2.0, A, B, 64))
    chained = ev.GraphDescription(
        [ev.GraphNodeInfo(_N.KERNEL, handle=0x41, kernel=k), ev.GraphNodeInfo(_N.KERNEL, handle=0x42, kernel=k)],
        [(0, 1)],
        [m.GraphEdgeData(m.GraphEdgePort.PROGRAMMATIC, 0, m.GraphEdgeType.PROGRAMMATIC)],
    )
    launch = ev.GraphLaunched(0xE0E0, 0x5000)
    events = [
        *setup_events(cubin),
        ev.GraphInstantiated(0xE0E0, chained),
        launch,
        ev.GraphNodeEnabled(0xE0E0, 0x42, False),
        launch,
    ]
    path, t = record(tmp_path, events, graph_memory())
    assert not t.report.errors
    with replayfmt.open(path) as cap:
        objects = {o.id: o for o in cap.objects() if isinstance(o, m.Graph)}
        launched = [objects[op.graph] for op in cap.iter_operations() if op.kind == m.OperationKind.GRAPH_LAUNCH]
        assert [g.programmatic_edges for g in launched] == [1, 0]
        assert launched[1].nodes[1].kind == _N.EMPTY and launched[1].edge_data == ()
        assert not build_plan(cap).problems
