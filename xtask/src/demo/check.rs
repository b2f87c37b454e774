//! The demo's check: the agents' own records against what the aggregation server counted and
//! the design server decrypted.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use anyhow::{Context, Result};
use penrose_agent::record::SealedRecord;
use penrose_aggregator::config::DataDir;
use penrose_aggregator::state::{State, seen};
use penrose_aggregator::store::{RocksStore, Store, Table};
use penrose_core::counters::BIN_COUNT;
use penrose_core::fingerprint::FingerprintParams;
use penrose_core::paillier::{ACCUMULATOR_REPORT_BOUND, PublicKey};
use penrose_core::release::{ReportsPerContributor, Threshold, releasable};
use penrose_core::wire::Day;
use penrose_design::joint::JointSummary;
use penrose_design::report::{CounterReport, Report};

use super::fleet::Host;
use super::outcome::{JointCheck, JointQuadrant, Row};
use super::print::with_unit;

/// What the check found.
pub(super) struct Checked {
    /// Histograms the agents sealed.
    pub sealed: usize,
    /// Of them, reports the aggregation server counted.
    pub counted: usize,
    /// Classes it formed.
    pub classes: usize,
    /// Rows of its Spent table.
    pub spent_rows: usize,
    /// How the design server's report compares with the records.
    pub compared: Compared,
}

/// Every decrypted (class, architecture, counter) histogram must equal, bin for bin, the sum
/// of the histograms the agents sealed (read from their own records) for the reports the
/// aggregation server counted in that class, on the days whose sum reached k = `threshold`
/// contributors; nothing else may be decrypted, and nothing of a lone host.
pub(super) fn check(
    hosts: &[Host],
    (agg, public): (&DataDir, &PublicKey),
    report: &Report,
    threshold: u64,
) -> Result<Checked> {
    let records = sealed_records(hosts)?;
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(&agg.db())?);
    let state = State::open(
        Arc::clone(&store),
        public,
        FingerprintParams::default(),
        ACCUMULATOR_REPORT_BOUND,
        None,
    )?;
    let counted = counted_reports(&*store, &records)?;
    let per_day = sums_per_day(&state, &records, &counted)?;
    let expected = Expected::of(&per_day, Threshold::new(threshold)?);
    let compared = compare(report, &expected);
    Ok(Checked {
        sealed: records.len(),
        counted: counted.iter().filter(|c| **c).count(),
        classes: state.tables().class_count(),
        spent_rows: spent_rows(&*store)?,
        compared,
    })
}

/// Every record the agents sealed, with whether its host ran its application alone.
fn sealed_records(hosts: &[Host]) -> Result<Vec<(bool, SealedRecord)>> {
    let mut records = Vec::new();
    for host in hosts {
        for record in penrose_agent::record::read_records(&host.state.join("sealed.jsonl"))? {
            records.push((host.alone, record));
        }
    }
    Ok(records)
}

/// Per record, whether the aggregation server counted it: a counted report's Seen row is
/// under its day (`penrose_aggregator::state::seen`).
fn counted_reports(store: &dyn Store, records: &[(bool, SealedRecord)]) -> Result<Vec<bool>> {
    let ids: Vec<Vec<u8>> = records
        .iter()
        .map(|(_, r)| seen::id_key(Day(r.day), &r.report_id))
        .collect();
    let keys_of: Vec<&[u8]> = ids.iter().map(Vec::as_slice).collect();
    Ok(store.contains_many(Table::Seen, &keys_of)?)
}

/// Rows of the aggregation server's Spent table: one per report admitted by a token.
fn spent_rows(store: &dyn Store) -> Result<usize> {
    let mut spent_rows = 0usize;
    store.scan(&[Table::Spent], &mut |_, _, _| {
        spent_rows += 1;
        Ok(())
    })?;
    Ok(spent_rows)
}

/// A (class, GPU architecture, counter): what the design server decrypts one histogram of.
type SumKey = (u32, String, u16);

