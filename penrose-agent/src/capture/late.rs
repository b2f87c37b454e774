//! Naming kernels that were registered before the agent attached: every training job running
//! during an agent upgrade, and every process after an agent restart.
//!
//! nvcc (CUDA 12.4 and later) gives each kernel's host stub a function-local static
//! `__handle`, filled once by `__cudaGetKernel` with the `CUkernel` that driver launches then
//! carry. Objects that keep their symbol table (PyTorch's `libtorch_cuda.so` does) list those
//! statics as LOCAL OBJECT symbols whose mangled names contain the stub's name, and the stub's
//! name contains the kernel's mangled name:
//!
//! ```text
//! _ZZL33__device_stub__Z13penrose_k0007PvPvE8__handle   the static `__handle`, in .symtab
//!     33: length of the stub's name    __device_stub__Z13penrose_k0007Pv
//!     the stub's name minus its prefix, plus `_`: the kernel  _Z13penrose_k0007Pv
//! ```
//!
//! So for each object a process maps, the agent reads `.symtab` and `.dynsym` (once per file,
//! cached), reads the current value of every `__handle` from the process's memory with
//! `process_vm_readv` (it never writes to the process), and names the handles that are set.
//! For the legacy launch path it also names the kernels' host functions: nvcc registers, and
//! the legacy `cudaLaunchKernel` passes, the address of the host function whose symbol is the
//! kernel's mangled name itself (it calls the stub). Objects without a symbol table (cuBLAS
//! links the runtime statically and is stripped) stay unnamed here.
//!
//! Bounds: at most [`MAX_OBJECTS_CACHED`] files' symbols are kept, [`MAX_SYMBOLS_PER_OBJECT`]
//! stub symbols per file, and files are read through a page cache rather than whole.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object::{Object, ObjectSegment, ObjectSymbol, ReadCache, SymbolKind};
use penrose_ebpf_common::HandleKind;

use super::events::{Pid, ProcessNames};
use super::mapped_file::{BoundedReads, Mapping, ReadError, check_tables};
use super::memory::read_words;
use super::procmaps::file_mappings;

/// Files whose stub symbols are kept.
pub const MAX_OBJECTS_CACHED: usize = 256;

/// Stub and handle symbols kept per file (libtorch_cuda.so holds about 21,000 handles).
pub const MAX_SYMBOLS_PER_OBJECT: usize = 200_000;

const STUB: &str = "__device_stub__";

/// The stub symbols of one object file, at their link-time addresses.
#[derive(Debug, Default)]
pub struct ObjectSymbols {
    /// `__handle` statics: address and the kernel's mangled name.
    handles: Vec<(u64, Arc<str>)>,
    /// Kernels' host functions (what registration and legacy launches pass): address and the
    /// kernel's mangled name.
    stubs: Vec<(u64, Arc<str>)>,
    /// The lowest address of the segment mapped from file offset 0 (the load bias is the
    /// mapping's start minus this).
    base_vaddr: u64,
}

impl ObjectSymbols {
    /// `__handle` statics found.
    pub fn handles(&self) -> usize {
        self.handles.len()
    }

    /// Host functions found.
    pub fn stubs(&self) -> usize {
        self.stubs.len()
    }
}

/// The kernel's mangled name in a symbol that names a host stub or its `__handle` static:
/// the identifier that starts with `__device_stub__`, whose length the digits before it give,
/// minus that prefix, plus `_` (nvcc names the stub `__device_stub__` + the kernel's mangled
/// name without its leading `_`).
pub fn kernel_of_stub_symbol(symbol: &str) -> Option<String> {
    let at = symbol.find(STUB)?;
    let digits = symbol[..at]
        .bytes()
        .rev()
        .take_while(u8::is_ascii_digit)
        .count();
    let len: usize = symbol[at - digits..at].parse().ok()?;
    let identifier = symbol.get(at..at + len)?;
    let kernel = identifier.strip_prefix(STUB)?;
    (!kernel.is_empty()).then(|| format!("_{kernel}"))
}

/// Whether a symbol is a stub's `__handle` static (`...E8__handle`, possibly with a
/// discriminator).
fn is_handle_symbol(symbol: &str) -> bool {
    symbol.contains("E8__handle")
}

/// Reads the stub symbols of the ELF file at `path` (`.symtab` and `.dynsym`).
pub fn read_object(path: &Path) -> Result<ObjectSymbols, String> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    read_object_file(file, path)
}

