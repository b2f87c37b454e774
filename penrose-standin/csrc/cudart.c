/*
 * Penrose stand-in CUDA runtime: a test-only shared library installed as `libcudart.so.13`.
 *
 * It behaves like the CUDA runtime of CUDA >= 12.4 where the agent's name probes are
 * concerned:
 *   - `__cudaRegisterFunction` maps a host stub to its kernel name and gets the kernel handle
 *     through the driver's private path (`penrose_standin_private_kernel`, standing for the
 *     private export table), never through cuModuleGetFunction / cuLibraryGetKernel;
 *   - `__cudaGetKernel` hands out the CUkernel registered for a stub (nvcc's host stubs call it
 *     once and keep the handle in a function-local static `__handle`);
 *   - `cudaLaunchKernel` (and `_ptsz`) accepts either such a handle or, on the legacy path
 *     (`__NV_LEGACY_LAUNCH`), the stub itself, and launches through the driver's PUBLIC
 *     `cuLaunchKernel` (`_ptsz`) with the CUkernel cast as CUfunction, so the driver's launch
 *     probes fire.
 * The driver is reached like the real runtime reaches it: `dlopen("libcuda.so.1")` (which finds
 * an already loaded stand-in by its soname) and `dlsym`.
 *
 * Exported functions have the real names and x86-64 SysV signatures (dim3 by value). Nothing
 * here is part of the product; docs/standin.md describes the ABI.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
/* Probed entry points stay real, separate functions: uprobes attach to their addresses. */
#define PROBED __attribute__((visibility("default"), noinline, used))

typedef int cudaError_t;
typedef struct CUstream_st *cudaStream_t;
typedef struct {
    unsigned int x, y, z;
} dim3;

#define cudaSuccess 0
#define cudaErrorInvalidValue 1
#define cudaErrorMemoryAllocation 2
#define cudaErrorInitializationError 3
#define cudaErrorInsufficientDriver 35
#define cudaErrorMissingConfiguration 52
#define cudaErrorInvalidDeviceFunction 98
#define cudaErrorInvalidResourceHandle 400
#define cudaErrorUnknown 999

/* Driver result codes this file maps. */
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_HANDLE 400

#define PENROSE_CUDART_ABI_VERSION 1u

/* ---- Counters (extras, read by tests through penrose_cudart_count) ---- */

enum counter {
    COUNT_REGISTER_FAT_BINARY = 0,
    COUNT_REGISTER_FUNCTION,
    COUNT_GET_KERNEL,
    COUNT_LAUNCH_BY_HANDLE,
    COUNT_LAUNCH_BY_STUB,
    COUNT_UNREGISTER_FAT_BINARY,
    COUNT_MAX
};
static volatile uint64_t counts[COUNT_MAX];

static void count(enum counter c) {
    __atomic_fetch_add(&counts[c], 1, __ATOMIC_RELAXED);
}

/* ---- The driver, found at run time ---- */

typedef int (*launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, unsigned smem, void *stream, void **params,
                         void **extra);

static struct {
    int (*init)(unsigned);
    launch_fn launch;
    launch_fn launch_ptsz;
    int (*private_kernel)(void **, const char *);
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static cudaError_t drv_status = cudaErrorInsufficientDriver;

static void drv_load(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h)
        return;
    *(void **)&drv.init = dlsym(h, "cuInit");
    *(void **)&drv.launch = dlsym(h, "cuLaunchKernel");
    *(void **)&drv.launch_ptsz = dlsym(h, "cuLaunchKernel_ptsz");
    *(void **)&drv.private_kernel = dlsym(h, "penrose_standin_private_kernel");
    if (!drv.init || !drv.launch || !drv.launch_ptsz || !drv.private_kernel)
        return;
    drv_status = drv.init(0) == CUDA_SUCCESS ? cudaSuccess : cudaErrorInitializationError;
}

/* Loads and initialises the driver once (the runtime's lazy initialisation). */
static cudaError_t driver_ready(void) {
    pthread_once(&drv_once, drv_load);
    return drv_status;
}

static cudaError_t from_driver(int code) {
    switch (code) {
    case CUDA_SUCCESS:
        return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE:
        return cudaErrorInvalidValue;
    case CUDA_ERROR_NOT_INITIALIZED:
        return cudaErrorInitializationError;
    case CUDA_ERROR_INVALID_HANDLE:
        return cudaErrorInvalidDeviceFunction;
    default:
        return cudaErrorUnknown;
    }
}

/* ---- Last error (cudaGetLastError) ---- */

static __thread cudaError_t last_error;

static cudaError_t fail(cudaError_t e) {
    if (e != cudaSuccess)
        last_error = e;
    return e;
}

EXPORT cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

/* ---- Fat binaries ---- */

#define MAX_FATBINS 4096
#define FATBIN_MAGIC 0x50524e4641544231ull /* "PRNFATB1" */

struct fatbin {
    void *handle; /* what the void ** handed out points at (nvcc's __cudaFatCubinHandle) */
    uint64_t magic;
    const void *image;
};

