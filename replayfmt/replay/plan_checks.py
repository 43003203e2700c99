"""Checks the plan makes across operations, beside the per-operation ones of ``plan``: object
lifetimes (nothing used after its DestroyObject), payloads whose frames the index promises (each
frame's chunk header read, nothing decompressed), whether a recovered capture kept any device
work, and what a replay goes on without (an invalid OPTIONAL TIMINGS chunk, dropped)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from replayfmt.errors import ReplayError, ReplayFormatError
from replayfmt.format import model as m, records
from replayfmt.format.cubin import CubinInfo
from replayfmt.format.object_columns import ObjectTable
from replayfmt.reader import Capture, EventUses

_K = m.OperationKind


class LiveObjects(Mapping[int, m.ObjectDef]):
    """The objects alive at the operation being checked: a DestroyObject takes its object out,
    and ``destroyed`` remembers by which operation (so that a later use is named as such).
    Events stay the capture's columns (ObjectTable.events): one is made into an object only
    where it is asked for, and the checks of their uses ask :meth:`is_event` or, a batch's in
    bulk, :meth:`all_events`."""

    def __init__(self, objects: ObjectTable) -> None:
        self._others = dict(objects.others)
        self._events = objects.events
        self._gone_events: set[int] = set()
        self.destroyed: dict[int, int] = {}
        self.highest = len(self._others) + len(self._events)  # object ids are dense from 1

    def __getitem__(self, oid: int) -> m.ObjectDef:
        obj = self.get(oid)
        if obj is None:
            raise KeyError(oid)
        return obj

    def get(self, oid: int, default: Any = None) -> Any:
        obj = self._others.get(oid)
        if obj is not None:
            return obj
        return self._events[oid] if self.is_event(oid) else default

    def __contains__(self, oid: object) -> bool:
        return oid in self._others or self.is_event(oid)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[int]:
        yield from self._others
        yield from (eid for eid in self._events if eid not in self._gone_events)

    def __len__(self) -> int:
        return len(self._others) + len(self._events) - len(self._gone_events)

    def is_event(self, oid: int) -> bool:
        """Whether ``oid`` is a live event."""
        return oid in self._events and oid not in self._gone_events

    def is_stream(self, oid: int) -> bool:
        """Whether ``oid`` is a live stream."""
        return type(self._others.get(oid)) is m.Stream

    def all_events(self, oids: np.ndarray) -> bool:
        """Whether every one of ``oids`` is a live event."""
        if not bool(self._events.holds(oids).all()):
            return False
        return not self._gone_events or self._gone_events.isdisjoint(oids.tolist())

    def destroy(self, op: m.DestroyObject) -> None:
        """Apply a DestroyObject; ReplayFormatError when its object does not exist or is gone."""
        if op.object in self.destroyed:
            raise ReplayFormatError(
                f"operation {op.index} (destroy): object {op.object} was destroyed already by operation "
                f"{self.destroyed[op.object]}"
            )
        if op.object not in self:
            raise ReplayFormatError(f"operation {op.index} (destroy): object {op.object} does not exist")
        if self._others.pop(op.object, None) is None:
            self._gone_events.add(op.object)
        self.destroyed[op.object] = op.index

    def missing(self, oid: int) -> str:
        """Why ``oid`` is not here, for a message."""
        gone = self.destroyed.get(oid)
        return f"object {oid} was destroyed by operation {gone}" if gone is not None else f"object {oid} does not exist"


def check_graph_lifetimes(live: LiveObjects, op: m.GraphLaunch, used: set[int]) -> None:
    """A graph launch after a buffer, event or child graph its nodes use was destroyed."""
    gone = sorted(oid for oid in used if oid in live.destroyed)
    if gone:
        raise ReplayFormatError(
            f"operation {op.index} (graph_launch): graph {op.graph} uses object {gone[0]}, destroyed by "
            f"operation {live.destroyed[gone[0]]}"
        )


_SHARERS_NAMED = 4  # payloads named as sharing a damaged frame
_SHARER_FRAMES_LOOKED = 1 << 20  # frame digests looked at to find them


class FrameChecks:
    """Each payload an operation uses, checked once: its frames are where the index says and,
    when ``verify`` (the GPU-less verdicts: dump-replay's and the dry run's), every distinct frame
    is read, decompressed and checked against its XXH3 hash as the replay's staging reads it (one
    frame in memory at a time), so that a damaged payload is named before any GPU is asked for.
    Payloads share frames (equal frames are stored once): a damaged frame is read once, and every
    payload checked that uses it is named, each with its own frame number."""

    def __init__(self, capture: Capture, *, verify: bool = False) -> None:
        self.capture = capture
        self.verify = verify
        self.checked: set[int] = set()
        self.verified_bytes = 0  # logical bytes read and hashed (each distinct frame once)
        self._good: set[bytes] = set()  # frames read and found intact
        self._damaged: dict[bytes, tuple[str, ReplayFormatError]] = {}  # frame -> (its first user, why)
        self._scratch = bytearray()

    def check(self, op: m.Operation | None, payload: int, what: str = "") -> None:
        """``payload``, used by ``op`` (or by the object ``what`` names): ReplayFormatError naming
        both, the frame and its offset, when a frame is missing, misplaced or (``verify``) damaged."""
        if payload in self.checked or not 1 <= payload <= self.capture.payload_count:
            return  # a missing payload is the operation's own check
        self.checked.add(payload)
        user = f"operation {op.index} ({op.kind.label})" if op is not None else what
        try:
            self.capture.check_frames(payload)
            if self.verify:
                self._verify(payload)
        except ReplayFormatError as exc:
            raise ReplayFormatError(f"{user} uses payload {payload}: {exc}") from None

    def _verify(self, payload: int) -> None:
        info = self.capture.payload(payload)
        last = len(info.frames) - 1
        for k, digest in enumerate(info.frames):
            record = f"payload {payload} frame {k}"
            if digest in self._damaged:
                first, exc = self._damaged[digest]
                raise ReplayFormatError(
                    f"{exc.message} (the frame is stored once, and {first} uses it too)",
                    path=exc.path,
                    offset=exc.offset,
                    record=record,
                )
            if digest in self._good and k != last:  # a deduplicated frame is the same bytes: read once
                continue
            size = min(info.frame_size, info.size - k * info.frame_size)
            if len(self._scratch) < size:
                self._scratch = bytearray(size)
            try:
                self.capture.read_frame_into(payload, k, memoryview(self._scratch)[:size], check=True)
            except ReplayFormatError as exc:
                self._damaged[digest] = (record, exc)
                also = self._sharers(digest, payload)
                if not also:
                    raise
                verb = "uses" if len(also) == 1 else "use"
                raise ReplayFormatError(
                    f"{exc.message} (the frame is stored once: {', '.join(also)} {verb} it too)",
                    path=exc.path,
                    offset=exc.offset,
                    record=exc.record,
                ) from None
            self._good.add(digest)
            self.verified_bytes += size

    def _sharers(self, digest: bytes, payload: int) -> list[str]:
        """The other payloads whose frames include ``digest`` (each by its first such frame), the
        first few named: a bounded look, the failure path only."""
        names: list[str] = []
        looked = 0
        for info in self.capture.payloads():
            looked += len(info.frames)
            if info.id != payload and digest in info.frames:
                names.append(f"payload {info.id} frame {info.frames.index(digest)}")
            if len(names) > _SHARERS_NAMED or looked > _SHARER_FRAMES_LOOKED:
                return [*names[:_SHARERS_NAMED], "maybe others"]
        return names


def object_payload_uses(objects: Mapping[int, m.ObjectDef]) -> Iterator[tuple[str, int]]:
    """(who, payload) for each payload an object brings into a replay: an executable's image, a
    global's initial bytes, a file's captured bytes."""
    for oid, obj in objects.items():
        if isinstance(obj, m.Executable) and obj.payload:
            yield f"executable {oid}", obj.payload
        elif isinstance(obj, m.Global) and obj.initial_payload:
            yield f"global {oid} ({obj.symbol})", obj.initial_payload
        elif isinstance(obj, m.FileReference):
            if obj.payload:
                yield f"file reference {oid}", obj.payload
            for r in obj.ranges:
                yield f"file reference {oid}", r.payload


def check_object_payloads(
    capture: Capture, objects: Mapping[int, m.ObjectDef], frames: FrameChecks, fail: Callable[[ReplayError], None]
) -> None:
    """Each payload an object names exists, and its frames are in the file (verified with
    ``frames.verify``): a replay reads them all when it loads modules, globals and files."""
    for who, payload in object_payload_uses(objects):
        if not 1 <= payload <= capture.payload_count:
            fail(
                ReplayFormatError(
                    f"{who}: its payload {payload} does not exist (the capture has {capture.payload_count})"
                )
            )
            continue
        try:
            frames.check(None, payload, who)
        except ReplayError as exc:
            fail(exc)


def check_global_symbol(
    gid: int, glob: m.Global, cubin: CubinInfo | None, source: str, fail: Callable[[ReplayError], None]
) -> None:
    """A module global's symbol must be defined by the executable's image, at least as large as
    captured (docs/FORMAT.md, module globals); an image that is no readable cubin, or has no symbol
    table, is the driver's to judge at load, and so is the size of a symbol in a section that is
    not one of the variables' (``cubin.module_variables``)."""
    if cubin is None or not cubin.symbols:
        return
    sizes = {v.name: v.size for v in cubin.variables}
    have = sizes.get(glob.symbol)
    if glob.symbol not in cubin.symbols:
        fail(
            ReplayFormatError(
                f"global {gid}: executable {glob.executable} ({source}) defines no symbol {glob.symbol!r}"
            )
        )
    elif have is not None and have < glob.size:
        fail(
            ReplayFormatError(
                f"global {gid} ({glob.symbol}): {glob.size} bytes captured, but executable {glob.executable} "
                f"({source}) defines it with {have}"
            )
        )