/// Reads the stub symbols of the ELF file `file` (`path` names it in errors), after
/// [`check_tables`] refused tables too large to read.
pub fn read_object_file(file: File, path: &Path) -> Result<ObjectSymbols, String> {
    let cache = ReadCache::new(file);
    check_tables(&cache).map_err(|e| format!("{}: {e}", path.display()))?;
    let elf = object::File::parse(&cache).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = ObjectSymbols {
        base_vaddr: elf
            .segments()
            .filter(|s| s.file_range().0 == 0)
            .map(|s| s.address())
            .min()
            .unwrap_or(0),
        ..ObjectSymbols::default()
    };
    // First pass: the kernels, from the stubs' symbols, and the `__handle` statics.
    let mut kernels: HashMap<String, Arc<str>> = HashMap::new();
    for symbol in elf.symbols().chain(elf.dynamic_symbols()) {
        if out.handles.len() >= MAX_SYMBOLS_PER_OBJECT {
            break;
        }
        let Ok(name) = symbol.name() else {
            continue;
        };
        if !name.contains(STUB) {
            continue;
        }
        let Some(kernel) = kernel_of_stub_symbol(name) else {
            continue;
        };
        let kernel = Arc::clone(
            kernels
                .entry(kernel.clone())
                .or_insert_with(|| Arc::from(kernel.as_str())),
        );
        if symbol.kind() == SymbolKind::Data && is_handle_symbol(name) && symbol.address() != 0 {
            out.handles.push((symbol.address(), kernel));
        }
    }
    // Second pass: the host functions, named like the kernels.
    if !kernels.is_empty() {
        for symbol in elf.symbols().chain(elf.dynamic_symbols()) {
            if out.stubs.len() >= MAX_SYMBOLS_PER_OBJECT {
                break;
            }
            if symbol.kind() != SymbolKind::Text || symbol.address() == 0 {
                continue;
            }
            if let Some(kernel) = symbol.name().ok().and_then(|n| kernels.get(n)) {
                out.stubs.push((symbol.address(), Arc::clone(kernel)));
            }
        }
    }
    Ok(out)
}

/// One file a process maps, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapped {
    /// The path in the process's mount namespace.
    pub path: PathBuf,
    /// `st_dev` as the maps line gives it (major:minor) and the inode.
    pub file: (String, u64),
    /// Start of the mapping of file offset 0.
    pub start: u64,
    /// One past its last address.
    pub end: u64,
}

/// The files a `/proc/<pid>/maps` text maps from offset 0 (each once).
pub fn parse_mapped(maps: &str) -> Vec<Mapped> {
    let mut out: Vec<Mapped> = Vec::new();
    for m in file_mappings(maps).filter(|m| m.file_offset == 0) {
        if !out.iter().any(|o| o.file == m.file) {
            out.push(Mapped {
                path: m.path,
                file: m.file,
                start: m.start,
                end: m.end,
            });
        }
    }
    out
}

/// What naming one process found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LateCounts {
    /// Objects whose symbols were read (or taken from the cache).
    pub objects: u64,
    /// `__handle` statics that were set, so a kernel handle was named.
    pub handles_named: u64,
    /// Stubs named (for the legacy launch path).
    pub stubs_named: u64,
    /// Objects that could not be read.
    pub unreadable: u64,
}

/// Reads the names of kernels a process registered before the agent attached; keeps the
/// symbols of the files it read, per file.
#[derive(Debug, Default)]
pub struct LateNamer {
    cache: HashMap<(String, u64), Arc<ObjectSymbols>>,
    counts: LateCounts,
    reads: BoundedReads,
}

