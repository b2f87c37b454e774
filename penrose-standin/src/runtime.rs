//! The stand-in CUDA runtime (`libcudart.so.13`), the nvcc-named test application
//! (`libpenrose_nvcc_app.so`) and the stripped library with a statically linked runtime
//! (`libpenrose_static.so`), each loaded with `dlopen` behind safe methods.
//!
//! Load order matters as in a real process: the driver first ([`Driver::load`]), then the
//! runtime ([`Runtime::load`], whose `dlopen("libcuda.so.1")` finds the loaded stand-in by its
//! soname), then the application ([`NvccApp::load`], whose `DT_NEEDED libcudart.so.13` finds
//! the loaded runtime the same way). The constructors take the library they need as proof.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::path::Path;

use libloading::Library;

use crate::driver::{Driver, KernelHandle, Launch};
use crate::error::StandinError;

/// The version of the runtime's extras this crate speaks (`penrose_cudart_abi_version`).
pub const CUDART_ABI_VERSION: u32 = 1;

/// `dim3`, passed by value as in `cuda_runtime_api.h`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Dim3 {
    /// x.
    pub x: u32,
    /// y.
    pub y: u32,
    /// z.
    pub z: u32,
}

impl From<[u32; 3]> for Dim3 {
    fn from([x, y, z]: [u32; 3]) -> Self {
        Self { x, y, z }
    }
}

/// A `void **` fat binary handle from `__cudaRegisterFatBinary`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FatBinaryHandle(pub usize);

/// A host stub address: what `__cudaRegisterFunction`, `__cudaGetKernel` and the legacy
/// `cudaLaunchKernel` take (nvcc passes the kernel's host function).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StubAddress(pub usize);

/// The runtime's counters (`penrose_cudart_count`), in this process so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum RuntimeCounter {
    /// `__cudaRegisterFatBinary` calls that returned a handle.
    RegisterFatBinary = 0,
    /// `__cudaRegisterFunction` calls that registered a stub.
    RegisterFunction = 1,
    /// `__cudaGetKernel` calls, whatever their result.
    GetKernel = 2,
    /// Successful `cudaLaunchKernel`(`_ptsz`) launches with a CUkernel handle.
    LaunchByHandle = 3,
    /// Successful `cudaLaunchKernel`(`_ptsz`) launches with a registered stub (legacy).
    LaunchByStub = 4,
    /// `__cudaUnregisterFatBinary` calls with a valid handle.
    UnregisterFatBinary = 5,
}

/// A stand-in fat binary wrapper (`__fatBinC_Wrapper_t`: magic, version, data, filename).
/// The stand-in runtime keeps the pointer and never reads through it.
static FAT_BINARY: [u32; 8] = [0x4662_43b1, 1, 0, 0, 0, 0, 0, 0];

/// Looks up `name` and copies the function pointer out.
///
/// # Safety
/// `T` must be the symbol's true C type.
unsafe fn symbol<T: Copy>(library: &Library, name: &[u8]) -> Result<T, StandinError> {
    // SAFETY: the caller names the symbol's C type; the pointer is used only while the library
    // stays loaded, which the owning struct guarantees.
    let s = unsafe { library.get::<T>(name)? };
    Ok(*s)
}

type LaunchKernelFn =
    unsafe extern "C" fn(*const c_void, Dim3, Dim3, *mut *mut c_void, usize, *mut c_void) -> c_int;

struct RuntimeSymbols {
    register_fat_binary: unsafe extern "C" fn(*mut c_void) -> *mut *mut c_void,
    register_fat_binary_end: unsafe extern "C" fn(*mut *mut c_void),
    unregister_fat_binary: unsafe extern "C" fn(*mut *mut c_void),
    register_function: unsafe extern "C" fn(
        *mut *mut c_void,
        *const c_char,
        *mut c_char,
        *const c_char,
        c_int,
        *mut c_void,
        *mut c_void,
        *mut c_void,
        *mut c_void,
        *mut c_int,
    ),
    get_kernel: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> c_int,
    launch_kernel: LaunchKernelFn,
    launch_kernel_ptsz: LaunchKernelFn,
    get_last_error: unsafe extern "C" fn() -> c_int,
    count: unsafe extern "C" fn(c_uint) -> u64,
    lookup: unsafe extern "C" fn(*const c_void, *mut *mut c_void) -> c_int,
}

