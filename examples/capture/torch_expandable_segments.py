"""PyTorch with expandable segments: the caching allocator reserves a virtual range and maps
physical memory into it piece by piece as it grows (cuMemAddressReserve, cuMemCreate, cuMemMap,
cuMemSetAccess), so tensors and copies span pieces mapped at different times.

python -m replayfmt.capture -o expandable.kreplay examples/capture/torch_expandable_segments.py
"""

import os

os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"  # before torch initialises CUDA

import numpy as np
import torch

torch.manual_seed(0)
x = torch.randn(1024, 1024, device="cuda")  # 4 MiB: the segment's first piece
parts = [torch.randn(1024, 1024, device="cuda") * i + x for i in range(10)]  # 40 MiB more: it grows
host = np.linspace(-1, 1, 4 << 20, dtype=np.float32)  # 16 MiB copied into the grown range
uploaded = torch.from_numpy(host).cuda().view(4096, 1024)
total = torch.stack(parts).sum(0) + uploaded[:1024]
torch.cuda.synchronize()
print("total", float(total.sum()), "reserved", torch.cuda.memory_reserved())
