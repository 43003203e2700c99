// A drop-in substitute for axpy (same name and parameters), written differently.
extern "C" __global__ void axpy(float a, const float* __restrict__ x, float* __restrict__ y, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) y[i] = fmaf(a, x[i], y[i]);
}
extern "C" __global__ void scale(float* __restrict__ y, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = y[i] * s;
}
