"""The plan's checks of CUDA graphs, without a GPU: node references, kernel-node parameter
layouts and relocations (checked as launches are), copy and memset ranges, child graphs and the
dependency edges (in range, acyclic)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from replayfmt.errors import ReplayError, ReplayFormatError, UnsupportedOperationError
from replayfmt.format import model as m
from replayfmt.format.model import GraphNode, GraphNodeKind

_N = GraphNodeKind
_MAX_DEPTH = 16


def node_launch(index: int, node: GraphNode) -> m.Launch:
    """A graph's kernel node as a launch (of operation ``index``, on no stream): what launch
    checks and launch packing take."""
    return m.Launch(
        index,
        node.executable,
        node.function,
        0,
        node.grid,
        node.block,
        node.cluster,
        node.shared_memory,
        node.flags,
        node.parameters,
        node.relocations,
    )


def topological_order(graph: m.Graph) -> list[int]:
    """Node indices in an order where every node follows the nodes it depends on;
    ReplayFormatError when an edge is out of range or the edges form a cycle."""
    count = len(graph.nodes)
    waiting = [0] * count
    after: list[list[int]] = [[] for _ in range(count)]
    for src, dst in graph.edges:
        if not (0 <= src < count and 0 <= dst < count) or src == dst:
            raise ReplayFormatError(f"graph {graph.id}: edge {src} -> {dst} is not between two of its {count} nodes")
        after[src].append(dst)
        waiting[dst] += 1
    ready = deque(i for i in range(count) if waiting[i] == 0)  # ties keep the nodes' order
    order = []
    while ready:
        node = ready.popleft()
        order.append(node)
        for nxt in after[node]:
            waiting[nxt] -= 1
            if waiting[nxt] == 0:
                ready.append(nxt)
    if len(order) != count:
        stuck = min(i for i in range(count) if waiting[i])
        raise ReplayFormatError(f"graph {graph.id}: its edges form a cycle (through node {stuck})")
    return order


def _range(graph: m.Graph, buffer: m.Buffer, offset: int, size: int, role: str) -> None:
    if offset < 0 or size < 0 or offset + size > buffer.size:
        raise ReplayFormatError(
            f"{role} range [{offset}, {offset + size}) lies outside buffer {buffer.id} ({buffer.size} bytes)"
        )


def _need(objects: dict[int, m.ObjectDef], oid: int, cls: type, graph: m.Graph, role: str) -> Any:
    obj = objects.get(oid)
    if not isinstance(obj, cls):
        what = f"object {oid} is a {obj.kind.label}" if obj is not None else f"object {oid} does not exist"
        raise ReplayFormatError(f"its {role} {what}, not a {cls.__name__.lower()}")
    return obj


def check_graph(
    graphs: dict[int, m.Graph],
    objects: dict[int, m.ObjectDef],
    graph: m.Graph,
    check_launch: Callable[[m.Launch], None],
    index: int,
) -> None:
    """Check ``graph`` (launched by operation ``index``) and its children; checked graphs go
    into ``graphs``. ``check_launch`` checks a kernel node as the plan checks a launch. Errors
    name the operation, the graph and the node."""
    try:
        _check_graph(graphs, objects, graph, check_launch, index, 0)
    except ReplayError as exc:
        raise type(exc)(f"operation {index} (graph_launch): {exc}") from None


def _check_graph(
    graphs: dict[int, m.Graph],
    objects: dict[int, m.ObjectDef],
    graph: m.Graph,
    check_launch: Callable[[m.Launch], None],
    index: int,
    depth: int,
) -> None:
    if graph.id in graphs:
        return
    if depth > _MAX_DEPTH:
        raise UnsupportedOperationError(f"graph {graph.id}: child graphs nest more than {_MAX_DEPTH} deep")
    topological_order(graph)
    for i, node in enumerate(graph.nodes):
        try:
            _check_node(graphs, objects, graph, node, check_launch, index, depth)
        except ReplayError as exc:
            raise type(exc)(f"graph {graph.id} node {i} ({node.label}): {exc}") from None
    graphs[graph.id] = graph


def _check_node(
    graphs: dict[int, m.Graph],
    objects: dict[int, m.ObjectDef],
    graph: m.Graph,
    node: GraphNode,
    check_launch: Callable[[m.Launch], None],
    index: int,
    depth: int,
) -> None:
    kind = node.kind
    if not isinstance(kind, GraphNodeKind):
        raise UnsupportedOperationError(f"node kind {kind} is unknown to this replayfmt: upgrade replayfmt")
    if kind == _N.KERNEL:
        if any(node.cluster) or node.flags:
            raise UnsupportedOperationError("kernel nodes with clusters or cooperative launches are not replayed yet")
        check_launch(node_launch(index, node))
    elif kind == _N.MEMCPY:
        src = _need(objects, node.src_buffer, m.Buffer, graph, "source")
        dst = _need(objects, node.dst_buffer, m.Buffer, graph, "destination")
        _range(graph, src, node.src_offset, node.size, "source")
        _range(graph, dst, node.dst_offset, node.size, "destination")
    elif kind == _N.MEMSET:
        dst = _need(objects, node.dst_buffer, m.Buffer, graph, "destination")
        if node.element_size not in (1, 2, 4) or node.height < 1:
            raise ReplayFormatError(f"memset of {node.element_size}-byte elements in {node.height} rows")
        row = node.width * node.element_size
        if node.height > 1 and node.pitch < row:
            raise ReplayFormatError(f"memset rows of {row} bytes are {node.pitch} bytes apart")
        _range(graph, dst, node.dst_offset, (node.height - 1) * node.pitch + row, "memset")
    elif kind in (_N.EVENT_RECORD, _N.EVENT_WAIT):
        _need(objects, node.event, m.Event, graph, "event")
    elif kind == _N.CHILD_GRAPH:
        child = _need(objects, node.graph, m.Graph, graph, "child graph")
        if child.id >= graph.id:
            raise ReplayFormatError(f"child graph {child.id} is not written before graph {graph.id}")
        _check_graph(graphs, objects, child, check_launch, index, depth + 1)


def graph_buffers(graphs: dict[int, m.Graph], graph_id: int) -> set[int]:
    """Every buffer a checked graph's nodes (its children's included) use."""
    used: set[int] = set()
    for node in graphs[graph_id].nodes:
        if node.kind == _N.KERNEL:
            for r in node.relocations:
                used |= {r.target_buffer, r.site_buffer} - {0}
        elif node.kind in (_N.MEMCPY, _N.MEMSET):
            used |= {node.src_buffer, node.dst_buffer} - {0}
        elif node.kind == _N.CHILD_GRAPH:
            used |= graph_buffers(graphs, node.graph)
    return used


def kernel_nodes(graphs: dict[int, m.Graph], graph_id: int) -> list[tuple[int, int, GraphNode]]:
    """(graph id, node index, node) of every kernel node of a checked graph, its children's included."""
    found = []
    for i, node in enumerate(graphs[graph_id].nodes):
        if node.kind == _N.KERNEL:
            found.append((graph_id, i, node))
        elif node.kind == _N.CHILD_GRAPH:
            found += kernel_nodes(graphs, node.graph)
    return found
