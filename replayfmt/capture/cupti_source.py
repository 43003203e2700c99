"""The driver-level source of events: CUPTI callbacks (cupti-python), decoded into :mod:`events`.

CUPTI calls :meth:`CuptiSource._callback` on the thread that made each enabled driver call, at
its entry and at its exit. The parameter struct of the call sits behind ``functionParams``
(offset 16 of ``CUpti_CallbackData``; cupti-python 13.0 does not expose it), and is read here
with ``struct`` at the offsets of CUDA's ``generated_cuda_meta.h`` (x86-64). The recorder's own
driver calls (parameter layouts, snapshots) run under a per-thread guard, so they are never
recorded. Nothing raised here reaches the program: errors go to the translator's report.
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..cuda import check, driver
from ..errors import ReplayError, ReplayUsageError
from . import events as ev

_string_at = ctypes.string_at
_unpack = struct.unpack
_ENTER, _EXIT = 0, 1
_FATBIN_MAGIC = 0xBA55ED50
_FATBIN_WRAPPER_MAGIC = 0x466243B1
_MAX_IMAGE = 1 << 30
_LAUNCH_PARAM_BUFFER_POINTER, _LAUNCH_PARAM_BUFFER_SIZE = 1, 2
_ATTRIBUTE_COOPERATIVE, _ATTRIBUTE_CLUSTER = 2, 4  # CUlaunchAttributeID
_ATTRIBUTE_SIZE = 72  # sizeof(CUlaunchAttribute)


def _q(address: int, offset: int = 0) -> int:
    return _unpack("<Q", _string_at(address + offset, 8))[0]


def load_cupti() -> Any:
    """The cupti-python module, or a one-line error saying how to get it."""
    try:
        from cupti import cupti
    except ImportError as exc:
        raise ReplayUsageError(
            f"capture needs cupti-python matching the driver's CUPTI ({exc}); install it with "
            "pip install 'replayfmt[capture]'"
        ) from None
    return cupti


def image_bytes(address: int) -> bytes:
    """The bytes of a code image given to the driver in memory: a cubin (ELF), a fatbin (or the
    runtime's fatbin wrapper around one) or NUL-terminated PTX."""
    head = _string_at(address, 64)
    if head[:4] == b"\x7fELF":
        shoff, = _unpack("<Q", head[0x28:0x30])  # fmt: skip
        phoff, = _unpack("<Q", head[0x20:0x28])  # fmt: skip
        phentsize, phnum, shentsize, shnum = _unpack("<HHHH", head[0x36:0x3E])
        size = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
        if not 64 <= size <= _MAX_IMAGE:
            raise ValueError(f"ELF image at {address:#x} claims {size} bytes")
        return _string_at(address, size)
    magic, = _unpack("<I", head[:4])  # fmt: skip
    if magic == _FATBIN_WRAPPER_MAGIC:
        return image_bytes(_unpack("<Q", head[8:16])[0])
    if magic == _FATBIN_MAGIC:
        header_size, = _unpack("<H", head[6:8])  # fmt: skip
        fat_size, = _unpack("<Q", head[8:16])  # fmt: skip
        size = header_size + fat_size
        if not 16 <= size <= _MAX_IMAGE:
            raise ValueError(f"fatbin image at {address:#x} claims {size} bytes")
        return _string_at(address, size)
    return _string_at(address)  # PTX text


class DriverMemory:
    """Device and host memory access for snapshots, through cuda.bindings. Device reads land in
    a reused pinned buffer (DMA at full speed) and are copied out once."""

    def __init__(self, guard: threading.local) -> None:
        self.cu = driver()
        self._guard = guard
        self._stream: Any = None
        self._pinned = 0
        self._pinned_size = 0
        self.copy_seconds = 0.0
        self.copied = 0

    @contextlib.contextmanager
    def _unrecorded(self) -> Iterator[None]:
        """The recorder's own driver calls: never recorded, and the caller's guard state is
        restored (these run inside callbacks, which hold the guard already)."""
        guard = self._guard
        previous = getattr(guard, "busy", False)
        guard.busy = True
        try:
            yield
        finally:
            guard.busy = previous

    def _own_stream(self) -> Any:
        if self._stream is None:
            cu = self.cu
            self._stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        return self._stream

    def _staging(self, size: int) -> int:
        if size > self._pinned_size:
            cu = self.cu
            if self._pinned:
                check(cu.cuMemFreeHost(self._pinned), "cuMemFreeHost")
                self._pinned = 0
            grown = max(size, min(2 * self._pinned_size, 1 << 30), 8 << 20)
            self._pinned = int(check(cu.cuMemHostAlloc(grown, 0), f"cuMemHostAlloc({grown})"))
            self._pinned_size = grown
        return self._pinned

    def read(self, address: int, size: int, stream: int | None) -> bytes:
        cu = self.cu
        with self._unrecorded():
            if stream is None:
                check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
            else:
                check(cu.cuStreamSynchronize(cu.CUstream(stream)), "cuStreamSynchronize (launching stream)")
            if size == 0:
                return b""
            own = self._own_stream()
            chunk = min(size, 1 << 30)
            staging = self._staging(chunk)
            out = bytearray(size) if size > chunk else None
            for start in range(0, size, chunk):
                n = min(chunk, size - start)
                began = time.perf_counter()
                check(cu.cuMemcpyDtoHAsync(staging, address + start, n, own), "cuMemcpyDtoHAsync (snapshot)")
                check(cu.cuStreamSynchronize(own), "cuStreamSynchronize (snapshot)")
                self.copy_seconds += time.perf_counter() - began
                self.copied += n
                if out is None:
                    return _string_at(staging, n)
                ctypes.memmove((ctypes.c_char * n).from_buffer(out, start), staging, n)
            return bytes(out or b"")

    def host_bytes(self, address: int, size: int) -> bytes:
        return _string_at(address, size)

    def find_allocation(self, address: int) -> tuple[int, int] | None:
        cu = self.cu
        with self._unrecorded():
            err, kind = cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address)
            if err != cu.CUresult.CUDA_SUCCESS or kind != cu.CUmemorytype.CU_MEMORYTYPE_DEVICE:
                return None
            err, base, size = cu.cuMemGetAddressRange(address)
            if err != cu.CUresult.CUDA_SUCCESS:
                return None
            return int(base), int(size)

    def close(self) -> None:
        cu = self.cu
        if self._pinned:
            cu.cuMemFreeHost(self._pinned)
            self._pinned = 0
        if self._stream is not None:
            cu.cuStreamDestroy(self._stream)
            self._stream = None


