"""Graph objects (CUDA graphs) to and from FlatBuffers records: the Graph body of an Object.

Kept beside :mod:`replayfmt.format.records`, which calls :func:`encode_graph`, and
:mod:`replayfmt.format.object_records`, which calls :func:`decode_graph`, for the ``Graph``
member of the ObjectBody union.
"""

from __future__ import annotations

import struct
from typing import Any

import flatbuffers
import numpy as np

from replayfmt.errors import ReplayFormatError, ReplayUsageError
from replayfmt.format import model as m
from replayfmt.format.decoder import StructVector
from replayfmt.format.generated import fb
from replayfmt.format.layout import DEFAULT_LIMITS
from replayfmt.format.model import GraphNode, GraphNodeKind
from replayfmt.format.schema import load_schema


def _structs(builder: flatbuffers.Builder, struct_name: str, rows: list[tuple[Any, ...]]) -> int:
    """A vector of schema structs from rows of field values (one memcpy)."""
    layout = load_schema().structs[struct_name]
    data = np.array(rows, dtype=load_schema().numpy_dtype(struct_name)).tobytes() if rows else b""
    builder.StartVector(layout.size, len(rows), layout.alignment)
    builder.head -= len(data)
    builder.Bytes[builder.head : builder.head + len(data)] = data
    return builder.EndVector()


def _rows(vector: StructVector | None, struct_name: str) -> list[tuple[Any, ...]]:
    if vector is None:
        return []
    return vector.to_numpy(load_schema().numpy_dtype(struct_name)).tolist()


def _dims(raw: bytes | None) -> m.Dims:
    return struct.unpack("<III", raw) if raw else (0, 0, 0)  # type: ignore[return-value]


def _encode_node(b: flatbuffers.Builder, node: GraphNode) -> int:
    parameters = b.CreateByteVector(bytes(node.parameters)) if node.parameters else 0
    relocations = 0
    if node.relocations:
        relocations = _structs(b, "Relocation", [tuple(int(x) for x in r) for r in node.relocations])
    n = fb.GraphNode
    n.Start(b)
    n.AddKind(b, int(node.kind))
    n.AddExecutable(b, node.executable)
    n.AddFunction(b, node.function)
    n.AddFlags(b, node.flags)
    n.AddGrid(b, fb.KernelDims.CreateKernelDims(b, *node.grid))
    n.AddBlock(b, fb.KernelDims.CreateKernelDims(b, *node.block))
    n.AddCluster(b, fb.KernelDims.CreateKernelDims(b, *node.cluster))
    n.AddSharedMemory(b, node.shared_memory)
    if parameters:
        n.AddParameters(b, parameters)
    if relocations:
        n.AddRelocations(b, relocations)
    n.AddSrcBuffer(b, node.src_buffer)
    n.AddDstBuffer(b, node.dst_buffer)
    n.AddSrcOffset(b, node.src_offset)
    n.AddDstOffset(b, node.dst_offset)
    n.AddSize(b, node.size)
    n.AddValue(b, node.value)
    n.AddElementSize(b, node.element_size)
    n.AddWidth(b, node.width)
    n.AddHeight(b, node.height)
    n.AddPitch(b, node.pitch)
    n.AddEvent(b, node.event)
    n.AddGraph(b, node.graph)
    return n.End(b)


def check_graph_within_limits(graph: m.ObjectDef) -> None:
    """ReplayUsageError for a graph no reader with default ``Limits`` would decode: a writer
    never writes a file its own reader refuses (any other object passes)."""
    if not isinstance(graph, m.Graph):
        return
    if graph.edge_data and len(graph.edge_data) != len(graph.edges):
        raise ReplayUsageError(
            f"graph {graph.id or '(new)'}: {len(graph.edge_data)} edge data rows for {len(graph.edges)} edges"
        )
    for count, most, name in (
        (len(graph.nodes), DEFAULT_LIMITS.max_graph_nodes, "nodes"),
        (len(graph.edges), DEFAULT_LIMITS.max_graph_edges, "edges"),
    ):
        if count > most:
            raise ReplayUsageError(
                f"graph {graph.id or '(new)'}: {count} {name}, more than a reader decodes "
                f"(Limits.max_graph_{name}, {most})"
            )


def encode_graph(b: flatbuffers.Builder, graph: m.Graph) -> int:
    """The Graph table of ``graph`` (refused as :func:`check_graph_within_limits` says)."""
    check_graph_within_limits(graph)
    nodes = [_encode_node(b, node) for node in graph.nodes]
    b.StartVector(4, len(nodes), 4)
    for offset in reversed(nodes):
        b.PrependUOffsetTRelative(offset)
    node_vector = b.EndVector()
    edges = _structs(b, "GraphEdge", [(int(s), int(d)) for s, d in graph.edges])
    edge_data = 0
    if kept := m.kept_edge_data(graph.edge_data):  # (1.7) absent when every edge is a full dependency
        edge_data = _structs(b, "GraphEdgeData", [(int(e.from_port), int(e.to_port), int(e.type)) for e in kept])
    fb.Graph.Start(b)
    fb.Graph.AddDevice(b, graph.device)
    fb.Graph.AddNodes(b, node_vector)
    fb.Graph.AddEdges(b, edges)
    if edge_data:
        fb.Graph.AddEdgeData(b, edge_data)
    return fb.Graph.End(b)


def _enum(value: int) -> GraphNodeKind | int:
    try:
        return GraphNodeKind(value)
    except ValueError:
        return value  # a newer writer's node kind: the plan refuses it by number


def _decode_node(v: dict[str, Any]) -> GraphNode:
    relocations = tuple(
        m.Relocation(site, target, site_offset, target_offset, m.RelocationKind(kind) if kind in (0, 1) else kind)
        for site, target, site_offset, target_offset, kind in _rows(v["relocations"], "Relocation")
    )
    return GraphNode(
        kind=_enum(v["kind"]),
        executable=v["executable"],
        function=v["function"],
        flags=v["flags"],
        grid=_dims(v["grid"]),
        block=_dims(v["block"]),
        cluster=_dims(v["cluster"]),
        shared_memory=v["shared_memory"],
        parameters=bytes(v["parameters"]) if v["parameters"] is not None else b"",
        relocations=relocations,
        src_buffer=v["src_buffer"],
        dst_buffer=v["dst_buffer"],
        src_offset=v["src_offset"],
        dst_offset=v["dst_offset"],
        size=v["size"],
        value=v["value"],
        element_size=v["element_size"],
        width=v["width"],
        height=v["height"],
        pitch=v["pitch"],
        event=v["event"],
        graph=v["graph"],
    )


def decode_graph(v: dict[str, Any], common: dict[str, Any]) -> m.Graph:
    """The model Graph of one decoded Graph table (``common``: id and label); a file whose edge
    data does not match its edges one to one is refused."""
    edges = tuple((int(s), int(d)) for s, d in _rows(v["edges"], "GraphEdge"))
    # numbers a newer writer used stay numbers: the plan refuses them
    data = tuple(m.GraphEdgeData.of(*(int(x) for x in row)) for row in _rows(v.get("edge_data"), "GraphEdgeData"))
    if data and len(data) != len(edges):
        raise ReplayFormatError(f"graph {common.get('id')}: {len(data)} edge data rows for {len(edges)} edges")
    return m.Graph(
        device=v["device"],
        nodes=tuple(_decode_node(n) for n in v["nodes"] or ()),
        edges=edges,
        edge_data=data,
        **common,
    )
