//! Decrypting the merged aggregates above the contributor threshold, and what architects read.
//!
//! The threshold is applied per accumulator: a generation of a (class, counter) sum is
//! decrypted only when at least k distinct reports contributed to it (default 10), because
//! its plaintext is a sum of that many histograms and no fewer. A (class, counter) with no
//! generation above the threshold is listed as held back, with its count, and nothing of it is
//! decrypted. Decrypted generations of one (class, counter) are added bin by bin.

use std::collections::BTreeMap;

use penrose_core::bundle::ClassId;
use penrose_core::counters::{BIN_COUNT, Bin, Binning, Catalogue, CatalogueVersion, CounterId};
use penrose_core::paillier::{PaillierError, PrivateKey};
use thiserror::Error;

use crate::archive::Aggregates;

/// The contributor threshold of DESIGN.md section 7.
pub const DEFAULT_THRESHOLD: Threshold = Threshold(10);

/// k: the fewest distinct reports an aggregate must hold to be decrypted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Threshold(pub u64);

/// Why a report could not be made.
#[derive(Debug, Error)]
pub enum ReportError {
    /// The aggregates are under another key than the private key given.
    #[error(transparent)]
    Decrypt(#[from] PaillierError),
    /// The sums' ciphertexts do not validate under the public key.
    #[error("class {class}, counter {counter}: {source}")]
    Ciphertext {
        /// Class.
        class: u32,
        /// Counter.
        counter: u16,
        /// Why.
        #[source]
        source: PaillierError,
    },
}

/// One decrypted (class, counter).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CounterReport {
    /// The class.
    pub class: u32,
    /// Catalogue version.
    pub catalogue: u16,
    /// Counter id.
    pub counter: u16,
    /// Counter name (`?` if the catalogue does not know it).
    pub name: String,
    /// Unit suffix.
    pub unit: String,
    /// Reports in the decrypted generations.
    pub reports: u64,
    /// Samples those reports claimed.
    pub samples: u64,
    /// Generations decrypted.
    pub generations: usize,
    /// Reports in generations held back (below the threshold on their own).
    pub held_back_reports: u64,
    /// Bin sums, 128 of them.
    pub bins: Vec<u64>,
    /// Mean at bin resolution (bin representatives).
    pub mean: Option<f64>,
    /// Median, 90th and 99th percentiles at bin resolution.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
}

/// A (class, counter) not decrypted.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct HeldBack {
    /// Class.
    pub class: u32,
    /// Counter id.
    pub counter: u16,
    /// Reports in it, all generations.
    pub reports: u64,
}

/// The whole report.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Report {
    /// The threshold applied.
    pub threshold: Threshold,
    /// Bundles merged.
    pub bundles: usize,
    /// The decrypted (class, counter) histograms.
    pub decrypted: Vec<CounterReport>,
    /// The (class, counter)s under the threshold.
    pub held_back: Vec<HeldBack>,
}

impl Report {
    /// Classes with at least one decrypted counter.
    pub fn classes(&self) -> usize {
        let mut classes: Vec<u32> = self.decrypted.iter().map(|c| c.class).collect();
        classes.dedup();
        classes.len()
    }
}

