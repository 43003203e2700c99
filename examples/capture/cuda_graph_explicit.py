"""A CUDA graph built with the explicit graph API (cuGraphCreate, cuGraphAdd*Node): a memset, a
kernel, a device-to-device copy, a child graph holding another kernel and an event record node.
It is launched, one kernel node's parameters are changed in the executable graph
(cuGraphExecKernelNodeSetParams) and it is launched again.

    python -m replayfmt.capture --scope step -o explicit.kreplay examples/capture/cuda_graph_explicit.py
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
x_host = (np.arange(n) % 89).astype(np.float32)
y_host = np.full(n, 3.0, dtype=np.float32)
x, y, z = ok(cu.cuMemAlloc(4 * n)), ok(cu.cuMemAlloc(4 * n)), ok(cu.cuMemAlloc(4 * n))
ok(cu.cuMemcpyHtoD(x, x_host, 4 * n))
ok(cu.cuMemcpyHtoD(y, y_host, 4 * n))
stream = ok(cu.cuStreamCreate(1))
done = ok(cu.cuEventCreate(0))
keep = []  # argument memory must outlive the calls that read it


def kernel_params(a: float, src, dst):
    args = (np.array([a], np.float32), np.array([int(src)], np.uint64), np.array([int(dst)], np.uint64),
            np.array([n], np.int32))  # fmt: skip
    pointers = np.array([v.ctypes.data for v in args], dtype=np.uint64)
    keep.append((args, pointers))
    params = cu.CUDA_KERNEL_NODE_PARAMS()
    params.func = saxpy
    params.gridDimX, params.gridDimY, params.gridDimZ = n // 256, 1, 1
    params.blockDimX, params.blockDimY, params.blockDimZ = 256, 1, 1
    params.sharedMemBytes = 0
    params.kernelParams = pointers.ctypes.data
    return params


child = ok(cu.cuGraphCreate(0))
ok(cu.cuGraphAddKernelNode(child, [], 0, kernel_params(1.0, x, z)))  # z = x + z
graph = ok(cu.cuGraphCreate(0))
memset = cu.CUDA_MEMSET_NODE_PARAMS()
memset.dst, memset.value, memset.elementSize, memset.width, memset.height, memset.pitch = z, 0, 4, n, 1, 0
clear = ok(cu.cuGraphAddMemsetNode(graph, [], 0, memset, context))  # z = 0
scale = ok(cu.cuGraphAddKernelNode(graph, [], 0, kernel_params(2.0, x, y)))  # y = 2x + y
copy = cu.CUDA_MEMCPY3D()
copy.srcMemoryType = copy.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
copy.srcDevice, copy.dstDevice = y, z
copy.WidthInBytes, copy.Height, copy.Depth = 4 * n, 1, 1
copied = ok(cu.cuGraphAddMemcpyNode(graph, [clear, scale], 2, copy, context))  # z = y
inner = ok(cu.cuGraphAddChildGraphNode(graph, [copied], 1, child))
ok(cu.cuGraphAddEventRecordNode(graph, [inner], 1, done))
executable = ok(cu.cuGraphInstantiate(graph, 0))
with replayfmt.capture.scope("step"):
    ok(cu.cuGraphLaunch(executable, stream))
    ok(cu.cuGraphExecKernelNodeSetParams(executable, scale, kernel_params(3.0, x, y)))  # now y = 3x + y
    ok(cu.cuGraphLaunch(executable, stream))
    ok(cu.cuEventSynchronize(done))
out_y, out_z = np.empty(n, dtype=np.float32), np.empty(n, dtype=np.float32)
ok(cu.cuMemcpyDtoH(out_y, y, 4 * n))
ok(cu.cuMemcpyDtoH(out_z, z, 4 * n))
assert np.array_equal(out_y, y_host + 5 * x_host), "the graph computed something else"
assert np.array_equal(out_z, out_y + x_host), "the graph computed something else"
print("explicit graph ok: 2 launches, one kernel node updated between them")
