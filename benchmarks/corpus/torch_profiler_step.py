"""torch.profiler around a training step, CPU and CUDA activities, as programs profile themselves
(Kineto is a CUPTI client of its own): an MLP step with Adam. Region: scope "step"."""

import torch
from torch.profiler import ProfilerActivity, profile

from replayfmt.capture import scope

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512)).cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(256, 512, device="cuda")


def step():
    optimizer.zero_grad(set_to_none=True)
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    return loss


step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof, scope("step"):
    loss = step()
    torch.cuda.synchronize()
print(prof.key_averages().table(row_limit=3))
print(f"loss {float(loss):.5f}")
