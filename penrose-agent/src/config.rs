//! The agent's configuration file (TOML, default `/etc/penrose/agent.toml`).
//!
//! Every key has a default, so an empty file is a valid configuration; [`DEFAULT_FILE`] is the
//! commented default file `penrose-agent config --print-default` prints, and a test checks that
//! it parses to exactly [`AgentConfig::default`]. Unknown keys are errors (a misspelt key would
//! otherwise silently keep its default), and every error names the key and the line, so an
//! operator who changed one value can find the mistake.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use penrose_core::fingerprint::FingerprintParams;
use penrose_core::paillier::MAX_REPORT_SAMPLES;
use penrose_core::release::ReportsPerContributor;
use serde::Deserialize;
use thiserror::Error;

use crate::counters::SourceKind;

/// Where `penrose-agent` looks for its configuration when not told.
pub const DEFAULT_PATH: &str = "/etc/penrose/agent.toml";

/// Why a configuration file was refused.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A key is unknown, has a value of the wrong type, or a value out of range.
    #[error("{path}:{line}: key `{key}`: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// 1-based line of the key (0 when the file has no such line, e.g. a missing section).
        line: usize,
        /// The key, with its section (`capture.budget_percent`).
        key: String,
        /// What is wrong.
        message: String,
    },
    /// The file is not TOML at all.
    #[error("{path}:{line}: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// What the parser said.
        message: String,
    },
}

/// The whole configuration.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// The owner's opt-out: `false` makes `run` exit at once without capturing or sending.
    pub enabled: bool,
    /// Spool, sealed record and status file live here.
    pub state_dir: PathBuf,
    /// Where reports go.
    pub aggregator: AggregatorConfig,
    /// The key reports are encrypted with.
    pub design: DesignConfig,
    /// Capture windows, sampling and counters.
    pub capture: CaptureSection,
    /// The trace-replay source (no eBPF).
    pub replay: ReplaySection,
    /// Local applications.
    pub classes: ClassesSection,
    /// When histograms are sealed.
    pub seal: SealSection,
    /// The spool's bound.
    pub spool: SpoolSection,
    /// Upload timing and retries.
    pub upload: UploadSection,
}

/// `[aggregator]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AggregatorConfig {
    /// `host:port` of the aggregation server's QUIC endpoint (UDP).
    pub address: String,
    /// The name its certificate carries.
    pub server_name: String,
    /// Its certificate (PEM or DER), pinned: no other is accepted.
    pub certificate: PathBuf,
}

/// `[design]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DesignConfig {
    /// The design server's public key file (`penrose-design keygen` writes it).
    pub public_key: PathBuf,
}

/// Which snippet source feeds the pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceChoice {
    /// eBPF when running as root, else the trace replay (with a log line saying why).
    Auto,
    /// eBPF probes on libcuda (needs root).
    Ebpf,
    /// Replay the traces in `[replay] traces`.
    Replay,
}

/// `[capture]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CaptureSection {
    /// Snippet source.
    pub source: SourceChoice,
    /// L: launches per process per window.
    pub window_launches: usize,
    /// Overhead budget, percent of the probed processes' CPU time.
    pub budget_percent: f64,
    /// Longest window.
    pub max_window_seconds: f64,
    /// Shortest gap between windows.
    pub min_gap_seconds: f64,
    /// Longest gap between windows.
    pub max_gap_seconds: f64,
    /// S: one launch in S sampled.
    pub sample_period: u32,
    /// O: the sampling offset is re-drawn this often.
    pub reoffset_seconds: f64,
    /// How long each counter group stays active.
    pub group_seconds: f64,
    /// Counter source.
    pub counters: SourceKind,
    /// libcuda files to probe besides those found.
    pub libraries: Vec<PathBuf>,
    /// Also look through `ldconfig -p` and running processes' maps.
    pub scan_system: bool,
    /// Measure the probe cost at start.
    pub calibrate: bool,
}

/// `[replay]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplaySection {
    /// Folder of `.json`/`.json.gz` profiler traces.
    pub traces: PathBuf,
    /// Time between replayed windows.
    pub window_seconds: f64,
    /// Replayed windows before the source ends (0: no end).
    pub windows: u64,
}

