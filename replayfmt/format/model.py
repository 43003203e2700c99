"""The Python view of a capture's resource graph: enums, objects and operations.

These small immutable types are what the reader returns and what tools consume. Their numbering
mirrors replayfmt/schema.fbs exactly (a test checks it). Objects are frozen dataclasses; the
operations that a capture holds by the million (launch, copy, memset, relocation) are NamedTuples,
which are several times cheaper to build than frozen dataclasses.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

# Exported here too (m.DType), so the whole Python view is one import.
from replayfmt.errors import ReplayUsageError
from replayfmt.format.collective import (
    COLLECTIVE_DTYPE_SIZES as COLLECTIVE_DTYPE_SIZES,
    Collective as Collective,
    CollectiveOperation as CollectiveOperation,
)
from replayfmt.format.enums import (
    COPY_FLAG_ASYNC as COPY_FLAG_ASYNC,
    DEVICE_WORK as DEVICE_WORK,
    EXECUTABLE_FORMATS as EXECUTABLE_FORMATS,
    LAUNCH_FLAG_COOPERATIVE as LAUNCH_FLAG_COOPERATIVE,
    LAUNCH_FLAG_HOST_RELEASED as LAUNCH_FLAG_HOST_RELEASED,
    LAUNCH_FLAG_PROGRAMMATIC as LAUNCH_FLAG_PROGRAMMATIC,
    LAUNCH_FLAGS_KNOWN as LAUNCH_FLAGS_KNOWN,
    STATE_FLAG_UNDEFINED as STATE_FLAG_UNDEFINED,
    DType as DType,
    ExecutableFormat as ExecutableFormat,
    FilePolicy as FilePolicy,
    FileValidation as FileValidation,
    GraphEdgePort as GraphEdgePort,
    GraphEdgeType as GraphEdgeType,
    MemoryKind as MemoryKind,
    ObjectKind as ObjectKind,
    OperationKind as OperationKind,
    ParameterKind as ParameterKind,
    RelocationKind as RelocationKind,
)
from replayfmt.format.graph_parts import (
    FULL_DEPENDENCY as FULL_DEPENDENCY,
    GraphEdgeData as GraphEdgeData,
    GraphNodeKind as GraphNodeKind,
    kept_edge_data as kept_edge_data,
)

Dims = tuple[int, int, int]


# ------------------------------------------------------------------------------------------
# Objects. ``id`` is assigned by the writer (dense from 1, shared by every kind).


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectDef:
    kind: ClassVar[ObjectKind] = ObjectKind.NONE
    id: int = 0
    label: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Device(ObjectDef):
    kind: ClassVar[ObjectKind] = ObjectKind.DEVICE
    ordinal: int = 0
    name: str = ""
    uuid: bytes = b""
    compute_capability: tuple[int, int] = (0, 0)
    total_memory: int = 0
    driver_version: int = 0
    multiprocessor_count: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Stream(ObjectDef):
    kind: ClassVar[ObjectKind] = ObjectKind.STREAM
    device: int = 0
    priority: int = 0
    flags: int = 0
    captured_handle: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Event(ObjectDef):
    kind: ClassVar[ObjectKind] = ObjectKind.EVENT
    device: int = 0
    flags: int = 0


def unlabelled_events(ids: list[int], devices: list[int], flags: list[int]) -> list[Event]:
    """``[Event(id=i, device=d, flags=f) ...]`` for each (i, d, f), made at a third of the cost: a
    frozen dataclass's ``__init__`` goes through ``object.__setattr__`` field by field, these
    through the slots' own descriptors (a capture may hold 200k events: a walk of its objects makes
    them all; the reader and the plan keep them as columns, replayfmt.format.object_columns)."""
    make, set_id, set_label = object.__new__, ObjectDef.id.__set__, ObjectDef.label.__set__  # type: ignore[misc]
    set_device, set_flags = Event.device.__set__, Event.flags.__set__  # type: ignore[misc]
    events = []
    for i, d, f in zip(ids, devices, flags, strict=True):
        event = make(Event)
        set_id(event, i)
        set_label(event, "")
        set_device(event, d)
        set_flags(event, f)
        events.append(event)
    return events


class TypedRange(NamedTuple):
    """The element type of ``size`` bytes at ``offset`` of a buffer (format 1.1)."""

    offset: int
    size: int
    dtype: DType


@dataclass(frozen=True, slots=True, kw_only=True)
class Buffer(ObjectDef):
    kind: ClassVar[ObjectKind] = ObjectKind.BUFFER
    size: int
    device: int = 0
    alignment: int = 256
    address: int = 0
    memory: MemoryKind = MemoryKind.DEVICE
    dtype: DType = DType.UNKNOWN
    shape: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    element_offset: int = 0
    requires_fixed_address: bool = False
    ranges: tuple[TypedRange, ...] = ()  # typed sub-ranges, when its tensors have several dtypes
    module_global: int = 0  # (1.4) the Global whose storage this is (replay finds it in the loaded module)

    def dtype_at(self, offset: int, size: int) -> DType:
        """The element type of bytes [offset, offset + size): the typed range holding them all,
        else the buffer's dtype when no typed range overlaps them, else UNKNOWN."""
        end = offset + size
        for r in self.ranges:
            if r.offset <= offset and end <= r.offset + r.size:
                return r.dtype
            if r.offset < end and offset < r.offset + r.size:
                return DType.UNKNOWN
        return self.dtype


