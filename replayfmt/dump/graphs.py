"""How dump-replay shows a CUDA graph: one row (JSONL) or one line per node (text)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from replayfmt.format import model as m
from replayfmt.format.model import GraphNode, GraphNodeKind
from replayfmt.format.names import demangle

FunctionLookup = Callable[[int, int], m.Function | None]
_N = GraphNodeKind


def _kind_label(kind: GraphNodeKind | int) -> str:
    return kind.label if isinstance(kind, GraphNodeKind) else f"unknown({kind})"


def _dependencies(graph: m.Graph) -> list[list[int]]:
    after: list[list[int]] = [[] for _ in graph.nodes]
    for src, dst in graph.edges:
        if 0 <= dst < len(after):
            after[dst].append(src)
    return after


def _programmatic_sources(graph: m.Graph) -> list[list[int]]:
    """Per node, the nodes it follows through a programmatic edge (it may start before they end)."""
    early: list[list[int]] = [[] for _ in graph.nodes]
    for k, (src, dst) in enumerate(graph.edges):
        if graph.edge_kind(k).type != m.GraphEdgeType.FULL and 0 <= dst < len(early):
            early[dst].append(src)
    return early


def _edge_row(edge: m.GraphEdgeData) -> dict[str, int]:
    return {"from_port": int(edge.from_port), "to_port": int(edge.to_port), "type": int(edge.type)}


def node_row(node: GraphNode, index: int, after: list[int], function: FunctionLookup) -> dict[str, Any]:
    """The JSON fields of one node: its kind, what it runs on and the nodes it waits for."""
    row: dict[str, Any] = {"index": index, "kind": _kind_label(node.kind), "after": after}
    if node.kind == _N.KERNEL:
        fn = function(node.executable, node.function)
        row.update(
            name=fn.name if fn else None,
            executable=node.executable,
            function=node.function,
            grid=list(node.grid),
            block=list(node.block),
            cluster=list(node.cluster),
            shared_memory=node.shared_memory,
            flags=node.flags,
            parameters=node.parameters.hex(),
            relocations=[
                {
                    "site_buffer": r.site_buffer,
                    "site_offset": r.site_offset,
                    "target_buffer": r.target_buffer,
                    "target_offset": r.target_offset,
                    "kind": int(r.kind),
                }
                for r in node.relocations
            ],
        )
    elif node.kind == _N.MEMCPY:
        row.update(
            src_buffer=node.src_buffer,
            src_offset=node.src_offset,
            dst_buffer=node.dst_buffer,
            dst_offset=node.dst_offset,
            size=node.size,
        )
    elif node.kind == _N.MEMSET:
        row.update(
            dst_buffer=node.dst_buffer,
            dst_offset=node.dst_offset,
            value=node.value,
            element_size=node.element_size,
            width=node.width,
            height=node.height,
            pitch=node.pitch,
        )
    elif node.kind in (_N.EVENT_RECORD, _N.EVENT_WAIT):
        row["event"] = node.event
    elif node.kind == _N.CHILD_GRAPH:
        row["graph"] = node.graph
    return row


def graph_fields(graph: m.Graph, function: FunctionLookup) -> dict[str, Any]:
    """The JSONL fields of a graph object beyond kind, id and label."""
    after = _dependencies(graph)
    nodes = [node_row(node, i, after[i], function) for i, node in enumerate(graph.nodes)]
    fields: dict[str, Any] = {"device": graph.device, "nodes": nodes, "edges": [list(e) for e in graph.edges]}
    if graph.edge_data:
        fields["edge_data"] = [_edge_row(e) for e in graph.edge_data]
    return fields


def graph_node_lines(graph: m.Graph, function: FunctionLookup) -> Iterator[str]:
    """One indented text line per node, after the graph's own line."""
    early = _programmatic_sources(graph)
    for i, (node, after) in enumerate(zip(graph.nodes, _dependencies(graph), strict=True)):
        head = f"    node {i:>4} {_kind_label(node.kind):<13}"
        waits = f" after={','.join(map(str, after))}" if after else ""
        if early[i]:
            waits += f" programmatic={','.join(map(str, early[i]))}"
        if node.kind == _N.KERNEL:
            fn = function(node.executable, node.function)
            name = fn.name if fn else f"function#{node.function}"
            grid, block = ",".join(map(str, node.grid)), ",".join(map(str, node.block))
            yield (
                f"{head} {name} exe={node.executable} grid={grid} block={block} smem={node.shared_memory} "
                f"params={len(node.parameters)}B relocs={len(node.relocations)}{waits}"
            )
        elif node.kind == _N.MEMCPY:
            yield (
                f"{head} buffer#{node.src_buffer}+{node.src_offset} -> buffer#{node.dst_buffer}+{node.dst_offset} "
                f"size={node.size}{waits}"
            )
        elif node.kind == _N.MEMSET:
            rows = f" rows={node.height} pitch={node.pitch}" if node.height > 1 else ""
            yield (
                f"{head} buffer#{node.dst_buffer}+{node.dst_offset} value={node.value:#x} x{node.width} "
                f"({node.element_size}B){rows}{waits}"
            )
        elif node.kind in (_N.EVENT_RECORD, _N.EVENT_WAIT):
            yield f"{head} event#{node.event}{waits}"
        elif node.kind == _N.CHILD_GRAPH:
            yield f"{head} graph#{node.graph}{waits}"
        else:
            yield f"{head}{waits}".rstrip()


def graph_summary(graph: m.Graph) -> str:
    """``nodes=N edges=E (kernel x3, memset x1)`` for the graph's own text line."""
    counts: dict[str, int] = {}
    for node in graph.nodes:
        label = _kind_label(node.kind)
        counts[label] = counts.get(label, 0) + 1
    kinds = ", ".join(f"{k} x{n}" for k, n in counts.items())
    programmatic = f" ({graph.programmatic_edges} programmatic)" if graph.programmatic_edges else ""
    edges = f"edges={len(graph.edges)}{programmatic}"
    return f"device={graph.device} nodes={len(graph.nodes)} {edges}" + (f" ({kinds})" if kinds else "")


def kernel_names(graph: m.Graph, function: FunctionLookup) -> list[str]:
    """The names of a graph's kernel nodes, raw and demangled."""
    names = []
    for node in graph.nodes:
        fn = function(node.executable, node.function) if node.kind == _N.KERNEL else None
        if fn is not None:
            names += [fn.name, demangle(fn.name)]
    return names