/// `[classes]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClassesSection {
    /// Similarity at or above which a snippet joins a local application.
    pub tau: f64,
    /// Most local applications kept; the longest idle is sealed and forgotten beyond it.
    pub max_local_apps: usize,
}

/// `[seal]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SealSection {
    /// A histogram is sealed when it holds this many samples.
    pub samples: u32,
    /// ... or when it is this old, whichever comes first.
    pub max_age_seconds: f64,
    /// T: the most reports sealed per (counter, day) across all local applications, 1 to
    /// [`ReportsPerContributor::DEFAULT`] (servers count contributors with the default).
    pub max_reports_per_counter_per_day: u32,
}

/// `[spool]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpoolSection {
    /// Bytes the spool may hold; the oldest reports are dropped beyond it.
    pub max_bytes: u64,
}

/// `[upload]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UploadSection {
    /// Each upload waits a uniformly random time up to this first.
    pub delay_max_seconds: f64,
    /// Attempts per upload (the transport's retries, first attempt included).
    pub attempts: u32,
    /// First retry's wait.
    pub backoff_base_seconds: f64,
    /// Longest wait between retries, and between rounds while the server is down.
    pub backoff_max_seconds: f64,
    /// Connect timeout.
    pub connect_timeout_seconds: f64,
    /// Ack timeout.
    pub ack_timeout_seconds: f64,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            state_dir: PathBuf::from("/var/lib/penrose-agent"),
            aggregator: AggregatorConfig::default(),
            design: DesignConfig::default(),
            capture: CaptureSection::default(),
            replay: ReplaySection::default(),
            classes: ClassesSection::default(),
            seal: SealSection::default(),
            spool: SpoolSection::default(),
            upload: UploadSection::default(),
        }
    }
}

impl Default for AggregatorConfig {
    fn default() -> Self {
        Self {
            address: "127.0.0.1:4433".into(),
            server_name: "aggregator.penrose".into(),
            certificate: PathBuf::from("/etc/penrose/aggregator.pem"),
        }
    }
}

impl Default for DesignConfig {
    fn default() -> Self {
        Self {
            public_key: PathBuf::from("/etc/penrose/design-public.key"),
        }
    }
}

impl Default for CaptureSection {
    fn default() -> Self {
        Self {
            source: SourceChoice::Auto,
            window_launches: crate::capture::window::DEFAULT_WINDOW_LAUNCHES,
            budget_percent: 0.02,
            max_window_seconds: 10.0,
            min_gap_seconds: 60.0,
            max_gap_seconds: 21_600.0,
            sample_period: 10_000,
            reoffset_seconds: 600.0,
            group_seconds: 600.0,
            counters: SourceKind::Auto,
            libraries: Vec::new(),
            scan_system: true,
            calibrate: true,
        }
    }
}

impl Default for ReplaySection {
    fn default() -> Self {
        Self {
            traces: PathBuf::from("/usr/share/penrose/traces"),
            window_seconds: 60.0,
            windows: 0,
        }
    }
}

impl Default for ClassesSection {
    fn default() -> Self {
        Self {
            tau: FingerprintParams::default().tau,
            max_local_apps: 1024,
        }
    }
}

impl Default for SealSection {
    fn default() -> Self {
        Self {
            samples: 10_000,
            max_age_seconds: 3600.0,
            max_reports_per_counter_per_day: ReportsPerContributor::DEFAULT.get(),
        }
    }
}

impl Default for SpoolSection {
    fn default() -> Self {
        Self {
            max_bytes: 64 * 1024 * 1024,
        }
    }
}

impl Default for UploadSection {
    fn default() -> Self {
        Self {
            delay_max_seconds: 60.0,
            attempts: 8,
            backoff_base_seconds: 0.2,
            backoff_max_seconds: 300.0,
            connect_timeout_seconds: 5.0,
            ack_timeout_seconds: 10.0,
        }
    }
}

/// The commented default file. A unit test checks it parses to [`AgentConfig::default`].
pub const DEFAULT_FILE: &str = r#"# Penrose agent configuration (/etc/penrose/agent.toml).
# Every key is optional; the values below are the defaults.

