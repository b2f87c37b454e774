//! Opening a file another user's process maps, as the agent (root), without trusting its path
//! or its declared sizes (issue 27 item 3).
//!
//! Late naming (`late`) and call-site identities (`identity`) parse ELF files that other users
//! control. A path read from `/proc/PID/maps` can be swapped for another file or a device node
//! before it is opened (the user owns its mount namespace), and an ELF section table can
//! declare a symbol table of many GiB in a sparse file, which the parser would read whole. So:
//!
//! - [`open_mapped`] opens the mapping itself, `/proc/PID/map_files/START-END` (no path to
//!   swap); where that is not permitted it opens the path through the process's root without
//!   following a final symbolic link and without blocking on a FIFO. Either way the file must
//!   be a regular file with the maps line's (device, inode), checked with `fstat` on the open
//!   descriptor.
//! - [`check_tables`] reads only the ELF header and section headers and refuses a file whose
//!   symbol or string tables declare more than [`MAX_TABLE_BYTES`], before any table is read.
//!
//! - [`BoundedReads`] runs each open and parse on a thread of its own and waits at most
//!   [`READ_LIMIT`]: a file that never answers (a FUSE mount that does not reply) costs one
//!   abandoned thread, not the capture loop, and after [`MAX_STUCK_READS`] such threads no new
//!   read starts until one of them ends.
//!
//! Not here yet: a per-host byte budget for all name tables.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use object::ReadRef;
use object::elf::{SHT_DYNSYM, SHT_STRTAB, SHT_SYMTAB};
use object::read::elf::{FileHeader, SectionHeader};

/// The most bytes one symbol or string table may declare. The largest real ones (a CUDA
/// framework's exported C++ names) are tens of MiB.
pub const MAX_TABLE_BYTES: u64 = 256 << 20;

/// Why a mapped file was not opened or not parsed.
#[derive(Debug, thiserror::Error)]
pub enum MappedFileError {
    /// Neither way of opening it worked.
    #[error("{path}: {source}")]
    Open {
        /// What was opened last.
        path: PathBuf,
        /// Why not.
        source: io::Error,
    },
    /// It is a directory, a FIFO, a device node, ...
    #[error("{0}: not a regular file")]
    NotRegular(PathBuf),
    /// The file opened is not the one the maps line named (a path swapped since).
    #[error("{path}: device {found_dev} inode {found_inode}, not the mapped file's")]
    Changed {
        /// What was opened.
        path: PathBuf,
        /// Its device, as major:minor.
        found_dev: String,
        /// Its inode.
        found_inode: u64,
    },
    /// A symbol or string table larger than [`MAX_TABLE_BYTES`], or headers that do not parse.
    #[error("{0}")]
    Elf(String),
}

/// How long opening and parsing one mapped file may take before the capture gives up on it.
/// A real library's tables are read in milliseconds (page cache) to a few hundred (cold disk).
pub const READ_LIMIT: Duration = Duration::from_secs(2);

/// Reads abandoned and still blocked beyond which no new read starts.
pub const MAX_STUCK_READS: usize = 4;

/// Why a bounded read gave no result.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The open or the parse refused the file.
    #[error("{0}")]
    Failed(String),
    /// It took longer than the limit; its thread is abandoned (the file is not read again).
    #[error("{path}: not read within {limit:?}; abandoned")]
    TimedOut {
        /// The file.
        path: PathBuf,
        /// The limit.
        limit: Duration,
    },
    /// Too many earlier reads are still blocked; this one did not start (it may next time).
    #[error("{path}: not read: {stuck} earlier reads of mapped files are still blocked")]
    Busy {
        /// The file.
        path: PathBuf,
        /// How many are blocked.
        stuck: usize,
    },
}

/// Where a bounded read stands, so that an abandoned thread that ends after all is no longer
/// counted as blocked (and one that ended just in time is not counted at all).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadState {
    Running,
    Done,
    Abandoned,
}

/// Runs reads of other users' files with a time limit (see the module's documentation).
#[derive(Clone, Debug)]
pub struct BoundedReads {
    limit: Duration,
    max_stuck: usize,
    stuck: Arc<AtomicUsize>,
}

impl Default for BoundedReads {
    fn default() -> Self {
        Self::new(READ_LIMIT, MAX_STUCK_READS)
    }
}

