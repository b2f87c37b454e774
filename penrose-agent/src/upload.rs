//! The uploader: spooled reports to the aggregator, oldest first, one at a time.
//!
//! Before each upload it waits a random time (up to `delay_max`, stretched by the inverse of
//! the server's throttle hint), so that reports do not leave in step with the captures that
//! made them and a throttled fleet slows down. The transport client retries lost connections
//! and timeouts with backoff; an upload that still gets no ack leaves the report spooled, and
//! the uploader backs off (doubling up to `backoff_max`) and tries again, so a server that is
//! down simply means the spool grows until it returns. Accepted and Duplicate acks remove the
//! report; Rejected moves it aside with its reason (resending would be refused again), except
//! the reasons that say "retry later" ([`RejectReason::retry_later`]), which keep it:
//! Overloaded and NewClassLimit (the report would found an application class, and the server
//! founds only so many an hour) set that one report aside for a random while, doubling, and the
//! uploader goes on with the others. An ack never holds up the spool behind the report it
//! answered: if it did, a server could stall one host's whole spool by refusing its oldest
//! report, and recognise the host by the silence (docs/threat-model.md, "What an ack can make
//! an agent do"). A fleet-wide slow-down is the throttle hint's job, which every ack carries.
//!
//! Every upload, and every retry of it, goes out on a QUIC connection of its own from a UDP
//! socket of its own ([`Reuse::FreshPerReport`]): a new source port, new connection ids, a full
//! handshake without TLS resumption or address-validation token, closed after the ack. Nothing
//! at the transport layer links two reports of this machine; the uploader refuses a client
//! configuration that would share a connection (docs/transport.md).
//!
//! **Admission tokens** (when `[admission]` is configured, [`Shared::tokens`]): before a report
//! is sent it gets a token of its own day and counter from the store, attached to it durably
//! ([`TokenStore::reserve`]), and carries `token.redeem(report.token_binding())`; a retry, also
//! after a restart, carries the same token. Accepted and Duplicate remove the token (spent);
//! InvalidToken and TokenSpent discard it and the report goes again once, after a short
//! backoff, with another; refused for its token a second time, it is moved aside like a report
//! refused for good, so that a server cannot make a host spend token after token on one report
//! (and run out, which a fetch would then show the issuer). A report refused for good takes its
//! token with it (a token is never put on a second report: one nonce on two reports would link
//! them). A report with no token of its
//! day and counter waits in the spool, never dropped for lack of tokens: if it has never been
//! sent and today's tokens of its counter exist, it is re-stamped to today (rewritten in the
//! spool, then sent with today's token); a report sent before keeps its day, since the server
//! deduplicates by report id and day. The fetcher is never asked for tokens early
//! ([`crate::admission`]): a report without one waits for its schedule. Without `[admission]`
//! reports go without tokens; a
//! server that requires them answers TokenRequired, the reports stay spooled, and the uploader
//! says so once, at error level.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use penrose_core::tokens::{TokenEpoch, TokenScope};
use penrose_core::wire::{
    AckStatus, AdmissionToken, Day, EvidenceToken, Message, RejectReason, Report,
};
use penrose_transport::{Client, ClientConfig, Reuse};
use rand::Rng;
use tokio::sync::Notify;

use crate::spool::{Spool, SpoolEntry, read_frame};
use crate::status::AgentStatus;
use crate::tokens::TokenStore;
use penrose_host::clock::{Clock, SystemClock};

/// Upload timing.
#[derive(Clone, Debug)]
pub struct UploadConfig {
    /// The client (address, pinned certificate, retries, timeouts).
    pub client: ClientConfig,
    /// Longest random wait before an upload, at full rate.
    pub delay_max: Duration,
    /// First wait after an upload that got no ack.
    pub backoff_base: Duration,
    /// Longest wait.
    pub backoff_max: Duration,
}

/// Everything the uploader shares with the rest of the daemon.
#[derive(Clone)]
pub struct Shared {
    /// The spool.
    pub spool: Arc<Mutex<Spool>>,
    /// The status the daemon writes out.
    pub status: Arc<Mutex<AgentStatus>>,
    /// Notified when a report is spooled.
    pub wake: Arc<Notify>,
    /// Set to stop.
    pub stop: Arc<AtomicBool>,
    /// The token store when `[admission]` is configured; `None`: reports go without tokens.
    pub tokens: Option<Arc<Mutex<TokenStore>>>,
    /// The evidence token store when `[evidence]` is configured; `None`: reports go without
    /// evidence. A report waits for one only until the first evidence fetch was tried; after
    /// that, without one of its day and counter it goes without (it then counts at the
    /// aggregation server, not at the release auditor).
    pub evidence: Option<Arc<Mutex<TokenStore>>>,
    /// The day (tokens are per day; tests move it).
    pub clock: std::sync::Arc<dyn Clock>,
}