Decoder = Callable[["CuptiSource", int, int, Any], None]  # (self, site, params address, callback data)


class CuptiSource:
    """Subscribes to CUPTI and feeds decoded driver events to ``sink`` (the translator)."""

    def __init__(self, sink: Callable[[ev.Event], None], guard: threading.local) -> None:
        self.cupti = load_cupti()
        self.cu = driver()
        self._sink = sink
        self._guard = guard
        self._kernels: dict[int, ev.Kernel] = {}
        self._subscriber: Any = None
        self._by_cbid: dict[int, Decoder] = {}
        self._loaded: set[tuple[str, int]] = set()  # module and library keys seen loading
        self._library_modules: dict[tuple[str, int], int] = {}  # library key -> its module handle

    # -- subscription ----------------------------------------------------------------------

    def start(self) -> None:
        cupti = self.cupti
        params = cupti.SubscriberParams()
        params.struct_size = cupti.SUBSCRIBER_PARAMS_SIZE
        params.subscriber_name = "replayfmt"
        try:
            self._subscriber = cupti.subscribe_v2(self._callback, None, params.ptr)
        except cupti.cuptiError as exc:
            other = getattr(params, "old_subscriber_name", None)
            if exc.status == cupti.Result.ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
                raise ReplayError(
                    f"another CUPTI client is already subscribed ({other or 'unnamed'}: torch.profiler, nsys, ncu "
                    "or another recorder); CUPTI allows one: stop it, or record in a process without it"
                ) from None
            raise ReplayError(f"cannot subscribe to CUPTI: {cupti.Result(exc.status).name}") from None
        cbids = cupti.driver_api_trace_cbid
        for name, decoder in _DECODERS.items():
            cbid = getattr(cbids, name, None)
            if cbid is not None:
                self._by_cbid[int(cbid)] = decoder
                cupti.enable_callback(1, self._subscriber, cupti.CallbackDomain.DRIVER_API, cbid)

    def stop(self) -> None:
        if self._subscriber is not None:
            self.cupti.unsubscribe(self._subscriber)
            self._subscriber = None

    # -- the callback ----------------------------------------------------------------------

    def _callback(self, userdata: Any, domain: int, cbid: int, data: Any) -> None:
        guard = self._guard
        if getattr(guard, "busy", False):
            return
        guard.busy = True
        try:
            decoder = self._by_cbid.get(cbid)
            if decoder is not None:
                base = data.ptr
                site, _, params = _unpack("<I4xQQ", _string_at(base, 24))
                decoder(self, site, params, data)
        except Exception as exc:  # never raise into the program
            self._sink(ev.NotReproducible("recorder", f"decoding a driver call failed: {type(exc).__name__}: {exc}"))
        finally:
            guard.busy = False

    @staticmethod
    def _result(data: Any) -> int:
        pointer = _q(data.ptr, 24)
        return _unpack("<i", _string_at(pointer, 4))[0] if pointer else 0

    # -- kernels ---------------------------------------------------------------------------

    def _kernel(self, handle: int, name: str) -> ev.Kernel:
        kernel = self._kernels.get(handle)
        if kernel is not None and kernel.name == name:
            return kernel
        cu = self.cu
        err, module = cu.cuFuncGetModule(handle)
        layout = []
        if err == cu.CUresult.CUDA_SUCCESS:  # a CUfunction (driver API, Triton)
            key: tuple[str, int] | None = ("module", int(module))
            if key not in self._loaded:
                key = self._library_of(int(module)) or key
            info = cu.cuFuncGetParamInfo
        else:  # a CUkernel (runtime API launches): its library
            err, library = cu.cuKernelGetLibrary(handle)
            key = ("library", int(library)) if err == cu.CUresult.CUDA_SUCCESS else None
            info = cu.cuKernelGetParamInfo
        for i in range(4096):
            err, offset, size = info(handle, i)
            if err != cu.CUresult.CUDA_SUCCESS:
                break
            layout.append((int(offset), int(size)))
        kernel = self._kernels[handle] = ev.Kernel(handle, name, key, tuple(layout))
        return kernel

    def _library_of(self, module: int) -> tuple[str, int] | None:
        """The library whose module ``module`` is (functions taken from a library's kernels)."""
        cu = self.cu
        for key in self._loaded:
            if key[0] == "library" and key not in self._library_modules:
                err, owned = cu.cuLibraryGetModule(key[1])
                self._library_modules[key] = int(owned) if err == cu.CUresult.CUDA_SUCCESS else 0
        for key, owned in self._library_modules.items():
            if owned == module and key in self._loaded:
                return key
        return None

    def _emit_image(self, image: ev.ModuleImage) -> None:
        self._loaded.add(image.key)
        self._library_modules.pop(image.key, None)
        self._sink(image)

    @staticmethod
    def _parameters(layout: tuple[tuple[int, int], ...], kernel_params: int, extra: int) -> bytes:
        if kernel_params and layout:
            pointers = _unpack(f"<{len(layout)}Q", _string_at(kernel_params, 8 * len(layout)))
            end = max(o + s for o, s in layout)
            block = bytearray(end)
            for (offset, size), pointer in zip(layout, pointers):
                block[offset : offset + size] = _string_at(pointer, size)
            return bytes(block)
        if extra:
            buffer = size = 0
            for i in range(0, 64, 2):
                key = _q(extra, 8 * i)
                if key == 0:
                    break
                value = _q(extra, 8 * i + 8)
                if key == _LAUNCH_PARAM_BUFFER_POINTER:
                    buffer = value
                elif key == _LAUNCH_PARAM_BUFFER_SIZE:
                    size = _q(value)
            return _string_at(buffer, size) if buffer and size else b""
        return b""

    def _launch(self, site: int, data: Any, f: int, grid: tuple[int, int, int], block: tuple[int, int, int],
                smem: int, stream: int, kernel_params: int, extra: int, cluster: tuple[int, int, int] = (0, 0, 0),
                cooperative: bool = False) -> None:  # fmt: skip
        if site == _EXIT:
            self._sink(ev.LaunchEnd(stream, self._result(data)))
            return
        base = data.ptr
        symbol = _q(base, 32)
        name = _string_at(symbol).decode("utf-8", "replace") if symbol else f"function_{f:#x}"
        kernel = self._kernel(f, name)
        parameters = self._parameters(kernel.layout, kernel_params, extra)
        call = _string_at(_q(base, 8)).decode()
        self._sink(ev.LaunchBegin(kernel, grid, block, smem, stream, parameters, cluster, cooperative, call))

    def _on_launch_kernel(self, site: int, p: int, data: Any) -> None:
        f, gx, gy, gz, bx, by, bz, smem, stream, kp, extra = _unpack("<Q7I4xQQQ", _string_at(p, 64))
        self._launch(site, data, f, (gx, gy, gz), (bx, by, bz), smem, stream, kp, extra)

    def _on_launch_cooperative(self, site: int, p: int, data: Any) -> None:
        f, gx, gy, gz, bx, by, bz, smem, stream, kp = _unpack("<Q7I4xQQ", _string_at(p, 56))
        self._launch(site, data, f, (gx, gy, gz), (bx, by, bz), smem, stream, kp, 0, cooperative=True)

    def _on_launch_ex(self, site: int, p: int, data: Any) -> None:
        config, f, kp, extra = _unpack("<QQQQ", _string_at(p, 32))
        gx, gy, gz, bx, by, bz, smem, stream, attrs, count = _unpack("<7I4xQQI", _string_at(config, 52))
        cluster, cooperative = (0, 0, 0), False
        for i in range(min(count, 64)):
            attr = attrs + i * _ATTRIBUTE_SIZE
            kind, = _unpack("<I", _string_at(attr, 4))  # fmt: skip
            if kind == _ATTRIBUTE_CLUSTER:
                cluster = _unpack("<III", _string_at(attr + 8, 12))
            elif kind == _ATTRIBUTE_COOPERATIVE:
                cooperative = _unpack("<i", _string_at(attr + 8, 4))[0] != 0
        self._launch(site, data, f, (gx, gy, gz), (bx, by, bz), smem, stream, kp, extra, cluster, cooperative)

    # -- memory ----------------------------------------------------------------------------

    def _on_alloc(self, site: int, p: int, data: Any) -> None:
        if site == _EXIT and self._result(data) == 0:
            out, size = _unpack("<QQ", _string_at(p, 16))
            self._sink(ev.Allocation(_q(out), size, ev.MemoryApi.DEVICE, data.function_name))

    def _on_alloc_pitch(self, site: int, p: int, data: Any) -> None:
        if site == _EXIT and self._result(data) == 0:
            out, pitch, _width, height = _unpack("<QQQQ", _string_at(p, 32))
            self._sink(ev.Allocation(_q(out), _q(pitch) * height, ev.MemoryApi.DEVICE, data.function_name))

    def _on_alloc_host(self, site: int, p: int, data: Any) -> None:
        if site == _EXIT and self._result(data) == 0:
            out, size = _unpack("<QQ", _string_at(p, 16))
            self._sink(ev.Allocation(_q(out), size, ev.MemoryApi.HOST_PINNED, data.function_name))

    def _on_alloc_managed(self, site: int, p: int, data: Any) -> None:
        if site == _EXIT and self._result(data) == 0:
            out, size = _unpack("<QQ", _string_at(p, 16))
            self._sink(ev.Allocation(_q(out), size, ev.MemoryApi.MANAGED, data.function_name))

    def _on_free(self, site: int, p: int, data: Any) -> None:
        if site == _ENTER:
            self._sink(ev.Free(_q(p), data.function_name))

    def _on_mem_map(self, site: int, p: int, data: Any) -> None:
        if site == _EXIT and self._result(data) == 0:
            address, size = _unpack("<QQ", _string_at(p, 16))
            self._sink(ev.Allocation(address, size, ev.MemoryApi.DEVICE, data.function_name))

    # -- streams, events, synchronisation ----------------------------------------------------

    def _on_stream_create(self, site: int, p: int, data: Any) -> None:
        if site == _EXIT and self._result(data) == 0:
            out, flags, priority = _unpack("<QIi", _string_at(p, 16))
            if data.function_name != "cuStreamCreateWithPriority":
                priority = 0
            self._sink(ev.StreamCreated(_q(out), flags, priority))

    def _on_event_create(self, site: int, p: int, data: Any) -> None:
        if site == _EXIT and self._result(data) == 0:
            out, flags = _unpack("<QI", _string_at(p, 12))
            self._sink(ev.EventCreated(_q(out), flags))

    def _on_event_record(self, site: int, p: int, data: Any) -> None:
        if site == _ENTER:
            event, stream = _unpack("<QQ", _string_at(p, 16))
            self._sink(ev.EventRecorded(event, stream))

    def _on_stream_wait(self, site: int, p: int, data: Any) -> None:
        if site == _ENTER:
            stream, event = _unpack("<QQ", _string_at(p, 16))
            self._sink(ev.StreamWaited(stream, event))

    def _on_stream_sync(self, site: int, p: int, data: Any) -> None:
        if site == _EXIT:
            self._sink(ev.StreamSynchronized(_q(p)))

    def _on_context_sync(self, site: int, p: int, data: Any) -> None:
        if site == _EXIT:
            self._sink(ev.ContextSynchronized())

    def _on_event_sync(self, site: int, p: int, data: Any) -> None:
        if site == _EXIT:
            self._sink(ev.EventSynchronized(_q(p)))

    # -- code ------------------------------------------------------------------------------


