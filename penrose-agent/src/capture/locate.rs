//! Finding the libraries to probe: the driver (libcuda) and the CUDA runtime (libcudart, where
//! kernels registered by nvcc's host stubs are named; PyTorch wheels ship their own copy under
//! `site-packages/nvidia/.../lib`, found through the processes that map it).
//!
//! A uprobe attaches to a file (an inode), not to a path: the host's copy, a copy in a
//! container image and a copy a user installed elsewhere are different files and each needs
//! its own probes, while two paths to one file (a symbolic link, a bind mount, a container
//! that shares the host's copy) must be probed once. So every candidate is resolved and
//! identified by its device and inode.

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

pub use penrose_ebpf_common::Library;

/// Where the agent looks for libcuda.
#[derive(Clone, Debug)]
pub struct LibrarySources {
    /// Paths from the agent's configuration (or `--lib`), probed even when nothing maps them yet.
    pub explicit: Vec<PathBuf>,
    /// Ask the dynamic linker's cache (`ldconfig -p`) for `libcuda.so*`.
    pub ldconfig: bool,
    /// Look at `/proc/<pid>/maps` of every running process: containers mount their own copy.
    pub proc_maps: bool,
}

impl Default for LibrarySources {
    fn default() -> Self {
        Self {
            explicit: Vec::new(),
            ldconfig: true,
            proc_maps: true,
        }
    }
}

/// Identity of a file: what a uprobe really attaches to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

/// Where a library path came from, for the start-up log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The configuration.
    Explicit,
    /// `ldconfig -p`.
    Ldconfig,
    /// A running process's memory map.
    ProcMaps,
}

/// One distinct library file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LibraryFile {
    /// A path that reaches the file from the agent's mount namespace (symbolic links resolved).
    pub path: PathBuf,
    /// Driver or runtime: which probes it gets.
    pub kind: Library,
    /// The file's identity.
    pub id: FileId,
    /// How it was first found.
    pub origin: Origin,
}

/// The driver and runtime paths in `ldconfig -p` output.
pub fn parse_ldconfig(output: &str) -> Vec<(PathBuf, Library)> {
    output
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.trim().split_once(' ')?;
            let (_, path) = rest.rsplit_once("=> ")?;
            Library::of_file_name(name).map(|kind| (PathBuf::from(path.trim()), kind))
        })
        .collect()
}

/// The driver and runtime paths a `/proc/<pid>/maps` text maps (as that process's mount
/// namespace sees them; a deleted file's ` (deleted)` entries are skipped).
pub fn parse_maps(maps: &str) -> Vec<(PathBuf, Library)> {
    let mut out: Vec<(PathBuf, Library)> = Vec::new();
    for line in maps.lines() {
        // address perms offset dev inode path
        let Some(path) = line.splitn(6, char::is_whitespace).nth(5).map(str::trim) else {
            continue;
        };
        if !path.starts_with('/') || path.ends_with(" (deleted)") {
            continue;
        }
        let path = Path::new(path);
        let kind = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(Library::of_file_name);
        if let Some(kind) = kind
            && !out.iter().any(|(p, _)| p == path)
        {
            out.push((path.to_path_buf(), kind));
        }
    }
    out
}

/// Every distinct libcuda file the sources reach, in the order found (explicit paths first).
/// Paths that do not exist are skipped with a warning; finding none is not an error here.
pub fn locate(sources: &LibrarySources) -> Vec<LibraryFile> {
    let mut found = Found::default();
    for path in &sources.explicit {
        // A configured path is the driver unless its name says runtime.
        let kind = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(Library::of_file_name)
            .unwrap_or(Library::Driver);
        found.add(path, kind, Origin::Explicit);
    }
    if sources.ldconfig {
        match Command::new("ldconfig").arg("-p").output() {
            Ok(out) => {
                for (path, kind) in parse_ldconfig(&String::from_utf8_lossy(&out.stdout)) {
                    found.add(&path, kind, Origin::Ldconfig);
                }
            }
            Err(e) => tracing::debug!("ldconfig -p: {e}"),
        }
    }
    if sources.proc_maps {
        for pid in running_pids() {
            let Ok(maps) = fs::read_to_string(format!("/proc/{pid}/maps")) else {
                continue; // exited, or a kernel thread
            };
            for (path, kind) in parse_maps(&maps) {
                // Through the process's root so a container's copy is reachable from here.
                let relative = path.strip_prefix("/").unwrap_or(&path);
                found.add(
                    &Path::new("/proc")
                        .join(pid.to_string())
                        .join("root")
                        .join(relative),
                    kind,
                    Origin::ProcMaps,
                );
            }
        }
    }
    found.files
}

