//! `cargo xtask bench-tor`: what the Tor route costs (issue 12), measured on a private Tor
//! network on loopback (`penrose-tornet`: 3 authorities, 2 middles, 2 exits of Debian's `tor`)
//! with arti as the agent uses it (`penrose-tor`).
//!
//! 1. The network: time from starting the 7 tors to a consensus a client can use.
//! 2. Bootstrap: a fresh [`Tor`] client with an empty state directory (cold), then again on
//!    the state directory of the first (warm: directory cached), each with the first stream
//!    after it.
//! 3. Isolated streams to a local TCP echo server, one after another: time to an open stream,
//!    and the circuit each ran on (each its own).
//! 4. Reports: the same `penrose_transport::serve` server, reports of a deployed report's
//!    size sent directly over UDP and over Tor (QUIC carried on a Tor stream, a fresh circuit
//!    per report), with 1 and with 8 concurrent senders: latency per report (median, p90) and
//!    reports per second, Tor against direct.
//! 5. The agent's memory: the release `penrose-agent run` (trace-replay source, test
//!    equipment) with `route = "tor"` and with `route = "direct"`, its VmRSS sampled from
//!    /proc and its VmHWM, for a minute each.
//!
//! The safety rule (docs/design.md section 5): the process moves into a network namespace
//! that has only loopback before anything else ([`enter_loopback_namespace`], called from
//! `main`), so neither the tors nor arti (which ships the public relays' list) can reach
//! another machine. It needs root.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use indicatif::{ProgressBar, ProgressStyle};
use penrose_core::counters::{CatalogueVersion, CounterId};
use penrose_core::fingerprint::SnippetHash;
use penrose_core::histogram::SampleCount;
use penrose_core::paillier::{KeyId, Keypair};
use penrose_core::wire::{
    Ack, AckStatus, Day, Message, PackedBytes, Report, ReportId, ThrottleHint, body_length,
};
use penrose_tor::{Tor, TorNetwork as Network};
use penrose_tornet::{TorNetwork, TorNetworkOptions};
use penrose_transport::{
    Client, ClientConfig, Encoding, Identity, Limits, Origin, ReportHandler, Route, Server,
    ServerConfig, Trust,
};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use xtask::machine;
use xtask::workspace::{target_dir, workspace_root};

/// The name in the test server's certificate.
const SERVER_NAME: &str = "aggregator.test";
/// Longest wait for the private network to become usable.
const NETWORK_READY: Duration = Duration::from_secs(300);
/// The traces the agent test fixtures replay (penrose-agent/tests/common).
const AGENT_TRACES: [&str; 3] = [
    "hta-trace_filter--sampled_rank-0.json.gz",
    "hta-trace_filter--sampled_rank-1.json.gz",
    "hta-ns_resolution_trace--rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
];
/// Longest wait for one stream, one report or one bootstrap.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// Arguments of `cargo xtask bench-tor`.
#[derive(clap::Args)]
pub struct Args {
    /// Bootstraps of a fresh client, cold (empty state directory) and as many warm (the
    /// first's state directory).
    #[arg(long, default_value_t = 5)]
    bootstraps: usize,
    /// Isolated streams opened one after another to a local TCP server (0 skips them).
    #[arg(long, default_value_t = 40)]
    streams: usize,
    /// Reports per route and concurrency (0 skips them).
    #[arg(long, default_value_t = 40)]
    reports: usize,
    /// Concurrent senders (comma-separated); each is run over both routes.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 8])]
    concurrency: Vec<usize>,
    /// How long each agent (Tor, then direct) runs for the memory figure; 0 skips it.
    #[arg(long, default_value_t = 60.0)]
    agent_seconds: f64,
    /// The traces the agents replay (file names in the trace folder, `PENROSE_TRACES`): the
    /// replay source parses them whole at start, which dominates the agent's memory.
    #[arg(
        long,
        value_delimiter = ',',
        default_values_t = AGENT_TRACES.map(String::from)
    )]
    agent_traces: Vec<String>,
    /// The agent binary to run [default: this tree's release build, built first].
    #[arg(long)]
    agent: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// The safety rule, first thing in `main` while the process has one thread: refuses without
/// `tor`, without root, or when the namespace cannot be made.
pub fn enter_loopback_namespace() -> Result<()> {
    ensure!(
        penrose_tornet::tor_installed(),
        "bench-tor needs Debian's tor and tor-gencert (apt-get install tor)"
    );
    penrose_tornet::enter_loopback_namespace()
        .context("entering a loopback-only network namespace (bench-tor must run as root)")?;
    penrose_tornet::check_loopback_only().context("checking the namespace")?;
    Ok(())
}

/// Everything measured.
#[derive(Serialize)]
struct Results {
    machine: String,
    /// The 1-minute load average at the start and at the end (other work on the machine).
    load_before: f64,
    load_after: f64,
    /// Starting the private network until a client can use it.
    network_ready_s: f64,
    network_readiness: String,
    bootstrap: BootstrapResult,
    streams: StreamResult,
    /// The report frame's bytes on the wire (prefix included).
    report_frame_bytes: usize,
    reports: Vec<ReportRun>,
    ratios: Vec<Ratio>,
    agents: Vec<AgentRun>,
    agent_binary: Option<BinarySize>,
}

