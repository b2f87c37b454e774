//! The stand-in loaded with `dlopen`, behind safe methods that check every result code.
//!
//! Function pointers are looked up once at load; calling them is as cheap as a call into a real
//! driver, which matters because the replayer's full speed is the probes' worst case.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::path::Path;

use libloading::Library;

use crate::abi::{
    CaptureMode, CaptureStatus, CuResult, EntryPoint, GraphExecUpdateResult,
    GraphExecUpdateResultInfo, GraphInstantiateParams, KernelNodeParamsV1, KernelNodeParamsV2,
    LaunchConfig, NextCounters,
};
use crate::error::StandinError;
use crate::ring::RING_VERSION;

macro_rules! handle {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub usize);

        impl $name {
            fn ptr(self) -> *mut c_void {
                self.0 as *mut c_void
            }
        }
    };
}

handle!(
    /// A `CUmodule`.
    ModuleHandle
);
handle!(
    /// A `CUfunction`: what launches name and what the agent maps to a kernel name.
    FunctionHandle
);
handle!(
    /// A `CUlibrary` (CUDA 12 library API).
    LibraryHandle
);
handle!(
    /// A `CUkernel` (CUDA 12 library API).
    KernelHandle
);
handle!(
    /// A `CUstream`; 0 is the legacy default stream.
    StreamHandle
);
handle!(
    /// A `CUgraph`: kernel nodes in insertion order, built explicitly or by stream capture.
    GraphHandle
);
handle!(
    /// A `CUgraphNode` (a kernel node; its graph's nodes are the only ones the stand-in makes).
    GraphNodeHandle
);
handle!(
    /// A `CUgraphExec`: an instantiated graph, what `cuGraphLaunch` runs.
    GraphExecHandle
);

/// What a kernel node launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeKernel {
    /// A `CUfunction` (`func`).
    Function(FunctionHandle),
    /// A `CUkernel`: `kern` with a null `func` in the v2 parameters (the node runs the function
    /// the kernel resolves to); cast as `func` in the v1 parameters, as cuda.h allows.
    Kernel(KernelHandle),
}

/// A kernel node's parameters, for both parameter versions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelNode {
    /// What it launches.
    pub kernel: NodeKernel,
    /// Grid dimensions, blocks.
    pub grid: [u32; 3],
    /// Block dimensions, threads.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, bytes.
    pub shared_mem_bytes: u32,
}

impl KernelNode {
    /// `CUDA_KERNEL_NODE_PARAMS_v1`.
    fn v1(&self) -> KernelNodeParamsV1 {
        let func = match self.kernel {
            NodeKernel::Function(f) => f.ptr(),
            NodeKernel::Kernel(k) => k.ptr(),
        };
        let [gx, gy, gz] = self.grid;
        let [bx, by, bz] = self.block;
        KernelNodeParamsV1 {
            func,
            grid_dim_x: gx,
            grid_dim_y: gy,
            grid_dim_z: gz,
            block_dim_x: bx,
            block_dim_y: by,
            block_dim_z: bz,
            shared_mem_bytes: self.shared_mem_bytes,
            kernel_params: std::ptr::null_mut(),
            extra: std::ptr::null_mut(),
        }
    }

    /// `CUDA_KERNEL_NODE_PARAMS_v2` (no context: the current one).
    fn v2(&self) -> KernelNodeParamsV2 {
        let v1 = self.v1();
        let (func, kern) = match self.kernel {
            NodeKernel::Function(f) => (f.ptr(), std::ptr::null_mut()),
            NodeKernel::Kernel(k) => (std::ptr::null_mut(), k.ptr()),
        };
        KernelNodeParamsV2 {
            func,
            grid_dim_x: v1.grid_dim_x,
            grid_dim_y: v1.grid_dim_y,
            grid_dim_z: v1.grid_dim_z,
            block_dim_x: v1.block_dim_x,
            block_dim_y: v1.block_dim_y,
            block_dim_z: v1.block_dim_z,
            shared_mem_bytes: v1.shared_mem_bytes,
            kernel_params: std::ptr::null_mut(),
            extra: std::ptr::null_mut(),
            kern,
            ctx: std::ptr::null_mut(),
        }
    }
}

type LaunchFn = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> c_int;
type LaunchExFn = unsafe extern "C" fn(
    *const LaunchConfig,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> c_int;
type LaunchCooperativeFn = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
) -> c_int;
type GraphLaunchFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;
type BeginCaptureFn = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
type EndCaptureFn = unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> c_int;
type AddKernelNodeFn<P> = unsafe extern "C" fn(
    *mut *mut c_void,
    *mut c_void,
    *const *mut c_void,
    usize,
    *const P,
) -> c_int;
type ExecSetParamsFn<P> = unsafe extern "C" fn(*mut c_void, *mut c_void, *const P) -> c_int;
type DestroyFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// The graph symbols of one loaded stand-in (see [`Symbols`]).
struct GraphSymbols {
    begin_capture: BeginCaptureFn,
    begin_capture_ptsz: BeginCaptureFn,
    end_capture: EndCaptureFn,
    end_capture_ptsz: EndCaptureFn,
    is_capturing: unsafe extern "C" fn(*mut c_void, *mut c_int) -> c_int,
    create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> c_int,
    add_kernel_node: AddKernelNodeFn<KernelNodeParamsV1>,
    add_kernel_node_v2: AddKernelNodeFn<KernelNodeParamsV2>,
    instantiate_with_flags: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, u64) -> c_int,
    instantiate_with_params:
        unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *mut GraphInstantiateParams) -> c_int,
    exec_set_params: ExecSetParamsFn<KernelNodeParamsV1>,
    exec_set_params_v2: ExecSetParamsFn<KernelNodeParamsV2>,
    exec_update:
        unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void, *mut c_int) -> c_int,
    exec_update_v2:
        unsafe extern "C" fn(*mut c_void, *mut c_void, *mut GraphExecUpdateResultInfo) -> c_int,
    destroy: DestroyFn,
    exec_destroy: DestroyFn,
    captured_launch_count: unsafe extern "C" fn() -> u64,
    node_launch_count: unsafe extern "C" fn() -> u64,
}

