"""Model objects from a RecordBatch's decoded Object tables (replayfmt.format.decoder's values):
the reading half of the objects' records; replayfmt.format.records writes them."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from replayfmt.format import model as m
from replayfmt.format.graph_records import decode_graph
from replayfmt.format.object_columns import EventTable, ObjectList
from replayfmt.format.records import struct_array
from replayfmt.format.table_columns import TableRows, UnionColumn


def _dims(raw: bytes | None) -> m.Dims:
    return struct.unpack("<III", raw) if raw else (0, 0, 0)  # type: ignore[return-value]


def _enum(cls: type, value: int) -> Any:
    try:
        return cls(value)
    except ValueError:
        return value  # a newer writer's enum value: kept as a plain int


def decode_objects(rows: Sequence[dict[str, Any]]) -> ObjectList:
    """A RecordBatch's decoded objects, in order. Objects walked by column (TableRows) whose
    bodies are all of known kinds and which have no labels are made from the columns: events
    kept as columns (made into objects only when asked for), the rest one by one."""
    if not isinstance(rows, TableRows):
        return ObjectList.of([decode_object(d) for d in rows])
    ids, labels, bodies = rows.columns["id"], rows.columns["label"], rows.columns["body"]
    if not isinstance(ids, list) or not isinstance(bodies, UnionColumn) or bodies.absent or bodies.unknown:
        return ObjectList.of([decode_object(d) for d in rows])
    if any(labels):  # (the column walk leaves labelled tables to the table walk today)
        return ObjectList.of([decode_object(d) for d in rows])
    made: list[m.ObjectDef | None] = [None] * len(rows)
    events, positions = EventTable.empty(), []
    for name, (at, tables) in bodies.members.items():
        if name == "Event":
            devices, flags = tables.columns["device"], tables.columns["flags"]
            assert isinstance(devices, list) and isinstance(flags, list)  # scalars: plain columns
            # (not checked here: decode_batch checks every id in sequence, naming the batch)
            events, positions = EventTable([ids[k] for k in at], devices, flags, check=False), list(at)
            continue
        for k, body in zip(at, tables.rows(), strict=True):
            made[k] = decode_object({"id": ids[k], "label": "", "body": (name, body)})
    return ObjectList(made, ids, events, positions)


def decode_object(d: dict[str, Any]) -> m.ObjectDef:
    common = {"id": d["id"], "label": d["label"]}
    body = d["body"]
    if body is None:
        return m.UnknownObject(type_code=0, **common)
    member, v = body
    if member == "?":
        return m.UnknownObject(type_code=v, **common)
    if member == "Device":
        return m.Device(
            ordinal=v["ordinal"],
            name=v["name"],
            uuid=bytes(v["uuid"]) if v["uuid"] is not None else b"",
            compute_capability=(v["compute_capability_major"], v["compute_capability_minor"]),
            total_memory=v["total_memory"],
            driver_version=v["driver_version"],
            multiprocessor_count=v["multiprocessor_count"],
            **common,
        )
    if member == "Stream":
        return m.Stream(
            device=v["device"],
            priority=v["priority"],
            flags=v["flags"],
            captured_handle=v["captured_handle"],
            **common,
        )
    if member == "Event":
        return m.Event(device=v["device"], flags=v["flags"], **common)
    if member == "Buffer":
        return m.Buffer(
            size=v["size"],
            device=v["device"],
            alignment=v["alignment"],
            address=v["address"],
            memory=_enum(m.MemoryKind, v["memory"]),
            dtype=_enum(m.DType, v["dtype"]),
            shape=tuple(int(x) for x in v["shape"]) if v["shape"] is not None else (),
            strides=tuple(int(x) for x in v["strides"]) if v["strides"] is not None else (),
            element_offset=v["element_offset"],
            requires_fixed_address=v["requires_fixed_address"],
            ranges=tuple(
                m.TypedRange(o, s, _enum(m.DType, d))
                for o, s, d in struct_array(v.get("ranges"), "TypedRange").tolist()
            ),
            module_global=v.get("module_global", 0),
            **common,
        )
    if member == "Executable":
        return m.Executable(
            format=_enum(m.ExecutableFormat, v["format"]),
            target_arch=v["target_arch"],
            payload=v["payload"],
            file=v["file"],
            functions=tuple(_decode_function(f) for f in v["functions"] or ()),
            **common,
        )
    if member == "Global":
        return m.Global(
            executable=v["executable"],
            symbol=v["symbol"],
            size=v["size"],
            initial_payload=v["initial_payload"],
            **common,
        )
    if member == "FileReference":
        ranges = struct_array(v["ranges"], "FileRange").tolist()
        return m.FileReference(
            path=v["path"],
            size=v["size"],
            device=v["device"],
            inode=v["inode"],
            mtime_ns=v["mtime_ns"],
            digest=v["digest"] if v["has_digest"] and v["digest"] is not None else None,
            policy=_enum(m.FilePolicy, v["policy"]),
            validation=_enum(m.FileValidation, v["validation"]),
            ranges=tuple(m.FileRange(offset=o, size=s, payload=p) for o, s, p in ranges),
            payload=v["payload"],
            **common,
        )
    if member == "Graph":
        return decode_graph(v, common)
    raise AssertionError(member)  # every schema member is handled above


def _decode_function(v: dict[str, Any]) -> m.Function:
    return m.Function(
        name=v["name"],
        parameters=tuple(
            m.Parameter(
                offset=p["offset"],
                size=p["size"],
                kind=_enum(m.ParameterKind, p["kind"]),
                name=p["name"],
                dtype=_enum(m.DType, p["dtype"]),
            )
            for p in v["parameters"] or ()
        ),
        parameters_known=v["parameters_known"],
        registers=v["registers"],
        static_shared_memory=v["static_shared_memory"],
        max_dynamic_shared_memory=v["max_dynamic_shared_memory"],
        max_threads_per_block=v["max_threads_per_block"],
        local_memory=v["local_memory"],
        required_cluster=_dims(v["required_cluster"]),
    )