impl BoundedReads {
    /// Reads of at most `limit` each, with at most `max_stuck` abandoned ones still blocked.
    pub fn new(limit: Duration, max_stuck: usize) -> Self {
        Self {
            limit,
            max_stuck,
            stuck: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Abandoned reads still blocked.
    pub fn stuck(&self) -> usize {
        self.stuck.load(Ordering::SeqCst)
    }

    /// Opens `mapping`'s own file ([`Mapping::open`]) and parses it with `parse`, on a thread
    /// of its own, waiting at most the limit.
    pub fn read_mapped<T: Send + 'static>(
        &self,
        mapping: Mapping,
        parse: impl FnOnce(File, &Path) -> Result<T, String> + Send + 'static,
    ) -> Result<T, ReadError> {
        let path = mapping.path.clone();
        self.run(&path, move || {
            let file = mapping.open().map_err(|e| e.to_string())?;
            parse(file, &mapping.path)
        })
    }

    /// Runs `work` (which opens and reads `path`) on a thread of its own and waits for it at
    /// most the limit.
    pub fn run<T: Send + 'static>(
        &self,
        path: &Path,
        work: impl FnOnce() -> Result<T, String> + Send + 'static,
    ) -> Result<T, ReadError> {
        let stuck = self.stuck();
        if stuck >= self.max_stuck {
            return Err(ReadError::Busy {
                path: path.to_owned(),
                stuck,
            });
        }
        let state = Arc::new(Mutex::new(ReadState::Running));
        let (tx, rx) = mpsc::sync_channel(1);
        let (thread_state, counter) = (Arc::clone(&state), Arc::clone(&self.stuck));
        std::thread::Builder::new()
            .name("penrose-mapped-read".into())
            .spawn(move || {
                let result = work();
                let _ = tx.send(result);
                let mut state = lock(&thread_state);
                if *state == ReadState::Abandoned {
                    counter.fetch_sub(1, Ordering::SeqCst);
                }
                *state = ReadState::Done;
            })
            .map_err(|e| ReadError::Failed(format!("{}: no reader thread: {e}", path.display())))?;
        let result = rx.recv_timeout(self.limit);
        let mut state = lock(&state);
        match result {
            Ok(result) => result.map_err(ReadError::Failed),
            // Ended between the timeout and the lock: its result is in the channel.
            Err(_) if *state == ReadState::Done => rx
                .try_recv()
                .map_err(|_| ReadError::Failed(format!("{}: the reader ended", path.display())))?
                .map_err(ReadError::Failed),
            Err(_) => {
                *state = ReadState::Abandoned;
                self.stuck.fetch_add(1, Ordering::SeqCst);
                Err(ReadError::TimedOut {
                    path: path.to_owned(),
                    limit: self.limit,
                })
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A mapping owned, for a read on another thread ([`BoundedReads`]).
#[derive(Clone, Debug)]
pub struct Mapping {
    /// The process.
    pub pid: u32,
    /// First address of the mapping.
    pub start: u64,
    /// One past its last address.
    pub end: u64,
    /// Its path in the process's mount namespace.
    pub path: PathBuf,
    /// Device (major:minor in hex, as the line gives it) and inode.
    pub file: (String, u64),
}

impl Mapping {
    /// Opens its file ([`open_mapped`]).
    pub fn open(&self) -> Result<File, MappedFileError> {
        open_mapped(MappingRef {
            pid: self.pid,
            start: self.start,
            end: self.end,
            path: &self.path,
            file: &self.file,
        })
    }
}

/// One mapping as `/proc/PID/maps` lists it: enough to open exactly its file.
#[derive(Clone, Copy, Debug)]
pub struct MappingRef<'a> {
    /// The process.
    pub pid: u32,
    /// First address of the mapping.
    pub start: u64,
    /// One past its last address.
    pub end: u64,
    /// Its path in the process's mount namespace.
    pub path: &'a Path,
    /// Device (major:minor in hex, as the line gives it) and inode.
    pub file: &'a (String, u64),
}

/// Opens the file of `mapping` (see the module's documentation).
pub fn open_mapped(mapping: MappingRef<'_>) -> Result<File, MappedFileError> {
    // map_files needs CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE): else the path.
    let (path, file) = match open_map_file(mapping) {
        Ok(opened) => opened,
        Err(_) => open_through_root(mapping)?,
    };
    check_identity(&path, &file, mapping.file)?;
    Ok(file)
}

/// The mapping itself, through `/proc/PID/map_files`.
fn open_map_file(mapping: MappingRef<'_>) -> io::Result<(PathBuf, File)> {
    let path = PathBuf::from(format!(
        "/proc/{}/map_files/{:x}-{:x}",
        mapping.pid, mapping.start, mapping.end
    ));
    let file = open_readonly(&path, false)?;
    Ok((path, file))
}

/// The mapping's path through the process's root (a container's files are reachable so),
/// without following a final symbolic link or blocking on a FIFO.
fn open_through_root(mapping: MappingRef<'_>) -> Result<(PathBuf, File), MappedFileError> {
    let relative = mapping.path.strip_prefix("/").unwrap_or(mapping.path);
    let path = Path::new("/proc")
        .join(mapping.pid.to_string())
        .join("root")
        .join(relative);
    match open_readonly(&path, true) {
        Ok(file) => Ok((path, file)),
        Err(source) => Err(MappedFileError::Open { path, source }),
    }
}

fn open_readonly(path: &Path, no_follow: bool) -> io::Result<File> {
    let mut flags = libc::O_NONBLOCK;
    if no_follow {
        flags |= libc::O_NOFOLLOW;
    }
    OpenOptions::new().read(true).custom_flags(flags).open(path)
}

/// Refuses anything but a regular file with the (device, inode) of the maps line.
fn check_identity(
    path: &Path,
    file: &File,
    expected: &(String, u64),
) -> Result<(), MappedFileError> {
    let meta = file.metadata().map_err(|source| MappedFileError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    if !meta.file_type().is_file() {
        return Err(MappedFileError::NotRegular(path.to_path_buf()));
    }
    let found_dev = format!(
        "{:02x}:{:02x}",
        libc::major(meta.dev()),
        libc::minor(meta.dev())
    );
    if same_device(&found_dev, &expected.0) && meta.ino() == expected.1 {
        return Ok(());
    }
    Err(MappedFileError::Changed {
        path: path.to_path_buf(),
        found_dev,
        found_inode: meta.ino(),
    })
}

/// Whether two major:minor texts (hex, any width) name the same device.
fn same_device(a: &str, b: &str) -> bool {
    let parse = |text: &str| -> Option<(u32, u32)> {
        let (major, minor) = text.split_once(':')?;
        Some((
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
        ))
    };
    matches!((parse(a), parse(b)), (Some(x), Some(y)) if x == y)
}

/// Reads the ELF header and section headers of `data` (and nothing else) and refuses symbol
/// and string tables that declare more than [`MAX_TABLE_BYTES`]: the parser reads those whole.
pub fn check_tables<'data, R: ReadRef<'data>>(data: R) -> Result<(), MappedFileError> {
    let bad = |e: object::Error| MappedFileError::Elf(format!("ELF headers: {e}"));
    let header = object::elf::FileHeader64::<object::Endianness>::parse(data).map_err(bad)?;
    let endian = header.endian().map_err(bad)?;
    for section in header.section_headers(endian, data).map_err(bad)? {
        let kind = section.sh_type(endian);
        let size = section.sh_size(endian);
        if matches!(kind, SHT_SYMTAB | SHT_DYNSYM | SHT_STRTAB) && size > MAX_TABLE_BYTES {
            return Err(MappedFileError::Elf(format!(
                "a symbol or string table of {size} bytes (more than {MAX_TABLE_BYTES})"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::io::{Read, Seek, Write};

    use super::*;
    use crate::capture::procmaps::{FileMapping, file_mappings};

    /// A read that never ends (a FUSE file that never answers, here a channel nobody sends
    /// on) returns within the limit, is counted as stuck, and after the cap no new read
    /// starts; when the blocked reads end they are no longer counted.
    #[test]
    fn a_read_that_never_answers_is_abandoned_and_blocked_reads_are_capped() {
        let reads = BoundedReads::new(Duration::from_millis(100), 2);
        let path = Path::new("/fuse/never");
        let mut releases = Vec::new();
        for _ in 0..2 {
            let (release, wait) = mpsc::channel::<()>();
            releases.push(release);
            let started = std::time::Instant::now();
            let result = reads.run(path, move || {
                let _ = wait.recv();
                Ok(())
            });
            assert!(
                matches!(result, Err(ReadError::TimedOut { .. })),
                "{result:?}"
            );
            assert!(started.elapsed() < Duration::from_secs(2));
        }
        assert_eq!(reads.stuck(), 2);
        let refused = reads.run(path, || Ok(()));
        assert!(
            matches!(refused, Err(ReadError::Busy { stuck: 2, .. })),
            "{refused:?}"
        );
        drop(releases);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while reads.stuck() > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(reads.stuck(), 0);
        assert_eq!(reads.run(path, || Ok(7)).unwrap(), 7);
        let failed = reads.run::<()>(path, || Err("not an ELF file".into()));
        assert!(matches!(failed, Err(ReadError::Failed(e)) if e == "not an ELF file"));
    }

    /// A 64-bit little-endian ELF header and two section headers (null, and one of `kind`
    /// declaring `size` bytes at offset 4096), in a sparse file of that size.
    fn elf_declaring(path: &Path, kind: u32, size: u64) {
        let mut header = vec![0u8; 64];
        header[..4].copy_from_slice(b"\x7fELF");
        header[4] = 2; // ELFCLASS64
        header[5] = 1; // little-endian
        header[6] = 1; // EV_CURRENT
        header[16..18].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN
        header[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
        header[20..24].copy_from_slice(&1u32.to_le_bytes());
        header[40..48].copy_from_slice(&64u64.to_le_bytes()); // e_shoff
        header[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
        header[58..60].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
        header[60..62].copy_from_slice(&2u16.to_le_bytes()); // e_shnum
        let mut table = vec![0u8; 128];
        table[64 + 4..64 + 8].copy_from_slice(&kind.to_le_bytes());
        table[64 + 24..64 + 32].copy_from_slice(&4096u64.to_le_bytes()); // sh_offset
        table[64 + 32..64 + 40].copy_from_slice(&size.to_le_bytes()); // sh_size
        table[64 + 56..64 + 64].copy_from_slice(&24u64.to_le_bytes()); // sh_entsize
        let mut file = File::create(path).unwrap();
        file.write_all(&header).unwrap();
        file.write_all(&table).unwrap();
        file.set_len(4096 + size).unwrap();
    }

    #[test]
    fn a_symbol_table_of_many_gib_in_a_sparse_file_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("huge.so");
        elf_declaring(&path, SHT_SYMTAB, 8 << 30);
        let error = crate::capture::late::read_object(&path).unwrap_err();
        assert!(error.contains("symbol or string table"), "{error}");
        assert_eq!(crate::capture::identity::build_id(&path), None);
        // Within the bound, the same file's headers pass the check.
        elf_declaring(&path, SHT_SYMTAB, 4096);
        let data = object::ReadCache::new(File::open(&path).unwrap());
        assert!(check_tables(&data).is_ok());
    }

    /// Maps `path` into this process (read-only, private) and returns the maps line's mapping.
    fn map_into_this_process(path: &Path) -> FileMapping {
        let file = File::open(path).unwrap();
        // SAFETY: a fresh private read-only mapping of an open file, never unmapped and never
        // read through a pointer here: it only has to be listed in /proc/self/maps.
        #[allow(unsafe_code)]
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        assert_ne!(at, libc::MAP_FAILED);
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        file_mappings(&maps).find(|m| m.start == at as u64).unwrap()
    }

    #[test]
    fn a_path_swapped_after_the_maps_line_never_opens_the_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lib.so");
        std::fs::write(&path, vec![b'A'; 4096]).unwrap();
        let mapping = map_into_this_process(&path);
        let other = dir.path().join("other");
        std::fs::write(&other, vec![b'B'; 4096]).unwrap();
        std::fs::rename(&other, &path).unwrap();
        let reference = MappingRef {
            pid: std::process::id(),
            start: mapping.start,
            end: mapping.end,
            path: &mapping.path,
            file: &mapping.file,
        };
        // By path the new file opens, and the identity check refuses it.
        let (opened_path, file) = open_through_root(reference).unwrap();
        assert!(matches!(
            check_identity(&opened_path, &file, reference.file),
            Err(MappedFileError::Changed { .. })
        ));
        // Whichever way open_mapped goes (map_files as root, the path otherwise), it gives the
        // mapped file's bytes or nothing, never the swapped-in file's.
        match open_mapped(reference) {
            Ok(mut file) => {
                let mut first = [0u8; 1];
                file.rewind().unwrap();
                file.read_exact(&mut first).unwrap();
                assert_eq!(first, [b'A']);
            }
            Err(e) => assert!(matches!(e, MappedFileError::Changed { .. }), "{e}"),
        }
        // A directory put in its place is not a regular file.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let (opened_path, file) = open_through_root(reference).unwrap();
        assert!(matches!(
            check_identity(&opened_path, &file, reference.file),
            Err(MappedFileError::NotRegular(_))
        ));
    }

    #[test]
    fn devices_compare_by_number_not_by_spelling() {
        assert!(same_device("08:01", "8:1"));
        assert!(same_device("103:02", "103:2"));
        assert!(!same_device("08:01", "08:02"));
        assert!(!same_device("08:01", "garbage"));
    }
}
