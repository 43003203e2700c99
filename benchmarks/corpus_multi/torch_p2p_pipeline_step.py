"""A two-stage pipeline over two processes under torchrun, its stages joined by NCCL's
point-to-point calls, in GPipe's order: rank 0 runs stage one on each of four micro-batches and
sends the activations (dist.send); rank 1 receives them (dist.recv) and runs stage two and the
loss on each, then each backward, sending every activation's gradient back; rank 0 receives them
and runs its backward; SGD with momentum on both. Needs 2 GPUs: torchrun --nproc_per_node 2.
Region: scope "step"."""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from replayfmt.capture import scope

rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
MICRO, ROWS, DIM = 4, 64, 1024
torch.manual_seed(rank)
stage = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM)).cuda()
optimizer = torch.optim.SGD(stage.parameters(), lr=0.01, momentum=0.9)
inputs = [torch.randn(ROWS, DIM, device="cuda") for _ in range(MICRO)]
targets = [torch.randn(ROWS, DIM, device="cuda") for _ in range(MICRO)]


def first_stage() -> None:
    held = []
    for x in inputs:
        h = stage(x)
        dist.send(h.detach(), dst=1)
        held.append(h)
    for h in held:
        grad = torch.empty_like(h)
        dist.recv(grad, src=1)
        h.backward(grad)


def second_stage() -> torch.Tensor:
    held = []
    for y in targets:  # every forward first, then every backward (GPipe's order): each send meets its recv
        a = torch.empty(ROWS, DIM, device="cuda")
        dist.recv(a, src=0)
        a.requires_grad_()
        held.append((a, F.mse_loss(stage(a), y) / MICRO))
    for a, loss in held:
        loss.backward()
        dist.send(a.grad, dst=0)
    return sum(loss.detach() for _, loss in held)


def step() -> torch.Tensor:
    optimizer.zero_grad()
    loss = second_stage() if rank == 1 else (first_stage() or torch.zeros((), device="cuda"))
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
