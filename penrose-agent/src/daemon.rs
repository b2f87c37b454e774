//! `penrose-agent run`: source -> pipeline -> record and spool -> uploader, until stopped.
//!
//! Three strands: the snippet source in a thread of its own (the live capture blocks on its
//! ring buffer), the pipeline in another (fingerprinting and Paillier encryption are CPU work
//! that must not delay the ring's reader), and the uploader as a tokio task. A sealed histogram
//! is appended to the sealed record and written to the spool before any network I/O. Stopping
//! (the `stop` flag: SIGINT/SIGTERM in the binary) ends the source, seals what the pipeline
//! holds into the spool, stops the uploader (a report in flight stays spooled), and writes the
//! final status. Histograms that would exceed the per-(counter, day) report cap are not sealed
//! at stop: they are lost, counted in `status` (`histograms_over_cap`, `samples_over_cap`). A
//! SIGKILL loses only the histograms not yet sealed: everything spooled is
//! delivered after the restart, exactly once thanks to the server's deduplication.
//!
//! With `[admission]` configured, a fourth strand, the token fetcher
//! ([`crate::admission::run`]), keeps the token store (`<state_dir>/tokens/`) supplied, and
//! the uploader spends a token on each report; without it, reports go without tokens.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use penrose_core::paillier::PublicKey;
use penrose_core::release::ReportsPerContributor;
use penrose_transport::{ClientConfig, RetryPolicy, Route, Trust};
use thiserror::Error;
use tokio::sync::Notify;

use crate::admission::{self, FetchTiming, Fetcher, ISSUER_PROTOCOL, TokenKind};
use crate::config::{AgentConfig, SourcePlan};
use crate::design_keys::DesignKeys;
use crate::pipeline::{Pipeline, PipelineConfig, PipelineError, Sealed};
use crate::record::{RecordBounds, RecordLog, sealed_per_day};
use crate::source::{EbpfSource, SnippetSource, SourceBatch, SourceError};
use crate::spool::{Spool, SpoolError, create_private_dir};
use crate::status::AgentStatus;
use crate::tokens::{TokenStore, TokenStoreError, evidence_token_dir, token_dir};
use crate::upload::{self, UploadConfig};
use penrose_host::clock::{SystemClock, today};

/// The spool's folder inside the state directory.
pub const SPOOL_DIR: &str = "spool";

/// Why the daemon could not start or had to stop.
#[derive(Debug, Error)]
pub enum DaemonError {
    /// A file the configuration names is missing or invalid.
    #[error("{0}")]
    Setup(String),
    /// The snippet source failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The spool could not be opened.
    #[error(transparent)]
    Spool(#[from] SpoolError),
    /// The pipeline could not be built.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// The token store could not be opened (or holds files others could read).
    #[error(transparent)]
    Tokens(#[from] TokenStoreError),
}

impl DaemonError {
    /// A host prerequisite of the live capture is missing (not root, no BTF, ...).
    pub fn is_missing_prerequisite(&self) -> bool {
        matches!(self, DaemonError::Source(SourceError::Capture(e)) if e.is_missing_prerequisite())
    }
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq)]
pub enum RunOutcome {
    /// `enabled = false`: nothing captured or sent.
    Disabled,
    /// Stopped; the final status.
    Stopped(Box<AgentStatus>),
}

/// Paths inside a state directory.
pub fn spool_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(SPOOL_DIR)
}

/// Reads the design server's public key file (`design.public_key`) with the shared reader,
/// which refuses a key under [`penrose_core::release::MIN_KEY_BITS`] bits.
pub fn load_public_key(path: &Path) -> Result<PublicKey, DaemonError> {
    penrose_host::key_file::read_public_key(path)
        .map_err(|e| DaemonError::Setup(format!("design.public_key: {e}")))
}

