//! The agent's own record of every histogram it sealed, in plaintext, on this machine only.
//!
//! One JSON object per line in `<state_dir>/sealed.jsonl` (mode 0600): report id, snippet hash,
//! counter, sample count and the 128 bins, exactly what was encrypted. It exists so that the
//! owner can see what leaves the machine (`penrose-agent inspect` shows the records of reports
//! still in the spool) and so that an end-to-end test can check that what the design server
//! decrypts equals, bin for bin, what the agents sealed. It never leaves the machine.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use penrose_core::counters::CounterId;
use penrose_core::wire::{Day, ReportId};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::spool::{hex, open_nofollow, parse_hex16};

/// File name of the record inside the state directory.
pub const RECORD_FILE: &str = "sealed.jsonl";

/// Why the record could not be written or read.
#[derive(Debug, Error)]
pub enum RecordError {
    /// The file system refused.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedRecord {
    /// The report id, hex.
    pub report_id: String,
    /// The snippet hash the report carries (that of the last snippet that contributed samples
    /// to the histogram), hex.
    pub snippet: String,
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
    /// Samples in the histogram.
    pub samples: u32,
    /// The 128 bins.
    pub bins: Vec<u32>,
    /// Why it was sealed.
    pub reason: SealReason,
}

impl SealedRecord {
    /// The report id.
    pub fn id(&self) -> Option<ReportId> {
        parse_hex16(&self.report_id).map(ReportId)
    }

    /// The hex form of `id`, as stored.
    pub fn id_hex(id: &ReportId) -> String {
        hex(&id.0)
    }
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

    /// Appends one record and syncs it (before its report is spooled).
    pub fn append(&self, record: &SealedRecord) -> Result<(), RecordError> {
        let io = |source| RecordError::Io {
            path: self.path.clone(),
            source,
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
        file.sync_data().map_err(io)
    }
}

/// Every record in a record file (none when it does not exist). A last line cut short by a
/// crash is skipped.
pub fn read_records(path: &Path) -> Result<Vec<SealedRecord>, RecordError> {
    let file = match open_nofollow(OpenOptions::new().read(true), path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(RecordError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    let lines: Vec<String> = BufReader::new(file)
        .lines()
        .collect::<Result<_, _>>()
        .map_err(|source| RecordError::Io {
            path: path.to_owned(),
            source,
        })?;
    let last = lines.len();
    let mut out = Vec::with_capacity(last);
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(r) => out.push(r),
            Err(_) if i + 1 == last => {
                tracing::warn!("{}: last line incomplete; skipped", path.display())
            }
            Err(source) => {
                return Err(RecordError::Parse {
                    path: path.to_owned(),
                    line: i + 1,
                    source,
                });
            }
        }
    }
    Ok(out)
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
    let io = |source| RecordError::Io {
        path: path.to_owned(),
        source,
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
            report_id: hex(&[day as u8; 16]),
            snippet: hex(&[0; 32]),
            local_app: 0,
            counter,
            counter_name: "c".into(),
            catalogue: 1,
            day,
            samples: 1,
            bins: vec![0; 128],
            reason: SealReason::Age,
        }
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
