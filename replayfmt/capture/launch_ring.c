/* Repeated launches recorded without entering Python: the recorder's hot path in C.
 *
 * A program's steady state launches the same kernels on the same buffers over and over. The
 * first such launch goes through the Python recorder (replayfmt.capture.cupti_source and the
 * translator): it decodes the arguments, relocates the pointers, snapshots what the kernel reads
 * and writes the launch. When nothing about it needs the recorder's judgement the next time (its
 * buffers are touched already, the region is open, no stream capture runs), the translator *arms*
 * the function with its argument bytes. From then on the CUPTI callback of a launch of that
 * function with the same argument bytes is answered here: its shape, stream, correlation ids and
 * CUPTI's clock go into a ring, and the program goes on without a call into Python. The recorder
 * takes the ring (replayfmt.capture.launch_ring) at its next callback, and before anything that
 * changes what a launch means (every other driver call the recorder follows, a region or scope
 * starting or ending) it takes the ring and disarms every function at once: C never judges a
 * launch, it only recognises a repeat of one Python judged, in the same state.
 *
 * Both the injection library's trampoline (inject.c) and a Python program's recorder (which
 * subscribes with replayfmt_recorder_callback, inject.c) call launch_ring_record first.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_CBID 4096
#define RING_CAPACITY 8192
#define ARMED_SLOTS 1024 /* a power of two */
#define MAX_PARAMETERS 256
#define MAX_ARGUMENT_BYTES 32764 /* CUDA's limit on a kernel's parameters */

enum { KIND_NONE = 0, KIND_KERNEL = 1, KIND_KERNEL_EX = 2, KIND_COOPERATIVE = 3 };
/* CUlaunchAttribute ids: cooperative, cluster dimension, programmatic stream serialization (PDL);
 * the programmatic and launch completion events, for which the recorder writes an event record
 * after the launch (Python's work: such a launch is never answered here) */
enum {
    ATTRIBUTE_COOPERATIVE = 2,
    ATTRIBUTE_CLUSTER = 4,
    ATTRIBUTE_PROGRAMMATIC = 6,
    ATTRIBUTE_PROGRAMMATIC_EVENT = 7,
    ATTRIBUTE_LAUNCH_COMPLETION_EVENT = 12,
    ATTRIBUTE_SIZE = 72
};
enum { FLAG_COOPERATIVE = 1, FLAG_PROGRAMMATIC = 4 }; /* as replayfmt.capture.launch_ring's */

/* One launch answered here. The layout is replayfmt.capture.launch_ring.RING_DTYPE's. */
typedef struct {
    uint64_t function;
    uint64_t stream;
    uint64_t timestamp; /* CUPTI's clock at the call (0: no clock given) */
    uint32_t grid[3], block[3], cluster[3];
    uint32_t shared_memory;
    uint32_t flags;
    uint32_t correlation; /* CUPTI's id of the driver call */
    uint32_t outer;       /* the runtime call's id around it (injection library), else 0 */
    uint32_t armed;       /* which arming this launch repeats */
} ring_launch;

typedef struct {
    uint64_t function; /* 0: empty */
    uint32_t generation;
    uint32_t armed;
    uint32_t count;
    uint32_t size;
    uint32_t layout[2 * MAX_PARAMETERS]; /* offset, size of each parameter */
    unsigned char *bytes;                /* the argument block, laid out by layout */
} armed_function;

typedef int (*clock_fn)(uint64_t *);

/* The CUPTI callback data and parameter structs (x86-64, cupti_callbacks.h and
 * generated_cuda_meta.h): read at the same offsets replayfmt.capture.cupti_source reads. */
typedef struct {  /* how both launch calls give a launch's shape */
    uint32_t grid[3], block[3], shared_memory;
    uint32_t pad;
    uint64_t stream;
} launch_shape;

typedef struct {
    uint64_t f;
    launch_shape shape;
    uint64_t kernel_params, extra;
} launch_kernel_params;

typedef struct {
    uint64_t config, f, kernel_params, extra;
} launch_ex_params;

