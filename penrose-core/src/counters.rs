//! The counter catalogue: which performance counters exist, in which unit, and how a value is
//! binned into one of [`BIN_COUNT`] bins.
//!
//! The catalogue is versioned because a report's bins only mean something against the binning
//! that produced them: an aggregator must never add a histogram binned one way to a histogram
//! binned another way, so every report names its [`CatalogueVersion`] and the aggregator refuses
//! versions it does not know.

use thiserror::Error;

/// Number of bins in every histogram. Fixed by the wire format and the packing of ciphertexts.
pub const BIN_COUNT: usize = 128;

/// Identifies a counter within a catalogue version; carried in every report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterId(pub u16);

/// The version of the catalogue a report was binned against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CatalogueVersion(pub u16);

/// A set of counters a GPU can read together; the agent rotates through groups, one per period,
/// because hardware exposes only a few counters at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterGroup(pub u8);

/// The index of one of the [`BIN_COUNT`] bins. Construction checks the range, so holding a
/// `Bin` is proof that indexing a histogram with it is in bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Bin(u8);

impl Bin {
    /// The first bin, where values at or below the range's lower edge land.
    pub const FIRST: Bin = Bin(0);
    /// The last bin, where values at or above the range's upper edge land.
    pub const LAST: Bin = Bin((BIN_COUNT - 1) as u8);

    /// Returns the bin with this index, or `None` when it is not below [`BIN_COUNT`].
    pub fn new(index: usize) -> Option<Bin> {
        if index < BIN_COUNT {
            u8::try_from(index).ok().map(Bin)
        } else {
            None
        }
    }

    /// The bin's position in a histogram's array.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// The unit a counter is measured in; decides how reports present it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Percent of a hardware maximum, 0 to 100.
    Percent,
    /// Nanoseconds of wall-clock time.
    Nanoseconds,
    /// Bytes.
    Bytes,
    /// A plain count (registers, blocks).
    Count,
}

impl Unit {
    /// A short suffix for tables and plots.
    pub fn suffix(self) -> &'static str {
        match self {
            Unit::Percent => "%",
            Unit::Nanoseconds => "ns",
            Unit::Bytes => "B",
            Unit::Count => "",
        }
    }
}

/// How a value maps to a bin. Linear suits bounded quantities (percentages); logarithmic suits
/// quantities spanning orders of magnitude (durations, byte counts), where a linear scale would
/// put nearly everything into the first bin.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Binning {
    /// `BIN_COUNT` equal-width bins over `[min, max)`.
    Linear {
        /// Lower edge of bin 0.
        min: f64,
        /// Upper edge of the last bin.
        max: f64,
    },
    /// `BIN_COUNT` bins of equal width in `ln(value)` over `[min, max)`; `min` must be positive.
    Log {
        /// Lower edge of bin 0 (positive).
        min: f64,
        /// Upper edge of the last bin.
        max: f64,
    },
}

/// Why a value could not be binned.
#[derive(Clone, Copy, Debug, Error, PartialEq)]
pub enum BinningError {
    /// NaN carries no position; binning it anywhere would invent data.
    #[error("counter value is NaN")]
    NotANumber,
}

impl Binning {
    /// Maps a value to its bin. Values below the range go to the first bin and values at or
    /// above it to the last, so that nothing sampled is lost; only NaN is refused.
    pub fn bin(&self, value: f64) -> Result<Bin, BinningError> {
        if value.is_nan() {
            return Err(BinningError::NotANumber);
        }
        let position = match *self {
            Binning::Linear { min, max } => (value - min) / (max - min),
            Binning::Log { min, max } => {
                if value <= min {
                    return Ok(Bin::FIRST);
                }
                (value / min).ln() / (max / min).ln()
            }
        };
        // `position` may be infinite for infinite inputs; the comparisons below send those to
        // the edge bins before any cast.
        if position <= 0.0 {
            return Ok(Bin::FIRST);
        }
        let scaled = position * BIN_COUNT as f64;
        if scaled >= (BIN_COUNT - 1) as f64 {
            return Ok(Bin::LAST);
        }
        // In range [0, BIN_COUNT - 1) here, so the truncating cast is exact and in bounds.
        Ok(Bin::new(scaled as usize).unwrap_or(Bin::LAST))
    }

