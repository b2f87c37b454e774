//! Anonymous admission tokens, the agent's side of issuance (issue 11): this host's enrolment
//! credential, and the fetcher that keeps the token store ([`crate::tokens`]) supplied.
//!
//! **A fetch** ([`Fetcher::fetch`]) is two or three exchanges with the issuer
//! (`penrose_core::tokens::protocol`), each on a QUIC connection of its own from a fresh UDP
//! socket ([`ExchangeClient`]; never a connection an upload uses):
//!
//! 1. the published key set, asked with nothing about the asker (no credential). It must agree
//!    with the keys seen before: an (epoch, scope)'s key never changes once seen, and a set
//!    that contradicts the stored one is refused and logged as a partition attempt (an issuer
//!    showing this agent keys of its own could recognise its tokens at redemption);
//! 2. the issuer's whole quota (24 tokens, [`TOKENS_PER_KEY`]) for today and tomorrow, for every
//!    counter of the catalogue, whatever the agent holds or used, so that what it asks says
//!    nothing about what it reported; a batch answered `Quota { remaining }` is asked again
//!    once for `remaining`. Every issuance's proof is checked against the published key
//!    (`TokenRequest::finalize`); one that fails, or that names a key the set does not hold,
//!    is discarded and logged at error level as a partition attempt.
//!
//! **When** ([`run`]): on a schedule of its own and on nothing else. At a uniformly random time
//! between half and all of `admission.refresh_max_seconds` after the previous fetch (the first
//! one at a random time within that bound, or, when the store holds no token for today at
//! start, within `admission.retry_min_seconds`), never at a fixed wall-clock time; after a
//! failed fetch again after `retry_min` (jittered, doubling). Never because tokens ran out: the
//! aggregation server decides which reports it refuses for their tokens, and a fetch that
//! followed such refusals would show the issuer, who sees the credential, the host that was
//! refused (docs/threat-model.md, "What an ack can make an agent do"). Each fetch takes today's
//! and tomorrow's quota, so the day's reserve is in hand before the day starts; a report with
//! no token left waits for the next scheduled fetch or the next day.
//!
//! **The credential** ([`load_credential`]) is a file installed with the package (format:
//! `penrose_core::tokens::protocol::Credential::from_file`), refused when group or others
//! may access it, when another user owns it, or when it is a symbolic link. It is sent only in
//! issue requests, to the pinned issuer, and never logged.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use penrose_core::counters::Catalogue;
use penrose_core::tokens::protocol::{
    self, BatchOutcome, Credential, IssuerAnswer, IssuerRequest, ProtocolError, Refusal,
};
use penrose_core::tokens::{
    CredentialFileError, IssueResponse, KeyEntry, KeySet, MAX_BATCH, MAX_CREDENTIAL_FILE,
    TokenEpoch, TokenError, TokenRequest, TokenScope,
};
use penrose_host::FileError;
use penrose_transport::ClientError;
use penrose_transport::exchange::{ExchangeClient, Protocol};
use rand::Rng;
use thiserror::Error;
use tokio::sync::Notify;

use crate::status::AgentStatus;
use crate::tokens::{KeySetConflict, TokenStore, TokenStoreError};
use penrose_host::clock::Clock;

/// Tokens asked for per (epoch, scope): the most any issuer's quota allows (the servers' T,
/// `penrose_core::release::ReportsPerContributor::DEFAULT`). Every agent asks for the same.
pub const TOKENS_PER_KEY: usize = 24;

/// Largest credential file read.
/// One byte past the longest credential file, so that a longer one is named as such.
const CREDENTIAL_READ_LIMIT: u64 = MAX_CREDENTIAL_FILE as u64 + 1;

/// The issuance protocol on the exchange transport.
pub const ISSUER_PROTOCOL: Protocol = Protocol {
    alpn: protocol::ALPN,
    max_body: protocol::MAX_ISSUER_MESSAGE,
};