# The owner's opt-out: false makes `penrose-agent run` log one line and exit 0 without
# capturing or sending anything.
enabled = true
# Spool (encrypted reports waiting to be sent), sealed record (the plaintext histograms this
# machine sealed, readable by root only; `penrose-agent inspect` shows them) and status file.
state_dir = "/var/lib/penrose-agent"

[aggregator]
# host:port of the aggregation server's QUIC endpoint (UDP).
address = "127.0.0.1:4433"
# The name in its certificate.
server_name = "aggregator.penrose"
# Its certificate (PEM or DER). Pinned: the agent accepts no other.
certificate = "/etc/penrose/aggregator.pem"

[design]
# The design server's public key (`penrose-design keygen` writes public.key). Reports are
# encrypted with it; nobody but the design server can read them.
public_key = "/etc/penrose/design-public.key"

[capture]
# Where snippets come from: "auto" (eBPF when root, else the trace replay), "ebpf", "replay".
source = "auto"
# L: launches per process per capture window.
window_launches = 10000
# Overhead budget: probes may cost this percentage of the probed processes' CPU time.
budget_percent = 0.02
# The longest a window stays open.
max_window_seconds = 10.0
# The shortest and longest gaps between windows.
min_gap_seconds = 60.0
max_gap_seconds = 21600.0
# S: one launch in S is sampled.
sample_period = 10000
# O: the random sampling offset is re-drawn this often.
reoffset_seconds = 600.0
# Counter groups take turns of this length.
group_seconds = 600.0
# Counter source: "auto" (NVML if present, else the stand-in ring), "nvml", "standin", "none".
counters = "auto"
# libcuda files to probe besides those ldconfig and running processes show.
libraries = []
# Look through `ldconfig -p` and /proc/*/maps for libcuda.
scan_system = true
# Measure the probe cost at start (else assume 10 us per launch).
calibrate = true

[replay]
# The trace-replay source (capture.source = "replay", or "auto" without root): a folder of
# PyTorch profiler traces replayed as if captured.
traces = "/usr/share/penrose/traces"
# Time between replayed windows.
window_seconds = 60.0
# Windows before the replay ends (0: none; it loops).
windows = 0

[classes]
# Similarity (estimated from snippet hashes) at or above which a snippet joins a local
# application.
tau = 0.46
# Most local applications kept; beyond it the longest idle one is sealed and forgotten.
max_local_apps = 1024

[seal]
# A histogram is sealed (encrypted and spooled) at this many samples (at most 10000) ...
samples = 10000
# ... or at this age, whichever comes first.
max_age_seconds = 3600.0
# At most this many reports per counter and day, all local applications together (1 to 24;
# servers count one contributor per 24). A histogram due beyond it is held until the next
# day; once full, its counter's further samples are dropped and counted (`status`); at stop,
# what is held beyond it is discarded.
max_reports_per_counter_per_day = 24

[spool]
# Bytes of encrypted reports kept while the server is unreachable; the oldest are dropped
# first, with a counted warning.
max_bytes = 67108864

[upload]
# Every attempt of every upload has a QUIC connection of its own, from a new UDP port, with a
# full handshake (no TLS resumption, no address token), closed after the ack: the server
# cannot link this machine's reports by their connection. There is no setting to share one.
# Each upload first waits a random time up to this (breaks timing correlation).
delay_max_seconds = 60.0
# Attempts per upload, and the backoff between them.
attempts = 8
backoff_base_seconds = 0.2
# Longest wait between attempts, and between rounds while the server is down.
backoff_max_seconds = 300.0
connect_timeout_seconds = 5.0
ack_timeout_seconds = 10.0
"#;

impl AgentConfig {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates `text` (`path` only names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let config: AgentConfig = toml::from_str(text).map_err(|e| {
            let at = e.span().map_or(0, |s| s.start);
            let line = line_of(text, at);
            let key = key_at(text, at);
            let message = e.message().trim().to_string();
            match key {
                Some(key) => ConfigError::Invalid {
                    path: path.to_owned(),
                    line,
                    key,
                    message,
                },
                None => ConfigError::Syntax {
                    path: path.to_owned(),
                    line,
                    message,
                },
            }
        })?;
        config
            .validate()
            .map_err(|(key, message)| ConfigError::Invalid {
                path: path.to_owned(),
                line: find_key_line(text, key),
                key: key.to_string(),
                message,
            })?;
        Ok(config)
    }

