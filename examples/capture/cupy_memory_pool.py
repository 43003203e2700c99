"""Stream-ordered allocation from a CUDA memory pool (CuPy's MemoryAsyncPool: cudaMallocAsync,
cudaFreeAsync), with memory freed and handed out again in stream order.

python -m replayfmt.capture -o pool.kreplay examples/capture/cupy_memory_pool.py
"""

import cupy as cp

cp.cuda.set_allocator(cp.cuda.MemoryAsyncPool().malloc)
stream = cp.cuda.Stream(non_blocking=True)
with stream:
    x = cp.arange(1 << 20, dtype=cp.float32)
    y = x * 2 + 1
    del x  # freed in stream order; the pool may hand the memory out again at once
    z = cp.sqrt(y)
    w = cp.empty_like(z)
    cp.multiply(z, 3, out=w)
stream.synchronize()
expected = 3 * cp.sqrt(cp.arange(1 << 20, dtype=cp.float32) * 2 + 1)
assert bool(cp.allclose(w, expected))
print("pool ok", float(w.sum()))
