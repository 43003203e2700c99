"""The snapshot pipeline on real device memory: digests computed on the device equal the host's
frame hashes, the bytes in the file are the device's, and held content is never copied again."""

import numpy as np
import pytest

import replayfmt
from replayfmt.capture.snapshots import CudaSnapshotDevice, Snapshotter
from replayfmt.cuda.driver import check, driver
from replayfmt.format.payloads import frame_hash

pytestmark = pytest.mark.gpu

FRAME = 1 << 20


@pytest.fixture
def cuda(gpu_arch):
    cu = driver()
    device = check(cu.cuDeviceGet(0), "cuDeviceGet")
    check(cu.cuCtxSetCurrent(check(cu.cuDevicePrimaryCtxRetain(device), "retain")), "current")
    stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
    yield cu, stream
    cu.cuStreamDestroy(stream)
    cu.cuDevicePrimaryCtxRelease(device)


def upload(cu, data: bytes, address: int = 0) -> int:
    host = np.frombuffer(data, np.uint8).copy()
    if not address:
        address = int(check(cu.cuMemAlloc(max(1, len(data))), "cuMemAlloc"))
    check(cu.cuMemcpyHtoD(address, host.ctypes.data, len(data)), "cuMemcpyHtoD")
    return address


@pytest.mark.parametrize("size", [FRAME * 9 + 1000, FRAME * 3 + 100, 5000, 100])
def test_snapshot_of_device_memory_matches_the_host(tmp_path, cuda, size):
    cu, stream = cuda
    data = np.random.default_rng(size).standard_normal(-(-size // 4), dtype=np.float32).tobytes()[:size]
    address = upload(cu, data)
    snapshots = Snapshotter(CudaSnapshotDevice(cu, stream), slot_size=2 * FRAME, slots=3)
    try:
        with replayfmt.CaptureWriter(tmp_path / "g.kreplay", frame_size=FRAME, threads=4) as w:
            pid = snapshots.snapshot(address, size, None, w)
            assert w.add_payload(data) == pid  # device digests == host frame hashes
            copied = snapshots.stats.copied_bytes
            assert snapshots.snapshot(address, size, None, w) == pid
            # frames under 241 bytes are hashed on the host, so they cross the bus every time
            frames = [min(FRAME, size - i) for i in range(0, size, FRAME)]
            host_hashed = sum(n for n in frames if n < 241)
            assert snapshots.stats.copied_bytes == copied + host_hashed
        with replayfmt.open(tmp_path / "g.kreplay") as cap:
            info = cap.payload(pid)
            assert info.frames == tuple(frame_hash(data[i : i + FRAME]) for i in range(0, size, FRAME))
            assert cap.read_payload(pid) == data
    finally:
        snapshots.close()
        snapshots.device.close()
        cu.cuMemFree(address)


def test_only_changed_frames_cross_and_the_file_has_the_new_bytes(tmp_path, cuda):
    cu, stream = cuda
    data = bytearray(np.random.default_rng(3).integers(0, 256, 8 * FRAME, dtype=np.uint8).tobytes())
    address = upload(cu, bytes(data))
    snapshots = Snapshotter(CudaSnapshotDevice(cu, stream), slot_size=4 * FRAME, slots=2)
    try:
        with replayfmt.CaptureWriter(tmp_path / "g.kreplay", frame_size=FRAME) as w:
            first = snapshots.snapshot(address, len(data), stream, w)
            data[5 * FRAME + 17] ^= 0x5A
            upload(cu, bytes(data[5 * FRAME + 17 : 5 * FRAME + 18]), address + 5 * FRAME + 17)
            before = snapshots.stats.copied_bytes
            second = snapshots.snapshot(address, len(data), stream, w)
            assert snapshots.stats.copied_bytes - before == FRAME
        with replayfmt.open(tmp_path / "g.kreplay") as cap:
            assert cap.read_payload(second) == bytes(data)
            assert cap.read_payload(first) != bytes(data)
    finally:
        snapshots.close()
        snapshots.device.close()
        cu.cuMemFree(address)
