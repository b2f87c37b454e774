//! The Tor client and the dialer the transport opens its streams with.
//!
//! One [`Tor`] per agent: arti bootstraps on the first stream (or on [`Tor::bootstrap`]) and
//! keeps its directory and guards in the agent's state directory, so a restart does not fetch
//! the whole directory again. Every stream is opened with an isolation token of its own, so
//! arti never puts two of them on one circuit: each report, each retry of it, and each token
//! fetch leave on a circuit of their own.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use arti_client::{BootstrapBehavior, IsolationToken, StreamPrefs, TorClient};
use penrose_transport::carrier::{BoxedStream, Dialer, OpenFuture};
use tor_proto::client::stream::ClientStreamCtrl;
use tor_rtcompat::PreferredRuntime;
use tracing::{debug, info};

use crate::error::TorError;
use crate::network::TorNetwork;

/// How many opened streams [`Tor::streams`] remembers (for status and tests; nothing of it is
/// written anywhere).
const REMEMBERED_STREAMS: usize = 64;

/// One stream the agent opened through Tor, as the agent saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamRecord {
    /// arti's process-unique name of the circuit the stream runs on (`None` if arti could
    /// not tell).
    pub circuit: Option<String>,
    /// Where the stream goes (`host:port`, resolved by the exit).
    pub target: String,
    /// From asking to the stream being open.
    pub open_time: Duration,
}

/// The agent's Tor client. Cheap to share (`Arc`).
pub struct Tor {
    client: Arc<TorClient<PreferredRuntime>>,
    network: TorNetwork,
    state_dir: PathBuf,
    streams: Mutex<VecDeque<StreamRecord>>,
    opened: AtomicU64,
    failed: AtomicU64,
}

impl std::fmt::Debug for Tor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tor")
            .field("network", &self.network)
            .field("state_dir", &self.state_dir)
            .finish_non_exhaustive()
    }
}

impl Tor {
    /// A client of `network` with its state under `state_dir` (created 0700 if missing). It
    /// does not bootstrap yet: the first stream does. Must be called inside a tokio runtime.
    pub fn new(network: TorNetwork, state_dir: &Path) -> Result<Arc<Tor>, TorError> {
        // The network is checked before anything is written.
        let config = network.arti_config(state_dir)?;
        create_private_dir(state_dir)?;
        // arti no longer installs a rustls provider itself; the workspace uses ring. Another
        // part of the process may have installed one already, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let runtime = PreferredRuntime::current().map_err(|e| TorError::Config(e.to_string()))?;
        let client = TorClient::with_runtime(runtime)
            .config(config)
            .bootstrap_behavior(BootstrapBehavior::OnDemand)
            .create_unbootstrapped()?;
        info!(%network, state_dir = %state_dir.display(), "tor client ready (bootstraps on first use)");
        Ok(Arc::new(Tor {
            client,
            network,
            state_dir: state_dir.to_owned(),
            streams: Mutex::new(VecDeque::new()),
            opened: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }))
    }

    /// Bootstraps now rather than at the first stream; returns how long it took (near zero
    /// when already bootstrapped).
    pub async fn bootstrap(&self) -> Result<Duration, TorError> {
        let started = Instant::now();
        self.client.bootstrap().await?;
        Ok(started.elapsed())
    }

    /// Whether arti has a directory and can build circuits now.
    pub fn is_ready(&self) -> bool {
        self.client.bootstrap_status().ready_for_traffic()
    }

    /// A dialer of streams to `target` (`host:port` as the exit should reach it; a host name
    /// is resolved by the exit, never here).
    pub fn dialer(self: &Arc<Self>, target: impl Into<String>) -> TorDialer {
        TorDialer {
            tor: Arc::clone(self),
            target: target.into(),
        }
    }

    /// Streams opened, and attempts that failed, since the start.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.opened.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }

    /// The network this client uses.
    pub fn network(&self) -> &TorNetwork {
        &self.network
    }

    /// The streams opened lately, oldest first (at most the last 64).
    pub fn streams(&self) -> Vec<StreamRecord> {
        self.streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }

    /// Opens a stream to `target` on a circuit of its own.
    pub async fn open(&self, target: &str) -> Result<arti_client::DataStream, TorError> {
        let started = Instant::now();
        let mut prefs = StreamPrefs::new();
        prefs.set_isolation(IsolationToken::new());
        // Counts a failure however the attempt ends without a stream: an error, or the caller's
        // timeout dropping this future while arti still looks for a circuit.
        let mut attempt = Attempt {
            failed: &self.failed,
            done: false,
        };
        let stream = self.client.connect_with_prefs(target, &prefs).await?;
        attempt.done = true;
        self.opened.fetch_add(1, Ordering::Relaxed);
        let circuit = stream
            .client_stream_ctrl()
            .and_then(|ctrl| ctrl.tunnel())
            .map(|tunnel| tunnel.unique_id().to_string());
        let record = StreamRecord {
            circuit,
            target: target.to_owned(),
            open_time: started.elapsed(),
        };
        debug!(?record, "tor stream open");
        let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        if streams.len() == REMEMBERED_STREAMS {
            streams.pop_front();
        }
        streams.push_back(record);
        Ok(stream)
    }
}

/// One stream attempt; counted as failed unless marked done before it is dropped.
struct Attempt<'a> {
    failed: &'a AtomicU64,
    done: bool,
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Opens each of the transport's streams on a fresh circuit ([`Tor::open`]).
#[derive(Clone, Debug)]
pub struct TorDialer {
    tor: Arc<Tor>,
    target: String,
}

impl Dialer for TorDialer {
    fn open(&self) -> OpenFuture<'_> {
        Box::pin(async move {
            let stream = self
                .tor
                .open(&self.target)
                .await
                .map_err(std::io::Error::other)?;
            Ok(Box::new(stream) as BoxedStream)
        })
    }
}

fn create_private_dir(path: &Path) -> Result<(), TorError> {
    use std::os::unix::fs::DirBuilderExt;
    let made = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path);
    made.map_err(|source| TorError::StateDir {
        path: path.to_owned(),
        source,
    })
}
