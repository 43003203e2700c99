"""saxpy through cuda-python's driver API, with two streams and an event edge.
The kernel comes from examples/kernels/saxpy.cu, compiled with nvcc at run time.

    python -m replayfmt.capture -o saxpy2.kreplay examples/capture/cuda_python_saxpy.py
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from cuda.bindings import driver as cu


def ok(result):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        sys.exit(f"CUDA error: {err}")
    return rest[0] if len(rest) == 1 else rest


source = Path(__file__).resolve().parent.parent / "kernels" / "saxpy.cu"
arch = sys.argv[1] if len(sys.argv) > 1 else "sm_90"
with tempfile.TemporaryDirectory() as tmp:
    subprocess.run(["nvcc", "-cubin", f"-arch={arch}", "-o", f"{tmp}/saxpy.cubin", str(source)], check=True)
    image = Path(f"{tmp}/saxpy.cubin").read_bytes()
ok(cu.cuInit(0))
context = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
ok(cu.cuCtxSetCurrent(context))
module = ok(cu.cuModuleLoadData(image))
saxpy = ok(cu.cuModuleGetFunction(module, b"saxpy"))
n = 1 << 20
x_host = (np.arange(n) % 97).astype(np.float32)
y_host = np.ones(n, dtype=np.float32)
x, y = ok(cu.cuMemAlloc(4 * n)), ok(cu.cuMemAlloc(4 * n))
upload, compute = ok(cu.cuStreamCreate(1)), ok(cu.cuStreamCreate(1))
ready = ok(cu.cuEventCreate(0))
ok(cu.cuMemcpyHtoDAsync(x, x_host, 4 * n, upload))
ok(cu.cuMemcpyHtoDAsync(y, y_host, 4 * n, upload))
ok(cu.cuEventRecord(ready, upload))
ok(cu.cuStreamWaitEvent(compute, ready, 0))
args = (
    np.array([2.0], np.float32),
    np.array([int(x)], np.uint64),
    np.array([int(y)], np.uint64),
    np.array([n], np.int32),
)
pointers = np.array([a.ctypes.data for a in args], dtype=np.uint64)
ok(cu.cuLaunchKernel(saxpy, n // 256, 1, 1, 256, 1, 1, 0, compute, pointers.ctypes.data, 0))
out = np.empty(n, dtype=np.float32)
ok(cu.cuMemcpyDtoHAsync(out, y, 4 * n, compute))
ok(cu.cuStreamSynchronize(compute))
assert np.array_equal(out, 2 * x_host + 1)
