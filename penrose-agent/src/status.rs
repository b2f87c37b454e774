//! What the daemon is doing, in `<state_dir>/status.json`, for `penrose-agent status`.
//!
//! The daemon rewrites the file (atomically: temporary file, rename) twice a second and when
//! it stops, so `status` works without talking to the daemon and shows the last state of a
//! daemon that is gone. One type, [`AgentStatus`], is what the daemon writes, what `status`
//! prints (as JSON, or as the text of its `Display`), and what the demo and tests read back.

use std::fmt;
use std::path::{Path, PathBuf};

use penrose_core::counters::{Catalogue, CounterId};
use serde::{Deserialize, Serialize};

use crate::pipeline::PipelineCounts;
use crate::source::{SourceInfo, WindowStat};
use crate::spool::{SpoolCounts, SpoolError, open_nofollow};
use crate::tokens::TokenCount;

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
    pub held: Vec<TokenCount>,
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
    /// Reports sent without one (evidence only: none was held for their day and counter).
    #[serde(default)]
    pub sent_without: u64,
    /// The last fetch's failure.
    pub last_fetch_error: Option<String>,
}

/// Which design key the agent seals under.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DesignKeyStatus {
    /// Today's key id (`None`: the key list gives today no key).
    pub key_id_today: Option<String>,
    /// The held key list's sequence (`None`: the configured key alone).
    pub list_sequence: Option<u64>,
    /// Whether the agent fetches key lists (`design.key_list_signer` is set).
    pub follows_lists: bool,
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
    /// The GPU generations reports name (`sm_80, sm_90`: each GPU's compute capability's major
    /// version, the minor zeroed; a report names its own GPU's); `None` without counters (no
    /// reports).
    #[serde(default)]
    pub arch: Option<String>,
    /// The design server's key today's reports are sealed under, and the key list it comes
    /// from (`crate::design_keys`).
    #[serde(default)]
    pub design_key: DesignKeyStatus,
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
    /// Contributor evidence tokens (the release auditor's party's), counted the same way;
    /// `restamped`, `waiting` and `token_required` stay 0 (a report never waits for one).
    #[serde(default)]
    pub evidence: TokenStatus,
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
        let bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        penrose_host::durable::replace(
            &status_path(state_dir),
            &bytes,
            penrose_host::durable::Access::Owner,
        )
        .map_err(SpoolError::from)
    }

    /// Reads the file.
    pub fn read(state_dir: &Path) -> Result<Self, StatusError> {
        let path = status_path(state_dir);
        let read = |path: &Path| -> std::io::Result<Vec<u8>> {
            let mut file = open_nofollow(std::fs::OpenOptions::new().read(true), path)?;
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut file, &mut bytes)?;
            Ok(bytes)
        };
        let bytes = read(&path).map_err(|error| StatusError::Read {
            path: path.clone(),
            error,
        })?;
        serde_json::from_slice(&bytes).map_err(|error| StatusError::Parse { path, error })
    }
}

/// Why the status file could not be read. The cause is part of the message and not chained
/// as a source, so that `penrose-agent status` says it once, in one line.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The file did not open or read (most often: no daemon has run with this state
    /// directory yet).
    #[error(
        "{}: {error} (has `penrose-agent run` started with this state directory?)",
        path.display()
    )]
    Read {
        /// The status file.
        path: PathBuf,
        /// What the file system said.
        error: std::io::Error,
    },
    /// The file is not a status (damaged, or written by an incompatible version).
    #[error("{}: {error}", path.display())]
    Parse {
        /// The status file.
        path: PathBuf,
        /// What is wrong with it.
        error: serde_json::Error,
    },
}

/// The text form `penrose-agent status` prints: one line per part of the daemon (source,
/// windows, pipeline, report cap, spool, uploads, and tokens when they matter).
impl fmt::Display for AgentStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self;
        write_source(f, s)?;
        write_graphs(f, &s.source.graphs)?;
        write_design_key(f, s)?;
        write_libraries(f, s)?;
        write_work(f, s)?;
        write_uploads(f, s)?;
        write_route(f, &s.route)?;
        write_admission(f, &s.tokens)?;
        write_evidence(f, &s.evidence)?;
        if let Some(e) = &s.last_error {
            writeln!(f, "last error: {e}")?;
        }
        Ok(())
    }
}

