"""torchvision: ResNet-18 with random weights in inference (eval mode, no grad, channels-last
fp16 under autocast). Region: scope "step"."""

import torch
import torchvision

from replayfmt.capture import scope

torch.manual_seed(0)
model = torchvision.models.resnet18(weights=None).cuda().eval().to(memory_format=torch.channels_last)
x = torch.randn(16, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
    model(x)
    torch.cuda.synchronize()
    with scope("step"):
        logits = model(x)
        torch.cuda.synchronize()
print(f"logits {tuple(logits.shape)} mean {float(logits.float().mean()):.5f}")
