//! Shared pieces of the daemon tests: a key pair, a loopback stand-in for the aggregator (a
//! penrose-transport server whose handler decodes reports and deduplicates them by report id),
//! agent configurations and `penrose-agent run` children.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    dead_code,
    unused_imports
)]

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use penrose_agent::status::AgentStatus;
use penrose_core::paillier::{Keypair, PublicKey};
use penrose_core::wire::{Ack, AckStatus, Message, RejectReason, ReportId, ThrottleHint};
use penrose_transport::{Encoding, Identity, Limits, ReportHandler, Server, ServerConfig};

pub const SERVER_NAME: &str = "aggregator.test";

/// One 2048-bit key pair per test binary.
pub fn public_key() -> &'static PublicKey {
    static KEY: OnceLock<PublicKey> = OnceLock::new();
    KEY.get_or_init(|| Keypair::generate(&mut rand::rng()).public_key().clone())
}

/// What the stand-in aggregator saw.
#[derive(Default)]
pub struct Handler {
    /// Every frame body, as received.
    pub bodies: Mutex<Vec<Vec<u8>>>,
    /// Per report id: how many times it was stored (accepted), and answered duplicate.
    pub stored: Mutex<HashMap<ReportId, (u32, u32)>>,
    pub key_id: Option<penrose_core::paillier::KeyId>,
    /// Keys accepted besides `key_id` (a key rollover's new key).
    pub also_accepted: Mutex<Vec<penrose_core::paillier::KeyId>>,
    /// The key of each stored report, in arrival order.
    pub keys_seen: Mutex<Vec<penrose_core::paillier::KeyId>>,
    /// The signed key list a key list request is answered with (`None`: refused).
    pub key_list: Mutex<Option<Vec<u8>>>,
    /// Key list requests answered.
    pub key_lists_served: std::sync::atomic::AtomicU32,
    /// Where each frame came from, as the transport saw it.
    pub origins: Mutex<Vec<penrose_transport::Origin>>,
}

impl ReportHandler for Handler {
    fn arrived_from(&self, origin: penrose_transport::Origin) {
        self.origins.lock().unwrap().push(origin);
    }

    fn answer(&self, body: &[u8]) -> Option<Vec<u8>> {
        if !matches!(Message::decode_body(body), Ok(Message::KeyListRequest)) {
            return None;
        }
        let list = self.key_list.lock().unwrap().clone()?;
        self.key_lists_served
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Some(Message::KeyList(list).to_frame().unwrap())
    }

    async fn handle(&self, body: Vec<u8>) -> Ack {
        self.bodies.lock().unwrap().push(body.clone());
        let ack = |report_id, status| Ack {
            report_id,
            status,
            throttle: ThrottleHint::FULL_RATE,
        };
        let report = match Message::decode_body(&body) {
            Ok(Message::Report(r)) => r,
            _ => {
                return ack(
                    ReportId([0; 16]),
                    AckStatus::Rejected(RejectReason::Malformed),
                );
            }
        };
        if self.key_id.is_some_and(|k| k != report.key_id)
            && !self.also_accepted.lock().unwrap().contains(&report.key_id)
        {
            return ack(
                report.report_id,
                AckStatus::Rejected(RejectReason::UnknownKey),
            );
        }
        let mut stored = self.stored.lock().unwrap();
        let entry = stored.entry(report.report_id).or_default();
        if entry.0 == 0 {
            entry.0 = 1;
            self.keys_seen.lock().unwrap().push(report.key_id);
            ack(report.report_id, AckStatus::Accepted)
        } else {
            entry.1 += 1;
            ack(report.report_id, AckStatus::Duplicate)
        }
    }
}

impl Handler {
    pub fn ids(&self) -> Vec<ReportId> {
        self.stored.lock().unwrap().keys().copied().collect()
    }
}

/// The real traces the replay source reads (`penrose_traces::TraceFolder::default_dir`).
pub const REPLAY_TRACES: [&str; 3] = [
    "hta-trace_filter--sampled_rank-0.json.gz",
    "hta-trace_filter--sampled_rank-1.json.gz",
    "hta-ns_resolution_trace--rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
];

/// Whether [`REPLAY_TRACES`] are all here; says SKIPPED (counted by CI) when not.
pub fn traces_present() -> bool {
    let dir = penrose_traces::TraceFolder::default_dir();
    let present = REPLAY_TRACES.iter().all(|name| dir.join(name).exists());
    if !present {
        skipped(format_args!(
            "SKIPPED: the real traces are not in {} (set PENROSE_TRACES)",
            dir.display()
        ));
    }
    present
}

/// A fixture: temporary state, key and certificate files.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub identity: Identity,
    pub key_path: PathBuf,
    pub cert_path: PathBuf,
    pub traces: PathBuf,
}

