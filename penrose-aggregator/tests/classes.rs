//! SST/EST on the real traces: capture windows (L = 10,000, the design's window) at random
//! offsets of one trace's main process land in one class; different traces land in different
//! classes. (At L = 2,500 the default fingerprint splits some traces; docs/evaluation.md.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};

use penrose_aggregator::loadgen::trace_snippets;
use penrose_aggregator::tables::Tables;
use penrose_core::fingerprint::FingerprintParams;
use penrose_core::wire::Day;
use penrose_traces::TraceFolder;

#[test]
fn windows_of_one_trace_share_a_class_and_traces_do_not() {
    let dir = TraceFolder::default_dir();
    let snippets = trace_snippets(&dir, 12, 10_000, 7).unwrap();
    let mut tables = Tables::new(FingerprintParams::default());
    let mut classes_of: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for (app, snippet) in &snippets {
        let class = tables.record(*snippet, Day(20_000)).class;
        classes_of.entry(app.clone()).or_default().insert(class.0);
    }
    assert!(
        classes_of.len() >= 5,
        "expected several traces: {classes_of:?}"
    );
    for (app, classes) in &classes_of {
        assert_eq!(classes.len(), 1, "{app} split over classes {classes:?}");
    }
    let all: Vec<u32> = classes_of.values().flatten().copied().collect();
    let distinct: BTreeSet<u32> = all.iter().copied().collect();
    assert_eq!(distinct.len(), all.len(), "traces merged: {classes_of:?}");
    assert_eq!(tables.class_count(), classes_of.len());
}
