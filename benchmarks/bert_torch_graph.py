"""Baseline for replay_bench.py's BERT section: the same training step (examples/capture/
bert_train_step.py's model, data and step) captured by PyTorch itself into a torch.cuda.CUDAGraph and
replayed, measured as replay_bench measures the replay: elapsed between CUDA events around each
replay, GPU busy as the union of its kernels and copies (CUPTI, through torch.profiler). The idle
share of a framework's own graph is the floor a graph of the same kernels can reach on this GPU:
the device's dispatch gap between dependent kernel nodes, which no host work adds to.

    python benchmarks/bert_torch_graph.py [--rounds 50]    (prints one JSON line)
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import statistics
from pathlib import Path
from types import ModuleType

import torch
from torch.profiler import ProfilerActivity, profile

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "capture" / "bert_train_step.py"


def _example() -> ModuleType:
    """examples/capture/bert_train_step.py as a module (its step, without its capture)."""
    spec = importlib.util.spec_from_file_location("bert_train_step", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    example = _example()
    model, tokens, labels = example.model_and_data()
    # capturable: the step count stays on the device, as a graph needs
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True, capturable=True)

    def step() -> torch.Tensor:
        return example.train_step(model, optimizer, tokens, labels)

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