impl Fixture {
    /// `None`, said as SKIPPED, when the real traces the replay reads are not here (a fresh
    /// clone has no `../shared`; CI, which has them, runs every test).
    pub fn new() -> Option<Self> {
        if !traces_present() {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let identity = Identity::self_signed(vec![SERVER_NAME.to_string()]).unwrap();
        let cert_path = dir.path().join("aggregator.pem");
        let key_file = dir.path().join("aggregator.key");
        identity.save(&cert_path, &key_file, Encoding::Pem).unwrap();
        let key_path = dir.path().join("public.key");
        std::fs::write(&key_path, public_key().to_bytes()).unwrap();
        // The replay reads a few of the real traces (linked, not copied).
        let traces = dir.path().join("traces");
        std::fs::create_dir(&traces).unwrap();
        let source = penrose_traces::TraceFolder::default_dir();
        for name in REPLAY_TRACES {
            let from = source.join(name);
            std::os::unix::fs::symlink(&from, traces.join(name)).unwrap();
        }
        Some(Self {
            dir,
            identity,
            key_path,
            cert_path,
            traces,
        })
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn spool_ids(&self) -> Vec<ReportId> {
        penrose_agent::spool::list_ids(&penrose_agent::daemon::spool_dir(&self.state_dir()))
            .unwrap()
    }

    pub fn records(&self) -> Vec<penrose_agent::record::SealedRecord> {
        penrose_agent::record::read_records(&self.state_dir().join("sealed.jsonl")).unwrap()
    }

    pub fn status(&self) -> Option<AgentStatus> {
        AgentStatus::read(&self.state_dir()).ok()
    }

    /// Writes a fast configuration sending to `addr`; `extra` is appended (TOML sections). The
    /// route is named: `extra`'s `[transport]` (the private Tor network), else direct.
    pub fn config(&self, addr: SocketAddr, top: &str, extra: &str) -> PathBuf {
        let direct =
            "\n[transport]\n# Loopback tests: the direct route, named.\nroute = \"direct\"\n";
        let route = if extra.contains("[transport]") {
            ""
        } else {
            direct
        };
        let text = format!(
            r#"{top}
state_dir = "{state}"

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
attempts = 2
backoff_base_seconds = 0.05
backoff_max_seconds = 0.3
connect_timeout_seconds = 0.5
ack_timeout_seconds = 2.0
{extra}
{route}"#,
            state = self.state_dir().display(),
            cert = self.cert_path.display(),
            key = self.key_path.display(),
            traces = self.traces.display(),
        );
        let path = self.dir.path().join("agent.toml");
        std::fs::write(&path, text).unwrap();
        path
    }
}

/// A loopback UDP port nothing listens on now (for a server that starts later).
pub fn free_addr() -> SocketAddr {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap()
}

pub async fn start_server(identity: &Identity, addr: SocketAddr) -> (Server, Arc<Handler>) {
    start_server_with_streams(identity, addr, None).await
}

/// A stand-in aggregator that also takes QUIC carried on TCP streams at `stream_listen` (where
/// Tor exits deliver).
pub async fn start_server_with_streams(
    identity: &Identity,
    addr: SocketAddr,
    stream_listen: Option<SocketAddr>,
) -> (Server, Arc<Handler>) {
    let handler = Arc::new(Handler {
        key_id: Some(public_key().key_id()),
        ..Handler::default()
    });
    let server = penrose_transport::serve(
        ServerConfig {
            listen: addr,
            identity: identity.clone(),
            limits: Limits::default(),
            stream_listen,
        },
        handler.clone(),
    )
    .await
    .unwrap();
    (server, handler)
}

pub fn agent_binary() -> &'static str {
    env!("CARGO_BIN_EXE_penrose-agent")
}

/// `penrose-agent run --config CONFIG`, its log in `log`.
pub fn spawn_agent(config: &Path, log: &Path) -> Child {
    spawn_agent_with(Command::new(agent_binary()), config, log)
}

pub fn spawn_agent_with(mut command: Command, config: &Path, log: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    command
        .args(["run", "--config"])
        .arg(config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// Sends SIGTERM and waits for a clean exit.
pub fn terminate(child: &mut Child) -> std::process::ExitStatus {
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: signalling our own child process.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    wait_exit(child, Duration::from_secs(30))
}

pub fn wait_exit(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            start.elapsed() < limit,
            "agent did not exit within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls `what` until true, failing after `limit` with `describe()`.
pub fn wait_until(limit: Duration, mut what: impl FnMut() -> bool, describe: impl Fn() -> String) {
    let start = Instant::now();
    while !what() {
        assert!(start.elapsed() < limit, "timed out: {}", describe());
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub use penrose_agent::capture::loader::is_root;

pub mod tokens;

pub use penrose_host::skip::skipped;
