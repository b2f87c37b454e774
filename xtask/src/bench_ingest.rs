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
    let binaries: Vec<(String, PathBuf)> = if args.binaries.is_empty() {
        if !args.json {
            eprintln!("building the release aggregator");
        }
        let status = Command::new(env!("CARGO"))
            .current_dir(&root)
            .args(["build", "--release", "-p", "penrose-aggregator", "--bins"])
            // The load generator is test equipment.
            .args(["--features", "penrose-aggregator/test-util"])
            .status()
            .context("running cargo build")?;
        ensure!(status.success(), "cargo build failed: {status}");
        vec![(
            "this".to_string(),
            target_dir(&root).join("release/penrose-aggregator"),
        )]
    } else {
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
            .collect::<Result<_>>()?
    };
    // One load generator for every run, so that its own CPU is the same on both sides.
    let loadgen = binaries
        .last()
        .map(|(_, path)| path.clone())
        .context("no binary")?;
    let dir = tempfile::Builder::new()
        .prefix("penrose-bench-ingest-")
        .tempdir()?;
    let key_path = dir.path().join("public.key");
    let keys = Keypair::generate(&mut rand::rng());
    std::fs::write(&key_path, keys.public_key().to_bytes())?;
    let ring_path = dir.path().join("token-keys");
    if args.admission != AdmissionArg::Open {
        let t = today();
        let ring = test_equipment_key_ring(
            penrose_core::wire::Day(t.0 - 1),
            penrose_core::wire::Day(t.0 + 1),
        )?;
        write_key_ring(&ring_path, &ring)?;
    }

    let mut runs = Vec::new();
    let mut labels = Vec::new();
    for round in 1..=args.rounds {
        for ((label, binary), &(tokens, suffix)) in binaries
            .iter()
            .flat_map(|b| args.admission.modes().iter().map(move |m| (b, m)))
        {
            let admission = Admission::of(binary, tokens.then_some(ring_path.as_path()))?;
            let fleets: Vec<Option<u32>> = if args.fleet_apps.is_empty() {
                vec![None]
            } else {
                args.fleet_apps.iter().copied().map(Some).collect()
            };
            let runs_of_binary = args
                .connection_mode
                .modes()
                .iter()
                .flat_map(|c| fleets.iter().map(move |f| (c, f)))
                .flat_map(|(c, f)| args.keep_evidence.modes().iter().map(move |e| (c, f, e)));
            for (&(fresh, connection_suffix), &fleet, &(kept, evidence_suffix)) in runs_of_binary {
                let label = format!("{label}{suffix}{connection_suffix}{evidence_suffix}");
                let mut admission = admission.clone();
                if kept {
                    admission.serve.push("--keep-evidence".into());
                }
                let label = match fleet {
                    Some(apps) => format!("{label} {apps} classes"),
                    None => label.clone(),
                };
                if !labels.contains(&label) {
                    labels.push(label.clone());
                }
                let data = DataDir::new(dir.path().join(format!("data-{round}-{label}")));
                let run = run_once(
                    &args, &label, round, binary, &loadgen, &data, &key_path, &admission, fleet,
                    fresh,
                )?;
                if !args.json {
                    eprintln!(
                        "round {round} {label}: {:.0} reports/s, p50 {:.1} ms, p99 {:.1} ms, server \
                     {:.1} us CPU per report (load {:.1}); {} transport errors, {} valid \
                     refused {}",
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

#[allow(clippy::too_many_arguments)]
fn run_once(
    args: &Args,
    label: &str,
    round: usize,
    binary: &Path,
    loadgen: &Path,
    data: &DataDir,
    key: &Path,
    admission: &Admission,
    fleet: Option<u32>,
    fresh: bool,
) -> Result<Run> {
    let load_before = load_average();
    let mut serve_flags = admission.serve.clone();
    let mut connection_flags: Vec<String> = Vec::new();
    if fresh {
        // Every report's connection comes from 127.0.0.1: no per-source limit may refuse one.
        serve_flags.extend([
            "--connections-per-source".into(),
            "1000000".into(),
            "--new-connections-per-source".into(),
            "0".into(),
        ]);
        connection_flags = vec!["--connection-mode".into(), "fresh-per-report".into()];
    }
    let mut fleet_flags: Vec<String> = Vec::new();
    if let Some(apps) = fleet {
        // Founders and new applications must not be rationed here.
        serve_flags.extend(["--new-classes-per-hour".into(), "100000000".into()]);
        fleet_flags = vec![
            "--fleet-apps".into(),
            apps.to_string(),
            "--new-app-share".into(),
            args.new_app_share.to_string(),
        ];
    }
    let (mut server, listen) = start_server(binary, data, "127.0.0.1:0", key, &serve_flags)?;
    let result = (|| -> Result<Run> {
        let founding = match fleet {
            None => None,
            Some(_) => {
                let started = std::time::Instant::now();
                let out = Command::new(loadgen)
                    .arg("loadgen")
                    .args(&admission.loadgen)
                    .args(&fleet_flags)
                    .args(["--server", &listen, "--public-key"])
                    .arg(key)
                    .arg("--cert")
                    .arg(data.tls_cert())
                    .args(["--reports", "0"])
                    .args(["--clients", &args.clients.to_string()])
                    .args(["--connections", &args.connections.to_string()])
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
                Some(started.elapsed().as_secs_f64())
            }
        };
        let cpu_before = thread_cpu(server.id())?;
        let out = Command::new(loadgen)
            .arg("loadgen")
            .args(&admission.loadgen)
            .args(&fleet_flags)
            .args(if fleet.is_some() {
                &["--founded"][..]
            } else {
                &[][..]
            })
            .args(["--server", &listen, "--public-key"])
            .arg(key)
            .arg("--cert")
            .arg(data.tls_cert())
            .args(["--reports", &args.reports.to_string()])
            .args([
                "--clients",
                &if fresh {
                    args.fresh_clients
                } else {
                    args.clients
                }
                .to_string(),
            ])
            .args(["--connections", &args.connections.to_string()])
            .args(&connection_flags)
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
        let outcome: serde_json::Value =
            serde_json::from_slice(&out.stdout).context("loadgen's JSON")?;
        // The last batch's commit may still be running; its CPU belongs to this run.
        std::thread::sleep(Duration::from_millis(300));
        let mut cpu = thread_cpu(server.id())?;
        for (group, seconds) in &mut cpu {
            if let Some((_, before)) = cpu_before.iter().find(|(g, _)| g == group) {
                *seconds -= before;
            }
        }
        let total: f64 = cpu.iter().map(|(_, s)| s).sum();
        let fleet = match (fleet, founding) {
            (Some(apps), Some(founding_seconds)) => Some(FleetRun {
                apps,
                founding_seconds,
                rss_mib: rss_mib(server.id())?,
                disk_mib: 0.0,
                restart_seconds: 0.0,
                restart_rss_mib: 0.0,
            }),
            _ => None,
        };
        let number = |k: &str| outcome[k].as_u64().unwrap_or(0);
        let accepted = number("accepted");
        Ok(Run {
            label: label.to_string(),
            round,
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
    })();
    server.kill().ok();
    server.wait().ok();
    let mut run = result?;
    if let Some(fleet) = &mut run.fleet {
        // The data directory as the run left it, then a restart on it.
        fleet.disk_mib = dir_bytes(data.path())? as f64 / 1_048_576.0;
        let started = std::time::Instant::now();
        let (mut server, _) = start_server(binary, data, "127.0.0.1:0", key, &serve_flags)?;
        fleet.restart_seconds = started.elapsed().as_secs_f64();
        fleet.restart_rss_mib = rss_mib(server.id())?;
        server.kill().ok();
        server.wait().ok();
    }
    Ok(run)
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
    let mut s = String::new();
    let binaries_arg: String = if args.binaries.is_empty() {
        String::new()
    } else {
        args.binaries
            .iter()
            .map(|b| format!(" --binary {b}"))
            .collect()
    };
    let admission_arg = match args.admission {
        AdmissionArg::Open => "",
        AdmissionArg::Tokens => " --admission tokens",
        AdmissionArg::Both => " --admission both",
    };
    let fleet_arg = if args.fleet_apps.is_empty() {
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
    };
    let (connection_arg, connection_text) = match args.connection_mode {
        ConnectionArg::Shared => (String::new(), ""),
        ConnectionArg::Fresh => (
            format!(
                " --connection-mode fresh --fresh-clients {}",
                args.fresh_clients
            ),
            " Every report on a fresh connection from a fresh UDP socket, as agents send (the \
             server's Retry, a full TLS 1.3 handshake, one stream, close), --fresh-clients in \
             flight at once; the server's per-source connection limits lifted.",
        ),
        ConnectionArg::Both => (
            format!(
                " --connection-mode both --fresh-clients {}",
                args.fresh_clients
            ),
            " `shared`: the clients share --connections connections (load testing only); \
             `fresh`: every report on a fresh connection from a fresh UDP socket, as agents send \
             (the server's Retry, a full TLS 1.3 handshake, one stream, close), --fresh-clients \
             in flight at once, the server's per-source connection limits lifted; the two in turn.",
        ),
    };
    let _ = writeln!(
        s,
        "`cargo xtask bench-ingest{binaries_arg}{admission_arg}{connection_arg}{fleet_arg} --rounds \
         {} --reports {} --clients {} --connections {}` on {}, {}: each run a fresh data \
         directory, `serve` on 127.0.0.1 and `loadgen` (5% invalid reports) as separate \
         processes; the binaries (and admission and connection modes) in turn, round after \
         round. Server CPU is read from /proc per thread after the run.{connection_text}{}\n",
        args.rounds,
        args.reports,
        args.clients,
        args.connections,
        machine::describe(),
        today_utc(),
        if args.admission == AdmissionArg::Open {
            ""
        } else {
            " With tokens the server verifies and spends a token per report (`--token-keys`), \
             and the load generator, its own issuer, mints them before the timed phase and \
             spends each (a MAC) in it; the invalid reports then include reports without and \
             with forged tokens."
        },
    );
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
    if runs.iter().any(|r| r.fleet.is_some()) {
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
    }
    let _ = writeln!(s);
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
    // With both modes of a kind: what the second costs against the first, per label, from
    // the medians.
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
