//! The aggregated sums (ASH): per (class, GPU architecture, catalogue, counter, epoch, design
//! key) the homomorphic product of every report's packed ciphertexts mod n^2, with the number
//! of reports and samples in it. Counters of different GPU generations never add up in one
//! sum, nor do ciphertexts under different keys (a key rollover's grace days,
//! `crate::design_keys`).
//!
//! Each report costs one multiplication per ciphertext. A sum is kept as a run of *sub-sums*
//! ([`Generation`]s): once one holds the sub-sum size of reports (the server's
//! `export::sub_sum_reports`, 2 k T: twice what the contributor threshold needs; never
//! more than the accumulator bound, 214,748 at 31-bit slots), the next report starts the next.
//! Full generations stay in the store unchanged. Export releases each sub-sum that meets the
//! threshold alone and folds a short last one into the one before (`crate::export`), so that
//! one bad report (bins that do not add up, which only the design server sees) costs the design
//! server one sub-sum, not the whole (class, counter, epoch). Closing an epoch drops its
//! accumulators, whose last states are in the store and never change again.
//!
//! **Loaded when touched.** Nothing is read at start: the first report of a sum key reads that
//! key's latest generation from the store (point reads, generation 0, 1, ... until one is
//! missing; [`latest_in_store`]) and keeps it in memory. At most a capacity of accumulators
//! stay held ([`DEFAULT_HELD_ACCUMULATORS`]); beyond it the least recently used *clean* ones are
//! dropped: those whose last state was written by a batch that is durable now. An accumulator
//! changed since the last batch, or written by a batch still syncing, is never dropped, since
//! the store does not hold its state yet; so the next read of a dropped key finds exactly the
//! state, reports and samples it had, and no acknowledged report is lost.

use std::collections::{BTreeMap, HashMap, HashSet};

use penrose_core::bundle::{Cursor, EpochId, Generation};
use penrose_core::counters::{CatalogueVersion, CounterId};
use penrose_core::gpu::GpuArch;
use penrose_core::paillier::{
    ACCUMULATOR_REPORT_BOUND, Accumulator, PackedCiphertexts, PaillierError, PublicKey,
};
use thiserror::Error;

use crate::design_keys::KeySlot;
use crate::store::{Store, StoreError, Table};
use crate::tables::ClassId;

/// What a sum is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SumKey {
    /// The class.
    pub class: ClassId,
    /// The GPU generation the counters were read on (validated: one a report may name).
    pub arch: GpuArch,
    /// The catalogue the counter's binning comes from; sums never mix catalogues.
    pub catalogue: CatalogueVersion,
    /// The counter.
    pub counter: CounterId,
    /// The epoch the reports belong to: sums of different epochs are released separately.
    pub epoch: EpochId,
    /// The design key the ciphertexts are under.
    pub key: KeySlot,
}

/// One ASH record, as stored and exported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AshRecord {
    /// What it sums.
    pub key: SumKey,
    /// Which accumulator of that key.
    pub generation: Generation,
    /// The cursor of the write batch that last changed it.
    pub changed: Cursor,
    /// Reports in it.
    pub reports: u64,
    /// Samples those reports claimed.
    pub samples: u64,
    /// The sums' ciphertexts, concatenated (fixed length each).
    pub sums: Vec<u8>,
}

/// Bytes of an ASH record key.
pub const ASH_KEY_BYTES: usize = 19;
const ASH_VALUE_FIXED: usize = 24;

impl AshRecord {
    /// The store key: class, architecture (major, minor), catalogue, counter, epoch, key
    /// slot, generation, big-endian, so that one class's records are adjacent (the partitioning key
    /// docs/design.md section 6 names).
    pub fn store_key(key: SumKey, generation: Generation) -> [u8; ASH_KEY_BYTES] {
        let mut out = [0u8; ASH_KEY_BYTES];
        out[..4].copy_from_slice(&key.class.0.to_be_bytes());
        out[4..6].copy_from_slice(&key.arch.to_bytes());
        out[6..8].copy_from_slice(&key.catalogue.0.to_be_bytes());
        out[8..10].copy_from_slice(&key.counter.0.to_be_bytes());
        out[10..14].copy_from_slice(&key.epoch.0.to_be_bytes());
        out[14] = key.key.0;
        out[15..].copy_from_slice(&generation.0.to_be_bytes());
        out
    }

