//! The aggregator's running sum of packed histograms: one multiplication mod n^2 per
//! ciphertext, and a hard stop before any slot could carry.
//!
//! Units mod n^2 are closed under multiplication, and a non-unit factor keeps the product a
//! non-unit (p | c implies p | c x mod n^2). So whether every absorbed ciphertext was a unit is
//! known exactly from the sum alone, which is what lets [`Accumulator::absorb_bytes`] skip the
//! per-ciphertext gcd (see its docs).
//!
//! The sums are kept in the form Montgomery multiplication leaves them in (`montgomery`
//! module): after k reports each is `S R^-k mod n^2`, which [`Accumulator::sum`] turns back
//! into S with one exponentiation. That form is also what [`Accumulator::state_bytes`]
//! stores, so the factor never has to be removed on the hot path.

use std::sync::Arc;

use rug::Integer;

use super::ciphertext::{Ciphertext, PackedCiphertexts, assign_be};
use super::error::PaillierError;
use super::keys::{KeyId, PublicKey};
use super::montgomery::{Limb, Montgomery, Scratch, from_limbs, push_limbs_be, to_limbs};
use super::params::{ACCUMULATOR_REPORT_BOUND, MAX_REPORT_SAMPLES};

const LIMB_BYTES: usize = Limb::BITS as usize / 8;

/// Encrypted bin sums of up to [`ACCUMULATOR_REPORT_BOUND`] reports under one key. When it is
/// full, the aggregator starts a fresh one; the design server decrypts each and adds the
/// plaintext sums.
#[derive(Clone, Debug)]
pub struct Accumulator {
    key_id: KeyId,
    modulus: Integer,
    modulus_sq: Integer,
    mont: Arc<Montgomery>,
    ciphertext_bytes: usize,
    /// Ciphertexts per histogram.
    count: usize,
    /// `count` runs of `mont.limbs()` limbs each: sum_i * R^-reports mod n^2.
    states: Vec<Limb>,
    /// The report being absorbed, as limbs, checked in full before any state changes.
    incoming: Vec<Limb>,
    parsed: Integer,
    byte_limbs: Vec<u64>,
    scratch: Scratch,
    bound: u64,
    reports: u64,
    samples: u64,
}

impl Accumulator {
    /// An empty sum (every ciphertext 1, an encryption of zero) for `key`.
    pub fn new(key: &PublicKey) -> Self {
        let count = key.size().ciphertexts_per_histogram();
        let mont = Arc::clone(key.mont_nn());
        let limbs = mont.limbs();
        let mut states = vec![0; count * limbs];
        // The empty product, 1 (R^-0 = 1, so no scaling yet).
        for state in states.chunks_exact_mut(limbs) {
            state[0] = 1;
        }
        Self {
            key_id: key.key_id(),
            modulus: key.n().clone(),
            modulus_sq: key.nn().clone(),
            ciphertext_bytes: key.size().ciphertext_bytes(),
            count,
            states,
            incoming: vec![0; count * limbs],
            parsed: Integer::new(),
            byte_limbs: Vec::new(),
            scratch: mont.scratch(),
            mont,
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
        if report.ciphertexts.len() != self.count {
            return Err(PaillierError::Length {
                expected: self.count * self.ciphertext_bytes,
                actual: report.ciphertexts.len() * self.ciphertext_bytes,
            });
        }
        let limbs = self.mont.limbs();
        for (incoming, ciphertext) in self
            .incoming
            .chunks_exact_mut(limbs)
            .zip(&report.ciphertexts)
        {
            to_limbs(&ciphertext.0, incoming);
        }
        self.multiply_incoming()?;
        self.count(samples);
        Ok(())
    }

    /// Multiplies every state by its incoming ciphertext (already checked).
    fn multiply_incoming(&mut self) -> Result<(), PaillierError> {
        let limbs = self.mont.limbs();
        for (state, incoming) in self
            .states
            .chunks_exact_mut(limbs)
            .zip(self.incoming.chunks_exact(limbs))
        {
            // Every buffer was sized from this modulus in `new`, so the lengths always match.
            if !self.mont.mul_assign(state, incoming, &mut self.scratch) {
                return Err(PaillierError::Length {
                    expected: limbs * LIMB_BYTES,
                    actual: state.len() * LIMB_BYTES,
                });
            }
        }
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
        let expected = self.ciphertext_bytes * self.count;
        if bytes.len() != expected {
            return Err(PaillierError::Length {
                expected,
                actual: bytes.len(),
            });
        }
        self.check_room(samples)?;
        let limbs = self.mont.limbs();
        for (incoming, chunk) in self
            .incoming
            .chunks_exact_mut(limbs)
            .zip(bytes.chunks_exact(self.ciphertext_bytes))
        {
            assign_be(&mut self.parsed, chunk, &mut self.byte_limbs);
            if self.parsed == 0 {
                return Err(PaillierError::CiphertextZero);
            }
            if self.parsed >= self.modulus_sq {
                return Err(PaillierError::CiphertextTooLarge);
            }
            if self.parsed.is_divisible(&self.modulus) {
                return Err(PaillierError::CiphertextNotUnit);
            }
            to_limbs(&self.parsed, incoming);
        }
        self.multiply_incoming()?;
        self.count(samples);
        Ok(())
    }

    /// The running state as stored between batches: per ciphertext `S R^-reports mod n^2`
    /// (module docs), fixed length, big-endian, concatenated. It is not a sum a design server
    /// could decrypt, and unlike [`sum`](Self::sum) it costs neither the exponentiation that
    /// removes R^-reports nor the unit check, which the aggregator cannot afford after every
    /// write batch; [`restore`](Self::restore) reads it back.
    pub fn state_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.count * self.ciphertext_bytes);
        // A state is below n^2, so it fits the ciphertext length (R may have more limbs).
        for state in self.states.chunks_exact(self.mont.limbs()) {
            push_limbs_be(&mut out, state, self.ciphertext_bytes);
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
        let expected = acc.ciphertext_bytes * acc.count;
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
        let limbs = acc.mont.limbs();
        for (state, chunk) in acc
            .states
            .chunks_exact_mut(limbs)
            .zip(bytes.chunks_exact(acc.ciphertext_bytes))
        {
            assign_be(&mut acc.parsed, chunk, &mut acc.byte_limbs);
            if acc.parsed == 0 {
                return Err(PaillierError::CiphertextZero);
            }
            if acc.parsed >= acc.modulus_sq {
                return Err(PaillierError::CiphertextTooLarge);
            }
            to_limbs(&acc.parsed, state);
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
    ///
    /// Costs one exponentiation mod n^2 (removing the Montgomery factor of every absorbed
    /// report, module docs) and a gcd per ciphertext: for export, not for every batch.
    pub fn sum(&self) -> Result<PackedCiphertexts, PaillierError> {
        let factor = self.mont.r_power(self.reports);
        let ciphertexts = self
            .states
            .chunks_exact(self.mont.limbs())
            .map(|state| {
                let sum = Integer::from(&factor * &from_limbs(state)) % &self.modulus_sq;
                if Integer::from(sum.gcd_ref(&self.modulus)) != 1 {
                    return Err(PaillierError::CiphertextNotUnit);
                }
                Ok(Ciphertext(sum))
            })
            .collect::<Result<_, _>>()?;
        Ok(PackedCiphertexts {
            key_id: self.key_id,
            ciphertexts,
            ciphertext_bytes: self.ciphertext_bytes,
        })
    }
}
