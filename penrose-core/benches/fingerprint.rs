//! Fingerprint throughput in kernels per second: one capture window of L = 10,000 launches
//! turned into a snippet hash, as the agent does when a window closes.
//!
//! The window is the first 10,000 launches of a real trace (`$PENROSE_TRACES` or
//! `../shared/traces`), or a synthetic looped sequence of 80 long names when the traces are
//! absent.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use penrose_core::fingerprint::{FingerprintParams, Fingerprinter, Weighting};

const WINDOW: usize = 10_000;

fn window() -> (String, Vec<String>) {
    let dir = penrose_traces::TraceFolder::default_dir();
    let file = dir.join("hta-df_index_resolver--df_index_resolver.json.gz");
    if let Ok(trace) = penrose_traces::read_trace(&file) {
        let seqs = trace.process_sequences();
        if let Some(seq) = seqs.values().next() {
            let names = seq
                .iter()
                .cycle()
                .take(WINDOW)
                .map(|k| k.name.to_string())
                .collect();
            return ("df_index_resolver".into(), names);
        }
    }
    eprintln!("traces absent: benchmarking a synthetic window");
    let names = (0..WINDOW)
        .map(|i| {
            format!(
                "void at::native::vectorized_elementwise_kernel<4, Functor{}, at::detail::Array<char*, 3> >(int)",
                (i * 7 + i / 13) % 80
            )
        })
        .collect();
    ("synthetic".into(), names)
}

fn bench(c: &mut Criterion) {
    let (source, names) = window();
    let mut group = c.benchmark_group(format!("snippet_hash_{source}"));
    group.throughput(Throughput::Elements(WINDOW as u64));
    for (label, weighting) in [("weighted", Weighting::Counts), ("set", Weighting::Set)] {
        for ngram_len in [4, 8] {
            let f = Fingerprinter::new(FingerprintParams {
                weighting,
                ngram_len,
                ..FingerprintParams::default()
            })
            .unwrap();
            group.bench_function(format!("{label}_n{ngram_len}_L{WINDOW}"), |b| {
                b.iter(|| f.snippet_hash(black_box(&names)))
            });
        }
    }
    group.finish();

    let f = Fingerprinter::new(FingerprintParams::default()).unwrap();
    let a = f.snippet_hash(&names[..5_000]);
    let b = f.snippet_hash(&names[5_000..]);
    c.bench_function("estimate_jaccard", |bench| {
        bench.iter(|| f.similarity(black_box(&a), black_box(&b)))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
