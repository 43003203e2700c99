"""CUDA graphs in the recorder, without a GPU: the source walks a graph through a stand-in driver
(structs in this process's memory, as the driver hands them out), and the translator, fed
synthetic graph events, filters stream capture, writes Graph objects and graph launches with
their snapshots, and writes a new graph version after an update."""

from __future__ import annotations

import struct
import threading
from types import SimpleNamespace

import numpy as np
from test_capture_source import SAXPY, SAXPY_ARGS, Keep, callback_data
from test_capture_translate import MODULE, A, B, C, FakeMemory, kernel, record, saxpy_params

import replayfmt
from replayfmt.capture import events as ev
from replayfmt.capture.cupti_api import DOMAIN_DRIVER_API
from replayfmt.capture.cupti_source import CuptiSource
from replayfmt.format import model as m
from replayfmt.replay.plan import PlanOptions, build_plan

SUCCESS = 0
IDS = {"cuGraphInstantiateWithFlags": 600, "cuGraphLaunch": 601, "cuStreamBeginCapture_v2": 602,
       "cuStreamEndCapture": 603, "cuGraphExecKernelNodeSetParams_v2": 604,
       "cuGraphExecMemsetNodeSetParams": 605}  # fmt: skip
PTX = b".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry saxpy()\n{\nret;\n}\n"
_N = m.GraphNodeKind


class Struct:
    """A bindings struct as the walker uses it: getPtr() gives the C bytes' address."""

    def __init__(self, keep: Keep, raw: bytes) -> None:
        self.address = keep.put(raw)

    def getPtr(self) -> int:
        return self.address


class GraphDriver:
    """A stand-in driver holding one graph (and one child graph) of every node kind it walks."""

    CUresult = SimpleNamespace(CUDA_SUCCESS=SUCCESS)

    def __init__(self, keep: Keep) -> None:
        self.keep = keep
        pointers = keep.put(struct.pack("<4Q", *[keep.put(a) for a in SAXPY_ARGS]))
        kernel = struct.pack("<Q7I4xQQQQ", 0xF00, 4, 1, 1, 256, 1, 1, 0, pointers, 0, 0, 0)
        memcpy = bytearray(200)
        struct.pack_into("<I", memcpy, 32, 2)
        struct.pack_into("<Q", memcpy, 48, 0x7F00_0010_0000)
        struct.pack_into("<I", memcpy, 120, 2)
        struct.pack_into("<Q", memcpy, 136, 0x7F00_0020_0000 + 64)
        struct.pack_into("<QQQ", memcpy, 176, 128, 1, 1)
        # node handle -> (CUgraphNodeType, parameters)
        self.nodes = {
            0x10: (2, struct.pack("<QQIIQQ", 0x7F00_0020_0000, 0, 7, 4, 16, 1)),  # memset
            0x11: (0, kernel),
            0x12: (1, bytes(memcpy)),
            0x13: (7, 0xE1),  # event record
            0x14: (4, 0xC0),  # child graph
            0x20: (5, None),  # the child's empty node
        }
        self.graphs = {0xA0: [0x10, 0x11, 0x12, 0x13, 0x14], 0xC0: [0x20]}
        self.edges = {0xA0: [(0x10, 0x12), (0x11, 0x12), (0x12, 0x14), (0x14, 0x13)], 0xC0: []}

    def cuGraphGetNodes(self, graph, count):
        nodes = self.graphs[graph]
        return SUCCESS, nodes[:count] if count else [], len(nodes)

    def cuGraphGetEdges(self, graph, count):
        edges = self.edges[graph]
        if not count:
            return SUCCESS, [], [], [], len(edges)
        return SUCCESS, [s for s, _ in edges], [d for _, d in edges], [None] * len(edges), len(edges)

    def cuGraphNodeGetType(self, node):
        return SUCCESS, self.nodes[node][0]

    def _params(self, node):
        return SUCCESS, Struct(self.keep, self.nodes[node][1])

    cuGraphKernelNodeGetParams = cuGraphMemsetNodeGetParams = cuGraphMemcpyNodeGetParams = _params

    def cuGraphEventRecordNodeGetEvent(self, node):
        return SUCCESS, self.nodes[node][1]

    def cuGraphChildGraphNodeGetGraph(self, node):
        return SUCCESS, self.nodes[node][1]

    def cuFuncGetModule(self, handle):
        return SUCCESS, 0xABC

    def cuFuncGetParamInfo(self, handle, index):
        return (SUCCESS, *SAXPY[index]) if index < len(SAXPY) else (1, 0, 0)

    def cuFuncGetName(self, handle):
        return SUCCESS, b"saxpy"

    def cuLibraryGetModule(self, library):
        return 1, 0


