"""A replay's collectives (format 1.5): issued again among the other ranks' replays through NCCL,
or, replayed alone, the bytes each received put in place.

Each rank's capture replays in a process of its own (:mod:`replayfmt.verbs.ranks` starts them):
its collectives run on communicators made for the replay, one per captured communicator, from
unique ids the launcher made and gave every rank (:class:`Peers`). NCCL is reached through its C
library (ctypes), in the replay's own contexts: the replay runs in each device's primary
context, which is the one NCCL's runtime calls use.

A capture of a process that drove several devices holds several ranks of one communicator (a
sharded JAX step: one rank per device). Replayed on as many GPUs, its ranks' communicators are
made in this one process (:func:`local_peers`): in one NCCL group, each rank's device current as
its ``ncclCommInitRank`` is called, one unique id per communicator. Its calls are then issued from
this one thread in the capture's order, each on its device's stream. That order interleaves the
ranks (rank 0's call, then rank 1's), so no call may wait on the host for a peer's call that comes
later: NCCL makes a communicator's connections lazily, at its first call, by default (from 2.22:
``NCCL_RUNTIME_CONNECT=1``), and that first call then blocks until its peers connect, which from
one thread never happens. The replay sets ``NCCL_RUNTIME_CONNECT=0`` before NCCL initialises, so
the connections are made at init, inside the group, and every call only queues its kernel. (A
program that set ``NCCL_LAUNCH_MODE=GROUP`` would make NCCL's calls wait for each other in the
process: leave it unset.)

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

from replayfmt.cuda.driver import check, driver
from replayfmt.errors import DeviceError, ReplayError, ReplayUsageError
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
    # the ranks of a communicator this capture holds itself (a process that drove several devices):
    # communicator -> ((rank, captured Device object id), ...), made together in this process
    local: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)


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

    def abort(self, communicator: int) -> None:
        """A communicator given up without waiting for its peers (its init failed in a group)."""
        self._lib.ncclCommAbort(ctypes.c_void_p(communicator))

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
    ranks' captures issue their calls on each communicator in one order), one per (communicator,
    rank): the ranks this capture holds itself all at once, in one group, each on its device
    (``use_device``: a captured Device object id made current)."""

    def __init__(
        self,
        peers: Peers | None,
        nccl: Callable[[], Nccl] = Nccl,
        use_device: Callable[[int], None] | None = None,
    ) -> None:
        self.peers = peers
        self.live = peers is not None
        self._make_nccl = nccl
        self._use_device = use_device
        self._nccl: Nccl | None = None
        self._communicators: dict[tuple[str, int], int] = {}
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
            if self.peers is not None and self.peers.local:  # calls from one thread: connect at init
                os.environ["NCCL_RUNTIME_CONNECT"] = "0"
            self._nccl = self._make_nccl()
        return self._nccl

    def _communicator(self, op: m.Collective) -> int:
        found = self._communicators.get((op.communicator, op.rank))
        if found is not None:
            return found
        assert self.peers is not None
        unique_id = self.peers.unique_ids.get(op.communicator)
        if unique_id is None:
            raise ReplayUsageError(
                f"operation {op.index} ({op.describe()}): communicator {op.communicator} is in none of the "
                "other captures given"
            )
        nccl = self._library()
        reopen = self._grouped  # a communicator is made outside any group of calls
        if reopen:
            nccl.group(False)
        members = self.peers.local.get(op.communicator, ())
        if members:
            self._make_together(nccl, op, unique_id, members)
        else:
            self._communicators[(op.communicator, op.rank)] = nccl.communicator(op.ranks, unique_id, op.rank)
        if reopen:
            nccl.group(True)
        return self._communicators[(op.communicator, op.rank)]

    def _make_together(
        self, nccl: Nccl, op: m.Collective, unique_id: bytes, members: tuple[tuple[int, int], ...]
    ) -> None:
        """Every rank of ``op``'s communicator this capture holds, made in one group (each one's
        init waits for the others), each with its device current; ``op``'s device current after."""
        use = self._use_device or (lambda device: None)
        nccl.group(True)
        made: list[tuple[str, int]] = []
        try:
            for rank, device in members:
                use(device)
                self._communicators[(op.communicator, rank)] = nccl.communicator(op.ranks, unique_id, rank)
                made.append((op.communicator, rank))
        except BaseException:
            # the group is not ended: its other inits would wait for ever for the rank that failed
            for key in made:
                communicator = self._communicators.pop(key)
                getattr(nccl, "abort", nccl.destroy)(communicator)
            raise
        nccl.group(False)
        use(dict(members).get(op.rank, members[0][1]))


