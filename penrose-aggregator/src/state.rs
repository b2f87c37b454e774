//! The server's aggregation state and the one operation that changes it: applying a batch of
//! validated reports as a single durable write.
//!
//! Crash consistency rests on one rule: a report's deduplication record (Seen), its SST/EST
//! rows, the ASH rows it changed and the new cursor go into the *same* write batch, synced
//! before [`State::apply`] returns, and acks are sent only after that. So after a crash a
//! report is either fully counted and remembered as seen, or absent and not acked; a retry
//! of an acked report finds its Seen record and is answered as a duplicate.
//!
//! The in-memory tables and sums are updated before the write. If the write fails they are
//! ahead of the store, so the caller must stop using this state (the server stops; the next
//! start rebuilds from the store), the way a database stops on a failed WAL sync.

use std::collections::HashSet;
use std::sync::Arc;

use penrose_core::bundle::Cursor;
use penrose_core::fingerprint::FingerprintParams;
use penrose_core::paillier::{KeyId, PublicKey};
use penrose_core::wire::{Day, ReportId, ThrottleHint};
use thiserror::Error;

use crate::aggregate::{AggregateError, AshRecord, SumKey, Sums};
use crate::store::{Store, StoreError, Table, WriteSet};
use crate::tables::{RecordError, Tables};
use crate::validate::ValidReport;

/// Keys of the meta table.
pub mod meta {
    /// The cursor: how many batches with accepted reports were committed (u64).
    pub const CURSOR: &[u8] = b"cursor";
    /// The Paillier key id the sums are under ([u8; 32]).
    pub const KEY_ID: &[u8] = b"key_id";
    /// The Paillier public key itself, so that admin tools can open the store without the
    /// key file.
    pub const PUBLIC_KEY: &[u8] = b"public_key";
    /// The throttle hint in permille (u16).
    pub const THROTTLE: &[u8] = b"throttle";
    /// Reports accepted over the life of the store (u64).
    pub const ACCEPTED: &[u8] = b"accepted";
}

/// What happened to one report of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Counted now.
    Accepted,
    /// Already counted (in an earlier batch, or earlier in this one).
    Duplicate,
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
    /// The store holds sums under another public key.
    #[error(
        "this data directory aggregates for key {stored}, but the server was given key {given}; \
         use a new data directory for a new key"
    )]
    KeyMismatch {
        /// The key the store's sums are under.
        stored: KeyId,
        /// The key given now.
        given: KeyId,
    },
    /// The writer thread panicked (a bug); the state it held is not trusted.
    #[error("the ingest writer panicked")]
    WriterPanicked,
    /// A meta value has the wrong length.
    #[error("damaged meta record {0}")]
    Meta(&'static str),
}

/// Tables, sums and counters, rebuilt from the store on open.
pub struct State {
    store: Arc<dyn Store>,
    key: PublicKey,
    tables: Tables,
    sums: Sums,
    cursor: Cursor,
    accepted: u64,
}

impl State {
    /// Rebuilds the state from `store` (empty for a new store) for `key`.
    pub fn open(
        store: Arc<dyn Store>,
        key: &PublicKey,
        params: FingerprintParams,
        bound: u64,
    ) -> Result<Self, StateError> {
        match store.get(Table::Meta, meta::KEY_ID)? {
            Some(stored) => {
                let stored: [u8; 32] = stored
                    .as_slice()
                    .try_into()
                    .map_err(|_| StateError::Meta("key_id"))?;
                if stored != key.key_id().0 {
                    return Err(StateError::KeyMismatch {
                        stored: KeyId(stored),
                        given: key.key_id(),
                    });
                }
            }
            None => {
                let mut set = WriteSet::new();
                set.put(Table::Meta, meta::KEY_ID, key.key_id().0.to_vec());
                set.put(Table::Meta, meta::PUBLIC_KEY, key.to_bytes());
                store.write(set)?;
            }
        }
        let (mut sst, mut est, mut ash) = (Vec::new(), Vec::new(), Vec::new());
        let mut cursor = Cursor(0);
        let mut accepted = 0;
        store.scan(
            &[Table::Sst, Table::Est, Table::Ash, Table::Meta],
            &mut |table, k, v| {
                match table {
                    Table::Sst => sst.push((k.to_vec(), v.to_vec())),
                    Table::Est => est.push((k.to_vec(), v.to_vec())),
                    Table::Ash => ash.push(
                        AshRecord::decode(k, v).map_err(|e| StoreError::Visit(e.to_string()))?,
                    ),
                    Table::Meta if k == meta::CURSOR => {
                        cursor = Cursor(
                            read_u64(v)
                                .ok_or(StoreError::Visit("damaged meta record cursor".into()))?,
                        );
                    }
                    Table::Meta if k == meta::ACCEPTED => {
                        accepted = read_u64(v)
                            .ok_or(StoreError::Visit("damaged meta record accepted".into()))?;
                    }
                    _ => {}
                }
                Ok(())
            },
        )?;
        let tables = Tables::load(params, sst, est)?;
        let sums = Sums::load(key, bound, ash)?;
        Ok(Self {
            store,
            key: key.clone(),
            tables,
            sums,
            cursor,
            accepted,
        })
    }

