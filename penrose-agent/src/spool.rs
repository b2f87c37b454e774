//! The spool: encrypted reports on disk between sealing and the server's ack.
//!
//! One file per report, named `<sequence>-<report id>.report` (the sequence orders them, oldest
//! first), holding the report's wire frame; once the uploader has sent it at least once it is
//! renamed `<sequence>-<report id>.sent` ([`Spool::mark_attempted`], before the first send), so
//! that a report that may have reached the server keeps the day it was sent with (the server
//! deduplicates by report id and day), while one that never left may be re-stamped to a day
//! it has an admission token for ([`Spool::rewrite`]: same size, atomic replace). A report is written to a temporary file, synced,
//! renamed into place and the directory synced, so after a crash (SIGKILL, power loss) a report
//! is either whole in the spool or absent, never half there; temporary files left by a crash
//! are removed at open. The spool is bounded in bytes: a report that would exceed the bound
//! first pushes out the oldest ones (counted and warned about, never an error), so an agent cut
//! off from its server for weeks keeps the newest data and a bounded disk footprint. A write
//! that fails (a full disk) removes its temporary file and leaves the spool as it was.
//!
//! Reports the server refused are moved to `rejected/` with a note of why, for the owner to
//! look at; that folder is bounded too ([`RejectedBounds`]: bytes and age, oldest removed
//! first, counted), so that a key rotation that gets every report refused cannot fill the
//! disk.
//!
//! State files (here and in the sealed record and status file) are opened with `O_NOFOLLOW`
//! ([`open_nofollow`]): a symbolic link at a state file's name is an error, never followed. The
//! state directory and its folders are the agent's own ([`create_private_dir`]): created 0700,
//! and one that already exists is refused unless it belongs to the agent's user and neither
//! group nor others may write to it.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use penrose_core::wire::ReportId;
use penrose_host::effective_uid;
use thiserror::Error;

const SUFFIX: &str = ".report";
/// A report the uploader has sent at least once.
const SENT_SUFFIX: &str = ".sent";
const TEMP_PREFIX: &str = ".tmp-";

/// Why the spool refused an operation.
#[derive(Debug, Error)]
pub enum SpoolError {
    /// A file beside the spool (the status file) was not written.
    #[error("{0}")]
    File(#[from] penrose_host::FileError),
    /// A state directory another user controls (its owner, or write access for group or
    /// others): the agent will not keep its state there.
    #[error("state directory {path}: {reason}; refusing to use it")]
    Unsafe {
        /// The directory.
        path: PathBuf,
        /// What is wrong, and how to fix it.
        reason: String,
    },
    /// One report is larger than the whole spool may be.
    #[error("a report of {size} bytes does not fit a spool of {max} bytes")]
    TooLarge {
        /// The report's size.
        size: u64,
        /// The bound.
        max: u64,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SpoolError + '_ {
    move |source| {
        SpoolError::File(penrose_host::FileError::Io {
            path: path.to_owned(),
            source,
        })
    }
}

/// One spooled report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpoolEntry {
    /// Its place in the order (higher is newer).
    pub sequence: u64,
    /// The report's id.
    pub report_id: ReportId,
    /// Its frame's size.
    pub bytes: u64,
    /// Its file.
    pub path: PathBuf,
    /// Whether it was sent at least once (it may have reached the server).
    pub attempted: bool,
}

/// Counts since the spool was opened, for `status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SpoolCounts {
    /// Reports written.
    pub written: u64,
    /// Oldest reports dropped to stay under the bound.
    pub dropped: u64,
    /// Writes that failed (the spool unchanged).
    pub write_failures: u64,
    /// Reports removed after the server had them.
    pub delivered: u64,
    /// Reports moved aside because the server rejected them.
    pub rejected: u64,
    /// Rejected reports removed from `rejected/` to keep it within its bounds.
    pub rejected_dropped: u64,
}

/// How much `rejected/` keeps (`spool.rejected_max_bytes`, `spool.rejected_max_age_days`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RejectedBounds {
    /// Bytes of reports and notes.
    pub max_bytes: u64,
    /// Reports moved aside longer ago than this many days are removed.
    pub max_age_days: u32,
}

impl Default for RejectedBounds {
    fn default() -> Self {
        Self {
            max_bytes: 16 * 1024 * 1024,
            max_age_days: 30,
        }
    }
}

