//! Compiles the stand-in libraries into `$OUT_DIR` and tells the crate where they are:
//!
//! - `csrc/standin.c` -> `libcuda.so.1` (`PENROSE_STANDIN_LIBCUDA`), the stand-in driver;
//! - `csrc/cudart.c` -> `libcudart.so.13` (`PENROSE_STANDIN_LIBCUDART`), the stand-in runtime;
//! - a generated C++ file -> `libpenrose_nvcc_app.so` (`PENROSE_STANDIN_NVCC_APP`), a test
//!   application whose host stubs and `__handle` statics carry nvcc's symbol names, linked
//!   against the stand-in runtime and NOT stripped (its `.symtab` is what late attach reads);
//! - `csrc/static.c` -> `libpenrose_static.so` (`PENROSE_STANDIN_STATIC`), a stripped library
//!   with a GNU build-id and its own hidden copy of the runtime, like cuBLAS.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Kernels (host stubs) in the test application's pool.
const APP_STUBS: usize = 2048;

fn main() {
    let Some(out_dir) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        panic!("cargo sets OUT_DIR for build scripts");
    };
    println!("cargo:rerun-if-changed=build.rs");

    let libcuda = out_dir.join("libcuda.so.1");
    compile_c(
        "csrc/standin.c",
        &libcuda,
        &["-fvisibility=hidden", "-Wl,-soname,libcuda.so.1"],
    );
    println!(
        "cargo:rustc-env=PENROSE_STANDIN_LIBCUDA={}",
        libcuda.display()
    );

    // The runtime finds the driver with dlopen("libcuda.so.1"), as the real one does. No
    // sibling calls: at cuLaunchKernel's entry the return address is inside the runtime.
    let libcudart = out_dir.join("libcudart.so.13");
    compile_c(
        "csrc/cudart.c",
        &libcudart,
        &[
            "-fvisibility=hidden",
            "-fno-optimize-sibling-calls",
            "-Wl,-soname,libcudart.so.13",
            "-ldl",
        ],
    );
    println!(
        "cargo:rustc-env=PENROSE_STANDIN_LIBCUDART={}",
        libcudart.display()
    );

    // Stripped (-s: no .symtab), with a build-id note; only penrose_static_* exported.
    let static_lib = out_dir.join("libpenrose_static.so");
    compile_c(
        "csrc/static.c",
        &static_lib,
        &[
            "-fvisibility=hidden",
            "-fno-optimize-sibling-calls",
            "-fno-omit-frame-pointer",
            "-Wl,-soname,libpenrose_static.so",
            "-Wl,--build-id=sha1",
            "-s",
            "-ldl",
        ],
    );
    println!(
        "cargo:rustc-env=PENROSE_STANDIN_STATIC={}",
        static_lib.display()
    );

    let app_source = out_dir.join("penrose_nvcc_app.cpp");
    std::fs::write(&app_source, nvcc_app_source(APP_STUBS))
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", app_source.display()));
    let app = out_dir.join("libpenrose_nvcc_app.so");
    compile_app(&app_source, &app, &out_dir);
    println!("cargo:rustc-env=PENROSE_STANDIN_NVCC_APP={}", app.display());
}

/// A shared object from one C file with the compiler the cc crate picks.
fn compile_c(source: &str, output: &Path, extra: &[&str]) {
    println!("cargo:rerun-if-changed={source}");
    // The cc crate picks the compiler and target flags cargo would; we only need a shared
    // object, which cc::Build does not produce itself.
    let compiler = cc::Build::new()
        .opt_level(2)
        .warnings(true)
        .extra_warnings(true)
        .get_compiler();
    let mut cmd: Command = compiler.to_command();
    cmd.args(["-std=c11", "-shared", "-fPIC", "-pthread", "-o"])
        .arg(output)
        .arg(source)
        .args(extra);
    run(cmd, source);
}

