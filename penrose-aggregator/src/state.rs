//! The server's aggregation state and the one operation that changes it: applying a batch of
//! validated reports as a single durable write.
//!
//! Crash consistency rests on one rule: a report's deduplication record (Seen), its SST/EST
//! rows, the ASH rows it changed and the new cursor go into the *same* write batch, synced
//! before the batch's acks are sent. So after a crash a report is either fully counted and
//! remembered as seen, or absent and not acked; a retry of an acked report finds its Seen
//! record and is answered as a duplicate.
//!
//! **Seen expires by day.** Seen rows are keyed by the report's day first ([`seen`]). A
//! report may only be counted while its day is within a day of the server's, so once the
//! server's day has moved on, the rows of days that can no longer be accepted are deleted
//! (one range deletion) and the *floor*, the oldest day still remembered, is raised in the
//! same write. No report of a day below the floor is ever counted, whatever the clock says
//! later, so a retry of an expired report can only be refused (`DayOutOfRange`), never
//! counted twice: every report that could still be counted has its Seen rows.
//!
//! **Admission tokens are spent in the same write.** A report admitted by a token
//! (`crate::admission`) records the token's spent id, under its epoch (the report's day), in
//! the Spent table of the same write batch as its Seen rows and sums. A token already recorded
//! for another report, in the store, in a batch still syncing or earlier in the same batch,
//! refuses the report (`TokenSpent`) and changes nothing; recorded for this very report id it
//! is a retry, answered `Duplicate`. Spent rows expire with their day, in the same range
//! deletion and behind the same floor as Seen rows: a token of a day below the floor can never
//! be accepted again, since its report's day cannot.
//!
//! Applying a batch has two halves, so that the writer can aggregate one batch while the
//! previous one syncs: [`State::prepare`] deduplicates, classifies and sums in memory and
//! builds the write; [`Prepared::commit`] makes it durable. Prepared batches must be committed
//! in the order they were prepared, each only after the one before it succeeded (a batch's
//! ASH rows hold the sums of every earlier batch), and a batch's acks, duplicates included,
//! go out only after its commit: a duplicate of a report whose batch is still syncing is only
//! as durable as that batch. Reports of prepared but not yet durable batches are remembered in
//! memory, so that a retry arriving meanwhile is still recognised as a duplicate.
//!
//! The in-memory tables and sums are updated before the write. If a write fails they are
//! ahead of the store, so the caller must stop using this state and commit nothing after it
//! (the server stops; the next start rebuilds from the store), the way a database stops on a
//! failed WAL sync.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use penrose_core::bundle::{Cursor, EpochId, EpochKind, InstanceId};
use penrose_core::fingerprint::{Fingerprint, FingerprintParams, SnippetHash};
use penrose_core::paillier::{PackedCiphertexts, PaillierError, PublicKey};
use penrose_core::release::{DAY_TOLERANCE, day_acceptable};
use penrose_core::wire::{Day, ReportId, ThrottleHint};
use rand::RngCore;
use thiserror::Error;

use crate::admission::SpentToken;
use crate::aggregate::{ASH_KEY_BYTES, AggregateError, AshRecord, SumKey, Sums};
use crate::design_keys::{self, DesignKeyError, DesignKeys, KeySettings, KeySlot};
use crate::epochs::{self, EpochPolicy, EpochRecord, Epochs};
use crate::evidence;
use crate::store::{Store, StoreError, Table, WriteSet};
use crate::tables::{
    ClassMerge, DEFAULT_NEW_CLASSES_PER_HOUR, DEFAULT_SNIPPET_CACHE, MERGE_PREFIX, NewClassBudget,
    RecordError, Tables, decode_merge, merge_record,
};
use crate::validate::{CiphertextDigest, ValidReport};

/// Keys of the meta table.
pub mod meta {
    /// The cursor: how many batches with accepted reports were committed (u64).
    pub const CURSOR: &[u8] = b"cursor";
    /// Format 7 and earlier: the one Paillier key id the sums were under ([u8; 32]). Format
    /// 8 keeps every key in a slot (`crate::design_keys::meta`); the migration moves it there.
    pub const KEY_ID: &[u8] = b"key_id";
    /// Format 7 and earlier: that key itself.
    pub const PUBLIC_KEY: &[u8] = b"public_key";
    /// The throttle hint in permille (u16).
    pub const THROTTLE: &[u8] = b"throttle";
    /// Reports accepted over the life of the store (u64).
    pub const ACCEPTED: &[u8] = b"accepted";
    /// How the records are laid out (u32, [`STORE_FORMAT`](super::STORE_FORMAT)); absent in
    /// stores written before it existed, which are format 1.
    pub const FORMAT: &[u8] = crate::store::FORMAT_KEY;
    /// The store's random instance id ([u8; 16]): the name of its bundle chain. A backup copy
    /// is given a new one (a restored store is a new chain).
    pub const INSTANCE: &[u8] = b"chain/instance";
    /// The instance a backup copy was taken from ([u8; 16]; absent for an original store).
    pub const PARENT: &[u8] = b"chain/parent";
    /// The Seen floor (u32, a day): Seen rows of earlier days are deleted, and no report of an
    /// earlier day is counted (module docs). Absent: nothing expired yet.
    pub const SEEN_FLOOR: &[u8] = b"seen/floor";
}

/// Keys of the Seen table: the report's day (u32be), a kind byte, then the report id or the
/// ciphertext digest. The day comes first so that whole days are deleted with one range
/// deletion ([`super::State`], module docs).
pub mod seen {
    use penrose_core::wire::{Day, ReportId};

    use crate::validate::CiphertextDigest;

    /// Kind byte of a report id row.
    pub const ID: u8 = 0;
    /// Kind byte of a ciphertext digest row.
    pub const DIGEST: u8 = 1;

    /// The key recording that report `id` of `day` was counted.
    pub fn id_key(day: Day, id: &ReportId) -> Vec<u8> {
        let mut key = Vec::with_capacity(4 + 1 + 16);
        key.extend_from_slice(&day.0.to_be_bytes());
        key.push(ID);
        key.extend_from_slice(&id.0);
        key
    }

    /// The key recording that a report of `day` with these ciphertexts was counted.
    pub fn digest_key(day: Day, digest: &CiphertextDigest) -> Vec<u8> {
        let mut key = Vec::with_capacity(4 + 1 + 32);
        key.extend_from_slice(&day.0.to_be_bytes());
        key.push(DIGEST);
        key.extend_from_slice(&digest.0);
        key
    }

    /// The first key of `day`: every key of earlier days sorts before it.
    pub fn day_start(day: Day) -> Vec<u8> {
        day.0.to_be_bytes().to_vec()
    }
}