/// The spool directory.
#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    rejected_dir: PathBuf,
    rejected_bounds: RejectedBounds,
    max_bytes: u64,
    entries: Vec<SpoolEntry>,
    next_sequence: u64,
    counts: SpoolCounts,
}

impl Spool {
    /// Opens (creating) `dir`, removes temporary files a crash left, and lists what is there.
    /// Rejected reports go to `dir/../rejected`.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<Self, SpoolError> {
        create_private_dir(dir)?;
        let rejected_dir = dir
            .parent()
            .map_or_else(|| dir.join("rejected"), |p| p.join("rejected"));
        let mut entries = Vec::new();
        for item in fs::read_dir(dir).map_err(io(dir))? {
            let item = item.map_err(io(dir))?;
            let name = item.file_name();
            let Some(name) = name.to_str() else { continue };
            let path = item.path();
            // The entry itself, not what a link points to.
            if !item.file_type().map_err(io(&path))?.is_file() {
                tracing::warn!("spool: ignoring {name}, not a regular file");
                continue;
            }
            if name.starts_with(TEMP_PREFIX) {
                tracing::info!("spool: removing {name}, left by an interrupted write");
                fs::remove_file(&path).map_err(io(&path))?;
                continue;
            }
            let Some((sequence, report_id, attempted)) = parse_name(name) else {
                tracing::warn!("spool: ignoring {name}, not a report file");
                continue;
            };
            let bytes = item.metadata().map_err(io(&path))?.len();
            entries.push(SpoolEntry {
                sequence,
                report_id,
                bytes,
                path,
                attempted,
            });
        }
        entries.sort_by_key(|e| e.sequence);
        let next_sequence = entries.last().map_or(0, |e| e.sequence + 1);
        Ok(Self {
            dir: dir.to_owned(),
            rejected_dir,
            rejected_bounds: RejectedBounds::default(),
            max_bytes,
            entries,
            next_sequence,
            counts: SpoolCounts::default(),
        })
    }

    /// Bounds `rejected/` by `bounds` (instead of the defaults) and applies them now.
    pub fn with_rejected_bounds(mut self, bounds: RejectedBounds) -> Result<Self, SpoolError> {
        self.rejected_bounds = bounds;
        self.prune_rejected(std::time::SystemTime::now())?;
        Ok(self)
    }

    /// Removes from `rejected/` what its bounds do not keep as of `now`: reports (with their
    /// notes) moved aside more than the age bound ago, then the oldest until the folder is
    /// within its byte bound. Returns how many reports were removed.
    pub fn prune_rejected(&mut self, now: std::time::SystemTime) -> Result<u64, SpoolError> {
        let dir = &self.rejected_dir;
        let items = match fs::read_dir(dir) {
            Ok(items) => items,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io(dir)(e)),
        };
        // Per report (file stem, whose sequence prefix orders them): its files, bytes and the
        // time it was moved aside.
        let mut reports: std::collections::BTreeMap<
            String,
            (Vec<PathBuf>, u64, std::time::SystemTime),
        > = std::collections::BTreeMap::new();
        for item in items {
            let item = item.map_err(io(dir))?;
            let path = item.path();
            if !item.file_type().map_err(io(&path))?.is_file() {
                continue;
            }
            let Some(stem) = path.file_stem().and_then(|s| s.to_str()).map(str::to_owned) else {
                continue;
            };
            let meta = item.metadata().map_err(io(&path))?;
            let modified = meta.modified().map_err(io(&path))?;
            let entry = reports
                .entry(stem)
                .or_insert_with(|| (Vec::new(), 0, modified));
            entry.0.push(path);
            entry.1 += meta.len();
            entry.2 = entry.2.min(modified);
        }
        let max_age =
            std::time::Duration::from_secs(u64::from(self.rejected_bounds.max_age_days) * 86_400);
        let mut total: u64 = reports.values().map(|r| r.1).sum();
        let mut removed = 0;
        for (files, bytes, moved) in reports.into_values() {
            let old = now.duration_since(moved).is_ok_and(|age| age > max_age);
            if !old && total <= self.rejected_bounds.max_bytes {
                continue;
            }
            for file in &files {
                match fs::remove_file(file) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io(file)(e)),
                }
            }
            total -= bytes;
            removed += 1;
        }
        if removed > 0 {
            sync_dir(dir)?;
            self.counts.rejected_dropped += removed;
            tracing::warn!(
                "rejected/: removed the {removed} oldest refused reports to stay within {} bytes and {} days",
                self.rejected_bounds.max_bytes,
                self.rejected_bounds.max_age_days
            );
        }
        Ok(removed)
    }

    /// Writes one report's frame durably, first dropping the oldest reports if it would not
    /// fit. Returns how many were dropped.
    pub fn push(&mut self, report_id: ReportId, frame: &[u8]) -> Result<u64, SpoolError> {
        let size = frame.len() as u64;
        if size > self.max_bytes {
            self.counts.write_failures += 1;
            return Err(SpoolError::TooLarge {
                size,
                max: self.max_bytes,
            });
        }
        let sequence = self.next_sequence;
        let name = format!("{sequence:020}-{report_id}{SUFFIX}");
        let path = self.dir.join(&name);
        let temp = self.dir.join(format!("{TEMP_PREFIX}{name}"));
        if let Err(e) = write_synced(&temp, frame) {
            let _ = fs::remove_file(&temp);
            self.counts.write_failures += 1;
            return Err(e);
        }
        // Room is made only once the new report is safely written, so that a failed write
        // (a full disk) costs no old report.
        let mut dropped = 0;
        while self.bytes() + size > self.max_bytes {
            let Some(oldest) = self.entries.first().cloned() else {
                break;
            };
            match fs::remove_file(&oldest.path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    let _ = fs::remove_file(&temp);
                    self.counts.write_failures += 1;
                    return Err(SpoolError::File(penrose_host::FileError::Io {
                        path: oldest.path,
                        source: e,
                    }));
                }
            }
            self.entries.remove(0);
            dropped += 1;
        }
        if let Err(e) = fs::rename(&temp, &path).map_err(io(&path)) {
            let _ = fs::remove_file(&temp);
            self.counts.write_failures += 1;
            return Err(e);
        }
        sync_dir(&self.dir)?;
        if dropped > 0 {
            self.counts.dropped += dropped;
            tracing::warn!(
                "spool full ({} bytes): dropped the {dropped} oldest reports ({} dropped since start)",
                self.max_bytes,
                self.counts.dropped
            );
        }
        self.next_sequence += 1;
        self.counts.written += 1;
        self.entries.push(SpoolEntry {
            sequence,
            report_id,
            bytes: size,
            path,
            attempted: false,
        });
        Ok(dropped)
    }

    /// Marks a report as sent (renames it `<sequence>-<id>.sent`, durably) before its first
    /// upload; returns the entry as it is now. A report already marked is returned unchanged.
    pub fn mark_attempted(&mut self, entry: &SpoolEntry) -> Result<SpoolEntry, SpoolError> {
        let Some(at) = self
            .entries
            .iter()
            .position(|e| e.sequence == entry.sequence)
        else {
            return Err(SpoolError::File(penrose_host::FileError::Io {
                path: entry.path.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "the report left the spool",
                ),
            }));
        };
        let current = self.entries[at].clone();
        if current.attempted {
            return Ok(current);
        }
        let name = format!(
            "{:020}-{}{SENT_SUFFIX}",
            current.sequence, current.report_id
        );
        let path = self.dir.join(name);
        fs::rename(&current.path, &path).map_err(io(&path))?;
        sync_dir(&self.dir)?;
        let marked = SpoolEntry {
            path,
            attempted: true,
            ..current
        };
        self.entries[at] = marked.clone();
        Ok(marked)
    }

    /// Replaces a report that never left the agent with `frame` (the same report re-stamped
    /// to another day: the same size), atomically: temporary file, sync, rename, directory
    /// sync. Refuses a report already sent and a frame of another size (the spool's bound
    /// counts the old one).
    pub fn rewrite(&mut self, entry: &SpoolEntry, frame: &[u8]) -> Result<(), SpoolError> {
        let current = self
            .entries
            .iter()
            .find(|e| e.sequence == entry.sequence)
            .cloned();
        let refused = |why: &str| {
            SpoolError::File(penrose_host::FileError::Io {
                path: entry.path.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, why.to_string()),
            })
        };
        let Some(current) = current else {
            return Err(refused("the report left the spool"));
        };
        if current.attempted {
            return Err(refused("a report already sent keeps its bytes"));
        }
        if frame.len() as u64 != current.bytes {
            return Err(refused("a rewritten report must keep its size"));
        }
        let Some(name) = current.path.file_name() else {
            return Err(refused("no file name"));
        };
        let temp = self
            .dir
            .join(format!("{TEMP_PREFIX}{}", name.to_string_lossy()));
        if let Err(e) = write_synced(&temp, frame) {
            let _ = fs::remove_file(&temp);
            return Err(e);
        }
        if let Err(e) = fs::rename(&temp, &current.path).map_err(io(&current.path)) {
            let _ = fs::remove_file(&temp);
            return Err(e);
        }
        sync_dir(&self.dir)
    }

    /// The reports, oldest first.
    pub fn entries(&self) -> &[SpoolEntry] {
        &self.entries
    }

    /// The oldest report.
    pub fn oldest(&self) -> Option<&SpoolEntry> {
        self.entries.first()
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    /// The bound.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Counts since open.
    pub fn counts(&self) -> SpoolCounts {
        self.counts
    }

    /// Whether `entry` is still spooled (it may have been dropped meanwhile).
    pub fn contains(&self, entry: &SpoolEntry) -> bool {
        self.entries.iter().any(|e| e.sequence == entry.sequence)
    }

    /// The server has the report: forget it.
    pub fn remove_delivered(&mut self, entry: &SpoolEntry) -> Result<(), SpoolError> {
        self.forget(entry)?;
        self.counts.delivered += 1;
        Ok(())
    }

    /// The server refused the report: move it to the rejected folder with a note of why.
    pub fn move_rejected(&mut self, entry: &SpoolEntry, reason: &str) -> Result<(), SpoolError> {
        create_private_dir(&self.rejected_dir)?;
        let Some(name) = entry.path.file_name() else {
            return self.forget(entry);
        };
        let target = self.rejected_dir.join(name);
        match fs::rename(&entry.path, &target) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&target)(e)),
        }
        let note = target.with_extension("reason");
        write_synced(&note, format!("{reason}\n").as_bytes())?;
        sync_dir(&self.rejected_dir)?;
        sync_dir(&self.dir)?;
        self.entries.retain(|e| e.sequence != entry.sequence);
        self.counts.rejected += 1;
        self.prune_rejected(std::time::SystemTime::now())?;
        Ok(())
    }

    fn forget(&mut self, entry: &SpoolEntry) -> Result<(), SpoolError> {
        match fs::remove_file(&entry.path) {
            Ok(()) => sync_dir(&self.dir)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&entry.path)(e)),
        }
        self.entries.retain(|e| e.sequence != entry.sequence);
        Ok(())
    }
}

