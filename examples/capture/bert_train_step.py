"""A BERT-like training step (transformers' BertForSequenceClassification, random weights: nothing
is downloaded), eager PyTorch: forward, loss, backward and an AdamW step, the step marked as a
scope. benchmarks/replay_bench.py --bert records it and measures the replay's host gaps.

python -m replayfmt.capture -o bert.kreplay --scope step examples/capture/bert_train_step.py
benchmark-replay --scope step bert.kreplay
benchmark-replay --scope step --mode graph bert.kreplay
"""

import torch
from transformers import BertConfig, BertForSequenceClassification

import replayfmt.capture


def model_and_data() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """The step's model (random weights, seeded) and batch; benchmarks/bert_torch_graph.py times
    the same step in PyTorch's own CUDA graph."""
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=8192,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=128,
        num_labels=2,
        attn_implementation="eager",
    )
    model = BertForSequenceClassification(config).cuda().train()
    tokens = torch.randint(0, config.vocab_size, (16, 128), device="cuda")
    labels = torch.randint(0, 2, (16,), device="cuda")
    return model, tokens, labels


def train_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    optimizer.zero_grad(set_to_none=False)
    loss = model(input_ids=tokens, labels=labels).loss
    loss.backward()
    optimizer.step()
    return loss


if __name__ == "__main__":
    model, tokens, labels = model_and_data()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    for _ in range(3):
        train_step(model, optimizer, tokens, labels)  # warm up: allocations, cuBLAS handles, optimizer state
    torch.cuda.synchronize()
    with replayfmt.capture.scope("step"):
        loss = train_step(model, optimizer, tokens, labels)
    torch.cuda.synchronize()
    print("loss", float(loss))
