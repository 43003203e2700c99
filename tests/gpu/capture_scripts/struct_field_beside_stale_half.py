"""A float field whose other half holds the stale high half of a device pointer, as PyTorch's
dropout backward passes its scale 1/(1-p) beside padding that still held 0x7f04 (a BERT step's
replay computed every gradient wrong, a few captures in ten on the H100): the 8-byte word lands
inside an allocation that no kernel uses. The recorder must leave it as captured, or the replay's
scale is the low half of that allocation's new address. Prints "word at 0x..." and the program's
own check; says it cannot be set up and exits 3 when no such allocation can be made here.

    python -m replayfmt.capture -o OUT.kreplay --scope step struct_field_beside_stale_half.py
"""

import sys

import cupy as cp
import numpy as np
from address_search import GIB4, SIZE, allocation_where

from replayfmt.capture import scope

FLOAT_LOW_HALVES = (0x3580_0000, 0x4A00_0000)  # read as floats of magnitude 2**-20 to 2**21

SOURCE = r"""
struct Scaled { float scale; unsigned int stale; const float* x; };
extern "C" __global__ void scaled(const Scaled p, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = p.x[i] * p.scale;
}
"""


def a_float_address(base: int) -> int | None:
    """An address 4 bytes past an 8-byte boundary inside the allocation at ``base`` whose low
    half reads as a plausible float, if it holds one."""
    window = base - base % GIB4
    start = max(base, window + FLOAT_LOW_HALVES[0]) + 0x1000
    start += (4 - start % 8) % 8
    return start if start < min(base + SIZE, window + FLOAT_LOW_HALVES[1]) - 0x1000 else None


cp.cuda.Device().use()
n = 4096
x = (cp.arange(n + 64, dtype=cp.float32) / 16 + 1)[64:]  # 256 bytes in: an address no float could be
out = cp.zeros(n, dtype=cp.float32)
kernel = cp.RawKernel(SOURCE, "scaled")
word = allocation_where(a_float_address, "holding a float's address")  # used by no kernel
layout = np.dtype(
    {
        "names": ["scale", "stale", "x"],
        "formats": [np.float32, np.uint32, np.uint64],
        "offsets": [0, 4, 8],
        "itemsize": 16,
    }
)
params = np.zeros(1, dtype=layout)
params["scale"] = np.array([word & 0xFFFFFFFF], dtype=np.uint32).view(np.float32)
params["stale"] = word >> 32
params["x"] = x.data.ptr
scale = float(params["scale"][0])
assert params.tobytes()[:8] == word.to_bytes(8, "little")
print(f"word at {word:#x}: the scale {scale:.6g} beside the stale half {word >> 32:#x}")
kernel((n // 256,), (256,), (params, out, np.int32(n)))  # warm-up
cp.cuda.Device().synchronize()
with scope(sys.argv[1] if len(sys.argv) > 1 else "step"):
    kernel((n // 256,), (256,), (params, out, np.int32(n)))
    cp.cuda.Device().synchronize()
assert bool(cp.allclose(out, x * np.float32(scale))), "the program itself went wrong"
print(f"sum {float(out.sum()):.6g}")
