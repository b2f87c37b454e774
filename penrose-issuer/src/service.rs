//! The issuer's endpoint: `penrose_transport::exchange` (QUIC, one request and one answer per
//! stream, ALPN `penrose-issuer/1`, bodies of at most `MAX_ISSUER_MESSAGE` bytes) with the
//! report endpoint's address validation, per-source limits and handshake timeout, answered by
//! an [`Issuer`]. Every answer is computed on tokio's blocking threads (scalar
//! multiplications, a synced write), at most a few at a time, never on the async executor.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use penrose_core::tokens::protocol::{ALPN, IssuerAnswer, MAX_ISSUER_MESSAGE, Refusal};
use penrose_host::process::{Request, Signals, print_ready};
use penrose_transport::exchange::{BlockingAnswers, Offloaded, Protocol, serve_exchange};
use penrose_transport::{Encoding, Identity, Limits, Server, ServerConfig};
use tokio::task::JoinHandle;
use tracing::info;

use crate::admin;
use crate::error::IssuerError;
use crate::issuer::{Issuer, IssuerConfig};
use crate::state::StateDir;
use penrose_host::clock::{Clock, SystemClock};

/// The issuer's protocol on the exchange transport.
pub const PROTOCOL: Protocol = Protocol {
    alpn: ALPN,
    max_body: MAX_ISSUER_MESSAGE,
};

/// The default listen address: loopback until the operator says otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:4434";

/// Answers exchanges with an [`Issuer`], off the async threads, a few at a time.
pub type Handler = Offloaded<Issuer>;

impl BlockingAnswers for Issuer {
    fn answer(&self, request: &[u8]) -> Vec<u8> {
        self.handle(request)
    }

    fn unavailable(&self) -> Vec<u8> {
        IssuerAnswer::Refused(Refusal::Unavailable).encode()
    }
}

/// Everything `serve` needs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The state directory (initialised by `init`).
    pub state: StateDir,
    /// QUIC listen address (UDP).
    pub listen: SocketAddr,
    /// TCP address for QUIC carried on streams (agents that fetch over Tor); `None`: UDP only.
    pub stream_listen: Option<SocketAddr>,
    /// TLS certificate and key; default: STATE/tls/, self-signed on first start.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Extra names for a self-signed certificate (besides `localhost` and the listen address).
    pub names: Vec<String>,
    /// Transport limits.
    pub limits: Limits,
    /// Quota, rate and key window.
    pub config: IssuerConfig,
}

impl ServeOptions {
    /// Options with default limits and configuration.
    pub fn new(state: StateDir, listen: SocketAddr) -> Self {
        ServeOptions {
            state,
            listen,
            stream_listen: None,
            tls: None,
            names: Vec::new(),
            limits: Limits::default(),
            config: IssuerConfig::default(),
        }
    }
}

/// A running issuer: its endpoint and its control socket.
pub struct Running {
    server: Server,
    issuer: Arc<Issuer>,
    control: JoinHandle<()>,
    socket: PathBuf,
    certificate: PathBuf,
}

impl Running {
    /// The address the endpoint is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// The stream port's TCP address, when it has one.
    pub fn stream_addr(&self) -> Option<SocketAddr> {
        self.server.stream_addr()
    }

    /// The issuer behind it.
    pub fn issuer(&self) -> &Arc<Issuer> {
        &self.issuer
    }

    /// The certificate agents pin.
    pub fn certificate(&self) -> &PathBuf {
        &self.certificate
    }

    /// The transport's counters.
    pub fn transport_stats(&self) -> penrose_transport::ServerStats {
        self.server.stats()
    }

