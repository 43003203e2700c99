"""Translation between the model types (replayfmt.format.model) and FlatBuffers records, both ways
(objects are read back in replayfmt.format.object_records).

Encoding goes through the generated builders in replayfmt/fb; decoding takes the plain values
that the verifying decoder (replayfmt.format.decoder) produced. The hot operation kinds are numpy
structured arrays whose dtypes come straight from the schema's struct layouts.
"""

from __future__ import annotations

import functools
import struct
from typing import Any

import flatbuffers
import numpy as np

from replayfmt.format import model as m
from replayfmt.format.decoder import StructVector
from replayfmt.format.generated import fb
from replayfmt.format.graph_records import encode_graph
from replayfmt.format.schema import load_schema
from replayfmt.format.typed_records import decode_typed_tensor, encode_typed_tensor


@functools.cache
def dtype(struct_name: str) -> np.dtype:
    """numpy dtype of a schema struct (e.g. ``dtype("LaunchRecord")``)."""
    return load_schema().numpy_dtype(struct_name)


def struct_array(vector: StructVector | None, struct_name: str) -> np.ndarray:
    """A decoded struct vector as a numpy structured array (empty when absent)."""
    if vector is None:
        return np.zeros(0, dtype=dtype(struct_name))
    return vector.to_numpy(dtype(struct_name))


# ------------------------------------------------------------------------------------------
# Encoding helpers


def _struct_vector(builder: flatbuffers.Builder, struct_name: str, array: np.ndarray) -> int:
    """Write a numpy structured array as a FlatBuffers vector of structs (one memcpy)."""
    layout = load_schema().structs[struct_name]
    data = memoryview(np.ascontiguousarray(array).view(np.uint8)) if len(array) else b""
    builder.StartVector(layout.size, len(array), layout.alignment)
    builder.head -= len(data)
    builder.Bytes[builder.head : builder.head + len(data)] = data
    return builder.EndVector()


def _ubyte_vector(builder: flatbuffers.Builder, data: bytes | bytearray | memoryview) -> int:
    return builder.CreateByteVector(data if isinstance(data, (bytes, bytearray)) else bytes(data))


def _string(builder: flatbuffers.Builder, text: str) -> int:
    return builder.CreateString(text)


def _hash_struct(builder: flatbuffers.Builder, digest: bytes) -> int:
    lo, hi = struct.unpack("<QQ", digest)
    builder.Prep(8, 16)
    builder.PrependUint64(hi)
    builder.PrependUint64(lo)
    return builder.Offset()


def _hash_vector(builder: flatbuffers.Builder, digests: list[bytes] | tuple[bytes, ...]) -> int:
    array = np.frombuffer(b"".join(digests), dtype=dtype("Hash128"))
    return _struct_vector(builder, "Hash128", array)


def _table_vector(builder: flatbuffers.Builder, offsets: list[int]) -> int:
    builder.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        builder.PrependUOffsetTRelative(off)
    return builder.EndVector()


def _int64_vector(builder: flatbuffers.Builder, values: tuple[int, ...]) -> int:
    return builder.CreateNumpyVector(np.asarray(values, dtype="<i8"))


def encode_metadata(meta: m.CaptureMetadata) -> bytes:
    b = flatbuffers.Builder(1024)
    strings = {name: _string(b, getattr(meta, name)) for name in ("tool", "tool_version", "host", "gpu", "driver")}
    command_line = _table_vector(b, [_string(b, arg) for arg in meta.command_line])
    pairs = []
    for key, value in meta.properties:
        k, v = _string(b, key), _string(b, value)
        fb.KeyValue.Start(b)
        fb.KeyValue.AddKey(b, k)
        fb.KeyValue.AddValue(b, v)
        pairs.append(fb.KeyValue.End(b))
    properties = _table_vector(b, pairs)
    fb.CaptureMetadata.Start(b)
    fb.CaptureMetadata.AddTool(b, strings["tool"])
    fb.CaptureMetadata.AddToolVersion(b, strings["tool_version"])
    fb.CaptureMetadata.AddCreatedUnixNs(b, meta.created_unix_ns)
    fb.CaptureMetadata.AddHost(b, strings["host"])
    fb.CaptureMetadata.AddGpu(b, strings["gpu"])
    fb.CaptureMetadata.AddDriver(b, strings["driver"])
    fb.CaptureMetadata.AddCommandLine(b, command_line)
    fb.CaptureMetadata.AddProperties(b, properties)
    b.Finish(fb.CaptureMetadata.End(b))
    return bytes(b.Output())