typedef struct {
    launch_shape shape;
    uint64_t attributes;
    uint32_t attribute_count;
} launch_config;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned char kind_of[MAX_CBID];
static ring_launch ring[RING_CAPACITY];
static armed_function armed[ARMED_SLOTS];
static uint32_t generation = 1, arm_count, occupied;
static uint32_t next_arm = 1;
static clock_fn cupti_clock;

/* Launches in the ring, not yet taken: read without the lock by the recorder as a hint. */
EXPORT volatile uint32_t replayfmt_launches_pending;

/* Say which driver callback id is which launch call (kind 1: cuLaunchKernel and its _ptsz,
 * 2: cuLaunchKernelEx, 3: cuLaunchCooperativeKernel; 0: none). */
EXPORT int replayfmt_launches_call(unsigned cbid, int kind) {
    if (cbid >= MAX_CBID || kind < KIND_NONE || kind > KIND_COOPERATIVE) return -1;
    kind_of[cbid] = (unsigned char)kind;
    return 0;
}

/* CUPTI's clock (cuptiGetTimestamp), read at each launch recorded here; NULL: none. */
EXPORT void replayfmt_launches_clock(clock_fn clock) { cupti_clock = clock; }

static armed_function *find(uint64_t function) {
    for (uint32_t i = 0, at = (uint32_t)(function >> 4); i < ARMED_SLOTS; ++i) {
        armed_function *slot = &armed[(at + i) & (ARMED_SLOTS - 1)];
        if (slot->function == function || slot->function == 0) return slot;
    }
    return NULL;
}

static void forget_all(void) {
    for (uint32_t i = 0; i < ARMED_SLOTS; ++i) {
        free(armed[i].bytes);
        memset(&armed[i], 0, sizeof armed[i]);
    }
    arm_count = occupied = 0;
}

/* Arm ``function``: its launches whose arguments, laid out by ``layout`` (offset, size pairs),
 * equal ``bytes`` are recorded in the ring from now until the next disarm. Returns the arming's
 * id (never 0), or 0 when it cannot be armed (too many parameters or bytes). */
EXPORT uint32_t replayfmt_launches_arm(uint64_t function, const uint32_t *layout, uint32_t count,
                                       const void *bytes, uint32_t size) {
    if (function == 0 || count > MAX_PARAMETERS || size > MAX_ARGUMENT_BYTES) return 0;
    for (uint32_t i = 0; i < count; ++i)
        if ((uint64_t)layout[2 * i] + layout[2 * i + 1] > size) return 0;
    unsigned char *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, bytes, size);
    pthread_mutex_lock(&lock);
    if (occupied >= ARMED_SLOTS / 2) forget_all();  /* half full (stale slots too): start again */
    armed_function *slot = find(function);  /* never NULL: at most half the slots are taken */
    if (slot->function == 0) ++occupied;
    if (slot->function == 0 || slot->generation != generation) ++arm_count;
    free(slot->bytes);
    slot->function = function;
    slot->generation = generation;
    slot->armed = next_arm++;
    if (next_arm == 0) next_arm = 1;
    slot->count = count;
    slot->size = size;
    memcpy(slot->layout, layout, sizeof(uint32_t) * 2 * count);
    slot->bytes = copy;
    uint32_t id = slot->armed;
    pthread_mutex_unlock(&lock);
    return id;
}

/* Withdraw every arming (a new generation: the slots of the old one match no launch again). */
static void withdraw_all(void) {
    if (++generation == 0) {  /* wrapped: stale slots could match again */
        forget_all();
        generation = 1;
    }
    arm_count = 0;
}

/* Take every launch in the ring into ``out`` (room for replayfmt_launches_capacity()), oldest
 * first; with ``disarm``, also disarm every function in the same step, so that no launch
 * recorded later repeats an arming made before. */
EXPORT uint32_t replayfmt_launches_take(ring_launch *out, int disarm) {
    pthread_mutex_lock(&lock);
    uint32_t n = replayfmt_launches_pending;
    memcpy(out, ring, sizeof(ring_launch) * n);
    replayfmt_launches_pending = 0;
    if (disarm) withdraw_all();
    pthread_mutex_unlock(&lock);
    return n;
}

/* Withdraw every arming, leaving the launches in the ring for the next take (they were recorded
 * while their armings held). */
