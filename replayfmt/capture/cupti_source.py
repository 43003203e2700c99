"""The driver-level source of events: CUPTI callbacks, decoded into :mod:`events`.

CUPTI calls :meth:`CuptiSource._callback` on the thread that made each enabled driver call, at
its entry and at its exit, with a ``CUpti_CallbackData`` (driver domain) or a
``CUpti_ResourceData`` (resource domain). Parameter structs are read in place at the offsets of
CUDA's ``generated_cuda_meta.h`` (x86-64). The recorder's own driver calls (parameter layouts,
snapshots) run under a per-thread guard, so they are never recorded. Nothing raised here
reaches the program: errors go to the translator's report.
Which code a launched function came from (and the module globals it may read) is
:mod:`loaded_code`'s to find.
"""

from __future__ import annotations

import os
import struct
import threading
import traceback
from collections.abc import Callable
from typing import Any

from replayfmt.capture import events as ev
from replayfmt.capture.contexts import DeviceTracker, ProgramContexts
from replayfmt.capture.cupti_api import (
    DOMAIN_DRIVER_API,
    DOMAIN_RESOURCE,
    RESOURCE_MODULE_LOADED,
    RESOURCE_MODULE_UNLOAD_STARTING,
    Cupti,
)
from replayfmt.capture.graphs import GRAPH_NODE_CHANGES, GRAPH_NODE_UPDATES, GRAPH_UPDATES_NOT_FOLLOWED, GraphCalls
from replayfmt.capture.launch_attributes import PLAIN, LaunchAttributes, launch_attributes
from replayfmt.capture.launch_ring import LaunchRing
from replayfmt.capture.loaded_code import LoadedCode
from replayfmt.capture.nccl_log import NCCL_KERNEL
from replayfmt.capture.process_memory import MEMORY, c_string, image_bytes, read, u64
from replayfmt.cuda.driver import driver
from replayfmt.cuda.functions import parameter_layout
from replayfmt.errors import ReplayUsageError

_ENTER, _EXIT = 0, 1
_LAUNCH_PARAM_BUFFER_POINTER, _LAUNCH_PARAM_BUFFER_SIZE = 1, 2


# callbackSite, (functionName), functionParams, functionReturnValue, symbolName
_CALLBACK_DATA = struct.Struct("<I4x8xQQQ")
_LAUNCH_KERNEL = struct.Struct("<Q7I4xQQQ")  # f, grid, block, sharedMemBytes, hStream, kernelParams, extra
_LAUNCH_COOPERATIVE = struct.Struct("<Q7I4xQQ")
_LAUNCH_EX = struct.Struct("<QQQQ")  # config, f, kernelParams, extra
_LAUNCH_CONFIG = struct.Struct("<7I4xQQI")  # grid, block, sharedMemBytes, hStream, attrs, numAttrs
_MODULE_RESOURCE = struct.Struct("<I4xQQ")  # moduleId, cubinSize, pCubin
_CORRELATION_ID = 64  # offset of CUpti_CallbackData.correlationId (the id activity records carry)
_CONTEXT = 40  # offset of CUpti_CallbackData.context: the calling thread's context
_unpack_from = struct.unpack_from

# (self, callback site, functionParams, functionReturnValue, call name, symbolName)
Decoder = Callable[["CuptiSource", int, int, int, str, int], None]


class _Kernel:
    """A launched function as the source caches it: its event, and how to read its arguments."""

    __slots__ = ("end", "kernel", "layout", "pointers", "symbol")

    def __init__(self, kernel: ev.Kernel, symbol: int) -> None:
        self.kernel = kernel
        self.symbol = symbol  # the driver's symbolName pointer: a changed pointer means a reused handle
        self.layout = kernel.layout
        self.pointers = struct.Struct(f"<{len(kernel.layout)}Q")
        self.end = max((o + s for o, s in kernel.layout), default=0)

    def arguments(self, kernel_params: int, extra: int) -> bytes:
        if kernel_params and self.layout:
            block = bytearray(self.end)
            for (offset, size), pointer in zip(self.layout, self.pointers.unpack_from(MEMORY, kernel_params)):
                block[offset : offset + size] = MEMORY[pointer : pointer + size]
            return bytes(block)
        if extra:  # CU_LAUNCH_PARAM_BUFFER_POINTER / _SIZE pairs, ended by CU_LAUNCH_PARAM_END
            buffer = size = 0
            for i in range(0, 64, 2):
                key = u64(extra + 8 * i)
                if key == 0:
                    break
                value = u64(extra + 8 * i + 8)
                if key == _LAUNCH_PARAM_BUFFER_POINTER:
                    buffer = value
                elif key == _LAUNCH_PARAM_BUFFER_SIZE:
                    size = u64(value)
            return read(buffer, size) if buffer and size else b""
        return b""