static struct fatbin fatbins[MAX_FATBINS];
static uint64_t fatbin_count;
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;

static struct fatbin *valid_fatbin(void **h) {
    uintptr_t a = (uintptr_t)h, base = (uintptr_t)fatbins;
    if (a < base || (a - base) % sizeof fatbins[0] != 0)
        return NULL;
    uint64_t i = (a - base) / sizeof fatbins[0];
    if (i >= __atomic_load_n(&fatbin_count, __ATOMIC_ACQUIRE))
        return NULL;
    struct fatbin *f = &fatbins[i];
    return f->magic == FATBIN_MAGIC ? f : NULL;
}

/* Any non-null image is accepted (nvcc passes a __fatBinC_Wrapper_t; its contents are not
 * read). NULL when the table is full or the image is null. */
PROBED void **__cudaRegisterFatBinary(void *fatCubin) {
    if (!fatCubin)
        return NULL;
    struct fatbin *f = NULL;
    pthread_mutex_lock(&reg_lock);
    if (fatbin_count < MAX_FATBINS) {
        f = &fatbins[fatbin_count];
        f->image = fatCubin;
        f->handle = f;
        f->magic = FATBIN_MAGIC;
        __atomic_store_n(&fatbin_count, fatbin_count + 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&reg_lock);
    if (f)
        count(COUNT_REGISTER_FAT_BINARY);
    return f ? &f->handle : NULL;
}

PROBED void __cudaRegisterFatBinaryEnd(void **fatCubinHandle) {
    (void)fatCubinHandle;
}

/* ---- Stubs: open addressing, inserted under reg_lock, read without a lock ---- */

#define STUB_SLOTS 131072 /* a power of two; at most half are used */
#define MAX_STUBS (STUB_SLOTS / 2)

struct stub {
    const void *stub;       /* the key; published last (release) */
    void *kernel;           /* CUkernel; NULL once its fat binary is unregistered */
    struct fatbin *fatbin;
};

static struct stub stubs[STUB_SLOTS];
static uint64_t stub_count;

static uint64_t hash_ptr(const void *p) {
    uint64_t h = (uint64_t)(uintptr_t)p;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

/* The slot of `stub`, or NULL when it was never registered. */
static struct stub *find_stub(const void *stub) {
    if (!stub)
        return NULL;
    for (uint64_t i = hash_ptr(stub);; i++) {
        struct stub *s = &stubs[i & (STUB_SLOTS - 1)];
        const void *key = __atomic_load_n(&s->stub, __ATOMIC_ACQUIRE);
        if (key == stub)
            return s;
        if (!key)
            return NULL;
    }
}

/*
 * nvcc's registration callback calls this once per kernel at load: hostFun is the address the
 * host code launches with (the kernel's host function), deviceName its mangled name. The kernel
 * handle comes from the driver's private path. Registering a stub again replaces its kernel.
 */
PROBED void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                                   const char *deviceName, int thread_limit, void *tid, void *bid,
                                   void *bDim, void *gDim, int *wSize) {
    (void)deviceFun;
    (void)thread_limit;
    (void)tid;
    (void)bid;
    (void)bDim;
    (void)gDim;
    (void)wSize;
    struct fatbin *f = valid_fatbin(fatCubinHandle);
    if (!f || !hostFun || !deviceName) {
        fail(cudaErrorInvalidValue);
        return;
    }
    cudaError_t e = driver_ready();
    if (e != cudaSuccess) {
        fail(e);
        return;
    }
    void *kernel = NULL;
    int rc = drv.private_kernel(&kernel, deviceName);
    if (rc != CUDA_SUCCESS) {
        fail(from_driver(rc));
        return;
    }
    pthread_mutex_lock(&reg_lock);
    struct stub *s = find_stub(hostFun);
    if (s) {
        __atomic_store_n(&s->kernel, kernel, __ATOMIC_RELEASE);
        s->fatbin = f;
    } else if (stub_count < MAX_STUBS) {
        uint64_t i = hash_ptr(hostFun);
        while (stubs[i & (STUB_SLOTS - 1)].stub)
            i++;
        s = &stubs[i & (STUB_SLOTS - 1)];
        s->kernel = kernel;
        s->fatbin = f;
        __atomic_store_n(&s->stub, (const void *)hostFun, __ATOMIC_RELEASE);
        stub_count++;
    }
    pthread_mutex_unlock(&reg_lock);
    if (s)
        count(COUNT_REGISTER_FUNCTION);
    else
        fail(cudaErrorMemoryAllocation);
}

/* Forgets the kernels of that fat binary: their stubs no longer resolve. */
PROBED void __cudaUnregisterFatBinary(void **fatCubinHandle) {
    struct fatbin *f = valid_fatbin(fatCubinHandle);
    if (!f)
        return;
    pthread_mutex_lock(&reg_lock);
    for (uint64_t i = 0; i < STUB_SLOTS; i++) {
        if (stubs[i].stub && stubs[i].fatbin == f) {
            __atomic_store_n(&stubs[i].kernel, NULL, __ATOMIC_RELEASE);
            stubs[i].fatbin = NULL;
        }
    }
    f->magic = 0;
    pthread_mutex_unlock(&reg_lock);
    count(COUNT_UNREGISTER_FAT_BINARY);
}

/* The kernel registered for `stub`; NULL if none. */
static void *kernel_of(const void *stub) {
    struct stub *s = find_stub(stub);
    return s ? __atomic_load_n(&s->kernel, __ATOMIC_ACQUIRE) : NULL;
}

/*
 * CUDA >= 12.4 host stubs: `static cudaKernel_t __handle; __cudaGetKernel(&__handle, fun)`,
 * once per stub per process. Writes the CUkernel registered for that stub.
 */
PROBED cudaError_t __cudaGetKernel(void **kernel, const void *entryFuncAddr) {
    count(COUNT_GET_KERNEL);
    if (!kernel)
        return fail(cudaErrorInvalidValue);
    void *k = kernel_of(entryFuncAddr);
    if (!k)
        return fail(cudaErrorInvalidDeviceFunction);
    *kernel = k;
    return cudaSuccess;
}

/* ---- Launch configuration (what `kernel<<<grid, block, smem, stream>>>(...)` pushes) ---- */

#define CONFIG_DEPTH 16

struct config {
    dim3 grid, block;
    size_t shared_mem;
    cudaStream_t stream;
};
static __thread struct config configs[CONFIG_DEPTH];
static __thread unsigned config_depth;

EXPORT unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                            struct CUstream_st *stream) {
    if (config_depth >= CONFIG_DEPTH)
        return 1;
    configs[config_depth++] = (struct config){gridDim, blockDim, sharedMem, stream};
    return 0;
}