    /// The lower and upper edge of a bin, for plots and for estimating statistics.
    pub fn edges(&self, bin: Bin) -> (f64, f64) {
        let i = bin.index() as f64;
        let n = BIN_COUNT as f64;
        match *self {
            Binning::Linear { min, max } => {
                let width = (max - min) / n;
                (min + i * width, min + (i + 1.0) * width)
            }
            Binning::Log { min, max } => {
                let ratio = (max / min).ln() / n;
                (min * (i * ratio).exp(), min * ((i + 1.0) * ratio).exp())
            }
        }
    }

    /// One value standing for the whole bin: the arithmetic midpoint for linear bins, the
    /// geometric one for logarithmic bins (the midpoint of the bin on its own scale).
    pub fn representative(&self, bin: Bin) -> f64 {
        let (lo, hi) = self.edges(bin);
        match self {
            Binning::Linear { .. } => (lo + hi) / 2.0,
            Binning::Log { .. } => (lo * hi).sqrt(),
        }
    }
}

/// One counter of the catalogue.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Counter {
    /// Stable id within the catalogue version.
    pub id: CounterId,
    /// Short machine name, used in reports and on the command line.
    pub name: &'static str,
    /// What the counter measures, for architects reading a report.
    pub description: &'static str,
    /// Unit of the raw value before binning.
    pub unit: Unit,
    /// How raw values map to bins.
    pub binning: Binning,
    /// The group the counter is read in.
    pub group: CounterGroup,
}

/// A versioned list of counters.
#[derive(Clone, Copy, Debug)]
pub struct Catalogue {
    /// The version reports carry.
    pub version: CatalogueVersion,
    /// Counters in id order.
    pub counters: &'static [Counter],
}

const PERCENT: Binning = Binning::Linear {
    min: 0.0,
    max: 100.0,
};

/// The first catalogue. Groups 0 and 1 are what NVML/GPM expose per device; group 2 is what
/// the launch itself tells (occupancy estimate, duration, launch shape), which the stand-in
/// driver can derive from real traces.
pub const CATALOGUE_V1: Catalogue = Catalogue {
    version: CatalogueVersion(1),
    counters: &[
        Counter {
            id: CounterId(0),
            name: "sm_active",
            description: "share of cycles with at least one warp resident on an SM",
            unit: Unit::Percent,
            binning: PERCENT,
            group: CounterGroup(0),
        },
        Counter {
            id: CounterId(1),
            name: "tensor_active",
            description: "share of cycles the tensor cores were busy",
            unit: Unit::Percent,
            binning: PERCENT,
            group: CounterGroup(0),
        },
        Counter {
            id: CounterId(2),
            name: "dram_bandwidth",
            description: "DRAM bandwidth used, as a share of the peak",
            unit: Unit::Percent,
            binning: PERCENT,
            group: CounterGroup(1),
        },
        Counter {
            id: CounterId(3),
            name: "l2_hit_rate",
            description: "share of L2 requests that hit",
            unit: Unit::Percent,
            binning: PERCENT,
            group: CounterGroup(1),
        },
        Counter {
            id: CounterId(4),
            name: "achieved_occupancy",
            description: "achieved warps per SM as a share of the maximum",
            unit: Unit::Percent,
            binning: PERCENT,
            group: CounterGroup(2),
        },
        Counter {
            id: CounterId(5),
            name: "kernel_duration",
            description: "kernel execution time, 100 ns to 10 s",
            unit: Unit::Nanoseconds,
            binning: Binning::Log {
                min: 100.0,
                max: 1e10,
            },
            group: CounterGroup(2),
        },
        Counter {
            id: CounterId(6),
            name: "blocks_per_sm",
            description: "thread blocks per SM in the launch, 1/64 to 4096",
            unit: Unit::Count,
            binning: Binning::Log {
                min: 1.0 / 64.0,
                max: 4096.0,
            },
            group: CounterGroup(2),
        },
        Counter {
            id: CounterId(7),
            name: "registers_per_thread",
            description: "registers allocated per thread, 0 to 256",
            unit: Unit::Count,
            binning: Binning::Linear {
                min: 0.0,
                max: 256.0,
            },
            group: CounterGroup(2),
        },
        Counter {
            id: CounterId(8),
            name: "shared_memory",
            description: "shared memory per block, 1 B to 1 MiB",
            unit: Unit::Bytes,
            binning: Binning::Log {
                min: 1.0,
                max: 1_048_576.0,
            },
            group: CounterGroup(2),
        },
    ],
};