/// Reads a spooled report's frame (a symbolic link is not followed).
pub fn read_frame(entry: &SpoolEntry) -> Result<Vec<u8>, SpoolError> {
    let mut file =
        open_nofollow(OpenOptions::new().read(true), &entry.path).map_err(io(&entry.path))?;
    let mut frame = Vec::new();
    std::io::Read::read_to_end(&mut file, &mut frame).map_err(io(&entry.path))?;
    Ok(frame)
}

/// Opens `path` with `options` and `O_NOFOLLOW`: a symbolic link at that name is an error
/// (saying so), never followed. Every state file is opened through this.
pub fn open_nofollow(options: &mut OpenOptions, path: &Path) -> std::io::Result<File> {
    options
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                std::io::Error::new(
                    e.kind(),
                    "a symbolic link where a state file belongs (state files are never followed)",
                )
            } else {
                e
            }
        })
}

/// The report ids of the files in a spool directory (for `inspect`, which must not take the
/// daemon's spool).
pub fn list_ids(dir: &Path) -> Result<Vec<ReportId>, SpoolError> {
    let mut out = Vec::new();
    let items = match fs::read_dir(dir) {
        Ok(items) => items,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io(dir)(e)),
    };
    for item in items {
        let item = item.map_err(io(dir))?;
        if let Some((_, id, _)) = item.file_name().to_str().and_then(parse_name) {
            out.push(id);
        }
    }
    Ok(out)
}

