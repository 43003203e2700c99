"""An autotuner's timing as XLA's GpuTimer does it (xla/stream_executor/cuda/delay_kernel_cuda.cu.cc),
through cuda-python: a DelayKernel spinning on a semaphore in pinned host memory is launched
first, then the start event, the candidate's kernels and the stop event are queued, and only then
does the host write the release. Three candidates, then a check of the result.

    python tests/gpu/capture_scripts/xla_delay_kernel.py [sm_XY]
"""

import ctypes

import numpy as np
from cuda.bindings import driver as cu
from driver_program import load_module, ok

SOURCE = r"""
namespace stream_executor {
enum struct GpuSemaphoreState { kHold, kRelease, kTimedOut };
namespace gpu {
__global__ void DelayKernel(volatile GpuSemaphoreState* semaphore, GpuSemaphoreState target) {
  constexpr long long WAIT_CYCLES = 1024, TIMEOUT_CYCLES = 200000000;  // 100 ms at 2 GHz
  const long long start = clock64();
  bool waiting;
  while ((waiting = (*semaphore != target)) && clock64() - start < TIMEOUT_CYCLES) {
    const long long t0 = clock64();
    while (clock64() - t0 < WAIT_CYCLES) {}
  }
  if (waiting) *semaphore = GpuSemaphoreState::kTimedOut;
}
}  // namespace gpu
}  // namespace stream_executor
extern "C" __global__ void scale_add(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""
DELAY = b"_ZN15stream_executor3gpu11DelayKernelEPVNS_17GpuSemaphoreStateES1_"


def launch(function, grid: int, block: int, stream, *args: np.ndarray) -> None:
    pointers = np.array([a.ctypes.data for a in args], dtype=np.uint64)
    ok(cu.cuLaunchKernel(function, grid, 1, 1, block, 1, 1, 0, stream, pointers.ctypes.data, 0))


module = load_module(SOURCE)
delay, scale_add = ok(cu.cuModuleGetFunction(module, DELAY)), ok(cu.cuModuleGetFunction(module, b"scale_add"))
n = 1 << 22
x_host = (np.arange(n) % 7).astype(np.float32)
x, y = ok(cu.cuMemAlloc(4 * n)), ok(cu.cuMemAlloc(4 * n))
ok(cu.cuMemcpyHtoD(x, x_host, 4 * n))
ok(cu.cuMemsetD32(y, 0, n))
stream = ok(cu.cuStreamCreate(1))
start, stop = ok(cu.cuEventCreate(0)), ok(cu.cuEventCreate(0))
work = (
    np.array([1.0], np.float32),
    np.array([int(x)], np.uint64),
    np.array([int(y)], np.uint64),
    np.array([n], np.int32),
)
for candidate in range(3):
    semaphore = int(ok(cu.cuMemHostAlloc(4, 0)))  # GpuSemaphore::Create: pinned, its own allocation
    hold = (ctypes.c_int32 * 1).from_address(semaphore)
    hold[0] = 0  # kHold
    launch(delay, 1, 1, stream, np.array([semaphore], np.uint64), np.array([1], np.int32))  # target: kRelease
    ok(cu.cuEventRecord(start, stream))
    for _ in range(4):
        launch(scale_add, n // 256, 256, stream, *work)
    ok(cu.cuEventRecord(stop, stream))
    hold[0] = 1  # the host releases the delay kernel once the timed work is queued
    ok(cu.cuEventSynchronize(stop))
    assert hold[0] == 1, f"candidate {candidate}: the delay kernel timed out"
    ok(cu.cuMemFreeHost(semaphore))
out = np.empty(n, np.float32)
ok(cu.cuMemcpyDtoH(out, y, 4 * n))
assert np.array_equal(out, 12 * x_host), "3 candidates x 4 launches of y += x"
print("ok")
