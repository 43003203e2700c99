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
from replayfmt.format.fb import (
    Buffer as FbBuffer,
    CaptureMetadata as FbCaptureMetadata,
    Checkpoint as FbCheckpoint,
    Device as FbDevice,
    Event as FbEvent,
    Executable as FbExecutable,
    FileReference as FbFileReference,
    Function as FbFunction,
    Global as FbGlobal,
    Index as FbIndex,
    KernelDims as FbKernelDims,
    KeyValue as FbKeyValue,
    Object as FbObject,
    Operation as FbOperation,
    Parameter as FbParameter,
    Payload as FbPayload,
    RecordBatch as FbRecordBatch,
    ScopeBegin as FbScopeBegin,
    ScopeEnd as FbScopeEnd,
    State as FbState,
    Stream as FbStream,
    Unsupported as FbUnsupported,
)
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
        FbKeyValue.Start(b)
        FbKeyValue.AddKey(b, k)
        FbKeyValue.AddValue(b, v)
        pairs.append(FbKeyValue.End(b))
    properties = _table_vector(b, pairs)
    FbCaptureMetadata.Start(b)
    FbCaptureMetadata.AddTool(b, strings["tool"])
    FbCaptureMetadata.AddToolVersion(b, strings["tool_version"])
    FbCaptureMetadata.AddCreatedUnixNs(b, meta.created_unix_ns)
    FbCaptureMetadata.AddHost(b, strings["host"])
    FbCaptureMetadata.AddGpu(b, strings["gpu"])
    FbCaptureMetadata.AddDriver(b, strings["driver"])
    FbCaptureMetadata.AddCommandLine(b, command_line)
    FbCaptureMetadata.AddProperties(b, properties)
    b.Finish(FbCaptureMetadata.End(b))
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
        FbParameter.Start(b)
        FbParameter.AddOffset(b, p.offset)
        FbParameter.AddSize(b, p.size)
        FbParameter.AddKind(b, int(p.kind))
        if pname:
            FbParameter.AddName(b, pname)
        FbParameter.AddDtype(b, int(p.dtype))
        params.append(FbParameter.End(b))
    param_vec = _table_vector(b, params)
    FbFunction.Start(b)
    FbFunction.AddName(b, name)
    FbFunction.AddParameters(b, param_vec)
    FbFunction.AddRegisters(b, fn.registers)
    FbFunction.AddStaticSharedMemory(b, fn.static_shared_memory)
    FbFunction.AddMaxDynamicSharedMemory(b, fn.max_dynamic_shared_memory)
    FbFunction.AddMaxThreadsPerBlock(b, fn.max_threads_per_block)
    FbFunction.AddLocalMemory(b, fn.local_memory)
    FbFunction.AddRequiredCluster(b, FbKernelDims.CreateKernelDims(b, *fn.required_cluster))
    FbFunction.AddParametersKnown(b, fn.parameters_known)
    return FbFunction.End(b)


