//! The counter catalogue: which performance counters exist, in which unit, and how a value is
//! binned into one of [`BIN_COUNT`] bins.
//!
//! The catalogue is versioned because a report's bins only mean something against the binning
//! that produced them: an aggregator must never add a histogram binned one way to a histogram
//! binned another way, so every report names its [`CatalogueVersion`] and the aggregator refuses
//! versions it does not know.
//!
//! Besides one histogram per counter, a catalogue may define **joint views** ([`JointView`]):
//! two counters of one group, read on the same sampled launch, binned together into a grid of
//! [`JOINT_X_CELLS`] x [`JOINT_Y_CELLS`] cells that fills the [`BIN_COUNT`] bins of one
//! report. A joint view answers what two separate histograms cannot: how often both were high
//! at once (tensor cores busy while DRAM bandwidth was low, say). Each axis is the counter's
//! own binning taken [`BIN_COUNT`] / cells fine bins at a time, so a cell's edges are edges of
//! the counter's own histogram. A joint view has its own [`CounterId`] (after the counters'),
//! so everything that handles a report (caps, tokens, sums, release) treats it as one more
//! counter; [`Catalogue::view`] says which of the two an id names.

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
        let guess = if scaled >= (BIN_COUNT - 1) as f64 {
            BIN_COUNT - 1
        } else {
            // In range [0, BIN_COUNT - 1) here, so the truncating cast is exact and in bounds.
            scaled as usize
        };
        // The edges are what a bin means (plots, reports, the splits of joint views compare
        // values with them), and the formula above can land one bin off where rounding puts a
        // value on an edge (10 us on the duration scale computes as bin 32, its edge as
        // 10000.000000000004 ns): the guess is checked against its own edges.
        let (lo, hi) = self.edges(Bin::new(guess).unwrap_or(Bin::LAST));
        let index = if value < lo && guess > 0 {
            guess - 1
        } else if value >= hi && guess < BIN_COUNT - 1 {
            guess + 1
        } else {
            guess
        };
        Ok(Bin::new(index).unwrap_or(Bin::LAST))
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
                // In the base whose logarithms of the range's ends are whole (10 for the
                // duration scale, 2 for sizes and per-SM counts), so that round values (1 ms,
                // 64 KiB) are edges exactly rather than a rounding error away from one.
                let base = if min.log10().fract() == 0.0 && max.log10().fract() == 0.0 {
                    10.0f64
                } else {
                    2.0
                };
                let (lo, hi) = (min.log(base), max.log(base));
                let at = |k: f64| base.powf(lo + k * (hi - lo) / n);
                (at(i), at(i + 1.0))
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
    /// Joint views in id order, their ids after every counter's.
    pub joints: &'static [JointView],
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
    counters: &V1_COUNTERS,
    joints: &[],
};

/// Catalogue 2: the counters of version 1, with the same ids, names and binning, DRAM
/// bandwidth read in group 0 with SM and tensor activity (GPM computes every metric from the
/// same pair of device samples, so the three can be read on one launch), and three joint
/// views. Its reports are kept apart from version 1's like any other version's.
pub const CATALOGUE_V2: Catalogue = Catalogue {
    version: CatalogueVersion(2),
    counters: &V2_COUNTERS,
    joints: &[
        JointView {
            id: CounterId(9),
            name: "tensor_x_dram",
            description: "tensor core activity against DRAM bandwidth used, on the same launch: \
                          how much of the time the tensor cores are busy while memory is idle, \
                          or memory is the bottleneck while the tensor cores wait",
            x: CounterId(1),
            y: CounterId(2),
        },
        JointView {
            id: CounterId(10),
            name: "duration_x_occupancy",
            description: "kernel duration against achieved occupancy, on the same launch: \
                          whether the time goes to long kernels that fill the SMs or to short \
                          ones that leave them idle",
            x: CounterId(5),
            y: CounterId(4),
        },
        JointView {
            id: CounterId(11),
            name: "registers_x_occupancy",
            description: "registers per thread against achieved occupancy, on the same \
                          launch: how often register pressure goes with low occupancy",
            x: CounterId(7),
            y: CounterId(4),
        },
    ],
};

/// Version 2's counters: version 1's, DRAM bandwidth moved to group 0.
const V2_COUNTERS: [Counter; 9] = {
    let mut counters = V1_COUNTERS;
    counters[2].group = CounterGroup(0);
    counters
};

const V1_COUNTERS: [Counter; 9] = [
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
];

