"""A recorder started while torch.profiler holds CUPTI must fail with a clear message."""

import torch
from torch.profiler import ProfilerActivity, profile

import replayfmt.capture
from replayfmt.errors import ReplayError

x = torch.ones(4, device="cuda")
with profile(activities=[ProfilerActivity.CUDA]):
    x.add_(1)
    try:
        replayfmt.capture.record(__import__("sys").argv[1])
    except ReplayError as exc:
        print("refused:", exc)
    else:
        raise SystemExit("the recorder started under torch.profiler")
