/*
 * Penrose stand-in libcuda: a test-only shared library installed as `libcuda.so.1`.
 *
 * It exports the real CUDA driver API symbol names with their real C signatures (argument
 * order and widths as in cuda.h), so that uprobes attached to it read the same registers and
 * stack slots they would read on a real driver. It launches nothing: each launch entry point
 * checks its arguments like a driver would, counts the launch per entry point and appends a
 * counter record to a shared-memory ring (`/dev/shm/penrose-standin-<pid>`) that the agent's
 * stand-in counter source reads. CUDA graphs (stream capture and the explicit graph API, kernel
 * nodes only) are kept as heap objects; a graph launch "runs" its kernel nodes in order, one
 * ring record each. The layout of that ring is mirrored by
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
#include <strings.h>
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
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef uint64_t cuuint64_t;
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
#define CUDA_ERROR_ILLEGAL_STATE 401
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define CUDA_ERROR_STREAM_CAPTURE_INVALIDATED 901
#define CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD 908
#define CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE 910

/* ---- CUDA graph types (cuda.h, CUDA 12) ---- */

typedef enum CUstreamCaptureMode_enum {
    CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    CU_STREAM_CAPTURE_MODE_RELAXED = 2
} CUstreamCaptureMode;

typedef enum CUstreamCaptureStatus_enum {
    CU_STREAM_CAPTURE_STATUS_NONE = 0,
    CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
    CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2
} CUstreamCaptureStatus;

typedef enum CUgraphExecUpdateResult_enum {
    CU_GRAPH_EXEC_UPDATE_SUCCESS = 0x0,
    CU_GRAPH_EXEC_UPDATE_ERROR = 0x1,
    CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED = 0x2,
    CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED = 0x3,
    CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED = 0x4,
    CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED = 0x5,
    CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED = 0x6,
    CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE = 0x7,
    CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED = 0x8
} CUgraphExecUpdateResult;

typedef enum CUgraphInstantiateResult_enum {
    CUDA_GRAPH_INSTANTIATE_SUCCESS = 0,
    CUDA_GRAPH_INSTANTIATE_ERROR = 1,
    CUDA_GRAPH_INSTANTIATE_INVALID_STRUCTURE = 2,
    CUDA_GRAPH_INSTANTIATE_NODE_OPERATION_NOT_SUPPORTED = 3,
    CUDA_GRAPH_INSTANTIATE_MULTIPLE_CTXS_NOT_SUPPORTED = 4
} CUgraphInstantiateResult;

/* CUgraphInstantiate_flags: AUTO_FREE_ON_LAUNCH 1, UPLOAD 2, DEVICE_LAUNCH 4, USE_NODE_PRIORITY 8. */
#define GRAPH_INSTANTIATE_FLAGS 0xfull

typedef struct CUDA_KERNEL_NODE_PARAMS_st {
    CUfunction func;
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
} CUDA_KERNEL_NODE_PARAMS_v1;

typedef struct CUDA_KERNEL_NODE_PARAMS_v2_st {
    CUfunction func;
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
    CUkernel kern;  /* launched when func is NULL */
    CUcontext ctx;  /* with kern: the context (NULL: the current one) */
} CUDA_KERNEL_NODE_PARAMS_v2;

typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st {
    cuuint64_t flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    CUgraphInstantiateResult result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;

typedef struct CUgraphExecUpdateResultInfo_st {
    CUgraphExecUpdateResult result;
    CUgraphNode errorNode;
    CUgraphNode errorFromNode;
} CUgraphExecUpdateResultInfo;

/* The layouts abi.rs mirrors (KernelNodeParamsV1/V2, GraphInstantiateParams,
 * GraphExecUpdateResultInfo). */
_Static_assert(sizeof(CUDA_KERNEL_NODE_PARAMS_v1) == 56, "v1 kernel node params");
_Static_assert(offsetof(CUDA_KERNEL_NODE_PARAMS_v1, kernelParams) == 40, "v1 kernelParams");
_Static_assert(sizeof(CUDA_KERNEL_NODE_PARAMS_v2) == 72, "v2 kernel node params");
_Static_assert(offsetof(CUDA_KERNEL_NODE_PARAMS_v2, kern) == 56, "v2 kern");
_Static_assert(sizeof(CUDA_GRAPH_INSTANTIATE_PARAMS) == 32, "instantiate params");
_Static_assert(sizeof(CUgraphExecUpdateResultInfo) == 24, "update result info");

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
#define PENROSE_RING_VERSION 4u
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
    uint32_t device;            /* bits 0..16: host index of the GPU it ran on, plus one (0:
                                 * unknown); bits 16..24: its MIG GPU instance id (0: whole) */
};

/* Version 4: after the records, `capacity` launch configurations; record i's is in slot
 * i % capacity, written before the record's seq is stored, with its own seq. */
struct ring_launch {            /* 48 bytes */
    uint64_t seq;               /* index + 1 when complete; 0 while being written */
    uint64_t graph_exec;        /* the CUgraphExec of a graph launch; 0 for a kernel launch */
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t shared_mem_bytes;  /* the launch's (or node's) sharedMemBytes */
    uint32_t node;              /* a graph launch's node: its index in the exec plus one */
};

_Static_assert(sizeof(struct ring_header) == 64, "ring header layout");
_Static_assert(sizeof(struct ring_record) == 80, "ring record layout");
_Static_assert(sizeof(struct ring_launch) == 48, "ring launch layout");

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

/* One kernel launch as the stand-in runs it: what a kernel node holds, and what a launch call
 * passes. `func` is the handle the ring records. */
struct kernel_launch {
    const void *func;
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t shared_mem_bytes;
    struct penrose_standin_counters counters;
};

static struct ring_header *ring;
static struct ring_record *ring_records;
static struct ring_launch *ring_launches;
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
    size_t size = sizeof(struct ring_header) +
                  (size_t)PENROSE_RING_CAPACITY *
                      (sizeof(struct ring_record) + sizeof(struct ring_launch));
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
    ring_launches = (struct ring_launch *)(ring_records + PENROSE_RING_CAPACITY);
    ring->version = PENROSE_RING_VERSION;
    ring->record_size = sizeof(struct ring_record);
    ring->capacity = PENROSE_RING_CAPACITY;
    ring->pid = (uint32_t)getpid();
    __atomic_store_n(&ring->head, 0, __ATOMIC_RELAXED);
    /* Readers wait for the magic: everything above is visible once it is. */
    __atomic_store_n(&ring->magic, PENROSE_RING_MAGIC, __ATOMIC_RELEASE);
    return 0;
}