impl Shared {
    /// Everything for an uploader without admission tokens, on the system clock.
    pub fn new(
        spool: Arc<Mutex<Spool>>,
        status: Arc<Mutex<AgentStatus>>,
        wake: Arc<Notify>,
        stop: Arc<AtomicBool>,
    ) -> Self {
        Self {
            spool,
            status,
            wake,
            stop,
            tokens: None,
            evidence: None,
            clock: std::sync::Arc::new(SystemClock),
        }
    }
}

/// Sleeps `d`, or less if `stop` is set meanwhile; returns whether to go on.
async fn pause(d: Duration, stop: &AtomicBool) -> bool {
    let end = tokio::time::Instant::now() + d;
    while tokio::time::Instant::now() < end {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        let left = end.saturating_duration_since(tokio::time::Instant::now());
        tokio::time::sleep(left.min(Duration::from_millis(50))).await;
    }
    !stop.load(Ordering::Relaxed)
}

/// Returns once `stop` is set.
pub async fn stopped(stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs until `shared.stop` is set. A report in flight at that moment stays spooled (if it
/// did arrive, the next start gets Duplicate for it and removes it).
pub async fn run(config: UploadConfig, shared: Shared) {
    if config.client.reuse() != Reuse::FreshPerReport {
        // Only a tool can ask for a shared connection; it would link this machine's reports.
        let why = "refusing a shared QUIC connection: agent uploads use a fresh connection each";
        tracing::error!("uploader: {why}");
        lock(&shared.status).uploads.last_error = Some(why.to_string());
        return;
    }
    let client = match Client::new(config.client.clone()) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("uploader: cannot create the QUIC client: {e}");
            lock(&shared.status).uploads.last_error = Some(e.to_string());
            return;
        }
    };
    let mut uploader = Uploader::new(config, shared);
    while !uploader.stopping() {
        if uploader.round(&client).await == Round::Stop {
            break;
        }
    }
    client.close().await;
}

/// Whether the loop goes on after a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    Next,
    Stop,
}

/// The uploader's memory between rounds: the throttle hint, the failures in a row, the
/// reports set aside for a while, and what was already said once in the log.
struct Uploader {
    config: UploadConfig,
    shared: Shared,
    throttle_permille: u16,
    failures: u32,
    deferred: HashMap<u64, Deferral>,
    /// Reports whose token the server refused once (the second refusal sets them aside).
    token_refused: HashSet<u64>,
    told_token_required: bool,
    /// Reports already logged as waiting for a token (logged once each).
    told_waiting: HashSet<u64>,
    /// The (day, store generation, evidence generation) reports waiting for tokens were last
    /// looked at under.
    token_view: Option<(Day, u64, Option<u64>)>,
    /// The day evidence tokens were last pruned on.
    evidence_day: Option<Day>,
}

impl Uploader {
    fn new(config: UploadConfig, shared: Shared) -> Self {
        Self {
            config,
            shared,
            throttle_permille: 1000,
            failures: 0,
            deferred: HashMap::new(),
            token_refused: HashSet::new(),
            told_token_required: false,
            told_waiting: HashSet::new(),
            token_view: None,
            evidence_day: None,
        }
    }

    fn stopping(&self) -> bool {
        self.shared.stop.load(Ordering::Relaxed)
    }

    /// One report's turn: pick it, check it may go, wait, send it, settle the answer.
    async fn round(&mut self, client: &Client) -> Round {
        let today = self.shared.clock.today();
        self.refresh_tokens(today);
        let entry = match self.pick() {
            Next::Send(entry) => entry,
            Next::Empty => return self.idle(None).await,
            Next::Wait(until) => return self.idle(Some(until)).await,
        };
        let Some(report) = read_report(&self.shared, &entry) else {
            return Round::Next;
        };
        if self.waits_for_tokens(&entry, &report, today) {
            self.deferred
                .insert(entry.sequence, Deferral::for_token(&self.config));
            return Round::Next;
        }
        if !pause(self.delay(), &self.shared.stop).await {
            return Round::Stop;
        }
        if !lock(&self.shared.spool).contains(&entry) {
            return Round::Next; // dropped to make room meanwhile
        }
        let (report, entry) = match self.prepare(&entry, report) {
            Ok(Some(ready)) => ready,
            Ok(None) => return Round::Next, // its tokens went meanwhile: it waits next round
            Err(e) => return self.prepare_failed(&e).await,
        };
        self.send(client, &report, &entry).await
    }

