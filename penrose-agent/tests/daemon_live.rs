//! `penrose-agent run` with the live eBPF source against the stand-in libcuda: replayer
//! processes launch a real trace's kernels, the daemon's probes capture them in budgeted
//! windows, and sealed, encrypted reports reach a loopback server. Needs root (eBPF); without
//! it, prints SKIPPED and passes (CI runs as root). The binary is its own replayer: with
//! `PENROSE_LIVE_CHILD` set it replays one trace through the stand-in, looping until killed.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use penrose_standin::{
    Driver, EntryPoint, Loops, Pace, ProcessSelection, ReplayOptions, ReplayPlan, Resolve, Via,
};

const CHILD: &str = "PENROSE_LIVE_CHILD";

fn main() {
    if let Some(spec) = std::env::var_os(CHILD) {
        let spec = spec.to_string_lossy().into_owned();
        let (lib, trace) = spec.split_once('\n').unwrap();
        let trace = penrose_traces::read_trace(Path::new(trace)).unwrap();
        let plan = ReplayPlan::from_trace(&trace, ProcessSelection::Largest).unwrap();
        let driver = Driver::load(Path::new(lib)).unwrap();
        let options = ReplayOptions {
            pace: Pace::Asap,
            loops: Loops::Count(1_000_000),
            resolve: Resolve::Module,
            via: Via::Entry(EntryPoint::LaunchKernel),
            stop: None,
            devices: penrose_standin::DevicePlan::default(),
        };
        penrose_standin::replay(&driver, &plan, &options).unwrap();
        return;
    }
    if !is_root() {
        println!("SKIPPED: the live daemon test needs root for eBPF (CI runs it as root)");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let Some(fx) = Fixture::new() else {
        return;
    };
    let lib = penrose_standin::install_libcuda(fx.dir.path()).unwrap();
    let (server, handler) = rt.block_on(start_server(&fx.identity, "127.0.0.1:0".parse().unwrap()));
    let capture = format!(
        r#"source = "ebpf"
window_launches = 2000
budget_percent = 100.0
max_window_seconds = 1.0
min_gap_seconds = 0.5
max_gap_seconds = 2.0
sample_period = 20
counters = "test-standin-ring"
libraries = ["{}"]
scan_system = false
# The stand-in copy lives in a temporary directory under /tmp.
allow_untrusted_libs = true
calibrate = false
"#,
        lib.display()
    );
    let config = fx.config(server.local_addr(), "", "");
    // Replace the replay [capture] section with the live one.
    let text = std::fs::read_to_string(&config).unwrap();
    let start = text.find("[capture]\n").unwrap() + "[capture]\n".len();
    let end = text.find("[replay]").unwrap();
    std::fs::write(
        &config,
        format!("{}{capture}\n{}", &text[..start], &text[end..]),
    )
    .unwrap();

    let trace = fx.traces.join("hta-trace_filter--sampled_rank-0.json.gz");
    let me = std::env::current_exe().unwrap();
    // Started before the agent, as on a host whose agent restarts under running jobs: the
    // agent never sees their contexts, and attributes their launches to the one GPU each
    // process's environment makes visible (the stand-in host has eight).
    let mut replayers: Vec<_> = ["3", "6"]
        .into_iter()
        .map(|gpu| {
            Command::new(&me)
                .env("CUDA_VISIBLE_DEVICES", gpu)
                .env_remove("CUDA_DEVICE_ORDER")
                .env(
                    CHILD,
                    format!(
                        "{}\n{}",
                        lib.display(),
                        std::fs::canonicalize(&trace).unwrap().display()
                    ),
                )
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let log = fx.dir.path().join("agent.log");
    let mut agent = spawn_agent(&config, &log);
    let agent_pid = agent.id() as i32;
    wait_until(
        Duration::from_secs(120),
        || handler.ids().len() >= 4,
        || {
            format!(
                "{} stored; status {:?}; log:\n{}",
                handler.ids().len(),
                fx.status(),
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        },
    );
    // SAFETY: signalling our own child.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(agent.id() as i32, libc::SIGTERM);
    }
    wait_until(
        Duration::from_secs(60),
        || agent.try_wait().unwrap().is_some(),
        || {
            // SAFETY: our own child.
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(agent_pid, libc::SIGKILL);
            }
            format!(
                "agent did not stop; log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        },
    );
    assert!(agent.wait().unwrap().success());
    for r in &mut replayers {
        let _ = r.kill();
        let _ = r.wait();
    }
    rt.block_on(server.shutdown());
    let status = fx.status().unwrap();
    assert_eq!(status.source.kind, "ebpf");
    assert_eq!(status.source.counters, "test-standin-ring");
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        log_text.contains("WARN")
            && log_text.contains("TEST EQUIPMENT: capture.counters = \"test-standin-ring\""),
        "{log_text}"
    );
    assert!(status.windows >= 1 && status.launches > 0, "{status:?}");
    assert!(status.pipeline.samples > 0);
    let devices = status.source.samples.devices;
    assert!(devices.single_visible > 0, "{:?}", status.source.samples);
    assert_eq!(
        status.source.samples.with_values, status.source.samples.sampled,
        "{:?}",
        status.source.samples
    );
    let records = fx.records();
    // The stand-in fills the per-launch group: its five counters and the joint views that pair
    // two of them.
    let catalogue = penrose_core::counters::Catalogue::current();
    let group = penrose_core::counters::CounterGroup(2);
    let names: Vec<&str> = catalogue
        .group(group)
        .map(|c| c.name)
        .chain(
            catalogue
                .joint_views()
                .filter(|j| j.group() == group)
                .map(|j| j.view.name),
        )
        .collect();
    assert_eq!(names.len(), 7, "{names:?}");
    for r in &records {
        assert!(
            names.contains(&r.counter_name.as_str()),
            "{}",
            r.counter_name
        );
    }
    assert!(
        records
            .iter()
            .any(|r| r.counter_name == "duration_x_occupancy"),
        "a joint view was sealed"
    );
    for id in handler.ids() {
        assert!(records.iter().any(|r| r.report_id == id));
    }
    println!(
        "live daemon: {} windows, {} launches, {} samples, {} reports stored, probe overhead {:?}%",
        status.windows,
        status.launches,
        status.pipeline.samples,
        handler.ids().len(),
        status.probe_overhead_percent
    );
}
