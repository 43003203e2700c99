"""A scope whose one small kernel touches a large allocation: 256 MiB of starting state, a few
microseconds of work. Benchmarks of the scope must time the kernel, not the state."""

import torch

import replayfmt.capture

big = torch.ones(64 << 20, device="cuda")  # 256 MiB, its own allocation
torch.cuda.synchronize()
with replayfmt.capture.scope("step"):
    big[:4096].mul_(3.0)
torch.cuda.synchronize()
assert float(big[0]) == 3.0 and float(big[-1]) == 1.0
