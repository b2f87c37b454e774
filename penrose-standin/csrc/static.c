/*
 * Penrose stand-in for a library that links the CUDA runtime statically and ships stripped
 * (cuBLAS, cuBLASLt): `libpenrose_static.so`, built with a GNU build-id note and no `.symtab`.
 *
 * Its registration and launch logic is a private, hidden copy (nothing of it is exported, no
 * __cudaRegisterFunction or __cudaGetKernel passes through a probed library): kernels come from
 * the driver's private path (`penrose_standin_private_kernel`) and launches go through the
 * driver's PUBLIC `cuLaunchKernel` with the CUkernel cast as CUfunction. Each kernel is launched
 * from its own hidden host function, compiled without sibling calls, so the return address on
 * the stack at cuLaunchKernel's entry lies inside this library.
 *
 * Its only exports are a small C API for the replayer. Nothing here is part of the product;
 * docs/standin.md describes it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>

#define EXPORT __attribute__((visibility("default")))
/* Internal functions: static (never exported), real functions of their own. */
#define HIDDEN __attribute__((noinline))

typedef int (*launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, unsigned smem, void *stream, void **params,
                         void **extra);

/* Names as cuBLAS's kernels look; nothing outside this library ever sees them. */
static const char *const kernel_names[] = {
    "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_"
    "segment_k_off_kernel__5x_cublas",
    "void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, false, false, "
    "false>(cublasLt::cublasSplitKParams<float>, float const*, float const*, float*, float "
    "const*, float const*, float const*, float const*, float*, void*, long, float*, int*)",
    "void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, "
    "cublasGemvParamsEx<int, cublasGemvTensorStrided<float const>, cublasGemvTensorStrided<float "
    "const>, cublasGemvTensorStrided<float>, float> >(cublasGemvParamsEx<int, "
    "cublasGemvTensorStrided<float const>, cublasGemvTensorStrided<float const>, "
    "cublasGemvTensorStrided<float>, float>, float, float)",
    "void dot_kernel<float, 128, 0, cublasDotParams<cublasGemvTensor<float const>, "
    "cublasGemvTensorStrided<float> > >(cublasDotParams<cublasGemvTensor<float const>, "
    "cublasGemvTensorStrided<float> >)",
};
#define KERNELS (sizeof kernel_names / sizeof kernel_names[0])

static struct {
    launch_fn launch;
    int (*private_kernel)(void **, const char *);
    void *kernels[KERNELS];
    int status; /* 0 once everything is registered; a CUresult (or -1: no driver) otherwise */
} rt = {.status = -1};
static pthread_once_t rt_once = PTHREAD_ONCE_INIT;

/* The statically linked runtime's lazy initialisation: find the driver, register kernels. */
HIDDEN static void rt_init(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h)
        return;
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    *(void **)&rt.launch = dlsym(h, "cuLaunchKernel");
    *(void **)&rt.private_kernel = dlsym(h, "penrose_standin_private_kernel");
    if (!init || !rt.launch || !rt.private_kernel)
        return;
    int rc = init(0);
    for (unsigned i = 0; rc == 0 && i < KERNELS; i++)
        rc = rt.private_kernel(&rt.kernels[i], kernel_names[i]);
    rt.status = rc;
}

/* One host function per kernel, as a statically linked runtime's generated stubs are. */
#define HOST_STUB(n)                                                                            \
    HIDDEN static int host_stub_##n(unsigned gx, unsigned gy, unsigned gz, unsigned bx,         \
                                    unsigned by, unsigned bz, unsigned smem, void *stream) {    \
        void *args[1] = {0};                                                                    \
        int rc = rt.launch(rt.kernels[n], gx, gy, gz, bx, by, bz, smem, stream, args, 0);       \
        return rc;                                                                              \
    }
HOST_STUB(0)
HOST_STUB(1)
HOST_STUB(2)
HOST_STUB(3)

typedef int (*host_stub_fn)(unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, void *);
static host_stub_fn const host_stubs[KERNELS] = {host_stub_0, host_stub_1, host_stub_2,
                                                 host_stub_3};

/* How many distinct kernels the library launches. */
EXPORT unsigned penrose_static_kernel_count(void) {
    return (unsigned)KERNELS;
}

/*
 * Launches kernel `kernel_index` (< penrose_static_kernel_count()) through cuLaunchKernel.
 * Returns the driver's CUresult; 1 (CUDA_ERROR_INVALID_VALUE) for a bad index, 3
 * (CUDA_ERROR_NOT_INITIALIZED) when no stand-in driver could be found.
 */
EXPORT int penrose_static_launch(unsigned kernel_index, unsigned gx, unsigned gy, unsigned gz,
                                 unsigned bx, unsigned by, unsigned bz, unsigned smem,
                                 void *stream) {
    pthread_once(&rt_once, rt_init);
    if (rt.status != 0)
        return rt.status < 0 ? 3 : rt.status;
    if (kernel_index >= KERNELS)
        return 1;
    return host_stubs[kernel_index](gx, gy, gz, bx, by, bz, smem, stream);
}