class CuptiSource(GraphCalls):
    """Subscribes to CUPTI and feeds decoded driver events to ``sink`` (the translator).

    ``launch_results``: also report each launch's return (kernel mode needs it to close an
    instance; region mode does not, and skips the work on every launch). ``cu``: the driver
    bindings (default ``cuda.bindings.driver``; tests give a stand-in). ``ring``: the launches
    the recorder's C library answers itself (region mode, where that library is built).
    """

    def __init__(
        self,
        cupti: Cupti | None,
        sink: Callable[[ev.Event], None],
        guard: threading.local,
        *,
        launch_results: bool = True,
        cu: Any = None,
        ring: LaunchRing | None = None,
        lock: Any = None,
        contexts: ProgramContexts | None = None,
    ) -> None:
        self.cupti = cupti
        self.cu = cu or driver()
        self._sink = sink
        self._guard = guard
        self._launch_results = launch_results
        self._kernels: dict[int, _Kernel] = {}
        self._subscriber: Any = None
        self._c_callback: Any = None
        self._by_cbid: dict[int, tuple[Decoder, str]] = {}
        self._code = LoadedCode(self.cu, sink)
        self._graphs = None  # a GraphReader, made at the first graph call
        self._pending_updates: dict[int, ev.Event] = {}  # thread id -> kernel-node update in its call
        self._captures = 0  # stream captures in progress: work enqueued then is recorded into graphs, not run
        self._deliver = sink
        # launches the library recorded in C (launch_ring): taken at each callback, and every
        # arming withdrawn before a call that could change what a launch means
        self.ring = ring
        # held from a ring's take until the call that took it is written (the recorder's times lock)
        self._lock = lock if lock is not None else threading.RLock()
        self._keeps_armed: set[int] = set()  # callback ids of calls that change no launch's meaning
        self.devices = DeviceTracker(contexts)  # the device the calls run on

    # -- subscription ----------------------------------------------------------------------

    def start(self) -> None:
        cupti = self.cupti
        if cupti is None:
            raise ReplayUsageError("this CUPTI source was built without CUPTI (a test stand-in): it cannot listen")
        self._subscriber, self._c_callback = cupti.subscribe(self._callback, "replayfmt")
        for cbid in self.route(cupti.driver_callback_ids):
            cupti.enable_callback(self._subscriber, DOMAIN_DRIVER_API, cbid)
        launches = [cbid for cbid, (decoder, _) in self._by_cbid.items() if decoder in _LAUNCH_DECODERS]
        cupti.skip_exits(launches, skip=not self._launch_results)  # only kernel mode needs a launch's exit
        cupti.enable_callback(self._subscriber, DOMAIN_RESOURCE, RESOURCE_MODULE_LOADED)
        cupti.enable_callback(self._subscriber, DOMAIN_RESOURCE, RESOURCE_MODULE_UNLOAD_STARTING)

    def route(self, callback_ids: dict[str, int]) -> list[int]:
        """Map driver callback ids (by call name) to their decoders; the ids to enable."""
        for name, decoder in _DECODERS.items():
            cbid = callback_ids.get(name)
            if cbid is not None:
                self._by_cbid[cbid] = (decoder, name)
                if decoder in _KEEP_ARMED or decoder in _LAUNCH_DECODERS:
                    self._keeps_armed.add(cbid)
        return list(self._by_cbid)

    def stop(self) -> None:
        if self._subscriber is not None and self.cupti is not None:
            self.cupti.unsubscribe(self._subscriber)
            self._subscriber = None

    # -- the callback ----------------------------------------------------------------------

    def _callback(self, userdata: int | None, domain: int, cbid: int, data: int | None) -> None:
        guard = self._guard
        if not data:
            return
        try:
            if domain != DOMAIN_DRIVER_API:
                self._on_resource(cbid, data)  # also inside the recorder's own calls: lazy loads
                return
            if getattr(guard, "busy", False):
                return
            entry = self._by_cbid.get(cbid)
            if entry is None:
                return
            guard.busy = True
            try:
                guard.correlation = data  # read only when asked (correlation_id): most calls never are
                site, params, result, symbol = _CALLBACK_DATA.unpack_from(MEMORY, data)
                with self._lock:
                    withdraws = cbid not in self._keeps_armed
                    if self.ring is not None and (withdraws or self.ring.pending()):
                        self._take_ring(disarm=withdraws)
                    if self._code.unloads:
                        self._forget_unloaded()
                    moved = self.devices.moved(u64(data + _CONTEXT))
                    if moved is not None:
                        self._sink(ev.DeviceChanged(moved))
                    entry[0](self, site, params, result, entry[1], symbol)
            finally:
                guard.busy = False
        except Exception as exc:  # never raise into the program
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            where = f"{os.path.basename(frame.filename)}:{frame.lineno}"
            call = self._by_cbid.get(cbid, (None, f"callback {domain}/{cbid}"))[1]
            self._sink(
                ev.NotReproducible(call, f"the recorder failed to decode it ({type(exc).__name__}: {exc}, {where})")
            )

    def settle(self) -> None:
        """Hand on the launches the C library recorded and withdraw every arming: before a region
        or scope starts or ends, and before the recorder closes."""
        with self._lock:
            self._take_ring(disarm=True)
            self._forget_unloaded()

    def _forget_unloaded(self) -> None:
        """The lazily loaded modules the driver unloaded: the sink hears of them, and their
        kernels are forgotten (a handle may come back as another module's)."""
        for key in self._code.take_unloads():
            self._forget_kernels_of(key)

    def _forget_kernels_of(self, key: tuple[str, int]) -> None:
        for f in [f for f, k in self._kernels.items() if k.kernel.module == key]:
            del self._kernels[f]

    def _take_ring(self, *, disarm: bool) -> None:
        repeats = self.ring.take(disarm=disarm) if self.ring is not None else None
        if repeats is not None:
            self._sink(repeats)

    def correlation_id(self) -> int:
        """CUPTI's correlation id of the callback's driver call on this thread (0: none)."""
        data = getattr(self._guard, "correlation", 0)
        return _unpack_from("<I", MEMORY, data + _CORRELATION_ID)[0] if data and self._guard.busy else 0

    @staticmethod
    def _succeeded(result: int) -> bool:
        """Whether the call returned CUDA_SUCCESS (``result`` points at its CUresult)."""
        return result == 0 or _unpack_from("<i", MEMORY, result)[0] == 0

    def _on_resource(self, cbid: int, data: int) -> None:
        descriptor = u64(data + 16)  # CUpti_ResourceData.resourceDescriptor
        if not descriptor:
            return
        module_id, size, cubin = _MODULE_RESOURCE.unpack_from(MEMORY, descriptor)
        self._code.resource(cbid, module_id, (lambda: read(cubin, size)) if cubin and size else None)

    # -- kernels ---------------------------------------------------------------------------

    def _kernel(self, handle: int, symbol: int) -> _Kernel:
        cached = self._kernels.get(handle)
        if cached is not None and cached.symbol == symbol:
            return cached
        name = c_string(symbol) or f"function_{handle:#x}"
        cu = self.cu
        key, info = self._code.module_of(handle, name)
        layout = parameter_layout(cu, handle, info)
        kernel = self._kernels[handle] = _Kernel(ev.Kernel(handle, name, key, tuple(layout)), symbol)
        return kernel

    def _launch(
        self,
        site: int,
        result: int,
        call: str,
        f: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        smem: int,
        stream: int,
        kernel_params: int,
        extra: int,
        symbol: int,
        attributes: LaunchAttributes = PLAIN,
    ) -> None:
        if site == _EXIT:
            known = self._kernels.get(f)  # an NCCL kernel's exit too: a copy of its results follows it
            if self._launch_results or (known and NCCL_KERNEL.search(known.kernel.name)):
                self._sink(ev.LaunchEnd(stream, 0 if self._succeeded(result) else 1))
            return
        kernel = self._kernel(f, symbol)
        arguments = kernel.arguments(kernel_params, extra)
        cluster, cooperative, programmatic = attributes
        self._sink(
            ev.LaunchBegin(
                kernel.kernel, grid, block, smem, stream, arguments, cluster, cooperative, call, programmatic
            )
        )

    # -- decoders ---------------------------------------------------------------------------

    def _on_launch_kernel(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        f, gx, gy, gz, bx, by, bz, smem, stream, kp, extra = _LAUNCH_KERNEL.unpack_from(MEMORY, p)
        self._launch(site, result, call, f, (gx, gy, gz), (bx, by, bz), smem, stream, kp, extra, symbol)

    def _on_launch_cooperative(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        f, gx, gy, gz, bx, by, bz, smem, stream, kp = _LAUNCH_COOPERATIVE.unpack_from(MEMORY, p)
        attributes = LaunchAttributes(cooperative=True)
        self._launch(site, result, call, f, (gx, gy, gz), (bx, by, bz), smem, stream, kp, 0, symbol, attributes)

    def _on_launch_ex(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        config, f, kp, extra = _LAUNCH_EX.unpack_from(MEMORY, p)
        gx, gy, gz, bx, by, bz, smem, stream, attrs, count = _LAUNCH_CONFIG.unpack_from(MEMORY, config)
        attributes, events = launch_attributes(attrs, count)
        self._launch(site, result, call, f, (gx, gy, gz), (bx, by, bz), smem, stream, kp, extra, symbol, attributes)
        # these events trigger once every block has triggered them or begun, at the kernel's end at
        # the latest: recorded after the launch, their waiters wait for the whole kernel (the same
        # results, without the overlap they allowed; CUDA allows that schedule too)
        for event in events if site != _EXIT else ():
            self._sink(ev.EventRecorded(event, stream))

    # -- memory ----------------------------------------------------------------------------

    def _on_alloc_pitch(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == _EXIT and self._succeeded(result):
            out, pitch, _width, height = _unpack_from("<QQQQ", MEMORY, p)
            self._sink(ev.Allocation(u64(out), u64(pitch) * height, ev.MemoryApi.DEVICE, call))

    def _on_free(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == _ENTER:
            self._sink(ev.Free(u64(p), call))

    def _on_mem_map(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == _EXIT and self._succeeded(result):  # (ptr, size, offset, handle, flags)
            address, size = _unpack_from("<QQ", MEMORY, p)
            self._sink(ev.Mapped(address, size, call))

    def _on_mem_unmap(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == _ENTER:  # (ptr, size)
            address, size = _unpack_from("<QQ", MEMORY, p)
            self._sink(ev.Unmapped(address, size, call))

    def _on_host_device_pointer(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == _EXIT and self._succeeded(result):  # (CUdeviceptr* pdptr, void* p, flags)
            out, host = _unpack_from("<QQ", MEMORY, p)
            self._sink(ev.HostDevicePointer(host, u64(out), call))

    def _on_address_reserve(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == _EXIT and self._succeeded(result):  # (CUdeviceptr* ptr, size, alignment, addr, flags)
            out, size = _unpack_from("<QQ", MEMORY, p)
            self._sink(ev.AddressReserved(u64(out), size, call))

    def _on_address_free(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == _ENTER:  # (ptr, size)
            address, size = _unpack_from("<QQ", MEMORY, p)
            self._sink(ev.AddressFreed(address, size, call))

    def _on_host_register(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == _EXIT and self._succeeded(result):  # (void* p, size, flags): the pointer itself
            address, size = _unpack_from("<QQ", MEMORY, p)
            self._sink(ev.Allocation(address, size, ev.MemoryApi.HOST_PINNED, call))

    # -- streams, events, synchronisation ----------------------------------------------------

    def _on_stream_create(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == _EXIT and self._succeeded(result):
            out, flags, priority = _unpack_from("<QIi", MEMORY, p)
            if call != "cuStreamCreateWithPriority":
                priority = 0
            self._sink(ev.StreamCreated(u64(out), flags, priority))

    def _on_event_create(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == _EXIT and self._succeeded(result):
            out, flags = _unpack_from("<QI", MEMORY, p)
            self._sink(ev.EventCreated(u64(out), flags))

    def _on_event_record(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == _ENTER:
            event, stream = _unpack_from("<QQ", MEMORY, p)
            self._sink(ev.EventRecorded(event, stream))

    def _on_stream_wait(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == _ENTER:
            stream, event = _unpack_from("<QQ", MEMORY, p)
            self._sink(ev.StreamWaited(stream, event))

    def _on_host_function(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == _ENTER:  # (hStream, fn, userData[, flags]): the stream comes first in both calls
            self._sink(ev.HostFunction(u64(p), call))

    def _on_stream_sync(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == _EXIT:
            self._sink(ev.StreamSynchronized(u64(p)))

    def _on_context_sync(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == _EXIT:
            self._sink(ev.ContextSynchronized())

    def _on_event_sync(self, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == _EXIT:
            self._sink(ev.EventSynchronized(u64(p)))


def _alloc_decoder(api: ev.MemoryApi) -> Decoder:
    """cuMemAlloc-like calls: (CUdeviceptr* out, size_t size, ...), reported once they succeed."""

    def decode(self: CuptiSource, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == _EXIT and self._succeeded(result):
            out, size = _unpack_from("<QQ", MEMORY, p)
            self._sink(ev.Allocation(u64(out), size, api, call))

    return decode


def _copy_decoder(direction: ev.CopyDirection, asynchronous: bool) -> Decoder:
    def decode(self: CuptiSource, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if asynchronous:
            dst, src, size, stream = _unpack_from("<QQQQ", MEMORY, p)
        else:
            (dst, src, size), stream = _unpack_from("<QQQ", MEMORY, p), 0
        if site == _EXIT:
            if direction != ev.CopyDirection.H2D and not asynchronous and self._succeeded(result):
                self._sink(ev.CopyDone(dst, size))
            return
        self._sink(ev.Copy(direction, dst, src, size, stream, asynchronous, call))

    return decode


def _peer_copy_decoder(asynchronous: bool) -> Decoder:
    """cuMemcpyPeer(Async): a device-to-device copy between two devices' memory (the contexts it
    names are those of the two addresses, which the allocations already say)."""

    def decode(self: CuptiSource, site: int, p: int, result: int, call: str, symbol: int) -> None:
        dst, _dst_context, src, _src_context, size, *stream = _unpack_from(
            "<QQQQQQ" if asynchronous else "<QQQQQ", MEMORY, p
        )
        if site == _EXIT:
            if not asynchronous and self._succeeded(result):
                self._sink(ev.CopyDone(dst, size))
            return
        self._sink(ev.Copy(_D2D, dst, src, size, stream[0] if stream else 0, asynchronous, call))

    return decode


def _memset_decoder(element_size: int, asynchronous: bool) -> Decoder:
    code = {1: "B", 2: "H", 4: "I"}[element_size]
    layout = struct.Struct(f"<Q{code}{8 - element_size}xQ" + ("Q" if asynchronous else ""))

    def decode(self: CuptiSource, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == _ENTER:
            address, value, count, *stream = layout.unpack_from(MEMORY, p)
            self._sink(ev.Memset(address, value, element_size, count, stream[0] if stream else 0, call))

    return decode


def _module_load_decoder(kind: str, from_file: bool) -> Decoder:
    def decode(self: CuptiSource, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site != _EXIT or not self._succeeded(result):
            return
        out, source = _unpack_from("<QQ", MEMORY, p)
        key = (kind, u64(out))
        if from_file:
            self._code.loaded(ev.ModuleImage(key, None, c_string(source), call))
        else:
            self._code.loaded(ev.ModuleImage(key, image_bytes(source), None, call))

    return decode


def _module_unload_decoder(kind: str) -> Decoder:
    def decode(self: CuptiSource, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == _ENTER:
            key = (kind, u64(p))
            self._sink(ev.ModuleUnload(key))
            self._code.unloaded(key)
            self._forget_kernels_of(key)

    return decode


def _global_lookup_decoder(kind: str) -> Decoder:
    """cuModuleGetGlobal / cuLibraryGetGlobal: the host is about to write a global (what
    cudaMemcpyToSymbol does), perhaps before any kernel of its module ran."""

    def decode(self: CuptiSource, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == _EXIT and self._succeeded(result):
            _, _, handle, name = _unpack_from("<QQQQ", MEMORY, p)
            self._code.looked_up((kind, handle), c_string(name))

    return decode


def _refusal_decoder(reason: str) -> Decoder:
    def decode(self: CuptiSource, site: int, p: int, result: int, call: str, symbol: int) -> None:
        if site == _ENTER:
            self._sink(ev.NotReproducible(call, reason))

    return decode


def _variants(*names: str) -> list[str]:
    """A driver call's names with its per-thread-default-stream variants (_ptsz, _ptds)."""
    return [n + suffix for n in names for suffix in ("", "_ptsz", "_ptds")]


_S = CuptiSource
_D, _H2D, _D2H, _D2D = ev.CopyDirection.DEFAULT, ev.CopyDirection.H2D, ev.CopyDirection.D2H, ev.CopyDirection.D2D
_LAUNCHES = (
    (_variants("cuLaunchKernel"), _S._on_launch_kernel),
    (_variants("cuLaunchKernelEx"), _S._on_launch_ex),
    (_variants("cuLaunchCooperativeKernel"), _S._on_launch_cooperative),
)
_LAUNCH_DECODERS = frozenset(decoder for _, decoder in _LAUNCHES)
# calls after which an armed launch means what it meant: the ring is taken, the armings stay
_KEEP_ARMED = frozenset((_S._on_stream_create, _S._on_event_create, _S._on_event_record, _S._on_stream_wait))
_KEEP_ARMED |= {_S._on_stream_sync, _S._on_context_sync, _S._on_event_sync}
_DECODERS: dict[str, Decoder] = {}
for _names, _decoder in [
    *_LAUNCHES,
    (_variants("cuMemAlloc_v2", "cuMemAllocAsync", "cuMemAllocFromPoolAsync"), _alloc_decoder(ev.MemoryApi.DEVICE)),
    (["cuMemAllocPitch_v2"], _S._on_alloc_pitch),
    (["cuMemHostAlloc", "cuMemHostAlloc_v2", "cuMemAllocHost_v2"], _alloc_decoder(ev.MemoryApi.HOST_PINNED)),
    (["cuMemHostRegister", "cuMemHostRegister_v2"], _S._on_host_register),
    (["cuMemHostGetDevicePointer", "cuMemHostGetDevicePointer_v2"], _S._on_host_device_pointer),
    (["cuMemAllocManaged"], _alloc_decoder(ev.MemoryApi.MANAGED)),
    (_variants("cuMemFree_v2", "cuMemFreeAsync", "cuMemFreeHost", "cuMemHostUnregister"), _S._on_free),
    (["cuMemAddressReserve"], _S._on_address_reserve),
    (["cuMemAddressFree"], _S._on_address_free),
    (["cuMemMap"], _S._on_mem_map),
    (["cuMemUnmap"], _S._on_mem_unmap),
    (_variants("cuMemcpy"), _copy_decoder(_D, False)),
    (_variants("cuMemcpyAsync"), _copy_decoder(_D, True)),
    (_variants("cuMemcpyHtoD_v2"), _copy_decoder(_H2D, False)),
    (_variants("cuMemcpyHtoDAsync_v2"), _copy_decoder(_H2D, True)),
    (_variants("cuMemcpyDtoH_v2"), _copy_decoder(_D2H, False)),
    (_variants("cuMemcpyDtoHAsync_v2"), _copy_decoder(_D2H, True)),
    (_variants("cuMemcpyDtoD_v2"), _copy_decoder(_D2D, False)),
    (_variants("cuMemcpyDtoDAsync_v2"), _copy_decoder(_D2D, True)),
    (_variants("cuMemcpyPeer"), _peer_copy_decoder(False)),
    (_variants("cuMemcpyPeerAsync"), _peer_copy_decoder(True)),
    (_variants("cuMemsetD8_v2"), _memset_decoder(1, False)),
    (_variants("cuMemsetD16_v2"), _memset_decoder(2, False)),
    (_variants("cuMemsetD32_v2"), _memset_decoder(4, False)),
    (_variants("cuMemsetD8Async"), _memset_decoder(1, True)),
    (_variants("cuMemsetD16Async"), _memset_decoder(2, True)),
    (_variants("cuMemsetD32Async"), _memset_decoder(4, True)),
    (["cuStreamCreate", "cuStreamCreateWithPriority"], _S._on_stream_create),
    (["cuEventCreate"], _S._on_event_create),
    (_variants("cuEventRecord", "cuEventRecordWithFlags"), _S._on_event_record),
    (_variants("cuStreamWaitEvent"), _S._on_stream_wait),
    (_variants("cuStreamSynchronize"), _S._on_stream_sync),
    (["cuCtxSynchronize", "cuCtxSynchronize_v2"], _S._on_context_sync),
    (["cuEventSynchronize"], _S._on_event_sync),
    (["cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary"], _module_load_decoder("module", False)),
    (["cuModuleLoad"], _module_load_decoder("module", True)),
    (["cuLibraryLoadData"], _module_load_decoder("library", False)),
    (["cuLibraryLoadFromFile"], _module_load_decoder("library", True)),
    (["cuModuleGetGlobal_v2", "cuModuleGetGlobal"], _global_lookup_decoder("module")),
    (["cuLibraryGetGlobal"], _global_lookup_decoder("library")),
    (["cuModuleUnload"], _module_unload_decoder("module")),
    (["cuLibraryUnload"], _module_unload_decoder("library")),
    (_variants("cuLaunchHostFunc", "cuStreamAddCallback"), _S._on_host_function),
    (_variants("cuGraphLaunch"), GraphCalls._on_graph_launch),
    (
        [
            "cuGraphInstantiate",
            "cuGraphInstantiate_v2",
            "cuGraphInstantiateWithFlags",
            *_variants("cuGraphInstantiateWithParams"),
        ],
        GraphCalls._on_graph_instantiate,
    ),
    (["cuGraphExecUpdate", "cuGraphExecUpdate_v2"], GraphCalls._on_graph_exec_update),
    (["cuGraphExecDestroy"], GraphCalls._on_graph_exec_destroy),
    (
        _variants("cuStreamBeginCapture", "cuStreamBeginCapture_v2", "cuStreamBeginCaptureToGraph"),
        GraphCalls._on_capture_begin,
    ),
    (_variants("cuStreamEndCapture"), GraphCalls._on_capture_end),
    (GRAPH_NODE_UPDATES, GraphCalls._on_graph_node_update),
    (GRAPH_NODE_CHANGES, GraphCalls._on_graph_node_change),
    (GRAPH_UPDATES_NOT_FOLLOWED, _refusal_decoder("this change to an executable graph is not followed yet")),
    (
        ["cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2", "cuIpcGetMemHandle"],
        _refusal_decoder("memory shared between processes (IPC)"),
    ),
    (
        _variants(
            "cuMemcpy2D_v2",
            "cuMemcpy2DAsync_v2",
            "cuMemcpy3D_v2",
            "cuMemcpy3DAsync_v2",
            "cuMemcpyBatchAsync",
            "cuMemsetD2D8_v2",
            "cuMemsetD2D32_v2",
        ),
        _refusal_decoder("this copy or memset form is not recorded yet"),
    ),
]:
    for _name in _names:
        _DECODERS[_name] = _decoder
