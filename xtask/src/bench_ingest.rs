//! `cargo xtask bench-ingest`: the aggregation server end to end (QUIC, validation, RocksDB,
//! aggregation) under the load generator on the same machine, with the server's CPU per
//! thread, for one binary or alternately for several (an A/B comparison on a machine whose
//! other load changes from minute to minute: alternating keeps both sides under the same
//! conditions, and CPU per report is a figure that load moves far less than the rate).
//!
//! `--admission tokens` runs the server with `--token-keys` (a test key ring of every counter,
//! yesterday to tomorrow) and the load generator minting and spending a token per report;
//! `--admission both` alternates open and token admission the same way as binaries.
//!
//! `--connection-mode fresh` has the load generator send as agents do (`loadgen
//! --connection-mode fresh-per-report`: every report on a connection and UDP socket of its own,
//! with the server's Retry and a full handshake, `--fresh-clients` in flight at once; the
//! founders of a fleet still go over shared connections, untimed); the default,
//! `shared`, spreads the clients over `--connections` shared connections, which no agent does;
//! `both` alternates them the same way as binaries. The server's per-source connection limits
//! are lifted for fresh runs (every connection comes from 127.0.0.1).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use penrose_aggregator::admission::{test_equipment_key_ring, write_key_ring};
use penrose_aggregator::config::DataDir;
use penrose_core::paillier::Keypair;
use penrose_host::clock::today;
use serde::Serialize;

use xtask::machine::{self, today_utc};
use xtask::measure::{dir_bytes, rss_mib};
use xtask::servers::start_server;
use xtask::workspace::{target_dir, workspace_root};

/// Arguments of `cargo xtask bench-ingest`.
#[derive(clap::Args)]
pub struct Args {
    /// An aggregator binary to measure, as LABEL=PATH; repeat it to compare binaries run in
    /// turn [default: this tree's release build, built first, labelled "this"].
    #[arg(long = "binary", value_name = "LABEL=PATH")]
    binaries: Vec<String>,
    /// Rounds; each round runs every binary once, with a fresh data directory.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Reports per run.
    #[arg(long, default_value_t = 60_000)]
    reports: u64,
    /// Concurrent load generator clients with --connection-mode shared.
    #[arg(long, default_value_t = 512)]
    clients: usize,
    /// Reports in flight at once with --connection-mode fresh (each its own connection and
    /// handshake; far fewer than --clients, or handshakes time out on a small machine).
    #[arg(long, default_value_t = 64)]
    fresh_clients: usize,
    /// With --connection-mode shared: the QUIC connections the clients share.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// How the load generator's reports use connections: `shared` (the clients share
    /// --connections connections, many reports on each: load testing only, no agent sends so),
    /// `fresh` (as agents send: every report on a fresh connection from a fresh UDP socket,
    /// with the server's Retry and a full TLS 1.3 handshake, --fresh-clients in flight at
    /// once), or `both` in turn.
    #[arg(long, value_enum, default_value_t = ConnectionArg::Shared)]
    connection_mode: ConnectionArg,
    /// How the server admits reports: `open`, `tokens` (a token per report, minted by the
    /// load generator before sending), or `both` in turn.
    #[arg(long, value_enum, default_value_t = AdmissionArg::Open)]
    admission: AdmissionArg,
    /// Run against synthetic fleets of these many applications (`loadgen --fleet-apps`), every
    /// report a fresh fingerprint: the founders first (one per application, not timed), then
    /// the reports. Adds the server's resident memory, its bytes on disk and a restart on the
    /// data directory to each run. Without it the reports come from the traces' windows.
    #[arg(long, value_delimiter = ',')]
    fleet_apps: Vec<u32>,
    /// Whether the server keeps each report's evidence for the release auditor (`serve
    /// --keep-evidence`): `off`, `on`, or `both` in turn (its cost at ingest).
    #[arg(long, value_enum, default_value_t = EvidenceArg::Off)]
    keep_evidence: EvidenceArg,
    /// With --fleet-apps: the share of reports from applications never seen.
    #[arg(long, default_value_t = 0.01)]
    new_app_share: f64,
    /// Write the result as Markdown here as well (for example docs/benchmarks-ingest.md).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// `--admission`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum AdmissionArg {
    /// Without tokens.
    Open,
    /// By tokens.
    Tokens,
    /// Both, in turn.
    Both,
}