/// A loaded stand-in runtime (`libcudart.so.13`).
pub struct Runtime {
    sym: RuntimeSymbols,
    _library: Library,
}

/// Turns a `cudaError_t` into a `Result` naming the call.
fn check(call: &'static str, code: c_int) -> Result<(), StandinError> {
    if code == 0 {
        Ok(())
    } else {
        Err(StandinError::Runtime { call, code })
    }
}

impl Runtime {
    /// Loads the runtime at `path` after `driver` (the runtime finds that driver by soname) and
    /// checks the version of its extras.
    pub fn load(path: &Path, driver: &Driver) -> Result<Self, StandinError> {
        let _ = driver;
        // SAFETY: loading runs the library's initialisers; the stand-in has none beyond libc's.
        let library = unsafe { Library::new(path)? };
        // SAFETY (all lookups below): each type is the signature in csrc/cudart.c, which
        // follows cuda_runtime_api.h and crt/host_runtime.h for the CUDA symbols.
        let (sym, version) = unsafe {
            let version: unsafe extern "C" fn() -> u32 =
                symbol(&library, b"penrose_cudart_abi_version\0")?;
            let sym = RuntimeSymbols {
                register_fat_binary: symbol(&library, b"__cudaRegisterFatBinary\0")?,
                register_fat_binary_end: symbol(&library, b"__cudaRegisterFatBinaryEnd\0")?,
                unregister_fat_binary: symbol(&library, b"__cudaUnregisterFatBinary\0")?,
                register_function: symbol(&library, b"__cudaRegisterFunction\0")?,
                get_kernel: symbol(&library, b"__cudaGetKernel\0")?,
                launch_kernel: symbol(&library, b"cudaLaunchKernel\0")?,
                launch_kernel_ptsz: symbol(&library, b"cudaLaunchKernel_ptsz\0")?,
                get_last_error: symbol(&library, b"cudaGetLastError\0")?,
                count: symbol(&library, b"penrose_cudart_count\0")?,
                lookup: symbol(&library, b"penrose_cudart_lookup\0")?,
            };
            (sym, version())
        };
        if version != CUDART_ABI_VERSION {
            return Err(StandinError::AbiMismatch {
                found: version,
                expected: CUDART_ABI_VERSION,
            });
        }
        Ok(Self {
            sym,
            _library: library,
        })
    }

    /// `__cudaRegisterFatBinary` with a stand-in fat binary wrapper.
    pub fn register_fat_binary(&self) -> Result<FatBinaryHandle, StandinError> {
        // SAFETY: the wrapper is a 'static array the runtime only keeps a pointer to.
        let h = unsafe { (self.sym.register_fat_binary)(FAT_BINARY.as_ptr().cast_mut().cast()) };
        if h.is_null() {
            return Err(StandinError::Runtime {
                call: "__cudaRegisterFatBinary",
                code: 2,
            });
        }
        Ok(FatBinaryHandle(h as usize))
    }

    /// `__cudaRegisterFatBinaryEnd`.
    pub fn register_fat_binary_end(&self, h: FatBinaryHandle) {
        // SAFETY: the runtime checks the handle by address and ignores it otherwise.
        unsafe { (self.sym.register_fat_binary_end)(h.0 as *mut *mut c_void) }
    }

    /// `__cudaUnregisterFatBinary`: the handle's stubs no longer resolve.
    pub fn unregister_fat_binary(&self, h: FatBinaryHandle) {
        // SAFETY: the runtime checks the handle by address and ignores a foreign one.
        unsafe { (self.sym.unregister_fat_binary)(h.0 as *mut *mut c_void) }
    }

