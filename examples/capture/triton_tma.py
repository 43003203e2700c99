"""A Triton kernel with host-side tensor descriptors (TMA, Hopper): each descriptor is a
128-byte CUtensorMap parameter holding a device address, recorded as a tensor-map relocation.

    python -m replayfmt.capture -o tma.kreplay examples/capture/triton_tma.py
"""

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def scale_tma(in_desc, out_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0) * BLOCK_M
    tile = in_desc.load([row, 0])
    out_desc.store([row, 0], tile * 2.0)


x = torch.randn(2048, 64, device="cuda")
y = torch.empty_like(x)
in_desc = TensorDescriptor.from_tensor(x, [64, 64])
out_desc = TensorDescriptor.from_tensor(y, [64, 64])
scale_tma[(2048 // 64,)](in_desc, out_desc, BLOCK_M=64, BLOCK_N=64)
torch.cuda.synchronize()
assert torch.equal(y, x * 2)
