// The capture-overhead probe: N launches of a small kernel inside an NVTX range ("timed"), timed
// on the host from the first launch to the synchronisation after the last. Prints
// "launch_loop launches=N per_launch_us=X". Run bare and under capture-replay side by side by
// benchmarks/native_capture_bench.py.
#include <nvtx3/nvToolsExt.h>
#include <chrono>
#include <vector>
#include "check.h"

__global__ void bump(float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * a + 1.0f;
}

int main(int argc, char** argv) {
  const int launches = argc > 1 ? std::atoi(argv[1]) : 2000, n = argc > 2 ? std::atoi(argv[2]) : 1 << 20;
  const int block = 256, grid = (n + block - 1) / block;
  std::vector<float> h(n);
  for (int i = 0; i < n; ++i) h[i] = pattern(i, 7);
  float* x;
  CHECK(cudaMalloc(&x, n * sizeof(float)));
  CHECK(cudaMemcpy(x, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  nvtxRangePushA("timed");
  for (int i = 0; i < 50; ++i) bump<<<grid, block>>>(x, 0.999f, n);  // warm: first touches, module load
  CHECK(cudaDeviceSynchronize());
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < launches; ++i) bump<<<grid, block>>>(x, 0.999f, n);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  nvtxRangePop();  // the range holds launches alone: its GPU busy time is kernel time
  CHECK(cudaMemcpy(h.data(), x, n * sizeof(float), cudaMemcpyDeviceToHost));
  std::printf("launch_loop launches=%d per_launch_us=%.3f first=%g\n", launches, seconds / launches * 1e6, h[0]);
  CHECK(cudaFree(x));
  return 0;
}
