"""PyTorch: scaled_dot_product_attention (flash or memory-efficient kernels) in a bf16 autocast
region with a causal mask, forward and backward. Region: scope "step"."""

import torch
import torch.nn.functional as F

from replayfmt.capture import scope

torch.manual_seed(0)
q, k, v = (torch.randn(4, 8, 256, 64, device="cuda", requires_grad=True) for _ in range(3))


def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.float().pow(2).mean().backward()
    return out


step()
torch.cuda.synchronize()
with scope("step"):
    out = step()
    torch.cuda.synchronize()
print(f"mean {float(out.float().mean()):.5f} grad {float(q.grad.abs().mean()):.5f}")
