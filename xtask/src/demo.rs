//! `cargo xtask demo`: the whole system on this machine, as the separate processes it is.
//!
//! 1. The design server makes a key pair split with the release auditor (`penrose-design
//!    keygen --split`: no private key is written, only its share and the auditor's), a
//!    list-signing key
//!    (`key-list-signer`) and a signed key list naming its key (`key-list`); the aggregation
//!    server is given the list, and every agent pins the list-signing key and fetches the list
//!    from the aggregation server (key rollover, docs/operations.md).
//! 2. The token issuer is set up in the run's temporary directory (`penrose-issuer init`),
//!    enrols one credential per host (`enrol --count N --out-dir`), exports the key ring the
//!    aggregation server verifies tokens with (`export-keys`) and starts on loopback
//!    (`penrose-issuer serve`). A second issuer, the release auditor's party's, is set up the
//!    same way with credentials of its own; its key ring goes to the auditor alone.
//! 3. The aggregation server starts on loopback with its RocksDB under the temporary directory
//!    (`penrose-aggregator serve --token-keys RING --keep-evidence`): it admits only reports
//!    that carry an admission token of the issuer's, each spent once, and keeps each report's
//!    evidence token, which it cannot check.
//! 4. A small fleet of agents starts (`penrose-agent run`, one process, state directory and
//!    credential file at each issuer; each fetches its tokens from both issuers at start and
//!    spends one of each on every report). A sum is released only with at least k = 10 contributors behind it,
//!    counted as ceil(reports / 24) since an agent sends at most 24 reports per counter and
//!    day (and the issuer gives it at most 24 tokens per counter and day); so one agent alone
//!    can never be decrypted, and the demo runs `--agents` hosts (12) that all run one popular
//!    application (one of the real traces in `../shared/traces/`), and two more hosts that
//!    each run another application alone. As root the first agent probes a stand-in libcuda
//!    with eBPF under a `penrose-replay` process replaying the popular trace; the others (and
//!    every agent without root, since eBPF needs it) replay their trace in place of the
//!    probes. Without a trace folder a small synthetic workload is used. All of this is test
//!    equipment, and each agent's configuration names it as such (`capture.source =
//!    "test-replay"`, `capture.counters = "test-standin-ring"`, `capture.allow_untrusted_libs =
//!    true` for the stand-in copy in the run's temporary directory); a product agent's
//!    defaults reach none of it.
//! 5. Time is compressed (L, S, the seal size, the windows, the upload delay and the wait
//!    before a failed token fetch is tried again are scaled down and said so on screen) so
//!    that the run takes about half a minute.
//! 6. The aggregation server closes the day's epoch (`close-epoch`) and exports the first
//!    bundle of its chain while it serves, and writes its contributor evidence
//!    (`export-evidence`); the design server imports both (`import`, `import-evidence`). The
//!    release auditor is set up with its share (`penrose-auditor init`) and its party's token
//!    key ring (`DATA/evidence-keys`) and starts on loopback as its own process
//!    (`penrose-auditor serve`); the design server asks it for its partial decryptions
//!    (`penrose-design audit`, pinning its certificate, each page with its evidence), and the
//!    auditor counts each sum's contributors from the evidence tokens itself; the design
//!    server decrypts every released sum with at least k contributors from both partials
//!    (`report --split-key`).
//! 7. The demo checks the result: every decrypted (class, counter) histogram must equal, bin
//!    for bin, the sum of the histograms the agents sealed (read from their own records) for
//!    the reports the aggregator counted in that class; nothing under k contributors may be
//!    decrypted, and no application run by one host alone is. And every report the aggregator
//!    counted was admitted by a token: the bundle's epoch summary counts every one of them as
//!    admitted with a token, the design server's report says the contributor bound was
//!    enforced by admission tokens, the aggregator's Spent table holds one row per counted
//!    report, and no agent saw a partition attempt. And the auditor counted every released
//!    sum from evidence: every report the evidence lists carried an evidence token, the
//!    auditor counted each once, and it gave a partial for every released sum.
//!
//! `run_demo` is also what the end-to-end tests run (see the tests below); they also check
//! that the issuer's stored bytes and the aggregation server's share no value.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use indicatif::{ProgressBar, ProgressStyle};
use penrose_aggregator::config::DataDir;
use penrose_aggregator::state::{State, seen};
use penrose_aggregator::store::{RocksStore, Store, Table};
use penrose_core::counters::{BIN_COUNT, CatalogueVersion, CounterId};
use penrose_core::fingerprint::{FingerprintParams, Fingerprinter, SnippetHash};
use penrose_core::histogram::SampleCount;
use penrose_core::paillier::{ACCUMULATOR_REPORT_BOUND, PublicKey};
use penrose_core::release::{ReportsPerContributor, Threshold, releasable};
use penrose_core::wire::{
    ADMISSION_TOKEN_BYTES, AdmissionToken, Day, Message, PackedBytes, Report, ReportId,
};
use penrose_tornet::{TorNetwork, TorNetworkOptions};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use penrose_agent::capture::loader::is_root;
use penrose_agent::config::RouteChoice;
use penrose_agent::status::AgentStatus;
use xtask::servers::{ServerKey, start_server, start_server_ready};
use xtask::workspace::{TEST_EQUIPMENT_FEATURES, newest_standin, target_dir, workspace_root};

/// Arguments of `cargo xtask demo`.
#[derive(clap::Args)]
pub struct Args {
    /// Folder of profiler traces [default: $PENROSE_TRACES, else ../shared/traces next to the
    /// workspace]; a synthetic workload is used when none exists.
    #[arg(long)]
    traces: Option<PathBuf>,
    /// How long the agent captures.
    #[arg(long, default_value_t = 30.0)]
    seconds: f64,
    /// The contributor threshold k of both servers (at least 10).
    #[arg(long, default_value_t = 10)]
    threshold: u64,
    /// Hosts running the popular application (each an agent process).
    #[arg(long, default_value_t = 12)]
    agents: usize,
    /// Keep the temporary directory (keys, stores, the agent's record) and print its path.
    #[arg(long)]
    keep: bool,
    /// Use the trace-replay source even as root (no eBPF).
    #[arg(long)]
    no_ebpf: bool,
    /// Kill the agent (a third of the way in) and the aggregation server (two thirds in) with
    /// SIGKILL and restart them; the result must still be exact.
    #[arg(long)]
    faults: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    /// Use the binaries already built in this directory instead of building them (for
    /// example to run the demo as another user than the one who built it).
    #[arg(long)]
    bins: Option<PathBuf>,
    /// Run the whole system over a private Tor network on loopback (test equipment: 3
    /// directory authorities, 2 middles, 2 exits): every agent sends its reports and fetches
    /// its tokens through it, to the servers' stream ports. Needs root (the demo moves into a
    /// network namespace that has only loopback) and Debian's tor; never falls back to the
    /// direct route.
    #[arg(long)]
    pub(crate) tor: bool,
}

/// `demo --tor`, first thing in `main` while the process has one thread: checks what the Tor
/// run needs and moves the process into a new network namespace that has only loopback, so
/// that nothing the demo starts (the tors, the agents' arti) can reach another machine
/// (docs/design.md section 5). An explicit request: without root or tor it fails, it does not
/// fall back to the direct route.
pub fn enter_tor_namespace() -> Result<()> {
    ensure!(
        is_root(),
        "--tor needs root: the demo runs the Tor network and the agents in a network namespace \
         that has only loopback (docs/design.md section 5), and making one needs root; run it \
         as root, or without --tor for the direct route"
    );
    ensure!(
        penrose_tornet::tor_installed(),
        "--tor needs Debian's tor (the tor and tor-gencert programs; `apt-get install tor`), \
         which runs the private Tor network; install it, or run without --tor for the direct \
         route"
    );
    penrose_tornet::enter_loopback_namespace()
        .context("--tor: entering a network namespace that has only loopback")?;
    penrose_tornet::check_loopback_only()
        .context("--tor: checking the network namespace has only loopback")?;
    Ok(())
}

/// How one demo run is set up.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where the release (or test) binaries are.
    pub bins: PathBuf,
    /// The trace folder, if any.
    pub traces: Option<PathBuf>,
    /// Capture time.
    pub capture: Duration,
    /// k.
    pub threshold: u64,
    /// Agents running the popular application; two more each run another one alone.
    pub agents: usize,
    /// Probe with eBPF (needs root).
    pub ebpf: bool,
    /// No progress output.
    pub quiet: bool,
    /// SIGKILL and restart the agent, then the aggregation server, mid-run.
    pub faults: bool,
    /// Over a private Tor network on loopback: the caller must already be in a loopback-only
    /// network namespace ([`enter_tor_namespace`]).
    pub tor: bool,
}

/// What a run produced.
#[derive(Debug, Serialize)]
pub struct Outcome {
    /// "ebpf" or "test-replay" (host 0's agent's source).
    pub source: String,
    /// What was replayed.
    pub workload: String,
    /// Replayer processes (eBPF mode).
    pub replayers: usize,
    /// Agent processes (hosts).
    pub agents: usize,
    /// Agents that hold the design server's signed key list, fetched from the aggregation
    /// server and verified under the list-signing key they pin: all of them.
    pub key_list_agents: usize,
    /// The application every popular-host agent runs.
    pub popular: String,
    /// Applications run by one host alone: never decrypted.
    pub alone: Vec<String>,
    /// Capture windows the agent ran.
    pub windows: u64,
    /// Launches it captured.
    pub launches: u64,
    /// Samples it took.
    pub samples: u64,
    /// Histograms it sealed.
    pub sealed: usize,
    /// Reports the aggregator counted (all of them sealed by the agent).
    pub counted: usize,
    /// Bytes of one report frame.
    pub report_bytes: usize,
    /// Classes the aggregator formed.
    pub classes: usize,
    /// (class, counter) aggregates decrypted.
    pub decrypted: usize,
    /// (class, counter) aggregates held back under k (withheld by the aggregation server or
    /// held back by the design server).
    pub held_back: usize,
    /// Reports the aggregator counted from the hosts that ran an application alone, and how
    /// many of them reached a decryption (must be none).
    pub alone_counted: usize,
    /// Of those, reports inside a decrypted sum.
    pub alone_decrypted: usize,
    /// Every decrypted aggregate equals the sealed histograms, nothing under k contributors
    /// was decrypted, and nothing of a lone host was.
    pub exact: bool,
    /// Admission: the issuer, the tokens, and whether every counted report was admitted by one.
    pub admission: Admission,
    /// Contributor evidence: the auditor's party's tokens, and whether the auditor counted
    /// every released sum's contributors from them.
    pub evidence: Evidence,
    /// The decrypted aggregates.
    pub rows: Vec<Row>,
    /// Processes killed with SIGKILL and restarted mid-run.
    pub killed: Vec<String>,
    /// Seconds per stage.
    pub seconds: BTreeMap<String, f64>,
    /// The architects' page of this run (`penrose-design report --html`): `html/index.html`
    /// in the run's directory, kept with `--keep`.
    pub html: PathBuf,
    /// With `--tor`: what went over the private Tor network.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tor: Option<TorFigures>,
    /// The decrypted joint views, each checked against the agents' raw values.
    pub joints: Vec<JointCheck>,
}

/// What went over the private Tor network in a `--tor` run.
#[derive(Debug, Serialize)]
pub struct TorFigures {
    /// Where the network lived (keys, torrc files, logs), in the run's directory.
    pub network_dir: PathBuf,
    /// Seconds from starting the seven tors until a client could use them.
    pub ready_seconds: f64,
    /// Reports acked to the agents, every one over Tor (their status files' `uploads.accepted`;
    /// a restarted agent's count starts again).
    pub reports: u64,
    /// Tor streams the agents opened (one per QUIC connection: per upload attempt and per token
    /// fetch), and attempts that failed, per their status files.
    pub streams: u64,
    /// See `streams`.
    pub stream_failures: u64,
    /// Per agent: the circuits of its last streams (at most 64), and how many distinct.
    pub circuits: Vec<AgentCircuits>,
    /// Every agent's last streams each ran on a circuit of its own.
    pub isolated: bool,
    /// The aggregation server's metrics page: `penrose_transport_carrier_streams_total`
    /// (TCP streams on its stream port) by outcome, and
    /// `penrose_transport_connections_total{outcome="accepted"}` (QUIC connections that
    /// completed the handshake, UDP or stream alike), since its last start.
    pub carrier_streams: BTreeMap<String, u64>,
    /// See `carrier_streams`.
    pub connections_accepted: u64,
    /// UDP datagrams received in the demo's network namespace (`Udp: InDatagrams` of
    /// `/proc/thread-self/net/snmp`) from before the agents started until they stopped: a
    /// QUIC report over UDP would need some, nothing else there sends UDP.
    pub udp_datagrams: u64,
    /// Connections on the servers' stream ports seen while open (sampled every 250 ms during
    /// the capture), by the exit whose process held the other end: "none" when a process
    /// that is no exit held it, "closed before the lookup" when no process held it any more
    /// by the time it was looked up.
    pub sampled_connections: BTreeMap<String, u64>,
    /// Every tor the demo started was stopped and reaped.
    pub stopped: bool,
}

