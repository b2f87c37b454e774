//! `demo --tor`: the private Tor network on loopback, and what went over it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use penrose_agent::config::RouteChoice;
use penrose_agent::status::AgentStatus;
use penrose_tornet::{TorNetwork, TorNetworkOptions};

use super::Options;
use super::outcome::{AgentCircuits, TorFigures};
use super::process::Stages;

/// The private Tor network of a `--tor` run.
pub(super) struct TorRun {
    net: TorNetwork,
    started: Instant,
    /// Seconds from `started` until it was usable.
    ready_seconds: f64,
}

/// With `--tor`, the private Tor network, first: it takes 20-60 s to become usable, and the
/// servers are set up meanwhile. It lives in the run's directory; dropping it (at the end,
/// or on any error) stops every tor by its process id.
pub(super) fn start(options: &Options, dir: &Path) -> Result<Option<TorRun>> {
    if !options.tor {
        return Ok(None);
    }
    let started = Instant::now();
    let net = TorNetwork::start(TorNetworkOptions::new(dir.join("tor-net")))
        .context("starting the private Tor network (--tor)")?;
    options.say(&format!(
        "tor: a private Tor network on loopback is starting in {} (test equipment: 3 \
         directory authorities, 2 middles, 2 exits; tor processes {:?}), inside a network \
         namespace that has only loopback",
        net.dir().display(),
        net.pids(),
    ));
    Ok(Some(TorRun {
        net,
        started,
        ready_seconds: 0.0,
    }))
}

/// With `--tor`, the network must be usable before the agents start (they fetch their tokens
/// through it at once); its arti configuration, which replaces the public relays, is written
/// to the returned path (`dir/arti-network.toml`, named in every run).
pub(super) fn wait_usable(
    tor: Option<&mut TorRun>,
    dir: &Path,
    stages: &mut Stages,
    options: &Options,
) -> Result<PathBuf> {
    let arti_file = dir.join("arti-network.toml");
    if let Some(tor) = tor {
        let t = Instant::now();
        let readiness = tor
            .net
            .wait_ready(Duration::from_secs(300))
            .context("the private Tor network did not become usable")?;
        tor.ready_seconds = tor.started.elapsed().as_secs_f64();
        std::fs::write(&arti_file, tor.net.arti_toml())?;
        stages.record("tor: waiting for the network", t);
        options.say(&format!(
            "tor: the private network is usable {:.1} s after it started ({readiness:?}); the \
             agents' arti configuration is {}",
            tor.ready_seconds,
            arti_file.display()
        ));
    }
    Ok(arti_file)
}

/// The servers' stream ports, and per connection seen on one while open, the exit whose
/// process held its other end.
pub(super) struct StreamSampler {
    exits: penrose_tornet::ExitFinder,
    ports: Vec<u16>,
    seen: HashMap<(u16, SocketAddr), String>,
}

impl StreamSampler {
    /// Watches the stream ports `streams` (addresses) of `run`'s exits.
    pub(super) fn new(run: &TorRun, streams: [&str; 2]) -> Self {
        StreamSampler {
            exits: run.net.exit_finder(),
            ports: streams
                .iter()
                .filter_map(|a| a.parse::<SocketAddr>().ok())
                .map(|a| a.port())
                .collect(),
            seen: HashMap::new(),
        }
    }

    /// Records every established TCP connection on one of the ports (127.0.0.1) in this
    /// thread's namespace now, with who holds its other end
    /// (`penrose_tornet::ExitFinder::holder_of`): an exit by nickname, "none" (a process that
    /// is not an exit), or "closed before the lookup".
    pub(super) fn sample(&mut self) -> Result<()> {
        for (local, peer) in penrose_tornet::connections_to(&self.ports)? {
            if self.seen.contains_key(&(local.port(), peer)) {
                continue;
            }
            let owner = match self.exits.holder_of(peer, local)? {
                penrose_tornet::Holder::Exit(exit) => exit.to_string(),
                penrose_tornet::Holder::Other => "none".to_string(),
                penrose_tornet::Holder::Gone => "closed before the lookup".to_string(),
            };
            self.seen.insert((local.port(), peer), owner);
        }
        Ok(())
    }

    /// Connections seen, by who held their other end.
    fn by_exit(&self) -> BTreeMap<String, u64> {
        let mut by_exit = BTreeMap::new();
        for owner in self.seen.values() {
            *by_exit.entry(owner.clone()).or_insert(0) += 1;
        }
        by_exit
    }
}

/// What the agents' last status files say went over Tor.
#[derive(Default)]
pub(super) struct AgentRoutes {
    reports: u64,
    streams: u64,
    failures: u64,
    circuits: Vec<AgentCircuits>,
}

impl AgentRoutes {
    /// Adds one agent's, which must have run over Tor (its log is `log`).
    pub(super) fn add(&mut self, status: &AgentStatus, log: &Path) -> Result<()> {
        let route = &status.route;
        ensure!(
            route.route == RouteChoice::Tor,
            "an agent did not run over Tor: {route:?}; see {}",
            log.display()
        );
        self.reports += status.uploads.accepted;
        self.streams += route.tor_streams;
        self.failures += route.tor_stream_failures;
        let recent: Vec<&str> = route
            .tor_recent_circuits
            .iter()
            .map(String::as_str)
            .collect();
        let distinct: BTreeSet<&str> = recent.iter().copied().filter(|c| *c != "?").collect();
        self.circuits.push(AgentCircuits {
            recent: recent.len(),
            distinct: distinct.len(),
        });
        Ok(())
    }
}

/// Once every server is stopped: stops the network (its Drop would do it on an error) and
/// counts what went over it, from the agents' status files, the aggregation server's
/// metrics page, the connections sampled and the UDP datagrams received meanwhile.
pub(super) fn stop_and_count(
    run: &mut TorRun,
    metrics: &str,
    agents: AgentRoutes,
    sampled: Option<&StreamSampler>,
    udp_datagrams: u64,
) -> Result<TorFigures> {
    run.net.stop().context("stopping the private Tor network")?;
    let carrier_streams: BTreeMap<String, u64> =
        ["accepted", "refused_server_full", "idle", "malformed"]
            .into_iter()
            .map(|outcome| {
                let value = metric(
                    metrics,
                    &format!("penrose_transport_carrier_streams_total{{outcome=\"{outcome}\"}}"),
                );
                value.map(|v| (outcome.to_string(), v))
            })
            .collect::<Result<_>>()?;
    Ok(TorFigures {
        network_dir: run.net.dir().to_path_buf(),
        ready_seconds: run.ready_seconds,
        reports: agents.reports,
        streams: agents.streams,
        stream_failures: agents.failures,
        isolated: agents
            .circuits
            .iter()
            .all(|c| c.recent > 0 && c.distinct == c.recent),
        circuits: agents.circuits,
        carrier_streams,
        connections_accepted: metric(
            metrics,
            "penrose_transport_connections_total{outcome=\"accepted\"}",
        )?,
        udp_datagrams,
        sampled_connections: sampled.map(StreamSampler::by_exit).unwrap_or_default(),
        stopped: run.net.pids().is_empty(),
    })
}

/// `Udp: InDatagrams` of this thread's network namespace.
pub(super) fn udp_datagrams() -> Result<u64> {
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

/// The aggregation server's metrics page (Prometheus text), from its `--metrics` address.
pub(super) fn fetch_metrics(addr: &str) -> Result<String> {
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
