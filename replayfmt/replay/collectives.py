"""A replay's collectives (format 1.5): issued again among the other ranks' replays through NCCL,
or, replayed alone, the bytes each received put in place.

Each rank's capture replays in a process of its own (:mod:`replayfmt.verbs.ranks` starts them):
its collectives run on communicators made for the replay, one per captured communicator, from
unique ids the launcher made and gave every rank (:class:`Peers`). NCCL is reached through its C
library (ctypes), in the replay's own contexts: the replay runs in each device's primary
context, which is the one NCCL's runtime calls use.

Only the runs every rank makes alike may issue collectives among the peers: a run waits in each
collective for the other ranks' matching call. A rank's verification may replay its capture
again on its own (poisoned replays, a reference replay), as many times as its own ranges need;
those replays put each collective's received bytes in place instead (:attr:`CollectiveRuntime.live`
off), which is what the peers' calls gave the first time.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replayfmt.errors import DeviceError, ReplayUsageError
from replayfmt.format import model as m

_O = m.CollectiveOperation
UNIQUE_ID_BYTES = 128  # sizeof(ncclUniqueId)
REDUCTIONS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}  # ncclRedOp_t


class _UniqueId(ctypes.Structure):
    # bytes, not chars: a c_char array field reads as a string, cut at its first NUL (an id holds many)
    _fields_ = [("internal", ctypes.c_ubyte * UNIQUE_ID_BYTES)]

    @classmethod
    def of(cls, data: bytes) -> _UniqueId:
        if len(data) != UNIQUE_ID_BYTES:
            raise ReplayUsageError(f"an NCCL unique id is {UNIQUE_ID_BYTES} bytes, not {len(data)}")
        return cls.from_buffer_copy(data)

    def data(self) -> bytes:
        return bytes(self)


@dataclass(frozen=True)
class Peers:
    """What one rank's replay needs to issue its collectives among the other ranks' replays
    (picklable: the launcher hands it to each rank's process)."""

    unique_ids: dict[str, bytes]  # captured communicator -> the NCCL unique id of its replay
    reductions: dict[int, int] = field(default_factory=dict)  # operation -> reduction issued instead (a planted bug)


def nccl_library_path() -> str:
    """Where NCCL's library is: ``REPLAYFMT_NCCL``, the one PyTorch's wheels bring, or the system's."""
    given = os.environ.get("REPLAYFMT_NCCL")
    if given:
        return given
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        spec = None
    for folder in spec.submodule_search_locations or () if spec is not None else ():
        found = sorted(Path(folder, "lib").glob("libnccl.so*"))
        if found:
            return str(found[0])
    return ctypes.util.find_library("nccl") or "libnccl.so.2"


class Nccl:
    """NCCL's C entry points that a replay calls (the library loaded once per process)."""

    def __init__(self, path: str | None = None) -> None:
        where = path or nccl_library_path()
        try:
            lib = ctypes.CDLL(where)
        except OSError as exc:
            raise ReplayUsageError(
                f"NCCL's library could not be loaded from {where} ({exc}): install NCCL or set REPLAYFMT_NCCL"
            ) from None
        self._lib = lib
        p, size, i32, comm = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        lib.ncclGetErrorString.argtypes = [i32]
        lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(_UniqueId)]
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(comm), i32, _UniqueId, i32]
        lib.ncclCommDestroy.argtypes = [comm]
        lib.ncclAllReduce.argtypes = [p, p, size, i32, i32, comm, p]
        lib.ncclBroadcast.argtypes = [p, p, size, i32, i32, comm, p]
        lib.ncclReduce.argtypes = [p, p, size, i32, i32, i32, comm, p]
        lib.ncclAllGather.argtypes = [p, p, size, i32, comm, p]
        lib.ncclReduceScatter.argtypes = [p, p, size, i32, i32, comm, p]
        lib.ncclSend.argtypes = [p, size, i32, i32, comm, p]
        lib.ncclRecv.argtypes = [p, size, i32, i32, comm, p]

    def check(self, result: int, what: str) -> None:
        if result != 0:
            text = self._lib.ncclGetErrorString(result).decode(errors="replace")
            raise DeviceError(f"{what}: NCCL error {result}: {text}")

    def unique_id(self) -> bytes:
        uid = _UniqueId()
        self.check(self._lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        return uid.data()

    def communicator(self, ranks: int, unique_id: bytes, rank: int) -> int:
        handle = ctypes.c_void_p()
        uid = _UniqueId.of(unique_id)
        self.check(self._lib.ncclCommInitRank(ctypes.byref(handle), ranks, uid, rank), "ncclCommInitRank")
        return handle.value or 0

    def destroy(self, communicator: int) -> None:
        self._lib.ncclCommDestroy(communicator)

    def group(self, start: bool) -> None:
        self.check((self._lib.ncclGroupStart if start else self._lib.ncclGroupEnd)(), "ncclGroup")

    def issue(self, op: m.Collective, send: int, recv: int, reduction: int, communicator: int, stream: int) -> int:
        """Issue ``op`` (this rank's part of it); NCCL's result."""
        lib, count, dtype = self._lib, op.count, op.datatype
        kind = op.operation
        if kind == _O.ALL_REDUCE:
            return lib.ncclAllReduce(send, recv, count, dtype, reduction, communicator, stream)
        if kind == _O.BROADCAST:
            return lib.ncclBroadcast(send, recv, count, dtype, op.root, communicator, stream)
        if kind == _O.REDUCE:
            return lib.ncclReduce(send, recv, count, dtype, reduction, op.root, communicator, stream)
        if kind == _O.ALL_GATHER:
            return lib.ncclAllGather(send, recv, count, dtype, communicator, stream)
        if kind == _O.REDUCE_SCATTER:
            return lib.ncclReduceScatter(send, recv, count, dtype, reduction, communicator, stream)
        if kind == _O.SEND:
            return lib.ncclSend(send, count, dtype, op.root, communicator, stream)
        if kind == _O.RECV:
            return lib.ncclRecv(recv, count, dtype, op.root, communicator, stream)
        raise ReplayUsageError(f"operation {op.index}: {kind.label} cannot be issued")


class CollectiveRuntime:
    """Issues one replay's collective steps: among the peers while :attr:`live`, else each one's
    received bytes put in place on its stream (what a rank replayed alone does).

    Communicators are made at the first collective that uses each (every rank reaches it: the
    ranks' captures issue their calls on each communicator in one order)."""

    def __init__(self, peers: Peers | None, nccl: Callable[[], Nccl] = Nccl) -> None:
        self.peers = peers
        self.live = peers is not None
        self._make_nccl = nccl
        self._nccl: Nccl | None = None
        self._communicators: dict[str, int] = {}
        self._grouped = False
        self.issued = 0  # collectives issued among the peers

    def issue(
        self, op: m.Collective, send: int, recv: int, stream: Any, upload: Callable[..., Any] | None, upload_args: tuple
    ) -> Any:
        """One collective step; returns what a step returns (a driver result tuple, or None)."""
        if not self.live:
            return upload(*upload_args) if upload is not None else None
        assert self.peers is not None
        nccl = self._library()
        communicator = self._communicator(op)
        reduction = self.peers.reductions.get(op.index, op.reduction)
        what = f"operation {op.index} ({op.describe()})"
        nccl.check(nccl.issue(op, send, recv, reduction, communicator, int(stream)), what)
        self.issued += 1
        return None

    def group(self, start: bool) -> None:
        """Open or close a group of calls (what the capture's calls of one group were)."""
        if self.live and start != self._grouped:
            self._library().group(start)
            self._grouped = start

    def close(self) -> None:
        if self._nccl is not None:
            for communicator in self._communicators.values():
                self._nccl.destroy(communicator)
        self._communicators.clear()

    def _library(self) -> Nccl:
        if self._nccl is None:
            self._nccl = self._make_nccl()
        return self._nccl

    def _communicator(self, op: m.Collective) -> int:
        found = self._communicators.get(op.communicator)
        if found is not None:
            return found
        assert self.peers is not None
        unique_id = self.peers.unique_ids.get(op.communicator)
        if unique_id is None:
            raise ReplayUsageError(
                f"operation {op.index} ({op.describe()}): communicator {op.communicator} is in none of the "
                "other captures given"
            )
        reopen = self._grouped  # a communicator is made outside any group
        if reopen:
            self._library().group(False)
        made = self._communicators[op.communicator] = self._library().communicator(op.ranks, unique_id, op.rank)
        if reopen:
            self._library().group(True)
        return made