/// Every catalogue this build understands, oldest first.
pub const CATALOGUES: &[Catalogue] = &[CATALOGUE_V1, CATALOGUE_V2];

impl Catalogue {
    /// The catalogue new reports are binned against.
    pub const fn current() -> &'static Catalogue {
        &CATALOGUE_V2
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

    /// The joint view with this id, its axes resolved (`None` for a counter's id, an unknown
    /// id, or a view whose axes the catalogue does not hold, which its tests rule out).
    pub fn joint(&self, id: CounterId) -> Option<Joint> {
        self.joints
            .iter()
            .find(|j| j.id == id)
            .and_then(|j| self.resolve(j))
    }

    /// The joint view with this name.
    pub fn joint_by_name(&self, name: &str) -> Option<Joint> {
        self.joints
            .iter()
            .find(|j| j.name == name)
            .and_then(|j| self.resolve(j))
    }

    /// Every joint view, resolved.
    pub fn joint_views(&self) -> impl Iterator<Item = Joint> + '_ {
        self.joints.iter().filter_map(|j| self.resolve(j))
    }

    fn resolve(&self, view: &'static JointView) -> Option<Joint> {
        Some(Joint {
            view,
            x: Axis::new(self.counter(view.x)?, JOINT_X_CELLS),
            y: Axis::new(self.counter(view.y)?, JOINT_Y_CELLS),
        })
    }

    /// What an id a report carries names: a counter's histogram or a joint view's grid.
    pub fn view(&self, id: CounterId) -> Option<View> {
        match self.counter(id) {
            Some(counter) => Some(View::Counter(counter)),
            None => self.joint(id).map(View::Joint),
        }
    }

    /// Every id a report of this catalogue may carry: the counters', then the joint views'.
    /// Caps, token scopes and load generators range over these.
    pub fn report_ids(&self) -> impl Iterator<Item = CounterId> + '_ {
        self.counters
            .iter()
            .map(|c| c.id)
            .chain(self.joints.iter().map(|j| j.id))
    }

    /// The name of what `id` names (`None` if nothing).
    pub fn name_of(&self, id: CounterId) -> Option<&'static str> {
        match self.view(id)? {
            View::Counter(c) => Some(c.name),
            View::Joint(j) => Some(j.view.name),
        }
    }
}

/// Cells of a joint view along its first counter (x).
pub const JOINT_X_CELLS: usize = 16;
/// Cells of a joint view along its second counter (y).
pub const JOINT_Y_CELLS: usize = 8;

const _: () = assert!(JOINT_X_CELLS * JOINT_Y_CELLS == BIN_COUNT);
const _: () = assert!(BIN_COUNT.is_multiple_of(JOINT_X_CELLS));
const _: () = assert!(BIN_COUNT.is_multiple_of(JOINT_Y_CELLS));

/// A joint view as the catalogue defines it: two counters of one group, by id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JointView {
    /// Its id, after the counters' ids; a report of the view carries it.
    pub id: CounterId,
    /// Short machine name (`tensor_x_dram`).
    pub name: &'static str,
    /// What it shows, for architects reading a report.
    pub description: &'static str,
    /// The counter along x ([`JOINT_X_CELLS`] cells).
    pub x: CounterId,
    /// The counter along y ([`JOINT_Y_CELLS`] cells).
    pub y: CounterId,
}

/// One axis of a joint view: a counter's binning, `cells` cells of `BIN_COUNT / cells` fine
/// bins each, so every cell edge is an edge of the counter's own histogram.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Axis {
    /// The counter.
    pub counter: &'static Counter,
    cells: usize,
}

impl Axis {
    fn new(counter: &'static Counter, cells: usize) -> Self {
        Self { counter, cells }
    }

    /// How many cells the axis has.
    pub fn cells(&self) -> usize {
        self.cells
    }

    /// Fine bins per cell.
    fn width(&self) -> usize {
        BIN_COUNT / self.cells
    }

    /// The cell a value falls into: the cell of its fine bin, so that the axis classifies a
    /// value exactly as the counter's own histogram does.
    pub fn cell(&self, value: f64) -> Result<usize, BinningError> {
        Ok(self.counter.binning.bin(value)?.index() / self.width())
    }

    /// The lower and upper edge of `cell` (`cell` past the last is taken as the last).
    pub fn edges(&self, cell: usize) -> (f64, f64) {
        let cell = cell.min(self.cells - 1);
        let first = Bin::new(cell * self.width()).unwrap_or(Bin::LAST);
        let last = Bin::new((cell + 1) * self.width() - 1).unwrap_or(Bin::LAST);
        (
            self.counter.binning.edges(first).0,
            self.counter.binning.edges(last).1,
        )
    }