def cuda_gpu_count() -> int:
    """How many CUDA devices this machine shows (the driver's answer)."""
    cu = driver()
    check(cu.cuInit(0), "cuInit")
    return int(check(cu.cuDeviceGetCount(), "cuDeviceGetCount"))


def ranks_held(capture: Any) -> dict[str, tuple[tuple[int, int], ...]]:
    """The communicators of which a capture holds several ranks (a process that drove several
    devices): communicator -> ((rank, the Device object id of its calls' streams), ...)."""
    return _held(capture)[0]


def _held(capture: Any) -> tuple[dict[str, tuple[tuple[int, int], ...]], str]:
    """:func:`ranks_held`, and why those ranks cannot be issued among themselves in this process
    ("" when they can): a communicator of which the capture holds fewer ranks than its size (the
    others' calls never come: a group's end would wait for ever), or a send or receive among them
    (NCCL connects a pair at its first send and receive, waiting on the host for the peer's call,
    which from one thread comes later)."""
    streams = {o.id: o.device for o in capture.objects() if isinstance(o, m.Stream)}
    held: dict[str, dict[int, int]] = {}
    sizes: dict[str, int] = {}
    pairs: dict[str, int] = {}  # communicator -> a send or receive on it (operation index)
    for op in capture.iter_operations():
        if isinstance(op, m.Collective):
            held.setdefault(op.communicator, {}).setdefault(op.rank, streams.get(op.stream, 0))
            sizes[op.communicator] = op.ranks
            if op.operation in (_O.SEND, _O.RECV):
                pairs.setdefault(op.communicator, op.index)
    several = {name: tuple(sorted(ranks.items())) for name, ranks in held.items() if len(ranks) > 1}
    why = ""
    for name, ranks in several.items():
        if len(ranks) != sizes[name]:
            why = f"{name} has {sizes[name]} ranks; this capture holds {len(ranks)}"
        elif name in pairs:
            why = (
                f"operation {pairs[name]} is a send or receive among the devices of one process, which this "
                "version does not issue (NCCL would wait for the peer's call, issued later from the same thread)"
            )
        if why:
            break
    return several, why


def local_peers(
    capture: Any,
    devices: int,
    ordinals: tuple[int, ...],
    *,
    gpu_count: Callable[[], int],
    nccl: Callable[[], Nccl] = Nccl,
    reductions: dict[int, int] | None = None,
) -> tuple[Peers | None, str]:
    """The peers of a capture that holds several ranks of its communicators, its ``devices``
    replayed on ``ordinals`` (then the lowest free ones), for one process: (peers, "") when each
    rank has a GPU of its own and NCCL loads; else (None, why its calls' received bytes are put in
    place instead); (None, "") for a capture that holds no communicator's ranks twice."""
    held, refused = _held(capture)
    if not held:
        return None, ""
    names = " and ".join(f"ranks {', '.join(str(r) for r, _ in ranks)} of {name}" for name, ranks in held.items())
    if refused:
        return None, f"received bytes put in place ({names}: {refused})"
    try:
        count = gpu_count()
    except ReplayError:
        count = 0
    free = [k for k in range(count) if k not in ordinals]
    used = (*ordinals, *free)[:devices]
    if len(set(used)) < devices or any(k >= count for k in used):
        why = f"this machine gives its {devices} devices {len({k for k in used if k < count})} GPU(s)"
        return None, f"received bytes put in place ({names}: {why}; NCCL needs a GPU per rank)"
    try:
        library = nccl()
    except ReplayError as exc:
        return None, f"received bytes put in place ({names}: {exc})"
    unique_ids = {name: library.unique_id() for name in held}
    peers = Peers(unique_ids, dict(reductions or {}), held)
    return peers, f"issued among {names} in this process, on {devices} GPUs"