def decode_metadata(d: dict[str, Any]) -> m.CaptureMetadata:
    return m.CaptureMetadata(
        tool=d["tool"],
        tool_version=d["tool_version"],
        created_unix_ns=d["created_unix_ns"],
        host=d["host"],
        gpu=d["gpu"],
        driver=d["driver"],
        command_line=tuple(d["command_line"] or ()),
        properties=tuple((kv["key"], kv["value"]) for kv in d["properties"] or ()),
    )


# ------------------------------------------------------------------------------------------
# Objects


def _encode_function(b: flatbuffers.Builder, fn: m.Function) -> int:
    name = _string(b, fn.name)
    params = []
    for p in fn.parameters:
        pname = _string(b, p.name) if p.name else 0
        fb.Parameter.Start(b)
        fb.Parameter.AddOffset(b, p.offset)
        fb.Parameter.AddSize(b, p.size)
        fb.Parameter.AddKind(b, int(p.kind))
        if pname:
            fb.Parameter.AddName(b, pname)
        fb.Parameter.AddDtype(b, int(p.dtype))
        params.append(fb.Parameter.End(b))
    param_vec = _table_vector(b, params)
    fb.Function.Start(b)
    fb.Function.AddName(b, name)
    fb.Function.AddParameters(b, param_vec)
    fb.Function.AddRegisters(b, fn.registers)
    fb.Function.AddStaticSharedMemory(b, fn.static_shared_memory)
    fb.Function.AddMaxDynamicSharedMemory(b, fn.max_dynamic_shared_memory)
    fb.Function.AddMaxThreadsPerBlock(b, fn.max_threads_per_block)
    fb.Function.AddLocalMemory(b, fn.local_memory)
    fb.Function.AddRequiredCluster(b, fb.KernelDims.CreateKernelDims(b, *fn.required_cluster))
    fb.Function.AddParametersKnown(b, fn.parameters_known)
    return fb.Function.End(b)