/// Keys of the Spent table: the token's epoch (u32be, the report's day) then its spent id
/// ([u8; 32]); the value is the report id ([u8; 16]) it admitted. The epoch comes first so
/// that whole days expire with one range deletion, as Seen rows do.
pub mod spent {
    use penrose_core::wire::{Day, ReportId};

    use crate::admission::SpentToken;

    /// The key recording that `token` was spent.
    pub fn key(token: &SpentToken) -> [u8; 36] {
        let mut key = [0u8; 36];
        key[..4].copy_from_slice(&token.epoch.0.to_be_bytes());
        key[4..].copy_from_slice(&token.id.0);
        key
    }

    /// The value: the report the token admitted.
    pub fn value(report: &ReportId) -> [u8; 16] {
        report.0
    }

    /// The report id a stored value names (`None`: damaged).
    pub fn decode_value(value: &[u8]) -> Option<ReportId> {
        Some(ReportId(value.try_into().ok()?))
    }

    /// The first key of `day`'s epoch: every key of earlier epochs sorts before it.
    pub fn epoch_start(day: Day) -> Vec<u8> {
        day.0.to_be_bytes().to_vec()
    }
}

/// The layout this build reads and writes. 8: sums per design key (the ASH key holds the
/// key's slot before the generation; the keys are in slot records, `crate::design_keys`), so
/// that keys roll over; a format 7 store is migrated when opened ([`migrate_7_to_8`]); 7: sums
/// per GPU architecture (the ASH key holds the
/// report's architecture after the class), EST records keep each representative's locator
/// beside its hash (class search by locator), and neither SST rows nor sums are read at start
/// (both on demand); 6: the Spent table (admission tokens) and epoch
/// records that count their reports admitted by tokens; 5: Seen keys begin with the report's
/// day (so that days expire) and the meta record `seen/floor`; 4: class merges (meta records)
/// and the cursor each exported bundle applied them as of; 3: sums per epoch (the ASH key holds
/// the epoch), epoch records, the instance id and the export chain; 2 kept one running sum per
/// (class, counter), which could be differenced, and stored accumulator states as 3 does; 1
/// stored the sums themselves. Opening a store of another format is refused rather than
/// misread.
pub const STORE_FORMAT: u32 = 8;

/// What happened to one report of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Counted now.
    Accepted,
    /// Already counted (in an earlier batch, or earlier in this one).
    Duplicate,
    /// A ciphertext is not a unit (the batch's unit check); not counted, not remembered.
    NotUnit,
    /// The report's day is no longer acceptable (the server's day turned since validation,
    /// or the day is below the Seen floor).
    DayOutOfRange,
    /// The report's snippet would found a new class and the new-class budget is spent; not
    /// counted, not remembered, nothing changed (retry later).
    NewClassLimit,
    /// The report's admission token was already spent on another report; not counted, nothing
    /// changed.
    TokenSpent,
}

/// Why the state could not be opened or a batch applied.
#[derive(Debug, Error)]
pub enum StateError {
    /// The store failed; nothing of the batch may be acknowledged.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A table record is damaged.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// A sum record is damaged or an accumulator refused.
    #[error(transparent)]
    Aggregate(#[from] AggregateError),
    /// The design keys could not be applied (a wrong key, an older list, a damaged record).
    #[error(transparent)]
    Keys(#[from] DesignKeyError),
    /// The writer thread panicked (a bug); the state it held is not trusted.
    #[error("the ingest writer panicked")]
    WriterPanicked,
    /// The writer has stopped (a failed write, or shutdown); nothing more is applied.
    #[error("the ingest writer has stopped")]
    WriterStopped,
    /// A meta value has the wrong length.
    #[error("damaged meta record {0}")]
    Meta(&'static str),
    /// A Spent row's value is not a report id.
    #[error("damaged spent-token record")]
    Spent,
    /// A key ring reload was asked of a server that admits reports without tokens.
    #[error(
        "this server admits reports without tokens (--open-admission); restart it with \
         --token-keys to admit by tokens"
    )]
    OpenAdmission,
    /// The store cuts epochs another way than the server was asked to.
    #[error(
        "this data directory cuts epochs by {stored:?}, but the server was started with {given}; \
         epochs of one store are all of one kind"
    )]
    EpochKindMismatch {
        /// The store's kind.
        stored: EpochKind,
        /// The policy given.
        given: EpochPolicy,
    },
    /// The store is not in the directory it was created in: a copy made around the product
    /// (`crate::copies`), which may not release what its parent may.
    #[error(
        "this store was created in another directory ({recorded}; this one: {found}): it is a \
         copy, and a copy may not release epochs its original also holds. Make it a new \
         instance with `penrose-aggregator adopt-copy` (its existing epochs are then never \
         released here), or point the server at the original"
    )]
    Copied {
        /// The directory the store was created in.
        recorded: crate::store::StoreHome,
        /// The one it is in now.
        found: crate::store::StoreHome,
    },
    /// The store was written by a build with another record layout.
    #[error(
        "this data directory has store format {found}, but this aggregator reads format \
         {expected}; export it with the aggregator that wrote it, then use a new data directory"
    )]
    Format {
        /// The store's format.
        found: u32,
        /// This build's.
        expected: u32,
    },
}

/// Tables, sums and counters, rebuilt from the store on open.
pub struct State {
    store: Arc<dyn Store>,
    keys: DesignKeys,
    tables: Tables,
    sums: Sums,
    epochs: Epochs,
    instance: InstanceId,
    /// The cursor and total of the last prepared batch (ahead of `durable` while it syncs).
    cursor: Cursor,
    accepted: u64,
    durable: Arc<Durable>,
    /// Accepted report ids of prepared batches, by cursor, until they are durable.
    in_flight: VecDeque<InFlight>,
    in_flight_ids: HashSet<ReportId>,
    in_flight_digests: HashSet<CiphertextDigest>,
    /// Tokens spent by accepted reports of prepared batches, until they are durable.
    in_flight_spent: HashMap<SpentToken, ReportId>,
    /// The oldest report day whose Seen rows are kept (module docs).
    seen_floor: Day,
    /// Classes that may still be founded.
    class_budget: NewClassBudget,
    /// Reports refused because they would have founded a class beyond the budget.
    class_refusals: u64,
    /// Whether each accepted report's binding and evidence token is kept for the release
    /// auditor (`crate::evidence`).
    keep_evidence: bool,
}

/// What a prepared batch accepted, remembered until it is durable (module docs).
#[derive(Debug, Default)]
struct Accepted {
    ids: Vec<ReportId>,
    digests: Vec<CiphertextDigest>,
    spent: Vec<(SpentToken, ReportId)>,
}

/// A prepared batch's [`Accepted`] under its cursor.
#[derive(Debug)]
struct InFlight {
    cursor: Cursor,
    accepted: Accepted,
}

/// What the last committed batch made durable, published by whoever commits.
#[derive(Debug, Default)]
struct Durable {
    cursor: AtomicU64,
    accepted: AtomicU64,
}