/// The process, its source, the GPU generation its reports name, and its samples.
fn write_source(f: &mut fmt::Formatter<'_>, s: &AgentStatus) -> fmt::Result {
    writeln!(
        f,
        "agent pid {} ({}), source {} (counters: {})",
        s.pid,
        if s.running { "running" } else { "stopped" },
        s.source.kind,
        s.source.counters
    )?;
    match (&s.arch, &s.source.gpu_arch) {
        (Some(arch), Some(read)) => writeln!(
            f,
            "GPU architecture: {read}; reports name the generation of the GPU each launch ran on ({arch}: the major version only)"
        )?,
        (Some(arch), None) => writeln!(f, "GPU architecture: reports name {arch}")?,
        (None, _) => writeln!(
            f,
            "GPU architecture: none (no counter values, so no reports)"
        )?,
    }
    let samples = &s.source.samples;
    if samples.sampled > 0 {
        let m = &samples.missing;
        writeln!(
            f,
            "samples: {} sampled, {} with counter values; without: device unknown {}, counters busy (another tool holds them) {}, too soon for the GPU {}, warm-up {}, not found {}, device error {}, group not read {}",
            samples.sampled,
            samples.with_values,
            m.device_unknown,
            m.counters_busy,
            m.too_soon,
            m.warmup,
            m.not_found,
            m.device_error,
            m.group_not_supported + m.no_source,
        )?;
    }
    Ok(())
}

/// Which design server key encrypts today's reports, and where it came from.
fn write_design_key(f: &mut fmt::Formatter<'_>, s: &AgentStatus) -> fmt::Result {
    match (&s.design_key.key_id_today, s.design_key.list_sequence) {
        (Some(id), Some(seq)) => writeln!(
            f,
            "design key today: {id} (signed key list {seq}, fetched from the aggregation server)"
        )?,
        (Some(id), None) if s.design_key.follows_lists => writeln!(
            f,
            "design key today: {id} (the configured key; no key list fetched yet)"
        )?,
        (Some(id), None) => writeln!(f, "design key today: {id} (the configured key)")?,
        (None, _) => {}
    }
    Ok(())
}

/// The libraries the eBPF source probed and the ones it left alone.
fn write_libraries(f: &mut fmt::Formatter<'_>, s: &AgentStatus) -> fmt::Result {
    if s.source.kind == "ebpf" {
        writeln!(
            f,
            "libraries probed: {}; not probed: {} root does not control, {} over capture.max_libraries",
            s.source.inputs.len(),
            s.source.libraries_untrusted,
            s.source.libraries_over_cap
        )?;
    }
    Ok(())
}

/// Capture windows, the pipeline, the report cap and the spool.
fn write_work(f: &mut fmt::Formatter<'_>, s: &AgentStatus) -> fmt::Result {
    writeln!(
        f,
        "windows: {} ({} launches), probe time {:.3} s, probe overhead {} (budget {}%)",
        s.windows,
        s.launches,
        s.probe_s,
        s.probe_overhead_percent
            .map_or("unknown".into(), |p| format!("{p:.4}%")),
        s.budget_percent
    )?;
    writeln!(
        f,
        "pipeline: {} snippets, {} samples, {} local applications, {} open histograms, {} sealed",
        s.pipeline.snippets,
        s.pipeline.samples,
        s.pipeline.local_apps,
        s.pipeline.open_histograms,
        s.pipeline.sealed
    )?;
    writeln!(
        f,
        "report cap: {} histograms held until the next day, {} samples and {} histograms dropped over the cap",
        s.pipeline.held_over_cap, s.pipeline.samples_over_cap, s.pipeline.histograms_over_cap
    )?;
    writeln!(
        f,
        "spool: {} reports, {} of {} bytes; {} dropped when full, {} write failures",
        s.spool.reports,
        s.spool.bytes,
        s.spool.max_bytes,
        s.spool.counts.dropped,
        s.spool.counts.write_failures
    )?;
    Ok(())
}

/// What the aggregation server answered.
fn write_uploads(f: &mut fmt::Formatter<'_>, s: &AgentStatus) -> fmt::Result {
    writeln!(
        f,
        "uploads: {} accepted, {} duplicate, {} rejected, {} overloaded, {} held for a new class, {} failed; server {}, throttle {}/1000{}",
        s.uploads.accepted,
        s.uploads.duplicate,
        s.uploads.rejected,
        s.uploads.overloaded,
        s.uploads.new_class_limit,
        s.uploads.failed,
        if s.uploads.server_reachable {
            "reachable"
        } else {
            "not reached"
        },
        s.uploads.throttle_permille,
        s.uploads
            .last_error
            .as_ref()
            .map_or(String::new(), |e| format!("; last error: {e}"))
    )?;
    Ok(())
}