/// Decrypts every accumulator generation with at least `threshold` reports.
pub fn build(
    aggregates: &Aggregates,
    key: &PrivateKey,
    threshold: Threshold,
) -> Result<Report, ReportError> {
    type Key = (ClassId, CatalogueVersion, CounterId);
    let mut grouped: BTreeMap<Key, Vec<&penrose_core::bundle::BundleEntry>> = BTreeMap::new();
    for (k, entry) in &aggregates.entries {
        grouped
            .entry((k.class, k.catalogue, k.counter))
            .or_default()
            .push(entry);
    }
    let mut decrypted = Vec::new();
    let mut held_back = Vec::new();
    for ((class, catalogue, counter), entries) in grouped {
        let mut bins = [0u64; BIN_COUNT];
        let (mut reports, mut samples, mut generations, mut held) = (0u64, 0u64, 0usize, 0u64);
        for entry in entries {
            if entry.reports < threshold.0 {
                held += entry.reports;
                continue;
            }
            let packed = key
                .public_key()
                .validate_packed(entry.sums.as_bytes())
                .map_err(|source| ReportError::Ciphertext {
                    class: class.0,
                    counter: counter.0,
                    source,
                })?;
            let sums = key.decrypt_packed(&packed)?;
            for (b, s) in bins.iter_mut().zip(sums) {
                *b += s;
            }
            reports += entry.reports;
            samples += entry.samples;
            generations += 1;
        }
        if generations == 0 {
            held_back.push(HeldBack {
                class: class.0,
                counter: counter.0,
                reports: held,
            });
            continue;
        }
        let known = Catalogue::by_version(catalogue).and_then(|c| c.counter(counter));
        let binning = known.map(|c| c.binning);
        decrypted.push(CounterReport {
            class: class.0,
            catalogue: catalogue.0,
            counter: counter.0,
            name: known.map_or("?".into(), |c| c.name.to_string()),
            unit: known.map_or(String::new(), |c| c.unit.suffix().to_string()),
            reports,
            samples,
            generations,
            held_back_reports: held,
            mean: binning.and_then(|b| mean(&bins, &b)),
            p50: binning.and_then(|b| quantile(&bins, &b, 0.5)),
            p90: binning.and_then(|b| quantile(&bins, &b, 0.9)),
            p99: binning.and_then(|b| quantile(&bins, &b, 0.99)),
            bins: bins.to_vec(),
        });
    }
    Ok(Report {
        threshold,
        bundles: aggregates.bundles,
        decrypted,
        held_back,
    })
}

fn bin(i: usize) -> Bin {
    Bin::new(i).unwrap_or(Bin::LAST)
}

/// The mean of the bins' representative values, weighted by their counts.
pub fn mean(bins: &[u64; BIN_COUNT], binning: &Binning) -> Option<f64> {
    let total: u64 = bins.iter().sum();
    if total == 0 {
        return None;
    }
    let sum: f64 = bins
        .iter()
        .enumerate()
        .map(|(i, &c)| c as f64 * binning.representative(bin(i)))
        .sum();
    Some(sum / total as f64)
}

/// The representative value of the bin holding the q-quantile.
pub fn quantile(bins: &[u64; BIN_COUNT], binning: &Binning, q: f64) -> Option<f64> {
    let total: u64 = bins.iter().sum();
    if total == 0 || !(0.0..=1.0).contains(&q) {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).max(1);
    let mut seen = 0u64;
    for (i, &c) in bins.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return Some(binning.representative(bin(i)));
        }
    }
    None
}

/// The report as CSV: one row per non-empty bin of each decrypted (class, counter), with the
/// bin's edges, so a spreadsheet can plot it.
pub fn to_csv(report: &Report) -> String {
    let mut out = String::from("class,counter,name,unit,reports,samples,bin,low,high,count\n");
    for c in &report.decrypted {
        let binning = Catalogue::by_version(CatalogueVersion(c.catalogue))
            .and_then(|cat| cat.counter(CounterId(c.counter)))
            .map(|k| k.binning);
        for (i, &count) in c.bins.iter().enumerate() {
            if count == 0 {
                continue;
            }
            let (lo, hi) = binning.map_or((f64::NAN, f64::NAN), |b| b.edges(bin(i)));
            out.push_str(&format!(
                "{},{},{},{},{},{},{},{},{},{}\n",
                c.class, c.counter, c.name, c.unit, c.reports, c.samples, i, lo, hi, count
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_quantiles_follow_the_bins() {
        let binning = Binning::Linear {
            min: 0.0,
            max: 128.0,
        };
        let mut bins = [0u64; BIN_COUNT];
        bins[10] = 90;
        bins[100] = 10;
        assert_eq!(quantile(&bins, &binning, 0.5), Some(10.5));
        assert_eq!(quantile(&bins, &binning, 0.9), Some(10.5));
        assert_eq!(quantile(&bins, &binning, 0.99), Some(100.5));
        let m = mean(&bins, &binning).unwrap();
        assert!((m - (0.9 * 10.5 + 0.1 * 100.5)).abs() < 1e-9);
        assert_eq!(mean(&[0; BIN_COUNT], &binning), None);
    }
}
