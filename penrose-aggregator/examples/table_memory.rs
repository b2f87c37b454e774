//! Heap memory of the SST/EST (with the LSH index) for many applications, measured as the growth of
//! the process's resident set while they are built: `cargo run --release -p penrose-aggregator --example table_memory --
//! 2000 10` (applications, distinct snippets per application). Prints JSON.
//!
//! Applications are synthetic (the trace folder holds seven): each repeats an iteration of
//! 300 launches over its own 40 kernels; its snippets are windows of 2,000 launches at
//! different offsets, so each application contributes several distinct snippet hashes, as
//! agents at different offsets do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use penrose_aggregator::tables::Tables;
use penrose_core::fingerprint::{FingerprintParams, Fingerprinter};
use penrose_core::wire::Day;

/// Resident set size of this process, from /proc (what the allocator really holds).
fn rss_bytes() -> i64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: i64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

fn main() {
    let mut args = std::env::args().skip(1);
    let apps: usize = args.next().map_or(2000, |a| a.parse().unwrap());
    let per_app: usize = args.next().map_or(10, |a| a.parse().unwrap());
    let f = Fingerprinter::new(FingerprintParams::default()).unwrap();
    let snippets: Vec<_> = (0..apps)
        .flat_map(|app| {
            let f = f.clone();
            (0..per_app).map(move |w| {
                let names: Vec<String> = (0..2_000)
                    .map(|i| {
                        let step = (w * 37 + i) % 300;
                        format!("app{app}_k{}", (step * 7 + step / 13) % 40)
                    })
                    .collect();
                f.fingerprint_of_names(&names)
            })
        })
        .collect();
    let before = rss_bytes();
    let start = Instant::now();
    let mut tables = Tables::new(FingerprintParams::default());
    for s in &snippets {
        tables.record(*s, Day(20_000));
    }
    let _ = tables.take_dirty();
    let elapsed = start.elapsed();
    let bytes = rss_bytes() - before;
    println!(
        "{}",
        serde_json::json!({
            "applications": apps,
            "snippets": tables.snippet_count(),
            "classes": tables.class_count(),
            "rss_growth_bytes": bytes,
            "rss_growth_mib": bytes as f64 / 1_048_576.0,
            "estimated_bytes": tables.heap_bytes(),
            "classify_us_per_new_snippet": elapsed.as_secs_f64() * 1e6 / snippets.len() as f64,
        })
    );
}
