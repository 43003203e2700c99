"""A CuPy RawKernel (NVRTC-compiled, loaded with cuModuleLoadData).

python -m replayfmt.capture -o cupy.kreplay examples/capture/cupy_rawkernel.py
"""

import cupy as cp

square = cp.RawKernel(
    r"""
extern "C" __global__ void square(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * x[i];
}""",
    "square",
)
n = 1 << 16
x = cp.arange(n, dtype=cp.float32) / 7
y = cp.empty_like(x)
square(((n + 255) // 256,), (256,), (x, y, cp.int32(n)))
cp.cuda.runtime.deviceSynchronize()
assert bool(cp.allclose(y, x * x))
