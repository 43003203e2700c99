"""A training step of a small transformer-style MLP stack sharded with FSDP2 (fully_shard: the
parameters all-gathered before each layer's forward and backward, the gradients reduce-scattered),
one process per GPU under torchrun. Needs 2 GPUs: torchrun --nproc_per_node 2. Region: scope "step"."""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

from replayfmt.capture import scope

rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
torch.manual_seed(0)
layers = [
    torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512)) for _ in range(4)
]
model = torch.nn.Sequential(*layers, torch.nn.Linear(512, 10)).cuda()
for layer in layers:
    fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
torch.manual_seed(1 + rank)
x = torch.randn(128, 512, device="cuda")
y = torch.randint(0, 10, (128,), device="cuda")


def step() -> torch.Tensor:
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


for _ in range(3):
    step()
torch.cuda.synchronize()
with scope("step"):
    loss = step()
    torch.cuda.synchronize()
print(f"rank {rank} loss {loss.item():.4f}")
dist.destroy_process_group()