#[derive(Serialize)]
struct BootstrapResult {
    cold_s: Vec<f64>,
    warm_s: Vec<f64>,
    cold_median_s: f64,
    warm_median_s: f64,
    /// The first stream after each bootstrap (its circuit may be built then).
    first_stream_cold_ms: Vec<f64>,
    first_stream_warm_ms: Vec<f64>,
    first_stream_cold_median_ms: f64,
    first_stream_warm_median_ms: f64,
}

#[derive(Serialize)]
struct StreamResult {
    opened: usize,
    failed: usize,
    open_ms: Vec<f64>,
    median_ms: f64,
    p90_ms: f64,
    max_ms: f64,
    /// Distinct circuit ids among the opened streams (equal to `opened`: each its own).
    distinct_circuits: usize,
    /// Streams whose circuit arti could not name.
    unnamed_circuits: usize,
}

#[derive(Serialize)]
struct ReportRun {
    route: &'static str,
    concurrency: usize,
    reports: usize,
    acked: usize,
    failed: usize,
    latency_median_ms: f64,
    latency_p90_ms: f64,
    latency_max_ms: f64,
    reports_per_second: f64,
    /// Over Tor: distinct circuits among the run's streams, and streams opened (counted by
    /// the client, failed QUIC attempts included).
    distinct_circuits: Option<usize>,
    tor_streams: Option<u64>,
    /// Reports the server saw on its stream port (from an exit) and over UDP in this run.
    server_carried: u64,
    server_udp: u64,
}

#[derive(Serialize)]
struct Ratio {
    concurrency: usize,
    /// Tor's median latency over direct's.
    latency_median: f64,
    latency_p90: f64,
    /// Direct's reports per second over Tor's.
    throughput: f64,
}

#[derive(Serialize)]
struct AgentRun {
    route: &'static str,
    seconds: f64,
    /// The largest VmRSS sampled (every 250 ms).
    peak_rss_mib: f64,
    /// The kernel's high-water mark of the resident set at the last sample.
    vm_hwm_mib: f64,
    last_rss_mib: f64,
    max_threads: u64,
    uploads_accepted: u64,
    uploads_failed: u64,
    tor_streams: u64,
    tor_stream_failures: u64,
    /// The agent's status file's last error, if any.
    last_error: Option<String>,
}

#[derive(Serialize)]
struct BinarySize {
    path: String,
    bytes: u64,
    stripped_bytes: Option<u64>,
}

/// Acks every frame, counting where frames came from.
#[derive(Default)]
struct AckAll {
    carried: AtomicU64,
    udp: AtomicU64,
}

