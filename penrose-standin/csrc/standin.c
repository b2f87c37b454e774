/*
 * Penrose stand-in libcuda: a test-only shared library installed as `libcuda.so.1`.
 *
 * It exports the real CUDA driver API symbol names with their real C signatures (argument
 * order and widths as in cuda.h), so that uprobes attached to it read the same registers and
 * stack slots they would read on a real driver. It launches nothing: each launch entry point
 * checks its arguments like a driver would, counts the launch per entry point and appends a
 * counter record to a shared-memory ring (`/dev/shm/penrose-standin-<pid>`) that the agent's
 * stand-in counter source reads. The layout of that ring is mirrored by
 * `penrose-standin-ring/src/lib.rs` (the agent and this crate's tests read it through that
 * crate); change both together and bump PENROSE_RING_VERSION.
 *
 * Nothing here is part of the product; docs/standin.md describes the ABI.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
/* Launch entry points must stay real, separate functions: uprobes attach to their addresses. */
#define PROBED __attribute__((visibility("default"), noinline, used))

/* ---- CUDA driver API types (the subset a replay needs, as cuda.h declares them) ---- */

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef struct CUstream_st *CUstream;
typedef struct CUgraphExec_st *CUgraphExec;
typedef int CUjit_option;
typedef int CUlibraryOption;

typedef struct CUlaunchAttribute_st CUlaunchAttribute;

typedef struct CUlaunchConfig_st {
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_IMAGE 200
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_OPERATING_SYSTEM 304
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_FOUND 500

/* ---- Launch entry points, counted separately (order mirrored by EntryPoint in abi.rs) ---- */

enum penrose_entry {
    ENTRY_LAUNCH_KERNEL = 0,
    ENTRY_LAUNCH_KERNEL_PTSZ,
    ENTRY_LAUNCH_KERNEL_EX,
    ENTRY_LAUNCH_KERNEL_EX_PTSZ,
    ENTRY_LAUNCH_COOPERATIVE_KERNEL,
    ENTRY_LAUNCH_COOPERATIVE_KERNEL_PTSZ,
    ENTRY_GRAPH_LAUNCH,
    ENTRY_GRAPH_LAUNCH_PTSZ,
    ENTRY_COUNT
};

/* volatile + atomic adds: the compiler can neither drop nor merge the counting. */
static volatile uint64_t launch_counts[ENTRY_COUNT];
static volatile int initialized;
/* Calls of the public name functions (cuModuleGetFunction, cuLibraryGetKernel,
 * cuKernelGetFunction), whatever their result: the runtime's private path must leave it alone. */
static volatile uint64_t name_calls;
/* Distinct kernels made through the private path (penrose_standin_private_kernel). */
static volatile uint64_t private_kernels;

/* ---- Function handles: one object per (module or library, name) ---- */

#define FUNCTION_MAGIC 0x50524e46554e4331ull /* "PRNFUNC1" */
#define KERNEL_MAGIC 0x50524e4b45524e31ull   /* "PRNKERN1" */
#define OWNER_MAGIC 0x50524e4d4f443031ull    /* "PRNMOD01" */

struct owner {
    uint64_t magic;
    uint64_t id;
};

struct function {
    uint64_t magic;
    const struct owner *owner;
    char *name;
};

struct kernel {
    uint64_t magic;
    struct function *function;
};

struct entry {
    struct function function;
    struct kernel kernel;
    struct entry *next;
};

/*
 * Handles live in fixed arrays, so that a handle can be validated by its address without
 * dereferencing a pointer the caller made up (a real driver also refuses foreign handles).
 */
#define MAX_FUNCTIONS 65536
#define MAX_OWNERS 4096
#define TABLE_BUCKETS 4096
static struct entry entries[MAX_FUNCTIONS];
static struct owner owners[MAX_OWNERS];
static struct entry *table[TABLE_BUCKETS];
static uint64_t function_count; /* entries[0..function_count) are in use */
static uint64_t owner_count;    /* owners[0..owner_count) are in use */
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t hash_name(const struct owner *owner, const char *name) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)(uintptr_t)owner;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 1099511628211ull;
    }
    return h;
}