    /// The cell edge nearest to `value`, as the index of the first cell at or above it (0 to
    /// `cells`): where a threshold a person picks falls on this axis. Edges are compared on
    /// the binning's own scale (logarithmic for log-binned counters). `None` for NaN.
    pub fn nearest_edge(&self, value: f64) -> Option<usize> {
        if value.is_nan() {
            return None;
        }
        let scale = |v: f64| match self.counter.binning {
            Binning::Linear { .. } => v,
            Binning::Log { min, .. } => v.max(min * 1e-300).ln(),
        };
        let target = scale(value);
        (0..=self.cells).min_by(|&a, &b| {
            let da = (scale(self.edge(a)) - target).abs();
            let db = (scale(self.edge(b)) - target).abs();
            da.total_cmp(&db)
        })
    }

    /// Edge `i` of the axis: the lower edge of cell `i`, or the upper edge of the last cell
    /// for `i = cells`.
    pub fn edge(&self, i: usize) -> f64 {
        if i >= self.cells {
            self.edges(self.cells - 1).1
        } else {
            self.edges(i).0
        }
    }
}

/// A joint view with its axes resolved against its catalogue.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Joint {
    /// The definition.
    pub view: &'static JointView,
    /// The x axis ([`JOINT_X_CELLS`] cells).
    pub x: Axis,
    /// The y axis ([`JOINT_Y_CELLS`] cells).
    pub y: Axis,
}

impl Joint {
    /// The bin of a launch whose x counter read `x` and y counter `y`: row-major, y outer.
    pub fn bin(&self, x: f64, y: f64) -> Result<Bin, BinningError> {
        let (cx, cy) = (self.x.cell(x)?, self.y.cell(y)?);
        Ok(Bin::new(cy * self.x.cells() + cx).unwrap_or(Bin::LAST))
    }

    /// The (x cell, y cell) of a bin of the grid.
    pub fn cell_of(&self, bin: Bin) -> (usize, usize) {
        (bin.index() % self.x.cells(), bin.index() / self.x.cells())
    }

    /// The group the view is read in (its counters').
    pub fn group(&self) -> CounterGroup {
        self.x.counter.group
    }
}

