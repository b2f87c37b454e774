//! What the transport tests share: a well-formed report whose content does not matter.
#![allow(clippy::unwrap_used, dead_code)]

use penrose_core::counters::{CatalogueVersion, CounterId};
use penrose_core::fingerprint::SnippetHash;
use penrose_core::histogram::SampleCount;
use penrose_core::paillier::KeyId;
use penrose_core::wire::{Day, PackedBytes, Report, ReportId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// A report of two random 128-byte "ciphertexts" (the transport never looks inside), seeded.
pub fn report(seed: u64) -> Report {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let ciphertexts: Vec<u8> = (0..2 * 128).map(|_| rng.random()).collect();
    Report {
        key_id: KeyId([7; 32]),
        report_id: ReportId(rng.random()),
        snippet: SnippetHash(rng.random()),
        locator: penrose_core::fingerprint::Locator([0; penrose_core::fingerprint::LOCATOR_BANDS]),
        arch: penrose_core::gpu::GpuArch::new(9, 0),
        counter: CounterId(3),
        catalogue: CatalogueVersion(1),
        day: Day(20_500),
        samples: SampleCount(1_000),
        ciphertexts: PackedBytes::new(ciphertexts, 2).unwrap(),
        token: None,
        evidence: None,
    }
}
