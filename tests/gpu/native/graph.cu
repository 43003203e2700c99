// A CUDA graph made by stream capture (a memset, two kernels and a device-to-device copy),
// instantiated once and launched several times; the result is checked on the host.
#include <vector>
#include "check.h"

__global__ void axpy(float* y, const float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}

__global__ void square_add(float* y, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i] * x[i];
}

int main(int argc, char** argv) {
  const int n = 1 << 18, launches = argc > 1 ? std::atoi(argv[1]) : 5;
  const size_t bytes = n * sizeof(float);
  std::vector<float> hx(n), got(n), want(n);
  for (int i = 0; i < n; ++i) hx[i] = pattern(i, 5);
  float *x, *y, *acc;
  CHECK(cudaMalloc(&x, bytes));
  CHECK(cudaMalloc(&y, bytes));
  CHECK(cudaMalloc(&acc, bytes));
  CHECK(cudaMemcpy(x, hx.data(), bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(acc, 0, bytes));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  const int block = 256, grid = (n + block - 1) / block;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  CHECK(cudaMemsetAsync(y, 0, bytes, stream));
  axpy<<<grid, block, 0, stream>>>(y, x, 3.0f, n);
  square_add<<<grid, block, 0, stream>>>(y, x, n);
  axpy<<<grid, block, 0, stream>>>(acc, y, 1.0f, n);
  CHECK(cudaMemcpyAsync(x, y, bytes / 2, cudaMemcpyDeviceToDevice, stream));
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < launches; ++i) CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaMemcpy(got.data(), acc, bytes, cudaMemcpyDeviceToHost));
  std::vector<float> xs(hx), sum(n, 0.0f);
  for (int l = 0; l < launches; ++l) {
    std::vector<float> ys(n);
    for (int i = 0; i < n; ++i) ys[i] = 3.0f * xs[i] + xs[i] * xs[i], sum[i] += ys[i];
    for (int i = 0; i < n / 2; ++i) xs[i] = ys[i];
  }
  expect_close("graph", got.data(), sum.data(), n, 1e-4f);
  std::printf("graph ok: %d launches of a 5-node graph\n", launches);
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
  CHECK(cudaFree(acc));
  return 0;
}
