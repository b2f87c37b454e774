//! SST/EST on the real traces: capture windows (L = 10,000, the design's window, and 2,500) at
//! random offsets of one trace's main process land in one class; different traces land in
//! different classes. At L = 2,500 this needs the merging of classes a window bridges (without
//! it df_index_resolver split). At L = 1,000, 12 windows cannot cover df_index_resolver's
//! 19,370 launches densely enough to bridge its parts (docs/evaluation.md has the shares).
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
    if !TraceFolder::open(&dir).is_ok_and(|f| !f.files().is_empty()) {
        penrose_host::skip::skipped(format_args!(
            "SKIPPED: the real traces are not in {} (set PENROSE_TRACES)",
            dir.display()
        ));
        return;
    }
    for len in [10_000, 2_500] {
        one_class_per_trace(len);
    }
}

fn one_class_per_trace(len: usize) {
    let dir = TraceFolder::default_dir();
    let snippets = trace_snippets(&dir, 12, len, 7).unwrap();
    let mut tables = Tables::new(FingerprintParams::default());
    let mut classes_of: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for (_, snippet) in &snippets {
        tables.record(*snippet, Day(20_000));
    }
    // Where each snippet counts once every window arrived (a later window may join classes).
    for (app, snippet) in &snippets {
        let class = tables.class_of(&snippet.hash).unwrap();
        classes_of.entry(app.clone()).or_default().insert(class.0);
    }
    assert!(
        classes_of.len() >= 5,
        "expected several traces: {classes_of:?}"
    );
    for (app, classes) in &classes_of {
        assert_eq!(
            classes.len(),
            1,
            "L = {len}: {app} split over classes {classes:?}"
        );
    }
    let all: Vec<u32> = classes_of.values().flatten().copied().collect();
    let distinct: BTreeSet<u32> = all.iter().copied().collect();
    assert_eq!(distinct.len(), all.len(), "traces merged: {classes_of:?}");
    assert_eq!(tables.class_count(), classes_of.len());
}