def _encode_body(b: flatbuffers.Builder, obj: m.ObjectDef) -> int:
    if isinstance(obj, m.Device):
        name = _string(b, obj.name)
        uuid = _ubyte_vector(b, obj.uuid)
        fb.Device.Start(b)
        fb.Device.AddOrdinal(b, obj.ordinal)
        fb.Device.AddName(b, name)
        fb.Device.AddUuid(b, uuid)
        fb.Device.AddComputeCapabilityMajor(b, obj.compute_capability[0])
        fb.Device.AddComputeCapabilityMinor(b, obj.compute_capability[1])
        fb.Device.AddTotalMemory(b, obj.total_memory)
        fb.Device.AddDriverVersion(b, obj.driver_version)
        fb.Device.AddMultiprocessorCount(b, obj.multiprocessor_count)
        return fb.Device.End(b)
    if isinstance(obj, m.Stream):
        fb.Stream.Start(b)
        fb.Stream.AddDevice(b, obj.device)
        fb.Stream.AddPriority(b, obj.priority)
        fb.Stream.AddFlags(b, obj.flags)
        fb.Stream.AddCapturedHandle(b, obj.captured_handle)
        return fb.Stream.End(b)
    if isinstance(obj, m.Event):
        fb.Event.Start(b)
        fb.Event.AddDevice(b, obj.device)
        fb.Event.AddFlags(b, obj.flags)
        return fb.Event.End(b)
    if isinstance(obj, m.Buffer):
        shape = _int64_vector(b, obj.shape) if obj.shape else 0
        strides = _int64_vector(b, obj.strides) if obj.strides else 0
        ranges = 0
        if obj.ranges:
            array = np.array([(r.offset, r.size, int(r.dtype)) for r in obj.ranges], dtype=dtype("TypedRange"))
            ranges = _struct_vector(b, "TypedRange", array)
        fb.Buffer.Start(b)
        fb.Buffer.AddDevice(b, obj.device)
        fb.Buffer.AddSize(b, obj.size)
        fb.Buffer.AddAlignment(b, obj.alignment)
        fb.Buffer.AddAddress(b, obj.address)
        fb.Buffer.AddMemory(b, int(obj.memory))
        fb.Buffer.AddDtype(b, int(obj.dtype))
        if shape:
            fb.Buffer.AddShape(b, shape)
        if strides:
            fb.Buffer.AddStrides(b, strides)
        fb.Buffer.AddElementOffset(b, obj.element_offset)
        fb.Buffer.AddRequiresFixedAddress(b, obj.requires_fixed_address)
        if ranges:
            fb.Buffer.AddRanges(b, ranges)
        fb.Buffer.AddModuleGlobal(b, obj.module_global)  # (a default is not written: 1.3 readers see none)
        return fb.Buffer.End(b)
    if isinstance(obj, m.Executable):
        arch = _string(b, obj.target_arch)
        functions = _table_vector(b, [_encode_function(b, fn) for fn in obj.functions])
        fb.Executable.Start(b)
        fb.Executable.AddFormat(b, int(obj.format))
        fb.Executable.AddTargetArch(b, arch)
        fb.Executable.AddPayload(b, obj.payload)
        fb.Executable.AddFile(b, obj.file)
        fb.Executable.AddFunctions(b, functions)
        return fb.Executable.End(b)
    if isinstance(obj, m.Global):
        symbol = _string(b, obj.symbol)
        fb.Global.Start(b)
        fb.Global.AddExecutable(b, obj.executable)
        fb.Global.AddSymbol(b, symbol)
        fb.Global.AddSize(b, obj.size)
        fb.Global.AddInitialPayload(b, obj.initial_payload)
        return fb.Global.End(b)
    if isinstance(obj, m.FileReference):
        path = _string(b, obj.path)
        ranges = 0
        if obj.ranges:
            array = np.array([(r.offset, r.size, r.payload) for r in obj.ranges], dtype=dtype("FileRange"))
            ranges = _struct_vector(b, "FileRange", array)
        fb.FileReference.Start(b)
        fb.FileReference.AddPath(b, path)
        fb.FileReference.AddSize(b, obj.size)
        fb.FileReference.AddDevice(b, obj.device)
        fb.FileReference.AddInode(b, obj.inode)
        fb.FileReference.AddMtimeNs(b, obj.mtime_ns)
        if obj.digest is not None:
            fb.FileReference.AddDigest(b, _hash_struct(b, obj.digest))
        fb.FileReference.AddHasDigest(b, obj.digest is not None)
        fb.FileReference.AddPolicy(b, int(obj.policy))
        fb.FileReference.AddValidation(b, int(obj.validation))
        if ranges:
            fb.FileReference.AddRanges(b, ranges)
        fb.FileReference.AddPayload(b, obj.payload)
        return fb.FileReference.End(b)
    if isinstance(obj, m.Graph):
        return encode_graph(b, obj)
    raise TypeError(f"cannot encode object of type {type(obj).__name__}")


def encode_object(b: flatbuffers.Builder, obj: m.ObjectDef) -> int:
    body = _encode_body(b, obj)
    label = _string(b, obj.label) if obj.label else 0
    fb.Object.Start(b)
    fb.Object.AddId(b, obj.id)
    if label:
        fb.Object.AddLabel(b, label)
    fb.Object.AddBodyType(b, int(obj.kind))
    fb.Object.AddBody(b, body)
    return fb.Object.End(b)


# ------------------------------------------------------------------------------------------
# Table operations (every kind but launch, copy and memset)