impl ReportHandler for AckAll {
    fn arrived_from(&self, origin: Origin) {
        let counter = if origin.carrier.is_some() {
            &self.carried
        } else {
            &self.udp
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    async fn handle(&self, body: Vec<u8>) -> Ack {
        let report_id = match Message::decode_body(&body) {
            Ok(Message::Report(r)) => r.report_id,
            _ => ReportId([0; 16]),
        };
        Ack {
            report_id,
            status: AckStatus::Accepted,
            throttle: ThrottleHint::FULL_RATE,
        }
    }
}

impl AckAll {
    fn counts(&self) -> (u64, u64) {
        (
            self.carried.load(Ordering::Relaxed),
            self.udp.load(Ordering::Relaxed),
        )
    }
}

/// Runs the task (in the namespace `main` entered).
pub fn run(args: Args) -> Result<()> {
    ensure!(args.bootstraps > 0, "--bootstraps must be at least 1");
    ensure!(
        args.concurrency.iter().all(|&c| c > 0),
        "--concurrency values must be at least 1"
    );
    penrose_tornet::check_loopback_only().context("bench-tor runs in a loopback namespace")?;
    let say = |line: &str| {
        if !args.json {
            eprintln!("{line}");
        }
    };
    let root = workspace_root()?;
    let agent_binary = if args.agent_seconds > 0.0 {
        Some(agent_binary(&args, &root, &say)?)
    } else {
        None
    };
    let load_before = load_average();
    let dir = tempfile::Builder::new()
        .prefix("penrose-bench-tor-")
        .tempdir()?;
    let mut private = PrivateNetwork::start(dir.path(), &say)?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let outcome = runtime.block_on(measure_all(
        &args,
        dir.path(),
        &private,
        agent_binary.as_deref(),
        &say,
    ));
    let (measured, agents) = match outcome {
        Ok(measured) => measured,
        Err(e) => {
            private.net.stop().ok();
            return Err(e);
        }
    };
    private
        .net
        .stop()
        .context("stopping the private Tor network")?;
    drop(runtime);

    let ratios = ratios(&measured.reports);
    let results = Results {
        machine: machine::describe(),
        load_before,
        load_after: load_average(),
        network_ready_s: private.ready_s,
        network_readiness: private.readiness,
        bootstrap: measured.bootstrap,
        streams: measured.streams,
        report_frame_bytes: measured.report_frame_bytes,
        reports: measured.reports,
        ratios,
        agents,
        agent_binary: agent_binary.as_deref().map(binary_size).transpose()?,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        println!("{}", markdown(&args, &results));
    }
    Ok(())
}

/// The private Tor network, usable, and arti's description of it.
struct PrivateNetwork {
    net: TorNetwork,
    /// How it became usable, as the results give it.
    readiness: String,
    /// Seconds from starting the tors to usable.
    ready_s: f64,
    /// arti's configuration of the network (for the agent).
    arti_file: PathBuf,
    /// The network as arti clients are given it.
    network: Network,
}

impl PrivateNetwork {
    /// Starts the 7 tors under `dir` and waits until a client can use them.
    fn start(dir: &Path, say: &dyn Fn(&str)) -> Result<Self> {
        say("starting the private Tor network (3 authorities, 2 middles, 2 exits)");
        let started = Instant::now();
        let mut net = TorNetwork::start(TorNetworkOptions::new(dir.join("tor-net")))
            .context("starting the private Tor network")?;
        let readiness = net
            .wait_ready(NETWORK_READY)
            .context("waiting for the private Tor network")?;
        let ready_s = started.elapsed().as_secs_f64();
        say(&format!(
            "network usable after {ready_s:.1} s: {readiness:?}"
        ));
        let arti_file = dir.join("arti-network.toml");
        std::fs::write(&arti_file, net.arti_toml())?;
        Ok(Self {
            net,
            readiness: format!("{readiness:?}"),
            ready_s,
            network: Network::Private(arti_file.clone()),
            arti_file,
        })
    }
}

/// Everything measured on the network: the bootstraps, streams and reports, then the agents
/// (when there is a binary to run), the test server shut down at the end.
async fn measure_all(
    args: &Args,
    dir: &Path,
    private: &PrivateNetwork,
    agent_binary: Option<&Path>,
    say: &dyn Fn(&str),
) -> Result<(Measured, Vec<AgentRun>)> {
    let (measured, server) = measure(args, dir, &private.network, say).await?;
    let agents = match agent_binary {
        Some(bin) => agent_runs(args, bin, dir, &private.arti_file, &server, say).await,
        None => Ok(Vec::new()),
    };
    server.server.shutdown().await;
    Ok((measured, agents?))
}

/// The test server, kept for the agent runs.
struct TestServer {
    server: Server,
    identity: Identity,
}

/// What [`measure`] measured (it also returns the server the agents send to next).
struct Measured {
    bootstrap: BootstrapResult,
    streams: StreamResult,
    /// The report frame's bytes on the wire (prefix included).
    report_frame_bytes: usize,
    reports: Vec<ReportRun>,
}

async fn measure(
    args: &Args,
    dir: &Path,
    network: &Network,
    say: &dyn Fn(&str),
) -> Result<(Measured, TestServer)> {
    let echo = start_echo_server().await?;
    let echo_target = echo.to_string();
    let bootstrap = bootstraps(args, dir, network, &echo_target).await?;
    say(&format!(
        "bootstrap: cold median {:.3} s, warm median {:.3} s",
        bootstrap.cold_median_s, bootstrap.warm_median_s
    ));

    // One client for the streams and the reports, bootstrapped on a directory of its own.
    let tor = Tor::new(network.clone(), &dir.join("arti-main"))?;
    timed(tor.bootstrap(), "bootstrapping").await??;
    let mut circuits_seen = HashSet::new();
    let streams = isolated_streams(args, &tor, &echo_target, &mut circuits_seen).await?;
    say(&format!(
        "streams: {} opened, median {:.1} ms, p90 {:.1} ms, {} distinct circuits",
        streams.opened, streams.median_ms, streams.p90_ms, streams.distinct_circuits
    ));

    // Reports to one server, over UDP and over Tor.
    let (server, handler) = start_report_server().await?;
    let (report_frame_bytes, reports) =
        report_runs(args, &tor, &server, &handler, &mut circuits_seen, say).await?;
    drop(tor);
    let measured = Measured {
        bootstrap,
        streams,
        report_frame_bytes,
        reports,
    };
    Ok((measured, server))
}

/// Bootstraps: cold on fresh directories, then warm on the first's.
async fn bootstraps(
    args: &Args,
    dir: &Path,
    network: &Network,
    echo_target: &str,
) -> Result<BootstrapResult> {
    let bar = progress(args, (2 * args.bootstraps) as u64, "bootstraps");
    let mut cold = Vec::new();
    let mut first_cold = Vec::new();
    for i in 0..args.bootstraps {
        let state = dir.join(format!("arti-cold-{i}"));
        let (took, first) = bootstrap_once(network, &state, echo_target).await?;
        cold.push(took);
        first_cold.push(first);
        bar.inc(1);
    }
    let mut warm = Vec::new();
    let mut first_warm = Vec::new();
    for _ in 0..args.bootstraps {
        let (took, first) = bootstrap_once(network, &dir.join("arti-cold-0"), echo_target).await?;
        warm.push(took);
        first_warm.push(first);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(BootstrapResult {
        cold_median_s: median(&cold).as_secs_f64(),
        warm_median_s: median(&warm).as_secs_f64(),
        first_stream_cold_median_ms: ms(median(&first_cold)),
        first_stream_warm_median_ms: ms(median(&first_warm)),
        cold_s: cold.iter().map(Duration::as_secs_f64).collect(),
        warm_s: warm.iter().map(Duration::as_secs_f64).collect(),
        first_stream_cold_ms: first_cold.iter().copied().map(ms).collect(),
        first_stream_warm_ms: first_warm.iter().copied().map(ms).collect(),
    })
}

/// The `penrose_transport::serve` server the reports (and later the agents) go to, with a
/// stream port for reports carried from an exit; its handler counts where they came from.
async fn start_report_server() -> Result<(TestServer, Arc<AckAll>)> {
    let identity = Identity::self_signed([SERVER_NAME])?;
    let handler = Arc::new(AckAll::default());
    let server = penrose_transport::serve(
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            identity: identity.clone(),
            limits: Limits {
                reports_per_second: None,
                new_connections_per_source_per_second: None,
                ..Limits::default()
            },
            stream_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        },
        handler.clone(),
    )
    .await?;
    Ok((TestServer { server, identity }, handler))
}

/// Reports over UDP and over Tor at each concurrency: the frame's bytes, and each run.
async fn report_runs(
    args: &Args,
    tor: &Arc<Tor>,
    server: &TestServer,
    handler: &AckAll,
    circuits_seen: &mut HashSet<String>,
    say: &dyn Fn(&str),
) -> Result<(usize, Vec<ReportRun>)> {
    let stream_addr = server
        .server
        .stream_addr()
        .context("the server's stream port")?;
    let template = report()?;
    let frame = Message::Report(template.clone()).to_frame()?;
    let report_frame_bytes = body_length(&frame)? + 4;
    let direct = ClientConfig::new(
        server.server.local_addr(),
        SERVER_NAME,
        Trust::pin(&server.identity),
    );
    let mut over_tor = direct.clone();
    over_tor.route = Route::Carried(Arc::new(tor.dialer(stream_addr.to_string())));
    over_tor.connect_timeout = Duration::from_secs(30);
    over_tor.ack_timeout = Duration::from_secs(30);
    let direct = Arc::new(Client::new(direct)?);
    let over_tor = Arc::new(Client::new(over_tor)?);
    let mut runs = Vec::new();
    let concurrencies = if args.reports == 0 {
        &[][..]
    } else {
        &args.concurrency[..]
    };
    for &concurrency in concurrencies {
        for (route, client) in [("direct", &direct), ("tor", &over_tor)] {
            let sending = Sending {
                route,
                client,
                template: &template,
                concurrency,
            };
            let run = counted_run(args, sending, tor, handler, circuits_seen).await;
            say(&format!(
                "{route} x{concurrency}: {}/{} acked, median {:.1} ms, p90 {:.1} ms, {:.1} reports/s",
                run.acked,
                run.reports,
                run.latency_median_ms,
                run.latency_p90_ms,
                run.reports_per_second
            ));
            runs.push(run);
        }
    }
    direct.close().await;
    over_tor.close().await;
    drop(over_tor);
    Ok((report_frame_bytes, runs))
}

/// One run of reports: the route, its client, the report sent and how many senders.
struct Sending<'a> {
    route: &'static str,
    client: &'a Arc<Client>,
    template: &'a Report,
    concurrency: usize,
}

/// [`send_reports`], with what the server saw arrive and, over Tor, the streams opened and
/// the circuits not seen before.
async fn counted_run(
    args: &Args,
    sending: Sending<'_>,
    tor: &Tor,
    handler: &AckAll,
    circuits_seen: &mut HashSet<String>,
) -> ReportRun {
    let Sending {
        route,
        client,
        template,
        concurrency,
    } = sending;
    let before_server = handler.counts();
    let before_tor = tor.counts();
    let mut run = send_reports(args, route, client, template, concurrency).await;
    let after_server = handler.counts();
    run.server_carried = after_server.0 - before_server.0;
    run.server_udp = after_server.1 - before_server.1;
    if route == "tor" {
        let opened = tor.counts().0 - before_tor.0;
        run.tor_streams = Some(opened);
        // The client remembers its last 64 streams.
        let records = tor.streams();
        let recent = &records[records.len().saturating_sub(opened as usize)..];
        let fresh: HashSet<_> = recent
            .iter()
            .filter_map(|r| r.circuit.clone())
            .filter(|c| !circuits_seen.contains(c))
            .collect();
        run.distinct_circuits = Some(fresh.len());
        circuits_seen.extend(fresh);
    }
    run
}

/// A fresh client on `state`, bootstrapped, then one stream: (bootstrap, first stream).
async fn bootstrap_once(
    network: &Network,
    state: &Path,
    target: &str,
) -> Result<(Duration, Duration)> {
    let tor = Tor::new(network.clone(), state)?;
    let took = timed(tor.bootstrap(), "bootstrapping").await??;
    let started = Instant::now();
    let mut stream = timed(tor.open(target), "the first stream").await??;
    let first = started.elapsed();
    echo_byte(&mut stream).await?;
    drop(stream);
    drop(tor);
    // Lets arti's tasks of this client wind down and release the state directory's lock.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok((took, first))
}

async fn isolated_streams(
    args: &Args,
    tor: &Tor,
    target: &str,
    circuits_seen: &mut HashSet<String>,
) -> Result<StreamResult> {
    let bar = progress(args, args.streams as u64, "streams");
    let mut times = Vec::new();
    let mut failed = 0;
    let mut unnamed = 0;
    let mut distinct = HashSet::new();
    for _ in 0..args.streams {
        let started = Instant::now();
        match timed(tor.open(target), "a stream").await {
            Ok(Ok(mut stream)) => {
                times.push(started.elapsed());
                echo_byte(&mut stream).await?;
                match tor.streams().last().and_then(|r| r.circuit.clone()) {
                    Some(circuit) => {
                        distinct.insert(circuit);
                    }
                    None => unnamed += 1,
                }
            }
            _ => failed += 1,
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    ensure!(args.streams == 0 || !times.is_empty(), "no stream opened");
    circuits_seen.extend(distinct.iter().cloned());
    Ok(StreamResult {
        opened: times.len(),
        failed,
        median_ms: ms(median(&times)),
        p90_ms: ms(percentile(&times, 0.9)),
        max_ms: ms(times.iter().copied().max().unwrap_or_default()),
        open_ms: times.iter().copied().map(ms).collect(),
        distinct_circuits: distinct.len(),
        unnamed_circuits: unnamed,
    })
}

/// `args.reports` reports over `client` with `concurrency` senders.
async fn send_reports(
    args: &Args,
    route: &'static str,
    client: &Arc<Client>,
    template: &Report,
    concurrency: usize,
) -> ReportRun {
    let bar = progress(
        args,
        args.reports as u64,
        &format!("{route} x{concurrency}"),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let client = Arc::clone(client);
        let next = Arc::clone(&next);
        let bar = bar.clone();
        let mut report = template.clone();
        let total = args.reports;
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut failed = 0usize;
            while next.fetch_add(1, Ordering::Relaxed) < total {
                report.report_id = ReportId(rand::random());
                let sent = Instant::now();
                match tokio::time::timeout(STEP_TIMEOUT, client.send(&report)).await {
                    Ok(Ok(ack)) if ack.status == AckStatus::Accepted => {
                        latencies.push(sent.elapsed());
                    }
                    _ => failed += 1,
                }
                bar.inc(1);
            }
            (latencies, failed)
        }));
    }
    let mut latencies = Vec::new();
    let mut failed = 0;
    for task in tasks {
        match task.await {
            Ok((l, f)) => {
                latencies.extend(l);
                failed += f;
            }
            Err(_) => failed += 1,
        }
    }
    let wall = started.elapsed();
    bar.finish_and_clear();
    ReportRun {
        route,
        concurrency,
        reports: args.reports,
        acked: latencies.len(),
        failed,
        latency_median_ms: ms(median(&latencies)),
        latency_p90_ms: ms(percentile(&latencies, 0.9)),
        latency_max_ms: ms(latencies.iter().copied().max().unwrap_or_default()),
        reports_per_second: latencies.len() as f64 / wall.as_secs_f64(),
        distinct_circuits: None,
        tor_streams: None,
        server_carried: 0,
        server_udp: 0,
    }
}

