"""Device times from CUPTI activity records: the clock Nsight Systems and torch.profiler read.

CUPTI writes one record per kernel, copy and memset with the device's own start and end
timestamps (nanoseconds) into buffers this module hands it, and gives each buffer back once full
or flushed. Nothing is inserted into the streams, so timing a region with it does not change the
region: a 2 µs kernel reads 2 µs, where CUDA events around it read 5-6 µs on an H100.

:class:`KernelActivity` starts and stops the records, flushes them and hands them out parsed as
:class:`ActivityRecord` rows. Records reach Python only when CUPTI returns a buffer; they are
parsed when :meth:`KernelActivity.take` is called, on the caller's thread, so that CUPTI's buffer
thread never holds the GIL for long while the program launches work.

Process-wide state that CUPTI forces: the buffer callbacks (``cuptiActivityRegisterCallbacks``)
and the enabled record kinds belong to the process, not to a caller. So at most one
KernelActivity is started at a time in a process (a second start raises), the two C callbacks
live for the life of the process (CUPTI may call them until it is finalised), and another CUPTI
activity client (torch.profiler, Nsight Systems) cannot run at the same time.

Record layouts are those of CUPTI 13 (``CUpti_ActivityKernel10``, ``CUpti_ActivityMemcpy6``,
``CUpti_ActivityMemset4``, ``CUpti_ActivityExternalCorrelation``): the fields read here lie at the
same offsets in every record version since CUDA 11.
"""

from __future__ import annotations

import ctypes
import enum
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from replayfmt.errors import DeviceError, DeviceUnavailableError
from replayfmt.format.timings import busy_ns

__all__ = [
    "ActivityBatch",
    "ActivityKind",
    "ActivityRecord",
    "ExternalKind",
    "KernelActivity",
    "busy_ns",
    "kernel_activity",
    "load_library",
    "parse_records",
]

_BUFFER_SIZE = 4 << 20
_ERROR_MAX_LIMIT_REACHED = 12  # cuptiActivityGetNextRecord: no more records in the buffer
_FLUSH_FORCED = 1  # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED: also flush records of work still running


class ActivityKind(enum.IntEnum):
    """The CUpti_ActivityKind values this module enables and parses."""

    MEMCPY = 1
    MEMSET = 2
    DRIVER = 4  # driver and runtime API records: external correlation records are emitted with them
    RUNTIME = 5
    CONCURRENT_KERNEL = 10
    EXTERNAL_CORRELATION = 39


class ExternalKind(enum.IntEnum):
    """CUpti_ExternalCorrelationKind: independent stacks of caller-chosen ids."""

    CUSTOM0 = 3
    CUSTOM1 = 4


DEVICE_WORK = (ActivityKind.CONCURRENT_KERNEL, ActivityKind.MEMCPY, ActivityKind.MEMSET)

# kind, start, end, deviceId, contextId, streamId, correlationId, graphNodeId, name pointer
_KERNEL = struct.Struct("<I12xQQ8xIII40xI8xQ")  # through name (offset 104, 112 bytes)
_KERNEL_GRAPH_NODE = struct.Struct("<Q")  # graphNodeId at 144
_MEMCPY = struct.Struct("<IB3xQQQIIII")  # kind, copyKind, bytes, start, end, device, context, stream, correlation
_MEMSET = struct.Struct("<IIQQQIIII")  # kind, value, bytes, start, end, device, context, stream, correlation
_EXTERNAL = struct.Struct("<IIQI")  # kind, externalKind, externalId, correlationId
_GRAPH_NODE_AT = {ActivityKind.CONCURRENT_KERNEL: 144, ActivityKind.MEMCPY: 64, ActivityKind.MEMSET: 64}
RECORD_SIZES = {
    ActivityKind.CONCURRENT_KERNEL: 216,
    ActivityKind.MEMCPY: 96,
    ActivityKind.MEMSET: 88,
    ActivityKind.EXTERNAL_CORRELATION: 24,
}
"""Sizes of the CUPTI 13 records (for building test buffers; the walk itself is CUPTI's)."""
_COPY_NAMES = {
    1: "memcpy HtoD",
    2: "memcpy DtoH",
    3: "memcpy HtoA",
    4: "memcpy AtoH",
    5: "memcpy AtoA",
    6: "memcpy AtoD",
    7: "memcpy DtoA",
    8: "memcpy DtoD",
    9: "memcpy HtoH",
    10: "memcpy PtoP",
}


