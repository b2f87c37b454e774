//! The agent over Tor, for real: a private Tor network on loopback (`penrose-tornet`: 3
//! directory authorities, 2 middles, 2 exits, Debian's `tor`), agents (the real binary) that
//! send with `transport.route = "tor"` through arti, and a stand-in aggregator that takes QUIC
//! on its stream port and asks, for every connection, which exit's process holds its other end.
//!
//! - Several agents upload through Tor: every report is acked and stored once, every
//!   connection the server sees comes from an exit, and none from an agent's socket.
//! - Isolation: each agent's consecutive streams ran on different circuits (arti's circuit
//!   ids, from the agents' status).
//! - The Tor network's relays stop mid-upload and come back: reports stay spooled, then
//!   arrive, each once.
//! - The safety rule (docs/design.md section 5): this binary moves into a network namespace
//!   that has only loopback before it starts anything, and fails if it is not in one; the
//!   arti configuration replaces the public relay list (the agent refuses one that does not:
//!   `penrose_tor::network` tests and the last case here).
//!
//! `harness = false`: the namespace must be entered while the process has one thread.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use penrose_core::wire::{Ack, AckStatus, ReportId};
use penrose_tornet::{ExitFinder, Holder, TorNetwork, TorNetworkOptions};
use penrose_transport::{Identity, Limits, Origin, ReportHandler, Server, ServerConfig};

const READY: Duration = Duration::from_secs(300);
const UPLOADS: Duration = Duration::from_secs(240);

/// The stand-in aggregator, which also names the exit behind each connection while it is
/// open.
struct TorHandler {
    inner: Handler,
    finder: Mutex<ExitFinder>,
    /// The server's stream port: the far end of every connection an exit makes to it.
    server: std::sync::OnceLock<SocketAddr>,
    /// Per frame: the carrier's TCP peer and who held its far end (`None`: came over UDP).
    seen: Mutex<Vec<(Option<SocketAddr>, Option<Held>)>>,
}

/// Who held a connection's far end when its report arrived.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Held {
    Exit(String),
    /// A live socket of another process: not from the Tor network.
    Other,
    /// Closed before it could be looked up (the agent gave up on an attempt that was slow
    /// under load, and its report was still read).
    Gone,
}

impl ReportHandler for TorHandler {
    fn arrived_from(&self, origin: Origin) {
        let holder = origin.carrier.map(|peer| {
            match self
                .finder
                .lock()
                .unwrap()
                .holder_of(peer, *self.server.get().expect("the server's stream port"))
                .unwrap()
            {
                Holder::Exit(nickname) => Held::Exit(nickname.to_owned()),
                Holder::Other => Held::Other,
                Holder::Gone => Held::Gone,
            }
        });
        self.seen.lock().unwrap().push((origin.carrier, holder));
        self.inner.arrived_from(origin);
    }

    async fn handle(&self, body: Vec<u8>) -> Ack {
        self.inner.handle(body).await
    }
}

/// An agent process that is killed if a case fails before it terminated it, so that no agent
/// outlives the test.
struct Agent(std::process::Child);