    /// `__cudaRegisterFunction(h, stub, name, name, -1, NULL, NULL, NULL, NULL, NULL)`, as
    /// nvcc's registration callback calls it; then `cudaGetLastError` to report a failure.
    pub fn register_function(
        &self,
        h: FatBinaryHandle,
        stub: StubAddress,
        name: &CStr,
    ) -> Result<(), StandinError> {
        // SAFETY: `name` is NUL-terminated and outlives the call.
        unsafe { self.register_function_at(h, stub, name.as_ptr()) }
    }

    /// [`Self::register_function`] with name `i` of `names`, passed without this process
    /// touching its page first (as a large library's `.rodata` at load).
    pub fn register_function_untouched(
        &self,
        h: FatBinaryHandle,
        stub: StubAddress,
        names: &UntouchedNames,
        i: usize,
    ) -> Result<(), StandinError> {
        let name = names.pointer(i).ok_or(StandinError::Runtime {
            call: "__cudaRegisterFunction",
            code: 1,
        })?;
        // SAFETY: `names` maps every name NUL-terminated and stays mapped during the call.
        unsafe { self.register_function_at(h, stub, name) }
    }

    /// # Safety
    /// `name` points at a NUL-terminated string that stays valid during the call.
    unsafe fn register_function_at(
        &self,
        h: FatBinaryHandle,
        stub: StubAddress,
        name: *const c_char,
    ) -> Result<(), StandinError> {
        let null = std::ptr::null_mut();
        // SAFETY: `name` is NUL-terminated and outlives the call (the caller's contract; the
        // stand-in copies it and never writes through deviceFun); the stub is only used as a
        // key; the handle is checked by address.
        unsafe {
            (self.sym.get_last_error)();
            (self.sym.register_function)(
                h.0 as *mut *mut c_void,
                stub.0 as *const c_char,
                name.cast_mut(),
                name,
                -1,
                null,
                null,
                null,
                null,
                null.cast(),
            );
        }
        // SAFETY: no arguments.
        check("__cudaRegisterFunction", unsafe {
            (self.sym.get_last_error)()
        })
    }

    /// `__cudaGetKernel`: the CUkernel registered for `stub` (counts as a call).
    pub fn get_kernel(&self, stub: StubAddress) -> Result<KernelHandle, StandinError> {
        let mut k: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the stub is only used as a key.
        check("__cudaGetKernel", unsafe {
            (self.sym.get_kernel)(&mut k, stub.0 as *const c_void)
        })?;
        Ok(KernelHandle(k as usize))
    }

    /// The CUkernel registered for `stub`, without counting as a `__cudaGetKernel` call.
    pub fn lookup(&self, stub: StubAddress) -> Result<KernelHandle, StandinError> {
        let mut k: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the stub is only used as a key.
        check("penrose_cudart_lookup", unsafe {
            (self.sym.lookup)(stub.0 as *const c_void, &mut k)
        })?;
        Ok(KernelHandle(k as usize))
    }

    /// `cudaLaunchKernel` (or `_ptsz`) with `func` (a CUkernel's value or a registered stub's
    /// address) and no kernel arguments.
    pub fn launch_kernel(
        &self,
        func: usize,
        launch: &Launch,
        per_thread_stream: bool,
    ) -> Result<(), StandinError> {
        let (f, call) = if per_thread_stream {
            (self.sym.launch_kernel_ptsz, "cudaLaunchKernel_ptsz")
        } else {
            (self.sym.launch_kernel, "cudaLaunchKernel")
        };
        // SAFETY: arguments as cuda_runtime_api.h declares them; the runtime resolves `func`
        // by table lookup and the driver validates it by address; `args` is null (no
        // parameters), which the stand-in never reads.
        let code = unsafe {
            f(
                func as *const c_void,
                launch.grid.into(),
                launch.block.into(),
                std::ptr::null_mut(),
                launch.shared_mem_bytes as usize,
                launch.stream.0 as *mut c_void,
            )
        };
        check(call, code)
    }

    /// One of the runtime's counters.
    pub fn count(&self, counter: RuntimeCounter) -> u64 {
        // SAFETY: plain integer argument; unknown indices return 0.
        unsafe { (self.sym.count)(counter as c_uint) }
    }
}

