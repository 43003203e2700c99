"""A DistributedDataParallel training step of an MLP, one process per GPU under torchrun (NCCL
all-reduce of the gradients). Needs 2 GPUs: torchrun --nproc_per_node 2. Region: scope "step"."""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from replayfmt.capture import scope

rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).cuda()
ddp = DistributedDataParallel(model, device_ids=[local])
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
torch.manual_seed(1 + rank)
x = torch.randn(256, 512, device="cuda")
y = torch.randint(0, 10, (256,), device="cuda")


def step() -> torch.Tensor:
    optimizer.zero_grad()
    loss = F.cross_entropy(ddp(x), y)
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