def _copy_decoder(direction: ev.CopyDirection, asynchronous: bool) -> Decoder:
    def decode(self: CuptiSource, site: int, p: int, data: Any) -> None:
        if asynchronous:
            dst, src, size, stream = _unpack("<QQQQ", _string_at(p, 32))
        else:
            (dst, src, size), stream = _unpack("<QQQ", _string_at(p, 24)), 0
        if site == _EXIT:
            if direction != ev.CopyDirection.H2D and not asynchronous and self._result(data) == 0:
                self._sink(ev.CopyDone(dst, size))
            return
        self._sink(ev.Copy(direction, dst, src, size, stream, asynchronous,
                           data.function_name))  # fmt: skip

    return decode


def _memset_decoder(element_size: int, asynchronous: bool) -> Decoder:
    code = {1: "B", 2: "H", 4: "I"}[element_size]

    def decode(self: CuptiSource, site: int, p: int, data: Any) -> None:
        if site == _ENTER:
            if asynchronous:
                address, value, count, stream = _unpack(f"<Q{code}{8 - element_size}xQQ", _string_at(p, 32))
            else:
                (address, value, count), stream = _unpack(f"<Q{code}{8 - element_size}xQ", _string_at(p, 24)), 0
            self._sink(ev.Memset(address, value, element_size, count, stream,
                                 data.function_name))  # fmt: skip

    return decode


