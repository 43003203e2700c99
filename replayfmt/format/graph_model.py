"""The nodes of a CUDA graph (format 1.2): what a :class:`replayfmt.format.model.Graph` object
holds. Kept beside :mod:`replayfmt.format.model`; the numbering mirrors schema.fbs's
``GraphNodeKind`` (a test checks it)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from replayfmt.format.model import Dims, Relocation


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


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphNode:
    """One node of a CUDA graph; which fields matter depends on ``kind`` (schema.fbs says).
    ``kind`` is a plain int when a newer writer used a kind this reader does not know."""

    kind: GraphNodeKind | int = GraphNodeKind.EMPTY
    executable: int = 0  # KERNEL: as a Launch
    function: int = 0
    flags: int = 0
    grid: Dims = (0, 0, 0)
    block: Dims = (0, 0, 0)
    cluster: Dims = (0, 0, 0)
    shared_memory: int = 0
    parameters: bytes = b""
    relocations: tuple[Relocation, ...] = ()
    src_buffer: int = 0  # MEMCPY
    dst_buffer: int = 0  # MEMCPY, MEMSET
    src_offset: int = 0
    dst_offset: int = 0
    size: int = 0  # MEMCPY: bytes
    value: int = 0  # MEMSET
    element_size: int = 0
    width: int = 0  # MEMSET: elements per row
    height: int = 0  # MEMSET: rows
    pitch: int = 0  # MEMSET: bytes between rows
    event: int = 0  # EVENT_RECORD, EVENT_WAIT: Event id
    graph: int = 0  # CHILD_GRAPH: Graph id

    @property
    def label(self) -> str:
        return self.kind.label if isinstance(self.kind, GraphNodeKind) else f"kind {self.kind}"
