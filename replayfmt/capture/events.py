"""What the recorder sees: driver events, decoded from CUPTI callbacks into plain values.

These types are the boundary between the CUPTI source (which reads driver parameter structs and
needs a GPU) and the translator (which turns events into capture records and is tested on the
CPU with synthetic event streams). Handles (streams, events, modules, functions) are the
program's raw driver handles as integers; 0 is the legacy default stream.

Events are not frozen: a frozen dataclass costs about a microsecond more to build, and one is
built on every launch of the program.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from replayfmt.format import model as m
from replayfmt.format.model import GraphNodeKind


class MemoryApi(enum.Enum):
    """How an allocation was made; decides whether it can be replayed."""

    DEVICE = "device"  # cuMemAlloc*, stream-ordered pools (cuMemAllocAsync), VMM maps (cuMemMap)
    HOST_PINNED = "host_pinned"  # cuMemHostAlloc / cuMemAllocHost / cuMemHostRegister: kernels may read it
    MANAGED = "managed"  # cuMemAllocManaged: the host and the device both use it


@dataclass(slots=True)
class ModuleImage:
    """Code loaded by the program. ``key`` is ("module", CUmodule) or ("library", CUlibrary)."""

    key: tuple[str, int]
    data: bytes | None  # the image, when it was given in memory
    path: str | None = None  # the file it was loaded from (cuModuleLoad, cuLibraryLoadFromFile)
    call: str = ""


@dataclass(frozen=True, slots=True)
class GlobalVariable:
    """A module global's storage in the program: a ``__device__`` or ``__constant__`` variable."""

    symbol: str
    address: int
    size: int
    initial: bytes | None = None  # what a fresh load of its module holds (None: not known)


@dataclass(slots=True)
class ModuleGlobals:
    """The globals of a module whose kernel runs for the first time (sent before that launch):
    the host may have written them (``cudaMemcpyToSymbol``: cuFFT stores a base pointer there),
    and its kernels read them without naming them in their parameters."""

    key: tuple[str, int]
    variables: tuple[GlobalVariable, ...]


@dataclass(slots=True)
class ModuleUnload:
    key: tuple[str, int]


@dataclass(slots=True)
class Kernel:
    """A launched function: its handle, symbol name, the module it came from and its parameter
    layout as the driver reports it ((offset, size) by ordinal)."""

    handle: int
    name: str
    module: tuple[str, int] | None
    layout: tuple[tuple[int, int], ...]


@dataclass(slots=True)
class Allocation:
    address: int
    size: int
    api: MemoryApi = MemoryApi.DEVICE
    call: str = "cuMemAlloc_v2"


@dataclass(slots=True)
class Free:
    address: int
    call: str = "cuMemFree_v2"


@dataclass(slots=True)
class HostDevicePointer:
    """The device address of host memory (cuMemHostGetDevicePointer): registered memory may be
    reached by kernels at an address other than the host's."""

    host: int
    device: int
    call: str = "cuMemHostGetDevicePointer_v2"


@dataclass(slots=True)
class AddressReserved:
    """A virtual address range reserved (cuMemAddressReserve); memory is mapped into it later."""

    address: int
    size: int
    call: str = "cuMemAddressReserve"


@dataclass(slots=True)
class AddressFreed:
    """A reserved range given back (cuMemAddressFree)."""

    address: int
    size: int
    call: str = "cuMemAddressFree"


@dataclass(slots=True)
class Mapped:
    """Physical memory mapped at ``address`` (cuMemMap): device memory from now on. Allocators
    grow a reserved range piece by piece (PyTorch's expandable segments)."""

    address: int
    size: int
    call: str = "cuMemMap"


@dataclass(slots=True)
class Unmapped:
    """``size`` bytes at ``address`` unmapped (cuMemUnmap)."""

    address: int
    size: int
    call: str = "cuMemUnmap"


@dataclass(slots=True)
class LaunchBegin:
    """A launch about to be enqueued (the driver has not run it yet)."""

    kernel: Kernel
    grid: m.Dims
    block: m.Dims
    shared_memory: int
    stream: int
    parameters: bytes  # laid out by kernel.layout
    cluster: m.Dims = (0, 0, 0)
    cooperative: bool = False
    call: str = "cuLaunchKernel"
    # launched with programmatic stream serialization allowed (PDL): it may begin before the
    # previous kernel on its stream ends
    programmatic: bool = False


@dataclass(slots=True)
class RepeatedLaunches:
    """Launches the recorder's C library answered without a call into Python, in the program's
    order: each repeats a launch the translator armed (:mod:`replayfmt.capture.launch_ring`)."""

    launches: Any  # numpy array of launch_ring.RING_DTYPE
    armed: dict[int, Any]  # arming id -> what the translator armed
    first: int = -1  # the operation index of the first launch, once all are written (in order)


@dataclass(slots=True)
class LaunchEnd:
    """The launch call returned (``result`` 0: enqueued)."""

    stream: int
    result: int = 0


class CopyDirection(enum.Enum):
    H2D = "h2d"
    D2H = "d2h"
    D2D = "d2d"
    DEFAULT = "default"  # cuMemcpy/cuMemcpyAsync: decided by the addresses


