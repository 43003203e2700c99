"""transformers: a small GPT-2 (2 layers, random weights from a GPT2Config) scoring a batch of
random tokens in inference. Region: scope "step"."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from replayfmt.capture import scope

torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_head=4, n_embd=256, vocab_size=8192, n_positions=256)
model = GPT2LMHeadModel(config).cuda().eval()
tokens = torch.randint(0, config.vocab_size, (4, 128), device="cuda")
with torch.no_grad():
    model(tokens)
    torch.cuda.synchronize()
    with scope("step"):
        logits = model(tokens).logits
        torch.cuda.synchronize()
print(f"logits {tuple(logits.shape)} mean {float(logits.mean()):.5f}")