    /// A new day or new tokens: the reports that waited for one go again, and tokens of past
    /// epochs and of reports gone from the spool are dropped.
    fn refresh_tokens(&mut self, today: Day) {
        let shared = &self.shared;
        if let Some(store) = &shared.tokens {
            let evidence = shared.evidence.as_deref().map(|e| lock(e).generation());
            let view = (today, lock(store).generation(), evidence);
            if self.token_view != Some(view) {
                self.deferred.retain(|_, d| d.kind != Wait::Token);
                if self.token_view.is_none_or(|(day, _, _)| day != today) {
                    prune_tokens(shared, store, today);
                }
                self.token_view = Some((today, lock(store).generation(), evidence));
            }
        }
        if let Some(store) = &shared.evidence
            && self.evidence_day != Some(today)
        {
            prune_tokens(shared, store, today);
            self.evidence_day = Some(today);
        }
    }

    /// The next report to send, after forgetting the ones that left the spool meanwhile
    /// (delivered, or dropped for room).
    fn pick(&mut self) -> Next {
        let next = {
            let spool = lock(&self.shared.spool);
            if !self.deferred.is_empty() || !self.told_waiting.is_empty() {
                let spooled: HashSet<u64> = spool.entries().iter().map(|e| e.sequence).collect();
                self.deferred
                    .retain(|sequence, _| spooled.contains(sequence));
                self.told_waiting
                    .retain(|sequence| spooled.contains(sequence));
                self.token_refused
                    .retain(|sequence| spooled.contains(sequence));
            }
            next_entry(spool.entries(), &self.deferred, tokio::time::Instant::now())
        };
        if self.shared.tokens.is_some() {
            lock(&self.shared.status).tokens.waiting = self
                .deferred
                .values()
                .filter(|d| d.kind == Wait::Token)
                .count() as u64;
        }
        next
    }

    /// Nothing to send now: waits for a new report, the next deferral's end, or at most
    /// 200 ms.
    async fn idle(&self, until: Option<tokio::time::Instant>) -> Round {
        let poll = tokio::time::Instant::now() + Duration::from_millis(200);
        let until = until.map_or(poll, |u| u.min(poll));
        tokio::select! {
            _ = self.shared.wake.notified() => {}
            _ = tokio::time::sleep_until(until) => {}
        }
        Round::Next
    }

    /// Whether the report must wait for a token: no admission token of its day and counter
    /// (nor of today's, for a report never sent), or no evidence token while the first
    /// evidence fetch is still to be tried. It waits without holding up the others.
    fn waits_for_tokens(&mut self, entry: &SpoolEntry, report: &Report, today: Day) -> bool {
        if let Some(store) = &self.shared.tokens
            && !token_available(&lock(store), entry, report, today)
        {
            if self.told_waiting.insert(entry.sequence) {
                tracing::info!(
                    "report {} (day {}, counter {}) waits for an admission token",
                    entry.report_id,
                    report.day.0,
                    report.counter.0
                );
            }
            return true;
        }
        waits_for_evidence(&self.shared, report)
    }

    /// The random delay before an upload, stretched by the throttle hint (0: wait the longest
    /// backoff).
    fn delay(&self) -> Duration {
        let config = &self.config;
        if self.throttle_permille == 0 {
            return config.backoff_max;
        }
        let stretch = 1000.0 / f64::from(self.throttle_permille);
        config
            .delay_max
            .mul_f64(rand::rng().random::<f64>())
            .mul_f64(stretch)
            .min(config.backoff_max.max(config.delay_max))
    }

    /// The report as it goes: with its tokens (re-stamped to today if it must), marked sent.
    /// `Ok(None)`: its tokens went meanwhile.
    fn prepare(
        &self,
        entry: &SpoolEntry,
        report: Report,
    ) -> Result<Option<(Report, SpoolEntry)>, Box<dyn std::error::Error + Send + Sync>> {
        let shared = &self.shared;
        let report = match &shared.tokens {
            Some(store) => attach_token(shared, store, entry, report, shared.clock.today())?,
            None => Some(report),
        };
        let Some(report) = report else {
            return Ok(None);
        };
        let report = match &shared.evidence {
            Some(store) => attach_evidence(shared, store, report)?,
            None => report,
        };
        let marked = lock(&shared.spool).mark_attempted(entry)?;
        Ok(Some((report, marked)))
    }

