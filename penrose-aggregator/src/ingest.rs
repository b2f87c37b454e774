//! The ingest pipeline a transport calls with each received frame: validate, queue, batch,
//! durable write, and only then the ack.
//!
//! Validation (decoding, the ciphertext range checks and, under admission by tokens, the
//! token's MAC: [`crate::admission`]) runs on the caller's task, so it spreads over the
//! runtime's threads. Valid reports go to one writer thread through a bounded
//! queue; the writer takes whatever has queued up (up to `max_batch`) and prepares it
//! ([`State::prepare`]: the batch's unit check, deduplication, classes, sums, the write set).
//! A second thread, the committer, makes each prepared batch durable in order
//! ([`Prepared::commit`], one synced write) and only then answers its reports. So the writer
//! aggregates batch n+1 while batch n syncs, and while both work the next batch queues: the
//! batch size grows with the load (group commit) and the sync cost is shared. At most one
//! prepared batch waits for the committer.
//!
//! A full queue answers `Overloaded` at once, which tells agents to retry later; so does a
//! server whose write failed: the committer then commits nothing more (a later batch's sums
//! include the failed one's), every waiting report is answered `Overloaded`, and the server
//! exits, to be restarted on the durable state.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, mpsc as sync_mpsc};
use std::thread::JoinHandle;
use std::time::Instant;

use penrose_host::clock::today;

use penrose_core::wire::{
    Ack, AckStatus, LENGTH_PREFIX, Message, RejectReason, ReportId, ThrottleHint,
};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error, info};

use crate::admission::{Admission, TokenRing};
use crate::design_keys::{DesignKeys, KeySettings};
use crate::epochs::EpochRecord;
use crate::metrics::Metrics;
use crate::state::{Outcome, Prepared, State, StateError, store_throttle};
use crate::tables::DEFAULT_NEW_CLASSES_PER_HOUR;
use crate::validate::{ValidReport, validate_body};

/// How the pipeline batches, and how many classes it founds.
#[derive(Clone, Copy, Debug)]
pub struct IngestConfig {
    /// Most reports in one durable write.
    pub max_batch: usize,
    /// Most valid reports waiting for the writer before new ones are answered `Overloaded`.
    pub queue: usize,
    /// Most classes founded per hour ([`crate::tables::NewClassBudget`]); a report beyond it
    /// is answered `NewClassLimit`.
    pub new_classes_per_hour: NonZeroU32,
    /// Keep each report's binding and evidence token for the release auditor
    /// ([`crate::evidence`]; about 1.4 KB a report).
    pub keep_evidence: bool,
}

impl Default for IngestConfig {
    fn default() -> Self {
        Self {
            max_batch: 4096,
            queue: 32_768,
            new_classes_per_hour: DEFAULT_NEW_CLASSES_PER_HOUR,
            keep_evidence: false,
        }
    }
}

// Nearly every job is a report; boxing it to shrink the rare close request would only add an
// allocation per report.
#[allow(clippy::large_enum_variant)]
enum Job {
    /// A valid report, answered once durable.
    Report {
        report: ValidReport,
        reply: oneshot::Sender<AckStatus>,
    },
    /// Close epochs (all open ones, or those due), in order with the reports before it;
    /// answered with the epochs closed once the closing is durable.
    Close {
        all: bool,
        reply: oneshot::Sender<Vec<EpochRecord>>,
    },
}

struct Inner {
    /// The design keys reports are validated against; replaced on reload.
    keys: RwLock<Arc<DesignKeys>>,
    /// How reports are admitted; the key ring is replaced on reload.
    admission: RwLock<Arc<Admission>>,
    queue: mpsc::Sender<Job>,
    throttle: AtomicU16,
    shared: Arc<Shared>,
}

/// What the writer thread shares with the handles (not the queue's sender, so that dropping
/// every handle closes the queue and ends the writer).
struct Shared {
    healthy: AtomicBool,
    metrics: Arc<Metrics>,
    state: Mutex<State>,
}

/// The handle transports and admin tools hold; cheap to clone.
#[derive(Clone)]
pub struct Ingest {
    inner: Arc<Inner>,
}

/// The writer thread; joining it returns the error that stopped it, if any.
pub struct Writer {
    thread: JoinHandle<Result<(), StateError>>,
}

impl Writer {
    /// Waits for the writer to finish (all [`Ingest`] handles dropped, or a failed write).
    pub fn join(self) -> Result<(), StateError> {
        self.thread
            .join()
            .unwrap_or(Err(StateError::WriterPanicked))
    }

    /// Whether the writer has stopped.
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }
}

