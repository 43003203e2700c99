// Runtime API, three streams joined by events: two streams scale their inputs, a third waits for
// both and adds them; the result is copied back and checked on the host.
#include <cmath>
#include <vector>
#include "check.h"

__global__ void scale(float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * a + 0.25f;
}

__global__ void add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + 2.0f * b[i];
}

int main(int argc, char** argv) {
  const int n = 1 << 20, iterations = argc > 1 ? std::atoi(argv[1]) : 4;
  const size_t bytes = n * sizeof(float);
  cudaStream_t s[3];
  cudaEvent_t scaled_a, scaled_b, added;
  for (auto& stream : s) CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK(cudaEventCreateWithFlags(&scaled_a, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&scaled_b, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&added, cudaEventDisableTiming));
  float *ha, *hb, *a, *b, *c;
  CHECK(cudaMallocHost(&ha, bytes));
  CHECK(cudaMallocHost(&hb, bytes));
  for (int i = 0; i < n; ++i) ha[i] = pattern(i, 1), hb[i] = pattern(i, 2);
  CHECK(cudaMalloc(&a, bytes));
  CHECK(cudaMalloc(&b, bytes));
  CHECK(cudaMalloc(&c, bytes));
  CHECK(cudaMemcpyAsync(a, ha, bytes, cudaMemcpyHostToDevice, s[0]));
  CHECK(cudaMemcpyAsync(b, hb, bytes, cudaMemcpyHostToDevice, s[1]));
  const int block = 256, grid = (n + block - 1) / block;
  for (int it = 0; it < iterations; ++it) {
    scale<<<grid, block, 0, s[0]>>>(a, 1.01f, n);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(scaled_a, s[0]));
    scale<<<grid, block, 0, s[1]>>>(b, 0.99f, n);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(scaled_b, s[1]));
    CHECK(cudaStreamWaitEvent(s[2], scaled_a, 0));
    CHECK(cudaStreamWaitEvent(s[2], scaled_b, 0));
    add<<<grid, block, 0, s[2]>>>(a, b, c, n);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(added, s[2]));
    CHECK(cudaStreamWaitEvent(s[0], added, 0));  // the next scale must not overwrite what add reads
    CHECK(cudaStreamWaitEvent(s[1], added, 0));
  }
  CHECK(cudaDeviceSynchronize());
  std::vector<float> got(n), want(n);
  CHECK(cudaMemcpy(got.data(), c, bytes, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    float x = ha[i], y = hb[i];
    for (int it = 0; it < iterations; ++it) x = x * 1.01f + 0.25f, y = y * 0.99f + 0.25f;
    want[i] = x + 2.0f * y;
  }
  expect_close("streams", got.data(), want.data(), n, 1e-5f);
  std::printf("streams ok: %d iterations on 3 streams\n", iterations);
  for (auto& stream : s) CHECK(cudaStreamDestroy(stream));
  CHECK(cudaEventDestroy(scaled_a));
  CHECK(cudaEventDestroy(scaled_b));
  CHECK(cudaEventDestroy(added));
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  CHECK(cudaFree(c));
  CHECK(cudaFreeHost(ha));
  CHECK(cudaFreeHost(hb));
  return 0;
}