/// The counted reports of one (class, GPU architecture, counter, day), added up.
struct DaySum {
    bins: [u64; BIN_COUNT],
    reports: u64,
    /// Whether a host that ran its application alone fed it.
    alone: bool,
    /// The raw joint values behind its cells.
    values: Vec<[f64; 2]>,
}

/// Per (class, GPU architecture, counter, day): the epoch of a report is its day (nothing
/// closed early); sums never mix architectures.
fn sums_per_day(
    state: &State,
    records: &[(bool, SealedRecord)],
    counted: &[bool],
) -> Result<BTreeMap<(u32, String, u16, u32), DaySum>> {
    let mut per_day = BTreeMap::new();
    for ((alone, record), counted) in records.iter().zip(counted) {
        if !counted {
            continue;
        }
        // Through the store: SST rows are loaded on demand, so a reopened state's tables hold
        // only some of them. The class the snippet was placed in, as the check always used.
        let class = state
            .snippet_row(&record.snippet)?
            .map(|s| s.class.0)
            .context("a counted report's snippet has no class")?;
        let entry = per_day
            .entry((class, record.arch.clone(), record.counter, record.day))
            .or_insert(DaySum {
                bins: [0; BIN_COUNT],
                reports: 0,
                alone: false,
                values: Vec::new(),
            });
        for (sum, bin) in entry.bins.iter_mut().zip(&record.bins) {
            *sum += u64::from(*bin);
        }
        entry.reports += 1;
        entry.alone |= *alone;
        entry.values.extend_from_slice(&record.joint_values);
    }
    Ok(per_day)
}

/// What one decrypted (class, architecture, counter) must be: its releasable days' sums.
struct ExpectedSum {
    bins: [u64; BIN_COUNT],
    reports: u64,
    values: Vec<[f64; 2]>,
}

/// What the design server must have decrypted, from the counted records.
struct Expected {
    /// Per (class, architecture, counter), the days whose sum reaches k contributors.
    sums: HashMap<SumKey, ExpectedSum>,
    /// Every (class, architecture, counter) counted.
    pairs: BTreeSet<SumKey>,
    /// Reports counted from the hosts that ran an application alone.
    alone_counted: usize,
    /// Where each one's counted reports came from.
    origins: HashMap<SumKey, Origins>,
}

impl Expected {
    fn of(per_day: &BTreeMap<(u32, String, u16, u32), DaySum>, threshold: Threshold) -> Self {
        let cap = ReportsPerContributor::DEFAULT;
        let mut expected = Expected {
            sums: HashMap::new(),
            pairs: BTreeSet::new(),
            alone_counted: 0,
            origins: HashMap::new(),
        };
        for ((class, arch, counter, _), day) in per_day {
            let key = (*class, arch.clone(), *counter);
            expected.pairs.insert(key.clone());
            let origin = expected.origins.entry(key.clone()).or_default();
            match day.alone {
                true => {
                    expected.alone_counted += day.reports as usize;
                    origin.alone += day.reports;
                }
                false => origin.shared += day.reports,
            }
            if !releasable(day.reports, 1, threshold, cap) {
                continue;
            }
            let entry = expected.sums.entry(key).or_insert(ExpectedSum {
                bins: [0; BIN_COUNT],
                reports: 0,
                values: Vec::new(),
            });
            for (s, b) in entry.bins.iter_mut().zip(&day.bins) {
                *s += b;
            }
            entry.reports += day.reports;
            entry.values.extend_from_slice(&day.values);
        }
        expected
    }
}

/// How the design server's report compares with what the records say it must be.
pub(super) struct Compared {
    /// (class, counter) aggregates decrypted.
    pub decrypted: usize,
    /// Held back under k (withheld by the aggregation server or by the design server).
    pub held_back: usize,
    /// Reports counted from lone hosts, and of those, reports inside a decrypted sum.
    pub alone_counted: usize,
    /// See `alone_counted`.
    pub alone_decrypted: usize,
    /// Every decrypted aggregate is exact, everything else was withheld or held back, and
    /// nothing was quarantined or of a lone host.
    pub exact: bool,
    /// The decrypted aggregates.
    pub rows: Vec<Row>,
    /// The decrypted joint views, each checked against the raw values.
    pub joints: Vec<JointCheck>,
}