def graph_source() -> tuple[CuptiSource, list[ev.Event], Keep]:
    keep = Keep()
    seen: list[ev.Event] = []
    source = CuptiSource(None, seen.append, threading.local(), cu=GraphDriver(keep))
    source.route({**IDS, "cuModuleLoadData": 47})
    load = keep.put(struct.pack("<QQ", keep.put(struct.pack("<Q", 0xABC)), keep.put(PTX)))
    source._callback(None, DOMAIN_DRIVER_API, 47, callback_data(keep, 1, load))
    seen.clear()
    return source, seen, keep


def call(source: CuptiSource, keep: Keep, name: str, params: bytes, site: int, result: int = SUCCESS) -> None:
    source._callback(None, DOMAIN_DRIVER_API, IDS[name], callback_data(keep, site, keep.put(params), result))


def test_instantiate_walks_every_node_kind_and_the_edges():
    source, seen, keep = graph_source()
    out = keep.put(struct.pack("<Q", 0xE0E0))
    call(source, keep, "cuGraphInstantiateWithFlags", struct.pack("<QQQ", out, 0xA0, 0), 0)
    assert seen == []  # read once the call succeeded
    call(source, keep, "cuGraphInstantiateWithFlags", struct.pack("<QQQ", out, 0xA0, 0), 1)
    (instantiated,) = seen
    assert isinstance(instantiated, ev.GraphInstantiated) and instantiated.executable == 0xE0E0
    graph = instantiated.graph
    assert [n.kind for n in graph.nodes] == [_N.MEMSET, _N.KERNEL, _N.MEMCPY, _N.EVENT_RECORD, _N.CHILD_GRAPH]
    assert graph.edges == [(0, 2), (1, 2), (2, 4), (4, 3)]
    memset, kernel_node, memcpy, record_node, child = graph.nodes
    assert (memset.dst, memset.value, memset.element_size, memset.width, memset.height) == (0x7F00_0020_0000, 7, 4,
                                                                                            16, 1)  # fmt: skip
    assert kernel_node.kernel.kernel.name == "saxpy" and kernel_node.kernel.kernel.module == ("module", 0xABC)
    assert kernel_node.kernel.parameters == SAXPY_ARGS[0] + bytes(4) + b"".join(SAXPY_ARGS[1:])
    assert (kernel_node.kernel.grid, kernel_node.kernel.block) == ((4, 1, 1), (256, 1, 1))
    assert (memcpy.src, memcpy.dst, memcpy.size, memcpy.unsupported) == (0x7F00_0010_0000, 0x7F00_0020_0040, 128, "")
    assert record_node.event == 0xE1 and [n.kind for n in child.child.nodes] == [_N.EMPTY]


def test_a_graph_the_driver_cannot_describe_is_refused_at_its_launch():
    source, seen, keep = graph_source()
    source.cu.cuGraphNodeGetType = lambda node: (700, None)  # CUDA_ERROR_..., as the driver answers
    out = keep.put(struct.pack("<Q", 0xE0E0))
    call(source, keep, "cuGraphInstantiateWithFlags", struct.pack("<QQQ", out, 0xA0, 0), 1)
    ((node,),) = [e.graph.nodes for e in seen]
    assert node.unsupported == (
        "cuGraphInstantiateWithFlags: the recorder could not read the graph (RuntimeError: cuGraphNodeGetType: 700)"
    )