/// The source the configuration names, and nothing else: when the live capture cannot start
/// (not root, no BTF, no NVML for `counters = "nvml"`, ...) that is the error returned; the
/// agent never falls back to test equipment. The trace replay opens only when the
/// configuration names it (`capture.source = "test-replay"`), with a warning.
pub fn open_source(config: &AgentConfig) -> Result<Box<dyn SnippetSource>, DaemonError> {
    let plan = config
        .source_plan()
        .map_err(|(key, why)| DaemonError::Setup(format!("{key}: {why}")))?;
    Ok(match plan {
        SourcePlan::Ebpf { capture, budget } => Box::new(EbpfSource::start(capture, budget)?),
        SourcePlan::TestReplay { traces, replay } => crate::source::open_replay(&traces, replay)?,
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs the agent with the source its configuration names until `stop` is set.
pub async fn run(config: AgentConfig, stop: Arc<AtomicBool>) -> Result<RunOutcome, DaemonError> {
    if !config.enabled {
        tracing::info!(
            "penrose-agent is disabled by its configuration (enabled = false): nothing is captured or sent"
        );
        return Ok(RunOutcome::Disabled);
    }
    let for_source = config.clone();
    let source = tokio::task::spawn_blocking(move || open_source(&for_source))
        .await
        .map_err(|e| DaemonError::Setup(format!("starting the source: {e}")))??;
    run_with_source(config, source, stop).await
}

/// Runs the agent with a source of the caller's (the demo's in-process agents, tests).
pub async fn run_with_source(
    config: AgentConfig,
    source: Box<dyn SnippetSource>,
    stop: Arc<AtomicBool>,
) -> Result<RunOutcome, DaemonError> {
    if !config.enabled {
        tracing::info!("penrose-agent is disabled by its configuration (enabled = false)");
        return Ok(RunOutcome::Disabled);
    }
    let state_dir = config.state_dir.clone();
    create_private_dir(&state_dir)?;
    let keys = design_keys_setup(&config, &state_dir)?;
    let tor = tor_setup(&config, &state_dir)?;
    let upload_config = upload_setup(&config, tor.as_ref())?;
    let spool = Spool::open(&spool_dir(&state_dir), config.spool.max_bytes)?
        .with_rejected_bounds(config.spool.rejected_bounds())?;
    let admission = issuer_setup(
        &config,
        TokenKind::Admission,
        &state_dir,
        &spool,
        tor.as_ref(),
    )?;
    let evidence = issuer_setup(
        &config,
        TokenKind::Evidence,
        &state_dir,
        &spool,
        tor.as_ref(),
    )?;
    let (pipeline, record_status) = pipeline_setup(&config, source.as_ref(), &keys)?;
    log_start(&config, source.as_ref(), &spool, &upload_config);
    let status = initial_status(&config, source.as_ref(), record_status, &pipeline);
    let spool = Arc::new(Mutex::new(spool));
    let wake = Arc::new(Notify::new());
    let mut shared = upload::Shared::new(
        Arc::clone(&spool),
        Arc::clone(&status),
        Arc::clone(&wake),
        Arc::clone(&stop),
    );
    let fetchers = start_fetchers([admission, evidence], &mut shared, &status, &stop, &wake);
    let writer = StatusWriter::new(&shared, tor, keys.clone(), state_dir.clone());
    writer.write();

    // Source thread -> channel -> pipeline thread.
    let (tx, rx) = mpsc::channel::<SourceBatch>();
    let source_thread = spawn_source(source, tx, Arc::clone(&stop))?;
    let pipeline_thread = PipelineThread {
        pipeline,
        record: RecordLog::in_state_dir(&state_dir),
        record_bounds: config.spool.record_bounds(),
        spool,
        status: Arc::clone(&status),
        wake,
    }
    .spawn(rx)?;
    let key_lists = spawn_key_lists(keys, &upload_config)?;
    let mut tasks = Tasks {
        source_thread: Some(source_thread),
        pipeline_thread,
        uploader: tokio::spawn(upload::run(upload_config, shared)),
        key_lists,
        fetchers,
    };
    let source_error = watch(&writer, &mut tasks, &stop).await;
    tasks.finish().await;
    lock(&status).running = false;
    writer.write();
    if let Some(e) = source_error {
        return Err(DaemonError::Source(e));
    }
    let last = lock(&status).clone();
    Ok(RunOutcome::Stopped(Box::new(last)))
}

/// The settings the daemon runs with, in one line at start.
fn log_start(
    config: &AgentConfig,
    source: &dyn SnippetSource,
    spool: &Spool,
    upload: &UploadConfig,
) {
    let info = source.info();
    tracing::info!(
        "penrose-agent running: source {} (counters: {}), {} spooled reports, sending to {} ({}), seal at {} samples or {:?}, at most {} reports per counter and day",
        info.kind,
        info.counters,
        spool.entries().len(),
        upload.client.server,
        config.aggregator.server_name,
        config.seal.samples,
        config.seal.max_age_seconds.get(),
        config.seal.max_reports_per_counter_per_day,
    );
    if let Some(warning) = config.transport.route.warning() {
        tracing::warn!("{warning}");
    }
}

/// The status before anything ran: the source, the route, the record, the generations the
/// reports will name.
fn initial_status(
    config: &AgentConfig,
    source: &dyn SnippetSource,
    record: crate::status::RecordStatus,
    pipeline: &Pipeline,
) -> Arc<Mutex<AgentStatus>> {
    let mut status = AgentStatus {
        pid: std::process::id(),
        running: true,
        source: source.info(),
        budget_percent: config.capture.budget_percent,
        uploads: crate::status::UploadCounts {
            throttle_permille: 1000,
            ..Default::default()
        },
        record,
        arch: crate::source::archs_text(pipeline.archs()),
        ..AgentStatus::default()
    };
    status.route.route = config.transport.route;
    Arc::new(Mutex::new(status))
}

/// The design key list fetcher, when the agent follows the design server's lists.
fn spawn_key_lists(
    keys: DesignKeys,
    upload: &UploadConfig,
) -> Result<Option<tokio::task::JoinHandle<()>>, DaemonError> {
    if !keys.fetches_lists() {
        return Ok(None);
    }
    let client = penrose_transport::Client::new(upload.client.clone())
        .map_err(|e| DaemonError::Setup(format!("the key list client: {e}")))?;
    Ok(Some(tokio::spawn(crate::design_keys::run_fetcher(
        keys, client,
    ))))
}

/// Until stopped: writes the status twice a second, and stops the daemon when the source
/// failed (keeping what was spooled). Returns the source's error, if that is why.
async fn watch(writer: &StatusWriter, tasks: &mut Tasks, stop: &AtomicBool) -> Option<SourceError> {
    let mut source_error = None;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        writer.write();
        if let Some(t) = tasks.source_thread.take_if(|t| t.is_finished())
            && let Ok(Err(e)) = t.join()
        {
            lock(&writer.status).last_error = Some(e.to_string());
            source_error = Some(e);
            stop.store(true, Ordering::Relaxed);
        }
    }
    source_error
}

/// What the status file is written from.
struct StatusWriter {
    status: Arc<Mutex<AgentStatus>>,
    spool: Arc<Mutex<Spool>>,
    /// The admission and evidence token stores, when configured.
    stores: [Option<Arc<Mutex<TokenStore>>>; 2],
    tor: Option<Arc<penrose_tor::Tor>>,
    keys: DesignKeys,
    state_dir: PathBuf,
}

impl StatusWriter {
    /// A writer of the status and spool the uploader shares, with its token stores.
    fn new(
        shared: &upload::Shared,
        tor: Option<Arc<penrose_tor::Tor>>,
        keys: DesignKeys,
        state_dir: PathBuf,
    ) -> Self {
        Self {
            status: Arc::clone(&shared.status),
            spool: Arc::clone(&shared.spool),
            stores: [shared.tokens.clone(), shared.evidence.clone()],
            tor,
            keys,
            state_dir,
        }
    }

    fn write(&self) {
        let [admission, evidence] = &self.stores;
        refresh(
            &self.status,
            &self.spool,
            [admission.as_deref(), evidence.as_deref()],
            self.tor.as_deref(),
            &self.keys,
            &self.state_dir,
        );
    }
}

/// The threads and tasks of a running daemon.
struct Tasks {
    source_thread: Option<std::thread::JoinHandle<Result<(), SourceError>>>,
    pipeline_thread: std::thread::JoinHandle<()>,
    uploader: tokio::task::JoinHandle<()>,
    key_lists: Option<tokio::task::JoinHandle<()>>,
    fetchers: Vec<tokio::task::JoinHandle<()>>,
}

impl Tasks {
    /// Waits for each to end once the stop flag is set: the source, then the pipeline (which
    /// seals what it holds), the uploader (the spool keeps what was not sent), the token
    /// fetchers; the key list fetcher, which never ends by itself, is aborted.
    async fn finish(self) {
        tracing::info!("stopping: sealing what is held, uploads stop (the spool keeps the rest)");
        if let Some(t) = self.source_thread {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        let pipeline_thread = self.pipeline_thread;
        let _ = tokio::task::spawn_blocking(move || pipeline_thread.join()).await;
        let _ = self.uploader.await;
        if let Some(key_lists) = self.key_lists {
            key_lists.abort();
            let _ = key_lists.await;
        }
        for fetcher in self.fetchers {
            let _ = fetcher.await;
        }
    }
}

/// Starts the token fetcher of each issuer configured, its store shared with the uploader.
fn start_fetchers(
    setups: [Option<IssuerSetup>; 2],
    shared: &mut upload::Shared,
    status: &Arc<Mutex<AgentStatus>>,
    stop: &Arc<AtomicBool>,
    wake: &Arc<Notify>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let [admission, evidence] = setups;
    let mut fetchers = Vec::new();
    match admission {
        Some(setup) => {
            let (store, task) = start_fetcher(setup, status, stop, wake);
            shared.tokens = Some(store);
            fetchers.push(task);
        }
        None => tracing::info!(
            "admission tokens are not configured ([admission] address): reports are sent \
             without tokens"
        ),
    }
    if let Some(setup) = evidence {
        let (store, task) = start_fetcher(setup, status, stop, wake);
        shared.evidence = Some(store);
        fetchers.push(task);
    }
    fetchers
}

/// The design server's keys: the configured public key (refused under the floor) and, with a
/// list signer, the signed list kept in the state directory.
fn design_keys_setup(config: &AgentConfig, state_dir: &Path) -> Result<DesignKeys, DaemonError> {
    let key = load_public_key(&config.design.public_key)?;
    let signer = config
        .design
        .key_list_signer
        .as_deref()
        .map(penrose_host::key_file::read_signer)
        .transpose()
        .map_err(|e| DaemonError::Setup(format!("design.key_list_signer: {e}")))?;
    DesignKeys::open(key, signer, state_dir)
        .map_err(|e| DaemonError::Setup(format!("the design key list: {e}")))
}

/// How reports are sent: the pinned aggregation server, the retry and timeout settings, and
/// over Tor a circuit per connection (the exit resolves the server; this host never looks it
/// up).
fn upload_setup(
    config: &AgentConfig,
    tor: Option<&Arc<penrose_tor::Tor>>,
) -> Result<UploadConfig, DaemonError> {
    let trust = Trust::load_pinned(&config.aggregator.certificate).map_err(|e| {
        DaemonError::Setup(format!(
            "aggregator.certificate {}: {e}",
            config.aggregator.certificate.display()
        ))
    })?;
    let server = match tor {
        None => config.aggregator_addr().map_err(DaemonError::Setup)?,
        Some(_) => penrose_transport::carrier::STREAM_SERVER,
    };
    let u = &config.upload;
    let mut client = ClientConfig::new(server, config.aggregator.server_name.clone(), trust);
    client.retry = RetryPolicy {
        attempts: u.attempts,
        base_delay: u.backoff_base_seconds.get(),
        max_delay: u.backoff_max_seconds.get(),
        jitter: 0.5,
    };
    client.connect_timeout = u.connect_timeout_seconds.get();
    client.ack_timeout = u.ack_timeout_seconds.get();
    if let Some(tor) = tor {
        carry_over_tor(
            &mut client,
            tor,
            &config.transport.aggregator_stream,
            config,
        );
    }
    Ok(UploadConfig {
        client,
        delay_max: u.delay_max_seconds.get(),
        backoff_base: u.backoff_base_seconds.get(),
        backoff_max: u.backoff_max_seconds.get(),
    })
}

/// The pipeline for this host's GPUs and the configured sealing, with the report cap counting
/// what earlier runs sealed (so that a restart does not reopen a day's cap), and the sealed
/// record pruned to its bounds first.
fn pipeline_setup(
    config: &AgentConfig,
    source: &dyn SnippetSource,
    keys: &DesignKeys,
) -> Result<(Pipeline, crate::status::RecordStatus), DaemonError> {
    if config.seal.test_record_joint_values {
        crate::test_equipment::warn(
            "seal.test_record_joint_values = true",
            "the raw counter values behind every joint view are written into the sealed record",
        );
    }
    let state_dir = &config.state_dir;
    let mut pipeline = Pipeline::new(
        PipelineConfig {
            tau: config.classes.tau,
            max_local_apps: config.classes.max_local_apps,
            // The host's GPUs as the counter source read them (the stand-in's only when test
            // equipment is configured); the pipeline coarsens each to its generation and
            // refuses any no report may name. Without counters there are no samples, so no
            // report, and no architecture.
            archs: source.gpu_archs(),
            seal_samples: config.seal.samples,
            max_age: config.seal.max_age_seconds.get(),
            reports_per_counter_per_day: ReportsPerContributor::for_agent(
                config.seal.max_reports_per_counter_per_day,
            )
            .map_err(|e| {
                DaemonError::Setup(format!("seal.max_reports_per_counter_per_day: {e}"))
            })?,
            test_record_joint_values: config.seal.test_record_joint_values,
        },
        keys.clone(),
    )?;
    // The sealed record is kept within its bounds from the start (age, bytes, damaged lines).
    let record_bounds = config.spool.record_bounds();
    let pruned = RecordLog::in_state_dir(state_dir)
        .prune(record_bounds, today(), Pipeline::oldest_capped_day(today()))
        .map_err(|e| DaemonError::Setup(format!("pruning the sealed record: {e}")))?;
    let mut record_status = crate::status::RecordStatus::default();
    record_status.add(&pruned);
    // The report cap counts what earlier runs sealed (the sealed record) so that a restart
    // does not reopen a day's cap.
    let record_path = RecordLog::in_state_dir(state_dir).path().to_owned();
    match sealed_per_day(&record_path, Pipeline::oldest_capped_day(today())) {
        Ok((sealed, skipped)) => {
            if skipped > 0 {
                tracing::warn!(
                    "{}: {skipped} lines are not records; the report cap does not count them",
                    record_path.display()
                );
            }
            pipeline.restore_sealed(&sealed);
        }
        Err(e) => tracing::warn!("{e}: the report cap counts only the reports this run seals"),
    }
    Ok((pipeline, record_status))
}

/// Runs the snippet source on a thread of its own, its batches sent to `tx`, until `stop`.
fn spawn_source(
    mut source: Box<dyn SnippetSource>,
    tx: mpsc::Sender<SourceBatch>,
    stop: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<Result<(), SourceError>>, DaemonError> {
    std::thread::Builder::new()
        .name("penrose-source".into())
        .spawn(move || {
            let r = source.run(&stop, &mut |batch| {
                let _ = tx.send(batch);
            });
            if let Err(e) = &r {
                tracing::error!("snippet source failed: {e}");
            } else {
                tracing::info!("snippet source ended");
            }
            r
        })
        .map_err(|e| DaemonError::Setup(format!("starting the source thread: {e}")))
}

/// What the daemon needs for one issuer's tokens, checked at start.
struct IssuerSetup {
    kind: TokenKind,
    store: TokenStore,
    client: penrose_transport::exchange::ExchangeClient,
    credential: penrose_core::tokens::protocol::Credential,
    timing: FetchTiming,
}

/// The token store behind its lock, and the fetcher's task on its schedule.
fn start_fetcher(
    setup: IssuerSetup,
    status: &Arc<Mutex<AgentStatus>>,
    stop: &Arc<AtomicBool>,
    wake: &Arc<Notify>,
) -> (Arc<Mutex<TokenStore>>, tokio::task::JoinHandle<()>) {
    let store = Arc::new(Mutex::new(setup.store));
    setup.kind.counts(&mut lock(status)).configured = true;
    let mut fetch = Fetcher::new(
        setup.client,
        setup.credential,
        Arc::clone(&store),
        Arc::clone(status),
        std::sync::Arc::new(SystemClock),
    );
    if setup.kind == TokenKind::Evidence {
        fetch = fetch.for_evidence();
    }
    let task = tokio::spawn(admission::run(
        fetch,
        setup.timing,
        Arc::clone(stop),
        Arc::clone(wake),
    ));
    (store, task)
}

/// With `[admission]` (or `[evidence]`) configured: this host's credential there, the
/// issuer's pinned certificate and address, and the token store (pruned against the spool);
/// `None` without it.
fn issuer_setup(
    config: &AgentConfig,
    kind: TokenKind,
    state_dir: &Path,
    spool: &Spool,
    tor: Option<&Arc<penrose_tor::Tor>>,
) -> Result<Option<IssuerSetup>, DaemonError> {
    let (a, stream, dir) = match kind {
        TokenKind::Admission => (
            &config.admission,
            &config.transport.issuer_stream,
            token_dir(state_dir),
        ),
        TokenKind::Evidence => (
            &config.evidence,
            &config.transport.evidence_issuer_stream,
            evidence_token_dir(state_dir),
        ),
    };
    if !a.is_configured() {
        return Ok(None);
    }
    let label = kind.label();
    let credential =
        admission::load_credential(&a.credential).map_err(|e| DaemonError::Setup(e.to_string()))?;
    let trust = Trust::load_pinned(&a.certificate).map_err(|e| {
        DaemonError::Setup(format!(
            "{label}.certificate {}: {e}",
            a.certificate.display()
        ))
    })?;
    let issuer = match tor {
        None => a.addr().map_err(DaemonError::Setup)?,
        Some(_) => penrose_transport::carrier::STREAM_SERVER,
    };
    let u = &config.upload;
    let mut client = ClientConfig::new(issuer, a.server_name.clone(), trust);
    client.connect_timeout = u.connect_timeout_seconds.get();
    client.ack_timeout = u.ack_timeout_seconds.get();
    if let Some(tor) = tor {
        carry_over_tor(&mut client, tor, stream, config);
    }
    let client = penrose_transport::exchange::ExchangeClient::new(client, ISSUER_PROTOCOL)
        .map_err(|e| DaemonError::Setup(format!("{label}: the issuer's client: {e}")))?;
    let mut store = TokenStore::open(&dir)?;
    let spooled = spool.entries().iter().map(|e| e.report_id).collect();
    store.prune(today(), &spooled)?;
    let held: u32 = store.counts().iter().map(|c| c.unspent).sum();
    tracing::info!(
        "{label} tokens from {issuer} ({}): {held} held",
        a.server_name
    );
    Ok(Some(IssuerSetup {
        kind,
        store,
        client,
        credential,
        timing: FetchTiming {
            refresh_max: a.refresh_max_seconds.get(),
            retry_min: a.retry_min_seconds.get(),
        },
    }))
}

/// `stores`: the admission and the evidence token stores, where configured.
fn refresh(
    status: &Mutex<AgentStatus>,
    spool: &Mutex<Spool>,
    stores: [Option<&Mutex<TokenStore>>; 2],
    tor: Option<&penrose_tor::Tor>,
    keys: &DesignKeys,
    state_dir: &Path,
) {
    let [held, evidence_held] = stores.map(|s| s.map(|store| lock(store).counts()));
    let snapshot = {
        let spool = lock(spool);
        let mut s = lock(status);
        s.design_key = crate::status::DesignKeyStatus {
            key_id_today: keys.key_for(today()).map(|k| k.key_id().to_string()),
            list_sequence: keys.sequence(),
            follows_lists: keys.fetches_lists(),
        };
        s.spool.reports = spool.entries().len() as u64;
        s.spool.bytes = spool.bytes();
        s.spool.max_bytes = spool.max_bytes();
        s.spool.counts = spool.counts();
        if let Some(held) = held {
            s.tokens.held = held;
        }
        if let Some(held) = evidence_held {
            s.evidence.held = held;
        }
        if let Some(tor) = tor {
            let (opened, failed) = tor.counts();
            s.route.tor_network = Some(tor.network().to_string());
            s.route.tor_ready = tor.is_ready();
            s.route.tor_streams = opened;
            s.route.tor_stream_failures = failed;
            s.route.tor_recent_circuits = tor
                .streams()
                .into_iter()
                .map(|r| r.circuit.unwrap_or_else(|| "?".into()))
                .collect();
        }
        s.clone()
    };
    if let Err(e) = snapshot.write(state_dir) {
        tracing::warn!("writing the status file: {e}");
    }
}

/// The Tor client when `transport.route = "tor"`: state under `<state_dir>/tor`, bootstrapped
/// by the first stream.
fn tor_setup(
    config: &AgentConfig,
    state_dir: &Path,
) -> Result<Option<Arc<penrose_tor::Tor>>, DaemonError> {
    let Some(network) = config
        .transport
        .tor_network()
        .map_err(|e| DaemonError::Setup(format!("transport.tor_network: {e}")))?
    else {
        return Ok(None);
    };
    let tor = penrose_tor::Tor::new(network, &state_dir.join("tor"))
        .map_err(|e| DaemonError::Setup(format!("transport: {e}")))?;
    Ok(Some(tor))
}

/// Sends `client`'s connections over Tor to `target` (a server's stream port), each on a
/// circuit of its own, with the Tor connect timeout.
fn carry_over_tor(
    client: &mut ClientConfig,
    tor: &Arc<penrose_tor::Tor>,
    target: &str,
    config: &AgentConfig,
) {
    client.route = Route::Carried(Arc::new(tor.dialer(target.trim())));
    client.connect_timeout = config.transport.tor_connect_timeout_seconds.get();
}

struct PipelineThread {
    pipeline: Pipeline,
    record: RecordLog,
    record_bounds: RecordBounds,
    spool: Arc<Mutex<Spool>>,
    status: Arc<Mutex<AgentStatus>>,
    wake: Arc<Notify>,
}

impl PipelineThread {
    fn spawn(
        self,
        rx: mpsc::Receiver<SourceBatch>,
    ) -> Result<std::thread::JoinHandle<()>, DaemonError> {
        std::thread::Builder::new()
            .name("penrose-pipeline".into())
            .spawn(move || self.run(rx))
            .map_err(|e| DaemonError::Setup(format!("starting the pipeline thread: {e}")))
    }

    fn run(mut self, rx: mpsc::Receiver<SourceBatch>) {
        loop {
            let sealed = match rx.recv_timeout(Duration::from_millis(250)) {
                Ok(batch) => {
                    {
                        let mut status = lock(&self.status);
                        status.add_windows(&batch.windows);
                        if let Some(info) = batch.info {
                            status.source = info;
                        }
                    }
                    let (now, day) = (Instant::now(), today());
                    let mut out = Vec::new();
                    for snippet in &batch.snippets {
                        match self.pipeline.ingest(snippet, now, day) {
                            Ok(s) => out.extend(s),
                            Err(e) => self.error(format!("pipeline: {e}")),
                        }
                    }
                    out
                }
                Err(RecvTimeoutError::Timeout) => self
                    .pipeline
                    .tick(Instant::now(), today())
                    .unwrap_or_else(|e| {
                        self.error(format!("pipeline: {e}"));
                        Vec::new()
                    }),
                Err(RecvTimeoutError::Disconnected) => {
                    // The source ended (stop, or it has nothing more): seal what is held,
                    // within the report cap; what exceeds it is discarded and counted.
                    let rest = self.pipeline.flush(today()).unwrap_or_else(|e| {
                        self.error(format!("pipeline: {e}"));
                        Vec::new()
                    });
                    self.store(rest);
                    return;
                }
            };
            self.store(sealed);
        }
    }

    fn error(&self, message: String) {
        tracing::warn!("{message}");
        lock(&self.status).last_error = Some(message);
    }

    /// Records, then spools, each sealed report; then tells the uploader.
    fn store(&mut self, sealed: Vec<Sealed>) {
        if sealed.is_empty() {
            lock(&self.status).pipeline = self.pipeline.counts();
            return;
        }
        for s in sealed {
            match self.record.append(&s.record) {
                Ok(bytes) => {
                    lock(&self.status).record.bytes = bytes;
                    if bytes > self.record_bounds.max_bytes {
                        let day = today();
                        match self.record.prune(
                            self.record_bounds,
                            day,
                            Pipeline::oldest_capped_day(day),
                        ) {
                            Ok(pruned) => lock(&self.status).record.add(&pruned),
                            Err(e) => self.error(format!("pruning the sealed record: {e}")),
                        }
                    }
                }
                Err(e) => {
                    self.error(format!("sealed record: {e}; report not spooled"));
                    continue;
                }
            }
            let pushed = lock(&self.spool).push(s.report.report_id, &s.frame);
            if let Err(e) = pushed {
                self.error(format!("spool: {e}; report lost"));
            }
        }
        lock(&self.status).pipeline = self.pipeline.counts();
        self.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use penrose_core::paillier::{KeySize, Keypair};

    use super::*;

    /// A design key under 2048 bits is refused, in one line naming the file.
    #[test]
    fn a_weak_design_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weak.key");
        let keys = Keypair::generate_with_size(KeySize::Bits1024, &mut rand::rng());
        std::fs::write(&path, keys.public_key().to_bytes()).unwrap();
        let message = load_public_key(&path).unwrap_err().to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains("design.public_key"), "{message}");
        assert!(message.contains("1024-bit"), "{message}");
        assert!(!message.contains('\n'), "{message}");
    }
}
