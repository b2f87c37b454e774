//! Per-launch cost of the stand-in with no probe attached: the baseline the capture probes'
//! cost is measured against (a probed launch costs this plus the uprobe trap and the BPF
//! program). One launch is `penrose_standin_set_next_counters` plus the launch call, as the
//! replayer makes it; the counter ring is written on every launch.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use penrose_standin::{
    Driver, EntryPoint, LIBCUDA_PATH, Launch, NextCounters, Present, StreamHandle,
};

fn launch(c: &mut Criterion) {
    let driver = Driver::load(Path::new(LIBCUDA_PATH)).unwrap();
    driver.init().unwrap();
    driver.create_context(0).unwrap();
    let module = driver.module_load_data(c"bench image").unwrap();
    let f = driver
        .module_get_function(module, c"void at::native::elementwise_kernel<128, 2>(int)")
        .unwrap();
    let l = Launch {
        grid: [108, 1, 1],
        block: [128, 1, 1],
        shared_mem_bytes: 0,
        stream: StreamHandle(0x5e_0000_0100),
    };
    let counters = NextCounters {
        duration_ns: 4_500,
        est_achieved_occupancy_pct: 50.0,
        blocks_per_sm: 1.0,
        registers_per_thread: 32,
        shared_memory_bytes: 0,
        present: Present::DURATION
            | Present::OCCUPANCY
            | Present::BLOCKS_PER_SM
            | Present::REGISTERS
            | Present::SHARED_MEMORY,
        reserved: 0,
    };
    let mut group = c.benchmark_group("standin_launch_unprobed");
    group.throughput(Throughput::Elements(1));
    for entry in [EntryPoint::LaunchKernel, EntryPoint::LaunchKernelEx] {
        group.bench_function(entry.symbol(), |b| {
            b.iter(|| {
                driver.set_next_counters(black_box(&counters));
                driver.launch(entry, black_box(f), black_box(&l)).unwrap();
            })
        });
    }
    group.finish();
    let _ = std::fs::remove_file(penrose_standin::ring_path(std::process::id()));
}

criterion_group!(benches, launch);
criterion_main!(benches);
