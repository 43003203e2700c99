// Each block writes its cluster's size and its rank in it: a kernel launched without its cluster
// dimensions writes 1000 + 0 everywhere, so a replay that drops a node's cluster attribute fails.
extern "C" __global__ void cluster_rank(unsigned *out) {
    unsigned rank, size;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(size));
    if (threadIdx.x == 0) out[blockIdx.x] = size * 1000 + rank;
}