/// What an id a report carries names.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum View {
    /// One counter's histogram.
    Counter(&'static Counter),
    /// A joint view's grid.
    Joint(Joint),
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
    fn joint_views_pair_two_counters_of_one_group_under_ids_of_their_own() {
        for catalogue in CATALOGUES {
            let ids: Vec<CounterId> = catalogue.report_ids().collect();
            let mut sorted = ids.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted, ids, "ids unique and in order");
            let names: Vec<&str> = ids.iter().filter_map(|&i| catalogue.name_of(i)).collect();
            let mut unique = names.clone();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(unique.len(), ids.len(), "every id has a name of its own");
            for view in catalogue.joints {
                let joint = catalogue.joint(view.id).expect("its axes are counters");
                assert_ne!(view.x, view.y);
                assert_eq!(
                    joint.x.counter.group, joint.y.counter.group,
                    "{}",
                    view.name
                );
                assert!(catalogue.counter(view.id).is_none());
                assert!(matches!(catalogue.view(view.id), Some(View::Joint(_))));
            }
        }
        assert_eq!(Catalogue::current().joints.len(), 3);
        assert!(CATALOGUE_V1.joints.is_empty());
    }

    #[test]
    fn version_2_keeps_version_1s_counters_and_binning() {
        assert_eq!(CATALOGUE_V1.counters.len(), CATALOGUE_V2.counters.len());
        for (a, b) in CATALOGUE_V1.counters.iter().zip(CATALOGUE_V2.counters) {
            assert_eq!(
                (a.id, a.name, a.unit, a.binning),
                (b.id, b.name, b.unit, b.binning)
            );
        }
        let dram = CATALOGUE_V2.counter_by_name("dram_bandwidth").unwrap();
        let tensor = CATALOGUE_V2.counter_by_name("tensor_active").unwrap();
        assert_eq!(dram.group, tensor.group);
    }

    #[test]
    fn a_joint_cell_is_the_pair_of_the_counters_own_bins_taken_in_blocks() {
        let joint = CATALOGUE_V2.joint_by_name("tensor_x_dram").unwrap();
        // Tensor 50% is fine bin 64 of 128, cell 8 of 16; DRAM 30% is fine bin 38, cell 2 of 8.
        let bin = joint.bin(50.0, 30.0).unwrap();
        assert_eq!(joint.cell_of(bin), (8, 2));
        assert_eq!(bin.index(), 2 * JOINT_X_CELLS + 8);
        assert_eq!(joint.x.edges(8), (50.0, 56.25));
        assert_eq!(joint.y.edges(2), (25.0, 37.5));
        assert_eq!(joint.bin(f64::NAN, 1.0), Err(BinningError::NotANumber));
        assert_eq!(joint.bin(-1.0, 1e9).map(|b| joint.cell_of(b)), Ok((0, 7)));
        // A log axis: kernel duration, 100 ns to 10 s in 16 cells of half a decade.
        let duration = CATALOGUE_V2.joint_by_name("duration_x_occupancy").unwrap();
        let (lo, hi) = duration.x.edges(4);
        assert!((lo - 1e4).abs() < 1e-6 && (hi - 1e4 * 10f64.sqrt()).abs() < 1e-6);
        assert_eq!(duration.x.nearest_edge(9_000.0), Some(4));
        assert_eq!(duration.x.nearest_edge(1e12), Some(JOINT_X_CELLS));
        assert_eq!(duration.x.nearest_edge(0.0), Some(0));
        assert_eq!(duration.y.nearest_edge(49.0), Some(4));
        assert_eq!(duration.y.nearest_edge(f64::NAN), None);
    }

    proptest! {
        #[test]
        fn a_joint_cell_holds_its_values_between_its_edges(x in 0.0f64..1e11, y in -10.0f64..120.0) {
            let joint = CATALOGUE_V2.joint_by_name("duration_x_occupancy").unwrap();
            let (cx, cy) = joint.cell_of(joint.bin(x, y).unwrap());
            prop_assert_eq!(cx, joint.x.cell(x).unwrap());
            prop_assert_eq!(cy, joint.y.cell(y).unwrap());
            let (lo, hi) = joint.x.edges(cx);
            let slack = 1e-9 * hi;
            if cx > 0 { prop_assert!(x >= lo - slack); }
            if cx + 1 < JOINT_X_CELLS { prop_assert!(x < hi + slack); }
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

    /// Whole decades of the duration scale and powers of two of the size scales are edges
    /// exactly, and land in the bin they open (computed through `ln`, 1 ms was an edge of
    /// 1000000.0000000009 ns, so a kernel of exactly 1 ms fell below a split at 1 ms).
    #[test]
    fn round_values_are_edges_exactly_and_open_their_bin() {
        let catalogue = &CATALOGUE_V2;
        let scales = [
            ("kernel_duration", vec![1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9]),
            // 20 octaves in 128 bins: an octave edge every 32 bins; 18 in 128: one at 64.
            ("shared_memory", vec![32.0, 1024.0, 32_768.0]),
            ("blocks_per_sm", vec![8.0]),
        ];
        for (name, values) in scales {
            let b = catalogue.counter_by_name(name).unwrap().binning;
            for v in values {
                let bin = b.bin(v).unwrap();
                assert_eq!(b.edges(bin).0, v, "{name}: {v} opens {bin:?}");
            }
        }
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
            // Exactly: the edges are what a bin means.
            if bin != Bin::FIRST { prop_assert!(v >= lo, "{v} < {lo} in {bin:?}"); }
            if bin != Bin::LAST { prop_assert!(v < hi, "{v} >= {hi} in {bin:?}"); }
        }

        #[test]
        fn a_value_on_an_edge_lands_in_the_bin_the_edge_opens(i in 1usize..BIN_COUNT, log in any::<bool>()) {
            let b = if log {
                Binning::Log { min: 100.0, max: 1e10 }
            } else {
                Binning::Linear { min: 0.0, max: 256.0 }
            };
            let bin = Bin::new(i).unwrap();
            let edge = b.edges(bin).0;
            prop_assert_eq!(b.bin(edge), Ok(bin));
            prop_assert_eq!(b.bin(edge.next_down()).map(Bin::index), Ok(i - 1));
        }

        #[test]
        fn binning_is_monotone(a in -1e3f64..1e12, b in -1e3f64..1e12) {
            let binning = CATALOGUE_V1.counters[5].binning;
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(binning.bin(lo).unwrap() <= binning.bin(hi).unwrap());
        }
    }
}
