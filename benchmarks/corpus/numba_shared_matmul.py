"""Numba-CUDA: the shared-memory tiled matrix product of Numba's documentation (cuda.shared.array,
cuda.syncthreads). Region: scope "step"."""

import numpy as np
from numba import cuda, float32

from replayfmt.capture import scope

TPB = 16


@cuda.jit
def fast_matmul(A, B, C):
    sA = cuda.shared.array(shape=(TPB, TPB), dtype=float32)
    sB = cuda.shared.array(shape=(TPB, TPB), dtype=float32)
    x, y = cuda.grid(2)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    bpg = cuda.gridDim.x
    tmp = float32(0.0)
    for i in range(bpg):
        sA[ty, tx] = 0
        sB[ty, tx] = 0
        if y < A.shape[0] and (tx + i * TPB) < A.shape[1]:
            sA[ty, tx] = A[y, tx + i * TPB]
        if x < B.shape[1] and (ty + i * TPB) < B.shape[0]:
            sB[ty, tx] = B[ty + i * TPB, x]
        cuda.syncthreads()
        for j in range(TPB):
            tmp += sA[ty, j] * sB[j, tx]
        cuda.syncthreads()
    if y < C.shape[0] and x < C.shape[1]:
        C[y, x] = tmp


n = 512
rng = np.random.default_rng(1)
a = rng.standard_normal((n, n)).astype(np.float32)
b = rng.standard_normal((n, n)).astype(np.float32)
A, B, C = cuda.to_device(a), cuda.to_device(b), cuda.device_array((n, n), dtype=np.float32)
grid = (n // TPB, n // TPB)
fast_matmul[grid, (TPB, TPB)](A, B, C)
cuda.synchronize()
with scope("step"):
    fast_matmul[grid, (TPB, TPB)](A, B, C)
    cuda.synchronize()
assert np.allclose(C.copy_to_host(), a @ b, atol=1e-2)
print("matmul ok")