def test_launches_captures_updates_and_refusals_become_events():
    source, seen, keep = graph_source()
    call(source, keep, "cuStreamBeginCapture_v2", struct.pack("<QI", 0x5000, 0), 1)
    call(source, keep, "cuStreamEndCapture", struct.pack("<QQ", 0x5000, keep.put(bytes(8))), 1)
    call(source, keep, "cuGraphLaunch", struct.pack("<QQ", 0xE0E0, 0x5000), 0)
    pointers = keep.put(struct.pack("<4Q", *[keep.put(a) for a in SAXPY_ARGS]))
    params = keep.put(struct.pack("<Q7I4xQQQQ", 0xF00, 8, 1, 1, 128, 1, 1, 0, pointers, 0, 0, 0))
    update = struct.pack("<QQQ", 0xE0E0, 0x11, params)
    call(source, keep, "cuGraphExecKernelNodeSetParams_v2", update, 0)
    call(source, keep, "cuGraphExecKernelNodeSetParams_v2", update, 1)
    call(source, keep, "cuGraphExecKernelNodeSetParams_v2", update, 0)
    call(source, keep, "cuGraphExecKernelNodeSetParams_v2", update, 1, result=1)  # failed: no event
    call(source, keep, "cuGraphExecMemsetNodeSetParams", struct.pack("<QQQ", 0xE0E0, 0x10, 0), 0)
    began, ended, launched, updated, refused = seen
    assert began == ev.StreamCaptureBegan(0x5000) and ended == ev.StreamCaptureEnded(0x5000)
    assert launched == ev.GraphLaunched(0xE0E0, 0x5000)
    assert isinstance(updated, ev.GraphKernelUpdated) and (updated.executable, updated.node) == (0xE0E0, 0x11)
    assert updated.kernel.grid == (8, 1, 1) and updated.kernel.block == (128, 1, 1)
    assert isinstance(refused, ev.NotReproducible) and refused.call == "cuGraphExecMemsetNodeSetParams"


# -- the translator ------------------------------------------------------------------------------


