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
//! Overloaded slows the whole uploader down (backoff), NewClassLimit (the report would found an
//! application class, and the server founds only so many an hour) sets that one report aside
//! for a while, doubling, and the uploader goes on with the others, so that reports of
//! known applications are not held up behind it.
//!
//! Every upload, and every retry of it, goes out on a QUIC connection of its own from a UDP
//! socket of its own ([`Reuse::FreshPerReport`]): a new source port, new connection ids, a full
//! handshake without TLS resumption or address-validation token, closed after the ack. Nothing
//! at the transport layer links two reports of this machine; the uploader refuses a client
//! configuration that would share a connection (docs/transport.md).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use penrose_core::wire::{AckStatus, Message, RejectReason};
use penrose_transport::{Client, ClientConfig, Reuse};
use rand::Rng;
use tokio::sync::Notify;

use crate::spool::{Spool, SpoolEntry, read_frame};
use crate::status::AgentStatus;

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
    let stop = &*shared.stop;
    let mut throttle_permille: u16 = 1000;
    let mut failures: u32 = 0;
    let mut deferred: HashMap<u64, Deferral> = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        let next = {
            let spool = lock(&shared.spool);
            if !deferred.is_empty() {
                // Forget reports that left the spool meanwhile (delivered, or dropped for room).
                let spooled: std::collections::HashSet<u64> =
                    spool.entries().iter().map(|e| e.sequence).collect();
                deferred.retain(|sequence, _| spooled.contains(sequence));
            }
            next_entry(spool.entries(), &deferred, tokio::time::Instant::now())
        };
        let entry = match next {
            Next::Send(entry) => entry,
            Next::Empty | Next::Wait(_) => {
                let until = match next {
                    Next::Wait(until) => {
                        until.min(tokio::time::Instant::now() + Duration::from_millis(200))
                    }
                    _ => tokio::time::Instant::now() + Duration::from_millis(200),
                };
                tokio::select! {
                    _ = shared.wake.notified() => {}
                    _ = tokio::time::sleep_until(until) => {}
                }
                continue;
            }
        };
        // The random delay, stretched by the throttle hint (0: wait the longest backoff).
        let stretch = if throttle_permille == 0 {
            None
        } else {
            Some(1000.0 / f64::from(throttle_permille))
        };
        let delay = match stretch {
            Some(s) => config
                .delay_max
                .mul_f64(rand::rng().random::<f64>())
                .mul_f64(s)
                .min(config.backoff_max.max(config.delay_max)),
            None => config.backoff_max,
        };
        if !pause(delay, stop).await {
            break;
        }
        if !lock(&shared.spool).contains(&entry) {
            continue; // dropped to make room meanwhile
        }
        let report =
            match read_frame(&entry)
                .map_err(|e| e.to_string())
                .and_then(|f| match Message::decode(&f) {
                    Ok((Message::Report(r), used)) if used == f.len() => Ok(r),
                    Ok(_) => Err("not one report frame".to_string()),
                    Err(e) => Err(e.to_string()),
                }) {
                Ok(r) => r,
                Err(why) => {
                    tracing::warn!(
                        "spooled report {} unreadable ({why}); moved aside",
                        entry.path.display()
                    );
                    let _ =
                        lock(&shared.spool).move_rejected(&entry, &format!("unreadable: {why}"));
                    continue;
                }
            };
        lock(&shared.status).uploads.attempts += 1;
        let outcome = tokio::select! {
            r = client.send_with_retry(&report) => Some(r),
            () = stopped(stop) => None,
        };
        let Some(outcome) = outcome else { break };
        match outcome {
            Ok(ack) => {
                failures = 0;
                throttle_permille = ack.throttle.permille();
                match settle(&shared, &entry, ack.status, throttle_permille) {
                    Settled::Done => {
                        deferred.remove(&entry.sequence);
                    }
                    Settled::Overloaded => {
                        failures += 1;
                        if !pause(backoff(&config, failures), stop).await {
                            break;
                        }
                    }
                    Settled::Deferred => {
                        let tries = deferred.get(&entry.sequence).map_or(0, |d| d.tries) + 1;
                        let until = tokio::time::Instant::now() + backoff(&config, tries);
                        deferred.insert(entry.sequence, Deferral { tries, until });
                    }
                }
            }
            Err(e) => {
                failures += 1;
                let wait = backoff(&config, failures);
                {
                    let mut status = lock(&shared.status);
                    status.uploads.failed += 1;
                    status.uploads.server_reachable = false;
                    status.uploads.last_error = Some(e.to_string());
                }
                let kept = lock(&shared.spool).entries().len();
                tracing::warn!(
                    "upload failed ({e}); {kept} reports kept in the spool, next try in {wait:?}"
                );
                if !pause(wait, stop).await {
                    break;
                }
            }
        }
    }
    client.close().await;
}

