"""CUDA graphs in the plan and at replay, without a GPU: the plan's checks (references, ranges,
node kinds, acyclic edges, child order) and the graph builder's driver calls, made against a
stand-in driver (topological order, dependencies, relocated node parameters, one instantiation)."""

from __future__ import annotations

import ctypes
import struct
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

import replayfmt
from replayfmt.errors import AbiMismatchError, ReplayFormatError, UnsupportedOperationError
from replayfmt.format import model as m
from replayfmt.format.model import GraphNode, GraphNodeKind
from replayfmt.replay import graphs as replay_graphs
from replayfmt.replay.graph_plan import buffers_used_by_graph, topological_order
from replayfmt.replay.plan import PlanOptions, build_plan

_N = GraphNodeKind
SAXPY = m.Function(
    name="saxpy",
    parameters_known=True,
    parameters=(
        m.Parameter(offset=0, size=4),
        m.Parameter(offset=8, size=8, kind=m.ParameterKind.POINTER),
        m.Parameter(offset=16, size=8, kind=m.ParameterKind.POINTER),
        m.Parameter(offset=24, size=4),
    ),
)
MEMSET_NODE = GraphNode(kind=GraphNodeKind.MEMSET, element_size=4, width=4, height=1)  # edges are checked before nodes
PROGRAMMATIC = m.GraphEdgeData(m.GraphEdgePort.PROGRAMMATIC, 0, m.GraphEdgeType.PROGRAMMATIC)
PTX = b".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry saxpy()\n{\nret;\n}\n"


def write(path, make_graphs) -> dict[str, int]:
    """A capture of two buffers, saxpy, an event and the graphs ``make_graphs(ids)`` returns,
    each launched once."""
    with replayfmt.CaptureWriter(path) as w:
        ids = {"device": w.add_object(m.Device())}
        ids["x"] = w.add_object(m.Buffer(size=1024, device=ids["device"]))
        ids["y"] = w.add_object(m.Buffer(size=1024, device=ids["device"]))
        ids["event"] = w.add_object(m.Event(device=ids["device"]))
        ids["exe"] = w.add_object(
            m.Executable(format=m.ExecutableFormat.PTX, payload=w.add_payload(PTX), functions=(SAXPY,))
        )
        params = struct.pack("<f4xQQi4x", 2.0, 0, 0, 256)
        ids["params"] = params
        for graph in make_graphs(ids):
            w.graph_launch(w.add_object(graph) if graph.id == 0 else graph.id)
    return ids


def kernel_node(ids, **changes) -> GraphNode:
    relocations = (m.Relocation(0, ids["x"], 8, 0), m.Relocation(0, ids["y"], 16, 64))
    fields = {
        "kind": _N.KERNEL,
        "executable": ids["exe"],
        "grid": (1, 1, 1),
        "block": (256, 1, 1),
        "parameters": ids["params"],
        "relocations": relocations,
    }
    return GraphNode(**{**fields, **changes})


def good_graph(ids) -> m.Graph:
    return m.Graph(
        device=ids["device"],
        nodes=(
            GraphNode(kind=_N.MEMSET, dst_buffer=ids["y"], value=0, element_size=4, width=16, height=2, pitch=512),
            kernel_node(ids),
            GraphNode(kind=_N.MEMCPY, src_buffer=ids["y"], dst_buffer=ids["x"], size=1024),
            GraphNode(kind=_N.EVENT_RECORD, event=ids["event"]),
            GraphNode(kind=_N.HOST),
        ),
        edges=((0, 1), (1, 2), (2, 3), (0, 4)),
    )


def plan_of(tmp_path, make_graphs):
    path = tmp_path / "g.kreplay"
    ids = write(path, make_graphs)
    cap = replayfmt.open(path)
    return build_plan(cap, PlanOptions()), ids, cap


def test_a_good_graph_is_planned_with_its_kernels_counted(tmp_path):
    plan, ids, cap = plan_of(tmp_path, lambda ids: [good_graph(ids)])
    with cap:
        (graph,) = plan.graphs.values()
        assert plan.launches_of == {(ids["exe"], 0): 1} and plan.operation_counts["graph_launch"] == 1
        assert buffers_used_by_graph(plan.graphs, graph.id) == {ids["x"], ids["y"]}
        order = topological_order(graph)
        assert all(order.index(s) < order.index(d) for s, d in graph.edges)