/// A report of a deployed report's size (two 512-byte ciphertexts; the frame's size is in
/// the results), without an admission token; each send gives it a random id.
fn report() -> Result<Report> {
    Ok(Report {
        key_id: KeyId([1; 32]),
        report_id: ReportId([0; 16]),
        snippet: SnippetHash([2; 32]),
        locator: penrose_core::fingerprint::Locator([0; penrose_core::fingerprint::LOCATOR_BANDS]),
        arch: penrose_core::gpu::GpuArch::new(9, 0),
        counter: CounterId(1),
        catalogue: CatalogueVersion(1),
        day: Day(20_000),
        samples: SampleCount(100),
        ciphertexts: PackedBytes::new(vec![0x5a; 1024], 2)?,
        token: None,
        evidence: None,
    })
}

fn ratios(runs: &[ReportRun]) -> Vec<Ratio> {
    let mut out = Vec::new();
    for direct in runs.iter().filter(|r| r.route == "direct") {
        let Some(tor) = runs
            .iter()
            .find(|r| r.route == "tor" && r.concurrency == direct.concurrency)
        else {
            continue;
        };
        out.push(Ratio {
            concurrency: direct.concurrency,
            latency_median: tor.latency_median_ms / direct.latency_median_ms,
            latency_p90: tor.latency_p90_ms / direct.latency_p90_ms,
            throughput: direct.reports_per_second / tor.reports_per_second,
        });
    }
    out
}

