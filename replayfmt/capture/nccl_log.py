"""What NCCL says of each collective this process calls, read from NCCL's own log.

NCCL writes one line per collective or point-to-point call when its log is on for the ``COLL``
subsystem: the operation, send and receive buffers, count, data type, reduction, root (or peer),
communicator, its number of ranks and the stream, written by the calling thread when the call is
made, before the group it belongs to launches its kernel. For the ``INIT`` subsystem it writes,
as each communicator is made, this process's rank in it and the communicator's id (a hash of its
unique id: the same in every rank). The recorder turns that log on for the program
(``NCCL_DEBUG=INFO``, ``NCCL_DEBUG_SUBSYS=COLL,INIT``, into a file of its own) before NCCL
starts, and reads the new lines when it sees an NCCL kernel launched. NCCL's kernels cannot be
replayed as kernels (they need its communicators, peer mappings and proxy threads); knowing each
call lets the recorder write it as a collective operation (format 1.5), which a replay issues
again among the other ranks' replays, with the bytes it left in its receive buffer for a replay
of this rank alone.

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
# "ncclCommInitRank comm 0x... rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 18000 commId 0x... - Init COMPLETE"
_INIT = re.compile(
    rb"comm (0x[0-9a-fA-F]+) rank (\d+) nranks (\d+)\b(?:.*?\bcudaDev (\d+))?(?:.*?\bcommId (0x[0-9a-fA-F]+))?"
    rb".*Init COMPLETE",
    re.I,
)
# NCCL's kernels (its device kernels, older releases' ncclKernel_*, mangled names of either)
NCCL_KERNEL = re.compile(r"^_?Z?\d*nccl|^ncclKernel|^ncclDevKernel")
# ncclDataType_t: int8, uint8, int32, uint32, int64, uint64, float16, float32, float64, bfloat16,
# float8 e4m3, float8 e5m2
DTYPE_SIZES = (1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1)
# how many counts of elements each operation leaves in its receive buffer (a rank's view; -1: a
# count per rank), and reads from its send buffer
_RECEIVED = {"AllReduce": 1, "Broadcast": 1, "Reduce": 1, "ReduceScatter": 1, "Recv": 1, "AllGather": -1, "Send": 0}
_SENT = {"AllReduce": 1, "Broadcast": 1, "Reduce": 1, "ReduceScatter": -1, "Recv": 0, "AllGather": 1, "Send": 1}


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
        return self._bytes(_RECEIVED, self.recvbuff)

    @property
    def sent(self) -> int | None:
        """Bytes the call reads from this rank's send buffer (0: none, a Recv); None when this
        version does not know the operation or its data type. NCCL ignores the send buffer of a
        Broadcast's other ranks and the receive buffer of a Reduce's: their bytes are counted,
        their ranges only touched."""
        return self._bytes(_SENT, self.sendbuff)

    def _bytes(self, factors: dict[str, int], address: int) -> int | None:
        factor = factors.get(self.operation)
        if factor is None or not 0 <= self.datatype < len(DTYPE_SIZES):
            return None
        elements = self.count * (self.ranks if factor < 0 else factor)
        return 0 if not address else elements * DTYPE_SIZES[self.datatype]

    def describe(self) -> str:
        return f"NCCL {self.operation} of {self.count} elements (data type {self.datatype}) among {self.ranks} ranks"


@dataclass(frozen=True, slots=True)
class Communicator:
    """An NCCL communicator of this process: its identity (the same in every rank's log, where
    NCCL says it) and this process's rank in it."""

    identity: str
    rank: int
    ranks: int
    device: int = -1  # the ordinal of the device NCCL made it on (cudaDev; -1: the line did not say)


def parse_init(line: bytes) -> tuple[int, Communicator] | None:
    """(handle, communicator) of a line saying a communicator was made, or None."""
    found = _INIT.search(line)
    if found is None:
        return None
    handle, rank, ranks, device, comm_id = found.groups()
    identity = f"nccl-{comm_id.decode().lower()}" if comm_id else ""
    return int(handle, 16), Communicator(identity, int(rank), int(ranks), int(device) if device is not None else -1)


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
        self.communicators: dict[int, Communicator] = {}  # by NCCL's handle, as they were made
        # communicators NCCL gave no id, by (size, device): how many so far
        self._unnamed: dict[tuple[int, int], int] = {}
        self._waiting: list[Collective] = []  # read, not yet taken (another device's launch takes them)
        self._seen_on: dict[int, int] = {}  # collectives taken so far, by the device they were taken for

    def start(self) -> bool:
        taken = [name for name in _VARIABLES if os.environ.get(name)]
        if taken:
            self.why_not = f"{taken[0]} is set in the program's environment; the recorder reads NCCL's log through it"
            return False
        self._folder = tempfile.mkdtemp(prefix="replayfmt-nccl-")
        self._saved = {name: os.environ.get(name) for name in _VARIABLES}
        os.environ.update(
            NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="COLL,INIT", NCCL_DEBUG_FILE=str(Path(self._folder, "nccl.%p.log"))
        )
        return True

    @property
    def on(self) -> bool:
        return self._folder is not None

    def take(self, device: int | None = None) -> list[Collective]:
        """The collectives logged and not taken yet, in call order: all of them (``device`` None),
        or those on the communicators of device ``device`` (a process that drives several devices
        calls each device's part from its own thread: their lines interleave, and one NCCL kernel
        launch carries only its own device's calls; while every communicator is on one device,
        all of them). A call on a communicator the log never showed made goes to the first launch
        that asks (it is refused there, saying why)."""
        self._waiting += self.read_lines(self.new_lines())
        if device is None or len({c.device for c in self.communicators.values()}) < 2:
            taken, self._waiting = self._waiting, []
        else:
            mine = self._device_of
            taken = [c for c in self._waiting if mine(c) in (device, -1)]
            self._waiting = [c for c in self._waiting if mine(c) not in (device, -1)]
        if device is not None and taken:
            self._seen_on[device] = self._seen_on.get(device, 0) + len(taken)
        return taken

    def devices(self) -> set[int]:
        """The ordinals of the devices of the communicators made so far (the log read to now)."""
        self._waiting += self.read_lines(self.new_lines())
        return {c.device for c in self.communicators.values() if c.device >= 0}

    def seen_on(self, device: int) -> int:
        """How many collectives were taken for ``device`` so far."""
        return self._seen_on.get(device, 0)

    def _device_of(self, call: Collective) -> int:
        communicator = self.communicators.get(call.communicator)
        return communicator.device if communicator is not None else -1

    def new_lines(self) -> list[bytes]:
        """Whole lines NCCL wrote to its log since the last read."""
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
        return lines

    def read_lines(self, lines: list[bytes]) -> list[Collective]:
        """The collectives of whole lines of the log, in call order (communicators made noted)."""
        found = []
        for line in lines:
            call = parse_line(line)
            if call is not None:
                found.append(call)
            elif (made := parse_init(line)) is not None:
                self._made(*made)
        self.seen += len(found)
        return found

    def _made(self, handle: int, communicator: Communicator) -> None:
        if not communicator.identity:  # every rank makes its communicators of a size in one order
            key = (communicator.ranks, communicator.device)  # per device: one process may hold several ranks
            k = self._unnamed[key] = self._unnamed.get(key, 0) + 1
            identity = f"nccl-{communicator.ranks}-ranks-{k}"
            communicator = Communicator(identity, communicator.rank, communicator.ranks, communicator.device)
        self.communicators[handle] = communicator

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
