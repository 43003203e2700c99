"""The kinds of a CUDA graph's nodes (1.2) and how one of its edges orders its nodes (1.7): parts
of :mod:`replayfmt.format.model` (``m.GraphNodeKind``, ``m.GraphEdgeData``), kept in a module of
their own."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from replayfmt.format.enums import GraphEdgePort, GraphEdgeType


class GraphNodeKind(enum.IntEnum):
    EMPTY = 0
    KERNEL = 1
    MEMCPY = 2
    MEMSET = 3
    EVENT_RECORD = 4
    EVENT_WAIT = 5
    CHILD_GRAPH = 6
    HOST = 7  # a host function: replayed as an empty node that keeps its place

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class GraphEdgeData:
    """(1.7) How one graph edge orders its nodes (CUgraphEdgeData): the default, a full
    dependency; a programmatic edge lets its destination start before its source has ended (the
    destination waits in ``griddepcontrol.wait``), as XLA's command buffers chain their kernels.
    Numbers outside the enums are a newer writer's: the plan refuses them."""

    from_port: GraphEdgePort | int = GraphEdgePort.DEFAULT
    to_port: int = 0
    type: GraphEdgeType | int = GraphEdgeType.FULL

    @classmethod
    def of(cls, from_port: int, to_port: int, dependency: int) -> GraphEdgeData:
        """From stored numbers (CUgraphEdgeData's from_port, to_port, type): the enums where this
        version knows them, else the numbers."""
        known_ports, known_types = {int(p) for p in GraphEdgePort}, {int(t) for t in GraphEdgeType}
        port = GraphEdgePort(from_port) if from_port in known_ports else from_port
        kind = GraphEdgeType(dependency) if dependency in known_types else dependency
        return cls(port, to_port, kind)

    @property
    def full(self) -> bool:
        return (self.from_port, self.to_port, self.type) == (0, 0, 0)


FULL_DEPENDENCY = GraphEdgeData()


def kept_edge_data(edge_data: Iterable[GraphEdgeData]) -> tuple[GraphEdgeData, ...]:
    """What a graph keeps of its edges' data: all of it, or none when every edge is a full
    dependency (the format writes no vector then, and a reader reads none)."""
    data = tuple(edge_data)
    return () if all(e.full for e in data) else data