def device_work_problem(capture: Capture, counts: dict[str, int]) -> str | None:
    """Why a recovered capture is not replayable work: nothing survived, or nothing that runs on
    a device (a launch, graph launch, copy or memset); None otherwise. dump-replay and run-replay
    --dry-run say it in these words."""
    if not capture.recovered:
        return None
    work = sum(n for label, n in counts.items() if label in {k.label for k in m.DEVICE_WORK})
    if work:
        return None
    kept = (
        f"none of the {capture.operation_count} operations that survived is device work "
        "(a launch, graph launch, copy or memset)"
        if capture.operation_count
        else "no operation survived"
    )
    return (
        f"the file was recovered and {kept} ({capture.discarded_bytes} bytes at its end were discarded): "
        "not replayable as captured"
    )


def plan_warnings(capture: Capture) -> list[str]:
    """What a replay goes on without: an invalid OPTIONAL TIMINGS chunk, dropped."""
    problem = capture.check_original_times()
    return [problem] if problem else []


_ID_FIELDS: dict[type, tuple[str, ...]] = {
    cls: names
    for kind, (cls, names) in records.ID_OPERATIONS.items()
    if kind not in (_K.CREATE_OBJECT, _K.DESTROY_OBJECT)
}


def repeat_key(op: m.Operation) -> tuple[object, ...] | None:
    """What an operation is checked on, all but its index (of a launch's parameters, only their
    length is checked), so that the plan checks a repeat once; None for operations checked every
    time (table operations: state, checkpoints, scopes; objects created and destroyed; uploads
    holding stored pointers)."""
    cls = type(op)
    if cls is m.Launch:
        return (*op[1:9], len(op.parameters), op.relocations)
    if cls is m.Copy and op.relocations:
        return None  # an upload holding stored pointers is staged for itself (plan.upload_key): checked each time
    if cls is m.Copy or cls is m.Memset:
        return (op.kind, *op[1:])
    names = _ID_FIELDS.get(cls)  # events, synchronisations, module loads, graph launches
    return None if names is None else (cls, *(getattr(op, n) for n in names))


