"""Float sums accumulated with atomics (index_add_ on CUDA): run to run, the low bits differ."""

import torch

torch.manual_seed(0)
values = torch.randn(1 << 22, device="cuda")
index = torch.randint(0, 64, (1 << 22,), device="cuda")
sums = torch.zeros(64, device="cuda").index_add_(0, index, values)
torch.cuda.synchronize()
print("sum", float(sums.sum()))
