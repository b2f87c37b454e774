//! Histograms of sampled counter values: what an agent accumulates per (local application,
//! counter) and what the design server finally decrypts.

use std::time::Duration;

use thiserror::Error;

use crate::counters::{BIN_COUNT, Bin, Binning};

/// The agent's seal age: a histogram is sealed this long after it opened unless it filled
/// first (300 s; the paper's agent and ours before used one hour). A short age lets slow
/// samplers contribute within minutes; T still caps reports per (counter, day). Chosen from the
/// fleet simulator together with [`crate::sampling::DEFAULT_SAMPLE_PERIOD`]
/// (docs/evaluation.md, "Steering by the ack").
pub const DEFAULT_SEAL_MAX_AGE: Duration = Duration::from_secs(300);

/// How many samples a histogram holds. Reports carry it in clear so that the aggregator can
/// bound sums without decrypting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SampleCount(pub u32);

/// A 128-bin histogram of one counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Histogram {
    bins: [u32; BIN_COUNT],
    samples: SampleCount,
}

/// Why a sample or a merge was refused.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum HistogramError {
    /// Adding would overflow a 32-bit count; the caller should have sealed the histogram long
    /// before (the seal size is far below this).
    #[error("histogram is full: {held} samples held")]
    Full {
        /// Samples already held.
        held: u32,
    },
    /// Counts given to [`Histogram::from_bins`] did not have [`BIN_COUNT`] entries.
    #[error("expected {BIN_COUNT} bins, got {0}")]
    WrongBinCount(usize),
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Histogram {
            bins: [0; BIN_COUNT],
            samples: SampleCount(0),
        }
    }

    /// Builds a histogram from counts, for example decrypted sums.
    pub fn from_bins(bins: &[u32]) -> Result<Self, HistogramError> {
        let bins: [u32; BIN_COUNT] = bins
            .try_into()
            .map_err(|_| HistogramError::WrongBinCount(bins.len()))?;
        let total: u64 = bins.iter().map(|&b| u64::from(b)).sum();
        let samples = u32::try_from(total).map_err(|_| HistogramError::Full { held: u32::MAX })?;
        Ok(Histogram {
            bins,
            samples: SampleCount(samples),
        })
    }

    /// Counts one sample in `bin`.
    pub fn record(&mut self, bin: Bin) -> Result<(), HistogramError> {
        let held = self.samples.0;
        let samples = held.checked_add(1).ok_or(HistogramError::Full { held })?;
        // The bin can never exceed the total, so it cannot overflow when the total did not.
        self.bins[bin.index()] += 1;
        self.samples = SampleCount(samples);
        Ok(())
    }

    /// Adds another histogram's counts into this one, or changes nothing if that would overflow.
    pub fn merge(&mut self, other: &Histogram) -> Result<(), HistogramError> {
        let held = self.samples.0;
        let samples = held
            .checked_add(other.samples.0)
            .ok_or(HistogramError::Full { held })?;
        for (mine, theirs) in self.bins.iter_mut().zip(other.bins.iter()) {
            *mine += theirs;
        }
        self.samples = SampleCount(samples);
        Ok(())
    }

    /// The counts, bin by bin.
    pub fn bins(&self) -> &[u32; BIN_COUNT] {
        &self.bins
    }

    /// The number of samples counted.
    pub fn samples(&self) -> SampleCount {
        self.samples
    }

    /// The largest count in any bin; the packing bound depends on it.
    pub fn max_bin(&self) -> u32 {
        self.bins.iter().copied().max().unwrap_or(0)
    }

    /// Mean of the samples, each standing at its bin's representative value. `None` when empty.
    pub fn mean(&self, binning: &Binning) -> Option<f64> {
        if self.samples.0 == 0 {
            return None;
        }
        let sum: f64 = self
            .nonzero()
            .map(|(bin, count)| f64::from(count) * binning.representative(bin))
            .sum();
        Some(sum / f64::from(self.samples.0))
    }

    /// The `q`-quantile (0 to 1) as the representative value of the bin holding it: the
    /// resolution of a histogram is its bin width, and claiming more would be false precision.
    pub fn quantile(&self, binning: &Binning, q: f64) -> Option<f64> {
        if self.samples.0 == 0 || !(0.0..=1.0).contains(&q) {
            return None;
        }
        // The rank of the quantile sample, 1-based, at least 1.
        let rank = ((q * f64::from(self.samples.0)).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (bin, count) in self.nonzero() {
            seen += u64::from(count);
            if seen >= rank {
                return Some(binning.representative(bin));
            }
        }
        None
    }

    fn nonzero(&self) -> impl Iterator<Item = (Bin, u32)> + '_ {
        self.bins
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .filter_map(|(i, &c)| Bin::new(i).map(|b| (b, c)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::CATALOGUE_V1;
    use proptest::prelude::*;

    #[test]
    fn record_counts_and_statistics() {
        let binning = Binning::Linear {
            min: 0.0,
            max: 128.0,
        };
        let mut h = Histogram::new();
        for v in [1.0, 1.5, 2.0, 100.0] {
            h.record(binning.bin(v).unwrap()).unwrap();
        }
        assert_eq!(h.samples(), SampleCount(4));
        assert_eq!(h.bins()[1], 2);
        assert_eq!(h.bins()[2], 1);
        assert_eq!(h.bins()[100], 1);
        assert_eq!(h.quantile(&binning, 0.5), Some(1.5));
        assert_eq!(h.quantile(&binning, 1.0), Some(100.5));
        assert_eq!(h.mean(&binning), Some((1.5 * 2.0 + 2.5 + 100.5) / 4.0));
        assert_eq!(Histogram::new().mean(&binning), None);
    }

    #[test]
    fn full_histogram_refuses_and_is_unchanged() {
        let mut bins = [0u32; BIN_COUNT];
        bins[3] = u32::MAX;
        let mut h = Histogram::from_bins(&bins).unwrap();
        let before = h.clone();
        assert_eq!(
            h.record(Bin::FIRST),
            Err(HistogramError::Full { held: u32::MAX })
        );
        assert!(h.merge(&before).is_err());
        assert_eq!(h, before);
        assert_eq!(
            Histogram::from_bins(&[1, 2]),
            Err(HistogramError::WrongBinCount(2))
        );
    }

    proptest! {
        #[test]
        fn merge_adds_bin_by_bin(a in proptest::collection::vec(0u32..1000, BIN_COUNT),
                                 b in proptest::collection::vec(0u32..1000, BIN_COUNT)) {
            let mut x = Histogram::from_bins(&a).unwrap();
            let y = Histogram::from_bins(&b).unwrap();
            x.merge(&y).unwrap();
            for i in 0..BIN_COUNT {
                prop_assert_eq!(x.bins()[i], a[i] + b[i]);
            }
            prop_assert_eq!(x.samples().0 as u64, a.iter().chain(&b).map(|&v| v as u64).sum::<u64>());
            let binning = CATALOGUE_V1.counters[0].binning;
            let median = x.quantile(&binning, 0.5);
            prop_assert_eq!(median.is_some(), x.samples().0 > 0);
        }
    }
}