/// `<sequence>-<id>.report` or `.sent`: (sequence, id, sent at least once).
/// The day each report in a spool directory carries (for `inspect`, which must not take the
/// daemon's spool). Reports that do not read back are left out.
pub fn spooled_days(
    dir: &Path,
) -> Result<std::collections::HashMap<ReportId, penrose_core::wire::Day>, SpoolError> {
    let mut out = std::collections::HashMap::new();
    let items = match fs::read_dir(dir) {
        Ok(items) => items,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io(dir)(e)),
    };
    for item in items {
        let item = item.map_err(io(dir))?;
        let Some((sequence, report_id, attempted)) = item.file_name().to_str().and_then(parse_name)
        else {
            continue;
        };
        let entry = SpoolEntry {
            sequence,
            report_id,
            bytes: 0,
            path: item.path(),
            attempted,
        };
        let Ok(frame) = read_frame(&entry) else {
            continue;
        };
        if let Ok((penrose_core::wire::Message::Report(report), _)) =
            penrose_core::wire::Message::decode(&frame)
        {
            out.insert(report_id, report.day);
        }
    }
    Ok(out)
}

fn parse_name(name: &str) -> Option<(u64, ReportId, bool)> {
    let (stem, attempted) = match name.strip_suffix(SUFFIX) {
        Some(stem) => (stem, false),
        None => (name.strip_suffix(SENT_SUFFIX)?, true),
    };
    let (sequence, id) = stem.split_once('-')?;
    let sequence = sequence.parse().ok()?;
    Some((sequence, id.parse().ok()?, attempted))
}

