"""Launches that allow programmatic dependent launch (PDL), through cuda-python's cuLaunchKernelEx
with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, as Triton's launch_pdl=True, cuBLASLt
and XLA make them (tests/gpu/kernels/pdl_chain.cu): in scope "step", six rounds of y += 2x then
z += 0.5y on one stream, each launch allowing PDL (repeats the recorder's C ring answers); then
z += y allowing PDL and recording a programmatic event (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT),
which a second stream waits for before w += 3z, a plain launch. The program checks its results.

    python -m replayfmt.capture -o pdl.kreplay --scope step pdl_chain.py [sm_XY]
"""

import sys
from pathlib import Path

import numpy as np
from cuda.bindings import driver as cu
from driver_program import load_module, ok

import replayfmt.capture

source = Path(__file__).resolve().parents[1] / "kernels" / "pdl_chain.cu"
module = load_module(source)
early, late = (ok(cu.cuModuleGetFunction(module, name)) for name in (b"axpy_early", b"axpy"))
n = 1 << 18
x_host = (np.arange(n) % 17).astype(np.float32)
x, y, z, w = (ok(cu.cuMemAlloc(4 * n)) for _ in range(4))
ok(cu.cuMemcpyHtoD(x, x_host, 4 * n))
for buffer in (y, z, w):
    ok(cu.cuMemsetD32(buffer, 0, n))
first, second = ok(cu.cuStreamCreate(1)), ok(cu.cuStreamCreate(1))
event = ok(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING))  # as a programmatic event must be
ok(cu.cuCtxSynchronize())


def launch(fn, stream, a, src, dst, *, programmatic=True, records=None):
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = n // 256, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = 256, 1, 1
    config.sharedMemBytes, config.hStream = 0, stream
    attributes = []
    if programmatic:
        attribute = cu.CUlaunchAttribute()
        attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attribute.value.programmaticStreamSerializationAllowed = 1
        attributes.append(attribute)
    if records is not None:
        attribute = cu.CUlaunchAttribute()
        attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT
        attribute.value.programmaticEvent.event = records
        attribute.value.programmaticEvent.triggerAtBlockStart = 0
        attributes.append(attribute)
    config.attrs, config.numAttrs = attributes, len(attributes)
    args = (np.array([a], np.float32), np.array([int(src)], np.uint64), np.array([int(dst)], np.uint64))
    args += (np.array([n], np.int32),)
    pointers = np.array([arg.ctypes.data for arg in args], dtype=np.uint64)
    ok(cu.cuLaunchKernelEx(config, fn, pointers.ctypes.data, 0))


with replayfmt.capture.scope("step"):
    for _ in range(6):
        launch(early, first, 2.0, x, y)
        launch(early, first, 0.5, y, z)
    launch(late, first, 1.0, y, z, records=event)
    ok(cu.cuStreamWaitEvent(second, event, 0))
    launch(late, second, 3.0, z, w, programmatic=False)
    ok(cu.cuCtxSynchronize())
expected_y, expected_z = np.zeros(n, np.float32), np.zeros(n, np.float32)
for _ in range(6):
    expected_y += 2 * x_host
    expected_z += 0.5 * expected_y
expected_z += expected_y
result = np.empty(n, np.float32)
ok(cu.cuMemcpyDtoH(result, w, 4 * n))
if not np.array_equal(result, 3 * expected_z):
    sys.exit("the program's own result is wrong: PDL kernels raced")
print("ok")