def _module_load_decoder(kind: str, from_file: bool) -> Decoder:
    def decode(self: CuptiSource, site: int, p: int, data: Any) -> None:
        if site != _EXIT or self._result(data) != 0:
            return
        out, source = _unpack("<QQ", _string_at(p, 16))
        key = (kind, _q(out))
        if from_file:
            self._sink(ev.ModuleImage(key, None, _string_at(source).decode(), data.function_name))
        else:
            self._sink(ev.ModuleImage(key, image_bytes(source), None, data.function_name))

    return decode


def _module_unload_decoder(kind: str) -> Decoder:
    def decode(self: CuptiSource, site: int, p: int, data: Any) -> None:
        if site == _ENTER:
            handle = _q(p)
            self._sink(ev.ModuleUnload((kind, handle)))
            for f in [f for f, k in self._kernels.items() if k.module == (kind, handle)]:
                del self._kernels[f]

    return decode


def _refusal_decoder(reason: str) -> Decoder:
    def decode(self: CuptiSource, site: int, p: int, data: Any) -> None:
        if site == _ENTER:
            self._sink(ev.NotReproducible(data.function_name, reason))

    return decode


def _variants(*names: str) -> list[str]:
    """A driver call's names with its per-thread-default-stream variants (_ptsz, _ptds)."""
    return [n + suffix for n in names for suffix in ("", "_ptsz", "_ptds")]