    /// The store value.
    pub fn store_value(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(ASH_VALUE_FIXED + self.sums.len());
        out.extend_from_slice(&self.changed.0.to_be_bytes());
        out.extend_from_slice(&self.reports.to_be_bytes());
        out.extend_from_slice(&self.samples.to_be_bytes());
        out.extend_from_slice(&self.sums);
        out
    }

    /// Reads a stored record.
    pub fn decode(key: &[u8], value: &[u8]) -> Result<Self, AggregateError> {
        let key: &[u8; ASH_KEY_BYTES] = key
            .try_into()
            .map_err(|_| AggregateError::Damaged("key length"))?;
        let (fixed, sums) = value
            .split_first_chunk::<ASH_VALUE_FIXED>()
            .ok_or(AggregateError::Damaged("value too short"))?;
        let u64_at = |b: &[u8], i: usize| {
            let mut v = [0u8; 8];
            v.copy_from_slice(&b[i..i + 8]);
            u64::from_be_bytes(v)
        };
        let u32_at = |i: usize| u32::from_be_bytes([key[i], key[i + 1], key[i + 2], key[i + 3]]);
        let u16_at = |i: usize| u16::from_be_bytes([key[i], key[i + 1]]);
        Ok(Self {
            key: SumKey {
                class: ClassId(u32_at(0)),
                arch: GpuArch::from_bytes([key[4], key[5]]),
                catalogue: CatalogueVersion(u16_at(6)),
                counter: CounterId(u16_at(8)),
                epoch: EpochId(u32_at(10)),
                key: KeySlot(key[14]),
            },
            generation: Generation(u32_at(15)),
            changed: Cursor(u64_at(fixed, 0)),
            reports: u64_at(fixed, 8),
            samples: u64_at(fixed, 16),
            sums: sums.to_vec(),
        })
    }
}