def description(a: float = 2.0, memset_value: int = 0) -> ev.GraphDescription:
    """memset C; saxpy y = a*x + y on (A, B); copy B -> C; event record. Edges 0->2, 1->2, 2->3."""
    k = ev.GraphKernel(kernel(), (1, 1, 1), (64, 1, 1), 0, saxpy_params(a, A, B, 64))
    return ev.GraphDescription(
        [
            ev.GraphNodeInfo(_N.MEMSET, handle=0x10, dst=C, value=memset_value, element_size=4, width=64),
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


def setup_events(stream: int = 0x5000) -> list:
    return [ev.ModuleImage(MODULE, PTX, None, "cuModuleLoadData"), ev.StreamCreated(stream, 1),
            ev.Allocation(A, 256), ev.Allocation(B, 256), ev.Allocation(C, 256)]  # fmt: skip


def test_graph_launches_write_the_graph_once_snapshot_and_checkpoint(tmp_path):
    mem = graph_memory()

    def run_graph():  # the device runs the graph after its launch
        mem.device[B][:] = (2 * np.arange(64) + 1).astype(np.float32).tobytes()
        mem.device[C][:] = mem.device[B]
        return ev.StreamSynchronized(0x5000)

    events = [*setup_events(), ev.GraphInstantiated(0xE0E0, description()),
              ev.GraphLaunched(0xE0E0, 0x5000), run_graph, ev.GraphLaunched(0xE0E0, 0x5000)]  # fmt: skip
    path, t = record(tmp_path, events, mem)
    assert not t.report.errors and t.report.kernels["saxpy"].captured == 2
    with replayfmt.open(path) as cap:
        ops = list(cap.iter_operations())
        (graph,) = [o for o in cap.objects() if isinstance(o, m.Graph)]
        buffers = {o.address: o.id for o in cap.objects() if isinstance(o, m.Buffer)}
        assert [n.kind for n in graph.nodes] == [_N.MEMSET, _N.KERNEL, _N.MEMCPY, _N.EVENT_RECORD]
        assert graph.edges == ((0, 2), (1, 2), (2, 3))
        memset, kernel_node, memcpy, record_node = graph.nodes
        assert (memset.dst_buffer, memset.width, memset.element_size) == (buffers[C], 64, 4)
        assert {(r.site_offset, r.target_buffer) for r in kernel_node.relocations} == {(8, buffers[A]),
                                                                                        (16, buffers[B])}  # fmt: skip
        assert (memcpy.src_buffer, memcpy.dst_buffer, memcpy.size) == (buffers[B], buffers[C], 256)
        assert isinstance(cap.object(record_node.event), m.Event)
        launches = [op for op in ops if op.kind == m.OperationKind.GRAPH_LAUNCH]
        assert [(op.graph, cap.object(op.stream).captured_handle) for op in launches] == [(graph.id, 0x5000)] * 2
        first = ops.index(launches[0])
        snapshots = [op.dst_buffer for op in ops[:first] if op.kind == m.OperationKind.COPY_HOST_TO_DEVICE]
        assert sorted(snapshots) == sorted(buffers.values())  # every buffer the graph touches, before it
        (checkpoint,) = [op for op in ops if op.kind == m.OperationKind.CHECKPOINT]
        assert sorted(e.buffer for e in checkpoint.entries) == sorted([buffers[B], buffers[C]])  # A did not change
        plan = build_plan(cap, PlanOptions())
        assert set(plan.graphs) == {graph.id} and plan.launches_of[(kernel_node.executable, 0)] == 1


def test_an_updated_kernel_node_writes_a_new_graph_version(tmp_path):
    k3 = ev.GraphKernel(kernel(), (1, 1, 1), (64, 1, 1), 0, saxpy_params(3.0, A, B, 64))
    events = [*setup_events(), ev.GraphInstantiated(0xE0E0, description()), ev.GraphLaunched(0xE0E0, 0x5000),
              ev.GraphKernelUpdated(0xE0E0, 0x11, k3), ev.GraphLaunched(0xE0E0, 0x5000),
              ev.GraphKernelUpdated(0xE0E0, 0x10, k3), ev.GraphLaunched(0xE0E0, 0x5000)]  # fmt: skip
    path, _ = record(tmp_path, events, graph_memory())
    with replayfmt.open(path) as cap:
        graphs = [o for o in cap.objects() if isinstance(o, m.Graph)]
        ops = list(cap.iter_operations())
        assert len(graphs) == 2
        a = [np.frombuffer(g.nodes[1].parameters[:4], np.float32)[0] for g in graphs]
        assert a == [2.0, 3.0]
        assert [op.graph for op in ops if op.kind == m.OperationKind.GRAPH_LAUNCH] == [g.id for g in graphs]
        (refused,) = [op for op in ops if op.kind == m.OperationKind.UNSUPPORTED]
        assert "which is no kernel node" in refused.reason


def test_stream_capture_is_not_recorded_nor_snapshotted(tmp_path):
    mem = graph_memory()
    launch = ev.LaunchBegin(kernel(), (1, 1, 1), (64, 1, 1), 0, 0x5000, saxpy_params(2.0, A, B, 64))
    joined = ev.LaunchBegin(kernel(), (1, 1, 1), (64, 1, 1), 0, 0x6000, saxpy_params(2.0, A, C, 64))
    events = [*setup_events(), ev.StreamCreated(0x6000), ev.StreamCaptureBegan(0x5000), launch,
              ev.EventRecorded(0xF1, 0x5000), ev.StreamWaited(0x6000, 0xF1), joined,
              ev.Memset(C, 0, 4, 64, 0x6000), ev.EventRecorded(0xF2, 0x6000), ev.StreamWaited(0x5000, 0xF2),
              ev.StreamCaptureEnded(0x5000), joined]  # fmt: skip
    path, t = record(tmp_path, events, mem)
    assert not t.report.errors
    with replayfmt.open(path) as cap:
        kinds = [op.kind.label for op in cap.iter_operations()]
    assert kinds.count("launch") == 1 and "memset" not in kinds and "event_record" not in kinds
    assert [r[0] for r in mem.reads] == [A, C, A, C]  # only the launch after the capture: snapshot, checkpoint


def test_unreplayable_graphs_become_unsupported_operations(tmp_path):
    host_copy = ev.GraphDescription([ev.GraphNodeInfo(_N.MEMCPY, unsupported="a host copy")], [])
    outside = ev.GraphDescription([ev.GraphNodeInfo(_N.MEMSET, dst=0x1234, element_size=1, width=4)], [])
    events = [*setup_events(), ev.GraphInstantiated(1, host_copy), ev.GraphInstantiated(2, outside),
              ev.GraphLaunched(1, 0x5000), ev.GraphLaunched(2, 0x5000), ev.GraphLaunched(3, 0x5000)]  # fmt: skip
    path, t = record(tmp_path, events, graph_memory())
    with replayfmt.open(path) as cap:
        reasons = [op.reason for op in cap.iter_operations() if op.kind == m.OperationKind.UNSUPPORTED]
    assert reasons[0] == "a host copy"
    assert reasons[1] == "a graph node uses address 0x1234, in no recorded allocation"
    assert reasons[2].startswith("the executable graph 0x3 was instantiated before recording started")
    assert t.report.unsupported == {"cuGraphLaunch": 3}