impl AdmissionArg {
    /// The modes to run, as (by tokens, label suffix).
    fn modes(self) -> &'static [(bool, &'static str)] {
        match self {
            AdmissionArg::Open => &[(false, "")],
            AdmissionArg::Tokens => &[(true, "")],
            AdmissionArg::Both => &[(false, " open"), (true, " tokens")],
        }
    }
}

/// `--keep-evidence`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum EvidenceArg {
    /// Evidence not kept.
    Off,
    /// Evidence kept.
    On,
    /// Both, in turn.
    Both,
}

impl EvidenceArg {
    /// The modes to run, as (kept, label suffix).
    fn modes(self) -> &'static [(bool, &'static str)] {
        match self {
            EvidenceArg::Off => &[(false, "")],
            EvidenceArg::On => &[(true, " evidence")],
            EvidenceArg::Both => &[(false, " no evidence"), (true, " evidence")],
        }
    }
}

/// `--connection-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ConnectionArg {
    /// Clients share --connections connections (load testing only).
    Shared,
    /// A fresh connection per report, as agents send.
    Fresh,
    /// Both, in turn.
    Both,
}

impl ConnectionArg {
    /// The modes to run, as (fresh, label suffix).
    fn modes(self) -> &'static [(bool, &'static str)] {
        match self {
            ConnectionArg::Shared => &[(false, "")],
            ConnectionArg::Fresh => &[(true, " fresh")],
            ConnectionArg::Both => &[(false, " shared"), (true, " fresh")],
        }
    }
}

/// One run of one binary.
#[derive(Serialize)]
struct Run {
    label: String,
    round: usize,
    /// The 1-minute load average when the run started (other work on the machine).
    load_before: f64,
    accepted: u64,
    rejected_invalid: u64,
    invalid_accepted: u64,
    errors: u64,
    /// Valid reports the server refused, with the reasons.
    rejected_valid: u64,
    reasons: serde_json::Value,
    reports_per_second: f64,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    /// The server's CPU seconds by thread group (tokio runtime, writer, committer, RocksDB,
    /// other), and in all.
    cpu_seconds: Vec<(String, f64)>,
    server_cpu_seconds: f64,
    /// Server CPU per accepted report.
    cpu_us_per_report: f64,
    /// With a synthetic fleet: its applications, what founding them took, and the server's
    /// memory, disk and restart after the run.
    fleet: Option<FleetRun>,
}

/// What a fleet run adds.
#[derive(Serialize)]
struct FleetRun {
    apps: u32,
    founding_seconds: f64,
    rss_mib: f64,
    disk_mib: f64,
    restart_seconds: f64,
    restart_rss_mib: f64,
}

/// Runs the task.
pub fn run(args: Args) -> Result<()> {
    ensure!(args.rounds > 0, "--rounds must be at least 1");
    let root = workspace_root()?;
    let binaries = binaries(&args, &root)?;
    // One load generator for every run, so that its own CPU is the same on both sides.
    let loadgen = binaries
        .last()
        .map(|(_, path)| path.clone())
        .context("no binary")?;
    let dir = tempfile::Builder::new()
        .prefix("penrose-bench-ingest-")
        .tempdir()?;
    let (key_path, ring_path) = write_keys(&args, dir.path())?;

    let mut runs = Vec::new();
    let mut labels = Vec::new();
    for round in 1..=args.rounds {
        for ((label, binary), &(tokens, suffix)) in binaries
            .iter()
            .flat_map(|b| args.admission.modes().iter().map(move |m| (b, m)))
        {
            let admission = Admission::of(binary, tokens.then_some(ring_path.as_path()))?;
            for variant in variants(&args) {
                let label = variant.label(&format!("{label}{suffix}"));
                let admission = variant.admission(&admission);
                if !labels.contains(&label) {
                    labels.push(label.clone());
                }
                let data = DataDir::new(dir.path().join(format!("data-{round}-{label}")));
                let setting = Setting {
                    args: &args,
                    label: &label,
                    round,
                    binary,
                    loadgen: &loadgen,
                    data: &data,
                    key: &key_path,
                    admission: &admission,
                    fleet: variant.fleet,
                    fresh: variant.fresh,
                };
                let run = run_once(&setting)?;
                if !args.json {
                    say_run(round, &label, &run);
                }
                std::fs::remove_dir_all(data.path()).ok();
                runs.push(run);
            }
        }
    }
    let text = markdown(&args, &labels, &runs);
    if let Some(out) = &args.out {
        std::fs::write(out, &text).with_context(|| format!("writing {}", out.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&runs)?);
    } else {
        println!("{text}");
    }
    Ok(())
}

