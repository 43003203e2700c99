"""Kernels that read host memory through its address: mapped pinned memory (cuMemHostAlloc) and
managed memory (cuMemAllocManaged), with the host changing the mapped array between launches;
with --registered, also registered memory (cuMemHostRegister, numba's cuda.mapped).

python -m replayfmt.capture -o hostmem.kreplay examples/capture/numba_host_memory.py [--registered]
"""

import contextlib
import sys

import numpy as np

if not hasattr(np, "row_stack"):  # some numba-cuda releases still call it; NumPy 2.x removed it
    np.row_stack = np.vstack

from numba import cuda


@cuda.jit
def combine(mapped, registered, managed, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] += 2 * mapped[i] + registered[i] + managed[i]


n = 1 << 14
mapped = cuda.mapped_array(n, dtype=np.float32)  # cuMemHostAlloc(DEVICEMAP)
mapped[:] = 1
managed = cuda.managed_array(n, dtype=np.float32)  # cuMemAllocManaged
managed[:] = np.arange(n, dtype=np.float32)
plain = np.full(n, 10, dtype=np.float32)
out = cuda.to_device(np.zeros(n, dtype=np.float32))
registering = "--registered" in sys.argv  # cuMemHostRegister(DEVICEMAP), or an ordinary device copy
pinning = cuda.mapped(plain) if registering else contextlib.nullcontext(cuda.to_device(plain))
with pinning as registered:
    combine[(n + 255) // 256, 256](mapped, registered, managed, out)
    cuda.synchronize()
    mapped[:] = 5  # the host changes it: the next launch must read 5
    combine[(n + 255) // 256, 256](mapped, registered, managed, out)
    cuda.synchronize()
result = out.copy_to_host()
assert np.allclose(result, 2 * 1 + 10 + np.arange(n) + 2 * 5 + 10 + np.arange(n))
print("host memory ok", float(result.sum()))