impl GraphSymbols {
    /// # Safety
    /// `library` must be a stand-in of this crate's ABI (the types are csrc/standin.c's).
    unsafe fn load(library: &Library) -> Result<Self, StandinError> {
        // SAFETY (all lookups): each type is the signature in csrc/standin.c, which follows
        // cuda.h for the CUDA symbols.
        unsafe {
            Ok(Self {
                begin_capture: symbol(library, b"cuStreamBeginCapture_v2\0")?,
                begin_capture_ptsz: symbol(library, b"cuStreamBeginCapture_v2_ptsz\0")?,
                end_capture: symbol(library, b"cuStreamEndCapture\0")?,
                end_capture_ptsz: symbol(library, b"cuStreamEndCapture_ptsz\0")?,
                is_capturing: symbol(library, b"cuStreamIsCapturing\0")?,
                create: symbol(library, b"cuGraphCreate\0")?,
                add_kernel_node: symbol(library, b"cuGraphAddKernelNode\0")?,
                add_kernel_node_v2: symbol(library, b"cuGraphAddKernelNode_v2\0")?,
                instantiate_with_flags: symbol(library, b"cuGraphInstantiateWithFlags\0")?,
                instantiate_with_params: symbol(library, b"cuGraphInstantiateWithParams\0")?,
                exec_set_params: symbol(library, b"cuGraphExecKernelNodeSetParams\0")?,
                exec_set_params_v2: symbol(library, b"cuGraphExecKernelNodeSetParams_v2\0")?,
                exec_update: symbol(library, b"cuGraphExecUpdate\0")?,
                exec_update_v2: symbol(library, b"cuGraphExecUpdate_v2\0")?,
                destroy: symbol(library, b"cuGraphDestroy\0")?,
                exec_destroy: symbol(library, b"cuGraphExecDestroy\0")?,
                captured_launch_count: symbol(library, b"penrose_standin_captured_launch_count\0")?,
                node_launch_count: symbol(library, b"penrose_standin_graph_node_launch_count\0")?,
            })
        }
    }
}

/// The symbols of one loaded stand-in. Fields are plain function pointers copied out of
/// `libloading::Symbol`s; they stay valid because `Driver` keeps the `Library` alive.
struct Symbols {
    init: unsafe extern "C" fn(c_uint) -> c_int,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> c_int,
    ctx_create: unsafe extern "C" fn(*mut *mut c_void, c_uint, c_int) -> c_int,
    module_load_data: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> c_int,
    module_get_function:
        unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> c_int,
    library_load_data: unsafe extern "C" fn(
        *mut *mut c_void,
        *const c_void,
        *mut c_int,
        *mut *mut c_void,
        c_uint,
        *mut c_int,
        *mut *mut c_void,
        c_uint,
    ) -> c_int,
    library_get_kernel: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> c_int,
    kernel_get_function: unsafe extern "C" fn(*mut *mut c_void, *mut c_void) -> c_int,
    launch_kernel: LaunchFn,
    launch_kernel_ptsz: LaunchFn,
    launch_kernel_ex: LaunchExFn,
    launch_kernel_ex_ptsz: LaunchExFn,
    launch_cooperative: LaunchCooperativeFn,
    launch_cooperative_ptsz: LaunchCooperativeFn,
    graph_launch: GraphLaunchFn,
    graph_launch_ptsz: GraphLaunchFn,
    graph: GraphSymbols,
    launch_count: unsafe extern "C" fn(c_uint) -> u64,
    function_count: unsafe extern "C" fn() -> u64,
    name_call_count: unsafe extern "C" fn() -> u64,
    private_kernel_count: unsafe extern "C" fn() -> u64,
    private_kernel: unsafe extern "C" fn(*mut *mut c_void, *const c_char) -> c_int,
    set_next_counters: unsafe extern "C" fn(*const NextCounters),
    abi_version: unsafe extern "C" fn() -> u32,
    device_get_count: unsafe extern "C" fn(*mut c_int) -> c_int,
    device_get_uuid: unsafe extern "C" fn(*mut [u8; 16], c_int) -> c_int,
    device_get_uuid_v1: unsafe extern "C" fn(*mut [u8; 16], c_int) -> c_int,
    primary_ctx_retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int,
    ctx_set_current: unsafe extern "C" fn(*mut c_void) -> c_int,
    stream_create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> c_int,
}

/// Grid, block, shared memory and stream of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Grid dimensions, blocks.
    pub grid: [u32; 3],
    /// Block dimensions, threads.
    pub block: [u32; 3],
    /// Shared memory per block, bytes (`sharedMemBytes`).
    pub shared_mem_bytes: u32,
    /// The stream.
    pub stream: StreamHandle,
}

/// A loaded stand-in libcuda. Its state (handles, counters) belongs to the loaded copy, and its
/// ring is named after the process: load one copy per process. (`dlopen` of the same file
/// returns the same copy, but two installed copies are two files, hence two libraries.)
pub struct Driver {
    sym: Symbols,
    _library: Library,
}

/// Looks up `name` and copies the function pointer out.
///
/// # Safety
/// `T` must be the symbol's true C type.
unsafe fn symbol<T: Copy>(library: &Library, name: &[u8]) -> Result<T, StandinError> {
    // SAFETY: the caller names the symbol's C type; the pointer is used only while the library
    // stays loaded, which `Driver` guarantees by owning it.
    let s = unsafe { library.get::<T>(name)? };
    Ok(*s)
}

