"""Rebuild a capture on one or several CUDA devices and execute it.

A :class:`Replayer` takes a :class:`~replayfmt.replay.plan.Plan` and does the cold work once (a context
per device, allocations, module loads, ABI checks against the loaded functions, payloads staged
on the device through pinned upload lanes, every launch's parameter block packed and relocated),
turning the capture into a list of steps; :meth:`Replayer.run` then executes the steps (as many
times as asked), each on its own captured stream, so that concurrency and event edges are kept.
Captured device k runs on ``options.devices[k]``; a step that changes device first makes that
device's context current (single-device captures never switch).

Strict: a CUDA error stops the replay with an error naming the operation, object and kernel and
the driver's error; a sticky error found at a synchronisation also names the launches issued since
the last one that succeeded. Ownership: the Replayer owns every device resource it creates and
frees them in :meth:`close` (idempotent; also a context manager).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from replayfmt.cuda.address_space import page_runs, steer_device_arena
from replayfmt.cuda.digest import SHORTEST as DIGEST_SHORTEST, DeviceDigester
from replayfmt.cuda.driver import STICKY_ERRORS, CudaCallError, check, compute_capability, driver, error_text
from replayfmt.cuda.nvtx import Nvtx
from replayfmt.errors import AbiMismatchError, DeviceError, DeviceUnavailableError, ReplayError, ReplayUsageError
from replayfmt.format import model as m
from replayfmt.replay.compare import NUMPY_DTYPES, BufferReport, Tolerance, compare
from replayfmt.replay.plan import ExecutableImage, Plan, UploadKey, layout_difference, upload_key

_K = m.OperationKind
_RECENT = 8
_EXPECTED_CACHE = 1 << 30  # bytes of decoded checkpoint payloads kept between runs


@dataclass
class ReplayOptions:
    devices: tuple[int, ...] = (0,)  # captured device k runs on cuda:devices[k]
    verify: bool = False
    tolerance: Tolerance = field(default_factory=Tolerance)
    save_output: Path | None = None
    continue_on_error: bool = False
    uploads_from_host: bool = False  # keep uploads as host-to-device copies (timing fidelity)
    nvtx: bool = False  # NVTX ranges around scopes and launches, for nsys and ncu
    check_payloads: bool = True  # check every payload frame against its hash (off: faster, corruption unseen)


class FrameCheck(StrEnum):
    """Where payload frames were checked against their recorded hashes while staged."""

    DEVICE = "on the device"  # a kernel hashed each frame where it landed
    HOST = "on the host"  # hashed as read (several devices, a driver too old for the kernel, host staging)
    NONE = "no"  # --no-payload-checks


@dataclass
class StagingStats:
    """How the capture's uploads were brought to the device at setup."""

    bytes: int = 0
    setup_seconds: float = 0.0  # thread pool, pinned upload lanes, the digest kernel's load
    seconds: float = 0.0  # reading, uploading and checking, once set up
    check_seconds: float = 0.0  # of which checking frames on the device, after the uploads
    on_device: bool = False  # pristine copies on the device (else pinned host memory)
    checked: FrameCheck = FrameCheck.NONE

    @property
    def gbs(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds else 0.0

    def line(self) -> str:
        where = "on the device" if self.on_device else "in pinned host memory"
        return (
            f"{self.bytes / 2**20:.1f} MiB staged {where} in {self.seconds:.3f} s ({self.gbs:.1f} GB/s), "
            f"after {self.setup_seconds:.3f} s of setup; frames checked: {self.checked}"
            + (f" ({self.check_seconds * 1e3:.0f} ms)" if self.check_seconds else "")
        )


@dataclass
class RunResult:
    device_ms: list[float] = field(default_factory=list)  # one per repetition, its starting state left out
    state_ms: list[float] = field(default_factory=list)  # one per repetition: setting its starting state
    reports: list[BufferReport] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        return all(r.passed for r in self.reports)


@dataclass
class _Launch:
    """A launch ready to go: everything packed once, at setup."""

    name: str
    args: tuple[Any, ...]  # for cuLaunchKernel or cuLaunchKernelEx
    extended: bool
    keepalive: list[Any]
    buffer_sites: list[tuple[int, int]]  # (device address of a pointer site, pinned address of its value)


@dataclass
class _Staged:
    """The bytes of one upload, staged once: a device address (pristine copy) or pinned host memory."""

    address: int
    size: int
    on_device: bool


_UPLOAD_PIECE = 8 << 20  # bytes an upload lane reads at a time (whole frames: one frame at least)
_UPLOAD_LANES = 16  # at most: more contend for memory bandwidth
_UPLOAD_PINNED = 256 << 20  # pinned bytes the lanes may take together (pinning costs ~0.3 s/GiB)
_FIXED_PAGE = 2 << 20  # the VMM granularity of current GPUs; the real one is asked of the driver


@dataclass
class ReplayDevice:
    """A device the replay runs on: captured device k runs on cuda:ordinal (its primary context)."""

    ordinal: int
    handle: Any
    ctx: Any
    name: str
    compute_capability: tuple[int, int]
    max_shared_optin: int


def _recorded_ranges(plan: Plan) -> list[tuple[int, int]]:
    return [(buf.address, buf.size) for buf in plan.buffers.values() if buf.address]


class Replayer:
    """Executes a plan on CUDA devices. Create, call :meth:`run`, then :meth:`close`."""

    def __init__(self, plan: Plan, options: ReplayOptions | None = None) -> None:
        self.plan = plan
        self.options = options or ReplayOptions()
        self._arena_problem: str | None = None
        if plan.options.fixed_addresses and driver.cache_info().currsize == 0:
            regions = page_runs(_recorded_ranges(plan), _FIXED_PAGE)
            if regions:
                low, high = regions[0][0], regions[-1][1]
                device = self.options.devices[0] if self.options.devices else 0
                self._arena_problem = steer_device_arena(low, high - low, device)
        self.cu = driver()
        self._closers: list[Callable[[], Any]] = []
        self._recent: deque[tuple[int, str]] = deque(maxlen=_RECENT)
        self.addresses: dict[int, int] = {}
        self.gpus: list[ReplayDevice] = []
        self._gpu_of: dict[int, int] = {}  # captured device id -> index in gpus
        self.functions: dict[tuple[int, int], Any] = {}  # on the first device (tuning works there)
        self._functions_on: list[dict[tuple[int, int], Any]] = []  # per device
        self.layouts: dict[tuple[int, int], list[tuple[int, int]]] = {}  # live (offset, size) per parameter
        self._kernel_names: dict[int, str] = {}  # launch operation index -> kernel name
        self._launches: list[_Launch] = []  # owns the packed parameter memory the steps point into
        self.op_streams: dict[int, Any] = {}  # operation index -> the stream its steps run on
        self._expected: dict[tuple[int, int], bytes] = {}  # (payload, size) -> decoded expected bytes
        # executable -> (register cap, threads hint) or None -> function handles
        self._jit_variants: dict[int, dict[tuple[int, int] | None, dict[tuple[int, int], Any]]] = {}
        self._images: list[bytes] = []  # module images must outlive their modules
        self.streams: dict[int, Any] = {}
        self._default_streams: list[Any] = []  # per device: where captured default-stream work runs
        self._stream_gpu: dict[int, int] = {}  # captured stream id -> device index
        self._peers: set[tuple[int, int]] = set()  # (device, device whose memory it may access)
        self.events: dict[int, Any] = {}
        self._steps: list[tuple[Callable[..., Any], tuple[Any, ...], int]] = []
        self._staged: dict[UploadKey, _Staged] = {}  # staged once per upload source
        self._result = RunResult()
        self._repetition = 0
        self.pristine_on_device = False
        self.staging = StagingStats()
        self.setup_seconds: dict[str, float] = {}  # setup phase -> seconds it took
        self.observer: Any = None  # sees every verified range's bytes (a NondeterminismTracker)
        self._state_events: dict[int, tuple[Any, Any]] = {}  # region start -> events around its state
        self.states_applied: list[tuple[Any, Any]] = []  # since the repetition began
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Replayer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def own(self, release: Callable[[], Any]) -> None:
        """Register the release of a resource made for this replay (freed by :meth:`close`)."""
        self._closers.append(release)

    def close(self) -> None:
        """Free every resource this replayer created (in reverse order). Idempotent."""
        while self._closers:
            closer = self._closers.pop()
            try:
                closer()
            except Exception:
                pass

    # -- setup -------------------------------------------------------------------------------

    def _setup(self) -> None:
        cu, plan = self.cu, self.plan
        wanted = max(1, len(plan.devices))
        if wanted > len(self.options.devices):
            raise ReplayUsageError(
                f"the capture uses {len(plan.devices)} devices; give as many --device flags "
                f"(got {len(self.options.devices)})"
            )
        if wanted > 1 and plan.options.fixed_addresses:
            raise DeviceError("--fixed-addresses replays single-device captures only")
        count = check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
        attr = cu.CUdevice_attribute
        for ordinal in self.options.devices[:wanted]:
            if ordinal >= count:
                raise DeviceUnavailableError(f"--device cuda:{ordinal}: this machine has {count} CUDA device(s)")
            handle = check(cu.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")
            ctx = check(cu.cuDevicePrimaryCtxRetain(handle), f"cuda:{ordinal}: cuDevicePrimaryCtxRetain")
            self._closers.append(lambda h=handle: cu.cuDevicePrimaryCtxRelease(h))
            optin = attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
            name = check(cu.cuDeviceGetName(256, handle), "cuDeviceGetName").split(b"\0")[0].decode()
            self.gpus.append(ReplayDevice(
                ordinal, handle, ctx, name, compute_capability(handle),
                check(cu.cuDeviceGetAttribute(optin, handle), "shared memory opt-in"),
            ))  # fmt: skip
        self._gpu_of = {device.id: k for k, device in enumerate(plan.devices)}
        self._use(0)
        for phase in (self._check_device_fits, self._allocate_buffers, self._load_modules,
                      self._create_streams_and_events, self._stage_inputs, self._build_steps):  # fmt: skip
            started = time.perf_counter()
            phase()
            self.setup_seconds[phase.__name__.strip("_")] = time.perf_counter() - started

    # the first device: where tuning, benchmarks and single-device captures run
    @property
    def device(self) -> Any:
        return self.gpus[0].handle

    @property
    def device_name(self) -> str:
        return self.gpus[0].name

    @property
    def compute_capability(self) -> tuple[int, int]:
        return self.gpus[0].compute_capability

    @property
    def max_shared_optin(self) -> int:
        return self.gpus[0].max_shared_optin

    def _use(self, gpu: int) -> None:
        """Make device ``gpu``'s context current (setup work, and runs, happen on it)."""
        check(self.cu.cuCtxSetCurrent(self.gpus[gpu].ctx), f"cuda:{self.gpus[gpu].ordinal}: cuCtxSetCurrent")

    def _gpu(self, device_id: int) -> int:
        """The device index a captured device id runs on (0 for objects that name none)."""
        return self._gpu_of.get(device_id, 0)

    def _op_gpu(self, op: m.Operation) -> int | None:
        """The device an operation's work runs on (None: no device work, or any device)."""
        stream = getattr(op, "stream", None)
        if stream:
            return self._stream_gpu.get(stream, 0)
        buffers = self.plan.buffers
        if isinstance(op, m.Launch):
            targets = [r.target_buffer for r in op.relocations if not r.site_buffer]
            return self._gpu(buffers[targets[0]].device) if targets else 0
        if isinstance(op, m.Copy):
            buffer = op.src_buffer if op.kind == _K.COPY_DEVICE_TO_HOST else op.dst_buffer
            return self._gpu(buffers[buffer].device)
        if isinstance(op, m.Memset):
            return self._gpu(buffers[op.buffer].device)
        if isinstance(op, m.DeviceSynchronize):
            return self._gpu(op.device)
        if isinstance(op, m.EventRecord | m.StreamWaitEvent):
            return self._gpu(self.plan.events[op.event].device)
        return None

    def _check_device_fits(self) -> None:
        cu = self.cu
        need: dict[int, int] = {}
        for buf in self.plan.buffers.values():
            need[self._gpu(buf.device)] = need.get(self._gpu(buf.device), 0) + buf.size
        for k, gpu in enumerate(self.gpus):
            arch = gpu.compute_capability[0] * 10 + gpu.compute_capability[1]
            for eid, image in self.plan.images.items():
                built = image.cubin.arch if image.cubin is not None else None
                if built is not None and (built // 10 != arch // 10 or built > arch):
                    raise DeviceError(
                        f"executable {eid} is a cubin for sm_{built}; cuda:{gpu.ordinal} "
                        f"({gpu.name}) is sm_{arch}: it cannot run it (substitute a build for sm_{arch})"
                    )
            self._use(k)
            free, _total = check(cu.cuMemGetInfo(), "cuMemGetInfo")
            if need.get(k, 0) > free:
                raise DeviceError(
                    f"the capture needs {need[k]} bytes of device memory on cuda:{gpu.ordinal}; {gpu.name} has "
                    f"{free} free"
                )
        self._use(0)

    def _allocate_buffers(self) -> None:
        cu = self.cu
        if self.plan.options.fixed_addresses:
            self._allocate_fixed()
            return
        current = 0
        for bid, buf in self.plan.buffers.items():
            if buf.memory != m.MemoryKind.DEVICE:
                raise DeviceError(f"buffer {bid}: {buf.memory.name.lower()} memory cannot be replayed")
            if self._gpu(buf.device) != current:
                current = self._gpu(buf.device)
                self._use(current)
            size = max(buf.size, 1)
            extra = max(0, buf.alignment - 256)
            ptr = check(cu.cuMemAlloc(size + extra), f"buffer {bid}: cuMemAlloc({size + extra})")
            self._closers.append(lambda p=ptr: cu.cuMemFree(p))
            address = int(ptr)
            if extra:
                address = (address + buf.alignment - 1) // buf.alignment * buf.alignment
            self.addresses[bid] = address
        self._use(0)

    def _allocate_fixed(self) -> None:
        """Give every buffer its recorded address, or fail (never run with other addresses).

        One virtual range spanning all recorded buffers is reserved (the address is only a hint
        to the driver, so the result is checked), then physical memory is mapped into it, once per
        run of pages that buffers share (allocators place several tensors in one page).
        """
        cu = self.cu
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = self.options.devices[0]
        flags = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
        page = check(cu.cuMemGetAllocationGranularity(prop, flags), "cuMemGetAllocationGranularity")
        for bid, buf in self.plan.buffers.items():
            if buf.address == 0:
                raise DeviceError(f"buffer {bid} has no recorded address; it cannot be replayed with --fixed-addresses")
            self.addresses[bid] = buf.address
        regions = page_runs(_recorded_ranges(self.plan), page)
        if not regions:
            return
        low, high = regions[0][0], regions[-1][1]
        ptr = check(cu.cuMemAddressReserve(high - low, page, low, 0), "cuMemAddressReserve")
        self._closers.append(lambda: cu.cuMemAddressFree(ptr, high - low))
        if int(ptr) != low:
            why = f": {self._arena_problem}" if self._arena_problem else ""
            raise DeviceError(
                f"--fixed-addresses: the driver would not reserve the recorded range [{low:#x}, {high:#x}) (it "
                f"offered {int(ptr):#x}){why}. Capture and replay with the tools' --fixed-addresses (they run "
                "with address-space randomisation off), in a fresh process with nothing else on the device"
            )
        access = cu.CUmemAccessDesc()
        access.location = prop.location
        access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        for start, end in regions:
            handle = check(cu.cuMemCreate(end - start, prop, 0), f"cuMemCreate({end - start}) at {start:#x}")
            self._closers.append(lambda h=handle: cu.cuMemRelease(h))
            check(cu.cuMemMap(start, end - start, 0, handle, 0), f"cuMemMap at {start:#x}")
            self._closers.append(lambda s=start, n=end - start: cu.cuMemUnmap(s, n))
            check(cu.cuMemSetAccess(start, end - start, [access], 1), f"cuMemSetAccess at {start:#x}")

    def _load_modules(self) -> None:
        initial_globals: dict[int, bytes] = {}  # read from the file once, uploaded on every device
        for k in range(len(self.gpus)):
            self._use(k)
            self._functions_on.append(self._load_modules_here(self.gpus[k], initial_globals))
        self._use(0)
        self.functions = self._functions_on[0]

    def _load_modules_here(self, gpu: ReplayDevice, initial_globals: dict[int, bytes]) -> dict[tuple[int, int], Any]:
        """Load every executable into the current context; the launched functions, checked."""
        cu = self.cu
        functions: dict[tuple[int, int], Any] = {}
        # Executables that share an image (a recorder writes one per kernel of a module) share
        # one loaded module, as they shared it in the program: module globals stay common.
        loaded: dict[tuple[str, int, int], Any] = {}
        for eid, image in self.plan.images.items():
            exe = image.executable
            key = (image.source, exe.payload, exe.file) if image.source == "capture" else (image.source, 0, 0)
            module = loaded.get(key)
            if module is None:
                module = loaded[key] = self._load_image(eid, image, gpu)
            for index, fn in enumerate(image.executable.functions):
                if (eid, index) not in self.plan.launches_of:
                    continue
                try:
                    handle = check(cu.cuModuleGetFunction(module, fn.name.encode()), "cuModuleGetFunction")
                except CudaCallError:
                    raise AbiMismatchError(f"executable {eid}: function {fn.name} is not in {image.source}") from None
                self.layouts[(eid, index)] = self._param_layout(handle)
                self._check_abi(eid, index, handle, image.source)
                smem = self.plan.max_shared_memory.get((eid, index), 0)
                if smem > 48 * 1024:
                    if smem > gpu.max_shared_optin:
                        raise DeviceError(
                            f"executable {eid}: {fn.name} needs {smem} bytes of dynamic shared memory; "
                            f"{gpu.name} allows {gpu.max_shared_optin}"
                        )
                    check(
                        cu.cuFuncSetAttribute(
                            handle, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem
                        ),
                        f"executable {eid}: {fn.name}: opting in to {smem} bytes of dynamic shared memory",
                    )
                functions[(eid, index)] = handle
            for gid, glob in self.plan.globals.items():
                if glob.executable == eid and glob.initial_payload:
                    ptr, size = check(cu.cuModuleGetGlobal(module, glob.symbol.encode()), f"global {gid} {glob.symbol}")
                    if gid not in initial_globals:
                        initial_globals[gid] = self.plan.capture.read_payload(glob.initial_payload)
                    data_bytes = initial_globals[gid]
                    check(cu.cuMemcpyHtoD(ptr, data_bytes, min(size, len(data_bytes))), f"global {gid}: upload")
        return functions

    def _load_image(self, eid: int, image: ExecutableImage, gpu: ReplayDevice) -> Any:
        cu = self.cu
        data = image.data + (
            b"\0" if image.format == m.ExecutableFormat.PTX and not image.data.endswith(b"\0") else b""
        )
        try:
            module = check(cu.cuModuleLoadData(data), f"executable {eid} ({image.source}): cuModuleLoadData")
        except CudaCallError as exc:
            if exc.name == "CUDA_ERROR_NO_BINARY_FOR_GPU":
                raise DeviceError(f"{exc}; the executable has no code for cuda:{gpu.ordinal} ({gpu.name})") from None
            raise
        self._closers.append(lambda mod=module: cu.cuModuleUnload(mod))
        self._images.append(data)
        return module

    def _check_abi(self, eid: int, index: int, handle: Any, source: str) -> None:
        """The loaded function must take the captured parameters and fit the captured launches."""
        cu = self.cu
        fn = self.plan.images[eid].executable.functions[index]
        layout = self.layouts[(eid, index)]
        if fn.parameters_known:
            captured = [(p.offset, p.size) for p in fn.parameters]
            if captured != layout:
                raise AbiMismatchError(layout_difference(eid, fn.name, captured, layout, source))
        attribute = cu.CUfunction_attribute
        threads = check(cu.cuFuncGetAttribute(attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, handle), "attribute")
        needed = self.plan.max_block_threads.get((eid, index), 0)
        if needed > threads:
            registers = check(cu.cuFuncGetAttribute(attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, handle), "attribute")
            raise AbiMismatchError(
                f"executable {eid}: {fn.name} from {source} allows {threads} threads per block ({registers} "
                f"registers per thread); the capture launches it with {needed}"
            )

    def _param_layout(self, handle: Any) -> list[tuple[int, int]]:
        cu = self.cu
        layout = []
        for i in range(4096):
            err, offset, size = cu.cuFuncGetParamInfo(handle, i)
            if err != cu.CUresult.CUDA_SUCCESS:
                break
            layout.append((int(offset), int(size)))
        return layout

    def _create_streams_and_events(self) -> None:
        cu = self.cu
        disable_timing = cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
        # CU_STREAM_LEGACY: captured default-stream work keeps its semantics on the first device;
        # on the others it runs on a blocking stream of theirs (it waits for their legacy stream)
        self.streams[0] = cu.CUstream(1)
        self._default_streams = [self.streams[0]]
        joinable: list[tuple[int, Any]] = []  # (device, stream) that the timing stream joins
        for k in range(1, len(self.gpus)):
            self._use(k)
            handle = check(cu.cuStreamCreate(0), f"cuda:{self.gpus[k].ordinal}: default-stream stand-in")
            self._closers.append(lambda h=handle: cu.cuStreamDestroy(h))
            self._default_streams.append(handle)
            joinable.append((k, handle))
        for sid, stream in self.plan.streams.items():
            k = self._stream_gpu[sid] = self._gpu(stream.device)
            self._use(k)
            flags = stream.flags & 1  # CU_STREAM_NON_BLOCKING is the only flag that matters here
            handle = check(cu.cuStreamCreateWithPriority(flags, stream.priority), f"stream {sid}: cuStreamCreate")
            self._closers.append(lambda h=handle: cu.cuStreamDestroy(h))
            self.streams[sid] = handle
            joinable.append((k, handle))
        for eid, event in self.plan.events.items():
            self._use(self._gpu(event.device))
            handle = check(cu.cuEventCreate(disable_timing), f"event {eid}: cuEventCreate")
            self._closers.append(lambda h=handle: cu.cuEventDestroy(h))
            self.events[eid] = handle
        self._join: list[tuple[Any, Any]] = []  # (stream, an event of its device)
        for k, handle in joinable:
            self._use(k)
            join = check(cu.cuEventCreate(disable_timing), "join event")
            self._closers.append(lambda h=join: cu.cuEventDestroy(h))
            self._join.append((handle, join))
        self._use(0)
        self._timing = [check(cu.cuEventCreate(0), "timing event") for _ in range(2)]
        for handle in self._timing:
            self._closers.append(lambda h=handle: cu.cuEventDestroy(h))

    def _pinned(self, size: int, what: str) -> int:
        cu = self.cu
        portable = cu.CU_MEMHOSTALLOC_PORTABLE if len(self.gpus) > 1 else 0  # pinned for every device's context
        ptr = check(cu.cuMemHostAlloc(max(size, 1), portable), f"{what}: cuMemHostAlloc({size})")
        self._closers.append(lambda: cu.cuMemFreeHost(ptr))
        return int(ptr)

    def _pinned_large(self, size: int, what: str) -> int:
        """Pinned memory for a large buffer: transparent huge pages registered with the driver
        pin in about half the time of cuMemHostAlloc (fewer pages to lock); cuMemHostAlloc when
        that is refused."""
        cu = self.cu
        huge = 2 << 20
        try:
            region = mmap.mmap(-1, size + huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except OSError:
            return self._pinned(size, what)
        with contextlib.suppress(AttributeError, OSError):
            region.madvise(mmap.MADV_HUGEPAGE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(region))
        address = (base + huge - 1) // huge * huge
        for page in range(address - base, address - base + size, huge):  # faulted (and zeroed) here, so threads
            region[page] = 0  # that pin side by side fault side by side: the driver's pinning is serial
        flags = cu.CU_MEMHOSTREGISTER_PORTABLE if len(self.gpus) > 1 else 0
        if cu.cuMemHostRegister(address, size, flags)[0] != cu.CUresult.CUDA_SUCCESS:
            region.close()
            return self._pinned(size, what)
        self._closers.append(region.close)
        self._closers.append(lambda: cu.cuMemHostUnregister(address))
        return address

    def _stage_inputs(self) -> None:
        """Bring every uploaded payload (or file range) close to the device, once.

        When device memory allows, each upload gets a pristine copy on the device: upload lanes
        (a thread, a stream and two pinned slots each) read frames (raw: preadv; zstd:
        decompressed in place), check them against their hash and copy each up as soon as it is
        read, so reading and uploading overlap. Every run's uploads are then device-to-device
        copies. Otherwise the bytes stay in pinned host memory and runs copy them up.
        """
        cu, cap = self.cu, self.plan.capture
        sources = self.plan.uploads
        if not sources:
            return
        started = time.perf_counter()
        workers = min(32, os.cpu_count() or 4)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kreplay-stage")
        self._closers.append(lambda: self._pool.shutdown(wait=True, cancel_futures=True))
        total = sum(size for _, size in sources.values())
        per_gpu: dict[int, int] = {}
        for op, size in sources.values():
            k = self._gpu(self.plan.buffers[op.dst_buffer].device)
            per_gpu[k] = per_gpu.get(k, 0) + size
        fits = True
        for k, size in per_gpu.items():
            self._use(k)
            free, _ = check(cu.cuMemGetInfo(), "cuMemGetInfo")
            fits &= size <= free - (1 << 30)
        self._use(0)
        self.pristine_on_device = not self.options.uploads_from_host and fits
        self.staging = StagingStats(bytes=total, on_device=self.pristine_on_device)
        if not self.pristine_on_device:
            self.staging.checked = FrameCheck.HOST if self.options.check_payloads else FrameCheck.NONE
            self.staging.setup_seconds = time.perf_counter() - started
            started = time.perf_counter()
            for key, (op, size) in sources.items():
                address = self._pinned(size, f"operation {op.index}")
                view = memoryview((ctypes.c_char * max(size, 1)).from_address(address)).cast("B")[:size]
                for future in [self._pool.submit(job) for job in self._read_jobs(op, view)]:
                    future.result()
                self._staged[key] = _Staged(address, size, on_device=False)
            self.staging.seconds = time.perf_counter() - started
            return
        slot_size = max([_UPLOAD_PIECE] + [n for op, _ in sources.values() if not op.src_file
                                     for _, n in cap.frame_ranges(op.payload)])  # fmt: skip
        # frames are checked where they land, on the device, when the digest kernel loads there
        on_device_check = self.options.check_payloads and len(self.gpus) == 1
        loading = self._pool.submit(self._load_digester) if on_device_check else None
        jobs: list[tuple[int, int, Callable[[memoryview], None]]] = []
        pristine: dict[UploadKey, int] = {}
        for key, (op, size) in sources.items():
            self._use(self._gpu(self.plan.buffers[op.dst_buffer].device))  # next to the buffers it restores
            address = int(check(cu.cuMemAlloc(max(size, 1)), f"operation {op.index}: pristine copy of {size} bytes"))
            self._closers.append(lambda p=address: cu.cuMemFree(p))
            self._staged[key] = _Staged(address, size, on_device=True)
            pristine[key] = address
        self._use(0)
        pieces_at_least = -(-total // slot_size)
        count = max(1, min(_UPLOAD_LANES, workers, pieces_at_least, _UPLOAD_PINNED // (_UploadLanes.SLOTS * slot_size)))
        lanes = _UploadLanes(self, self._pool, lanes=count, slot_size=slot_size)
        digester = loading.result() if loading is not None else None
        if digester is not None:
            self.staging.checked = FrameCheck.DEVICE
        elif self.options.check_payloads:
            self.staging.checked = FrameCheck.HOST
        for key, (op, size) in sources.items():
            pieces = self._pieces(op, size, slot_size, check_frames=self.staging.checked == FrameCheck.HOST)
            jobs += [(pristine[key] + offset, length, read) for offset, length, read in pieces]
        self.staging.setup_seconds = time.perf_counter() - started
        started = time.perf_counter()
        lanes.upload(jobs)
        if digester is not None:
            checking = time.perf_counter()
            self._check_frames_on_device(digester, pristine)
            self.staging.check_seconds = time.perf_counter() - checking
        self.staging.seconds = time.perf_counter() - started

    def _load_digester(self) -> DeviceDigester | None:
        check(self.cu.cuCtxSetCurrent(self.gpus[0].ctx), "frame digests")
        try:
            digester = DeviceDigester(self.cu)
        except (CudaCallError, OSError):
            return None  # a driver older than the kernel's PTX (or no PTX): frames are hashed on the host
        self._closers.append(digester.close)
        return digester

    def _check_frames_on_device(self, digester: DeviceDigester, pristine: dict[UploadKey, int]) -> None:
        """Compare every staged payload frame's digest, computed where it landed, with the
        recorded one (frames of 240 bytes or less, which XXH3 hashes otherwise, on the host)."""
        cap = self.plan.capture
        frames: list[tuple[int, int]] = []
        names: list[tuple[int, int, bytes]] = []  # (payload, frame index, recorded digest) of each
        for key, (op, _) in self.plan.uploads.items():
            if op.src_file:
                continue
            recorded = cap.payload(op.payload).frames
            for k, (offset, length) in enumerate(cap.frame_ranges(op.payload)):
                address = pristine[key] + offset
                if length >= DIGEST_SHORTEST and address % 8 == 0:
                    frames.append((address, length))
                    names.append((op.payload, k, recorded[k]))
                else:
                    cap.read_frame_into(op.payload, k, bytearray(length))  # re-read and hashed on the host
        for (payload, k, expected), digest in zip(names, digester.digests(frames), strict=True):
            if digest != expected:
                cap.check_frame_digest(payload, k, digest)  # raises the reader's error, naming the frame

    def _pieces(
        self, op: m.Copy, size: int, chunk: int, *, check_frames: bool
    ) -> list[tuple[int, int, Callable[[memoryview], None]]]:
        """(offset, length, reader) pieces of an upload's source: file chunks, or runs of whole
        payload frames of up to ``chunk`` bytes (one frame at least, 256 at most: one preadv),
        hashed as they are read when ``check_frames``."""
        cap = self.plan.capture
        if op.src_file:
            return [(s, min(chunk, size - s), lambda view, s=s: self._read_file_range(op, view, s))
                    for s in range(0, size, chunk)]  # fmt: skip
        pieces: list[tuple[int, int, Callable[[memoryview], None]]] = []
        frames = cap.frame_ranges(op.payload)
        first = 0
        while first < len(frames):
            start, length = frames[first]
            count = 1
            while first + count < len(frames) and count < 256 and length + frames[first + count][1] <= chunk:
                length += frames[first + count][1]
                count += 1
            pieces.append((start, length, lambda view, k=first, n=count: cap.read_frames_into(
                op.payload, k, n, view, check=check_frames)))  # fmt: skip
            first += count
        return pieces

    def _read_jobs(self, op: m.Copy, target: memoryview) -> list[Callable[[], None]]:
        return [
            lambda s=s, n=n, read=read: read(target[s : s + n])
            for s, n, read in self._pieces(op, len(target), _UPLOAD_PIECE, check_frames=self.options.check_payloads)
        ]

    def _read_file_range(self, op: m.Copy, target: memoryview, skip: int = 0) -> None:
        """Fill ``target`` with the copy's file bytes starting ``skip`` bytes into its range."""
        resolved = self.plan.files[op.src_file]
        ref = resolved.reference
        start = op.src_offset + skip
        if resolved.path is not None:
            with open(resolved.path, "rb") as f:
                f.seek(start)
                if f.readinto(target) != len(target):
                    raise ReplayError(f"operation {op.index}: {resolved.path} is shorter than the captured read")
            return
        if ref.policy == m.FilePolicy.CAPTURE_ALL:
            self.plan.capture.read_payload_into(ref.payload, target, start)
            return
        for r in ref.ranges:
            if r.offset <= op.src_offset and op.src_offset + op.size <= r.offset + r.size:
                self.plan.capture.read_payload_into(r.payload, target, start - r.offset)
                return
        raise ReplayError(f"operation {op.index}: file bytes at {op.src_offset} were not captured")

    # -- steps ---------------------------------------------------------------------------------

    def _build_steps(self) -> None:
        cu = self.cu
        steps = self._steps
        A = self.addresses
        nvtx = Nvtx.load() if self.options.nvtx else None
        several = len(self.gpus) > 1
        current = 0  # the device whose context is current when this step runs (runs start on the first)
        for op in self.plan.capture.iter_operations():
            if op.index in self.plan.state:  # the starting state of the region beginning here
                steps.append((self.apply_state, (op.index, self.plan.state[op.index]), op.index))
                current = 0
            gpu = self._op_gpu(op) if several else 0
            if gpu is not None and gpu != current:
                steps.append((cu.cuCtxSetCurrent, (self.gpus[gpu].ctx,), op.index))
                current = gpu
            captured_stream = getattr(op, "stream", 0)
            stream = self.streams[captured_stream] if captured_stream else self._default_streams[gpu or 0]
            self.op_streams[op.index] = stream
            if isinstance(op, m.Launch):
                launch = self._prepare_launch(op, stream, gpu or 0)
                self._launches.append(launch)
                for site, value in launch.buffer_sites:
                    steps.append((cu.cuMemcpyHtoDAsync, (site, value, 8, stream), op.index))
                if nvtx is not None:
                    steps.append((nvtx.push, (launch.name.encode(),), op.index))
                steps.append((self._launch_ex if launch.extended else cu.cuLaunchKernel, launch.args, op.index))
                if nvtx is not None:
                    steps.append((nvtx.pop, (), op.index))
                self._kernel_names[op.index] = launch.name
            elif isinstance(op, m.Copy):
                if op.kind == _K.COPY_HOST_TO_DEVICE:
                    staged = self._staged[upload_key(op)]
                    copy = cu.cuMemcpyDtoDAsync if staged.on_device else cu.cuMemcpyHtoDAsync
                    steps.append((copy, (A[op.dst_buffer] + op.dst_offset, staged.address, op.size, stream), op.index))
                elif op.kind == _K.COPY_DEVICE_TO_HOST:
                    host = self._pinned(op.size, f"operation {op.index}")
                    steps.append(
                        (cu.cuMemcpyDtoHAsync, (host, A[op.src_buffer] + op.src_offset, op.size, stream), op.index)
                    )
                    if op.payload and self.options.verify:
                        steps.append((self._check_download, (op, host), op.index))
                        current = 0  # it synchronises every device
                else:
                    args = (A[op.dst_buffer] + op.dst_offset, A[op.src_buffer] + op.src_offset, op.size, stream)
                    steps.append((cu.cuMemcpyDtoDAsync, args, op.index))
            elif isinstance(op, m.Memset):
                fn = {1: cu.cuMemsetD8Async, 2: cu.cuMemsetD16Async, 4: cu.cuMemsetD32Async}[op.element_size]
                steps.append((fn, (A[op.buffer] + op.offset, op.value, op.count, stream), op.index))
            elif isinstance(op, m.EventRecord):
                steps.append((cu.cuEventRecord, (self.events[op.event], stream), op.index))
            elif isinstance(op, m.StreamWaitEvent):
                steps.append((cu.cuStreamWaitEvent, (stream, self.events[op.event], 0), op.index))
            elif isinstance(op, m.StreamSynchronize):
                steps.append((self._synchronize, (cu.cuStreamSynchronize, stream), op.index))
            elif isinstance(op, m.DeviceSynchronize):
                steps.append((self._synchronize, (cu.cuCtxSynchronize,), op.index))
            elif isinstance(op, m.EventSynchronize):
                steps.append((self._synchronize, (cu.cuEventSynchronize, self.events[op.event]), op.index))
            elif isinstance(op, m.Checkpoint) and (self.options.verify or self.options.save_output):
                steps.append((self._checkpoint, (op,), op.index))
                current = 0  # it synchronises every device
            elif isinstance(op, m.ScopeBegin) and nvtx is not None:
                steps.append((nvtx.push, (op.name.encode(),), op.index))
            elif isinstance(op, m.ScopeEnd) and nvtx is not None:
                steps.append((nvtx.pop, (), op.index))
            # create, destroy, module load: done at setup; scopes: markers only

    def apply_state(self, index: int, copies: list[m.Copy]) -> None:
        """Set the starting state of the region beginning at operation ``index`` (format 1.1 state,
        hoisted): after all work before it, before any of its own, on the legacy stream joined with
        every stream, between two timed events (``run`` leaves that interval out of device time)."""
        cu = self.cu
        self._use(0)  # its events and the legacy stream it joins belong to the first device
        events = self._state_events.get(index)
        if events is None:
            events = self._state_events[index] = (check(cu.cuEventCreate(0), "state event"),
                                                  check(cu.cuEventCreate(0), "state event"))  # fmt: skip
            for event in events:
                self.own(lambda e=event: cu.cuEventDestroy(e))
        self.join(events[0])
        for copy in copies:
            staged = self._staged[upload_key(copy)]
            fn = cu.cuMemcpyDtoDAsync if staged.on_device else cu.cuMemcpyHtoDAsync
            args = (self.addresses[copy.dst_buffer] + copy.dst_offset, staged.address, copy.size, self.streams[0])
            check(fn(*args), f"operation {copy.index} (state)")
        self.fork(events[1])
        self.states_applied.append(events)

    def _prepare_launch(self, op: m.Launch, stream: Any, gpu: int = 0) -> _Launch:
        cu = self.cu
        plan = self.plan
        exe = plan.images[op.executable].executable
        fn = exe.functions[op.function]
        handle = self._functions_on[gpu][(op.executable, op.function)]
        for r in op.relocations:
            owner = self._gpu(plan.buffers[r.target_buffer].device)
            if owner != gpu:
                self._enable_peer_access(gpu, owner, op)
        layout = self.layouts[(op.executable, op.function)]
        block = bytearray(op.parameters)
        sites = []
        for r in op.relocations:
            target = self.addresses[r.target_buffer] + r.target_offset
            if r.site_buffer:
                value = self._pinned(8, f"operation {op.index}")
                ctypes.c_uint64.from_address(value).value = target
                sites.append((self.addresses[r.site_buffer] + r.site_offset, value))
            elif r.kind == m.RelocationKind.TENSOR_MAP:
                block[r.site_offset : r.site_offset + 128] = self._retarget_tensor_map(
                    bytes(block[r.site_offset : r.site_offset + 128]), target, op
                )
            else:
                block[r.site_offset : r.site_offset + 8] = target.to_bytes(8, "little")
        end = max((o + s for o, s in layout), default=0)
        if len(block) < end:
            raise AbiMismatchError(
                f"operation {op.index} ({fn.name}): {len(block)} parameter bytes captured, the loaded function "
                f"takes {end}"
            )
        storage = np.frombuffer(bytes(block) or b"\0", dtype=np.uint8).copy()
        pointers = np.array([storage.ctypes.data + o for o, _ in layout] or [0], dtype=np.uint64)
        params = pointers.ctypes.data if layout else 0
        override = plan.overrides.get(op.index)
        grid, blk, smem = op.grid, op.block, op.shared_memory
        if override is not None:
            grid, blk = override.grid or grid, override.block or blk
            smem = smem if override.shared_memory is None else override.shared_memory
        keep = [storage, pointers]
        if any(op.cluster) or op.flags & m.LAUNCH_FLAG_COOPERATIVE:
            config = cu.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ = grid
            config.blockDimX, config.blockDimY, config.blockDimZ = blk
            config.sharedMemBytes = smem
            config.hStream = stream
            attrs = []
            if any(op.cluster):
                attr = cu.CUlaunchAttribute()
                attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
                attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = (
                    max(1, c) for c in op.cluster
                )
                attrs.append(attr)
            if op.flags & m.LAUNCH_FLAG_COOPERATIVE:
                attr = cu.CUlaunchAttribute()
                attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
                attr.value.cooperative = 1
                attrs.append(attr)
            config.attrs = attrs
            config.numAttrs = len(attrs)
            keep.append(config)
            return _Launch(fn.name, (config, handle, params, 0), True, keep, sites)
        args = (handle, *grid, *blk, smem, stream, params, 0)
        return _Launch(fn.name, args, False, keep, sites)

    def _enable_peer_access(self, gpu: int, owner: int, op: m.Launch) -> None:
        """Let kernels on ``gpu`` dereference memory of ``owner`` (a pointer into its buffer)."""
        if (gpu, owner) in self._peers:
            return
        cu = self.cu
        here, there = self.gpus[gpu], self.gpus[owner]
        if not check(cu.cuDeviceCanAccessPeer(here.handle, there.handle), "cuDeviceCanAccessPeer"):
            raise DeviceError(
                f"operation {op.index}: a kernel on cuda:{here.ordinal} uses memory of cuda:{there.ordinal}, and "
                "these devices cannot access each other's memory: replay on devices with peer access"
            )
        self._use(gpu)
        result = cu.cuCtxEnablePeerAccess(there.ctx, 0)
        if result[0] not in (cu.CUresult.CUDA_SUCCESS, cu.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED):
            check(result, f"operation {op.index}: cuCtxEnablePeerAccess(cuda:{here.ordinal} -> cuda:{there.ordinal})")
        self._peers.add((gpu, owner))
        self._use(0)

    def _launch_ex(self, config: Any, handle: Any, params: int, extra: int) -> Any:
        return self.cu.cuLaunchKernelEx(config, handle, params, extra)

    def _retarget_tensor_map(self, raw: bytes, address: int, op: m.Launch) -> bytes:
        cu = self.cu
        tensor_map = cu.CUtensorMap()
        try:
            tensor_map.opaque = list(np.frombuffer(raw, "<u8").tolist())
        except (AttributeError, TypeError) as exc:
            raise DeviceError(
                f"operation {op.index}: cannot rewrite a tensor map with this cuda-python ({exc})"
            ) from None
        check(cu.cuTensorMapReplaceAddress(tensor_map, address), f"operation {op.index}: cuTensorMapReplaceAddress")
        return np.array(tensor_map.opaque, dtype="<u8").tobytes()

    # -- running -------------------------------------------------------------------------------

    def _synchronize(self, fn: Callable[..., Any], *args: Any) -> Any:
        result = fn(*args)
        if result[0] == self.cu.CUresult.CUDA_SUCCESS:
            self._recent.clear()
        return result

    def _op_error(self, index: int, fn: Any, result: Any) -> ReplayError:
        err = result[0] if isinstance(result, tuple) else result
        name = getattr(fn, "__name__", str(fn)).lstrip("_")
        op = self.plan.capture.operation(index)
        what = op.kind.label
        if index in self._kernel_names:
            what += f" of {self._kernel_names[index]}"
        message = f"operation {index} ({what}): {name} failed: {error_text(self.cu, err)}"
        if getattr(err, "name", "") in STICKY_ERRORS:
            suspects = ", ".join(f"operation {i} ({n})" for i, n in self._recent) or "none recorded"
            message += (f"; launches since the last successful synchronisation: {suspects} "
                        "(the CUDA context is now unusable)")  # fmt: skip
        return DeviceError(message)

    def _sync_error(self, err: Any) -> DeviceError:
        suspects = ", ".join(f"operation {i} ({n})" for i, n in self._recent) or "none recorded"
        return DeviceError(
            f"synchronising at the end of the replay: {error_text(self.cu, err)}; launches since the last "
            f"successful synchronisation: {suspects} (the CUDA context is now unusable)"
        )

    def set_launch_shape(self, index: int, grid: m.Dims, block: m.Dims, shared_memory: int) -> None:
        """Change the shape of launch operation ``index`` in the prepared steps (for tuning)."""
        cu = self.cu
        for k, (fn, args, op) in enumerate(self._steps):
            if op != index:
                continue
            if fn == cu.cuLaunchKernel:
                handle, *_, stream, params, extra = args
                self._steps[k] = (fn, (handle, *grid, *block, shared_memory, stream, params, extra), op)
                return
            if fn == self._launch_ex:
                config = args[0]
                config.gridDimX, config.gridDimY, config.gridDimZ = grid
                config.blockDimX, config.blockDimY, config.blockDimZ = block
                config.sharedMemBytes = shared_memory
                return
        raise ReplayUsageError(f"operation {index} is not a launch of this replay")

    def load_with_register_cap(self, executable: int, max_registers: int | None, threads_per_block: int = 0) -> None:
        """Re-JIT a PTX executable with a register cap and a threads-per-block hint (None: back to
        the image as loaded at setup) and point its launches at the new functions. Compiled
        modules are kept, so going back to a variant already tried costs nothing."""
        cu = self.cu
        image = self.plan.images[executable]
        if image.format != m.ExecutableFormat.PTX:
            raise ReplayUsageError(
                f"executable {executable} is {image.format.name.lower()}, not PTX: only PTX can be re-JITted "
                "with a register cap"
            )
        variants = self._jit_variants.setdefault(executable, {None: {k: v for k, v in self.functions.items()
                                                                       if k[0] == executable}})  # fmt: skip
        key = None if max_registers is None else (max_registers, threads_per_block)
        if key not in variants:
            data = image.data + (b"" if image.data.endswith(b"\0") else b"\0")
            options, values = [cu.CUjit_option.CU_JIT_MAX_REGISTERS], [max_registers]
            if threads_per_block:
                options.append(cu.CUjit_option.CU_JIT_THREADS_PER_BLOCK)
                values.append(threads_per_block)
            module = check(cu.cuModuleLoadDataEx(data, len(options), options, values),
                           f"executable {executable}: JIT with at most {max_registers} registers")  # fmt: skip
            self.own(lambda: cu.cuModuleUnload(module))
            self._images.append(data)
            handles = {}
            for (eid, index), _ in variants[None].items():
                name = image.executable.functions[index].name
                handles[(eid, index)] = check(cu.cuModuleGetFunction(module, name.encode()), f"function {name}")
                smem = self.plan.max_shared_memory.get((eid, index), 0)
                if smem > 48 * 1024:
                    attribute = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                    check(cu.cuFuncSetAttribute(handles[(eid, index)], attribute, smem), "shared memory opt-in")
            variants[key] = handles
        new = variants[key]
        old_to_new = {id(self.functions[key]): handle for key, handle in new.items()}
        for k, (fn, args, op) in enumerate(self._steps):
            if fn == cu.cuLaunchKernel and id(args[0]) in old_to_new:
                self._steps[k] = (fn, (old_to_new[id(args[0])], *args[1:]), op)
            elif fn == self._launch_ex and id(args[1]) in old_to_new:
                self._steps[k] = (fn, (args[0], old_to_new[id(args[1])], *args[2:]), op)
        self.functions.update(new)

    def opt_in_shared_memory(self, executable: int, function: int, size: int) -> None:
        """Allow a function ``size`` bytes of dynamic shared memory (over 48 KiB needs opting in)."""
        cu = self.cu
        if size > self.max_shared_optin:
            raise DeviceError(
                f"{size} bytes of dynamic shared memory: {self.device_name} allows {self.max_shared_optin}"
            )
        attribute = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(cu.cuFuncSetAttribute(self.functions[(executable, function)], attribute, size), "cuFuncSetAttribute")

    def wrap_with_events(self, index: int, before: Any, after: Any) -> None:
        """Record ``before``/``after`` on the operation's stream around its steps (for timing)."""
        cu = self.cu
        positions = [k for k, step in enumerate(self._steps) if step[2] == index]
        if not positions:
            raise ReplayUsageError(f"operation {index} has no device work to time")
        stream = self.op_streams[index]
        self._steps.insert(positions[-1] + 1, (cu.cuEventRecord, (after, stream), index))
        self._steps.insert(positions[0], (cu.cuEventRecord, (before, stream), index))

    @property
    def steps(self) -> list[tuple[Callable[..., Any], tuple[Any, ...], int]]:
        """The prepared steps: (driver call, arguments, operation index), in capture order."""
        return self._steps

    def kernel_name(self, index: int) -> str | None:
        """The kernel a launch operation runs (None for other operations)."""
        return self._kernel_names.get(index)

    def execute_steps(self, steps: list[tuple[Callable[..., Any], tuple[Any, ...], int]]) -> list[str]:
        """Issue steps; raise on the first failure (or collect them with continue_on_error)."""
        cu = self.cu
        success = cu.CUresult.CUDA_SUCCESS
        names = self._kernel_names
        launch_fns = (cu.cuLaunchKernel, self._launch_ex)
        errors = []
        for fn, args, index in steps:
            out = fn(*args)
            if out is None:
                continue
            if out[0] != success:
                error = self._op_error(index, fn, out)
                if not self.options.continue_on_error or getattr(out[0], "name", "") in STICKY_ERRORS:
                    raise error  # nothing after a sticky error can run
                errors.append(str(error))
            elif fn in launch_fns:
                self._recent.append((index, names.get(index, "?")))
        return errors

    def fork(self, event: Any) -> None:
        """Record ``event`` on the timing stream and make every captured stream wait for it."""
        cu = self.cu
        self._use(0)
        timing_stream = self.streams[0]
        check(cu.cuEventRecord(event, timing_stream), "cuEventRecord")
        for handle, _ in self._join:
            check(cu.cuStreamWaitEvent(handle, event, 0), "cuStreamWaitEvent")

    def join(self, event: Any) -> None:
        """Make the timing stream wait for every captured stream, then record ``event`` on it."""
        cu = self.cu
        self._use(0)
        timing_stream = self.streams[0]
        for handle, join in self._join:
            check(cu.cuEventRecord(join, handle), "cuEventRecord")
            check(cu.cuStreamWaitEvent(timing_stream, join, 0), "cuStreamWaitEvent")
        check(cu.cuEventRecord(event, timing_stream), "cuEventRecord")

    def _synchronize_devices(self) -> Any:
        """cuCtxSynchronize on every device (the first error, if any); the first device stays current."""
        cu = self.cu
        out: Any = (cu.CUresult.CUDA_SUCCESS,)
        for k in reversed(range(len(self.gpus))):
            if len(self.gpus) > 1:
                self._use(k)
            result = cu.cuCtxSynchronize()
            if result[0] != cu.CUresult.CUDA_SUCCESS and out[0] == cu.CUresult.CUDA_SUCCESS:
                out = result
        return out

    def synchronize(self) -> None:
        """Wait for all work; a failure names the launches issued since the last good sync."""
        out = self._synchronize_devices()
        if out[0] != self.cu.CUresult.CUDA_SUCCESS:
            raise self._sync_error(out[0])
        self._recent.clear()

    def run(self, repetitions: int = 1) -> RunResult:
        """Execute the capture ``repetitions`` times; device time per repetition (CUDA events).

        Each repetition re-runs the captured uploads, so inputs are restored between repetitions.
        Device time leaves out the setting of starting state (it is not the program's work).
        """
        cu = self.cu
        result = self._result = RunResult()
        for repetition in range(repetitions):
            self._repetition = repetition
            self.states_applied = []
            self.fork(self._timing[0])
            result.errors += self.execute_steps(self._steps)
            self.join(self._timing[1])
            self.synchronize()
            total = check(cu.cuEventElapsedTime(self._timing[0], self._timing[1]), "cuEventElapsedTime")
            state = sum(check(cu.cuEventElapsedTime(a, b), "cuEventElapsedTime") for a, b in self.states_applied)
            result.device_ms.append(total - state)
            result.state_ms.append(state)
        return result

    # -- verification ------------------------------------------------------------------------

    def _read_back(self, buffer: int, offset: int, size: int) -> bytes:
        cu = self.cu
        out = bytearray(size)
        check(self._synchronize_devices(), "cuCtxSynchronize before reading a checkpoint")
        if size:
            host = (ctypes.c_char * size).from_buffer(out)
            check(
                cu.cuMemcpyDtoH(ctypes.addressof(host), self.addresses[buffer] + offset, size),
                f"reading buffer {buffer}",
            )
        return bytes(out)

    def _checkpoint(self, op: m.Checkpoint) -> None:
        """Compare (and save) the checkpoint's buffers. Every repetition is verified, since a race
        can show in any of them; the report of the first is kept, later ones only when they fail."""
        saving = self.options.save_output is not None and self._repetition == 0
        if not (self.options.verify or saving):
            return None  # nothing to compare or save: no read-back, no synchronisation
        for entry in op.entries:
            actual = self._read_back(entry.buffer, entry.offset, entry.size)
            buffer = self.plan.buffers[entry.buffer]
            if self.options.verify:
                expected = self._expected_bytes(entry.payload, entry.size)
                self._report(compare(expected, actual, buffer=buffer, operation=op.index,
                                     tolerance=self.options.tolerance, offset=entry.offset))  # fmt: skip
                if self.observer is not None:
                    self.observer.observe(op.index, buffer, entry.offset, expected, actual)
            if saving:
                self._save(op, buffer, entry.offset, actual)
        return None

    def _expected_bytes(self, payload: int, size: int) -> bytes:
        """Expected bytes, decoded once: repetitions and tuning candidates compare against them."""
        key = (payload, size)
        data = self._expected.get(key)
        if data is None:
            data = self.plan.capture.read_payload(payload, 0, size)
            if sum(len(v) for v in self._expected.values()) + size <= _EXPECTED_CACHE:
                self._expected[key] = data
        return data

    def _report(self, report: BufferReport) -> None:
        if self._repetition == 0 or not report.passed:
            self._result.reports.append(report)

    def _check_download(self, op: m.Copy, host: int) -> None:
        check(self._synchronize_devices(), "cuCtxSynchronize before checking a download")
        actual = ctypes.string_at(host, op.size)
        expected = self._expected_bytes(op.payload, op.size)
        buffer = self.plan.buffers[op.src_buffer]
        self._report(compare(expected, actual, buffer=buffer, operation=op.index, tolerance=self.options.tolerance,
                             offset=op.src_offset))  # fmt: skip
        if self.observer is not None:
            self.observer.observe(op.index, buffer, op.src_offset, expected, actual)
        return None

    def _save(self, op: m.Checkpoint, buffer: m.Buffer, offset: int, data: bytes) -> None:
        directory = self.options.save_output
        assert directory is not None
        directory.mkdir(parents=True, exist_ok=True)
        code = NUMPY_DTYPES.get(buffer.dtype)
        stem = f"op{op.index}_buffer{buffer.id}" + (f"_at{offset}" if offset else "")
        path = directory / (stem + (".npy" if code else ".bin"))
        if path.exists():
            raise ReplayUsageError(f"--save-output: {path} already exists; choose an empty directory")
        if code:
            array = np.frombuffer(data[: len(data) // np.dtype(code).itemsize * np.dtype(code).itemsize], code)
            if buffer.shape and int(np.prod(buffer.shape)) == array.size and not offset:
                array = array.reshape(buffer.shape)
            np.save(path, array)
        else:
            path.write_bytes(data)


@dataclass
class _Lane:
    """One upload lane's own stream and pinned slots, with an event per slot marking its copy done."""

    stream: Any
    slots: list[int]
    done: list[Any]


class _UploadLanes:
    """Upload lanes: each is a worker thread with its own stream and two pinned slots. A lane takes
    the next piece, reads it into a slot whose previous copy is done, and copies it up from its
    own thread, so lanes never wait on one another: one ring fed in order by the main thread held
    every copy behind the slowest read and reached half the rate on the H100. Every lane is
    pinned before any reads: while the driver pins memory it holds back other threads' driver
    calls, so lanes that pinned as they started stalled each other's copies (half the rate)."""

    SLOTS = 2

    def __init__(self, replayer: Replayer, pool: ThreadPoolExecutor, *, lanes: int, slot_size: int) -> None:
        self.cu = replayer.cu
        self.replayer = replayer
        self.pool = pool
        self.slot_size = slot_size
        self.context = replayer.gpus[0].ctx
        self.lanes = list(pool.map(self._make_lane, range(lanes)))  # each faults its pages in its own thread

    def _make_lane(self, index: int) -> _Lane:
        cu, own = self.cu, self.replayer.own
        check(cu.cuCtxSetCurrent(self.context), "staging lane")
        base = self.replayer._pinned_large(self.SLOTS * self.slot_size, f"staging lane {index}")
        stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "staging stream")
        own(lambda: cu.cuStreamDestroy(stream))
        done = [check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "event") for _ in range(self.SLOTS)]
        for event in done:
            own(lambda e=event: cu.cuEventDestroy(e))
        return _Lane(stream, [base + k * self.slot_size for k in range(self.SLOTS)], done)

    def upload(self, jobs: list[tuple[int, int, Callable[[memoryview], None]]]) -> None:
        """Run every (device address, length, reader) job; raises the first failure (a damaged
        frame raises ReplayFormatError here, before anything runs) once every lane has stopped."""
        queue = deque(jobs)
        failed = threading.Event()
        futures = [self.pool.submit(self._run_lane, lane, queue, failed) for lane in self.lanes]
        errors = []
        for future in futures:
            try:
                future.result()
            except BaseException as exc:  # re-raised below, once every lane has stopped
                errors.append(exc)
        if errors:
            raise next((e for e in errors if isinstance(e, ReplayError)), errors[0])

    def _run_lane(self, lane: _Lane, queue: deque, failed: threading.Event) -> None:
        cu = self.cu
        check(cu.cuCtxSetCurrent(self.context), "staging lane")
        try:
            turn = 0
            while not failed.is_set():
                try:
                    target, length, read = queue.popleft()
                except IndexError:
                    break
                slot = turn % self.SLOTS
                if turn >= self.SLOTS:  # the slot's previous copy must be done before it is overwritten
                    check(cu.cuEventSynchronize(lane.done[slot]), "staging upload")
                turn += 1
                read(memoryview((ctypes.c_char * length).from_address(lane.slots[slot])).cast("B"))
                check(cu.cuMemcpyHtoDAsync(target, lane.slots[slot], length, lane.stream), "staging upload")
                check(cu.cuEventRecord(lane.done[slot], lane.stream), "staging upload")
            check(cu.cuStreamSynchronize(lane.stream), "staging upload")
        except BaseException:
            failed.set()
            cu.cuStreamSynchronize(lane.stream)  # its slots must not be freed under a copy still reading them
            raise


def environment_ok() -> str | None:
    """None when a CUDA device can be used here, else why not (for tests that must skip)."""
    if os.environ.get("REPLAYFMT_NO_GPU"):
        return "REPLAYFMT_NO_GPU is set"
    try:
        cu = driver()
        count = check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
    except ReplayError as exc:
        return str(exc)
    return None if count else "no CUDA device"
