"""An MLP training step on cuda:1 alone (as a torchrun rank with LOCAL_RANK=1 runs): the recorder
starts while cuda:0 is current, then follows the program to cuda:1. Region: scope "step"."""

import torch
import torch.nn.functional as F

from replayfmt.capture import scope

torch.cuda.set_device(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(256, 512, device="cuda")
y = torch.randint(0, 10, (256,), device="cuda")


def step() -> torch.Tensor:
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


for _ in range(3):
    step()
torch.cuda.synchronize()
with scope("step"):
    loss = step()
    torch.cuda.synchronize()
print(f"loss {loss.item():.4f}")
