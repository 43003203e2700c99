"""Baseline for replay_bench.py's BERT section: the same training step (examples/capture/
bert_train_step.py's model and data) captured by PyTorch itself into a torch.cuda.CUDAGraph and
replayed, measured as replay_bench measures the replay: elapsed between CUDA events around each
replay, GPU busy as the union of its kernels and copies (CUPTI, through torch.profiler). The idle
share of a framework's own graph is the floor a graph of the same kernels can reach on this GPU:
the device's dispatch gap between dependent kernel nodes, which no host work adds to.

    python benchmarks/bert_torch_graph.py [--rounds 50]    (prints one JSON line)
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import BertConfig, BertForSequenceClassification


def busy_us(events: list[tuple[float, float]]) -> float:
    """The union of [start, end) intervals, in their unit."""
    busy, reach = 0.0, float("-inf")
    for start, end in sorted(events):
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    return busy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
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
    # capturable: the step count stays on the device, as a graph needs
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True, capturable=True)
    tokens = torch.randint(0, config.vocab_size, (16, 128), device="cuda")
    labels = torch.randint(0, 2, (16,), device="cuda")

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=False)
        loss = model(input_ids=tokens, labels=labels).loss
        loss.backward()
        optimizer.step()
        return loss

    # transformers builds its attention mask with torch.tensor(min_dtype, device="cuda"): a copy
    # from pageable host memory, which a CUDA graph cannot hold; a device fill is the same value
    host_tensor = torch.tensor

    def device_scalar(data, *args, **kwargs):  # type: ignore[no-untyped-def]
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda" and isinstance(data, int | float) and not args:
            return torch.full((), data, device=device, dtype=kwargs.get("dtype"))
        return host_tensor(data, *args, **kwargs)

    torch.tensor = device_scalar
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    elapsed_ms, busy_ms, kernels = [], [], 0
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(args.rounds)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(args.rounds)]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for k in range(args.rounds):
            starts[k].record()
            graph.replay()
            ends[k].record()
            torch.cuda.synchronize()  # one replay at a time: its device work falls between its events
    elapsed_ms = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    work = sorted(
        (e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
    )
    # the replays ran one after another: split the intervals at the largest gaps into rounds
    gaps = sorted(range(1, len(work)), key=lambda i: work[i][0] - work[i - 1][1], reverse=True)[: args.rounds - 1]
    bounds = [0, *sorted(gaps), len(work)]
    for a, b in itertools.pairwise(bounds):
        busy_ms.append(busy_us(work[a:b]) / 1e3)
    kernels = len(work) // args.rounds
    elapsed, busy = statistics.median(elapsed_ms), statistics.median(busy_ms)
    print(json.dumps({"elapsed_ms": elapsed, "busy_ms": busy, "nodes_per_replay": kernels}))


if __name__ == "__main__":
    main()