/// Creates `dir` (and parents) readable by the owner only, and checks it: a directory that
/// already existed is refused ([`SpoolError::Unsafe`]) unless it is owned by this process's
/// user and neither group nor others may write to it.
pub fn create_private_dir(dir: &Path) -> Result<(), SpoolError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io(dir))?;
    check_private_dir(dir)
}

/// Whether `dir` is fit to hold the agent's state (see [`create_private_dir`]).
pub fn check_private_dir(dir: &Path) -> Result<(), SpoolError> {
    let meta = fs::metadata(dir).map_err(io(dir))?;
    let unsafe_dir = |reason: String| SpoolError::Unsafe {
        path: dir.to_owned(),
        reason,
    };
    if !meta.is_dir() {
        return Err(unsafe_dir("not a directory".into()));
    }
    let uid = effective_uid();
    if meta.uid() != uid {
        return Err(unsafe_dir(format!(
            "owned by uid {}, not by the agent's user (uid {uid}); remove it or give it to that user",
            meta.uid()
        )));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(unsafe_dir(format!(
            "writable by group or others (mode {mode:o}); `chmod 700` it"
        )));
    }
    Ok(())
}

/// Writes `bytes` to a new file `path` (mode 0600; a symbolic link there is an error) and
/// syncs it.
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), SpoolError> {
    let mut file = open_nofollow(
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600),
        path,
    )
    .map_err(io(path))?;
    file.write_all(bytes).map_err(io(path))?;
    file.sync_all().map_err(io(path))
}