/// A batch applied to the in-memory state whose write is not yet durable (module docs).
#[must_use = "a prepared batch must be committed before its acks are sent"]
pub struct Prepared {
    outcomes: Vec<Outcome>,
    write: Option<(WriteSet, Cursor, u64)>,
    closed: Vec<EpochRecord>,
    store: Arc<dyn Store>,
    durable: Arc<Durable>,
}

impl Prepared {
    /// Makes the batch durable (one synced write; nothing to write when no report of it was
    /// accepted) and returns its outcomes, in the batch's order: only now may they be acked.
    pub fn commit(self) -> Result<Vec<Outcome>, StateError> {
        if let Some((set, cursor, accepted)) = self.write {
            self.store.write(set)?;
            self.durable.accepted.store(accepted, Ordering::Release);
            self.durable.cursor.store(cursor.0, Ordering::Release);
        }
        Ok(self.outcomes)
    }

    /// The epochs this batch closes, final once it is committed.
    pub fn closed(&self) -> &[EpochRecord] {
        &self.closed
    }

    /// Reports of the batch that will be counted once it is committed.
    pub fn accepted(&self) -> usize {
        self.outcomes
            .iter()
            .filter(|o| **o == Outcome::Accepted)
            .count()
    }
}

/// What the store's Seen table holds of a batch ([`State::prepare`]): per report, its id
/// under its day, then (after every report's id) `per_report` flags per report, its digest
/// under each day still remembered.
struct Seen {
    flags: Vec<bool>,
    reports: usize,
    per_report: usize,
}

impl Seen {
    /// Whether report `i`'s digest is in the store under any day.
    fn digest(&self, i: usize) -> bool {
        let (_, digests) = self.flags.split_at(self.reports);
        digests
            .get(i * self.per_report..(i + 1) * self.per_report)
            .is_some_and(|days| days.iter().any(|&s| s))
    }
}

/// The reports of the batch being prepared counted so far: to find copies within the batch,
/// and what its write records.
struct Counted {
    in_batch: HashSet<ReportId>,
    in_batch_digests: HashSet<CiphertextDigest>,
    /// Tokens spent in the batch, and by which report.
    spent: HashMap<SpentToken, ReportId>,
    /// Counted report ids and digests, under their report's day.
    ids: Vec<(Day, ReportId)>,
    digests: Vec<(Day, CiphertextDigest)>,
    accepted_spent: Vec<(SpentToken, ReportId)>,
}

impl Counted {
    fn with_capacity(n: usize) -> Self {
        Self {
            in_batch: HashSet::with_capacity(n),
            in_batch_digests: HashSet::with_capacity(n),
            spent: HashMap::new(),
            ids: Vec::with_capacity(n),
            digests: Vec::with_capacity(n),
            accepted_spent: Vec::new(),
        }
    }

    /// What the batch accepted, to remember until it is durable.
    fn into_accepted(self) -> Accepted {
        Accepted {
            ids: self.ids.into_iter().map(|(_, id)| id).collect(),
            digests: self.digests.into_iter().map(|(_, d)| d).collect(),
            spent: self.accepted_spent,
        }
    }
}

impl State {
    /// Rebuilds the state from `store` (empty for a new store) for the design keys `keys` (one
    /// public key, or a signed list: `crate::design_keys`). Epochs are cut by `policy` when
    /// given (its kind must be the store's; a count may change), else as the store says (a
    /// new store: by day). A format 7 store is migrated first.
    pub fn open(
        store: Arc<dyn Store>,
        keys: impl Into<KeySettings>,
        params: FingerprintParams,
        bound: u64,
        policy: Option<EpochPolicy>,
    ) -> Result<Self, StateError> {
        let settings = keys.into();
        initialise_or_check(store.as_ref(), policy)?;
        let mut set = WriteSet::new();
        let keys = DesignKeys::load(store.as_ref(), settings, &mut set)?;
        if !set.is_empty() {
            store.write(set)?;
        }
        let meta = StoredMeta::read(store.as_ref())?;
        let instance = meta.instance.ok_or(StateError::Meta("chain/instance"))?;
        let policy = meta.policy(store.as_ref(), policy)?;
        let epochs = Epochs::load(
            policy,
            meta.closed_through,
            meta.current,
            meta.epoch_records,
        );
        let tables = Tables::load(params, DEFAULT_SNIPPET_CACHE, meta.est, meta.merges)?;
        let sums = Sums::new(keys.by_slot(), bound)?;
        let (cursor, accepted) = (meta.cursor, meta.accepted);
        Ok(Self {
            store,
            keys,
            tables,
            sums,
            epochs,
            instance,
            cursor,
            accepted,
            durable: Arc::new(Durable {
                cursor: AtomicU64::new(cursor.0),
                accepted: AtomicU64::new(accepted),
            }),
            in_flight: VecDeque::new(),
            in_flight_ids: HashSet::new(),
            in_flight_digests: HashSet::new(),
            in_flight_spent: HashMap::new(),
            seen_floor: meta.seen_floor,
            class_budget: NewClassBudget::new(DEFAULT_NEW_CLASSES_PER_HOUR, Instant::now()),
            class_refusals: 0,
            keep_evidence: false,
        })
    }

    /// Keeps, from the next batch on, each accepted report's binding and evidence token
    /// beside its sum, in the report's own write (`crate::evidence`).
    pub fn set_keep_evidence(&mut self, keep: bool) {
        self.keep_evidence = keep;
    }

    /// Sets how many classes may be founded per hour (a full budget from now on; default
    /// [`DEFAULT_NEW_CLASSES_PER_HOUR`]).
    pub fn set_new_classes_per_hour(&mut self, per_hour: std::num::NonZeroU32) {
        self.class_budget = NewClassBudget::new(per_hour, Instant::now());
    }

    /// The new-class budget.
    pub fn new_class_budget(&mut self) -> &mut NewClassBudget {
        &mut self.class_budget
    }

    /// Reports refused since start because they would have founded a class beyond the budget.
    pub fn class_refusals(&self) -> u64 {
        self.class_refusals
    }

    /// The oldest report day whose Seen rows are kept; no report of an earlier day is counted.
    pub fn seen_floor(&self) -> Day {
        self.seen_floor
    }

    /// Deduplicates, classifies and sums a batch, and makes it durable in one synced write:
    /// [`prepare`](Self::prepare) then [`Prepared::commit`]. Outcomes are in the batch's
    /// order. On an error nothing may be acknowledged and this state must be dropped (module
    /// docs).
    pub fn apply(&mut self, batch: &[ValidReport], today: Day) -> Result<Vec<Outcome>, StateError> {
        self.prepare(batch, today)?.commit()
    }