def _event_and_stream(live: LiveObjects, op: m.EventRecord | m.StreamWaitEvent) -> bool:
    return live.is_event(op.event) and (not op.stream or live.is_stream(op.stream))


def event_uses_pass(live: LiveObjects, uses: EventUses) -> bool:
    """The quick checks of a batch's uses of events, in bulk: True when every one passes (each
    event distinct and live, each record's and wait's stream too); False sends each down the
    general path (plan._check_operation), which names the one that fails."""
    if not live.all_events(np.unique(uses.events)):
        return False
    on = set(uses.streams[uses.kinds != int(_K.EVENT_SYNCHRONIZE)].tolist())
    on.discard(0)  # the legacy default stream
    return all(map(live.is_stream, on))


# The checks of the most numerous operations (a program may create and record an event per
# launch), taken on their own before the general path: True when the operation passes; False sends
# it down the general path (plan._check_operation), which names what is wrong.
QUICK_CHECKS: dict[type, Callable[[LiveObjects, Any], bool]] = {
    m.CreateObject: lambda live, op: 0 < op.object <= live.highest,  # object 0, or one no batch defines: named
    m.DeviceSynchronize: lambda live, op: True,
    m.EventRecord: _event_and_stream,
    m.StreamWaitEvent: _event_and_stream,
    m.EventSynchronize: lambda live, op: live.is_event(op.event),
    m.StreamSynchronize: lambda live, op: not op.stream or live.is_stream(op.stream),
}


