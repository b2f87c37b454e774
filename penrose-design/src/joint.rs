//! Joint counter views in the report: the four quadrants of a decrypted grid, split where an
//! architect asks, and the share of samples (and, with a duration axis, of time) in each.
//!
//! A joint view (`penrose_core::counters::JointView`) bins two counters read on the same
//! launch into a grid of 16 x 8 cells. The questions architects ask of it are of the kind
//! "what share of the time are the tensor cores busy while DRAM bandwidth is under-used": a
//! split of each axis at a threshold, and the share of the grid on each side of both. A split
//! can only fall on a cell edge (the grid holds nothing finer), so a threshold given by a person
//! is moved to the nearest edge, and the report says which edge it used.
//!
//! Shares of samples are exact: they are counts of the decrypted grid. A sample is a sampled
//! launch, so with per-launch counters (duration, occupancy, registers) they are shares of
//! launches; with GPM counters a reading covers the interval since the previous sampled launch,
//! so they approximate shares of time only as far as those intervals are alike. Where one axis
//! is a kernel duration the report also gives the share of kernel *time*, weighting each cell
//! by its duration: an estimate at cell resolution (half a decade per cell) with the bounds the
//! cell edges allow.

use std::collections::BTreeMap;
use std::fmt;

use penrose_core::counters::{Axis, Bin, Catalogue, Joint, Unit};
use thiserror::Error;

/// Why a split could not be taken.
#[derive(Debug, Error, PartialEq)]
pub enum SplitError {
    /// Not `VIEW:X,Y`.
    #[error("a split is VIEW:X,Y (for example tensor_x_dram:50,30), not {0:?}")]
    Syntax(String),
    /// The catalogue has no joint view of this name.
    #[error("no joint view is named {name:?}; the catalogue's are: {known}")]
    UnknownView {
        /// The name given.
        name: String,
        /// The names there are.
        known: String,
    },
    /// A threshold is not a number.
    #[error("{0:?} is not a number")]
    NotANumber(String),
}

/// Where one joint view is split: a threshold on each axis, in the counters' units.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Split {
    /// The threshold on the x counter.
    pub x: f64,
    /// The threshold on the y counter.
    pub y: f64,
}

/// The splits of every joint view: the defaults, replaced where `--split` says otherwise.
#[derive(Clone, Debug, PartialEq)]
pub struct Splits(BTreeMap<&'static str, Split>);

impl Default for Splits {
    /// Half of the range for percentages (busy or not), 10 us for kernel durations (where
    /// launch overhead stops dominating a kernel), 128 registers per thread (above it a full
    /// SM cannot hold the maximum of threads).
    fn default() -> Self {
        let mut splits = BTreeMap::new();
        for joint in Catalogue::current().joint_views() {
            let default = |unit: Unit, name: &str| match (unit, name) {
                (Unit::Nanoseconds, _) => 10_000.0,
                (_, "registers_per_thread") => 128.0,
                _ => 50.0,
            };
            splits.insert(
                joint.view.name,
                Split {
                    x: default(joint.x.counter.unit, joint.x.counter.name),
                    y: default(joint.y.counter.unit, joint.y.counter.name),
                },
            );
        }
        Self(splits)
    }
}

/// Parses a `VIEW:X,Y` the user gave (`report --split`): the view, by its catalogue name,
/// and where to split it.
pub fn parse_split(text: &str) -> Result<(&'static str, Split), SplitError> {
    let (name, values) = text
        .split_once(':')
        .ok_or_else(|| SplitError::Syntax(text.to_string()))?;
    let (x, y) = values
        .split_once(',')
        .ok_or_else(|| SplitError::Syntax(text.to_string()))?;
    let number = |v: &str| {
        v.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| !v.is_nan())
            .ok_or_else(|| SplitError::NotANumber(v.to_string()))
    };
    let catalogue = Catalogue::current();
    let joint = catalogue
        .joint_by_name(name.trim())
        .ok_or_else(|| SplitError::UnknownView {
            name: name.trim().to_string(),
            known: catalogue
                .joint_views()
                .map(|j| j.view.name)
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    Ok((
        joint.view.name,
        Split {
            x: number(x)?,
            y: number(y)?,
        },
    ))
}

impl FromIterator<(&'static str, Split)> for Splits {
    /// The splits given, a later one of a view replacing an earlier.
    fn from_iter<I: IntoIterator<Item = (&'static str, Split)>>(splits: I) -> Self {
        let mut out = Splits::default();
        for (view, split) in splits {
            out.insert(view, split);
        }
        out
    }
}

impl Splits {
    /// Replaces the split of `view` (a name [`parse_split`] returned).
    pub fn insert(&mut self, view: &'static str, split: Split) {
        self.0.insert(view, split);
    }

    /// The split of a view (`None` for a view this build's catalogue does not name).
    pub fn of(&self, view: &str) -> Option<Split> {
        self.0.get(view).copied()
    }
}

/// One axis of a decrypted joint view.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AxisSummary {
    /// The counter.
    pub counter: String,
    /// Its unit's suffix.
    pub unit: String,
    /// The cell edges, one more than the cells.
    pub edges: Vec<f64>,
    /// The threshold asked for.
    pub asked: f64,
    /// The edge it was moved to: the split.
    pub split: f64,
    /// The first cell at or above the split (0 to the number of cells).
    pub split_cell: usize,
}

/// A value estimated at cell resolution, with the bounds the cell edges allow.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Estimate {
    /// With each cell at its representative value.
    pub estimate: f64,
    /// The least the share can be.
    pub low: f64,
    /// The most it can be.
    pub high: f64,
}

