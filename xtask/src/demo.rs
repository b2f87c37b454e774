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
//! `run_demo` calls these steps in this order, each a function (in the modules below) that
//! returns what it started or produced, and reads every server's output into the server's
//! own type. It is also what the end-to-end tests run (see the tests below); they also check
//! that the issuer's stored bytes and the aggregation server's share no value.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use penrose_aggregator::config::DataDir;
use penrose_core::counters::{BIN_COUNT, CatalogueVersion, CounterId};
use penrose_core::fingerprint::SnippetHash;
use penrose_core::histogram::SampleCount;
use penrose_core::paillier::PublicKey;
use penrose_core::wire::{
    ADMISSION_TOKEN_BYTES, AdmissionToken, Day, Message, PackedBytes, Report, ReportId,
};

use penrose_agent::capture::loader::is_root;
use penrose_agent::status::AgentStatus;
use xtask::servers::{ServerKey, start_server, start_server_ready};
use xtask::workspace::{TEST_EQUIPMENT_FEATURES, newest_standin, target_dir, workspace_root};

mod applications;
mod capture;
mod check;
mod fleet;
mod issuers;
mod keys;
mod outcome;
mod print;
mod process;
mod release;
mod tor;
mod workload;

use applications::choose_applications;
use capture::{agent_figures, capture};
use check::check;
use fleet::{Servers, lay_out_hosts, start_fleet};
use issuers::start_issuers;
use keys::{DesignKeys, make_design_keys};
use outcome::{Finished, Outcome};
use print::print_outcome;
use process::{Bins, Children, Stages};
use release::{AuditorParts, close_epoch, decrypt};

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

impl Options {
    /// A progress line on stderr, unless quiet (`--json`).
    fn say(&self, msg: &str) {
        if !self.quiet {
            eprintln!("{msg}");
        }
    }

    /// The run `args` ask for, with the binaries in `bins`. eBPF needs root: without it,
    /// says that the agents replay the traces themselves.
    fn of(args: &Args, bins: PathBuf) -> Self {
        let root_user = is_root();
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
        if !root_user {
            options.say(
                "note: eBPF needs root, so the agent replays the traces itself in place of the \
                 probes",
            );
        }
        options
    }
}

/// Runs the task.
pub fn run(args: Args) -> Result<()> {
    ensure!(
        args.seconds.is_finite() && args.seconds > 0.0,
        "--seconds must be positive"
    );
    let root = workspace_root()?;
    let bins = match &args.bins {
        Some(bins) => bins.clone(),
        None => build_release_binaries(&args, &root)?,
    };
    let options = Options::of(&args, bins);
    let dir = tempfile::Builder::new().prefix("penrose-demo-").tempdir()?;
    let outcome = run_demo(&options, dir.path())?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&outcome)?);
    } else {
        print_outcome(&outcome, options.threshold);
    }
    if args.keep {
        let kept = dir.keep();
        options.say(&format!("kept {}", kept.display()));
    }
    check_outcome(&outcome, options.threshold)
}

/// `cargo build --release` of the binaries the demo runs, with the test equipment; their
/// folder.
fn build_release_binaries(args: &Args, root: &Path) -> Result<PathBuf> {
    if !args.json {
        eprintln!(
            "building the release binaries (agent, aggregator, token issuer, design server, \
             replayer)"
        );
    }
    let mut build = Command::new(env!("CARGO"));
    build
        .current_dir(root)
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
    Ok(target_dir(root).join("release"))
}