impl Agent {
    fn spawn(config: &Path, log: &Path) -> Agent {
        Agent(spawn_agent(config, log))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

struct World {
    net: TorNetwork,
    arti_file: std::path::PathBuf,
    server: Server,
    handler: Arc<TorHandler>,
    identity: Identity,
    _dir: tempfile::TempDir,
}

fn main() {
    if !penrose_tornet::tor_installed() {
        skipped(format_args!(
            "SKIPPED: tor tests: tor is not installed (CI installs Debian's tor)"
        ));
        return;
    }
    if !is_root() {
        skipped(format_args!(
            "SKIPPED: tor tests: a loopback-only network namespace needs root"
        ));
        return;
    }
    if !traces_present() {
        return;
    }
    // The safety rule, first thing: leave the host's network before any thread or process
    // exists, so that nothing started here can reach anything but loopback.
    penrose_tornet::enter_loopback_namespace().expect("entering a loopback-only namespace");
    penrose_tornet::check_loopback_only().expect("only loopback in this namespace");

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut world = runtime.block_on(start_world());
    let mut failed = Vec::new();
    type Case = fn(&mut World, &tokio::runtime::Runtime);
    let cases: [(&str, Case); 5] = [
        (
            "several_agents_upload_through_tor_each_report_once_from_exits_only",
            several_agents,
        ),
        (
            "the_network_stops_mid_upload_and_comes_back_reports_arrive_once",
            outage,
        ),
        (
            "an_agent_with_a_network_file_that_keeps_the_public_relays_refuses_to_start",
            unreplaced_network,
        ),
        (
            "tokens_are_fetched_and_spent_over_tor_on_circuits_of_their_own",
            tokens_over_tor,
        ),
        // Last: it stops the network.
        (
            "an_agent_whose_tor_network_is_gone_still_stops_promptly",
            network_gone,
        ),
    ];
    for (name, case) in cases {
        let started = Instant::now();
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(&mut world, &runtime)));
        match outcome {
            Ok(()) => eprintln!("test {name} ... ok ({:.1?})", started.elapsed()),
            Err(_) => {
                eprintln!("test {name} ... FAILED");
                failed.push(name);
            }
        }
    }
    world.net.stop().expect("stopping the Tor network");
    runtime.block_on(world.server.shutdown());
    if !failed.is_empty() {
        eprintln!("failed: {failed:?}");
        std::process::exit(1);
    }
}

async fn start_world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let mut net = TorNetwork::start(TorNetworkOptions::new(dir.path().join("tor-net")))
        .expect("starting the private Tor network");
    let readiness = tokio::task::block_in_place(|| net.wait_ready(READY))
        .expect("the private Tor network becomes usable");
    eprintln!(
        "private Tor network usable after {:.1?}: {readiness:?}",
        started.elapsed()
    );
    let arti_file = dir.path().join("arti-network.toml");
    std::fs::write(&arti_file, net.arti_toml()).unwrap();

    let identity = Identity::self_signed(vec![SERVER_NAME.to_string()]).unwrap();
    let handler = Arc::new(TorHandler {
        inner: Handler {
            key_id: Some(public_key().key_id()),
            ..Handler::default()
        },
        finder: Mutex::new(net.exit_finder()),
        server: std::sync::OnceLock::new(),
        seen: Mutex::new(Vec::new()),
    });
    let server = penrose_transport::serve(
        ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            identity: identity.clone(),
            limits: Limits::default(),
            stream_listen: Some("127.0.0.1:0".parse().unwrap()),
        },
        handler.clone(),
    )
    .await
    .unwrap();
    let _ = handler.server.set(server.stream_addr().unwrap());
    World {
        net,
        arti_file,
        server,
        handler,
        identity,
        _dir: dir,
    }
}

/// A fixture whose agent pins the world's server and sends over Tor.
fn tor_agent(world: &World, extra: &str) -> (Fixture, std::path::PathBuf) {
    let fixture = Fixture::new().unwrap();
    world
        .identity
        .save(
            &fixture.cert_path,
            &fixture.dir.path().join("unused.key"),
            penrose_transport::Encoding::Pem,
        )
        .unwrap();
    let stream = world.server.stream_addr().unwrap();
    let config = fixture.config(
        world.server.local_addr(),
        "",
        &format!(
            r#"
[transport]
route = "tor"
tor_network = "{}"
aggregator_stream = "{stream}"
tor_connect_timeout_seconds = 10.0
{extra}"#,
            world.arti_file.display()
        ),
    );
    // The Tor route needs patience the direct tests' timeouts do not have.
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("attempts = 2\n", "attempts = 3\n")
        .replace("ack_timeout_seconds = 2.0", "ack_timeout_seconds = 20.0");
    std::fs::write(&config, text).unwrap();
    (fixture, config)
}

fn accepted(fixture: &Fixture) -> u64 {
    fixture.status().map_or(0, |s| s.uploads.accepted)
}

/// The ids the server stored, each once.
fn stored_once(handler: &TorHandler) -> HashSet<ReportId> {
    let stored = handler.inner.stored.lock().unwrap();
    assert!(stored.values().all(|(stores, _)| *stores == 1));
    stored.keys().copied().collect()
}

