"""Candidates of a reduction written as standalone captures: a subset of a capture's device work,
closed under its dependencies the way extract-replay closes a range (:mod:`replayfmt.edit.closure`).

Every kept operation sees the inputs it saw in the original program. Bytes it reads that a removed
operation (or an earlier region's state) left are given from the capture's own data
(:class:`~replayfmt.edit.shadow.Shadow`: states, uploads, memsets, copies, checkpoints): as starting
state where nothing kept touched them before, else as a host-to-device copy just before it on its
stream. A candidate whose kept operations read bytes the capture does not hold (a removed launch
wrote them and no checkpoint followed) cannot be built (:class:`NotBuildable`); the search counts
it as passing without replaying it. A region capture keeps its producers for that reason; a
kernel-mode capture (every launch its own region with state and checkpoint) reduces to single launches.

Checkpoints: each of the original's checkpoints at or after the first kept operation is carried
over, narrowed to the bytes whose last writer in the original is a kept operation, so a candidate
is compared only on what its own work computed.

Pieces (:class:`Piece`): the ranges given before a kept operation, which the second phase of a
reduction drops to find the bytes the remaining work needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from replayfmt.edit.closure import Closure, compute_closure
from replayfmt.edit.lazy_shadow import LazyShadow
from replayfmt.edit.run_map import RunMap
from replayfmt.edit.shadow import ByteState, buffers_named_by_graph, graph_executables, launch_buffers
from replayfmt.edit.transplant import Transplant, derived_metadata
from replayfmt.errors import ReplayUsageError, UnsupportedOperationError
from replayfmt.format import model as m
from replayfmt.format.uses import ModuleGlobals
from replayfmt.reader import Capture
from replayfmt.writer import CaptureWriter

_K = m.OperationKind
_CONTROL = {
    _K.EVENT_RECORD,
    _K.STREAM_WAIT_EVENT,
    _K.EVENT_SYNCHRONIZE,
    _K.STREAM_SYNCHRONIZE,
    _K.DEVICE_SYNCHRONIZE,
}
UNSET = -2  # a candidate's byte nothing has given yet
NOTHING = -1  # an original byte nothing wrote (undefined: a capture must not depend on it)
TOOL = "replayfmt reduce-replay"


class NotBuildable(Exception):
    """A candidate's kept work reads bytes the capture does not hold."""


