"""The plan's checks of CUDA graphs, without a GPU: node references, kernel-node parameter
layouts and relocations (checked as launches are), copy and memset ranges, child graphs and the
dependency edges (in range, acyclic). Every walk over child graphs here is iterative, memoised
and bounded by ``Limits`` (``max_graph_depth``, ``max_graph_visits``): a capture's graphs are
untrusted, and neither a chain of thousands of child graphs nor a diamond that doubles at every
level may recurse or run for long."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from replayfmt.errors import ReplayError, ReplayFormatError, UnsupportedOperationError
from replayfmt.format import model as m
from replayfmt.format.layout import DEFAULT_LIMITS, Limits
from replayfmt.format.model import GraphNode, GraphNodeKind

_N = GraphNodeKind


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


def _check_edge_data(graph: m.Graph) -> None:
    """How each edge orders its nodes, as the driver accepts it: kinds this version knows; a port
    other than the default only on a kernel node (only kernels have them); a programmatic edge
    only between kernel nodes, from the source's trigger or launch-order port."""
    for k, edge in enumerate(graph.edge_data):
        src, dst = graph.edges[k]
        where = f"graph {graph.id}: edge {src} -> {dst}"
        if not isinstance(edge.type, m.GraphEdgeType) or not isinstance(edge.from_port, m.GraphEdgePort):
            raise UnsupportedOperationError(
                f"{where}: edge type {int(edge.type)}, port {int(edge.from_port)} is unknown to this replayfmt: "
                "upgrade replayfmt"
            )
        if edge.to_port != 0:
            raise UnsupportedOperationError(f"{where}: destination port {edge.to_port} is unknown to this replayfmt")
        source, target = graph.nodes[src], graph.nodes[dst]
        if edge.from_port != m.GraphEdgePort.DEFAULT and source.kind != _N.KERNEL:
            raise ReplayFormatError(f"{where}: port {edge.from_port.name.lower()} of a {source.label} node")
        if edge.type != m.GraphEdgeType.PROGRAMMATIC:
            continue
        if source.kind != _N.KERNEL or target.kind != _N.KERNEL:
            ends = f"{source.label} and {target.label}"
            raise ReplayFormatError(f"{where}: a programmatic edge joins two kernel nodes, not {ends}")
        if edge.from_port == m.GraphEdgePort.DEFAULT:
            raise ReplayFormatError(f"{where}: a programmatic edge leaves its source's trigger or launch-order port")


def _range(graph: m.Graph, buffer: m.Buffer, offset: int, size: int, role: str) -> None:
    if offset < 0 or size < 0 or offset + size > buffer.size:
        raise ReplayFormatError(
            f"{role} range [{offset}, {offset + size}) lies outside buffer {buffer.id} ({buffer.size} bytes)"
        )


def _need(objects: Mapping[int, m.ObjectDef], oid: int, cls: type, graph: m.Graph, role: str) -> Any:
    obj = objects.get(oid)
    if not isinstance(obj, cls):
        missing = getattr(objects, "missing", lambda oid: f"object {oid} does not exist")(oid)
        what = f"object {oid} is a {obj.kind.label}" if obj is not None else missing
        raise ReplayFormatError(f"its {role} {what}, not a {cls.__name__.lower()}")
    return obj


@dataclass(frozen=True, slots=True)
class GraphSize:
    """What one checked graph amounts to once its child graphs are expanded, as the driver
    instantiates it: how deep its child graphs nest (1: none), how many nodes it runs, and whether
    any of its edges (its children's included) is programmatic (1.7: needs sm_90)."""

    depth: int
    nodes: int
    programmatic: bool = False


def check_graph(
    graphs: dict[int, m.Graph],
    objects: Mapping[int, m.ObjectDef],
    graph: m.Graph,
    check_launch: Callable[[m.Launch], None],
    index: int,
    *,
    limits: Limits = DEFAULT_LIMITS,
    sizes: dict[int, GraphSize] | None = None,
) -> GraphSize:
    """Check ``graph`` (launched by operation ``index``) and its children; checked graphs go
    into ``graphs`` and their expanded sizes into ``sizes``; returns ``graph``'s. ``check_launch`` checks a kernel node
    as the plan checks a launch. The walk is iterative and memoised (a child graph reached again
    is not walked again), child graphs nest at most ``limits.max_graph_depth`` deep and a launch
    expands to at most ``limits.max_graph_visits`` nodes (a chain of thousands of child graphs, or
    a diamond whose expansion doubles at every level, is refused, never recursed into). Errors
    name the operation, the graph and the node."""
    sizes = {} if sizes is None else sizes
    try:
        for gid in children_first(objects, graph.id, graphs, limits):
            child = objects[gid]
            assert isinstance(child, m.Graph)
            _check_one(graphs, objects, child, check_launch, index, limits, sizes)
    except ReplayError as exc:
        raise type(exc)(f"operation {index} (graph_launch): {exc}") from None
    return sizes[graph.id]