_S = CuptiSource
_D, _H2D, _D2H, _D2D = ev.CopyDirection.DEFAULT, ev.CopyDirection.H2D, ev.CopyDirection.D2H, ev.CopyDirection.D2D
_DECODERS: dict[str, Decoder] = {}
for _names, _decoder in [
    (_variants("cuLaunchKernel"), _S._on_launch_kernel),
    (_variants("cuLaunchKernelEx"), _S._on_launch_ex),
    (_variants("cuLaunchCooperativeKernel"), _S._on_launch_cooperative),
    (_variants("cuMemAlloc_v2", "cuMemAllocAsync", "cuMemAllocFromPoolAsync"), _S._on_alloc),
    (["cuMemAllocPitch_v2"], _S._on_alloc_pitch),
    (["cuMemHostAlloc", "cuMemAllocHost_v2"], _S._on_alloc_host),
    (["cuMemAllocManaged"], _S._on_alloc_managed),
    (_variants("cuMemFree_v2", "cuMemFreeAsync", "cuMemFreeHost", "cuMemUnmap"), _S._on_free),
    (["cuMemMap"], _S._on_mem_map),
    (_variants("cuMemcpy"), _copy_decoder(_D, False)),
    (_variants("cuMemcpyAsync"), _copy_decoder(_D, True)),
    (_variants("cuMemcpyHtoD_v2"), _copy_decoder(_H2D, False)),
    (_variants("cuMemcpyHtoDAsync_v2"), _copy_decoder(_H2D, True)),
    (_variants("cuMemcpyDtoH_v2"), _copy_decoder(_D2H, False)),
    (_variants("cuMemcpyDtoHAsync_v2"), _copy_decoder(_D2H, True)),
    (_variants("cuMemcpyDtoD_v2"), _copy_decoder(_D2D, False)),
    (_variants("cuMemcpyDtoDAsync_v2"), _copy_decoder(_D2D, True)),
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
    (["cuModuleUnload"], _module_unload_decoder("module")),
    (["cuLibraryUnload"], _module_unload_decoder("library")),
    (_variants("cuLaunchHostFunc", "cuStreamAddCallback"), _refusal_decoder("a host function runs in the stream")),
    (_variants("cuGraphLaunch"), _refusal_decoder("CUDA graph launches are not decomposed into their nodes")),
    (["cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2", "cuIpcGetMemHandle"],
     _refusal_decoder("memory shared between processes (IPC)")),
    (_variants("cuMemcpyPeer", "cuMemcpyPeerAsync", "cuMemcpy2D_v2", "cuMemcpy2DAsync_v2", "cuMemcpy3D_v2",
               "cuMemcpy3DAsync_v2", "cuMemcpyBatchAsync", "cuMemsetD2D8_v2", "cuMemsetD2D32_v2"),
     _refusal_decoder("this copy or memset form is not recorded yet")),
]:  # fmt: skip
    for _name in _names:
        _DECODERS[_name] = _decoder
