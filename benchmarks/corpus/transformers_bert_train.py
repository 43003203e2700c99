"""transformers: a small BERT for sequence classification (random weights from a BertConfig), one
AdamW training step on random tokens. Region: scope "step"."""

import torch
from transformers import BertConfig, BertForSequenceClassification

from replayfmt.capture import scope

torch.manual_seed(0)
config = BertConfig(
    vocab_size=4096, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512, num_labels=3
)
model = BertForSequenceClassification(config).cuda().train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
tokens = torch.randint(0, config.vocab_size, (8, 64), device="cuda")
labels = torch.randint(0, 3, (8,), device="cuda")


def step():
    optimizer.zero_grad(set_to_none=True)
    loss = model(input_ids=tokens, labels=labels).loss
    loss.backward()
    optimizer.step()
    return loss


step()
torch.cuda.synchronize()
with scope("step"):
    loss = step()
    torch.cuda.synchronize()
print(f"loss {float(loss):.5f}")
