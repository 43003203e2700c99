/* replayfmt's CUDA injection library: records a program that is not Python (a C++ binary, a
 * benchmark, a server) with the same recorder that records Python programs.
 *
 * capture-replay starts the program with CUDA_INJECTION64_PATH naming this library. The CUDA
 * driver loads it inside the program's first cuInit and calls InitializeInjection, before the
 * program's first driver call returns. No driver call is safe there (cuInit is still running),
 * so InitializeInjection only subscribes to CUPTI with a trampoline and enables the driver-API
 * domain. The first driver call after that (cudart's cuDeviceGet or the program's own) reaches
 * the trampoline, which turns the domain off again, starts an embedded CPython (libpython,
 * opened with dlopen: no Python or CUDA headers are needed to build this file) and runs
 * replayfmt.capture.hosted, which builds the Recorder over this library's subscriber: it enables
 * exactly the callbacks the Python recorder enables and hands back the ctypes callbacks the
 * trampoline forwards to (driver and resource domains to the recorder, the NVTX domain to the
 * --scope ranges). At exit an atexit handler closes the recorder (final checkpoint, index,
 * verdict) and writes the report the parent prints; a program that resets its device or destroys
 * its context first (cudaDeviceReset, cuCtxDestroy) has the recorder closed at that call's entry,
 * while its memory still exists.
 *
 * Only one process records: the first that initialises CUDA claims the session directory
 * (O_EXCL); a child it forks or execs, which inherits the environment, is listed, not recorded.
 *
 * Environment (set by replayfmt.capture.injection for the child):
 *   REPLAYFMT_INJECTION_DIR  the session directory (config.json in; claim, others, error, report.json out)
 *   REPLAYFMT_LIBCUPTI       the libcupti the recorder's cupti-python loads (one CUPTI per process)
 *   REPLAYFMT_LIBPYTHON      the shared libpython of the interpreter that runs capture-replay
 *   REPLAYFMT_PYTHONHOME     that interpreter's sys.base_prefix
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <wchar.h>

#define EXPORT __attribute__((visibility("default")))

enum { DOMAIN_DRIVER_API = 1, DOMAIN_RUNTIME_API = 2, DOMAIN_NVTX = 5 };
enum { SITE_ENTER = 0, SITE_EXIT = 1, SYMBOL_NAME_OFFSET = 32, CORRELATION_ID_OFFSET = 64 };  /* CUpti_CallbackData */
#define MAX_CBID 4096
#define REPLAYFMT_INJECTION_ABI 5 /* replayfmt.capture.c_library.INJECTION_ABI: bump both together */
/* CUpti_driver_api_trace_cbid (cupti_driver_cbid.h) */
enum { CBID_INIT = 1, CBID_CTX_DESTROY = 11, CBID_CTX_DESTROY_V2 = 322, CBID_PRIMARY_RESET = 389,
       CBID_PRIMARY_RESET_V2 = 545 };
static const unsigned TEARDOWN[] = {CBID_CTX_DESTROY, CBID_CTX_DESTROY_V2, CBID_PRIMARY_RESET,
                                    CBID_PRIMARY_RESET_V2};
enum { ARMED, STARTING, HOSTING, FAILED, FINISHED };
enum { SLOT_DRIVER = 0, SLOT_NVTX = 1 };

typedef void (*callback_fn)(void *userdata, int domain, unsigned cbid, const void *data);
typedef int (*subscribe_fn)(void **subscriber, callback_fn callback, void *userdata);
typedef int (*enable_domain_fn)(uint32_t enable, void *subscriber, int domain);
typedef int (*enable_callback_fn)(uint32_t enable, void *subscriber, int domain, unsigned cbid);
typedef int (*result_string_fn)(int result, const char **text);

/* The CPython C API, by name: the few stable entry points this file calls. */
typedef int (*py_is_initialized_fn)(void);
typedef void (*py_initialize_ex_fn)(int);
typedef int (*py_run_simple_string_fn)(const char *);
typedef int (*py_gil_ensure_fn)(void);
typedef void (*py_gil_release_fn)(int);
typedef void *(*py_save_thread_fn)(void);
typedef void (*py_set_home_fn)(const wchar_t *);