impl Ingest {
    /// Starts the writer thread over `state`, admitting reports as `admission` says.
    pub fn start(
        mut state: State,
        throttle: ThrottleHint,
        config: IngestConfig,
        admission: Admission,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<(Ingest, Writer)> {
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        state.set_new_classes_per_hour(config.new_classes_per_hour);
        metrics.set_state(&mut state);
        let keys = Arc::new(state.keys().clone());
        let shared = Arc::new(Shared {
            healthy: AtomicBool::new(true),
            metrics,
            state: Mutex::new(state),
        });
        let (to_commit, commits) = sync_mpsc::sync_channel(1);
        let committer = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("penrose-commit".into())
                .spawn(move || commit_loop(&commits, &shared))?
        };
        let writer_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("penrose-writer".into())
            .spawn(move || {
                let written = write_loop(rx, &writer_shared, config.max_batch.max(1), to_commit);
                // The committer ends once the writer dropped its sender, after the batches
                // already handed to it; its failure is the one that stopped the writer.
                let committed = committer.join().unwrap_or(Err(StateError::WriterPanicked));
                committed.and(written)
            })?;
        let inner = Arc::new(Inner {
            keys: RwLock::new(keys),
            admission: RwLock::new(Arc::new(admission)),
            queue: tx,
            throttle: AtomicU16::new(throttle.permille()),
            shared,
        });
        Ok((Ingest { inner }, Writer { thread }))
    }

    /// Handles one received frame body (the bytes after its length prefix) and returns the ack
    /// to send. The ack of an accepted or duplicate report is returned only once the report is
    /// durable.
    pub async fn handle(&self, body: Vec<u8>) -> Ack {
        let arrived = Instant::now();
        let metrics = &self.inner.shared.metrics;
        metrics
            .bytes
            .fetch_add((body.len() + LENGTH_PREFIX) as u64, Ordering::Relaxed);
        let admission = self.admission();
        let keys = self.design_keys();
        let status = match validate_body(&body, &keys, today(), &admission) {
            Err(rejection) => {
                debug!(%rejection, "report rejected");
                AckStatus::Rejected(rejection.reason())
            }
            Ok(report) => {
                if report.token.is_some() {
                    metrics.tokens_verified.fetch_add(1, Ordering::Relaxed);
                }
                self.enqueue(report).await
            }
        };
        match status {
            AckStatus::Accepted => {
                metrics.accepted.fetch_add(1, Ordering::Relaxed);
            }
            AckStatus::Duplicate => {
                metrics.duplicates.fetch_add(1, Ordering::Relaxed);
            }
            AckStatus::Rejected(reason) => metrics.rejected(reason),
        }
        metrics.observe_latency(arrived.elapsed());
        Ack {
            report_id: penrose_core::wire::peek_report_id(&body).unwrap_or(ReportId([0; 16])),
            status,
            throttle: self.throttle(),
        }
    }

    async fn enqueue(&self, report: ValidReport) -> AckStatus {
        if !self.inner.shared.healthy.load(Ordering::Relaxed) {
            return AckStatus::Rejected(RejectReason::Overloaded);
        }
        let (reply, answer) = oneshot::channel();
        let job = Job::Report { report, reply };
        if self.inner.queue.try_send(job).is_err() {
            return AckStatus::Rejected(RejectReason::Overloaded);
        }
        // A dropped reply means the writer stopped before the report was durable.
        answer
            .await
            .unwrap_or(AckStatus::Rejected(RejectReason::Overloaded))
    }

    /// Closes epochs on the writer thread, after the reports queued before this call: every
    /// open epoch with reports (`all`, an operator's close), or those the policy says are due.
    /// Returns the epochs closed once their closing is durable; an error if the writer stopped.
    /// Blocking: call it off the async threads.
    pub fn close_epochs(&self, all: bool) -> Result<Vec<EpochRecord>, StateError> {
        let (reply, answer) = oneshot::channel();
        self.inner
            .queue
            .blocking_send(Job::Close { all, reply })
            .map_err(|_| StateError::WriterStopped)?;
        answer
            .blocking_recv()
            .map_err(|_| StateError::WriterStopped)
    }

    /// [`close_epochs`](Self::close_epochs) of the epochs due, from async code (the
    /// server's periodic tick, so that epochs close on time when no report arrives).
    pub async fn close_due(&self) -> Result<Vec<EpochRecord>, StateError> {
        let (reply, answer) = oneshot::channel();
        self.inner
            .queue
            .send(Job::Close { all: false, reply })
            .await
            .map_err(|_| StateError::WriterStopped)?;
        answer.await.map_err(|_| StateError::WriterStopped)
    }

