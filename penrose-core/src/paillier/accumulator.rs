//! The aggregator's running sum of packed histograms: one multiplication mod n^2 per
//! ciphertext, and a hard stop before any slot could carry.

use rug::Integer;

use super::ciphertext::{Ciphertext, PackedCiphertexts};
use super::error::PaillierError;
use super::keys::{KeyId, PublicKey};
use super::params::{ACCUMULATOR_REPORT_BOUND, MAX_REPORT_SAMPLES};

/// Encrypted bin sums of up to [`ACCUMULATOR_REPORT_BOUND`] reports under one key. When it is
/// full, the aggregator starts a fresh one; the design server decrypts each and adds the
/// plaintext sums.
#[derive(Clone, Debug)]
pub struct Accumulator {
    key_id: KeyId,
    modulus_sq: Integer,
    ciphertext_bytes: usize,
    sums: Vec<Integer>,
    bound: u64,
    reports: u64,
    samples: u64,
}

impl Accumulator {
    /// An empty sum (every ciphertext 1, an encryption of zero) for `key`.
    pub fn new(key: &PublicKey) -> Self {
        Self {
            bound: ACCUMULATOR_REPORT_BOUND,
            key_id: key.key_id(),
            modulus_sq: key.nn().clone(),
            ciphertext_bytes: key.size().ciphertext_bytes(),
            sums: vec![Integer::from(1); key.size().ciphertexts_per_histogram()],
            reports: 0,
            samples: 0,
        }
    }

    /// An empty sum that holds at most `bound` reports, for an aggregator that wants smaller
    /// batches; `bound` may not exceed [`ACCUMULATOR_REPORT_BOUND`].
    pub fn with_bound(key: &PublicKey, bound: u64) -> Result<Self, PaillierError> {
        if bound > ACCUMULATOR_REPORT_BOUND {
            return Err(PaillierError::BoundTooLarge {
                bound,
                max: ACCUMULATOR_REPORT_BOUND,
            });
        }
        Ok(Self {
            bound,
            ..Self::new(key)
        })
    }

    /// Adds one report holding `samples` samples. Refuses, leaving the sum unchanged, when the
    /// report is for another key, claims more than [`MAX_REPORT_SAMPLES`], or the accumulator
    /// already holds its bound of reports.
    pub fn absorb(&mut self, report: &PackedCiphertexts, samples: u64) -> Result<(), PaillierError> {
        if report.key_id != self.key_id {
            return Err(PaillierError::KeyMismatch {
                expected: self.key_id,
                actual: report.key_id,
            });
        }
        if samples > MAX_REPORT_SAMPLES {
            return Err(PaillierError::TooManySamples {
                samples,
                max: MAX_REPORT_SAMPLES,
            });
        }
        if self.is_full() {
            return Err(PaillierError::AccumulatorFull { bound: self.bound });
        }
        for (sum, ciphertext) in self.sums.iter_mut().zip(&report.ciphertexts) {
            *sum *= &ciphertext.0;
            *sum %= &self.modulus_sq;
        }
        self.reports += 1;
        self.samples += samples;
        Ok(())
    }

    /// Whether the next [`absorb`](Self::absorb) would be refused for the bound.
    pub fn is_full(&self) -> bool {
        self.reports >= self.bound
    }

    /// The most reports this accumulator takes.
    pub fn bound(&self) -> u64 {
        self.bound
    }

    /// Reports absorbed so far.
    pub fn reports(&self) -> u64 {
        self.reports
    }

    /// Samples the absorbed reports claimed, summed.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// The key the sums are under.
    pub fn key_id(&self) -> KeyId {
        self.key_id
    }

    /// The encrypted sums, in the same form (and wire encoding) as one report's.
    pub fn sum(&self) -> PackedCiphertexts {
        PackedCiphertexts {
            key_id: self.key_id,
            ciphertexts: self.sums.iter().cloned().map(Ciphertext).collect(),
            ciphertext_bytes: self.ciphertext_bytes,
        }
    }
}