_K = m.OperationKind
# The id-only kinds, stored as IdOperationRecord(first, second): kind -> (model class, field names).
ID_OPERATIONS: dict[m.OperationKind, tuple[type, tuple[str, ...]]] = {
    _K.CREATE_OBJECT: (m.CreateObject, ("object",)),
    _K.DESTROY_OBJECT: (m.DestroyObject, ("object",)),
    _K.MODULE_LOAD: (m.ModuleLoad, ("executable", "device")),
    _K.EVENT_RECORD: (m.EventRecord, ("event", "stream")),
    _K.STREAM_WAIT_EVENT: (m.StreamWaitEvent, ("stream", "event")),
    _K.STREAM_SYNCHRONIZE: (m.StreamSynchronize, ("stream",)),
    _K.DEVICE_SYNCHRONIZE: (m.DeviceSynchronize, ("device",)),
    _K.EVENT_SYNCHRONIZE: (m.EventSynchronize, ("event",)),
    _K.HOST_FUNCTION: (m.HostFunction, ("stream",)),
    _K.GRAPH_LAUNCH: (m.GraphLaunch, ("graph", "stream")),
}
# The kinds stored as Operation tables, and their union member names (a test checks the schema).
UNION_MEMBER_OF_KIND: dict[m.OperationKind, str] = {
    _K.SCOPE_BEGIN: "ScopeBegin",
    _K.SCOPE_END: "ScopeEnd",
    _K.CHECKPOINT: "Checkpoint",
    _K.UNSUPPORTED: "Unsupported",
    _K.STATE: "State",
    _K.COLLECTIVE: "Collective",
}
KIND_OF_UNION_MEMBER = {member: kind for kind, member in UNION_MEMBER_OF_KIND.items()}
STRUCT_KINDS = frozenset(
    {_K.LAUNCH, _K.COPY_HOST_TO_DEVICE, _K.COPY_DEVICE_TO_HOST, _K.COPY_DEVICE_TO_DEVICE, _K.MEMSET, *ID_OPERATIONS}
)


def id_operation_fields(op: Any) -> tuple[int, int]:
    """(first, second) of an id-only operation."""
    names = ID_OPERATIONS[op.kind][1]
    values = [getattr(op, n) for n in names]
    return values[0], values[1] if len(values) > 1 else 0


def _union_code(kind: m.OperationKind) -> int:
    return load_schema().unions["OperationBody"].index(UNION_MEMBER_OF_KIND[kind]) + 1


def encode_table_op(b: flatbuffers.Builder, op: Any) -> int:
    """Encode one scope, checkpoint or unsupported operation as an Operation table."""
    kind = op.kind
    if kind in (_K.SCOPE_BEGIN, _K.SCOPE_END):
        module = fb.ScopeBegin if kind == _K.SCOPE_BEGIN else fb.ScopeEnd
        name = _string(b, op.name)
        module.Start(b)
        module.AddName(b, name)
        body = module.End(b)
    elif kind == _K.CHECKPOINT:
        name = _string(b, op.name)
        array = np.array([tuple(e) for e in op.entries], dtype=dtype("CheckpointEntry"))
        entries = _struct_vector(b, "CheckpointEntry", array)
        types = _table_vector(b, [encode_typed_tensor(b, t) for t in op.types]) if op.types else 0
        fb.Checkpoint.Start(b)
        fb.Checkpoint.AddName(b, name)
        fb.Checkpoint.AddEntries(b, entries)
        if types:
            fb.Checkpoint.AddTypes(b, types)
        body = fb.Checkpoint.End(b)
    elif kind == _K.STATE:
        fb.State.Start(b)
        fb.State.AddBuffer(b, op.buffer)
        fb.State.AddPayload(b, op.payload)
        fb.State.AddOffset(b, op.offset)
        fb.State.AddSize(b, op.size)
        if op.flags:
            fb.State.AddFlags(b, op.flags)
        body = fb.State.End(b)
    elif kind == _K.COLLECTIVE:
        body = _encode_collective(b, op)
    elif kind == _K.UNSUPPORTED:
        call, reason = _string(b, op.call), _string(b, op.reason)
        fb.Unsupported.Start(b)
        fb.Unsupported.AddCall(b, call)
        fb.Unsupported.AddReason(b, reason)
        fb.Unsupported.AddStream(b, op.stream)
        body = fb.Unsupported.End(b)
    else:
        raise TypeError(f"{kind!r} is not a table operation")
    fb.Operation.Start(b)
    fb.Operation.AddBodyType(b, _union_code(kind))
    fb.Operation.AddBody(b, body)
    return fb.Operation.End(b)


