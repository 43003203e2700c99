"""Payload frame digests computed on the device.

Staging copies payload frames to the device; checking them against their XXH3-128 on the host
would read every byte a second time from host memory, which is what bounds upload rates. Here a
kernel (``kernels/frame_digest.cu``, shipped as PTX that the driver compiles at load) hashes the
frames where they landed, eight threads a frame, and the host only compares 16-byte digests.
The digests are bit-exact with :func:`replayfmt.format.payloads.frame_hash`.

XXH3 hashes inputs of 240 bytes or less by other code paths: callers hash those on the host.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from importlib import resources
from typing import Any

import numpy as np

from replayfmt.cuda.driver import check

SHORTEST = 241  # bytes: XXH3's long-input path, the one the kernel implements
_THREADS_PER_FRAME = 8
_BLOCK = 128


def _ptx() -> bytes:
    return resources.files("replayfmt.cuda").joinpath("kernels", "frame_digest.ptx").read_bytes() + b"\0"


class DeviceDigester:
    """The frame-digest kernel loaded in the current context. Raises CudaCallError when the
    driver cannot load it (a driver older than the PTX): callers then hash on the host."""

    def __init__(self, cu: Any) -> None:
        self.cu = cu
        self.module = check(cu.cuModuleLoadData(_ptx()), "frame digests: cuModuleLoadData")
        try:
            self.function = check(
                cu.cuModuleGetFunction(self.module, b"replayfmt_frame_digest"), "frame digests: cuModuleGetFunction"
            )
        except BaseException:
            cu.cuModuleUnload(self.module)
            raise

    def close(self) -> None:
        self.cu.cuModuleUnload(self.module)

    def digests(self, frames: Sequence[tuple[int, int]]) -> list[bytes]:
        """The XXH3-128 of each (device address, length) frame, as frame_hash spells it. Every
        frame is longer than 240 bytes and starts 8-byte aligned; the device work that wrote
        them has finished."""
        if not frames:
            return []
        for address, length in frames:
            if length < SHORTEST or address % 8:
                raise ValueError(f"frame at {address:#x} of {length} bytes: hash it on the host")
        cu, n = self.cu, len(frames)
        table = np.array(frames, dtype=np.uint64)
        host = np.concatenate([table[:, 0], table[:, 1]])
        out = np.empty(2 * n, dtype=np.uint64)
        memory = int(check(cu.cuMemAlloc(32 * n), f"frame digests: {32 * n} bytes of device memory"))
        try:
            check(cu.cuMemcpyHtoD(memory, host.ctypes.data, 16 * n), "frame digests: table upload")
            values = (ctypes.c_uint64(memory), ctypes.c_uint64(memory + 8 * n), ctypes.c_uint64(memory + 16 * n),
                      ctypes.c_uint32(n))  # fmt: skip
            params = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
            blocks = -(-n * _THREADS_PER_FRAME // _BLOCK)
            check(cu.cuLaunchKernel(self.function, blocks, 1, 1, _BLOCK, 1, 1, 0, 0, ctypes.addressof(params), 0),
                  "frame digests: launch")  # fmt: skip
            check(cu.cuMemcpyDtoH(out.ctypes.data, memory + 16 * n, 16 * n), "frame digests: results")
        finally:
            cu.cuMemFree(memory)
        return [out[2 * k : 2 * k + 2].tobytes() for k in range(n)]  # low half, then high, little-endian
