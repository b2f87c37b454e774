//! The aggregator's running sum of packed histograms: one multiplication mod n^2 per
//! ciphertext, and a hard stop before any slot could carry.
//!
//! Units mod n^2 are closed under multiplication, and a non-unit factor keeps the product a
//! non-unit (p | c implies p | c x mod n^2). So whether every absorbed ciphertext was a unit is
//! known exactly from the sum alone, which is what lets [`Accumulator::absorb_bytes`] skip the
//! per-ciphertext gcd (see its docs).

use rug::Integer;

use super::ciphertext::{Ciphertext, PackedCiphertexts, assign_be};
use super::error::PaillierError;
use super::keys::{KeyId, PublicKey, push_fixed};
use super::params::{ACCUMULATOR_REPORT_BOUND, MAX_REPORT_SAMPLES};

/// Encrypted bin sums of up to [`ACCUMULATOR_REPORT_BOUND`] reports under one key. When it is
/// full, the aggregator starts a fresh one; the design server decrypts each and adds the
/// plaintext sums.
#[derive(Clone, Debug)]
pub struct Accumulator {
    key_id: KeyId,
    modulus: Integer,
    modulus_sq: Integer,
    ciphertext_bytes: usize,
    sums: Vec<Integer>,
    /// Parsed ciphertexts of the report being absorbed, kept to avoid allocating per report.
    scratch: Vec<Integer>,
    scratch_limbs: Vec<u64>,
    bound: u64,
    reports: u64,
    samples: u64,
}

impl Accumulator {
    /// An empty sum (every ciphertext 1, an encryption of zero) for `key`.
    pub fn new(key: &PublicKey) -> Self {
        let count = key.size().ciphertexts_per_histogram();
        Self {
            key_id: key.key_id(),
            modulus: key.n().clone(),
            modulus_sq: key.nn().clone(),
            ciphertext_bytes: key.size().ciphertext_bytes(),
            sums: vec![Integer::from(1); count],
            scratch: vec![Integer::new(); count],
            scratch_limbs: Vec::new(),
            bound: ACCUMULATOR_REPORT_BOUND,
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

    /// Adds one validated report holding `samples` samples. Refuses, leaving the sum
    /// unchanged, when the report is for another key, claims more than [`MAX_REPORT_SAMPLES`],
    /// or the accumulator already holds its bound of reports.
    pub fn absorb(
        &mut self,
        report: &PackedCiphertexts,
        samples: u64,
    ) -> Result<(), PaillierError> {
        if report.key_id != self.key_id {
            return Err(PaillierError::KeyMismatch {
                expected: self.key_id,
                actual: report.key_id,
            });
        }
        self.check_room(samples)?;
        for (sum, ciphertext) in self.sums.iter_mut().zip(&report.ciphertexts) {
            *sum *= &ciphertext.0;
            *sum %= &self.modulus_sq;
        }
        self.count(samples);
        Ok(())
    }

    /// Adds one report straight from its wire bytes: the aggregator's hot path.
    ///
    /// Checks the length and that every ciphertext is non-zero, below n^2 and not a multiple
    /// of n, with the same errors as [`PublicKey::validate_packed`]. The one check it leaves
    /// out is gcd(c, n) = 1 for c not a multiple of n: such a c is a multiple of p or q, so
    /// only someone who already knows the factorisation can make one, and it costs more than
    /// the multiplication itself. It is not lost: [`sum`](Self::sum) refuses a sum that
    /// is not a unit, which is exact (module docs). On any error the sum is unchanged.
    pub fn absorb_bytes(&mut self, bytes: &[u8], samples: u64) -> Result<(), PaillierError> {
        let expected = self.ciphertext_bytes * self.sums.len();
        if bytes.len() != expected {
            return Err(PaillierError::Length {
                expected,
                actual: bytes.len(),
            });
        }
        self.check_room(samples)?;
        for (parsed, chunk) in self
            .scratch
            .iter_mut()
            .zip(bytes.chunks_exact(self.ciphertext_bytes))
        {
            assign_be(parsed, chunk, &mut self.scratch_limbs);
            if *parsed == 0 {
                return Err(PaillierError::CiphertextZero);
            }
            if *parsed >= self.modulus_sq {
                return Err(PaillierError::CiphertextTooLarge);
            }
            if parsed.is_divisible(&self.modulus) {
                return Err(PaillierError::CiphertextNotUnit);
            }
        }
        for (sum, parsed) in self.sums.iter_mut().zip(&self.scratch) {
            *sum *= parsed;
            *sum %= &self.modulus_sq;
        }
        self.count(samples);
        Ok(())
    }

    /// The running sums as stored between batches: the ciphertexts, fixed length, big-endian,
    /// concatenated. Unlike [`sum`](Self::sum) it skips the unit check (two gcds), which the
    /// aggregator cannot afford after every write batch; [`restore`](Self::restore) reads it.
    pub fn state_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.sums.len() * self.ciphertext_bytes);
        for sum in &self.sums {
            push_fixed(&mut out, sum, self.ciphertext_bytes);
        }
        out
    }

