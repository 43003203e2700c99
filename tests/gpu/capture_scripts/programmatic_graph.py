"""Two kernels chained by programmatic dependent launch inside a CUDA graph, as XLA's command
buffers chain theirs: stream capture of a saxpy, then a second saxpy launched with
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (the captured edge between them is a
programmatic one: the second may start before the first has ended). The two write different
buffers, so the overlap changes no result. The graph is launched three times in scope "step".

    python -m replayfmt.capture -o pdl.kreplay --scope step programmatic_graph.py [sm_XY]
"""

from pathlib import Path

import numpy as np
from cuda.bindings import driver as cu
from driver_program import load_module, ok

import replayfmt.capture

source = Path(__file__).resolve().parents[3] / "examples" / "kernels" / "saxpy.cu"
saxpy = ok(cu.cuModuleGetFunction(load_module(source), b"saxpy"))
n = 1 << 20
x, y, z = (ok(cu.cuMemAlloc(4 * n)) for _ in range(3))
ok(cu.cuMemcpyHtoD(x, (np.arange(n) % 89).astype(np.float32), 4 * n))
ok(cu.cuMemsetD32(y, 0x3F800000, n))  # 1.0
ok(cu.cuMemsetD32(z, 0x40000000, n))  # 2.0
stream = ok(cu.cuStreamCreate(1))
keep = []


def launch(a: float, dst, programmatic: bool) -> None:
    args = [np.array([a], np.float32), np.array([int(x)], np.uint64), np.array([int(dst)], np.uint64)]
    args.append(np.array([n], np.int32))
    pointers = np.array([v.ctypes.data for v in args], dtype=np.uint64)
    keep.extend([args, pointers])
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = n // 256, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = 256, 1, 1
    config.sharedMemBytes = 0
    config.hStream = stream
    attrs = []
    if programmatic:
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        attrs.append(attr)
    config.attrs = attrs
    config.numAttrs = len(attrs)
    ok(cu.cuLaunchKernelEx(config, saxpy, pointers.ctypes.data, 0))


ok(cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
launch(2.0, y, False)
launch(3.0, z, True)
graph = ok(cu.cuStreamEndCapture(stream))
executable = ok(cu.cuGraphInstantiate(graph, 0))
with replayfmt.capture.scope("step"):
    for _ in range(3):
        ok(cu.cuGraphLaunch(executable, stream))
    ok(cu.cuStreamSynchronize(stream))
out = np.empty(n, np.float32)
ok(cu.cuMemcpyDtoH(out, z, 4 * n))
print("z[5]", out[5])
