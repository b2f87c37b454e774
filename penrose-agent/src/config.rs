//! The agent's configuration file (TOML, default `/etc/penrose/agent.toml`).
//!
//! Every key has a default, and [`DEFAULT_FILE`] is the commented default file
//! `penrose-agent config --print-default` prints (the package's conffile); a test checks that
//! it parses to exactly [`AgentConfig::default`] but for the route. The route is Tor by default,
//! and the Tor network has no default in the code: the file names the public network, so an
//! empty file is refused until it names a network or chooses `route = "direct"` (which shows
//! this host's address to the aggregation server, and says so in `status`, `config --check` and
//! the log). No default of the code therefore reaches the public Tor network, and none shows
//! the host's address. Unknown keys are errors (a misspelt key would
//! otherwise silently keep its default), and every error names the key and the line, so an
//! operator who changed one value can find the mistake.
//!
//! Test equipment (the trace replay, the stand-in libcuda's counter ring) is reached only by
//! settings whose names say so, `capture.source = "test-replay"` and
//! `capture.counters = "test-standin-ring"`; the defaults are the live eBPF capture and NVML, and
//! when those cannot start the agent stops with an error (exit code 4, unavailable) instead of falling back.
//! [`AgentConfig::source_plan`] turns the capture settings into the types the sources run on,
//! once; `parse` calls it, so a file it accepts resolves.

use std::net::{SocketAddr, ToSocketAddrs};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::Duration;

use penrose_core::fingerprint::FingerprintParams;
use penrose_core::histogram::DEFAULT_SEAL_MAX_AGE;
use penrose_core::paillier::MAX_REPORT_SAMPLES;
use penrose_core::release::ReportsPerContributor;
use penrose_core::sampling::{DEFAULT_SAMPLE_PERIOD, SamplePeriod};
use serde::Deserialize;
use thiserror::Error;

mod seconds;

pub use seconds::{Seconds, SecondsOrZero};

use crate::capture::CaptureConfig;
use crate::capture::locate::LibrarySources;
use crate::capture::schedule::{BudgetConfig, OverheadBudget};
use crate::counters::SourceKind;
use crate::source::ReplayConfig;
use crate::test_equipment;

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
    /// The trace-replay source (test equipment, `capture.source = "test-replay"`).
    pub replay: ReplaySection,
    /// Local applications.
    pub classes: ClassesSection,
    /// When histograms are sealed.
    pub seal: SealSection,
    /// The spool's bound.
    pub spool: SpoolSection,
    /// Upload timing and retries.
    pub upload: UploadSection,
    /// Anonymous admission tokens (the issuer, this host's credential).
    pub admission: AdmissionSection,
    /// Contributor evidence tokens: a second token per report, from the release auditor's
    /// party (its issuer, this host's credential there), which only the auditor verifies.
    /// Keys not given take `[evidence]`'s own defaults, never `[admission]`'s.
    #[serde(deserialize_with = "evidence_section")]
    pub evidence: AdmissionSection,
    /// How reports and token requests reach the servers: direct, or over Tor.
    pub transport: TransportSection,
}

/// How the agent's QUIC connections reach the servers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RouteChoice {
    /// QUIC over UDP from this host's address: the servers see which address sent each
    /// report (docs/threat-model.md). Only when chosen in so many words.
    Direct,
    /// QUIC over Tor (arti), each connection on a Tor stream and circuit of its own: the
    /// servers see only exit relays. The default.
    #[default]
    Tor,
}

/// What `status`, `config --check` and the log say of the direct route, so that an operator
/// who chose it cannot miss what it gives away.
pub const DIRECT_ROUTE_WARNING: &str = "transport.route = \"direct\": the aggregation server \
    sees this host's address beside each report's application class; the Tor route (the \
    default) hides it";

impl RouteChoice {
    /// The warning this route calls for, if any.
    pub fn warning(self) -> Option<&'static str> {
        match self {
            RouteChoice::Direct => Some(DIRECT_ROUTE_WARNING),
            RouteChoice::Tor => None,
        }
    }
}

/// `[transport]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TransportSection {
    /// `direct` or `tor`.
    pub route: RouteChoice,
    /// (`tor`) `public`, or the path of an arti configuration file that replaces arti's
    /// directory authorities and fallback relays. No default: the public Tor network is used
    /// only where a configuration names it.
    pub tor_network: String,
    /// (`tor`) The aggregation server's stream port, `host:port` as the exit reaches it (a host
    /// name is resolved by the exit, never by this host).
    pub aggregator_stream: String,
    /// (`tor`, with admission) The issuer's stream port, `host:port`.
    pub issuer_stream: String,
    /// (`tor`, with evidence) The evidence issuer's stream port, `host:port`.
    pub evidence_issuer_stream: String,
    /// (`tor`) Longest wait for a Tor stream and the QUIC handshake on it (circuits take
    /// seconds on the public network); replaces `upload.connect_timeout_seconds`.
    pub tor_connect_timeout_seconds: Seconds,
}

impl Default for TransportSection {
    fn default() -> Self {
        Self {
            route: RouteChoice::Tor,
            tor_network: String::new(),
            aggregator_stream: String::new(),
            issuer_stream: String::new(),
            evidence_issuer_stream: String::new(),
            tor_connect_timeout_seconds: Seconds::secs(60.0),
        }
    }
}

