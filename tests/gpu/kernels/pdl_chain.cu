// Kernels for programmatic dependent launch (PDL, sm_90 and newer): y = a * x + y, each waiting for
// the previous kernel on its stream's results (griddepcontrol.wait) before it touches memory.
// axpy_early also lets the next kernel launch at once (griddepcontrol.launch_dependents), so two
// launches that allow PDL overlap; axpy triggers only at its end (a programmatic event it records
// fires then). Before sm_90 the instructions are left out: the kernels run one after the other.
__device__ __forceinline__ void wait_for_previous() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void let_next_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

extern "C" __global__ void axpy_early(float a, const float* __restrict__ x, float* __restrict__ y, int n) {
    wait_for_previous();
    let_next_launch();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void axpy(float a, const float* __restrict__ x, float* __restrict__ y, int n) {
    wait_for_previous();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