/// One of the four quadrants.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Quadrant {
    /// At or above the x split.
    pub x_high: bool,
    /// At or above the y split.
    pub y_high: bool,
    /// Samples in it.
    pub samples: u64,
    /// Its share of the samples, 0 to 1.
    pub share: f64,
    /// Its share of kernel time, 0 to 1, where an axis is a duration.
    pub time_share: Option<Estimate>,
}

/// A decrypted joint view, split.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct JointSummary {
    /// The view's name.
    pub view: String,
    /// The x axis.
    pub x: AxisSummary,
    /// The y axis.
    pub y: AxisSummary,
    /// The four quadrants: (low x, low y), (high x, low y), (low x, high y), (high x, high y).
    pub quadrants: Vec<Quadrant>,
}

impl JointSummary {
    /// Splits the decrypted grid `bins` of `joint` at `split`.
    pub fn new(joint: &Joint, bins: &[u64], split: Split) -> Self {
        let (x, y) = (
            AxisSummary::split(&joint.x, split.x),
            AxisSummary::split(&joint.y, split.y),
        );
        let total: u64 = bins.iter().sum();
        let duration = DurationAxis::of(joint);
        let tallies = tally_quadrants(joint, bins, (x.split_cell, y.split_cell), duration);
        Self {
            view: joint.view.name.to_string(),
            x,
            y,
            quadrants: quadrants(&tallies, total, duration.is_some()),
        }
    }

    /// What a quadrant covers, in words: "tensor_active >= 50% and dram_bandwidth < 50%".
    pub fn describe(&self, q: &Quadrant) -> String {
        let side = |a: &AxisSummary, high: bool| {
            format!(
                "{} {} {}",
                a.counter,
                if high { ">=" } else { "<" },
                crate::scale::human(a.split, &a.unit)
            )
        };
        format!(
            "{} and {}",
            side(&self.x, q.x_high),
            side(&self.y, q.y_high)
        )
    }
}

impl AxisSummary {
    /// Axis `a` split at the cell edge nearest `asked`.
    fn split(a: &Axis, asked: f64) -> Self {
        let cell = a.nearest_edge(asked).unwrap_or(0);
        AxisSummary {
            counter: a.counter.name.to_string(),
            unit: a.counter.unit.suffix().to_string(),
            edges: (0..=a.cells()).map(|i| a.edge(i)).collect(),
            asked,
            split: a.edge(cell),
            split_cell: cell,
        }
    }
}

/// The axis of a joint view that is a kernel duration, whose cells weigh samples by time.
#[derive(Clone, Copy, Debug)]
enum DurationAxis {
    X,
    Y,
}

impl DurationAxis {
    /// The duration axis of `joint` (x first), `None` where neither is one.
    fn of(joint: &Joint) -> Option<Self> {
        match (joint.x.counter.unit, joint.y.counter.unit) {
            (Unit::Nanoseconds, _) => Some(Self::X),
            (_, Unit::Nanoseconds) => Some(Self::Y),
            _ => None,
        }
    }
}