/// Why a sum could not be updated or restored.
#[derive(Debug, Error)]
pub enum AggregateError {
    /// The accumulator refused (wrong key, sample count); validation should have caught it.
    #[error("accumulator: {0}")]
    Paillier(#[from] PaillierError),
    /// A stored record does not parse.
    #[error("damaged ASH record: {0}")]
    Damaged(&'static str),
    /// A sum key names a key slot the server does not hold (a bug: validation gives slots).
    #[error("no design key in slot {0}")]
    UnknownKeySlot(u8),
    /// Reading a sum's stored state failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The latest generation of `key` in `store`, if any. Generations are written in order, each
/// only after the previous one filled, so they are contiguous from 0: point reads of 0, 1, 3,
/// 7, ... until one is missing, then a binary search between the last present and the first
/// missing (about 2 log2(generations) reads; a busy sum of a day has hundreds of sub-sums).
pub fn latest_in_store(
    store: &dyn Store,
    key: SumKey,
) -> Result<Option<AshRecord>, AggregateError> {
    let read = |g: u32| -> Result<Option<AshRecord>, AggregateError> {
        let stored_key = AshRecord::store_key(key, Generation(g));
        store
            .get(Table::Ash, &stored_key)?
            .map(|value| AshRecord::decode(&stored_key, &value))
            .transpose()
    };
    let Some(mut present) = read(0)? else {
        return Ok(None);
    };
    // Invariant: generation `present.generation` exists, `missing` does not (or is past u32).
    let mut missing = u64::from(u32::MAX) + 1;
    let mut probe = 1u64;
    while probe < missing {
        match read(probe as u32)? {
            Some(record) => {
                present = record;
                probe = probe * 2 + 1;
            }
            None => missing = probe,
        }
    }
    while u64::from(present.generation.0) + 1 < missing {
        let middle = (u64::from(present.generation.0) + missing) / 2;
        match read(middle as u32)? {
            Some(record) => present = record,
            None => missing = middle,
        }
    }
    Ok(Some(present))
}

/// How many accumulators [`Sums`] holds in memory at most, beyond those changed by batches not
/// yet durable (module docs). About 5.8 KB resident each under a 2048-bit key (state, working
/// buffers, key copies; measured by `measure_held_accumulator_bytes` in `tests/sums.rs`), so
/// about 380 MB; docs/operations.md states the bound.
pub const DEFAULT_HELD_ACCUMULATORS: usize = 65_536;

struct Open {
    generation: Generation,
    accumulator: Accumulator,
    /// The cursor of the batch that last wrote its state (`None`: never written).
    written: Option<Cursor>,
    /// Its place in the use order ([`Sums::order`]).
    tick: u64,
}

/// The accumulators of open epochs held in memory, loaded from the store when first touched
/// (module docs), and which changed since the last batch.
pub struct Sums {
    /// The design keys by slot.
    keys: Vec<PublicKey>,
    bound: u64,
    open: HashMap<SumKey, Open>,
    dirty: HashSet<SumKey>,
    /// Generations that filled since the last batch, in their last state: a generation can
    /// fill and the next begin within one batch, and the batch must still write the full one.
    filled: Vec<AshRecord>,
    /// Held keys by last use, oldest first.
    order: BTreeMap<u64, SumKey>,
    tick: u64,
    capacity: usize,
    loads: u64,
    evictions: u64,
}

impl Sums {
    /// No sums held yet, under the design keys `keys` (by slot); each generation takes at
    /// most `bound` reports, the sub-sum size (at most the safe bound), and at most
    /// [`DEFAULT_HELD_ACCUMULATORS`] clean ones are held.
    pub fn new(keys: &[PublicKey], bound: u64) -> Result<Self, AggregateError> {
        // Checks the bound once per key, here, rather than on every fresh accumulator.
        for key in keys {
            Accumulator::with_bound(key, bound)?;
        }
        Ok(Self {
            keys: keys.to_vec(),
            bound,
            open: HashMap::new(),
            dirty: HashSet::new(),
            filled: Vec::new(),
            order: BTreeMap::new(),
            tick: 0,
            capacity: DEFAULT_HELD_ACCUMULATORS,
            loads: 0,
            evictions: 0,
        })
    }

    /// The design keys by slot after a new key list gave keys slots (slots only grow).
    pub fn set_keys(&mut self, keys: &[PublicKey]) -> Result<(), AggregateError> {
        for key in keys.iter().skip(self.keys.len()) {
            Accumulator::with_bound(key, self.bound)?;
        }
        self.keys = keys.to_vec();
        Ok(())
    }

    /// Holds at most `capacity` clean accumulators (at least 1).
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.max(1);
    }

    /// The most clean accumulators held.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Multiplies one validated report into its sum, starting the next generation when the
    /// open one is full, and says which generation took it. A key not held is first read from
    /// `store` (its latest generation; none: a fresh generation 0). Keys of closed epochs must
    /// not be given: their sums are final.
    pub fn absorb(
        &mut self,
        store: &dyn Store,
        key: SumKey,
        ciphertexts: &PackedCiphertexts,
        samples: u64,
    ) -> Result<Generation, AggregateError> {
        let Some(sum_key) = self.keys.get(usize::from(key.key.0)) else {
            return Err(AggregateError::UnknownKeySlot(key.key.0));
        };
        self.tick += 1;
        let tick = self.tick;
        let open = match self.open.get_mut(&key) {
            Some(open) => {
                self.order.remove(&open.tick);
                open.tick = tick;
                open
            }
            None => {
                let loaded = match latest_in_store(store, key)? {
                    Some(record) => {
                        self.loads += 1;
                        Open {
                            generation: record.generation,
                            // The safe bound: a store written with larger sub-sums restores,
                            // and rotates at its next report.
                            accumulator: Accumulator::restore(
                                sum_key,
                                ACCUMULATOR_REPORT_BOUND,
                                &record.sums,
                                record.reports,
                                record.samples,
                            )?,
                            written: Some(record.changed),
                            tick,
                        }
                    }
                    None => Open {
                        generation: Generation(0),
                        accumulator: Accumulator::with_bound(sum_key, self.bound)?,
                        written: None,
                        tick,
                    },
                };
                self.open.entry(key).or_insert(loaded)
            }
        };
        self.order.insert(tick, key);
        if open.accumulator.reports() >= self.bound {
            // The full generation's last state goes with this batch (it may have filled in
            // it); the cursor is stamped when the batch takes it.
            self.filled.push(AshRecord {
                key,
                generation: open.generation,
                changed: Cursor(0),
                reports: open.accumulator.reports(),
                samples: open.accumulator.samples(),
                sums: open.accumulator.state_bytes(),
            });
            open.generation = Generation(open.generation.0 + 1);
            open.accumulator = Accumulator::with_bound(sum_key, self.bound)?;
        }
        open.accumulator.absorb(ciphertexts, samples)?;
        self.dirty.insert(key);
        Ok(open.generation)
    }

    /// The records of every sum changed since the last call, stamped with `cursor`: the
    /// caller writes them in the batch of that cursor.
    pub fn take_dirty(&mut self, cursor: Cursor) -> Vec<AshRecord> {
        let mut out = std::mem::take(&mut self.filled);
        for record in &mut out {
            record.changed = cursor;
        }
        out.reserve(self.dirty.len());
        for key in std::mem::take(&mut self.dirty) {
            let Some(open) = self.open.get_mut(&key) else {
                continue;
            };
            open.written = Some(cursor);
            out.push(AshRecord {
                key,
                generation: open.generation,
                changed: cursor,
                reports: open.accumulator.reports(),
                samples: open.accumulator.samples(),
                sums: open.accumulator.state_bytes(),
            });
        }
        out
    }

    /// Drops least recently used accumulators while more than the capacity are held, only
    /// clean ones: unchanged since their state was written by a batch at or before `durable`,
    /// the cursor of the last batch the store holds (module docs). Returns how many went.
    pub fn evict(&mut self, durable: Cursor) -> usize {
        let excess = self.open.len().saturating_sub(self.capacity);
        if excess == 0 {
            return 0;
        }
        let mut gone = Vec::with_capacity(excess);
        for (&tick, key) in &self.order {
            if gone.len() == excess {
                break;
            }
            let clean = !self.dirty.contains(key)
                && self
                    .open
                    .get(key)
                    .and_then(|o| o.written)
                    .is_some_and(|w| w <= durable);
            if clean {
                gone.push((tick, *key));
            }
        }
        for (tick, key) in &gone {
            self.order.remove(tick);
            self.open.remove(key);
        }
        self.evictions += gone.len() as u64;
        gone.len()
    }

    /// Forgets the accumulators of `epoch`, which is closed: its sums are final in the store.
    /// Must follow a [`take_dirty`](Self::take_dirty), so that no change of it is unwritten.
    pub fn close(&mut self, epoch: EpochId) {
        let order = &mut self.order;
        self.open.retain(|k, open| {
            let keep = k.epoch != epoch;
            if !keep {
                order.remove(&open.tick);
            }
            keep
        });
    }

    /// Accumulators held in memory now (one per key).
    pub fn open_count(&self) -> usize {
        self.open.len()
    }

    /// Accumulators read from the store since start (first touches of keys it held).
    pub fn loads(&self) -> u64 {
        self.loads
    }

    /// Accumulators dropped from memory since start to stay within the capacity.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }
}
