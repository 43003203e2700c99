"""The CUDA side of the snapshot pipeline (CudaSnapshotDevice, DeviceDigester's table, scratch and
stream handling) against a fake driver module: "device" memory is host memory, copies are
memmoves, and the digest kernel is replaced by the host's frame_hash reading the table the real
code uploaded. What this cannot check (the kernel itself, the real driver) tests/gpu does."""

import ctypes
import enum
import types

import numpy as np
import pytest

import replayfmt
from replayfmt.capture.snapshots import CudaSnapshotDevice, Snapshotter
from replayfmt.cuda import driver as driver_module
from replayfmt.cuda.digest import DeviceDigester
from replayfmt.format.payloads import MIN_FRAME_SIZE, frame_hash

FRAME = MIN_FRAME_SIZE


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1


class FakeCu:
    """Just the cuda.bindings.driver calls the snapshot path makes."""

    CUresult = CUresult
    CUevent_flags = types.SimpleNamespace(CU_EVENT_DISABLE_TIMING=2)

    def __init__(self) -> None:
        self.buffers: dict[int, ctypes.Array] = {}
        self.calls: list[str] = []
        self.launches = 0
        self.events_alive = 0
        self.pinned: set[int] = set()

    def _alloc(self, size: int) -> int:
        buffer = (ctypes.c_char * size)()
        self.buffers[ctypes.addressof(buffer)] = buffer
        return ctypes.addressof(buffer)

    def CUstream(self, handle):
        return handle

    def cuGetErrorString(self, err):
        return CUresult.CUDA_SUCCESS, b"fake"

    def cuModuleLoadData(self, image):
        return CUresult.CUDA_SUCCESS, "module"

    def cuModuleGetFunction(self, module, name):
        assert name in (b"replayfmt_frame_digest", b"replayfmt_frame_candidates")
        return CUresult.CUDA_SUCCESS, name.decode()

    def cuModuleUnload(self, module):
        return (CUresult.CUDA_SUCCESS,)

    def cuMemAlloc(self, size):
        self.calls.append("cuMemAlloc")
        return CUresult.CUDA_SUCCESS, self._alloc(size)

    def cuMemFree(self, address):
        self.buffers.pop(address)
        return (CUresult.CUDA_SUCCESS,)

    def cuMemHostAlloc(self, size, flags):
        address = self._alloc(size)
        self.pinned.add(address)
        return CUresult.CUDA_SUCCESS, address

    def cuMemFreeHost(self, address):
        self.pinned.discard(address)
        self.buffers.pop(address)
        return (CUresult.CUDA_SUCCESS,)

    def cuMemcpyHtoDAsync(self, dst, src, size, stream):
        ctypes.memmove(dst, src, size)
        return (CUresult.CUDA_SUCCESS,)

    def cuMemcpyDtoHAsync(self, dst, src, size, stream):
        pinned = any(base <= dst < base + len(self.buffers[base]) for base in self.pinned)
        self.calls.append(f"copy {size}" if pinned else f"digests {size}")
        ctypes.memmove(dst, src, size)
        return (CUresult.CUDA_SUCCESS,)

    def cuLaunchKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        """The digest kernel's contract, computed on the host from the uploaded table."""
        self.launches += 1
        if function == "replayfmt_frame_candidates":
            return self._candidates(gy, params)
        pointers = (ctypes.c_void_p * 4).from_address(params)
        addresses = ctypes.c_uint64.from_address(pointers[0]).value
        lengths = ctypes.c_uint64.from_address(pointers[1]).value
        digests = ctypes.c_uint64.from_address(pointers[2]).value
        count = ctypes.c_uint32.from_address(pointers[3]).value
        assert gx * bx >= 8 * count  # eight threads a frame
        table = np.ctypeslib.as_array((ctypes.c_uint64 * (2 * count)).from_address(addresses))
        assert lengths == addresses + 8 * count
        out = (ctypes.c_uint64 * (2 * count)).from_address(digests)
        for k in range(count):
            digest = frame_hash(ctypes.string_at(int(table[k]), int(table[count + k])))
            out[2 * k], out[2 * k + 1] = int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little")
        return (CUresult.CUDA_SUCCESS,)

    def _candidates(self, frames_in_grid: int, params: int):
        """frame_candidates' contract: hits in no particular order (reversed here), counts past cap."""
        p = (ctypes.c_void_p * 8).from_address(params)
        value = lambda i, t: t.from_address(p[i]).value  # noqa: E731
        addresses, lengths = value(0, ctypes.c_uint64), value(1, ctypes.c_uint64)
        n, low, high = value(2, ctypes.c_uint32), value(3, ctypes.c_uint64), value(4, ctypes.c_uint64)
        cap, counts, hits = value(5, ctypes.c_uint32), value(6, ctypes.c_uint64), value(7, ctypes.c_uint64)
        assert frames_in_grid == n and lengths == addresses + 8 * n
        table = np.ctypeslib.as_array((ctypes.c_uint64 * (2 * n)).from_address(addresses))
        out_counts = np.ctypeslib.as_array((ctypes.c_uint32 * n).from_address(counts))
        assert not out_counts.any()  # zeroed by the caller
        out_hits = np.ctypeslib.as_array((ctypes.c_uint64 * (2 * n * cap)).from_address(hits)).reshape(n, cap, 2)
        for f in range(n):
            words = np.frombuffer(ctypes.string_at(int(table[f]), int(table[n + f])), "<u8")
            found = np.flatnonzero((words >= low) & (words < high))[::-1]
            out_counts[f] = len(found)
            kept = found[:cap]
            out_hits[f, : len(kept), 0], out_hits[f, : len(kept), 1] = 8 * kept, words[kept]
        return (CUresult.CUDA_SUCCESS,)

    def cuStreamSynchronize(self, stream):
        self.calls.append(f"sync {stream}")
        return (CUresult.CUDA_SUCCESS,)

    def cuCtxSynchronize(self):
        self.calls.append("sync all")
        return (CUresult.CUDA_SUCCESS,)

    def cuEventCreate(self, flags):
        self.events_alive += 1
        return CUresult.CUDA_SUCCESS, object()

    def cuEventRecord(self, event, stream):
        return (CUresult.CUDA_SUCCESS,)

    def cuEventSynchronize(self, event):
        return (CUresult.CUDA_SUCCESS,)

    def cuEventDestroy(self, event):
        self.events_alive -= 1
        return (CUresult.CUDA_SUCCESS,)