    /// Range checks serde cannot express; `Err((key, why))`.
    fn validate(&self) -> Result<(), (&'static str, String)> {
        fn secs(key: &'static str, v: f64, zero_ok: bool) -> Result<(), (&'static str, String)> {
            let ok = v.is_finite() && (v > 0.0 || (zero_ok && v == 0.0)) && v < 1e9;
            if ok {
                Ok(())
            } else {
                Err((
                    key,
                    format!(
                        "{v} is not a duration in seconds (must be {} and finite)",
                        if zero_ok { "at least 0" } else { "above 0" }
                    ),
                ))
            }
        }
        let c = &self.capture;
        if c.window_launches == 0 {
            return Err(("capture.window_launches", "must be at least 1".into()));
        }
        if !(c.budget_percent > 0.0 && c.budget_percent <= 100.0) {
            return Err((
                "capture.budget_percent",
                format!("{} must be above 0 and at most 100", c.budget_percent),
            ));
        }
        secs("capture.max_window_seconds", c.max_window_seconds, false)?;
        secs("capture.min_gap_seconds", c.min_gap_seconds, true)?;
        secs("capture.max_gap_seconds", c.max_gap_seconds, false)?;
        if c.min_gap_seconds > c.max_gap_seconds {
            return Err((
                "capture.min_gap_seconds",
                "must not exceed capture.max_gap_seconds".into(),
            ));
        }
        if c.sample_period == 0 {
            return Err(("capture.sample_period", "must be at least 1".into()));
        }
        secs("capture.reoffset_seconds", c.reoffset_seconds, false)?;
        secs("capture.group_seconds", c.group_seconds, false)?;
        secs("replay.window_seconds", self.replay.window_seconds, true)?;
        if !(0.0..=1.0).contains(&self.classes.tau) {
            return Err((
                "classes.tau",
                format!("{} is not a similarity in [0, 1]", self.classes.tau),
            ));
        }
        if self.classes.max_local_apps == 0 {
            return Err(("classes.max_local_apps", "must be at least 1".into()));
        }
        if self.seal.samples == 0 || u64::from(self.seal.samples) > MAX_REPORT_SAMPLES {
            return Err((
                "seal.samples",
                format!(
                    "{} must be between 1 and {MAX_REPORT_SAMPLES} (what one report may hold)",
                    self.seal.samples
                ),
            ));
        }
        secs("seal.max_age_seconds", self.seal.max_age_seconds, false)?;
        ReportsPerContributor::for_agent(self.seal.max_reports_per_counter_per_day)
            .map_err(|e| ("seal.max_reports_per_counter_per_day", e.to_string()))?;
        if self.spool.max_bytes < 4096 {
            return Err((
                "spool.max_bytes",
                format!("{} is below one report (4096)", self.spool.max_bytes),
            ));
        }
        let u = &self.upload;
        secs("upload.delay_max_seconds", u.delay_max_seconds, true)?;
        if u.attempts == 0 {
            return Err(("upload.attempts", "must be at least 1".into()));
        }
        secs("upload.backoff_base_seconds", u.backoff_base_seconds, false)?;
        secs("upload.backoff_max_seconds", u.backoff_max_seconds, false)?;
        secs(
            "upload.connect_timeout_seconds",
            u.connect_timeout_seconds,
            false,
        )?;
        secs("upload.ack_timeout_seconds", u.ack_timeout_seconds, false)?;
        if self.aggregator.address.trim().is_empty() {
            return Err(("aggregator.address", "is empty".into()));
        }
        Ok(())
    }

    /// The aggregator's address, resolved (a name is looked up once, at start).
    pub fn aggregator_addr(&self) -> Result<SocketAddr, String> {
        self.aggregator
            .address
            .to_socket_addrs()
            .map_err(|e| format!("aggregator.address {:?}: {e}", self.aggregator.address))?
            .next()
            .ok_or_else(|| {
                format!(
                    "aggregator.address {:?} resolves to nothing",
                    self.aggregator.address
                )
            })
    }
}

/// Seconds as a [`Duration`]; the configuration was validated, so this cannot fail there.
pub fn seconds(v: f64) -> Duration {
    Duration::try_from_secs_f64(v).unwrap_or(Duration::ZERO)
}