/// How the test application's stubs launch (`penrose_nvcc_app_launch`'s flags).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AppLaunch {
    /// The legacy path (`__NV_LEGACY_LAUNCH`): `cudaLaunchKernel(stub, ...)`, no
    /// `__cudaGetKernel`.
    pub legacy: bool,
    /// `cudaLaunchKernel_ptsz` (nvcc `--default-stream per-thread`).
    pub per_thread_stream: bool,
}

impl AppLaunch {
    fn flags(self) -> c_uint {
        c_uint::from(self.legacy) | (c_uint::from(self.per_thread_stream) << 1)
    }
}

type AppLaunchFn = unsafe extern "C" fn(
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    c_uint,
) -> c_int;

struct AppSymbols {
    stub_count: unsafe extern "C" fn() -> c_uint,
    stub: unsafe extern "C" fn(c_uint) -> *const c_void,
    kernel_name: unsafe extern "C" fn(c_uint) -> *const c_char,
    launch: AppLaunchFn,
}

/// The loaded test application (`libpenrose_nvcc_app.so`): a pool of kernels whose host stubs
/// carry nvcc's symbol names.
pub struct NvccApp {
    sym: AppSymbols,
    _library: Library,
}

impl NvccApp {
    /// Loads the application at `path` after `runtime` (its `DT_NEEDED libcudart.so.13`
    /// resolves to that runtime by soname).
    pub fn load(path: &Path, runtime: &Runtime) -> Result<Self, StandinError> {
        let _ = runtime;
        // SAFETY: the application has no initialisers beyond the C++ runtime's.
        let library = unsafe { Library::new(path)? };
        // SAFETY: each type is the signature of the generated entry points (build.rs).
        let sym = unsafe {
            AppSymbols {
                stub_count: symbol(&library, b"penrose_nvcc_app_stub_count\0")?,
                stub: symbol(&library, b"penrose_nvcc_app_stub\0")?,
                kernel_name: symbol(&library, b"penrose_nvcc_app_kernel_name\0")?,
                launch: symbol(&library, b"penrose_nvcc_app_launch\0")?,
            }
        };
        Ok(Self {
            sym,
            _library: library,
        })
    }

    /// Kernels in the pool.
    pub fn stub_count(&self) -> u32 {
        // SAFETY: no arguments.
        unsafe { (self.sym.stub_count)() }
    }

    /// Kernel `i`'s host function address (what nvcc registers), `None` past the pool.
    pub fn stub(&self, i: u32) -> Option<StubAddress> {
        // SAFETY: plain integer argument; out-of-range indices return NULL.
        let p = unsafe { (self.sym.stub)(i) };
        (!p.is_null()).then_some(StubAddress(p as usize))
    }

    /// Kernel `i`'s mangled name (`_Z13penrose_kNNNNPv`), `None` past the pool.
    pub fn kernel_name(&self, i: u32) -> Option<CString> {
        // SAFETY: plain integer argument; the result is NULL or a string literal of the
        // library, which stays loaded while `self` lives; it is copied before returning.
        unsafe {
            let p = (self.sym.kernel_name)(i);
            (!p.is_null()).then(|| CStr::from_ptr(p).to_owned())
        }
    }

    /// `penrose_kNNNN<<<grid, block, smem, stream>>>(nullptr)` for kernel `i`.
    pub fn launch(&self, i: u32, launch: &Launch, how: AppLaunch) -> Result<(), StandinError> {
        let [gx, gy, gz] = launch.grid;
        let [bx, by, bz] = launch.block;
        // SAFETY: integer arguments and an opaque stream pointer the stand-ins never
        // dereference.
        let code = unsafe {
            (self.sym.launch)(
                i,
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                launch.shared_mem_bytes,
                launch.stream.0 as *mut c_void,
                how.flags(),
            )
        };
        check("penrose_nvcc_app_launch", code)
    }
}

type StaticLaunchFn = unsafe extern "C" fn(
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
) -> c_int;

/// The loaded stripped library with a statically linked runtime (`libpenrose_static.so`).
pub struct StaticLib {
    kernel_count: unsafe extern "C" fn() -> c_uint,
    launch: StaticLaunchFn,
    _library: Library,
}

