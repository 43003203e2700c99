"""The format's enumerations: operation and object kinds, memory kinds, dtypes, file policies.

Their numbering mirrors replayfmt/schema.fbs exactly (a test checks it). :mod:`replayfmt.format.model`
builds its objects and operations on them and exports them too (``m.DType``), so callers need one
import for the whole Python view.
"""

from __future__ import annotations

import enum


class OperationKind(enum.IntEnum):
    NONE = 0
    CREATE_OBJECT = 1
    DESTROY_OBJECT = 2
    COPY_HOST_TO_DEVICE = 3
    COPY_DEVICE_TO_HOST = 4
    COPY_DEVICE_TO_DEVICE = 5
    MEMSET = 6
    MODULE_LOAD = 7
    LAUNCH = 8
    EVENT_RECORD = 9
    STREAM_WAIT_EVENT = 10
    STREAM_SYNCHRONIZE = 11
    DEVICE_SYNCHRONIZE = 12
    EVENT_SYNCHRONIZE = 13
    SCOPE_BEGIN = 14
    SCOPE_END = 15
    CHECKPOINT = 16
    UNSUPPORTED = 17
    STATE = 18  # format 1.1
    HOST_FUNCTION = 19  # format 1.1
    GRAPH_LAUNCH = 20  # format 1.2
    COLLECTIVE = 21  # format 1.5

    @property
    def label(self) -> str:
        """The name used by dump-replay and in messages, e.g. ``copy_h2d``."""
        return _OPERATION_LABELS[self]


_OPERATION_LABELS = {
    OperationKind.NONE: "none",
    OperationKind.CREATE_OBJECT: "create",
    OperationKind.DESTROY_OBJECT: "destroy",
    OperationKind.COPY_HOST_TO_DEVICE: "copy_h2d",
    OperationKind.COPY_DEVICE_TO_HOST: "copy_d2h",
    OperationKind.COPY_DEVICE_TO_DEVICE: "copy_d2d",
    OperationKind.MEMSET: "memset",
    OperationKind.MODULE_LOAD: "module_load",
    OperationKind.LAUNCH: "launch",
    OperationKind.EVENT_RECORD: "event_record",
    OperationKind.STREAM_WAIT_EVENT: "stream_wait_event",
    OperationKind.STREAM_SYNCHRONIZE: "stream_synchronize",
    OperationKind.DEVICE_SYNCHRONIZE: "device_synchronize",
    OperationKind.EVENT_SYNCHRONIZE: "event_synchronize",
    OperationKind.SCOPE_BEGIN: "scope_begin",
    OperationKind.SCOPE_END: "scope_end",
    OperationKind.CHECKPOINT: "checkpoint",
    OperationKind.UNSUPPORTED: "unsupported",
    OperationKind.HOST_FUNCTION: "host_function",
    OperationKind.STATE: "state",
    OperationKind.GRAPH_LAUNCH: "graph_launch",
    OperationKind.COLLECTIVE: "collective",
}


DEVICE_WORK = frozenset(
    {
        OperationKind.LAUNCH,
        OperationKind.GRAPH_LAUNCH,
        OperationKind.COPY_HOST_TO_DEVICE,
        OperationKind.COPY_DEVICE_TO_HOST,
        OperationKind.COPY_DEVICE_TO_DEVICE,
        OperationKind.MEMSET,
        OperationKind.COLLECTIVE,
    }
)
"""The operation kinds that are work on a device (what a region is timed over, what an extract must
hold, what a capture cut short must still have to be worth replaying)."""


class CollectiveOperation(enum.IntEnum):
    """A collective communication library's operations (NCCL's), format 1.5."""

    UNKNOWN = 0
    ALL_REDUCE = 1
    ALL_GATHER = 2
    REDUCE_SCATTER = 3
    BROADCAST = 4
    REDUCE = 5
    SEND = 6
    RECV = 7

    @property
    def label(self) -> str:
        """NCCL's name, e.g. ``AllReduce``."""
        return "".join(part.capitalize() for part in self.name.split("_")) if self else "unknown"