    /// The in-memory half of [`apply`](Self::apply): epochs due by `today` are closed and Seen
    /// and Spent rows of days no longer acceptable deleted, then the unit check of the batch's
    /// ciphertexts (one gcd), the admission tokens (one spent elsewhere refuses its report),
    /// deduplication by report id and by ciphertext digest against the store and the batches
    /// still syncing, the day check (and the Seen floor), classes (a report that would found
    /// one beyond the new-class budget is refused and changes nothing), epochs, one
    /// multiplication per ciphertext, and the write that records it all; an epoch the batch
    /// fills (count policy) is closed with it. On an error nothing of this batch may be
    /// committed or acknowledged and this state must be dropped; batches prepared before it may
    /// still be committed.
    pub fn prepare(&mut self, batch: &[ValidReport], today: Day) -> Result<Prepared, StateError> {
        self.forget_durable();
        self.sums
            .evict(Cursor(self.durable.cursor.load(Ordering::Acquire)));
        let now = Instant::now();
        let mut set = WriteSet::new();
        let mut closed = self.close_epochs(&self.epochs.due(today));
        self.expire_seen(today, &mut set);
        let units = self.check_units(batch);
        let seen = self.seen_in_store(batch, today)?;
        let spent_by = self.spent_in_store(batch)?;
        self.load_snippets(batch)?;
        let next = Cursor(self.cursor.0 + 1);
        let mut counted = Counted::with_capacity(batch.len());
        let mut outcomes = Vec::with_capacity(batch.len());
        let (seen_ids, _) = seen.flags.split_at(batch.len());
        for (i, ((valid, &seen_id), unit)) in batch.iter().zip(seen_ids).zip(units).enumerate() {
            let Ok(ciphertexts) = unit else {
                outcomes.push(Outcome::NotUnit);
                continue;
            };
            let spent_for = spent_by.get(i).and_then(Option::as_ref);
            let seen_digest = seen.digest(i);
            let outcome =
                match self.refusal(valid, spent_for, seen_id || seen_digest, &counted, today) {
                    Some(refused) => refused,
                    None => self.count(valid, ciphertexts, today, now, &mut counted, &mut set)?,
                };
            outcomes.push(outcome);
        }
        if !counted.ids.is_empty() {
            self.write_accepted(&mut counted, &mut set, next);
            // The count policy closes the epoch this batch filled, with the batch.
            closed.extend(self.close_epochs(&self.epochs.due(today)));
        }
        Ok(self.finish(set, outcomes, counted.into_accepted(), closed, next))
    }

    /// Whether the store's Seen table holds each report of `batch`: its id under its own day
    /// (a retry carries the same day), then its digest under every day still remembered (a
    /// copy may claim another day), in one lookup for the batch.
    fn seen_in_store(&self, batch: &[ValidReport], today: Day) -> Result<Seen, StateError> {
        let digest_days: Vec<Day> = (self.seen_floor.0..=today.0.saturating_add(DAY_TOLERANCE))
            .map(Day)
            .collect();
        let mut keys: Vec<Vec<u8>> = Vec::with_capacity(batch.len() * (1 + digest_days.len()));
        keys.extend(
            batch
                .iter()
                .map(|r| seen::id_key(r.report.day, &r.report.report_id)),
        );
        for r in batch {
            keys.extend(digest_days.iter().map(|&d| seen::digest_key(d, &r.digest)));
        }
        let key_refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        Ok(Seen {
            flags: self.store.contains_many(Table::Seen, &key_refs)?,
            reports: batch.len(),
            per_report: digest_days.len().max(1),
        })
    }

    /// Why a report is not counted, checked before its class is looked up: its token spent for
    /// another report (or for this one: a retry), a copy (`seen` in the store, in a batch
    /// still syncing, or earlier in this batch), or a day out of range. `None`: it may count.
    fn refusal(
        &self,
        valid: &ValidReport,
        spent_for: Option<&ReportId>,
        seen: bool,
        counted: &Counted,
        today: Day,
    ) -> Option<Outcome> {
        let report = &valid.report;
        // A token recorded for another report refuses this one; recorded for this report
        // id, this is a retry of a counted report.
        if let Some(token) = &valid.token {
            let holder = counted
                .spent
                .get(token)
                .or_else(|| self.in_flight_spent.get(token))
                .or(spent_for);
            match holder {
                Some(id) if *id == report.report_id => return Some(Outcome::Duplicate),
                Some(_) => return Some(Outcome::TokenSpent),
                None => {}
            }
        }
        if seen
            || self.in_flight_ids.contains(&report.report_id)
            || self.in_flight_digests.contains(&valid.digest)
            || counted.in_batch.contains(&report.report_id)
            || counted.in_batch_digests.contains(&valid.digest)
        {
            return Some(Outcome::Duplicate);
        }
        if !day_acceptable(report.day, today) || report.day < self.seen_floor {
            return Some(Outcome::DayOutOfRange);
        }
        None
    }

    /// Places a report that may count in its class (refused when it would found one beyond
    /// the new-class budget) and adds its ciphertexts into its sum, remembering it in
    /// `counted` (and its evidence in `set` when kept).
    fn count(
        &mut self,
        valid: &ValidReport,
        ciphertexts: &PackedCiphertexts,
        today: Day,
        now: Instant,
        counted: &mut Counted,
        set: &mut WriteSet,
    ) -> Result<Outcome, StateError> {
        let report = &valid.report;
        let budget = &mut self.class_budget;
        let fingerprint = Fingerprint {
            hash: report.snippet,
            locator: report.locator,
        };
        let Some(placement) = self
            .tables
            .record_if_founding_allowed(fingerprint, today, || budget.try_take(now))
        else {
            self.class_refusals += 1;
            return Ok(Outcome::NewClassLimit);
        };
        // Only a report that is counted is remembered in this batch: a copy of a refused
        // one is judged on its own, not answered Duplicate.
        counted.in_batch.insert(report.report_id);
        counted.in_batch_digests.insert(valid.digest);
        if let Some(token) = valid.token {
            counted.spent.insert(token, report.report_id);
            counted.accepted_spent.push((token, report.report_id));
        }
        let epoch = self.epochs.admit(report.day, valid.token.is_some());
        let key = SumKey {
            class: placement.class,
            arch: report.arch,
            catalogue: report.catalogue,
            counter: report.counter,
            epoch,
            key: valid.key,
        };
        let generation = self.sums.absorb(
            self.store.as_ref(),
            key,
            ciphertexts,
            u64::from(report.samples.0),
        )?;
        if self.keep_evidence {
            set.put(
                Table::Evidence,
                evidence::row_key(key, generation, &report.report_id),
                evidence::row_value(report),
            );
        }
        counted.ids.push((report.day, report.report_id));
        counted.digests.push((report.day, valid.digest));
        Ok(Outcome::Accepted)
    }