EXPORT void replayfmt_launches_withdraw(void) {
    pthread_mutex_lock(&lock);
    withdraw_all();
    pthread_mutex_unlock(&lock);
}

EXPORT uint32_t replayfmt_launches_capacity(void) { return RING_CAPACITY; }

EXPORT uint32_t replayfmt_launches_record_size(void) { return (uint32_t)sizeof(ring_launch); }

static void take_shape(ring_launch *launch, const launch_shape *shape) {
    memcpy(launch->grid, shape->grid, sizeof launch->grid);
    memcpy(launch->block, shape->block, sizeof launch->block);
    launch->shared_memory = shape->shared_memory;
    launch->stream = shape->stream;
}

static int same_arguments(const armed_function *slot, const uint64_t *pointers) {
    for (uint32_t i = 0; i < slot->count; ++i) {
        const void *argument = (const void *)(uintptr_t)pointers[i];
        if (!argument || memcmp(slot->bytes + slot->layout[2 * i], argument, slot->layout[2 * i + 1]) != 0)
            return 0;
    }
    return 1;
}

/* The launch whose CUPTI driver callback this is, recorded in the ring when it repeats an armed
 * one: 1 (the recorder needs no call), else 0. ``outer``: the runtime call's correlation id. */
int launch_ring_record(unsigned cbid, const void *data, uint32_t outer) {
    if (cbid >= MAX_CBID || !kind_of[cbid] || !data) return 0;
    if (*(const uint32_t *)data != 0) return 0;  /* the call's exit */
    const void *params = *(const void *const *)((const char *)data + 16);  /* functionParams */
    if (!params) return 0;
    ring_launch launch;
    memset(&launch, 0, sizeof launch);
    uint64_t kernel_params;
    if (kind_of[cbid] == KIND_KERNEL_EX) {
        const launch_ex_params *p = params;
        const launch_config *config = (const launch_config *)(uintptr_t)p->config;
        if (!config) return 0;
        launch.function = p->f;
        kernel_params = p->kernel_params;
        take_shape(&launch, &config->shape);
        const unsigned char *attribute = (const unsigned char *)(uintptr_t)config->attributes;
        uint32_t attributes = config->attribute_count < 64 ? config->attribute_count : 64;
        for (uint32_t i = 0; attribute && i < attributes; ++i, attribute += ATTRIBUTE_SIZE) {
            uint32_t id = *(const uint32_t *)attribute;
            if (id == ATTRIBUTE_CLUSTER) memcpy(launch.cluster, attribute + 8, sizeof launch.cluster);
            else if (id == ATTRIBUTE_COOPERATIVE && *(const int32_t *)(attribute + 8))
                launch.flags |= FLAG_COOPERATIVE;
            else if (id == ATTRIBUTE_PROGRAMMATIC && *(const int32_t *)(attribute + 8))
                launch.flags |= FLAG_PROGRAMMATIC;
            else if (id == ATTRIBUTE_PROGRAMMATIC_EVENT || id == ATTRIBUTE_LAUNCH_COMPLETION_EVENT) return 0;
        }
    } else {
        const launch_kernel_params *p = params;
        launch.function = p->f;
        kernel_params = p->kernel_params;
        take_shape(&launch, &p->shape);
        if (kind_of[cbid] == KIND_COOPERATIVE) launch.flags |= FLAG_COOPERATIVE;
        else if (p->extra) return 0;  /* arguments in one packed buffer: the recorder reads them */
    }
    if (!kernel_params) return 0;
    launch.correlation = *(const uint32_t *)((const char *)data + 64);
    launch.outer = outer;
    int recorded = 0;
    pthread_mutex_lock(&lock);
    if (arm_count && replayfmt_launches_pending < RING_CAPACITY) {
        armed_function *slot = find(launch.function);
        if (slot && slot->function == launch.function && slot->generation == generation &&
            same_arguments(slot, (const uint64_t *)(uintptr_t)kernel_params)) {
            launch.armed = slot->armed;
            if (cupti_clock) cupti_clock(&launch.timestamp);
            ring[replayfmt_launches_pending] = launch;
            ++replayfmt_launches_pending;
            recorded = 1;
        }
    }
    pthread_mutex_unlock(&lock);
    return recorded;
}