impl Driver {
    /// Loads the library at `path` (normally an installed `libcuda.so.1`) and checks that it is
    /// a stand-in of this crate's ABI version.
    pub fn load(path: &Path) -> Result<Self, StandinError> {
        // SAFETY: loading runs the library's initialisers; the stand-in has none beyond libc's.
        let library = unsafe { Library::new(path)? };
        // SAFETY (all lookups below): each type is the signature in csrc/standin.c, which
        // follows cuda.h for the CUDA symbols.
        let sym = unsafe {
            Symbols {
                init: symbol(&library, b"cuInit\0")?,
                device_get: symbol(&library, b"cuDeviceGet\0")?,
                ctx_create: symbol(&library, b"cuCtxCreate_v2\0")?,
                module_load_data: symbol(&library, b"cuModuleLoadData\0")?,
                module_get_function: symbol(&library, b"cuModuleGetFunction\0")?,
                library_load_data: symbol(&library, b"cuLibraryLoadData\0")?,
                library_get_kernel: symbol(&library, b"cuLibraryGetKernel\0")?,
                kernel_get_function: symbol(&library, b"cuKernelGetFunction\0")?,
                launch_kernel: symbol(&library, b"cuLaunchKernel\0")?,
                launch_kernel_ptsz: symbol(&library, b"cuLaunchKernel_ptsz\0")?,
                launch_kernel_ex: symbol(&library, b"cuLaunchKernelEx\0")?,
                launch_kernel_ex_ptsz: symbol(&library, b"cuLaunchKernelEx_ptsz\0")?,
                launch_cooperative: symbol(&library, b"cuLaunchCooperativeKernel\0")?,
                launch_cooperative_ptsz: symbol(&library, b"cuLaunchCooperativeKernel_ptsz\0")?,
                graph_launch: symbol(&library, b"cuGraphLaunch\0")?,
                graph_launch_ptsz: symbol(&library, b"cuGraphLaunch_ptsz\0")?,
                graph: GraphSymbols::load(&library)?,
                launch_count: symbol(&library, b"penrose_standin_launch_count\0")?,
                function_count: symbol(&library, b"penrose_standin_function_count\0")?,
                name_call_count: symbol(&library, b"penrose_standin_name_call_count\0")?,
                private_kernel_count: symbol(&library, b"penrose_standin_private_kernel_count\0")?,
                private_kernel: symbol(&library, b"penrose_standin_private_kernel\0")?,
                set_next_counters: symbol(&library, b"penrose_standin_set_next_counters\0")?,
                abi_version: symbol(&library, b"penrose_standin_abi_version\0")?,
                device_get_count: symbol(&library, b"cuDeviceGetCount\0")?,
                device_get_uuid: symbol(&library, b"cuDeviceGetUuid_v2\0")?,
                device_get_uuid_v1: symbol(&library, b"cuDeviceGetUuid\0")?,
                primary_ctx_retain: symbol(&library, b"cuDevicePrimaryCtxRetain\0")?,
                ctx_set_current: symbol(&library, b"cuCtxSetCurrent\0")?,
                stream_create: symbol(&library, b"cuStreamCreate\0")?,
            }
        };
        // SAFETY: takes no arguments, returns a constant.
        let found = unsafe { (sym.abi_version)() };
        if found != RING_VERSION {
            return Err(StandinError::AbiMismatch {
                found,
                expected: RING_VERSION,
            });
        }
        Ok(Self {
            sym,
            _library: library,
        })
    }

    /// `cuInit(0)`; also creates this process's counter ring.
    pub fn init(&self) -> Result<(), StandinError> {
        // SAFETY: plain integer argument.
        CuResult(unsafe { (self.sym.init)(0) }).check("cuInit")
    }

    /// `cuDeviceGet` then `cuCtxCreate_v2` for device `ordinal`, as an application starts.
    pub fn create_context(&self, ordinal: i32) -> Result<(), StandinError> {
        let mut device: c_int = -1;
        // SAFETY: `device` is a valid out-pointer for the call's duration.
        CuResult(unsafe { (self.sym.device_get)(&mut device, ordinal) }).check("cuDeviceGet")?;
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out-pointer for the call's duration.
        CuResult(unsafe { (self.sym.ctx_create)(&mut ctx, 0, device) }).check("cuCtxCreate_v2")
    }

    /// `cuDeviceGetCount`: the devices this process sees (after `CUDA_VISIBLE_DEVICES`).
    pub fn device_count(&self) -> Result<i32, StandinError> {
        let mut count: c_int = 0;
        // SAFETY: `count` is a valid out-pointer for the call's duration.
        CuResult(unsafe { (self.sym.device_get_count)(&mut count) }).check("cuDeviceGetCount")?;
        Ok(count)
    }

    /// `cuDeviceGetUuid_v2` of `ordinal`, as an application asking for its devices'
    /// properties does: for a MIG instance, the instance's own UUID.
    pub fn device_uuid(&self, ordinal: i32) -> Result<[u8; 16], StandinError> {
        let mut uuid = [0u8; 16];
        // SAFETY: `uuid` is a valid 16-byte out-buffer (`CUuuid`) for the call's duration.
        CuResult(unsafe { (self.sym.device_get_uuid)(&mut uuid, ordinal) })
            .check("cuDeviceGetUuid_v2")?;
        Ok(uuid)
    }