impl StaticLib {
    /// Loads the library at `path` after `driver` (it finds the driver by soname on first
    /// launch).
    pub fn load(path: &Path, driver: &Driver) -> Result<Self, StandinError> {
        let _ = driver;
        // SAFETY: the library has no initialisers beyond libc's.
        let library = unsafe { Library::new(path)? };
        // SAFETY: each type is the signature in csrc/static.c.
        let (kernel_count, launch) = unsafe {
            (
                symbol(&library, b"penrose_static_kernel_count\0")?,
                symbol(&library, b"penrose_static_launch\0")?,
            )
        };
        Ok(Self {
            kernel_count,
            launch,
            _library: library,
        })
    }

    /// Distinct kernels the library launches.
    pub fn kernel_count(&self) -> u32 {
        // SAFETY: no arguments.
        unsafe { (self.kernel_count)() }
    }

    /// Launches kernel `i` through the library's hidden runtime (`cuLaunchKernel`).
    pub fn launch(&self, i: u32, launch: &Launch) -> Result<(), StandinError> {
        let [gx, gy, gz] = launch.grid;
        let [bx, by, bz] = launch.block;
        // SAFETY: integer arguments and an opaque stream pointer the stand-ins never
        // dereference.
        let code = unsafe {
            (self.launch)(
                i,
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                launch.shared_mem_bytes,
                launch.stream.0 as *mut c_void,
            )
        };
        crate::abi::CuResult(code).check("penrose_static_launch")
    }
}

/// Kernel names laid out one per page table in a mapping this process has not touched, so that the
/// first read of each name faults its page in: what a probe meets when a large library (a real
/// `libtorch_cuda.so`) registers its kernels at load, straight from `.rodata`. A probe cannot
/// fault pages in, so it cannot read such a name itself.
///
/// The mapping stays for the life of the process, as a library's `.rodata` does: the agent
/// reads the names from it after registration (dropping this value leaves it mapped).
pub struct UntouchedNames {
    base: *mut c_void,
    count: usize,
}

impl UntouchedNames {
    /// One name per [`STRIDE`] bytes of a sparse file (names longer than a page less its NUL
    /// are refused).
    pub fn map(names: &[CString]) -> Result<Self, StandinError> {
        if let Some(long) = names.iter().find(|n| n.as_bytes_with_nul().len() > PAGE) {
            return Err(StandinError::NameTooLong(long.as_bytes().len()));
        }
        let io = |source| StandinError::Install {
            path: "memfd:penrose-untouched-names".into(),
            source,
        };
        let len = names.len().max(1) * STRIDE;
        // SAFETY: a NUL-terminated name and no flags.
        let fd = unsafe { libc::memfd_create(c"penrose-untouched-names".as_ptr(), 0) };
        if fd < 0 {
            return Err(io(std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just created and is owned here alone.
        let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        file.set_len(len as u64).map_err(io)?;
        for (i, name) in names.iter().enumerate() {
            std::os::unix::fs::FileExt::write_all_at(
                &file,
                name.as_bytes_with_nul(),
                (i * STRIDE) as u64,
            )
            .map_err(io)?;
        }
        // SAFETY: a fresh read-only private mapping of the whole file; nothing else maps it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io(std::io::Error::last_os_error()));
        }
        Ok(Self {
            base,
            count: names.len(),
        })
    }

    /// Name `i`, without reading it.
    fn pointer(&self, i: usize) -> Option<*const c_char> {
        // The offset stays inside the mapping (i < count, one stride each).
        (i < self.count).then(|| {
            self.base
                .cast::<u8>()
                .wrapping_add(i * STRIDE)
                .cast_const()
                .cast()
        })
    }
}

/// Pages are 4 KiB on the hosts the stand-in runs on.
const PAGE: usize = 4096;

/// Room per name: when a read faults one page in, the kernel maps the neighbouring pages it
/// already holds too ("fault-around", 64 KiB by default, never past a 2 MiB page table), which
/// would let the probe read the next names. One page table per name keeps every name apart.
const STRIDE: usize = 2 << 20;
