"""What NCCL says of each collective this process calls, read from NCCL's own log.

NCCL writes one line per collective or point-to-point call when its log is on for the ``COLL``
subsystem: the operation, send and receive buffers, count, data type, reduction, root (or peer),
communicator, its number of ranks and the stream, written by the calling thread when the call is
made, before the group it belongs to launches its kernel. The recorder turns that log on for the
program (``NCCL_DEBUG=INFO``, ``NCCL_DEBUG_SUBSYS=COLL``, into a file of its own) before NCCL
starts, and reads the new lines when it sees an NCCL kernel launched. NCCL's kernels cannot be
replayed as kernels (they need its communicators, peer mappings and proxy threads); knowing the
receive buffer of each collective lets the recorder keep the bytes it left instead.

A program that sets NCCL's log variables itself keeps them: the recorder then reads nothing and
its collectives are refused (NCCL kernels cannot replay), saying why.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

_VARIABLES = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")
_LINE = re.compile(
    rb"NCCL INFO (\w+): opCount [0-9a-fA-F]+ sendbuff (\S+) recvbuff (\S+) count (\d+) datatype (\d+) op (\d+) "
    rb"root (-?\d+) comm (\S+) \[nranks=(\d+)\] stream (\S+)"
)
# ncclDataType_t: int8, uint8, int32, uint32, int64, uint64, float16, float32, float64, bfloat16,
# float8 e4m3, float8 e5m2
DTYPE_SIZES = (1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1)
# how many counts of elements each operation leaves in its receive buffer (a rank's view)
_RECEIVED = {"AllReduce": 1, "Broadcast": 1, "Reduce": 1, "ReduceScatter": 1, "Recv": 1, "AllGather": -1}


@dataclass(frozen=True, slots=True)
class Collective:
    """One NCCL call of this process, as NCCL logged it (addresses and handles as raw integers)."""

    operation: str  # NCCL's name: AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, Send, Recv
    sendbuff: int
    recvbuff: int
    count: int
    datatype: int
    reduction: int
    root: int  # the root, or a point-to-point call's peer
    communicator: int
    ranks: int
    stream: int

    @property
    def received(self) -> int | None:
        """Bytes the call leaves in this rank's receive buffer (0: none, a Send); None when this
        version does not know the operation or its data type."""
        if self.operation == "Send":
            return 0
        factor = _RECEIVED.get(self.operation)
        if factor is None or not 0 <= self.datatype < len(DTYPE_SIZES):
            return None
        elements = self.count * (self.ranks if factor < 0 else factor)
        return 0 if not self.recvbuff else elements * DTYPE_SIZES[self.datatype]

    def describe(self) -> str:
        return f"NCCL {self.operation} of {self.count} elements (data type {self.datatype}) among {self.ranks} ranks"


def _pointer(text: bytes) -> int:
    return 0 if text in (b"(nil)", b"0", b"NULL") else int(text, 16)


def parse_line(line: bytes) -> Collective | None:
    """The collective a line of NCCL's log describes, or None for any other line."""
    found = _LINE.search(line)
    if found is None:
        return None
    name, send, recv, count, dtype, op, root, comm, ranks, stream = found.groups()
    return Collective(
        operation=name.decode(),
        sendbuff=_pointer(send),
        recvbuff=_pointer(recv),
        count=int(count),
        datatype=int(dtype),
        reduction=int(op),
        root=int(root),
        communicator=_pointer(comm),
        ranks=int(ranks),
        stream=_pointer(stream),
    )


class CollectiveLog:
    """NCCL's log of this process's collectives, turned on by :meth:`start` (before NCCL starts)."""

    def __init__(self) -> None:
        self._folder: str | None = None
        self._saved: dict[str, str | None] = {}
        self._offset = 0
        self._partial = b""
        self.why_not = ""  # why nothing is read ("" when the log is on)
        self.seen = 0  # collectives read so far

    def start(self) -> bool:
        taken = [name for name in _VARIABLES if os.environ.get(name)]
        if taken:
            self.why_not = f"{taken[0]} is set in the program's environment; the recorder reads NCCL's log through it"
            return False
        self._folder = tempfile.mkdtemp(prefix="replayfmt-nccl-")
        self._saved = {name: os.environ.get(name) for name in _VARIABLES}
        os.environ.update(
            NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="COLL", NCCL_DEBUG_FILE=str(Path(self._folder, "nccl.%p.log"))
        )
        return True

    @property
    def on(self) -> bool:
        return self._folder is not None

    def take(self) -> list[Collective]:
        """The collectives logged since the last call, in call order."""
        if self._folder is None:
            return []
        try:
            with open(Path(self._folder, f"nccl.{os.getpid()}.log"), "rb") as log:
                log.seek(self._offset)
                data = log.read()
        except OSError:
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()  # a line still being written
        found = [c for c in map(parse_line, lines) if c is not None]
        self.seen += len(found)
        return found

    def stop(self) -> None:
        """Restore the environment and remove the log."""
        if self._folder is None:
            return
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(self._folder, ignore_errors=True)
        self._folder = None