/// The kernel time of one launch in a cell: its representative value, and the least and most
/// the cell's edges allow.
#[derive(Clone, Copy, Debug)]
struct CellTime {
    rep: f64,
    low: f64,
    high: f64,
}

/// The kernel time of a launch in cell (`cx`, `cy`), where an axis is a duration.
fn cell_time(
    joint: &Joint,
    duration: Option<DurationAxis>,
    cx: usize,
    cy: usize,
) -> Option<CellTime> {
    let (a, c) = match duration? {
        DurationAxis::X => (&joint.x, cx),
        DurationAxis::Y => (&joint.y, cy),
    };
    let (lo, hi) = a.edges(c);
    // The edge cells also hold what lies beyond the range.
    let low = if c == 0 { 0.0 } else { lo };
    let high = if c + 1 == a.cells() {
        f64::INFINITY
    } else {
        hi
    };
    Some(CellTime {
        rep: (lo * hi).sqrt(),
        low,
        high,
    })
}

/// What one quadrant holds: its samples and, where an axis is a duration, their kernel time
/// (each cell at its representative value, and at its least and most).
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    samples: u64,
    time: f64,
    low: f64,
    high: f64,
}

/// The four quadrants' tallies, in [`JointSummary::quadrants`]' order, of `bins` split at the
/// cells `split_cells` (x, y).
fn tally_quadrants(
    joint: &Joint,
    bins: &[u64],
    split_cells: (usize, usize),
    duration: Option<DurationAxis>,
) -> [Tally; 4] {
    let mut quadrants = [Tally::default(); 4];
    for (i, &count) in bins.iter().enumerate() {
        if count == 0 {
            continue;
        }
        let Some(bin) = Bin::new(i) else { continue };
        let (cx, cy) = joint.cell_of(bin);
        let q = usize::from(cx >= split_cells.0) + 2 * usize::from(cy >= split_cells.1);
        quadrants[q].samples += count;
        if let Some(t) = cell_time(joint, duration, cx, cy) {
            let n = count as f64;
            quadrants[q].time += n * t.rep;
            quadrants[q].low += n * t.low;
            quadrants[q].high += n * t.high;
        }
    }
    quadrants
}

/// The quadrants' shares of the `total` samples and, `timed` (an axis is a duration), of
/// kernel time.
fn quadrants(tallies: &[Tally; 4], total: u64, timed: bool) -> Vec<Quadrant> {
    let time: f64 = tallies.iter().map(|q| q.time).sum();
    tallies
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let (others_low, others_high) = tallies
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .fold((0.0, 0.0), |(l, h), (_, q)| (l + q.low, h + q.high));
            Quadrant {
                x_high: i % 2 == 1,
                y_high: i >= 2,
                samples: t.samples,
                share: if total == 0 {
                    0.0
                } else {
                    t.samples as f64 / total as f64
                },
                time_share: (timed && time > 0.0).then(|| Estimate {
                    estimate: t.time / time,
                    low: ratio(t.low, t.low + others_high),
                    high: ratio(t.high, t.high + others_low),
                }),
            }
        })
        .collect()
}

/// `part / whole`, where an infinite part (an open-ended edge cell) makes the share 1 and an
/// infinite whole makes it 0.
fn ratio(part: f64, whole: f64) -> f64 {
    if part.is_infinite() {
        1.0
    } else if whole.is_infinite() || whole <= 0.0 {
        0.0
    } else {
        part / whole
    }
}