@dataclass(slots=True)
class Copy:
    direction: CopyDirection
    dst: int
    src: int
    size: int
    stream: int = 0
    asynchronous: bool = False
    call: str = "cuMemcpy"


@dataclass(slots=True)
class CopyDone:
    """A synchronous device-to-host copy returned: the host bytes are what the program received."""

    dst: int
    size: int


@dataclass(slots=True)
class Memset:
    address: int
    value: int
    element_size: int
    count: int
    stream: int = 0
    call: str = "cuMemsetD8_v2"


@dataclass(slots=True)
class StreamCreated:
    handle: int
    flags: int = 0
    priority: int = 0


@dataclass(slots=True)
class EventCreated:
    handle: int
    flags: int = 0


@dataclass(slots=True)
class EventRecorded:
    event: int
    stream: int


@dataclass(slots=True)
class StreamWaited:
    stream: int
    event: int


@dataclass(slots=True)
class StreamSynchronized:
    stream: int


@dataclass(slots=True)
class ContextSynchronized:
    pass


@dataclass(slots=True)
class EventSynchronized:
    event: int


@dataclass(slots=True)
class DeviceChanged:
    """The calls that follow run on ``device`` (the calling context's device changed: a program
    that works on several GPUs from one process)."""

    device: m.Device


@dataclass(slots=True)
class HostFunction:
    """A host function enqueued in ``stream`` (cuLaunchHostFunc, cuStreamAddCallback): it keeps
    its place in the stream's order; its code, the program's own, is not captured."""

    stream: int
    call: str = "cuLaunchHostFunc"


@dataclass(slots=True)
class GraphKernel:
    """A graph's kernel node: the function, its shape and its argument block."""

    kernel: Kernel
    grid: m.Dims
    block: m.Dims
    shared_memory: int
    parameters: bytes
    cluster: m.Dims = (0, 0, 0)


@dataclass(slots=True)
class GraphNodeInfo:
    """One node of a graph as the driver reports it; addresses are the program's.
    ``unsupported``: why the node cannot be recorded ("" when it can)."""

    kind: GraphNodeKind
    handle: int = 0  # the CUgraphNode (of the graph the executable was made from)
    kernel: GraphKernel | None = None
    src: int = 0  # memcpy source address
    dst: int = 0  # memcpy or memset destination address
    size: int = 0  # memcpy bytes
    value: int = 0  # memset
    element_size: int = 0
    width: int = 0
    height: int = 1
    pitch: int = 0
    event: int = 0  # event record / wait: the event handle
    child: GraphDescription | None = None
    unsupported: str = ""


@dataclass(slots=True)
class GraphDescription:
    """A CUDA graph read with the driver: its nodes and edges (node indices, dst after src)."""

    nodes: list[GraphNodeInfo]
    edges: list[tuple[int, int]]
    edge_data: list[m.GraphEdgeData] = field(default_factory=list)  # one per edge; empty: all full dependencies


@dataclass(slots=True)
class GraphInstantiated:
    """An executable graph was made from ``graph`` (cuGraphInstantiate*) or now runs it
    (cuGraphExecUpdate)."""

    graph_exec: int
    graph: GraphDescription


@dataclass(slots=True)
class GraphKernelUpdated:
    """cuGraphExecKernelNodeSetParams: one kernel node of an executable graph changed."""

    graph_exec: int
    node: int  # the CUgraphNode handle (of the graph it was instantiated from)
    kernel: GraphKernel


@dataclass(slots=True)
class GraphNodeUpdated:
    """cuGraphExecMemsetNodeSetParams and kin: one node of an executable graph got new parameters
    (``info.unsupported`` says why when the recorder cannot read the change)."""

    graph_exec: int
    node: int  # the CUgraphNode handle (of the graph it was instantiated from)
    info: GraphNodeInfo


@dataclass(slots=True)
class GraphNodeEnabled:
    """cuGraphNodeSetEnabled: a node of an executable graph was disabled (it runs as an empty
    node) or enabled again."""

    graph_exec: int
    node: int  # the CUgraphNode handle (of the graph it was instantiated from)
    enabled: bool


@dataclass(slots=True)
class GraphExecDestroyed:
    graph_exec: int


@dataclass(slots=True)
class GraphLaunched:
    """cuGraphLaunch of executable graph ``graph_exec`` on ``stream``."""

    graph_exec: int
    stream: int


@dataclass(slots=True)
class NotReproducible:
    """A call replay cannot reproduce (host functions, IPC, managed memory, graphs, ...)."""

    call: str
    reason: str
    stream: int = 0


Event = (
    ModuleImage
    | ModuleGlobals
    | ModuleUnload
    | Allocation
    | Free
    | HostDevicePointer
    | AddressReserved
    | AddressFreed
    | Mapped
    | Unmapped
    | LaunchBegin
    | LaunchEnd
    | Copy
    | CopyDone
    | Memset
    | StreamCreated
    | EventCreated
    | EventRecorded
    | StreamWaited
    | StreamSynchronized
    | ContextSynchronized
    | EventSynchronized
    | DeviceChanged
    | HostFunction
    | GraphInstantiated
    | GraphKernelUpdated
    | GraphNodeUpdated
    | GraphNodeEnabled
    | GraphExecDestroyed
    | GraphLaunched
    | NotReproducible
)
