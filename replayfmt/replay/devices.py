"""The devices a replay runs on: their primary contexts, which captured device runs where, whether
the capture fits them, peer access between them, and every resource made for the replay.

Captured device k runs on ``cuda:ordinals[k]`` (its primary context). A :class:`Devices` is the
small state object that every setup phase is handed: it switches contexts and owns what the
phases create (released in reverse order by :meth:`Devices.close`).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from replayfmt.cuda.driver import check, compute_capability, driver, libcuda
from replayfmt.errors import DeviceError, DeviceUnavailableError, ReplayError
from replayfmt.format import model as m
from replayfmt.format.targets import refusal
from replayfmt.replay.executables import image_targets
from replayfmt.replay.plan import Plan

_K = m.OperationKind


@dataclass(frozen=True)
class ReplayDevice:
    """A device the replay runs on: captured device k runs on cuda:ordinal (its primary context)."""

    ordinal: int
    handle: Any
    ctx: Any
    name: str
    compute_capability: tuple[int, int]
    max_shared_optin: int

    @property
    def arch(self) -> int:
        """The compute capability as one number: 90 for sm_90."""
        return self.compute_capability[0] * 10 + self.compute_capability[1]


class DeviceWarmup:
    """Starts CUDA and retains the primary contexts of ``ordinals`` on a thread of its own while
    the caller goes on (reading and planning a large capture takes as long): the driver's start
    and a context's creation take a few hundred milliseconds that the replay's setup, which
    retains the same contexts, then does not wait for. It calls the driver through ctypes
    (``library``: :func:`libcuda`), which lets the caller's Python run meanwhile.

    Errors are left for the setup to meet and report (the warm-up only saves time);
    :meth:`close` releases what it retained."""

    def __init__(self, ordinals: tuple[int, ...], library: Callable[[], Any] | None = None) -> None:
        self._retained: list[int] = []
        self._lib: Any = None
        self._thread = threading.Thread(target=self._warm, args=(ordinals, library), name="device warm-up", daemon=True)
        self._thread.start()

    def _warm(self, ordinals: tuple[int, ...], library: Callable[[], Any] | None) -> None:
        try:
            lib = self._lib = (library or libcuda)()
            if lib is None or lib.cuInit(0) != 0:
                return
            for ordinal in ordinals:
                device, context = ctypes.c_int(), ctypes.c_void_p()
                if lib.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
                    return
                if lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) != 0:
                    return
                self._retained.append(device.value)
        except Exception:
            pass  # the setup starts CUDA itself and reports what fails

    def wait(self) -> None:
        """Until the warm-up is done (before the setup starts CUDA itself)."""
        self._thread.join()

    def close(self) -> None:
        """Release the contexts the warm-up retained (the replay's own retains keep them alive
        for as long as it runs). Idempotent."""
        self.wait()
        if not self._retained:
            return
        release = getattr(self._lib, "cuDevicePrimaryCtxRelease_v2", None) or self._lib.cuDevicePrimaryCtxRelease
        while self._retained:
            release(self._retained.pop())


class Devices:
    """The replay's devices (index 0 is where tuning, benchmarks and single-device captures run)
    and the owner of every resource created on them."""

    def __init__(self, cu: Any) -> None:
        self.cu = cu
        self.gpus: list[ReplayDevice] = []
        self._index_of: dict[int, int] = {}  # captured device id -> index in gpus
        self._closers: list[Callable[[], Any]] = []
        self._peers: set[tuple[int, int]] = set()  # (device, device whose memory it may access)

    # -- ownership ---------------------------------------------------------------------------

    def own(self, release: Callable[[], Any]) -> None:
        """Register the release of a resource made for this replay (run by :meth:`close`)."""
        self._closers.append(release)

    def close(self) -> None:
        """Release every resource owned (in reverse order), the contexts last. Idempotent."""
        while self._closers:
            closer = self._closers.pop()
            try:
                closer()
            except Exception:
                pass

    # -- which device ------------------------------------------------------------------------

    @property
    def several(self) -> bool:
        return len(self.gpus) > 1

    def use(self, gpu: int) -> None:
        """Make device ``gpu``'s context current (setup work, and runs, happen on it)."""
        device = self.gpus[gpu]
        check(self.cu.cuCtxSetCurrent(device.ctx), f"cuda:{device.ordinal}: cuCtxSetCurrent")

    def index(self, device_id: int) -> int:
        """The device index a captured device id runs on (0 for objects that name none)."""
        return self._index_of.get(device_id, 0)

    # -- opening -----------------------------------------------------------------------------

    def open(self, plan: Plan, ordinals: tuple[int, ...]) -> None:
        """Retain the primary context of each device the capture needs; the first becomes current.
        Captured devices that ``ordinals`` does not name run on the lowest ordinals it leaves free."""
        cu = self.cu
        wanted = max(1, len(plan.devices))
        if wanted > 1 and plan.options.fixed_addresses:
            raise DeviceError("--fixed-addresses replays single-device captures only")
        count = check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
        free = [k for k in range(count) if k not in ordinals]
        ordinals = (*ordinals, *free[: max(0, wanted - len(ordinals))])
        if wanted > len(ordinals):
            raise DeviceUnavailableError(
                f"the capture uses {wanted} devices; this machine has {count} CUDA device(s) (replay each rank or "
                "device's work on a machine with as many GPUs)"
            )
        optin = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        for ordinal in ordinals[:wanted]:
            if ordinal >= count:
                raise DeviceUnavailableError(f"--device cuda:{ordinal}: this machine has {count} CUDA device(s)")
            handle = check(cu.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")
            ctx = check(cu.cuDevicePrimaryCtxRetain(handle), f"cuda:{ordinal}: cuDevicePrimaryCtxRetain")
            self.own(lambda h=handle: cu.cuDevicePrimaryCtxRelease(h))
            name = check(cu.cuDeviceGetName(256, handle), "cuDeviceGetName").split(b"\0")[0].decode()
            shared = check(cu.cuDeviceGetAttribute(optin, handle), "shared memory opt-in")
            self.gpus.append(ReplayDevice(ordinal, handle, ctx, name, compute_capability(handle), shared))
        self._index_of = {device.id: k for k, device in enumerate(plan.devices)}
        self.use(0)

    def check_fit(self, plan: Plan) -> None:
        """Every executable must have a cubin or PTX its device can run (the refusal names those that
        do not), and every device must hold its buffers."""
        cu = self.cu
        need: dict[int, int] = {}
        for buf in plan.buffers.values():
            k = self.index(buf.device)
            need[k] = need.get(k, 0) + buf.size
        targets = image_targets(plan.images)  # what each image holds code for: cubins, PTX
        for k, gpu in enumerate(self.gpus):
            why = refusal(targets, gpu.compute_capability, f"cuda:{gpu.ordinal} ({gpu.name})")
            if why is not None:
                raise DeviceError(why)
            self.use(k)
            free, _total = check(cu.cuMemGetInfo(), "cuMemGetInfo")
            if need.get(k, 0) > free:
                raise DeviceError(
                    f"the capture needs {need[k]} bytes of device memory on cuda:{gpu.ordinal}; {gpu.name} has "
                    f"{free} free"
                )
        self.use(0)

    # -- running -----------------------------------------------------------------------------

    def enable_peer_access(self, gpu: int, owner: int, op: m.Operation) -> None:
        """Let kernels on ``gpu`` dereference memory of ``owner`` (a pointer into its buffer)."""
        if not self.peer_access(gpu, owner, op):
            here, there = self.gpus[gpu], self.gpus[owner]
            raise DeviceError(
                f"operation {op.index}: a kernel on cuda:{here.ordinal} uses memory of cuda:{there.ordinal}, and "
                "these devices cannot access each other's memory: replay on devices with peer access"
            )

    def peer_access(self, gpu: int, owner: int, op: m.Operation) -> bool:
        """Peer access from ``gpu`` to ``owner``'s memory, enabled once; False where the devices
        have none (a copy between them then goes through the host, slower, as it would have in
        the program; a kernel cannot run at all: :meth:`enable_peer_access`)."""
        if gpu == owner or (gpu, owner) in self._peers:
            return True
        cu = self.cu
        here, there = self.gpus[gpu], self.gpus[owner]
        if not check(cu.cuDeviceCanAccessPeer(here.handle, there.handle), "cuDeviceCanAccessPeer"):
            return False
        self.use(gpu)
        result = cu.cuCtxEnablePeerAccess(there.ctx, 0)
        if result[0] not in (cu.CUresult.CUDA_SUCCESS, cu.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED):
            check(result, f"operation {op.index}: cuCtxEnablePeerAccess(cuda:{here.ordinal} -> cuda:{there.ordinal})")
        self._peers.add((gpu, owner))
        self.use(0)
        return True

    def synchronize_all(self) -> Any:
        """cuCtxSynchronize on every device; the first error's result, if any (else success). The
        first device stays current."""
        cu = self.cu
        out: Any = (cu.CUresult.CUDA_SUCCESS,)
        for k in reversed(range(len(self.gpus))):
            if self.several:
                self.use(k)
            result = cu.cuCtxSynchronize()
            if result[0] != cu.CUresult.CUDA_SUCCESS and out[0] == cu.CUresult.CUDA_SUCCESS:
                out = result
        return out

    def operation_device(self, op: m.Operation, plan: Plan, stream_device: dict[int, int]) -> int | None:
        """The device an operation's work runs on (None: no device work, or any device);
        ``stream_device`` maps captured stream ids to device indices."""
        stream = getattr(op, "stream", None)
        if stream:
            return stream_device.get(stream, 0)
        buffers = plan.buffers
        if isinstance(op, m.Launch):
            targets = [r.target_buffer for r in op.relocations if not r.site_buffer]
            return self.index(buffers[targets[0]].device) if targets else 0
        if isinstance(op, m.Copy):
            buffer = op.src_buffer if op.kind == _K.COPY_DEVICE_TO_HOST else op.dst_buffer
            return self.index(buffers[buffer].device)
        if isinstance(op, m.Memset):
            return self.index(buffers[op.buffer].device)
        if isinstance(op, m.DeviceSynchronize):
            return self.index(op.device)
        if isinstance(op, m.EventRecord | m.StreamWaitEvent):
            return self.index(plan.events.device(op.event))
        return None


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
