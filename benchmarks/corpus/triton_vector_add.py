"""Triton's tutorial 01 (vector addition), as the tutorial writes it. Region: scope "step"."""

import torch
import triton
import triton.language as tl

from replayfmt.capture import scope


@triton.jit
def add_kernel(x_ptr, y_ptr, output_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    block_start = pid * BLOCK_SIZE
    offsets = block_start + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(output_ptr + offsets, x + y, mask=mask)


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    output = torch.empty_like(x)
    n_elements = output.numel()
    grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)  # noqa: E731
    add_kernel[grid](x, y, output, n_elements, BLOCK_SIZE=1024)
    return output


torch.manual_seed(0)
size = 98432 * 16
x = torch.rand(size, device="cuda")
y = torch.rand(size, device="cuda")
add(x, y)
torch.cuda.synchronize()
with scope("step"):
    output = add(x, y)
    torch.cuda.synchronize()
assert torch.allclose(output, x + y)
print(f"max difference {torch.max(torch.abs(output - (x + y))).item()}")