@dataclass(frozen=True, slots=True, kw_only=True)
class Parameter:
    offset: int
    size: int
    kind: ParameterKind = ParameterKind.UNKNOWN
    name: str = ""
    dtype: DType = DType.UNKNOWN


@dataclass(frozen=True, slots=True, kw_only=True)
class Function:
    name: str
    parameters: tuple[Parameter, ...] = ()
    parameters_known: bool = False
    registers: int = 0
    static_shared_memory: int = 0
    max_dynamic_shared_memory: int = 0
    max_threads_per_block: int = 0
    local_memory: int = 0
    required_cluster: Dims = (0, 0, 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Executable(ObjectDef):
    kind: ClassVar[ObjectKind] = ObjectKind.EXECUTABLE
    format: ExecutableFormat = ExecutableFormat.UNKNOWN
    target_arch: str = ""
    payload: int = 0
    file: int = 0
    functions: tuple[Function, ...] = ()

    def function_index(self, name: str) -> int | None:
        for i, fn in enumerate(self.functions):
            if fn.name == name:
                return i
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Global(ObjectDef):
    kind: ClassVar[ObjectKind] = ObjectKind.GLOBAL
    executable: int = 0
    symbol: str = ""
    size: int = 0
    initial_payload: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class FileRange:
    offset: int
    size: int
    payload: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FileReference(ObjectDef):
    kind: ClassVar[ObjectKind] = ObjectKind.FILE_REFERENCE
    path: str
    size: int = 0
    device: int = 0
    inode: int = 0
    mtime_ns: int = 0
    digest: bytes | None = None  # XXH3-128 of the whole file, 16 bytes
    policy: FilePolicy = FilePolicy.REFERENCE
    validation: FileValidation = FileValidation.IDENTITY
    ranges: tuple[FileRange, ...] = ()
    payload: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphNode:
    """One node of a CUDA graph; which fields matter depends on ``kind`` (schema.fbs says).
    ``kind`` is a plain int when a newer writer used a kind this reader does not know."""

    kind: GraphNodeKind | int = GraphNodeKind.EMPTY
    executable: int = 0  # KERNEL: as a Launch
    function: int = 0
    flags: int = 0
    grid: Dims = (0, 0, 0)
    block: Dims = (0, 0, 0)
    cluster: Dims = (0, 0, 0)
    shared_memory: int = 0
    parameters: bytes = b""
    relocations: tuple[Relocation, ...] = ()
    src_buffer: int = 0  # MEMCPY
    dst_buffer: int = 0  # MEMCPY, MEMSET
    src_offset: int = 0
    dst_offset: int = 0
    size: int = 0  # MEMCPY: bytes
    value: int = 0  # MEMSET
    element_size: int = 0
    width: int = 0  # MEMSET: elements per row
    height: int = 0  # MEMSET: rows
    pitch: int = 0  # MEMSET: bytes between rows
    event: int = 0  # EVENT_RECORD, EVENT_WAIT: Event id
    graph: int = 0  # CHILD_GRAPH: Graph id

    @property
    def label(self) -> str:
        return self.kind.label if isinstance(self.kind, GraphNodeKind) else f"kind {self.kind}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Graph(ObjectDef):
    """(1.2) A CUDA graph as launched: its nodes (:class:`GraphNode`) and
    dependency edges (``(src, dst)`` node indices: dst runs after src). A graph whose executable
    was updated between launches is written again as a new object. ``edge_data`` (1.7): how each
    edge orders its nodes, in ``edges``' order; empty when every edge is a full dependency."""

    kind: ClassVar[ObjectKind] = ObjectKind.GRAPH
    device: int = 0
    nodes: tuple[GraphNode, ...] = ()
    edges: tuple[tuple[int, int], ...] = ()
    edge_data: tuple[GraphEdgeData, ...] = ()

    def edge_kind(self, index: int) -> GraphEdgeData:
        """How edge ``index`` orders its nodes."""
        return self.edge_data[index] if self.edge_data else FULL_DEPENDENCY

    @property
    def programmatic_edges(self) -> int:
        return sum(e.type != GraphEdgeType.FULL for e in self.edge_data)


OBJECT_TYPES: dict[ObjectKind, type[ObjectDef]] = {
    cls.kind: cls for cls in (Device, Stream, Event, Buffer, Executable, Global, FileReference, Graph)
}


@dataclass(frozen=True, slots=True)
class UnknownObject(ObjectDef):
    """An object of a kind this reader does not know (written by a newer minor version)."""

    type_code: int = 0


# ------------------------------------------------------------------------------------------
# Operations. ``index`` is the operation's number in capture order, from 0.


class Relocation(NamedTuple):
    """A pointer to patch on replay: site (parameters or a buffer) -> target buffer + offset."""

    site_buffer: int  # 0: the launch's parameter bytes
    target_buffer: int
    site_offset: int
    target_offset: int
    kind: RelocationKind = RelocationKind.POINTER


class Launch(NamedTuple):
    index: int
    executable: int
    function: int
    stream: int
    grid: Dims
    block: Dims
    cluster: Dims
    shared_memory: int
    flags: int
    parameters: bytes
    relocations: tuple[Relocation, ...]


class Copy(NamedTuple):
    index: int
    op: OperationKind  # one of the three COPY_* kinds
    stream: int
    src_buffer: int
    dst_buffer: int
    payload: int
    src_file: int
    flags: int
    src_offset: int
    dst_offset: int
    size: int
    # (1.3) host-to-device: pointers stored in the uploaded bytes (site_buffer: dst_buffer,
    # site_offset: in dst_buffer), written as the replay's addresses
    relocations: tuple[Relocation, ...] = ()

    @property
    def kind(self) -> OperationKind:  # type: ignore[override]
        return self.op


class Memset(NamedTuple):
    index: int
    stream: int
    buffer: int
    value: int
    element_size: int
    offset: int
    count: int


# NamedTuple turns annotated class attributes into fields, so the constant kinds are set here.
Launch.kind = OperationKind.LAUNCH  # type: ignore[attr-defined]
Memset.kind = OperationKind.MEMSET  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class CreateObject:
    index: int
    object: int
    kind: ClassVar[OperationKind] = OperationKind.CREATE_OBJECT


@dataclass(frozen=True, slots=True)
class DestroyObject:
    index: int
    object: int
    kind: ClassVar[OperationKind] = OperationKind.DESTROY_OBJECT


@dataclass(frozen=True, slots=True)
class ModuleLoad:
    index: int
    executable: int
    device: int
    kind: ClassVar[OperationKind] = OperationKind.MODULE_LOAD


@dataclass(frozen=True, slots=True)
class EventRecord:
    index: int
    event: int
    stream: int
    kind: ClassVar[OperationKind] = OperationKind.EVENT_RECORD


@dataclass(frozen=True, slots=True)
class StreamWaitEvent:
    index: int
    stream: int
    event: int
    kind: ClassVar[OperationKind] = OperationKind.STREAM_WAIT_EVENT


@dataclass(frozen=True, slots=True)
class StreamSynchronize:
    index: int
    stream: int
    kind: ClassVar[OperationKind] = OperationKind.STREAM_SYNCHRONIZE


@dataclass(frozen=True, slots=True)
class DeviceSynchronize:
    index: int
    device: int
    kind: ClassVar[OperationKind] = OperationKind.DEVICE_SYNCHRONIZE


@dataclass(frozen=True, slots=True)
class EventSynchronize:
    index: int
    event: int
    kind: ClassVar[OperationKind] = OperationKind.EVENT_SYNCHRONIZE


@dataclass(frozen=True, slots=True)
class ScopeBegin:
    index: int
    name: str
    kind: ClassVar[OperationKind] = OperationKind.SCOPE_BEGIN


@dataclass(frozen=True, slots=True)
class ScopeEnd:
    index: int
    name: str
    kind: ClassVar[OperationKind] = OperationKind.SCOPE_END


class CheckpointEntry(NamedTuple):
    buffer: int
    payload: int  # expected bytes
    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class TypedTensor:
    """(1.3) What ``size`` bytes at ``offset`` of checkpointed buffer ``buffer`` hold, as the
    program's framework described them when the checkpoint was taken."""

    buffer: int
    offset: int
    size: int
    dtype: DType
    shape: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    name: str = ""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    index: int
    name: str
    entries: tuple[CheckpointEntry, ...] = field(default=())
    types: tuple[TypedTensor, ...] = field(default=())  # (1.3) typed ranges of the entries
    kind: ClassVar[OperationKind] = OperationKind.CHECKPOINT


def typed_tensor_problem(entries: tuple[CheckpointEntry, ...], types: tuple[TypedTensor, ...]) -> str | None:
    """Why a checkpoint's typed tensors are malformed (one outside every entry of its buffer, or
    overlapping another), or None. Entries are looked up by buffer and bisected (n log n: a
    checkpoint may type 20k tensors over 20k entries)."""
    spans: dict[int, tuple[list[int], list[int]]] = {}  # buffer -> entry starts (sorted), widest end so far
    for e in sorted(entries, key=lambda e: (e.buffer, e.offset)):
        starts, ends = spans.setdefault(e.buffer, ([], []))
        starts.append(e.offset)
        ends.append(max(ends[-1], e.offset + e.size) if ends else e.offset + e.size)
    last_end: dict[int, int] = {}
    for k, t in enumerate(sorted(types, key=lambda t: (t.buffer, t.offset))):
        starts, ends = spans.get(t.buffer, ([], []))
        at = bisect.bisect_right(starts, t.offset) - 1
        # the entry reaching furthest among those starting at or before the tensor holds it, or none does
        if t.size <= 0 or at < 0 or ends[at] < t.offset + t.size:
            return f"typed tensor {k} (buffer {t.buffer}, bytes {t.offset}+{t.size}) lies outside every entry"
        if t.offset < last_end.get(t.buffer, 0):
            return f"typed tensor {k} (buffer {t.buffer}, bytes {t.offset}+{t.size}) overlaps another"
        last_end[t.buffer] = t.offset + t.size
    return None


def checked_checkpoint(
    name: str, entries: tuple[CheckpointEntry, ...], types: tuple[TypedTensor, ...]
) -> tuple[tuple[CheckpointEntry, ...], tuple[TypedTensor, ...]]:
    """A checkpoint's entries and typed tensors, refused (ReplayUsageError) when malformed."""
    problem = typed_tensor_problem(entries, types)
    if problem is not None:
        raise ReplayUsageError(f"checkpoint {name!r}: {problem}")
    return entries, types


@dataclass(frozen=True, slots=True)
class State:
    """What buffer bytes [offset, offset + size) hold when the enclosing region begins (format
    1.1): starting state the capture restores, not a copy the program made. See docs/FORMAT.md."""

    index: int
    buffer: int
    payload: int
    offset: int
    size: int
    # (1.3) pointers stored in these bytes (site_buffer: buffer, site_offset: in buffer)
    relocations: tuple[Relocation, ...] = ()
    flags: int = 0  # (1.6) STATE_FLAG_UNDEFINED
    kind: ClassVar[OperationKind] = OperationKind.STATE

    @property
    def undefined(self) -> bool:
        """Whether the range held none of the program's data when the region began (1.6)."""
        return bool(self.flags & STATE_FLAG_UNDEFINED)


@dataclass(frozen=True, slots=True)
class Unsupported:
    index: int
    call: str
    reason: str
    stream: int = 0
    kind: ClassVar[OperationKind] = OperationKind.UNSUPPORTED


@dataclass(frozen=True, slots=True)
class HostFunction:
    """A host function the program ran in ``stream``'s order (cuLaunchHostFunc,
    cuStreamAddCallback). Its code is the program's own and is not captured: replay keeps its
    place in the stream as a host step that does nothing."""

    index: int
    stream: int
    kind: ClassVar[OperationKind] = OperationKind.HOST_FUNCTION


@dataclass(frozen=True, slots=True)
class GraphLaunch:
    """(1.2) One launch of Graph object ``graph`` on ``stream`` (cuGraphLaunch)."""

    index: int
    graph: int
    stream: int
    kind: ClassVar[OperationKind] = OperationKind.GRAPH_LAUNCH


@dataclass(frozen=True, slots=True)
class UnknownOperation:
    """An operation of a kind this reader does not know (written by a newer minor version)."""

    index: int
    code: int
    kind: ClassVar[OperationKind] = OperationKind.NONE


Operation = (
    Launch
    | Copy
    | Memset
    | CreateObject
    | DestroyObject
    | ModuleLoad
    | EventRecord
    | StreamWaitEvent
    | StreamSynchronize
    | DeviceSynchronize
    | EventSynchronize
    | ScopeBegin
    | ScopeEnd
    | Checkpoint
    | Unsupported
    | HostFunction
    | State
    | GraphLaunch
    | Collective
    | UnknownOperation
)


# ------------------------------------------------------------------------------------------
# Capture-level data


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptureMetadata:
    tool: str = ""
    tool_version: str = ""
    created_unix_ns: int = 0
    host: str = ""
    gpu: str = ""
    driver: str = ""
    command_line: tuple[str, ...] = ()
    properties: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class PayloadInfo:
    """What the file says about one payload; bytes are read through Capture.read_payload."""

    id: int
    hash: bytes  # 16 bytes, XXH3-128 over (size, frame hashes)
    size: int  # logical bytes
    frame_size: int
    frames: tuple[bytes, ...]  # XXH3-128 of each frame

    @property
    def hash_hex(self) -> str:
        return self.hash.hex()
