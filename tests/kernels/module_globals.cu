// Module globals as a library keeps them (cuFFT's base pointer): a __device__ pointer and a
// __constant__ table the host writes, and a counter the kernel itself bumps. The recorder reads
// their names from this cubin's symbol table (tests/test_module_globals.py).
__device__ const float* base;
__constant__ float scale[4];
__device__ unsigned int calls;

extern "C" __global__ void gather(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = base[i] * scale[i % 4] + 1.0f;
    if (i == 0) atomicAdd(&calls, 1u);
}
