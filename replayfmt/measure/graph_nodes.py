"""Per-kernel timing inside CUDA graphs: with ``--per-kernel`` a graph launch of the timed region
runs node by node, as the eager calls doing each node's work (in an order its edges allow), each
between its own pair of events, so that a graph's kernel nodes are timed as launches are. Other
iterations (and ``--mode=graph``) launch the graph as a graph."""

from __future__ import annotations

from typing import Any

from replayfmt.replay.replayer import Replayer
from replayfmt.replay.steps import Step, StepKind

NodeKey = tuple[int, int]
"""(graph launch operation, node number in the graph's eager order)."""

_NODE_STEP_KINDS = {
    "memcpy": StepKind.COPY,
    "memset": StepKind.MEMSET,
    "event_record": StepKind.EVENT_RECORD,
    "event_wait": StepKind.STREAM_WAIT,
}


def unroll_graph_launches(
    steps: list[Step], replayer: Replayer, events: dict[NodeKey, tuple[Any, Any]], record: Any
) -> list[Step]:
    """``steps`` with every graph launch that has node ``events`` replaced by its nodes' calls,
    each bracketed by its (before, after) events on the launch's stream (``record``:
    cuEventRecord)."""
    out = []
    for step in steps:
        graph = replayer.graph(step.operation) if step.kind is StepKind.GRAPH_LAUNCH else None
        if graph is None or (step.operation, 0) not in events:
            out.append(step)
            continue
        stream = step.args[1]
        for node, call in enumerate(graph.calls):
            before, after = events[(step.operation, node)]
            kind = StepKind.LAUNCH if call.kernel else _NODE_STEP_KINDS.get(call.label, StepKind.COPY)
            out += [
                Step(StepKind.EVENT_RECORD, record, (before, stream), step.operation),
                Step(kind, call.fn, call.on(stream), step.operation),
                Step(StepKind.EVENT_RECORD, record, (after, stream), step.operation),
            ]
    return out


def node_name(replayer: Replayer, key: NodeKey) -> str:
    """``saxpy (graph node 3)``: how a node's timing is named (``3.0``: node 0 of the child
    graph that node 3 holds)."""
    index, node = key
    graph = replayer.graph(index)
    call = graph.calls[node] if graph is not None else None
    return f"{call.label} (graph node {call.node})" if call is not None else f"graph node {node}"