static atomic_int state = ARMED;
static _Atomic(callback_fn) forward[2];
static void *subscriber;
static enable_domain_fn enable_domain;
static enable_callback_fn enable_callback;
static pid_t owner;
static volatile int forked_child;
static _Thread_local int starting_here;
/* The runtime call (cudaLaunchKernel...) this thread is inside: CUPTI gives the work a runtime
 * call issues that call's correlation id, not the id of the driver call the recorder sees. */
static _Thread_local uint32_t runtime_correlation;
static _Thread_local int runtime_depth;
static unsigned char skip_exit[MAX_CBID];  /* driver calls whose exit the recorder ignores */
static char session[PATH_MAX];
static wchar_t python_home[PATH_MAX];
static py_gil_ensure_fn gil_ensure;
static py_gil_release_fn gil_release;
static py_run_simple_string_fn run_string;

/* Python run inside the program: the recorder's module, found through the parent's sys.path in
 * its order (site-packages folders through site.addsitedir, so that their .pth files, editable
 * installs among them, work as in the parent).
 * It never raises: PyRun_SimpleString would print a traceback, and a SystemExit would end the
 * program; failures go to the session's error file, which the caller checks. */
static const char BOOTSTRAP[] =
    "def _replayfmt_bootstrap(entry):\n"
    "    import json, os, sys\n"
    "    where = os.environ['REPLAYFMT_INJECTION_DIR']\n"
    "    try:\n"
    "        with open(os.path.join(where, 'config.json'), encoding='utf-8') as f:\n"
    "            paths = json.load(f)['sys_path']\n"
    "        import site\n"
    "        own = [p for p in sys.path if p not in paths]\n"
    "        sys.path[:] = list(paths)\n"
    "        for p in paths:\n"
    "            if os.path.basename(p) in ('site-packages', 'dist-packages') and os.path.isdir(p):\n"
    "                site.addsitedir(p)\n"
    "        sys.path += own\n"
    "        import replayfmt.capture.hosted as hosted\n"
    "        getattr(hosted, entry)(where)\n"
    "    except BaseException as exc:\n"
    "        with open(os.path.join(where, 'error'), 'a', encoding='utf-8') as f:\n"
    "            f.write(f'the recorder inside the program failed to {entry}: {type(exc).__name__}: {exc}\\n')\n";

static void note(const char *file, const char *format, ...) {
    char path[PATH_MAX + 16], line[2048];
    va_list args;
    va_start(args, format);
    int n = vsnprintf(line, sizeof line - 1, format, args);
    va_end(args);
    if (n < 0) return;
    if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    snprintf(path, sizeof path, "%s/%s", session, file);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) return;
    ssize_t written = write(fd, line, (size_t)n);  /* one write with O_APPEND: lines never interleave */
    (void)written;
    close(fd);
}

static const char *program_name(char *buffer, size_t size) {
    ssize_t n = readlink("/proc/self/exe", buffer, size - 1);
    buffer[n > 0 ? n : 0] = '\0';
    return buffer;
}

static void after_fork_child(void) { forked_child = 1; }

/* Claims the session for this process: only the first process that initialises CUDA records. */
static int claim(void) {
    char path[PATH_MAX + 16], exe[PATH_MAX];
    snprintf(path, sizeof path, "%s/claim", session);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
        dprintf(fd, "%d\n", (int)getpid());
        close(fd);
        return 1;
    }
    long holder = 0;
    FILE *f = fopen(path, "r");
    if (f) {
        if (fscanf(f, "%ld", &holder) != 1) holder = 0;
        fclose(f);
    }
    if (holder == (long)getpid())
        note("others", "%d\t%s\texec: the recorded process replaced itself with this program; its capture "
             "ended unfinished", (int)getpid(), program_name(exe, sizeof exe));
    else
        note("others", "%d\t%s\tanother process that used CUDA (a child of the recorded one): not recorded",
             (int)getpid(), program_name(exe, sizeof exe));
    return 0;
}

static int has_error(void) {
    char path[PATH_MAX + 16];
    struct stat info;
    snprintf(path, sizeof path, "%s/error", session);
    return stat(path, &info) == 0;
}