    /// The spool or the token store could not be written (a full disk): backs off.
    async fn prepare_failed(&mut self, e: &(dyn std::fmt::Display + Sync)) -> Round {
        self.failures += 1;
        let wait = backoff(&self.config, self.failures);
        tracing::warn!("preparing an upload: {e}; next try in {wait:?}");
        lock(&self.shared.status).last_error = Some(e.to_string());
        self.pause_or_stop(wait).await
    }

    async fn pause_or_stop(&self, wait: Duration) -> Round {
        if pause(wait, &self.shared.stop).await {
            Round::Next
        } else {
            Round::Stop
        }
    }

    /// Sends the report on a connection of its own and settles what came back.
    async fn send(&mut self, client: &Client, report: &Report, entry: &SpoolEntry) -> Round {
        lock(&self.shared.status).uploads.attempts += 1;
        let outcome = tokio::select! {
            r = client.send_with_retry(report) => r,
            () = stopped(&self.shared.stop) => return Round::Stop,
        };
        match outcome {
            Ok(ack) => {
                self.acked(entry, ack.status, ack.throttle.permille());
                Round::Next
            }
            Err(e) => self.unanswered(&e).await,
        }
    }

    /// An ack: the report is done, or set aside for a while (never the spool behind it).
    fn acked(&mut self, entry: &SpoolEntry, status: AckStatus, throttle_permille: u16) {
        self.failures = 0;
        self.throttle_permille = throttle_permille;
        let refused_before = self.token_refused.contains(&entry.sequence);
        let settled = settle(
            &self.shared,
            entry,
            status,
            throttle_permille,
            refused_before,
        );
        match settled {
            Settled::Done => {
                self.deferred.remove(&entry.sequence);
                self.token_refused.remove(&entry.sequence);
                return;
            }
            Settled::TokenRefused => {
                self.token_refused.insert(entry.sequence);
            }
            Settled::TokenRequired => self.tell_token_required(),
            Settled::Overloaded | Settled::Deferred => {}
        }
        let tries = self.deferred.get(&entry.sequence).map_or(0, |d| d.tries) + 1;
        let until = tokio::time::Instant::now() + backoff(&self.config, tries);
        let deferral = Deferral {
            tries,
            until,
            kind: Wait::Server,
        };
        self.deferred.insert(entry.sequence, deferral);
    }

    /// Says once, at error level, that the server requires tokens this agent cannot give.
    fn tell_token_required(&mut self) {
        if std::mem::replace(&mut self.told_token_required, true) {
            return;
        }
        if self.shared.tokens.is_none() {
            tracing::error!(
                "the aggregation server requires admission tokens, and this agent has none \
                 configured ([admission] in its configuration): reports stay in the spool \
                 until it has (docs/operations.md, \"Admission tokens\")"
            );
        } else {
            tracing::error!(
                "the aggregation server answered TokenRequired to a report that carried a \
                 token; the report stays in the spool"
            );
        }
    }

    /// No ack after the transport's retries: the report stays spooled and the uploader backs
    /// off.
    async fn unanswered(&mut self, e: &(dyn std::fmt::Display + Sync)) -> Round {
        self.failures += 1;
        let wait = backoff(&self.config, self.failures);
        {
            let mut status = lock(&self.shared.status);
            status.uploads.failed += 1;
            status.uploads.server_reachable = false;
            status.uploads.last_error = Some(e.to_string());
        }
        let kept = lock(&self.shared.spool).entries().len();
        tracing::warn!(
            "upload failed ({e}); {kept} reports kept in the spool, next try in {wait:?}"
        );
        self.pause_or_stop(wait).await
    }
}

/// Reads and decodes a spooled report; one that does not read back is moved aside.
fn read_report(shared: &Shared, entry: &SpoolEntry) -> Option<Report> {
    let read =
        read_frame(entry)
            .map_err(|e| e.to_string())
            .and_then(|f| match Message::decode(&f) {
                Ok((Message::Report(r), used)) if used == f.len() => Ok(r),
                Ok(_) => Err("not one report frame".to_string()),
                Err(e) => Err(e.to_string()),
            });
    match read {
        Ok(report) => Some(report),
        Err(why) => {
            tracing::warn!(
                "spooled report {} unreadable ({why}); moved aside",
                entry.path.display()
            );
            let _ = lock(&shared.spool).move_rejected(entry, &format!("unreadable: {why}"));
            None
        }
    }
}

