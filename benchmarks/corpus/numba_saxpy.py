"""Numba-CUDA: a saxpy kernel written with @cuda.jit on device arrays. Region: scope "step"."""

import numpy as np
from numba import cuda

from replayfmt.capture import scope


@cuda.jit
def saxpy(a, x, y, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = a * x[i] + y[i]


n = 1 << 20
rng = np.random.default_rng(0)
x = cuda.to_device(rng.standard_normal(n).astype(np.float32))
y = cuda.to_device(rng.standard_normal(n).astype(np.float32))
out = cuda.device_array(n, dtype=np.float32)
blocks = (n + 255) // 256
saxpy[blocks, 256](np.float32(2.0), x, y, out)
cuda.synchronize()
with scope("step"):
    saxpy[blocks, 256](np.float32(2.0), x, y, out)
    cuda.synchronize()
assert np.allclose(out.copy_to_host(), 2 * x.copy_to_host() + y.copy_to_host())
print("saxpy ok")
