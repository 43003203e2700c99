"""Launches packed once, at setup: each launch's parameter block relocated to the replay's
buffers (pointer words, pointers stored in device memory, tensor maps), its shape (with any
``--launch`` override) and, for clusters, cooperative launches and launches that allow
programmatic dependent launch (PDL), its launch configuration.

A launch flagged ``LAUNCH_FLAG_PROGRAMMATIC`` is issued with CUDA's programmatic stream
serialization attribute, as the program issued it: it may begin before the previous kernel on its
stream ends, and waits for that kernel's results in ``griddepcontrol.wait``. Devices before sm_90
have no PDL: there such a launch is issued without the attribute (the attribute only allows an
overlap, so the kernels compute the same results, one after the other), and
:func:`programmatic_note` says so in run-replay's device line."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from replayfmt.cuda.driver import check
from replayfmt.errors import AbiMismatchError, DeviceError
from replayfmt.format import model as m
from replayfmt.replay.buffers import PinnedSlabs
from replayfmt.replay.devices import Devices
from replayfmt.replay.modules import Modules
from replayfmt.replay.plan import Plan, launch_shape

_TENSOR_MAP_BYTES = 128
PROGRAMMATIC_ARCH = 90  # the first compute capability with programmatic dependent launch (sm_90)


@dataclass
class PreparedLaunch:
    """A launch ready to go: everything packed once, at setup."""

    name: str
    args: tuple[Any, ...]  # for cuLaunchKernel, or cuLaunchKernelEx when extended
    extended: bool
    keepalive: list[Any]  # the packed parameter memory the arguments point into
    buffer_sites: list[tuple[int, int]]  # (device address of a pointer site, pinned address of its value)


def prepare_launch(
    devices: Devices,
    plan: Plan,
    modules: Modules,
    addresses: dict[int, int],
    op: m.Launch,
    stream: Any,
    gpu: int,
    host: PinnedSlabs,
) -> PreparedLaunch:
    """Pack launch ``op`` for device ``gpu`` and ``stream``: relocations applied to the replay's
    buffer ``addresses``, peer access enabled where it points into another device's buffers;
    the values of pointers stored in device memory held in pinned memory from ``host``."""
    cu = devices.cu
    exe = plan.images[op.executable].executable
    fn = exe.functions[op.function]
    handle = modules.on_device[gpu][(op.executable, op.function)]
    for r in op.relocations:
        owner = devices.index(plan.buffers[r.target_buffer].device)
        if owner != gpu:
            devices.enable_peer_access(gpu, owner, op)
    layout = modules.layouts[(op.executable, op.function)]
    block = bytearray(op.parameters)
    sites = []
    for r in op.relocations:
        target = addresses[r.target_buffer] + r.target_offset
        if r.site_buffer:
            value = host.take(8, f"operation {op.index}")
            ctypes.c_uint64.from_address(value).value = target
            sites.append((addresses[r.site_buffer] + r.site_offset, value))
        elif r.kind == m.RelocationKind.TENSOR_MAP:
            span = slice(r.site_offset, r.site_offset + _TENSOR_MAP_BYTES)
            block[span] = retarget_tensor_map(cu, bytes(block[span]), target, op)
        else:
            block[r.site_offset : r.site_offset + 8] = target.to_bytes(8, "little")
    end = max((o + s for o, s in layout), default=0)
    if len(block) < end:
        raise AbiMismatchError(
            f"operation {op.index} ({fn.name}): {len(block)} parameter bytes captured, the loaded function takes {end}"
        )
    # ctypes arrays, not numpy: packing is per launch, and a capture may hold 250k of them
    storage = ctypes.create_string_buffer(bytes(block), max(len(block), 1))
    base = ctypes.addressof(storage)
    pointers = (ctypes.c_uint64 * max(len(layout), 1))(*[base + o for o, _ in layout])
    params = ctypes.addressof(pointers) if layout else 0
    shape = launch_shape(op, plan.overrides.get(op.index))
    keep: list[Any] = [storage, pointers]
    programmatic = bool(op.flags & m.LAUNCH_FLAG_PROGRAMMATIC) and devices.gpus[gpu].arch >= PROGRAMMATIC_ARCH
    if any(op.cluster) or op.flags & m.LAUNCH_FLAG_COOPERATIVE or programmatic:
        config = _launch_config(cu, op, shape.grid, shape.block, shape.shared_memory, stream, programmatic)
        keep.append(config)
        return PreparedLaunch(fn.name, (config, handle, params, 0), True, keep, sites)
    args = (handle, *shape.grid, *shape.block, shape.shared_memory, stream, params, 0)
    return PreparedLaunch(fn.name, args, False, keep, sites)


def launch_config_copy(
    cu: Any, config: Any, *, shape: tuple[m.Dims, m.Dims, int] | None = None, stream: Any = None
) -> Any:
    """A new CUlaunchConfig equal to ``config`` but for ``shape`` (grid, block, shared memory) or
    ``stream``: prepared launches share one config among the launches that agree in all but their
    index, so a change to one launch is made on a copy, never on the shared config."""
    copy = cu.CUlaunchConfig()
    grid, block, smem = shape or (
        (config.gridDimX, config.gridDimY, config.gridDimZ),
        (config.blockDimX, config.blockDimY, config.blockDimZ),
        config.sharedMemBytes,
    )
    copy.gridDimX, copy.gridDimY, copy.gridDimZ = grid
    copy.blockDimX, copy.blockDimY, copy.blockDimZ = block
    copy.sharedMemBytes = smem
    copy.hStream = config.hStream if stream is None else stream
    copy.attrs = config.attrs
    copy.numAttrs = config.numAttrs
    return copy


def programmatic_note(plan: Plan, arch: int) -> str:
    """What run-replay says of a device of compute capability ``arch`` (90 for sm_90) that runs
    the plan's launches flagged programmatic without the attribute; "" when none does."""
    if not plan.programmatic or arch >= PROGRAMMATIC_ARCH:
        return ""
    return (
        "no programmatic dependent launch before sm_90: the launches and graph edges that allow it "
        "run one kernel after the other, with the same results"
    )


def _launch_config(
    cu: Any, op: m.Launch, grid: m.Dims, block: m.Dims, smem: int, stream: Any, programmatic: bool
) -> Any:
    """A CUlaunchConfig carrying the launch's cluster dimensions, its cooperative flag and, where
    ``programmatic``, programmatic stream serialization (PDL)."""
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = smem
    config.hStream = stream
    attrs = []
    if any(op.cluster):
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        x, y, z = (max(1, c) for c in op.cluster)
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = x, y, z
        attrs.append(attr)
    if op.flags & m.LAUNCH_FLAG_COOPERATIVE:
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        attr.value.cooperative = 1
        attrs.append(attr)
    if programmatic:
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        attrs.append(attr)
    config.attrs = attrs
    config.numAttrs = len(attrs)
    return config


def retarget_tensor_map(cu: Any, raw: bytes, address: int, op: m.Launch) -> bytes:
    """A captured 128-byte tensor map pointing at ``address`` instead (the driver rewrites it)."""
    tensor_map = cu.CUtensorMap()
    try:
        tensor_map.opaque = list(np.frombuffer(raw, "<u8").tolist())
    except (AttributeError, TypeError) as exc:
        raise DeviceError(f"operation {op.index}: cannot rewrite a tensor map with this cuda-python ({exc})") from None
    check(cu.cuTensorMapReplaceAddress(tensor_map, address), f"operation {op.index}: cuTensorMapReplaceAddress")
    return np.array(tensor_map.opaque, dtype="<u8").tobytes()
