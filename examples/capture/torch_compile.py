"""A torch.compile'd function (Inductor generates and launches Triton kernels).

python -m replayfmt.capture -o compiled.kreplay examples/capture/torch_compile.py
"""

import torch

import replayfmt.capture


@torch.compile
def fused(a, b):
    return torch.relu(a * 2 + b).sum(dim=-1)


a = torch.randn(4096, 512, device="cuda")
b = torch.randn(4096, 512, device="cuda")
fused(a, b)  # compile outside the scope
with replayfmt.capture.scope("step"):
    out = fused(a, b)
torch.cuda.synchronize()
print("sum", float(out.sum()))