/* The calling thread's pending counters (penrose_standin_set_next_counters), consumed. */
static struct penrose_standin_counters take_next_counters(void) {
    struct penrose_standin_counters c = next_counters;
    memset(&next_counters, 0, sizeof next_counters);
    return c;
}

static uint32_t current_tid(void) {
    if (thread_id == 0)
        thread_id = (uint32_t)syscall(SYS_gettid);
    return thread_id;
}

/* Appends one record and its launch configuration; the caller holds ring_lock (a seqlock per
 * slot: seq 0 while written, index + 1 when complete). */
static void ring_append_locked(enum penrose_entry entry, const struct kernel_launch *k,
                               CUstream stream, uint32_t device, const void *exec,
                               uint32_t node) {
    uint64_t index = __atomic_load_n(&ring->head, __ATOMIC_RELAXED);
    uint64_t slot = index & (PENROSE_RING_CAPACITY - 1);
    struct ring_record *r = &ring_records[slot];
    struct ring_launch *l = &ring_launches[slot];
    __atomic_store_n(&r->seq, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&l->seq, 0, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    l->graph_exec = (uint64_t)(uintptr_t)exec;
    memcpy(l->grid, k->grid, sizeof l->grid);
    memcpy(l->block, k->block, sizeof l->block);
    l->shared_mem_bytes = k->shared_mem_bytes;
    l->node = node;
    const struct penrose_standin_counters *c = &k->counters;
    r->function = (uint64_t)(uintptr_t)k->func;
    r->stream = (uint64_t)(uintptr_t)stream;
    r->duration_ns = c->duration_ns;
    r->est_achieved_occupancy_pct = c->est_achieved_occupancy_pct;
    r->blocks_per_sm = c->blocks_per_sm;
    r->registers_per_thread = c->registers_per_thread;
    r->shared_memory_bytes = c->shared_memory_bytes;
    r->entry = (uint32_t)entry;
    r->present = c->present;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    r->timestamp_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
    r->tid = current_tid();
    r->device = device;
    __atomic_store_n(&l->seq, index + 1, __ATOMIC_RELEASE);
    __atomic_store_n(&r->seq, index + 1, __ATOMIC_RELEASE);
    __atomic_store_n(&ring->head, index + 1, __ATOMIC_RELEASE);
}

/* Appends the record of one kernel launch. */
static void ring_write(enum penrose_entry entry, const struct kernel_launch *k, CUstream stream,
                       uint32_t device) {
    if (!ring)
        return;
    pthread_mutex_lock(&ring_lock);
    ring_append_locked(entry, k, stream, device, NULL, 0);
    pthread_mutex_unlock(&ring_lock);
}

/* ---- Initialisation, devices, contexts ---- */

static void parse_gpus(void);
static void parse_visible(void);

EXPORT CUresult cuInit(unsigned int Flags) {
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&init_lock);
    if (!initialized) {
        parse_gpus();
        parse_visible();
        if (ring_open() != 0)
            rc = CUDA_ERROR_OPERATING_SYSTEM;
        else
            initialized = 1;
    }
    pthread_mutex_unlock(&init_lock);
    return rc;
}

/* ---- Devices (PENROSE_STANDIN_GPUS), their CUDA ordinals and UUIDs ----
 *
 * The host's GPUs are a list of compute capabilities, `PENROSE_STANDIN_GPUS=9.0,9.0,8.0`
 * (default: eight 9.0s), in PCI bus order: host index i is NVML's index i. The agent's
 * stand-in counter source reads the same variable (penrose-standin-ring mirrors the parsing
 * and the UUIDs). A process sees them as CUDA does: CUDA_DEVICE_ORDER=PCI_BUS_ID enumerates
 * them in host order, anything else (FASTEST_FIRST, the default) by compute capability,
 * highest first, ties in host order; CUDA_VISIBLE_DEVICES then picks and renumbers them by
 * enumeration index or UUID prefix, and ends at its first invalid entry.
 *
 * MIG: an entry `MAJOR.MINOR/N` (N in 1..=7) is a GPU in MIG mode, partitioned into N GPU
 * instances (ids 1..=N) of one compute instance each (id 0). A CUDA device is then a "unit":
 * a whole GPU (gi 0) or one instance (host index, gi). Instance UUIDs are `PNSM`, zeros, the
 * parent's host index (big-endian) in bytes 12-13, the gi in 14 and the ci (0) in 15, written
 * `MIG-xxxxxxxx-...` like GPU UUIDs. As on a real driver, a partitioned GPU named by index or
 * by GPU UUID, or enumerated with CUDA_VISIBLE_DEVICES unset, is its first instance (gi 1);
 * `MIG-<instance UUID prefix>` (hex case-insensitive) and the older
 * `MIG-GPU-<parent UUID>/<gi>/<ci>` name any instance. cuDeviceGetUuid answers with the
 * physical GPU's UUID, cuDeviceGetUuid_v2 with the instance's. A launch's ring record carries
 * its unit: host index + 1 in the low 16 bits of `device`, the gi in bits 16..24 (0 for a
 * whole GPU, so rings written before MIG read the same). */

#define MAX_GPUS 64
#define MAX_MIG_INSTANCES 7
#define MAX_CONTEXTS 1024
#define MAX_STREAMS 65536
#define MAX_CTX_DEPTH 16
#define CONTEXT_MAGIC 0x50524e4354583031ull /* "PRNCTX01" */
#define STREAM_MAGIC 0x50524e5354524d31ull  /* "PRNSTRM1" */

typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;

/* What a CUDA device of this process is: a whole GPU (gi 0) or one of its MIG instances. */
struct unit {
    int host; /* the (parent) GPU's host index */
    int gi;   /* GPU instance id; 0 for a whole GPU */
};

static int gpu_count;
static unsigned gpu_cc[MAX_GPUS];  /* major * 10 + minor */
static int gpu_mig[MAX_GPUS];      /* GPU instances; 0: not in MIG mode */
static struct unit visible[MAX_GPUS]; /* CUDA ordinal -> unit */
static int visible_count;

static void gpu_uuid(int host, unsigned char out[16]) {
    memset(out, 0, 16);
    memcpy(out, "PNSG", 4);
    out[14] = (unsigned char)(host >> 8);
    out[15] = (unsigned char)host;
}

