//! The numbers that fix the packed layout and the accumulator bound.
//!
//! A 2048-bit modulus n satisfies n >= 2^2047, so a plaintext of 2047 bits always fits. With
//! slots of [`SLOT_BITS`] = 31 bits, floor(2047 / 31) = 66 slots fit in one plaintext and the
//! 128 bins need 2 ciphertexts (1024 bytes on the wire). 31 is the widest slot that keeps
//! 128 bins in 2 ciphertexts (32 bits would give 63 slots and need 3), so it buys the most
//! headroom for sums at the smallest report.

/// Bins per histogram: the counter catalogue's, re-exported where the packing needs it.
pub use crate::counters::BIN_COUNT;

/// Width of one packed slot: a slot holds a bin's sum over every report in an accumulator.
pub const SLOT_BITS: u32 = 31;

/// Largest sum a slot can hold without carrying into its neighbour.
pub const SLOT_MAX: u64 = (1 << SLOT_BITS) - 1;

/// A histogram is sealed after at most this many samples (docs/design.md section 3), so no bin of
/// one report can exceed it.
pub const MAX_REPORT_SAMPLES: u64 = 10_000;

/// The largest value one report may put in one bin: a bin counts samples.
pub const MAX_BIN_VALUE: u64 = MAX_REPORT_SAMPLES;

/// How many reports one accumulator may absorb: with every report at most [`MAX_BIN_VALUE`]
/// per bin, this many can never carry out of a slot. floor((2^31 - 1) / 10,000) = 214,748.
pub const ACCUMULATOR_REPORT_BOUND: u64 = SLOT_MAX / MAX_BIN_VALUE;

// The bound is safe (bound reports of maximal bins fit a slot) and tight (one more would not).
const _: () = assert!(ACCUMULATOR_REPORT_BOUND * MAX_BIN_VALUE <= SLOT_MAX);
const _: () = assert!((ACCUMULATOR_REPORT_BOUND + 1) * MAX_BIN_VALUE > SLOT_MAX);

/// Modulus sizes. Only [`KeySize::Bits2048`] is for deployment; the smaller sizes exist so that
/// tests can generate many keys quickly and are insecure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeySize {
    /// 512-bit modulus: tests only, insecure.
    Bits512,
    /// 1024-bit modulus: tests only, insecure.
    Bits1024,
    /// 2048-bit modulus: the deployed size.
    Bits2048,
}

impl KeySize {
    /// The size every deployed key has.
    pub const PRODUCTION: Self = Self::Bits2048;

    /// Bits of the modulus n (n has exactly this many).
    pub const fn modulus_bits(self) -> u32 {
        match self {
            Self::Bits512 => 512,
            Self::Bits1024 => 1024,
            Self::Bits2048 => 2048,
        }
    }

    pub(crate) const fn from_bits(bits: u16) -> Option<Self> {
        match bits {
            512 => Some(Self::Bits512),
            1024 => Some(Self::Bits1024),
            2048 => Some(Self::Bits2048),
            _ => None,
        }
    }

    /// Bytes of n, big-endian.
    pub const fn modulus_bytes(self) -> usize {
        self.modulus_bits() as usize / 8
    }

    /// Bytes of one prime factor.
    pub const fn prime_bytes(self) -> usize {
        self.modulus_bytes() / 2
    }

    /// Bytes of one ciphertext on the wire: fixed length, big-endian, mod n^2.
    pub const fn ciphertext_bytes(self) -> usize {
        2 * self.modulus_bytes()
    }

    /// Slots per plaintext: a plaintext must stay below n >= 2^(bits - 1).
    pub const fn slots_per_ciphertext(self) -> usize {
        ((self.modulus_bits() - 1) / SLOT_BITS) as usize
    }

    /// Ciphertexts per packed histogram.
    pub const fn ciphertexts_per_histogram(self) -> usize {
        BIN_COUNT.div_ceil(self.slots_per_ciphertext())
    }

    /// Bytes of one packed histogram on the wire.
    pub const fn packed_bytes(self) -> usize {
        self.ciphertexts_per_histogram() * self.ciphertext_bytes()
    }

    /// Bits of the Damgard-Jurik-Nielsen exponent: half the modulus, as in their paper.
    pub const fn djn_exponent_bits(self) -> u32 {
        self.modulus_bits() / 2
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn production_layout_matches_the_design() {
        let size = KeySize::PRODUCTION;
        assert_eq!(size.slots_per_ciphertext(), 66);
        assert_eq!(size.ciphertexts_per_histogram(), 2);
        assert_eq!(size.ciphertext_bytes(), 512);
        assert_eq!(size.packed_bytes(), 1024);
        assert_eq!(ACCUMULATOR_REPORT_BOUND, 214_748);
    }

    #[test]
    fn every_size_keeps_its_slots_below_the_modulus() {
        for size in [KeySize::Bits512, KeySize::Bits1024, KeySize::Bits2048] {
            let used = size.slots_per_ciphertext() as u32 * SLOT_BITS;
            assert!(used < size.modulus_bits());
            assert_eq!(KeySize::from_bits(size.modulus_bits() as u16), Some(size));
        }
    }
}