@pytest.fixture
def cu(monkeypatch):
    fake = FakeCu()
    monkeypatch.setattr(driver_module, "driver", lambda: fake)
    return fake


def test_snapshots_through_the_cuda_adapter(tmp_path, cu):
    data = np.random.default_rng(1).standard_normal((9 * FRAME + 500) // 4, dtype=np.float32).tobytes()
    device = cu._alloc(len(data))
    ctypes.memmove(device, data, len(data))
    snapshots = Snapshotter(CudaSnapshotDevice(cu, "own-stream"), slot_size=2 * FRAME, slots=2)
    with replayfmt.CaptureWriter(tmp_path / "c.kreplay", frame_size=FRAME, threads=3) as w:
        first = snapshots.snapshot(device, len(data), "program-stream", w)
        assert w.add_payload(data) == first  # the adapter's digests are the host's frame hashes
        copies = [c for c in cu.calls if c.startswith("copy")]
        assert snapshots.snapshot(device, len(data), None, w) == first
        assert [c for c in cu.calls if c.startswith("copy")] == copies  # held content: no copy
    snapshots.close()
    snapshots.device.close()
    assert cu.calls[:2] == ["sync program-stream", "cuMemAlloc"]  # the program's stream first
    assert "sync all" in cu.calls
    assert cu.calls.count("cuMemAlloc") == 1  # the digest scratch is kept between snapshots
    assert cu.launches == 2 and cu.events_alive == 0
    assert sum(int(c.split()[1]) for c in copies) == len(data)
    assert len(cu.buffers) == 1  # pinned slots and scratch freed; only the "device" buffer is left
    with replayfmt.open(tmp_path / "c.kreplay") as cap:
        assert cap.read_payload(first) == data


def test_candidates_come_back_per_frame_in_order_and_too_many_say_so(cu):
    rng = np.random.default_rng(2)
    low, high = 0x7F00_0000_0000, 0x7F10_0000_0000
    frames = []
    for hits in (0, 3, 40):
        words = rng.integers(0, 1 << 40, FRAME // 8, dtype=np.uint64)
        words[rng.choice(len(words), hits, replace=False)] = low + 8 * rng.integers(0, 1000, hits, dtype=np.uint64)
        frames.append(words)
    placed = []
    for words in frames:
        address = cu._alloc(words.nbytes)
        ctypes.memmove(address, words.ctypes.data, words.nbytes)
        placed.append((address, words.nbytes))
    digester = DeviceDigester(cu)
    found = digester.candidates(placed, low, high, cap=16)
    assert found[2] is None  # 40 hits, past the cap: scanned on the host
    for words, result in zip(frames[:2], found[:2], strict=True):
        expected = np.flatnonzero((words >= low) & (words < high))
        assert (
            result is not None
            and np.array_equal(result[0], 8 * expected)
            and np.array_equal(result[1], words[expected])
        )
    digester.close()