/* Compute instance 0 of GPU instance `gi` of GPU `host`. */
static void mig_uuid(int host, int gi, unsigned char out[16]) {
    memset(out, 0, 16);
    memcpy(out, "PNSM", 4);
    out[12] = (unsigned char)(host >> 8);
    out[13] = (unsigned char)host;
    out[14] = (unsigned char)gi;
    out[15] = 0;
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (or "MIG-..."), as NVML and
 * CUDA_VISIBLE_DEVICES spell it. */
static void uuid_text(const char *prefix, const unsigned char u[16], char out[41]) {
    snprintf(out, 41,
             "%.4s%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", prefix,
             u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
             u[13], u[14], u[15]);
}

static void gpu_uuid_text(int host, char out[41]) {
    unsigned char u[16];
    gpu_uuid(host, u);
    uuid_text("GPU-", u, out);
}

static void mig_uuid_text(int host, int gi, char out[41]) {
    unsigned char u[16];
    mig_uuid(host, gi, u);
    uuid_text("MIG-", u, out);
}

/* Decimal digits at *p (at least one; no sign, no spaces), saturating at 1000 so that a long
 * run stays out of range instead of wrapping; advances *p past them. -1 when there are none. */
static int parse_digits(const char **p) {
    const char *s = *p;
    unsigned v = 0;
    if (*s < '0' || *s > '9')
        return -1;
    for (; *s >= '0' && *s <= '9'; s++)
        if (v < 1000)
            v = v * 10 + (unsigned)(*s - '0');
    *p = s;
    return (int)v;
}

/* Entries `MAJOR.MINOR` or `MAJOR.MINOR/N`, after optional leading white space, up to the
 * first invalid one (penrose-standin-ring's standin_gpus parses exactly the same way). */
static void parse_gpus(void) {
    const char *spec = getenv("PENROSE_STANDIN_GPUS");
    gpu_count = 0;
    if (spec && *spec) {
        const char *p = spec;
        while (*p && gpu_count < MAX_GPUS) {
            while (*p && strchr(" \t\n\v\f\r", *p))
                p++;
            int major = parse_digits(&p);
            if (major < 0 || major > 25 || *p != '.')
                break;
            p++;
            int minor = parse_digits(&p);
            if (minor < 0 || minor > 9)
                break;
            int mig = 0;
            if (*p == '/') {
                p++;
                mig = parse_digits(&p);
                if (mig < 1 || mig > MAX_MIG_INSTANCES)
                    break;
            }
            if (*p != ',' && *p != '\0')
                break;
            gpu_cc[gpu_count] = (unsigned)(major * 10 + minor);
            gpu_mig[gpu_count] = mig;
            gpu_count++;
            if (*p != ',')
                break;
            p++;
        }
    }
    if (gpu_count == 0) {
        gpu_count = 8;
        for (int i = 0; i < gpu_count; i++) {
            gpu_cc[i] = 90;
            gpu_mig[i] = 0;
        }
    }
}

/* The unit a GPU named as a whole stands for: itself, or its first instance in MIG mode (CUDA
 * picks the first one available). */
static struct unit whole_or_first(int host) {
    struct unit u = {host, gpu_mig[host] ? 1 : 0};
    return u;
}

/* `MIG-GPU-<parent's full GPU UUID text>/<gi>/<ci>`, the pre-R470 form; gi -1 when it names no
 * instance. */
static struct unit parse_old_mig(const char *tok) {
    struct unit none = {-1, -1};
    const char *slash = strchr(tok, '/');
    if (!slash)
        return none;
    size_t len = (size_t)(slash - (tok + 4));
    int host = -1;
    for (int i = 0; i < gpu_count && host < 0; i++) {
        char text[41];
        gpu_uuid_text(i, text);
        if (len == strlen(text) && strncasecmp(text, tok + 4, len) == 0)
            host = i;
    }
    const char *p = slash + 1;
    int gi = parse_digits(&p);
    if (host < 0 || gi < 1 || gi > gpu_mig[host] || *p != '/')
        return none;
    p++;
    int ci = parse_digits(&p);
    if (ci != 0 || *p != '\0')
        return none;
    struct unit u = {host, gi};
    return u;
}

/* `MIG-<prefix of an instance's UUID text>`: the one instance it starts; host -2 when several
 * do, -1 when none does. */
static struct unit parse_mig(const char *tok) {
    struct unit found = {-1, -1};
    size_t len = strlen(tok);
    for (int i = 0; i < gpu_count; i++)
        for (int gi = 1; gi <= gpu_mig[i]; gi++) {
            char text[41];
            mig_uuid_text(i, gi, text);
            if (strncasecmp(text, tok, len) != 0)
                continue;
            if (found.host >= 0) {
                found.host = -2;
                return found;
            }
            found.host = i;
            found.gi = gi;
        }
    return found;
}

static void parse_visible(void) {
    int order[MAX_GPUS];
    for (int i = 0; i < gpu_count; i++)
        order[i] = i;
    const char *device_order = getenv("CUDA_DEVICE_ORDER");
    if (!device_order || strcmp(device_order, "PCI_BUS_ID") != 0) {
        /* FASTEST_FIRST: a stable insertion sort by compute capability, highest first. */
        for (int i = 1; i < gpu_count; i++) {
            int v = order[i], j = i - 1;
            while (j >= 0 && gpu_cc[order[j]] < gpu_cc[v]) {
                order[j + 1] = order[j];
                j--;
            }
            order[j + 1] = v;
        }
    }
    const char *list = getenv("CUDA_VISIBLE_DEVICES");
    visible_count = 0;
    if (!list) {
        for (int i = 0; i < gpu_count; i++)
            visible[visible_count++] = whole_or_first(order[i]);
        return;
    }
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", list);
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok && visible_count < MAX_GPUS;
         tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        struct unit u = {-1, -1};
        if (strncmp(tok, "MIG-GPU-", 8) == 0) {
            u = parse_old_mig(tok);
        } else if (strncmp(tok, "MIG-", 4) == 0) {
            u = parse_mig(tok);
        } else if (strncmp(tok, "GPU-", 4) == 0) {
            int host = -1;
            for (int i = 0; i < gpu_count; i++) {
                char text[41];
                gpu_uuid_text(i, text);
                if (strncmp(text, tok, strlen(tok)) == 0) {
                    if (host >= 0) {
                        host = -2; /* ambiguous prefix */
                        break;
                    }
                    host = i;
                }
            }
            if (host >= 0)
                u = whole_or_first(host);
        } else {
            char *end = NULL;
            long n = strtol(tok, &end, 10);
            if (end != tok && *end == '\0' && n >= 0 && n < gpu_count)
                u = whole_or_first(order[n]);
        }
        if (u.host < 0)
            break;
        int duplicate = 0;
        for (int i = 0; i < visible_count; i++)
            if (visible[i].host == u.host && visible[i].gi == u.gi)
                duplicate = 1;
        if (duplicate)
            break;
        visible[visible_count++] = u;
    }
}

/* The checks every call on a device ordinal makes: initialised, an out-pointer, a visible
 * ordinal. */
