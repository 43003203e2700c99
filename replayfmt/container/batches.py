"""Record batches: gathering one as the writer appends (``OpenBatch``), and checking a decoded
RecordBatch against the index and building its operations (``decode_batch``, ``materialize``).

A batch stores operations column-wise by storage category (launches, copies, memsets, id-only
records as struct vectors; other kinds as tables). Decoding checks every count and range against
the index entry and the batch's own blocks, then builds model records in one pass per column.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import operator
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from replayfmt.container.distinct_rows import distinct_launches, distinct_rows
from replayfmt.container.event_uses import EventUses
from replayfmt.errors import ReplayFormatError
from replayfmt.format import model as m, records
from replayfmt.format.layout import Limits
from replayfmt.format.object_records import decode_objects
from replayfmt.format.payloads import payload_hash

_K = m.OperationKind
_LAUNCH, _MEMSET = int(_K.LAUNCH), int(_K.MEMSET)
_COPY_KINDS = {int(k): k for k in (_K.COPY_HOST_TO_DEVICE, _K.COPY_DEVICE_TO_HOST, _K.COPY_DEVICE_TO_DEVICE)}
_KNOWN_KINDS = {int(k) for k in _K if k != _K.NONE}
# storage category of each operation kind: 0 launch, 1 copy, 2 memset, 3 id-only records, 4 tables
_CATEGORY = np.full(256, 4, dtype=np.uint8)
_CATEGORY[_LAUNCH] = 0
_CATEGORY[list(_COPY_KINDS)] = 1
_CATEGORY[_MEMSET] = 2
_CATEGORY[[int(k) for k in records.ID_OPERATIONS]] = 3
_CATEGORIES = 5
_ID_OPERATIONS = {int(kind): entry for kind, entry in records.ID_OPERATIONS.items()}  # by kind code: no enum per record
_new_tuple = tuple.__new__
OPERATION_BYTES = 80  # what an operation's record counts for when a batch's size is judged for sealing
_EVENT_KINDS = np.array(
    [int(m.OperationKind.EVENT_RECORD), int(m.OperationKind.STREAM_WAIT_EVENT), int(m.OperationKind.EVENT_SYNCHRONIZE)],
    dtype=np.uint32,
)
RELOCATION_STRUCT = struct.Struct("<IIQQB7x")  # the schema's Relocation (a test checks the layouts agree)

ErrorAt = Callable[[str, str], ReplayFormatError]  # (message, record) -> the error, located in the file
_CREATE = int(_K.CREATE_OBJECT)


@dataclass(frozen=True, slots=True)
class BatchEntry:
    """What the index says of one record batch."""

    index: int
    offset: int
    first_operation: int
    operation_count: int
    first_object: int
    object_count: int
    first_payload: int
    payload_count: int


class PackedRelocations(dict):
    """Relocation sets (tuples) to their packed Relocation structs, worked out once per distinct
    set: launches of one kernel repeat them. Bounded: cleared when it reaches ``limit`` sets."""

    def __init__(self, limit: int = 4096) -> None:
        super().__init__()
        self.limit = limit
        self._last: tuple[Any, bytes] = ((), b"")

    def pack(self, relocations: tuple[Any, ...]) -> bytes:
        """The packed structs of ``relocations``: the caller's own tuple again is not even hashed,
        an unhashable set (holding lists) is packed every time."""
        last = self._last
        if relocations is last[0]:
            return last[1]
        try:
            packed = self[relocations]
        except TypeError:
            packed = pack_relocations(relocations)
        self._last = (relocations, packed)
        return packed

    def __missing__(self, relocations: tuple[Any, ...]) -> bytes:
        if len(self) >= self.limit:
            self.clear()
        packed = self[relocations] = pack_relocations(relocations)
        return packed


def pack_relocations(relocations: Iterable[Any]) -> bytes:
    return b"".join([RELOCATION_STRUCT.pack(*r) for r in relocations])


@dataclasses.dataclass(frozen=True)
class LaunchTemplate:
    """What a run of launches of ``CaptureWriter.launches`` shares: the function launched (an
    executable and its function index), its argument bytes and their relocations."""

    executable: int
    function: int
    parameters: bytes
    relocations: tuple[m.Relocation, ...] = ()


class OpenBatch:
    """Operations, objects and payload definitions the writer gathered since the last seal."""

    def __init__(self, first_operation: int, first_object: int, first_payload: int) -> None:
        self.first_operation = first_operation
        self.first_object = first_object
        self.first_payload = first_payload
        self.kinds = bytearray()
        self.launch_bytes = bytearray()  # packed LaunchRecord structs
        self.copies: list[tuple[int, ...]] = []
        self.memsets: list[tuple[int, ...]] = []
        self.id_operations = bytearray()  # packed IdOperationRecord structs
        self.table_ops: list[Any] = []
        self.relocation_bytes = bytearray()  # packed Relocation structs (32 bytes each)
        self.parameters = bytearray()
        self.objects: list[m.ObjectDef] = []
        self.payloads: list[tuple[bytes, int, int, tuple[bytes, ...]]] = []
        # (1.3) (operation, site_offset, target_offset, target_buffer, kind) of State and upload pointers
        self.data_relocations: list[tuple[int, int, int, int, int]] = []
        self.extra_bytes = 0
        self.started = time.monotonic()

    def __len__(self) -> int:
        return len(self.kinds)

    def estimated_bytes(self) -> int:
        """What the batch counts against ``batch_bytes``: its parameter bytes, a record's worth
        (:data:`OPERATION_BYTES`) per operation, and what stored pointers add."""
        return len(self.parameters) + OPERATION_BYTES * len(self.kinds) + self.extra_bytes

    def add_launches(
        self, templates: Sequence[LaunchTemplate], packed: Sequence[bytes], which: np.ndarray, shapes: np.ndarray
    ) -> int:
        """Append launch ``i`` as ``templates[which[i]]`` (its relocations packed in ``packed``)
        in the shape ``shapes[i]``: (stream, flags, grid x, y, z, block x, y, z, cluster x, y, z,
        shared memory), uint32. Returns how many were appended (all of them)."""
        n = len(which)
        sizes = np.array([len(t.parameters) for t in templates], dtype=np.int64)[which]
        counts = np.array([len(t.relocations) for t in templates], dtype=np.int64)[which]
        rows = np.empty((n, 18), dtype=np.uint32)  # LaunchRecord, as CaptureWriter.launch packs it
        rows[:, 0:2] = np.array([(t.executable, t.function) for t in templates], dtype=np.uint32).reshape(-1, 2)[which]
        rows[:, 2:14] = shapes
        rows[:, 14] = len(self.parameters) + np.cumsum(sizes) - sizes
        rows[:, 15] = sizes
        rows[:, 16] = len(self.relocation_bytes) // RELOCATION_STRUCT.size + np.cumsum(counts) - counts
        rows[:, 17] = counts
        listed = which.tolist()
        self.kinds += bytes([m.OperationKind.LAUNCH]) * n
        self.launch_bytes += rows.tobytes()
        self.parameters += b"".join([templates[i].parameters for i in listed])
        self.relocation_bytes += b"".join([packed[i] for i in listed])
        return n

    def empty(self) -> bool:
        return not self.kinds and not self.payloads

    def encode(self) -> bytes:
        dt = records.dtype
        return records.encode_record_batch(
            first_operation=self.first_operation,
            first_object=self.first_object,
            first_payload=self.first_payload,
            kinds=self.kinds,  # the batch is sealed: its buffers are no longer appended to
            launches=np.frombuffer(self.launch_bytes, dtype=dt("LaunchRecord")),
            copies=np.array(self.copies, dtype=dt("CopyRecord")),
            memsets=np.array(self.memsets, dtype=dt("MemsetRecord")),
            id_operations=np.frombuffer(self.id_operations, dtype=dt("IdOperationRecord")),
            table_ops=self.table_ops,
            relocations=np.frombuffer(self.relocation_bytes, dtype=dt("Relocation")),
            parameter_bytes=self.parameters,
            objects=self.objects,
            payloads=self.payloads,
            data_relocations=np.array(self.data_relocations, dtype=dt("DataRelocation")),
        )

    def add_data_relocations(self, operation: int, relocations: Iterable[m.Relocation]) -> None:
        """Pointers stored in the bytes operation ``operation`` (a State or an upload) writes."""
        rows = [(operation, r.site_offset, r.target_offset, r.target_buffer, int(r.kind)) for r in relocations]
        self.data_relocations += rows
        self.extra_bytes += 32 * len(rows)


class DecodedBatch:
    """One decoded, verified RecordBatch."""

    __slots__ = (
        "copies",
        "data_relocations",
        "first_object",
        "first_operation",
        "first_payload",
        "id_operations",
        "kinds",
        "launches",
        "memsets",
        "objects",
        "parameters",
        "payloads",
        "relocations",
        "table_ops",
    )

    def __init__(self, **fields: Any) -> None:
        for name, value in fields.items():
            setattr(self, name, value)


def decode_batch(d: dict[str, Any], entry: BatchEntry, limits: Limits, error: ErrorAt) -> DecodedBatch:
    """Check a decoded RecordBatch table against its index entry and turn its columns into arrays
    and model objects. ``error(message, record)`` makes the error for this batch's chunk."""
    record = f"record batch {entry.index}"

    def fail(message: str) -> ReplayFormatError:
        return error(message, record)

    kinds = d["operation_kinds"] if d["operation_kinds"] is not None else np.zeros(0, np.uint8)
    if (d["first_operation"], len(kinds)) != (entry.first_operation, entry.operation_count):
        raise fail("its operations disagree with the index")
    objects = d["objects"] or []
    payloads = d["payloads"] or []
    if (d["first_object"], len(objects)) != (entry.first_object, entry.object_count) or (
        d["first_payload"],
        len(payloads),
    ) != (entry.first_payload, entry.payload_count):
        raise fail("its objects or payloads disagree with the index")
    launches = records.struct_array(d["launches"], "LaunchRecord")
    copies = records.struct_array(d["copies"], "CopyRecord")
    memsets = records.struct_array(d["memsets"], "MemsetRecord")
    id_operations = records.struct_array(d["id_operations"], "IdOperationRecord")
    relocations = records.struct_array(d["relocations"], "Relocation")
    parameters = bytes(d["parameter_bytes"]) if d["parameter_bytes"] is not None else b""
    table_dicts = d["operations"] or []
    category = _CATEGORY[kinds]
    record_counts = (
        ("launch", len(launches)),
        ("copy", len(copies)),
        ("memset", len(memsets)),
        ("id-only", len(id_operations)),
        ("table", len(table_dicts)),
    )
    for cat, (name, have) in enumerate(record_counts):
        want = int(np.count_nonzero(category == cat))
        if want != have:
            raise fail(f"{want} {name} operations but {have} {name} records")
    if len(launches):
        param_end = launches["parameter_offset"].astype(np.uint64) + launches["parameter_size"]
        reloc_end = launches["relocation_first"].astype(np.uint64) + launches["relocation_count"]
        if int(param_end.max()) > len(parameters):
            raise fail("a launch's parameter bytes run past the batch's parameter block")
        if int(reloc_end.max()) > len(relocations):
            raise fail("a launch's relocations run past the batch's relocation table")
        most = int(launches["relocation_count"].max())
        if most > limits.max_launch_relocations:
            raise fail(
                f"a launch holds {most} relocations, over Limits.max_launch_relocations "
                f"({limits.max_launch_relocations})"
            )
        # each launch gets its own copy of its parameters and relocations: ranges that overlap
        # would amplify a small block into gigabytes (the writer never shares them)
        if int(launches["parameter_size"].astype(np.uint64).sum()) > len(parameters):
            raise fail("launches' parameter ranges overlap (they add up to more than the parameter block)")
        if int(launches["relocation_count"].astype(np.uint64).sum()) > len(relocations):
            raise fail("launches' relocation ranges overlap (they add up to more than the relocation table)")
    first = d["first_operation"]
    table_positions = np.flatnonzero(category == 4)
    data_relocations = _data_relocations(d.get("data_relocations"), first, kinds, fail)
    table_ops = []
    for pos, td in zip(table_positions.tolist(), table_dicts, strict=True):
        code = int(kinds[pos])
        op = records.decode_table_op(first + pos, code, td)
        if op is None:
            raise fail(f"operation {first + pos}: its kind {code} disagrees with its record")
        if code not in _KNOWN_KINDS and not isinstance(op, m.UnknownOperation):
            op = m.UnknownOperation(first + pos, code)
        elif isinstance(op, m.State) and op.index in data_relocations:
            op = dataclasses.replace(op, relocations=_sited(data_relocations[op.index], op.buffer))
        table_ops.append(op)
    decoded_objects = decode_objects(objects)
    expected = range(d["first_object"], d["first_object"] + len(decoded_objects))
    if decoded_objects.ids != list(expected):
        j = next(j for j, oid in enumerate(decoded_objects.ids) if oid != expected[j])
        raise fail(f"object {decoded_objects.ids[j]} is out of sequence (expected {expected[j]})")
    decoded_payloads = []
    for j, pd in enumerate(payloads):
        frames = records.struct_array(pd["frames"], "Hash128").tobytes()
        frame_hashes = tuple(frames[k : k + 16] for k in range(0, len(frames), 16))
        info = m.PayloadInfo(
            d["first_payload"] + j, pd["hash"] or bytes(16), pd["size"], pd["frame_size"], frame_hashes
        )
        check_payload(info, limits, error)
        decoded_payloads.append(info)
    return DecodedBatch(
        first_operation=first,
        kinds=kinds,
        launches=launches,
        copies=copies,
        memsets=memsets,
        id_operations=id_operations,
        table_ops=table_ops,
        relocations=relocations,
        parameters=parameters,
        objects=decoded_objects,
        payloads=decoded_payloads,
        first_object=d["first_object"],
        first_payload=d["first_payload"],
        data_relocations=data_relocations,
    )


