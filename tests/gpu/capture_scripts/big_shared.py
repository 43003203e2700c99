"""reverse_in_shared (tests/gpu/kernels/replay_kernels.cu) with 96 KiB of dynamic shared memory,
launched three times through cuLaunchKernelEx; argv[1] is the cubin."""

import sys
from pathlib import Path

import numpy as np
from cuda.bindings import driver as cu


def ok(result):
    err, *rest = result if isinstance(result, tuple) else (result,)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    return rest[0] if len(rest) == 1 else rest


ok(cu.cuInit(0))
ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))))
module = ok(cu.cuModuleLoadData(Path(sys.argv[1]).read_bytes()))
fn = ok(cu.cuModuleGetFunction(module, b"reverse_in_shared"))
per_block, blocks = 24576, 8  # 96 KiB of floats per block
smem = per_block * 4
ok(cu.cuFuncSetAttribute(fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem))
data = (np.arange(per_block * blocks) % 1000).astype(np.float32)
src, dst = ok(cu.cuMemAlloc(data.nbytes)), ok(cu.cuMemAlloc(data.nbytes))
stream = ok(cu.cuStreamCreate(1))
ok(cu.cuMemcpyHtoD(src, data, data.nbytes))
config = cu.CUlaunchConfig()
config.gridDimX, config.gridDimY, config.gridDimZ = blocks, 1, 1
config.blockDimX, config.blockDimY, config.blockDimZ = 256, 1, 1
config.sharedMemBytes, config.hStream, config.numAttrs = smem, stream, 0
for i in range(3):
    a, b = (src, dst) if i % 2 == 0 else (dst, src)
    args = (np.array([int(a)], np.uint64), np.array([int(b)], np.uint64), np.array([per_block], np.int32))
    pointers = np.array([x.ctypes.data for x in args], dtype=np.uint64)
    ok(cu.cuLaunchKernelEx(config, fn, pointers.ctypes.data, 0))
ok(cu.cuStreamSynchronize(stream))
out = np.empty_like(data)
ok(cu.cuMemcpyDtoH(out, dst, data.nbytes))
assert np.array_equal(out, data.reshape(blocks, per_block)[:, ::-1].ravel())