@dataclass(frozen=True, slots=True)
class ActivityRecord:
    """One kernel, copy or memset as the device ran it (CUPTI timestamps, nanoseconds)."""

    kind: ActivityKind
    name: str  # the kernel's symbol; "memcpy HtoD" and the like; "memset"
    start_ns: int
    end_ns: int
    device: int
    stream: int  # CUPTI's stream id (not the CUstream handle)
    correlation_id: int  # the driver call that issued it (a graph launch: the cuGraphLaunch)
    graph_node: int = 0  # the graph node, for work launched through a CUDA graph
    bytes: int = 0  # copies and memsets

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class ActivityBatch:
    """Records taken from CUPTI: device work, and external ids by kind and correlation id."""

    records: list[ActivityRecord] = field(default_factory=list)
    external: dict[ExternalKind, dict[int, int]] = field(default_factory=dict)  # kind -> correlation -> id
    dropped: int = 0  # records CUPTI had to drop (buffers full)

    def external_id(self, kind: ExternalKind, correlation_id: int) -> int | None:
        return self.external.get(kind, {}).get(correlation_id)

    def extend(self, other: ActivityBatch) -> None:
        self.records += other.records
        for kind, ids in other.external.items():
            self.external.setdefault(kind, {}).update(ids)
        self.dropped += other.dropped


def parse_records(buffer: Any, offsets: Iterable[int], name_at: Callable[[int], str]) -> ActivityBatch:
    """Parse the records at ``offsets`` of ``buffer`` (bytes or a memoryview of a CUPTI buffer).

    ``name_at`` turns a kernel record's name pointer into its name (CUPTI owns the strings).
    Kinds other than kernels, copies, memsets and external correlations are skipped.
    """
    batch = ActivityBatch()
    records = batch.records
    names: dict[int, str] = {}
    for at in offsets:
        kind = struct.unpack_from("<I", buffer, at)[0]
        if kind == ActivityKind.CONCURRENT_KERNEL:
            _, start, end, device, _ctx, stream, correlation, name_ptr = _KERNEL.unpack_from(buffer, at)
            name = names.get(name_ptr)
            if name is None:
                name = names[name_ptr] = name_at(name_ptr) if name_ptr else ""
            node = _KERNEL_GRAPH_NODE.unpack_from(buffer, at + 144)[0]
            records.append(
                ActivityRecord(ActivityKind.CONCURRENT_KERNEL, name, start, end, device, stream, correlation, node)
            )
        elif kind == ActivityKind.MEMCPY:
            _, copy_kind, size, start, end, device, _ctx, stream, correlation = _MEMCPY.unpack_from(buffer, at)
            node = struct.unpack_from("<Q", buffer, at + 64)[0]
            name = _COPY_NAMES.get(copy_kind, "memcpy")
            records.append(
                ActivityRecord(ActivityKind.MEMCPY, name, start, end, device, stream, correlation, node, size)
            )
        elif kind == ActivityKind.MEMSET:
            _, _value, size, start, end, device, _ctx, stream, correlation = _MEMSET.unpack_from(buffer, at)
            node = struct.unpack_from("<Q", buffer, at + 64)[0]
            records.append(
                ActivityRecord(ActivityKind.MEMSET, "memset", start, end, device, stream, correlation, node, size)
            )
        elif kind == ActivityKind.EXTERNAL_CORRELATION:
            _, external_kind, external_id, correlation = _EXTERNAL.unpack_from(buffer, at)
            try:
                key = ExternalKind(external_kind)
            except ValueError:
                continue
            batch.external.setdefault(key, {})[correlation] = external_id
    return batch


# -- the library ----------------------------------------------------------------------------

_CANDIDATES = ("libcupti.so.13", "libcupti.so")
_TOOLKIT_DIRS = ("/usr/local/cuda/lib64", "/usr/local/cuda/extras/CUPTI/lib64", "/usr/local/cuda/lib")


def loaded_cupti_path() -> str | None:
    """A libcupti this process has loaded already (one copy per process: never load a second)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                if "libcupti.so" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return None


def _wheel_paths() -> list[str]:
    """libcupti from the nvidia-cuda-cupti wheel (torch installs it) or cupti-python's locator."""
    paths = []
    try:
        import nvidia.cuda_cupti as wheel  # type: ignore[import-not-found]

        for root in getattr(wheel, "__path__", []):
            paths += [f"{root}/lib/libcupti.so.13", f"{root}/lib/libcupti.so.12"]
    except ImportError:
        pass
    try:
        import nvidia.cu13 as cu13  # type: ignore[import-not-found]  # CUDA 13 wheels share one tree

        for root in getattr(cu13, "__path__", []):
            paths.append(f"{root}/lib/libcupti.so.13")
    except ImportError:
        pass
    return paths