/* The function object for (owner, name), created on first use so handles are stable. */
static struct entry *lookup(const struct owner *owner, const char *name, int *created) {
    uint64_t bucket = hash_name(owner, name) % TABLE_BUCKETS;
    pthread_mutex_lock(&table_lock);
    struct entry *e = table[bucket];
    while (e && !(e->function.owner == owner && strcmp(e->function.name, name) == 0))
        e = e->next;
    if (!e && function_count < MAX_FUNCTIONS) {
        char *copy = strdup(name);
        if (copy) {
            e = &entries[function_count];
            e->function.owner = owner;
            e->function.name = copy;
            e->function.magic = FUNCTION_MAGIC;
            e->kernel.function = &e->function;
            e->kernel.magic = KERNEL_MAGIC;
            e->next = table[bucket];
            table[bucket] = e;
            __atomic_store_n(&function_count, function_count + 1, __ATOMIC_RELEASE);
            if (created)
                *created = 1;
        }
    }
    pthread_mutex_unlock(&table_lock);
    return e;
}

static struct owner *new_owner(const void *image) {
    if (!image)
        return NULL;
    struct owner *o = NULL;
    pthread_mutex_lock(&table_lock);
    if (owner_count < MAX_OWNERS) {
        o = &owners[owner_count];
        o->id = owner_count + 1;
        o->magic = OWNER_MAGIC;
        __atomic_store_n(&owner_count, owner_count + 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&table_lock);
    return o;
}

/* Whether p is the address of member `offset` of a used element of an array. */
static int in_array(const void *p, const void *array, size_t size, size_t offset,
                    uint64_t *count) {
    uintptr_t base = (uintptr_t)array + offset, a = (uintptr_t)p;
    if (a < base || (a - base) % size != 0)
        return 0;
    return (a - base) / size < __atomic_load_n(count, __ATOMIC_ACQUIRE);
}

static int valid_owner(const void *p) {
    return in_array(p, owners, sizeof owners[0], 0, &owner_count);
}

static int valid_function(const void *p) {
    return in_array(p, entries, sizeof entries[0], offsetof(struct entry, function),
                    &function_count);
}

static int valid_kernel(const void *p) {
    return in_array(p, entries, sizeof entries[0], offsetof(struct entry, kernel),
                    &function_count);
}

/* ---- Counter ring (mirrored by penrose-standin-ring/src/lib.rs) ---- */

#define PENROSE_RING_MAGIC 0x31474e4952534e50ull /* "PNSRING1" little-endian */
#define PENROSE_RING_VERSION 2u
#define PENROSE_RING_CAPACITY 65536u /* records; a power of two */

/* Bits of `present`: which trace fields the replayer passed for this launch. */
#define PRESENT_DURATION 1u
#define PRESENT_OCCUPANCY 2u
#define PRESENT_BLOCKS_PER_SM 4u
#define PRESENT_REGISTERS 8u
#define PRESENT_SHARED_MEMORY 16u

struct ring_header {            /* 64 bytes */
    uint64_t magic;             /* PENROSE_RING_MAGIC once the ring is ready */
    uint32_t version;
    uint32_t record_size;       /* sizeof(struct ring_record) */
    uint32_t capacity;          /* records */
    uint32_t pid;
    uint64_t head;              /* records ever written; store-release after each record */
    uint64_t reserved[4];
};

struct ring_record {            /* 80 bytes */
    uint64_t seq;               /* index + 1 when complete; 0 while being written */
    uint64_t function;          /* CUfunction (CUgraphExec for a graph launch) */
    uint64_t stream;            /* CUstream */
    uint64_t duration_ns;
    double est_achieved_occupancy_pct;
    double blocks_per_sm;
    uint32_t registers_per_thread;
    uint32_t shared_memory_bytes;
    uint32_t entry;             /* enum penrose_entry */
    uint32_t present;           /* PRESENT_* bits */
    uint64_t timestamp_ns;      /* CLOCK_MONOTONIC, read under ring_lock (never decreases) */
    uint32_t tid;               /* the launching thread */
    uint32_t reserved;
};

_Static_assert(sizeof(struct ring_header) == 64, "ring header layout");
_Static_assert(sizeof(struct ring_record) == 80, "ring record layout");

/* What the replayer passes before a launch (mirrored by NextCounters in abi.rs). */
struct penrose_standin_counters {
    uint64_t duration_ns;
    double est_achieved_occupancy_pct;
    double blocks_per_sm;
    uint32_t registers_per_thread;
    uint32_t shared_memory_bytes;
    uint32_t present;
    uint32_t reserved;
};

static struct ring_header *ring;
static struct ring_record *ring_records;
static pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread struct penrose_standin_counters next_counters;
/* The thread's id, looked up once per thread (a gettid syscall per launch would cost more
 * than the launch). */
static __thread uint32_t thread_id;

/* Rings outlive processes that die without cleaning up (killed by a test, or run with
 * --keep-ring and never read). Left alone they fill /dev/shm (5 MiB each, in memory) and, once
 * pids wrap, a new process with an old pid looks as if it had already started to launch. So a
 * new ring first removes this user's rings whose process is gone and which nobody has written
 * for a minute (a reader may still drain a ring of a process that just exited). */
static void ring_sweep_stale(void) {
    DIR *dir = opendir("/dev/shm");
    if (!dir)
        return;
    time_t now = time(NULL);
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        int pid;
        char tail;
        if (sscanf(e->d_name, "penrose-standin-%d%c", &pid, &tail) != 1 || pid <= 0)
            continue;
        if (kill(pid, 0) == 0 || errno != ESRCH)
            continue;
        struct stat st;
        if (fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || now - st.st_mtime < 60)
            continue;
        unlinkat(dirfd(dir), e->d_name, 0);
    }
    closedir(dir);
}