    /// How reports are admitted now.
    pub fn admission(&self) -> Arc<Admission> {
        let guard = self
            .inner
            .admission
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(&guard)
    }

    /// Answers a key list request with the design server's signed list as it was loaded
    /// (agents verify it); `None` for every other body, and when the server was given a single
    /// key rather than a list (the request is then refused like any body that is not a
    /// report). Counted in `key_lists_served`.
    pub fn answer(&self, body: &[u8]) -> Option<Vec<u8>> {
        if !matches!(Message::decode_body(body), Ok(Message::KeyListRequest)) {
            return None;
        }
        let keys = self.design_keys();
        let list = keys.signed()?;
        let frame = Message::KeyList(list.to_vec()).to_frame().ok()?;
        self.inner
            .shared
            .metrics
            .key_lists_served
            .fetch_add(1, Ordering::Relaxed);
        Some(frame)
    }

    /// The design keys reports are validated against now.
    pub fn design_keys(&self) -> Arc<DesignKeys> {
        let guard = self
            .inner
            .keys
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(&guard)
    }

    /// Applies the design server's next key list (or key): the store gives its keys slots
    /// first, durably, then reports validated from now on use it. An older list, or a wrong
    /// single key, is refused and changes nothing (`crate::design_keys`).
    pub fn replace_design_keys(&self, settings: KeySettings) -> Result<(), StateError> {
        let keys = {
            let mut state = self.state();
            state.replace_keys(settings)?;
            Arc::new(state.keys().clone())
        };
        *self
            .inner
            .keys
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = keys;
        Ok(())
    }

    /// Reads the design key list file again and applies it ([`Self::replace_design_keys`]);
    /// refused when the keys did not come from a list file.
    pub fn reload_design_keys(&self) -> Result<(), StateError> {
        let source = self
            .design_keys()
            .source()
            .cloned()
            .ok_or(crate::design_keys::DesignKeyError::NoListFile)?;
        let settings = KeySettings::from_file(&source.list, source.signer)?;
        self.replace_design_keys(settings)
    }

    /// Replaces the key ring tokens are verified with (the issuer's next export); reports
    /// validated from now on use it. Refused under open admission, which a reload does not
    /// change: the admission mode is chosen when the server starts.
    pub fn replace_key_ring(&self, ring: TokenRing) -> Result<(), StateError> {
        let mut guard = self
            .inner
            .admission
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if !guard.by_tokens() {
            return Err(StateError::OpenAdmission);
        }
        *guard = Arc::new(Admission::Tokens(ring));
        Ok(())
    }

    /// The hint every ack carries.
    pub fn throttle(&self) -> ThrottleHint {
        ThrottleHint::from_permille(self.inner.throttle.load(Ordering::Relaxed))
            .unwrap_or(ThrottleHint::FULL_RATE)
    }

    /// Stores a new throttle hint durably, then puts it in every following ack.
    pub fn set_throttle(&self, hint: ThrottleHint) -> Result<(), StateError> {
        let store = Arc::clone(self.state().store());
        store_throttle(store.as_ref(), hint)?;
        self.inner
            .throttle
            .store(hint.permille(), Ordering::Relaxed);
        Ok(())
    }

    /// Whether the writer is still committing batches.
    pub fn is_healthy(&self) -> bool {
        self.inner.shared.healthy.load(Ordering::Relaxed)
    }

    /// The aggregation state, for status queries. Holding the guard pauses ingest.
    pub fn state(&self) -> MutexGuard<'_, State> {
        self.inner
            .shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.shared.metrics
    }
}

/// A prepared batch on its way to the committer, with the replies it owes.
struct Pending {
    prepared: Prepared,
    replies: Replies,
}

enum Replies {
    Reports(Vec<oneshot::Sender<AckStatus>>),
    Close(oneshot::Sender<Vec<EpochRecord>>),
}

