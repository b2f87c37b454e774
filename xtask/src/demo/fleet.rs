//! The fleet: one agent process per host, each with its own state directory, credential
//! files and trace, configured in compressed time.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};

use super::applications::{Applications, trace_name};
use super::issuers::Issuers;
use super::process::{Bins, Children, wait_for};
use super::tor::udp_datagrams;
use super::{Aggregator, DesignKeys, Options, read_status};

/// One host of the demo's fleet.
pub(super) struct Host {
    pub state: PathBuf,
    pub config: PathBuf,
    pub log: PathBuf,
    folder: PathBuf,
    pub alone: bool,
    /// Its agent, in the run's children.
    pub child: usize,
}

/// The fleet, its agents running.
pub(super) struct Fleet {
    pub hosts: Vec<Host>,
    /// Host 0's agent's source: "ebpf" or "test-replay".
    pub source: &'static str,
    /// The replayer processes (eBPF mode), in the run's children.
    pub replayers: Vec<usize>,
    /// With `--tor`: UDP datagrams received in the namespace before the agents started.
    pub udp_before: Option<u64>,
}

/// The fleet's hosts: `agents` hosts run the popular application, and two more hosts each
/// run another one alone. Each gets its own state directory, configuration, log and a folder
/// holding its one trace.
pub(super) fn lay_out_hosts(
    options: &Options,
    dir: &Path,
    apps: &Applications,
) -> Result<Vec<Host>> {
    let mut hosts: Vec<Host> = Vec::new();
    for i in 0..options.agents + apps.alone.len() {
        let trace = if i < options.agents {
            &apps.popular
        } else {
            &apps.alone[i - options.agents]
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
    options.say(&format!(
        "fleet: {} hosts run {} (the popular application); {} more each run one of {} alone",
        options.agents,
        trace_name(&apps.popular),
        apps.alone.len(),
        apps.alone
            .iter()
            .map(|t| trace_name(t))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    Ok(hosts)
}

/// What every agent of the fleet is given: the aggregation server, the design server's key
/// and the token issuers.
pub(super) struct Servers<'a> {
    /// The aggregation server's QUIC address.
    listen: &'a str,
    /// Its TLS certificate, pinned.
    agg_cert: PathBuf,
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
    /// The arti configuration of the private network (`TorNetwork::arti_toml`).
    network: &'a Path,
    /// The aggregation server's stream port.
    aggregator_stream: &'a str,
    /// The token issuer's stream port.
    issuer_stream: &'a str,
    /// The evidence issuer's stream port.
    evidence_stream: &'a str,
}

impl<'a> Servers<'a> {
    /// The run's servers; with `tor`, reached through the private network whose arti
    /// configuration is `arti_file`.
    pub(super) fn of(
        keys: &'a DesignKeys,
        issuers: &'a Issuers,
        agg: &'a Aggregator,
        (tor, arti_file): (bool, &'a Path),
    ) -> Self {
        Servers {
            listen: &agg.listen,
            agg_cert: agg.data.tls_cert(),
            key: &keys.public_key,
            list_signer: &keys.list_signer,
            issuer: &issuers.admission.listen,
            issuer_cert: &issuers.admission.cert,
            evidence: &issuers.evidence.listen,
            evidence_cert: &issuers.evidence.cert,
            tor: tor.then_some(TorRoute {
                network: arti_file,
                aggregator_stream: &agg.stream,
                issuer_stream: &issuers.admission.stream,
                evidence_stream: &issuers.evidence.stream,
            }),
        }
    }
}

/// Writes every host's configuration and starts its agent, waits until each has written its
/// first status, and in eBPF mode (`lib`, the stand-in) starts the replayer under host 0's
/// probes.
pub(super) fn start_fleet(
    (options, bins): (&Options, &Bins),
    (mut hosts, lib): (Vec<Host>, Option<PathBuf>),
    (servers, credentials): (&Servers<'_>, [&[PathBuf]; 2]),
    popular: &Path,
    children: &mut Children,
) -> Result<Fleet> {
    // No UDP datagram should arrive in the namespace while the agents run over Tor.
    let udp_before = servers.tor.as_ref().map(|_| udp_datagrams()).transpose()?;
    start_agents(
        bins,
        &mut hosts,
        servers,
        (lib.as_deref(), credentials),
        children,
    )?;
    // An agent is running once it writes its first status (after loading its probes, or the
    // traces it replays); capture time counts from there, and in eBPF mode the name probes are
    // attached before the replayers resolve their kernels.
    for host in &hosts {
        wait_for(Duration::from_secs(120), || {
            Ok(read_status(&host.state).is_some())
        })
        .with_context(|| format!("an agent did not start; see {}", host.log.display()))?;
    }
    let replayers = match &lib {
        Some(lib) => vec![start_replayer(options, bins, lib, popular, children)?],
        None => {
            options.say("agents: replaying their traces as if captured (trace-replay source)");
            Vec::new()
        }
    };
    Ok(Fleet {
        hosts,
        source: if lib.is_some() { "ebpf" } else { "test-replay" },
        replayers,
        udp_before,
    })
}

/// Each host's configuration, written, and its agent started: host 0 probes the stand-in
/// `lib` with eBPF (as root); the rest replay their trace.
fn start_agents(
    bins: &Bins,
    hosts: &mut [Host],
    servers: &Servers<'_>,
    (lib, [credentials, evidence_credentials]): (Option<&Path>, [&[PathBuf]; 2]),
    children: &mut Children,
) -> Result<()> {
    for (((i, host), credential), evidence_credential) in hosts
        .iter_mut()
        .enumerate()
        .zip(credentials)
        .zip(evidence_credentials)
    {
        let (source, lib) = match (lib, i) {
            (Some(lib), 0) => ("ebpf", Some(lib)),
            _ => ("test-replay", None),
        };
        std::fs::write(
            &host.config,
            agent_config(
                &host.state,
                servers,
                source,
                lib,
                &host.folder,
                [credential, evidence_credential],
            ),
        )?;
        let agent = super::start_agent(&bins.path("penrose-agent"), &host.config, &host.log)?;
        host.child = children.push("penrose-agent", agent);
    }
    Ok(())
}

/// A `penrose-replay` process launching the popular trace's kernels through the stand-in
/// `lib`, which host 0's agent probes.
fn start_replayer(
    options: &Options,
    bins: &Bins,
    lib: &Path,
    popular: &Path,
    children: &mut Children,
) -> Result<usize> {
    let child = bins
        .command("penrose-replay")
        .arg("--lib")
        .arg(lib)
        .args(["--pace", "trace", "--speed", "2", "--loop-forever"])
        .arg(popular)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting penrose-replay")?;
    let index = children.push("penrose-replay", child);
    options.say(&format!(
        "host 0: its agent probes {} with eBPF; a replayer process launches the popular \
         trace's kernels through it. The other agents replay their trace as if captured.",
        lib.display(),
    ));
    Ok(index)
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
    credentials: [&Path; 2],
) -> String {
    format!(
        "{}{}{}{}",
        servers_toml(dir, servers),
        capture_toml(source, lib, traces),
        tokens_toml(servers, credentials),
        transport_toml(servers)
    )
}

/// The agent configuration's first part: its state directory, the aggregation server and the
/// design server's keys.
fn servers_toml(dir: &Path, servers: &Servers<'_>) -> String {
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

"#,
        state = dir.display().to_string(),
        listen = servers.listen,
        cert = servers.agg_cert.display().to_string(),
        key = servers.key.display().to_string(),
        list_signer = servers.list_signer.display().to_string(),
    )
}

/// The capture, replay, seal and upload sections, in compressed time.
fn capture_toml(source: &str, lib: Option<&Path>, traces: &Path) -> String {
    let libraries = lib.map_or(String::new(), |l| format!("{:?}", l.display().to_string()));
    format!(
        r#"[capture]
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

"#,
        traces = traces.display().to_string(),
    )
}

/// The admission and evidence sections: both issuers, each with this host's own credential.
fn tokens_toml(servers: &Servers<'_>, [credential, evidence_credential]: [&Path; 2]) -> String {
    format!(
        r#"[admission]
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
"#,
        issuer = servers.issuer,
        issuer_cert = servers.issuer_cert.display().to_string(),
        credential = credential.display().to_string(),
        evidence = servers.evidence,
        evidence_cert = servers.evidence_cert.display().to_string(),
        evidence_credential = evidence_credential.display().to_string(),
    )
}

/// The transport section: the direct route on loopback, or with `--tor` the private Tor
/// network.
fn transport_toml(servers: &Servers<'_>) -> String {
    let direct = "\n[transport]\n# Without --tor: the direct route on loopback, named (the agent's default is \
                  Tor).\nroute = \"direct\"\n";
    servers.tor.as_ref().map_or(direct.to_string(), |tor| {
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
    })
}