/// Every catalogue this build understands, oldest first.
pub const CATALOGUES: &[Catalogue] = &[CATALOGUE_V1];

impl Catalogue {
    /// The catalogue new reports are binned against.
    pub const fn current() -> &'static Catalogue {
        &CATALOGUE_V1
    }

    /// The catalogue with this version, if this build knows it.
    pub fn by_version(version: CatalogueVersion) -> Option<&'static Catalogue> {
        CATALOGUES.iter().find(|c| c.version == version)
    }

    /// The counter with this id.
    pub fn counter(&self, id: CounterId) -> Option<&'static Counter> {
        self.counters.iter().find(|c| c.id == id)
    }

    /// The counter with this name.
    pub fn counter_by_name(&self, name: &str) -> Option<&'static Counter> {
        self.counters.iter().find(|c| c.name == name)
    }

    /// The counters read together in one group.
    pub fn group(&self, group: CounterGroup) -> impl Iterator<Item = &'static Counter> {
        self.counters.iter().filter(move |c| c.group == group)
    }

    /// The distinct groups, in order, for rotation.
    pub fn groups(&self) -> Vec<CounterGroup> {
        let mut groups: Vec<CounterGroup> = self.counters.iter().map(|c| c.group).collect();
        groups.sort();
        groups.dedup();
        groups
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn catalogue_ids_are_unique_and_ordered() {
        for catalogue in CATALOGUES {
            for pair in catalogue.counters.windows(2) {
                assert!(pair[0].id < pair[1].id, "{:?} then {:?}", pair[0], pair[1]);
            }
            let mut names: Vec<_> = catalogue.counters.iter().map(|c| c.name).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), catalogue.counters.len());
            for counter in catalogue.counters {
                if let Binning::Log { min, max } = counter.binning {
                    assert!(min > 0.0 && max > min, "{}", counter.name);
                }
            }
        }
    }

    #[test]
    fn linear_edges_and_out_of_range() {
        let b = PERCENT;
        assert_eq!(b.bin(-5.0), Ok(Bin::FIRST));
        assert_eq!(b.bin(0.0), Ok(Bin::FIRST));
        assert_eq!(b.bin(100.0), Ok(Bin::LAST));
        assert_eq!(b.bin(1e300), Ok(Bin::LAST));
        assert_eq!(b.bin(f64::INFINITY), Ok(Bin::LAST));
        assert_eq!(b.bin(f64::NEG_INFINITY), Ok(Bin::FIRST));
        assert_eq!(b.bin(f64::NAN), Err(BinningError::NotANumber));
        // 50% is the lower edge of bin 64 of 128.
        assert_eq!(b.bin(50.0).map(Bin::index), Ok(64));
        assert_eq!(b.bin(49.99).map(Bin::index), Ok(63));
    }

    #[test]
    fn log_bins_split_decades_evenly() {
        let b = Binning::Log { min: 1.0, max: 1e8 };
        // 8 decades over 128 bins: 16 bins per decade.
        assert_eq!(b.bin(0.0), Ok(Bin::FIRST));
        assert_eq!(b.bin(-1.0), Ok(Bin::FIRST));
        assert_eq!(b.bin(10.5).map(Bin::index), Ok(16));
        assert_eq!(b.bin(1e4 * 1.01).map(Bin::index), Ok(64));
        assert_eq!(b.bin(1e9), Ok(Bin::LAST));
    }

    proptest! {
        #[test]
        fn every_value_lands_in_the_bin_whose_edges_hold_it(v in 0.0f64..1e10, log in any::<bool>()) {
            let b = if log {
                Binning::Log { min: 100.0, max: 1e10 }
            } else {
                Binning::Linear { min: 0.0, max: 1e10 }
            };
            let bin = b.bin(v).unwrap();
            let (lo, hi) = b.edges(bin);
            // Edges are computed in floating point; allow a relative rounding slack.
            let slack = 1e-9 * hi.abs().max(1.0);
            if bin != Bin::FIRST { prop_assert!(v >= lo - slack, "{v} < {lo} in {bin:?}"); }
            if bin != Bin::LAST { prop_assert!(v < hi + slack, "{v} >= {hi} in {bin:?}"); }
        }

        #[test]
        fn binning_is_monotone(a in -1e3f64..1e12, b in -1e3f64..1e12) {
            let binning = CATALOGUE_V1.counters[5].binning;
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(binning.bin(lo).unwrap() <= binning.bin(hi).unwrap());
        }
    }
}
