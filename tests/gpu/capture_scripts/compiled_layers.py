"""A torch.compile'd stack of layers, one step recorded under ``--scope step``: for extract-replay
(one GEMM cut out of the step) and diff-replay (the same program compiled two ways).

python -m replayfmt.capture --scope step -o step.kreplay compiled_layers.py [MODE] [LAYERS] [DTYPE]

MODE: an Inductor mode (``default``, ``max-autotune-no-cudagraphs``); LAYERS: how many layers;
DTYPE: float32 (default) or bfloat16. The weights are 2048x2048 (16 MiB in fp32: each its own
caching-allocator segment), the activations 512x2048 (sharing segments), so a step holds LAYERS
weights and one GEMM reads one of them.
"""

import sys

import torch

import replayfmt.capture

mode = sys.argv[1] if len(sys.argv) > 1 else "default"
layers = int(sys.argv[2]) if len(sys.argv) > 2 else 4
dtype = getattr(torch, sys.argv[3]) if len(sys.argv) > 3 else torch.float32
torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False  # full fp32 GEMMs: long enough (>= 20 us) to time


def layer(x, w, b):
    return torch.relu(x @ w + b)


compiled = torch.compile(layer, mode=None if mode == "default" else mode)
weights = [(torch.randn(2048, 2048, device="cuda") / 45).to(dtype) for _ in range(layers)]
biases = [torch.randn(2048, device="cuda").to(dtype) for _ in range(layers)]
x0 = torch.randn(512, 2048, device="cuda").to(dtype)


def step(x):
    for w, b in zip(weights, biases):
        x = compiled(x, w, b)
    return x


step(x0)  # compile (and autotune) outside the scope
torch.cuda.synchronize()
with replayfmt.capture.scope("step"):
    out = step(x0)
torch.cuda.synchronize()
print("checksum", float(out.double().sum()))
