//! The issuer's answers: the published key set, and tokens within each credential's quota.
//!
//! An issue request goes through, in order:
//!
//! 1. **Decoding** (`IssuerRequest::decode`): anything that is not exactly one request is
//!    refused whole (`Malformed`, or `UnsupportedVersion`), before any table is read.
//! 2. **The credential**: its [`CredentialId`] must be enrolled and not revoked, else
//!    `UnknownCredential`. Nothing is written for an unknown credential.
//! 3. **The rate limit**: a bucket per credential of `requests_per_hour` requests that fills
//!    again at that rate (so at most that many in a burst, and that many an hour); an empty
//!    bucket is `RateLimited`. Every request of an enrolled credential takes one, whatever
//!    becomes of its batches. The bucket is kept in memory and written to the store with the
//!    counts of the next issuance, so a request that issues nothing writes nothing, and a
//!    restart gives a credential at most one bucket back.
//! 4. **Each batch**: it must decode against the published key set (`Invalid` otherwise;
//!    `UnknownKey` for a key the set does not hold), be for today's or tomorrow's epoch
//!    (`UnknownKey` otherwise), and fit the quota: tokens issued to the credential under that
//!    (epoch, scope), in earlier requests and earlier batches of this one, plus the batch's,
//!    at most `tokens_per_epoch` (T = 24 at most; configuration may only lower it). A batch
//!    that does not fit gets `Quota { remaining }` and nothing; the issuer never issues part
//!    of a batch. A batch that fits is evaluated (`IssuerKey::issue`: one scalar
//!    multiplication per token and a batched DLEQ proof).
//! 5. **The write**: the new counts (and the rate bucket) in one synced write, *before* the
//!    answer is returned; if it fails the request is answered `Unavailable` and no token
//!    leaves.
//!
//! Requests of one credential are serialised (a lock per credential, striped), so two
//! concurrent requests cannot both spend the same quota. Counts of epochs more than
//! `keep_days` before today are pruned when the day changes, behind a floor below which
//! nothing is issued even if the clock goes back.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use penrose_core::release::ReportsPerContributor;
use penrose_core::tokens::protocol::{
    BatchOutcome, Credential, IssuerAnswer, IssuerRequest, ProtocolError, Refusal,
};
use penrose_core::tokens::{BlindedRequest, TokenEpoch, TokenError, TokenScope};
use penrose_core::wire::Day;
use rand::rngs::ThreadRng;
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::credential::CredentialId;
use crate::error::IssuerError;
use crate::keys::{Keys, PublishWindow, Published};
use crate::seed::MasterSeed;
use crate::state::StateDir;
use crate::store::{RATE_UNITS, RateRecord, Store, Table, WriteSet, issued_key};
use penrose_host::clock::Clock;

/// Requests per credential per hour by default.
pub const DEFAULT_REQUESTS_PER_HOUR: u32 = 12;

/// Days of counts kept before today (for `status`, and against a clock that goes back).
pub const DEFAULT_KEEP_DAYS: u32 = 2;

/// Epochs issued: today's and the next `ISSUE_AHEAD` days'.
pub const ISSUE_AHEAD: u32 = 1;

/// Striped locks that serialise requests of one credential.
const STRIPES: usize = 64;

/// Rate buckets kept in memory before full ones are dropped (a full bucket is the same as no
/// record).
const MAX_RATE_ENTRIES: usize = 100_000;

/// How the issuer issues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IssuerConfig {
    tokens_per_epoch: u16,
    requests_per_hour: u32,
    /// Which days the published key set holds around today.
    pub publish: PublishWindow,
    /// Days of counts kept before today.
    pub keep_days: u32,
}

impl Default for IssuerConfig {
    fn default() -> Self {
        IssuerConfig {
            // The agents' cap and the servers' contributor bound, T = 24.
            tokens_per_epoch: ReportsPerContributor::DEFAULT.get() as u16,
            requests_per_hour: DEFAULT_REQUESTS_PER_HOUR,
            publish: PublishWindow::default(),
            keep_days: DEFAULT_KEEP_DAYS,
        }
    }
}

impl IssuerConfig {
    /// A configuration with a quota of `tokens_per_epoch` tokens per (credential, epoch,
    /// scope), 1 to T = 24 (never more: the contributor threshold counts with 24 reports per
    /// agent, counter and day), and `requests_per_hour` requests per credential (at least 1).
    pub fn new(tokens_per_epoch: u32, requests_per_hour: u32) -> Result<Self, IssuerError> {
        let cap = ReportsPerContributor::for_agent(tokens_per_epoch).map_err(|_| {
            IssuerError::Config(format!(
                "tokens per epoch must be 1 to {} (the reports per counter and day the \
                 contributor threshold counts with); got {tokens_per_epoch}",
                ReportsPerContributor::DEFAULT.get()
            ))
        })?;
        if requests_per_hour == 0 {
            return Err(IssuerError::Config(
                "requests per hour must be at least 1".into(),
            ));
        }
        Ok(IssuerConfig {
            tokens_per_epoch: u16::try_from(cap.get()).unwrap_or(u16::MAX),
            requests_per_hour,
            ..IssuerConfig::default()
        })
    }