/// The test application: C++, `-g0` but not stripped, linked against the stand-in runtime
/// (`DT_NEEDED libcudart.so.13`, found next to the application through `$ORIGIN` when it is
/// not loaded already).
fn compile_app(source: &Path, output: &Path, out_dir: &Path) {
    let compiler = cc::Build::new()
        .cpp(true)
        .opt_level(2)
        .warnings(true)
        .extra_warnings(true)
        .get_compiler();
    let mut cmd: Command = compiler.to_command();
    cmd.args([
        "-std=c++17",
        "-shared",
        "-fPIC",
        "-g0",
        "-fvisibility=hidden",
        "-Wl,-soname,libpenrose_nvcc_app.so",
        "-Wl,--build-id=sha1",
        "-o",
    ])
    .arg(output)
    .arg(source)
    .arg(format!("-L{}", out_dir.display()))
    .args(["-l:libcudart.so.13", "-Wl,-rpath,$ORIGIN"]);
    run(cmd, "the generated test application");
}

fn run(mut cmd: Command, what: &str) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run the compiler ({cmd:?}): {e}"));
    assert!(status.success(), "compiling {what} failed: {cmd:?}");
}

/// The C++ source of the test application: `stubs` kernels `penrose_kNNNN(void *)`, each with
/// a host function (what nvcc registers and launches with) and a static device stub whose body
/// is nvcc's `__cudaLaunch` expansion (CUDA >= 12.4, and the `__NV_LEGACY_LAUNCH` one behind a
/// run-time flag).
fn nvcc_app_source(stubs: usize) -> String {
    let mut s = String::new();
    s.push_str(APP_PRELUDE);
    for i in 0..stubs {
        let name = format!("penrose_k{i:04}");
        let mangled = format!("_Z{}{name}Pv", name.len());
        let stub = format!("__device_stub_{mangled}");
        // The same shape as nvcc's .cudafe1.stub.c.
        let _ = writeln!(
            s,
            "void {name}(void *);\n\
             static void {stub}(void *) PENROSE_STUB;\n\
             static void {stub}(void *__par0) {{\n  \
             __cudaLaunchPrologue(1);\n  __cudaSetupArgSimple(__par0, 0UL);\n  \
             __cudaLaunch(((char *)((void (*)(void *)){name})));\n}}\n\
             void {name}(void *__cuda_0) {{ {stub}(__cuda_0); }}\n"
        );
    }
    let _ = writeln!(s, "#define PENROSE_STUBS {stubs}u");
    s.push_str("static void (*const penrose_kernels[PENROSE_STUBS])(void *) = {\n");
    for i in 0..stubs {
        let _ = writeln!(s, "  penrose_k{i:04},");
    }
    s.push_str("};\nstatic const char *const penrose_names[PENROSE_STUBS] = {\n");
    for i in 0..stubs {
        let _ = writeln!(s, "  \"_Z13penrose_k{i:04}Pv\",");
    }
    s.push_str("};\n");
    s.push_str(APP_ENTRY_POINTS);
    s
}

const APP_PRELUDE: &str = r#"// Generated by penrose-standin/build.rs: the stand-in test application (docs/standin.md).
// Host code shaped as nvcc >= 12.4 generates it, compiled by the host C++ compiler.
#include <cstddef>

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
};
typedef int cudaError_t;
typedef struct CUstream_st *cudaStream_t;
typedef struct CUkern_st *cudaKernel_t;

extern "C" {
cudaError_t __cudaGetKernel(cudaKernel_t *, const void *);
cudaError_t cudaLaunchKernel(const void *, dim3, dim3, void **, size_t, cudaStream_t);
cudaError_t cudaLaunchKernel_ptsz(const void *, dim3, dim3, void **, size_t, cudaStream_t);
unsigned __cudaPushCallConfiguration(dim3, dim3, size_t, struct CUstream_st *);
cudaError_t __cudaPopCallConfiguration(dim3 *, dim3 *, size_t *, void *);
cudaError_t cudaGetLastError(void);
}

// Stubs must stay separate LOCAL functions under their own names: no inlining, no clones.
#if defined(__clang__)
#define PENROSE_STUB __attribute__((noinline, used))
#else
#define PENROSE_STUB __attribute__((noipa, used))
#endif

// Run-time switches (an nvcc build fixes them at compile time): bit 0 the legacy launch
// (__NV_LEGACY_LAUNCH), bit 1 the per-thread default stream (cudaLaunchKernel_ptsz).
#define PENROSE_LEGACY 1u
#define PENROSE_PTSZ 2u
static thread_local unsigned penrose_launch_flags;

