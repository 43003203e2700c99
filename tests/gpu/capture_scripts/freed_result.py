"""A step that computes y = 2x + y into memory it frees before the step ends (cuMemFree through
cuda-python: no framework), and a PyTorch step whose result is dropped (the caching allocator's
block free, when torch is installed). Issue 44: what they wrote must still be compared.

    python -m replayfmt.capture -o freed.kreplay --scope step freed_result.py [sm_XY]
"""

from pathlib import Path

import numpy as np
from cuda.bindings import driver as cu
from driver_program import load_module, ok

import replayfmt.capture

source = Path(__file__).resolve().parents[3] / "examples" / "kernels" / "saxpy.cu"
saxpy = ok(cu.cuModuleGetFunction(load_module(source), b"saxpy"))
n = 1 << 20
x_host = (np.arange(n) % 89).astype(np.float32)
x = ok(cu.cuMemAlloc(4 * n))
ok(cu.cuMemcpyHtoD(x, x_host, 4 * n))
with replayfmt.capture.scope("step"):
    y = ok(cu.cuMemAlloc(4 * n))
    ok(cu.cuMemsetD32(y, 0x3F800000, n))  # 1.0
    args = [np.array([2.0], np.float32), np.array([int(x)], np.uint64), np.array([int(y)], np.uint64)]
    args.append(np.array([n], np.int32))
    pointers = np.array([a.ctypes.data for a in args], dtype=np.uint64)
    ok(cu.cuLaunchKernel(saxpy, n // 256, 1, 1, 256, 1, 1, 0, 0, pointers.ctypes.data, 0))
    ok(cu.cuMemFree(y))  # the result is gone before the step ends
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        a = torch.arange(512 * 512, device="cuda", dtype=torch.float32).reshape(512, 512) / 1e5
        torch.relu(a @ a.T - 1.0)  # its result dropped: the caching allocator frees the block at once
ok(cu.cuCtxSynchronize())
print("ok")
