"""A layer norm in Triton, forward and backward, the weight and bias gradients accumulated with
float32 atomics (run to run their low bits differ), captured after a warm-up.

usage: verify_layer_norm.py [DIR]   DIR: also write DIR/bug.cubin, the backward kernel with a
planted wrong constant in dx, for a substitution that must fail verification.
"""

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

import replayfmt.capture


@triton.jit
def layer_norm_forward(X, Y, W, B, Mean, Rstd, stride, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    centred = tl.where(mask, x - mean, 0.0)
    rstd = 1 / tl.sqrt(tl.sum(centred * centred, axis=0) / N + eps)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)
    w = tl.load(W + cols, mask=mask)
    b = tl.load(B + cols, mask=mask)
    tl.store(Y + row * stride + cols, centred * rstd * w + b, mask=mask)


@triton.jit
def layer_norm_backward(DX, DY, DW, DB, X, W, Mean, Rstd, stride, N, BLOCK: tl.constexpr, BUG: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.load(Mean + row)
    rstd = tl.load(Rstd + row)
    xhat = tl.where(mask, (x - mean) * rstd, 0.0)
    wdy = tl.where(mask, w * dy, 0.0)
    c1 = tl.sum(xhat * wdy, axis=0) / N
    c2 = tl.sum(wdy, axis=0) / N
    if BUG:
        c2 = c2 * 1.01
    tl.store(DX + row * stride + cols, (wdy - (xhat * c1 + c2)) * rstd, mask=mask)
    tl.atomic_add(DW + cols, dy * xhat, mask=mask)
    tl.atomic_add(DB + cols, dy, mask=mask)


M, N = 2048, 1024
torch.manual_seed(0)
x = -2.3 + 0.5 * torch.randn(M, N, device="cuda")
w = torch.rand(N, device="cuda")
b = torch.rand(N, device="cuda")
dy = 0.1 * torch.randn(M, N, device="cuda")


def step(bug=0):
    y = torch.empty_like(x)
    mean = torch.empty(M, device="cuda")
    rstd = torch.empty(M, device="cuda")
    layer_norm_forward[(M,)](x, y, w, b, mean, rstd, x.stride(0), N, 1e-5, BLOCK=1024, num_warps=4)
    dx = torch.empty_like(x)
    dw = torch.zeros(N, device="cuda")
    db = torch.zeros(N, device="cuda")
    compiled = layer_norm_backward[(M,)](
        dx, dy, dw, db, x, w, mean, rstd, x.stride(0), N, BLOCK=1024, BUG=bug, num_warps=4
    )
    return y, dx, dw, db, compiled


step()  # compile outside the scope (a warm-up, as users capture a step)
with replayfmt.capture.scope("step"):
    y, dx, dw, db, _ = step()
torch.cuda.synchronize()
if len(sys.argv) > 1:
    *_, compiled = step(bug=1)
    Path(sys.argv[1], "bug.cubin").write_bytes(compiled.asm["cubin"])
print("dw", float(dw.sum()), "db", float(db.sum()))