@pytest.mark.parametrize(
    ("broken", "error", "message"),
    [
        (
            lambda ids: m.Graph(nodes=(GraphNode(), GraphNode()), edges=((0, 1), (1, 0))),
            ReplayFormatError,
            "{op} graph {g}: its edges form a cycle (through node 0)",
        ),
        (
            lambda ids: m.Graph(nodes=(GraphNode(),), edges=((0, 3),)),
            ReplayFormatError,
            "{op} graph {g}: edge 0 -> 3 is not between two of its 1 nodes",
        ),
        (
            lambda ids: m.Graph(nodes=(GraphNode(kind=9),)),
            UnsupportedOperationError,  # type: ignore[arg-type]
            "{op} graph {g} node 0 (kind 9): node kind 9 is unknown to this replayfmt: upgrade replayfmt",
        ),
        (
            lambda ids: m.Graph(
                nodes=(GraphNode(kind=_N.MEMSET, dst_buffer=ids["y"], element_size=4, width=200, height=2, pitch=800),)
            ),
            ReplayFormatError,
            "{op} graph {g} node 0 (memset): memset range [0, 1600) lies outside buffer {y} (1024 bytes)",
        ),
        (
            lambda ids: m.Graph(nodes=(GraphNode(kind=_N.EVENT_WAIT, event=ids["x"]),)),
            ReplayFormatError,
            "{op} graph {g} node 0 (event_wait): its event object {x} is a buffer, not a event",
        ),
        (
            lambda ids: m.Graph(nodes=(kernel_node(ids, parameters=b"\0" * 16),)),
            AbiMismatchError,
            "{op} graph {g} node 0 (kernel): operation 6 (saxpy): 16 parameter bytes, the layout needs 28",
        ),
        (
            lambda ids: m.Graph(nodes=(kernel_node(ids, block=(4096, 1, 1)),)),
            UnsupportedOperationError,
            "{op} graph {g} node 0 (kernel): operation 6 (saxpy): block dimension 0 is 4096, outside [1, 1024]",
        ),
        (
            lambda ids: m.Graph(
                nodes=(kernel_node(ids), kernel_node(ids)), edges=((0, 1),), edge_data=(m.GraphEdgeData.of(1, 0, 7),)
            ),
            UnsupportedOperationError,
            "{op} graph {g}: edge 0 -> 1: edge type 7, port 1 is unknown to this replayfmt: upgrade replayfmt",
        ),
        (
            lambda ids: m.Graph(
                nodes=(kernel_node(ids), MEMSET_NODE),
                edges=((0, 1),),
                edge_data=(PROGRAMMATIC,),
            ),
            ReplayFormatError,
            "{op} graph {g}: edge 0 -> 1: a programmatic edge joins two kernel nodes, not kernel and memset",
        ),
        (
            lambda ids: m.Graph(
                nodes=(kernel_node(ids), kernel_node(ids)), edges=((0, 1),), edge_data=(m.GraphEdgeData.of(0, 0, 1),)
            ),
            ReplayFormatError,
            "{op} graph {g}: edge 0 -> 1: a programmatic edge leaves its source's trigger or launch-order port",
        ),
        (
            lambda ids: m.Graph(
                nodes=(MEMSET_NODE, kernel_node(ids)), edges=((0, 1),), edge_data=(m.GraphEdgeData.of(2, 0, 0),)
            ),
            ReplayFormatError,
            "{op} graph {g}: edge 0 -> 1: port launch_order of a memset node",
        ),
        (
            lambda ids: m.Graph(
                nodes=(kernel_node(ids), kernel_node(ids)), edges=((0, 1),), edge_data=(m.GraphEdgeData.of(1, 3, 1),)
            ),
            UnsupportedOperationError,
            "{op} graph {g}: edge 0 -> 1: destination port 3 is unknown to this replayfmt",
        ),
        (
            lambda ids: m.Graph(nodes=(kernel_node(ids, flags=m.LAUNCH_FLAG_PROGRAMMATIC),)),
            ReplayFormatError,
            "{op} graph {g} node 0 (kernel): kernel node flags 0x4: a kernel node carries none but cooperative",
        ),
        (
            lambda ids: m.Graph(nodes=(GraphNode(kind=_N.CHILD_GRAPH, graph=99),)),
            ReplayFormatError,
            "{op} graph {g} node 0 (child_graph): its child graph object 99 does not exist, not a graph",
        ),
    ],
)
def test_the_plan_refuses_broken_graphs(tmp_path, broken, error, message):
    with pytest.raises(error) as caught:
        plan_of(tmp_path, lambda ids: [broken(ids)])
    # objects: device 1, x 2, y 3, event 4, exe 5, graph 6
    assert str(caught.value) == message.format(op="operation 6 (graph_launch):", g=6, x=2, y=3)