/* One ring per process, named by pid: load one copy of the stand-in per process. */
static int ring_open(void) {
    ring_sweep_stale();
    char name[64];
    snprintf(name, sizeof name, "/penrose-standin-%d", (int)getpid());
    int fd = shm_open(name, O_CREAT | O_RDWR | O_TRUNC, 0600);
    if (fd < 0)
        return -1;
    size_t size = sizeof(struct ring_header) + (size_t)PENROSE_RING_CAPACITY * sizeof(struct ring_record);
    if (ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        shm_unlink(name);
        return -1;
    }
    void *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        shm_unlink(name);
        return -1;
    }
    ring = map;
    ring_records = (struct ring_record *)(ring + 1);
    ring->version = PENROSE_RING_VERSION;
    ring->record_size = sizeof(struct ring_record);
    ring->capacity = PENROSE_RING_CAPACITY;
    ring->pid = (uint32_t)getpid();
    __atomic_store_n(&ring->head, 0, __ATOMIC_RELAXED);
    /* Readers wait for the magic: everything above is visible once it is. */
    __atomic_store_n(&ring->magic, PENROSE_RING_MAGIC, __ATOMIC_RELEASE);
    return 0;
}

/* Appends one record (a seqlock per slot: seq 0 while written, index + 1 when complete). */
static void ring_write(enum penrose_entry entry, const void *function, CUstream stream) {
    struct penrose_standin_counters c = next_counters;
    memset(&next_counters, 0, sizeof next_counters);
    if (!ring)
        return;
    pthread_mutex_lock(&ring_lock);
    uint64_t index = __atomic_load_n(&ring->head, __ATOMIC_RELAXED);
    struct ring_record *r = &ring_records[index & (PENROSE_RING_CAPACITY - 1)];
    __atomic_store_n(&r->seq, 0, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    r->function = (uint64_t)(uintptr_t)function;
    r->stream = (uint64_t)(uintptr_t)stream;
    r->duration_ns = c.duration_ns;
    r->est_achieved_occupancy_pct = c.est_achieved_occupancy_pct;
    r->blocks_per_sm = c.blocks_per_sm;
    r->registers_per_thread = c.registers_per_thread;
    r->shared_memory_bytes = c.shared_memory_bytes;
    r->entry = (uint32_t)entry;
    r->present = c.present;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    r->timestamp_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
    if (thread_id == 0)
        thread_id = (uint32_t)syscall(SYS_gettid);
    r->tid = thread_id;
    r->reserved = 0;
    __atomic_store_n(&r->seq, index + 1, __ATOMIC_RELEASE);
    __atomic_store_n(&ring->head, index + 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&ring_lock);
}

/* ---- Initialisation, devices, contexts ---- */

EXPORT CUresult cuInit(unsigned int Flags) {
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&init_lock);
    if (!initialized) {
        if (ring_open() != 0)
            rc = CUDA_ERROR_OPERATING_SYSTEM;
        else
            initialized = 1;
    }
    pthread_mutex_unlock(&init_lock);
    return rc;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = 0;
    return CUDA_SUCCESS;
}

static struct CUctx_st {
    uint64_t magic;
} the_context = {0x50524e4354583031ull};

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *pctx = &the_context;
    return CUDA_SUCCESS;
}

/* The pre-3.2 name, still exported by real drivers for old binaries. */
EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    return cuCtxCreate_v2(pctx, flags, dev);
}