static CUresult check_device_call(const void *out, CUdevice dev) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= visible_count)
        return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = visible_count;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    CUresult rc = check_device_call(device, ordinal);
    if (rc != CUDA_SUCCESS)
        return rc;
    *device = ordinal;
    return CUDA_SUCCESS;
}

/* v1 always names the physical GPU; v2 names a MIG instance by its own UUID (cuda.h: "If the
 * device is in MIG mode, returns its MIG UUID"). */
static CUresult device_uuid(CUuuid *uuid, CUdevice dev, int instance_uuid) {
    CUresult rc = check_device_call(uuid, dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct unit u = visible[dev];
    if (instance_uuid && u.gi > 0)
        mig_uuid(u.host, u.gi, (unsigned char *)uuid->bytes);
    else
        gpu_uuid(u.host, (unsigned char *)uuid->bytes);
    return CUDA_SUCCESS;
}

PROBED CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
    return device_uuid(uuid, dev, 0);
}

PROBED CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    return device_uuid(uuid, dev, 1);
}

/* ---- Contexts and streams ---- */

struct CUctx_st {
    uint64_t magic;
    int ordinal;
    struct unit unit; /* the GPU or MIG instance its launches run on */
};

struct CUstream_st {
    uint64_t magic;
    struct CUctx_st *ctx;
};

static struct CUctx_st contexts[MAX_CONTEXTS];
static uint64_t context_count;
static struct CUctx_st *primary[MAX_GPUS];
static struct CUstream_st streams[MAX_STREAMS];
static uint64_t stream_count;
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
/* The calling thread's context stack; the top is current. */
static __thread CUcontext ctx_stack[MAX_CTX_DEPTH];
static __thread int ctx_depth;

static int valid_context(const void *p) {
    return in_array(p, contexts, sizeof contexts[0], 0, &context_count);
}

static int valid_stream(const void *p) {
    return in_array(p, streams, sizeof streams[0], 0, &stream_count);
}

static CUcontext current_context(void) {
    return ctx_depth > 0 ? ctx_stack[ctx_depth - 1] : NULL;
}

static CUcontext new_context(CUdevice dev) {
    CUcontext c = NULL;
    pthread_mutex_lock(&ctx_lock);
    if (context_count < MAX_CONTEXTS) {
        c = &contexts[context_count];
        c->magic = CONTEXT_MAGIC;
        c->ordinal = dev;
        c->unit = visible[dev];
        __atomic_store_n(&context_count, context_count + 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&ctx_lock);
    return c;
}

PROBED CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    CUresult rc = check_device_call(pctx, dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!__atomic_load_n(&primary[dev], __ATOMIC_ACQUIRE)) {
        CUcontext c = new_context(dev);
        if (!c)
            return CUDA_ERROR_OUT_OF_MEMORY;
        CUcontext expected = NULL;
        __atomic_compare_exchange_n(&primary[dev], &expected, c, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE);
    }
    *pctx = __atomic_load_n(&primary[dev], __ATOMIC_ACQUIRE);
    return CUDA_SUCCESS;
}

/* One body for every cuCtxCreate version: each probed entry point must fire once per call. */
static CUresult ctx_create(CUcontext *pctx, CUdevice dev) {
    CUresult rc = check_device_call(pctx, dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (ctx_depth >= MAX_CTX_DEPTH)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUcontext c = new_context(dev);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ctx_stack[ctx_depth++] = c;
    *pctx = c;
    return CUDA_SUCCESS;
}

PROBED CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    return ctx_create(pctx, dev);
}

/* CUDA 11.4: with execution affinity parameters (ignored here). */
PROBED CUresult cuCtxCreate_v3(CUcontext *pctx, void *paramsArray, int numParams,
                               unsigned int flags, CUdevice dev) {
    (void)paramsArray;
    (void)numParams;
    (void)flags;
    return ctx_create(pctx, dev);
}

/* CUDA 12.5: with a CUctxCreateParams (ignored here). */
PROBED CUresult cuCtxCreate_v4(CUcontext *pctx, void *ctxCreateParams, unsigned int flags,
                               CUdevice dev) {
    (void)ctxCreateParams;
    (void)flags;
    return ctx_create(pctx, dev);
}

/* The pre-3.2 name, still exported by real drivers for old binaries. */
EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    return ctx_create(pctx, dev);
}

PROBED CUresult cuCtxSetCurrent(CUcontext ctx) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx) {
        if (ctx_depth > 0)
            ctx_depth--;
        return CUDA_SUCCESS;
    }
    if (!valid_context(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == 0)
        ctx_depth = 1;
    ctx_stack[ctx_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = current_context();
    return CUDA_SUCCESS;
}

PROBED CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!valid_context(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth >= MAX_CTX_DEPTH)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ctx_stack[ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

PROBED CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = ctx_stack[--ctx_depth];
    if (pctx)
        *pctx = c;
    return CUDA_SUCCESS;
}

static CUresult stream_create(CUstream *ph) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ph)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = current_context();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUstream s = NULL;
    pthread_mutex_lock(&ctx_lock);
    if (stream_count < MAX_STREAMS) {
        s = &streams[stream_count];
        s->magic = STREAM_MAGIC;
        s->ctx = c;
        __atomic_store_n(&stream_count, stream_count + 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&ctx_lock);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *ph = s;
    return CUDA_SUCCESS;
}

PROBED CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) {
    (void)Flags;
    return stream_create(phStream);
}

PROBED CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority) {
    (void)flags;
    (void)priority;
    return stream_create(phStream);
}

/* The unit a launch on `stream` runs on, as the ring's `device` field encodes it: host index
 * plus one in the low 16 bits (0: no current context), the GPU instance id in bits 16..24 (0
 * for a whole GPU). A stream the stand-in made must belong to the current context, as the
 * driver requires; other values are the replayer's opaque stream ids and are taken as they
 * come. */
