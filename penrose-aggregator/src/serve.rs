//! The server process: reads the admission key ring, opens the data directory, rebuilds the
//! state, and runs the QUIC transport, the writer, the admin socket and the metrics responder
//! until it is told to stop (SIGINT/SIGTERM) or a durable write fails. SIGHUP reads the key
//! ring file again (`crate::control::reload_key_ring`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use penrose_core::fingerprint::FingerprintParams;
use penrose_host::process::{Request, Signals, print_ready};
use penrose_transport::{Encoding, Identity, Limits, Server, ServerConfig};
use tracing::{error, info, warn};

use crate::admission::{Admission, AdmissionConfig};
use crate::config::DataDir;
use crate::control::{self, Admin};
use crate::epochs::EpochPolicy;
use crate::export::{load_or_create_signing_key, sub_sum_reports};
use crate::ingest::{Ingest, IngestConfig, Writer};
use penrose_core::release::ReleaseRule;

use crate::design_keys::{KeySettings, stored_settings};
use crate::metrics::{Metrics, render_transport, serve_http};
use crate::state::{State, stored_throttle};
use crate::store::{RocksStore, Store};

/// How often the server checks whether an epoch is due to close without a report arriving.
const EPOCH_TICK: Duration = Duration::from_secs(30);

/// Everything `serve` needs, after the configuration file and flags are merged.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The data directory.
    pub data: DataDir,
    /// QUIC listen address (UDP).
    pub listen: SocketAddr,
    /// TCP address for QUIC carried on streams (from Tor exits); `None`: UDP only.
    pub stream_listen: Option<SocketAddr>,
    /// The design server's keys (required on first start; later the stored ones are used).
    pub keys: KeySource,
    /// Prometheus listen address.
    pub metrics: Option<SocketAddr>,
    /// TLS certificate and key; default: DATA/tls/, self-signed on first start.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Batching.
    pub ingest: IngestConfig,
    /// Transport limits.
    pub limits: Limits,
    /// How epochs are cut (`None`: as the store says; a new store: by day).
    pub epochs: Option<EpochPolicy>,
    /// The release rule exports apply.
    pub release: ReleaseRule,
    /// How reports are admitted: by tokens of a key ring file, or open (only when asked).
    pub admission: AdmissionConfig,
}

/// Where the design server's keys come from (`crate::design_keys`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum KeySource {
    /// What the store was last given (a store never served is refused).
    #[default]
    Stored,
    /// One public key file, for every day (`public_key`).
    PublicKey(PathBuf),
    /// The design server's signed key list, verified under its pinned list-signing key
    /// (`key_list`, `key_list_signer`): keys roll over without a restart.
    List {
        /// The list file (`penrose-design key-list` writes it).
        list: PathBuf,
        /// The list-signing public key file.
        signer: PathBuf,
    },
}

impl KeySource {
    /// From the flags or configuration keys: a public key, or a list with its signer.
    pub fn new(
        public_key: Option<PathBuf>,
        key_list: Option<PathBuf>,
        signer: Option<PathBuf>,
    ) -> Result<Self> {
        Ok(match (public_key, key_list, signer) {
            (None, None, None) => KeySource::Stored,
            (Some(key), None, None) => KeySource::PublicKey(key),
            (None, Some(list), Some(signer)) => KeySource::List { list, signer },
            (None, Some(_), None) | (None, None, Some(_)) => {
                bail!("key_list and key_list_signer go together")
            }
            (Some(_), _, _) => bail!("give public_key or key_list, not both"),
        })
    }
}