fn compare(report: &Report, expected: &Expected) -> Compared {
    let decrypted = &report.decrypted;
    let alone_decrypted = lone_reports_decrypted(&expected.origins, decrypted);
    let mut exact = alone_decrypted == 0;
    let mut rows = Vec::new();
    let mut joints = Vec::new();
    for c in decrypted {
        let wanted = expected.sums.get(&(c.class, c.arch.clone(), c.counter));
        let ok = wanted
            .is_some_and(|w| w.reports == c.reports && w.bins.as_slice() == c.bins.as_slice());
        exact &= ok;
        if let Some(joint) = &c.joint {
            let values = wanted.map_or(&[][..], |w| w.values.as_slice());
            joints.push(check_joint(c, joint, values));
        }
        rows.push(Row::of(c, ok));
    }
    // Everything released was decrypted; everything else was withheld by the aggregation
    // server (never exported) or held back by the design server; nothing quarantined.
    exact &= expected.sums.len() == decrypted.len();
    let held_back = report.held_back.len() + report.withheld_sums as usize;
    exact &= held_back == expected.pairs.len() - expected.sums.len();
    exact &= report.quarantined.is_empty();
    Compared {
        decrypted: decrypted.len(),
        held_back,
        alone_counted: expected.alone_counted,
        alone_decrypted,
        exact,
        rows,
        joints,
    }
}

impl Row {
    /// The row of one decrypted (class, counter); `exact` when it equals the agents' sealed
    /// histograms.
    fn of(c: &CounterReport, exact: bool) -> Self {
        Row {
            class: c.class,
            counter: c.name.clone(),
            unit: c.unit.clone(),
            reports: c.reports,
            contributors: c.contributors_at_least,
            samples: c.samples,
            mean: c.mean,
            p50: c.p50,
            p90: c.p90,
            exact,
        }
    }
}

/// Checks one decrypted joint view of the design server's report (`c`, its `joint`) against
/// the raw (x, y) values the agents recorded for the reports in it: as many values as
/// samples, and in each quadrant as many values, and the same share, as the design server
/// found in the decrypted grid. The values are compared with the split the report names
/// directly (`x >= split`), not through the catalogue's binning, so a cell put on the wrong
/// side of an edge anywhere from the agent to the design server shows.
fn check_joint(c: &CounterReport, j: &JointSummary, values: &[[f64; 2]]) -> JointCheck {
    // Kernel time per quadrant, where an axis is a duration.
    let duration_axis = match (j.x.unit.as_str(), j.y.unit.as_str()) {
        ("ns", _) => Some(0),
        (_, "ns") => Some(1),
        _ => None,
    };
    let (counted, time) = quadrant_counts(values, (j.x.split, j.y.split), duration_axis);
    let all_time: f64 = time.iter().sum();
    let total = values.len() as u64;
    let mut quadrants = Vec::new();
    let mut from_grid = Vec::new();
    let mut exact = total == c.samples && total > 0;
    for (i, q) in j.quadrants.iter().enumerate() {
        from_grid.push(q.samples);
        let from_values = counted.get(i).copied().unwrap_or(u64::MAX);
        exact &= (q.x_high, q.y_high) == (i % 2 == 1, i >= 2);
        // Counts exactly; the share up to the last bit, which serde_json's float parsing
        // (without its float_roundtrip feature) may not give back.
        let expected_share = from_values as f64 / total.max(1) as f64;
        exact &= q.samples == from_values && (q.share - expected_share).abs() <= 1e-12;
        // The share of kernel time the raw durations give lies within the bounds the design
        // server derived from the cell edges.
        if duration_axis.is_some() {
            let truth = time.get(i).copied().unwrap_or(f64::NAN) / all_time;
            exact &= q
                .time_share
                .is_some_and(|b| b.low <= truth + 1e-12 && truth <= b.high + 1e-12);
        }
        quadrants.push(JointQuadrant {
            describe: describe_quadrant(j, i),
            share: q.share,
            time_share: q.time_share.map(|t| t.estimate),
        });
    }
    exact &= quadrants.len() == 4;
    JointCheck {
        class: c.class,
        view: c.name.clone(),
        samples: total,
        quadrants,
        from_grid,
        from_values: counted.to_vec(),
        exact,
    }
}