impl TransportSection {
    /// The Tor network, when the route is Tor.
    pub fn tor_network(&self) -> Result<Option<penrose_tor::TorNetwork>, String> {
        match self.route {
            RouteChoice::Direct => Ok(None),
            RouteChoice::Tor if self.tor_network.trim().is_empty() => Err(
                "is empty: the Tor route (the default) needs its network, \"public\" for the \
                 Tor network or the path of an arti network file; or choose route = \"direct\", \
                 with which the aggregation server sees this host's address"
                    .into(),
            ),
            RouteChoice::Tor => self
                .tor_network
                .parse()
                .map(Some)
                .map_err(|e: penrose_tor::TorError| e.to_string()),
        }
    }
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

/// `[admission]`: where the agent gets its anonymous admission tokens (issue 11). Not
/// configured (an empty address, the default), reports go without tokens.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionSection {
    /// `host:port` of the token issuer's QUIC endpoint (UDP); empty: admission not configured.
    pub address: String,
    /// The name its certificate carries.
    pub server_name: String,
    /// Its certificate (PEM or DER), pinned: no other is accepted.
    pub certificate: PathBuf,
    /// This host's enrolment credential file (`penrose-issuer-credential 1`), readable by the
    /// agent's user alone.
    pub credential: PathBuf,
    /// Tokens are fetched at a random time at most this long after the previous fetch.
    pub refresh_max_seconds: Seconds,
    /// Shortest wait before fetching again after a failure, and the bound on the start-up
    /// fetch when the store holds no token of today (never a fetch because tokens ran out).
    pub retry_min_seconds: Seconds,
}

impl AdmissionSection {
    /// `[evidence]`'s defaults: not configured, and the auditor party's own file names.
    pub fn evidence_default() -> Self {
        Self {
            server_name: "evidence-issuer.penrose".into(),
            certificate: PathBuf::from("/etc/penrose/evidence-issuer.pem"),
            credential: PathBuf::from("/etc/penrose/agent-evidence.credential"),
            ..Self::default()
        }
    }

    /// Whether an issuer is configured.
    pub fn is_configured(&self) -> bool {
        !self.address.trim().is_empty()
    }

    /// The issuer's address, resolved (once, at start).
    pub fn addr(&self) -> Result<SocketAddr, String> {
        self.address
            .to_socket_addrs()
            .map_err(|e| format!("admission.address {:?}: {e}", self.address))?
            .next()
            .ok_or_else(|| format!("admission.address {:?} resolves to nothing", self.address))
    }
}

/// `[design]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DesignConfig {
    /// The design server's public key file (`penrose-design keygen` writes it): the key
    /// until a key list is held.
    pub public_key: PathBuf,
    /// The design server's list-signing public key (`penrose-design key-list-signer`
    /// writes it): with it, the agent fetches the signed key list from the aggregation server
    /// and follows its key rollovers (`crate::design_keys`). Unset: the public key is used
    /// for good.
    pub key_list_signer: Option<PathBuf>,
}

/// Which snippet source feeds the pipeline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceChoice {
    /// eBPF probes on libcuda (needs root, or the capabilities `capture` names): the product's
    /// source and the default. When it cannot start, the agent stops with an error.
    #[default]
    Ebpf,
    /// TEST EQUIPMENT: replay the traces in `[replay] traces` as if captured (tests and the
    /// demo only; logged with a warning at start).
    TestReplay,
}

impl SourceChoice {
    /// The spelling in the configuration file.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ebpf => "ebpf",
            Self::TestReplay => "test-replay",
        }
    }

    /// Whether this is test equipment (never a default, never a fallback).
    pub fn is_test_equipment(self) -> bool {
        matches!(self, Self::TestReplay)
    }
}

/// Where snippets (and their counter values) come from: the capture settings resolved into the
/// types the sources run on, by [`AgentConfig::source_plan`].
#[derive(Clone, Debug)]
pub enum SourcePlan {
    /// eBPF probes on libcuda, windows spaced by the overhead budget.
    Ebpf {
        /// The capture's settings (libraries, L, S, O, counters, trust).
        capture: CaptureConfig,
        /// The budget scheduler's settings.
        budget: BudgetConfig,
    },
    /// TEST EQUIPMENT: profiler traces replayed as if captured.
    TestReplay {
        /// The folder of traces.
        traces: PathBuf,
        /// How the replay runs.
        replay: ReplayConfig,
    },
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
    pub max_window_seconds: Seconds,
    /// Shortest gap between windows.
    pub min_gap_seconds: SecondsOrZero,
    /// Longest gap between windows.
    pub max_gap_seconds: Seconds,
    /// S: one launch in S sampled.
    pub sample_period: u32,
    /// O: a schedule that runs across windows (the trace replay's) is re-seeded this often;
    /// the capture starts a block of S at every window it opens, which makes this moot there.
    pub reoffset_seconds: Seconds,
    /// How long each counter group stays active.
    pub group_seconds: Seconds,
    /// Counter source.
    pub counters: SourceKind,
    /// libcuda files to probe besides those found.
    pub libraries: Vec<PathBuf>,
    /// Also look through `ldconfig -p` and running processes' maps.
    pub scan_system: bool,
    /// Also probe driver and runtime libraries that are not root's: files not owned by root,
    /// writable by group or others, or in a directory (at any level) that is. Off by default:
    /// the agent runs as root and parses what it probes.
    pub allow_untrusted_libs: bool,
    /// Most distinct library files probed; further ones are counted, not probed.
    pub max_libraries: usize,
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
    pub window_seconds: SecondsOrZero,
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
    pub max_age_seconds: Seconds,
    /// T: the most reports sealed per (counter, day) across all local applications, 1 to
    /// [`ReportsPerContributor::DEFAULT`] (servers count contributors with the default).
    pub max_reports_per_counter_per_day: u32,
    /// TEST EQUIPMENT: also write each joint view's raw (x, y) values into the sealed record
    /// (tests compare the decrypted grid with them). Warned about when on.
    pub test_record_joint_values: bool,
}

