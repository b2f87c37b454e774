//! Measures how fast the auditor answers a page at 2048 bits: partial decryptions (with their
//! proofs) per second, the median over several answers of the same page, on one thread and
//! on every CPU. Each answer is the whole request path (`Auditor::answer`: decode, signature,
//! chain, page checks, ciphertext validation, partials, record); the first also records the
//! bundle.
//!
//! ```text
//! cargo run --release -p penrose-auditor --example page_rate -- [ENTRIES [RUNS]]
//! ```
//!
//! Defaults: a page of 32 entries (the design server's page), 5 answers per setting.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{DAY, ENOUGH, Setup};
use cpu_time::ProcessTime;
use penrose_auditor::{Auditor, Policy};
use penrose_core::audit::{AuditAnswer, AuditRequest};
use penrose_core::paillier::KeySize;

fn main() {
    let mut args = std::env::args().skip(1);
    let entries: u32 = args.next().map_or(32, |a| a.parse().unwrap());
    let runs: usize = args.next().map_or(5, |a| a.parse().unwrap());
    let mut setup = Setup::with_key_size(KeySize::Bits2048, Policy::default());
    let sums = (0..entries)
        .map(|class| setup.sum(DAY, class, ENOUGH).0)
        .collect();
    let bundle = setup.chain(1).next(&[DAY], sums);
    let request = AuditRequest::Release {
        bundle,
        first: 0,
        count: entries,
        evidence: Vec::new(),
    }
    .encode();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("page of {entries} sums at 2048 bits, {runs} answers per setting, {cpus} CPUs");
    for workers in [1, cpus] {
        let auditor = setup.auditor().with_workers(workers);
        let (wall, cpu) = measure(&auditor, &request, runs);
        let rate = f64::from(entries) / wall.as_secs_f64();
        println!(
            "{workers} thread(s): median {:.2} s wall per page = {rate:.2} partials/s; \
             median cpu {:.1} ms per partial",
            wall.as_secs_f64(),
            cpu.as_secs_f64() * 1e3 / f64::from(entries)
        );
    }
}

/// Median wall time and median process CPU time of `runs` answers.
fn measure(auditor: &Auditor, request: &[u8], runs: usize) -> (Duration, Duration) {
    let mut walls = Vec::with_capacity(runs);
    let mut cpus = Vec::with_capacity(runs);
    for _ in 0..runs {
        let (start, cpu) = (Instant::now(), ProcessTime::now());
        let answer = AuditAnswer::decode(&auditor.answer(request)).unwrap();
        walls.push(start.elapsed());
        cpus.push(cpu.elapsed());
        assert!(matches!(answer, AuditAnswer::Partials { .. }), "{answer:?}");
    }
    walls.sort();
    cpus.sort();
    (walls[runs / 2], cpus[runs / 2])
}
