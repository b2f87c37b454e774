//! The aggregated sums (ASH): per (class, catalogue, counter, epoch) the homomorphic product of
//! every report's packed ciphertexts mod n^2, with the number of reports and samples in it.
//!
//! Each report costs one multiplication per ciphertext. A sum holds at most the accumulator
//! bound of reports (214,748 at 31-bit slots), after which the next report starts a fresh
//! accumulator, the next [`Generation`]; full generations stay in the store unchanged and the
//! design server decrypts each and adds the plaintexts. Only the open generation of each
//! (class, counter) of an open epoch is held in memory; closing an epoch drops its
//! accumulators, whose last states are in the store and never change again.

use std::collections::{HashMap, HashSet};

use penrose_core::bundle::{Cursor, EpochId, Generation};
use penrose_core::counters::{CatalogueVersion, CounterId};
use penrose_core::paillier::{Accumulator, PackedCiphertexts, PaillierError, PublicKey};
use thiserror::Error;

use crate::tables::ClassId;

/// What a sum is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SumKey {
    /// The class.
    pub class: ClassId,
    /// The catalogue the counter's binning comes from; sums never mix catalogues.
    pub catalogue: CatalogueVersion,
    /// The counter.
    pub counter: CounterId,
    /// The epoch the reports belong to: sums of different epochs are released separately.
    pub epoch: EpochId,
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
pub const ASH_KEY_BYTES: usize = 16;
const ASH_VALUE_FIXED: usize = 24;

impl AshRecord {
    /// The store key: class, catalogue, counter, epoch, generation, big-endian, so that one
    /// class's records are adjacent (the partitioning key docs/design.md section 6 names).
    pub fn store_key(key: SumKey, generation: Generation) -> [u8; ASH_KEY_BYTES] {
        let mut out = [0u8; ASH_KEY_BYTES];
        out[..4].copy_from_slice(&key.class.0.to_be_bytes());
        out[4..6].copy_from_slice(&key.catalogue.0.to_be_bytes());
        out[6..8].copy_from_slice(&key.counter.0.to_be_bytes());
        out[8..12].copy_from_slice(&key.epoch.0.to_be_bytes());
        out[12..].copy_from_slice(&generation.0.to_be_bytes());
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
                catalogue: CatalogueVersion(u16_at(4)),
                counter: CounterId(u16_at(6)),
                epoch: EpochId(u32_at(8)),
            },
            generation: Generation(u32_at(12)),
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
}

struct Open {
    generation: Generation,
    accumulator: Accumulator,
}

/// The open accumulators of every (class, counter), and which changed since the last batch.
pub struct Sums {
    key: PublicKey,
    bound: u64,
    open: HashMap<SumKey, Open>,
    dirty: HashSet<SumKey>,
    reports: u64,
}

impl Sums {
    /// No sums yet; each accumulator takes at most `bound` reports (at most the safe bound).
    pub fn new(key: &PublicKey, bound: u64) -> Result<Self, AggregateError> {
        // Checks the bound once, here, rather than on every fresh accumulator.
        Accumulator::with_bound(key, bound)?;
        Ok(Self {
            key: key.clone(),
            bound,
            open: HashMap::new(),
            dirty: HashSet::new(),
            reports: 0,
        })
    }

    /// Multiplies one validated report into its sum, starting the next generation when the
    /// open one is full.
    pub fn absorb(
        &mut self,
        key: SumKey,
        ciphertexts: &PackedCiphertexts,
        samples: u64,
    ) -> Result<(), AggregateError> {
        let open = match self.open.get_mut(&key) {
            Some(open) => open,
            None => self.open.entry(key).or_insert(Open {
                generation: Generation(0),
                accumulator: Accumulator::with_bound(&self.key, self.bound)?,
            }),
        };
        if open.accumulator.is_full() {
            // The full generation's last state was written with the batch that filled it.
            open.generation = Generation(open.generation.0 + 1);
            open.accumulator = Accumulator::with_bound(&self.key, self.bound)?;
        }
        open.accumulator.absorb(ciphertexts, samples)?;
        self.dirty.insert(key);
        self.reports += 1;
        Ok(())
    }

    /// The records of every sum changed since the last call, stamped with `cursor`.
    pub fn take_dirty(&mut self, cursor: Cursor) -> Vec<AshRecord> {
        std::mem::take(&mut self.dirty)
            .into_iter()
            .filter_map(|key| {
                let open = self.open.get(&key)?;
                Some(AshRecord {
                    key,
                    generation: open.generation,
                    changed: cursor,
                    reports: open.accumulator.reports(),
                    samples: open.accumulator.samples(),
                    sums: open.accumulator.state_bytes(),
                })
            })
            .collect()
    }

    /// Rebuilds the open accumulators from stored records (the highest generation of each key
    /// is the open one); records of epochs that `is_open` says are closed stay in the store.
    pub fn load(
        key: &PublicKey,
        bound: u64,
        records: impl IntoIterator<Item = AshRecord>,
        is_open: impl Fn(EpochId) -> bool,
    ) -> Result<Self, AggregateError> {
        let mut sums = Self::new(key, bound)?;
        let mut latest: HashMap<SumKey, AshRecord> = HashMap::new();
        for record in records {
            sums.reports += record.reports;
            if !is_open(record.key.epoch) {
                continue;
            }
            match latest.get(&record.key) {
                Some(have) if have.generation >= record.generation => {}
                _ => {
                    latest.insert(record.key, record);
                }
            }
        }
        for (k, record) in latest {
            let accumulator =
                Accumulator::restore(key, bound, &record.sums, record.reports, record.samples)?;
            sums.open.insert(
                k,
                Open {
                    generation: record.generation,
                    accumulator,
                },
            );
        }
        Ok(sums)
    }

    /// Forgets the accumulators of `epoch`, which is closed: its sums are final in the store.
    /// Must follow a [`take_dirty`](Self::take_dirty), so that no change of it is unwritten.
    pub fn close(&mut self, epoch: EpochId) {
        self.open.retain(|k, _| k.epoch != epoch);
    }

    /// Open accumulators (one per key).
    pub fn open_count(&self) -> usize {
        self.open.len()
    }

    /// Reports in every generation, open or full.
    pub fn reports(&self) -> u64 {
        self.reports
    }
}
