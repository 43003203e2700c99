"""torchvision: a MobileNetV3-small training step (random weights, SGD with momentum, cross entropy)
on random images. Region: scope "step"."""

import torch
import torchvision

from replayfmt.capture import scope

torch.manual_seed(0)
model = torchvision.models.mobilenet_v3_small(weights=None, num_classes=100).cuda().train()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
images = torch.randn(32, 3, 128, 128, device="cuda")
labels = torch.randint(0, 100, (32,), device="cuda")


def step():
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss


step()
torch.cuda.synchronize()
with scope("step"):
    loss = step()
    torch.cuda.synchronize()
print(f"loss {float(loss):.5f}")