fn write_loop(
    mut rx: mpsc::Receiver<Job>,
    inner: &Shared,
    max_batch: usize,
    to_commit: sync_mpsc::SyncSender<Pending>,
) -> Result<(), StateError> {
    let mut jobs: Vec<Job> = Vec::with_capacity(max_batch);
    let mut reports: Vec<ValidReport> = Vec::with_capacity(max_batch);
    let mut replies: Vec<oneshot::Sender<AckStatus>> = Vec::with_capacity(max_batch);
    while let Some(first) = rx.blocking_recv() {
        jobs.push(first);
        while jobs.len() < max_batch {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        if !inner.healthy.load(Ordering::Relaxed) {
            // A write failed: nothing more may be counted. Dropping the replies answers
            // `Overloaded`.
            jobs.clear();
            continue;
        }
        // Reports go in batches; a close request ends the batch before it and is prepared on
        // its own, so that it sees exactly the reports queued before it.
        for job in jobs.drain(..) {
            match job {
                Job::Report { report, reply } => {
                    reports.push(report);
                    replies.push(reply);
                }
                Job::Close { all, reply } => {
                    if !reports.is_empty()
                        && !prepare_batch(inner, &mut reports, &mut replies, &to_commit)?
                    {
                        return Ok(());
                    }
                    let prepared = lock(inner).prepare_close(today(), all);
                    let pending = Pending {
                        prepared,
                        replies: Replies::Close(reply),
                    };
                    if to_commit.send(pending).is_err() {
                        return Ok(());
                    }
                }
            }
        }
        if !reports.is_empty() && !prepare_batch(inner, &mut reports, &mut replies, &to_commit)? {
            return Ok(());
        }
    }
    Ok(())
}

fn lock(inner: &Shared) -> MutexGuard<'_, State> {
    inner
        .state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Prepares the reports gathered so far as one batch and hands it to the committer; false
/// when the committer has stopped (its error is the one reported).
fn prepare_batch(
    inner: &Shared,
    reports: &mut Vec<ValidReport>,
    replies: &mut Vec<oneshot::Sender<AckStatus>>,
    to_commit: &sync_mpsc::SyncSender<Pending>,
) -> Result<bool, StateError> {
    let started = Instant::now();
    let result = {
        let mut state = lock(inner);
        let result = state.prepare(reports, today());
        inner.metrics.set_state(&mut state);
        result
    };
    reports.clear();
    inner.metrics.aggregate_micros.fetch_add(
        u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
    match result {
        Ok(prepared) => {
            let pending = Pending {
                prepared,
                replies: Replies::Reports(std::mem::take(replies)),
            };
            // A failed send means the committer stopped on a failed write; the replies of
            // this batch were dropped with it.
            Ok(to_commit.send(pending).is_ok())
        }
        Err(e) => {
            error!(error = %e, "aggregating a batch failed; no further reports are accepted");
            inner.healthy.store(false, Ordering::Relaxed);
            replies.clear();
            Err(e)
        }
    }
}

fn commit_loop(batches: &sync_mpsc::Receiver<Pending>, inner: &Shared) -> Result<(), StateError> {
    while let Ok(Pending { prepared, replies }) = batches.recv() {
        let started = Instant::now();
        let closed = prepared.closed().to_vec();
        match prepared.commit() {
            Ok(outcomes) => {
                let metrics = &inner.metrics;
                metrics.batches.fetch_add(1, Ordering::Relaxed);
                metrics.write_micros.fetch_add(
                    u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
                    Ordering::Relaxed,
                );
                for epoch in &closed {
                    info!(
                        epoch = epoch.id.0,
                        reports = epoch.reports,
                        days = epoch.days(),
                        "epoch closed"
                    );
                }
                match replies {
                    Replies::Reports(replies) => {
                        for (reply, outcome) in replies.into_iter().zip(outcomes) {
                            let status = match outcome {
                                Outcome::Accepted => AckStatus::Accepted,
                                Outcome::Duplicate => AckStatus::Duplicate,
                                Outcome::NotUnit => {
                                    AckStatus::Rejected(RejectReason::InvalidCiphertext)
                                }
                                Outcome::DayOutOfRange => {
                                    AckStatus::Rejected(RejectReason::DayOutOfRange)
                                }
                                Outcome::NewClassLimit => {
                                    AckStatus::Rejected(RejectReason::NewClassLimit)
                                }
                                Outcome::TokenSpent => {
                                    AckStatus::Rejected(RejectReason::TokenSpent)
                                }
                            };
                            // The caller may have gone away; the report is counted regardless.
                            let _ = reply.send(status);
                        }
                    }
                    Replies::Close(reply) => {
                        let _ = reply.send(closed);
                    }
                }
            }
            Err(e) => {
                error!(error = %e, "durable write failed; no further reports are accepted");
                inner.healthy.store(false, Ordering::Relaxed);
                // Returning drops the receiver, and with it every batch prepared after this
                // one, uncommitted; their dropped replies answer `Overloaded`.
                return Err(e);
            }
        }
    }
    Ok(())
}

impl penrose_transport::ReportHandler for Ingest {
    fn handle(&self, body: Vec<u8>) -> impl std::future::Future<Output = Ack> + Send {
        Ingest::handle(self, body)
    }

    fn throttle(&self) -> ThrottleHint {
        Ingest::throttle(self)
    }

    fn answer(&self, body: &[u8]) -> Option<Vec<u8>> {
        Ingest::answer(self, body)
    }
}