fn spooled(fixture: &Fixture) -> HashSet<ReportId> {
    fixture.spool_ids().into_iter().collect()
}

fn several_agents(world: &mut World, _runtime: &tokio::runtime::Runtime) {
    let agents: Vec<_> = (0..3).map(|_| tor_agent(world, "")).collect();
    let mut children: Vec<_> = agents
        .iter()
        .map(|(fixture, config)| Agent::spawn(config, &fixture.dir.path().join("agent.log")))
        .collect();
    wait_until(
        UPLOADS,
        || agents.iter().all(|(f, _)| accepted(f) >= 3),
        || {
            agents
                .iter()
                .map(|(f, _)| {
                    format!(
                        "accepted {} status {:?}\nlog: {}",
                        accepted(f),
                        f.status().map(|s| (s.uploads, s.route)),
                        log_tail(&f.dir.path().join("agent.log"))
                    )
                })
                .collect::<Vec<_>>()
                .join("\n")
        },
    );
    for child in &mut children {
        assert!(terminate(&mut child.0).success());
    }

    let stored = stored_once(&world.handler);
    let delivered: u64 = agents.iter().map(|(f, _)| accepted(f)).sum();
    assert!(
        stored.len() as u64 >= delivered,
        "the server stored {} reports, the agents had {delivered} acked",
        stored.len()
    );
    for (fixture, _) in &agents {
        let status = fixture.status().unwrap();
        // Nothing lost: everything an agent sealed is at the server or still in its spool (both
        // when the agent stopped before the ack came: it sends it again and the server
        // answers Duplicate), and the server stored each once.
        let spooled = spooled(fixture);
        let records = fixture.records();
        assert!(!records.is_empty());
        for record in records {
            assert!(
                stored.contains(&record.report_id) || spooled.contains(&record.report_id),
                "report {} lost",
                record.report_id
            );
        }
        // Isolation: every stream this agent opened ran on a circuit of its own.
        let circuits = &status.route.tor_recent_circuits;
        assert!(circuits.len() >= 3, "{:?}", status.route);
        assert!(circuits.iter().all(|c| c != "?"), "{circuits:?}");
        let distinct: HashSet<_> = circuits.iter().collect();
        assert_eq!(
            distinct.len(),
            circuits.len(),
            "two streams shared a circuit: {circuits:?}"
        );
    }
    // The server saw exits only: every connection came on the stream port, from a socket
    // that one exit's process holds; no UDP connection, no agent's socket.
    let seen = world.handler.seen.lock().unwrap().clone();
    assert!(!seen.is_empty());
    for (carrier, held) in &seen {
        let Some(held) = held else {
            panic!("a report came over UDP, not from an exit");
        };
        assert_ne!(
            *held,
            Held::Other,
            "connection from {carrier:?} is held by a process that is not an exit"
        );
    }
    let exits: HashSet<_> = seen
        .iter()
        .filter_map(|(_, held)| match held {
            Some(Held::Exit(nickname)) => Some(nickname.clone()),
            _ => None,
        })
        .collect();
    let gone = seen
        .iter()
        .filter(|(_, held)| *held == Some(Held::Gone))
        .count();
    assert!(
        gone * 2 < seen.len(),
        "most connections are found at their exit: {gone} of {} closed before the lookup",
        seen.len()
    );
    eprintln!(
        "{} reports from 3 agents through exits {exits:?} ({gone} closed before the lookup)",
        seen.len()
    );
}

