"""A training step whose backward accumulates with atomics: an embedding table gathered in the
forward pass, its gradient scattered back with a Triton float32 atomic add, a linear layer, MSE,
SGD. Captured after two warm-up steps, as users capture a step.

usage: verify_train_step.py [DIR]   DIR: also write DIR/bug.cubin, the gradient scatter with a
planted wrong constant, for a substitution that must fail verification.
"""

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

import replayfmt.capture


@triton.jit
def scatter_rows_kernel(grad_table, index, grad_rows, dim, BLOCK: tl.constexpr, BUG: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    target = tl.load(index + row)
    g = tl.load(grad_rows + row * dim + cols, mask=mask, other=0.0)
    if BUG:
        g = g * 2.0
    tl.atomic_add(grad_table + target * dim + cols, g, mask=mask)


BUGGY = [0]


class Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, table, index):
        ctx.save_for_backward(index)
        ctx.rows = table.shape[0]
        return table.index_select(0, index)

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        grad = grad.contiguous()
        out = torch.zeros(ctx.rows, grad.shape[1], device=grad.device)
        BUGGY.append(scatter_rows_kernel[(index.numel(),)](out, index, grad, grad.shape[1], BLOCK=64, BUG=BUGGY[0]))
        return out, None


torch.manual_seed(0)
table = torch.nn.Parameter(0.1 * torch.randn(1000, 64, device="cuda"))
head = torch.nn.Linear(64, 1, device="cuda")
optimizer = torch.optim.SGD([table, *head.parameters()], lr=0.1)
index = torch.randint(0, 1000, (8192,), device="cuda")
target = torch.randn(8192, 1, device="cuda")


def train_step():
    optimizer.zero_grad(set_to_none=False)
    loss = torch.nn.functional.mse_loss(head(Gather.apply(table, index)), target)
    loss.backward()
    optimizer.step()
    return loss


for _ in range(2):
    train_step()
with replayfmt.capture.scope("step"):
    loss = train_step()
torch.cuda.synchronize()
if len(sys.argv) > 1:
    BUGGY[0] = 1
    train_step()
    Path(sys.argv[1], "bug.cubin").write_bytes(BUGGY[-1].asm["cubin"])
print("loss", float(loss))