def load_library() -> ctypes.CDLL:
    """libcupti: the copy already loaded, else the CUDA toolkit's, the wheel's or the linker's.

    Raises DeviceUnavailableError (one line, every place tried) when there is none. Once activity
    buffers are registered, the library they were registered with (two copies of CUPTI in one
    process refuse each other: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED).
    """
    if _callbacks:
        return _callbacks[0].lib
    loaded = loaded_cupti_path()
    candidates = [loaded] if loaded else [*_CANDIDATES, *(f"{d}/libcupti.so" for d in _TOOLKIT_DIRS), *_wheel_paths()]
    problems = []
    for candidate in candidates:
        try:
            return ctypes.CDLL(candidate)
        except OSError as exc:
            problems.append(str(exc).split(":")[0])
    located = _cupti_python_path()
    if located:
        return ctypes.CDLL(located)
    raise DeviceUnavailableError(f"no CUPTI library here (tried {', '.join(problems) or 'nothing'})")


def _cupti_python_path() -> str | None:
    """The libcupti cupti-python loads (it finds the nvidia-cuda-cupti wheel's), if installed."""
    try:
        from cupti import cupti  # type: ignore[import-not-found]

        cupti.get_callback_name(1, 1)  # makes cupti-python load its libcupti
    except Exception:
        return None
    return loaded_cupti_path()


_REQUEST = ctypes.CFUNCTYPE(
    None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)
)
_COMPLETE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)


class _Callbacks:
    """The process's one pair of CUPTI buffer callbacks, routed to the started KernelActivity.

    CUPTI keeps the function pointers for the life of the process, so they are created once and
    never freed; buffers handed out are kept alive here until CUPTI gives them back.
    """

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        self.lock = threading.Lock()
        self.owner: KernelActivity | None = None
        self.outstanding: dict[int, Any] = {}
        self.buffer_size = _BUFFER_SIZE
        self.request = _REQUEST(self._request)
        self.complete = _COMPLETE(self._complete)
        result = lib.cuptiActivityRegisterCallbacks(self.request, self.complete)
        if result != 0:
            raise DeviceError(f"cannot register CUPTI activity buffers: {_error(lib, result)}")

    def _request(self, buffer: Any, size: Any, max_records: Any) -> None:
        block = ctypes.create_string_buffer(self.buffer_size + 8)
        address = (ctypes.addressof(block) + 7) & ~7  # records are 8-byte aligned
        with self.lock:
            self.outstanding[address] = block
        buffer[0] = address
        size[0] = self.buffer_size
        max_records[0] = 0

    def _complete(self, context: Any, stream: int, buffer: int | None, size: int, valid: int) -> None:
        if not buffer:
            return
        with self.lock:
            block = self.outstanding.pop(buffer, None)
            owner = self.owner
        if block is not None and owner is not None and valid:
            owner._received(block, buffer, valid)


_callbacks: list[_Callbacks] = []  # the process's one registration (see the module docstring)
_registration_lock = threading.Lock()


def _error(lib: ctypes.CDLL, result: int) -> str:
    text = ctypes.c_char_p()
    if lib.cuptiGetResultString(result, ctypes.byref(text)) == 0 and text.value:
        return text.value.decode(errors="replace")
    return f"CUPTI error {result}"