/// `[spool]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpoolSection {
    /// Bytes the spool may hold; the oldest reports are dropped beyond it.
    pub max_bytes: u64,
    /// Bytes `rejected/` may hold (refused reports and their notes); oldest removed first.
    pub rejected_max_bytes: u64,
    /// Refused reports are removed from `rejected/` after this many days.
    pub rejected_max_age_days: u32,
    /// Bytes the sealed record (`sealed.jsonl`) may hold before its oldest records are pruned.
    pub record_max_bytes: u64,
    /// Sealed records whose day is older than this many days are pruned.
    pub record_max_age_days: u32,
}

impl SpoolSection {
    /// The bounds of `rejected/`.
    pub fn rejected_bounds(&self) -> crate::spool::RejectedBounds {
        crate::spool::RejectedBounds {
            max_bytes: self.rejected_max_bytes,
            max_age_days: self.rejected_max_age_days,
        }
    }

    /// The bounds of the sealed record.
    pub fn record_bounds(&self) -> crate::record::RecordBounds {
        crate::record::RecordBounds {
            max_bytes: self.record_max_bytes,
            max_age_days: self.record_max_age_days,
        }
    }
}

/// `[upload]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UploadSection {
    /// Each upload waits a uniformly random time up to this first.
    pub delay_max_seconds: SecondsOrZero,
    /// Attempts per upload (the transport's retries, first attempt included).
    pub attempts: u32,
    /// First retry's wait.
    pub backoff_base_seconds: Seconds,
    /// Longest wait between retries, and between rounds while the server is down.
    pub backoff_max_seconds: Seconds,
    /// Connect timeout.
    pub connect_timeout_seconds: Seconds,
    /// Ack timeout.
    pub ack_timeout_seconds: Seconds,
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
            admission: AdmissionSection::default(),
            evidence: AdmissionSection::evidence_default(),
            transport: TransportSection::default(),
        }
    }
}

impl Default for AdmissionSection {
    fn default() -> Self {
        Self {
            address: String::new(),
            server_name: "issuer.penrose".into(),
            certificate: PathBuf::from("/etc/penrose/issuer.pem"),
            credential: PathBuf::from("/etc/penrose/agent.credential"),
            refresh_max_seconds: Seconds::secs(43_200.0),
            retry_min_seconds: Seconds::secs(600.0),
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
            key_list_signer: None,
        }
    }
}

impl Default for CaptureSection {
    fn default() -> Self {
        Self {
            source: SourceChoice::Ebpf,
            window_launches: crate::capture::window::DEFAULT_WINDOW_LAUNCHES,
            budget_percent: 0.02,
            max_window_seconds: Seconds::secs(10.0),
            min_gap_seconds: SecondsOrZero::secs(60.0),
            max_gap_seconds: Seconds::secs(21_600.0),
            sample_period: DEFAULT_SAMPLE_PERIOD.get(),
            reoffset_seconds: Seconds::secs(600.0),
            group_seconds: Seconds::secs(600.0),
            counters: SourceKind::Nvml,
            libraries: Vec::new(),
            scan_system: true,
            allow_untrusted_libs: false,
            max_libraries: crate::capture::locate::DEFAULT_MAX_LIBRARIES,
            calibrate: true,
        }
    }
}

impl Default for ReplaySection {
    fn default() -> Self {
        Self {
            traces: PathBuf::from("/usr/share/penrose/traces"),
            window_seconds: SecondsOrZero::secs(60.0),
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
            max_age_seconds: Seconds(DEFAULT_SEAL_MAX_AGE),
            max_reports_per_counter_per_day: ReportsPerContributor::DEFAULT.get(),
            test_record_joint_values: false,
        }
    }
}

impl Default for SpoolSection {
    fn default() -> Self {
        Self {
            max_bytes: 64 * 1024 * 1024,
            rejected_max_bytes: 16 * 1024 * 1024,
            rejected_max_age_days: 30,
            record_max_bytes: 32 * 1024 * 1024,
            record_max_age_days: 30,
        }
    }
}

impl Default for UploadSection {
    fn default() -> Self {
        Self {
            delay_max_seconds: SecondsOrZero::secs(60.0),
            attempts: 8,
            backoff_base_seconds: Seconds::secs(0.2),
            backoff_max_seconds: Seconds::secs(300.0),
            connect_timeout_seconds: Seconds::secs(5.0),
            ack_timeout_seconds: Seconds::secs(10.0),
        }
    }
}

/// The commented default file. A unit test checks it parses to [`AgentConfig::default`].
pub const DEFAULT_FILE: &str = r#"# Penrose agent configuration (/etc/penrose/agent.toml).
# Every key is optional; the values below are the defaults, but for [transport], where the file
# names the public Tor network and the code names none (an empty file must choose a route).

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
# To follow the design server's key rollovers, pin its list-signing key
# (`penrose-design key-list-signer` writes list-signing.pub): the agent then asks the
# aggregation server for the signed key list at start and every 6 hours, and encrypts each
# day's reports under the key the list gives that day. A list that does not verify is refused.
# key_list_signer = "/etc/penrose/design-list-signing.pub"

