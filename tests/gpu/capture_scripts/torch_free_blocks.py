"""A PyTorch caching-allocator segment that holds mostly free blocks: 256 MiB allocated and freed,
then a 64 MiB tensor placed in the cached segment; the scope touches only that tensor, so a
bounded snapshot takes its 64 MiB and skips the 192 MiB of free blocks."""

import torch

import replayfmt.capture

big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # one 256 MiB segment
del big  # cached, not returned to the driver
x = torch.arange(16 << 20, dtype=torch.float32, device="cuda")  # 64 MiB, split from the cached block
segments = [s for s in torch.cuda.memory_snapshot() if s["address"] <= x.data_ptr() < s["address"] + s["total_size"]]
assert segments and segments[0]["total_size"] == 256 << 20, segments
with replayfmt.capture.scope("step"):
    x.mul_(3).add_(1)
torch.cuda.synchronize()
print("sum", float(x.double().sum()))