    /// `cuDeviceGetUuid` (the pre-11.4 call, still what older applications and libraries
    /// make) of `ordinal`: for a MIG instance, the physical GPU's UUID, so a tool that maps
    /// UUIDs to devices must not take it for the instance's.
    pub fn device_uuid_v1(&self, ordinal: i32) -> Result<[u8; 16], StandinError> {
        let mut uuid = [0u8; 16];
        // SAFETY: `uuid` is a valid 16-byte out-buffer (`CUuuid`) for the call's duration.
        CuResult(unsafe { (self.sym.device_get_uuid_v1)(&mut uuid, ordinal) })
            .check("cuDeviceGetUuid")?;
        Ok(uuid)
    }

    /// Makes device `ordinal` this thread's current device as the CUDA runtime does
    /// (`cudaSetDevice`): `cuDeviceGet`, `cuDevicePrimaryCtxRetain`, `cuCtxSetCurrent`.
    pub fn use_device(&self, ordinal: i32) -> Result<(), StandinError> {
        let mut device: c_int = -1;
        // SAFETY: `device` is a valid out-pointer for the call's duration.
        CuResult(unsafe { (self.sym.device_get)(&mut device, ordinal) }).check("cuDeviceGet")?;
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out-pointer for the call's duration.
        CuResult(unsafe { (self.sym.primary_ctx_retain)(&mut ctx, device) })
            .check("cuDevicePrimaryCtxRetain")?;
        // SAFETY: `ctx` is the handle the stand-in just returned.
        CuResult(unsafe { (self.sym.ctx_set_current)(ctx) }).check("cuCtxSetCurrent")
    }

    /// `cuStreamCreate`: a stream of this thread's current context.
    pub fn stream_create(&self) -> Result<StreamHandle, StandinError> {
        let mut stream: *mut c_void = std::ptr::null_mut();
        // SAFETY: `stream` is a valid out-pointer for the call's duration.
        CuResult(unsafe { (self.sym.stream_create)(&mut stream, 0) }).check("cuStreamCreate")?;
        Ok(StreamHandle(stream as usize))
    }

    /// `cuModuleLoadData` with `image` (the stand-in accepts any non-empty image).
    pub fn module_load_data(&self, image: &CStr) -> Result<ModuleHandle, StandinError> {
        let mut module: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; `image` outlives the call.
        CuResult(unsafe { (self.sym.module_load_data)(&mut module, image.as_ptr().cast()) })
            .check("cuModuleLoadData")?;
        Ok(ModuleHandle(module as usize))
    }

    /// `cuModuleGetFunction`: the handle for `name` in `module`.
    pub fn module_get_function(
        &self,
        module: ModuleHandle,
        name: &CStr,
    ) -> Result<FunctionHandle, StandinError> {
        let mut f: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; `name` is NUL-terminated and outlives the call; the
        // stand-in checks the module handle itself.
        CuResult(unsafe { (self.sym.module_get_function)(&mut f, module.ptr(), name.as_ptr()) })
            .check("cuModuleGetFunction")?;
        Ok(FunctionHandle(f as usize))
    }

