// A substitute for axpy with the same name, parameters and answer that takes far longer (each
// thread recomputes its element many times): reduce-replay --slower must find an axpy launch.
extern "C" __global__ void axpy(float a, const float* __restrict__ x, float* __restrict__ y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float xi = x[i], yi = y[i], r = 0.0f;
  for (int k = 0; k < 200000; ++k) r = a * xi + yi + r * 1e-30f;  // r stays a * x + y (r * 1e-30 underflows)
  y[i] = a * xi + yi;
  if (r == 12345.678f) y[i] = r;  // keeps the loop alive
}
extern "C" __global__ void scale(float* __restrict__ y, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = y[i] * s;
}