fn line_of(text: &str, offset: usize) -> usize {
    let offset = offset.min(text.len());
    text.as_bytes()[..offset]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The section a byte offset lies in (the last `[header]` above it).
fn section_at(text: &str, offset: usize) -> Option<String> {
    let offset = offset.min(text.len());
    text[..offset].lines().rev().find_map(|l| {
        let l = l.trim();
        (l.starts_with('[') && l.ends_with(']') && !l.starts_with("[["))
            .then(|| l.trim_matches(['[', ']']).trim().to_string())
    })
}

/// The dotted key whose line holds byte `offset`; `None` when that line is not `key = value`.
fn key_at(text: &str, offset: usize) -> Option<String> {
    let offset = offset.min(text.len());
    let start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line = text[start..].lines().next().unwrap_or("");
    let (key, _) = line.split_once('=')?;
    let key = key.trim().trim_matches('"');
    if key.is_empty() || key.starts_with('#') || key.starts_with('[') {
        return None;
    }
    Some(match section_at(text, start) {
        Some(section) => format!("{section}.{key}"),
        None => key.to_string(),
    })
}

/// The line of dotted key `key` (`section.key`) in `text`; 0 when absent.
fn find_key_line(text: &str, key: &str) -> usize {
    let (want_section, want_key) = match key.rsplit_once('.') {
        Some((s, k)) => (Some(s), k),
        None => (None, key),
    };
    let mut section: Option<String> = None;
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.starts_with('[') && l.ends_with(']') {
            section = Some(l.trim_matches(['[', ']']).trim().to_string());
            continue;
        }
        if let Some((k, _)) = l.split_once('=')
            && k.trim().trim_matches('"') == want_key
            && section.as_deref() == want_section
        {
            return i + 1;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn parse(text: &str) -> Result<AgentConfig, ConfigError> {
        AgentConfig::parse(text, Path::new("agent.toml"))
    }

    #[test]
    fn the_default_file_is_the_default() {
        assert_eq!(parse(DEFAULT_FILE).unwrap(), AgentConfig::default());
        assert_eq!(parse("").unwrap(), AgentConfig::default());
    }

    #[test]
    fn unknown_key_is_named_with_its_line() {
        let e = parse("enabled = true\n\n[capture]\nbudget_percnt = 0.1\n").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("agent.toml:4:"), "{msg}");
        assert!(msg.contains("capture.budget_percnt"), "{msg}");
    }

    #[test]
    fn wrong_type_is_named_with_its_line() {
        let e = parse("[seal]\nsamples = 100\nmax_age_seconds = \"an hour\"\n").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("agent.toml:3:"), "{msg}");
        assert!(msg.contains("seal.max_age_seconds"), "{msg}");
    }

    #[test]
    fn out_of_range_is_named_with_its_line() {
        let e = parse("[classes]\n# a comment\ntau = 1.5\n").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("agent.toml:3:"), "{msg}");
        assert!(msg.contains("classes.tau"), "{msg}");
        let e = parse("[seal]\nsamples = 20000\n").unwrap_err();
        assert!(
            e.to_string().contains("agent.toml:2: key `seal.samples`"),
            "{e}"
        );
        let e = parse("[seal]\nmax_reports_per_counter_per_day = 25\n").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("agent.toml:2: key `seal.max_reports_per_counter_per_day`"),
            "{msg}"
        );
        assert!(msg.contains("1..=24"), "{msg}");
        assert!(parse("[seal]\nmax_reports_per_counter_per_day = 0\n").is_err());
        assert_eq!(
            parse("[seal]\nmax_reports_per_counter_per_day = 6\n")
                .unwrap()
                .seal
                .max_reports_per_counter_per_day,
            6
        );
        let e = parse("[capture]\nsource = \"bpf\"\n").unwrap_err();
        assert!(
            e.to_string().contains("agent.toml:2: key `capture.source`"),
            "{e}"
        );
    }

    #[test]
    fn broken_syntax_names_the_line() {
        let e = parse("enabled = true\n[capture\n").unwrap_err();
        assert!(e.to_string().contains("agent.toml:2:"), "{e}");
    }
}
