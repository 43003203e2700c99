"""A cuBLAS GEMM through PyTorch, for fixed-address capture and replay."""

import torch

torch.manual_seed(0)
a = torch.randn(512, 256, device="cuda")
b = torch.randn(256, 384, device="cuda")
c = a @ b
torch.cuda.synchronize()
print("sum", float(c.sum()))