[capture]
# Where snippets come from: "ebpf", the probes on libcuda. If they cannot be loaded (not root,
# no BTF, ...) the agent exits with code 3; it never falls back to anything else.
# ("test-replay" replays profiler traces as if captured: test equipment, for tests and the
# demo only, in builds with the test-util feature; a packaged agent refuses it.)
source = "ebpf"
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
sample_period = 1000
# O: the trace replay's sampling schedule is re-seeded this often (the capture starts a block
# of S launches, with its sampled position drawn afresh, at every window it opens).
reoffset_seconds = 600.0
# Counter groups take turns of this length.
group_seconds = 600.0
# Counter source: "nvml" (GPM metrics of the GPU each sampled launch ran on; if NVML or GPM
# is unavailable the agent exits with code 3) or "none" (no counter values). ("test-standin-ring" reads the stand-in
# libcuda's ring: test equipment, for tests and the demo only.)
counters = "nvml"
# libcuda files to probe besides those ldconfig and running processes show.
libraries = []
# Look through `ldconfig -p` and /proc/*/maps for libcuda and libcudart.
scan_system = true
# Probe only libraries owned by root, not writable by group or others, in directories (up to /)
# that are root's and not writable by group or others. true also probes the others (the agent
# parses every library it probes, as root).
allow_untrusted_libs = false
# Most distinct library files probed; further ones are counted (`capture` output, status).
max_libraries = 64
# Measure the probe cost at start (else assume 10 us per launch).
calibrate = true

[replay]
# Test equipment: the trace-replay source (capture.source = "test-replay" only), a folder of
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
max_age_seconds = 300.0
# At most this many reports per counter and day, all local applications together (1 to 24;
# servers count one contributor per 24). A histogram due beyond it is held until the next
# day; once full, its counter's further samples are dropped and counted (`status`); at stop,
# what is held beyond it is discarded.
max_reports_per_counter_per_day = 24
# Test equipment: also write the raw values behind each joint view's cells into the sealed
# record (sealed.jsonl, never sent), for tests that check the decrypted grids against them.
test_record_joint_values = false

[spool]
# Bytes of encrypted reports kept while the server is unreachable; the oldest are dropped
# first, with a counted warning.
max_bytes = 67108864
# Reports the server refused are kept in rejected/ with a note of why, up to these bounds
# (oldest removed first, counted in status).
rejected_max_bytes = 16777216
rejected_max_age_days = 30
# The plaintext record of what was sealed (sealed.jsonl, never sent) is pruned to these
# bounds, oldest first; today's and yesterday's records are always kept (the report cap).
record_max_bytes = 33554432
record_max_age_days = 30

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

[admission]
# Anonymous admission tokens. With an issuer address, the agent fetches tokens with this host's
# enrolment credential and spends one on each report, so that the aggregation server admits
# reports of enrolled hosts only, at most the issuer's quota per counter and day, without
# learning which host sent which report. Empty (the default): reports carry no token, and a
# server that requires them answers TokenRequired; the reports then stay spooled.
address = ""
# The name in the issuer's certificate.
server_name = "issuer.penrose"
# The issuer's certificate (PEM or DER). Pinned: the agent accepts no other.
certificate = "/etc/penrose/issuer.pem"
# This host's enrolment credential, installed with the package: owned by root, mode 0600 (a file
# group or others may access, or a symbolic link, is refused).
credential = "/etc/penrose/agent.credential"
# Tokens for today and tomorrow, every counter, the issuer's whole quota, are fetched at a
# random time at most this long after the previous fetch, and at once when none is held for
# today; each fetch on connections of its own, never an upload's.
refresh_max_seconds = 43200.0
# Shortest wait before fetching again after a failed fetch, or once today's tokens ran out.
retry_min_seconds = 600.0

[evidence]
# Contributor evidence tokens, from the release auditor's party (its own issuer, where this host
# is enrolled with a credential of its own). With an address, the agent spends one on each
# report besides the admission token; only the auditor can verify it, so it counts a released
# sum's contributors itself instead of trusting the aggregation server's count. Empty (the
# default): reports carry none. Same keys and timing as [admission].
address = ""
server_name = "evidence-issuer.penrose"
certificate = "/etc/penrose/evidence-issuer.pem"
credential = "/etc/penrose/agent-evidence.credential"
refresh_max_seconds = 43200.0
retry_min_seconds = 600.0

[transport]
# How reports and token requests leave this host. "tor" (the default): QUIC over Tor (arti),
# every connection (each upload attempt, each token fetch) on a Tor circuit of its own, so the
# servers see only Tor exit relays. "direct": QUIC over UDP from this host's address, so the
# aggregation server sees which address sent each report, beside its application class;
# `status`, `config --check` and the log then say so.
route = "tor"
# (route = "tor") Which Tor network: "public" for the Tor network, or the path of an arti
# configuration file that replaces arti's directory authorities and fallback relays (a private
# network). The code has no default: the public network is used only where it is named here.
tor_network = "public"
# (route = "tor") The aggregation server's stream port (its `serve --stream-listen`), host:port
# as the exit reaches it; a host name is resolved by the exit, never by this host.
aggregator_stream = "aggregator.penrose:9443"
# (route = "tor", with [admission]) The issuer's stream port, host:port.
issuer_stream = ""
# (route = "tor", with [evidence]) The evidence issuer's stream port, host:port.
evidence_issuer_stream = ""
# (route = "tor") Longest wait for a Tor stream and the QUIC handshake on it.
tor_connect_timeout_seconds = 60.0
"#;

/// `[evidence]` as written: the keys given, each over [`AdmissionSection::evidence_default`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IssuerKeysGiven {
    address: Option<String>,
    server_name: Option<String>,
    certificate: Option<PathBuf>,
    credential: Option<PathBuf>,
    refresh_max_seconds: Option<Seconds>,
    retry_min_seconds: Option<Seconds>,
}

