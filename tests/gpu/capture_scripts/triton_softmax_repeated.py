"""The quick start's Triton row softmax (examples/capture/triton_softmax.py), launched several
times on the same input: a kernel-mode capture with --skip-first leaves out the cold first launches,
so the original's time of a captured instance is a warm kernel's, as the replay's is."""

import sys

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


launches = int(sys.argv[1]) if len(sys.argv) > 1 else 8
torch.manual_seed(0)
x = torch.randn(128, 781, device="cuda")
out = torch.empty_like(x)
for _ in range(launches):
    softmax_kernel[(x.shape[0],)](out, x, x.stride(0), x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
torch.cuda.synchronize()
assert torch.allclose(out, torch.softmax(x, dim=1), atol=1e-6)