impl fmt::Display for JointSummary {
    /// One line per quadrant: "  tensor_active >= 50% and dram_bandwidth < 50%: 38.2% of
    /// samples (1,234)", with the time share where there is one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for q in &self.quadrants {
            write!(
                f,
                "    {}: {:.1}% of samples ({})",
                self.describe(q),
                q.share * 100.0,
                q.samples
            )?;
            if let Some(t) = q.time_share {
                write!(
                    f,
                    ", {:.1}% of kernel time (between {:.1}% and {:.1}%)",
                    t.estimate * 100.0,
                    t.low * 100.0,
                    t.high * 100.0
                )?;
            }
            if self.x.asked != self.x.split || self.y.asked != self.y.split {
                write!(f, " [split moved to cell edges]")?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use penrose_core::counters::BIN_COUNT;

    fn grid(joint: &Joint, points: &[(f64, f64, u64)]) -> Vec<u64> {
        let mut bins = vec![0u64; BIN_COUNT];
        for &(x, y, n) in points {
            bins[joint.bin(x, y).unwrap().index()] += n;
        }
        bins
    }

    #[test]
    fn quadrant_shares_are_counts_of_the_grid_on_each_side_of_the_split() {
        let joint = Catalogue::current().joint_by_name("tensor_x_dram").unwrap();
        let bins = grid(
            &joint,
            &[
                (90.0, 10.0, 38),
                (90.0, 80.0, 12),
                (10.0, 20.0, 29),
                (5.0, 90.0, 21),
            ],
        );
        let s = JointSummary::new(&joint, &bins, Split { x: 50.0, y: 50.0 });
        let got: Vec<(bool, bool, u64)> = s
            .quadrants
            .iter()
            .map(|q| (q.x_high, q.y_high, q.samples))
            .collect();
        assert_eq!(
            got,
            [
                (false, false, 29),
                (true, false, 38),
                (false, true, 21),
                (true, true, 12)
            ]
        );
        assert!((s.quadrants[1].share - 0.38).abs() < 1e-12);
        assert!(s.quadrants.iter().all(|q| q.time_share.is_none()));
        assert_eq!(
            s.describe(&s.quadrants[1]),
            "tensor_active >= 50.0% and dram_bandwidth < 50.0%"
        );
        // A threshold off the edges moves to the nearest one: DRAM 30% to 25% (cell 2 of 8).
        let moved = JointSummary::new(&joint, &bins, Split { x: 50.0, y: 30.0 });
        assert_eq!((moved.y.split, moved.y.split_cell), (25.0, 2));
        assert_eq!(moved.quadrants[0].samples, 29, "20% DRAM is under 25% too");
        assert!(moved.to_string().contains("[split moved to cell edges]"));
    }

    #[test]
    fn time_shares_weight_cells_by_duration_within_the_bounds_of_their_edges() {
        let joint = Catalogue::current()
            .joint_by_name("duration_x_occupancy")
            .unwrap();
        // 90 short kernels (2 us, full occupancy) and 10 long ones (1 ms, low occupancy).
        let bins = grid(&joint, &[(2_000.0, 90.0, 90), (1e6, 20.0, 10)]);
        let s = JointSummary::new(
            &joint,
            &bins,
            Split {
                x: 10_000.0,
                y: 50.0,
            },
        );
        let long_low = &s.quadrants[1];
        let short_high = &s.quadrants[2];
        assert_eq!((long_low.samples, short_high.samples), (10, 90));
        let t = long_low.time_share.unwrap();
        // True share: 10 ms of 10.18 ms.
        let truth = 10.0 * 1e6 / (10.0 * 1e6 + 90.0 * 2_000.0);
        assert!(t.low <= truth && truth <= t.high, "{t:?} {truth}");
        assert!(t.low <= t.estimate && t.estimate <= t.high, "{t:?}");
        assert!(t.estimate > 0.9, "{t:?}");
        let shares: f64 = s
            .quadrants
            .iter()
            .map(|q| q.time_share.unwrap().estimate)
            .sum();
        assert!((shares - 1.0).abs() < 1e-9);
    }

    #[test]
    fn splits_name_a_view_and_two_numbers() {
        let mut splits = Splits::default();
        assert_eq!(
            splits.of("duration_x_occupancy"),
            Some(Split {
                x: 10_000.0,
                y: 50.0
            })
        );
        let (view, split) = parse_split("tensor_x_dram:75,25").unwrap();
        splits.insert(view, split);
        assert_eq!(splits.of("tensor_x_dram"), Some(Split { x: 75.0, y: 25.0 }));
        assert!(matches!(
            parse_split("nothing:1,2"),
            Err(SplitError::UnknownView { .. })
        ));
        assert!(matches!(
            parse_split("tensor_x_dram:1"),
            Err(SplitError::Syntax(_))
        ));
        assert!(matches!(
            parse_split("tensor_x_dram:NaN,2"),
            Err(SplitError::NotANumber(_))
        ));
        assert_eq!(splits.of("tensor_x_dram").unwrap().x, 75.0, "unchanged");
    }
}