def _encode_body(b: flatbuffers.Builder, obj: m.ObjectDef) -> int:
    if isinstance(obj, m.Device):
        name = _string(b, obj.name)
        uuid = _ubyte_vector(b, obj.uuid)
        FbDevice.Start(b)
        FbDevice.AddOrdinal(b, obj.ordinal)
        FbDevice.AddName(b, name)
        FbDevice.AddUuid(b, uuid)
        FbDevice.AddComputeCapabilityMajor(b, obj.compute_capability[0])
        FbDevice.AddComputeCapabilityMinor(b, obj.compute_capability[1])
        FbDevice.AddTotalMemory(b, obj.total_memory)
        FbDevice.AddDriverVersion(b, obj.driver_version)
        FbDevice.AddMultiprocessorCount(b, obj.multiprocessor_count)
        return FbDevice.End(b)
    if isinstance(obj, m.Stream):
        FbStream.Start(b)
        FbStream.AddDevice(b, obj.device)
        FbStream.AddPriority(b, obj.priority)
        FbStream.AddFlags(b, obj.flags)
        FbStream.AddCapturedHandle(b, obj.captured_handle)
        return FbStream.End(b)
    if isinstance(obj, m.Event):
        FbEvent.Start(b)
        FbEvent.AddDevice(b, obj.device)
        FbEvent.AddFlags(b, obj.flags)
        return FbEvent.End(b)
    if isinstance(obj, m.Buffer):
        shape = _int64_vector(b, obj.shape) if obj.shape else 0
        strides = _int64_vector(b, obj.strides) if obj.strides else 0
        ranges = 0
        if obj.ranges:
            array = np.array([(r.offset, r.size, int(r.dtype)) for r in obj.ranges], dtype=dtype("TypedRange"))
            ranges = _struct_vector(b, "TypedRange", array)
        FbBuffer.Start(b)
        FbBuffer.AddDevice(b, obj.device)
        FbBuffer.AddSize(b, obj.size)
        FbBuffer.AddAlignment(b, obj.alignment)
        FbBuffer.AddAddress(b, obj.address)
        FbBuffer.AddMemory(b, int(obj.memory))
        FbBuffer.AddDtype(b, int(obj.dtype))
        if shape:
            FbBuffer.AddShape(b, shape)
        if strides:
            FbBuffer.AddStrides(b, strides)
        FbBuffer.AddElementOffset(b, obj.element_offset)
        FbBuffer.AddRequiresFixedAddress(b, obj.requires_fixed_address)
        if ranges:
            FbBuffer.AddRanges(b, ranges)
        FbBuffer.AddModuleGlobal(b, obj.module_global)  # (a default is not written: 1.3 readers see none)
        return FbBuffer.End(b)
    if isinstance(obj, m.Executable):
        arch = _string(b, obj.target_arch)
        functions = _table_vector(b, [_encode_function(b, fn) for fn in obj.functions])
        FbExecutable.Start(b)
        FbExecutable.AddFormat(b, int(obj.format))
        FbExecutable.AddTargetArch(b, arch)
        FbExecutable.AddPayload(b, obj.payload)
        FbExecutable.AddFile(b, obj.file)
        FbExecutable.AddFunctions(b, functions)
        return FbExecutable.End(b)
    if isinstance(obj, m.Global):
        symbol = _string(b, obj.symbol)
        FbGlobal.Start(b)
        FbGlobal.AddExecutable(b, obj.executable)
        FbGlobal.AddSymbol(b, symbol)
        FbGlobal.AddSize(b, obj.size)
        FbGlobal.AddInitialPayload(b, obj.initial_payload)
        return FbGlobal.End(b)
    if isinstance(obj, m.FileReference):
        path = _string(b, obj.path)
        ranges = 0
        if obj.ranges:
            array = np.array([(r.offset, r.size, r.payload) for r in obj.ranges], dtype=dtype("FileRange"))
            ranges = _struct_vector(b, "FileRange", array)
        FbFileReference.Start(b)
        FbFileReference.AddPath(b, path)
        FbFileReference.AddSize(b, obj.size)
        FbFileReference.AddDevice(b, obj.device)
        FbFileReference.AddInode(b, obj.inode)
        FbFileReference.AddMtimeNs(b, obj.mtime_ns)
        if obj.digest is not None:
            FbFileReference.AddDigest(b, _hash_struct(b, obj.digest))
        FbFileReference.AddHasDigest(b, obj.digest is not None)
        FbFileReference.AddPolicy(b, int(obj.policy))
        FbFileReference.AddValidation(b, int(obj.validation))
        if ranges:
            FbFileReference.AddRanges(b, ranges)
        FbFileReference.AddPayload(b, obj.payload)
        return FbFileReference.End(b)
    if isinstance(obj, m.Graph):
        return encode_graph(b, obj)
    raise TypeError(f"cannot encode object of type {type(obj).__name__}")