static CUresult launch_device(CUstream stream, uint32_t *device) {
    CUcontext c = current_context();
    if (valid_stream(stream) && stream->ctx != c)
        return CUDA_ERROR_INVALID_CONTEXT;
    *device = c ? ((uint32_t)c->unit.host + 1) | ((uint32_t)c->unit.gi << 16) : 0;
    return CUDA_SUCCESS;
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

/* ---- CUDA graphs: objects, registries, stream capture ----
 *
 * Graphs, their nodes and executable graphs are heap objects with magic numbers. A handle is
 * checked before it is used, never dereferenced on trust: graphs and execs are looked up in a
 * registry of live objects, nodes by their address inside one of their graph's chunks (so a
 * made-up node handle is refused without being read). Only kernel nodes exist; a graph's nodes
 * are kept in insertion order, which is a topological order, and run in that order.
 *
 * CUDA graph objects are not thread-safe, but the registries are shared: one lock (graph_lock)
 * covers every graph call, taken before ring_lock when both are needed. */

#define GRAPH_MAGIC 0x31485052474e5250ull /* "PRNGRPH1" */
#define NODE_MAGIC 0x3145444f4e4e5250ull  /* "PRNNODE1" */
#define EXEC_MAGIC 0x31435845474e5250ull  /* "PRNGEXC1" */
#define NODE_CHUNK 1024u                  /* nodes per allocation: handles never move */
#define MAX_GRAPH_NODES 1048576u
#define MAX_CAPTURES 1024

struct CUgraphNode_st {
    uint64_t magic;
    struct CUgraph_st *graph;
    struct kernel_launch params;
};

/* A chunk of nodes by address, for turning a node handle into its index. */
struct chunk_ref {
    uintptr_t base;
    uint32_t ordinal;
};

struct CUgraph_st {
    uint64_t magic;
    struct CUgraphNode_st **chunks; /* chunk k holds nodes k * NODE_CHUNK .. */
    struct chunk_ref *by_address;   /* the chunks sorted by address */
    uint32_t count;                 /* nodes, in insertion order */
    uint32_t nchunks;
    uint32_t chunk_cap;
};

struct CUgraphExec_st {
    uint64_t magic;
    struct kernel_launch *nodes;   /* what a launch runs, in order */
    uint32_t count;
    uint32_t nchunks;
    struct chunk_ref *by_address;  /* the source graph's chunks: its node handles, by address */
};

/* A set of live object addresses (open addressing; 0 empty, 1 removed). */
struct ptrset {
    uintptr_t *slots;
    size_t cap; /* a power of two, or 0 */
    size_t used;
    size_t removed;
};

#define PTRSET_REMOVED ((uintptr_t)1)

static size_t ptrset_home(uintptr_t v, size_t cap) {
    return (size_t)(((uint64_t)v * 0x9e3779b97f4a7c15ull) >> 17) & (cap - 1);
}

/* The slot holding v, or the empty slot where a search for it ends; cap must be non-zero. */
static size_t ptrset_find(const struct ptrset *s, uintptr_t v) {
    size_t i = ptrset_home(v, s->cap);
    while (s->slots[i] != 0 && s->slots[i] != v)
        i = (i + 1) & (s->cap - 1);
    return i;
}

static int ptrset_has(const struct ptrset *s, const void *p) {
    uintptr_t v = (uintptr_t)p;
    if (s->cap == 0 || v <= PTRSET_REMOVED)
        return 0;
    return s->slots[ptrset_find(s, v)] == v;
}

static int ptrset_rehash(struct ptrset *s, size_t cap) {
    uintptr_t *slots = calloc(cap, sizeof *slots);
    if (!slots)
        return -1;
    for (size_t i = 0; i < s->cap; i++) {
        uintptr_t v = s->slots[i];
        if (v <= PTRSET_REMOVED)
            continue;
        size_t j = ptrset_home(v, cap);
        while (slots[j] != 0)
            j = (j + 1) & (cap - 1);
        slots[j] = v;
    }
    free(s->slots);
    s->slots = slots;
    s->cap = cap;
    s->removed = 0;
    return 0;
}

/* Adds p (not in the set); -1 when out of memory. At most half the slots are ever in use. */
static int ptrset_add(struct ptrset *s, const void *p) {
    if ((s->used + s->removed + 1) * 2 > s->cap) {
        size_t cap = 16;
        while (cap < (s->used + 1) * 4)
            cap *= 2;
        if (ptrset_rehash(s, cap) != 0)
            return -1;
    }
    uintptr_t v = (uintptr_t)p;
    size_t i = ptrset_home(v, s->cap);
    while (s->slots[i] > PTRSET_REMOVED)
        i = (i + 1) & (s->cap - 1);
    if (s->slots[i] == PTRSET_REMOVED)
        s->removed--;
    s->slots[i] = v;
    s->used++;
    return 0;
}

static void ptrset_remove(struct ptrset *s, const void *p) {
    if (!ptrset_has(s, p))
        return;
    s->slots[ptrset_find(s, (uintptr_t)p)] = PTRSET_REMOVED;
    s->used--;
    s->removed++;
}

/* A capture in progress: launches on `stream` become nodes of `graph`. */
struct capture {
    CUstream stream;
    struct CUgraph_st *graph;
    CUstreamCaptureMode mode;
    uint32_t tid;     /* the thread that began it */
    int invalidated;  /* a launch failed: EndCapture returns no graph */
};

static pthread_mutex_t graph_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ptrset live_graphs;
static struct ptrset live_execs;
static struct capture captures[MAX_CAPTURES];
static int capture_count; /* under graph_lock */
/* capture_count, read without the lock: a launch looks for its stream's capture only when
 * some stream is capturing, so eager launches pay one load. */
static volatile int capturing;
static volatile uint64_t captured_launches;
static volatile uint64_t graph_node_launches;

static int valid_graph(const void *g) {
    return g && ptrset_has(&live_graphs, g);
}

static int valid_exec(const void *e) {
    return e && ptrset_has(&live_execs, e);
}

static struct CUgraphNode_st *graph_node(const struct CUgraph_st *g, uint32_t i) {
    return &g->chunks[i / NODE_CHUNK][i % NODE_CHUNK];
}

/* The index of node handle p among `count` nodes kept in the chunks `refs` (sorted by
 * address), or -1: p is never dereferenced. */
static int64_t node_index(const struct chunk_ref *refs, uint32_t nrefs, uint32_t count,
                          const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t lo = 0, hi = nrefs;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (refs[mid].base <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return -1;
    const struct chunk_ref *r = &refs[lo - 1];
    uintptr_t offset = a - r->base;
    const size_t size = sizeof(struct CUgraphNode_st);
    if (offset % size != 0 || offset / size >= NODE_CHUNK)
        return -1;
    uint64_t i = (uint64_t)r->ordinal * NODE_CHUNK + offset / size;
    return i < count ? (int64_t)i : -1;
}

static struct CUgraph_st *graph_new(void) {
    struct CUgraph_st *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    if (ptrset_add(&live_graphs, g) != 0) {
        free(g);
        return NULL;
    }
    g->magic = GRAPH_MAGIC;
    return g;
}

static void graph_free(struct CUgraph_st *g) {
    ptrset_remove(&live_graphs, g);
    for (uint32_t i = 0; i < g->nchunks; i++)
        free(g->chunks[i]);
    free(g->chunks);
    free(g->by_address);
    g->magic = 0;
    free(g);
}

/* Room for one more chunk of nodes, kept sorted by address too. */
static int graph_add_chunk(struct CUgraph_st *g) {
    if (g->nchunks == g->chunk_cap) {
        uint32_t cap = g->chunk_cap ? g->chunk_cap * 2 : 4;
        struct CUgraphNode_st **chunks = realloc(g->chunks, cap * sizeof *chunks);
        if (!chunks)
            return -1;
        g->chunks = chunks;
        struct chunk_ref *refs = realloc(g->by_address, cap * sizeof *refs);
        if (!refs)
            return -1;
        g->by_address = refs;
        g->chunk_cap = cap;
    }
    struct CUgraphNode_st *chunk = malloc(NODE_CHUNK * sizeof *chunk);
    if (!chunk)
        return -1;
    uint32_t at = 0;
    while (at < g->nchunks && g->by_address[at].base < (uintptr_t)chunk)
        at++;
    memmove(&g->by_address[at + 1], &g->by_address[at],
            (g->nchunks - at) * sizeof g->by_address[0]);
    g->by_address[at] = (struct chunk_ref){(uintptr_t)chunk, g->nchunks};
    g->chunks[g->nchunks++] = chunk;
    return 0;
}

/* Appends a kernel node (insertion order is the graph's order). */
static CUresult graph_append(struct CUgraph_st *g, const struct kernel_launch *k,
                             struct CUgraphNode_st **out) {
    if (g->count >= MAX_GRAPH_NODES)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (g->count % NODE_CHUNK == 0 && graph_add_chunk(g) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct CUgraphNode_st *n = graph_node(g, g->count);
    n->magic = NODE_MAGIC;
    n->graph = g;
    n->params = *k;
    g->count++;
    if (out)
        *out = n;
    return CUDA_SUCCESS;
}

static struct capture *capture_of(CUstream stream) {
    for (int i = 0; i < capture_count; i++)
        if (captures[i].stream == stream)
            return &captures[i];
    return NULL;
}

/*
 * A launch on a capturing stream becomes a kernel node of the capture's graph (with the
 * counters set for it) instead of running. Returns 1 with the launch's result in *rc when
 * `stream` is capturing, 0 when the launch should run. `check` is the launch's own argument
 * check: an invalid launch invalidates the capture, as in CUDA.
 */
static int capture_launch(CUstream stream, CUresult check, const struct kernel_launch *k,
                          CUresult *rc) {
    pthread_mutex_lock(&graph_lock);
    struct capture *c = capture_of(stream);
    if (!c) {
        pthread_mutex_unlock(&graph_lock);
        return 0;
    }
    if (c->invalidated) {
        *rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    } else if (check != CUDA_SUCCESS) {
        c->invalidated = 1;
        *rc = check;
    } else {
        struct kernel_launch node = *k;
        node.counters = take_next_counters();
        *rc = graph_append(c->graph, &node, NULL);
        if (*rc != CUDA_SUCCESS)
            c->invalidated = 1;
        else
            __atomic_fetch_add(&captured_launches, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&graph_lock);
    return 1;
}

/* ---- Launch entry points ---- */

/* The checks every kernel launch makes: a function (or a CUkernel cast as one: cuda.h allows it
 * for cuLaunchKernel and its variants) and no zero dimension. */
static CUresult check_kernel_launch(const void *f, const uint32_t grid[3],
                                    const uint32_t block[3]) {
    if (!valid_function(f) && !valid_kernel(f))
        return CUDA_ERROR_INVALID_HANDLE;
    for (int i = 0; i < 3; i++)
        if (!grid[i] || !block[i])
            return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

static CUresult launch(enum penrose_entry entry, CUfunction f, unsigned int gx, unsigned int gy,
                       unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz,
                       unsigned int smem, CUstream stream) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct kernel_launch k = {f, {gx, gy, gz}, {bx, by, bz}, smem, {0}};
    CUresult rc = check_kernel_launch(f, k.grid, k.block);
    uint32_t device = 0;
    if (rc == CUDA_SUCCESS)
        rc = launch_device(stream, &device);
    if (__atomic_load_n(&capturing, __ATOMIC_ACQUIRE) && capture_launch(stream, rc, &k, &rc))
        return rc;
    if (rc != CUDA_SUCCESS)
        return rc;
    k.counters = take_next_counters();
    __atomic_fetch_add(&launch_counts[entry], 1, __ATOMIC_RELAXED);
    ring_write(entry, &k, stream, device);
    return CUDA_SUCCESS;
}

PROBED CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                               unsigned int gridDimZ, unsigned int blockDimX,
                               unsigned int blockDimY, unsigned int blockDimZ,
                               unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                               void **extra) {
    (void)kernelParams;
    (void)extra;
    return launch(ENTRY_LAUNCH_KERNEL, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                  blockDimZ, sharedMemBytes, hStream);
}

PROBED CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                    unsigned int gridDimZ, unsigned int blockDimX,
                                    unsigned int blockDimY, unsigned int blockDimZ,
                                    unsigned int sharedMemBytes, CUstream hStream,
                                    void **kernelParams, void **extra) {
    (void)kernelParams;
    (void)extra;
    return launch(ENTRY_LAUNCH_KERNEL_PTSZ, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                  blockDimZ, sharedMemBytes, hStream);
}

static CUresult launch_ex(enum penrose_entry entry, const CUlaunchConfig *config, CUfunction f) {
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    if (config->numAttrs && !config->attrs)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(entry, f, config->gridDimX, config->gridDimY, config->gridDimZ,
                  config->blockDimX, config->blockDimY, config->blockDimZ,
                  config->sharedMemBytes, config->hStream);
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
    (void)kernelParams;
    return launch(ENTRY_LAUNCH_COOPERATIVE_KERNEL, f, gridDimX, gridDimY, gridDimZ, blockDimX,
                  blockDimY, blockDimZ, sharedMemBytes, hStream);
}

PROBED CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                               unsigned int gridDimY, unsigned int gridDimZ,
                                               unsigned int blockDimX, unsigned int blockDimY,
                                               unsigned int blockDimZ,
                                               unsigned int sharedMemBytes, CUstream hStream,
                                               void **kernelParams) {
    (void)kernelParams;
    return launch(ENTRY_LAUNCH_COOPERATIVE_KERNEL_PTSZ, f, gridDimX, gridDimY, gridDimZ,
                  blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream);
}

/* ---- Stream capture ---- */

/* CU_STREAM_LEGACY and CU_STREAM_PER_THREAD, the special stream values of cuda.h. */
#define STREAM_LEGACY ((CUstream)0x1)
#define STREAM_PER_THREAD ((CUstream)0x2)

static CUresult begin_capture(CUstream stream, CUstreamCaptureMode mode) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if ((unsigned)mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    /* The default streams cannot be captured here (the legacy one cannot be in CUDA either). */
    if (!stream || stream == STREAM_LEGACY || stream == STREAM_PER_THREAD)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (!valid_stream(stream))
        return CUDA_ERROR_INVALID_HANDLE;
    if (stream->ctx != current_context())
        return CUDA_ERROR_INVALID_CONTEXT;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&graph_lock);
    if (capture_of(stream)) {
        rc = CUDA_ERROR_ILLEGAL_STATE;
    } else if (capture_count >= MAX_CAPTURES) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        struct CUgraph_st *g = graph_new();
        if (!g) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            captures[capture_count++] = (struct capture){stream, g, mode, current_tid(), 0};
            __atomic_store_n(&capturing, capture_count, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&graph_lock);
    return rc;
}

