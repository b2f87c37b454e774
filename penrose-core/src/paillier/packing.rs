//! Bins <-> plaintexts. Bin i lives in plaintext i / s at bits [31 (i mod s), 31 (i mod s) + 31),
//! where s is the slots per plaintext: slot 0 is the least significant.

use rug::Integer;

use super::error::PaillierError;
use super::params::{BIN_COUNT, KeySize, MAX_BIN_VALUE, SLOT_BITS};

/// Packs one report's bins, refusing bins that would break the accumulator bound.
pub(crate) fn pack<B: Copy + Into<u64>>(
    bins: &[B],
    size: KeySize,
) -> Result<Vec<Integer>, PaillierError> {
    if bins.len() != BIN_COUNT {
        return Err(PaillierError::BinCount {
            expected: BIN_COUNT,
            actual: bins.len(),
        });
    }
    if let Some((index, value)) = bins
        .iter()
        .map(|&bin| bin.into())
        .enumerate()
        .find(|&(_, value)| value > MAX_BIN_VALUE)
    {
        return Err(PaillierError::BinTooLarge {
            index,
            value,
            max: MAX_BIN_VALUE,
        });
    }
    Ok(bins
        .chunks(size.slots_per_ciphertext())
        .map(|chunk| {
            chunk.iter().rev().fold(Integer::new(), |mut acc, &bin| {
                acc <<= SLOT_BITS;
                acc += bin.into();
                acc
            })
        })
        .collect())
}

/// Unpacks decrypted plaintexts into bin sums, refusing any plaintext with bits beyond its
/// slots (a slot carried: the sum is not trustworthy).
pub(crate) fn unpack(
    plaintexts: Vec<Integer>,
    size: KeySize,
) -> Result<[u64; BIN_COUNT], PaillierError> {
    let slots = size.slots_per_ciphertext();
    let mut bins = [0u64; BIN_COUNT];
    for (index, (mut plaintext, chunk)) in plaintexts
        .into_iter()
        .zip(bins.chunks_mut(slots))
        .enumerate()
    {
        if plaintext.significant_bits() > chunk.len() as u32 * SLOT_BITS {
            return Err(PaillierError::PlaintextOverflow { ciphertext: index });
        }
        for bin in chunk.iter_mut() {
            let slot = Integer::from(plaintext.keep_bits_ref(SLOT_BITS));
            // A slot has SLOT_BITS < 64 bits, so it always fits.
            *bin = slot.to_u64().unwrap_or(u64::MAX);
            plaintext >>= SLOT_BITS;
        }
    }
    Ok(bins)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_places_bins_in_documented_slots() {
        let bins: Vec<u64> = (0..BIN_COUNT as u64).map(|i| i * 77 % 10_001).collect();
        let size = KeySize::Bits2048;
        let packed = pack(&bins, size).unwrap();
        assert_eq!(packed.len(), 2);
        // Bin 67 is slot 1 of plaintext 1.
        let slot = Integer::from(&packed[1] >> SLOT_BITS).keep_bits(SLOT_BITS);
        assert_eq!(slot, bins[67]);
        assert_eq!(unpack(packed, size).unwrap().to_vec(), bins);
    }

    #[test]
    fn refuses_bad_bins_and_overflowed_plaintexts() {
        let mut bins = [0u32; BIN_COUNT];
        bins[5] = MAX_BIN_VALUE as u32 + 1;
        assert!(matches!(
            pack(&bins, KeySize::Bits512),
            Err(PaillierError::BinTooLarge { index: 5, .. })
        ));
        assert!(matches!(
            pack(&bins[..10], KeySize::Bits512),
            Err(PaillierError::BinCount { actual: 10, .. })
        ));
        let size = KeySize::Bits2048;
        // The last plaintext holds 62 slots: a bit above them is an overflow.
        let over = vec![Integer::new(), Integer::from(1) << (62 * SLOT_BITS)];
        assert_eq!(
            unpack(over, size),
            Err(PaillierError::PlaintextOverflow { ciphertext: 1 })
        );
    }
}
