"""A CUDA kernel that follows a device array of pointers (CuPy RawKernel): each output row is
gathered from the row its pointer table names, the table built in device memory before the step,
as batched GEMMs, MoE routing and ragged batches keep theirs. Region: scope "step"."""

import cupy as cp
import numpy as np

from replayfmt.capture import scope

gather = cp.RawKernel(
    r"""
extern "C" __global__ void gather_rows(const float* const* rows, const float* scale, float* out, int width) {
    const float* row = rows[blockIdx.x];
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        out[blockIdx.x * width + i] = row[i] * scale[blockIdx.x];
    }
}
""",
    "gather_rows",
)
width, count = 1024, 64
rng = cp.random.default_rng(2)
sources = [rng.standard_normal(width, dtype=cp.float32) for _ in range(16)]  # separate allocations
order = np.random.default_rng(3).integers(0, len(sources), count)
table = cp.asarray(np.array([sources[i].data.ptr for i in order], dtype=np.uint64))
scale = cp.arange(count, dtype=cp.float32) / count
out = cp.empty((count, width), dtype=cp.float32)
gather((count,), (256,), (table, scale, out, cp.int32(width)))
cp.cuda.Device().synchronize()
with scope("step"):
    gather((count,), (256,), (table, scale, out, cp.int32(width)))
    cp.cuda.Device().synchronize()
expected = cp.stack([sources[i] for i in order]) * scale[:, None]
assert cp.allclose(out, expected)
print(f"gathered {count} rows")