/// The (epoch, scope) of the token a report needs: its day and counter.
fn token_key(report: &Report) -> (TokenEpoch, TokenScope) {
    (TokenEpoch(report.day.0), TokenScope(report.counter.0))
}

/// Whether [`attach_token`] would find a token for the report now.
fn token_available(store: &TokenStore, entry: &SpoolEntry, report: &Report, today: Day) -> bool {
    let (epoch, scope) = token_key(report);
    store.in_flight_for(&report.report_id).is_some()
        || store.unspent(epoch, scope) > 0
        || (!entry.attempted
            && report.day != today
            && store.unspent(TokenEpoch(today.0), scope) > 0)
}

/// Attaches a token to the report, durably: the one it already carries (a retry), else one of
/// its day and counter, else, for a report never sent, one of today's after re-stamping the
/// report to today in the spool. `None`: no token for it now.
fn attach_token(
    shared: &Shared,
    store: &Mutex<TokenStore>,
    entry: &SpoolEntry,
    mut report: Report,
    today: Day,
) -> Result<Option<Report>, Box<dyn std::error::Error + Send + Sync>> {
    let mut spool = lock(&shared.spool);
    let mut store = lock(store);
    let (_, scope) = token_key(&report);
    let token = match carried_or_reserved(&mut store, &report)? {
        Some(token) => Some(token),
        None if !entry.attempted
            && report.day != today
            && store.unspent(TokenEpoch(today.0), scope) > 0 =>
        {
            let from = report.day;
            report.day = today;
            let frame = Message::Report(report.clone()).to_frame()?;
            spool.rewrite(entry, &frame)?;
            let token = store.reserve(TokenEpoch(today.0), scope, report.report_id)?;
            lock(&shared.status).tokens.restamped += 1;
            tracing::info!(
                "report {} had no token left for day {}: re-stamped to today ({})",
                report.report_id,
                from.0,
                today.0
            );
            token
        }
        None => None,
    };
    Ok(token.map(|token| {
        let redemption = token.redeem(&report.token_binding());
        report.token = Some(AdmissionToken(redemption.encode()));
        report
    }))
}

/// The token the report already carries, if it is of its day and counter (a retry); else,
/// forgetting one of another day or counter (it cannot admit this report), a new one reserved
/// for it, durably. `None`: none of its day and counter is held.
fn carried_or_reserved(
    store: &mut TokenStore,
    report: &Report,
) -> Result<Option<penrose_core::tokens::Token>, crate::tokens::TokenStoreError> {
    let (epoch, scope) = token_key(report);
    match store.in_flight_for(&report.report_id) {
        Some((e, s, token)) if (e, s) == (epoch, scope) => return Ok(Some(token)),
        Some(_) => {
            store.forget_in_flight(&report.report_id)?;
        }
        None => {}
    }
    store.reserve(epoch, scope, report.report_id)
}

/// Whether the report waits for an evidence token: until the first evidence fetch since
/// start has been tried (succeeded or not), a report with none of its day and counter waits
/// (at start the two fetches race); after it, never: a report goes without rather than stall
/// behind an unreachable evidence issuer.
fn waits_for_evidence(shared: &Shared, report: &Report) -> bool {
    let Some(store) = &shared.evidence else {
        return false;
    };
    let tried = {
        let status = lock(&shared.status);
        status.evidence.fetches + status.evidence.fetch_failures > 0
    };
    let (epoch, scope) = token_key(report);
    let store = lock(store);
    let held = store.in_flight_for(&report.report_id).is_some() || store.unspent(epoch, scope) > 0;
    !tried && !held
}

/// Attaches an evidence token of the report's (final) day and counter, durably: the one it
/// already carries (a retry), else a new one; none left, the report goes without. Its tag
/// covers the same bytes as the admission token's ([`Report::token_binding`]), so it is
/// attached after any re-stamping.
fn attach_evidence(
    shared: &Shared,
    store: &Mutex<TokenStore>,
    mut report: Report,
) -> Result<Report, Box<dyn std::error::Error + Send + Sync>> {
    let token = carried_or_reserved(&mut lock(store), &report)?;
    match token {
        Some(token) => {
            let tag = token.redeem(&report.token_binding());
            report.evidence = Some(EvidenceToken(tag.encode()));
        }
        None => lock(&shared.status).evidence.sent_without += 1,
    }
    Ok(report)
}

