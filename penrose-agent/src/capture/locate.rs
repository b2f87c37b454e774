//! Finding the libraries to probe: the driver (libcuda) and the CUDA runtime (libcudart, where
//! kernels registered by nvcc's host stubs are named; PyTorch wheels ship their own copy under
//! `site-packages/nvidia/.../lib`, found through the processes that map it).
//!
//! A uprobe attaches to a file (an inode), not to a path: the host's copy, a copy in a
//! container image and a copy a user installed elsewhere are different files and each needs
//! its own probes, while two paths to one file (a symbolic link, a bind mount, a container
//! that shares the host's copy) must be probed once. So every candidate is resolved and
//! identified by its device and inode.
//!
//! The agent runs as root and parses every library it probes (symbol tables, to attach by
//! name), and any process can map any file named `libcuda.so*`. So by default only a library
//! root controls is probed ([`check_trusted`]): the file owned by root and not writable by group
//! or others, in directories that are root's and not writable by group or others all the way up
//! to `/`. Others are listed in [`Located::untrusted`] (the capture counts them) unless
//! [`LibrarySources::allow_untrusted`] is set (`capture.allow_untrusted_libs`).

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

pub use penrose_ebpf_common::Library;

/// The most distinct library files probed unless configured otherwise
/// (`capture.max_libraries`): a host has a driver, a runtime or two per application
/// environment, and a copy per container image.
pub const DEFAULT_MAX_LIBRARIES: usize = 64;

/// Where the agent looks for libcuda.
#[derive(Clone, Debug)]
pub struct LibrarySources {
    /// Paths from the agent's configuration (or `--lib`), probed even when nothing maps them yet.
    pub explicit: Vec<PathBuf>,
    /// Ask the dynamic linker's cache (`ldconfig -p`) for `libcuda.so*`.
    pub ldconfig: bool,
    /// Look at `/proc/<pid>/maps` of every running process: containers mount their own copy.
    pub proc_maps: bool,
    /// Also probe files [`check_trusted`] refuses (`capture.allow_untrusted_libs`); off by
    /// default.
    pub allow_untrusted: bool,
}

impl Default for LibrarySources {
    fn default() -> Self {
        Self {
            explicit: Vec::new(),
            ldconfig: true,
            proc_maps: true,
            allow_untrusted: false,
        }
    }
}

/// What [`locate`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Located {
    /// The files to probe, in the order found (explicit paths first).
    pub files: Vec<LibraryFile>,
    /// Files refused by [`check_trusted`], with the reason.
    pub untrusted: Vec<Untrusted>,
}

/// A library file that is not probed because root does not control it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Untrusted {
    /// The file (symbolic links resolved).
    pub path: PathBuf,
    /// Its identity.
    pub id: FileId,
    /// How it was found.
    pub origin: Origin,
    /// Why it is not trusted.
    pub reason: String,
}

