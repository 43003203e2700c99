"""The frame-digest kernel on a real GPU: bit-exact with xxhash's XXH3-128 over every length
class of XXH3's long path, many frames in one launch."""

import numpy as np
import pytest

from replayfmt.cuda.digest import SHORTEST, DeviceDigester
from replayfmt.cuda.driver import check, driver
from replayfmt.format.payloads import frame_hash

pytestmark = pytest.mark.gpu

LENGTHS = [
    SHORTEST,
    242,
    255,
    256,
    511,
    1023,
    1024,
    1025,
    1087,
    1088,
    1089,
    2047,
    2048,
    2049,
    4097,
    65535,
    65536,
    (4 << 20) + 13,
    4 << 20,
]


@pytest.fixture
def context(gpu_arch):
    cu = driver()
    device = check(cu.cuDeviceGet(0), "cuDeviceGet")
    check(cu.cuCtxSetCurrent(check(cu.cuDevicePrimaryCtxRetain(device), "retain")), "current")
    yield cu
    cu.cuDevicePrimaryCtxRelease(device)


def test_digests_match_xxh3_128_for_every_length_class(context):
    cu = context
    rng = np.random.default_rng(1)
    frames = [rng.integers(0, 256, n, dtype=np.uint8) for n in LENGTHS + list(rng.integers(SHORTEST, 9000, 200))]
    offsets = np.cumsum([0] + [-(-f.nbytes // 8) * 8 for f in frames])  # each frame 8-byte aligned
    host = np.zeros(int(offsets[-1]), dtype=np.uint8)
    for frame, offset in zip(frames, offsets, strict=False):
        host[offset : offset + frame.nbytes] = frame
    base = int(check(cu.cuMemAlloc(host.nbytes), "alloc"))
    try:
        check(cu.cuMemcpyHtoD(base, host.ctypes.data, host.nbytes), "upload")
        digester = DeviceDigester(cu)
        try:
            got = digester.digests([(base + int(o), f.nbytes) for f, o in zip(frames, offsets, strict=False)])
        finally:
            digester.close()
    finally:
        cu.cuMemFree(base)
    expected = [frame_hash(f.tobytes()) for f in frames]
    wrong = [(f.nbytes, g.hex(), e.hex()) for f, g, e in zip(frames, got, expected, strict=True) if g != e]
    assert not wrong, wrong[:5]


def test_short_or_unaligned_frames_are_refused(context):
    digester = DeviceDigester(context)
    try:
        with pytest.raises(ValueError, match="hash it on the host"):
            digester.digests([(1 << 20, SHORTEST - 1)])
        with pytest.raises(ValueError, match="hash it on the host"):
            digester.digests([((1 << 20) + 4, 4096)])
    finally:
        digester.close()
