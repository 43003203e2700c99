"""timm: a ConvNeXt-Atto training step (random weights, AdamW, label-smoothed cross entropy) on
random images. Region: scope "step"."""

import timm
import torch

from replayfmt.capture import scope

torch.manual_seed(0)
model = timm.create_model("convnext_atto", pretrained=False, num_classes=10).cuda().train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
images = torch.randn(16, 3, 96, 96, device="cuda")
labels = torch.randint(0, 10, (16,), device="cuda")
criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)


def step():
    optimizer.zero_grad(set_to_none=True)
    loss = criterion(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss


step()
torch.cuda.synchronize()
with scope("step"):
    loss = step()
    torch.cuda.synchronize()
print(f"loss {float(loss):.5f}")