    /// Deduplicates, classifies and sums a batch, and makes it durable in one synced write.
    /// Outcomes are in the batch's order. On an error nothing may be acknowledged and this
    /// state must be dropped (module docs).
    pub fn apply(&mut self, batch: &[ValidReport], today: Day) -> Result<Vec<Outcome>, StateError> {
        let ids: Vec<&[u8]> = batch.iter().map(|r| &r.report.report_id.0[..]).collect();
        let seen = self.store.contains_many(Table::Seen, &ids)?;
        let next = Cursor(self.cursor.0 + 1);
        let mut set = WriteSet::new();
        let mut in_batch: HashSet<ReportId> = HashSet::with_capacity(batch.len());
        let mut outcomes = Vec::with_capacity(batch.len());
        for (valid, seen) in batch.iter().zip(seen) {
            let report = &valid.report;
            if seen || !in_batch.insert(report.report_id) {
                outcomes.push(Outcome::Duplicate);
                continue;
            }
            let placement = self.tables.record(report.snippet, today);
            let key = SumKey {
                class: placement.class,
                catalogue: report.catalogue,
                counter: report.counter,
            };
            self.sums
                .absorb(key, &valid.ciphertexts, u64::from(report.samples.0))?;
            set.put(
                Table::Seen,
                report.report_id.0.to_vec(),
                next.0.to_be_bytes().to_vec(),
            );
            outcomes.push(Outcome::Accepted);
        }
        let accepted = outcomes.iter().filter(|o| **o == Outcome::Accepted).count() as u64;
        if accepted == 0 {
            return Ok(outcomes);
        }
        let (snippets, classes) = self.tables.take_dirty();
        for (k, v) in snippets {
            set.put(Table::Sst, k, v);
        }
        for (k, v) in classes {
            set.put(Table::Est, k, v);
        }
        for record in self.sums.take_dirty(next) {
            set.put(
                Table::Ash,
                AshRecord::store_key(record.key, record.generation).to_vec(),
                record.store_value(),
            );
        }
        set.put(Table::Meta, meta::CURSOR, next.0.to_be_bytes().to_vec());
        set.put(
            Table::Meta,
            meta::ACCEPTED,
            (self.accepted + accepted).to_be_bytes().to_vec(),
        );
        self.store.write(set)?;
        self.cursor = next;
        self.accepted += accepted;
        Ok(outcomes)
    }

    /// The tables.
    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    /// The sums.
    pub fn sums(&self) -> &Sums {
        &self.sums
    }

    /// The cursor of the last committed batch.
    pub fn cursor(&self) -> Cursor {
        self.cursor
    }

    /// Reports accepted over the life of the store.
    pub fn accepted(&self) -> u64 {
        self.accepted
    }

    /// The key the sums are under.
    pub fn key(&self) -> &PublicKey {
        &self.key
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
}

/// The public key a store aggregates for, if it has been opened for one.
pub fn stored_public_key(store: &dyn Store) -> Result<Option<PublicKey>, StateError> {
    match store.get(Table::Meta, meta::PUBLIC_KEY)? {
        None => Ok(None),
        Some(bytes) => PublicKey::from_bytes(&bytes)
            .map(Some)
            .map_err(|_| StateError::Meta("public_key")),
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