def _encode_collective(b: flatbuffers.Builder, op: m.Collective) -> int:
    communicator = _string(b, op.communicator)
    c = fb.Collective
    c.Start(b)
    c.AddOperation(b, int(op.operation))
    c.AddDatatype(b, op.datatype)
    c.AddReduction(b, op.reduction)
    c.AddStream(b, op.stream)
    c.AddCount(b, op.count)
    c.AddRoot(b, op.root)
    c.AddRanks(b, op.ranks)
    c.AddRank(b, op.rank)
    c.AddCommunicator(b, communicator)
    c.AddGroup(b, op.group)
    c.AddSendBuffer(b, op.send_buffer)
    c.AddSendOffset(b, op.send_offset)
    c.AddRecvBuffer(b, op.recv_buffer)
    c.AddRecvOffset(b, op.recv_offset)
    c.AddReceived(b, op.received)
    return c.End(b)


def _decode_collective(index: int, v: dict[str, Any]) -> m.Collective:
    known = {int(k) for k in m.CollectiveOperation}
    operation = m.CollectiveOperation(v["operation"] if v["operation"] in known else 0)
    return m.Collective(
        index,
        operation,
        v["datatype"],
        v["reduction"],
        v["stream"],
        v["count"],
        v["root"],
        v["ranks"],
        v["rank"],
        v["communicator"] or "",
        v["group"],
        v["send_buffer"],
        v["send_offset"],
        v["recv_buffer"],
        v["recv_offset"],
        v["received"],
    )


def decode_table_op(index: int, kind_code: int, d: dict[str, Any]) -> Any:
    """Build the model operation for one decoded Operation table."""
    body = d["body"]
    if body is None or body[0] == "?":
        return m.UnknownOperation(index, kind_code)
    member, v = body
    kind = KIND_OF_UNION_MEMBER[member]
    if kind_code != kind:
        return None  # the caller reports the disagreement with operation_kinds
    if kind == _K.SCOPE_BEGIN:
        return m.ScopeBegin(index, v["name"])
    if kind == _K.SCOPE_END:
        return m.ScopeEnd(index, v["name"])
    if kind == _K.CHECKPOINT:
        entries = struct_array(v["entries"], "CheckpointEntry").tolist()
        types = tuple(decode_typed_tensor(t) for t in v.get("types") or ())
        return m.Checkpoint(index, v["name"], tuple(m.CheckpointEntry(*e) for e in entries), types)
    if kind == _K.STATE:
        return m.State(index, v["buffer"], v["payload"], v["offset"], v["size"], flags=v.get("flags", 0))
    if kind == _K.COLLECTIVE:
        return _decode_collective(index, v)
    return m.Unsupported(index, v["call"], v["reason"], v["stream"])


# ------------------------------------------------------------------------------------------
# Batches and index


