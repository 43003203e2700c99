"""A CUDA graph built with the explicit graph API (cuda-python): a memset node, a kernel node, a
memcpy node, a child graph with a kernel node, and an event record node. It is launched, one
kernel node of the executable graph is changed (cuGraphExecKernelNodeSetParams) and it is
launched again; then the graph's node is changed and the executable updated from it
(cuGraphKernelNodeSetParams, cuGraphExecUpdate) and it is launched a third time. The kernel
comes from examples/kernels/saxpy.cu, compiled with nvcc at run time.

    python -m replayfmt.capture -o graph.kreplay examples/capture/cuda_python_graph.py
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
saxpy = ok(cu.cuModuleGetFunction(ok(cu.cuModuleLoadData(image)), b"saxpy"))
n = 1 << 16
x_host = (np.arange(n) % 13).astype(np.float32)
x, y, z = ok(cu.cuMemAlloc(4 * n)), ok(cu.cuMemAlloc(4 * n)), ok(cu.cuMemAlloc(4 * n))
ok(cu.cuMemcpyHtoD(x, x_host, 4 * n))
stream = ok(cu.cuStreamCreate(1))
done = ok(cu.cuEventCreate(0))
keep = []  # argument memory must outlive the calls that read it


def kernel_params(a, y_pointer):
    args = (
        np.array([a], np.float32),
        np.array([int(x)], np.uint64),
        np.array([int(y_pointer)], np.uint64),
        np.array([n], np.int32),
    )
    pointers = np.array([v.ctypes.data for v in args], dtype=np.uint64)
    keep.append((args, pointers))
    params = cu.CUDA_KERNEL_NODE_PARAMS()
    params.func = saxpy
    params.gridDimX, params.gridDimY, params.gridDimZ = n // 256, 1, 1
    params.blockDimX, params.blockDimY, params.blockDimZ = 256, 1, 1
    params.sharedMemBytes = 0
    params.kernelParams = pointers.ctypes.data
    return params


graph = ok(cu.cuGraphCreate(0))
memset = cu.CUDA_MEMSET_NODE_PARAMS()
memset.dst, memset.value, memset.elementSize, memset.width, memset.height, memset.pitch = y, 0x3F800000, 4, n, 1, 0
reset = ok(cu.cuGraphAddMemsetNode(graph, None, 0, memset, context))  # y = 1
axpy = ok(cu.cuGraphAddKernelNode(graph, [reset], 1, kernel_params(2.0, y)))  # y = ax + 1
copy = cu.CUDA_MEMCPY3D()
copy.srcMemoryType = copy.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
copy.srcDevice, copy.dstDevice = y, z
copy.WidthInBytes, copy.Height, copy.Depth = 4 * n, 1, 1
copied = ok(cu.cuGraphAddMemcpyNode(graph, [axpy], 1, copy, context))  # z = y
child = ok(cu.cuGraphCreate(0))
ok(cu.cuGraphAddKernelNode(child, None, 0, kernel_params(2.0, z)))  # z = 2x + z
nested = ok(cu.cuGraphAddChildGraphNode(graph, [copied], 1, child))
ok(cu.cuGraphAddEventRecordNode(graph, [nested], 1, done))
runnable = ok(cu.cuGraphInstantiate(graph, 0))
ok(cu.cuGraphLaunch(runnable, stream))  # z = 4x + 1
ok(cu.cuGraphExecKernelNodeSetParams(runnable, axpy, kernel_params(3.0, y)))
ok(cu.cuGraphLaunch(runnable, stream))  # z = 5x + 1
ok(cu.cuGraphKernelNodeSetParams(axpy, kernel_params(4.0, y)))
ok(cu.cuGraphExecUpdate(runnable, graph))
ok(cu.cuGraphLaunch(runnable, stream))  # z = 6x + 1
ok(cu.cuEventSynchronize(done))
out = np.empty(n, dtype=np.float32)
ok(cu.cuMemcpyDtoH(out, z, 4 * n))
assert np.array_equal(out, 6 * x_host + 1), out[:8]
print("graph ok: 3 launches, an executable node update and an executable update between them", float(out.sum()))
