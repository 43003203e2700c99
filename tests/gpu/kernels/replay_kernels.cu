// Kernels the GPU replay tests capture with the writer and replay with run-replay.
#include <cooperative_groups.h>
#include <cstdint>
namespace cg = cooperative_groups;

extern "C" __global__ void axpy(float a, const float* __restrict__ x, float* __restrict__ y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void scale(float* __restrict__ y, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] *= s;
}

// Pointers stored inside a buffer: tables[k] points into another buffer.
extern "C" __global__ void gather_tables(const float* const* __restrict__ tables, float* __restrict__ out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tables[0][i] + 2.0f * tables[1][i];
}

// Reverses each block's slice through dynamic shared memory (launched with more than 48 KiB).
extern "C" __global__ void reverse_in_shared(const float* __restrict__ in, float* __restrict__ out, int per_block) {
  extern __shared__ float tile[];
  const float* src = in + (size_t)blockIdx.x * per_block;
  for (int i = threadIdx.x; i < per_block; i += blockDim.x) tile[i] = src[i];
  __syncthreads();
  float* dst = out + (size_t)blockIdx.x * per_block;
  for (int i = threadIdx.x; i < per_block; i += blockDim.x) dst[i] = tile[per_block - 1 - i];
}

// Writes each block's rank in its cluster: correct only when launched with the captured cluster.
extern "C" __global__ void cluster_ranks(int* __restrict__ out) {
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) out[blockIdx.x] = (int)cluster.block_rank() + 100 * (int)cluster.num_blocks();
}

// Faults on purpose: writes through a pointer it is given (the test passes a bad one).
extern "C" __global__ void write_through(int* p) { p[threadIdx.x] = 1; }
