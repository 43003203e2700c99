"""A float field whose other half holds the stale high half of a device pointer, as PyTorch's
dropout backward passes its scale 1/(1-p) beside padding that still held 0x7f04 (a BERT step's
replay computed every gradient wrong, a few captures in ten on the H100): the 8-byte word lands
inside an allocation that no kernel uses. The recorder must leave it as captured, or the replay's
scale is the low half of that allocation's new address. Prints "word at 0x..." and the program's
own check; exits 3 when no such allocation could be made here (the device's memory is taken).

    python -m replayfmt.capture -o OUT.kreplay --scope step struct_field_beside_stale_half.py
"""

import sys

import cupy as cp
import numpy as np
from cuda.bindings import driver as cu

from replayfmt.capture import scope

SIZE = 66 << 20  # not a divisor of 4 GiB: allocations side by side drift through the window
GIB4 = 1 << 32
FLOAT_LOW_HALVES = (0x3580_0000, 0x4A00_0000)  # read as floats of magnitude 2**-20 to 2**21

SOURCE = r"""
struct Scaled { float scale; unsigned int stale; const float* x; };
extern "C" __global__ void scaled(const Scaled p, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = p.x[i] * p.scale;
}
"""


def unused_allocation_holding_a_float_address() -> int:
    """An address 4 bytes past an 8-byte boundary inside an allocation of SIZE (made here and
    used by no kernel) whose low half reads as a plausible float."""
    made: list[int] = []
    found = 0
    for _ in range(2 * GIB4 // SIZE + 64):
        err, address = cu.cuMemAlloc(SIZE)
        if err != cu.CUresult.CUDA_SUCCESS:
            break
        base = int(address)
        window = base - base % GIB4
        start = max(base, window + FLOAT_LOW_HALVES[0]) + 0x1000
        start += (4 - start % 8) % 8
        if start < min(base + SIZE, window + FLOAT_LOW_HALVES[1]) - 0x1000:
            found = start
            break
        made.append(base)
    for base in made:
        cu.cuMemFree(base)
    if not found:
        print("no allocation holding a float's address could be made here")
        raise SystemExit(3)
    return found


cp.cuda.Device().use()
n = 4096
x = (cp.arange(n + 64, dtype=cp.float32) / 16 + 1)[64:]  # 256 bytes in: an address no float could be
out = cp.zeros(n, dtype=cp.float32)
kernel = cp.RawKernel(SOURCE, "scaled")
word = unused_allocation_holding_a_float_address()
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
