// Kernels whose cubins the container tests embed as executables (compiled at test time by nvcc).
#include <cstdint>

extern "C" __global__ void saxpy(float a, const float* __restrict__ x, float* __restrict__ y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void gather(const float* const* __restrict__ tables, const int* __restrict__ index,
                                  float* __restrict__ out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tables[i & 1][index[i]];
}