def encode_object(b: flatbuffers.Builder, obj: m.ObjectDef) -> int:
    body = _encode_body(b, obj)
    label = _string(b, obj.label) if obj.label else 0
    FbObject.Start(b)
    FbObject.AddId(b, obj.id)
    if label:
        FbObject.AddLabel(b, label)
    FbObject.AddBodyType(b, int(obj.kind))
    FbObject.AddBody(b, body)
    return FbObject.End(b)


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
        module = FbScopeBegin if kind == _K.SCOPE_BEGIN else FbScopeEnd
        name = _string(b, op.name)
        module.Start(b)
        module.AddName(b, name)
        body = module.End(b)
    elif kind == _K.CHECKPOINT:
        name = _string(b, op.name)
        array = np.array([tuple(e) for e in op.entries], dtype=dtype("CheckpointEntry"))
        entries = _struct_vector(b, "CheckpointEntry", array)
        types = _table_vector(b, [encode_typed_tensor(b, t) for t in op.types]) if op.types else 0
        FbCheckpoint.Start(b)
        FbCheckpoint.AddName(b, name)
        FbCheckpoint.AddEntries(b, entries)
        if types:
            FbCheckpoint.AddTypes(b, types)
        body = FbCheckpoint.End(b)
    elif kind == _K.STATE:
        FbState.Start(b)
        FbState.AddBuffer(b, op.buffer)
        FbState.AddPayload(b, op.payload)
        FbState.AddOffset(b, op.offset)
        FbState.AddSize(b, op.size)
        body = FbState.End(b)
    elif kind == _K.UNSUPPORTED:
        call, reason = _string(b, op.call), _string(b, op.reason)
        FbUnsupported.Start(b)
        FbUnsupported.AddCall(b, call)
        FbUnsupported.AddReason(b, reason)
        FbUnsupported.AddStream(b, op.stream)
        body = FbUnsupported.End(b)
    else:
        raise TypeError(f"{kind!r} is not a table operation")
    FbOperation.Start(b)
    FbOperation.AddBodyType(b, _union_code(kind))
    FbOperation.AddBody(b, body)
    return FbOperation.End(b)


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
        return m.State(index, v["buffer"], v["payload"], v["offset"], v["size"])
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
        FbPayload.Start(b)
        FbPayload.AddHash(b, _hash_struct(b, digest))
        FbPayload.AddSize(b, size)
        FbPayload.AddFrameSize(b, frame_size)
        FbPayload.AddFrames(b, frames_vec)
        payload_offsets.append(FbPayload.End(b))
    payload_vec = _table_vector(b, payload_offsets)
    has_data = data_relocations is not None and len(data_relocations) > 0
    data_vec = _struct_vector(b, "DataRelocation", data_relocations) if has_data else 0
    FbRecordBatch.Start(b)
    FbRecordBatch.AddFirstOperation(b, first_operation)
    FbRecordBatch.AddFirstObject(b, first_object)
    FbRecordBatch.AddFirstPayload(b, first_payload)
    FbRecordBatch.AddOperationKinds(b, kinds_vec)
    FbRecordBatch.AddLaunches(b, launch_vec)
    FbRecordBatch.AddCopies(b, copy_vec)
    FbRecordBatch.AddMemsets(b, memset_vec)
    FbRecordBatch.AddIdOperations(b, id_vec)
    FbRecordBatch.AddOperations(b, op_vec)
    FbRecordBatch.AddRelocations(b, reloc_vec)
    FbRecordBatch.AddParameterBytes(b, param_vec)
    FbRecordBatch.AddObjects(b, obj_vec)
    FbRecordBatch.AddPayloads(b, payload_vec)
    if has_data:  # (1.3) written only when there are any: files without them read as 1.2 wrote them
        FbRecordBatch.AddDataRelocations(b, data_vec)
    b.Finish(FbRecordBatch.End(b))
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
    FbIndex.Start(b)
    FbIndex.AddMetadataOffset(b, metadata_offset)
    FbIndex.AddOperationCount(b, operation_count)
    FbIndex.AddObjectCount(b, object_count)
    FbIndex.AddPayloadCount(b, payload_count)
    FbIndex.AddBatches(b, batch_vec)
    FbIndex.AddFrames(b, frame_vec)
    if timings_offset:
        FbIndex.AddTimingsOffset(b, timings_offset)
    if partial:
        FbIndex.AddPartial(b, partial_text)
    b.Finish(FbIndex.End(b))
    return bytes(b.Output())