/// A TCP server on 127.0.0.1 that echoes what it reads.
async fn start_echo_server() -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 256];
                while let Ok(n) = socket.read(&mut buf).await {
                    if n == 0 || socket.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    Ok(addr)
}

/// One byte there and back, so that the stream is known to work end to end.
async fn echo_byte<S>(stream: &mut S) -> Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    timed(
        async {
            stream.write_all(b"x").await?;
            stream.flush().await?;
            let mut byte = [0u8; 1];
            stream.read_exact(&mut byte).await?;
            ensure!(&byte == b"x", "the echo server answered {byte:?}");
            Ok(())
        },
        "the echo",
    )
    .await?
}

async fn timed<T>(future: impl Future<Output = T>, what: &str) -> Result<T> {
    tokio::time::timeout(STEP_TIMEOUT, future)
        .await
        .with_context(|| format!("{what} took over {STEP_TIMEOUT:?}"))
}

/// The agent binary: given, or this tree's release build (built now, offline: the namespace
/// has no network).
fn agent_binary(args: &Args, root: &Path, say: &dyn Fn(&str)) -> Result<PathBuf> {
    if let Some(path) = &args.agent {
        ensure!(path.is_file(), "--agent {} is not a file", path.display());
        return Ok(path.clone());
    }
    say("building the release agent");
    let status = Command::new(env!("CARGO"))
        .current_dir(root)
        .args([
            "build",
            "--release",
            "--offline",
            "-p",
            "penrose-agent",
            "--bin",
            "penrose-agent",
            "--features",
            "penrose-agent/test-util",
        ])
        .status()
        .context("running cargo build")?;
    ensure!(status.success(), "cargo build failed: {status}");
    Ok(target_dir(root).join("release/penrose-agent"))
}