    /// An accumulator of at most `bound` reports continuing from
    /// [`state_bytes`](Self::state_bytes) and its counts, as after a restart. Refuses sums of
    /// the wrong length, zero or not below n^2, and counts that the bound or
    /// [`MAX_REPORT_SAMPLES`] rule out, so that a damaged record cannot turn into a sum that
    /// silently carries.
    pub fn restore(
        key: &PublicKey,
        bound: u64,
        bytes: &[u8],
        reports: u64,
        samples: u64,
    ) -> Result<Self, PaillierError> {
        let mut acc = Self::with_bound(key, bound)?;
        let expected = acc.ciphertext_bytes * acc.sums.len();
        if bytes.len() != expected {
            return Err(PaillierError::Length {
                expected,
                actual: bytes.len(),
            });
        }
        if reports > acc.bound {
            return Err(PaillierError::AccumulatorFull { bound: acc.bound });
        }
        if samples > reports.saturating_mul(MAX_REPORT_SAMPLES) {
            return Err(PaillierError::TooManySamples {
                samples,
                max: reports.saturating_mul(MAX_REPORT_SAMPLES),
            });
        }
        let mut limbs = Vec::new();
        for (sum, chunk) in acc
            .sums
            .iter_mut()
            .zip(bytes.chunks_exact(acc.ciphertext_bytes))
        {
            assign_be(sum, chunk, &mut limbs);
            if *sum == 0 {
                return Err(PaillierError::CiphertextZero);
            }
            if *sum >= acc.modulus_sq {
                return Err(PaillierError::CiphertextTooLarge);
            }
        }
        acc.reports = reports;
        acc.samples = samples;
        Ok(acc)
    }

    fn check_room(&self, samples: u64) -> Result<(), PaillierError> {
        if samples > MAX_REPORT_SAMPLES {
            return Err(PaillierError::TooManySamples {
                samples,
                max: MAX_REPORT_SAMPLES,
            });
        }
        if self.is_full() {
            return Err(PaillierError::AccumulatorFull { bound: self.bound });
        }
        Ok(())
    }

    fn count(&mut self, samples: u64) {
        self.reports += 1;
        self.samples += samples;
    }

    /// Whether the next report would be refused for the bound.
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

    /// The encrypted sums, in the same form (and wire encoding) as one report's. Fails with
    /// [`PaillierError::CiphertextNotUnit`] if some absorbed ciphertext was not a unit: the sum
    /// would not decrypt to anything meaningful.
    pub fn sum(&self) -> Result<PackedCiphertexts, PaillierError> {
        if self
            .sums
            .iter()
            .any(|sum| Integer::from(sum.gcd_ref(&self.modulus)) != 1)
        {
            return Err(PaillierError::CiphertextNotUnit);
        }
        Ok(PackedCiphertexts {
            key_id: self.key_id,
            ciphertexts: self.sums.iter().cloned().map(Ciphertext).collect(),
            ciphertext_bytes: self.ciphertext_bytes,
        })
    }
}