/// The demo fails unless the outcome is exact, every counted report was admitted by a token,
/// the auditor counted every released sum from evidence, something reached the threshold
/// and, with `--tor`, everything went over Tor.
fn check_outcome(outcome: &Outcome, threshold: u64) -> Result<()> {
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
        bail!("no aggregate reached the threshold of {threshold} contributors");
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

/// Runs the whole system once in `dir` and checks it: the steps of the module's
/// documentation, in order, each a function that returns what it started or produced.
pub fn run_demo(options: &Options, dir: &Path) -> Result<Outcome> {
    let bins = Bins::check(&options.bins)?;
    let run = (options, &bins, dir);
    let mut stages = Stages::default();
    let mut children = Children::default();
    let workload = workload::prepare(options, dir)?;
    let mut tor = tor::start(options, dir)?;
    let keys = make_design_keys(run, &mut stages)?;
    let apps = choose_applications(&workload.traces)?;
    let host_count = options.agents + apps.alone.len();
    let issuers = start_issuers(run, host_count, &mut children, &mut stages)?;
    let agg = start_aggregator(run, &keys, &issuers.admission.ring, &mut children)?;
    let arti_file = tor::wait_usable(tor.as_mut(), dir, &mut stages, options)?;
    let hosts = lay_out_hosts(options, dir, &apps)?;
    let lib = install_standin(options, dir)?;
    let servers = Servers::of(&keys, &issuers, &agg, (options.tor, &arti_file));
    let credentials = [
        &issuers.admission.credentials,
        &issuers.evidence.credentials,
    ];
    let fleet = start_fleet(
        (options, &bins),
        (hosts, lib),
        (&servers, credentials.map(Vec::as_slice)),
        &apps.popular,
        &mut children,
    )?;
    let tor_run = (&agg, issuers.admission.stream.as_str(), tor.as_ref());
    let captured = capture((options, &bins), &fleet, tor_run, &mut children)?;
    let mut agents = agent_figures(&fleet.hosts, &keys.public, options.tor)?;
    let statuses = issuers.stop(&bins, &mut children)?;
    stages.record("agents: capture and upload", captured.started);
    let host0 = read_status(&fleet.hosts[0].state).context("host 0's last status")?;
    let closed = close_epoch(
        (&bins, dir),
        &agg,
        (tor.as_mut(), &captured, agents.routes.take()),
        &mut children,
        &mut stages,
    )?;
    let parts = AuditorParts {
        keys: &keys.dir,
        agg: &agg.data,
        archive: &dir.join("design"),
        evidence_ring: &issuers.evidence.ring,
    };
    let decrypted = decrypt(run, &parts, &closed.exported, &mut children, &mut stages)?;
    let checked = check(
        &fleet.hosts,
        (&agg.data, &keys.public),
        &decrypted.report,
        options.threshold,
    )?;
    Outcome::of(Finished {
        workload,
        apps,
        fleet,
        agents,
        host0,
        killed: captured.killed,
        issuers: (&issuers, statuses),
        closed,
        decrypted,
        checked,
        public: &keys.public,
        stages,
    })
}

/// The aggregation server of a run, serving.
struct Aggregator {
    /// Its data directory (its TLS certificate and signing key are pinned).
    data: DataDir,
    /// Its QUIC address.
    listen: String,
    /// With `--tor`: its stream port, where the exits deliver; empty otherwise.
    stream: String,
    /// With `--tor`: its metrics page; empty otherwise.
    metrics: String,
    /// Its process, in the run's children.
    index: usize,
    /// Its flags after the key's; with `--tor` the ports it bound, so that a restart
    /// (`--faults`) binds the same ones again.
    flags: Vec<OsString>,
    /// The design server's signed key list it applies, and the list-signing key.
    key_list: PathBuf,
    /// See `key_list`.
    list_signer: PathBuf,
}

/// The aggregation server starts on loopback, its RocksDB in `dir/aggregator`, admitting
/// reports by tokens of the admission issuer's key `ring` and keeping each report's evidence
/// token; with `--tor` also on a stream port, with its metrics page.
fn start_aggregator(
    (options, bins, dir): (&Options, &Bins, &Path),
    keys: &DesignKeys,
    ring: &Path,
    children: &mut Children,
) -> Result<Aggregator> {
    let data = DataDir::new(dir.join("aggregator"));
    let mut flags = vec![
        OsString::from("--token-keys"),
        ring.as_os_str().to_owned(),
        // Each report's evidence token, for the release auditor to count contributors from.
        OsString::from("--keep-evidence"),
    ];
    // With --tor: a stream port, where the exits deliver, and the metrics page (its transport
    // counters say what came on the stream port).
    let tor_flags = |stream: &str, metrics: &str| {
        ["--stream-listen", stream, "--metrics", metrics].map(OsString::from)
    };
    let mut serve_args = flags.clone();
    if options.tor {
        serve_args.extend(tor_flags("127.0.0.1:0", "127.0.0.1:0"));
    }
    let key = ServerKey::List {
        list: &keys.key_list,
        signer: &keys.list_signer,
    };
    let bin = bins.path("penrose-aggregator");
    let (server, ready) = start_server_ready(&bin, &data, "127.0.0.1:0", key, &serve_args)?;
    let index = children.push("penrose-aggregator", server);
    let ready: penrose_aggregator::serve::Listening =
        serde_json::from_value(ready).context("the aggregator's ready line")?;
    let (stream, metrics) = match options.tor {
        true => {
            let address = |a: Option<SocketAddr>, name: &str| {
                a.map(|a| a.to_string())
                    .with_context(|| format!("the aggregator's {name} address"))
            };
            let stream = address(ready.stream_listening, "stream_listening")?;
            let metrics = address(ready.metrics, "metrics")?;
            flags.extend(tor_flags(&stream, &metrics));
            (stream, metrics)
        }
        false => (String::new(), String::new()),
    };
    let agg = Aggregator {
        data,
        listen: ready.listening.to_string(),
        stream,
        metrics,
        index,
        flags,
        key_list: keys.key_list.clone(),
        list_signer: keys.list_signer.clone(),
    };
    agg.say(options);
    Ok(agg)
}

impl Aggregator {
    fn say(&self, options: &Options) {
        options.say(&format!(
            "aggregation server: listening on {} (QUIC){}, data in {}; admits reports with an \
             admission token only",
            self.listen,
            if options.tor {
                format!(
                    " and {} (stream port, for Tor; metrics on {})",
                    self.stream, self.metrics
                )
            } else {
                String::new()
            },
            self.data.path().display()
        ));
    }

    /// Starts it again on its data directory, address and flags (after a SIGKILL).
    fn restart(&self, bins: &Bins) -> Result<Child> {
        let key = ServerKey::List {
            list: &self.key_list,
            signer: &self.list_signer,
        };
        let bin = bins.path("penrose-aggregator");
        let (server, _) = start_server(&bin, &self.data, &self.listen, key, &self.flags)?;
        Ok(server)
    }
}

/// In eBPF mode, the stand-in libcuda that host 0's agent probes, copied into `dir/lib`.
fn install_standin(options: &Options, dir: &Path) -> Result<Option<PathBuf>> {
    if !options.ebpf {
        return Ok(None);
    }
    let lib_dir = dir.join("lib");
    std::fs::create_dir_all(&lib_dir)?;
    let lib = lib_dir.join("libcuda.so.1");
    std::fs::copy(newest_standin(&options.bins)?, &lib).context("installing the stand-in")?;
    Ok(Some(lib))
}

/// Starts `penrose-issuer serve` on a free loopback port (and a stream port, for Tor, with
/// `stream`), its log in `log`, and returns it with the line it printed once ready, as the
/// issuer's own type (`listening`, `stream_listening`, `certificate`, ...).
fn start_issuer(
    bin: &Path,
    state: &Path,
    log_path: &Path,
    stream: bool,
) -> Result<(Child, penrose_issuer::service::Listening)> {
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use penrose_aggregator::store::{RocksStore, Store, Table};

    use super::issuers::issuer_state;
    use super::workload::write_synthetic_traces;
    use super::*;

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
            penrose_host::skip::skipped(format_args!(
                "SKIPPED: the workspace's binaries are not built next to this test \
                 (cargo test --workspace builds them)"
            ));
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