/// Opens a data directory and starts ingest over it (no transport), admitting reports as
/// `admission` says: what `serve` runs on, and what admin commands use when no server is
/// running (they ingest nothing).
pub fn open(
    data: &DataDir,
    keys: &KeySource,
    config: IngestConfig,
    epochs: Option<EpochPolicy>,
    release: ReleaseRule,
    admission: Admission,
) -> Result<(Admin, Writer)> {
    // Given keys are checked before anything is created, so a refused key leaves no data
    // directory behind.
    let given = match keys {
        KeySource::Stored => None,
        KeySource::PublicKey(path) => Some(KeySettings::single(
            penrose_host::key_file::read_public_key(path)?,
        )),
        // The list's reader checks the key floor, at start and at `reload-keys` alike.
        KeySource::List { list, signer } => Some(KeySettings::from_files(list, signer)?),
    };
    data.create()
        .with_context(|| format!("creating {}", data.path().display()))?;
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(&data.db()).with_context(|| {
        format!(
            "opening the store in {} (is a server running?)",
            data.db().display()
        )
    })?);
    let settings = match given {
        Some(settings) => settings,
        None => match stored_settings(store.as_ref())? {
            Some(settings) => settings,
            None => bail!(
                "{} has never been served; give the design server's public key (--public-key) \
                 or its signed key list (--key-list with --key-list-signer)",
                data.path().display()
            ),
        },
    };
    let mut state = State::open(
        Arc::clone(&store),
        settings,
        FingerprintParams::default(),
        sub_sum_reports(&release),
        epochs,
    )?;
    state.set_keep_evidence(config.keep_evidence);
    let throttle = stored_throttle(store.as_ref())?;
    let (ingest, writer) = Ingest::start(
        state,
        throttle,
        config,
        admission,
        Arc::new(Metrics::default()),
    )
    .context("starting the writer thread")?;
    let signing = load_or_create_signing_key(&data.signing_key())?;
    Ok((
        Admin {
            ingest,
            store,
            signing,
            release,
            serving: false,
        },
        writer,
    ))
}

/// Logs how reports are admitted: a warning when open, or when the key ring holds no key of
/// today or of tomorrow (the issuer exports rings ahead of time).
pub fn log_admission(admission: &Admission) {
    let today = penrose_host::clock::today();
    match admission {
        Admission::Open => {
            warn!("admission open: anyone who can reach this server can report");
        }
        Admission::Tokens(ring) => {
            let epochs = ring.epochs();
            info!(
                key_ring = %ring.path().map_or_else(String::new, |p| p.display().to_string()),
                keys = ring.ring().keys().len(),
                first_epoch = epochs.first().map(|e| e.0),
                last_epoch = epochs.last().map(|e| e.0),
                "admission by tokens"
            );
            for day in [today, penrose_core::wire::Day(today.0.saturating_add(1))] {
                if !ring.covers(day) {
                    warn!(
                        day = day.0,
                        "the key ring holds no key of day {}: every report of that day will be \
                         refused (invalid_token) until the issuer's next ring is loaded \
                         (SIGHUP or `penrose-aggregator reload-keys`)",
                        day.0
                    );
                }
            }
        }
    }
}

/// The certificate agents pin: the one configured, else the data directory's own.
fn certificate(options: &ServeOptions) -> PathBuf {
    options
        .tls
        .as_ref()
        .map_or_else(|| options.data.tls_cert(), |(cert, _)| cert.clone())
}

fn identity(options: &ServeOptions) -> Result<Identity> {
    let (cert, key) = options
        .tls
        .clone()
        .unwrap_or_else(|| (options.data.tls_cert(), options.data.tls_key()));
    if cert.exists() {
        return Identity::load(&cert, &key).context("loading the TLS identity");
    }
    if options.tls.is_some() {
        bail!("TLS certificate {} does not exist", cert.display());
    }
    let names = vec!["localhost".to_string(), options.listen.ip().to_string()];
    let identity = Identity::self_signed(names).context("creating a self-signed certificate")?;
    if let Some(dir) = cert.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    identity
        .save(&cert, &key, Encoding::Pem)
        .context("saving the TLS identity")?;
    info!(cert = %cert.display(), "created a self-signed certificate; agents pin it");
    Ok(identity)
}

/// What `serve` prints on stdout once it listens: the shared ready line
/// ([`penrose_host::process::Ready`]: addresses with the ports the system chose for `:0`, the
/// certificate agents pin, the admin socket) with what only this server says.
pub type Listening = penrose_host::process::Ready<AggregatorReady>;

/// What only the aggregation server's ready line says.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AggregatorReady {
    /// The export signing key, hex (what the design server pins).
    pub signer: String,
}