    /// Adds to `set` what a batch that counted reports records: their Seen and Spent rows,
    /// the snippets and classes it changed, its merges and its sums.
    fn write_accepted(&mut self, counted: &mut Counted, set: &mut WriteSet, next: Cursor) {
        // In key order: RocksDB's memtable insert starts from where the previous key went,
        // which saves most of each skip-list search when the keys come sorted.
        counted.ids.sort_unstable();
        counted.digests.sort_unstable();
        counted.accepted_spent.sort_unstable();
        for (day, id) in &counted.ids {
            set.put(
                Table::Seen,
                seen::id_key(*day, id),
                next.0.to_be_bytes().to_vec(),
            );
        }
        for (day, digest) in &counted.digests {
            set.put(
                Table::Seen,
                seen::digest_key(*day, digest),
                next.0.to_be_bytes().to_vec(),
            );
        }
        for (token, id) in &counted.accepted_spent {
            set.put(
                Table::Spent,
                spent::key(token).to_vec(),
                spent::value(id).to_vec(),
            );
        }
        let (snippets, classes) = self.tables.take_dirty();
        for (k, v) in snippets {
            set.put(Table::Sst, k, v);
        }
        for (k, v) in classes {
            set.put(Table::Est, k, v);
        }
        for merge in self.tables.take_merges() {
            let (k, v) = merge_record(&merge, next);
            set.put(Table::Meta, k, v);
        }
        self.write_sums(set, next);
    }

    /// Reads the SST rows of the batch's snippets that are in the store but not in memory.
    fn load_snippets(&mut self, batch: &[ValidReport]) -> Result<(), StateError> {
        let mut missing: Vec<SnippetHash> = batch
            .iter()
            .map(|r| r.report.snippet)
            .filter(|hash| !self.tables.knows(hash))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        missing.sort_unstable();
        missing.dedup();
        let keys: Vec<&[u8]> = missing.iter().map(|h| h.0.as_slice()).collect();
        let rows = self.store.get_many(Table::Sst, &keys)?;
        for (hash, row) in missing.iter().zip(rows) {
            if let Some(value) = row {
                self.tables.load_snippet(*hash, &value)?;
            }
        }
        Ok(())
    }