/// The binaries to measure, labelled: `--binary LABEL=PATH` each, or this tree's release
/// build (built now).
fn binaries(args: &Args, root: &Path) -> Result<Vec<(String, PathBuf)>> {
    if args.binaries.is_empty() {
        if !args.json {
            eprintln!("building the release aggregator");
        }
        let status = Command::new(env!("CARGO"))
            .current_dir(root)
            .args(["build", "--release", "-p", "penrose-aggregator", "--bins"])
            // The load generator is test equipment.
            .args(["--features", "penrose-aggregator/test-util"])
            .status()
            .context("running cargo build")?;
        ensure!(status.success(), "cargo build failed: {status}");
        return Ok(vec![(
            "this".to_string(),
            target_dir(root).join("release/penrose-aggregator"),
        )]);
    }
    args.binaries
        .iter()
        .map(|spec| {
            let (label, path) = spec
                .split_once('=')
                .with_context(|| format!("--binary {spec:?}: expected LABEL=PATH"))?;
            let path = PathBuf::from(path);
            ensure!(
                path.is_file(),
                "--binary {label}: {} is not a file",
                path.display()
            );
            Ok((label.to_string(), path))
        })
        .collect()
}

/// Writes the design server's public key and, unless every run is open, a test key ring of
/// every counter from yesterday to tomorrow under `dir`; returns their paths.
fn write_keys(args: &Args, dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let key_path = dir.join("public.key");
    let keys = Keypair::generate(&mut rand::rng());
    std::fs::write(&key_path, keys.public_key().to_bytes())?;
    let ring_path = dir.join("token-keys");
    if args.admission != AdmissionArg::Open {
        let t = today();
        let ring = test_equipment_key_ring(
            penrose_core::wire::Day(t.0 - 1),
            penrose_core::wire::Day(t.0 + 1),
        )?;
        write_key_ring(&ring_path, &ring)?;
    }
    Ok((key_path, ring_path))
}

/// How one binary is run, past its admission mode: connections, fleet, evidence.
struct Variant {
    fresh: bool,
    connection_suffix: &'static str,
    fleet: Option<u32>,
    kept: bool,
    evidence_suffix: &'static str,
}

impl Variant {
    /// The run's label: the binary's (with its admission mode), then this variant's.
    fn label(&self, binary: &str) -> String {
        let label = format!("{binary}{}{}", self.connection_suffix, self.evidence_suffix);
        match self.fleet {
            Some(apps) => format!("{label} {apps} classes"),
            None => label,
        }
    }

    /// The binary's admission flags, with `--keep-evidence` when this variant keeps it.
    fn admission(&self, admission: &Admission) -> Admission {
        let mut admission = admission.clone();
        if self.kept {
            admission.serve.push("--keep-evidence".into());
        }
        admission
    }
}

/// Every variant of a binary's runs, in the order they run: connection modes, then fleets,
/// then evidence modes.
fn variants(args: &Args) -> Vec<Variant> {
    let fleets: Vec<Option<u32>> = if args.fleet_apps.is_empty() {
        vec![None]
    } else {
        args.fleet_apps.iter().copied().map(Some).collect()
    };
    let mut out = Vec::new();
    for &(fresh, connection_suffix) in args.connection_mode.modes() {
        for &fleet in &fleets {
            for &(kept, evidence_suffix) in args.keep_evidence.modes() {
                out.push(Variant {
                    fresh,
                    connection_suffix,
                    fleet,
                    kept,
                    evidence_suffix,
                });
            }
        }
    }
    out
}