PROBED CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
    return begin_capture(hStream, mode);
}

PROBED CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
    return begin_capture(hStream, mode);
}

static CUresult end_capture(CUstream stream, CUgraph *phGraph) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!phGraph)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_lock);
    struct capture *c = capture_of(stream);
    if (!c) {
        pthread_mutex_unlock(&graph_lock);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && c->tid != current_tid()) {
        pthread_mutex_unlock(&graph_lock);
        return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    }
    struct capture done = *c;
    *c = captures[--capture_count];
    __atomic_store_n(&capturing, capture_count, __ATOMIC_RELEASE);
    CUresult rc = CUDA_SUCCESS;
    if (done.invalidated) {
        graph_free(done.graph);
        *phGraph = NULL;
        rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    } else {
        *phGraph = done.graph;
    }
    pthread_mutex_unlock(&graph_lock);
    return rc;
}

PROBED CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
    return end_capture(hStream, phGraph);
}

PROBED CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph) {
    return end_capture(hStream, phGraph);
}

PROBED CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!captureStatus)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_lock);
    const struct capture *c = capture_of(hStream);
    *captureStatus = !c                ? CU_STREAM_CAPTURE_STATUS_NONE
                     : c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                      : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    pthread_mutex_unlock(&graph_lock);
    return CUDA_SUCCESS;
}

