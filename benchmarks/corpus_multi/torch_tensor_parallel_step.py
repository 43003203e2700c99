"""A sequence-parallel MLP training step with PyTorch's tensor parallelism (DTensor over a
one-dimensional device mesh), one process per GPU under torchrun: each block's first linear layer
is split by columns and all-gathers its token-sharded input, the second is split by rows and
reduce-scatters its output back over the tokens; AdamW on the sharded parameters. Needs 2 GPUs:
torchrun --nproc_per_node 2. Region: scope "step"."""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from replayfmt.capture import scope


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))


rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
world = int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(local)
mesh = init_device_mesh("cuda", (world,))
torch.manual_seed(0)  # the same full weights on every rank before they are split
model = nn.Sequential(Block(1024, 4096), Block(1024, 4096)).cuda()
plan = {}
for k in range(len(model)):
    plan[f"{k}.up"] = ColwiseParallel(input_layouts=Shard(0))
    plan[f"{k}.down"] = RowwiseParallel(output_layouts=Shard(0))
model = parallelize_module(model, mesh, plan)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
torch.manual_seed(1 + rank)
tokens = torch.randn(512 // world, 1024, device="cuda")  # this rank's share of the tokens
target = torch.randn(512 // world, 1024, device="cuda")


def step() -> torch.Tensor:
    optimizer.zero_grad()
    loss = F.mse_loss(model(tokens), target)
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