def chained_graph(ids) -> m.Graph:
    """Three kernels in a chain, as XLA's command buffers chain theirs: the first edge programmatic
    (the second kernel may start before the first ends), the second a full dependency."""
    return m.Graph(
        device=ids["device"],
        nodes=(kernel_node(ids), kernel_node(ids), kernel_node(ids)),
        edges=((0, 1), (1, 2)),
        edge_data=(PROGRAMMATIC, m.FULL_DEPENDENCY),
    )


def test_how_each_edge_orders_its_nodes_is_written_and_read_back(tmp_path):
    plan, _, cap = plan_of(tmp_path, lambda ids: [chained_graph(ids), good_graph(ids)])
    with cap:
        chained, plain = sorted(plan.graphs.values(), key=lambda g: g.id)
        assert chained.edge_data == (PROGRAMMATIC, m.FULL_DEPENDENCY) and chained.programmatic_edges == 1
        assert isinstance(chained.edge_data[0].type, m.GraphEdgeType)  # read back as the enums
        assert plain.edge_data == () and plain.edge_kind(0).full  # full dependencies are not written
        assert (cap.header.major, cap.header.minor) == (1, 7)
    with replayfmt.open(Path(__file__).parent / "golden" / "sample-1.6.kreplay") as old:
        (graph,) = [o for o in old.objects() if isinstance(o, m.Graph)]
        assert old.header.minor == 6 and graph.edge_data == () and graph.edges == ((0, 1), (1, 2))
        assert all(graph.edge_kind(k).full for k in range(len(graph.edges)))  # 1.6: every edge a full dependency


def test_dump_shows_which_edges_are_programmatic(tmp_path):
    import json

    from click.testing import CliRunner

    from replayfmt_tools.dump_replay import main as dump_main

    write(tmp_path / "g.kreplay", lambda ids: [chained_graph(ids)])
    text = CliRunner().invoke(dump_main, ["--kind=graph", str(tmp_path / "g.kreplay")]).stdout
    assert "nodes=3 edges=2 (1 programmatic)" in text
    assert [line.split()[1] for line in text.splitlines() if "programmatic=" in line] == ["1"]  # node 1 follows 0 early
    out = CliRunner().invoke(dump_main, ["--format=jsonl", "--kind=graph", str(tmp_path / "g.kreplay")]).stdout
    (row,) = [r for r in map(json.loads, out.splitlines()) if r.get("kind") == "graph"]
    assert row["edge_data"] == [{"from_port": 1, "to_port": 0, "type": 1}, {"from_port": 0, "to_port": 0, "type": 0}]


def test_a_graph_whose_edge_data_does_not_match_its_edges_is_not_written(tmp_path):
    with pytest.raises(replayfmt.ReplayUsageError, match=r"1 edge data rows for 2 edges"):
        write(tmp_path / "g.kreplay", lambda ids: [replace(chained_graph(ids), edge_data=(PROGRAMMATIC,))])


