// Kernels for the tune-replay tests.

// Correct for every launch shape: a grid-stride loop.
extern "C" __global__ void stride_scale(float* __restrict__ y, float s, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) y[i] *= s;
}

// Reverses each block-sized slice: the result depends on the block size, so only the captured
// block size (256) computes the captured answer.
extern "C" __global__ void reverse_blocks(float* __restrict__ y, int n) {
  __shared__ float tile[1024];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x] = i < n ? y[i] : 0.0f;
  __syncthreads();
  if (i < n) y[i] = tile[blockDim.x - 1 - threadIdx.x];
}

// Faults (writes through a null pointer) when launched with more than 256 threads per block.
extern "C" __global__ void fault_if_wide(float* __restrict__ y, int n) {
  if (blockDim.x > 256) *(volatile float*)nullptr = 1.0f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) y[i] *= 2.0f;
}