fn evidence_section<'de, D: serde::Deserializer<'de>>(d: D) -> Result<AdmissionSection, D::Error> {
    let given = IssuerKeysGiven::deserialize(d)?;
    let base = AdmissionSection::evidence_default();
    Ok(AdmissionSection {
        address: given.address.unwrap_or(base.address),
        server_name: given.server_name.unwrap_or(base.server_name),
        certificate: given.certificate.unwrap_or(base.certificate),
        credential: given.credential.unwrap_or(base.credential),
        refresh_max_seconds: given
            .refresh_max_seconds
            .unwrap_or(base.refresh_max_seconds),
        retry_min_seconds: given.retry_min_seconds.unwrap_or(base.retry_min_seconds),
    })
}

/// The configuration keys of one issuer section, for its error messages.
struct IssuerKeys {
    refresh_max: &'static str,
    retry_min: &'static str,
    server_name: &'static str,
    certificate: &'static str,
    credential: &'static str,
}

const ADMISSION_KEYS: IssuerKeys = IssuerKeys {
    refresh_max: "admission.refresh_max_seconds",
    retry_min: "admission.retry_min_seconds",
    server_name: "admission.server_name",
    certificate: "admission.certificate",
    credential: "admission.credential",
};

const EVIDENCE_KEYS: IssuerKeys = IssuerKeys {
    refresh_max: "evidence.refresh_max_seconds",
    retry_min: "evidence.retry_min_seconds",
    server_name: "evidence.server_name",
    certificate: "evidence.certificate",
    credential: "evidence.credential",
};

/// The checks of `[admission]` and `[evidence]`: timings, and, with an address, a server name,
/// a certificate and a credential.
fn check_issuer(i: &AdmissionSection, keys: &IssuerKeys) -> Result<(), (&'static str, String)> {
    if i.retry_min_seconds > i.refresh_max_seconds {
        return Err((
            keys.retry_min,
            format!("must not exceed {}", keys.refresh_max),
        ));
    }
    if !i.is_configured() {
        return Ok(());
    }
    if i.server_name.trim().is_empty() {
        return Err((
            keys.server_name,
            "is empty (the name in the issuer's certificate)".into(),
        ));
    }
    for (key, path) in [
        (keys.certificate, &i.certificate),
        (keys.credential, &i.credential),
    ] {
        if path.as_os_str().is_empty() {
            return Err((key, "is empty while its issuer's address is set".into()));
        }
    }
    Ok(())
}

/// `[capture]`'s ranges serde cannot express.
fn check_capture(c: &CaptureSection) -> Result<(), (&'static str, String)> {
    if c.window_launches == 0 {
        return Err(("capture.window_launches", "must be at least 1".into()));
    }
    if c.min_gap_seconds.get() > c.max_gap_seconds.get() {
        return Err((
            "capture.min_gap_seconds",
            "must not exceed capture.max_gap_seconds".into(),
        ));
    }
    if c.max_libraries == 0 {
        return Err(("capture.max_libraries", "must be at least 1".into()));
    }
    Ok(())
}

/// `[classes]`: tau a similarity, at least one local application.
fn check_classes(c: &ClassesSection) -> Result<(), (&'static str, String)> {
    if !(0.0..=1.0).contains(&c.tau) {
        return Err((
            "classes.tau",
            format!("{} is not a similarity in [0, 1]", c.tau),
        ));
    }
    if c.max_local_apps == 0 {
        return Err(("classes.max_local_apps", "must be at least 1".into()));
    }
    Ok(())
}

/// `[seal]`: what one report may hold, and T within the agent's range.
fn check_seal(s: &SealSection) -> Result<(), (&'static str, String)> {
    if s.samples == 0 || u64::from(s.samples) > MAX_REPORT_SAMPLES {
        return Err((
            "seal.samples",
            format!(
                "{} must be between 1 and {MAX_REPORT_SAMPLES} (what one report may hold)",
                s.samples
            ),
        ));
    }
    ReportsPerContributor::for_agent(s.max_reports_per_counter_per_day)
        .map_err(|e| ("seal.max_reports_per_counter_per_day", e.to_string()))?;
    Ok(())
}

/// `[spool]`: room for a report, a few refused ones, and yesterday's records.
fn check_spool(s: &SpoolSection) -> Result<(), (&'static str, String)> {
    if s.max_bytes < 4096 {
        return Err((
            "spool.max_bytes",
            format!("{} is below one report (4096)", s.max_bytes),
        ));
    }
    for (key, value) in [
        ("spool.rejected_max_bytes", s.rejected_max_bytes),
        ("spool.record_max_bytes", s.record_max_bytes),
    ] {
        if value < 65_536 {
            return Err((key, format!("{value} is below 65536 (a few reports)")));
        }
    }
    for (key, value) in [
        ("spool.rejected_max_age_days", s.rejected_max_age_days),
        ("spool.record_max_age_days", s.record_max_age_days),
    ] {
        if value < 2 {
            return Err((
                key,
                format!("{value} is below 2 (the report cap counts yesterday's records)"),
            ));
        }
    }
    Ok(())
}

/// The evidence issuer is another party than the admission issuer: its own certificate and
/// its own credential for this host.
fn check_issuers_apart(
    admission: &AdmissionSection,
    evidence: &AdmissionSection,
) -> Result<(), (&'static str, String)> {
    if !(evidence.is_configured() && admission.is_configured()) {
        return Ok(());
    }
    for (key, mine, theirs) in [
        (
            "evidence.credential",
            &evidence.credential,
            &admission.credential,
        ),
        (
            "evidence.certificate",
            &evidence.certificate,
            &admission.certificate,
        ),
    ] {
        if mine == theirs {
            return Err((
                key,
                "is the admission issuer's: the evidence issuer is the release auditor's \
                 party, with its own certificate and its own credential for this host"
                    .into(),
            ));
        }
    }
    Ok(())
}