/* ---- Modules and the CUDA 12 library API ---- */

EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!module)
        return CUDA_ERROR_INVALID_VALUE;
    if (!image)
        return CUDA_ERROR_INVALID_IMAGE;
    struct owner *o = new_owner(image);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *module = (CUmodule)o;
    return CUDA_SUCCESS;
}

/* The name probe's target: entry reads `name` and the out-pointer, return reads *hfunc. */
PROBED CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    __atomic_fetch_add(&name_calls, 1, __ATOMIC_RELAXED);
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_owner(hmod))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!*name)
        return CUDA_ERROR_NOT_FOUND;
    struct entry *e = lookup((const struct owner *)hmod, name, NULL);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *hfunc = (CUfunction)&e->function;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                  void **jitOptionsValues, unsigned int numJitOptions,
                                  CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                  unsigned int numLibraryOptions) {
    (void)jitOptions;
    (void)jitOptionsValues;
    (void)libraryOptions;
    (void)libraryOptionValues;
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!library || (numJitOptions && !jitOptions) || (numLibraryOptions && !libraryOptions))
        return CUDA_ERROR_INVALID_VALUE;
    if (!code)
        return CUDA_ERROR_INVALID_IMAGE;
    struct owner *o = new_owner(code);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *library = (CUlibrary)o;
    return CUDA_SUCCESS;
}

PROBED CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name) {
    __atomic_fetch_add(&name_calls, 1, __ATOMIC_RELAXED);
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pKernel || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_owner(library))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!*name)
        return CUDA_ERROR_NOT_FOUND;
    struct entry *e = lookup((const struct owner *)library, name, NULL);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pKernel = (CUkernel)&e->kernel;
    return CUDA_SUCCESS;
}

PROBED CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel) {
    __atomic_fetch_add(&name_calls, 1, __ATOMIC_RELAXED);
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pFunc)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_kernel(kernel))
        return CUDA_ERROR_INVALID_HANDLE;
    const struct kernel *k = (const struct kernel *)kernel;
    *pFunc = (CUfunction)k->function;
    return CUDA_SUCCESS;
}

/* ---- The private path (stands for the driver's private export table) ---- */

/* The owner of kernels made by the private path: the runtime's own modules. */
static struct owner private_owner = {OWNER_MAGIC, 0};

/*
 * Not a CUDA name. The CUDA runtime registers its kernels through the driver's private export
 * table, never through the public name functions the agent probes; this export stands for that
 * table. One kernel per name (across callers), stable; the handle is a CUkernel, which every
 * kernel launch entry point accepts cast as CUfunction.
 */
EXPORT CUresult penrose_standin_private_kernel(void **kernel_out, const char *name) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!kernel_out || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!*name)
        return CUDA_ERROR_NOT_FOUND;
    int created = 0;
    struct entry *e = lookup(&private_owner, name, &created);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (created)
        __atomic_fetch_add(&private_kernels, 1, __ATOMIC_RELAXED);
    *kernel_out = &e->kernel;
    return CUDA_SUCCESS;
}

/* ---- Launch entry points ---- */

static CUresult launch(enum penrose_entry entry, CUfunction f, unsigned int gx, unsigned int gy,
                       unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz,
                       CUstream stream) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    /* A CUkernel cast as CUfunction is a valid launch handle (cuda.h says so for
       cuLaunchKernel and its variants); the ring records the handle as passed. */
    if (!valid_function(f) && !valid_kernel(f))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!gx || !gy || !gz || !bx || !by || !bz)
        return CUDA_ERROR_INVALID_VALUE;
    __atomic_fetch_add(&launch_counts[entry], 1, __ATOMIC_RELAXED);
    ring_write(entry, f, stream);
    return CUDA_SUCCESS;
}

PROBED CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                               unsigned int gridDimZ, unsigned int blockDimX,
                               unsigned int blockDimY, unsigned int blockDimZ,
                               unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                               void **extra) {
    (void)sharedMemBytes;
    (void)kernelParams;
    (void)extra;
    return launch(ENTRY_LAUNCH_KERNEL, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                  blockDimZ, hStream);
}

PROBED CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                    unsigned int gridDimZ, unsigned int blockDimX,
                                    unsigned int blockDimY, unsigned int blockDimZ,
                                    unsigned int sharedMemBytes, CUstream hStream,
                                    void **kernelParams, void **extra) {
    (void)sharedMemBytes;
    (void)kernelParams;
    (void)extra;
    return launch(ENTRY_LAUNCH_KERNEL_PTSZ, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                  blockDimZ, hStream);
}