/* ---- The explicit graph API ---- */

PROBED CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!phGraph || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_lock);
    struct CUgraph_st *g = graph_new();
    pthread_mutex_unlock(&graph_lock);
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phGraph = g;
    return CUDA_SUCCESS;
}

/* The launch a kernel node's parameters describe, checked as a launch is: `func` if set (a
 * CUfunction, or a CUkernel cast as one), else the function `kern` resolves to. */
static CUresult node_launch(const void *func, CUkernel kern, CUcontext ctx, unsigned int gx,
                            unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
                            unsigned int bz, unsigned int smem, void **kernelParams,
                            void **extra, struct kernel_launch *out) {
    if (!func) {
        if (!kern)
            return CUDA_ERROR_INVALID_VALUE;
        if (!valid_kernel(kern))
            return CUDA_ERROR_INVALID_HANDLE;
        if (ctx && !valid_context(ctx))
            return CUDA_ERROR_INVALID_CONTEXT;
        func = ((const struct kernel *)kern)->function;
    }
    *out = (struct kernel_launch){func, {gx, gy, gz}, {bx, by, bz}, smem, {0}};
    if (kernelParams && extra)
        return CUDA_ERROR_INVALID_VALUE;
    return check_kernel_launch(func, out->grid, out->block);
}

static CUresult node_launch_v1(const CUDA_KERNEL_NODE_PARAMS_v1 *p, struct kernel_launch *out) {
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return node_launch(p->func, NULL, NULL, p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX,
                       p->blockDimY, p->blockDimZ, p->sharedMemBytes, p->kernelParams, p->extra,
                       out);
}

static CUresult node_launch_v2(const CUDA_KERNEL_NODE_PARAMS_v2 *p, struct kernel_launch *out) {
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return node_launch(p->func, p->kern, p->ctx, p->gridDimX, p->gridDimY, p->gridDimZ,
                       p->blockDimX, p->blockDimY, p->blockDimZ, p->sharedMemBytes,
                       p->kernelParams, p->extra, out);
}

/* Adds a kernel node after its dependencies (nodes of the same graph). The node takes the
 * calling thread's pending counters, as a launch would. */
static CUresult add_kernel_node(CUgraphNode *phNode, CUgraph hGraph,
                                const CUgraphNode *dependencies, size_t numDependencies,
                                CUresult checked, const struct kernel_launch *k) {
    if (!phNode || (numDependencies && !dependencies))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_lock);
    CUresult rc = valid_graph(hGraph) ? checked : CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; rc == CUDA_SUCCESS && i < numDependencies; i++)
        if (node_index(hGraph->by_address, hGraph->nchunks, hGraph->count, dependencies[i]) < 0)
            rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        struct kernel_launch node = *k;
        node.counters = take_next_counters();
        rc = graph_append(hGraph, &node, phNode);
    }
    pthread_mutex_unlock(&graph_lock);
    return rc;
}

PROBED CUresult cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                     const CUgraphNode *dependencies, size_t numDependencies,
                                     const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct kernel_launch k;
    CUresult checked = node_launch_v1(nodeParams, &k);
    return add_kernel_node(phGraphNode, hGraph, dependencies, numDependencies, checked, &k);
}

PROBED CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                        const CUgraphNode *dependencies, size_t numDependencies,
                                        const CUDA_KERNEL_NODE_PARAMS_v2 *nodeParams) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct kernel_launch k;
    CUresult checked = node_launch_v2(nodeParams, &k);
    return add_kernel_node(phGraphNode, hGraph, dependencies, numDependencies, checked, &k);
}

/* An executable copy of the graph: later changes to the graph do not reach it. */
static CUresult instantiate(CUgraphExec *phGraphExec, CUgraph hGraph, uint64_t flags) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!phGraphExec || (flags & ~GRAPH_INSTANTIATE_FLAGS))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_lock);
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
    struct CUgraphExec_st *e = NULL;
    if (!valid_graph(hGraph)) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else if ((e = calloc(1, sizeof *e)) != NULL) {
        const struct CUgraph_st *g = hGraph;
        e->count = g->count;
        e->nchunks = g->nchunks;
        e->nodes = malloc(((size_t)g->count + 1) * sizeof *e->nodes);
        e->by_address = malloc(((size_t)g->nchunks + 1) * sizeof *e->by_address);
        if (e->nodes && e->by_address && ptrset_add(&live_execs, e) == 0) {
            for (uint32_t i = 0; i < g->count; i++)
                e->nodes[i] = graph_node(g, i)->params;
            memcpy(e->by_address, g->by_address, g->nchunks * sizeof *e->by_address);
            e->magic = EXEC_MAGIC;
            *phGraphExec = e;
            rc = CUDA_SUCCESS;
        } else {
            free(e->nodes);
            free(e->by_address);
            free(e);
        }
    }
    pthread_mutex_unlock(&graph_lock);
    return rc;
}

