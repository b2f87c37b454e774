//! The agent's own record of every histogram it sealed, in plaintext, on this machine only.
//!
//! One JSON object per line in `<state_dir>/sealed.jsonl` (mode 0600): report id, snippet hash,
//! counter, sample count and the 128 bins, exactly what was encrypted. It exists so that the
//! owner can see what leaves the machine (`penrose-agent inspect` shows the records of reports
//! still in the spool) and so that an end-to-end test can check that what the design server
//! decrypts equals, bin for bin, what the agents sealed. It never leaves the machine.
//!
//! **Bounded.** [`RecordLog::prune`] keeps it within [`RecordBounds`]: records whose day is
//! older than the age bound go first, then the oldest records until the file is within three
//! quarters of the byte bound; records of the days the report cap still counts (today and
//! yesterday) are always kept, so a restart never reopens a day's cap. The daemon prunes at
//! start and whenever an append takes the file over its bound; a prune rewrites the file
//! atomically (temporary file, sync, rename, directory sync), so a crash leaves the old or the
//! new file, never a mix. **Damaged lines** (a torn write, a bad sector) are skipped and
//! counted by every reader, wherever they are, and dropped by the next prune.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use penrose_core::counters::CounterId;
use penrose_core::fingerprint::SnippetHash;
use penrose_core::wire::{Day, ReportId};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::spool::open_nofollow;

/// File name of the record inside the state directory.
pub const RECORD_FILE: &str = "sealed.jsonl";

/// Why the record could not be written or read.
#[derive(Debug, Error)]
pub enum RecordError {
    /// A file was not read or written.
    #[error("{0}")]
    File(#[from] penrose_host::FileError),
    /// A line is not a record.
    #[error("{path}:{line}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        source: serde_json::Error,
    },
}

/// Why a histogram was sealed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SealReason {
    /// It reached the seal size.
    Size,
    /// It reached the maximum age.
    Age,
    /// The agent stopped (or its source ended) and sealed what it held.
    Flush,
    /// Its local application was evicted to keep the number of local applications bounded.
    Evicted,
}

/// One sealed histogram, as encrypted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SealedRecord {
    /// The report id (in the file: its text form, 32 hex digits).
    pub report_id: ReportId,
    /// The snippet hash the report carries (that of the last snippet that contributed samples
    /// to the histogram; in the file: its text form, 64 hex digits).
    pub snippet: SnippetHash,
    /// The agent's number for the local application (never sent).
    pub local_app: u64,
    /// Counter id (catalogue).
    pub counter: u16,
    /// Counter name.
    pub counter_name: String,
    /// Catalogue version.
    pub catalogue: u16,
    /// Day (since the epoch) the report carries.
    pub day: u32,
    /// The GPU generation the report names (`sm_90`; empty in records written before reports
    /// carried one).
    #[serde(default)]
    pub arch: String,
    /// Samples in the histogram.
    pub samples: u32,
    /// The 128 bins.
    pub bins: Vec<u32>,
    /// Why it was sealed.
    pub reason: SealReason,
    /// TEST EQUIPMENT (`seal.test_record_joint_values`): a joint view's raw (x, y) values,
    /// one pair per sample, so that a test can check the decrypted grid against the values
    /// themselves rather than against the agent's own binning. Empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub joint_values: Vec<[f64; 2]>,
}

/// How much of the sealed record is kept (`spool.record_max_bytes`,
/// `spool.record_max_age_days`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordBounds {
    /// Bytes the file may hold before a prune.
    pub max_bytes: u64,
    /// Records whose day is more than this many days before today are dropped.
    pub max_age_days: u32,
}

/// What one prune did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pruned {
    /// Records kept.
    pub kept: u64,
    /// Records dropped for age.
    pub too_old: u64,
    /// Records dropped to fit the byte bound.
    pub over_bytes: u64,
    /// Damaged lines dropped.
    pub damaged: u64,
    /// The file's size afterwards.
    pub bytes: u64,
}

/// Appends records, synced, to the record file.
#[derive(Debug)]
pub struct RecordLog {
    path: PathBuf,
}