fn running_pids() -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

#[derive(Default)]
struct Found {
    files: Vec<LibraryFile>,
    seen: HashSet<FileId>,
}

impl Found {
    fn add(&mut self, path: &Path, kind: Library, origin: Origin) {
        let resolved = match fs::canonicalize(path) {
            Ok(p) => p,
            Err(e) => {
                if origin == Origin::Explicit {
                    tracing::warn!("library path {}: {e}", path.display());
                }
                return;
            }
        };
        let Ok(meta) = fs::metadata(&resolved) else {
            return;
        };
        if !meta.is_file() {
            return;
        }
        let id = FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        };
        if self.seen.insert(id) {
            self.files.push(LibraryFile {
                path: resolved,
                kind,
                id,
                origin,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldconfig_lines_yield_driver_and_runtime_paths() {
        let out = "1234 libs found in cache `/etc/ld.so.cache'\n\
            \tlibcudart.so.12 (libc6,x86-64) => /usr/lib/libcudart.so.12\n\
            \tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n\
            \tlibcuda.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so\n\
            \tlibc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6\n";
        assert_eq!(
            parse_ldconfig(out),
            [
                (PathBuf::from("/usr/lib/libcudart.so.12"), Library::Runtime),
                (
                    PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
                    Library::Driver
                ),
                (
                    PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so"),
                    Library::Driver
                ),
            ]
        );
    }

    #[test]
    fn maps_lines_yield_each_library_once() {
        let maps = "7f00-7f10 r--p 00000000 08:01 42 /usr/lib/libcuda.so.550.54.15\n\
            7f10-7f20 r-xp 00010000 08:01 42 /usr/lib/libcuda.so.550.54.15\n\
            7f20-7f30 r--p 00000000 08:01 43 /opt/other/libcudart.so.12\n\
            7f30-7f40 rw-p 00000000 00:00 0 \n\
            7f40-7f50 r-xp 00000000 08:01 44 /tmp/x/libcuda.so.1 (deleted)\n\
            7ffd-7ffe rw-p 00000000 00:00 0                          [stack]\n";
        assert_eq!(
            parse_maps(maps),
            [
                (
                    PathBuf::from("/usr/lib/libcuda.so.550.54.15"),
                    Library::Driver
                ),
                (
                    PathBuf::from("/opt/other/libcudart.so.12"),
                    Library::Runtime
                ),
            ]
        );
    }

    #[test]
    fn links_and_copies_are_told_apart_by_inode() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("libcuda.so.1");
        std::fs::write(&a, b"not really a library").unwrap();
        let link = dir.path().join("libcuda.so");
        std::os::unix::fs::symlink(&a, &link).unwrap();
        let copy_dir = dir.path().join("container");
        std::fs::create_dir(&copy_dir).unwrap();
        let copy = copy_dir.join("libcuda.so.1");
        std::fs::copy(&a, &copy).unwrap();
        let files = locate(&LibrarySources {
            explicit: vec![link, a.clone(), copy.clone(), dir.path().join("missing.so")],
            ldconfig: false,
            proc_maps: false,
        });
        let paths: Vec<_> = files.iter().map(|f| f.path.clone()).collect();
        assert_eq!(
            paths,
            [a.canonicalize().unwrap(), copy.canonicalize().unwrap()]
        );
        assert_ne!(files[0].id, files[1].id);
    }
}
