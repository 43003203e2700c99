"""timm: a ViT-Tiny/16 with random weights in inference (eval, no grad). Region: scope "step"."""

import timm
import torch

from replayfmt.capture import scope

torch.manual_seed(0)
model = timm.create_model("vit_tiny_patch16_224", pretrained=False).cuda().eval()
x = torch.randn(8, 3, 224, 224, device="cuda")
with torch.no_grad():
    model(x)
    torch.cuda.synchronize()
    with scope("step"):
        logits = model(x)
        torch.cuda.synchronize()
print(f"logits {tuple(logits.shape)} mean {float(logits.mean()):.5f}")