/// One line on the terminal per run.
fn say_run(round: usize, label: &str, run: &Run) {
    eprintln!(
        "round {round} {label}: {:.0} reports/s, p50 {:.1} ms, p99 {:.1} ms, server \
         {:.1} us CPU per report (load {:.1}); {} transport errors, {} valid refused {}",
        run.reports_per_second,
        run.p50_ms.unwrap_or(f64::NAN),
        run.p99_ms.unwrap_or(f64::NAN),
        run.cpu_us_per_report,
        run.load_before,
        run.errors,
        run.rejected_valid,
        run.reasons
    );
}

/// The admission flags of one run: the server's, and the load generator's.
#[derive(Clone)]
struct Admission {
    serve: Vec<std::ffi::OsString>,
    loadgen: Vec<std::ffi::OsString>,
}

impl Admission {
    /// By tokens with the key ring `ring`, or open: `--open-admission`, unless `binary` is a
    /// build from before admission tokens (which admits every report and knows no such flag).
    fn of(binary: &Path, ring: Option<&Path>) -> Result<Self> {
        let help = Command::new(binary)
            .args(["serve", "--help"])
            .output()
            .context("running serve --help")?;
        let knows = String::from_utf8_lossy(&help.stdout).contains("--open-admission");
        Ok(match ring {
            Some(ring) => {
                ensure!(
                    knows,
                    "{} does not admit by tokens (no --token-keys)",
                    binary.display()
                );
                let flags = vec!["--token-keys".into(), ring.as_os_str().to_owned()];
                Admission {
                    serve: flags.clone(),
                    loadgen: flags,
                }
            }
            None => Admission {
                serve: if knows {
                    vec!["--open-admission".into()]
                } else {
                    Vec::new()
                },
                loadgen: Vec::new(),
            },
        })
    }
}

/// One run's setting: the binary measured, where its data goes, and how it is loaded.
struct Setting<'a> {
    args: &'a Args,
    label: &'a str,
    round: usize,
    binary: &'a Path,
    loadgen: &'a Path,
    data: &'a DataDir,
    key: &'a Path,
    admission: &'a Admission,
    fleet: Option<u32>,
    fresh: bool,
}

/// The flags of one run beyond the admission's: the server's, and the load generator's for
/// its connections and its fleet.
struct Flags {
    serve: Vec<std::ffi::OsString>,
    connection: Vec<String>,
    fleet: Vec<String>,
}

impl Flags {
    fn of(s: &Setting) -> Self {
        let mut serve = s.admission.serve.clone();
        let mut connection: Vec<String> = Vec::new();
        if s.fresh {
            // Every report's connection comes from 127.0.0.1: no per-source limit may refuse one.
            serve.extend([
                "--connections-per-source".into(),
                "1000000".into(),
                "--new-connections-per-source".into(),
                "0".into(),
            ]);
            connection = vec!["--connection-mode".into(), "fresh-per-report".into()];
        }
        let mut fleet: Vec<String> = Vec::new();
        if let Some(apps) = s.fleet {
            // Founders and new applications must not be rationed here.
            serve.extend(["--new-classes-per-hour".into(), "100000000".into()]);
            fleet = vec![
                "--fleet-apps".into(),
                apps.to_string(),
                "--new-app-share".into(),
                s.args.new_app_share.to_string(),
            ];
        }
        Self {
            serve,
            connection,
            fleet,
        }
    }
}

fn run_once(s: &Setting) -> Result<Run> {
    let load_before = load_average();
    let flags = Flags::of(s);
    let (mut server, listen) = start_server(s.binary, s.data, "127.0.0.1:0", s.key, &flags.serve)?;
    let result = measure_server(s, &flags, server.id(), &listen, load_before);
    server.kill().ok();
    server.wait().ok();
    let mut run = result?;
    if let Some(fleet) = &mut run.fleet {
        // The data directory as the run left it, then a restart on it.
        fleet.disk_mib = dir_bytes(s.data.path())? as f64 / 1_048_576.0;
        let started = std::time::Instant::now();
        let (mut server, _) = start_server(s.binary, s.data, "127.0.0.1:0", s.key, &flags.serve)?;
        fleet.restart_seconds = started.elapsed().as_secs_f64();
        fleet.restart_rss_mib = rss_mib(server.id())?;
        server.kill().ok();
        server.wait().ok();
    }
    Ok(run)
}