/// Over Tor: a usable network, and a `host:port` for each stream the agent opens.
fn check_route(
    t: &TransportSection,
    admission: &AdmissionSection,
    evidence: &AdmissionSection,
) -> Result<(), (&'static str, String)> {
    if t.route != RouteChoice::Tor {
        return Ok(());
    }
    t.tor_network().map_err(|e| ("transport.tor_network", e))?;
    let mut streams = vec![("transport.aggregator_stream", &t.aggregator_stream)];
    if admission.is_configured() {
        streams.push(("transport.issuer_stream", &t.issuer_stream));
    }
    if evidence.is_configured() {
        streams.push((
            "transport.evidence_issuer_stream",
            &t.evidence_issuer_stream,
        ));
    }
    for (key, value) in streams {
        stream_target(value).map_err(|e| (key, e))?;
    }
    Ok(())
}

/// Checks a `host:port` the exit is to connect to, without resolving it.
fn stream_target(value: &str) -> Result<(), String> {
    let (host, port) = value
        .trim()
        .rsplit_once(':')
        .ok_or_else(|| format!("{value:?} is not host:port"))?;
    if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(format!("{value:?} is not host:port"));
    }
    Ok(())
}

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
        check_capture(&self.capture)?;
        check_classes(&self.classes)?;
        check_seal(&self.seal)?;
        check_spool(&self.spool)?;
        if self.upload.attempts == 0 {
            return Err(("upload.attempts", "must be at least 1".into()));
        }
        if self.aggregator.address.trim().is_empty() {
            return Err(("aggregator.address", "is empty".into()));
        }
        check_issuer(&self.admission, &ADMISSION_KEYS)?;
        check_issuer(&self.evidence, &EVIDENCE_KEYS)?;
        check_issuers_apart(&self.admission, &self.evidence)?;
        check_route(&self.transport, &self.admission, &self.evidence)?;
        self.source_plan().map(|_| ())
    }

    /// The capture settings as the types the sources run on. The one place they are checked
    /// beyond their ranges: S at least 1, the budget a share in (0, 100] percent, and counters
    /// that fit the source (the test replay samples the traces' own values, so it takes
    /// `test-standin-ring` or `none`, never `nvml`). `Err((key, why))`.
    pub fn source_plan(&self) -> Result<SourcePlan, (&'static str, String)> {
        let c = &self.capture;
        let sample_period = NonZeroU32::new(c.sample_period)
            .map(SamplePeriod)
            .ok_or(("capture.sample_period", "must be at least 1".to_string()))?;
        let budget = OverheadBudget::new(c.budget_percent / 100.0)
            .filter(|_| c.budget_percent.is_finite())
            .ok_or((
                "capture.budget_percent",
                format!("{} must be above 0 and at most 100", c.budget_percent),
            ))?;
        refuse_unbuilt_test_equipment(c)?;
        Ok(match c.source {
            SourceChoice::Ebpf => SourcePlan::Ebpf {
                capture: CaptureConfig {
                    sources: LibrarySources {
                        explicit: c.libraries.clone(),
                        ldconfig: c.scan_system,
                        proc_maps: c.scan_system,
                        allow_untrusted: c.allow_untrusted_libs,
                    },
                    max_libraries: c.max_libraries,
                    window_launches: c.window_launches,
                    poll_interval: Duration::from_millis(1),
                    sample_period,
                    group_period: c.group_seconds.get(),
                    counters: c.counters,
                    calibrate: c.calibrate,
                    seed: None,
                },
                budget: BudgetConfig {
                    budget,
                    max_window: c.max_window_seconds.get(),
                    min_gap: c.min_gap_seconds.get(),
                    max_gap: c.max_gap_seconds.get(),
                },
            },
            SourceChoice::TestReplay => {
                let sample_counters = match c.counters {
                    SourceKind::TestStandinRing => true,
                    SourceKind::None => false,
                    SourceKind::Nvml => {
                        return Err((
                            "capture.counters",
                            "\"nvml\" reads a GPU, but capture.source = \"test-replay\" samples the \
                             traces' own values: set \"test-standin-ring\" (or \"none\")"
                                .into(),
                        ));
                    }
                };
                SourcePlan::TestReplay {
                    traces: self.replay.traces.clone(),
                    replay: ReplayConfig {
                        window_launches: c.window_launches,
                        sample_period,
                        reoffset_every: c.reoffset_seconds.get(),
                        group_period: c.group_seconds.get(),
                        window_every: self.replay.window_seconds.get(),
                        windows: (self.replay.windows > 0).then_some(self.replay.windows),
                        sample_counters,
                        seed: None,
                    },
                }
            }
        })
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

/// Refuses, in a build without the test equipment, a capture section that names it: the
/// product has no path to the trace replay or the stand-in ring, not even a misconfigured one.
fn refuse_unbuilt_test_equipment(c: &CaptureSection) -> Result<(), (&'static str, String)> {
    if test_equipment::BUILT {
        return Ok(());
    }
    if c.source.is_test_equipment() {
        let setting = format!("capture.source = {:?}", c.source.name());
        return Err(("capture.source", test_equipment::not_built(&setting)));
    }
    if c.counters.is_test_equipment() {
        let setting = format!("capture.counters = {:?}", c.counters.name());
        return Err(("capture.counters", test_equipment::not_built(&setting)));
    }
    Ok(())
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

    /// `text` as written.
    fn parse_exact(text: &str) -> Result<AgentConfig, ConfigError> {
        AgentConfig::parse(text, Path::new("agent.toml"))
    }

    /// `text`, with the direct route chosen at its end where it chooses none (the tests about
    /// other keys; line numbers stay those of `text`).
    fn parse(text: &str) -> Result<AgentConfig, ConfigError> {
        match text.contains("[transport]") {
            true => parse_exact(text),
            false => parse_exact(&format!("{text}\n[transport]\nroute = \"direct\"\n")),
        }
    }

    /// The code's defaults with the direct route (what [`parse`] adds).
    fn direct_default() -> AgentConfig {
        let mut config = AgentConfig::default();
        config.transport.route = RouteChoice::Direct;
        config
    }

    #[test]
    fn the_default_file_is_the_default_but_names_the_public_tor_network() {
        let file = parse_exact(DEFAULT_FILE).unwrap();
        let mut expected = AgentConfig::default();
        expected.transport.tor_network = "public".into();
        expected.transport.aggregator_stream = "aggregator.penrose:9443".into();
        assert_eq!(file, expected);
        assert_eq!(file.transport.route, RouteChoice::Tor);
        assert_eq!(parse("").unwrap(), direct_default());
    }

    #[test]
    fn tor_is_the_default_route_and_direct_must_be_chosen() {
        assert_eq!(AgentConfig::default().transport.route, RouteChoice::Tor);
        assert_eq!(RouteChoice::default(), RouteChoice::Tor);
        // An empty file names no Tor network, and the code names none: refused, with both
        // ways out named, rather than reaching the public network or showing the address.
        let e = parse_exact("").unwrap_err().to_string();
        assert!(e.contains("transport.tor_network"), "{e}");
        assert!(e.contains("route = \"direct\""), "{e}");
        let direct = parse_exact("[transport]\nroute = \"direct\"\n").unwrap();
        assert_eq!(direct.transport.route.warning(), Some(DIRECT_ROUTE_WARNING));
        assert_eq!(RouteChoice::Tor.warning(), None);
        assert!(DIRECT_ROUTE_WARNING.contains("sees this host's address"));
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

    /// The defaults (no file, an empty file, the commented default file) are the live capture
    /// with NVML counters and trusted libraries only: no default reaches test equipment.
    #[test]
    fn the_default_configuration_never_selects_test_equipment() {
        for config in [
            AgentConfig::default(),
            parse("").unwrap(),
            parse_exact(DEFAULT_FILE).unwrap(),
        ] {
            let c = &config.capture;
            assert_eq!(
                (c.source, c.counters),
                (SourceChoice::Ebpf, SourceKind::Nvml)
            );
            assert!(!c.source.is_test_equipment() && !c.counters.is_test_equipment());
            assert!(!c.allow_untrusted_libs);
            assert!(!config.seal.test_record_joint_values);
            match config.source_plan().unwrap() {
                SourcePlan::Ebpf { capture, .. } => {
                    assert_eq!(capture.counters, SourceKind::Nvml);
                    assert!(!capture.sources.allow_untrusted);
                    assert_eq!(capture.max_libraries, 64);
                }
                SourcePlan::TestReplay { .. } => panic!("the default replays traces"),
            }
        }
        // The library types' own defaults agree.
        assert_eq!(SourceChoice::default(), SourceChoice::Ebpf);
        assert_eq!(SourceKind::default(), SourceKind::Nvml);
        assert_eq!(CaptureConfig::default().counters, SourceKind::Nvml);
        assert!(!LibrarySources::default().allow_untrusted);
    }

    /// The spellings that used to reach test equipment by default or by fallback (`auto`) or
    /// without saying so (`replay`, `standin`) are refused, naming the key.
    #[test]
    fn the_old_fallback_spellings_are_refused() {
        for (key, old) in [
            ("source", "auto"),
            ("source", "replay"),
            ("counters", "auto"),
            ("counters", "standin"),
        ] {
            let e = parse(&format!("[capture]\n{key} = \"{old}\"\n"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("agent.toml:2: key `capture.{key}`")),
                "{e}"
            );
        }
    }

    /// Test equipment is reached only by settings whose names say "test", and then resolves to
    /// the test source; every other value is not test equipment.
    #[test]
    fn test_equipment_is_named_as_such_and_reached_only_by_naming_it() {
        for source in [SourceChoice::Ebpf, SourceChoice::TestReplay] {
            assert_eq!(
                source.is_test_equipment(),
                source.name().starts_with("test-")
            );
            let text = format!(
                "[capture]\nsource = \"{}\"\ncounters = \"none\"\n",
                source.name()
            );
            assert_eq!(parse(&text).unwrap().capture.source, source);
        }
        for &kind in <SourceKind as clap::ValueEnum>::value_variants() {
            assert_eq!(kind.is_test_equipment(), kind.name().starts_with("test-"));
            let text = format!("[capture]\ncounters = \"{}\"\n", kind.name());
            assert_eq!(parse(&text).unwrap().capture.counters, kind);
            let value = clap::ValueEnum::to_possible_value(&kind).unwrap();
            assert_eq!(value.get_name(), kind.name());
        }
        let config =
            parse("[capture]\nsource = \"test-replay\"\ncounters = \"test-standin-ring\"\n")
                .unwrap();
        match config.source_plan().unwrap() {
            SourcePlan::TestReplay { replay, .. } => assert!(replay.sample_counters),
            SourcePlan::Ebpf { .. } => panic!("test-replay resolved to the live capture"),
        }
        // The replay samples the traces' values; NVML with it is a contradiction, refused.
        let e = parse("[capture]\nsource = \"test-replay\"\n").unwrap_err();
        assert!(e.to_string().contains("key `capture.counters`"), "{e}");
    }

    #[test]
    fn library_trust_and_cap_are_configurable() {
        let config = parse("[capture]\nallow_untrusted_libs = true\nmax_libraries = 3\n").unwrap();
        match config.source_plan().unwrap() {
            SourcePlan::Ebpf { capture, .. } => {
                assert!(capture.sources.allow_untrusted);
                assert_eq!(capture.max_libraries, 3);
            }
            SourcePlan::TestReplay { .. } => panic!(),
        }
        let e = parse("[capture]\nmax_libraries = 0\n").unwrap_err();
        assert!(
            e.to_string()
                .contains("agent.toml:2: key `capture.max_libraries`"),
            "{e}"
        );
    }

    #[test]
    fn the_tor_route_needs_a_named_network_and_stream_ports() {
        let config = direct_default();
        assert_eq!(config.transport.tor_network(), Ok(None));
        assert!(AgentConfig::default().transport.tor_network().is_err());
        // Tor without a network: refused, never the public network by default.
        let e = parse("[transport]\nroute = \"tor\"\naggregator_stream = \"a.example:443\"\n")
            .unwrap_err();
        assert!(e.to_string().contains("transport.tor_network"), "{e}");
        let e = parse("[transport]\nroute = \"tor\"\ntor_network = \"public\"\n").unwrap_err();
        assert!(e.to_string().contains("transport.aggregator_stream"), "{e}");
        let e = parse(
            "[transport]\nroute = \"tor\"\ntor_network = \"public\"\naggregator_stream = \"host\"\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("is not host:port"), "{e}");
        let config = parse(
            "[transport]\nroute = \"tor\"\ntor_network = \"public\"\naggregator_stream = \"agg.example:9443\"\n",
        )
        .unwrap();
        assert_eq!(
            config.transport.tor_network(),
            Ok(Some(penrose_tor::TorNetwork::Public))
        );
        // With admission over Tor, the issuer's stream port is needed too.
        let e = parse(
            "[transport]\nroute = \"tor\"\ntor_network = \"public\"\naggregator_stream = \"a:1\"\n\
             [admission]\naddress = \"127.0.0.1:4434\"\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("transport.issuer_stream"), "{e}");
        let e = parse("[transport]\nroute = \"onion\"\n").unwrap_err();
        assert!(e.to_string().contains("transport.route"), "{e}");
    }

    #[test]
    fn evidence_is_off_by_default_and_never_shares_the_admission_issuers_files() {
        let config = AgentConfig::default();
        assert!(!config.evidence.is_configured());
        assert_ne!(config.evidence.credential, config.admission.credential);
        let both =
            "[admission]\naddress = \"127.0.0.1:4434\"\n[evidence]\naddress = \"127.0.0.1:4435\"\n";
        let config = parse(both).unwrap();
        assert_eq!(
            config.evidence.credential,
            PathBuf::from("/etc/penrose/agent-evidence.credential")
        );
        // The same credential (or certificate) for both issuers is a configuration mistake:
        // the auditor's party enrols this host with a credential of its own.
        let e = parse(&format!(
            "{both}credential = \"/etc/penrose/agent.credential\"\n"
        ))
        .unwrap_err();
        assert!(e.to_string().contains("evidence.credential"), "{e}");
        let e = parse(&format!(
            "{both}certificate = \"/etc/penrose/issuer.pem\"\n"
        ))
        .unwrap_err();
        assert!(e.to_string().contains("evidence.certificate"), "{e}");
        let e =
            parse("[evidence]\naddress = \"127.0.0.1:1\"\nretry_min_seconds = 0\n").unwrap_err();
        assert!(e.to_string().contains("evidence.retry_min_seconds"), "{e}");
        let e = parse("[evidence]\n\nadress = \"127.0.0.1:4435\"\n").unwrap_err();
        assert!(e.to_string().contains("agent.toml:3"), "{e}");
        assert!(e.to_string().contains("adress"), "{e}");
        // Over Tor, its stream port is needed too.
        let e = parse(
            "[transport]\nroute = \"tor\"\ntor_network = \"public\"\naggregator_stream = \"a:1\"\n\
             [evidence]\naddress = \"127.0.0.1:4435\"\n",
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("transport.evidence_issuer_stream"),
            "{e}"
        );
    }

    #[test]
    fn admission_is_off_by_default_and_checked_when_configured() {
        assert!(!AgentConfig::default().admission.is_configured());
        let config =
            parse("[admission]\naddress = \"127.0.0.1:4434\"\ncredential = \"/etc/penrose/c\"\n")
                .unwrap();
        assert!(config.admission.is_configured());
        assert_eq!(
            config.admission.addr().unwrap(),
            "127.0.0.1:4434".parse().unwrap()
        );
        let e = parse("[admission]\naddress = \"127.0.0.1:1\"\nserver_name = \"\"\n").unwrap_err();
        assert!(
            e.to_string()
                .contains("agent.toml:3: key `admission.server_name`"),
            "{e}"
        );
        let e = parse("[admission]\nretry_min_seconds = 0\n").unwrap_err();
        assert!(
            e.to_string().contains("key `admission.retry_min_seconds`"),
            "{e}"
        );
        let e = parse("[admission]\nissuer = \"x\"\n").unwrap_err();
        assert!(e.to_string().contains("admission.issuer"), "{e}");
    }

    #[test]
    fn broken_syntax_names_the_line() {
        let e = parse("enabled = true\n[capture\n").unwrap_err();
        assert!(e.to_string().contains("agent.toml:2:"), "{e}");
    }
}
