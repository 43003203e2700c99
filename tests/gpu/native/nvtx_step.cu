// A program that marks its step with an NVTX range ("step"): warm-up work before it, cleanup
// work after it; capture-replay --scope step records only the step.
#include <nvtx3/nvToolsExt.h>
#include <vector>
#include "check.h"

__global__ void smooth(float* out, const float* in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 0.25f * in[i > 0 ? i - 1 : i] + 0.5f * in[i] + 0.25f * in[i + 1 < n ? i + 1 : i];
}

__global__ void warm(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * 2.0f;
}

int main() {
  const int n = 1 << 16, block = 256, grid = (n + block - 1) / block;
  const size_t bytes = n * sizeof(float);
  std::vector<float> h(n), got(n);
  for (int i = 0; i < n; ++i) h[i] = pattern(i, 6);
  float *a, *b;
  CHECK(cudaMalloc(&a, bytes));
  CHECK(cudaMalloc(&b, bytes));
  CHECK(cudaMemcpy(a, h.data(), bytes, cudaMemcpyHostToDevice));
  nvtxRangePushA("warmup");
  warm<<<grid, block>>>(a, n);  // outside the step: not recorded with --scope step
  CHECK(cudaGetLastError());
  nvtxRangePop();
  nvtxRangePushA("step");
  for (int it = 0; it < 3; ++it) {
    smooth<<<grid, block>>>(b, a, n);
    CHECK(cudaGetLastError());
    smooth<<<grid, block>>>(a, b, n);
    CHECK(cudaGetLastError());
  }
  CHECK(cudaMemcpy(got.data(), a, bytes, cudaMemcpyDeviceToHost));
  nvtxRangePop();
  warm<<<grid, block>>>(b, n);  // after the step: not recorded either
  CHECK(cudaDeviceSynchronize());
  for (int i = 0; i < n; ++i) h[i] *= 2.0f;
  std::vector<float> t(n);
  for (int it = 0; it < 6; ++it) {
    for (int i = 0; i < n; ++i) t[i] = 0.25f * h[i > 0 ? i - 1 : i] + 0.5f * h[i] + 0.25f * h[i + 1 < n ? i + 1 : i];
    h.swap(t);
  }
  expect_close("nvtx step", got.data(), h.data(), n, 1e-5f);
  std::printf("nvtx step ok\n");
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  return 0;
}
