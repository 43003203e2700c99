"""A two-stage model split over two GPUs in one process, pipelined by hand: stage one on cuda:0, its
activations copied to cuda:1 with .to(), stage two and the loss on cuda:1, backward through both
devices and an SGD step. Needs 2 GPUs. Region: scope "step"."""

import torch
import torch.nn.functional as F

from replayfmt.capture import scope

torch.manual_seed(0)
first = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512)).to("cuda:0")
second = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).to("cuda:1")
optimizer = torch.optim.SGD([*first.parameters(), *second.parameters()], lr=0.01)
x = torch.randn(256, 512, device="cuda:0")
y = torch.randint(0, 10, (256,), device="cuda:1")


def step() -> torch.Tensor:
    optimizer.zero_grad()
    loss = F.cross_entropy(second(first(x).to("cuda:1")), y)
    loss.backward()
    optimizer.step()
    return loss


for _ in range(3):
    step()
torch.cuda.synchronize("cuda:0")
torch.cuda.synchronize("cuda:1")
with scope("step"):
    loss = step()
    torch.cuda.synchronize("cuda:0")
    torch.cuda.synchronize("cuda:1")
print(f"loss {loss.item():.4f}")