/// Drops tokens the server can no longer accept and those of reports gone from the spool.
fn prune_tokens(shared: &Shared, store: &Mutex<TokenStore>, today: Day) {
    let spooled = lock(&shared.spool)
        .entries()
        .iter()
        .map(|e| e.report_id)
        .collect();
    match lock(store).prune(today, &spooled) {
        Ok(pruned) if pruned.expired + pruned.orphaned > 0 => tracing::info!(
            "admission tokens: {} of past days and {} of reports no longer spooled dropped",
            pruned.expired,
            pruned.orphaned
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!("pruning the token store: {e}"),
    }
}

/// A spooled report not sent again before `until`.
#[derive(Clone, Copy, Debug)]
struct Deferral {
    tries: u32,
    until: tokio::time::Instant,
    kind: Wait,
}

impl Deferral {
    /// A report that waits for a token: looked at again after the longest backoff, or as soon
    /// as tokens arrive (a new store generation clears these).
    fn for_token(config: &UploadConfig) -> Self {
        Deferral {
            tries: 0,
            until: tokio::time::Instant::now() + config.backoff_max.max(config.delay_max),
            kind: Wait::Token,
        }
    }
}

/// What a deferred report waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    /// The server could not take it for now (it would found a class, or its token was
    /// refused, or the server requires a token).
    Server,
    /// A token of its day and counter; looked at again when tokens arrive or the day changes.
    Token,
}

/// What to do next.
#[derive(Debug, PartialEq)]
enum Next {
    /// Send this report.
    Send(SpoolEntry),
    /// Every report is set aside until at least then.
    Wait(tokio::time::Instant),
    /// The spool is empty.
    Empty,
}

/// The oldest report not set aside at `now`.
fn next_entry(
    entries: &[SpoolEntry],
    deferred: &HashMap<u64, Deferral>,
    now: tokio::time::Instant,
) -> Next {
    let mut earliest = None;
    for entry in entries {
        match deferred.get(&entry.sequence) {
            Some(d) if d.until > now => {
                earliest = Some(earliest.map_or(d.until, |e: tokio::time::Instant| e.min(d.until)));
            }
            _ => return Next::Send(entry.clone()),
        }
    }
    earliest.map_or(Next::Empty, Next::Wait)
}

/// What an ack did to the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Settled {
    /// Delivered (removed) or refused for good (moved aside).
    Done,
    /// The server is overloaded: kept and set aside for a random while like
    /// [`Settled::Deferred`]; the others go on (the throttle hint slows the uploader down).
    Overloaded,
    /// Kept and set aside for a while; the others go first (a class the server cannot found
    /// now, or any other retry-later reason a newer server may add).
    Deferred,
    /// The server refused the report's token (invalid or spent) for the first time: the token
    /// is discarded and the report, kept, goes again once with another.
    TokenRefused,
    /// The server requires a token and the report carried none: kept.
    TokenRequired,
}

/// Applies an ack to the spool, the token store and the counts; `token_refused_before`: the
/// server refused this report's token once already.
fn settle(
    shared: &Shared,
    entry: &SpoolEntry,
    ack: AckStatus,
    throttle_permille: u16,
    token_refused_before: bool,
) -> Settled {
    let mut held = Held {
        spool: lock(&shared.spool),
        tokens: shared.tokens.as_deref().map(lock),
        evidence: shared.evidence.as_deref().map(lock),
        status: lock(&shared.status),
    };
    held.status.uploads.server_reachable = true;
    held.status.uploads.throttle_permille = throttle_permille;
    let status = &mut held.status;
    match ack {
        AckStatus::Accepted | AckStatus::Duplicate => held.delivered(entry, ack),
        AckStatus::Rejected(reason @ (RejectReason::InvalidToken | RejectReason::TokenSpent))
            if !token_refused_before =>
        {
            if held.drop_token(entry) {
                held.status.tokens.discarded += 1;
            }
            tracing::warn!(
                "the server refused the admission token of report {} ({reason:?}); token \
                 discarded, the report goes again once with another",
                entry.report_id
            );
            Settled::TokenRefused
        }
        AckStatus::Rejected(RejectReason::TokenRequired) => {
            status.tokens.token_required += 1;
            Settled::TokenRequired
        }
        AckStatus::Rejected(RejectReason::Overloaded) => {
            status.uploads.overloaded += 1;
            Settled::Overloaded
        }
        AckStatus::Rejected(reason) if reason.retry_later() => {
            status.uploads.new_class_limit += 1;
            tracing::info!(
                "report {} not taken for now ({reason:?}); kept, the others go first",
                entry.report_id
            );
            Settled::Deferred
        }
        AckStatus::Rejected(reason) => held.refused(entry, reason),
    }
}

