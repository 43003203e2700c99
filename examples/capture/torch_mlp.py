"""A PyTorch eager MLP step (cuBLAS GEMMs, elementwise kernels, softmax).

python -m replayfmt.capture -o mlp.kreplay examples/capture/torch_mlp.py
run-replay --verify mlp.kreplay
"""

import torch

import replayfmt.capture

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256), torch.nn.Softmax(dim=-1)
).cuda()
x = torch.randn(64, 512, device="cuda")
with torch.no_grad(), replayfmt.capture.scope("step"):
    y = model(x)
torch.cuda.synchronize()
print("sum", float(y.sum()))