/// Runs the agent over Tor, then directly, sampling its memory.
async fn agent_runs(
    args: &Args,
    bin: &Path,
    dir: &Path,
    arti_file: &Path,
    server: &TestServer,
    say: &dyn Fn(&str),
) -> Result<Vec<AgentRun>> {
    let files = dir.join("agent-files");
    std::fs::create_dir_all(&files)?;
    let cert = files.join("aggregator.pem");
    server
        .identity
        .save(&cert, &files.join("aggregator.key"), Encoding::Pem)?;
    let key = files.join("public.key");
    let keys = tokio::task::spawn_blocking(|| Keypair::generate(&mut rand::rng())).await?;
    std::fs::write(&key, keys.public_key().to_bytes())?;
    let traces = files.join("traces");
    std::fs::create_dir_all(&traces)?;
    let source = penrose_traces::TraceFolder::default_dir();
    for name in &args.agent_traces {
        let from = source.join(name);
        ensure!(
            from.exists(),
            "{} missing (set PENROSE_TRACES)",
            from.display()
        );
        std::os::unix::fs::symlink(&from, traces.join(name))?;
    }
    let stream = server.server.stream_addr().context("stream port")?;
    let mut runs = Vec::new();
    for route in ["tor", "direct"] {
        let state = dir.join(format!("agent-{route}"));
        let transport = if route == "tor" {
            format!(
                "[transport]\nroute = \"tor\"\ntor_network = \"{}\"\naggregator_stream = \
                 \"{stream}\"\ntor_connect_timeout_seconds = 10.0\n",
                arti_file.display()
            )
        } else {
            "[transport]\nroute = \"direct\"\n".to_string()
        };
        let config = dir.join(format!("agent-{route}.toml"));
        std::fs::write(
            &config,
            agent_config(
                &state,
                server.server.local_addr(),
                &cert,
                &key,
                &traces,
                &transport,
            ),
        )?;
        say(&format!(
            "agent with route = \"{route}\" for {:.0} s",
            args.agent_seconds
        ));
        let log = dir.join(format!("agent-{route}.log"));
        let child = spawn_agent(bin, &config, &log)?;
        let run = sample_agent(args, route, child, &state, &log).await?;
        say(&format!(
            "agent {route}: peak VmRSS {:.1} MiB, VmHWM {:.1} MiB, {} uploads accepted",
            run.peak_rss_mib, run.vm_hwm_mib, run.uploads_accepted
        ));
        runs.push(run);
    }
    Ok(runs)
}

/// The tor test's fast agent configuration (penrose-agent/tests/common `Fixture::config`,
/// with the Tor test's patience): replayed traces, a sealed report every few seconds.
fn agent_config(
    state: &Path,
    addr: SocketAddr,
    cert: &Path,
    key: &Path,
    traces: &Path,
    transport: &str,
) -> String {
    format!(
        r#"state_dir = "{state}"

[aggregator]
address = "{addr}"
server_name = "{SERVER_NAME}"
certificate = "{cert}"

[design]
public_key = "{key}"

[capture]
source = "test-replay"
counters = "test-standin-ring"
window_launches = 2000
sample_period = 20

[replay]
traces = "{traces}"
window_seconds = 0.2

[seal]
samples = 40
max_age_seconds = 2.0

[upload]
delay_max_seconds = 0.02
attempts = 3
backoff_base_seconds = 0.05
backoff_max_seconds = 0.3
connect_timeout_seconds = 0.5
ack_timeout_seconds = 20.0

{transport}"#,
        state = state.display(),
        cert = cert.display(),
        key = key.display(),
        traces = traces.display(),
    )
}