/// One agent's recent Tor circuits.
#[derive(Debug, Serialize)]
pub struct AgentCircuits {
    /// Streams listed in its status.
    pub recent: usize,
    /// Distinct circuits among them.
    pub distinct: usize,
}

impl TorFigures {
    /// Everything went over Tor: reports were acked; the aggregation server accepted streams
    /// on its stream port and no more QUIC connections than that (a connection over UDP would
    /// have no stream); no UDP datagram arrived in the namespace; every connection sampled on
    /// the stream ports came from an exit; every agent's streams had circuits of their own;
    /// and the network was stopped.
    pub fn over_tor(&self) -> bool {
        let accepted = self.carrier_streams.get("accepted").copied().unwrap_or(0);
        self.reports > 0
            && accepted > 0
            && self.connections_accepted <= accepted
            && self.udp_datagrams == 0
            && !self.sampled_connections.contains_key("none")
            && self.isolated
            && self.stopped
    }
}

/// What the run's admission tokens did.
#[derive(Debug, Serialize)]
pub struct Admission {
    /// The token issuer's QUIC address.
    pub issuer: String,
    /// Credentials enrolled at the issuer (one per host), per its `status`.
    pub enrolled: u64,
    /// Tokens the issuer issued (every day it keeps counts of), per its `status`.
    pub tokens_issued: u64,
    /// Tokens the agents received and stored, per their status files (a restarted agent's
    /// count starts again).
    pub tokens_fetched: u64,
    /// Tokens whose MAC the aggregation server verified since its last start (retries of a
    /// report already counted are verified again), per its `status`.
    pub tokens_verified: u64,
    /// Reports of the exported epochs, and of those the ones admitted with a spent token, per
    /// the bundle's epoch summaries (`export --json`).
    pub epoch_reports: u64,
    /// See `epoch_reports`.
    pub reports_with_tokens: u64,
    /// Rows of the aggregation server's Spent table: one per report admitted by a token.
    pub spent_rows: usize,
    /// The design server's report: "contributor bound enforced by admission tokens: yes".
    pub bound_enforced_by_tokens: bool,
    /// Partition attempts the agents saw (key sets or issuances not matching the keys
    /// published), per their status files: none may be.
    pub partition_warnings: u64,
    /// Every report the aggregator counted was admitted by a token spent once: the bundle
    /// counts each of them as admitted with a token, the design server's report says the bound
    /// was enforced by tokens, the Spent table holds one row per counted report; and no agent
    /// saw a partition attempt.
    pub admitted: bool,
}

/// What the run's contributor evidence did (docs/crypto.md, "Contributor evidence").
#[derive(Debug, Serialize)]
pub struct Evidence {
    /// The evidence issuer's (the release auditor's party's) QUIC address.
    pub issuer: String,
    /// Tokens it issued, per its `status`.
    pub tokens_issued: u64,
    /// Sums the bundle released.
    pub entries: u64,
    /// Reports the bundle's evidence lists for them, and of those the ones that carried an
    /// evidence token (`export-evidence --json`).
    pub reports_listed: u64,
    /// See `reports_listed`.
    pub reports_with_tokens: u64,
    /// Tokens the auditor counted (its `status`).
    pub tokens_counted: u64,
    /// Partial decryptions the auditor gave, and sums it withheld.
    pub partials: u64,
    /// See `partials`.
    pub withheld: u64,
    /// Evidence rows the aggregation server deleted once the auditor had answered
    /// (`forget-evidence --through 1`): every report of the epoch, withheld ones included.
    pub rows_forgotten: u64,
    /// The evidence covers every released sum, every listed report carried an evidence token,
    /// the auditor counted each of them once and gave a partial for every released sum; then
    /// the server deleted at least those reports' rows.
    pub counted: bool,
}

impl Evidence {
    /// The figures of a run: the evidence issuer's status, the bundle's export, its evidence
    /// file's (`export-evidence --json`) and what the auditor did.
    fn of(
        issuer: &str,
        status: &penrose_issuer::admin::Status,
        exported: &serde_json::Value,
        written: &serde_json::Value,
        audited: &Audited,
    ) -> Self {
        let listed = |field: &str| written[field].as_u64().unwrap_or(0);
        let entries = exported["entries"].as_u64().unwrap_or(0);
        Evidence {
            issuer: issuer.to_string(),
            tokens_issued: status.epochs.iter().map(|e| e.tokens).sum(),
            entries,
            reports_listed: listed("reports"),
            reports_with_tokens: listed("with_tokens"),
            tokens_counted: audited.tokens_counted,
            partials: audited.partials,
            withheld: audited.withheld,
            rows_forgotten: audited.rows_forgotten,
            counted: entries > 0
                && audited.rows_forgotten >= listed("reports")
                && listed("entries") == entries
                && listed("reports") > 0
                && listed("with_tokens") == listed("reports")
                && audited.tokens_counted == listed("with_tokens")
                && audited.partials == entries
                && audited.withheld == 0,
        }
    }
}

impl Admission {
    /// The figures of a run: the issuer's status; the agents' (tokens fetched, partition
    /// warnings); the bundle's export, the aggregation server's status and the design
    /// server's report (JSON); (reports counted, rows of the Spent table).
    fn of(
        issuer: String,
        status: &penrose_issuer::admin::Status,
        (tokens_fetched, partition_warnings): (u64, u64),
        [exported, agg_status, report]: [&serde_json::Value; 3],
        (counted_reports, spent_rows): (usize, usize),
    ) -> Self {
        let epoch_reports = exported["epoch_reports"].as_u64().unwrap_or(0);
        let reports_with_tokens = exported["reports_with_tokens"].as_u64().unwrap_or(0);
        let bound_enforced_by_tokens = report["bound_enforced_by_tokens"].as_bool() == Some(true);
        Admission {
            issuer,
            enrolled: status.enrolled,
            tokens_issued: status.epochs.iter().map(|e| e.tokens).sum(),
            tokens_fetched,
            tokens_verified: agg_status["admission"]["tokens_verified"]
                .as_u64()
                .unwrap_or(0),
            epoch_reports,
            reports_with_tokens,
            spent_rows,
            bound_enforced_by_tokens,
            partition_warnings,
            admitted: counted_reports > 0
                && epoch_reports == counted_reports as u64
                && reports_with_tokens == epoch_reports
                && spent_rows == counted_reports
                && bound_enforced_by_tokens
                && partition_warnings == 0,
        }
    }
}

/// One decrypted joint view, checked against the agents' raw values.
#[derive(Debug, Serialize)]
pub struct JointCheck {
    /// Class.
    pub class: u32,
    /// The view's name.
    pub view: String,
    /// Raw (x, y) values the agents recorded for its reports.
    pub samples: u64,
    /// Its quadrants as the design server split them.
    pub quadrants: Vec<JointQuadrant>,
    /// Samples per quadrant in the decrypted grid, as the design server counted them.
    pub from_grid: Vec<u64>,
    /// Raw values per quadrant, compared with the split directly.
    pub from_values: Vec<u64>,
    /// Each quadrant holds as many of the raw values, and the same share, as the design
    /// server counted in the decrypted grid.
    pub exact: bool,
}

/// One quadrant of a decrypted joint view.
#[derive(Debug, Serialize)]
pub struct JointQuadrant {
    /// What it covers.
    pub describe: String,
    /// Its share of the samples.
    pub share: f64,
    /// Its share of kernel time (estimated), where an axis is a duration.
    pub time_share: Option<f64>,
}

/// One decrypted (class, counter).
#[derive(Debug, Serialize)]
pub struct Row {
    /// Class.
    pub class: u32,
    /// Counter name.
    pub counter: String,
    /// Unit suffix.
    pub unit: String,
    /// Reports.
    pub reports: u64,
    /// The fewest contributors behind them.
    pub contributors: u64,
    /// Samples.
    pub samples: u64,
    /// Mean, p50, p90 at bin resolution.
    pub mean: Option<f64>,
    /// Median.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// Equal to the agent's sealed histograms, bin for bin.
    pub exact: bool,
}

/// Runs the task.
pub fn run(args: Args) -> Result<()> {
    ensure!(
        args.seconds.is_finite() && args.seconds > 0.0,
        "--seconds must be positive"
    );
    let root = workspace_root()?;
    let say = |msg: &str| {
        if !args.json {
            eprintln!("{msg}");
        }
    };
    let bins = match &args.bins {
        Some(bins) => bins.clone(),
        None => {
            say(
                "building the release binaries (agent, aggregator, token issuer, design server, \
                 replayer)",
            );
            let mut build = Command::new(env!("CARGO"));
            build
                .current_dir(&root)
                .args(["build", "--release", "--bins"])
                .args(["-p", "penrose-agent", "-p", "penrose-aggregator"])
                .args(["-p", "penrose-issuer", "-p", "penrose-design"])
                .args(["-p", "penrose-auditor"])
                .args(["-p", "penrose-standin"])
                .args(["--features", TEST_EQUIPMENT_FEATURES]);
            if args.tor {
                // The namespace has no network: the build uses what cargo already fetched.
                build.arg("--offline");
            }
            let status = build.status().context("running cargo build")?;
            ensure!(
                status.success(),
                "cargo build failed: {status}{}",
                if args.tor {
                    " (with --tor it runs offline, inside the loopback-only namespace: fetch \
                     the dependencies first, e.g. with `cargo fetch` or a demo without --tor)"
                } else {
                    ""
                }
            );
            target_dir(&root).join("release")
        }
    };
    let root_user = is_root();
    if !root_user {
        say("note: eBPF needs root, so the agent replays the traces itself in place of the probes");
    }
    let options = Options {
        bins,
        traces: args.traces.clone().or_else(default_traces),
        capture: Duration::from_secs_f64(args.seconds),
        threshold: args.threshold,
        agents: args.agents,
        ebpf: root_user && !args.no_ebpf,
        quiet: args.json,
        faults: args.faults,
        tor: args.tor,
    };
    let dir = tempfile::Builder::new().prefix("penrose-demo-").tempdir()?;
    let outcome = run_demo(&options, dir.path())?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&outcome)?);
    } else {
        print_outcome(&outcome, options.threshold);
    }
    if args.keep {
        let kept = dir.keep();
        say(&format!("kept {}", kept.display()));
    }
    if !outcome.exact {
        bail!("a decrypted aggregate differs from what the agent sealed");
    }
    if !outcome.admission.admitted {
        bail!(
            "a counted report was not admitted by an admission token: {:?}",
            outcome.admission
        );
    }
    if !outcome.evidence.counted {
        bail!(
            "the release auditor did not count every released sum's contributors from \
             evidence: {:?}",
            outcome.evidence
        );
    }
    if outcome.decrypted == 0 {
        bail!(
            "no aggregate reached the threshold of {} contributors",
            options.threshold
        );
    }
    if let Some(tor) = &outcome.tor
        && !tor.over_tor()
    {
        bail!("not everything went over the private Tor network: {tor:?}");
    }
    Ok(())
}

fn default_traces() -> Option<PathBuf> {
    let dir = penrose_traces::TraceFolder::default_dir();
    dir.is_dir().then_some(dir)
}

