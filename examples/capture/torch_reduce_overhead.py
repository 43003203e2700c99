"""torch.compile(mode="reduce-overhead"): Inductor's kernels run as CUDA graphs (stream capture,
then cuGraphLaunch on every step), as serving stacks and training loops do.

python -m replayfmt.capture -o graphs.kreplay examples/capture/torch_reduce_overhead.py
"""

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256), torch.nn.LayerNorm(256)
).cuda()
compiled = torch.compile(model, mode="reduce-overhead")
x = torch.randn(64, 256, device="cuda")
with torch.no_grad():
    for step in range(5):  # warm-up, graph recording, then graph replays
        y = compiled(x + step)
        torch.cuda.synchronize()
print("sum", float(y.sum()))
