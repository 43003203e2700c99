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
        self._scratch_memory = self._scratch_size = 0
        self.module = check(cu.cuModuleLoadData(_ptx()), "frame digests: cuModuleLoadData")
        try:
            self.function = check(
                cu.cuModuleGetFunction(self.module, b"replayfmt_frame_digest"), "frame digests: cuModuleGetFunction"
            )
            self.candidates_function = check(
                cu.cuModuleGetFunction(self.module, b"replayfmt_frame_candidates"),
                "frame candidates: cuModuleGetFunction",
            )
        except BaseException:
            cu.cuModuleUnload(self.module)
            raise

    def close(self) -> None:
        if self._scratch_memory:
            self.cu.cuMemFree(self._scratch_memory)
            self._scratch_memory = self._scratch_size = 0
        self.cu.cuModuleUnload(self.module)

    def digests(self, frames: Sequence[tuple[int, int]], stream: Any = 0) -> list[bytes]:
        """The XXH3-128 of each (device address, length) frame, as frame_hash spells it. Every
        frame is longer than 240 bytes and starts 8-byte aligned; the device work that wrote
        them has finished. Runs on ``stream`` (0: the legacy default stream) and waits for it."""
        if not frames:
            return []
        for address, length in frames:
            if length < SHORTEST or address % 8:
                raise ValueError(f"frame at {address:#x} of {length} bytes: hash it on the host")
        cu, n = self.cu, len(frames)
        table = np.array(frames, dtype=np.uint64)
        host = np.concatenate([table[:, 0], table[:, 1]])
        out = np.empty(2 * n, dtype=np.uint64)
        memory = self._scratch(32 * n)
        check(cu.cuMemcpyHtoDAsync(memory, host.ctypes.data, 16 * n, stream), "frame digests: table upload")
        values = (
            ctypes.c_uint64(memory),
            ctypes.c_uint64(memory + 8 * n),
            ctypes.c_uint64(memory + 16 * n),
            ctypes.c_uint32(n),
        )
        params = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
        blocks = -(-n * _THREADS_PER_FRAME // _BLOCK)
        check(
            cu.cuLaunchKernel(self.function, blocks, 1, 1, _BLOCK, 1, 1, 0, stream, ctypes.addressof(params), 0),
            "frame digests: launch",
        )
        check(cu.cuMemcpyDtoHAsync(out.ctypes.data, memory + 16 * n, 16 * n, stream), "frame digests: results")
        check(cu.cuStreamSynchronize(stream), "frame digests: cuStreamSynchronize")
        return [out[2 * k : 2 * k + 2].tobytes() for k in range(n)]  # low half, then high, little-endian

    def candidates(
        self, frames: Sequence[tuple[int, int]], low: int, high: int, stream: Any = 0, cap: int = 1024
    ) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """Per (device address, length) frame, the byte offsets (int64, ascending) and values
        (uint64) of its 8-byte words in [low, high), found on the device; None for a frame with
        more than ``cap`` of them (scan it on the host). Frames start 8-byte aligned."""
        if not frames:
            return []
        if any(address % 8 for address, _ in frames):
            raise ValueError("frame candidates: frames must start 8-byte aligned")
        cu, n = self.cu, len(frames)
        table = np.array(frames, dtype=np.uint64)
        host = np.concatenate([table[:, 0], table[:, 1], np.zeros(-(-n // 2), dtype=np.uint64)])
        hits_at = 16 * n + 8 * (-(-n // 2))
        memory = self._scratch(hits_at + 16 * n * cap)
        check(cu.cuMemcpyHtoDAsync(memory, host.ctypes.data, hits_at, stream), "frame candidates: table upload")
        values = (
            ctypes.c_uint64(memory),
            ctypes.c_uint64(memory + 8 * n),
            ctypes.c_uint32(n),
            ctypes.c_uint64(low),
            ctypes.c_uint64(high),
            ctypes.c_uint32(cap),
            ctypes.c_uint64(memory + 16 * n),
            ctypes.c_uint64(memory + hits_at),
        )
        params = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
        longest = int(table[:, 1].max())
        blocks = max(1, min(64, -(-longest // (8 * _BLOCK * 4))))
        check(
            cu.cuLaunchKernel(
                self.candidates_function, blocks, n, 1, _BLOCK, 1, 1, 0, stream, ctypes.addressof(params), 0
            ),
            "frame candidates: launch",
        )
        counts = np.empty(n, dtype=np.uint32)
        check(cu.cuMemcpyDtoHAsync(counts.ctypes.data, memory + 16 * n, 4 * n, stream), "frame candidates: counts")
        check(cu.cuStreamSynchronize(stream), "frame candidates: cuStreamSynchronize")
        found = int(np.minimum(counts, cap).max())
        hits = np.empty((n, cap, 2), dtype=np.uint64)
        if found:
            check(
                cu.cuMemcpyDtoHAsync(hits.ctypes.data, memory + hits_at, hits.nbytes, stream), "frame candidates: hits"
            )
            check(cu.cuStreamSynchronize(stream), "frame candidates: cuStreamSynchronize")
        out: list[tuple[np.ndarray, np.ndarray] | None] = []
        for f, count in enumerate(counts.tolist()):
            if count > cap:
                out.append(None)
                continue
            pairs = hits[f, :count]
            order = np.argsort(pairs[:, 0], kind="stable")
            out.append((pairs[order, 0].astype(np.int64), pairs[order, 1].copy()))
        return out

    def _scratch(self, size: int) -> int:
        """Device memory for the frame table and the digests, kept and grown (allocating and
        freeing per call would synchronise the device each time)."""
        if size > self._scratch_size:
            if self._scratch_memory:
                self.cu.cuMemFree(self._scratch_memory)
                self._scratch_memory, self._scratch_size = 0, 0
            grown = max(size, 2 * self._scratch_size, 64 << 10)
            self._scratch_memory = int(
                check(self.cu.cuMemAlloc(grown), f"frame digests: {grown} bytes of device memory")
            )
            self._scratch_size = grown
        return self._scratch_memory