    /// Stops taking connections, lets the answers in flight finish, closes the control socket.
    pub async fn shutdown(self) {
        self.server.shutdown().await;
        self.control.abort();
        let _ = self.control.await;
        let _ = std::fs::remove_file(&self.socket);
        // Answers still on blocking threads hold the issuer; let them finish so that the
        // store is closed when this returns (a restart in the same process reopens it).
        let mut issuer = self.issuer;
        for _ in 0..500 {
            match Arc::try_unwrap(issuer) {
                Ok(issuer) => {
                    drop(issuer);
                    return;
                }
                Err(shared) => {
                    issuer = shared;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}

fn identity(options: &ServeOptions) -> Result<(Identity, PathBuf), IssuerError> {
    let (cert, key) = options
        .tls
        .clone()
        .unwrap_or_else(|| (options.state.tls_cert(), options.state.tls_key()));
    if cert.exists() {
        return Ok((Identity::load(&cert, &key)?, cert));
    }
    if options.tls.is_some() {
        return Err(IssuerError::File(penrose_host::FileError::Io {
            path: cert,
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such certificate"),
        }));
    }
    let mut names = vec!["localhost".to_string(), options.listen.ip().to_string()];
    names.extend(options.names.iter().cloned());
    let identity = Identity::self_signed(names)?;
    if let Some(dir) = cert.parent() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(IssuerError::io(dir))?;
    }
    identity.save(&cert, &key, Encoding::Pem)?;
    info!(cert = %cert.display(), "created a self-signed certificate; agents pin it");
    Ok((identity, cert))
}

/// Opens the state directory and starts the endpoint and the control socket; must run inside a
/// tokio runtime. `clock` is the system clock in production, a test's clock in tests.
pub async fn start(options: ServeOptions, clock: Arc<dyn Clock>) -> Result<Running, IssuerError> {
    let issuer = Arc::new(Issuer::open(&options.state, clock, options.config)?);
    // Today's set now, so that a seed that cannot derive keys fails at start, not per request.
    issuer.published()?;
    let (identity, certificate) = identity(&options)?;
    let concurrent = std::thread::available_parallelism().map_or(2, |n| n.get());
    let server = serve_exchange(
        ServerConfig {
            listen: options.listen,
            identity,
            limits: options.limits.clone(),
            stream_listen: options.stream_listen,
        },
        PROTOCOL,
        Handler::new(Arc::clone(&issuer), concurrent),
    )
    .await?;
    let socket = options.state.control_socket();
    let listener = admin::bind_socket(&socket)?;
    let control = tokio::spawn(admin::serve_socket(listener, Arc::clone(&issuer)));
    Ok(Running {
        server,
        issuer,
        control,
        socket,
        certificate,
    })
}

/// What `serve` prints on stdout once it listens: the shared ready line
/// ([`penrose_host::process::Ready`]) with what only the issuer says.
pub type Listening = penrose_host::process::Ready<IssuerReady>;

/// What only the issuer's ready line says.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IssuerReady {
    /// SHA-256 of today's published key set, hex (what agents compare).
    pub key_set_digest: String,
    /// The quota per (credential, day, counter).
    pub tokens_per_epoch: u16,
    /// Requests per credential per hour.
    pub requests_per_hour: u32,
}

/// Runs the issuer on the system clock until SIGINT or SIGTERM.
pub async fn run(options: ServeOptions) -> Result<(), IssuerError> {
    // Signals are handled from before the ready line on (docs/architecture.md, "Signals"):
    // one sent as soon as the issuer says it listens stops it cleanly, and SIGHUP, which has
    // nothing to reload here (keys derive from the seed by day), is logged, not fatal.
    let mut signals = Signals::install().map_err(IssuerError::io("signal handlers"))?;
    let running = start(options, Arc::new(SystemClock)).await?;
    let issuer = Arc::clone(running.issuer());
    let line = Listening {
        server: "issuer".into(),
        listening: running.local_addr(),
        stream_listening: running.stream_addr(),
        certificate: running.certificate().clone(),
        control: Some(running.socket.clone()),
        metrics: None,
        details: IssuerReady {
            key_set_digest: penrose_core::hex::encode(&issuer.published()?.set.digest()),
            tokens_per_epoch: issuer.config().tokens_per_epoch(),
            requests_per_hour: issuer.config().requests_per_hour(),
        },
    };
    drop(issuer);
    // One line on stdout for whoever started the issuer (scripts, tests).
    print_ready(&line).map_err(IssuerError::io("stdout"))?;
    info!(listen = %running.local_addr(), "serving");
    while signals.next().await == Request::Reload {
        info!("SIGHUP: nothing to reload (the keys of each day derive from the seed); running on");
    }
    info!("shutting down");
    running.shutdown().await;
    Ok(())
}
