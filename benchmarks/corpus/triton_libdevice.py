"""Triton's tutorial 07 (extern functions): libdevice's asin called from a Triton kernel.
Region: scope "step"."""

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from replayfmt.capture import scope


@triton.jit
def asin_kernel(x_ptr, y_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, libdevice.asin(x), mask=mask)


torch.manual_seed(0)
x = torch.rand(98432, device="cuda")
y = torch.empty_like(x)
grid = lambda meta: (triton.cdiv(x.numel(), meta["BLOCK_SIZE"]),)  # noqa: E731
asin_kernel[grid](x, y, x.numel(), BLOCK_SIZE=1024)
torch.cuda.synchronize()
with scope("step"):
    asin_kernel[grid](x, y, x.numel(), BLOCK_SIZE=1024)
    torch.cuda.synchronize()
assert torch.allclose(y, torch.asin(x))
print("asin matches torch")
