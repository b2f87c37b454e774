//! What the daemon is doing, in `<state_dir>/status.json`, for `penrose-agent status`.
//!
//! The daemon rewrites the file (atomically: temporary file, rename) twice a second and when
//! it stops, so `status` works without talking to the daemon and shows the last state of a
//! daemon that is gone.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::pipeline::PipelineCounts;
use crate::source::{SourceInfo, WindowStat};
use crate::spool::{SpoolCounts, SpoolError, open_nofollow, write_synced};

/// File name inside the state directory.
pub const STATUS_FILE: &str = "status.json";

/// Windows kept in the status file.
const RECENT_WINDOWS: usize = 10;

/// The spool now.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SpoolStatus {
    /// Reports waiting.
    pub reports: u64,
    /// Their bytes.
    pub bytes: u64,
    /// The bound.
    pub max_bytes: u64,
    /// Counts since start.
    pub counts: SpoolCounts,
}

/// The sealed record (`sealed.jsonl`) and its pruning since start.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RecordStatus {
    /// Its size after the last append or prune.
    pub bytes: u64,
    /// Records pruned for age.
    pub pruned_too_old: u64,
    /// Records pruned to fit the byte bound.
    pub pruned_over_bytes: u64,
    /// Damaged lines dropped.
    pub damaged_lines: u64,
}

impl RecordStatus {
    /// Counts one prune.
    pub fn add(&mut self, pruned: &crate::record::Pruned) {
        if pruned.kept > 0 || pruned.too_old + pruned.over_bytes + pruned.damaged > 0 {
            self.bytes = pruned.bytes;
        }
        self.pruned_too_old += pruned.too_old;
        self.pruned_over_bytes += pruned.over_bytes;
        self.damaged_lines += pruned.damaged;
    }
}

/// Uploads since start.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UploadCounts {
    /// Reports sent (each with its retries).
    pub attempts: u64,
    /// Acked Accepted.
    pub accepted: u64,
    /// Acked Duplicate (an earlier attempt had got through).
    pub duplicate: u64,
    /// Acked Rejected and moved aside.
    pub rejected: u64,
    /// Acked Rejected(Overloaded): kept, retried later.
    pub overloaded: u64,
    /// Acked Rejected(NewClassLimit): the report would found a class the server cannot found
    /// now; kept and retried later, the other reports sent meanwhile.
    #[serde(default)]
    pub new_class_limit: u64,
    /// Uploads that got no ack after all retries (server down or unreachable).
    pub failed: u64,
    /// The server's last throttle hint, thousandths of the normal rate.
    pub throttle_permille: u16,
    /// Whether the last upload got an ack.
    pub server_reachable: bool,
    /// The last failure.
    pub last_error: Option<String>,
}

/// Admission tokens: counts only (tokens are secrets; nothing here identifies one).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TokenStatus {
    /// Whether an issuer is configured (`[admission] address`).
    pub configured: bool,
    /// Tokens held per (epoch = day, scope = counter).
    pub held: Vec<crate::tokens::TokenCount>,
    /// Fetches that got an answer (key set and issuance).
    pub fetches: u64,
    /// Fetches that failed (issuer unreachable, refused, malformed answers).
    pub fetch_failures: u64,
    /// Tokens received and stored.
    pub issued: u64,
    /// Issuances discarded because the issuer's proof did not verify against the published
    /// key (or named a key it never published), and key sets refused because a key changed:
    /// the issuer tried to tell this agent apart from the others.
    pub partition_warnings: u64,
    /// Tokens spent: the server took their reports.
    pub spent: u64,
    /// Tokens discarded because the server refused them (InvalidToken, TokenSpent), or because
    /// their report was refused for good.
    pub discarded: u64,
    /// Reports re-stamped to today because their own day had no token left.
    pub restamped: u64,
    /// Reports waiting now for a token of their day and counter.
    pub waiting: u64,
    /// Acks TokenRequired (the server requires tokens and the report carried none).
    pub token_required: u64,
    /// The last fetch's failure.
    pub last_fetch_error: Option<String>,
}