/// What settling an ack holds, locked in the uploader's order (spool, tokens, evidence,
/// status).
struct Held<'a> {
    spool: std::sync::MutexGuard<'a, Spool>,
    tokens: Option<std::sync::MutexGuard<'a, TokenStore>>,
    evidence: Option<std::sync::MutexGuard<'a, TokenStore>>,
    status: std::sync::MutexGuard<'a, AgentStatus>,
}

impl Held<'_> {
    /// Forgets the report's admission token; whether it carried one.
    fn drop_token(&mut self, entry: &SpoolEntry) -> bool {
        forget_token(self.tokens.as_deref_mut(), entry, &mut self.status)
    }

    /// The evidence token goes with its report: spent when the server took it, discarded
    /// when it refused it for good, kept for the retry otherwise (no server can check it).
    fn drop_evidence(&mut self, entry: &SpoolEntry, spent: bool) {
        if forget_token(self.evidence.as_deref_mut(), entry, &mut self.status) {
            let counts = &mut self.status.evidence;
            if spent {
                counts.spent += 1;
            } else {
                counts.discarded += 1;
            }
        }
    }

    /// Accepted or Duplicate: the report leaves the spool and its tokens are spent.
    fn delivered(&mut self, entry: &SpoolEntry, ack: AckStatus) -> Settled {
        if ack == AckStatus::Accepted {
            self.status.uploads.accepted += 1;
        } else {
            self.status.uploads.duplicate += 1;
        }
        if let Err(e) = self.spool.remove_delivered(entry) {
            tracing::warn!("removing a delivered report: {e}");
            self.status.last_error = Some(e.to_string());
        }
        if self.drop_token(entry) {
            self.status.tokens.spent += 1;
        }
        self.drop_evidence(entry, true);
        Settled::Done
    }

    /// Refused for good: moved aside with its reason. Its tokens, if they were not spent, are
    /// never put on another report.
    fn refused(&mut self, entry: &SpoolEntry, reason: RejectReason) -> Settled {
        if self.drop_token(entry) {
            self.status.tokens.discarded += 1;
        }
        self.drop_evidence(entry, false);
        self.status.uploads.rejected += 1;
        tracing::warn!(
            "report {} rejected by the server ({reason:?}); moved aside",
            entry.report_id
        );
        if let Err(e) = self.spool.move_rejected(entry, &format!("{reason:?}")) {
            self.status.last_error = Some(e.to_string());
        }
        Settled::Done
    }
}

/// Removes the report's token from the store, if it carries one; whether it did. An error
/// leaves it attached: the report is gone (or goes again with it), and the next prune removes
/// a token whose report left the spool.
fn forget_token(
    store: Option<&mut TokenStore>,
    entry: &SpoolEntry,
    status: &mut AgentStatus,
) -> bool {
    let Some(store) = store else { return false };
    store
        .forget_in_flight(&entry.report_id)
        .unwrap_or_else(|e| {
            tracing::warn!("token store: {e}");
            status.last_error = Some(e.to_string());
            false
        })
}

