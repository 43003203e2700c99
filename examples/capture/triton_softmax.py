"""A row softmax in Triton (as in Triton's fused-softmax tutorial), launched from Python.
examples/triton_softmax.kreplay was recorded from it on an H100 with

python -m replayfmt.capture -o examples/triton_softmax.kreplay --mode kernel --kernels softmax_kernel \
    examples/capture/triton_softmax.py

(add --overwrite to record it again over the file in place).
"""

import torch
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(out_ptr, in_ptr, row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * row_stride + cols, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(out_ptr + row * row_stride + cols, e / tl.sum(e, axis=0), mask=mask)


torch.manual_seed(0)
x = torch.randn(128, 781, device="cuda")  # an odd width: masked loads, as in the tutorial
out = torch.empty_like(x)
softmax_kernel[(x.shape[0],)](out, x, x.stride(0), x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
torch.cuda.synchronize()
assert torch.allclose(out, torch.softmax(x, dim=1), atol=1e-6)