static CUresult launch_ex(enum penrose_entry entry, const CUlaunchConfig *config, CUfunction f) {
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    if (config->numAttrs && !config->attrs)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(entry, f, config->gridDimX, config->gridDimY, config->gridDimZ,
                  config->blockDimX, config->blockDimY, config->blockDimZ, config->hStream);
}

PROBED CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                 void **extra) {
    (void)kernelParams;
    (void)extra;
    return launch_ex(ENTRY_LAUNCH_KERNEL_EX, config, f);
}

PROBED CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                      void **kernelParams, void **extra) {
    (void)kernelParams;
    (void)extra;
    return launch_ex(ENTRY_LAUNCH_KERNEL_EX_PTSZ, config, f);
}

PROBED CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                          unsigned int gridDimY, unsigned int gridDimZ,
                                          unsigned int blockDimX, unsigned int blockDimY,
                                          unsigned int blockDimZ, unsigned int sharedMemBytes,
                                          CUstream hStream, void **kernelParams) {
    (void)sharedMemBytes;
    (void)kernelParams;
    return launch(ENTRY_LAUNCH_COOPERATIVE_KERNEL, f, gridDimX, gridDimY, gridDimZ, blockDimX,
                  blockDimY, blockDimZ, hStream);
}

PROBED CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                               unsigned int gridDimY, unsigned int gridDimZ,
                                               unsigned int blockDimX, unsigned int blockDimY,
                                               unsigned int blockDimZ,
                                               unsigned int sharedMemBytes, CUstream hStream,
                                               void **kernelParams) {
    (void)sharedMemBytes;
    (void)kernelParams;
    return launch(ENTRY_LAUNCH_COOPERATIVE_KERNEL_PTSZ, f, gridDimX, gridDimY, gridDimZ,
                  blockDimX, blockDimY, blockDimZ, hStream);
}

/* A graph launch is one event; its record carries the exec handle where others carry the
   function. Any non-null exec handle is accepted. */
static CUresult graph_launch(enum penrose_entry entry, CUgraphExec exec, CUstream stream) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!exec)
        return CUDA_ERROR_INVALID_VALUE;
    __atomic_fetch_add(&launch_counts[entry], 1, __ATOMIC_RELAXED);
    ring_write(entry, exec, stream);
    return CUDA_SUCCESS;
}

PROBED CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    return graph_launch(ENTRY_GRAPH_LAUNCH, hGraphExec, hStream);
}

PROBED CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
    return graph_launch(ENTRY_GRAPH_LAUNCH_PTSZ, hGraphExec, hStream);
}

/* ---- Stand-in extras (not CUDA): what tests and the replayer use ---- */

/* Launches through one entry point so far in this process; 0 for an unknown entry. */
EXPORT uint64_t penrose_standin_launch_count(unsigned int entry) {
    if (entry >= ENTRY_COUNT)
        return 0;
    return __atomic_load_n(&launch_counts[entry], __ATOMIC_RELAXED);
}

/* Distinct function handles created so far (one per (module or library, name)). */
EXPORT uint64_t penrose_standin_function_count(void) {
    return __atomic_load_n(&function_count, __ATOMIC_ACQUIRE);
}

/* Calls of the public name functions so far (cuModuleGetFunction, cuLibraryGetKernel,
 * cuKernelGetFunction), successful or not. */
EXPORT uint64_t penrose_standin_name_call_count(void) {
    return __atomic_load_n(&name_calls, __ATOMIC_RELAXED);
}

/* Distinct kernels made by penrose_standin_private_kernel so far (also counted by
 * penrose_standin_function_count, which counts every handle made). */
EXPORT uint64_t penrose_standin_private_kernel_count(void) {
    return __atomic_load_n(&private_kernels, __ATOMIC_RELAXED);
}

/* The trace fields of the calling thread's next launch; consumed by that launch. */
EXPORT void penrose_standin_set_next_counters(const struct penrose_standin_counters *counters) {
    if (counters)
        next_counters = *counters;
    else
        memset(&next_counters, 0, sizeof next_counters);
}

/* The ABI version of these extras and of the ring, so a mismatched build fails loudly. */
EXPORT uint32_t penrose_standin_abi_version(void) {
    return PENROSE_RING_VERSION;
}