/// Why the credential file was refused. Never shows its contents.
#[derive(Debug, Error)]
pub enum CredentialError {
    /// A file was not read or written.
    #[error("admission.credential {0}")]
    File(#[from] penrose_host::FileError),
    /// Others could read or replace it, it is a symbolic link, or it is larger than any
    /// credential file: [`penrose_host::secret_file::read`] says which.
    #[error("admission.credential: {0}; refusing to use it")]
    Unsafe(FileError),
    /// It is not a credential file.
    #[error("admission.credential {path}: not a credential file: {source}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: CredentialFileError,
    },
}

/// Reads this host's credential from `path`: a regular file (not a symbolic link) of the
/// agent's user that neither group nor others may access, in the
/// `penrose-issuer-credential 1` format (`penrose_core::tokens::CREDENTIAL_FILE_MAGIC`).
pub fn load_credential(path: &Path) -> Result<Credential, CredentialError> {
    let bytes =
        penrose_host::secret_file::read(path, CREDENTIAL_READ_LIMIT).map_err(|e| match e {
            FileError::Io { path, source } => {
                CredentialError::File(penrose_host::FileError::Io { path, source })
            }
            e => CredentialError::Unsafe(e),
        })?;
    let format = |source| CredentialError::Format {
        path: path.to_owned(),
        source,
    };
    let text = String::from_utf8(bytes).map_err(|_| format(CredentialFileError::NotACredential))?;
    Credential::from_file(&text).map_err(format)
}

/// Why a fetch got no tokens.
#[derive(Debug, Error)]
pub enum FetchError {
    /// The issuer could not be reached, or did not answer in time.
    #[error("issuer unreachable: {0}")]
    Transport(#[from] ClientError),
    /// The answer does not decode.
    #[error("the issuer's answer: {0}")]
    Protocol(#[from] ProtocolError),
    /// The issuer refused the request.
    #[error("the issuer refused: {0}")]
    Refused(Refusal),
    /// The key set does not decode.
    #[error("the issuer's key set: {0}")]
    KeySet(TokenError),
    /// The key set contradicts the one seen before: refused, no tokens asked for.
    #[error(
        "PARTITION ATTEMPT: the issuer's key set contradicts the one this agent saw before ({0}); refused, no tokens asked for"
    )]
    Partition(KeySetConflict),
    /// An answer of the wrong kind or size.
    #[error("the issuer answered {0}")]
    Unexpected(&'static str),
    /// The store could not be written.
    #[error(transparent)]
    Store(#[from] TokenStoreError),
}

/// What one fetch did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fetched {
    /// Tokens received and stored.
    pub issued: u64,
    /// Issuances discarded as partition attempts.
    pub partition: u64,
    /// (epoch, scope) pairs asked for that the key set has no key for.
    pub missing_keys: u64,
    /// Whether the store still holds no unspent token of today afterwards.
    pub none_for_today: bool,
}

/// Which issuer's tokens: the aggregation server's admission, or the release auditor's
/// evidence. The same protocol and code; each its own issuer, credential, store and counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenKind {
    /// `[admission]`: tokens the aggregation server verifies.
    Admission,
    /// `[evidence]`: tokens only the release auditor verifies.
    Evidence,
}

impl TokenKind {
    /// Its counts in the status.
    pub fn counts(self, status: &mut AgentStatus) -> &mut crate::status::TokenStatus {
        match self {
            TokenKind::Admission => &mut status.tokens,
            TokenKind::Evidence => &mut status.evidence,
        }
    }

    /// Its name in logs.
    pub fn label(self) -> &'static str {
        match self {
            TokenKind::Admission => "admission",
            TokenKind::Evidence => "evidence",
        }
    }
}