def payloads_of(op: m.Operation) -> tuple[int, ...]:
    """The payloads an operation reads (their frames are checked once each)."""
    if isinstance(op, m.State) or (isinstance(op, m.Copy) and op.kind == _K.COPY_HOST_TO_DEVICE and not op.src_file):
        return (op.payload,)
    if isinstance(op, m.Checkpoint):
        return tuple(e.payload for e in op.entries)
    if isinstance(op, m.Collective) and op.received:
        return (op.received,)
    return ()


def unfolded(capture: Capture, each: bool) -> Iterator[tuple[m.Operation | EventUses, int]]:
    """The capture's operations with repeats folded and uses of events as columns
    (``Capture.distinct_operations``), or ``each`` standing for itself (when --launch overrides
    some by index)."""
    if each:
        return ((op, 1) for op in capture.iter_operations())
    return capture.distinct_operations()


def need(objects: Mapping[int, m.ObjectDef], oid: int, cls: type, op: m.Operation, role: str) -> m.ObjectDef:
    obj = objects.get(oid)
    if not isinstance(obj, cls):
        missing = objects.missing(oid) if isinstance(objects, LiveObjects) else f"object {oid} does not exist"
        what = f"object {oid} is a {obj.kind.label}" if obj is not None else missing
        raise ReplayFormatError(
            f"operation {op.index} ({op.kind.label}): its {role} {what}, not a {cls.__name__.lower()}"
        )
    return obj


def check_data_relocations(
    objects: Mapping[int, m.ObjectDef], op: m.Operation, relocations: tuple[m.Relocation, ...], offset: int, size: int
) -> None:
    """(1.3) Each pointer stored in the bytes ``op`` writes lies inside them and points into a buffer."""
    for r in relocations:
        if not offset <= r.site_offset <= offset + size - 8:
            raise ReplayFormatError(
                f"operation {op.index} ({op.kind.label}): a stored pointer at byte {r.site_offset} lies outside "
                f"the range [{offset}, {offset + size}) it writes"
            )
        target = need(objects, r.target_buffer, m.Buffer, op, "stored pointer's target")
        if r.target_offset > target.size:
            raise ReplayFormatError(
                f"operation {op.index} ({op.kind.label}): a stored pointer at byte {r.site_offset} points "
                f"{r.target_offset} bytes into buffer {target.id} ({target.size} bytes)"
            )


def check_range(op: m.Operation, buffer: m.Buffer, offset: int, size: int, role: str) -> None:
    if offset < 0 or size < 0 or offset + size > buffer.size:
        raise ReplayFormatError(
            f"operation {op.index} ({op.kind.label}): {role} range [{offset}, {offset + size}) lies outside "
            f"buffer {buffer.id} ({buffer.size} bytes)"
        )


def check_flags(op: m.Operation, flags: int, known: int, what: str) -> None:
    """Flag bits this replayfmt does not know (a newer writer's) are refused by number: what they
    ask of a replay is unknown here."""
    if flags & ~known:
        raise ReplayFormatError(
            f"operation {op.index} ({what}): unknown flags {flags & ~known:#x} (a newer writer's?): upgrade replayfmt"
        )
