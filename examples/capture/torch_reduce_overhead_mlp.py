"""A small model compiled with torch.compile(mode="reduce-overhead"): Inductor runs each step as a
CUDA graph (cuGraphLaunch), recorded and replayed as graphs. Random weights.

    python -m replayfmt.capture --scope step -o graphs.kreplay examples/capture/torch_reduce_overhead_mlp.py
"""

import torch

import replayfmt.capture

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64)
).cuda()
compiled = torch.compile(model, mode="reduce-overhead")
x = torch.randn(32, 256, device="cuda")
with torch.no_grad():
    for _ in range(3):  # warm-up, then the graph is recorded
        compiled(x)
    torch.cuda.synchronize()
    with replayfmt.capture.scope("step"):
        for _ in range(3):
            out = compiled(x)
        result = out.clone()
        torch.cuda.synchronize()
    expected = model(x)
torch.testing.assert_close(result, expected, rtol=1e-3, atol=1e-3)
print("reduce-overhead ok", float(result.abs().sum()))