    /// The quota per (credential, epoch, scope).
    pub fn tokens_per_epoch(&self) -> u16 {
        self.tokens_per_epoch
    }

    /// Requests per credential per hour.
    pub fn requests_per_hour(&self) -> u32 {
        self.requests_per_hour
    }
}

/// What the issuer has done since it started.
#[derive(Debug, Default)]
struct Counters {
    key_set_requests: AtomicU64,
    issue_requests: AtomicU64,
    tokens_issued: AtomicU64,
    refused_malformed: AtomicU64,
    refused_unknown_credential: AtomicU64,
    refused_rate_limited: AtomicU64,
    refused_unavailable: AtomicU64,
    batches_issued: AtomicU64,
    batches_quota: AtomicU64,
    batches_unknown_key: AtomicU64,
    batches_invalid: AtomicU64,
}

/// A snapshot of the issuer's counters since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssuerStats {
    /// Key set requests answered.
    pub key_set_requests: u64,
    /// Issue requests received (decoded).
    pub issue_requests: u64,
    /// Tokens issued.
    pub tokens_issued: u64,
    /// Requests refused as malformed or of another version.
    pub refused_malformed: u64,
    /// Requests of credentials not enrolled or revoked.
    pub refused_unknown_credential: u64,
    /// Requests refused by the rate limit.
    pub refused_rate_limited: u64,
    /// Requests refused because the store failed.
    pub refused_unavailable: u64,
    /// Batches issued.
    pub batches_issued: u64,
    /// Batches refused by the quota.
    pub batches_quota: u64,
    /// Batches for a key not issued now.
    pub batches_unknown_key: u64,
    /// Batches that did not decode.
    pub batches_invalid: u64,
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The issuer: store, keys, clock and configuration.
pub struct Issuer {
    store: Store,
    keys: Keys,
    clock: Arc<dyn Clock>,
    config: IssuerConfig,
    rates: Mutex<HashMap<CredentialId, RateRecord>>,
    stripes: Vec<Mutex<()>>,
    maintained: Mutex<Option<Day>>,
    counters: Counters,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer")
            .field("store", &self.store)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Issuer {
    /// Opens an initialised state directory: loads the seed (refusing one others may read),
    /// opens the store (refusing another format or another seed's store) and prunes old
    /// counts.
    pub fn open(
        state: &StateDir,
        clock: Arc<dyn Clock>,
        config: IssuerConfig,
    ) -> Result<Self, IssuerError> {
        let db = state.db();
        if !db.join("CURRENT").exists() {
            return Err(IssuerError::NotInitialised(state.path().to_owned()));
        }
        let seed = MasterSeed::load(&state.seed())?;
        let store = Store::open(&db, Some(seed.id()))?;
        let issuer = Issuer {
            store,
            keys: Keys::new(seed, config.publish),
            clock,
            config,
            rates: Mutex::new(HashMap::new()),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            maintained: Mutex::new(None),
            counters: Counters::default(),
        };
        issuer.maintain(issuer.clock.today())?;
        Ok(issuer)
    }

    /// The store (admin commands while serving, tests).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The configuration.
    pub fn config(&self) -> &IssuerConfig {
        &self.config
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The key set published today.
    pub fn published(&self) -> Result<Arc<Published>, IssuerError> {
        self.keys.published(self.clock.today())
    }

    /// Counters since start.
    pub fn stats(&self) -> IssuerStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        IssuerStats {
            key_set_requests: get(&c.key_set_requests),
            issue_requests: get(&c.issue_requests),
            tokens_issued: get(&c.tokens_issued),
            refused_malformed: get(&c.refused_malformed),
            refused_unknown_credential: get(&c.refused_unknown_credential),
            refused_rate_limited: get(&c.refused_rate_limited),
            refused_unavailable: get(&c.refused_unavailable),
            batches_issued: get(&c.batches_issued),
            batches_quota: get(&c.batches_quota),
            batches_unknown_key: get(&c.batches_unknown_key),
            batches_invalid: get(&c.batches_invalid),
        }
    }

    /// Answers one request body with one answer body. Blocking (scalar multiplications, a
    /// synced write): call it off the async threads. Never panics on any input.
    pub fn handle(&self, request: &[u8]) -> Vec<u8> {
        self.answer(request).encode()
    }

    /// Answers one request body.
    pub fn answer(&self, request: &[u8]) -> IssuerAnswer {
        let request = match IssuerRequest::decode(request) {
            Ok(request) => request,
            Err(e) => {
                bump(&self.counters.refused_malformed, 1);
                debug!(error = %e, "malformed issuer request");
                return IssuerAnswer::Refused(match e {
                    ProtocolError::UnsupportedVersion(_) => Refusal::UnsupportedVersion,
                    _ => Refusal::Malformed,
                });
            }
        };
        let today = self.clock.today();
        let result = match request {
            IssuerRequest::KeySet => {
                bump(&self.counters.key_set_requests, 1);
                self.keys
                    .published(today)
                    .map(|published| IssuerAnswer::KeySet(published.encoded.clone()))
            }
            IssuerRequest::Issue {
                credential,
                batches,
            } => {
                bump(&self.counters.issue_requests, 1);
                self.issue(&credential, &batches, today)
            }
        };
        result.unwrap_or_else(|e| {
            bump(&self.counters.refused_unavailable, 1);
            warn!(error = %e, "issuer request failed; answered unavailable");
            IssuerAnswer::Refused(Refusal::Unavailable)
        })
    }

    /// Prunes counts of old epochs once per day.
    fn maintain(&self, today: Day) -> Result<(), IssuerError> {
        let mut maintained = lock(&self.maintained);
        if *maintained == Some(today) {
            return Ok(());
        }
        let floor = Day(today.0.saturating_sub(self.config.keep_days));
        if self.store.prune_before(floor)? {
            debug!(floor = floor.0, "pruned issued counts of older epochs");
        }
        *maintained = Some(today);
        Ok(())
    }

    fn stripe(&self, id: &CredentialId) -> MutexGuard<'_, ()> {
        let at = usize::from(id.0[0]) % self.stripes.len();
        lock(&self.stripes[at])
    }

