//! Property: the snippet-hash estimate stays close to the exact Jaccard similarity.
//!
//! Bound: 4 standard deviations of the estimator at the exact similarity J
//! ([`FingerprintParams::estimate_std_dev`]: sqrt(p(1-p)/k) / (1-r), p = J + (1-J) r,
//! r = 2^-b), plus one step of the estimator, 1 / (k (1-r)), for the discreteness of p̂. For
//! a normal approximation 4 standard deviations fail once in about 16,000 pairs; the proptest
//! seed is fixed so that the run is reproducible.

use std::collections::HashMap;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

use super::{FingerprintParams, Fingerprinter, ShingleKey, Weighting, shingle_keys};

fn exact(a: &[ShingleKey], b: &[ShingleKey], weighting: Weighting) -> f64 {
    let mut counts: HashMap<ShingleKey, (u32, u32)> = HashMap::new();
    for k in a {
        counts.entry(*k).or_default().0 += 1;
    }
    for k in b {
        counts.entry(*k).or_default().1 += 1;
    }
    let (mut num, mut den) = (0u64, 0u64);
    for &(x, y) in counts.values() {
        let (x, y) = match weighting {
            Weighting::Set => (x.min(1), y.min(1)),
            Weighting::Counts => (x, y),
        };
        num += u64::from(x.min(y));
        den += u64::from(x.max(y));
    }
    if den == 0 {
        1.0
    } else {
        num as f64 / den as f64
    }
}

/// A base sequence over a small alphabet and a copy in which a share of launches is replaced,
/// so that similarities spread over [0, 1].
fn pair() -> impl Strategy<Value = (Vec<String>, Vec<String>)> {
    (3u32..60, 50usize..1500, 0.0f64..1.0, any::<u64>()).prop_map(
        |(alphabet, len, mutate, seed)| {
            let mut state = seed | 1;
            let mut next = move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state
            };
            let base: Vec<u32> = (0..len)
                .map(|_| (next() % u64::from(alphabet)) as u32)
                .collect();
            let other: Vec<u32> = base
                .iter()
                .map(|&k| {
                    if (next() % 10_000) as f64 / 10_000.0 < mutate {
                        (next() % u64::from(2 * alphabet)) as u32
                    } else {
                        k
                    }
                })
                .collect();
            let names = |v: &[u32]| v.iter().map(|k| format!("kernel_{k}")).collect();
            (names(&base), names(&other))
        },
    )
}

fn check(weighting: Weighting, a: &[String], b: &[String]) -> Result<(), TestCaseError> {
    let params = FingerprintParams {
        weighting,
        ..FingerprintParams::default()
    };
    let f = Fingerprinter::new(params).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let j = exact(
        &shingle_keys(a, params.ngram_len),
        &shingle_keys(b, params.ngram_len),
        weighting,
    );
    let estimate = f.similarity(&f.snippet_hash(a), &f.snippet_hash(b));
    let r = params.chance_collision();
    let bound = 4.0 * params.estimate_std_dev(j) + 1.0 / (params.num_hashes as f64 * (1.0 - r));
    prop_assert!(
        (estimate - j).abs() <= bound,
        "exact {j:.3}, estimate {estimate:.3}, bound {bound:.3}"
    );
    Ok(())
}

fn config() -> Config {
    Config {
        cases: 128,
        rng_seed: RngSeed::Fixed(0x5045_4e52),
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn set_estimate_within_four_sd((a, b) in pair()) {
        check(Weighting::Set, &a, &b)?;
    }

    #[test]
    fn weighted_estimate_within_four_sd((a, b) in pair()) {
        check(Weighting::Counts, &a, &b)?;
    }
}
