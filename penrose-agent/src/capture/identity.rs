//! A stable identity for launches that no name reaches.
//!
//! A library that links the CUDA runtime statically and is stripped (cuBLAS, cuBLASLt) leaves
//! nothing to name its kernels by: no runtime to probe, no symbol table. What is stable about
//! its launches across processes, hosts and runs of the same build is *where* they are made
//! and *how*: the launch probe reads the return address at the driver's entry (the call site
//! inside the library), and the agent turns it into the library's GNU build id plus the call
//! site's offset in the file, joined with the grid, block and dynamic shared memory:
//!
//! ```text
//! <bid:4f1c9a...e2+0x1a2b30 g128x1x1 b256x1x1 s0>
//! ```
//!
//! Two processes of the same library build give equal identities for the same launches, so
//! identities fingerprint like names. A launch through the shared runtime (its call site is
//! in libcudart) would identify only the runtime, which is why named paths come first; an
//! identity is used only when no name exists. What it reveals is in docs/threat-model.md.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object::{Object, ReadCache};

use super::events::{Launch, Pid};
use super::mapped_file::{BoundedReads, Mapping, check_tables};
use super::procmaps::file_mappings;

/// Processes whose memory maps are kept.
pub const MAX_PROCESSES: usize = 4096;

/// Identities kept (one string per distinct call site and launch configuration).
pub const MAX_IDENTITIES: usize = 65_536;

/// Files whose build ids are kept.
pub const MAX_FILES: usize = 1024;

/// One executable mapping of a file.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Region {
    start: u64,
    end: u64,
    file_offset: u64,
    file: (String, u64),
    path: PathBuf,
}

/// Where a launch came from, in terms stable across processes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Site {
    object: Arc<str>,
    offset: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem_bytes: u32,
}

/// Call sites to identities, per process maps and per file build ids, all bounded.
#[derive(Debug, Default)]
pub struct Identities {
    regions: HashMap<Pid, Vec<Region>>,
    objects: HashMap<(String, u64), Arc<str>>,
    interned: HashMap<Site, Arc<str>>,
    reads: BoundedReads,
}

impl Identities {
    /// The identity of a launch made from `launch.caller`, or `None` when the caller is not in
    /// a mapped file.
    pub fn of(&mut self, launch: &Launch) -> Option<Arc<str>> {
        if launch.caller == 0 {
            return None;
        }
        let region = self.region(launch.pid, launch.caller)?;
        let object = self.object(launch.pid, &region)?;
        let site = Site {
            object,
            offset: launch.caller - region.start + region.file_offset,
            grid: launch.grid,
            block: launch.block,
            shared_mem_bytes: launch.shared_mem_bytes,
        };
        if let Some(name) = self.interned.get(&site) {
            return Some(Arc::clone(name));
        }
        let name: Arc<str> = Arc::from(format!(
            "<{}+{:#x} g{}x{}x{} b{}x{}x{} s{}>",
            site.object,
            site.offset,
            site.grid[0],
            site.grid[1],
            site.grid[2],
            site.block[0],
            site.block[1],
            site.block[2],
            site.shared_mem_bytes
        ));
        if self.interned.len() < MAX_IDENTITIES {
            self.interned.insert(site, Arc::clone(&name));
        }
        Some(name)
    }

    /// Forgets an exited process.
    pub fn exited(&mut self, pid: Pid) {
        self.regions.remove(&pid);
    }

    fn region(&mut self, pid: Pid, address: u64) -> Option<Region> {
        let find = |regions: &[Region]| {
            regions
                .iter()
                .find(|r| r.start <= address && address < r.end)
                .cloned()
        };
        if let Some(found) = self.regions.get(&pid).and_then(|r| find(r)) {
            return Some(found);
        }
        // Not mapped when last read (or never read): read the maps again.
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", pid.0)).ok()?;
        let regions = parse_executable(&maps);
        let found = find(&regions);
        if self.regions.len() >= MAX_PROCESSES {
            self.regions.clear();
        }
        self.regions.insert(pid, regions);
        found
    }