/// Syncs a directory, so that a rename or removal in it survives a crash.
pub fn sync_dir(dir: &Path) -> Result<(), SpoolError> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn id(n: u8) -> ReportId {
        ReportId([n; 16])
    }

    /// A key rotation gets every report refused: `rejected/` stays within its byte bound
    /// (oldest removed first) and drops what is older than its age bound, counting both.
    #[test]
    fn the_rejected_folder_is_bounded_by_bytes_and_age() {
        let dir = tempfile::tempdir().unwrap();
        let spool_dir = dir.path().join("spool");
        let bounds = RejectedBounds {
            max_bytes: 10_000,
            max_age_days: 7,
        };
        let mut spool = Spool::open(&spool_dir, 1 << 20)
            .unwrap()
            .with_rejected_bounds(bounds)
            .unwrap();
        for n in 0..20 {
            spool.push(id(n), &[n; 1_000]).unwrap();
        }
        for entry in spool.entries().to_vec() {
            spool.move_rejected(&entry, "unknown key").unwrap();
        }
        let rejected = dir.path().join("rejected");
        let bytes = |dir: &Path| -> u64 {
            fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().metadata().unwrap().len())
                .sum()
        };
        assert!(bytes(&rejected) <= bounds.max_bytes, "{}", bytes(&rejected));
        let mut kept: Vec<String> = fs::read_dir(&rejected)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(SUFFIX))
            .collect();
        kept.sort();
        // The newest are kept, each with its note.
        assert_eq!(kept.len(), 9, "{kept:?}");
        assert!(kept.last().unwrap().contains(&id(19).to_string()));
        assert_eq!(spool.counts().rejected_dropped, 11);

        // Ten days later everything is past the age bound.
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(10 * 86_400);
        assert_eq!(spool.prune_rejected(later).unwrap(), 9);
        assert_eq!(fs::read_dir(&rejected).unwrap().count(), 0);
        assert_eq!(spool.counts().rejected_dropped, 20);
    }

    #[test]
    fn reports_survive_reopening_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let spool_dir = dir.path().join("spool");
        let mut spool = Spool::open(&spool_dir, 1 << 20).unwrap();
        for n in 0..5 {
            spool.push(id(n), &[n; 100]).unwrap();
        }
        // A crash mid-write leaves a temporary file; it is not a report.
        fs::write(
            spool_dir.join(".tmp-00000000000000000009-xx.report"),
            b"half",
        )
        .unwrap();
        drop(spool);
        let mut spool = Spool::open(&spool_dir, 1 << 20).unwrap();
        let ids: Vec<_> = spool.entries().iter().map(|e| e.report_id).collect();
        assert_eq!(ids, (0..5).map(id).collect::<Vec<_>>());
        assert_eq!(spool.bytes(), 500);
        assert_eq!(read_frame(spool.oldest().unwrap()).unwrap(), vec![0u8; 100]);
        assert_eq!(
            fs::read_dir(&spool_dir).unwrap().count(),
            5,
            "temp file removed"
        );
        // New reports continue the order.
        spool.push(id(9), &[9; 10]).unwrap();
        assert_eq!(spool.entries().last().unwrap().sequence, 5);
        let oldest = spool.oldest().unwrap().clone();
        spool.remove_delivered(&oldest).unwrap();
        spool
            .move_rejected(&spool.oldest().unwrap().clone(), "Rejected(UnknownKey)")
            .unwrap();
        assert_eq!(spool.entries().len(), 4);
        let rejected = dir.path().join("rejected");
        let notes: Vec<_> = fs::read_dir(&rejected).unwrap().collect();
        assert_eq!(notes.len(), 2, "the report and its reason");
        assert_eq!(list_ids(&spool_dir).unwrap().len(), 4);
    }

    #[test]
    fn a_full_spool_drops_the_oldest_and_counts_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::open(dir.path(), 1000).unwrap();
        for n in 0..10 {
            spool.push(id(n), &[n; 300]).unwrap();
            assert!(spool.bytes() <= 1000);
        }
        let ids: Vec<_> = spool.entries().iter().map(|e| e.report_id).collect();
        assert_eq!(ids, vec![id(7), id(8), id(9)], "the newest three kept");
        assert_eq!(spool.counts().dropped, 7);
        assert_eq!(spool.counts().written, 10);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 3);
        let e = spool.push(id(20), &[0; 1001]).unwrap_err();
        assert!(matches!(e, SpoolError::TooLarge { .. }));
        assert_eq!(spool.entries().len(), 3, "a refused report changes nothing");
    }

    #[test]
    fn a_failed_write_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let spool_dir = dir.path().join("spool");
        let mut spool = Spool::open(&spool_dir, 1000).unwrap();
        for n in 0..3 {
            spool.push(id(n), &[n; 300]).unwrap();
        }
        // The directory vanishes under the spool (as good as a full disk for the write).
        fs::rename(&spool_dir, dir.path().join("elsewhere")).unwrap();
        assert!(spool.push(id(7), &[7; 300]).is_err());
        assert_eq!(spool.entries().len(), 3);
        assert_eq!(
            spool.counts().dropped,
            0,
            "no old report lost for a failed write"
        );
        assert_eq!(spool.counts().write_failures, 1);
    }

    /// A report is marked sent before its first upload (durably: a reopened spool knows), and
    /// only a report never sent can be rewritten, keeping its size.
    #[test]
    fn sent_reports_are_marked_and_only_unsent_ones_can_be_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let spool_dir = dir.path().join("spool");
        let mut spool = Spool::open(&spool_dir, 1 << 20).unwrap();
        spool.push(id(1), &[1; 100]).unwrap();
        spool.push(id(2), &[2; 100]).unwrap();
        let first = spool.oldest().unwrap().clone();
        assert!(!first.attempted);
        spool.rewrite(&first, &[7; 100]).unwrap();
        assert_eq!(read_frame(&first).unwrap(), vec![7; 100]);
        assert!(spool.rewrite(&first, &[7; 99]).is_err(), "size kept");
        let marked = spool.mark_attempted(&first).unwrap();
        assert!(marked.attempted && marked.path.to_string_lossy().ends_with(".sent"));
        assert_eq!(read_frame(&marked).unwrap(), vec![7; 100]);
        assert!(
            spool.rewrite(&marked, &[8; 100]).is_err(),
            "a sent report keeps its bytes"
        );
        assert_eq!(spool.mark_attempted(&marked).unwrap(), marked);
        assert_eq!(spool.bytes(), 200);
        drop(spool);
        let mut spool = Spool::open(&spool_dir, 1 << 20).unwrap();
        let attempted: Vec<_> = spool.entries().iter().map(|e| e.attempted).collect();
        assert_eq!(attempted, vec![true, false]);
        assert_eq!(list_ids(&spool_dir).unwrap().len(), 2);
        // Delivered and rejected work on sent reports as on the others.
        let sent = spool.oldest().unwrap().clone();
        spool.move_rejected(&sent, "InvalidSnippet").unwrap();
        assert!(
            dir.path()
                .join("rejected")
                .join(sent.path.file_name().unwrap())
                .exists()
        );
        assert_eq!(spool.entries().len(), 1);
    }

    /// A pre-existing state directory that group or others may write to (0777) is refused,
    /// naming the mode; so is one owned by another user (checked when the test runs as root).
    #[test]
    fn a_state_directory_others_control_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        fs::create_dir(&state).unwrap();
        fs::set_permissions(&state, fs::Permissions::from_mode(0o777)).unwrap();
        let err = create_private_dir(&state).unwrap_err();
        assert!(matches!(err, SpoolError::Unsafe { .. }), "{err}");
        let message = err.to_string();
        assert!(
            message.contains("writable by group or others (mode 777)"),
            "{message}"
        );
        assert!(message.contains(&state.display().to_string()), "{message}");
        // Its spool inside is refused too once the spool folder is as open.
        let spool_dir = state.join("spool");
        fs::create_dir(&spool_dir).unwrap();
        fs::set_permissions(&spool_dir, fs::Permissions::from_mode(0o770)).unwrap();
        assert!(matches!(
            Spool::open(&spool_dir, 1 << 20),
            Err(SpoolError::Unsafe { .. })
        ));
        // 0700 (and 0755: others may read the encrypted spool, not change it) is fine.
        fs::set_permissions(&state, fs::Permissions::from_mode(0o755)).unwrap();
        create_private_dir(&state).unwrap();
        if effective_uid() == 0 {
            std::os::unix::fs::chown(&state, Some(65534), Some(65534)).unwrap();
            let message = create_private_dir(&state).unwrap_err().to_string();
            assert!(message.contains("owned by uid 65534"), "{message}");
        }
        // A directory the agent creates is its own, 0700.
        let fresh = dir.path().join("fresh/state");
        create_private_dir(&fresh).unwrap();
        assert_eq!(
            fs::metadata(&fresh).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }

    /// A symbolic link where a state file belongs is an error, and what it points to is left
    /// alone.
    #[test]
    fn a_symlinked_state_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        fs::write(&target, b"not the agent's").unwrap();
        let link = dir.path().join("status.json.tmp");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let message = write_synced(&link, b"state").unwrap_err().to_string();
        assert!(message.contains("symbolic link"), "{message}");
        assert_eq!(fs::read(&target).unwrap(), b"not the agent's");
        // A spooled report that is a link is not read through it.
        let spool_dir = dir.path().join("spool");
        let mut spool = Spool::open(&spool_dir, 1 << 20).unwrap();
        spool.push(id(1), &[1; 10]).unwrap();
        let entry = spool.oldest().unwrap().clone();
        fs::remove_file(&entry.path).unwrap();
        std::os::unix::fs::symlink(&target, &entry.path).unwrap();
        assert!(read_frame(&entry).is_err());
        // ... and a reopened spool does not list it.
        drop(spool);
        assert!(
            Spool::open(&spool_dir, 1 << 20)
                .unwrap()
                .entries()
                .is_empty()
        );
    }
}