    /// Per report of `batch`, the report id its token is recorded as spent for in the store
    /// (`None`: no token, or not spent), in one lookup for the batch.
    fn spent_in_store(&self, batch: &[ValidReport]) -> Result<Vec<Option<ReportId>>, StateError> {
        let tokened: Vec<(usize, [u8; 36])> = batch
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.token.as_ref().map(|t| (i, spent::key(t))))
            .collect();
        let mut out = vec![None; batch.len()];
        if tokened.is_empty() {
            return Ok(out);
        }
        let keys: Vec<&[u8]> = tokened.iter().map(|(_, k)| k.as_slice()).collect();
        let values = self.store.get_many(Table::Spent, &keys)?;
        for ((i, _), value) in tokened.iter().zip(values) {
            if let Some(value) = value {
                let id = spent::decode_value(&value).ok_or(StateError::Spent)?;
                if let Some(slot) = out.get_mut(*i) {
                    *slot = Some(id);
                }
            }
        }
        Ok(out)
    }

    /// Raises the Seen floor to the oldest day a report may still have (`today` less the
    /// tolerance) when the day has moved on, deleting the Seen and Spent rows of the days below
    /// it in the same write (module docs). The floor never goes down, whatever the clock does.
    fn expire_seen(&mut self, today: Day, set: &mut WriteSet) {
        let floor = Day(today.0.saturating_sub(DAY_TOLERANCE));
        if floor <= self.seen_floor {
            return;
        }
        set.delete_range(Table::Seen, seen::day_start(Day(0)), seen::day_start(floor));
        set.delete_range(
            Table::Spent,
            spent::epoch_start(Day(0)),
            spent::epoch_start(floor),
        );
        set.put(
            Table::Meta,
            meta::SEEN_FLOOR,
            floor.0.to_be_bytes().to_vec(),
        );
        self.seen_floor = floor;
    }

    /// Closes open epochs now, in order with the batches: those due by `today`, or with
    /// `all`, every open epoch that holds reports (an operator's close); and the Seen and Spent
    /// rows of days that can no longer be accepted are deleted. The returned batch holds only
    /// that write; commit it like any other.
    pub fn prepare_close(&mut self, today: Day, all: bool) -> Prepared {
        self.forget_durable();
        let ids = if all {
            self.epochs.all_open()
        } else {
            self.epochs.due(today)
        };
        let closed = self.close_epochs(&ids);
        let mut set = WriteSet::new();
        self.expire_seen(today, &mut set);
        let next = Cursor(self.cursor.0 + 1);
        self.finish(set, Vec::new(), Accepted::default(), closed, next)
    }

    /// Forgets the in-flight ids of batches committed since the last call: they are visible in
    /// the store now.
    fn forget_durable(&mut self) {
        let durable = self.durable.cursor.load(Ordering::Acquire);
        while self
            .in_flight
            .front()
            .is_some_and(|batch| batch.cursor.0 <= durable)
        {
            if let Some(InFlight { accepted, .. }) = self.in_flight.pop_front() {
                for id in accepted.ids {
                    self.in_flight_ids.remove(&id);
                }
                for digest in accepted.digests {
                    self.in_flight_digests.remove(&digest);
                }
                for (token, _) in accepted.spent {
                    self.in_flight_spent.remove(&token);
                }
            }
        }
    }

    /// Closes `ids`: their sums' last states are written by the caller's batch before the
    /// accumulators are dropped from memory.
    fn close_epochs(&mut self, ids: &[EpochId]) -> Vec<EpochRecord> {
        if ids.is_empty() {
            return Vec::new();
        }
        let closed = self.epochs.close(ids);
        for record in &closed {
            self.sums.close(record.id);
        }
        closed
    }

    fn write_sums(&mut self, set: &mut WriteSet, next: Cursor) {
        for record in self.sums.take_dirty(next) {
            set.put(
                Table::Ash,
                AshRecord::store_key(record.key, record.generation).to_vec(),
                record.store_value(),
            );
        }
    }

    fn finish(
        &mut self,
        mut set: WriteSet,
        outcomes: Vec<Outcome>,
        accepted: Accepted,
        closed: Vec<EpochRecord>,
        next: Cursor,
    ) -> Prepared {
        let count = accepted.ids.len() as u64;
        self.epochs.write_dirty(&mut set);
        let mut prepared = Prepared {
            outcomes,
            write: None,
            closed,
            store: Arc::clone(&self.store),
            durable: Arc::clone(&self.durable),
        };
        if set.is_empty() {
            return prepared;
        }
        let total = self.accepted + count;
        set.put(Table::Meta, meta::CURSOR, next.0.to_be_bytes().to_vec());
        set.put(Table::Meta, meta::ACCEPTED, total.to_be_bytes().to_vec());
        self.cursor = next;
        self.accepted = total;
        self.in_flight_ids.extend(accepted.ids.iter().copied());
        self.in_flight_digests
            .extend(accepted.digests.iter().copied());
        self.in_flight_spent.extend(accepted.spent.iter().copied());
        self.in_flight.push_back(InFlight {
            cursor: next,
            accepted,
        });
        prepared.write = Some((set, next, total));
        prepared
    }

    /// The class a snippet counts in now, from memory or else from its stored SST row; `None`
    /// for a snippet never placed.
    pub fn class_of(
        &self,
        snippet: &SnippetHash,
    ) -> Result<Option<crate::tables::ClassId>, StateError> {
        Ok(self
            .snippet_row(snippet)?
            .map(|row| self.tables.root(row.class)))
    }

    /// A snippet's SST row, from memory or else from the store; `None` for a snippet never
    /// placed. Its class is the one it was placed in (see [`State::class_of`] for where it
    /// counts now).
    pub fn snippet_row(
        &self,
        snippet: &SnippetHash,
    ) -> Result<Option<crate::tables::SnippetEntry>, StateError> {
        if let Some(row) = self.tables.snippet(snippet) {
            return Ok(Some(*row));
        }
        match self.store.get(Table::Sst, &snippet.0)? {
            Some(row) => {
                let row = crate::tables::decode_snippet(&row)?;
                if row.class.0 as usize >= self.tables.founded_count() {
                    return Err(RecordError::Damaged {
                        table: "sst",
                        why: "snippet of an unknown class",
                    }
                    .into());
                }
                Ok(Some(row))
            }
            None => Ok(None),
        }
    }

    /// The tables.
    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    /// The sums.
    pub fn sums(&self) -> &Sums {
        &self.sums
    }

    /// Holds at most `capacity` clean accumulators in memory (default
    /// [`DEFAULT_HELD_ACCUMULATORS`](crate::aggregate::DEFAULT_HELD_ACCUMULATORS)).
    pub fn set_held_accumulators(&mut self, capacity: usize) {
        self.sums.set_capacity(capacity);
    }

    /// The epochs.
    pub fn epochs(&self) -> &Epochs {
        &self.epochs
    }

    /// The store's instance id (its bundle chain's name).
    pub fn instance(&self) -> InstanceId {
        self.instance
    }

    /// The cursor of the last committed (durable) batch.
    pub fn cursor(&self) -> Cursor {
        Cursor(self.durable.cursor.load(Ordering::Acquire))
    }

    /// Reports accepted over the life of the store and durable.
    pub fn accepted(&self) -> u64 {
        self.durable.accepted.load(Ordering::Acquire)
    }

    /// The design keys: the list applied and every key the sums are under, by slot.
    pub fn keys(&self) -> &DesignKeys {
        &self.keys
    }

    /// Applies a new key list (`reload-keys`): its keys get slots, durably, before any report
    /// is summed under them. An older list, or a single key the store never summed under
    /// while it holds others, is refused and changes nothing.
    pub fn replace_keys(&mut self, settings: KeySettings) -> Result<(), StateError> {
        let mut set = WriteSet::new();
        let keys = DesignKeys::load(self.store.as_ref(), settings, &mut set)?;
        self.sums.set_keys(keys.by_slot())?;
        if !set.is_empty() {
            self.store.write(set)?;
        }
        self.keys = keys;
        Ok(())
    }

    /// The unit check of a batch's ciphertexts, one gcd per design key the batch uses, in the
    /// batch's order.
    fn check_units<'a>(
        &self,
        batch: &'a [ValidReport],
    ) -> Vec<Result<&'a PackedCiphertexts, PaillierError>> {
        let mut slots: Vec<KeySlot> = batch.iter().map(|r| r.key).collect();
        slots.sort_unstable();
        slots.dedup();
        if let [only] = slots.as_slice()
            && let Some(key) = self.keys.key(*only)
        {
            return key.check_units(batch.iter().map(|r| &r.ciphertexts));
        }
        let mut out: Vec<Option<_>> = (0..batch.len()).map(|_| None).collect();
        for slot in slots {
            let picked: Vec<usize> = (0..batch.len()).filter(|&i| batch[i].key == slot).collect();
            let Some(key) = self.keys.key(slot) else {
                for i in picked {
                    out[i] = Some(Err(PaillierError::InvalidKey(
                        "no design key in the report's slot",
                    )));
                }
                continue;
            };
            let checked = key.check_units(picked.iter().map(|&i| &batch[i].ciphertexts));
            for (i, r) in picked.into_iter().zip(checked) {
                out[i] = Some(r);
            }
        }
        out.into_iter().flatten().collect()
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
}

/// A store written before is migrated from format 7 if it is of that format, then checked
/// (its format, and that it is where it was made); a new one gets its format, instance id,
/// home and epoch policy (`policy`, else by day).
fn initialise_or_check(store: &dyn Store, policy: Option<EpochPolicy>) -> Result<(), StateError> {
    // Any of these says the store was written before: by this format, an older one (a
    // key id but no instance), or a newer one.
    let mut written = false;
    for key in [meta::INSTANCE, meta::KEY_ID, meta::FORMAT] {
        written |= store.get(Table::Meta, key)?.is_some();
    }
    if written {
        if stored_format(store)? == 7 {
            migrate_7_to_8(store)?;
        }
        check_format(store)?;
        crate::copies::check_home(store)?;
        return Ok(());
    }
    let mut set = WriteSet::new();
    set.put(
        Table::Meta,
        meta::FORMAT,
        STORE_FORMAT.to_be_bytes().to_vec(),
    );
    let mut instance = [0u8; 16];
    rand::rng().fill_bytes(&mut instance);
    set.put(Table::Meta, meta::INSTANCE, instance.to_vec());
    set.put(
        Table::Meta,
        crate::copies::keys::HOME,
        store.home()?.to_bytes().to_vec(),
    );
    epochs::write_policy(&mut set, policy.unwrap_or_default());
    store.write(set)?;
    Ok(())
}

/// What [`State::open`] reads of the store: the EST rows and the meta records it rebuilds
/// from. The sums are not read here: each accumulator is read when a report first touches it
/// (`crate::aggregate`, "Loaded when touched").
struct StoredMeta {
    est: Vec<(Vec<u8>, Vec<u8>)>,
    cursor: Cursor,
    accepted: u64,
    instance: Option<InstanceId>,
    kind: Option<EpochKind>,
    count: Option<u64>,
    closed_through: Option<EpochId>,
    current: Option<EpochId>,
    epoch_records: Vec<EpochRecord>,
    merges: Vec<ClassMerge>,
    seen_floor: Day,
}

