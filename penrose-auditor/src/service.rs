//! The auditor's endpoint: `penrose_transport::exchange` (QUIC, one request and one answer per
//! stream, ALPN `penrose-auditor/1`, bodies of at most `MAX_AUDIT_MESSAGE` bytes) answered by
//! an [`Auditor`]. Every answer is computed on tokio's blocking threads (partial decryptions,
//! a synced write), a few at a time, never on the async executor. The process holds the data
//! directory's lock while it serves.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use penrose_core::audit::{ALPN, AuditAnswer, AuditRefusal, MAX_AUDIT_MESSAGE};
use penrose_core::paillier::KeyId;
use penrose_host::process::{Request, Signals, print_ready};
use penrose_transport::exchange::{BlockingAnswers, Offloaded, Protocol, serve_exchange};
use penrose_transport::{Encoding, Identity, Limits, Server, ServerConfig};
use serde::{Deserialize, Serialize};
use tracing::info;

use crate::auditor::Auditor;
use crate::data_dir::{DataDir, DirLock};
use crate::error::AuditorError;

/// The auditor's protocol on the exchange transport.
pub const PROTOCOL: Protocol = Protocol {
    alpn: ALPN,
    max_body: MAX_AUDIT_MESSAGE,
};

/// The default listen address: loopback until the operator says otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:4435";

/// Answers computed at once; each spreads its page's partial decryptions over the CPUs, so
/// more would only queue on them.
pub const CONCURRENT_ANSWERS: usize = 2;

/// How long a request body may take to arrive, and an answer to be delivered: a bundle of
/// tens of megabytes must cross a real network, where the report endpoint's 5 s suit a report.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(60);

/// Answers exchanges with an [`Auditor`], off the async threads, a few at a time.
pub type Handler = Offloaded<Auditor>;

impl BlockingAnswers for Auditor {
    fn answer(&self, request: &[u8]) -> Vec<u8> {
        Auditor::answer(self, request)
    }

    fn unavailable(&self) -> Vec<u8> {
        AuditAnswer::Refused(AuditRefusal::Unavailable).encode()
    }
}

/// Everything `serve` needs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The data directory (made by `init`).
    pub data: DataDir,
    /// QUIC listen address (UDP).
    pub listen: SocketAddr,
    /// TLS certificate and key; default: DATA/tls/, self-signed on first start.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Extra names for a self-signed certificate (besides `localhost` and the listen address).
    pub names: Vec<String>,
    /// Transport limits.
    pub limits: Limits,
}

impl ServeOptions {
    /// Options with the default limits, but [`BODY_TIMEOUT`] for a body.
    pub fn new(data: DataDir, listen: SocketAddr) -> Self {
        let limits = Limits {
            stream_read_timeout: BODY_TIMEOUT,
            ..Limits::default()
        };
        ServeOptions {
            data,
            listen,
            tls: None,
            names: Vec::new(),
            limits,
        }
    }
}

/// A running auditor: its endpoint, holding the data directory's lock.
pub struct Running {
    server: Server,
    auditor: Arc<Auditor>,
    certificate: PathBuf,
    _lock: DirLock,
}

impl Running {
    /// The address the endpoint is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// The auditor behind it.
    pub fn auditor(&self) -> &Arc<Auditor> {
        &self.auditor
    }

    /// The certificate the design server pins.
    pub fn certificate(&self) -> &PathBuf {
        &self.certificate
    }

    /// Stops taking connections and lets the answers in flight finish (their records are
    /// written before they are sent), then gives the data directory back.
    pub async fn shutdown(self) {
        self.server.shutdown().await;
        // Answers still on blocking threads hold the auditor; the lock is released only once
        // they are done, so that no other process changes the record under them.
        let mut auditor = self.auditor;
        while let Err(shared) = Arc::try_unwrap(auditor) {
            auditor = shared;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn identity(options: &ServeOptions) -> Result<(Identity, PathBuf), AuditorError> {
    let (cert, key) = options
        .tls
        .clone()
        .unwrap_or_else(|| (options.data.tls_cert(), options.data.tls_key()));
    if cert.exists() {
        return Ok((Identity::load(&cert, &key)?, cert));
    }
    if options.tls.is_some() {
        return Err(AuditorError::io(&cert)(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no such certificate",
        )));
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
            .map_err(AuditorError::io(dir))?;
    }
    identity.save(&cert, &key, Encoding::Pem)?;
    info!(cert = %cert.display(), "created a self-signed certificate; the design server pins it");
    Ok((identity, cert))
}

/// Locks the data directory, opens the auditor and starts the endpoint; must run inside a
/// tokio runtime.
pub async fn start(options: ServeOptions) -> Result<Running, AuditorError> {
    let lock = options.data.lock()?;
    let auditor = Arc::new(Auditor::open(&options.data)?);
    let (identity, certificate) = identity(&options)?;
    let server = serve_exchange(
        ServerConfig {
            listen: options.listen,
            identity,
            limits: options.limits.clone(),
            stream_listen: None,
        },
        PROTOCOL,
        Handler::new(Arc::clone(&auditor), CONCURRENT_ANSWERS),
    )
    .await?;
    Ok(Running {
        server,
        auditor,
        certificate,
        _lock: lock,
    })
}

/// What `serve` prints on stdout once it listens: the shared ready line
/// ([`penrose_host::process::Ready`]) with what only the auditor says.
pub type Listening = penrose_host::process::Ready<AuditorReady>;

/// What only the auditor's ready line says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditorReady {
    /// The chain followed (hex), if any yet.
    pub instance: Option<String>,
    /// The last bundle taken (0: none).
    pub seq: u64,
    /// The keys a share is held of.
    pub keys: Vec<KeyId>,
    /// k.
    pub threshold: u64,
    /// T.
    pub cap: u32,
}

/// Runs the auditor until SIGINT or SIGTERM.
pub async fn run(options: ServeOptions) -> Result<(), AuditorError> {
    // Signals are handled from before the ready line on, so that one sent as soon as the
    // auditor says it listens stops it cleanly; SIGHUP has nothing to reload and is logged.
    let mut signals = Signals::install().map_err(AuditorError::io("signal handlers"))?;
    let running = start(options).await?;
    let auditor = running.auditor();
    let status = auditor.status();
    let line = Listening {
        server: "auditor".into(),
        listening: running.local_addr(),
        stream_listening: None,
        certificate: running.certificate().clone(),
        control: None,
        metrics: None,
        details: AuditorReady {
            instance: status.instance.map(|i| i.to_string()),
            seq: status.seq,
            keys: auditor.key_ids(),
            threshold: auditor.policy().threshold().get(),
            cap: auditor.policy().cap().get(),
        },
    };
    // One line on stdout for whoever started the auditor (scripts, tests).
    print_ready(&line).map_err(AuditorError::io("stdout"))?;
    info!(listen = %running.local_addr(), "serving");
    while signals.next().await == Request::Reload {
        info!("SIGHUP: nothing to reload (shares are added with add-share while stopped)");
    }
    info!("shutting down");
    running.shutdown().await;
    Ok(())
}