fn spawn_agent(bin: &Path, config: &Path, log: &Path) -> Result<Child> {
    let log = std::fs::File::create(log)?;
    Command::new(bin)
        .args(["run", "--config"])
        .arg(config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting penrose-agent run")
}

/// Samples the agent's /proc status every 250 ms for `--agent-seconds`, then stops it.
async fn sample_agent(
    args: &Args,
    route: &'static str,
    mut child: Child,
    state: &Path,
    log: &Path,
) -> Result<AgentRun> {
    let pid = child.id();
    let bar = progress(
        args,
        args.agent_seconds.ceil() as u64,
        &format!("agent {route}"),
    );
    let started = Instant::now();
    let limit = Duration::from_secs_f64(args.agent_seconds);
    let (mut peak, mut hwm, mut last, mut threads) = (0u64, 0u64, 0u64, 0u64);
    while started.elapsed() < limit {
        if let Some(status) = child.try_wait()? {
            bail!("the agent ({route}) exited early ({status}): {}", tail(log));
        }
        if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            let rss = status_kib(&text, "VmRSS:");
            peak = peak.max(rss);
            last = rss;
            hwm = hwm.max(status_kib(&text, "VmHWM:"));
            threads = threads.max(status_kib(&text, "Threads:"));
        }
        bar.set_position(started.elapsed().as_secs());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    bar.finish_and_clear();
    let status = penrose_agent::status::AgentStatus::read(state).ok();
    let stopped = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    ensure!(stopped.success(), "kill -TERM {pid} failed");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            child.kill().ok();
            child.wait().ok();
            bail!("the agent ({route}) did not stop within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mib = |kib: u64| kib as f64 / 1024.0;
    Ok(AgentRun {
        route,
        seconds: started.elapsed().as_secs_f64(),
        peak_rss_mib: mib(peak),
        vm_hwm_mib: mib(hwm),
        last_rss_mib: mib(last),
        max_threads: threads,
        uploads_accepted: status.as_ref().map_or(0, |s| s.uploads.accepted),
        uploads_failed: status.as_ref().map_or(0, |s| s.uploads.failed),
        tor_streams: status.as_ref().map_or(0, |s| s.route.tor_streams),
        tor_stream_failures: status.as_ref().map_or(0, |s| s.route.tor_stream_failures),
        last_error: status.and_then(|s| s.last_error.or(s.uploads.last_error)),
    })
}

/// A `Key:   1234 kB` line of /proc/PID/status, as a number (kB for sizes).
fn status_kib(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<_> = text.lines().rev().take(5).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join("\n")
}

fn binary_size(path: &Path) -> Result<BinarySize> {
    let bytes = std::fs::metadata(path)?.len();
    let stripped = tempfile::NamedTempFile::new()?;
    let stripped_bytes = Command::new("strip")
        .arg("-o")
        .arg(stripped.path())
        .arg(path)
        .status()
        .ok()
        .filter(std::process::ExitStatus::success)
        .and_then(|_| std::fs::metadata(stripped.path()).ok())
        .map(|m| m.len());
    Ok(BinarySize {
        path: path.display().to_string(),
        bytes,
        stripped_bytes,
    })
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

fn progress(args: &Args, len: u64, what: &str) -> ProgressBar {
    if args.json {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {prefix}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_prefix(what.to_string());
    bar
}

fn median(values: &[Duration]) -> Duration {
    percentile(values, 0.5)
}

/// The nearest-rank percentile (zero for no values).
fn percentile(values: &[Duration], p: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = values.to_vec();
    sorted.sort();
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn markdown(args: &Args, r: &Results) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Machine: {} (load average {:.1} before, {:.1} after)\n",
        r.machine, r.load_before, r.load_after
    );
    s.push_str(&measures_table(r));
    s.push_str(&reports_table(args, r));
    s.push_str(&agents_table(r));
    s
}

/// The network, the bootstraps, the streams and the agent's binary.
fn measures_table(r: &Results) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| measure | value |\n|---|---|");
    let _ = writeln!(
        s,
        "| private network (7 tors) start to usable | {:.1} s |",
        r.network_ready_s
    );
    let b = &r.bootstrap;
    let _ = writeln!(
        s,
        "| arti bootstrap, cold (empty state dir), median of {} | {:.3} s (runs: {}) |",
        b.cold_s.len(),
        b.cold_median_s,
        list(&b.cold_s, 3)
    );
    let _ = writeln!(
        s,
        "| arti bootstrap, warm (cached directory), median of {} | {:.3} s (runs: {}) |",
        b.warm_s.len(),
        b.warm_median_s,
        list(&b.warm_s, 3)
    );
    let _ = writeln!(
        s,
        "| first stream after a cold / warm bootstrap, median | {:.1} ms / {:.1} ms |",
        b.first_stream_cold_median_ms, b.first_stream_warm_median_ms
    );
    let st = &r.streams;
    let _ = writeln!(
        s,
        "| isolated stream to a local TCP server, open time ({} opened, {} failed) | median {:.1} ms, p90 {:.1} ms, max {:.1} ms |",
        st.opened, st.failed, st.median_ms, st.p90_ms, st.max_ms
    );
    let _ = writeln!(
        s,
        "| circuits of those streams | {} distinct of {} ({} unnamed) |",
        st.distinct_circuits, st.opened, st.unnamed_circuits
    );
    if let Some(bin) = &r.agent_binary {
        let _ = writeln!(
            s,
            "| release agent binary | {:.1} MiB ({:.1} MiB stripped) |",
            bin.bytes as f64 / 1048576.0,
            bin.stripped_bytes
                .map_or(f64::NAN, |b| b as f64 / 1048576.0)
        );
    }
    s
}

/// Each run of reports, then Tor against direct at each concurrency.
fn reports_table(args: &Args, r: &Results) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nReports ({} bytes a frame, {} per run), one `penrose_transport::serve` server; over Tor each report is a fresh QUIC connection on a fresh Tor stream and circuit:\n",
        r.report_frame_bytes, args.reports
    );
    let _ = writeln!(
        s,
        "| route | senders | acked / failed | latency median | p90 | max | reports/s | new circuits / streams | server saw carried / UDP |\n|---|---|---|---|---|---|---|---|---|"
    );
    for run in &r.reports {
        let circuits = match (run.distinct_circuits, run.tor_streams) {
            (Some(c), Some(t)) => format!("{c} / {t}"),
            _ => String::new(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} / {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} | {} | {} / {} |",
            run.route,
            run.concurrency,
            run.acked,
            run.failed,
            run.latency_median_ms,
            run.latency_p90_ms,
            run.latency_max_ms,
            run.reports_per_second,
            circuits,
            run.server_carried,
            run.server_udp
        );
    }
    for ratio in &r.ratios {
        let _ = writeln!(
            s,
            "\n- {} sender(s): Tor's median latency {:.1} x direct's (p90 {:.1} x); direct sends {:.1} x the reports/s",
            ratio.concurrency, ratio.latency_median, ratio.latency_p90, ratio.throughput
        );
    }
    s
}