def test_a_file_whose_edge_data_does_not_match_its_edges_is_refused_when_read(tmp_path, monkeypatch):
    from replayfmt import writer as writer_module
    from replayfmt.format import graph_records

    monkeypatch.setattr(graph_records, "check_graph_within_limits", lambda graph: None)  # a hostile writer
    monkeypatch.setattr(writer_module, "check_graph_within_limits", lambda graph: None)
    write(tmp_path / "g.kreplay", lambda ids: [replace(chained_graph(ids), edge_data=(PROGRAMMATIC,))])
    monkeypatch.undo()
    with replayfmt.open(tmp_path / "g.kreplay") as cap, pytest.raises(ReplayFormatError) as refused:
        list(cap.objects())
    assert "graph 6: 1 edge data rows for 2 edges" in str(refused.value)


def test_a_child_graph_must_come_before_its_parent(tmp_path):
    def graphs(ids):
        child = m.Graph(nodes=(GraphNode(),), id=8)
        parent = m.Graph(nodes=(GraphNode(kind=_N.CHILD_GRAPH, graph=7),))
        return [parent, child]  # parent is 6, so it names a later object

    with pytest.raises(
        ReplayFormatError,
        match="operation 6 \\(graph_launch\\): graph 6 node 0 \\(child_graph\\): its child graph object 7",
    ):
        plan_of(tmp_path, graphs)


# -- the builder ---------------------------------------------------------------------------------