class KernelActivity:
    """Kernel, copy and memset records from CUPTI, between :meth:`start` and :meth:`stop`.

    ``library``: a loaded libcupti (the recorder passes the one its callbacks use); default
    :func:`load_library`. ``kinds``: what to record (default kernels, copies and memsets);
    ``external=True`` also records external correlation ids (:meth:`push` / :meth:`pop`), which
    needs CUPTI's driver- and runtime-API records too (a kernel the runtime launches carries the
    runtime call's correlation id).
    """

    def __init__(
        self,
        library: ctypes.CDLL | None = None,
        *,
        kinds: tuple[ActivityKind, ...] = DEVICE_WORK,
        external: bool = False,
    ) -> None:
        # the process's registered library wins over ``library``: CUPTI copies refuse each other
        self.lib = _callbacks[0].lib if _callbacks else library if library is not None else load_library()
        for name in (
            "cuptiActivityEnable",
            "cuptiActivityDisable",
            "cuptiActivityFlushAll",
            "cuptiActivityRegisterCallbacks",
            "cuptiActivityPushExternalCorrelationId",
            "cuptiActivityPopExternalCorrelationId",
            "cuptiActivityGetNextRecord",
            "cuptiActivityGetNumDroppedRecords",
            "cuptiGetTimestamp",
        ):
            getattr(self.lib, name).restype = ctypes.c_int
        self.lib.cuptiActivityGetNextRecord.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_void_p),
        ]
        self.lib.cuptiActivityPushExternalCorrelationId.argtypes = [ctypes.c_int, ctypes.c_uint64]
        self.lib.cuptiActivityPopExternalCorrelationId.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)]
        api = (ActivityKind.DRIVER, ActivityKind.RUNTIME, ActivityKind.EXTERNAL_CORRELATION)
        self.kinds = tuple(kinds) + (api if external else ())
        self._push = self.lib.cuptiActivityPushExternalCorrelationId
        self._pop = self.lib.cuptiActivityPopExternalCorrelationId
        self._popped = ctypes.c_uint64()
        self._now = ctypes.c_uint64()
        self._now_ref = ctypes.byref(self._now)
        self._received_blocks: list[tuple[Any, int, int]] = []
        self._lock = threading.Lock()
        self._started = False

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Register (once per process) and enable the record kinds. Raises DeviceError when
        another KernelActivity is started, or CUPTI refuses (another activity client)."""
        with _registration_lock:
            if not _callbacks:
                _callbacks.append(_Callbacks(self.lib))
            callbacks = _callbacks[0]
            with callbacks.lock:
                if callbacks.owner is not None and callbacks.owner is not self:
                    raise DeviceError("CUPTI activity records are already being taken in this process (one at a time)")
                callbacks.owner = self
        enabled = []
        try:
            for kind in self.kinds:
                result = self.lib.cuptiActivityEnable(int(kind))
                if result != 0:
                    raise DeviceError(f"cannot enable CUPTI activity kind {kind.name}: {_error(self.lib, result)}")
                enabled.append(kind)
        except BaseException:
            for kind in enabled:
                self.lib.cuptiActivityDisable(int(kind))
            with callbacks.lock:
                callbacks.owner = None
            raise
        self._started = True

    def stop(self) -> None:
        """Flush what is recorded and disable the kinds; records stay available to :meth:`take`."""
        if not self._started:
            return
        self.flush()
        for kind in self.kinds:
            self.lib.cuptiActivityDisable(int(kind))
        self.flush()
        self._started = False
        with _registration_lock:
            callbacks = _callbacks[0]
            with callbacks.lock:
                if callbacks.owner is self:
                    callbacks.owner = None

    def __enter__(self) -> KernelActivity:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def flush(self) -> None:
        """Have CUPTI hand back every buffer (records of finished work; call after a synchronise)."""
        self.lib.cuptiActivityFlushAll(_FLUSH_FORCED)

    def timestamp(self) -> int:
        """CUPTI's clock now (ns; the clock of the records' start and end), 0 where CUPTI refuses."""
        if self.lib.cuptiGetTimestamp(self._now_ref) != 0:
            return 0
        return self._now.value

    # -- external correlation ----------------------------------------------------------------

    def push(self, kind: ExternalKind, external_id: int) -> None:
        """Tag the driver calls this thread makes from now on with ``external_id`` (until pop)."""
        self._push(kind, external_id)

    def pop(self, kind: ExternalKind) -> None:
        self._pop(kind, ctypes.byref(self._popped))

    # -- records ---------------------------------------------------------------------------

    def _received(self, block: Any, address: int, valid: int) -> None:
        with self._lock:
            self._received_blocks.append((block, address, valid))

    def take(self) -> ActivityBatch:
        """The records received so far (after :meth:`flush`), parsed; they are handed out once."""
        with self._lock:
            blocks, self._received_blocks = self._received_blocks, []
        batch = ActivityBatch()
        record = ctypes.c_void_p()
        get_next = self.lib.cuptiActivityGetNextRecord
        for block, address, valid in blocks:
            base = ctypes.addressof(block)
            offsets = []
            record.value = None
            while get_next(address, valid, ctypes.byref(record)) == 0:
                offsets.append(int(record.value or 0) - base)
            view = memoryview(block).cast("B")
            batch.extend(parse_records(view, offsets, _c_string))
        dropped = ctypes.c_size_t()
        if self.lib.cuptiActivityGetNumDroppedRecords(None, 0, ctypes.byref(dropped)) == 0:
            batch.dropped = int(dropped.value)
        return batch


def _c_string(address: int) -> str:
    return ctypes.string_at(address).decode("utf-8", "replace")


def kernel_activity(*, external: bool = False) -> tuple[KernelActivity | None, str]:
    """A KernelActivity, or None and why not (no CUPTI here): callers fall back to CUDA events."""
    try:
        return KernelActivity(external=external), ""
    except DeviceUnavailableError as exc:
        return None, str(exc)
    except (OSError, AttributeError) as exc:
        return None, f"CUPTI cannot be used here ({exc})"