/// The agent's memory over each route (nothing when no agent ran).
fn agents_table(r: &Results) -> String {
    let mut s = String::new();
    if r.agents.is_empty() {
        return s;
    }
    let _ = writeln!(
        s,
        "\nAgent memory (release `penrose-agent run`, trace-replay source, sampled every 250 ms):\n"
    );
    let _ = writeln!(
        s,
        "| route | seconds | peak VmRSS | VmHWM | last VmRSS | threads (max) | uploads accepted / failed | Tor streams / failures | under 64 MiB |\n|---|---|---|---|---|---|---|---|---|"
    );
    for a in &r.agents {
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.1} MiB | {:.1} MiB | {:.1} MiB | {} | {} / {} | {} / {} | {} |",
            a.route,
            a.seconds,
            a.peak_rss_mib,
            a.vm_hwm_mib,
            a.last_rss_mib,
            a.max_threads,
            a.uploads_accepted,
            a.uploads_failed,
            a.tor_streams,
            a.tor_stream_failures,
            if a.vm_hwm_mib.max(a.peak_rss_mib) < 64.0 {
                "yes"
            } else {
                "no"
            }
        );
    }
    s
}

fn list(values: &[f64], decimals: usize) -> String {
    values
        .iter()
        .map(|v| format!("{v:.decimals$}"))
        .collect::<Vec<_>>()
        .join(", ")
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

    fn report_run(route: &'static str, concurrency: usize, x: f64) -> ReportRun {
        ReportRun {
            route,
            concurrency,
            reports: 40,
            acked: 39,
            failed: 1,
            latency_median_ms: 12.34 * x,
            latency_p90_ms: 23.45 * x,
            latency_max_ms: 45.67 * x,
            reports_per_second: 78.9 / x,
            distinct_circuits: (route == "tor").then_some(38),
            tor_streams: (route == "tor").then_some(41),
            server_carried: if route == "tor" { 40 } else { 0 },
            server_udp: if route == "tor" { 0 } else { 40 },
        }
    }

    fn results(full: bool) -> Results {
        let reports = vec![
            report_run("direct", 1, 1.0),
            report_run("tor", 1, 7.5),
            report_run("direct", 8, 1.3),
            report_run("tor", 8, 9.1),
        ];
        Results {
            machine: "machine M".into(),
            load_before: 0.53,
            load_after: 1.27,
            network_ready_s: 23.456,
            network_readiness: "Ready".into(),
            bootstrap: BootstrapResult {
                cold_s: vec![1.2345, 2.3456, 1.1111],
                warm_s: vec![0.1234, 0.2345],
                cold_median_s: 1.2345,
                warm_median_s: 0.1789,
                first_stream_cold_ms: vec![12.0, 13.0],
                first_stream_warm_ms: vec![10.0, 11.0],
                first_stream_cold_median_ms: 12.5,
                first_stream_warm_median_ms: 10.25,
            },
            streams: StreamResult {
                opened: 39,
                failed: 1,
                open_ms: vec![1.0, 2.0],
                median_ms: 34.56,
                p90_ms: 45.67,
                max_ms: 99.9,
                distinct_circuits: 38,
                unnamed_circuits: 1,
            },
            report_frame_bytes: 1234,
            ratios: if full { ratios(&reports) } else { Vec::new() },
            reports: if full { reports } else { Vec::new() },
            agents: if full {
                vec![
                    AgentRun {
                        route: "tor",
                        seconds: 60.2,
                        peak_rss_mib: 45.6,
                        vm_hwm_mib: 47.8,
                        last_rss_mib: 44.4,
                        max_threads: 9,
                        uploads_accepted: 30,
                        uploads_failed: 1,
                        tor_streams: 31,
                        tor_stream_failures: 1,
                        last_error: None,
                    },
                    AgentRun {
                        route: "direct",
                        seconds: 60.1,
                        peak_rss_mib: 65.6,
                        vm_hwm_mib: 47.8,
                        last_rss_mib: 44.4,
                        max_threads: 5,
                        uploads_accepted: 31,
                        uploads_failed: 0,
                        tor_streams: 0,
                        tor_stream_failures: 0,
                        last_error: Some("x".into()),
                    },
                ]
            } else {
                Vec::new()
            },
            agent_binary: full.then(|| BinarySize {
                path: "/x".into(),
                bytes: 12_345_678,
                stripped_bytes: Some(9_876_543),
            }),
        }
    }

    #[test]
    fn markdown_leaves_out_what_was_not_measured() {
        let args = Cli::parse_from(["x"]).args;
        let full = markdown(&args, &results(true));
        assert!(full.starts_with("Machine: machine M (load average 0.5 before, 1.3 after)\n"));
        for part in [
            "| arti bootstrap, cold (empty state dir), median of 3 | 1.234 s (runs: 1.234, 2.346, 1.111) |",
            "| release agent binary | 11.8 MiB (9.4 MiB stripped) |",
            "\nReports (1234 bytes a frame, 40 per run)",
            "| tor | 8 | 39 / 1 | 112.3 ms |",
            "\n- 8 sender(s): Tor's median latency 7.0 x direct's",
            "\nAgent memory",
            "| 5 | 31 / 0 | 0 / 0 | no |",
        ] {
            assert!(full.contains(part), "{part:?} missing from {full}");
        }
        let bare = markdown(&args, &results(false));
        for part in ["release agent binary", "\n- ", "Agent memory", "| tor |"] {
            assert!(!bare.contains(part), "{part:?} in {bare}");
        }
    }
}