/// The admission tokens' line and the tokens held, when configured or required.
fn write_admission(f: &mut fmt::Formatter<'_>, t: &TokenStatus) -> fmt::Result {
    if t.configured || t.token_required > 0 {
        writeln!(
            f,
            "admission tokens: {}; {} fetches ({} failed), {} received, {} spent, {} discarded, \
             {} reports re-stamped to today, {} reports waiting for one, {} TokenRequired acks, \
             {} partition warnings{}",
            if t.configured {
                "configured"
            } else {
                "NOT configured, and the server requires them"
            },
            t.fetches,
            t.fetch_failures,
            t.issued,
            t.spent,
            t.discarded,
            t.restamped,
            t.waiting,
            t.token_required,
            t.partition_warnings,
            t.last_fetch_error
                .as_ref()
                .map_or(String::new(), |e| format!("; last fetch: {e}"))
        )?;
        write!(f, "{}", HeldTokens(&t.held))?;
    }
    Ok(())
}

/// The evidence tokens' line and the tokens held, when configured.
fn write_evidence(f: &mut fmt::Formatter<'_>, e: &TokenStatus) -> fmt::Result {
    if e.configured {
        writeln!(
            f,
            "evidence tokens (release auditor): {} fetches ({} failed), {} received, {} spent, \
             {} discarded, {} reports sent without one, {} partition warnings{}",
            e.fetches,
            e.fetch_failures,
            e.issued,
            e.spent,
            e.discarded,
            e.sent_without,
            e.partition_warnings,
            e.last_fetch_error
                .as_ref()
                .map_or(String::new(), |e| format!("; last fetch: {e}"))
        )?;
        write!(f, "{}", HeldTokens(&e.held))?;
    }
    Ok(())
}

/// Tokens held per (day, counter) as `status` and `inspect` show them, one line each: counts
/// only, never a token (tokens are secrets).
#[derive(Clone, Copy, Debug)]
pub struct HeldTokens<'a>(pub &'a [TokenCount]);

impl fmt::Display for HeldTokens<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let catalogue = Catalogue::current();
        for c in self.0 {
            let name = catalogue.name_of(CounterId(c.scope)).unwrap_or("?");
            writeln!(
                f,
                "  day {} counter {} ({name}): {} unspent, {} attached to a report in flight",
                c.epoch, c.scope, c.unspent, c.in_flight
            )?;
        }
        Ok(())
    }
}

/// Where the status file of `state_dir` is.
pub fn status_path(state_dir: &Path) -> PathBuf {
    state_dir.join(STATUS_FILE)
}

/// The route, and on the direct route what it gives away.
fn write_route(f: &mut std::fmt::Formatter<'_>, r: &RouteStatus) -> std::fmt::Result {
    match r.route.warning() {
        Some(warning) => writeln!(f, "route: direct; warning: {warning}"),
        None => writeln!(
            f,
            "route: tor ({}), directory {}, {} streams ({} failed)",
            r.tor_network.as_deref().unwrap_or("network not read yet"),
            if r.tor_ready { "ready" } else { "not ready" },
            r.tor_streams,
            r.tor_stream_failures
        ),
    }
}

