"""CuPy: an ElementwiseKernel (a fused squared difference) and a ReductionKernel (an L2 norm),
with CuPy's memory pool. Region: scope "step"."""

import cupy as cp

from replayfmt.capture import scope

squared_diff = cp.ElementwiseKernel("float32 x, float32 y", "float32 z", "z = (x - y) * (x - y)", "squared_diff")
l2norm = cp.ReductionKernel("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0", "l2norm")
rng = cp.random.default_rng(0)
x = rng.standard_normal((1024, 1024), dtype=cp.float32)
y = rng.standard_normal((1024, 1024), dtype=cp.float32)
l2norm(squared_diff(x, y), axis=1)
cp.cuda.Device().synchronize()
with scope("step"):
    norms = l2norm(squared_diff(x, y), axis=1)
    cp.cuda.Device().synchronize()
print(f"mean norm {float(norms.mean()):.4f}")