EXPORT cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem,
                                              void *stream) {
    if (config_depth == 0)
        return fail(cudaErrorMissingConfiguration);
    struct config c = configs[--config_depth];
    if (gridDim)
        *gridDim = c.grid;
    if (blockDim)
        *blockDim = c.block;
    if (sharedMem)
        *sharedMem = c.shared_mem;
    if (stream)
        *(cudaStream_t *)stream = c.stream;
    return cudaSuccess;
}

/* ---- Launches ---- */

static cudaError_t launch(launch_fn *via, const void *func, dim3 g, dim3 b, void **args,
                          size_t smem, cudaStream_t stream) {
    cudaError_t e = driver_ready();
    if (e != cudaSuccess)
        return fail(e);
    if (!func)
        return fail(cudaErrorInvalidDeviceFunction);
    if (smem > UINT_MAX)
        return fail(cudaErrorInvalidValue);
    /* A registered stub (legacy path) or, failing that, a CUkernel from __cudaGetKernel; the
     * driver validates the latter. */
    struct stub *s = find_stub(func);
    void *kernel = s ? __atomic_load_n(&s->kernel, __ATOMIC_ACQUIRE) : (void *)func;
    if (!kernel)
        return fail(cudaErrorInvalidDeviceFunction);
    int rc = (*via)(kernel, g.x, g.y, g.z, b.x, b.y, b.z, (unsigned)smem, stream, args, NULL);
    if (rc != CUDA_SUCCESS)
        return fail(from_driver(rc));
    count(s ? COUNT_LAUNCH_BY_STUB : COUNT_LAUNCH_BY_HANDLE);
    return cudaSuccess;
}

PROBED cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                    size_t sharedMem, cudaStream_t stream) {
    return launch(&drv.launch, func, gridDim, blockDim, args, sharedMem, stream);
}

/* The per-thread default stream variant (nvcc --default-stream per-thread); launches through
 * cuLaunchKernel_ptsz. */
PROBED cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim,
                                         void **args, size_t sharedMem, cudaStream_t stream) {
    return launch(&drv.launch_ptsz, func, gridDim, blockDim, args, sharedMem, stream);
}

/* ---- Extras (not CUDA), for the replayer and tests ---- */

/* One of the counters (enum counter); 0 for an unknown index. */
EXPORT uint64_t penrose_cudart_count(unsigned int counter) {
    if (counter >= COUNT_MAX)
        return 0;
    return __atomic_load_n(&counts[counter], __ATOMIC_RELAXED);
}

/* The kernel registered for `stub` without counting as a __cudaGetKernel call (so a replayer
 * can name the handles the driver will see): 0 and *kernel set, or cudaErrorInvalidDeviceFunction. */
EXPORT cudaError_t penrose_cudart_lookup(const void *stub, void **kernel) {
    if (!kernel)
        return cudaErrorInvalidValue;
    void *k = kernel_of(stub);
    if (!k)
        return cudaErrorInvalidDeviceFunction;
    *kernel = k;
    return cudaSuccess;
}

EXPORT uint32_t penrose_cudart_abi_version(void) {
    return PENROSE_CUDART_ABI_VERSION;
}