def children_first(
    objects: Mapping[int, m.ObjectDef], root: int, done: Mapping[int, object], limits: Limits = DEFAULT_LIMITS
) -> list[int]:
    """The graphs reachable from Graph ``root`` through child-graph nodes (``root`` included),
    each once, every child before the graphs that hold it: an iterative walk that skips the ids
    in ``done``. A child that is not a graph, a child written after its parent (the only way a
    cycle can form) and nesting deeper than ``limits.max_graph_depth`` are refused."""
    order: list[int] = []
    seen: set[int] = set(done)
    if root in seen:
        return order
    seen.add(root)
    stack: list[tuple[int, int]] = [(root, 0)]  # (graph id, next node to look at)
    while stack:
        gid, at = stack[-1]
        graph = objects[gid]
        assert isinstance(graph, m.Graph)
        nodes = graph.nodes
        while at < len(nodes) and nodes[at].kind != _N.CHILD_GRAPH:
            at += 1
        if at == len(nodes):
            stack.pop()
            order.append(gid)
            continue
        stack[-1] = (gid, at + 1)
        child_id = nodes[at].graph
        child = objects.get(child_id)
        where = f"graph {gid} node {at} (child_graph)"
        if not isinstance(child, m.Graph):
            missing = getattr(objects, "missing", lambda oid: f"object {oid} does not exist")(child_id)
            what = f"object {child_id} is a {child.kind.label}" if child is not None else missing
            raise ReplayFormatError(f"{where}: its child graph {what}, not a graph")
        if child_id >= gid:  # so a graph never holds itself, nor any cycle of graphs
            raise ReplayFormatError(f"{where}: child graph {child_id} is not written before graph {gid}")
        if child_id in seen:
            continue
        if len(stack) >= limits.max_graph_depth:
            raise UnsupportedOperationError(
                f"graph {root}: child graphs nest more than {limits.max_graph_depth} deep (Limits.max_graph_depth)"
            )
        seen.add(child_id)
        stack.append((child_id, 0))
    return order


def _check_one(
    graphs: dict[int, m.Graph],
    objects: Mapping[int, m.ObjectDef],
    graph: m.Graph,
    check_launch: Callable[[m.Launch], None],
    index: int,
    limits: Limits,
    sizes: dict[int, GraphSize],
) -> None:
    """Check one graph whose children are checked (and sized) already."""
    topological_order(graph)
    _check_edge_data(graph)
    depth, expanded, programmatic = 1, 0, graph.programmatic_edges > 0
    for i, node in enumerate(graph.nodes):
        try:
            _check_node(objects, graph, node, check_launch, index)
        except ReplayError as exc:
            raise type(exc)(f"graph {graph.id} node {i} ({node.label}): {exc}") from None
        if node.kind == _N.CHILD_GRAPH:
            child = sizes[node.graph]
            depth, expanded = max(depth, child.depth + 1), expanded + child.nodes
            programmatic |= child.programmatic
        else:
            expanded += 1
    if depth > limits.max_graph_depth:
        raise UnsupportedOperationError(
            f"graph {graph.id}: child graphs nest {depth} deep, more than {limits.max_graph_depth} "
            "(Limits.max_graph_depth)"
        )
    if expanded > limits.max_graph_visits:
        raise UnsupportedOperationError(
            f"graph {graph.id}: its child graphs expand it to {expanded} nodes, more than "
            f"Limits.max_graph_visits ({limits.max_graph_visits})"
        )
    sizes[graph.id] = GraphSize(depth, expanded, programmatic)
    graphs[graph.id] = graph


def _check_node(
    objects: Mapping[int, m.ObjectDef],
    graph: m.Graph,
    node: GraphNode,
    check_launch: Callable[[m.Launch], None],
    index: int,
) -> None:
    kind = node.kind
    if not isinstance(kind, GraphNodeKind):
        raise UnsupportedOperationError(f"node kind {kind} is unknown to this replayfmt: upgrade replayfmt")
    if kind == _N.KERNEL:
        if node.flags & m.LAUNCH_FLAG_COOPERATIVE:
            raise UnsupportedOperationError("kernel nodes of cooperative launches are not replayed yet")
        if node.flags:  # a node's programmatic dependencies are its edges (1.7), not a flag
            raise ReplayFormatError(f"kernel node flags {node.flags:#x}: a kernel node carries none but cooperative")
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
    # a child graph was checked before this graph (children_first)


def buffers_used_by_graph(graphs: dict[int, m.Graph], graph_id: int, limits: Limits = DEFAULT_LIMITS) -> set[int]:
    """Every buffer a checked graph's nodes (its children's included) use; each graph is looked
    at once, however often it is reached."""
    used: set[int] = set()
    for gid in children_first(graphs, graph_id, {}, limits):
        for node in graphs[gid].nodes:
            if node.kind == _N.KERNEL:
                for r in node.relocations:
                    used |= {r.target_buffer, r.site_buffer} - {0}
            elif node.kind in (_N.MEMCPY, _N.MEMSET):
                used |= {node.src_buffer, node.dst_buffer} - {0}
    return used


def graph_references(graphs: dict[int, m.Graph], graph_id: int, limits: Limits = DEFAULT_LIMITS) -> set[int]:
    """Every object a checked graph's nodes refer to (buffers, events, executables, child graphs),
    its children's included: what must still be alive when it is launched."""
    used: set[int] = set()
    for gid in children_first(graphs, graph_id, {}, limits):
        used.add(gid)
        for node in graphs[gid].nodes:
            used |= {node.executable, node.src_buffer, node.dst_buffer, node.event, node.graph}
            for r in node.relocations:
                used |= {r.target_buffer, r.site_buffer}
    used.discard(0)
    return used


def kernel_nodes(
    graphs: dict[int, m.Graph], graph_id: int, limits: Limits = DEFAULT_LIMITS
) -> list[tuple[int, int, GraphNode]]:
    """(graph id, node index, node) of every kernel node of a checked graph, its children's
    included, each once (a child graph reached along several paths is listed once)."""
    return [
        (gid, i, node)
        for gid in children_first(graphs, graph_id, {}, limits)
        for i, node in enumerate(graphs[gid].nodes)
        if node.kind == _N.KERNEL
    ]