/// How graph launches entered snippets, when the capture saw any graph.
fn write_graphs(
    f: &mut std::fmt::Formatter<'_>,
    g: &crate::capture::graphs::GraphCounts,
) -> std::fmt::Result {
    if g.graph_events == 0 && g.launches_unknown == 0 {
        return Ok(());
    }
    writeln!(
        f,
        "graphs: {} launches expanded into {} kernels; kept as <graph>: {} built before the agent saw them, {} not seen whole; {} launches captured; {} over the bounds",
        g.launches_expanded,
        g.kernels_expanded,
        g.launches_unknown,
        g.launches_incomplete,
        g.captured_launches,
        g.over_bounds,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A status with every part the text form shows.
    fn status() -> AgentStatus {
        let mut s = AgentStatus {
            pid: 4242,
            running: true,
            arch: Some("sm_80".into()),
            budget_percent: 0.02,
            windows: 12,
            launches: 34_567,
            probe_s: 0.123_456,
            process_cpu_s: 99.0,
            probe_overhead_percent: Some(0.012_345_6),
            last_error: Some("disk full".into()),
            ..AgentStatus::default()
        };
        s.source.kind = "ebpf".into();
        s.source.counters = "nvml".into();
        s.source.gpu_arch = Some("sm_86".into());
        s.source.inputs = vec!["/usr/lib/libcuda.so.1".into()];
        s.source.libraries_untrusted = 3;
        s.source.libraries_over_cap = 1;
        s.pipeline.snippets = 5;
        s.pipeline.sealed = 2;
        s.spool.reports = 2;
        s.spool.bytes = 2000;
        s.spool.max_bytes = 4096;
        s.uploads.accepted = 1;
        s.uploads.new_class_limit = 5;
        s.uploads.throttle_permille = 500;
        s.uploads.last_error = Some("timed out".into());
        s.tokens.configured = true;
        s.tokens.fetches = 3;
        s.tokens.fetch_failures = 1;
        s.tokens.held = vec![TokenCount {
            epoch: 20_000,
            scope: 2,
            unspent: 5,
            in_flight: 1,
        }];
        s.tokens.last_fetch_error = Some("refused".into());
        s.route.tor_network = Some("public".into());
        s.route.tor_ready = true;
        s.route.tor_streams = 7;
        s.route.tor_stream_failures = 1;
        s
    }

    /// What the daemon writes, `status` and the demo read back as the same value.
    #[test]
    fn the_status_file_round_trips_through_json() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = status();
        s.add_windows(&[WindowStat {
            index: 12,
            launches: 10,
            open_s: 1.0,
            gap_s: 1.0,
            probe_s: 0.001,
            process_cpu_s: Some(0.5),
        }]);
        s.write(dir.path()).unwrap();
        assert_eq!(AgentStatus::read(dir.path()).unwrap(), s);
        let text = serde_json::to_string_pretty(&s).unwrap();
        assert_eq!(serde_json::from_str::<AgentStatus>(&text).unwrap(), s);
    }

    #[test]
    fn a_missing_or_damaged_status_file_is_one_line_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = status_path(dir.path());
        let e = AgentStatus::read(dir.path()).unwrap_err();
        assert!(matches!(e, StatusError::Read { .. }), "{e}");
        let shown = e.to_string();
        assert!(
            shown.starts_with(&format!("{}: ", path.display())),
            "{shown}"
        );
        assert!(
            shown.ends_with(" (has `penrose-agent run` started with this state directory?)"),
            "{shown}"
        );
        assert!(std::error::Error::source(&e).is_none(), "said once");
        std::fs::write(&path, "{\"pid\": 1").unwrap();
        let e = AgentStatus::read(dir.path()).unwrap_err();
        assert!(matches!(e, StatusError::Parse { .. }), "{e}");
        assert!(
            e.to_string().starts_with(&format!("{}: ", path.display())),
            "{e}"
        );
    }

    /// The text form, line by line as `penrose-agent status` has always printed it.
    #[test]
    fn the_text_form_shows_every_part() {
        let counter = Catalogue::current()
            .counter(CounterId(2))
            .map_or("?", |c| c.name);
        assert_eq!(
            status().to_string(),
            format!(
                "agent pid 4242 (running), source ebpf (counters: nvml)\n\
                 GPU architecture: sm_86; reports name the generation of the GPU each launch ran on (sm_80: the major version only)\n\
                 libraries probed: 1; not probed: 3 root does not control, 1 over capture.max_libraries\n\
                 windows: 12 (34567 launches), probe time 0.123 s, probe overhead 0.0123% (budget 0.02%)\n\
                 pipeline: 5 snippets, 0 samples, 0 local applications, 0 open histograms, 2 sealed\n\
                 report cap: 0 histograms held until the next day, 0 samples and 0 histograms dropped over the cap\n\
                 spool: 2 reports, 2000 of 4096 bytes; 0 dropped when full, 0 write failures\n\
                 uploads: 1 accepted, 0 duplicate, 0 rejected, 0 overloaded, 5 held for a new class, 0 failed; server not reached, throttle 500/1000; last error: timed out\n\
                 route: tor (public), directory ready, 7 streams (1 failed)\n\
                 admission tokens: configured; 3 fetches (1 failed), 0 received, 0 spent, 0 discarded, 0 reports re-stamped to today, 0 reports waiting for one, 0 TokenRequired acks, 0 partition warnings; last fetch: refused\n  \
                 day 20000 counter 2 ({counter}): 5 unspent, 1 attached to a report in flight\n\
                 last error: disk full\n"
            )
        );
    }

    /// A replaying agent without counters and without tokens: no library line, no token
    /// lines, and the architecture says why there are no reports.
    #[test]
    fn the_text_form_leaves_out_what_does_not_apply() {
        let mut s = AgentStatus::default();
        s.source.kind = "test-replay".into();
        s.source.counters = "none".into();
        let shown = s.to_string();
        assert!(shown.contains("\nGPU architecture: none (no counter values, so no reports)\n"));
        assert!(!shown.contains("libraries probed"), "{shown}");
        assert!(!shown.contains("admission tokens"), "{shown}");
        assert!(!shown.contains("last error"), "{shown}");
        assert_eq!(shown.lines().count(), 8, "{shown}");
        s.tokens.token_required = 1;
        assert!(
            s.to_string()
                .contains("admission tokens: NOT configured, and the server requires them; ")
        );
    }

    #[test]
    fn the_direct_route_is_shown_with_what_it_gives_away() {
        let mut s = status();
        s.route.route = crate::config::RouteChoice::Direct;
        let shown = s.to_string();
        assert!(
            shown.contains(&format!(
                "\nroute: direct; warning: {}\n",
                crate::config::DIRECT_ROUTE_WARNING
            )),
            "{shown}"
        );
        assert!(!shown.contains("route: tor"), "{shown}");
    }
}
