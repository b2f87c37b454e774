//! The agent's own record of every histogram it sealed, in plaintext, on this machine only.
//!
//! One JSON object per line in `<state_dir>/sealed.jsonl` (mode 0600): report id, snippet hash,
//! counter, sample count and the 128 bins, exactly what was encrypted. It exists so that the
//! owner can see what leaves the machine (`penrose-agent inspect` shows the records of reports
//! still in the spool) and so that an end-to-end test can check that what the design server
//! decrypts equals, bin for bin, what the agents sealed. It never leaves the machine.

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use penrose_core::wire::ReportId;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::spool::{hex, parse_hex16};

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
    /// The snippet hash the report carries (the local application's representative), hex.
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
        let mut file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&self.path)
            .map_err(io)?;
        file.write_all(&line).map_err(io)?;
        file.sync_data().map_err(io)
    }
}

/// Every record in a record file (none when it does not exist). A last line cut short by a
/// crash is skipped.
pub fn read_records(path: &Path) -> Result<Vec<SealedRecord>, RecordError> {
    let file = match std::fs::File::open(path) {
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
