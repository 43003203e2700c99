/* The replay's issue loop, compiled: runs of prepared driver calls (launches, event records,
 * stream waits, copies, memsets) issued from one C loop instead of one Python call each.
 *
 * Through cuda-python a launch costs the host about 7 us on an H100 machine, as long as the
 * kernels of a training step take on the device: eager replay then keeps the device waiting.
 * replayfmt/replay/issue.py packs each call's arguments (handles, shapes, addresses, as integers)
 * into struct issue_call rows once, and hands this loop the driver's own entry points (from
 * cuGetProcAddress), so a call here costs what the driver costs.
 *
 * No CUDA headers: the entry points' signatures are written out below from the driver API
 * (CUresult is an int; handles and device pointers are pointer-sized). Built by setup.py into
 * replayfmt/replay/_issue*.so; without it the replay issues from Python. */

#include <stddef.h>
#include <stdint.h>

#define ISSUE_ABI 1
#define EXPORT __attribute__((visibility("default")))

enum issue_kind {
    ISSUE_LAUNCH = 0,       /* cuLaunchKernel(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra) */
    ISSUE_LAUNCH_EX = 1,    /* cuLaunchKernelEx(config, f, params, extra) */
    ISSUE_EVENT_RECORD = 2, /* cuEventRecord(event, stream) */
    ISSUE_STREAM_WAIT = 3,  /* cuStreamWaitEvent(stream, event, flags) */
    ISSUE_COPY_HTOD = 4,    /* cuMemcpyHtoDAsync(dst, src, bytes, stream) */
    ISSUE_COPY_DTOD = 5,    /* cuMemcpyDtoDAsync(dst, src, bytes, stream) */
    ISSUE_COPY_DTOH = 6,    /* cuMemcpyDtoHAsync(dst, src, bytes, stream) */
    ISSUE_MEMSET_8 = 7,     /* cuMemsetD8Async(dst, value, count, stream) */
    ISSUE_MEMSET_16 = 8,    /* cuMemsetD16Async */
    ISSUE_MEMSET_32 = 9,    /* cuMemsetD32Async */
    ISSUE_KINDS = 10
};

struct issue_call { /* 96 bytes: the kind, then its arguments in the driver call's order */
    uint64_t kind;
    uint64_t a[11];
};

typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                         void **, void **);
typedef int (*launch_ex_fn)(const void *, void *, void **, void **);
typedef int (*record_fn)(void *, void *);
typedef int (*wait_fn)(void *, void *, unsigned);
typedef int (*copy_htod_fn)(uint64_t, const void *, size_t, void *);
typedef int (*copy_dtod_fn)(uint64_t, uint64_t, size_t, void *);
typedef int (*copy_dtoh_fn)(void *, uint64_t, size_t, void *);
typedef int (*memset8_fn)(uint64_t, unsigned char, size_t, void *);
typedef int (*memset16_fn)(uint64_t, unsigned short, size_t, void *);
typedef int (*memset32_fn)(uint64_t, unsigned int, size_t, void *);

EXPORT int replayfmt_issue_abi(void) { return ISSUE_ABI; }

/* Issue calls[0..n) in order through entries[kind] (the driver's entry point of each kind).
 * Returns n when every call returned CUDA_SUCCESS (0); else the index of the first call that did
 * not, its result in *result (-1: a kind this loop does not know, or no entry point for it). */
EXPORT int64_t replayfmt_issue(const struct issue_call *calls, int64_t n, void *const *entries, int *result) {
    *result = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint64_t kind = calls[i].kind;
        const uint64_t *a = calls[i].a;
        void *entry = kind < ISSUE_KINDS ? entries[kind] : NULL;
        int r;
        if (!entry) {
            *result = -1;
            return i;
        }
        switch (kind) {
        case ISSUE_LAUNCH:
            r = ((launch_fn)entry)((void *)a[0], (unsigned)a[1], (unsigned)a[2], (unsigned)a[3], (unsigned)a[4],
                                   (unsigned)a[5], (unsigned)a[6], (unsigned)a[7], (void *)a[8], (void **)a[9],
                                   (void **)a[10]);
            break;
        case ISSUE_LAUNCH_EX:
            r = ((launch_ex_fn)entry)((const void *)a[0], (void *)a[1], (void **)a[2], (void **)a[3]);
            break;
        case ISSUE_EVENT_RECORD:
            r = ((record_fn)entry)((void *)a[0], (void *)a[1]);
            break;
        case ISSUE_STREAM_WAIT:
            r = ((wait_fn)entry)((void *)a[0], (void *)a[1], (unsigned)a[2]);
            break;
        case ISSUE_COPY_HTOD:
            r = ((copy_htod_fn)entry)(a[0], (const void *)a[1], (size_t)a[2], (void *)a[3]);
            break;
        case ISSUE_COPY_DTOD:
            r = ((copy_dtod_fn)entry)(a[0], a[1], (size_t)a[2], (void *)a[3]);
            break;
        case ISSUE_COPY_DTOH:
            r = ((copy_dtoh_fn)entry)((void *)a[0], a[1], (size_t)a[2], (void *)a[3]);
            break;
        case ISSUE_MEMSET_8:
            r = ((memset8_fn)entry)(a[0], (unsigned char)a[1], (size_t)a[2], (void *)a[3]);
            break;
        case ISSUE_MEMSET_16:
            r = ((memset16_fn)entry)(a[0], (unsigned short)a[1], (size_t)a[2], (void *)a[3]);
            break;
        default: /* ISSUE_MEMSET_32 */
            r = ((memset32_fn)entry)(a[0], (unsigned int)a[1], (size_t)a[2], (void *)a[3]);
            break;
        }
        if (r != 0) {
            *result = r;
            return i;
        }
    }
    return n;
}