class FakeCu:
    """Records graph calls; struct arguments are read back as the bytes handed over."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.count = 0

    def _new(self, name: str, *args) -> tuple[int, str]:
        self.count += 1
        self.calls.append((name, *args))
        return 0, f"{name}#{self.count}"

    def __getattr__(self, name: str):
        if name.startswith("CUDA_"):
            size = {"CUDA_KERNEL_NODE_PARAMS": 72, "CUDA_MEMSET_NODE_PARAMS": 40, "CUDA_MEMCPY3D": 200}[name]
            return lambda address: ctypes.string_at(address, size)
        if name == "CUgraphEdgeData":
            return SimpleNamespace
        if name.startswith("cuGraph"):
            return lambda *args: self._new(name, *args)
        if name.startswith("cu"):  # eager calls: named, never called here
            return name
        raise AttributeError(name)


def builder_of(plan, ids, monkeypatch, arch: int = 90) -> tuple[replay_graphs.GraphBuilder, FakeCu, list]:
    """A graph builder over a stand-in driver; ``check`` gives back what each call made."""
    monkeypatch.setattr(replay_graphs, "check", lambda result, what: result[1])
    cu = FakeCu()
    owned: list = []
    devices = SimpleNamespace(
        cu=cu, own=owned.append, index=lambda device: 0, gpus=[SimpleNamespace(ctx="ctx", arch=arch)]
    )
    layouts = {(ids["exe"], 0): [(0, 4), (8, 8), (16, 8), (24, 4)]}
    modules = SimpleNamespace(on_device=[{(ids["exe"], 0): 0xF00}], layouts=layouts)
    addresses = {ids["x"]: 0x1000_0000, ids["y"]: 0x2000_0000}
    return replay_graphs.GraphBuilder(devices, plan, modules, addresses, {ids["event"]: "event"}), cu, owned


def test_the_builder_adds_nodes_in_order_with_relocated_parameters_and_instantiates_once(tmp_path, monkeypatch):
    plan, ids, cap = plan_of(tmp_path, lambda ids: [good_graph(ids)])
    builder, cu, owned = builder_of(plan, ids, monkeypatch)
    with cap:
        (op,) = [o for o in cap.iter_operations() if o.kind == m.OperationKind.GRAPH_LAUNCH]
        prepared = builder.prepared(op, 0)
        assert builder.prepared(op, 0) is prepared  # built and instantiated once
    names = [c[0] for c in cu.calls]
    assert names[0] == "cuGraphCreate" and names[-1] == "cuGraphInstantiate" and names.count("cuGraphInstantiate") == 1
    added = {c[0]: c for c in cu.calls[1:-1]}
    memset, kernel, memcpy = added["cuGraphAddMemsetNode"], added["cuGraphAddKernelNode"], added["cuGraphAddMemcpyNode"]
    assert memset[2:4] == ([], 0) and memset[5] == "ctx"
    assert struct.unpack("<QQIIQQ", memset[4]) == (0x2000_0000, 512, 0, 4, 16, 2)
    memset_node = f"cuGraphAddMemsetNode#{names.index('cuGraphAddMemsetNode') + 1}"
    assert kernel[2:4] == ([memset_node], 1)
    func, gx, gy, gz, bx, by, bz, smem, params, extra, kern, _ctx = struct.unpack("<Q7I4xQQQQ", kernel[4])
    assert (func, (gx, gy, gz), (bx, by, bz), smem, extra, kern) == (0xF00, (1, 1, 1), (256, 1, 1), 0, 0, 0)
    pointers = struct.unpack("<4Q", ctypes.string_at(params, 32))
    assert struct.unpack("<Q", ctypes.string_at(pointers[1], 8))[0] == 0x1000_0000
    assert struct.unpack("<Q", ctypes.string_at(pointers[2], 8))[0] == 0x2000_0000 + 64
    raw = memcpy[4]
    assert struct.unpack_from("<Q", raw, 48)[0] == 0x2000_0000 and struct.unpack_from("<Q", raw, 136)[0] == 0x1000_0000
    assert struct.unpack_from("<QQQ", raw, 176) == (1024, 1, 1)
    assert added["cuGraphAddEventRecordNode"][4] == "event" and added["cuGraphAddEmptyNode"][3] == 1  # the host node
    assert prepared.name == "graph of 1 kernels" and len(owned) == 2  # the graph and its executable
    # node by node (per-kernel timing): a topological order, each call on the given stream
    calls = [(c.label, c.fn, c.on("stream")) for c in prepared.calls]
    assert [c[0] for c in calls] == ["memset", "saxpy", "memcpy", "event_record"]
    assert [c.node for c in prepared.calls] == ["0", "1", "2", "3"]  # the graph's own node numbers
    assert calls[0][1:] == ("cuMemsetD2D32Async", (0x2000_0000, 512, 0, 16, 2, "stream"))
    assert calls[1][1] == "cuLaunchKernel" and calls[1][2][:9] == (0xF00, 1, 1, 1, 256, 1, 1, 0, "stream")
    assert calls[2][1:] == ("cuMemcpyDtoDAsync", (0x1000_0000, 0x2000_0000, 1024, "stream"))
    assert calls[3][1:] == ("cuEventRecord", ("event", "stream"))


def test_a_programmatic_edge_is_added_with_its_edge_data_once_both_nodes_exist(tmp_path, monkeypatch):
    plan, ids, cap = plan_of(tmp_path, lambda ids: [chained_graph(ids)])
    builder, cu, _ = builder_of(plan, ids, monkeypatch)
    with cap:
        (op,) = [o for o in cap.iter_operations() if o.kind == m.OperationKind.GRAPH_LAUNCH]
        builder.prepared(op, 0)
    kernels = [c for c in cu.calls if c[0] == "cuGraphAddKernelNode"]
    first, second, _ = (f"cuGraphAddKernelNode#{cu.calls.index(c) + 1}" for c in kernels)
    assert [k[2:4] for k in kernels] == [([], 0), ([], 0), ([second], 1)]  # only the full dependency at creation
    (added,) = [c for c in cu.calls if c[0] == "cuGraphAddDependencies"]
    _, graph, sources, targets, data, count = added
    assert graph == "cuGraphCreate#1" and (sources, targets, count) == ([first], [second], 1)
    assert [(d.from_port, d.to_port, d.type) for d in data] == [(1, 0, 1)]


def test_before_sm_90_a_programmatic_edge_is_built_as_a_full_dependency(tmp_path, monkeypatch):
    plan, ids, cap = plan_of(tmp_path, lambda ids: [chained_graph(ids)])
    assert plan.programmatic  # run-replay's device line says what an older GPU does with it
    builder, cu, _ = builder_of(plan, ids, monkeypatch, arch=80)
    with cap:
        (op,) = [o for o in cap.iter_operations() if o.kind == m.OperationKind.GRAPH_LAUNCH]
        builder.prepared(op, 0)
    kernels = [c for c in cu.calls if c[0] == "cuGraphAddKernelNode"]
    first, second, _ = (f"cuGraphAddKernelNode#{cu.calls.index(c) + 1}" for c in kernels)
    assert [k[2:4] for k in kernels] == [([], 0), ([first], 1), ([second], 1)]
    assert not [c for c in cu.calls if c[0] == "cuGraphAddDependencies"]


def test_per_kernel_timing_runs_a_graph_node_by_node_between_events():
    from replayfmt.measure.graph_nodes import node_name, unroll_graph_launches
    from replayfmt.replay.steps import Step, StepKind

    stream = replay_graphs.STREAM
    calls = [
        replay_graphs.NodeCall("memset", "cuMemsetD32Async", (0x10, 0, 4, stream), False, "0"),
        replay_graphs.NodeCall("saxpy", "cuLaunchKernel", (0xF00, 1, 1, 1, 64, 1, 1, 0, stream, 7, 0), True, "2.0"),
    ]
    graph = replay_graphs.PreparedGraph("exec", "graph", [], calls)
    bench = SimpleNamespace(
        cu=SimpleNamespace(cuEventRecord="cuEventRecord"),
        r=SimpleNamespace(graph=lambda index: graph if index == 5 else None),
        _node_events={(5, 0): ("b0", "a0"), (5, 1): ("b1", "a1")},
    )
    steps = [
        Step(StepKind.POINTER_SITE, "cuMemcpyHtoDAsync", (1, 2, 8, "s"), 5),
        Step(StepKind.GRAPH_LAUNCH, "cuGraphLaunch", ("exec", "s"), 5),
        Step(StepKind.GRAPH_LAUNCH, "cuGraphLaunch", ("other", "s"), 6),
    ]
    out = unroll_graph_launches(steps, bench.r, bench._node_events, "cuEventRecord")
    assert [(s.kind, s.fn, s.args, s.operation) for s in out] == [
        (StepKind.POINTER_SITE, "cuMemcpyHtoDAsync", (1, 2, 8, "s"), 5),
        (StepKind.EVENT_RECORD, "cuEventRecord", ("b0", "s"), 5),
        (StepKind.MEMSET, "cuMemsetD32Async", (0x10, 0, 4, "s"), 5),
        (StepKind.EVENT_RECORD, "cuEventRecord", ("a0", "s"), 5),
        (StepKind.EVENT_RECORD, "cuEventRecord", ("b1", "s"), 5),
        (StepKind.LAUNCH, "cuLaunchKernel", (0xF00, 1, 1, 1, 64, 1, 1, 0, "s", 7, 0), 5),
        (StepKind.EVENT_RECORD, "cuEventRecord", ("a1", "s"), 5),
        (StepKind.GRAPH_LAUNCH, "cuGraphLaunch", ("other", "s"), 6),  # no node events: launched whole
    ]
    assert graph.name == "graph of 1 kernels"
    assert node_name(bench.r, (5, 1)) == "saxpy (graph node 2.0)"


def test_format_1_1_files_still_open_and_mean_what_they_meant(tmp_path):
    """A 1.1 file (the sample as 1.1 wrote it) reads as before: the operations of today's sample
    but its graph (1.2) and its collective (1.5)."""
    from samples import write_sample

    golden = Path(__file__).parent / "golden" / "sample-1.1.kreplay"
    write_sample(tmp_path / "now.kreplay", n=64)
    with replayfmt.open(golden) as old, replayfmt.open(tmp_path / "now.kreplay") as now:
        assert (old.header.major, old.header.minor) == (1, 1) and (now.header.major, now.header.minor) == (
            1,
            replayfmt.FORMAT_MINOR,
        )
        graphs = {o.id for o in now.objects() if isinstance(o, m.Graph)}
        assert not [o for o in old.objects() if isinstance(o, m.Graph)] and len(graphs) == 1
        kept = [
            op
            for op in now.iter_operations()
            if op.kind not in (m.OperationKind.GRAPH_LAUNCH, m.OperationKind.COLLECTIVE)
            and not (isinstance(op, m.CreateObject) and op.object in graphs)
        ]
        assert [op.kind for op in old.iter_operations()] == [op.kind for op in kept]
        assert build_plan(old, PlanOptions(continue_on_error=True)).state


def test_tuning_reaches_a_kernel_node_and_rebuilds_its_graph(tmp_path, monkeypatch):
    from replayfmt.measure.tune import Candidate, find_targets, graph_node_shapes, override_flags

    plan, ids, cap = plan_of(tmp_path, lambda ids: [good_graph(ids)])
    with cap:
        (op,) = [o for o in cap.iter_operations() if o.kind == m.OperationKind.GRAPH_LAUNCH]
        targets = find_targets(plan, launch=None, kernel="^saxpy$")
        assert (targets.operations, targets.nodes, targets.graph_launches) == (
            (op.index,),
            ((op.graph, 1),),
            (op.index,),
        )
        assert (targets.kernel, targets.grid, targets.block, targets.smem) == ("saxpy", (1, 1, 1), (256, 1, 1), 0)
        best = Candidate(None, (128, 1, 1), None, None)
        assert override_flags(targets, best) == ""  # no launch to give a --launch flag
        shape = "grid=1,1,1,block=128,1,1,smem=0"
        assert (
            graph_node_shapes(targets, best)
            == f"graph {op.graph} node 1: {shape} (run-replay has no flag for graph nodes yet)"
        )
        builder, cu, _ = builder_of(plan, ids, monkeypatch)
        first = builder.prepared(op, 0)
        rebuilt = builder.reshape(op.graph, 1, (2, 1, 1), (128, 1, 1), 64)
        assert list(rebuilt) == [op.index] and rebuilt[op.index] is not first
        kernels = [c for c in cu.calls if c[0] == "cuGraphAddKernelNode"]
        shapes = [struct.unpack("<Q7I4xQQQQ", k[4])[1:8] for k in kernels]
        assert shapes == [(1, 1, 1, 256, 1, 1, 0), (2, 1, 1, 128, 1, 1, 64)]
        assert [c[0] for c in cu.calls].count("cuGraphInstantiate") == 2
        with pytest.raises(replayfmt.ReplayUsageError, match=f"^graph {op.graph} has no kernel node 0 in this replay$"):
            builder.reshape(op.graph, 0, (1, 1, 1), (1, 1, 1), 0)


class _CaptureDriver:
    """The driver calls a graph launch makes inside a stream capture, recorded."""

    CUresult = SimpleNamespace(CUDA_SUCCESS=0)
    CUstreamCaptureStatus = SimpleNamespace(CU_STREAM_CAPTURE_STATUS_ACTIVE=1, CU_STREAM_CAPTURE_STATUS_INVALIDATED=2)
    CUstreamUpdateCaptureDependencies_flags = SimpleNamespace(CU_STREAM_SET_CAPTURE_DEPENDENCIES=1)

    def __init__(self, status: int) -> None:
        self.status = status
        self.calls: list[tuple] = []

    def cuStreamGetCaptureInfo(self, stream):
        return 0, self.status, 7, "region graph", ["last node", "other stream's node", "stale"], None, 2

    def cuGraphAddChildGraphNode(self, graph, dependencies, count, child):
        self.calls.append(("child", graph, dependencies, count, child))
        return 0, "child node"

    def cuStreamUpdateCaptureDependencies(self, stream, nodes, edges, count, flags):
        self.calls.append(("depend", stream, nodes, edges, count, flags))
        return (0,)


def test_a_graph_launch_inside_a_capture_becomes_a_child_node(monkeypatch):
    from replayfmt.cuda import driver as driver_module

    cu = _CaptureDriver(status=1)
    monkeypatch.setattr(driver_module, "driver", lambda: cu)
    replay_graphs.launch_into_capture(cu, "captured graph", "stream", "operation 9")
    assert cu.calls == [
        ("child", "region graph", ["last node", "other stream's node"], 2, "captured graph"),
        ("depend", "stream", ["child node"], None, 1, 1),  # the child is what the stream's next work waits for
    ]
    invalidated = _CaptureDriver(status=2)
    with pytest.raises(replayfmt.DeviceError, match=r"operation 9: the stream is not capturing"):
        replay_graphs.launch_into_capture(invalidated, "captured graph", "stream", "operation 9")
    assert invalidated.calls == []
