"""Triton kernels launched with launch_pdl=True (sm_90 and newer): Triton's launcher sets
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, and each kernel waits for the one before it
(gdc_wait) and lets the next launch early (gdc_launch_dependents). In scope "step", four rounds of
y += 2x then z += 0.5y. The program checks its result.

    python -m replayfmt.capture -o triton_pdl.kreplay --scope step triton_pdl.py
"""

import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

import replayfmt.capture


@triton.jit
def axpy_pdl(a, x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    gdc_wait()
    gdc_launch_dependents()
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, a * x + y, mask=mask)


n = 1 << 18
x = (torch.arange(n, device="cuda") % 17).float()
y, z = torch.zeros_like(x), torch.zeros_like(x)
grid = (triton.cdiv(n, 1024),)
axpy_pdl[grid](0.0, x, y, n, BLOCK=1024, launch_pdl=True)  # compiled before the step
torch.cuda.synchronize()
with replayfmt.capture.scope("step"):
    for _ in range(4):
        axpy_pdl[grid](2.0, x, y, n, BLOCK=1024, launch_pdl=True)
        axpy_pdl[grid](0.5, y, z, n, BLOCK=1024, launch_pdl=True)
    torch.cuda.synchronize()
expected_y, expected_z = torch.zeros_like(x), torch.zeros_like(x)
for _ in range(4):
    expected_y += 2 * x
    expected_z += 0.5 * expected_y
if not torch.equal(z, expected_z):
    sys.exit("the program's own result is wrong: PDL kernels raced")
print("ok")