@dataclass(frozen=True, order=True)
class Piece:
    """Bytes ``[lo, hi)`` of buffer ``buffer`` (source id) given before kept operation ``before``."""

    before: int
    buffer: int
    lo: int
    hi: int

    @property
    def size(self) -> int:
        return self.hi - self.lo

    def halves(self, least: int) -> list[Piece]:
        """Two halves split at a multiple of ``least`` bytes (itself when it is that small)."""
        if self.size <= least:
            return [self]
        mid = self.lo + max(least, (self.size // 2) // least * least)
        return [replace(self, hi=mid), replace(self, lo=mid)]


@dataclass
class Built:
    """A candidate written: its source-to-new object ids, pieces given, and sizes."""

    path: Path
    kept: tuple[int, ...]  # source operation indices of the kept device work
    ids: dict[int, int]
    pieces: list[Piece] = field(default_factory=list)
    operations: int = 0
    launches: int = 0
    state_bytes: int = 0  # starting state and copies given from the capture's data
    size: int = 0  # file bytes


def _ranges_cut(lo: int, hi: int, holes: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """``[lo, hi)`` less the ``holes``."""
    out = [(lo, hi)]
    for a, b in holes:
        nxt = []
        for x, y in out:
            if b <= x or y <= a:
                nxt.append((x, y))
                continue
            if x < a:
                nxt.append((x, a))
            if b < y:
                nxt.append((b, y))
        out = nxt
    return out


class Reducible:
    """A capture opened for reduction: its operations, their footprints, and candidate writing."""

    def __init__(self, capture: Capture, source: Path) -> None:
        self.capture = capture
        self.source = source
        self.ops = list(capture.iter_operations(0, None))
        # operations that cannot be replayed (unsupported calls, kinds this reader does not know) are
        # never kept: they are not device work; what they may have written is unknown to the shadow
        for op in self.ops:
            if isinstance(op, m.State | m.Copy) and op.relocations:
                raise UnsupportedOperationError(
                    f"operation {op.index} ({op.kind.label}) stores pointers in device memory: reduce-replay "
                    "rebuilds inputs as plain bytes and cannot carry stored pointers (record with --mode kernel)"
                )
        self.units = [op.index for op in self.ops if op.kind in m.DEVICE_WORK]
        if not self.units:
            raise ReplayUsageError(f"{source} holds no device work (launches, copies, memsets or graph launches)")
        lookup = capture.object
        self._globals = ModuleGlobals(range(1, capture.object_count + 1), lookup)
        self.reads: dict[int, list[tuple[int, int, int]]] = {}  # op -> (buffer, lo, hi)
        self.writes: dict[int, list[tuple[int, int, int]]] = {}
        for i in self.units:
            self.reads[i], self.writes[i] = self._footprint(self.ops[i])
        self.launches = sum(1 for i in self.units if self.ops[i].kind == _K.LAUNCH)

    def _size(self, buffer: int) -> int:
        obj = self.capture.object(buffer)
        if not isinstance(obj, m.Buffer):
            raise ReplayUsageError(f"object {buffer} is named as a buffer but is a {type(obj).__name__}")
        return obj.size

    def _whole(self, buffers: Iterable[int]) -> list[tuple[int, int, int]]:
        return [(b, 0, self._size(b)) for b in sorted(set(buffers) - {0})]

    def _footprint(self, op: m.Operation) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
        """(reads, writes) of one operation; launches read and may write whole buffers."""
        if op.kind == _K.LAUNCH:
            whole = self._whole(launch_buffers(op))  # type: ignore[arg-type]
            whole += self._whole(self._globals.of({op.executable}) - {b for b, _, _ in whole})  # type: ignore[union-attr]
            return whole, whole
        if op.kind == _K.GRAPH_LAUNCH:
            graph = self.capture.object(op.graph)  # type: ignore[union-attr]
            if not isinstance(graph, m.Graph):
                return [], []
            lookup = self.capture.object
            names = buffers_named_by_graph(graph, lookup) | self._globals.of(graph_executables(graph, lookup))
            whole = self._whole(names)
            return whole, whole
        if op.kind == _K.MEMSET:
            s: m.Memset = op  # type: ignore[assignment]
            return [], [(s.buffer, s.offset, s.offset + s.count * s.element_size)]
        c: m.Copy = op  # type: ignore[assignment]
        reads = [(c.src_buffer, c.src_offset, c.src_offset + c.size)] if c.src_buffer else []
        writes = [(c.dst_buffer, c.dst_offset, c.dst_offset + c.size)] if c.dst_buffer else []
        return reads, writes

    def launches_of(self, executables: set[int]) -> list[int]:
        """The device work that runs one of ``executables``: its launches, and graph launches whose
        graph holds a kernel node of one."""
        out = []
        for i in self.units:
            op = self.ops[i]
            if op.kind == _K.LAUNCH and op.executable in executables:  # type: ignore[union-attr]
                out.append(i)
            elif op.kind == _K.GRAPH_LAUNCH:
                graph = self.capture.object(op.graph)  # type: ignore[union-attr]
                if isinstance(graph, m.Graph) and graph_executables(graph, self.capture.object) & executables:
                    out.append(i)
        return out

    def last_writer(self, before: int, buffer: int) -> int | None:
        """The last device work before operation ``before`` that writes ``buffer``, or None."""
        for i in reversed([u for u in self.units if u < before]):
            if any(b == buffer for b, _, _ in self.writes[i]):
                return i
        return None

    def with_producers(self, kept: Iterable[int]) -> list[int]:
        """``kept`` and, transitively, the earlier device work that writes a buffer it reads (whole
        buffers: an over-approximation, for a region capture whose kept work reads what removed
        work left and the capture does not hold)."""
        keep = set(kept)
        needed: set[int] = set()
        for i in reversed(self.units):
            if i in keep:
                needed |= {b for b, _, _ in self.reads[i]}
            elif needed & {b for b, _, _ in self.writes[i]}:
                keep.add(i)
                needed |= {b for b, _, _ in self.reads[i]}
        return sorted(keep)

    # -- one candidate --------------------------------------------------------------------------

    def _selection(self, kept: Iterable[int]) -> tuple[list[int], set[int], Closure]:
        """The kept device work (sorted), the control operations kept with it, and their closure."""
        keep = sorted(set(kept))
        if not keep:
            raise NotBuildable("no operation kept")
        first, last = keep[0], keep[-1]
        ops = self.ops
        streams = {getattr(ops[i], "stream", 0) for i in keep} - {0}
        recorded = {
            o.event  # type: ignore[union-attr]
            for o in ops[first : last + 1]
            if o.kind == _K.EVENT_RECORD and o.stream in streams  # type: ignore[union-attr]
        }
        control = {
            o.index for o in ops[first : last + 1] if o.kind in _CONTROL and self._keeps_control(o, streams, recorded)
        }
        closure = compute_closure(
            [ops[i] for i in sorted(set(keep) | control)], self.capture.object, self.capture.object_count
        )
        return keep, control, closure

    def build(
        self,
        kept: Iterable[int],
        output: Path,
        *,
        dropped: Iterable[Piece] = (),
        properties: Callable[[tuple[int, ...], dict[int, int]], tuple[tuple[str, str], ...]] | None = None,
        poison: bool = False,
    ) -> Built:
        """Write the candidate that keeps device work ``kept`` (source operation indices) to
        ``output``, less the ``dropped`` pieces; NotBuildable when the capture lacks bytes it reads.
        ``properties(kept, ids)``: metadata properties, given the new id of each kept source object.
        ``poison``: the dropped pieces are given too, every byte the complement of the capture's,
        so that a kernel reading one cannot see the bytes it saw (left out, they are undefined and
        may hold them: the allocation a previous replay left)."""
        keep, control, closure = self._selection(kept)
        holes: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for p in dropped:
            holes.setdefault((p.before, p.buffer), []).append((p.lo, p.hi))
        plan = _Walk(self, set(keep), closure.buffers, holes, poison)
        plan.walk()
        ids = {old: k + 1 for k, old in enumerate(sorted(closure.objects))}  # as Transplant numbers them
        props = properties(tuple(keep), ids) if properties is not None else ()
        built = self._write(output, keep, control, closure.objects, plan, props)
        if built.ids != ids:
            raise ReplayUsageError("the reduced capture's objects were numbered unlike expected (an internal error)")
        return built

    @staticmethod
    def _keeps_control(op: m.Operation, streams: set[int], recorded: set[int]) -> bool:
        if op.kind == _K.DEVICE_SYNCHRONIZE:
            return True
        if op.kind in (_K.EVENT_RECORD, _K.STREAM_SYNCHRONIZE):
            return op.stream in streams  # type: ignore[union-attr]
        if op.kind == _K.STREAM_WAIT_EVENT:
            return op.stream in streams and op.event in recorded  # type: ignore[union-attr]
        return op.event in recorded  # type: ignore[union-attr]

    def _write(
        self,
        output: Path,
        keep: list[int],
        control: set[int],
        objects: list[int],
        plan: _Walk,
        properties: tuple[tuple[str, str], ...],
    ) -> Built:
        src = self.capture.metadata
        meta = derived_metadata(src, TOOL, "reduce.", properties)
        built = Built(output, tuple(keep), {})
        with CaptureWriter(output, metadata=meta, overwrite=True) as w:
            t = Transplant(self.capture, w)
            t.add_objects(objects)
            w.scope_begin("reduced")
            for buffer, lo, data in plan.state:
                w.state(buffer=t.id(buffer), data=data, offset=lo)
                built.state_bytes += len(data)
            for action in plan.actions:
                if isinstance(action, _Restore):
                    w.copy_h2d(
                        dst_buffer=t.id(action.buffer),
                        data=action.data,
                        dst_offset=action.lo,
                        stream=t.id(action.stream),
                    )
                    built.state_bytes += len(action.data)
                elif isinstance(action, _Check):
                    entries = [m.CheckpointEntry(t.id(b), w.add_payload(d), lo, len(d)) for b, lo, d in action.entries]
                    types = [replace(x, buffer=t.id(x.buffer)) for x in action.types]
                    w.checkpoint(entries, name=action.name, types=types)
                else:
                    op = self.ops[action]
                    if op.kind in _CONTROL and action not in control:
                        continue
                    t.operation(op)
                    built.launches += op.kind == _K.LAUNCH
            w.scope_end("reduced")
            built.operations = w.operation_count
        built.ids = dict(t.ids)
        built.pieces = plan.pieces
        built.size = output.stat().st_size
        return built


@dataclass
class _Restore:
    buffer: int
    lo: int
    data: bytes
    stream: int


@dataclass
class _Check:
    name: str
    entries: list[tuple[int, int, bytes]]  # (source buffer, offset, bytes)
    types: list[m.TypedTensor]


class _Walk:
    """One pass over the original's operations for a candidate: what to give before each kept
    operation, and which checkpointed bytes the kept work alone wrote."""

    def __init__(
        self,
        r: Reducible,
        kept: set[int],
        buffers: set[int],
        holes: dict[tuple[int, int], list[tuple[int, int]]],
        poison: bool = False,
    ) -> None:
        self.r = r
        self.kept = kept
        self.holes = holes
        self.poison = poison
        cap = r.capture
        tracked = set(buffers)
        grew = True
        while grew:  # device-to-device copies into tracked buffers make their sources matter too
            grew = False
            for op in r.ops:
                if op.kind == _K.COPY_DEVICE_TO_DEVICE and op.dst_buffer in tracked and op.src_buffer not in tracked:  # type: ignore[union-attr]
                    tracked.add(op.src_buffer)  # type: ignore[union-attr]
                    grew = True
        self.buffers = buffers
        self.shadow = LazyShadow(
            {b: r._size(b) for b in tracked}, lambda p, out, at: cap.read_payload_into(p, out, at), cap.object
        )
        self.original = {b: RunMap(r._size(b), NOTHING) for b in buffers}  # the last writer in the original
        self.candidate = {b: RunMap(r._size(b), UNSET) for b in buffers}  # whose output the candidate holds
        self.state: list[tuple[int, int, bytes]] = []
        self.actions: list[int | _Restore | _Check] = []
        self.pieces: list[Piece] = []

    def walk(self) -> None:
        first, last = min(self.kept), max(self.kept)
        for op in self.r.ops:
            i = op.index
            if i in self.kept:
                self._give_inputs(op)
                self.actions.append(i)
                self._wrote(i, candidate=True)
            elif i in self.r.reads:  # removed device work
                self._wrote(i, candidate=False)
            elif op.kind == _K.STATE:
                if op.buffer in self.original:  # type: ignore[union-attr]
                    self.original[op.buffer].set(op.offset, op.offset + op.size, i)  # type: ignore[union-attr]
            elif op.kind == _K.CHECKPOINT and i > first:
                check = self._checkpoint(op)  # type: ignore[arg-type]
                if check is not None:
                    self.actions.append(check)
            elif op.kind in _CONTROL and first < i < last:
                self.actions.append(i)
            if i < last:  # after the last kept operation nothing is given: only checkpoints matter
                self.shadow.apply(op)

    def _wrote(self, i: int, *, candidate: bool) -> None:
        for b, lo, hi in self.r.writes[i]:
            if b in self.original:
                self.original[b].set(lo, hi, i)
                if candidate:
                    self.candidate[b].set(lo, hi, i)

    def _give_inputs(self, op: m.Operation) -> None:
        """Give the bytes ``op`` reads whose value in the candidate is not the original's."""
        stream = getattr(op, "stream", 0)
        for b, lo, hi in self.r.reads[op.index]:
            if b not in self.original:
                continue
            for a, z, writer in self.original[b].pieces(lo, hi):
                if writer == NOTHING:
                    continue
                for x, y, held in self.candidate[b].pieces(a, z):
                    if held != writer:
                        self._give(op.index, b, x, y, writer, held == UNSET, stream)

    def _give(self, before: int, b: int, lo: int, hi: int, writer: int, fresh: bool, stream: int) -> None:
        dirty = self.shadow.state_runs(b, lo, hi - lo, ByteState.DIRTY)
        if dirty:
            raise NotBuildable(
                f"operation {before} reads buffer {b} bytes [{dirty[0][0]}, {dirty[-1][1]}) that removed operation "
                f"{writer} wrote, and the capture does not hold them"
            )
        self.candidate[b].set(lo, hi, writer)
        for x, y in self.shadow.state_runs(b, lo, hi - lo, ByteState.KNOWN):
            self.pieces.append(Piece(before, b, x, y))
            holes = self.holes.get((before, b), ())
            given = [(u, v, False) for u, v in _ranges_cut(x, y, holes)]
            if self.poison:
                given += [(max(x, a), min(y, z), True) for a, z in holes if max(x, a) < min(y, z)]
            for u, v, poisoned in sorted(given):
                data = self.shadow.read(b, u, v - u).tobytes()
                if poisoned:
                    data = (~np.frombuffer(data, np.uint8)).tobytes()
                if fresh:
                    self.state.append((b, u, data))
                else:
                    self.actions.append(_Restore(b, u, data, stream))

    def _checkpoint(self, op: m.Checkpoint) -> _Check | None:
        entries = []
        cap = self.r.capture
        for e in op.entries:
            runs = self.original.get(e.buffer)
            if runs is None:
                continue
            mine = [(a, z) for a, z, w in runs.pieces(e.offset, e.offset + e.size) if w in self.kept]
            if not mine:
                continue
            data = cap.read_payload(e.payload)
            for a, z in mine:
                entries.append((e.buffer, a, bytes(data[a - e.offset : z - e.offset])))
        if not entries:
            return None
        types = [
            t
            for t in op.types
            if any(b == t.buffer and lo <= t.offset and t.offset + t.size <= lo + len(d) for b, lo, d in entries)
        ]
        return _Check(op.name, entries, types)