/// The raw values per quadrant at the splits (`x >= split` is high), and the kernel time in
/// each where an axis (`duration_axis`, 0 for x) is a duration.
fn quadrant_counts(
    values: &[[f64; 2]],
    (sx, sy): (f64, f64),
    duration_axis: Option<usize>,
) -> ([u64; 4], [f64; 4]) {
    let mut counted = [0u64; 4];
    let mut time = [0f64; 4];
    for &[x, y] in values {
        let q = usize::from(x >= sx) + 2 * usize::from(y >= sy);
        counted[q] += 1;
        if let Some(axis) = duration_axis {
            time[q] += [x, y][axis];
        }
    }
    (counted, time)
}

/// What quadrant `i` of `j` covers: "kernel_duration >= 10.0 µs and achieved_occupancy <
/// 50.0%".
fn describe_quadrant(j: &JointSummary, i: usize) -> String {
    format!(
        "{} {} {} and {} {} {}",
        j.x.counter,
        if i % 2 == 1 { ">=" } else { "<" },
        with_unit(j.x.split, &j.x.unit),
        j.y.counter,
        if i >= 2 { ">=" } else { "<" },
        with_unit(j.y.split, &j.y.unit),
    )
}

/// Where the counted reports of one (class, architecture, counter) came from.
#[derive(Debug, Default)]
struct Origins {
    /// From hosts that ran their application alone.
    alone: u64,
    /// From the others.
    shared: u64,
}

/// The lone hosts' reports inside what the design server decrypted: those of every
/// (class, architecture, counter) it decrypted that only lone hosts fed. Read from the design
/// server's output, so that a design server that decrypted a lone application's sum makes the
/// demo fail.
fn lone_reports_decrypted(
    origins: &HashMap<SumKey, Origins>,
    decrypted: &[CounterReport],
) -> usize {
    decrypted
        .iter()
        .filter_map(|c| origins.get(&(c.class, c.arch.clone(), c.counter)))
        .filter(|o| o.shared == 0)
        .map(|o| o.alone as usize)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decrypted (class, architecture, counter 3) as the design server's report has it.
    fn decrypted(class: u32, arch: &str) -> CounterReport {
        CounterReport {
            class,
            arch: arch.to_string(),
            merged_from: Vec::new(),
            catalogue: 1,
            counter: 3,
            name: "kernel_duration".to_string(),
            unit: "ns".to_string(),
            reports: 1,
            samples: 1,
            contributors_at_least: 10,
            sums: 1,
            epochs: vec![20_000],
            held_back_reports: 0,
            bound_enforced_by_tokens: true,
            bins: vec![0; BIN_COUNT],
            mean: None,
            p50: None,
            p90: None,
            p99: None,
            label: None,
            joint: None,
        }
    }

    #[test]
    fn a_decrypted_lone_application_is_seen_in_the_design_servers_output() {
        let mut origins = HashMap::new();
        origins.insert(
            (7, "sm_90".to_string(), 3),
            Origins {
                alone: 12,
                shared: 0,
            },
        );
        origins.insert(
            (8, "sm_90".to_string(), 3),
            Origins {
                alone: 5,
                shared: 400,
            },
        );
        origins.insert(
            (9, "sm_90".to_string(), 3),
            Origins {
                alone: 0,
                shared: 400,
            },
        );
        let row = decrypted;
        // The popular classes only (one of which a lone host also fed): nothing lone.
        assert_eq!(
            lone_reports_decrypted(&origins, &[row(8, "sm_90"), row(9, "sm_90")]),
            0
        );
        // A design server that decrypted the lone class: its 12 reports.
        assert_eq!(
            lone_reports_decrypted(&origins, &[row(9, "sm_90"), row(7, "sm_90")]),
            12
        );
        // The same class under another architecture is another sum.
        assert_eq!(lone_reports_decrypted(&origins, &[row(7, "sm_80")]), 0);
    }
}
