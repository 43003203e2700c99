"""A CUDA kernel that follows a device array of pointers, as grouped and batched GEMMs do: the
table of pointers is uploaded with a host-to-device copy and the kernel sums through it. Those
pointers live in device memory, so replay must write the replay's addresses into the table
(format 1.3 data relocations); the arrays they point to appear in no kernel parameter.

    python -m replayfmt.capture -o table.kreplay examples/capture/cupy_pointer_table.py
    python -m replayfmt.capture -o table.kreplay --scope sum examples/capture/cupy_pointer_table.py

With ``--scope sum`` the table and the arrays exist before the scope: their contents are starting
state, found through the table.
"""

import cupy as cp

from replayfmt.capture import scope

gather_sum = cp.RawKernel(
    r"""
extern "C" __global__ void gather_sum(const float* const* rows, int count, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float total = 0.0f;
    for (int k = 0; k < count; ++k) total += rows[k][i] * (float)(k + 1);
    out[i] = total;
}""",
    "gather_sum",
)

n, count, skip = 1 << 14, 6, 16
arrays = [(cp.arange(n + count * skip, dtype=cp.float32) % (97 + k)) / (k + 1) for k in range(count)]
# each entry points skip * k elements into its array: pointers inside allocations, not only starts
table = cp.array([a.data.ptr + 4 * skip * k for k, a in enumerate(arrays)], dtype=cp.uint64)
out = cp.empty(n, dtype=cp.float32)
with scope("sum"):
    gather_sum(((n + 255) // 256,), (256,), (table, cp.int32(count), out, cp.int32(n)))
    cp.cuda.runtime.deviceSynchronize()
expected = sum(a[skip * k : skip * k + n] * (k + 1) for k, a in enumerate(arrays))
assert bool(cp.allclose(out, expected, rtol=1e-6, atol=1e-5)), "the kernel did not sum through its table"
print(f"summed {count} arrays through a table of {count} device pointers")