static int start_python(const char *entry) {
    const char *library = getenv("REPLAYFMT_LIBPYTHON");
    if (!library || !*library) {
        note("error", "REPLAYFMT_LIBPYTHON is not set: the parent names the shared libpython to embed");
        return -1;
    }
    if (dlsym(RTLD_DEFAULT, "Py_IsInitialized")) {  /* the program is (or embeds) a Python itself */
        note("error", "the program is a Python interpreter (it holds CPython already): run the Python "
             "script itself under capture-replay");
        return -1;
    }
    /* RTLD_GLOBAL: extension modules (ctypes, numpy) take CPython's symbols from the process */
    void *python = dlopen(library, RTLD_NOW | RTLD_GLOBAL);
    if (!python) {
        note("error", "cannot load %s: %s", library, dlerror());
        return -1;
    }
    py_initialize_ex_fn initialize = (py_initialize_ex_fn)dlsym(python, "Py_InitializeEx");
    py_save_thread_fn save_thread = (py_save_thread_fn)dlsym(python, "PyEval_SaveThread");
    py_set_home_fn set_home = (py_set_home_fn)dlsym(python, "Py_SetPythonHome");
    run_string = (py_run_simple_string_fn)dlsym(python, "PyRun_SimpleString");
    gil_ensure = (py_gil_ensure_fn)dlsym(python, "PyGILState_Ensure");
    gil_release = (py_gil_release_fn)dlsym(python, "PyGILState_Release");
    if (!initialize || !save_thread || !run_string || !gil_ensure || !gil_release) {
        note("error", "%s lacks the CPython entry points the recorder needs (Py_InitializeEx, "
             "PyRun_SimpleString, PyGILState_Ensure)", library);
        return -1;
    }
    const char *home = getenv("REPLAYFMT_PYTHONHOME");
    if (home && *home) {
        if (set_home) {  /* Python <= 3.12; later ones read PYTHONHOME */
            mbstowcs(python_home, home, PATH_MAX - 1);
            set_home(python_home);
        } else {
            setenv("PYTHONHOME", home, 1);
        }
    }
    initialize(0);  /* 0: the program keeps its own signal handlers */
    if (set_home == NULL && home && *home) unsetenv("PYTHONHOME");  /* not for the program's children */
    char call[256];
    snprintf(call, sizeof call, "_replayfmt_bootstrap('%s')\n", entry);
    int failed = run_string(BOOTSTRAP) != 0 || run_string(call) != 0 || has_error();
    save_thread();  /* let callbacks on any thread take the GIL */
    return failed ? -1 : 0;
}

/* The first driver call after cuInit: start the recorder, which adopts the subscriber. */
static void start_recorder(void) {
    enable_domain(0, subscriber, DOMAIN_DRIVER_API);  /* the recorder enables the calls it follows */
    int ok = start_python("start") == 0;
    if (ok && enable_callback)  /* the capture closes before the program's context goes away */
        for (size_t i = 0; i < sizeof TEARDOWN / sizeof TEARDOWN[0]; ++i)
            enable_callback(1, subscriber, DOMAIN_DRIVER_API, TEARDOWN[i]);
    atomic_store(&state, ok ? HOSTING : FAILED);
}

static void finish(void);

static int tears_down(int domain, unsigned cbid, const void *data) {
    if (domain != DOMAIN_DRIVER_API || !data || *(const uint32_t *)data != 0) return 0;  /* API entry only */
    for (size_t i = 0; i < sizeof TEARDOWN / sizeof TEARDOWN[0]; ++i)
        if (cbid == TEARDOWN[i]) return 1;
    return 0;
}

static void track_runtime_call(const void *data) {
    if (*(const uint32_t *)data == SITE_ENTER) {
        if (runtime_depth++ == 0)
            runtime_correlation = *(const uint32_t *)((const char *)data + CORRELATION_ID_OFFSET);
    } else if (runtime_depth > 0 && --runtime_depth == 0) {
        runtime_correlation = 0;
    }
}

int launch_ring_record(unsigned cbid, const void *data, uint32_t outer);  /* launch_ring.c */