static inline cudaError_t penrose_launch(const void *f, dim3 g, dim3 b, void **args, size_t smem,
                                         cudaStream_t stream) {
  return (penrose_launch_flags & PENROSE_PTSZ) ? cudaLaunchKernel_ptsz(f, g, b, args, smem, stream)
                                               : cudaLaunchKernel(f, g, b, args, smem, stream);
}

#define __cudaLaunchPrologue(size) \
  void *__args_arr[size];          \
  int __args_idx = 0
#define __cudaSetupArgSimple(arg, offset)            \
  __args_arr[__args_idx] = (void *)(char *)&arg;     \
  ++__args_idx

// crt/host_runtime.h's __cudaLaunch: the CUDA >= 12.4 expansion, with the legacy one first.
#define __cudaLaunch(fun)                                                                     \
  {                                                                                           \
    volatile static char *__f __attribute__((unused));                                        \
    __f = fun;                                                                                \
    dim3 __gridDim, __blockDim;                                                               \
    size_t __sharedMem;                                                                       \
    cudaStream_t __stream;                                                                    \
    if (penrose_launch_flags & PENROSE_LEGACY) {                                              \
      if (__cudaPopCallConfiguration(&__gridDim, &__blockDim, &__sharedMem, &__stream) != 0)  \
        return;                                                                               \
      (void)penrose_launch(fun, __gridDim, __blockDim, &__args_arr[0], __sharedMem, __stream); \
      return;                                                                                 \
    }                                                                                         \
    static cudaKernel_t __handle = 0;                                                         \
    volatile static bool __tmp __attribute__((unused)) =                                      \
        (__cudaGetKernel(&__handle, (const void *)fun) == 0);                                 \
    if (__cudaPopCallConfiguration(&__gridDim, &__blockDim, &__sharedMem, &__stream) != 0)    \
      return;                                                                                 \
    (void)penrose_launch(__handle, __gridDim, __blockDim, &__args_arr[0], __sharedMem,        \
                         __stream);                                                           \
  }

"#;

const APP_ENTRY_POINTS: &str = r#"
#define PENROSE_EXPORT extern "C" __attribute__((visibility("default")))

// Kernels in the pool.
PENROSE_EXPORT unsigned penrose_nvcc_app_stub_count(void) { return PENROSE_STUBS; }

// The address kernel i is registered and (legacy path) launched with: its host function
// `penrose_kNNNN(void *)`, as nvcc registers it. NULL past the pool.
PENROSE_EXPORT const void *penrose_nvcc_app_stub(unsigned i) {
  return i < PENROSE_STUBS ? (const void *)penrose_kernels[i] : nullptr;
}

// Kernel i's mangled name, `_Z13penrose_kNNNNPv`. NULL past the pool.
PENROSE_EXPORT const char *penrose_nvcc_app_kernel_name(unsigned i) {
  return i < PENROSE_STUBS ? penrose_names[i] : nullptr;
}

// `penrose_kNNNN<<<grid, block, smem, stream>>>(nullptr)`: pushes the configuration and calls
// the host function, whose stub pops it and launches. flags: PENROSE_LEGACY, PENROSE_PTSZ.
// Returns the launch's cudaError_t (cudaGetLastError), 1 for an index past the pool.
PENROSE_EXPORT int penrose_nvcc_app_launch(unsigned i, unsigned gx, unsigned gy, unsigned gz,
                                           unsigned bx, unsigned by, unsigned bz, unsigned smem,
                                           void *stream, unsigned flags) {
  if (i >= PENROSE_STUBS)
    return 1;
  (void)cudaGetLastError();
  penrose_launch_flags = flags;
  if (__cudaPushCallConfiguration(dim3(gx, gy, gz), dim3(bx, by, bz), smem,
                                  (cudaStream_t)stream) != 0)
    return 52; // cudaErrorMissingConfiguration: configurations nested too deep
  penrose_kernels[i](nullptr);
  penrose_launch_flags = 0;
  return cudaGetLastError();
}
"#;