/// Fetches tokens from the issuer into the store (module docs).
pub struct Fetcher {
    client: ExchangeClient,
    credential: Credential,
    store: Arc<Mutex<TokenStore>>,
    status: Arc<Mutex<AgentStatus>>,
    clock: std::sync::Arc<dyn Clock>,
    scopes: Vec<TokenScope>,
    kind: TokenKind,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Fetcher {
    /// A fetcher for every counter and joint view of the current catalogue. `client` is the issuer's
    /// exchange client (its own connections: [`ISSUER_PROTOCOL`]).
    pub fn new(
        client: ExchangeClient,
        credential: Credential,
        store: Arc<Mutex<TokenStore>>,
        status: Arc<Mutex<AgentStatus>>,
        clock: std::sync::Arc<dyn Clock>,
    ) -> Self {
        let scopes = Catalogue::current()
            .report_ids()
            .map(|id| TokenScope(id.0))
            .collect();
        Self {
            client,
            credential,
            store,
            status,
            clock,
            scopes,
            kind: TokenKind::Admission,
        }
    }

    /// A fetcher of evidence tokens (`[evidence]`), counted apart in the status.
    pub fn for_evidence(mut self) -> Self {
        self.kind = TokenKind::Evidence;
        self
    }

    /// Which issuer's tokens it fetches.
    pub fn kind(&self) -> TokenKind {
        self.kind
    }

    /// Asks for these scopes instead of the catalogue's (tests).
    pub fn with_scopes(mut self, scopes: Vec<TokenScope>) -> Self {
        self.scopes = scopes;
        self
    }

    /// One fetch: the key set, then the whole quota of today and tomorrow (module docs).
    /// Counts what it did in the status.
    pub async fn fetch(&self) -> Result<Fetched, FetchError> {
        let result = self.fetch_inner().await;
        let mut status = lock(&self.status);
        let t = self.kind.counts(&mut status);
        match &result {
            Ok(fetched) => {
                t.fetches += 1;
                t.issued += fetched.issued;
                t.partition_warnings += fetched.partition;
                t.last_fetch_error = None;
            }
            Err(e) => {
                t.fetch_failures += 1;
                if matches!(e, FetchError::Partition(_)) {
                    t.partition_warnings += 1;
                }
                t.last_fetch_error = Some(e.to_string());
            }
        }
        result
    }

    async fn fetch_inner(&self) -> Result<Fetched, FetchError> {
        let today = self.clock.today();
        let set = self.key_set().await?;
        let merged = lock(&self.store)
            .merged_key_set(&set, today)
            .map_err(|conflict| {
                tracing::error!(
                    "PARTITION ATTEMPT: the issuer's key set contradicts the one this agent saw \
                     before ({conflict}); it is refused and no tokens are asked for. An issuer \
                     that shows one agent keys of its own can tell that agent's reports apart"
                );
                FetchError::Partition(conflict)
            })?;
        lock(&self.store).set_key_set(merged)?;

        let mut fetched = Fetched::default();
        let mut wanted = Vec::new();
        for epoch in [TokenEpoch(today.0), TokenEpoch(today.0.saturating_add(1))] {
            for &scope in &self.scopes {
                match set.get(epoch, scope) {
                    Some(entry) => wanted.push((entry.clone(), TOKENS_PER_KEY.min(MAX_BATCH))),
                    None => fetched.missing_keys += 1,
                }
            }
        }
        if fetched.missing_keys > 0 {
            tracing::warn!(
                "the issuer publishes no key for {} of the (day, counter) pairs of today and \
                 tomorrow; their reports wait",
                fetched.missing_keys
            );
        }
        let again = self.issue(&set, wanted, &mut fetched).await?;
        if !again.is_empty() {
            self.issue(&set, again, &mut fetched).await?;
        }
        fetched.none_for_today = !lock(&self.store).has_unspent_for(TokenEpoch(today.0));
        tracing::info!(
            "{} tokens: {} received (today and tomorrow, {} counters){}",
            self.kind.label(),
            fetched.issued,
            self.scopes.len(),
            if fetched.none_for_today {
                "; none left for today"
            } else {
                ""
            }
        );
        Ok(fetched)
    }

    /// The published key set, on a connection of its own, with no credential.
    async fn key_set(&self) -> Result<KeySet, FetchError> {
        let answer = self
            .client
            .exchange(&IssuerRequest::KeySet.encode())
            .await?;
        match IssuerAnswer::decode(&answer)? {
            IssuerAnswer::KeySet(bytes) => KeySet::decode(&bytes).map_err(FetchError::KeySet),
            IssuerAnswer::Refused(refusal) => Err(FetchError::Refused(refusal)),
            IssuerAnswer::Issued(_) => Err(FetchError::Unexpected("tokens to a key set request")),
        }
    }

    /// Asks for `wanted` (key, count) in requests of at most `MAX_BATCHES` batches, stores
    /// what verifies, and returns the (key, remaining) pairs answered with a partial quota.
    async fn issue(
        &self,
        set: &KeySet,
        wanted: Vec<(KeyEntry, usize)>,
        fetched: &mut Fetched,
    ) -> Result<Vec<(KeyEntry, usize)>, FetchError> {
        let mut again = Vec::new();
        for chunk in wanted.chunks(protocol::MAX_BATCHES) {
            let mut pending = Vec::with_capacity(chunk.len());
            {
                // The generator is the thread's: not held across the exchange below.
                let mut rng = rand::rng();
                for (entry, count) in chunk {
                    // Counts are 1 to MAX_BATCH, entries come from a decoded set: cannot fail.
                    match TokenRequest::new(entry, *count, &mut rng) {
                        Ok(request) => pending.push((entry.clone(), request)),
                        Err(e) => tracing::warn!("token request for epoch {}: {e}", entry.epoch()),
                    }
                }
            }
            if pending.is_empty() {
                continue;
            }
            let request = IssuerRequest::Issue {
                credential: self.credential.clone(),
                batches: pending.iter().map(|(_, r)| r.request().encode()).collect(),
            };
            let answer = self.client.exchange(&request.encode()).await?;
            let outcomes = match IssuerAnswer::decode(&answer)? {
                IssuerAnswer::Issued(outcomes) => outcomes,
                IssuerAnswer::Refused(refusal) => return Err(FetchError::Refused(refusal)),
                IssuerAnswer::KeySet(_) => {
                    return Err(FetchError::Unexpected("a key set to an issue request"));
                }
            };
            if outcomes.len() != pending.len() {
                return Err(FetchError::Unexpected(
                    "another number of outcomes than batches",
                ));
            }
            for ((entry, request), outcome) in pending.into_iter().zip(outcomes) {
                match outcome {
                    BatchOutcome::Issued(bytes) => {
                        self.finalize(set, &entry, request, &bytes, fetched)?;
                    }
                    BatchOutcome::Quota { remaining } => {
                        let remaining = usize::from(remaining).min(MAX_BATCH);
                        if remaining > 0 {
                            again.push((entry, remaining));
                        }
                    }
                    BatchOutcome::UnknownKey => tracing::warn!(
                        "the issuer does not issue its published key of day {}, counter {} now",
                        entry.epoch(),
                        entry.scope()
                    ),
                    BatchOutcome::Invalid => tracing::warn!(
                        "the issuer found the token request of day {}, counter {} invalid",
                        entry.epoch(),
                        entry.scope()
                    ),
                }
            }
        }
        Ok(again)
    }

    /// Verifies one issuance against the published key and stores its tokens; one that does
    /// not verify is discarded and logged as a partition attempt.
    fn finalize(
        &self,
        set: &KeySet,
        entry: &KeyEntry,
        request: TokenRequest,
        bytes: &[u8],
        fetched: &mut Fetched,
    ) -> Result<(), FetchError> {
        let tokens = IssueResponse::decode(bytes, set).and_then(|r| request.finalize(&r));
        match tokens {
            Ok(tokens) => {
                let n = lock(&self.store).add(entry.epoch(), entry.scope(), tokens)?;
                fetched.issued += n as u64;
            }
            Err(
                e @ (TokenError::ProofFailed(_)
                | TokenError::UnknownKey { .. }
                | TokenError::Mismatch(_)),
            ) => {
                fetched.partition += 1;
                tracing::error!(
                    "PARTITION ATTEMPT: the issuer's answer for day {}, counter {} is not made \
                     with the key it publishes to every agent ({e}); its tokens are discarded. \
                     An issuer that answers one agent with a key of its own can tell that \
                     agent's reports apart",
                    entry.epoch(),
                    entry.scope()
                );
            }
            Err(e) => tracing::warn!(
                "the issuer's answer for day {}, counter {} is malformed ({e}); discarded",
                entry.epoch(),
                entry.scope()
            ),
        }
        Ok(())
    }
}

/// When the fetcher runs (`admission.refresh_max_seconds`, `admission.retry_min_seconds`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FetchTiming {
    /// The longest time between two fetches.
    pub refresh_max: Duration,
    /// The wait before the start-up fetch (no token for today at start) and the shortest
    /// wait after a failure.
    pub retry_min: Duration,
}