impl LateNamer {
    /// Names what `pid` registered before the agent attached into `names`.
    pub fn name_process(&mut self, pid: Pid, names: &mut ProcessNames) -> LateCounts {
        let mut found = LateCounts::default();
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{}/maps", pid.0)) else {
            return found;
        };
        for mapped in parse_mapped(&maps) {
            let Some(symbols) = self.symbols(pid, &mapped, &mut found) else {
                continue;
            };
            found.objects += 1;
            let bias = mapped.start.wrapping_sub(symbols.base_vaddr);
            for (vaddr, kernel) in &symbols.stubs {
                names.learn(HandleKind::Stub, bias.wrapping_add(*vaddr), kernel);
                found.stubs_named += 1;
            }
            let addresses: Vec<u64> = symbols
                .handles
                .iter()
                .map(|(vaddr, _)| bias.wrapping_add(*vaddr))
                .collect();
            let values = read_words(pid, &addresses);
            for ((_, kernel), value) in symbols.handles.iter().zip(values) {
                if let Some(handle) = value.filter(|v| *v != 0) {
                    names.learn(HandleKind::Function, handle, kernel);
                    found.handles_named += 1;
                }
            }
        }
        self.counts.objects += found.objects;
        self.counts.handles_named += found.handles_named;
        self.counts.stubs_named += found.stubs_named;
        self.counts.unreadable += found.unreadable;
        found
    }

    fn symbols(
        &mut self,
        pid: Pid,
        mapped: &Mapped,
        found: &mut LateCounts,
    ) -> Option<Arc<ObjectSymbols>> {
        if let Some(symbols) = self.cache.get(&mapped.file) {
            return Some(Arc::clone(symbols));
        }
        // The mapping's own file, never whatever its path names now, read on a thread of its
        // own within a time limit (`mapped_file`).
        let mapping = Mapping {
            pid: pid.0,
            start: mapped.start,
            end: mapped.end,
            path: mapped.path.clone(),
            file: mapped.file.clone(),
        };
        let symbols = match self.reads.read_mapped(mapping, read_object_file) {
            Ok(symbols) => Arc::new(symbols),
            Err(e) => {
                tracing::debug!("late naming: {e}");
                found.unreadable += 1;
                if matches!(e, ReadError::TimedOut { .. }) {
                    // Never read again: nothing to name in it, as far as this agent knows.
                    self.cache
                        .insert(mapped.file.clone(), Arc::new(ObjectSymbols::default()));
                }
                return None;
            }
        };
        if self.cache.len() >= MAX_OBJECTS_CACHED {
            // Forget the files with nothing to name first, then anything.
            let empty: Vec<_> = self
                .cache
                .iter()
                .filter(|(_, s)| s.handles.is_empty() && s.stubs.is_empty())
                .map(|(k, _)| k.clone())
                .collect();
            for key in empty {
                self.cache.remove(&key);
            }
            if self.cache.len() >= MAX_OBJECTS_CACHED {
                self.cache.clear();
            }
        }
        self.cache.insert(mapped.file.clone(), Arc::clone(&symbols));
        Some(symbols)
    }

    /// Totals over every process named.
    pub fn counts(&self) -> LateCounts {
        self.counts
    }
}

/// The running processes that map a CUDA driver or runtime library: those whose kernels may
/// have been registered before the agent attached.
pub fn cuda_processes() -> Vec<Pid> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|maps| {
                maps.lines().any(|line| {
                    line.rsplit('/').next().is_some_and(|name| {
                        penrose_ebpf_common::Library::of_file_name(name.trim()).is_some()
                    })
                })
            })
        })
        .map(Pid)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_come_out_of_nvcc_stub_symbols() {
        for (symbol, kernel) in [
            (
                "_ZZL33__device_stub__Z13penrose_k0007PvPvE8__handle",
                Some("_Z13penrose_k0007Pv"),
            ),
            (
                "_ZZ25__device_stub__Z6kernelPfPfE8__handle",
                Some("_Z6kernelPf"),
            ),
            ("_Z25__device_stub__Z6kernelPfPf", Some("_Z6kernelPf")),
            (
                "_ZN2at6native37__device_stub__ZN2at6native6kernelEPfEPf",
                Some("_ZN2at6native6kernelEPf"),
            ),
            ("_Z6kernelPf", None),
            ("_ZZ99__device_stub__Z6kernelPfPfE8__handle", None),
            ("__device_stub__", None),
        ] {
            assert_eq!(kernel_of_stub_symbol(symbol).as_deref(), kernel, "{symbol}");
        }
    }

    #[test]
    fn the_nvcc_test_application_gives_every_handle_and_host_function() {
        let symbols = read_object(Path::new(penrose_standin::NVCC_APP_PATH)).unwrap();
        assert_eq!(symbols.handles(), 2048);
        assert_eq!(symbols.stubs(), 2048);
        assert!(
            symbols
                .handles
                .iter()
                .any(|(_, k)| &**k == "_Z13penrose_k0007Pv")
        );
    }

    #[test]
    fn each_file_mapped_from_offset_zero_is_listed_once() {
        let maps = "55d0-55e0 r--p 00000000 08:01 42 /usr/bin/python3.11\n\
            55e0-55f0 r-xp 00010000 08:01 42 /usr/bin/python3.11\n\
            7f00-7f10 r--p 00000000 08:01 77 /opt/lib/libtorch_cuda.so\n";
        let mapped = parse_mapped(maps);
        assert_eq!(mapped.len(), 2);
        assert_eq!(mapped[0].start, 0x55d0);
    }

    #[test]
    fn this_process_memory_reads_back_and_bad_addresses_are_none() {
        static WORDS: [u64; 3] = [7, 0xfeed, u64::MAX];
        let pid = Pid(std::process::id());
        let addresses: Vec<u64> = WORDS.iter().map(|w| std::ptr::from_ref(w) as u64).collect();
        let mut with_bad = addresses.clone();
        with_bad.insert(1, 8);
        let values = read_words(pid, &with_bad);
        assert_eq!(values, vec![Some(7), None, Some(0xfeed), Some(u64::MAX)]);
    }
}