/// The status file's contents.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentStatus {
    /// The daemon's process id.
    pub pid: u32,
    /// Whether it is running (false once it stopped cleanly).
    pub running: bool,
    /// The snippet source.
    pub source: SourceInfo,
    /// The GPU generation every report names (`sm_90`: the compute capability's major version,
    /// the minor zeroed); `None` without counters (no reports).
    #[serde(default)]
    pub arch: Option<String>,
    /// The configured overhead budget, percent.
    pub budget_percent: f64,
    /// Windows closed.
    pub windows: u64,
    /// Launches seen in them.
    pub launches: u64,
    /// Probe time in them, seconds.
    pub probe_s: f64,
    /// Probed processes' CPU time over windows and the gaps after them (extrapolated from
    /// what they used inside the windows), seconds.
    pub process_cpu_s: f64,
    /// Probe time as a share of that CPU time, percent (the quantity the budget bounds).
    pub probe_overhead_percent: Option<f64>,
    /// The last windows.
    pub recent_windows: Vec<WindowStat>,
    /// Snippets, samples, local applications, sealed histograms.
    pub pipeline: PipelineCounts,
    /// The spool.
    pub spool: SpoolStatus,
    /// The sealed record.
    #[serde(default)]
    pub record: RecordStatus,
    /// Uploads.
    pub uploads: UploadCounts,
    /// Admission tokens.
    #[serde(default)]
    pub tokens: TokenStatus,
    /// How reports leave the host (direct, or over Tor).
    #[serde(default)]
    pub route: RouteStatus,
    /// The last error outside uploads (sealing, spooling).
    pub last_error: Option<String>,
}

/// `transport.route` and, over Tor, what the Tor client did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RouteStatus {
    /// `direct` or `tor`.
    pub route: crate::config::RouteChoice,
    /// The Tor network (`public`, or a network file), over Tor.
    pub tor_network: Option<String>,
    /// Whether arti has a usable directory now.
    pub tor_ready: bool,
    /// Tor streams opened (one per QUIC connection: per upload attempt and per token fetch).
    pub tor_streams: u64,
    /// Tor streams that could not be opened.
    pub tor_stream_failures: u64,
    /// The circuits of the last streams, oldest first (arti's process-unique circuit names:
    /// each stream should name a different one).
    pub tor_recent_circuits: Vec<String>,
}

impl AgentStatus {
    /// Takes closed windows into the totals.
    pub fn add_windows(&mut self, windows: &[WindowStat]) {
        for w in windows {
            self.windows += 1;
            self.launches += w.launches;
            self.probe_s += w.probe_s;
            if let Some(cpu) = w.process_cpu_s
                && w.open_s > 0.0
            {
                self.process_cpu_s += cpu * (w.open_s + w.gap_s) / w.open_s;
            }
            self.recent_windows.push(*w);
        }
        let excess = self.recent_windows.len().saturating_sub(RECENT_WINDOWS);
        self.recent_windows.drain(..excess);
        self.probe_overhead_percent =
            (self.process_cpu_s > 0.0).then(|| 100.0 * self.probe_s / self.process_cpu_s);
    }

    /// Writes the file atomically.
    pub fn write(&self, state_dir: &Path) -> Result<(), SpoolError> {
        let path = status_path(state_dir);
        let temp = state_dir.join(".status.json.tmp");
        let bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        write_synced(&temp, &bytes)?;
        std::fs::rename(&temp, &path).map_err(|source| SpoolError::Io { path, source })
    }

    /// Reads the file.
    pub fn read(state_dir: &Path) -> Result<Self, String> {
        let path = status_path(state_dir);
        let read = |path: &Path| -> std::io::Result<Vec<u8>> {
            let mut file = open_nofollow(std::fs::OpenOptions::new().read(true), path)?;
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut file, &mut bytes)?;
            Ok(bytes)
        };
        let bytes = read(&path).map_err(|e| {
            format!(
                "{}: {e} (has `penrose-agent run` started with this state directory?)",
                path.display()
            )
        })?;
        serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// Where the status file of `state_dir` is.
pub fn status_path(state_dir: &Path) -> PathBuf {
    state_dir.join(STATUS_FILE)
}