impl RecordLog {
    /// The record in `state_dir`.
    pub fn in_state_dir(state_dir: &Path) -> Self {
        Self {
            path: state_dir.join(RECORD_FILE),
        }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one record and syncs it (before its report is spooled). Returns the file's
    /// size afterwards. A failed write (a full disk) leaves at most a torn last line, which
    /// readers skip.
    pub fn append(&self, record: &SealedRecord) -> Result<u64, RecordError> {
        let io = |source| {
            RecordError::File(penrose_host::FileError::Io {
                path: self.path.clone(),
                source,
            })
        };
        let mut line = serde_json::to_vec(record).map_err(|source| RecordError::Parse {
            path: self.path.clone(),
            line: 0,
            source,
        })?;
        line.push(b'\n');
        let mut file = open_nofollow(
            OpenOptions::new().append(true).create(true).mode(0o600),
            &self.path,
        )
        .map_err(io)?;
        file.write_all(&line).map_err(io)?;
        file.sync_data().map_err(io)?;
        Ok(file.metadata().map_err(io)?.len())
    }

    /// Drops what `bounds` do not keep (module docs) as of `today`, keeping every record of a
    /// day from `keep_from` on. Rewrites the file only when something is dropped.
    pub fn prune(
        &self,
        bounds: RecordBounds,
        today: Day,
        keep_from: Day,
    ) -> Result<Pruned, RecordError> {
        #[derive(Deserialize)]
        struct DayOnly {
            day: u32,
        }
        let io = |source| {
            RecordError::File(penrose_host::FileError::Io {
                path: self.path.clone(),
                source,
            })
        };
        let file = match open_nofollow(OpenOptions::new().read(true), &self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Pruned::default()),
            Err(source) => return Err(io(source)),
        };
        let mut out = Pruned::default();
        let oldest = Day(today.0.saturating_sub(bounds.max_age_days));
        // (day, line) of every record young enough, in file order (oldest first).
        let mut lines: Vec<(u32, Vec<u8>)> = Vec::new();
        let mut reader = BufReader::new(file);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let n = reader.read_until(b'\n', &mut buf).map_err(io)?;
            if n == 0 {
                break;
            }
            let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match serde_json::from_slice::<DayOnly>(line) {
                Ok(r) if r.day < oldest.0 && r.day < keep_from.0 => out.too_old += 1,
                Ok(r) => lines.push((r.day, line.to_vec())),
                Err(_) => out.damaged += 1,
            }
        }
        let size =
            |lines: &[(u32, Vec<u8>)]| lines.iter().map(|(_, l)| l.len() as u64 + 1).sum::<u64>();
        let mut bytes = size(&lines);
        if bytes > bounds.max_bytes {
            let target = bounds.max_bytes / 4 * 3;
            let mut kept = Vec::with_capacity(lines.len());
            for (day, line) in lines {
                if bytes > target && day < keep_from.0 {
                    bytes -= line.len() as u64 + 1;
                    out.over_bytes += 1;
                } else {
                    kept.push((day, line));
                }
            }
            lines = kept;
        }
        out.kept = lines.len() as u64;
        out.bytes = size(&lines);
        if out.too_old + out.over_bytes + out.damaged == 0 {
            return Ok(out);
        }
        let mut text = Vec::with_capacity(out.bytes as usize);
        for (_, line) in &lines {
            text.extend_from_slice(line);
            text.push(b'\n');
        }
        penrose_host::durable::replace(&self.path, &text, penrose_host::durable::Access::Owner)
            .map_err(|e| io(std::io::Error::other(e.to_string())))?;
        Ok(out)
    }
}

/// Every record in a record file (none when it does not exist). Damaged lines (a last line
/// cut short by a crash or a full disk, or a damaged line anywhere) are skipped with a warning;
/// [`read_records_counted`] counts them.
pub fn read_records(path: &Path) -> Result<Vec<SealedRecord>, RecordError> {
    let (records, damaged) = read_records_counted(path)?;
    if damaged > 0 {
        tracing::warn!("{}: {damaged} damaged line(s) skipped", path.display());
    }
    Ok(records)
}