impl StoredMeta {
    /// Scans the EST and meta tables; a damaged record ends the scan with its error.
    fn read(store: &dyn Store) -> Result<Self, StateError> {
        let mut meta = Self {
            est: Vec::new(),
            cursor: Cursor(0),
            accepted: 0,
            instance: None,
            kind: None,
            count: None,
            closed_through: None,
            current: None,
            epoch_records: Vec::new(),
            merges: Vec::new(),
            seen_floor: Day(0),
        };
        store.scan(&[Table::Est, Table::Meta], &mut |table, k, v| {
            match table {
                Table::Est => meta.est.push((k.to_vec(), v.to_vec())),
                Table::Meta => meta.read_meta(k, v)?,
                _ => {}
            }
            Ok(())
        })?;
        Ok(meta)
    }

    /// Takes in one meta record (the others are of no concern to the state).
    fn read_meta(&mut self, k: &[u8], v: &[u8]) -> Result<(), StoreError> {
        let damaged = |what: &str| StoreError::Visit(format!("damaged meta record {what}"));
        if k == meta::CURSOR {
            self.cursor =
                Cursor(read_u64(v).ok_or(StoreError::Visit("damaged meta record cursor".into()))?);
        } else if k == meta::ACCEPTED {
            self.accepted =
                read_u64(v).ok_or(StoreError::Visit("damaged meta record accepted".into()))?;
        } else if k == meta::INSTANCE {
            self.instance = Some(InstanceId(
                v.try_into().map_err(|_| damaged("chain/instance"))?,
            ));
        } else if k == epochs::keys::KIND {
            self.kind = Some(
                v.first()
                    .copied()
                    .and_then(EpochKind::from_code)
                    .ok_or_else(|| damaged("epoch/kind"))?,
            );
        } else if k == epochs::keys::COUNT {
            self.count = Some(read_u64(v).ok_or_else(|| damaged("epoch/count"))?);
        } else if k == epochs::keys::CLOSED_THROUGH {
            self.closed_through = Some(EpochId(
                read_u32(v).ok_or_else(|| damaged("closed_through"))?,
            ));
        } else if k == epochs::keys::CURRENT {
            self.current = Some(EpochId(read_u32(v).ok_or_else(|| damaged("current"))?));
        } else if k == meta::SEEN_FLOOR {
            self.seen_floor = Day(read_u32(v).ok_or_else(|| damaged("seen/floor"))?);
        } else if k.starts_with(MERGE_PREFIX) {
            let (merge, _) = decode_merge(k, v).map_err(|e| StoreError::Visit(e.to_string()))?;
            self.merges.push(merge);
        } else if k.starts_with(epochs::keys::RECORD) {
            self.epoch_records
                .push(EpochRecord::decode(k, v).ok_or_else(|| damaged("epoch record"))?);
        }
        Ok(())
    }

    /// The epoch policy: the stored one, or `given` when it is of the same kind (written
    /// when it differs, as a count may change).
    fn policy(
        &self,
        store: &dyn Store,
        given: Option<EpochPolicy>,
    ) -> Result<EpochPolicy, StateError> {
        let stored = match self.kind.ok_or(StateError::Meta("epoch/kind"))? {
            EpochKind::Day => EpochPolicy::Day,
            EpochKind::Count => EpochPolicy::Count(
                self.count
                    .and_then(std::num::NonZeroU64::new)
                    .ok_or(StateError::Meta("epoch/count"))?,
            ),
        };
        Ok(match given {
            None => stored,
            Some(given) if given.kind() != stored.kind() => {
                return Err(StateError::EpochKindMismatch {
                    stored: stored.kind(),
                    given,
                });
            }
            Some(given) => {
                if given != stored {
                    let mut set = WriteSet::new();
                    epochs::write_policy(&mut set, given);
                    store.write(set)?;
                }
                given
            }
        })
    }
}

/// Format 7 to 8: the one key moves into slot 0 and every ASH row's key gains slot 0 before
/// its generation. Rows are moved in chunks, each chunk in one write (a new key put and the
/// old one deleted together), and the format is written last, so a migration cut short is
/// finished by the next open (18-byte keys are the rows not moved yet).
pub fn migrate_7_to_8(store: &dyn Store) -> Result<(), StateError> {
    const CHUNK: usize = 4096;
    let key = store
        .get(Table::Meta, meta::PUBLIC_KEY)?
        .ok_or(StateError::Meta("public_key"))?;
    PublicKey::from_bytes(&key).map_err(|_| StateError::Meta("public_key"))?;
    let mut old_rows = Vec::new();
    store.scan(&[Table::Ash], &mut |_, k, v| {
        if k.len() == ASH_KEY_BYTES - 1 {
            old_rows.push((k.to_vec(), v.to_vec()));
        }
        Ok(())
    })?;
    for chunk in old_rows.chunks(CHUNK) {
        let mut set = WriteSet::new();
        for (k, v) in chunk {
            let mut new_key = Vec::with_capacity(ASH_KEY_BYTES);
            new_key.extend_from_slice(&k[..14]);
            new_key.push(0);
            new_key.extend_from_slice(&k[14..]);
            let mut end = k.clone();
            end.push(0);
            set.delete_range(Table::Ash, k.clone(), end);
            set.put(Table::Ash, new_key, v.clone());
        }
        store.write(set)?;
    }
    let mut set = WriteSet::new();
    set.put(Table::Meta, design_keys::slot_record_key(KeySlot(0)), key);
    set.put(
        Table::Meta,
        meta::FORMAT,
        STORE_FORMAT.to_be_bytes().to_vec(),
    );
    store.write(set)?;
    tracing::info!(
        rows = old_rows.len(),
        "store migrated from format 7 to 8 (sums per design key)"
    );
    Ok(())
}

/// The format a store says it has (1 when it says nothing).
fn stored_format(store: &dyn Store) -> Result<u32, StateError> {
    match store.get(Table::Meta, meta::FORMAT)? {
        None => Ok(1),
        Some(v) => {
            let bytes: [u8; 4] = v
                .as_slice()
                .try_into()
                .map_err(|_| StateError::Meta("format"))?;
            Ok(u32::from_be_bytes(bytes))
        }
    }
}

/// Reads the stored throttle hint (full rate when none was set).
pub fn stored_throttle(store: &dyn Store) -> Result<ThrottleHint, StateError> {
    match store.get(Table::Meta, meta::THROTTLE)? {
        None => Ok(ThrottleHint::FULL_RATE),
        Some(v) => {
            let bytes: [u8; 2] = v
                .as_slice()
                .try_into()
                .map_err(|_| StateError::Meta("throttle"))?;
            ThrottleHint::from_permille(u16::from_be_bytes(bytes))
                .ok_or(StateError::Meta("throttle"))
        }
    }
}