/* Whether a launch callback launches one of NCCL's kernels (CUpti_CallbackData.symbolName): its
 * exit goes to the recorder, which queues a copy of the call's results after the kernel. A few
 * bytes at the name's start, as replayfmt.capture.nccl_log.NCCL_KERNEL reads it (ncclDevKernel_*,
 * ncclKernel_*, or either mangled: _Z<length>nccl...): never a scan of a long mangled name on every
 * launch's exit, and no program kernel with "nccl" inside its name taken for one. */
static int nccl_kernel(const void *data) {
    const char *s = *(const char *const *)((const char *)data + SYMBOL_NAME_OFFSET);
    if (!s) return 0;
    if (*s == '_') s++;
    if (*s == 'Z') s++;
    while (*s >= '0' && *s <= '9') s++;
    return s[0] == 'n' && s[1] == 'c' && s[2] == 'c' && s[3] == 'l';
}

/* A callback the recorder follows: a launch's exit it ignores is dropped, a launch that repeats
 * one the recorder armed goes into the ring (launch_ring.c), anything else to the recorder. */
static void deliver(void *userdata, int domain, unsigned cbid, const void *data, uint32_t outer) {
    if (domain == DOMAIN_DRIVER_API && data) {
        if (cbid < MAX_CBID && skip_exit[cbid] && *(const uint32_t *)data == SITE_EXIT && !nccl_kernel(data))
            return;  /* a launch's exit in region mode: the recorder would only return */
        if (launch_ring_record(cbid, data, outer)) return;
    }
    callback_fn target = atomic_load_explicit(&forward[domain == DOMAIN_NVTX ? SLOT_NVTX : SLOT_DRIVER],
                                              memory_order_acquire);
    if (target) target(userdata, domain, cbid, data);
}

static void trampoline(void *userdata, int domain, unsigned cbid, const void *data) {
    if (domain == DOMAIN_RUNTIME_API) {
        if (data) track_runtime_call(data);
        return;
    }
    int now = atomic_load_explicit(&state, memory_order_acquire);
    if (now != HOSTING) {
        if (now != ARMED && now != STARTING) return;
        if (starting_here || forked_child) return;  /* the recorder's own calls while it starts */
        if (domain == DOMAIN_DRIVER_API && cbid == CBID_INIT) return;  /* cuInit's exit: not yet */
        int expected = ARMED;
        if (atomic_compare_exchange_strong(&state, &expected, STARTING)) {
            starting_here = 1;
            start_recorder();
            starting_here = 0;
        } else {
            while (atomic_load(&state) == STARTING) sched_yield();  /* another thread starts it */
        }
        if (atomic_load(&state) != HOSTING) return;
    }
    if (forked_child) return;
    if (tears_down(domain, cbid, data)) {  /* cudaDeviceReset, cuCtxDestroy: close while memory lives */
        finish();
        return;
    }
    deliver(userdata, domain, cbid, data, runtime_correlation);
}

static void finish(void) {
    if (forked_child) return;
    int was = atomic_exchange(&state, FINISHED);
    atomic_store(&forward[SLOT_DRIVER], NULL);
    atomic_store(&forward[SLOT_NVTX], NULL);
    if (was == ARMED) {
        note("error", "the program made no CUDA driver call after cuInit: nothing was recorded");
        return;
    }
    if (was != HOSTING) return;
    int gil = gil_ensure();
    run_string("_replayfmt_bootstrap('finish')\n");
    gil_release(gil);
}

/* Called by the CUDA driver inside cuInit (CUDA_INJECTION64_PATH). Returns 1 whatever happens:
 * a recorder that cannot start must never stop the program; the parent reports why. */