/// Child processes, killed when dropped (an error never leaves servers behind).
#[derive(Default)]
struct Children(Vec<(&'static str, Child)>);

impl Children {
    fn push(&mut self, name: &'static str, child: Child) -> usize {
        self.0.push((name, child));
        self.0.len() - 1
    }

    /// SIGTERM, then waits up to `grace` before SIGKILL.
    fn stop(&mut self, index: usize, grace: Duration) -> Result<std::process::ExitStatus> {
        let (name, child) = &mut self.0[index];
        terminate(child.id());
        let deadline = Instant::now() + grace;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("{name} did not stop within {grace:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

fn terminate(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: sends SIGTERM to a child of ours that has not been waited for.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
}

fn output(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    ensure!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn spinner(quiet: bool, prefix: &'static str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} {prefix:<12} {elapsed:>4} {msg}") {
        bar.set_style(style);
    }
    bar.set_prefix(prefix);
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// What every agent of the fleet is given: the aggregation server, the design server's key
/// and the token issuer.
struct Servers<'a> {
    /// The aggregation server's QUIC address.
    listen: &'a str,
    /// Its data directory (its TLS certificate is pinned).
    agg: &'a DataDir,
    /// The design server's public key.
    key: &'a Path,
    /// The design server's list-signing key (public half), which agents pin.
    list_signer: &'a Path,
    /// The token issuer's QUIC address.
    issuer: &'a str,
    /// Its certificate, pinned.
    issuer_cert: &'a Path,
    /// The evidence issuer's (the release auditor's party's) QUIC address.
    evidence: &'a str,
    /// Its certificate, pinned.
    evidence_cert: &'a Path,
    /// With `--tor`: the route through the private Tor network.
    tor: Option<TorRoute<'a>>,
}

/// How the agents reach the servers with `--tor`.
struct TorRoute<'a> {
    /// The arti configuration of the private network ([`TorNetwork::arti_toml`]).
    network: &'a Path,
    /// The aggregation server's stream port.
    aggregator_stream: &'a str,
    /// The token issuer's stream port.
    issuer_stream: &'a str,
    /// The evidence issuer's stream port.
    evidence_stream: &'a str,
}

/// The compressed-time agent configuration: its state directory, its snippet source, the
/// traces it replays and its own credential files (the admission issuer's, the evidence
/// issuer's).
fn agent_config(
    dir: &Path,
    servers: &Servers<'_>,
    source: &str,
    lib: Option<&Path>,
    traces: &Path,
    [credential, evidence_credential]: [&Path; 2],
) -> String {
    let libraries = lib.map_or(String::new(), |l| format!("{:?}", l.display().to_string()));
    let direct = "\n[transport]\n# Without --tor: the direct route on loopback, named (the agent's default is \
                  Tor).\nroute = \"direct\"\n";
    let transport = servers.tor.as_ref().map_or(direct.to_string(), |tor| {
        format!(
            r#"
[transport]
# --tor: every report and every token fetch goes through the private Tor network on loopback
# (test equipment; its arti configuration replaces the public relays), each QUIC connection
# on a Tor stream and circuit of its own, to the servers' stream ports.
route = "tor"
tor_network = {network:?}
aggregator_stream = {aggregator:?}
issuer_stream = {issuer:?}
evidence_issuer_stream = {evidence:?}
tor_connect_timeout_seconds = 60.0
"#,
            network = tor.network.display().to_string(),
            aggregator = tor.aggregator_stream,
            issuer = tor.issuer_stream,
            evidence = tor.evidence_stream,
        )
    });
    format!(
        r#"# Written by cargo xtask demo: the design's settings compressed in time.
state_dir = {state:?}

[aggregator]
address = {listen:?}
server_name = "localhost"
certificate = {cert:?}

[design]
public_key = {key:?}
# The design server's signed key list, fetched from the aggregation server (key rollover).
key_list_signer = {list_signer:?}

[capture]
source = {source:?}
window_launches = 2000
budget_percent = 100.0
max_window_seconds = 2.0
min_gap_seconds = 0.3
max_gap_seconds = 2.0
sample_period = 20
group_seconds = 600.0
# Test equipment, named as such: counter values from the stand-in libcuda's ring (or, with
# source = "test-replay", the traces' own fields), and the stand-in copy in this run's
# temporary directory probed although root does not control that directory.
counters = "test-standin-ring"
libraries = [{libraries}]
scan_system = false
allow_untrusted_libs = true

[replay]
traces = {traces:?}
window_seconds = 1.0

[seal]
samples = 40
max_age_seconds = 1.0
# Test equipment: the raw values behind every joint view's cells go into the sealed record, so
# that the demo checks the decrypted grids' quadrants against the values themselves.
test_record_joint_values = true

[upload]
delay_max_seconds = 0.005
backoff_base_seconds = 0.05
backoff_max_seconds = 1.0

[admission]
address = {issuer:?}
server_name = "localhost"
certificate = {issuer_cert:?}
# This host's own credential, enrolled by the demo's issuer (mode 0600, the agent user's).
credential = {credential:?}
# Tokens are fetched at start (none held for today yet); a failed fetch is tried again after
# a second rather than ten minutes. refresh_max_seconds keeps its default (12 h): the regular
# refresh does not come up during the run.
retry_min_seconds = 1.0

[evidence]
# The release auditor's party's issuer: a second token on each report, which only the
# auditor can check, to count contributors from.
address = {evidence:?}
server_name = "localhost"
certificate = {evidence_cert:?}
credential = {evidence_credential:?}
retry_min_seconds = 1.0
{transport}"#,
        listen = servers.listen,
        issuer = servers.issuer,
        issuer_cert = servers.issuer_cert.display().to_string(),
        credential = credential.display().to_string(),
        evidence = servers.evidence,
        evidence_cert = servers.evidence_cert.display().to_string(),
        evidence_credential = evidence_credential.display().to_string(),
        state = dir.display().to_string(),
        cert = servers.agg.tls_cert().display().to_string(),
        key = servers.key.display().to_string(),
        list_signer = servers.list_signer.display().to_string(),
        traces = traces.display().to_string(),
    )
}

/// Runs the whole system once in `dir` and checks it.
pub fn run_demo(options: &Options, dir: &Path) -> Result<Outcome> {
    let bin = |name: &str| options.bins.join(name);
    for name in [
        "penrose-agent",
        "penrose-aggregator",
        "penrose-issuer",
        "penrose-design",
        "penrose-auditor",
        "penrose-replay",
    ] {
        ensure!(
            bin(name).exists(),
            "{} is missing (build the workspace's binaries first)",
            bin(name).display()
        );
    }
    let say = |msg: &str| {
        if !options.quiet {
            eprintln!("{msg}");
        }
    };
    let mut seconds = BTreeMap::new();
    let mut children = Children::default();

    // The workload.
    let (workload, traces) = match &options.traces {
        Some(folder) => {
            let files = penrose_traces::TraceFolder::open(folder)?.files().to_vec();
            ensure!(!files.is_empty(), "no traces in {}", folder.display());
            (
                format!("{} real traces in {}", files.len(), folder.display()),
                folder.clone(),
            )
        }
        None => {
            let folder = dir.join("synthetic-traces");
            write_synthetic_traces(&folder)?;
            (
                "3 synthetic applications (no trace folder found)".to_string(),
                folder,
            )
        }
    };
    say(&format!("workload: {workload}"));
    say(
        "compressed time: L = 2,000 launches per window (design: 10,000), 1 launch in 20 sampled \
         (1,000), histograms sealed at 40 samples or 1 s (10,000 or 300 s) and at most 24 per counter and day as in the design, windows of at most 2 s \
         at least 0.3 s apart under a 100% budget (0.02%), uploads after a random delay of at most 5 ms (60 s), \
         a failed admission token fetch tried again after 1 s (600 s)",
    );

    // 0. With --tor, the private Tor network, first: it takes 20-60 s to become usable, and
    // the servers are set up meanwhile. It lives in the run's directory; dropping it (at the
    // end, or on any error) stops every tor by its process id.
    let mut tor = if options.tor {
        let started = Instant::now();
        let net = TorNetwork::start(TorNetworkOptions::new(dir.join("tor-net")))
            .context("starting the private Tor network (--tor)")?;
        say(&format!(
            "tor: a private Tor network on loopback is starting in {} (test equipment: 3 \
             directory authorities, 2 middles, 2 exits; tor processes {:?}), inside a network \
             namespace that has only loopback",
            net.dir().display(),
            net.pids(),
        ));
        Some(TorRun {
            net,
            started,
            ready_seconds: 0.0,
        })
    } else {
        None
    };

    // 1. Keys.
    let t = Instant::now();
    let keys = dir.join("keys");
    output(
        // Split with the release auditor: no private key is ever written.
        Command::new(bin("penrose-design"))
            .arg("keygen")
            .arg("--split")
            .arg("--out")
            .arg(&keys),
        "penrose-design keygen --split",
    )?;
    let public_key = keys.join("public.key");
    let public = PublicKey::from_bytes(&std::fs::read(&public_key)?)?;
    seconds.insert(
        "design server: keygen".to_string(),
        t.elapsed().as_secs_f64(),
    );
    say(&format!("design server: key {}", public.key_id()));
    // Its signed key list (one key, for every day): the aggregation server applies it and
    // hands it to the agents, which verify it under the list-signing key they pin.
    output(
        Command::new(bin("penrose-design"))
            .arg("key-list-signer")
            .arg("--out")
            .arg(&keys),
        "penrose-design key-list-signer",
    )?;
    let list_signer = keys.join("list-signing.pub");
    let key_list = keys.join("keys.list");
    output(
        Command::new(bin("penrose-design"))
            .arg("key-list")
            .arg("--signing-key")
            .arg(keys.join("list-signing.key"))
            .arg("--key")
            .arg(format!("{}@1970-01-01", public_key.display()))
            .args(["--sequence", "1", "--out"])
            .arg(&key_list),
        "penrose-design key-list",
    )?;
    let server_key = ServerKey::List {
        list: &key_list,
        signer: &list_signer,
    };

    // 2. The token issuer: its state, a credential per host, the aggregation server's key
    // ring; then it serves.
    let (popular, alone) = choose_applications(&traces)?;
    let t = Instant::now();
    let host_count = options.agents + alone.len();
    let issuer_state = issuer_state(dir);
    let issuer_cmd = |command: &str| {
        let mut cmd = Command::new(bin("penrose-issuer"));
        cmd.arg(command).arg("--state").arg(&issuer_state);
        cmd
    };
    let ring = dir.join("aggregator-token-keys");
    let issuer_run = set_up_issuer(
        &bin("penrose-issuer"),
        &IssuerPaths {
            state: issuer_state.clone(),
            credentials: dir.join("credentials"),
            ring: ring.clone(),
            log: dir.join("issuer.log"),
        },
        host_count,
        tor.is_some(),
    )?;
    let issuer_index = children.push("penrose-issuer", issuer_run.child);
    let (issuer_listen, issuer_cert, issuer_stream) =
        (issuer_run.listen, issuer_run.cert, issuer_run.stream);
    let (credentials, exported) = (issuer_run.credentials, issuer_run.exported);
    // The release auditor's party runs an issuer of its own: its own enrolment (a second
    // credential per host), its own keys, which only the auditor gets (contributor evidence).
    let evidence_state = dir.join("evidence-issuer");
    let evidence_ring = dir.join("auditor-evidence-keys");
    let evidence_run = set_up_issuer(
        &bin("penrose-issuer"),
        &IssuerPaths {
            state: evidence_state.clone(),
            credentials: dir.join("evidence-credentials"),
            ring: evidence_ring.clone(),
            log: dir.join("evidence-issuer.log"),
        },
        host_count,
        tor.is_some(),
    )?;
    let evidence_index = children.push("penrose-issuer (evidence)", evidence_run.child);
    seconds.insert(
        "issuer: init, enrol, export keys, start".to_string(),
        t.elapsed().as_secs_f64(),
    );
    say(&format!(
        "token issuer: listening on {issuer_listen} (QUIC){}, {host_count} hosts enrolled (one \
         credential file each, in {}); key ring of {} to {} exported to the aggregation server",
        if tor.is_some() {
            format!(" and {issuer_stream} (stream port, for Tor)")
        } else {
            String::new()
        },
        dir.join("credentials").display(),
        exported["from_date"].as_str().unwrap_or("?"),
        exported["to_date"].as_str().unwrap_or("?"),
    ));
    say(&format!(
        "evidence issuer (the release auditor's party): listening on {}, {host_count} hosts \
         enrolled with credentials of its own (in {}); its key ring goes to the auditor alone",
        evidence_run.listen,
        dir.join("evidence-credentials").display(),
    ));

    // 3. The aggregation server, admitting reports by tokens of that ring.
    let agg = DataDir::new(dir.join("aggregator"));
    let mut admission = vec![
        OsString::from("--token-keys"),
        ring.into_os_string(),
        // Each report's evidence token, for the release auditor to count contributors from.
        OsString::from("--keep-evidence"),
    ];
    // With --tor: a stream port, where the exits deliver, and the metrics page (its transport
    // counters say what came on the stream port).
    let tor_flags = |stream: &str, metrics: &str| {
        ["--stream-listen", stream, "--metrics", metrics].map(OsString::from)
    };
    let mut serve_args = admission.clone();
    if tor.is_some() {
        serve_args.extend(tor_flags("127.0.0.1:0", "127.0.0.1:0"));
    }
    let (server, server_ready) = start_server_ready(
        &bin("penrose-aggregator"),
        &agg,
        "127.0.0.1:0",
        server_key,
        &serve_args,
    )?;
    let server_index = children.push("penrose-aggregator", server);
    let listen = server_ready["listening"]
        .as_str()
        .context("the aggregator's listening address")?
        .to_string();
    let (agg_stream, agg_metrics) = if tor.is_some() {
        let field = |name: &str| {
            server_ready[name]
                .as_str()
                .map(str::to_string)
                .with_context(|| format!("the aggregator's {name} address"))
        };
        let (stream, metrics) = (field("stream_listening")?, field("metrics")?);
        // A restart (--faults) binds the same ports again.
        admission.extend(tor_flags(&stream, &metrics));
        (stream, metrics)
    } else {
        (String::new(), String::new())
    };
    say(&format!(
        "aggregation server: listening on {listen} (QUIC){}, data in {}; admits reports with an \
         admission token only",
        if tor.is_some() {
            format!(" and {agg_stream} (stream port, for Tor; metrics on {agg_metrics})")
        } else {
            String::new()
        },
        agg.path().display()
    ));

    // With --tor, the network must be usable before the agents start (they fetch their tokens
    // through it at once); its arti configuration replaces the public relays.
    let arti_file = dir.join("arti-network.toml");
    if let Some(tor) = &mut tor {
        let t = Instant::now();
        let readiness = tor
            .net
            .wait_ready(Duration::from_secs(300))
            .context("the private Tor network did not become usable")?;
        tor.ready_seconds = tor.started.elapsed().as_secs_f64();
        std::fs::write(&arti_file, tor.net.arti_toml())?;
        seconds.insert(
            "tor: waiting for the network".to_string(),
            t.elapsed().as_secs_f64(),
        );
        say(&format!(
            "tor: the private network is usable {:.1} s after it started ({readiness:?}); the \
             agents' arti configuration is {}",
            tor.ready_seconds,
            arti_file.display()
        ));
    }

    // 4. The fleet: `agents` hosts run the popular application, and two more hosts each run
    // another one alone. Each agent gets its own state directory, credential file and a
    // folder holding its one trace.
    let mut hosts: Vec<Host> = Vec::new();
    for i in 0..host_count {
        let trace = if i < options.agents {
            &popular
        } else {
            &alone[i - options.agents]
        };
        let folder = dir.join(format!("traces-{i:02}"));
        std::fs::create_dir_all(&folder)?;
        let name = trace.file_name().context("a trace file name")?;
        std::os::unix::fs::symlink(trace, folder.join(name))?;
        hosts.push(Host {
            state: dir.join(format!("agent-{i:02}")),
            config: dir.join(format!("agent-{i:02}.toml")),
            log: dir.join(format!("agent-{i:02}.log")),
            folder,
            alone: i >= options.agents,
            child: 0,
        });
    }
    say(&format!(
        "fleet: {} hosts run {} (the popular application); {} more each run one of {} alone",
        options.agents,
        trace_name(&popular),
        alone.len(),
        alone
            .iter()
            .map(|t| trace_name(t))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let lib = if options.ebpf {
        let lib_dir = dir.join("lib");
        std::fs::create_dir_all(&lib_dir)?;
        let lib = lib_dir.join("libcuda.so.1");
        std::fs::copy(newest_standin(&options.bins)?, &lib).context("installing the stand-in")?;
        Some(lib)
    } else {
        None
    };
    let source = if lib.is_some() { "ebpf" } else { "test-replay" };
    let servers = Servers {
        listen: &listen,
        agg: &agg,
        key: &public_key,
        list_signer: &list_signer,
        issuer: &issuer_listen,
        issuer_cert: &issuer_cert,
        evidence: &evidence_run.listen,
        evidence_cert: &evidence_run.cert,
        tor: tor.as_ref().map(|_| TorRoute {
            network: &arti_file,
            aggregator_stream: &agg_stream,
            issuer_stream: &issuer_stream,
            evidence_stream: &evidence_run.stream,
        }),
    };
    // No UDP datagram should arrive in the namespace while the agents run over Tor.
    let udp_before = if tor.is_some() { udp_datagrams()? } else { 0 };
    for (((i, host), credential), evidence_credential) in hosts
        .iter_mut()
        .enumerate()
        .zip(&credentials)
        .zip(&evidence_run.credentials)
    {
        // Host 0 probes the stand-in with eBPF (as root); the rest replay their trace.
        let (source, lib) = match (&lib, i) {
            (Some(lib), 0) => ("ebpf", Some(lib.as_path())),
            _ => ("test-replay", None),
        };
        std::fs::write(
            &host.config,
            agent_config(
                &host.state,
                &servers,
                source,
                lib,
                &host.folder,
                [credential, evidence_credential],
            ),
        )?;
        let agent = start_agent(&bin("penrose-agent"), &host.config, &host.log)?;
        host.child = children.push("penrose-agent", agent);
    }
    let mut replayers = Vec::new();
    // An agent is running once it writes its first status (after loading its probes, or the
    // traces it replays); capture time counts from there, and in eBPF mode the name probes are
    // attached before the replayers resolve their kernels.
    for host in &hosts {
        wait_for(Duration::from_secs(120), || {
            Ok(read_status(&host.state).is_some())
        })
        .with_context(|| format!("an agent did not start; see {}", host.log.display()))?;
    }
    if let Some(lib) = &lib {
        let child = Command::new(bin("penrose-replay"))
            .arg("--lib")
            .arg(lib)
            .args(["--pace", "trace", "--speed", "2", "--loop-forever"])
            .arg(&popular)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting penrose-replay")?;
        replayers.push(children.push("penrose-replay", child));
        say(&format!(
            "host 0: its agent probes {} with eBPF; a replayer process launches the popular \
             trace's kernels through it. The other agents replay their trace as if captured.",
            lib.display(),
        ));
    } else {
        say("agents: replaying their traces as if captured (trace-replay source)");
    }

    // 5. Capture for the chosen time, with progress.
    let t = Instant::now();
    let bar = spinner(options.quiet, "capturing");
    let mut killed = Vec::new();
    let first = hosts[0].state.clone();
    let first_index = hosts[0].child;
    // Faults strike the first host once its agent has delivered something (its counts restart
    // with it), so that each one lands mid-stream rather than during a start-up.
    let delivered = |state_dir: &Path| read_status(state_dir).map_or(0, |s| s.uploads.accepted);
    let hard_stop = options.capture + Duration::from_secs(120);
    // With --tor: the servers' stream ports, and per connection seen on one while open, the
    // exit whose process held its other end.
    let exits = tor.as_ref().map(|t| t.net.exit_finder());
    let stream_ports: Vec<u16> = [&agg_stream, &issuer_stream]
        .iter()
        .filter_map(|a| a.parse::<std::net::SocketAddr>().ok())
        .map(|a| a.port())
        .collect();
    let mut sampled: HashMap<(u16, std::net::SocketAddr), String> = HashMap::new();
    while t.elapsed() < options.capture || (options.faults && killed.len() < 2) {
        ensure!(
            t.elapsed() < hard_stop,
            "the faults did not all strike within {hard_stop:?}; see {}",
            hosts[0].log.display()
        );
        std::thread::sleep(Duration::from_millis(250));
        if let Some(exits) = &exits {
            sample_stream_connections(exits, &stream_ports, &mut sampled)?;
        }
        if options.faults && killed.is_empty() && delivered(&first) >= 20 {
            let (_, agent) = &mut children.0[first_index];
            agent.kill()?;
            agent.wait()?;
            bar.println(
                "fault: host 0's agent was killed with SIGKILL; restarting it on its state",
            );
            // Its last status is gone with it: the next one is the new agent's.
            let _ = std::fs::remove_file(first.join("status.json"));
            children.0[first_index].1 =
                start_agent(&bin("penrose-agent"), &hosts[0].config, &hosts[0].log)?;
            killed.push("penrose-agent".to_string());
        } else if options.faults && killed.len() == 1 && delivered(&first) >= 20 {
            let (_, server) = &mut children.0[server_index];
            server.kill()?;
            server.wait()?;
            bar.println("fault: the aggregation server was killed with SIGKILL; down for 2 s");
            std::thread::sleep(Duration::from_secs(2));
            let (server, _) = start_server(
                &bin("penrose-aggregator"),
                &agg,
                &listen,
                server_key,
                &admission,
            )?;
            children.0[server_index].1 = server;
            killed.push("penrose-aggregator".to_string());
        }
        let statuses: Vec<AgentStatus> =
            hosts.iter().filter_map(|h| read_status(&h.state)).collect();
        let total = |f: &dyn Fn(&AgentStatus) -> u64| statuses.iter().map(f).sum::<u64>();
        bar.set_message(format!(
            "{} agents: {} launches, {} samples, {} sealed, {} accepted, {} spooled",
            statuses.len(),
            total(&|s| s.launches),
            total(&|s| s.pipeline.samples),
            total(&|s| s.pipeline.sealed),
            total(&|s| s.uploads.accepted),
            total(&|s| s.spool.reports),
        ));
        for host in &hosts {
            if let Some(status) = children.0[host.child].1.try_wait()? {
                bail!(
                    "an agent exited early ({status}); see {}",
                    host.log.display()
                );
            }
        }
    }
    for index in replayers.iter().copied() {
        children.stop(index, Duration::from_secs(10))?;
    }
    // Let the spools drain before stopping the agents (what they seal on stop stays spooled):
    // an empty spool in a status written after the replayers stopped.
    let stopped = std::time::SystemTime::now();
    // Over Tor a report takes a circuit of its own and a few hundred ms more.
    let drain = Duration::from_secs(if tor.is_some() { 90 } else { 30 });
    let _ = wait_for(drain, || {
        Ok(hosts.iter().all(|h| {
            let fresh = std::fs::metadata(h.state.join("status.json"))
                .and_then(|m| m.modified())
                .is_ok_and(|m| m > stopped + Duration::from_millis(600));
            fresh && read_status(&h.state).is_some_and(|s| s.spool.reports == 0)
        }))
    });
    for host in &hosts {
        children.stop(host.child, Duration::from_secs(60))?;
    }
    bar.finish_and_clear();
    let udp_datagrams = if tor.is_some() {
        udp_datagrams()?.saturating_sub(udp_before)
    } else {
        0
    };
    // What the agents did with their tokens, from their last status files; and with --tor, what
    // went through Tor.
    let (mut tokens_fetched, mut partition_warnings) = (0, 0);
    let (mut tor_reports, mut tor_streams, mut tor_failures) = (0, 0, 0);
    let mut circuits = Vec::new();
    let mut key_list_agents = 0;
    for host in &hosts {
        let status = read_status(&host.state).context("an agent's last status")?;
        ensure!(
            status.design_key.list_sequence == Some(1)
                && status.design_key.key_id_today == Some(public.key_id().to_string()),
            "an agent does not hold the design server's key list: {:?}; see {}",
            status.design_key,
            host.log.display()
        );
        key_list_agents += 1;
        tokens_fetched += status.tokens.issued;
        partition_warnings += status.tokens.partition_warnings;
        if tor.is_some() {
            let route = &status.route;
            ensure!(
                route.route == RouteChoice::Tor,
                "an agent did not run over Tor: {route:?}; see {}",
                host.log.display()
            );
            tor_reports += status.uploads.accepted;
            tor_streams += route.tor_streams;
            tor_failures += route.tor_stream_failures;
            let recent: Vec<&str> = route
                .tor_recent_circuits
                .iter()
                .map(String::as_str)
                .collect();
            let distinct: std::collections::BTreeSet<&str> =
                recent.iter().copied().filter(|c| *c != "?").collect();
            circuits.push(AgentCircuits {
                recent: recent.len(),
                distinct: distinct.len(),
            });
        }
    }
    // The issuer's own status type, which its `status --json` prints.
    let issuer_status: penrose_issuer::admin::Status = serde_json::from_str(&output(
        issuer_cmd("status").arg("--json"),
        "penrose-issuer status",
    )?)?;
    children.stop(issuer_index, Duration::from_secs(30))?;
    let evidence_status: penrose_issuer::admin::Status = serde_json::from_str(&output(
        Command::new(bin("penrose-issuer"))
            .arg("status")
            .arg("--state")
            .arg(&evidence_state)
            .arg("--json"),
        "penrose-issuer status (evidence)",
    )?)?;
    children.stop(evidence_index, Duration::from_secs(30))?;
    seconds.insert(
        "agents: capture and upload".to_string(),
        t.elapsed().as_secs_f64(),
    );
    let status = read_status(&first).context("host 0's last status")?;

    // 6. Close the epoch and export while serving, import, decrypt.
    let t = Instant::now();
    let release = ["--threshold".to_string(), options.threshold.to_string()];
    let Exported {
        bundle,
        json: exported,
        evidence: evidence_file,
        evidence_json: evidence_written,
    } = close_and_export(&bin("penrose-aggregator"), &agg, dir)?;
    let agg_status: serde_json::Value = serde_json::from_str(&output(
        Command::new(bin("penrose-aggregator"))
            .arg("status")
            .arg("-d")
            .arg(agg.path())
            .arg("--json"),
        "penrose-aggregator status",
    )?)?;
    let metrics = if tor.is_some() {
        fetch_metrics(&agg_metrics)?
    } else {
        String::new()
    };
    children.stop(server_index, Duration::from_secs(30))?;
    // Every server is stopped: so is the Tor network (its Drop would do it on an error).
    let tor_figures = match tor.as_mut() {
        Some(run) => {
            run.net.stop().context("stopping the private Tor network")?;
            let carrier_streams: BTreeMap<String, u64> =
                ["accepted", "refused_server_full", "idle", "malformed"]
                    .into_iter()
                    .map(|outcome| {
                        let value = metric(
                            &metrics,
                            &format!(
                                "penrose_transport_carrier_streams_total{{outcome=\"{outcome}\"}}"
                            ),
                        );
                        value.map(|v| (outcome.to_string(), v))
                    })
                    .collect::<Result<_>>()?;
            let mut by_exit = BTreeMap::new();
            for owner in sampled.values() {
                *by_exit.entry(owner.clone()).or_insert(0) += 1;
            }
            Some(TorFigures {
                network_dir: run.net.dir().to_path_buf(),
                ready_seconds: run.ready_seconds,
                reports: tor_reports,
                streams: tor_streams,
                stream_failures: tor_failures,
                isolated: circuits
                    .iter()
                    .all(|c| c.recent > 0 && c.distinct == c.recent),
                circuits,
                carrier_streams,
                connections_accepted: metric(
                    &metrics,
                    "penrose_transport_connections_total{outcome=\"accepted\"}",
                )?,
                udp_datagrams,
                sampled_connections: by_exit,
                stopped: run.net.pids().is_empty(),
            })
        }
        None => None,
    };
    seconds.insert(
        "aggregator: close epoch, export".to_string(),
        t.elapsed().as_secs_f64(),
    );
    let t = Instant::now();
    let archive = dir.join("design");
    import_into_design(
        &bin("penrose-design"),
        &archive,
        &agg,
        &bundle,
        &evidence_file,
    )?;
    let auditor = AuditorParts {
        keys: &keys,
        agg: &agg,
        archive: &archive,
        evidence_ring: &evidence_ring,
    };
    let mut audited = release_auditor(options, dir, &auditor, &mut children)?;
    say(&audited.said);
    // The auditor has answered bundle 1: its evidence can go (the server is stopped; the
    // command opens its data directory).
    let forgot: serde_json::Value = serde_json::from_str(&output(
        Command::new(bin("penrose-aggregator"))
            .arg("forget-evidence")
            .arg("-d")
            .arg(agg.path())
            .args(["--through", "1", "--json"]),
        "penrose-aggregator forget-evidence",
    )?)?;
    audited.rows_forgotten = forgot["rows"].as_u64().unwrap_or(0);
    let report: serde_json::Value = serde_json::from_str(&output(
        Command::new(bin("penrose-design"))
            .arg("report")
            .arg("--archive")
            .arg(&archive)
            .arg("--split-key")
            .arg(&keys)
            .args(&release)
            .arg("--json"),
        "penrose-design report",
    )?)?;
    // The same release as the page architects read; it must show the decrypted histograms.
    let html_dir = dir.join("html");
    output(
        Command::new(bin("penrose-design"))
            .arg("report")
            .arg("--archive")
            .arg(&archive)
            .arg("--split-key")
            .arg(&keys)
            .args(&release)
            .arg("--html")
            .arg(&html_dir),
        "penrose-design report --html",
    )?;
    let html = html_dir.join("index.html");
    let page = std::fs::read_to_string(&html).context("reading the report page")?;
    ensure!(
        page.contains("<svg"),
        "the report page {} holds no plot",
        html.display()
    );
    seconds.insert(
        "design server: import and decrypt".to_string(),
        t.elapsed().as_secs_f64(),
    );

    // 7. The check: the agents' own records against what the aggregator counted and the
    // design server decrypted.
    let mut records = Vec::new();
    for host in &hosts {
        for record in penrose_agent::record::read_records(&host.state.join("sealed.jsonl"))? {
            records.push((host.alone, record));
        }
    }
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(&agg.db())?);
    let state = State::open(
        Arc::clone(&store),
        &public,
        FingerprintParams::default(),
        ACCUMULATOR_REPORT_BOUND,
        None,
    )?;
    // A counted report's Seen row is under its day (`penrose_aggregator::state::seen`).
    let ids: Vec<Vec<u8>> = records
        .iter()
        .map(|(_, r)| seen::id_key(Day(r.day), &r.report_id))
        .collect();
    let keys_of: Vec<&[u8]> = ids.iter().map(Vec::as_slice).collect();
    let counted = store.contains_many(Table::Seen, &keys_of)?;
    // Per (class, GPU architecture, counter, day): the epoch of a report is its day (nothing
    // closed early); sums never mix architectures.
    type Sum = ([u64; BIN_COUNT], u64, bool, Vec<[f64; 2]>);
    let mut per_day: BTreeMap<(u32, String, u16, u32), Sum> = BTreeMap::new();
    for ((alone, record), counted) in records.iter().zip(&counted) {
        if !counted {
            continue;
        }
        // Through the store: SST rows are loaded on demand, so a reopened state's tables hold
        // only some of them. The class the snippet was placed in, as the check always used.
        let class = state
            .snippet_row(&record.snippet)?
            .map(|s| s.class.0)
            .context("a counted report's snippet has no class")?;
        let entry = per_day
            .entry((class, record.arch.clone(), record.counter, record.day))
            .or_insert(([0; BIN_COUNT], 0, false, Vec::new()));
        for (sum, bin) in entry.0.iter_mut().zip(&record.bins) {
            *sum += u64::from(*bin);
        }
        entry.1 += 1;
        entry.2 |= *alone;
        entry.3.extend_from_slice(&record.joint_values);
    }
    let threshold = Threshold::new(options.threshold)?;
    let cap = ReportsPerContributor::DEFAULT;
    // What must be decrypted: per (class, architecture, counter), the days whose sum reaches
    // k contributors.
    type Expected = ([u64; BIN_COUNT], u64, Vec<[f64; 2]>);
    let mut expected: HashMap<(u32, String, u16), Expected> = HashMap::new();
    let mut pairs: std::collections::BTreeSet<(u32, String, u16)> = Default::default();
    let mut alone_counted = 0usize;
    let mut origins: HashMap<(u32, String, u16), Origins> = HashMap::new();
    for ((class, arch, counter, _), (bins, n, alone, values)) in &per_day {
        let (class, counter) = (*class, *counter);
        pairs.insert((class, arch.clone(), counter));
        let origin = origins.entry((class, arch.clone(), counter)).or_default();
        match alone {
            true => {
                alone_counted += *n as usize;
                origin.alone += n;
            }
            false => origin.shared += n,
        }
        if !releasable(*n, 1, threshold, cap) {
            continue;
        }
        let entry = expected.entry((class, arch.clone(), counter)).or_insert((
            [0; BIN_COUNT],
            0,
            Vec::new(),
        ));
        for (s, b) in entry.0.iter_mut().zip(bins) {
            *s += b;
        }
        entry.1 += n;
        entry.2.extend_from_slice(values);
    }
    let decrypted = report["decrypted"].as_array().cloned().unwrap_or_default();
    let alone_decrypted = lone_reports_decrypted(&origins, &decrypted);
    let mut exact = alone_decrypted == 0;
    let mut rows = Vec::new();
    let mut joints = Vec::new();
    for d in &decrypted {
        let class = d["class"].as_u64().unwrap_or(u64::MAX) as u32;
        let counter = d["counter"].as_u64().unwrap_or(u64::MAX) as u16;
        let arch = d["arch"].as_str().unwrap_or("?").to_string();
        let bins: Vec<u64> = d["bins"]
            .as_array()
            .map(|b| b.iter().filter_map(|v| v.as_u64()).collect())
            .unwrap_or_default();
        let reports = d["reports"].as_u64().unwrap_or(0);
        let wanted = expected.get(&(class, arch, counter));
        let ok =
            wanted.is_some_and(|(sum, n, _)| *n == reports && sum.as_slice() == bins.as_slice());
        exact &= ok;
        if !d["joint"].is_null() {
            let values = wanted.map_or(&[][..], |w| w.2.as_slice());
            joints.push(check_joint(class, d, values));
        }
        rows.push(Row {
            class,
            counter: d["name"].as_str().unwrap_or("?").to_string(),
            unit: d["unit"].as_str().unwrap_or("").to_string(),
            reports,
            contributors: d["contributors_at_least"].as_u64().unwrap_or(0),
            samples: d["samples"].as_u64().unwrap_or(0),
            mean: d["mean"].as_f64(),
            p50: d["p50"].as_f64(),
            p90: d["p90"].as_f64(),
            exact: ok,
        });
    }
    // Everything released was decrypted; everything else was withheld by the aggregation
    // server (never exported) or held back by the design server; nothing quarantined.
    exact &= expected.len() == decrypted.len();
    let held_back = report["held_back"].as_array().map_or(0, Vec::len)
        + report["withheld_sums"].as_u64().unwrap_or(0) as usize;
    exact &= held_back == pairs.len() - expected.len();
    exact &= report["quarantined"].as_array().is_some_and(Vec::is_empty);

    // Admission: every counted report came with a token, spent once.
    let counted_reports = counted.iter().filter(|c| **c).count();
    let mut spent_rows = 0usize;
    store.scan(&[Table::Spent], &mut |_, _, _| {
        spent_rows += 1;
        Ok(())
    })?;
    let admission = Admission::of(
        issuer_listen,
        &issuer_status,
        (tokens_fetched, partition_warnings),
        [&exported, &agg_status, &report],
        (counted_reports, spent_rows),
    );
    let evidence = Evidence::of(
        &evidence_run.listen,
        &evidence_status,
        &exported,
        &evidence_written,
        &audited,
    );
    Ok(Outcome {
        html,
        source: source.to_string(),
        workload,
        replayers: replayers.len(),
        agents: hosts.len(),
        key_list_agents,
        popular: trace_name(&popular),
        alone: alone.iter().map(|t| trace_name(t)).collect(),
        windows: status.windows,
        launches: status.launches,
        samples: status.pipeline.samples,
        sealed: records.len(),
        counted: counted_reports,
        report_bytes: report_frame_len(&public)?,
        classes: state.tables().class_count(),
        decrypted: decrypted.len(),
        held_back,
        alone_counted,
        alone_decrypted,
        exact,
        admission,
        evidence,
        rows,
        killed,
        seconds,
        tor: tor_figures,
        joints,
    })
}

/// Checks one decrypted joint view of the design server's report (`d`, its JSON) against the
/// raw (x, y) values the agents recorded for the reports in it: as many values as samples,
/// and in each quadrant as many values, and the same share, as the design server found in the
/// decrypted grid. The values are compared with the split the report names directly (`x >=
/// split`), not through the catalogue's binning, so a cell put on the wrong side of an edge
/// anywhere from the agent to the design server shows.
fn check_joint(class: u32, d: &serde_json::Value, values: &[[f64; 2]]) -> JointCheck {
    let j = &d["joint"];
    let split = |axis: &str| j[axis]["split"].as_f64().unwrap_or(f64::NAN);
    let (sx, sy) = (split("x"), split("y"));
    let mut counted = [0u64; 4];
    // Kernel time per quadrant, where an axis is a duration.
    let duration_axis = match (j["x"]["unit"].as_str(), j["y"]["unit"].as_str()) {
        (Some("ns"), _) => Some(0),
        (_, Some("ns")) => Some(1),
        _ => None,
    };
    let mut time = [0f64; 4];
    for &[x, y] in values {
        let q = usize::from(x >= sx) + 2 * usize::from(y >= sy);
        counted[q] += 1;
        if let Some(axis) = duration_axis {
            time[q] += [x, y][axis];
        }
    }
    let all_time: f64 = time.iter().sum();
    let total = values.len() as u64;
    let mut quadrants = Vec::new();
    let mut from_grid = Vec::new();
    let mut exact = total == d["samples"].as_u64().unwrap_or(u64::MAX) && total > 0;
    for (i, q) in j["quadrants"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let samples = q["samples"].as_u64().unwrap_or(u64::MAX);
        from_grid.push(samples);
        let share = q["share"].as_f64().unwrap_or(f64::NAN);
        let from_values = counted.get(i).copied().unwrap_or(u64::MAX);
        let at = (q["x_high"].as_bool(), q["y_high"].as_bool());
        exact &= at == (Some(i % 2 == 1), Some(i >= 2));
        // Counts exactly; the share up to the last bit, which serde_json's float parsing
        // (without its float_roundtrip feature) may not give back.
        let expected_share = from_values as f64 / total.max(1) as f64;
        exact &= samples == from_values && (share - expected_share).abs() <= 1e-12;
        // The share of kernel time the raw durations give lies within the bounds the design
        // server derived from the cell edges.
        if duration_axis.is_some() {
            let truth = time.get(i).copied().unwrap_or(f64::NAN) / all_time;
            let bound = |name: &str| q["time_share"][name].as_f64().unwrap_or(f64::NAN);
            exact &= bound("low") <= truth + 1e-12 && truth <= bound("high") + 1e-12;
        }
        quadrants.push(JointQuadrant {
            describe: format!(
                "{} {} {} and {} {} {}",
                j["x"]["counter"].as_str().unwrap_or("?"),
                if i % 2 == 1 { ">=" } else { "<" },
                with_unit(sx, j["x"]["unit"].as_str().unwrap_or("")),
                j["y"]["counter"].as_str().unwrap_or("?"),
                if i >= 2 { ">=" } else { "<" },
                with_unit(sy, j["y"]["unit"].as_str().unwrap_or("")),
            ),
            share,
            time_share: q["time_share"]["estimate"].as_f64(),
        });
    }
    exact &= quadrants.len() == 4;
    JointCheck {
        class,
        view: d["name"].as_str().unwrap_or("?").to_string(),
        samples: total,
        quadrants,
        from_grid,
        from_values: counted.to_vec(),
        exact,
    }
}

/// The private Tor network of a `--tor` run.
struct TorRun {
    net: TorNetwork,
    started: Instant,
    /// Seconds from `started` until it was usable.
    ready_seconds: f64,
}

/// `Udp: InDatagrams` of this thread's network namespace.
fn udp_datagrams() -> Result<u64> {
    let path = "/proc/thread-self/net/snmp";
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let mut udp = text.lines().filter(|l| l.starts_with("Udp: "));
    let (names, values) = (udp.next(), udp.next());
    let (Some(names), Some(values)) = (names, values) else {
        bail!("no Udp lines in {path}");
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(name, _)| *name == "InDatagrams")
        .and_then(|(_, value)| value.parse().ok())
        .with_context(|| format!("no Udp InDatagrams in {path}"))
}

/// Records every established TCP connection on one of `ports` (127.0.0.1) in this thread's
/// namespace now, with who holds its other end (`penrose_tornet::ExitFinder::holder_of`): an
/// exit by nickname, "none" (a process that is not an exit), or "closed before the lookup".
fn sample_stream_connections(
    exits: &penrose_tornet::ExitFinder,
    ports: &[u16],
    seen: &mut HashMap<(u16, std::net::SocketAddr), String>,
) -> Result<()> {
    for (local, peer) in penrose_tornet::connections_to(ports)? {
        if seen.contains_key(&(local.port(), peer)) {
            continue;
        }
        let owner = match exits.holder_of(peer, local)? {
            penrose_tornet::Holder::Exit(exit) => exit.to_string(),
            penrose_tornet::Holder::Other => "none".to_string(),
            penrose_tornet::Holder::Gone => "closed before the lookup".to_string(),
        };
        seen.insert((local.port(), peer), owner);
    }
    Ok(())
}

/// The aggregation server's metrics page (Prometheus text), from its `--metrics` address.
fn fetch_metrics(addr: &str) -> Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)
        .with_context(|| format!("connecting to the metrics page on {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut page = String::new();
    stream.read_to_string(&mut page)?;
    Ok(page)
}

/// The value of the sample `name` (with its labels, as written) on a metrics page.
fn metric(page: &str, name: &str) -> Result<u64> {
    page.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .with_context(|| format!("no {name} on the aggregation server's metrics page"))
}

/// One host of the demo's fleet.
struct Host {
    state: PathBuf,
    config: PathBuf,
    log: PathBuf,
    folder: PathBuf,
    alone: bool,
    child: usize,
}

/// The popular application and up to two others, each run by one host. Each agent replays
/// its trace in windows of L = 2,000 launches of the looping sequence, and an application
/// whose windows look alike to the fingerprint forms one class at the aggregator: so the
/// traces with one process are ranked by the least similarity of their windows to the first,
/// and the steadiest is the popular one. (Applications whose windows alternate between
/// phases split into several classes today; healing them is the kernel-identity issue's.)
fn choose_applications(folder: &Path) -> Result<(PathBuf, Vec<PathBuf>)> {
    const WINDOW: usize = 2_000;
    let fingerprinter = Fingerprinter::new(FingerprintParams::default())?;
    let mut ranked = Vec::new();
    for file in penrose_traces::TraceFolder::open(folder)?.files() {
        let trace = penrose_traces::read_trace(file)?;
        let sequences = trace.process_sequences();
        let Some(sequence) = sequences.values().next().filter(|_| sequences.len() == 1) else {
            continue;
        };
        let windows: Vec<_> = (0..6)
            .map(|w| {
                let names: Vec<&str> = sequence
                    .iter()
                    .cycle()
                    .skip(w * WINDOW)
                    .take(WINDOW)
                    .map(|k| &*k.name)
                    .collect();
                fingerprinter.snippet_hash(&names)
            })
            .collect();
        let steadiness = windows
            .iter()
            .map(|w| fingerprinter.similarity(&windows[0], w))
            .fold(f64::INFINITY, f64::min);
        ranked.push((steadiness, file.clone()));
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut files = ranked.into_iter().map(|(_, f)| f);
    let popular = files
        .next()
        .context("no trace with a single process to run")?;
    Ok((popular, files.take(2).collect()))
}

fn trace_name(path: &Path) -> String {
    penrose_traces::job_name(path)
}

/// The issuer's state directory in a demo run's directory.
pub fn issuer_state(dir: &Path) -> PathBuf {
    dir.join("issuer")
}

/// What a run's export wrote: the bundle and its evidence file, with what each command said.
struct Exported {
    bundle: PathBuf,
    json: serde_json::Value,
    evidence: PathBuf,
    evidence_json: serde_json::Value,
}

/// Closes the open epoch, exports bundle 1 while serving and writes its contributor evidence
/// (`export-evidence`, written by the server), in `dir`.
fn close_and_export(bin: &Path, agg: &DataDir, dir: &Path) -> Result<Exported> {
    let admin = |command: &str| {
        let mut cmd = Command::new(bin);
        cmd.arg(command).arg("-d").arg(agg.path());
        cmd
    };
    output(&mut admin("close-epoch"), "penrose-aggregator close-epoch")?;
    let bundle = dir.join("0001.bundle");
    let json = serde_json::from_str(&output(
        admin("export").arg("--out").arg(&bundle).arg("--json"),
        "penrose-aggregator export",
    )?)?;
    let evidence = dir.join("0001.evidence");
    let evidence_json = serde_json::from_str(&output(
        admin("export-evidence")
            .args(["--seq", "1", "--out"])
            .arg(&evidence)
            .arg("--json"),
        "penrose-aggregator export-evidence",
    )?)?;
    Ok(Exported {
        bundle,
        json,
        evidence,
        evidence_json,
    })
}

/// The design server imports the bundle (pinning the aggregation server's key) and keeps its
/// evidence beside it.
fn import_into_design(
    bin: &Path,
    archive: &Path,
    agg: &DataDir,
    bundle: &Path,
    evidence: &Path,
) -> Result<()> {
    output(
        Command::new(bin)
            .arg("import")
            .arg("--archive")
            .arg(archive)
            .arg("--signer")
            .arg(agg.signing_key().with_extension("key.pub"))
            .arg(bundle),
        "penrose-design import",
    )?;
    output(
        Command::new(bin)
            .arg("import-evidence")
            .arg("--archive")
            .arg(archive)
            .arg(evidence),
        "penrose-design import-evidence",
    )?;
    Ok(())
}

/// What the release auditor's part of a run works with: the dealer's key folder, the
/// aggregation server's data directory (its signing key), the design server's archive and the
/// evidence issuer's key ring.
struct AuditorParts<'a> {
    keys: &'a Path,
    agg: &'a DataDir,
    archive: &'a Path,
    evidence_ring: &'a Path,
}

/// What the release auditor did.
struct Audited {
    /// As said on screen.
    said: String,
    /// Partial decryptions it gave, and sums it withheld, per `penrose-design audit`.
    partials: u64,
    /// See `partials`.
    withheld: u64,
    /// Evidence tokens it counted (its `status`).
    tokens_counted: u64,
    /// Evidence rows the aggregation server deleted once the auditor had answered.
    rows_forgotten: u64,
}

/// The release auditor's part of a run: set up and started as its own process
/// ([`start_auditor`]) with the evidence issuer's key ring, so that it counts contributors
/// itself, asked by the design server for its partial decryptions of the archive
/// (`penrose-design audit`, pinning its certificate, forwarding each page's evidence),
/// stopped.
fn release_auditor(
    options: &Options,
    dir: &Path,
    parts: &AuditorParts<'_>,
    children: &mut Children,
) -> Result<Audited> {
    let bin = |name: &str| options.bins.join(name);
    let (child, address, certificate) =
        start_auditor(&bin("penrose-auditor"), dir, parts, options.threshold)?;
    let index = children.push("penrose-auditor", child);
    let audited: serde_json::Value = serde_json::from_str(&output(
        Command::new(bin("penrose-design"))
            .arg("audit")
            .arg("--archive")
            .arg(parts.archive)
            .args(["--auditor", &address])
            .arg("--auditor-cert")
            .arg(&certificate)
            .arg("--json"),
        "penrose-design audit",
    )?)?;
    children.stop(index, Duration::from_secs(10))?;
    let status: penrose_auditor::AuditorStatus = serde_json::from_str(&output(
        Command::new(bin("penrose-auditor"))
            .arg("status")
            .arg("--data")
            .arg(dir.join("auditor"))
            .arg("--json"),
        "penrose-auditor status",
    )?)?;
    let (partials, withheld) = (
        audited["partials"].as_u64().unwrap_or(0),
        audited["withheld"].as_u64().unwrap_or(0),
    );
    Ok(Audited {
        said: format!(
            "release auditor: on {address} as its own process, counting contributors from \
             evidence ({} tokens counted); {partials} partial decryptions given, {withheld} sums \
             withheld under its own k = {}",
            status.tokens_counted, options.threshold
        ),
        partials,
        withheld,
        tokens_counted: status.tokens_counted,
        rows_forgotten: 0,
    })
}

/// Sets up the release auditor (`penrose-auditor init` with the auditor's share, the
/// aggregation server's signing key and the run's threshold) in `dir/auditor` and starts it
/// on a free loopback port, its log in `dir/auditor.log`: the child, its address and the
/// certificate the design server pins.
fn start_auditor(
    bin: &Path,
    dir: &Path,
    parts: &AuditorParts<'_>,
    threshold: u64,
) -> Result<(Child, String, PathBuf)> {
    let (keys, agg) = (parts.keys, parts.agg);
    let data = dir.join("auditor");
    output(
        Command::new(bin)
            .arg("init")
            .arg("--data")
            .arg(&data)
            .arg("--share")
            .arg(keys.join("auditor.share"))
            .arg("--public-key")
            .arg(keys.join("public.key"))
            .arg("--verification-key")
            .arg(keys.join("verification.key"))
            .arg("--aggregator-key")
            .arg(agg.signing_key().with_extension("key.pub"))
            .args(["--threshold", &threshold.to_string()]),
        "penrose-auditor init",
    )?;
    // The dealer's copy goes once the auditor holds it.
    std::fs::remove_file(keys.join("auditor.share"))?;
    // Its party's token key ring: with it, the auditor counts every sum's contributors from
    // the evidence tokens the agents spent (0600, as the issuer exported it).
    std::fs::copy(parts.evidence_ring, data.join("evidence-keys"))?;
    std::fs::set_permissions(
        data.join("evidence-keys"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )?;
    let log = std::fs::File::create(dir.join("auditor.log"))?;
    let mut child = Command::new(bin)
        .arg("serve")
        .arg("--data")
        .arg(&data)
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .context("starting penrose-auditor serve")?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("auditor stdout")?).read_line(&mut line)?;
    let ready: serde_json::Value = match serde_json::from_str(&line) {
        Ok(ready) => ready,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e).with_context(|| format!("the auditor's first line: {line:?}"));
        }
    };
    let listening = ready["listening"].as_str().context("auditor address")?;
    let certificate = ready["certificate"]
        .as_str()
        .context("auditor certificate")?;
    Ok((child, listening.to_string(), PathBuf::from(certificate)))
}

/// Where one issuer of a run keeps its state, writes its hosts' credentials, exports its
/// key ring and logs.
struct IssuerPaths {
    state: PathBuf,
    credentials: PathBuf,
    ring: PathBuf,
    log: PathBuf,
}

/// One issuer, set up and serving.
struct IssuerRun {
    child: Child,
    /// Its QUIC address.
    listen: String,
    /// Its certificate.
    cert: PathBuf,
    /// Its stream port (for Tor), or empty.
    stream: String,
    /// One credential file per host.
    credentials: Vec<PathBuf>,
    /// What `export-keys --json` said.
    exported: serde_json::Value,
}

/// `penrose-issuer init`, `enrol` (one credential per host), `export-keys` and `serve`.
fn set_up_issuer(
    bin: &Path,
    paths: &IssuerPaths,
    host_count: usize,
    tor: bool,
) -> Result<IssuerRun> {
    let cmd = |command: &str| {
        let mut cmd = Command::new(bin);
        cmd.arg(command).arg("--state").arg(&paths.state);
        cmd
    };
    output(&mut cmd("init"), "penrose-issuer init")?;
    let enrolled: Vec<serde_json::Value> = serde_json::from_str(&output(
        cmd("enrol")
            .args(["--count", &host_count.to_string(), "--out-dir"])
            .arg(&paths.credentials)
            .arg("--json"),
        "penrose-issuer enrol",
    )?)?;
    let credentials: Vec<PathBuf> = enrolled
        .iter()
        .map(|e| e["file"].as_str().map(PathBuf::from))
        .collect::<Option<_>>()
        .context("a credential file in penrose-issuer enrol's output")?;
    ensure!(
        credentials.len() == host_count,
        "penrose-issuer enrol wrote {} credentials for {host_count} hosts",
        credentials.len()
    );
    let exported: serde_json::Value = serde_json::from_str(&output(
        cmd("export-keys")
            .arg("--out")
            .arg(&paths.ring)
            .arg("--json"),
        "penrose-issuer export-keys",
    )?)?;
    let (child, ready) = start_issuer(bin, &paths.state, &paths.log, tor)?;
    let field = |name: &str| ready[name].as_str().map(str::to_string);
    let listen = field("listening").context("the issuer's listening address")?;
    let cert = PathBuf::from(field("certificate").context("the issuer's certificate")?);
    let stream = match tor {
        true => field("stream_listening").context("the issuer's stream port (--stream-listen)")?,
        false => String::new(),
    };
    Ok(IssuerRun {
        child,
        listen,
        cert,
        stream,
        credentials,
        exported,
    })
}

/// Starts `penrose-issuer serve` on a free loopback port (and a stream port, for Tor, with
/// `stream`), its log in `log`, and returns it with the JSON line it printed (`listening`,
/// `stream_listening`, `certificate`, ...).
fn start_issuer(
    bin: &Path,
    state: &Path,
    log_path: &Path,
    stream: bool,
) -> Result<(Child, serde_json::Value)> {
    let log = std::fs::File::create(log_path)?;
    let mut cmd = Command::new(bin);
    cmd.arg("serve")
        .arg("--state")
        .arg(state)
        .args(["--listen", "127.0.0.1:0"]);
    if stream {
        cmd.args(["--stream-listen", "127.0.0.1:0"]);
    }
    let mut issuer = cmd
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .context("starting penrose-issuer serve")?;
    let mut line = String::new();
    BufReader::new(issuer.stdout.take().context("issuer stdout")?).read_line(&mut line)?;
    match serde_json::from_str(&line) {
        Ok(ready) => Ok((issuer, ready)),
        Err(e) => {
            let _ = issuer.kill();
            let _ = issuer.wait();
            Err(e).with_context(|| {
                format!(
                    "the issuer's first line: {line:?}; see {}",
                    log_path.display()
                )
            })
        }
    }
}

/// Starts `penrose-agent run`, its log appended to `log`.
fn start_agent(bin: &Path, config: &Path, log: &Path) -> Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    Command::new(bin)
        .arg("run")
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting penrose-agent run")
}

/// Bytes of one report frame under `key`, as the wire encoder writes it (every report has the
/// same size: the format and the key size fix it).
/// Bytes of one report frame as the demo's agents send it: with its admission token.
fn report_frame_len(key: &PublicKey) -> Result<usize> {
    let packed = key.encrypt_packed(&[0u32; BIN_COUNT], &mut rand::rng())?;
    let count = packed.ciphertexts().len();
    let report = Report {
        key_id: key.key_id(),
        report_id: ReportId([0; 16]),
        snippet: SnippetHash([0; 32]),
        locator: penrose_core::fingerprint::Locator([0; penrose_core::fingerprint::LOCATOR_BANDS]),
        arch: penrose_core::gpu::GpuArch::new(9, 0),
        counter: CounterId(0),
        catalogue: CatalogueVersion(1),
        day: Day(0),
        samples: SampleCount(1),
        ciphertexts: PackedBytes::new(packed.to_bytes(), count)?,
        token: Some(AdmissionToken([0; ADMISSION_TOKEN_BYTES])),
        evidence: None,
    };
    Ok(Message::Report(report).to_frame()?.len())
}

/// An agent's status file, as the agent's own type (`penrose_agent::status::AgentStatus`);
/// `None` until the agent has written one.
fn read_status(state_dir: &Path) -> Option<AgentStatus> {
    AgentStatus::read(state_dir).ok()
}

fn wait_for(limit: Duration, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + limit;
    while !done()? {
        ensure!(Instant::now() < deadline, "timed out after {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Three synthetic applications as profiler traces, each a loop over its own kernels with
/// trace-like per-kernel fields, for machines without the real traces.
fn write_synthetic_traces(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed);
    for app in 0..3 {
        let vocabulary: Vec<String> = (0..40)
            .map(|k| format!("synthetic_app{app}_kernel_{k}"))
            .collect();
        let iteration: Vec<usize> = (0..300)
            .map(|_| rng.random_range(0..vocabulary.len()))
            .collect();
        let mut events = Vec::new();
        let mut ts = 0.0f64;
        for (correlation, &k) in iteration.iter().cycle().take(6_000).enumerate() {
            let dur = rng.random_range(2.0..2_000.0f64);
            events.push(serde_json::json!({
                "ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                "pid": 100 + app, "tid": 1, "ts": ts, "dur": 3.0,
                "args": {"correlation": correlation},
            }));
            events.push(serde_json::json!({
                "ph": "X", "cat": "kernel", "name": vocabulary[k],
                "pid": 0, "tid": 7, "ts": ts + 5.0, "dur": dur,
                "args": {
                    "correlation": correlation, "stream": 7, "device": 0,
                    "grid": [rng.random_range(1..1024u32), 1, 1], "block": [128, 1, 1],
                    "registers per thread": rng.random_range(16..128u32),
                    "shared memory": rng.random_range(0..49_152u32),
                    "est. achieved occupancy %": rng.random_range(5.0..100.0f64),
                    "blocks per SM": rng.random_range(0.1..64.0f64),
                },
            }));
            ts += 50.0;
        }
        let doc = serde_json::json!({ "traceEvents": events });
        std::fs::write(
            dir.join(format!("synthetic-app{app}.json")),
            doc.to_string(),
        )?;
    }
    Ok(())
}

fn print_outcome(o: &Outcome, threshold: u64) {
    println!();
    println!(
        "{:>5}  {:<22} {:>7} {:>7} {:>8}  {:>12} {:>12} {:>12}  exact",
        "class", "counter", "reports", "owners", "samples", "mean", "p50", "p90"
    );
    for r in &o.rows {
        let value = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| with_unit(v, &r.unit));
        println!(
            "{:>5}  {:<22} {:>7} {:>6}+ {:>8}  {:>12} {:>12} {:>12}  {}",
            r.class,
            r.counter,
            r.reports,
            r.contributors,
            r.samples,
            value(r.mean),
            value(r.p50),
            value(r.p90),
            if r.exact { "yes" } else { "NO" }
        );
    }
    println!();
    println!("workload: {}", o.workload);
    println!(
        "fleet: {} agents; {} ran on every popular host, {} each on one host alone.",
        o.agents,
        o.popular,
        o.alone.join(" and ")
    );
    println!(
        "host 0 ({} source{}): {} windows, {} launches, {} samples. All agents: {} histograms \
         sealed and encrypted, {} counted by the aggregation server; a report (with its token) is {} bytes \
         on the wire.",
        o.source,
        if o.replayers > 0 {
            format!(
                ", {} replayer processes on the stand-in libcuda",
                o.replayers
            )
        } else {
            String::new()
        },
        o.windows,
        o.launches,
        o.samples,
        o.sealed,
        o.counted,
        o.report_bytes
    );
    println!(
        "aggregation server: {} classes, one epoch closed and released. design server: {} \
         (class, counter) aggregates decrypted, {} held back under k = {threshold} contributors \
         (counted as reports / 24, rounded up).",
        o.classes, o.decrypted, o.held_back
    );
    let a = &o.admission;
    println!(
        "admission: token issuer on {}, {} credentials enrolled (one per host); {} tokens issued \
         ({} received by the agents), {} verified by the aggregation server{}; of the {} reports \
         of the released epoch {} were admitted with a token, each spent once ({} rows in the \
         spent table); contributor bound enforced by admission tokens: {}; partition warnings: \
         {}.",
        a.issuer,
        a.enrolled,
        a.tokens_issued,
        a.tokens_fetched,
        a.tokens_verified,
        if o.killed.iter().any(|k| k == "penrose-aggregator") {
            " since its restart"
        } else {
            ""
        },
        a.epoch_reports,
        a.reports_with_tokens,
        a.spent_rows,
        if a.bound_enforced_by_tokens {
            "yes"
        } else {
            "NO"
        },
        a.partition_warnings,
    );
    let e = &o.evidence;
    println!(
        "contributor evidence: the release auditor's party's issuer on {} issued {} tokens; the \
         bundle's {} released sums list {} reports, {} with an evidence token; the auditor \
         counted {} tokens and gave {} partials ({} withheld), after which the server deleted \
         {} evidence rows: {}.",
        e.issuer,
        e.tokens_issued,
        e.entries,
        e.reports_listed,
        e.reports_with_tokens,
        e.tokens_counted,
        e.partials,
        e.withheld,
        e.rows_forgotten,
        if e.counted {
            "every released sum counted from evidence"
        } else {
            "NOT every sum counted from evidence"
        },
    );
    println!(
        "design key list: {} of {} agents fetched the design server's signed list from the \
         aggregation server and verified it under the list-signing key they pin.",
        o.key_list_agents, o.agents
    );
    println!(
        "reports of the hosts that ran an application alone: {} counted, {} decrypted.",
        o.alone_counted, o.alone_decrypted
    );
    println!(
        "every decrypted aggregate equals the agents' sealed histograms bin for bin, and nothing \
         under k contributors was decrypted: {}",
        if o.exact { "yes" } else { "NO" }
    );
    println!(
        "every report the aggregation server counted was admitted by an admission token: {}",
        if a.admitted { "yes" } else { "NO" }
    );
    for j in &o.joints {
        println!(
            "joint view {} of class {} ({} samples): quadrant shares from the decrypted grid \
             equal those counted from the agents' raw values: {}",
            j.view,
            j.class,
            j.samples,
            if j.exact { "yes" } else { "NO" }
        );
        for q in &j.quadrants {
            let time = q.time_share.map_or(String::new(), |t| {
                format!(", {:.1}% of kernel time", t * 100.0)
            });
            println!(
                "    {}: {:.1}% of samples{time}",
                q.describe,
                q.share * 100.0
            );
        }
    }
    if let Some(t) = &o.tor {
        print_tor(t);
    }
    println!(
        "the architects' page of this run: {} (one file; the run's directory is removed at \
         the end unless --keep is given)",
        o.html.display()
    );
    for (stage, s) in &o.seconds {
        println!("  {stage:<38} {s:>7.2} s");
    }
}

fn print_tor(t: &TorFigures) {
    let yes = |b: bool| if b { "yes" } else { "NO" };
    let carrier = |outcome: &str| t.carrier_streams.get(outcome).copied().unwrap_or(0);
    println!(
        "tor: the private network (in {}) was usable {:.1} s after it started; {} reports were \
         acked over Tor; the agents opened {} Tor streams (one per upload attempt and per token \
         fetch), {} attempts failed.",
        t.network_dir.display(),
        t.ready_seconds,
        t.reports,
        t.streams,
        t.stream_failures,
    );
    println!(
        "tor: distinct circuits among each agent's last streams (distinct/streams): {}; a \
         circuit of its own for every stream: {}.",
        t.circuits
            .iter()
            .map(|c| format!("{}/{}", c.distinct, c.recent))
            .collect::<Vec<_>>()
            .join(" "),
        yes(t.isolated),
    );
    println!(
        "tor: the aggregation server's metrics: penrose_transport_carrier_streams_total \
         accepted {}, idle {}, refused {}, malformed {}; QUIC connections accepted in all {} \
         (none without a stream: {}). UDP datagrams received in the demo's network namespace \
         while the agents ran: {}.",
        carrier("accepted"),
        carrier("idle"),
        carrier("refused_server_full"),
        carrier("malformed"),
        t.connections_accepted,
        yes(t.connections_accepted <= carrier("accepted")),
        t.udp_datagrams,
    );
    println!(
        "tor: connections seen open on the servers' stream ports (sampled every 250 ms), by the \
         exit holding their other end: {}.",
        if t.sampled_connections.is_empty() {
            "none seen".to_string()
        } else {
            t.sampled_connections
                .iter()
                .map(|(exit, n)| format!("{exit} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    println!(
        "tor: every tor process the demo started was stopped: {}; everything went over Tor: {}",
        yes(t.stopped),
        yes(t.over_tor()),
    );
}

/// A value with its unit, scaled to read at a glance (durations in s/ms/µs, sizes in KiB/MiB).
fn with_unit(v: f64, unit: &str) -> String {
    let scales: &[(f64, &str)] = match unit {
        "ns" => &[(1e9, "s"), (1e6, "ms"), (1e3, "µs"), (1.0, "ns")],
        "B" => &[(1_048_576.0, "MiB"), (1024.0, "KiB"), (1.0, "B")],
        other => return format!("{v:.1}{other}"),
    };
    let (div, name) = scales
        .iter()
        .find(|(div, _)| v.abs() >= *div)
        .or(scales.last())
        .copied()
        .unwrap_or((1.0, unit));
    format!("{:.1} {name}", v / div)
}

/// Where the counted reports of one (class, architecture, counter) came from.
#[derive(Debug, Default)]
struct Origins {
    /// From hosts that ran their application alone.
    alone: u64,
    /// From the others.
    shared: u64,
}

/// The lone hosts' reports inside what the design server decrypted: those of every
/// (class, architecture, counter) it decrypted that only lone hosts fed. Read from the design
/// server's output, so that a design server that decrypted a lone application's sum makes the
/// demo fail.
fn lone_reports_decrypted(
    origins: &HashMap<(u32, String, u16), Origins>,
    decrypted: &[serde_json::Value],
) -> usize {
    decrypted
        .iter()
        .filter_map(|d| {
            let class = u32::try_from(d["class"].as_u64()?).ok()?;
            let counter = u16::try_from(d["counter"].as_u64()?).ok()?;
            let arch = d["arch"].as_str()?.to_string();
            origins.get(&(class, arch, counter))
        })
        .filter(|o| o.shared == 0)
        .map(|o| o.alone as usize)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decrypted_lone_application_is_seen_in_the_design_servers_output() {
        let mut origins = HashMap::new();
        origins.insert(
            (7, "sm_90".to_string(), 3),
            Origins {
                alone: 12,
                shared: 0,
            },
        );
        origins.insert(
            (8, "sm_90".to_string(), 3),
            Origins {
                alone: 5,
                shared: 400,
            },
        );
        origins.insert(
            (9, "sm_90".to_string(), 3),
            Origins {
                alone: 0,
                shared: 400,
            },
        );
        let row = |class: u32, arch: &str| serde_json::json!({"class": class, "arch": arch, "counter": 3, "reports": 1});
        // The popular classes only (one of which a lone host also fed): nothing lone.
        assert_eq!(
            lone_reports_decrypted(&origins, &[row(8, "sm_90"), row(9, "sm_90")]),
            0
        );
        // A design server that decrypted the lone class: its 12 reports.
        assert_eq!(
            lone_reports_decrypted(&origins, &[row(9, "sm_90"), row(7, "sm_90")]),
            12
        );
        // The same class under another architecture is another sum.
        assert_eq!(lone_reports_decrypted(&origins, &[row(7, "sm_80")]), 0);
    }

    /// The binaries `cargo test --workspace` built next to this test.
    fn test_bins() -> Option<PathBuf> {
        let exe = std::env::current_exe().ok()?;
        let dir = exe.parent()?.parent()?.to_path_buf();
        dir.join("penrose-agent").exists().then_some(dir)
    }

    /// The whole system as processes: agent -> aggregation server -> export -> design server,
    /// and every decrypted aggregate equals the agent's sealed histograms bin for bin. As root
    /// the agent probes the stand-in with eBPF under replayer processes.
    #[test]
    fn end_to_end_the_decrypted_aggregates_are_exactly_what_the_agent_sealed() {
        end_to_end(is_root(), false);
    }

    /// The same with the trace-replay source, the path a plain user's demo takes.
    #[test]
    fn end_to_end_with_the_trace_replay_source() {
        end_to_end(false, false);
    }

    /// The agent and then the aggregation server are killed with SIGKILL mid-run and
    /// restarted: the agent resends what it had spooled, the aggregator counts each report
    /// once, and the decrypted sums are still exactly what the agent sealed and the aggregator
    /// acknowledged.
    #[test]
    fn end_to_end_survives_killing_the_agent_and_the_aggregator() {
        end_to_end(false, true);
    }

    /// One end-to-end run at a time: each starts a server, an agent and replayers, and on a
    /// 2-core machine three at once would measure the scheduler rather than the system.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn end_to_end(ebpf: bool, faults: bool) {
        let _turn = ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(bins) = test_bins() else {
            // On the real stderr: libtest captures eprintln! of a passing test, and CI counts
            // SKIPPED lines (ci/test.sh).
            {
                use std::io::Write as _;
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: the workspace's binaries are not built next to this test \
                 (cargo test --workspace builds them)"
                );
            }
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let options = Options {
            bins,
            traces: default_traces(),
            capture: Duration::from_secs(15),
            threshold: 10,
            agents: 12,
            ebpf,
            quiet: true,
            faults,
            tor: false,
        };
        let outcome = run_demo(&options, dir.path()).unwrap();
        eprintln!(
            "end to end ({}): {} sealed, {} counted, {} classes, {} decrypted, {} held back",
            outcome.source,
            outcome.sealed,
            outcome.counted,
            outcome.classes,
            outcome.decrypted,
            outcome.held_back
        );
        assert!(outcome.counted > 0, "{outcome:?}");
        assert!(outcome.decrypted > 0, "{outcome:?}");
        assert!(outcome.alone_counted > 0, "{outcome:?}");
        assert_eq!(outcome.alone_decrypted, 0, "{outcome:?}");
        assert!(outcome.exact, "{outcome:?}");
        // Joint views: decrypted, and split into quadrants exactly as the raw values fall.
        assert!(!outcome.joints.is_empty(), "{outcome:?}");
        assert!(
            outcome.joints.iter().all(|j| j.exact),
            "{:?}",
            outcome.joints
        );
        if faults {
            assert_eq!(outcome.killed, ["penrose-agent", "penrose-aggregator"]);
        }
        // Every counted report came with a token, spent once: the bundle and the design
        // server's report say so, and the aggregator's Spent table holds one row per counted
        // report.
        let a = &outcome.admission;
        assert!(a.admitted, "{outcome:?}");
        assert_eq!(a.spent_rows, outcome.counted, "{outcome:?}");
        assert_eq!(a.reports_with_tokens, outcome.counted as u64, "{outcome:?}");
        assert!(a.bound_enforced_by_tokens, "{outcome:?}");
        assert_eq!(a.enrolled, outcome.agents as u64, "{outcome:?}");
        assert!(a.tokens_issued >= outcome.counted as u64, "{outcome:?}");
        assert_eq!(a.partition_warnings, 0, "{outcome:?}");
        // The auditor counted every released sum's contributors from the evidence tokens of
        // its own party's issuer, every counted report's among them.
        let e = &outcome.evidence;
        assert!(e.counted, "{e:?}");
        assert!(e.entries > 0 && e.partials == e.entries, "{e:?}");
        assert_eq!(e.tokens_counted, e.reports_listed, "{e:?}");
        assert!(e.tokens_issued >= e.tokens_counted, "{e:?}");
        assert_eq!(e.rows_forgotten, outcome.counted as u64, "{e:?}");
        the_issuers_and_the_aggregators_stored_bytes_share_no_value(dir.path(), &outcome);
    }

    /// Bytes of a stored record compared, as in penrose-issuer/tests/unlinkable.rs: every run
    /// of this many bytes is looked for, not just whole values.
    const RUN: usize = 12;

    /// Every key and value of every column family of the issuer's store, each as one record
    /// named by its table.
    fn issuer_records(dir: &Path) -> Vec<(String, Vec<u8>)> {
        use penrose_issuer::store::{Store, Table};
        use penrose_kv::Table as _;
        let store = Store::open(&penrose_issuer::StateDir::new(issuer_state(dir)).db(), None)
            .expect("the issuer's store");
        let mut rows = Vec::new();
        store
            .scan(&Table::ALL, &mut |table, key, value| {
                rows.push((format!("issuer {} key", table.name()), key.to_vec()));
                rows.push((format!("issuer {} value", table.name()), value.to_vec()));
                Ok(())
            })
            .expect("scanning the issuer's store");
        rows
    }

    /// Every key and value of every column family of the aggregation server's store.
    fn aggregator_records(dir: &Path) -> Vec<(String, Vec<u8>)> {
        use penrose_kv::Table as _;
        let store = RocksStore::open(&DataDir::new(dir.join("aggregator")).db())
            .expect("the aggregator's store");
        let mut rows = Vec::new();
        store
            .scan(&Table::ALL, &mut |table, key, value| {
                rows.push((format!("aggregator {} key", table.name()), key.to_vec()));
                rows.push((format!("aggregator {} value", table.name()), value.to_vec()));
                Ok(())
            })
            .expect("scanning the aggregator's store");
        rows
    }

    /// The runs of [`RUN`] bytes that occur both in a record of `a` and in a record of `b`
    /// (which makes it symmetric: a run of an `a` record found in a `b` record is a run of
    /// that `b` record found in the `a` record), with where each was found.
    ///
    /// Excepted are runs of zero bytes only: the high bytes of small integers, which both
    /// stores hold in numbers (a drained rate bucket at the issuer is a level of 0 then a
    /// timestamp with 4 zero high bytes: 12 zero bytes; the aggregator's sums and counts have
    /// many) and which are no value of either tier. No other public value both tiers keep is
    /// as long as a run: day numbers are 4 bytes and counter ids 2 (in the issuer's issued
    /// keys and the aggregator's Spent, Seen and sum keys), and the one key name both stores
    /// use (`format`, in their meta tables) is 6.
    fn shared_runs(
        a: &[(String, Vec<u8>)],
        b: &[(String, Vec<u8>)],
    ) -> Vec<(String, String, [u8; RUN])> {
        let runs = |bytes: &[u8]| -> Vec<[u8; RUN]> {
            bytes
                .windows(RUN)
                .filter(|w| w.iter().any(|&x| x != 0))
                .map(|w| w.try_into().expect("a window of RUN bytes"))
                .collect()
        };
        let mut in_a: HashMap<[u8; RUN], &str> = HashMap::new();
        for (place, bytes) in a {
            for run in runs(bytes) {
                in_a.entry(run).or_insert(place);
            }
        }
        let mut shared = Vec::new();
        for (place, bytes) in b {
            for run in runs(bytes) {
                if let Some(found) = in_a.get(&run) {
                    shared.push((found.to_string(), place.clone(), run));
                }
            }
        }
        shared
    }

    /// Issue 11's cross-tier unlinkability, on the stored bytes of a real run: the issuer's
    /// record of an issuance (credentials, issued counts per (day, counter, credential), rate
    /// records, meta) and the aggregation server's record of a redemption (Spent rows, and
    /// every other table) share no value.
    fn the_issuers_and_the_aggregators_stored_bytes_share_no_value(dir: &Path, outcome: &Outcome) {
        let issuer = issuer_records(dir);
        let aggregator = aggregator_records(dir);
        // Not vacuous: the issuer recorded every host's credential and issuance, the
        // aggregator every report and its token.
        let count = |rows: &[(String, Vec<u8>)], place: &str| {
            rows.iter().filter(|(p, _)| p == place).count()
        };
        assert_eq!(count(&issuer, "issuer credentials key"), outcome.agents);
        assert!(count(&issuer, "issuer issued key") >= outcome.agents);
        assert_eq!(count(&aggregator, "aggregator spent key"), outcome.counted);
        let shared = shared_runs(&issuer, &aggregator);
        assert!(
            shared.is_empty(),
            "{} runs of {RUN} bytes in both stores, the first: {:?}",
            shared.len(),
            shared.first()
        );
    }

    /// The comparison finds a value the two stores share anywhere in their records (here a
    /// credential id planted in a Spent value), in either direction, and passes over runs of
    /// zero bytes only.
    #[test]
    fn shared_runs_finds_a_planted_value_and_passes_over_zero_bytes() {
        let id: Vec<u8> = (1..=32).collect();
        let issuer = vec![
            ("issuer credentials key".to_string(), id.clone()),
            ("issuer issued value".to_string(), vec![0; 16]),
        ];
        let mut value = vec![7u8; 5];
        value.extend_from_slice(&id[10..22]);
        value.extend_from_slice(&[0; 20]);
        let aggregator = vec![
            ("aggregator spent value".to_string(), value),
            ("aggregator ash value".to_string(), vec![0; 64]),
        ];
        let shared = shared_runs(&issuer, &aggregator);
        assert_eq!(shared.len(), 1, "{shared:?}");
        assert_eq!(shared[0].0, "issuer credentials key");
        assert_eq!(shared[0].1, "aggregator spent value");
        assert_eq!(shared[0].2.as_slice(), &id[10..22]);
        assert!(shared_runs(&aggregator, &issuer).len() == 1);
        assert!(shared_runs(&issuer, &aggregator[1..]).is_empty());
        // Only zeros are passed over: any other repeated byte is a value like any other.
        let sevens = |n| vec![("record".to_string(), vec![7u8; n])];
        assert_eq!(shared_runs(&sevens(12), &sevens(13)).len(), 2);
    }

    #[test]
    fn synthetic_traces_read_back_as_three_applications() {
        let dir = tempfile::tempdir().unwrap();
        write_synthetic_traces(dir.path()).unwrap();
        let folder = penrose_traces::TraceFolder::open(dir.path()).unwrap();
        assert_eq!(folder.files().len(), 3);
        for file in folder.files() {
            let trace = penrose_traces::read_trace(file).unwrap();
            assert_eq!(trace.kernels().len(), 6_000);
            assert!(
                trace
                    .kernels()
                    .iter()
                    .all(|k| k.est_achieved_occupancy_pct.is_some())
            );
        }
    }
}
