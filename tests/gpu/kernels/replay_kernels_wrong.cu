// A substitute for axpy with the same name and parameters that computes another answer
// (a * x + y + 1): replaying with it must show that the substitute, not the captured code, ran.
extern "C" __global__ void axpy(float a, const float* __restrict__ x, float* __restrict__ y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i] + 1.0f;
}
extern "C" __global__ void scale(float* __restrict__ y, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = y[i] * s;
}