# (site_offset, target_offset, target_buffer, kind) of one stored pointer, as decoded
_DataRow = tuple[int, int, int, int]


def _data_relocations(
    vector: Any, first: int, kinds: np.ndarray, fail: Callable[[str], ReplayFormatError]
) -> dict[int, list[_DataRow]]:
    """(1.3) A batch's data relocations by operation index, checked: each names a State or an
    upload of this batch, in order, with a pointer-aligned site."""
    rows = records.struct_array(vector, "DataRelocation")
    if not len(rows):
        return {}
    operations = rows["operation"].astype(np.int64)
    if bool((np.diff(operations) < 0).any()):
        raise fail("its data relocations are not in operation order")
    positions = operations - first
    if int(positions.min()) < 0 or int(positions.max()) >= len(kinds):
        raise fail("a data relocation names an operation outside the batch")
    bad = ~np.isin(kinds[positions], (int(_K.STATE), int(_K.COPY_HOST_TO_DEVICE)))
    if bool(bad.any()):
        where = int(operations[np.flatnonzero(bad)[0]])
        raise fail(f"a data relocation names operation {where}, which is neither a state nor an upload")
    if bool((rows["site_offset"] % 8 != 0).any()) or bool((rows["kind"] != int(m.RelocationKind.POINTER)).any()):
        raise fail("a data relocation is not an 8-byte-aligned pointer")
    out: dict[int, list[_DataRow]] = {}
    for op, site, target_offset, target, kind in rows.tolist():
        out.setdefault(op, []).append((site, target_offset, target, kind))
    return out