/// Stores the throttle hint durably.
pub fn store_throttle(store: &dyn Store, hint: ThrottleHint) -> Result<(), StateError> {
    let mut set = WriteSet::new();
    set.put(
        Table::Meta,
        meta::THROTTLE,
        hint.permille().to_be_bytes().to_vec(),
    );
    store.write(set)?;
    Ok(())
}

fn read_u64(v: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(v.try_into().ok()?))
}

fn read_u32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.try_into().ok()?))
}

/// Refuses a store whose records this build would misread (see [`STORE_FORMAT`]).
pub fn check_format(store: &dyn Store) -> Result<(), StateError> {
    let found = stored_format(store)?;
    if found != STORE_FORMAT {
        return Err(StateError::Format {
            found,
            expected: STORE_FORMAT,
        });
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use penrose_core::paillier::{KeySize, Keypair};
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    use super::*;
    use crate::store::RocksStore;

    fn open(store: &Arc<dyn Store>, key: &PublicKey) -> Result<State, StateError> {
        State::open(
            Arc::clone(store),
            key,
            FingerprintParams::default(),
            1_000,
            None,
        )
    }

    /// A store of format 5 (written before the Spent table existed) is refused with the format
    /// error, and opening it adds no table, so the build that wrote it still opens it.
    #[test]
    fn a_format_5_store_is_refused_and_gets_no_spent_table() {
        let keys =
            Keypair::generate_with_size(KeySize::Bits1024, &mut ChaCha20Rng::seed_from_u64(4));
        let key = keys.public_key();
        let dir = tempfile::tempdir().unwrap();
        let old = ["seen", "sst", "est", "ash", "meta"];
        {
            let mut options = rocksdb::Options::default();
            options.create_if_missing(true);
            options.create_missing_column_families(true);
            let db = rocksdb::DB::open_cf(&options, dir.path(), old).unwrap();
            let meta_cf = db.cf_handle("meta").unwrap();
            db.put_cf(meta_cf, meta::KEY_ID, key.key_id().0).unwrap();
            db.put_cf(meta_cf, meta::PUBLIC_KEY, key.to_bytes())
                .unwrap();
            db.put_cf(meta_cf, meta::FORMAT, 5u32.to_be_bytes())
                .unwrap();
        }
        let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir.path()).unwrap());
        let error = open(&store, key).err().unwrap();
        assert!(matches!(
            error,
            StateError::Format {
                found: 5,
                expected: STORE_FORMAT
            }
        ));
        assert!(
            error
                .to_string()
                .contains("export it with the aggregator that wrote it")
        );
        drop(store);
        let mut tables = rocksdb::DB::list_cf(&rocksdb::Options::default(), dir.path()).unwrap();
        tables.sort();
        let mut expected: Vec<String> = old.iter().map(|t| t.to_string()).collect();
        expected.push("default".into());
        expected.sort();
        assert_eq!(tables, expected);
    }

    /// A store of format 6 (sums keyed without the GPU architecture) is refused with the
    /// format error that says to export it first, and is left as it was.
    #[test]
    fn a_format_6_store_is_refused_with_the_export_first_message() {
        let keys =
            Keypair::generate_with_size(KeySize::Bits1024, &mut ChaCha20Rng::seed_from_u64(6));
        let key = keys.public_key();
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir.path()).unwrap());
        let mut set = WriteSet::new();
        set.put(Table::Meta, meta::KEY_ID, key.key_id().0.to_vec());
        set.put(Table::Meta, meta::PUBLIC_KEY, key.to_bytes());
        set.put(Table::Meta, meta::FORMAT, 6u32.to_be_bytes().to_vec());
        // A format 6 ASH row: a 16-byte key (no architecture).
        set.put(Table::Ash, vec![0u8; 16], vec![0u8; 24]);
        store.write(set).unwrap();
        let before = store_rows(store.as_ref());
        let error = open(&store, key).err().unwrap();
        assert!(matches!(
            error,
            StateError::Format {
                found: 6,
                expected: STORE_FORMAT
            }
        ));
        assert!(error.to_string().contains(
            "export it with the aggregator that wrote it, then use a new data directory"
        ));
        assert_eq!(store_rows(store.as_ref()), before);
    }

    fn store_rows(store: &dyn Store) -> Vec<(Table, Vec<u8>, Vec<u8>)> {
        let mut rows = Vec::new();
        store
            .scan(&Table::ALL, &mut |t, k, v| {
                rows.push((t, k.to_vec(), v.to_vec()));
                Ok(())
            })
            .unwrap();
        rows
    }

    #[test]
    fn stores_of_another_format_are_refused_and_left_alone() {
        let keys =
            Keypair::generate_with_size(KeySize::Bits1024, &mut ChaCha20Rng::seed_from_u64(3));
        let key = keys.public_key();
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir.path()).unwrap());
        // A new store is stamped with this build's format and opens again.
        drop(open(&store, key).unwrap());
        assert_eq!(
            store.get(Table::Meta, meta::FORMAT).unwrap(),
            Some(STORE_FORMAT.to_be_bytes().to_vec())
        );
        drop(open(&store, key).unwrap());

        // A store written before the stamp existed (format 1: plain sums).
        let old_dir = tempfile::tempdir().unwrap();
        let old: Arc<dyn Store> = Arc::new(RocksStore::open(old_dir.path()).unwrap());
        let mut set = WriteSet::new();
        set.put(Table::Meta, meta::KEY_ID, key.key_id().0.to_vec());
        set.put(Table::Meta, meta::PUBLIC_KEY, key.to_bytes());
        old.write(set).unwrap();
        assert!(matches!(
            open(&old, key),
            Err(StateError::Format {
                found: 1,
                expected: STORE_FORMAT
            })
        ));
        assert!(matches!(
            crate::export::all_sums(old.as_ref()),
            Err(crate::export::ExportError::State(StateError::Format {
                found: 1,
                ..
            }))
        ));
        assert_eq!(old.get(Table::Meta, meta::FORMAT).unwrap(), None);

        // A store of another format (an older one than the one migrated, and a newer one), and
        // a damaged stamp.
        let other = [STORE_FORMAT - 2, STORE_FORMAT + 1].map(|f| (f.to_be_bytes().to_vec(), false));
        for (value, damaged) in other.into_iter().chain([(vec![0, 2], true)]) {
            let mut set = WriteSet::new();
            set.put(Table::Meta, meta::FORMAT, value.clone());
            store.write(set).unwrap();
            let result = open(&store, key);
            if damaged {
                assert!(matches!(result, Err(StateError::Meta("format"))));
            } else {
                let found = u32::from_be_bytes(value.as_slice().try_into().unwrap());
                assert!(
                    matches!(result, Err(StateError::Format { found: f, .. }) if f == found),
                    "format {found}"
                );
            }
            assert_eq!(store.get(Table::Meta, meta::FORMAT).unwrap(), Some(value));
        }
    }
}