/// Runs the server until SIGINT/SIGTERM (Ok) or a failed durable write (Err).
pub async fn run(options: ServeOptions) -> Result<()> {
    // The key ring is read before anything is created: a refused file leaves nothing behind.
    let admission = options.admission.load()?;
    log_admission(&admission);
    let (mut admin, writer) = open(
        &options.data,
        &options.keys,
        options.ingest,
        options.epochs,
        options.release,
        admission,
    )?;
    admin.serving = true;
    let identity = identity(&options)?;
    let server = penrose_transport::serve(
        ServerConfig {
            listen: options.listen,
            identity,
            limits: options.limits.clone(),
            stream_listen: options.stream_listen,
        },
        Arc::new(admin.ingest.clone()),
    )
    .await
    .context("starting the QUIC endpoint")?;
    let socket = options.data.control_socket();
    let control = {
        let admin = admin.clone();
        let socket = socket.clone();
        tokio::spawn(async move { control::serve_socket(&socket, admin).await })
    };
    let metrics_addr = start_metrics(options.metrics, &admin, &server).await?;
    // Signals are handled from before the ready line on: a SIGHUP sent once the server says
    // it listens reloads the key ring rather than ending the process.
    let mut signals = Signals::install()?;
    // One line on stdout for whoever started the server (scripts, tests).
    let ready = Listening {
        server: "aggregator".into(),
        listening: server.local_addr(),
        stream_listening: server.stream_addr(),
        certificate: certificate(&options),
        control: Some(socket.clone()),
        metrics: metrics_addr,
        details: AggregatorReady {
            signer: crate::export::hex(admin.signing.verifying_key().as_bytes()),
        },
    };
    print_ready(&ready).context("writing the ready line")?;
    info!(listen = %server.local_addr(), "serving");
    let stopped = serve_until_stopped(&admin, &mut signals).await;
    info!("shutting down");
    server.shutdown().await;
    control.abort();
    let _ = std::fs::remove_file(&socket);
    drop(admin);
    let result = tokio::task::spawn_blocking(move || writer.join()).await?;
    if let Err(e) = result {
        error!(error = %e, "the writer stopped");
        bail!("a durable write failed: {e}");
    }
    if stopped == Stopped::WriterFailed {
        bail!("the writer stopped");
    }
    Ok(())
}

/// Starts the metrics responder on `addr`, if given (the ingest's metrics, the store's sizes
/// and the transport's counters on one page); returns the address it listens on.
async fn start_metrics(
    addr: Option<SocketAddr>,
    admin: &Admin,
    server: &Server,
) -> Result<Option<SocketAddr>> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics address {addr}"))?;
    let local = listener.local_addr()?;
    let page = {
        let metrics = Arc::clone(admin.ingest.metrics());
        let store = Arc::clone(&admin.store);
        let transport = server.stats_handle();
        move || {
            let mut page = metrics.render(&store.sizes());
            page.push_str(&render_transport(&transport.snapshot()));
            page
        }
    };
    tokio::spawn(serve_http(listener, page));
    Ok(Some(local))
}

/// Why the server stopped serving.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stopped {
    /// SIGINT or SIGTERM.
    Asked,
    /// The writer is no longer healthy: a durable write failed.
    WriterFailed,
}

/// Serves until a stop signal or an unhealthy writer: SIGHUP reloads the keys, and due
/// epochs are closed by the clock even when no report arrives to trigger it.
async fn serve_until_stopped(admin: &Admin, signals: &mut Signals) -> Stopped {
    let mut health = tokio::time::interval(Duration::from_millis(200));
    // Epochs close by the clock even when no report arrives to trigger it.
    let mut epochs = tokio::time::interval(EPOCH_TICK);
    loop {
        tokio::select! {
            request = signals.next() => {
                if request == Request::Stop {
                    return Stopped::Asked;
                }
                let ingest = admin.ingest.clone();
                match tokio::task::spawn_blocking(move || control::reload_keys(&ingest)).await {
                    Ok(Ok(_)) => log_admission(&admin.ingest.admission()),
                    Ok(Err(e)) => error!(
                        error = %e,
                        "SIGHUP: the keys were not reloaded; those in use stay"
                    ),
                    Err(e) => error!(error = %e, "SIGHUP: reloading the keys failed"),
                }
            }
            _ = health.tick() => {
                if !admin.ingest.is_healthy() {
                    return Stopped::WriterFailed;
                }
            }
            _ = epochs.tick() => {
                if let Err(e) = admin.ingest.close_due().await {
                    error!(error = %e, "closing due epochs failed");
                }
            }
        }
    }
}