    /// Takes one request from the credential's bucket; `None` when it is empty.
    fn take_rate(&self, id: &CredentialId, now: u64) -> Result<Option<RateRecord>, IssuerError> {
        // Levels in 3600ths of a request: N requests an hour refill N units a second.
        let per_hour = u64::from(self.config.requests_per_hour);
        let capacity = per_hour.saturating_mul(RATE_UNITS);
        let refilled = |record: &RateRecord| -> u64 {
            let refill = now.saturating_sub(record.at).saturating_mul(per_hour);
            capacity.min(record.level.saturating_add(refill))
        };
        let mut rates = lock(&self.rates);
        let record = match rates.get(id) {
            Some(record) => *record,
            None => self.store.rate(id)?.unwrap_or(RateRecord {
                level: capacity,
                at: now,
            }),
        };
        let level = refilled(&record);
        let (taken, level) = match level.checked_sub(RATE_UNITS) {
            Some(left) => (true, left),
            None => (false, level),
        };
        let record = RateRecord {
            level,
            at: now.max(record.at),
        };
        rates.insert(*id, record);
        if rates.len() > MAX_RATE_ENTRIES {
            rates.retain(|_, record| refilled(record) < capacity);
        }
        Ok(taken.then_some(record))
    }

    fn issue(
        &self,
        credential: &Credential,
        batches: &[Vec<u8>],
        today: Day,
    ) -> Result<IssuerAnswer, IssuerError> {
        self.maintain(today)?;
        let id = CredentialId::of(credential);
        match self.store.credential(&id)? {
            Some(record) if record.revoked.is_none() => {}
            _ => {
                bump(&self.counters.refused_unknown_credential, 1);
                return Ok(IssuerAnswer::Refused(Refusal::UnknownCredential));
            }
        }
        let _serial = self.stripe(&id);
        let Some(rate) = self.take_rate(&id, self.clock.now())? else {
            bump(&self.counters.refused_rate_limited, 1);
            return Ok(IssuerAnswer::Refused(Refusal::RateLimited));
        };
        let published = self.keys.published(today)?;
        let request = RequestTerms {
            id: &id,
            published: &published,
            today,
            floor: self.store.prune_floor()?,
            quota: self.config.tokens_per_epoch,
        };
        let mut issuance = Issuance {
            outcomes: Vec::with_capacity(batches.len()),
            ..Issuance::default()
        };
        let mut rng = rand::rng();
        for bytes in batches {
            let outcome = self.issue_batch(&request, bytes, &mut issuance, &mut rng)?;
            issuance.outcomes.push(outcome);
        }
        self.record(&id, &issuance.totals, rate)?;
        self.count(&issuance);
        Ok(IssuerAnswer::Issued(issuance.outcomes))
    }