/// A spooled report the server could not take for now (it would found a class): not sent
/// again before `until`.
#[derive(Clone, Copy, Debug)]
struct Deferral {
    tries: u32,
    until: tokio::time::Instant,
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
    /// The server is overloaded: kept, and the uploader slows down.
    Overloaded,
    /// Kept and set aside for a while; the others go first (a class the server cannot found
    /// now, or any other retry-later reason a newer server may add).
    Deferred,
}

/// Applies an ack to the spool and the counts.
fn settle(shared: &Shared, entry: &SpoolEntry, ack: AckStatus, throttle_permille: u16) -> Settled {
    let mut spool = lock(&shared.spool);
    let mut status = lock(&shared.status);
    status.uploads.server_reachable = true;
    status.uploads.throttle_permille = throttle_permille;
    match ack {
        AckStatus::Accepted | AckStatus::Duplicate => {
            if ack == AckStatus::Accepted {
                status.uploads.accepted += 1;
            } else {
                status.uploads.duplicate += 1;
            }
            if let Err(e) = spool.remove_delivered(entry) {
                tracing::warn!("removing a delivered report: {e}");
                status.last_error = Some(e.to_string());
            }
            Settled::Done
        }
        AckStatus::Rejected(RejectReason::Overloaded) => {
            status.uploads.overloaded += 1;
            Settled::Overloaded
        }
        AckStatus::Rejected(reason) if reason.retry_later() => {
            status.uploads.new_class_limit += 1;
            tracing::info!(
                "report {} not taken for now ({reason:?}); kept, the others go first",
                crate::spool::hex(&entry.report_id.0)
            );
            Settled::Deferred
        }
        AckStatus::Rejected(reason) => {
            status.uploads.rejected += 1;
            tracing::warn!(
                "report {} rejected by the server ({reason:?}); moved aside",
                crate::spool::hex(&entry.report_id.0)
            );
            if let Err(e) = spool.move_rejected(entry, &format!("{reason:?}")) {
                status.last_error = Some(e.to_string());
            }
            Settled::Done
        }
    }
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
        Shared {
            spool: Arc::new(Mutex::new(
                Spool::open(&dir.join("spool"), 1 << 20).unwrap(),
            )),
            status: Arc::new(Mutex::new(AgentStatus::default())),
            wake: Arc::new(Notify::new()),
            stop: Arc::new(AtomicBool::new(false)),
        }
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
            },
        );
        assert_eq!(
            next_entry(&entries, &deferred, now),
            Next::Send(entries[1].clone())
        );
        for e in &entries[1..] {
            let until = later + Duration::from_secs(1);
            deferred.insert(e.sequence, Deferral { tries: 1, until });
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
                1000
            ),
            Settled::Overloaded
        );
        assert!(lock(&shared.spool).contains(&entries[1]));
        assert_eq!(
            settle(
                &shared,
                &entries[2],
                AckStatus::Rejected(RejectReason::InvalidSnippet),
                1000
            ),
            Settled::Done
        );
        assert!(!lock(&shared.spool).contains(&entries[2]));
        assert_eq!(lock(&shared.status).uploads.rejected, 1);
    }
}