fn outage(world: &mut World, _runtime: &tokio::runtime::Runtime) {
    let (fixture, config) = tor_agent(world, "");
    let log = fixture.dir.path().join("agent.log");
    let mut child = Agent::spawn(&config, &log);
    wait_until(
        UPLOADS,
        || accepted(&fixture) >= 1,
        || format!("no upload yet: {}", log_tail(&log)),
    );
    // Mid-upload: the relays (middles and exits) go; the authorities stay.
    let stream_failures = |f: &Fixture| f.status().map_or(0, |s| s.route.tor_stream_failures);
    let failures_before = stream_failures(&fixture);
    world.net.stop_relays().unwrap();
    let stopped = Instant::now();
    // The exits' processes are gone (reaped): nothing more can reach the server until they
    // are back.
    let stored_at_stop = world.handler.inner.stored.lock().unwrap().len();
    // Uploads are tried and fail while reports keep being sealed into the spool.
    wait_until(
        Duration::from_secs(120),
        || stream_failures(&fixture) > failures_before && !fixture.spool_ids().is_empty(),
        || {
            format!(
                "no failed Tor stream while the relays were down: {}",
                log_tail(&log)
            )
        },
    );
    assert_eq!(
        world.handler.inner.stored.lock().unwrap().len(),
        stored_at_stop,
        "reports arrived without relays"
    );
    let before = accepted(&fixture);
    world.net.restart().unwrap();
    *world.handler.finder.lock().unwrap() = world.net.exit_finder();
    eprintln!("relays were down for {:.1?}", stopped.elapsed());
    let back = Instant::now();
    wait_until(
        UPLOADS,
        || fixture.spool_ids().is_empty() && accepted(&fixture) >= before + 3,
        || {
            format!(
                "spool {:?} status {:?}: {}",
                fixture.spool_ids().len(),
                fixture.status().map(|s| (s.uploads, s.route)),
                log_tail(&log)
            )
        },
    );
    eprintln!(
        "spool drained {:.1?} after the relays came back",
        back.elapsed()
    );
    assert!(terminate(&mut child.0).success());
    let stored = stored_once(&world.handler);
    let spooled = spooled(&fixture);
    for record in fixture.records() {
        assert!(
            stored.contains(&record.report_id) || spooled.contains(&record.report_id),
            "report {} lost",
            record.report_id
        );
    }
}

fn unreplaced_network(world: &mut World, _runtime: &tokio::runtime::Runtime) {
    // A network file that names only fallbacks would leave arti's public authorities in
    // place: the agent must refuse it before any Tor traffic.
    let (fixture, config) = tor_agent(world, "");
    let partial = fixture.dir.path().join("partial-network.toml");
    let text = std::fs::read_to_string(&world.arti_file).unwrap();
    let kept: String = text
        .split("\n[")
        .filter(|section| !section.starts_with("tor_network.authorities"))
        .collect::<Vec<_>>()
        .join("\n[");
    std::fs::write(&partial, kept).unwrap();
    let text = std::fs::read_to_string(&config).unwrap().replace(
        &world.arti_file.display().to_string(),
        &partial.display().to_string(),
    );
    std::fs::write(&config, text).unwrap();
    let log = fixture.dir.path().join("agent.log");
    let mut child = Agent::spawn(&config, &log);
    let status = wait_exit(&mut child.0, Duration::from_secs(30));
    assert!(!status.success());
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("tor_network.authorities"),
        "the refusal names what is missing: {logged}"
    );
    assert!(
        !fixture.state_dir().join("tor").exists(),
        "nothing of Tor was set up"
    );
}