/// The load generator against the server `pid` listening on `listen` (the fleet's founders
/// first, untimed), and the server's CPU over it.
fn measure_server(
    s: &Setting,
    flags: &Flags,
    pid: u32,
    listen: &str,
    load_before: f64,
) -> Result<Run> {
    let founding = match s.fleet {
        None => None,
        Some(_) => Some(found_fleet(s, flags, listen)?),
    };
    let cpu_before = thread_cpu(pid)?;
    let outcome = load(s, flags, listen)?;
    // The last batch's commit may still be running; its CPU belongs to this run.
    std::thread::sleep(Duration::from_millis(300));
    let mut cpu = thread_cpu(pid)?;
    for (group, seconds) in &mut cpu {
        if let Some((_, before)) = cpu_before.iter().find(|(g, _)| g == group) {
            *seconds -= before;
        }
    }
    let total: f64 = cpu.iter().map(|(_, s)| s).sum();
    let fleet = match (s.fleet, founding) {
        (Some(apps), Some(founding_seconds)) => Some(FleetRun {
            apps,
            founding_seconds,
            rss_mib: rss_mib(pid)?,
            disk_mib: 0.0,
            restart_seconds: 0.0,
            restart_rss_mib: 0.0,
        }),
        _ => None,
    };
    let number = |k: &str| outcome[k].as_u64().unwrap_or(0);
    let accepted = number("accepted");
    Ok(Run {
        label: s.label.to_string(),
        round: s.round,
        load_before,
        accepted,
        rejected_invalid: number("rejected_invalid"),
        invalid_accepted: number("invalid_accepted"),
        errors: number("errors"),
        rejected_valid: number("rejected_valid"),
        reasons: outcome["reasons"].clone(),
        reports_per_second: outcome["reports_per_second"].as_f64().unwrap_or(0.0),
        p50_ms: outcome["latency_ms"]["p50"].as_f64(),
        p99_ms: outcome["latency_ms"]["p99"].as_f64(),
        cpu_seconds: cpu,
        server_cpu_seconds: total,
        cpu_us_per_report: if accepted > 0 {
            total / accepted as f64 * 1e6
        } else {
            f64::NAN
        },
        fleet,
    })
}

/// The fleet's founders (one report per application, no others): seconds until the server
/// has taken them.
fn found_fleet(s: &Setting, flags: &Flags, listen: &str) -> Result<f64> {
    let started = std::time::Instant::now();
    let out = Command::new(s.loadgen)
        .arg("loadgen")
        .args(&s.admission.loadgen)
        .args(&flags.fleet)
        .args(["--server", listen, "--public-key"])
        .arg(s.key)
        .arg("--cert")
        .arg(s.data.tls_cert())
        .args(["--reports", "0"])
        .args(["--clients", &s.args.clients.to_string()])
        .args(["--connections", &s.args.connections.to_string()])
        .arg("--json")
        .stderr(Stdio::null())
        .output()
        .context("running the load generator's founders")?;
    ensure!(
        out.status.success(),
        "loadgen (founders) failed: {}",
        out.status
    );
    std::thread::sleep(Duration::from_millis(300));
    Ok(started.elapsed().as_secs_f64())
}

/// The timed load: `--reports` reports, and what the load generator counted (its JSON).
fn load(s: &Setting, flags: &Flags, listen: &str) -> Result<serde_json::Value> {
    let args = s.args;
    let clients = if s.fresh {
        args.fresh_clients
    } else {
        args.clients
    };
    let out = Command::new(s.loadgen)
        .arg("loadgen")
        .args(&s.admission.loadgen)
        .args(&flags.fleet)
        .args(if s.fleet.is_some() {
            &["--founded"][..]
        } else {
            &[][..]
        })
        .args(["--server", listen, "--public-key"])
        .arg(s.key)
        .arg("--cert")
        .arg(s.data.tls_cert())
        .args(["--reports", &args.reports.to_string()])
        .args(["--clients", &clients.to_string()])
        .args(["--connections", &args.connections.to_string()])
        .args(&flags.connection)
        .arg("--json")
        .stderr(Stdio::null())
        .output()
        .context("running the load generator")?;
    // Exit code 3: a valid report was not accepted (refused, or a transport error); the run
    // is still recorded, with its errors, in the table.
    ensure!(
        out.status.success() || out.status.code() == Some(3),
        "loadgen failed: {}",
        out.status
    );
    serde_json::from_slice(&out.stdout).context("loadgen's JSON")
}