/// Whether root alone controls the file at `path` (absolute, symbolic links resolved): the
/// file is a regular file owned by root and not writable by group or others, and every
/// directory above it, up to `/`, is owned by root and not writable by group or others (a
/// sticky world-writable directory such as `/tmp` included). `Err(why)` otherwise.
pub fn check_trusted(path: &Path) -> Result<(), String> {
    fn owned_by_root(path: &Path, meta: &fs::Metadata, what: &str) -> Result<(), String> {
        if meta.uid() != 0 {
            return Err(format!(
                "{what} {} is owned by uid {}, not root",
                path.display(),
                meta.uid()
            ));
        }
        if meta.permissions().mode() & 0o022 != 0 {
            return Err(format!(
                "{what} {} is writable by group or others (mode {:o})",
                path.display(),
                meta.permissions().mode() & 0o7777
            ));
        }
        Ok(())
    }
    if !path.is_absolute() {
        return Err(format!("{} is not an absolute path", path.display()));
    }
    let meta = fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    owned_by_root(path, &meta, "file")?;
    for dir in path.ancestors().skip(1) {
        let meta = fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if !meta.is_dir() {
            return Err(format!("{} is not a directory", dir.display()));
        }
        owned_by_root(dir, &meta, "directory")?;
    }
    Ok(())
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

/// Every distinct libcuda file the sources reach, in the order found (explicit paths first),
/// and those refused as untrusted (unless `sources.allow_untrusted`). Paths that do not exist
/// are skipped with a warning; finding none is not an error here.
pub fn locate(sources: &LibrarySources) -> Located {
    let mut found = Found {
        allow_untrusted: sources.allow_untrusted,
        ..Found::default()
    };
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
    Located {
        files: found.files,
        untrusted: found.untrusted,
    }
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
    allow_untrusted: bool,
    files: Vec<LibraryFile>,
    untrusted: Vec<Untrusted>,
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
        if !self.seen.insert(id) {
            return;
        }
        if !self.allow_untrusted
            && let Err(reason) = check_trusted(&resolved)
        {
            self.untrusted.push(Untrusted {
                path: resolved,
                id,
                origin,
                reason,
            });
            return;
        }
        self.files.push(LibraryFile {
            path: resolved,
            kind,
            id,
            origin,
        });
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
            allow_untrusted: true,
        })
        .files;
        let paths: Vec<_> = files.iter().map(|f| f.path.clone()).collect();
        assert_eq!(
            paths,
            [a.canonicalize().unwrap(), copy.canonicalize().unwrap()]
        );
        assert_ne!(files[0].id, files[1].id);
    }

    /// A user's copy of libcuda in /tmp (the file the user's, the directory world-writable) is
    /// not probed by default, with the reason; with `allow_untrusted` it is. A root-owned copy
    /// in a root-owned directory under /tmp is refused too, for /tmp itself.
    #[test]
    fn libraries_root_does_not_control_are_not_probed_by_default() {
        let dir = tempfile::tempdir_in("/tmp").unwrap();
        let lib = dir.path().join("libcuda.so.1");
        std::fs::write(&lib, b"not really a library").unwrap();
        // Owned by nobody, as a plain user's copy would be (when this test runs as root).
        if crate::capture::loader::is_root() {
            std::os::unix::fs::chown(&lib, Some(65534), Some(65534)).unwrap();
        }
        let sources = |allow_untrusted| LibrarySources {
            explicit: vec![lib.clone()],
            ldconfig: false,
            proc_maps: false,
            allow_untrusted,
        };
        let located = locate(&sources(false));
        assert!(located.files.is_empty(), "{located:?}");
        assert_eq!(located.untrusted.len(), 1);
        let reason = &located.untrusted[0].reason;
        assert!(
            reason.contains("not root") || reason.contains("writable by group or others"),
            "{reason}"
        );
        assert_eq!(located.untrusted[0].path, lib.canonicalize().unwrap());
        assert_eq!(locate(&sources(true)).files.len(), 1);
        // The reasons, one by one.
        let why = check_trusted(&lib.canonicalize().unwrap()).unwrap_err();
        if crate::capture::loader::is_root() {
            assert!(why.contains("owned by uid 65534, not root"), "{why}");
            std::os::unix::fs::chown(&lib, Some(0), Some(0)).unwrap();
            // Root's file, but /tmp lets anyone replace the directory above it.
            let why = check_trusted(&lib.canonicalize().unwrap()).unwrap_err();
            assert!(why.contains("/tmp is writable by group or others"), "{why}");
        }
        assert!(check_trusted(Path::new("relative/libcuda.so")).is_err());
    }

    /// A library root controls (the C library, root's on any normal system) passes.
    #[test]
    fn root_owned_libraries_in_root_owned_directories_are_trusted() {
        let libc_path = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
        ]
        .iter()
        .map(Path::new)
        .find(|p| p.exists());
        let Some(libc_path) = libc_path else {
            penrose_host::skip::skipped(format_args!("SKIPPED: no libc.so.6 at the Debian path"));
            return;
        };
        let resolved = libc_path.canonicalize().unwrap();
        assert_eq!(check_trusted(&resolved), Ok(()));
    }
}
