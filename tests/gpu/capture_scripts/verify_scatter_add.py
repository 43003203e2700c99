"""A scatter-add (Triton, float32 atomics): run to run the sums' low bits differ.

usage: verify_scatter_add.py [DIR]   DIR: also write DIR/bug.cubin, the same kernel with a planted
off-by-one (each value read one element late), for a substitution that must fail verification.
"""

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

import replayfmt.capture


@triton.jit
def scatter_add_kernel(out_ptr, index_ptr, value_ptr, n, BLOCK: tl.constexpr, BUG: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    index = tl.load(index_ptr + offsets, mask=mask, other=0)
    if BUG:
        value = tl.load(value_ptr + offsets + 1, mask=offsets + 1 < n, other=0.0)
    else:
        value = tl.load(value_ptr + offsets, mask=mask, other=0.0)
    tl.atomic_add(out_ptr + index, value, mask=mask)


def scatter_add(out, index, values, bug=0):
    n = values.numel()
    return scatter_add_kernel[(triton.cdiv(n, 1024),)](out, index, values, n, BLOCK=1024, BUG=bug)


torch.manual_seed(0)
values = torch.randn(1 << 20, device="cuda")
index = torch.randint(0, 512, (1 << 20,), device="cuda", dtype=torch.int32)
sums = torch.zeros(512, device="cuda")
scatter_add(sums, index, values)  # compile outside the scope
with replayfmt.capture.scope("step"):
    sums.zero_()
    scatter_add(sums, index, values)
torch.cuda.synchronize()
if len(sys.argv) > 1:
    compiled = scatter_add(torch.zeros_like(sums), index, values, bug=1)
    Path(sys.argv[1], "bug.cubin").write_bytes(compiled.asm["cubin"])
print("sum", float(sums.sum()))