/// CPU seconds of each of the process's thread groups, from /proc/PID/task/*/stat.
fn thread_cpu(pid: u32) -> Result<Vec<(String, f64)>> {
    // utime and stime are in USER_HZ ticks, which Linux fixes at 100 for user space.
    const TICKS_PER_SECOND: f64 = 100.0;
    let mut groups: Vec<(String, f64)> = Vec::new();
    let tasks =
        std::fs::read_dir(format!("/proc/{pid}/task")).context("reading the server's threads")?;
    for task in tasks {
        let Ok(stat) = std::fs::read_to_string(task?.path().join("stat")) else {
            continue; // the thread ended
        };
        // comm is in parentheses and may hold spaces; the fields after it are fixed.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        // After the comm: state is field 3 (index 0 here), utime 14 and stime 15.
        let ticks: f64 = [11, 12]
            .iter()
            .filter_map(|&i| fields.get(i)?.parse::<f64>().ok())
            .sum();
        let group = if comm.starts_with("tokio") {
            "tokio"
        } else if comm == "penrose-writer" {
            "writer"
        } else if comm == "penrose-commit" {
            "commit"
        } else if comm.starts_with("rocksdb") {
            "rocksdb"
        } else {
            "other"
        };
        match groups.iter_mut().find(|(g, _)| g == group) {
            Some((_, s)) => *s += ticks / TICKS_PER_SECOND,
            None => groups.push((group.to_string(), ticks / TICKS_PER_SECOND)),
        }
    }
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(groups)
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

fn markdown(args: &Args, labels: &[String], runs: &[Run]) -> String {
    let mut s = intro(args);
    s.push_str(&runs_table(runs));
    s.push_str(&fleet_table(runs));
    let _ = writeln!(s);
    s.push_str(&medians(labels, runs));
    s.push_str(&comparisons(labels, runs));
    s
}

/// The command that made the table, and how the runs were made.
fn intro(args: &Args) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "`cargo xtask bench-ingest{}{}{}{} --rounds \
         {} --reports {} --clients {} --connections {}` on {}, {}: each run a fresh data \
         directory, `serve` on 127.0.0.1 and `loadgen` (5% invalid reports) as separate \
         processes; the binaries (and admission and connection modes) in turn, round after \
         round. Server CPU is read from /proc per thread after the run.{}{}\n",
        binaries_arg(args),
        admission_arg(args.admission),
        connection_arg(args),
        fleet_arg(args),
        args.rounds,
        args.reports,
        args.clients,
        args.connections,
        machine::describe(),
        today_utc(),
        connection_text(args.connection_mode),
        if args.admission == AdmissionArg::Open {
            ""
        } else {
            " With tokens the server verifies and spends a token per report (`--token-keys`), \
             and the load generator, its own issuer, mints them before the timed phase and \
             spends each (a MAC) in it; the invalid reports then include reports without and \
             with forged tokens."
        },
    );
    s
}

/// `--binary LABEL=PATH` for each binary given.
fn binaries_arg(args: &Args) -> String {
    if args.binaries.is_empty() {
        String::new()
    } else {
        args.binaries
            .iter()
            .map(|b| format!(" --binary {b}"))
            .collect()
    }
}

fn admission_arg(admission: AdmissionArg) -> &'static str {
    match admission {
        AdmissionArg::Open => "",
        AdmissionArg::Tokens => " --admission tokens",
        AdmissionArg::Both => " --admission both",
    }
}

fn fleet_arg(args: &Args) -> String {
    if args.fleet_apps.is_empty() {
        String::new()
    } else {
        format!(
            " --fleet-apps {} --new-app-share {}",
            args.fleet_apps
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(","),
            args.new_app_share
        )
    }
}

