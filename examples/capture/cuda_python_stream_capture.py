"""A CUDA graph made by stream capture (cuda-python's driver API), launched three times.

The capture forks a second stream (a memset on one branch, saxpy on the other), joins it, then
copies device to device and runs saxpy again: a graph of kernel, memset and memcpy nodes with
their dependency edges. Only the launches are recorded (``--scope step``).

    python -m replayfmt.capture --scope step -o graph.kreplay examples/capture/cuda_python_stream_capture.py
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from cuda.bindings import driver as cu

import replayfmt.capture


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
x, y, z = ok(cu.cuMemAlloc(4 * n)), ok(cu.cuMemAlloc(4 * n)), ok(cu.cuMemAlloc(4 * n))
ok(cu.cuMemcpyHtoD(x, x_host, 4 * n))
ok(cu.cuMemcpyHtoD(y, y_host, 4 * n))
stream, side = ok(cu.cuStreamCreate(1)), ok(cu.cuStreamCreate(1))
fork, join = ok(cu.cuEventCreate(0)), ok(cu.cuEventCreate(0))


def launch(a: float, src, dst, on) -> None:
    args = (
        np.array([a], np.float32),
        np.array([int(src)], np.uint64),
        np.array([int(dst)], np.uint64),
        np.array([n], np.int32),
    )
    pointers = np.array([v.ctypes.data for v in args], dtype=np.uint64)
    ok(cu.cuLaunchKernel(saxpy, n // 256, 1, 1, 256, 1, 1, 0, on, pointers.ctypes.data, 0))


ok(cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
ok(cu.cuEventRecord(fork, stream))
ok(cu.cuStreamWaitEvent(side, fork, 0))
ok(cu.cuMemsetD32Async(z, 0, n, side))  # side branch: z = 0
launch(2.0, x, y, stream)  # main branch: y = 2x + y
ok(cu.cuEventRecord(join, side))
ok(cu.cuStreamWaitEvent(stream, join, 0))
ok(cu.cuMemcpyDtoDAsync(z, y, 4 * n, stream))  # z = y
launch(1.0, x, z, stream)  # z = x + z
graph = ok(cu.cuStreamEndCapture(stream))
executable = ok(cu.cuGraphInstantiate(graph, 0))
with replayfmt.capture.scope("step"):
    for _ in range(3):
        ok(cu.cuGraphLaunch(executable, stream))
    ok(cu.cuStreamSynchronize(stream))
out = np.empty(n, dtype=np.float32)
ok(cu.cuMemcpyDtoH(out, z, 4 * n))
assert np.array_equal(out, y_host + 7 * x_host), "the graph computed something else"
print("graph ok: 3 launches")