def _sited(rows: list[_DataRow], site_buffer: int) -> tuple[m.Relocation, ...]:
    return tuple(m.Relocation(site_buffer, t, s, o, m.RelocationKind(k)) for s, o, t, k in rows)


def check_payload(info: m.PayloadInfo, limits: Limits, error: ErrorAt) -> None:
    """A payload definition's sizes and frames are consistent, and its hash matches its frames."""
    record = f"payload {info.id}"
    if info.size > limits.max_payload_size:
        raise error(f"declares {info.size} bytes, over the limit of {limits.max_payload_size}", record)
    if info.size and not 0 < info.frame_size <= limits.max_frame_size:
        raise error(f"invalid frame size {info.frame_size}", record)
    expected_frames = -(-info.size // info.frame_size) if info.size else 0
    if len(info.frames) != expected_frames:
        raise error(f"{len(info.frames)} frames for {info.size} bytes (expected {expected_frames})", record)
    if payload_hash(info.size, info.frames) != info.hash:
        raise error("payload hash does not match its frames", record)


def materialize(b: DecodedBatch) -> list[m.Operation]:
    """Every operation of a decoded batch as model records, built column-wise."""
    first = b.first_operation
    category = _CATEGORY[b.kinds]
    counts = np.bincount(category, minlength=_CATEGORIES)
    # Records are made with tuple.__new__ through map(): one C call each, no Python frame.
    if counts[0]:
        positions = _positions(category, 0, first, len(category))
        launch_ops = _launches(b, positions)
        if counts[0] == len(category):
            return launch_ops  # a batch of launches only (the common case): nothing to interleave
    else:
        launch_ops = []
    copy_ops: list[m.Operation] = []
    if counts[1]:
        copy_kinds = [_COPY_KINDS[k] for k in b.kinds[category == 1].tolist()]
        copy_cols = (b.copies[name].tolist() for name in b.copies.dtype.names)
        rows = zip(_positions(category, 1, first, len(category)), copy_kinds, *copy_cols, repeat(()))
        copy_ops = list(map(_new_tuple, repeat(m.Copy), rows))
        if b.data_relocations:
            data = b.data_relocations
            copy_ops = [
                op._replace(relocations=_sited(data[op.index], op.dst_buffer)) if op.index in data else op
                for op in copy_ops
            ]
    memset_ops: list[m.Operation] = []
    if counts[2]:
        memset_cols = (b.memsets[name].tolist() for name in b.memsets.dtype.names)
        memset_ops = list(map(_new_tuple, repeat(m.Memset), zip(_positions(category, 2, first, 0), *memset_cols)))
    id_ops: list[m.Operation] = []
    order = category
    if counts[3]:
        id_ops = _id_operations(b, category)
        order = (category.astype(np.uint16) << 8) | np.where(category == 3, b.kinds, 0)
    # Interleave the categories back into capture order: the records laid end to end in category
    # order, then picked in capture order by one C call (itemgetter) from where each one landed.
    grouped = [*launch_ops, *copy_ops, *memset_ops, *id_ops, *b.table_ops]
    if len(grouped) < 2:
        return grouped
    landed = np.empty(len(category), np.int64)
    landed[np.argsort(order, kind="stable")] = np.arange(len(category))
    return list(operator.itemgetter(*landed.tolist())(grouped))


def _id_operations(b: DecodedBatch, category: np.ndarray) -> list[m.Operation]:
    """The batch's id-only operations, one map() per kind: ordered by kind code, then index."""
    id_ops: list[m.Operation] = []
    id_kinds = b.kinds[category == 3]
    id_positions = np.asarray(_positions(category, 3, b.first_operation, 0))
    for code in np.unique(id_kinds).tolist():
        cls, names = _ID_OPERATIONS[code]
        chosen = id_kinds == code
        columns = [id_positions[chosen].tolist(), b.id_operations["first"][chosen].tolist()]
        if len(names) == 2:
            columns.append(b.id_operations["second"][chosen].tolist())
        id_ops += map(cls, *columns)
    return id_ops


def distinct_operations(b: DecodedBatch) -> list[tuple[m.Operation | EventUses, int]]:
    """The batch's operations in capture order, each launch, copy, memset or id operation
    (synchronisation, module load, host function, graph launch) standing for itself and the later
    ones of the batch that equal it in everything but index (and, for a launch, the values of its
    parameters, not their length): ``(operation, how many it stands for)``. What a checker needs to
    look at once, without building a record per operation. The batch's creates come as its first
    one, standing for all of them (an object is checked when it is decoded, not where it is
    created); its uses of events as one ``EventUses`` at the first one's place (each use extends
    its event's span: none is folded). Never folded: table operations, uploads holding stored
    pointers; a batch that destroys an object is returned whole, each operation for itself (order
    matters there: a use after the destroy)."""
    category = _CATEGORY[b.kinds]
    if bool((b.kinds == int(_K.DESTROY_OBJECT)).any()):
        return [(op, 1) for op in materialize(b)]
    first = b.first_operation
    out: list[tuple[m.Operation | EventUses, int]] = [(op, 1) for op in b.table_ops]
    if len(b.id_operations):  # synchronisations, graph launches, creates: folded alike; events as columns
        id_kinds = b.kinds[category == 3].astype(np.uint32)
        id_positions = np.flatnonzero(category == 3) + first
        ones, twos = b.id_operations["first"], b.id_operations["second"]
        uses = np.isin(id_kinds, _EVENT_KINDS)
        if bool(uses.any()):
            events = EventUses.from_records(id_kinds[uses], id_positions[uses], ones[uses], twos[uses])
            out.append((events, len(events)))
        rest = ~uses
        id_kinds, id_positions, ones, twos = id_kinds[rest], id_positions[rest], ones[rest], twos[rest]
        # every create of the batch's own objects alike; any other (object 0, one of no batch) for itself
        own = (ones >= b.first_object) & (ones < b.first_object + len(b.objects))
        columns = [id_kinds, np.where((id_kinds == _CREATE) & own, 0xFFFFFFFF, ones), twos]
        keys = np.column_stack(columns).astype(np.uint32)
        js, n = distinct_rows(np.ascontiguousarray(keys))
        for code, index, one, two, count in zip(
            id_kinds[js].tolist(),
            id_positions[js].tolist(),
            ones[js].tolist(),
            twos[js].tolist(),
            n.tolist(),
            strict=True,
        ):
            cls, names = _ID_OPERATIONS[code]
            out.append((cls(index, one, two) if len(names) == 2 else cls(index, one), count))
    if len(b.launches):
        js, n = distinct_launches(b.launches, b.relocations)
        positions = np.flatnonzero(category == 0)[js] + first
        chosen = DecodedBatch(launches=b.launches[js], parameters=b.parameters, relocations=b.relocations)
        out += zip(_launches(chosen, positions.tolist()), n.tolist(), strict=True)
    if len(b.copies):
        copy_kinds = b.kinds[category == 1]
        if b.data_relocations:  # uploads holding stored pointers differ by them (1.3): none folded
            js, n = np.arange(len(b.copies)), np.ones(len(b.copies), dtype=np.int64)
        else:
            raw = b.copies.view(np.uint8).reshape(len(b.copies), b.copies.dtype.itemsize)
            js, n = distinct_rows(np.ascontiguousarray(np.hstack([raw, copy_kinds[:, None]])))
        positions = (np.flatnonzero(category == 1)[js] + first).tolist()
        kinds = [_COPY_KINDS[k] for k in copy_kinds[js].tolist()]
        rows = zip(positions, kinds, *(b.copies[name][js].tolist() for name in b.copies.dtype.names), repeat(()))
        copies = list(map(_new_tuple, repeat(m.Copy), rows))
        data = b.data_relocations
        if data:
            copies = [
                op._replace(relocations=_sited(data[op.index], op.dst_buffer)) if op.index in data else op
                for op in copies
            ]
        out += zip(copies, n.tolist(), strict=True)
    if len(b.memsets):
        raw = b.memsets.view(np.uint8).reshape(len(b.memsets), b.memsets.dtype.itemsize)
        js, n = distinct_rows(np.ascontiguousarray(raw))
        positions = (np.flatnonzero(category == 2)[js] + first).tolist()
        rows = zip(positions, *(b.memsets[name][js].tolist() for name in b.memsets.dtype.names))
        out += zip(map(_new_tuple, repeat(m.Memset), rows), n.tolist(), strict=True)
    out.sort(key=lambda item: item[0].index)
    return out


def _positions(category: np.ndarray, which: int, first: int, total: int) -> list[int] | range:
    """Operation indices of one storage category (a plain range when the batch is only that)."""
    if total and bool((category == which).all()):
        return range(first, first + total)
    return (np.flatnonzero(category == which) + first).tolist()


def _launches(b: DecodedBatch, positions: list[int] | range) -> list[m.Operation]:
    table = b.launches.view("<u4").reshape(-1, 18)
    executable, function, stream, flags, shared_memory, param_first = table[:, [0, 1, 2, 3, 13, 14]].T.tolist()
    params = b.parameters
    param_ends = (b.launches["parameter_offset"].astype(np.int64) + b.launches["parameter_size"]).tolist()
    param_slices = list(map(params.__getitem__, map(slice, param_first, param_ends)))
    # Launches of one kernel repeat their relocation sets: each distinct set (its packed bytes)
    # becomes one shared tuple of Relocations.
    size = RELOCATION_STRUCT.size
    rel_raw = b.relocations.tobytes()
    rel_first = b.launches["relocation_first"].astype(np.int64) * size
    rel_end = rel_first + b.launches["relocation_count"].astype(np.int64) * size
    keys = list(map(rel_raw.__getitem__, map(slice, rel_first.tolist(), rel_end.tolist())))
    groups = dict.fromkeys(keys)
    for key in groups:
        groups[key] = tuple(map(_new_tuple, repeat(m.Relocation), RELOCATION_STRUCT.iter_unpack(key)))
    rows = zip(
        positions,
        executable,
        function,
        stream,
        _shared_dims(table, 4),
        _shared_dims(table, 7),
        _shared_dims(table, 10),
        shared_memory,
        flags,
        param_slices,
        map(groups.__getitem__, keys),
    )
    return list(map(_new_tuple, repeat(m.Launch), rows))


def _shared_dims(launches: np.ndarray, first: int) -> Iterator[tuple[int, int, int]]:
    """The (x, y, z) tuples of three columns, one shared tuple per distinct value: a batch holds
    few distinct grids and blocks, and shared tuples are fewer objects to build and for the
    collector to walk."""
    x, y, z = (launches[:, first + i].astype(np.uint64) for i in range(3))
    if len(x) and int(max(y.max(), z.max())) < (1 << 16):  # CUDA's limits on y and z: one u64 key
        distinct, inverse = np.unique(x | (y << np.uint64(32)) | (z << np.uint64(48)), return_inverse=True)
        shared = [(k & 0xFFFFFFFF, (k >> 32) & 0xFFFF, k >> 48) for k in distinct.tolist()]
        return map(shared.__getitem__, inverse.ravel().tolist())
    dims = list(zip(x.tolist(), y.tolist(), z.tolist()))
    canonical = dict(zip(dims, dims))
    return map(canonical.__getitem__, dims)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic GC while a batch's operations are built.

    Building tens of thousands of small records that all stay alive (the batch cache holds them)
    makes the collector run full passes over the whole heap again and again: measured, it more
    than doubled the time to iterate a million launches. The records hold no cycles.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