fn connection_arg(args: &Args) -> String {
    match args.connection_mode {
        ConnectionArg::Shared => String::new(),
        ConnectionArg::Fresh => format!(
            " --connection-mode fresh --fresh-clients {}",
            args.fresh_clients
        ),
        ConnectionArg::Both => format!(
            " --connection-mode both --fresh-clients {}",
            args.fresh_clients
        ),
    }
}

/// How the reports used connections, in words (nothing for the default).
fn connection_text(mode: ConnectionArg) -> &'static str {
    match mode {
        ConnectionArg::Shared => "",
        ConnectionArg::Fresh => {
            " Every report on a fresh connection from a fresh UDP socket, as agents send (the \
             server's Retry, a full TLS 1.3 handshake, one stream, close), --fresh-clients in \
             flight at once; the server's per-source connection limits lifted."
        }
        ConnectionArg::Both => {
            " `shared`: the clients share --connections connections (load testing only); \
             `fresh`: every report on a fresh connection from a fresh UDP socket, as agents send \
             (the server's Retry, a full TLS 1.3 handshake, one stream, close), --fresh-clients \
             in flight at once, the server's per-source connection limits lifted; the two in turn."
        }
    }
}

/// Every run, in the order they ran.
fn runs_table(runs: &[Run]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| binary | round | load before | reports/s | p50 ms | p99 ms | accepted | invalid refused | invalid accepted | errors | server CPU us/report | CPU s by thread |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in runs {
        let threads: Vec<String> = r
            .cpu_seconds
            .iter()
            .map(|(g, t)| format!("{g} {t:.2}"))
            .collect();
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | {:.0} | {:.1} | {:.1} | {} | {} | {} | {} | {:.1} | {} |",
            r.label,
            r.round,
            r.load_before,
            r.reports_per_second,
            r.p50_ms.unwrap_or(f64::NAN),
            r.p99_ms.unwrap_or(f64::NAN),
            r.accepted,
            r.rejected_invalid,
            r.invalid_accepted,
            r.errors,
            r.cpu_us_per_report,
            threads.join(", ")
        );
    }
    s
}

/// The fleet runs' founding, memory, disk and restart (nothing without a fleet).
fn fleet_table(runs: &[Run]) -> String {
    let mut s = String::new();
    if !runs.iter().any(|r| r.fleet.is_some()) {
        return s;
    }
    let _ = writeln!(
        s,
        "\n| binary | round | classes | founding s | server RSS MiB | disk MiB | restart s | RSS after restart MiB |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
    for r in runs {
        if let Some(f) = &r.fleet {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.1} | {:.0} | {:.0} | {:.2} | {:.0} |",
                r.label,
                r.round,
                f.apps,
                f.founding_seconds,
                f.rss_mib,
                f.disk_mib,
                f.restart_seconds,
                f.restart_rss_mib
            );
        }
    }
    s
}

/// Each label's medians over its rounds.
fn medians(labels: &[String], runs: &[Run]) -> String {
    let mut s = String::new();
    for label in labels {
        let mine = || runs.iter().filter(|r| &r.label == label);
        let _ = writeln!(
            s,
            "- {label}: median {:.0} reports/s, {:.1} us server CPU per report, p50 {:.1} ms, \
             p99 {:.1} ms",
            median(mine().map(|r| r.reports_per_second).collect()),
            median(mine().map(|r| r.cpu_us_per_report).collect()),
            median(mine().filter_map(|r| r.p50_ms).collect()),
            median(mine().filter_map(|r| r.p99_ms).collect()),
        );
    }
    s
}

/// With both modes of a kind: what the second costs against the first, per label, from the
/// medians.
fn comparisons(labels: &[String], runs: &[Run]) -> String {
    let mut s = String::new();
    let rate = |r: &Run| r.reports_per_second;
    let cpu = |r: &Run| r.cpu_us_per_report;
    for (this, that) in [(" tokens", " open"), (" fresh", " shared")] {
        for label in labels.iter().filter(|l| l.contains(this)) {
            let other = label.replacen(this, that, 1);
            if !labels.contains(&other) {
                continue;
            }
            let of = |label: &str, f: fn(&Run) -> f64| {
                median(runs.iter().filter(|r| r.label == label).map(f).collect())
            };
            let _ = writeln!(
                s,
                "- {label} against {other}: {:.2} x the reports/s, {:.2} x the server CPU per \
                 report ({:+.1} us)",
                of(label, rate) / of(&other, rate),
                of(label, cpu) / of(&other, cpu),
                of(label, cpu) - of(&other, cpu),
            );
        }
    }
    s
}