    /// One batch's outcome: refused as invalid, for a key not issued now, or over the quota,
    /// else issued (its tokens added to `issuance`'s totals).
    fn issue_batch(
        &self,
        terms: &RequestTerms<'_>,
        bytes: &[u8],
        issuance: &mut Issuance,
        rng: &mut ThreadRng,
    ) -> Result<BatchOutcome, IssuerError> {
        let (request, scope) = match terms.admit(bytes) {
            Ok(admitted) => admitted,
            Err(refused) => return Ok(refused),
        };
        let epoch = request.epoch();
        let already = match issuance.totals.get(&(epoch, scope)) {
            Some(total) => *total,
            None => self.store.issued(epoch, scope, terms.id)?,
        };
        // A batch holds at most MAX_BATCH (64) tokens.
        let count = u16::try_from(request.count()).unwrap_or(u16::MAX);
        if already.saturating_add(count) > terms.quota {
            return Ok(BatchOutcome::Quota {
                remaining: terms.quota.saturating_sub(already),
            });
        }
        let issued = terms
            .published
            .key(epoch, scope)
            .ok_or(TokenError::UnknownKey {
                epoch,
                key_id: request.key_id(),
            })
            .and_then(|key| key.issue(&request, rng));
        Ok(match issued {
            Ok(response) => {
                issuance.totals.insert((epoch, scope), already + count);
                issuance.added += u64::from(count);
                BatchOutcome::Issued(response.encode())
            }
            Err(e) => {
                debug!(error = %e, "a decoded batch could not be issued");
                BatchOutcome::Invalid
            }
        })
    }

    /// Writes the new counts and the rate bucket in one synced write, durable before a single
    /// token leaves; nothing when nothing was issued.
    fn record(
        &self,
        id: &CredentialId,
        totals: &BTreeMap<(TokenEpoch, TokenScope), u16>,
        rate: RateRecord,
    ) -> Result<(), IssuerError> {
        if totals.is_empty() {
            return Ok(());
        }
        let mut set = WriteSet::new();
        for (&(epoch, scope), total) in totals {
            set.put(
                Table::Issued,
                issued_key(epoch, scope, id),
                total.to_be_bytes(),
            );
        }
        set.put(Table::Rate, id.0, rate.encode());
        // Durable before a single token leaves.
        self.store.write(set)
    }

    /// Counts a request's batches by outcome, and the tokens it issued.
    fn count(&self, issuance: &Issuance) {
        let c = &self.counters;
        for outcome in &issuance.outcomes {
            match outcome {
                BatchOutcome::Issued(_) => bump(&c.batches_issued, 1),
                BatchOutcome::Quota { .. } => bump(&c.batches_quota, 1),
                BatchOutcome::UnknownKey => bump(&c.batches_unknown_key, 1),
                BatchOutcome::Invalid => bump(&c.batches_invalid, 1),
            }
        }
        bump(&c.tokens_issued, issuance.added);
    }
}

/// What each batch of one issue request is checked against: the credential, the key set
/// published today, the prune floor and the quota per (epoch, scope).
struct RequestTerms<'a> {
    id: &'a CredentialId,
    published: &'a Published,
    today: Day,
    floor: Day,
    quota: u16,
}

impl RequestTerms<'_> {
    /// The batch decoded, with the scope of its key, if it is for a key issued now: else its
    /// outcome (`Invalid`, or `UnknownKey` for a key the set does not hold or an epoch not
    /// issued now).
    fn admit(&self, bytes: &[u8]) -> Result<(BlindedRequest, TokenScope), BatchOutcome> {
        let request = match BlindedRequest::decode(bytes, &self.published.set) {
            Ok(request) => request,
            Err(TokenError::UnknownKey { .. }) => return Err(BatchOutcome::UnknownKey),
            Err(_) => return Err(BatchOutcome::Invalid),
        };
        let epoch = request.epoch();
        let issuable = epoch.0 >= self.today.0
            && epoch.0 <= self.today.0.saturating_add(ISSUE_AHEAD)
            && epoch.0 >= self.floor.0;
        let entry = self.published.set.find(epoch, request.key_id()).ok();
        let (Some(entry), true) = (entry, issuable) else {
            return Err(BatchOutcome::UnknownKey);
        };
        let scope = entry.scope();
        Ok((request, scope))
    }
}

/// What one issue request's batches came to: each batch's outcome, the counts after it per
/// (epoch, scope) it issued under, and the tokens issued.
#[derive(Default)]
struct Issuance {
    outcomes: Vec<BatchOutcome>,
    totals: BTreeMap<(TokenEpoch, TokenScope), u16>,
    added: u64,
}