def encode_record_batch(
    *,
    first_operation: int,
    first_object: int,
    first_payload: int,
    kinds: bytes | bytearray,
    launches: np.ndarray,
    copies: np.ndarray,
    memsets: np.ndarray,
    id_operations: np.ndarray,
    table_ops: list[Any],
    relocations: np.ndarray,
    parameter_bytes: bytes | bytearray,
    objects: list[m.ObjectDef],
    payloads: list[tuple[bytes, int, int, tuple[bytes, ...]]],
    data_relocations: np.ndarray | None = None,
) -> bytes:
    # Sized once for everything but the tables, so the builder does not grow (and copy) itself.
    columns = launches.nbytes + copies.nbytes + memsets.nbytes + id_operations.nbytes + relocations.nbytes
    tables = 256 * (len(table_ops) + len(objects)) + sum(64 + 16 * len(p[3]) for p in payloads)
    b = flatbuffers.Builder(1024 + len(kinds) + len(parameter_bytes) + columns + tables)
    kinds_vec = _ubyte_vector(b, kinds)
    launch_vec = _struct_vector(b, "LaunchRecord", launches)
    copy_vec = _struct_vector(b, "CopyRecord", copies)
    memset_vec = _struct_vector(b, "MemsetRecord", memsets)
    id_vec = _struct_vector(b, "IdOperationRecord", id_operations)
    op_vec = _table_vector(b, [encode_table_op(b, op) for op in table_ops])
    reloc_vec = _struct_vector(b, "Relocation", relocations)
    param_vec = _ubyte_vector(b, parameter_bytes)
    obj_vec = _table_vector(b, [encode_object(b, o) for o in objects])
    payload_offsets = []
    for digest, size, frame_size, frames in payloads:
        frames_vec = _hash_vector(b, frames)
        fb.Payload.Start(b)
        fb.Payload.AddHash(b, _hash_struct(b, digest))
        fb.Payload.AddSize(b, size)
        fb.Payload.AddFrameSize(b, frame_size)
        fb.Payload.AddFrames(b, frames_vec)
        payload_offsets.append(fb.Payload.End(b))
    payload_vec = _table_vector(b, payload_offsets)
    has_data = data_relocations is not None and len(data_relocations) > 0
    data_vec = _struct_vector(b, "DataRelocation", data_relocations) if has_data else 0
    fb.RecordBatch.Start(b)
    fb.RecordBatch.AddFirstOperation(b, first_operation)
    fb.RecordBatch.AddFirstObject(b, first_object)
    fb.RecordBatch.AddFirstPayload(b, first_payload)
    fb.RecordBatch.AddOperationKinds(b, kinds_vec)
    fb.RecordBatch.AddLaunches(b, launch_vec)
    fb.RecordBatch.AddCopies(b, copy_vec)
    fb.RecordBatch.AddMemsets(b, memset_vec)
    fb.RecordBatch.AddIdOperations(b, id_vec)
    fb.RecordBatch.AddOperations(b, op_vec)
    fb.RecordBatch.AddRelocations(b, reloc_vec)
    fb.RecordBatch.AddParameterBytes(b, param_vec)
    fb.RecordBatch.AddObjects(b, obj_vec)
    fb.RecordBatch.AddPayloads(b, payload_vec)
    if has_data:  # (1.3) written only when there are any: files without them read as 1.2 wrote them
        fb.RecordBatch.AddDataRelocations(b, data_vec)
    b.Finish(fb.RecordBatch.End(b))
    return bytes(memoryview(b.Bytes)[b.Head() :])


def encode_index(
    *,
    metadata_offset: int,
    operation_count: int,
    object_count: int,
    payload_count: int,
    batches: np.ndarray,
    frames: np.ndarray,
    timings_offset: int = 0,
    partial: str = "",
) -> bytes:
    b = flatbuffers.Builder(1024 + batches.nbytes + frames.nbytes)
    partial_text = _string(b, partial) if partial else 0
    batch_vec = _struct_vector(b, "BatchEntry", batches)
    frame_vec = _struct_vector(b, "FrameEntry", frames)
    fb.Index.Start(b)
    fb.Index.AddMetadataOffset(b, metadata_offset)
    fb.Index.AddOperationCount(b, operation_count)
    fb.Index.AddObjectCount(b, object_count)
    fb.Index.AddPayloadCount(b, payload_count)
    fb.Index.AddBatches(b, batch_vec)
    fb.Index.AddFrames(b, frame_vec)
    if timings_offset:
        fb.Index.AddTimingsOffset(b, timings_offset)
    if partial:
        fb.Index.AddPartial(b, partial_text)
    b.Finish(fb.Index.End(b))
    return bytes(b.Output())