/// The reports' text on fixed, made-up results.
#[cfg(test)]
mod report_tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn run(label: &str, round: usize, fleet: bool, x: f64) -> Run {
        Run {
            label: label.to_string(),
            round,
            load_before: 1.23 + x,
            accepted: 57_000 + round as u64,
            rejected_invalid: 3000,
            invalid_accepted: 0,
            errors: round as u64,
            rejected_valid: 0,
            reasons: serde_json::json!({}),
            reports_per_second: 12345.6 * x,
            p50_ms: Some(1.234 * x),
            p99_ms: if round == 2 { None } else { Some(12.34 * x) },
            cpu_seconds: vec![("commit".into(), 0.123 * x), ("tokio".into(), 4.567 * x)],
            server_cpu_seconds: 4.69 * x,
            cpu_us_per_report: 81.2 * x,
            fleet: fleet.then_some(FleetRun {
                apps: 1000,
                founding_seconds: 2.345 * x,
                rss_mib: 123.4 * x,
                disk_mib: 56.7 * x,
                restart_seconds: 0.456 * x,
                restart_rss_mib: 89.1 * x,
            }),
        }
    }

    fn labels() -> Vec<String> {
        [
            "this tokens fresh",
            "this open fresh",
            "this tokens shared",
            "this open shared",
            "lonely tokens",
        ]
        .map(String::from)
        .to_vec()
    }

    fn runs(labels: &[String], fleet: bool) -> Vec<Run> {
        let mut runs = Vec::new();
        for round in 1..=2 {
            for (i, l) in labels.iter().enumerate() {
                let x = 1.0 + i as f64 * 0.3 + round as f64 * 0.1;
                runs.push(run(l, round, fleet && i % 2 == 0, x));
            }
        }
        runs
    }

    #[test]
    fn markdown_names_the_command_and_sets_each_mode_against_the_other() {
        let args = Cli::parse_from(["x", "--admission", "both", "--connection-mode", "both"]).args;
        let labels = labels();
        let text = markdown(&args, &labels, &runs(&labels, false));
        assert!(text.starts_with(
            "`cargo xtask bench-ingest --admission both --connection-mode both --fresh-clients 64 \
             --rounds 3 --reports 60000 --clients 512 --connections 16` on "
        ));
        assert!(text.contains("`shared`: the clients share --connections connections"));
        assert!(text.contains(" With tokens the server verifies and spends a token"));
        assert_eq!(text.matches("\n| this open fresh | ").count(), 2);
        assert!(!text.contains("| founding s |"));
        assert!(text.contains("- lonely tokens: median "));
        for (this, other) in [
            ("this tokens fresh", "this open fresh"),
            ("this tokens shared", "this open shared"),
            ("this tokens fresh", "this tokens shared"),
            ("this open fresh", "this open shared"),
        ] {
            assert!(
                text.contains(&format!("\n- {this} against {other}: ")),
                "{this}"
            );
        }
        assert!(!text.contains("- lonely tokens against"));
    }

    #[test]
    fn the_fleet_table_lists_the_fleet_runs_only() {
        let args = Cli::parse_from([
            "x",
            "--binary",
            "a=/bin/a",
            "--fleet-apps",
            "1000,5000",
            "--connection-mode",
            "fresh",
        ])
        .args;
        let labels = labels();
        let text = markdown(&args, &labels, &runs(&labels, true));
        assert!(text.starts_with(
            "`cargo xtask bench-ingest --binary a=/bin/a --connection-mode fresh --fresh-clients \
             64 --fleet-apps 1000,5000 --new-app-share 0.01 --rounds 3 "
        ));
        assert!(text.contains(" Every report on a fresh connection from a fresh UDP socket"));
        assert!(!text.contains(" With tokens the server"));
        let fleet = &text[text.find("| founding s |").expect("a fleet table")..];
        // Labels 0, 2 and 4 of each of the two rounds ran a fleet.
        assert_eq!(fleet.matches(" | 1000 | ").count(), 6);
    }
}
