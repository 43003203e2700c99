"""A Numba CUDA kernel.

python -m replayfmt.capture -o numba.kreplay examples/capture/numba_kernel.py
"""

import numpy as np

if not hasattr(np, "row_stack"):  # some numba-cuda releases still call it; NumPy 2.x removed it
    np.row_stack = np.vstack

from numba import cuda


@cuda.jit
def axpy(a, x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = a * x[i] + y[i]


n = 1 << 16
x = cuda.to_device(np.arange(n, dtype=np.float32))
y = cuda.to_device(np.ones(n, dtype=np.float32))
axpy[(n + 255) // 256, 256](np.float32(3.0), x, y)
cuda.synchronize()
assert np.allclose(y.copy_to_host(), 3 * np.arange(n) + 1)
