"""(1.5) One rank's call of a collective communication library (NCCL), as a capture holds it: a
part of :mod:`replayfmt.format.model` (``m.Collective``), kept in a module of its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from replayfmt.format.enums import CollectiveOperation, OperationKind

# bytes per element of NCCL's data types (ncclDataType_t): int8, uint8, int32, uint32, int64, uint64,
# float16, float32, float64, bfloat16, float8 e4m3, float8 e5m2
COLLECTIVE_DTYPE_SIZES = (1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1)


@dataclass(frozen=True, slots=True)
class Collective:
    """(1.5) One rank's call of a collective (NCCL) on ``stream``: ``count`` elements of
    ``datatype`` sent from ``send_buffer`` and received into ``recv_buffer``. Replayed with the
    other ranks' captures it is issued again among them; replayed alone, payload ``received``
    (the receive range's bytes after the call) is put in place on the stream instead."""

    index: int
    operation: CollectiveOperation
    datatype: int
    reduction: int
    stream: int
    count: int
    root: int
    ranks: int
    rank: int
    communicator: str
    group: int = 0
    send_buffer: int = 0
    send_offset: int = 0
    recv_buffer: int = 0
    recv_offset: int = 0
    received: int = 0
    kind: ClassVar[OperationKind] = OperationKind.COLLECTIVE

    def fields(self) -> tuple:
        """Every field but the index and the received bytes' payload (what the writer sets)."""
        return (
            self.operation, self.datatype, self.reduction, self.stream, self.count, self.root, self.ranks, self.rank,
            self.communicator, self.group, self.send_buffer, self.send_offset, self.recv_buffer, self.recv_offset,
        )  # fmt: skip

    @property
    def element_size(self) -> int:
        sizes = COLLECTIVE_DTYPE_SIZES
        return sizes[self.datatype] if 0 <= self.datatype < len(sizes) else 0

    @property
    def send_size(self) -> int:
        """Bytes this rank's call reads from its send range."""
        op, kinds = self.operation, CollectiveOperation
        if not self.send_buffer or op == kinds.RECV or (op == kinds.BROADCAST and self.rank != self.root):
            return 0
        factor = self.ranks if op == kinds.REDUCE_SCATTER else 1
        return self.count * factor * self.element_size

    @property
    def recv_size(self) -> int:
        """Bytes the call leaves in this rank's receive range."""
        op, kinds = self.operation, CollectiveOperation
        if not self.recv_buffer or op == kinds.SEND or (op == kinds.REDUCE and self.rank != self.root):
            return 0
        factor = self.ranks if op == kinds.ALL_GATHER else 1
        return self.count * factor * self.element_size

    def describe(self) -> str:
        return (
            f"{self.operation.label} of {self.count} elements (data type {self.datatype}) "
            f"on rank {self.rank} of {self.ranks}"
        )