/// [`read_records`], with the number of damaged lines skipped.
pub fn read_records_counted(path: &Path) -> Result<(Vec<SealedRecord>, usize), RecordError> {
    let file = match open_nofollow(OpenOptions::new().read(true), path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(source) => {
            return Err(RecordError::File(penrose_host::FileError::Io {
                path: path.to_owned(),
                source,
            }));
        }
    };
    let io = |source| {
        RecordError::File(penrose_host::FileError::Io {
            path: path.to_owned(),
            source,
        })
    };
    let mut out = Vec::new();
    let mut damaged = 0;
    let mut reader = BufReader::new(file);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        if reader.read_until(b'\n', &mut buf).map_err(io)? == 0 {
            break;
        }
        let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice(line) {
            Ok(r) => out.push(r),
            Err(_) => damaged += 1,
        }
    }
    Ok((out, damaged))
}

/// Reports sealed per (day stamped, counter).
pub type SealedPerDay = BTreeMap<(Day, CounterId), u32>;

/// How many records a record file holds per (day, counter), for days from `oldest` on: what
/// the agent sealed before a restart, so that the report cap survives it. Read line by line
/// (only the day and the counter are parsed); lines that are not records (a last line cut
/// short by a crash, a damaged line) are skipped and counted in the second value. A missing
/// file holds none.
pub fn sealed_per_day(path: &Path, oldest: Day) -> Result<(SealedPerDay, usize), RecordError> {
    #[derive(Deserialize)]
    struct DayCounter {
        day: u32,
        counter: u16,
    }
    let io = |source| {
        RecordError::File(penrose_host::FileError::Io {
            path: path.to_owned(),
            source,
        })
    };
    let file = match open_nofollow(OpenOptions::new().read(true), path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((BTreeMap::new(), 0)),
        Err(source) => return Err(io(source)),
    };
    let mut counts = BTreeMap::new();
    let mut skipped = 0;
    for line in BufReader::new(file).lines() {
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<DayCounter>(&line) {
            Ok(r) if r.day >= oldest.0 => {
                *counts
                    .entry((Day(r.day), CounterId(r.counter)))
                    .or_insert(0) += 1;
            }
            Ok(_) => {}
            Err(_) => skipped += 1,
        }
    }
    Ok((counts, skipped))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn record(day: u32, counter: u16) -> SealedRecord {
        SealedRecord {
            report_id: ReportId([day as u8; 16]),
            snippet: SnippetHash([0; 32]),
            local_app: 0,
            counter,
            counter_name: "c".into(),
            catalogue: 1,
            day,
            arch: "sm_90".into(),
            samples: 1,
            bins: vec![0; 128],
            reason: SealReason::Age,
            joint_values: Vec::new(),
        }
    }

    /// The ids are typed in memory but the file keeps the format it always had: each id as
    /// its text form, a JSON string of lower-case hex. A line written before the ids were
    /// typed reads back as the same record, and a line whose id is not one counts as damaged.
    #[test]
    fn ids_keep_their_text_form_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let log = RecordLog::in_state_dir(dir.path());
        let mut written = record(3, 5);
        written.report_id = ReportId(std::array::from_fn(|i| 0xf0 | i as u8));
        written.snippet = SnippetHash(std::array::from_fn(|i| i as u8 * 7));
        log.append(&written).unwrap();
        let text = std::fs::read_to_string(log.path()).unwrap();
        let id_hex: String = (0..16).map(|i| format!("{:02x}", 0xf0 | i)).collect();
        let snippet_hex: String = (0..32).map(|i| format!("{:02x}", i * 7)).collect();
        assert!(
            text.contains(&format!("\"report_id\":\"{id_hex}\"")),
            "{text}"
        );
        assert!(
            text.contains(&format!("\"snippet\":\"{snippet_hex}\"")),
            "{text}"
        );

        // The line as the agent wrote it when both were hex strings (the same bytes).
        let old = format!(
            "{{\"report_id\":\"{id_hex}\",\"snippet\":\"{snippet_hex}\",\"local_app\":0,\
             \"counter\":5,\"counter_name\":\"c\",\"catalogue\":1,\"day\":3,\"arch\":\"sm_90\",\
             \"samples\":1,\
             \"bins\":[{}],\"reason\":\"age\"}}\n",
            vec!["0"; 128].join(",")
        );
        assert_eq!(old, text);
        let bad = old.replacen(&id_hex, &id_hex[..30], 1);
        std::fs::write(log.path(), format!("{old}{bad}")).unwrap();
        let (read, damaged) = read_records_counted(log.path()).unwrap();
        assert_eq!((read, damaged), (vec![written], 1));
    }

    /// The record's per-(day, counter) counts, from a given day on, skipping a torn last line.
    #[test]
    fn sealed_per_day_counts_what_was_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let log = RecordLog::in_state_dir(dir.path());
        let (none, skipped) = sealed_per_day(log.path(), Day(0)).unwrap();
        assert!(none.is_empty() && skipped == 0, "no file: no records");
        for (day, counter) in [(9, 5), (10, 5), (10, 5), (10, 6), (11, 5)] {
            log.append(&record(day, counter)).unwrap();
        }
        let mut file = OpenOptions::new().append(true).open(log.path()).unwrap();
        file.write_all(b"{\"report_id\":\"ab").unwrap();
        let (counts, skipped) = sealed_per_day(log.path(), Day(10)).unwrap();
        assert_eq!(skipped, 1);
        let expected: BTreeMap<_, _> = [
            ((Day(10), CounterId(5)), 2),
            ((Day(10), CounterId(6)), 1),
            ((Day(11), CounterId(5)), 1),
        ]
        .into_iter()
        .collect();
        assert_eq!(counts, expected);
    }

    /// A symbolic link at `sealed.jsonl` (planted to make the agent write, as root, where the
    /// link points) is refused, by the writer and the readers, and its target is untouched.
    #[test]
    fn a_pruned_record_keeps_the_cap_days_and_the_newest_within_its_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let log = RecordLog::in_state_dir(dir.path());
        let today = Day(100);
        // 10 records 60 days old, 200 of 10 days ago, 5 of yesterday and 5 of today.
        for (day, n) in [(40, 10), (90, 200), (99, 5), (100, 5)] {
            for _ in 0..n {
                log.append(&record(day, 5)).unwrap();
            }
        }
        // A damaged line in the middle (a bad sector), not only at the end.
        let mut file = OpenOptions::new().append(true).open(log.path()).unwrap();
        file.write_all(b"\x00\x00garbage\n").unwrap();
        log.append(&record(100, 6)).unwrap();
        let (all, damaged) = read_records_counted(log.path()).unwrap();
        assert_eq!((all.len(), damaged), (221, 1));
        let line = std::fs::metadata(log.path()).unwrap().len() / 222;

        let bounds = RecordBounds {
            max_bytes: 50 * line,
            max_age_days: 30,
        };
        let pruned = log.prune(bounds, today, Day(99)).unwrap();
        assert_eq!(pruned.too_old, 10);
        assert_eq!(pruned.damaged, 1);
        // Down to three quarters of the bound, oldest first, never the cap days (11 records).
        assert!(pruned.bytes <= bounds.max_bytes / 4 * 3, "{pruned:?}");
        let (kept, damaged) = read_records_counted(log.path()).unwrap();
        assert_eq!(damaged, 0);
        assert_eq!(kept.len() as u64, pruned.kept);
        assert_eq!(kept.iter().filter(|r| r.day >= 99).count(), 11);
        assert_eq!(pruned.over_bytes + pruned.kept, 211);
        // Nothing more to drop: a second prune does not rewrite.
        let again = log.prune(bounds, today, Day(99)).unwrap();
        assert_eq!(again.too_old + again.over_bytes + again.damaged, 0);
        // The cap days alone over the bound are still all kept.
        let tiny = RecordBounds {
            max_bytes: line,
            max_age_days: 30,
        };
        let pruned = log.prune(tiny, today, Day(99)).unwrap();
        assert_eq!(pruned.kept, 11);
    }

    #[test]
    fn a_symlinked_sealed_record_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"").unwrap();
        let log = RecordLog::in_state_dir(dir.path());
        std::os::unix::fs::symlink(&target, log.path()).unwrap();
        let message = log.append(&record(10, 5)).unwrap_err().to_string();
        assert!(message.contains("symbolic link"), "{message}");
        assert!(message.contains(RECORD_FILE), "{message}");
        assert_eq!(std::fs::read(&target).unwrap(), b"");
        assert!(read_records(log.path()).is_err());
        assert!(sealed_per_day(log.path(), Day(0)).is_err());
    }
}