fn tokens_over_tor(world: &mut World, runtime: &tokio::runtime::Runtime) {
    use common::tokens::*;
    use penrose_core::tokens::protocol::Credential;
    const CREDENTIAL: Credential = Credential([0x5a; 32]);

    let today = penrose_host::clock::today().0;
    let scopes: Vec<u16> = penrose_core::counters::Catalogue::current()
        .report_ids()
        .map(|id| id.0)
        .collect();
    let issuer = IssuerState::new(&[today, today + 1], &scopes, 24, CREDENTIAL);
    let issuer_identity = Identity::self_signed(vec![ISSUER_NAME.to_string()]).unwrap();
    let stream_port = Some("127.0.0.1:0".parse().unwrap());
    let (issuer_server, aggregator, verifier) = runtime.block_on(async {
        let issuer_server =
            start_issuer_with_streams(&issuer_identity, Arc::clone(&issuer), stream_port).await;
        let verifier = TokenServer::new(Arc::clone(&issuer));
        let aggregator = start_token_server_with_streams(
            &world.identity,
            "127.0.0.1:0".parse().unwrap(),
            Arc::clone(&verifier),
            stream_port,
        )
        .await;
        (issuer_server, aggregator, verifier)
    });
    let (fixture, _) = tor_agent(world, "");
    let issuer_cert = fixture.dir.path().join("issuer.pem");
    issuer_identity
        .save(
            &issuer_cert,
            &fixture.dir.path().join("issuer.key"),
            penrose_transport::Encoding::Pem,
        )
        .unwrap();
    let credential = fixture.dir.path().join("agent.credential");
    penrose_agent::spool::write_synced(&credential, CREDENTIAL.to_file("tor host").as_bytes())
        .unwrap();
    // The agent sends to this test's verifying stand-in and fetches from its issuer, both
    // through Tor only: their UDP addresses are given but never used.
    let config = fixture.config(
        aggregator.local_addr(),
        "",
        &format!(
            r#"
[admission]
address = "{}"
server_name = "{ISSUER_NAME}"
certificate = "{}"
credential = "{}"
retry_min_seconds = 0.5

[transport]
route = "tor"
tor_network = "{}"
aggregator_stream = "{}"
issuer_stream = "{}"
tor_connect_timeout_seconds = 10.0
"#,
            issuer_server.local_addr(),
            issuer_cert.display(),
            credential.display(),
            world.arti_file.display(),
            aggregator.stream_addr().unwrap(),
            issuer_server.stream_addr().unwrap(),
        ),
    );
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("ack_timeout_seconds = 2.0", "ack_timeout_seconds = 20.0");
    std::fs::write(&config, text).unwrap();
    let log = fixture.dir.path().join("agent.log");
    let mut child = Agent::spawn(&config, &log);
    wait_until(
        UPLOADS,
        || verifier.seen.lock().unwrap().accepted.len() >= 3,
        || log_tail(&log),
    );
    assert!(terminate(&mut child.0).success());
    let seen = verifier.seen.lock().unwrap();
    assert!(
        seen.received
            .iter()
            .all(|(r, status, _)| r.token.is_some() && *status == AckStatus::Accepted),
        "every report carried a token the server verified"
    );
    drop(seen);
    // Both servers were reached on their stream ports only: a UDP attempt would have been
    // answered with a Retry first.
    for (name, server) in [("issuer", &issuer_server), ("aggregator", &aggregator)] {
        let stats = server.stats();
        assert_eq!(stats.retries_sent, 0, "{name} saw UDP: {stats:?}");
        assert!(stats.carrier.streams > 0, "{name}: {stats:?}");
        assert!(
            stats.connections_accepted <= stats.carrier.streams,
            "{name}: {stats:?}"
        );
    }
    // The key set and the issue request each went on a stream, and circuit, of their own,
    // and so did every upload.
    let status = fixture.status().unwrap();
    assert!(status.tokens.spent >= 3, "{:?}", status.tokens);
    assert!(
        issuer_server.stats().carrier.streams >= 2,
        "key set and issuance on separate streams"
    );
    let circuits = &status.route.tor_recent_circuits;
    let distinct: HashSet<_> = circuits.iter().collect();
    assert_eq!(distinct.len(), circuits.len(), "{circuits:?}");
    runtime.block_on(async {
        issuer_server.shutdown().await;
        aggregator.shutdown().await;
    });
}

fn network_gone(world: &mut World, _runtime: &tokio::runtime::Runtime) {
    world.net.stop().unwrap();
    let (fixture, config) = tor_agent(world, "");
    let log = fixture.dir.path().join("agent.log");
    let mut child = Agent::spawn(&config, &log);
    // It seals reports and tries to send them into a Tor network that is not there.
    wait_until(
        Duration::from_secs(60),
        || {
            !fixture.spool_ids().is_empty()
                && fixture.status().is_some_and(|s| s.uploads.attempts > 0)
        },
        || log_tail(&log),
    );
    std::thread::sleep(Duration::from_secs(2));
    let asked = Instant::now();
    let status = terminate(&mut child.0);
    let took = asked.elapsed();
    eprintln!("stopped {took:.1?} after SIGTERM with its Tor network gone");
    assert!(status.success(), "{status:?}: {}", log_tail(&log));
    assert!(
        took < Duration::from_secs(10),
        "SIGTERM took {took:?}: {}",
        log_tail(&log)
    );
    assert!(!fixture.spool_ids().is_empty(), "its reports stay spooled");
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<_> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}
