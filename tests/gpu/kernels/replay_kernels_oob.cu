// A substitute for axpy with the same name and parameters that reads x 1 TiB past where it should
// (an out-of-bounds read: CUDA_ERROR_ILLEGAL_ADDRESS whatever the data), for reduce-replay --faults
// with a substitution, whose result must still hold what the captured axpy reads.
extern "C" __global__ void axpy(float a, const float* __restrict__ x, float* __restrict__ y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  const float* far = x + (1ull << 38);  // 1 TiB of floats on
  if (i < n) y[i] = a * far[i] + y[i];
}
extern "C" __global__ void scale(float* __restrict__ y, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = y[i] * s;
}
