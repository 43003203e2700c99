"""An MLP compiled with torch.compile(mode="max-autotune-no-cudagraphs"), run once to compile and
tune, then once in a scope whose result is not kept (``keep``: kept past the scope). Issue 44:
the dropped step verified nothing, and the kept step's 16 MB output was not among the compared
ranges.

    python -m replayfmt.capture -o mlp.kreplay --scope step dropped_compiled_mlp.py [keep]
"""

import sys

import torch

import replayfmt.capture

torch.manual_seed(0)
mlp = torch.nn.Sequential(
    torch.nn.Linear(1024, 4096),
    torch.nn.GELU(),
    torch.nn.Linear(4096, 4096),
    torch.nn.GELU(),
    torch.nn.Linear(4096, 1024),
).cuda()
fn = torch.compile(mlp, mode="max-autotune-no-cudagraphs")
x = torch.randn(4096, 1024, device="cuda")
keep = sys.argv[1:] == ["keep"]
with torch.no_grad():
    fn(x)
    torch.cuda.synchronize()
    with replayfmt.capture.scope("step"):
        if keep:
            out = fn(x)  # 4096 x 1024 floats: 16 MB
        else:
            fn(x)  # the result is dropped at once
    torch.cuda.synchronize()
if keep:
    print("kept", float(out[0, 0]))