    fn object(&mut self, pid: Pid, region: &Region) -> Option<Arc<str>> {
        if let Some(object) = self.objects.get(&region.file) {
            return Some(Arc::clone(object));
        }
        // The mapping's own file, never whatever its path names now, read on a thread of its
        // own within a time limit (`mapped_file`).
        let mapping = Mapping {
            pid: pid.0,
            start: region.start,
            end: region.end,
            path: region.path.clone(),
            file: region.file.clone(),
        };
        let read = self
            .reads
            .read_mapped(mapping, |file, _| Ok(build_id_of(file)));
        let object: Arc<str> = match read.ok().flatten() {
            Some(id) => Arc::from(format!("bid:{id}")),
            // Without a build id the file's name is the best stable handle there is.
            None => Arc::from(format!(
                "file:{}",
                region
                    .path
                    .file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
            )),
        };
        if self.objects.len() >= MAX_FILES {
            self.objects.clear();
        }
        self.objects
            .insert(region.file.clone(), Arc::clone(&object));
        Some(object)
    }
}

/// The GNU build id of the ELF file at `path`, in hex.
pub fn build_id(path: &Path) -> Option<String> {
    build_id_of(std::fs::File::open(path).ok()?)
}

/// The GNU build id of the ELF file `file`, in hex (none for a file whose tables
/// [`check_tables`] refuses).
pub fn build_id_of(file: std::fs::File) -> Option<String> {
    let cache = ReadCache::new(file);
    check_tables(&cache).ok()?;
    let elf = object::File::parse(&cache).ok()?;
    let id = elf.build_id().ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

/// The executable file mappings of a `/proc/<pid>/maps` text.
fn parse_executable(maps: &str) -> Vec<Region> {
    file_mappings(maps)
        .filter(|m| m.executable)
        .map(|m| Region {
            start: m.start,
            end: m.end,
            file_offset: m.file_offset,
            file: m.file,
            path: m.path,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use penrose_ebpf_common::EntryPoint;

    fn launch_from(caller: u64, grid: [u32; 3]) -> Launch {
        Launch {
            pid: Pid(std::process::id()),
            tid: 1,
            sampled: false,
            graph_position: 0,
            in_graph: false,
            timestamp_ns: 0,
            function: 0xf00,
            stream: 0,
            grid,
            block: [256, 1, 1],
            shared_mem_bytes: 0,
            entry: EntryPoint::LaunchKernel,
            caller,
        }
    }

    #[test]
    fn executable_mappings_are_parsed_with_their_file_offsets() {
        let maps = "55d0-55e0 r--p 00000000 08:01 42 /usr/bin/python3.11\n\
            55e0-55f0 r-xp 00010000 08:01 42 /usr/bin/python3.11\n\
            7f00-7f10 r-xp 00002000 08:01 77 /opt/lib/libcublasLt.so.13\n\
            7f20-7f30 r-xp 00000000 00:00 0 [vdso]\n";
        let regions = parse_executable(maps);
        assert_eq!(regions.len(), 2);
        assert_eq!(
            (regions[0].start, regions[0].file_offset),
            (0x55e0, 0x10000)
        );
        assert_eq!(regions[1].file, ("08:01".to_string(), 77));
    }

    #[test]
    fn a_call_site_in_this_binary_has_a_stable_identity_by_build_id() {
        // This test binary is an ELF file with a GNU build id (rustc asks the linker for one).
        let caller = a_call_site_in_this_binary as *const () as usize as u64;
        let mut ids = Identities::default();
        let a = ids.of(&launch_from(caller, [128, 1, 1])).unwrap();
        let again = ids.of(&launch_from(caller, [128, 1, 1])).unwrap();
        let other = ids.of(&launch_from(caller, [64, 1, 1])).unwrap();
        assert!(a.starts_with("<bid:") || a.starts_with("<file:"), "{a}");
        assert_eq!(a, again);
        assert_ne!(a, other, "another launch configuration is another identity");
        assert!(ids.of(&launch_from(0, [1, 1, 1])).is_none());
        assert!(ids.of(&launch_from(8, [1, 1, 1])).is_none(), "not mapped");
    }

    #[inline(never)]
    fn a_call_site_in_this_binary() {}
}
