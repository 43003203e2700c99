// XXH3-128 (seed 0, default secret) of payload frames already on the device, so that staging
// checks frames without the host reading their bytes a second time. Frames of at most 240 bytes
// take other code paths of XXH3; the host hashes those. Bit-exact with xxhash 0.8.
//
// replayfmt_frame_candidates (at the end) finds the words of frames that may be stored pointers.
//
// Eight threads hash one frame, one per XXH3 accumulator; the pairs of lanes that XXH3 mixes
// swap words with a shuffle. Frames must start 8-byte aligned (the host checks).
//
// The PTX next to this file is what replayfmt loads; regenerate it after any change with
//   nvcc -ptx -arch=compute_75 -o frame_digest.ptx frame_digest.cu

typedef unsigned long long u64;

__constant__ unsigned char kSecret[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

#define PRIME32_1 0x9E3779B1ULL
#define PRIME32_2 0x85EBCA77ULL
#define PRIME32_3 0xC2B2AE3DULL
#define PRIME64_1 0x9E3779B185EBCA87ULL
#define PRIME64_2 0xC2B2AE3D27D4EB4FULL
#define PRIME64_3 0x165667B19E3779F9ULL
#define PRIME64_4 0x85EBCA77C2B2AE63ULL
#define PRIME64_5 0x27D4EB2F165667C5ULL
#define PRIME_MX1 0x165667919E3779F9ULL

__device__ __forceinline__ u64 read64(const unsigned char* p) {  // little-endian, any alignment
    u64 v = 0;
#pragma unroll
    for (int b = 7; b >= 0; b--) v = (v << 8) | p[b];
    return v;
}

__device__ __forceinline__ u64 secret64(int offset) { return read64(kSecret + offset); }

// One lane's share of XXH3_accumulate_512: acc[i] += lo32(key) * hi32(key), acc[i ^ 1] += data
__device__ __forceinline__ u64 accumulate(u64 acc, u64 data, u64 key, unsigned group) {
    u64 mixed = data ^ key;
    u64 partner = __shfl_xor_sync(group, data, 1, 8);
    return acc + (mixed & 0xffffffffULL) * (mixed >> 32) + partner;
}

__device__ __forceinline__ u64 fold(u64 a, u64 b) { return a * b ^ __umul64hi(a, b); }

__device__ __forceinline__ u64 avalanche(u64 h) {
    h ^= h >> 37;
    h *= PRIME_MX1;
    return h ^ (h >> 32);
}

__device__ u64 merge(const u64* acc, int secret_offset, u64 start) {
    u64 result = start;
#pragma unroll
    for (int i = 0; i < 4; i++)
        result += fold(acc[2 * i] ^ secret64(secret_offset + 16 * i), acc[2 * i + 1] ^ secret64(secret_offset + 16 * i + 8));
    return avalanche(result);
}

// digests[2k], digests[2k + 1]: the low and high halves of frame k's XXH3-128 (lengths > 240).
extern "C" __global__ void replayfmt_frame_digest(const u64* addresses, const u64* lengths, u64* digests,
                                                  unsigned count) {
    const unsigned thread = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned frame = thread / 8, lane = thread % 8;
    if (frame >= count) return;  // a whole group of eight leaves together
    const unsigned group = 0xffu << (threadIdx.x & 24);
    const unsigned char* input = reinterpret_cast<const unsigned char*>(addresses[frame]);
    const u64 length = lengths[frame];
    const u64 initial[8] = {PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1};
    u64 acc = initial[lane];
    const u64* words = reinterpret_cast<const u64*>(input);
    const u64 blocks = (length - 1) / 1024;
    const u64 scramble_key = secret64(128 + 8 * lane);
    u64 keys[16];
#pragma unroll
    for (int s = 0; s < 16; s++) keys[s] = secret64(8 * (s + lane));
    // the next block's words are loaded while this one is mixed: one thread's chain of blocks is
    // the whole frame, so memory latency, not arithmetic, is what bounds it
    u64 data[16], next[16];
    if (blocks > 0) {
#pragma unroll
        for (int s = 0; s < 16; s++) next[s] = words[8 * s + lane];
    }
    for (u64 n = 0; n < blocks; n++) {
#pragma unroll
        for (int s = 0; s < 16; s++) data[s] = next[s];
        if (n + 1 < blocks) {
            const u64* following = words + (n + 1) * 128;
#pragma unroll
            for (int s = 0; s < 16; s++) next[s] = following[8 * s + lane];
        }
#pragma unroll
        for (int s = 0; s < 16; s++) acc = accumulate(acc, data[s], keys[s], group);
        acc ^= acc >> 47;
        acc ^= scramble_key;
        acc *= PRIME32_1;
    }
    const unsigned stripes = static_cast<unsigned>(((length - 1) - 1024 * blocks) / 64);
    const u64* last_block = words + blocks * 128;
    for (unsigned s = 0; s < stripes; s++) acc = accumulate(acc, last_block[8 * s + lane], secret64(8 * (s + lane)), group);
    acc = accumulate(acc, read64(input + length - 64 + 8 * lane), secret64(192 - 64 - 7 + 8 * lane), group);
    u64 all[8];
#pragma unroll
    for (int i = 0; i < 8; i++) all[i] = __shfl_sync(group, acc, i, 8);
    if (lane == 0) {
        digests[2 * frame] = merge(all, 11, length * PRIME64_1);
        digests[2 * frame + 1] = merge(all, 192 - 64 - 11, ~(length * PRIME64_2));
    }
}

// The 8-byte words of each frame whose values lie in [low, high): the words that may be stored
// pointers (replayfmt.capture.stored_pointers.candidate_words, on the device), so that a
// snapshot's frames are scanned where they are, without crossing the bus first. Frame f's hits
// go to hits[2 * (f * cap + i)] (byte offset in the frame) and hits[... + 1] (the word), in no
// particular order; counts[f] (zeroed by the caller) ends as the number of hits, which may be
// more than cap: the caller then scans that frame on the host. Grid: (any, frames); frames
// start 8-byte aligned.
extern "C" __global__ void replayfmt_frame_candidates(const u64* addresses, const u64* lengths, unsigned frames,
                                                      u64 low, u64 high, unsigned cap, unsigned* counts,
                                                      u64* hits) {
    const unsigned frame = blockIdx.y;
    if (frame >= frames) return;
    const u64* words = reinterpret_cast<const u64*>(addresses[frame]);
    const u64 count = lengths[frame] / 8;
    for (u64 i = blockIdx.x * static_cast<u64>(blockDim.x) + threadIdx.x; i < count;
         i += static_cast<u64>(gridDim.x) * blockDim.x) {
        const u64 word = words[i];
        if (word >= low && word < high) {
            const unsigned slot = atomicAdd(&counts[frame], 1u);
            if (slot < cap) {
                hits[2 * (static_cast<u64>(frame) * cap + slot)] = 8 * i;
                hits[2 * (static_cast<u64>(frame) * cap + slot) + 1] = word;
            }
        }
    }
}