PROBED CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                            unsigned long long flags) {
    return instantiate(phGraphExec, hGraph, flags);
}

PROBED CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                             CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
    if (!instantiateParams)
        return initialized ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = instantiate(phGraphExec, hGraph, instantiateParams->flags);
    instantiateParams->hErrNode_out = NULL;
    instantiateParams->result_out =
        rc == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
    return rc;
}

/* Replaces one node's parameters in the exec (hNode: a node of the graph it was instantiated
 * from). The node takes the calling thread's pending counters. */
static CUresult exec_set_params(CUgraphExec hGraphExec, CUgraphNode hNode, CUresult checked,
                                const struct kernel_launch *k) {
    pthread_mutex_lock(&graph_lock);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (valid_exec(hGraphExec)) {
        struct CUgraphExec_st *e = hGraphExec;
        int64_t i = node_index(e->by_address, e->nchunks, e->count, hNode);
        rc = i < 0 ? CUDA_ERROR_INVALID_VALUE : checked;
        if (rc == CUDA_SUCCESS) {
            e->nodes[i] = *k;
            e->nodes[i].counters = take_next_counters();
        }
    }
    pthread_mutex_unlock(&graph_lock);
    return rc;
}

PROBED CUresult cuGraphExecKernelNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                               const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct kernel_launch k;
    CUresult checked = node_launch_v1(nodeParams, &k);
    return exec_set_params(hGraphExec, hNode, checked, &k);
}

PROBED CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                  const CUDA_KERNEL_NODE_PARAMS_v2 *nodeParams) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct kernel_launch k;
    CUresult checked = node_launch_v2(nodeParams, &k);
    return exec_set_params(hGraphExec, hNode, checked, &k);
}

/* The exec takes the graph's node parameters when both have as many kernel nodes (paired in
 * order); otherwise nothing changes (topology changed, no error node). */
static CUresult exec_update(CUgraphExec hGraphExec, CUgraph hGraph,
                            CUgraphExecUpdateResult *result) {
    *result = CU_GRAPH_EXEC_UPDATE_ERROR;
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&graph_lock);
    CUresult rc = CUDA_SUCCESS;
    *result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
    if (!valid_exec(hGraphExec) || !valid_graph(hGraph)) {
        *result = CU_GRAPH_EXEC_UPDATE_ERROR;
        rc = CUDA_ERROR_INVALID_VALUE;
    } else if (hGraphExec->count != hGraph->count) {
        *result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
        rc = CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    } else {
        for (uint32_t i = 0; i < hGraph->count; i++)
            hGraphExec->nodes[i] = graph_node(hGraph, i)->params;
    }
    pthread_mutex_unlock(&graph_lock);
    return rc;
}

/* The CUDA 10.2-11.x signature, still exported under this name by CUDA 12 drivers. */
PROBED CUresult cuGraphExecUpdate(CUgraphExec hGraphExec, CUgraph hGraph,
                                  CUgraphNode *hErrorNode_out,
                                  CUgraphExecUpdateResult *updateResult_out) {
    CUgraphExecUpdateResult result;
    CUresult rc = exec_update(hGraphExec, hGraph, &result);
    if (hErrorNode_out)
        *hErrorNode_out = NULL;
    if (updateResult_out)
        *updateResult_out = result;
    return rc;
}

PROBED CUresult cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph,
                                     CUgraphExecUpdateResultInfo *resultInfo) {
    CUgraphExecUpdateResult result;
    CUresult rc = exec_update(hGraphExec, hGraph, &result);
    if (resultInfo) {
        resultInfo->result = result;
        resultInfo->errorNode = NULL;
        resultInfo->errorFromNode = NULL;
    }
    return rc;
}

PROBED CUresult cuGraphDestroy(CUgraph hGraph) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&graph_lock);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (valid_graph(hGraph)) {
        graph_free(hGraph);
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&graph_lock);
    return rc;
}

PROBED CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&graph_lock);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (valid_exec(hGraphExec)) {
        struct CUgraphExec_st *e = hGraphExec;
        ptrset_remove(&live_execs, e);
        free(e->nodes);
        free(e->by_address);
        e->magic = 0;
        free(e);
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&graph_lock);
    return rc;
}

/*
 * A graph launch runs the exec's kernel nodes in order: one ring record per node (its function,
 * launch configuration and counters; the launching thread and the stream's device), written
 * back to back under one hold of the ring lock. It counts once in launch_counts and once per
 * node in graph_node_launches. Launching into a capturing stream (a child graph node in CUDA)
 * is not supported: it invalidates that capture.
 */
static CUresult graph_launch(enum penrose_entry entry, CUgraphExec exec, CUstream stream) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&graph_lock);
    uint32_t device = 0;
    CUresult rc = valid_exec(exec) ? launch_device(stream, &device) : CUDA_ERROR_INVALID_VALUE;
    struct capture *c = rc == CUDA_SUCCESS ? capture_of(stream) : NULL;
    if (c) {
        c->invalidated = 1;
        rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (rc == CUDA_SUCCESS) {
        (void)take_next_counters(); /* the nodes carry their own */
        __atomic_fetch_add(&launch_counts[entry], 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&graph_node_launches, exec->count, __ATOMIC_RELAXED);
        if (ring) {
            pthread_mutex_lock(&ring_lock);
            for (uint32_t i = 0; i < exec->count; i++)
                ring_append_locked(entry, &exec->nodes[i], stream, device, exec, i + 1);
            pthread_mutex_unlock(&ring_lock);
        }
    }
    pthread_mutex_unlock(&graph_lock);
    return rc;
}

PROBED CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    return graph_launch(ENTRY_GRAPH_LAUNCH, hGraphExec, hStream);
}

PROBED CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
    return graph_launch(ENTRY_GRAPH_LAUNCH_PTSZ, hGraphExec, hStream);
}

/* ---- Stand-in extras (not CUDA): what tests and the replayer use ---- */

/* Kernel launches recorded as graph nodes by stream capture so far (not counted as launches). */
EXPORT uint64_t penrose_standin_captured_launch_count(void) {
    return __atomic_load_n(&captured_launches, __ATOMIC_RELAXED);
}

/* Kernel nodes run by graph launches so far (each also has its ring record). */
EXPORT uint64_t penrose_standin_graph_node_launch_count(void) {
    return __atomic_load_n(&graph_node_launches, __ATOMIC_RELAXED);
}

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