class ObjectKind(enum.IntEnum):
    """Matches the member order of the schema's ObjectBody union."""

    NONE = 0
    DEVICE = 1
    STREAM = 2
    EVENT = 3
    BUFFER = 4
    EXECUTABLE = 5
    GLOBAL = 6
    FILE_REFERENCE = 7
    GRAPH = 8  # format 1.2

    @property
    def label(self) -> str:
        return self.name.lower()


class ExecutableFormat(enum.IntEnum):
    UNKNOWN = 0
    CUBIN = 1
    PTX = 2
    FATBIN = 3


EXECUTABLE_FORMATS = {"cubin": ExecutableFormat.CUBIN, "ptx": ExecutableFormat.PTX, "fatbin": ExecutableFormat.FATBIN}
"""Executable formats by name: as ``format.cubin.detect_format`` returns them and flags spell them."""


class ParameterKind(enum.IntEnum):
    UNKNOWN = 0
    VALUE = 1
    POINTER = 2
    TENSOR_MAP = 3


class RelocationKind(enum.IntEnum):
    POINTER = 0
    TENSOR_MAP = 1


class MemoryKind(enum.IntEnum):
    DEVICE = 0
    HOST_PINNED = 1
    MANAGED = 2


class DType(enum.IntEnum):
    UNKNOWN = 0
    BOOL = 1
    INT8 = 2
    UINT8 = 3
    INT16 = 4
    UINT16 = 5
    INT32 = 6
    UINT32 = 7
    INT64 = 8
    UINT64 = 9
    FLOAT16 = 10
    BFLOAT16 = 11
    FLOAT32 = 12
    FLOAT64 = 13
    FLOAT8_E4M3FN = 14
    FLOAT8_E5M2 = 15
    COMPLEX64 = 16
    COMPLEX128 = 17


class FilePolicy(enum.IntEnum):
    REFERENCE = 0
    CAPTURE_RANGES = 1
    CAPTURE_ALL = 2
    FAIL = 3

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")


class FileValidation(enum.IntEnum):
    IDENTITY = 0
    DIGEST = 1
    NONE = 2

    @property
    def label(self) -> str:
        return self.name.lower()


class GraphEdgeType(enum.IntEnum):
    """(1.7) How a graph edge orders its nodes (CUgraphDependencyType)."""

    FULL = 0  # the destination starts once the source has ended
    PROGRAMMATIC = 1  # it may start once every block of the source triggered it or ended (PDL)


class GraphEdgePort(enum.IntEnum):
    """(1.7) The event of the source an edge waits for (CU_GRAPH_KERNEL_NODE_PORT_*)."""

    DEFAULT = 0  # the source's end
    PROGRAMMATIC = 1  # every block of the source triggered its dependents (or ended)
    LAUNCH_ORDER = 2  # every block of the source began


LAUNCH_FLAG_COOPERATIVE = 1
# the kernel waits for the host to write a release into pinned memory (XLA's autotuner DelayKernel):
# a replay, which never writes it, skips the launch (format/host_waits.py says why)
LAUNCH_FLAG_HOST_RELEASED = 2
# (1.7) launched with programmatic stream serialization allowed (PDL, CUDA's launch attribute
# CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION): it may begin before the previous kernel on
# its stream ends (it waits for that kernel's results in griddepcontrol.wait)
LAUNCH_FLAG_PROGRAMMATIC = 4
LAUNCH_FLAGS_KNOWN = LAUNCH_FLAG_COOPERATIVE | LAUNCH_FLAG_HOST_RELEASED | LAUNCH_FLAG_PROGRAMMATIC
COPY_FLAG_ASYNC = 1
# (1.6) the range held none of the program's data when its region began (memory its framework called
# free, or an allocation the region made): its bytes are the recorder's choice, and the region writes
# what it reads of them. Such a state may come after operations of its region that wrote the range
# (the bytes the region left there), and verification may poison it whatever its type (docs/VERIFY.md)
STATE_FLAG_UNDEFINED = 1
