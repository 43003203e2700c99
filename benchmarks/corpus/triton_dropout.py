"""Triton's tutorial 04 (low-memory dropout): a seeded dropout whose mask is regenerated from a
seed and the element offsets (tl.rand). Region: scope "step"."""

import torch
import triton
import triton.language as tl

from replayfmt.capture import scope


@triton.jit
def _seeded_dropout(x_ptr, output_ptr, n_elements, p, seed, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    block_start = pid * BLOCK_SIZE
    offsets = block_start + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    random = tl.rand(seed, offsets)
    x_keep = random > p
    output = tl.where(x_keep, x / (1 - p), 0.0)
    tl.store(output_ptr + offsets, output, mask=mask)


def seeded_dropout(x, p, seed):
    output = torch.empty_like(x)
    n_elements = x.numel()
    grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)  # noqa: E731
    _seeded_dropout[grid](x, output, n_elements, p, seed, BLOCK_SIZE=1024)
    return output


x = torch.randn(size=(1 << 20,), device="cuda")
seeded_dropout(x, p=0.5, seed=123)
torch.cuda.synchronize()
with scope("step"):
    a = seeded_dropout(x, p=0.5, seed=123)
    b = seeded_dropout(x, p=0.5, seed=512)
    torch.cuda.synchronize()
assert torch.equal(a, seeded_dropout(x, p=0.5, seed=123)) and not torch.equal(a, b)
print(f"kept {float((a != 0).float().mean()):.3f}")