    /// `cuLibraryLoadData` with no JIT or library options.
    pub fn library_load_data(&self, code: &CStr) -> Result<LibraryHandle, StandinError> {
        let mut library: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; zero option counts with null arrays, as cuda.h allows.
        CuResult(unsafe {
            (self.sym.library_load_data)(
                &mut library,
                code.as_ptr().cast(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        })
        .check("cuLibraryLoadData")?;
        Ok(LibraryHandle(library as usize))
    }

    /// `cuLibraryGetKernel`: the kernel handle for `name` in `library`.
    pub fn library_get_kernel(
        &self,
        library: LibraryHandle,
        name: &CStr,
    ) -> Result<KernelHandle, StandinError> {
        let mut k: *mut c_void = std::ptr::null_mut();
        // SAFETY: as for `module_get_function`.
        CuResult(unsafe { (self.sym.library_get_kernel)(&mut k, library.ptr(), name.as_ptr()) })
            .check("cuLibraryGetKernel")?;
        Ok(KernelHandle(k as usize))
    }

    /// `cuKernelGetFunction`: the function handle behind a kernel handle.
    pub fn kernel_get_function(
        &self,
        kernel: KernelHandle,
    ) -> Result<FunctionHandle, StandinError> {
        let mut f: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the stand-in checks the kernel handle's tag.
        CuResult(unsafe { (self.sym.kernel_get_function)(&mut f, kernel.ptr()) })
            .check("cuKernelGetFunction")?;
        Ok(FunctionHandle(f as usize))
    }

    /// `penrose_standin_private_kernel`: the kernel for `name` through the driver's private
    /// path (what the runtime uses), touching no public name function. A CUkernel may be
    /// launched cast as a function: `FunctionHandle(kernel.0)`.
    pub fn private_kernel(&self, name: &CStr) -> Result<KernelHandle, StandinError> {
        let mut k: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; `name` is NUL-terminated and outlives the call.
        CuResult(unsafe { (self.sym.private_kernel)(&mut k, name.as_ptr()) })
            .check("penrose_standin_private_kernel")?;
        Ok(KernelHandle(k as usize))
    }

    /// Launches `f` through `entry` with no kernel parameters. For the graph entry points `f`
    /// is passed as the `CUgraphExec`, which the stand-in refuses (`CUDA_ERROR_INVALID_VALUE`)
    /// unless it is a live executable graph's value: use [`Driver::graph_launch`].
    pub fn launch(
        &self,
        entry: EntryPoint,
        f: FunctionHandle,
        launch: &Launch,
    ) -> Result<(), StandinError> {
        let s = &self.sym;
        let code = match entry {
            EntryPoint::LaunchKernel => self.launch_plain(s.launch_kernel, f, launch),
            EntryPoint::LaunchKernelPtsz => self.launch_plain(s.launch_kernel_ptsz, f, launch),
            EntryPoint::LaunchKernelEx => self.launch_ex(s.launch_kernel_ex, f, launch),
            EntryPoint::LaunchKernelExPtsz => self.launch_ex(s.launch_kernel_ex_ptsz, f, launch),
            EntryPoint::LaunchCooperativeKernel => {
                self.launch_cooperative(s.launch_cooperative, f, launch)
            }
            EntryPoint::LaunchCooperativeKernelPtsz => {
                self.launch_cooperative(s.launch_cooperative_ptsz, f, launch)
            }
            // SAFETY: the arguments of cuGraphLaunch's cuda.h signature; the stand-in
            // validates the handles.
            EntryPoint::GraphLaunch => unsafe { (s.graph_launch)(f.ptr(), launch.stream.ptr()) },
            // SAFETY: as above, for cuGraphLaunch_ptsz.
            EntryPoint::GraphLaunchPtsz => unsafe {
                (s.graph_launch_ptsz)(f.ptr(), launch.stream.ptr())
            },
        };
        CuResult(code).check(entry.symbol())
    }

    /// Calls `call`, one of this library's `cuLaunchKernel` symbols (`self.sym`), with no
    /// kernel parameters; returns its result code.
    fn launch_plain(&self, call: LaunchFn, f: FunctionHandle, launch: &Launch) -> c_int {
        let [gx, gy, gz] = launch.grid;
        let [bx, by, bz] = launch.block;
        let null = std::ptr::null_mut();
        // SAFETY: `call` is this library's symbol with cuLaunchKernel's cuda.h signature, and
        // gets its arguments; the parameter arrays are null; the stand-in validates the handles.
        unsafe {
            call(
                f.ptr(),
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                launch.shared_mem_bytes,
                launch.stream.ptr(),
                null,
                null,
            )
        }
    }

    /// Calls `call`, one of this library's `cuLaunchKernelEx` symbols (`self.sym`), with the
    /// launch as its config and no kernel parameters; returns its result code.
    fn launch_ex(&self, call: LaunchExFn, f: FunctionHandle, launch: &Launch) -> c_int {
        let [gx, gy, gz] = launch.grid;
        let [bx, by, bz] = launch.block;
        let null: *mut c_void = std::ptr::null_mut();
        let config = LaunchConfig {
            grid_dim_x: gx,
            grid_dim_y: gy,
            grid_dim_z: gz,
            block_dim_x: bx,
            block_dim_y: by,
            block_dim_z: bz,
            shared_mem_bytes: launch.shared_mem_bytes,
            h_stream: launch.stream.ptr(),
            attrs: null.cast(),
            num_attrs: 0,
        };
        // SAFETY: `call` is this library's symbol with cuLaunchKernelEx's cuda.h signature;
        // `config` outlives the call; the parameter arrays are null; the stand-in validates
        // the handles.
        unsafe { call(&config, f.ptr(), null.cast(), null.cast()) }
    }

    /// Calls `call`, one of this library's `cuLaunchCooperativeKernel` symbols (`self.sym`),
    /// with no kernel parameters; returns its result code.
    fn launch_cooperative(
        &self,
        call: LaunchCooperativeFn,
        f: FunctionHandle,
        launch: &Launch,
    ) -> c_int {
        let [gx, gy, gz] = launch.grid;
        let [bx, by, bz] = launch.block;
        // SAFETY: `call` is this library's symbol with cuLaunchCooperativeKernel's cuda.h
        // signature, and gets its arguments; the parameter array is null; the stand-in
        // validates the handles.
        unsafe {
            call(
                f.ptr(),
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                launch.shared_mem_bytes,
                launch.stream.ptr(),
                std::ptr::null_mut(),
            )
        }
    }

    /// `cuStreamBeginCapture_v2`: launches on `stream` (a stream the stand-in made, of the
    /// current context) become kernel nodes of a new graph until [`Driver::end_capture`].
    pub fn begin_capture(
        &self,
        stream: StreamHandle,
        mode: CaptureMode,
    ) -> Result<(), StandinError> {
        // SAFETY: plain values; the stand-in checks the stream.
        CuResult(unsafe { (self.sym.graph.begin_capture)(stream.ptr(), mode as c_int) })
            .check("cuStreamBeginCapture_v2")
    }

    /// `cuStreamBeginCapture_v2_ptsz` (the per-thread default stream variant).
    pub fn begin_capture_ptsz(
        &self,
        stream: StreamHandle,
        mode: CaptureMode,
    ) -> Result<(), StandinError> {
        // SAFETY: plain values; the stand-in checks the stream.
        CuResult(unsafe { (self.sym.graph.begin_capture_ptsz)(stream.ptr(), mode as c_int) })
            .check("cuStreamBeginCapture_v2_ptsz")
    }

    /// `cuStreamEndCapture`: the captured graph (an invalidated capture is
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`, with no graph).
    pub fn end_capture(&self, stream: StreamHandle) -> Result<GraphHandle, StandinError> {
        let mut graph: *mut c_void = std::ptr::null_mut();
        // SAFETY: `graph` is a valid out-pointer for the call's duration.
        CuResult(unsafe { (self.sym.graph.end_capture)(stream.ptr(), &mut graph) })
            .check("cuStreamEndCapture")?;
        Ok(GraphHandle(graph as usize))
    }

    /// `cuStreamEndCapture_ptsz`.
    pub fn end_capture_ptsz(&self, stream: StreamHandle) -> Result<GraphHandle, StandinError> {
        let mut graph: *mut c_void = std::ptr::null_mut();
        // SAFETY: `graph` is a valid out-pointer for the call's duration.
        CuResult(unsafe { (self.sym.graph.end_capture_ptsz)(stream.ptr(), &mut graph) })
            .check("cuStreamEndCapture_ptsz")?;
        Ok(GraphHandle(graph as usize))
    }

    /// `cuStreamIsCapturing`.
    pub fn is_capturing(&self, stream: StreamHandle) -> Result<CaptureStatus, StandinError> {
        let mut status: c_int = -1;
        // SAFETY: `status` is a valid out-pointer (a C enum is an int) for the call's duration.
        CuResult(unsafe { (self.sym.graph.is_capturing)(stream.ptr(), &mut status) })
            .check("cuStreamIsCapturing")?;
        CaptureStatus::from_c(status).ok_or(StandinError::Cuda {
            call: "cuStreamIsCapturing",
            code: CuResult::INVALID_VALUE,
        })
    }

    /// `cuGraphCreate(&graph, 0)`: an empty graph.
    pub fn graph_create(&self) -> Result<GraphHandle, StandinError> {
        let mut graph: *mut c_void = std::ptr::null_mut();
        // SAFETY: `graph` is a valid out-pointer for the call's duration.
        CuResult(unsafe { (self.sym.graph.create)(&mut graph, 0) }).check("cuGraphCreate")?;
        Ok(GraphHandle(graph as usize))
    }

    /// `cuGraphAddKernelNode` (v1 parameters) after `dependencies` (nodes of `graph`). The node
    /// takes the counters set with [`Driver::set_next_counters`], as a launch would.
    pub fn graph_add_kernel_node(
        &self,
        graph: GraphHandle,
        dependencies: &[GraphNodeHandle],
        node: &KernelNode,
    ) -> Result<GraphNodeHandle, StandinError> {
        let deps: Vec<*mut c_void> = dependencies.iter().map(|d| d.ptr()).collect();
        let params = node.v1();
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; `deps` holds `deps.len()` handles and `params` is a v1
        // struct, both alive for the call; the stand-in checks every handle.
        CuResult(unsafe {
            (self.sym.graph.add_kernel_node)(
                &mut out,
                graph.ptr(),
                deps.as_ptr(),
                deps.len(),
                &params,
            )
        })
        .check("cuGraphAddKernelNode")?;
        Ok(GraphNodeHandle(out as usize))
    }

    /// `cuGraphAddKernelNode_v2` (v2 parameters: a [`NodeKernel::Kernel`] goes in `kern`).
    pub fn graph_add_kernel_node_v2(
        &self,
        graph: GraphHandle,
        dependencies: &[GraphNodeHandle],
        node: &KernelNode,
    ) -> Result<GraphNodeHandle, StandinError> {
        let deps: Vec<*mut c_void> = dependencies.iter().map(|d| d.ptr()).collect();
        let params = node.v2();
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: as for `graph_add_kernel_node`, with a v2 struct.
        CuResult(unsafe {
            (self.sym.graph.add_kernel_node_v2)(
                &mut out,
                graph.ptr(),
                deps.as_ptr(),
                deps.len(),
                &params,
            )
        })
        .check("cuGraphAddKernelNode_v2")?;
        Ok(GraphNodeHandle(out as usize))
    }

    /// `cuGraphInstantiateWithFlags`: an executable copy of `graph`.
    pub fn graph_instantiate(
        &self,
        graph: GraphHandle,
        flags: u64,
    ) -> Result<GraphExecHandle, StandinError> {
        let mut exec: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; plain values otherwise.
        CuResult(unsafe { (self.sym.graph.instantiate_with_flags)(&mut exec, graph.ptr(), flags) })
            .check("cuGraphInstantiateWithFlags")?;
        Ok(GraphExecHandle(exec as usize))
    }

    /// `cuGraphInstantiateWithParams` with `flags` and `upload_stream`.
    pub fn graph_instantiate_with_params(
        &self,
        graph: GraphHandle,
        flags: u64,
        upload_stream: StreamHandle,
    ) -> Result<GraphExecHandle, StandinError> {
        let mut params = GraphInstantiateParams {
            flags,
            upload_stream: upload_stream.ptr(),
            err_node_out: std::ptr::null_mut(),
            result_out: -1,
        };
        let mut exec: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer and parameter struct for the call's duration.
        CuResult(unsafe {
            (self.sym.graph.instantiate_with_params)(&mut exec, graph.ptr(), &mut params)
        })
        .check("cuGraphInstantiateWithParams")?;
        Ok(GraphExecHandle(exec as usize))
    }

    /// `cuGraphExecKernelNodeSetParams` (v1): `node` (of the graph `exec` was instantiated
    /// from) runs with `params` from the next launch on, with the counters set with
    /// [`Driver::set_next_counters`].
    pub fn graph_exec_kernel_node_set_params(
        &self,
        exec: GraphExecHandle,
        node: GraphNodeHandle,
        params: &KernelNode,
    ) -> Result<(), StandinError> {
        let p = params.v1();
        // SAFETY: `p` is a v1 struct alive for the call; the stand-in checks the handles.
        CuResult(unsafe { (self.sym.graph.exec_set_params)(exec.ptr(), node.ptr(), &p) })
            .check("cuGraphExecKernelNodeSetParams")
    }

    /// `cuGraphExecKernelNodeSetParams_v2`.
    pub fn graph_exec_kernel_node_set_params_v2(
        &self,
        exec: GraphExecHandle,
        node: GraphNodeHandle,
        params: &KernelNode,
    ) -> Result<(), StandinError> {
        let p = params.v2();
        // SAFETY: `p` is a v2 struct alive for the call; the stand-in checks the handles.
        CuResult(unsafe { (self.sym.graph.exec_set_params_v2)(exec.ptr(), node.ptr(), &p) })
            .check("cuGraphExecKernelNodeSetParams_v2")
    }

    /// `cuGraphExecUpdate` (the CUDA 11 signature): `exec` takes `graph`'s node parameters, or
    /// [`StandinError::GraphExecUpdate`] says why not.
    pub fn graph_exec_update(
        &self,
        exec: GraphExecHandle,
        graph: GraphHandle,
    ) -> Result<(), StandinError> {
        let mut error_node: *mut c_void = std::ptr::null_mut();
        let mut result: c_int = -1;
        // SAFETY: valid out-pointers for the call's duration.
        let code = CuResult(unsafe {
            (self.sym.graph.exec_update)(exec.ptr(), graph.ptr(), &mut error_node, &mut result)
        });
        update_result("cuGraphExecUpdate", code, result)
    }

    /// `cuGraphExecUpdate_v2` (`CUgraphExecUpdateResultInfo`).
    pub fn graph_exec_update_v2(
        &self,
        exec: GraphExecHandle,
        graph: GraphHandle,
    ) -> Result<(), StandinError> {
        let mut info = GraphExecUpdateResultInfo {
            result: -1,
            error_node: std::ptr::null_mut(),
            error_from_node: std::ptr::null_mut(),
        };
        // SAFETY: `info` is a valid out-struct for the call's duration.
        let code = CuResult(unsafe {
            (self.sym.graph.exec_update_v2)(exec.ptr(), graph.ptr(), &mut info)
        });
        update_result("cuGraphExecUpdate_v2", code, info.result)
    }

    /// `cuGraphLaunch`: runs `exec`'s kernel nodes in order on `stream` (one ring record each).
    pub fn graph_launch(
        &self,
        exec: GraphExecHandle,
        stream: StreamHandle,
    ) -> Result<(), StandinError> {
        // SAFETY: plain values; the stand-in checks the exec handle.
        CuResult(unsafe { (self.sym.graph_launch)(exec.ptr(), stream.ptr()) })
            .check("cuGraphLaunch")
    }

    /// `cuGraphLaunch_ptsz`.
    pub fn graph_launch_ptsz(
        &self,
        exec: GraphExecHandle,
        stream: StreamHandle,
    ) -> Result<(), StandinError> {
        // SAFETY: plain values; the stand-in checks the exec handle.
        CuResult(unsafe { (self.sym.graph_launch_ptsz)(exec.ptr(), stream.ptr()) })
            .check("cuGraphLaunch_ptsz")
    }

    /// `cuGraphDestroy` (executable graphs made from it stay valid).
    pub fn graph_destroy(&self, graph: GraphHandle) -> Result<(), StandinError> {
        // SAFETY: plain value; the stand-in checks the handle.
        CuResult(unsafe { (self.sym.graph.destroy)(graph.ptr()) }).check("cuGraphDestroy")
    }

    /// `cuGraphExecDestroy`.
    pub fn graph_exec_destroy(&self, exec: GraphExecHandle) -> Result<(), StandinError> {
        // SAFETY: plain value; the stand-in checks the handle.
        CuResult(unsafe { (self.sym.graph.exec_destroy)(exec.ptr()) }).check("cuGraphExecDestroy")
    }

    /// Kernel launches stream capture recorded as graph nodes in this process so far (they are
    /// not counted as launches).
    pub fn captured_launch_count(&self) -> u64 {
        // SAFETY: no arguments.
        unsafe { (self.sym.graph.captured_launch_count)() }
    }

    /// Kernel nodes run by graph launches in this process so far.
    pub fn graph_node_launch_count(&self) -> u64 {
        // SAFETY: no arguments.
        unsafe { (self.sym.graph.node_launch_count)() }
    }

    /// Hands the trace fields of the calling thread's next launch to the stand-in.
    pub fn set_next_counters(&self, counters: &NextCounters) {
        // SAFETY: the pointer is valid for the call; the stand-in copies the struct.
        unsafe { (self.sym.set_next_counters)(counters) }
    }

    /// Launches through `entry` in this process so far.
    pub fn launch_count(&self, entry: EntryPoint) -> u64 {
        // SAFETY: plain integer argument; out-of-range indices return 0.
        unsafe { (self.sym.launch_count)(entry as c_uint) }
    }

    /// Distinct function handles the stand-in has made in this process (by any path).
    pub fn function_count(&self) -> u64 {
        // SAFETY: no arguments.
        unsafe { (self.sym.function_count)() }
    }

    /// Calls of the public name functions (`cuModuleGetFunction`, `cuLibraryGetKernel`,
    /// `cuKernelGetFunction`) in this process so far, whatever their result.
    pub fn name_call_count(&self) -> u64 {
        // SAFETY: no arguments.
        unsafe { (self.sym.name_call_count)() }
    }

    /// Distinct kernels made through the private path in this process so far.
    pub fn private_kernel_count(&self) -> u64 {
        // SAFETY: no arguments.
        unsafe { (self.sym.private_kernel_count)() }
    }
}

/// The outcome of a `cuGraphExecUpdate` call: `CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE` with the
/// reason the result names, any other error as it is.
fn update_result(call: &'static str, code: CuResult, result: c_int) -> Result<(), StandinError> {
    if code == CuResult::GRAPH_EXEC_UPDATE_FAILURE {
        return Err(StandinError::GraphExecUpdate {
            call,
            code,
            result: GraphExecUpdateResult(result),
        });
    }
    code.check(call)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{CounterRing, ring_path};

    /// One copy of the stand-in for all tests of this process (see [`Driver`]).
    fn driver() -> &'static Driver {
        static DRIVER: std::sync::OnceLock<Driver> = std::sync::OnceLock::new();
        DRIVER.get_or_init(|| {
            let d = Driver::load(Path::new(crate::LIBCUDA_PATH)).unwrap();
            d.init().unwrap();
            d.create_context(0).unwrap();
            d
        })
    }

    fn launch_on(stream: usize) -> Launch {
        Launch {
            grid: [4, 2, 1],
            block: [128, 1, 1],
            shared_mem_bytes: 1024,
            stream: StreamHandle(stream),
        }
    }

    #[test]
    fn handles_are_stable_per_name_and_distinct_across_names() {
        let d = driver();
        let m = d.module_load_data(c"image").unwrap();
        let a = d.module_get_function(m, c"kernel_a").unwrap();
        let b = d.module_get_function(m, c"kernel_b").unwrap();
        assert_ne!(a, b);
        assert_eq!(a, d.module_get_function(m, c"kernel_a").unwrap());
        // Another module's kernel of the same name is another function.
        let m2 = d.module_load_data(c"image").unwrap();
        assert_ne!(a, d.module_get_function(m2, c"kernel_a").unwrap());

        let lib = d.library_load_data(c"image").unwrap();
        let k = d.library_get_kernel(lib, c"kernel_a").unwrap();
        assert_eq!(k, d.library_get_kernel(lib, c"kernel_a").unwrap());
        let f = d.kernel_get_function(k).unwrap();
        assert_ne!(f.0, k.0);
        assert_eq!(f, d.kernel_get_function(k).unwrap());
    }

    #[test]
    fn private_kernels_launch_as_functions_without_name_calls() {
        let d = driver();
        let k = d.private_kernel(c"private_kernel_a").unwrap();
        assert_eq!(k, d.private_kernel(c"private_kernel_a").unwrap());
        assert_ne!(k, d.private_kernel(c"private_kernel_b").unwrap());
        assert!(d.private_kernel_count() >= 2);
        // Every kernel launch entry point takes the CUkernel cast as CUfunction. (The ring is
        // another test's to remove; tests/runtime.rs checks the records of such launches.)
        for entry in EntryPoint::ALL.into_iter().take(6) {
            let before = d.launch_count(entry);
            d.launch(entry, FunctionHandle(k.0), &launch_on(0x77))
                .unwrap();
            assert!(d.launch_count(entry) > before, "{entry:?}");
        }
        let err = d.private_kernel(c"").unwrap_err();
        assert!(matches!(err, StandinError::Cuda { code, .. } if code == CuResult::NOT_FOUND));
    }

    #[test]
    fn bad_handles_and_dimensions_are_refused() {
        let d = driver();
        let err = d
            .launch(EntryPoint::LaunchKernel, FunctionHandle(8), &launch_on(0))
            .unwrap_err();
        assert!(matches!(err, StandinError::Cuda { code, .. } if code == CuResult::INVALID_HANDLE));
        let m = d.module_load_data(c"image").unwrap();
        let f = d.module_get_function(m, c"zero_grid").unwrap();
        let mut l = launch_on(0);
        l.grid = [0, 1, 1];
        let err = d.launch(EntryPoint::LaunchKernelEx, f, &l).unwrap_err();
        assert!(matches!(err, StandinError::Cuda { code, .. } if code == CuResult::INVALID_VALUE));
        let err = d.module_get_function(ModuleHandle(16), c"x").unwrap_err();
        assert!(matches!(err, StandinError::Cuda { code, .. } if code == CuResult::INVALID_HANDLE));
    }

    #[test]
    fn every_entry_point_counts_and_records_its_launches() {
        let d = driver();
        let m = d.module_load_data(c"image").unwrap();
        let f = d
            .module_get_function(m, c"every_entry_point_counts")
            .unwrap();
        let mut ring = CounterRing::open(std::process::id()).unwrap();
        // The six kernel launch entry points; a graph launch takes an executable graph, which
        // a function handle is not (the graph tests in tests/graphs.rs launch real ones).
        let kernel_entries = &EntryPoint::ALL[..6];
        for entry in [EntryPoint::GraphLaunch, EntryPoint::GraphLaunchPtsz] {
            let err = d.launch(entry, f, &launch_on(0x1000)).unwrap_err();
            assert!(
                matches!(err, StandinError::Cuda { code, .. } if code == CuResult::INVALID_VALUE),
                "{entry:?}: {err}"
            );
        }
        for (i, entry) in kernel_entries.iter().copied().enumerate() {
            let before = d.launch_count(entry);
            let counters = NextCounters {
                duration_ns: 1000 + i as u64,
                registers_per_thread: 32,
                present: crate::Present::DURATION | crate::Present::REGISTERS,
                ..NextCounters::default()
            };
            d.set_next_counters(&counters);
            d.launch(entry, f, &launch_on(0x1000 + i)).unwrap();
            // Other tests launch in this process too, so compare by at least one.
            assert!(d.launch_count(entry) > before, "{entry:?} not counted");
        }
        let ours: Vec<_> = ring
            .read_new()
            .unwrap()
            .into_iter()
            .filter(|r| r.function == f.0 as u64)
            .collect();
        assert_eq!(ours.len(), kernel_entries.len());
        for (i, r) in ours.iter().enumerate() {
            assert_eq!(r.entry_point(), Some(kernel_entries[i]));
            let launch = ring.launch_record(r.seq).unwrap().unwrap();
            assert_eq!((launch.grid, launch.block), ([4, 2, 1], [128, 1, 1]));
            assert_eq!(
                (launch.shared_mem_bytes, launch.graph_exec, launch.node),
                (1024, 0, 0)
            );
            assert_eq!(r.stream, 0x1000 + i as u64);
            assert_eq!(r.duration_ns(), Some(1000 + i as u64));
            assert_eq!(r.registers_per_thread(), Some(32));
            assert_eq!(r.est_achieved_occupancy_pct(), None);
        }
        let _ = std::fs::remove_file(ring_path(std::process::id()));
    }
}