/// `min(backoff_max, backoff_base * 2^(failures-1))`, less up to half at random.
fn backoff(config: &UploadConfig, failures: u32) -> Duration {
    let full = config
        .backoff_base
        .saturating_mul(2u32.saturating_pow(failures.saturating_sub(1).min(31)))
        .min(config.backoff_max);
    full.mul_f64(1.0 - 0.5 * rand::rng().random::<f64>())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use penrose_core::wire::ReportId;

    use super::*;

    fn shared(dir: &std::path::Path) -> Shared {
        Shared::new(
            Arc::new(Mutex::new(
                Spool::open(&dir.join("spool"), 1 << 20).unwrap(),
            )),
            Arc::new(Mutex::new(AgentStatus::default())),
            Arc::new(Notify::new()),
            Arc::new(AtomicBool::new(false)),
        )
    }

    #[test]
    fn a_report_that_would_found_a_class_is_kept_and_the_others_go_first() {
        let dir = tempfile::tempdir().unwrap();
        let shared = shared(dir.path());
        for n in 0..3 {
            lock(&shared.spool)
                .push(ReportId([n; 16]), &[n; 64])
                .unwrap();
        }
        let entries = lock(&shared.spool).entries().to_vec();
        let settled = settle(
            &shared,
            &entries[0],
            AckStatus::Rejected(RejectReason::NewClassLimit),
            1000,
            false,
        );
        assert_eq!(settled, Settled::Deferred);
        assert!(
            lock(&shared.spool).contains(&entries[0]),
            "kept in the spool"
        );
        assert!(entries[0].path.exists());
        assert_eq!(lock(&shared.status).uploads.new_class_limit, 1);
        assert_eq!(lock(&shared.status).uploads.rejected, 0);

        // Set aside, the next report goes first; once all are set aside, the uploader waits
        // for the earliest; when its time has come, it is sent again.
        let now = tokio::time::Instant::now();
        let later = now + Duration::from_secs(5);
        let mut deferred = HashMap::new();
        deferred.insert(
            entries[0].sequence,
            Deferral {
                tries: 1,
                until: later,
                kind: Wait::Server,
            },
        );
        assert_eq!(
            next_entry(&entries, &deferred, now),
            Next::Send(entries[1].clone())
        );
        for e in &entries[1..] {
            let until = later + Duration::from_secs(1);
            deferred.insert(
                e.sequence,
                Deferral {
                    tries: 1,
                    until,
                    kind: Wait::Token,
                },
            );
        }
        assert_eq!(next_entry(&entries, &deferred, now), Next::Wait(later));
        assert_eq!(
            next_entry(&entries, &deferred, later),
            Next::Send(entries[0].clone())
        );
        assert_eq!(next_entry(&[], &deferred, now), Next::Empty);

        // Overloaded keeps it too; a final refusal moves it aside.
        assert_eq!(
            settle(
                &shared,
                &entries[1],
                AckStatus::Rejected(RejectReason::Overloaded),
                1000,
                false
            ),
            Settled::Overloaded
        );
        assert!(lock(&shared.spool).contains(&entries[1]));
        assert_eq!(
            settle(
                &shared,
                &entries[2],
                AckStatus::Rejected(RejectReason::InvalidSnippet),
                1000,
                false
            ),
            Settled::Done
        );
        assert!(!lock(&shared.spool).contains(&entries[2]));
        assert_eq!(lock(&shared.status).uploads.rejected, 1);
    }

    #[test]
    fn a_token_refused_twice_sets_the_report_aside() {
        let dir = tempfile::tempdir().unwrap();
        let shared = shared(dir.path());
        lock(&shared.spool)
            .push(ReportId([7; 16]), &[7; 64])
            .unwrap();
        let entry = lock(&shared.spool).entries()[0].clone();
        let refused = AckStatus::Rejected(RejectReason::TokenSpent);
        assert_eq!(
            settle(&shared, &entry, refused, 1000, false),
            Settled::TokenRefused
        );
        assert!(lock(&shared.spool).contains(&entry), "kept for one retry");
        let refused = AckStatus::Rejected(RejectReason::InvalidToken);
        assert_eq!(settle(&shared, &entry, refused, 1000, true), Settled::Done);
        assert!(!lock(&shared.spool).contains(&entry), "then set aside");
        assert_eq!(lock(&shared.status).uploads.rejected, 1);
    }

    /// Every reason that is neither "retry later" nor about the token moves its report aside
    /// and nothing else: the other report stays, untouched.
    #[test]
    fn every_final_reason_moves_only_its_report_aside() {
        let final_reasons = (1..=255u8)
            .map(RejectReason::from_code)
            .filter(|r| !r.retry_later() && !r.token_problem());
        for (n, reason) in final_reasons.enumerate() {
            let dir = tempfile::tempdir().unwrap();
            let shared = shared(dir.path());
            for id in [1u8, 2] {
                lock(&shared.spool)
                    .push(ReportId([id; 16]), &[id; 64])
                    .unwrap();
            }
            let entries = lock(&shared.spool).entries().to_vec();
            let ack = AckStatus::Rejected(reason);
            assert_eq!(
                settle(&shared, &entries[0], ack, 1000, false),
                Settled::Done
            );
            assert!(
                !lock(&shared.spool).contains(&entries[0]),
                "{reason:?} #{n}"
            );
            assert!(lock(&shared.spool).contains(&entries[1]), "{reason:?} #{n}");
            assert_eq!(lock(&shared.status).uploads.rejected, 1, "{reason:?}");
        }
    }
}