/// Runs the fetcher until `stop` (module docs); `uploads` is notified after every fetch that
/// added tokens.
pub async fn run(
    fetcher: Fetcher,
    timing: FetchTiming,
    stop: Arc<AtomicBool>,
    uploads: Arc<Notify>,
) {
    let jitter = |d: Duration, low: f64| d.mul_f64(rand::rng().random_range(low..=1.0));
    let now = tokio::time::Instant::now;
    let none_today = !lock(&fetcher.store).has_unspent_for(TokenEpoch(fetcher.clock.today().0));
    let first = match none_today {
        true => timing.retry_min.min(timing.refresh_max),
        false => timing.refresh_max,
    };
    let mut next = now() + jitter(first, 0.0);
    let mut failures: u32 = 0;
    while !stop.load(Ordering::Relaxed) {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = crate::upload::stopped(&stop) => break,
        }
        let outcome = tokio::select! {
            r = fetcher.fetch() => r,
            () = crate::upload::stopped(&stop) => break,
        };
        match outcome {
            Ok(fetched) => {
                failures = 0;
                if fetched.issued > 0 {
                    uploads.notify_one();
                }
                next = now() + jitter(timing.refresh_max, 0.5);
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                tracing::warn!("fetching {} tokens: {e}", fetcher.kind().label());
                let wait = timing
                    .retry_min
                    .saturating_mul(2u32.saturating_pow(failures.saturating_sub(1).min(16)))
                    .min(timing.refresh_max);
                next = now() + jitter(wait, 0.5);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// The credential file is read only when it is a regular file of the agent's user that
    /// nobody else may access; a link to a good file is refused too; errors never quote it.
    #[test]
    fn the_credential_file_is_refused_when_others_may_read_it_or_it_is_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.credential");
        let credential = Credential([0x3c; 32]);
        crate::spool::write_synced(&path, credential.to_file("test host").as_bytes()).unwrap();
        assert_eq!(load_credential(&path).unwrap(), credential);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        let e = load_credential(&path).unwrap_err().to_string();
        assert!(
            e.contains("mode 640") && e.contains("admission.credential"),
            "{e}"
        );
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("link.credential");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let e = load_credential(&link).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        crate::spool::write_synced(&path, b"penrose-issuer-credential 1\nnot hex\n").unwrap();
        let e = load_credential(&path).unwrap_err().to_string();
        assert!(e.contains("64-hex-digit") && !e.contains("not hex"), "{e}");
        let e = load_credential(&dir.path().join("absent"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("absent"), "{e}");
    }
}