EXPORT int InitializeInjection(void) {
    const char *where = getenv("REPLAYFMT_INJECTION_DIR");
    if (!where || !*where || strlen(where) >= sizeof session) return 1;
    strcpy(session, where);
    if (!claim()) return 1;
    owner = getpid();
    pthread_atfork(NULL, NULL, after_fork_child);
    const char *cupti_path = getenv("REPLAYFMT_LIBCUPTI");
    void *cupti = cupti_path && *cupti_path ? dlopen(cupti_path, RTLD_NOW | RTLD_GLOBAL) : NULL;
    if (!cupti) {
        note("error", "cannot load libcupti (%s): %s", cupti_path ? cupti_path : "REPLAYFMT_LIBCUPTI unset",
             cupti_path ? dlerror() : "the parent names it");
        atomic_store(&state, FAILED);
        return 1;
    }
    subscribe_fn subscribe = (subscribe_fn)dlsym(cupti, "cuptiSubscribe");
    enable_domain = (enable_domain_fn)dlsym(cupti, "cuptiEnableDomain");
    enable_callback = (enable_callback_fn)dlsym(cupti, "cuptiEnableCallback");
    result_string_fn result_string = (result_string_fn)dlsym(cupti, "cuptiGetResultString");
    if (!subscribe || !enable_domain) {
        note("error", "%s lacks cuptiSubscribe or cuptiEnableDomain", cupti_path);
        atomic_store(&state, FAILED);
        return 1;
    }
    int result = subscribe(&subscriber, trampoline, NULL);
    if (result == 0) result = enable_domain(1, subscriber, DOMAIN_DRIVER_API);
    /* the runtime domain (followed in C only, for correlation ids) is enabled here, before the
     * runtime's own initialisation goes on, in case a runtime settles then whether it reports
     * its calls to CUPTI (enabled later, at the recorder's start, no work a runtime call issued
     * could be bound to that call; whether enabling it here is enough is not yet checked on a
     * GPU) */
    if (result == 0) result = enable_domain(1, subscriber, DOMAIN_RUNTIME_API);
    if (result != 0) {
        const char *text = NULL;
        if (result_string) result_string(result, &text);
        note("error", "cannot subscribe to CUPTI: %s%s", text ? text : "error",
             result == 39 ? " (another CUPTI client is subscribed: nsys, ncu or a profiler)" : "");
        atomic_store(&state, FAILED);
        return 1;
    }
    atexit(finish);  /* before the program's own static destructors and cudart's teardown */
    return 1;
}

/* The interface version between this library and replayfmt.capture.injection. */
EXPORT int replayfmt_injection_abi(void) { return REPLAYFMT_INJECTION_ABI; }

/* For the hosted recorder (ctypes): the CUPTI subscriber this library holds. */
EXPORT void *replayfmt_injection_subscriber(void) { return subscriber; }

/* For the hosted recorder (ctypes): where the trampoline forwards a domain's callbacks
 * (slot 0: driver API and resource domains; slot 1: NVTX); NULL stops forwarding. */
EXPORT int replayfmt_injection_forward(int slot, callback_fn target) {
    if (slot != SLOT_DRIVER && slot != SLOT_NVTX) return -1;
    atomic_store_explicit(&forward[slot], target, memory_order_release);
    return 0;
}

/* For the hosted recorder (ctypes): the correlation id of the runtime call this thread is in
 * (0: none), which the kernels, copies and memsets that call issues carry in CUPTI's records. */
EXPORT uint32_t replayfmt_injection_runtime_correlation(void) { return runtime_correlation; }

/* For the recorder (ctypes): whether to drop the exit of driver call ``cbid`` (the recorder
 * ignores it: launches in region mode), which saves a callback into Python a launch. A later
 * recorder in the same process (kernel mode) says again. */
EXPORT int replayfmt_injection_skip_exit(unsigned cbid, int skip) {
    if (cbid >= MAX_CBID) return -1;
    skip_exit[cbid] = skip != 0;
    return 0;
}

/* The CUPTI callback a Python program's recorder subscribes with (replayfmt.capture.launch_ring):
 * the same filtering and ring as the trampoline's, then the recorder's ctypes callback (slot 0). */
EXPORT void replayfmt_recorder_callback(void *userdata, int domain, unsigned cbid, const void *data) {
    deliver(userdata, domain, cbid, data, 0);
}

/* Diagnostics without CUDA: start the embedded interpreter as a recording would, run
 * replayfmt.capture.hosted.probe (it writes probe.json into the session directory), and return 0
 * when it ran. The CPU tests drive the embedding through it. */
EXPORT int replayfmt_injection_probe(void) {
    const char *where = getenv("REPLAYFMT_INJECTION_DIR");
    if (!where || !*where || strlen(where) >= sizeof session) return -1;
    strcpy(session, where);
    return start_python("probe");
}
