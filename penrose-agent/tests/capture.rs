//! Live capture against the stand-in libcuda, driven by replays of the real traces.
//!
//! Needs root (loading eBPF programs); without it every check prints SKIPPED and passes. CI
//! runs as root, where all of them run. The binary is its own replayer: run with
//! `PENROSE_CAPTURE_CHILD=1` it replays one trace through the stand-in (in a process of its
//! own, as an application would) and prints the replayer's summary as JSON.
//!
//! The harness is our own (`harness = false`): the checks share one loaded capture and must
//! not run in parallel, since every capture probes every process that maps its library.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashSet;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use penrose_agent::capture::events::Pid;
use penrose_agent::capture::loader::is_root;
use penrose_agent::capture::locate::LibrarySources;
use penrose_agent::capture::schedule::{BudgetConfig, OverheadBudget, Schedule};
use penrose_agent::capture::window::{Snippet, SnippetEnd};
use penrose_agent::capture::{Capture, CaptureConfig};
use penrose_agent::counters::SourceKind;
use penrose_core::counters::Catalogue;
use penrose_core::gpu::GpuArch;
use penrose_core::sampling::SamplePeriod;
use penrose_standin::{
    Driver, EntryPoint, Loops, NextCounters, Pace, ProcessSelection, ReplayOptions, ReplayPlan,
    Resolve, Via,
};
use serde_json::Value;

const CHILD: &str = "PENROSE_CAPTURE_CHILD";

/// Set in the re-run of this binary that checks device attribution on a stand-in host of two
/// architectures (`PENROSE_STANDIN_GPUS` must be in the capture's environment from the start).
const DEVICES_RUN: &str = "PENROSE_CAPTURE_DEVICES";

/// Set in the re-run of this binary that checks attribution to MIG instances on [`MIG_HOST`].
const MIG_RUN: &str = "PENROSE_CAPTURE_MIG";

/// The stand-in host of the MIG checks: GPU 0 whole, GPU 1 in MIG mode with three instances,
/// GPU 2 with two, GPU 3 whole; all Hoppers.
const MIG_HOST: &str = "9.0,9.0/3,9.0/2,9.0";

/// The stand-in host of the device checks: four Amperes, then four Hoppers, in PCI order.
/// CUDA's default order (fastest first) puts the Hoppers first, so a process's ordinal i is
/// host GPU (i + 4) % 8 there, and the host index only under `CUDA_DEVICE_ORDER=PCI_BUS_ID`.
const MIXED_HOST: &str = "8.0,8.0,8.0,8.0,9.0,9.0,9.0,9.0";

fn main() {
    if std::env::var_os(CHILD).is_some() {
        child();
        return;
    }
    if std::env::var_os(DEVICES_RUN).is_some() {
        devices_run();
        return;
    }
    if std::env::var_os(MIG_RUN).is_some() {
        mig_run();
        return;
    }
    let started = Instant::now();
    not_root_is_a_one_line_error();
    no_btf_is_a_one_line_error();
    if !is_root() {
        println!("SKIPPED: live capture tests need root (CI runs them as root)");
        return;
    }
    let Some(traces) = traces() else {
        println!("SKIPPED: no traces (set PENROSE_TRACES)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let lib = penrose_standin::install_libcuda(dir.path()).unwrap();
    let doomed_dir = dir.path().join("container");
    std::fs::create_dir(&doomed_dir).unwrap();
    let doomed = penrose_standin::install_libcuda(&doomed_dir).unwrap();
    let mut capture = Capture::start(CaptureConfig {
        sources: LibrarySources {
            explicit: vec![lib.clone(), doomed.clone()],
            ldconfig: false,
            proc_maps: false,
            // The stand-in copies live in temporary directories under /tmp.
            allow_untrusted: true,
        },
        window_launches: usize::MAX,
        counters: SourceKind::TestStandinRing,
        ..CaptureConfig::default()
    })
    .unwrap();
    assert_eq!(capture.libraries().len(), 2, "two copies are two files");
    the_probe_cost_is_measured_at_start(&capture);
    // A library that disappears (a container gone) must not stop the agent.
    std::fs::remove_file(&doomed).unwrap();
    capture.rescan().unwrap();

    let full = every_trace_every_launch_and_name(&mut capture, &lib, &traces);
    the_launch_log_is_the_snippet_with_configurations(&mut capture, &lib, &traces[0]);
    detached_probes_see_no_launches_but_names(&mut capture, &lib, &traces[0]);
    concurrent_replayers_are_attributed_to_their_pid(&mut capture, &lib, &traces);
    a_window_closes_under_a_running_replay(&mut capture, &lib, &full);
    let counts = capture.counts();
    assert_eq!(
        capture.drops().unwrap(),
        0,
        "ring-buffer drops at full speed"
    );
    assert_eq!(counts.malformed, 0);
    assert_eq!(counts.launches_outside_window, 0);
    println!(
        "capture: {} events, {} launches, 0 drops, {:.1} s in all",
        counts.events,
        counts.launches,
        started.elapsed().as_secs_f64()
    );
    drop(capture);
    default_counters_without_nvml_are_an_error_not_the_stand_in();
    libraries_root_does_not_control_or_over_the_cap_are_counted_not_probed(dir.path());
    snippets_end_at_the_limit(&lib, &full);
    sampled_launches_carry_their_own_trace_values(&lib, &full);
    a_budget_window_closes_when_every_process_reached_l(&lib, &full);
    device_checks_on_a_host_of_two_architectures();
    rerun_on(MIG_RUN, MIG_HOST);
}

/// Re-runs this binary with [`MIXED_HOST`] in its environment for the device checks, and
/// passes its output on.
fn device_checks_on_a_host_of_two_architectures() {
    rerun_on(DEVICES_RUN, MIXED_HOST);
}

/// Re-runs this binary with `run` set and `host` as the stand-in host, and passes its output
/// on.
fn rerun_on(run: &str, host: &str) {
    let out = Command::new(std::env::current_exe().unwrap())
        .env(run, "1")
        .env(penrose_standin::ring::GPUS_VAR, host)
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("CUDA_DEVICE_ORDER")
        .output()
        .unwrap();
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{run} checks: {}", out.status);
}

/// Waits for `replayers`, closes the window and checks that at least `least` launches were
/// sampled, every one with values, attributed through UUIDs and through visible devices both,
/// with no ring drops.
fn every_sample_attributed(
    capture: &mut Capture,
    replayers: Vec<Replayer>,
    least: u64,
) -> (Vec<Snippet>, penrose_agent::capture::Counts) {
    wait_all(capture, replayers);
    capture.close_window().unwrap();
    let snippets = capture.take_snippets();
    let counts = capture.counts();
    assert_eq!(capture.drops().unwrap(), 0, "ring-buffer drops");
    assert!(counts.sampled >= least, "{counts:?}");
    assert_eq!(counts.samples_with_values, counts.sampled, "{counts:?}");
    assert!(counts.devices.by_uuid > 0, "{:?}", counts.devices);
    assert!(
        counts.devices.by_visible_devices > 0,
        "{:?}",
        counts.devices
    );
    (snippets, counts)
}

/// Prints how many samples a device check saw and how they were attributed.
fn print_attributed(what: &str, device: &str, counts: &penrose_agent::capture::Counts) {
    println!(
        "  {what}: {} samples, each with its own {device}'s values ({} through UUIDs, {} through visible devices)",
        counts.sampled, counts.devices.by_uuid, counts.devices.by_visible_devices
    );
}

/// The MIG checks, on [`MIG_HOST`] (this process's environment says so).
fn mig_run() {
    on_this_host(&[
        processes_on_mig_instances_each_read_their_own,
        an_instance_known_only_by_its_gpu_gets_no_values,
    ]);
}

/// Runs `checks` with a fresh stand-in on the stand-in host this process's environment names,
/// each on the trace with the most launches.
fn on_this_host(checks: &[fn(&Path, &Path)]) {
    let traces = traces().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let lib = penrose_standin::install_libcuda(dir.path()).unwrap();
    let trace = traces
        .iter()
        .max_by_key(|t| replayed_sequence(t).len())
        .unwrap();
    for check in checks {
        check(&lib, trace);
    }
}

/// Seven processes on the five MIG instances of [`MIG_HOST`]: five name their instance in
/// `CUDA_VISIBLE_DEVICES` (two also ask `cuDeviceGetUuid`, which names the GPU, not the
/// instance), one in the older `MIG-GPU-<uuid>/<gi>/<ci>` form, and one finds its instance
/// through `cuDeviceGetUuid_v2`. The stand-in stamps each record with the instance that ran
/// it, so a launch credited to its GPU or a neighbour would find no values.
fn processes_on_mig_instances_each_read_their_own(lib: &Path, trace: &Path) {
    let mut capture = standin_capture(lib, usize::MAX, 97);
    let host = penrose_agent::counters::standin::standin_devices();
    let instances: Vec<_> = host.iter().filter(|d| d.instance().is_some()).collect();
    assert_eq!(instances.len(), 5, "{host:?}");
    let names: Vec<String> = instances.iter().map(|d| d.uuid_text()).collect();
    let old_form = format!("MIG-{}/2/0", host[1].uuid);
    capture.open_window().unwrap();
    let mut replayers = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let on = OnDevices {
            visible: Some(name),
            query_uuids: i < 2,
            legacy_uuids: i < 2,
            speed: Some(0.5),
            ..OnDevices::default()
        };
        replayers.push(spawn_on(lib, trace, on));
    }
    let by_old_form = OnDevices {
        visible: Some(&old_form),
        speed: Some(0.5),
        ..OnDevices::default()
    };
    replayers.push(spawn_on(lib, trace, by_old_form));
    // Ordinal 1 in PCI order is GPU 1, which CUDA shows as its first instance.
    let by_v2 = OnDevices {
        ordinal: 1,
        query_uuids: true,
        order: Some("PCI_BUS_ID"),
        speed: Some(0.5),
        ..OnDevices::default()
    };
    replayers.push(spawn_on(lib, trace, by_v2));
    let pids: Vec<u32> = replayers.iter().map(|r| r.child.id()).collect();
    let (snippets, counts) = every_sample_attributed(&mut capture, replayers, 7);
    let seq = replayed_sequence(trace);
    for pid in &pids {
        let snippet = snippet_of(&snippets, Pid(*pid));
        assert!(!snippet.samples.is_empty(), "pid {pid}");
        assert_trace_values(snippet, &seq, &format!("pid {pid} on a MIG instance"));
    }
    print_attributed("7 processes on 5 MIG instances", "instance", &counts);
    check("processes_on_mig_instances_each_read_their_own");
}

/// A process on GPU 1's first instance that asked only `cuDeviceGetUuid` (which names GPU 1)
/// and named no device in its environment: which instance it runs on is CUDA's choice, so its
/// samples get no values, never the GPU's or another instance's.
fn an_instance_known_only_by_its_gpu_gets_no_values(lib: &Path, trace: &Path) {
    let mut capture = standin_capture(lib, usize::MAX, 97);
    capture.open_window().unwrap();
    let on = OnDevices {
        ordinal: 1,
        query_uuids: true,
        legacy_uuids: true,
        order: Some("PCI_BUS_ID"),
        ..OnDevices::default()
    };
    wait_all(&mut capture, vec![spawn_on(lib, trace, on)]);
    capture.close_window().unwrap();
    let counts = capture.counts();
    assert!(counts.sampled > 0);
    assert_eq!(counts.samples_with_values, 0, "{counts:?}");
    assert_eq!(
        counts.samples_missing.device_unknown, counts.sampled,
        "{counts:?}"
    );
    assert_eq!(
        counts.devices.unattributed.unresolved_ordinal, counts.sampled,
        "{:?}",
        counts.devices
    );
    check("an_instance_known_only_by_its_gpu_gets_no_values");
}

/// The device checks, on [`MIXED_HOST`] (this process's environment says so).
fn devices_run() {
    on_this_host(&[
        eight_processes_on_eight_devices_each_read_their_own,
        a_process_switching_devices_is_attributed_launch_by_launch,
        an_ordinal_with_no_certain_device_gets_no_values,
        busy_counters_give_no_values_until_they_are_free,
    ]);
}

/// Where one replayer runs: its ordinal, switches, whether it asks for UUIDs, and the two
/// environment variables that renumber devices.
#[derive(Clone, Copy, Default)]
struct OnDevices<'a> {
    ordinal: i32,
    switch_every: Option<u64>,
    query_uuids: bool,
    /// Asks with the older `cuDeviceGetUuid`, which names a MIG instance's GPU.
    legacy_uuids: bool,
    visible: Option<&'a str>,
    order: Option<&'a str>,
    /// At the trace's pace times this (back to back when `None`): eight launchers at full
    /// speed outrun a debug build's reader on two cores.
    speed: Option<f64>,
}

fn spawn_on(lib: &Path, trace: &Path, on: OnDevices<'_>) -> Replayer {
    let out = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .env(CHILD, "1")
        .env(format!("{CHILD}_OUT"), &out)
        .env(format!("{CHILD}_LIB"), lib)
        .env(format!("{CHILD}_TRACE"), trace)
        .env(format!("{CHILD}_RESOLVE"), "module")
        .env(format!("{CHILD}_VIA"), "launch")
        .env(format!("{CHILD}_LOOPS"), "1")
        .env(format!("{CHILD}_DEVICE"), on.ordinal.to_string())
        .env_remove(DEVICES_RUN)
        .env_remove(MIG_RUN);
    if let Some(every) = on.switch_every {
        command.env(format!("{CHILD}_SWITCH"), every.to_string());
    }
    if on.legacy_uuids {
        command.env(format!("{CHILD}_UUIDS"), "v1");
    } else if on.query_uuids {
        command.env(format!("{CHILD}_UUIDS"), "1");
    }
    if let Some(speed) = on.speed {
        command.env(format!("{CHILD}_PACE"), speed.to_string());
    }
    for (var, value) in [
        ("CUDA_VISIBLE_DEVICES", on.visible),
        ("CUDA_DEVICE_ORDER", on.order),
    ] {
        match value {
            Some(v) => command.env(var, v),
            None => command.env_remove(var),
        };
    }
    Replayer {
        child: command.spawn().unwrap(),
        trace: trace.to_path_buf(),
        out,
    }
}

/// The architecture of [`MIXED_HOST`]'s GPU `host`.
fn mixed_arch(host: usize) -> GpuArch {
    if host < 4 {
        GpuArch::new(8, 0)
    } else {
        GpuArch::new(9, 0)
    }
}

/// Every sample of `snippet` carries the trace's own values for its kernel.
fn assert_trace_values(snippet: &Snippet, seq: &[penrose_traces::Kernel], what: &str) {
    let duration = Catalogue::current()
        .counter_by_name("kernel_duration")
        .unwrap()
        .id;
    for sample in &snippet.samples {
        let expected = NextCounters::from_kernel(&seq[sample.position]);
        let value = sample.values.iter().find(|v| v.counter == duration);
        assert_eq!(
            value.map(|v| v.value),
            Some(expected.duration_ns as f64),
            "{what}: sample at {}",
            sample.position
        );
    }
}

/// Eight processes, one per GPU: four find their GPU through the UUIDs the driver gave them
/// (CUDA's default order, in which ordinal i is host GPU (i + 4) % 8), four through
/// `CUDA_VISIBLE_DEVICES` (one GPU each, renumbered to ordinal 0). The stand-in stamps each
/// record with the GPU that ran it, so a launch attributed to any other GPU would find no
/// values: every sample has its own GPU's values and architecture.
fn eight_processes_on_eight_devices_each_read_their_own(lib: &Path, trace: &Path) {
    let mut capture = standin_capture(lib, usize::MAX, 97);
    assert_eq!(
        capture.gpu_archs(),
        [GpuArch::new(8, 0), GpuArch::new(9, 0)]
    );
    capture.open_window().unwrap();
    let visible: Vec<String> = (0..4).map(|i| i.to_string()).collect();
    let mut replayers = Vec::new();
    let mut host_of = Vec::new();
    for ordinal in 0..4 {
        let on = OnDevices {
            ordinal,
            query_uuids: true,
            speed: Some(0.5),
            ..OnDevices::default()
        };
        replayers.push(spawn_on(lib, trace, on));
        host_of.push((ordinal as usize + 4) % 8);
    }
    for host in &visible {
        let on = OnDevices {
            visible: Some(host),
            order: Some("PCI_BUS_ID"),
            speed: Some(0.5),
            ..OnDevices::default()
        };
        replayers.push(spawn_on(lib, trace, on));
        host_of.push(host.parse().unwrap());
    }
    let pids: Vec<u32> = replayers.iter().map(|r| r.child.id()).collect();
    let (snippets, counts) = every_sample_attributed(&mut capture, replayers, 8);
    let seq = replayed_sequence(trace);
    for (pid, host) in pids.iter().zip(&host_of) {
        let snippet = snippet_of(&snippets, Pid(*pid));
        assert!(!snippet.samples.is_empty(), "pid {pid}");
        for sample in &snippet.samples {
            assert_eq!(sample.arch, mixed_arch(*host), "pid {pid} on GPU {host}");
        }
        assert_trace_values(snippet, &seq, &format!("pid {pid} on GPU {host}"));
    }
    print_attributed("8 processes on 8 GPUs of two architectures", "GPU", &counts);
    check("eight_processes_on_eight_devices_each_read_their_own");
}

/// One process moving to the next GPU every 1,000 launches: each sample is read on the GPU
/// its launch ran on, so its architecture follows the switches position by position.
fn a_process_switching_devices_is_attributed_launch_by_launch(lib: &Path, trace: &Path) {
    let every = 1_000u64;
    let mut capture = standin_capture(lib, usize::MAX, 31);
    capture.open_window().unwrap();
    let on = OnDevices {
        switch_every: Some(every),
        query_uuids: true,
        ..OnDevices::default()
    };
    let replayer = spawn_on(lib, trace, on);
    let pid = Pid(replayer.child.id());
    wait_all(&mut capture, vec![replayer]);
    capture.close_window().unwrap();
    let snippets = capture.take_snippets();
    let snippet = snippet_of(&snippets, pid);
    let counts = capture.counts();
    assert_eq!(counts.samples_with_values, counts.sampled, "{counts:?}");
    let mut archs = HashSet::new();
    for sample in &snippet.samples {
        let ordinal = (sample.position as u64 / every) % 8;
        let host = (ordinal as usize + 4) % 8;
        assert_eq!(
            sample.arch,
            mixed_arch(host),
            "sample at {}",
            sample.position
        );
        archs.insert(sample.arch);
    }
    assert_trace_values(snippet, &replayed_sequence(trace), "switching process");
    assert_eq!(archs.len(), 2, "the replay crossed both architectures");
    println!(
        "  a process switching GPUs every {every} launches: {} samples, each on its launch's GPU",
        snippet.samples.len()
    );
    check("a_process_switching_devices_is_attributed_launch_by_launch");
}

/// CUDA's default order on a host of two architectures is a heuristic the agent does not
/// guess: a process that neither asked for UUIDs nor named its devices gets no values, never
/// another GPU's.
fn an_ordinal_with_no_certain_device_gets_no_values(lib: &Path, trace: &Path) {
    let mut capture = standin_capture(lib, usize::MAX, 97);
    capture.open_window().unwrap();
    let replayer = spawn_on(lib, trace, OnDevices::default());
    wait_all(&mut capture, vec![replayer]);
    capture.close_window().unwrap();
    let counts = capture.counts();
    assert!(counts.sampled > 0);
    assert_eq!(counts.samples_with_values, 0, "{counts:?}");
    assert_eq!(
        counts.samples_missing.device_unknown, counts.sampled,
        "{counts:?}"
    );
    check("an_ordinal_with_no_certain_device_gets_no_values");
}

/// While another tool holds a GPU's counters (the stand-in's busy file), samples on it get
/// none and are counted; once it lets go, values come again.
fn busy_counters_give_no_values_until_they_are_free(lib: &Path, trace: &Path) {
    let busy = penrose_agent::counters::standin::busy_path(4);
    let mut capture = standin_capture(lib, usize::MAX, 97);
    let on = OnDevices {
        query_uuids: true,
        ..OnDevices::default()
    };
    std::fs::write(&busy, b"").unwrap();
    capture.open_window().unwrap();
    wait_all(&mut capture, vec![spawn_on(lib, trace, on)]);
    let held = capture.counts();
    std::fs::remove_file(&busy).unwrap();
    assert!(held.sampled > 0);
    assert_eq!(held.samples_missing.counters_busy, held.sampled, "{held:?}");
    wait_all(&mut capture, vec![spawn_on(lib, trace, on)]);
    capture.close_window().unwrap();
    let after = capture.counts();
    assert!(after.sampled > held.sampled);
    assert_eq!(
        after.samples_with_values,
        after.sampled - held.sampled,
        "{after:?}"
    );
    assert_eq!(after.samples_missing.counters_busy, held.sampled);
    check("busy_counters_give_no_values_until_they_are_free");
}

fn standin_capture(lib: &Path, window_launches: usize, sample_period: u32) -> Capture {
    Capture::start(CaptureConfig {
        sources: LibrarySources {
            explicit: vec![lib.to_path_buf()],
            ldconfig: false,
            proc_maps: false,
            // The stand-in copies live in temporary directories under /tmp.
            allow_untrusted: true,
        },
        window_launches,
        sample_period: SamplePeriod(NonZeroU32::new(sample_period).unwrap()),
        counters: SourceKind::TestStandinRing,
        seed: Some(7),
        ..CaptureConfig::default()
    })
    .unwrap()
}

/// The calibration measured a trap: more than a function call, and more than the BPF program
/// alone, which the kernel's statistics also timed.
fn the_probe_cost_is_measured_at_start(capture: &Capture) {
    let cost = capture.probe_cost();
    println!(
        "  probe cost: {:?} per launch (call {:?} probed, {:?} unprobed), BPF program {:?}",
        cost.per_launch, cost.probed_call, cost.unprobed_call, cost.bpf_run
    );
    assert!(cost.per_launch > Duration::from_nanos(100), "{cost:?}");
    let bpf = cost.bpf_run.expect("BPF run-time statistics");
    assert!(bpf > Duration::ZERO && bpf < cost.per_launch, "{cost:?}");
    assert_eq!(
        capture.counts().launches,
        0,
        "calibration calls are not launches"
    );
    check("the_probe_cost_is_measured_at_start");
}

/// The largest process's kernels in launch order, as the replayer chooses them.
fn replayed_sequence(trace: &Path) -> Vec<penrose_traces::Kernel> {
    let trace = penrose_traces::read_trace(trace).unwrap();
    let seqs = trace.process_sequences();
    let (_, seq) = seqs
        .iter()
        .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.cmp(a.0)))
        .unwrap();
    seq.iter().map(|k| (*k).clone()).collect()
}

/// With S = 97 the BPF countdown samples about one launch in 97, and each sample carries the
/// counter values the replayer passed for that very launch (duration, occupancy, ... of the
/// trace kernel at the sample's position).
fn sampled_launches_carry_their_own_trace_values(lib: &Path, full: &[(PathBuf, Snippet)]) {
    let (trace, whole) = full.iter().max_by_key(|(_, s)| s.names.len()).unwrap();
    let period = 97u32;
    let mut capture = standin_capture(lib, usize::MAX, period);
    capture.open_window().unwrap();
    wait_all(&mut capture, vec![spawn(lib, trace, "module", "launch", 1)]);
    capture.close_window().unwrap();
    let snippets = capture.take_snippets();
    let snippet = &snippets[0];
    let counts = capture.counts();
    let launches = snippet.names.len() as f64;
    let cpus = std::thread::available_parallelism().unwrap().get() as f64;
    assert!(
        (counts.sampled as f64 - launches / f64::from(period)).abs() <= 2.0 + cpus,
        "{} sampled of {launches}",
        counts.sampled
    );
    assert_eq!(counts.samples_with_values, counts.sampled, "{counts:?}");
    assert_eq!(snippet.samples.len() as u64, counts.sampled);
    let seq = replayed_sequence(trace);
    assert_eq!(seq.len(), whole.names.len());
    let catalogue = Catalogue::current();
    let id = |name: &str| catalogue.counter_by_name(name).unwrap().id;
    for sample in &snippet.samples {
        let kernel = &seq[sample.position];
        assert_eq!(&*sample.kernel, &*kernel.name);
        assert_eq!(sample.kernel, snippet.names[sample.position]);
        let expected = NextCounters::from_kernel(kernel);
        let value = |name: &str| {
            sample
                .values
                .iter()
                .find(|v| v.counter == id(name))
                .map(|v| v.value)
        };
        assert_eq!(value("kernel_duration"), Some(expected.duration_ns as f64));
        assert_eq!(
            value("achieved_occupancy"),
            kernel.est_achieved_occupancy_pct
        );
        assert_eq!(value("blocks_per_sm"), kernel.blocks_per_sm);
        assert_eq!(
            value("registers_per_thread"),
            kernel.registers_per_thread.map(f64::from)
        );
        assert_eq!(
            value("shared_memory"),
            kernel
                .shared_memory_bytes
                .map(|b| f64::from(penrose_standin::abi::saturate_u32(b)))
        );
    }
    println!(
        "  {}: {} of {launches} launches sampled at S = {period}, all with the trace's values",
        trace.file_name().unwrap().to_string_lossy(),
        counts.sampled
    );
    check("sampled_launches_carry_their_own_trace_values");
}

/// Under the budget scheduler a window closes as soon as every process in it reached L, long
/// before its maximum length, and the gap that follows is the budget's answer to its cost.
fn a_budget_window_closes_when_every_process_reached_l(lib: &Path, full: &[(PathBuf, Snippet)]) {
    let (trace, whole) = full.iter().min_by_key(|(_, s)| s.names.len()).unwrap();
    let limit = 5_000;
    let mut capture = standin_capture(lib, limit, 10_000);
    let config = BudgetConfig {
        budget: OverheadBudget::new(0.0002).unwrap(),
        max_window: Duration::from_secs(20),
        min_gap: Duration::from_secs(1),
        max_gap: Duration::from_secs(3600),
    };
    let schedule = Schedule::Budget {
        config,
        cost: capture.probe_cost(),
    };
    // Enough loops to keep launching through the whole run at unprobed speed.
    let loops = 400_000_000 / whole.names.len() as u64;
    let mut replayer = spawn(lib, trace, "module", "launch", loops);
    let started = Instant::now();
    capture.run_for(Duration::from_secs(6), &schedule).unwrap();
    let _ = replayer.child.kill();
    let _ = replayer.child.wait();
    let history = capture.history().to_vec();
    assert_eq!(history.len(), 1, "one window, then the gap: {history:?}");
    let w = history[0];
    assert!(w.closed_early, "{w:?}");
    assert!(w.cost.open_for < Duration::from_secs(5), "{w:?}");
    assert!(w.cost.launches >= limit as u64);
    let cpu = w.cost.process_cpu.expect("the replayer's CPU time");
    assert!(cpu > Duration::ZERO);
    assert_eq!(w.gap, schedule.gap_after(&w.cost));
    assert!(w.gap > started.elapsed(), "no second window in the run");
    let snippets = capture.take_snippets();
    assert_eq!(snippets.len(), 1);
    assert_eq!(snippets[0].end, SnippetEnd::Limit);
    assert_eq!(snippets[0].names.len(), limit);
    println!(
        "  budget window: {} launches in {:.3} s, probe time {:.3} s, replayer CPU {:.3} s, next window in {:.0} s",
        w.cost.launches,
        w.cost.open_for.as_secs_f64(),
        w.probe_time.as_secs_f64(),
        cpu.as_secs_f64(),
        w.gap.as_secs_f64()
    );
    check("a_budget_window_closes_when_every_process_reached_l");
}

/// Without kernel BTF the agent exits with status 3 and one line naming it. The BTF file is
/// hidden in a mount namespace of the agent's own (needs root; skipped otherwise).
/// As root on a host without an NVIDIA driver, the default counter source (NVML) cannot open:
/// the capture exits with code 4 (unavailable) saying so, and does not read the stand-in's ring instead.
fn default_counters_without_nvml_are_an_error_not_the_stand_in() {
    if Path::new("/dev/nvidiactl").exists() {
        println!(
            "SKIPPED: default_counters_without_nvml_are_an_error_not_the_stand_in (an NVIDIA driver is here)"
        );
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_penrose-agent"))
        .args(["capture", "--seconds", "1", "--only-lib", "--no-calibrate"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "stderr: {stderr}");
    let last = stderr.trim_end().lines().last().unwrap_or_default();
    assert!(last.starts_with("error: "), "{stderr}");
    assert!(
        last.contains("capture.counters = \"nvml\" cannot be used on this host"),
        "{stderr}"
    );
    assert!(last.contains("does not fall back"), "{stderr}");
    assert!(!stderr.contains("standin"), "{stderr}");
    check("default_counters_without_nvml_are_an_error_not_the_stand_in");
}

/// Copies of the stand-in in a directory under /tmp are not root's to control: by default
/// they are counted, once each, and not probed; allowed, at most `max_libraries` are probed
/// and the rest counted.
fn libraries_root_does_not_control_or_over_the_cap_are_counted_not_probed(dir: &Path) {
    let copies: Vec<PathBuf> = ["trust-a", "trust-b"]
        .iter()
        .map(|name| {
            let d = dir.join(name);
            std::fs::create_dir(&d).unwrap();
            penrose_standin::install_libcuda(&d).unwrap()
        })
        .collect();
    let start = |allow_untrusted: bool, max_libraries: usize| {
        Capture::start(CaptureConfig {
            sources: LibrarySources {
                explicit: copies.clone(),
                ldconfig: false,
                proc_maps: false,
                allow_untrusted,
            },
            max_libraries,
            counters: SourceKind::None,
            calibrate: false,
            ..CaptureConfig::default()
        })
        .unwrap()
    };
    let mut capture = start(false, 64);
    assert!(capture.libraries().is_empty(), "{:?}", capture.libraries());
    capture.rescan().unwrap();
    assert_eq!(capture.counts().libraries_untrusted, 2, "each counted once");
    assert_eq!(capture.counts().libraries_over_cap, 0);
    drop(capture);
    let mut capture = start(true, 1);
    capture.rescan().unwrap();
    assert_eq!(capture.libraries().len(), 1);
    assert_eq!(capture.counts().libraries_untrusted, 0);
    assert_eq!(capture.counts().libraries_over_cap, 1, "counted once");
    check("libraries_root_does_not_control_or_over_the_cap_are_counted_not_probed");
}

fn no_btf_is_a_one_line_error() {
    if !is_root() {
        println!("SKIPPED: no_btf_is_a_one_line_error (needs root for a mount namespace)");
        return;
    }
    let script = format!(
        "mount -t tmpfs none /sys/kernel/btf && exec {} capture --seconds 1 --only-lib",
        env!("CARGO_BIN_EXE_penrose-agent")
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output();
    let Ok(out) = out else {
        println!("SKIPPED: no_btf_is_a_one_line_error (unshare is missing)");
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("unshare failed") || stderr.contains("mount:") {
        println!("SKIPPED: no_btf_is_a_one_line_error (no mount namespace here: {stderr})");
        return;
    }
    assert_eq!(out.status.code(), Some(4), "stderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("kernel BTF is missing"), "{stderr}");
    check("no_btf_is_a_one_line_error");
}

fn traces() -> Option<Vec<PathBuf>> {
    let dir = penrose_traces::TraceFolder::default_dir();
    let files = penrose_traces::TraceFolder::open(&dir)
        .ok()?
        .files()
        .to_vec();
    (!files.is_empty()).then_some(files)
}

/// The replayer side: one trace, one process.
fn child() {
    let var = |k: &str| std::env::var(format!("{CHILD}_{k}")).unwrap();
    let trace = penrose_traces::read_trace(Path::new(&var("TRACE"))).unwrap();
    let plan = ReplayPlan::from_trace(&trace, ProcessSelection::Largest).unwrap();
    let driver = Driver::load(Path::new(&var("LIB"))).unwrap();
    let options = ReplayOptions {
        // Back to back, or at the trace's pace times PACE (launchers faster than a debug
        // build of the reader overflow any ring; the budget, not the ring, bounds that).
        pace: match std::env::var(format!("{CHILD}_PACE"))
            .ok()
            .and_then(|p| p.parse().ok())
        {
            Some(speed) => Pace::Trace { speed },
            None => Pace::Asap,
        },
        loops: Loops::Count(var("LOOPS").parse().unwrap()),
        resolve: if var("RESOLVE") == "library" {
            Resolve::Library
        } else {
            Resolve::Module
        },
        via: if var("VIA") == "rotate" {
            Via::Rotate
        } else {
            Via::Entry(EntryPoint::LaunchKernel)
        },
        stop: None,
        devices: penrose_standin::DevicePlan {
            ordinal: std::env::var(format!("{CHILD}_DEVICE"))
                .ok()
                .and_then(|d| d.parse().ok())
                .unwrap_or(0),
            switch_every: std::env::var(format!("{CHILD}_SWITCH"))
                .ok()
                .and_then(|d| d.parse().ok()),
            query_uuids: std::env::var_os(format!("{CHILD}_UUIDS")).is_some(),
            legacy_uuid_call: std::env::var(format!("{CHILD}_UUIDS")).is_ok_and(|v| v == "v1"),
        },
    };
    let summary = penrose_standin::replay(&driver, &plan, &options).unwrap();
    // A file, not stdout: the summary (every kernel name) outgrows a pipe's buffer.
    std::fs::write(var("OUT"), serde_json::to_vec(&summary).unwrap()).unwrap();
}

struct Replayer {
    child: Child,
    trace: PathBuf,
    out: tempfile::TempPath,
}

fn spawn(lib: &Path, trace: &Path, resolve: &str, via: &str, loops: u64) -> Replayer {
    spawn_paced(lib, trace, resolve, via, loops, None)
}

fn spawn_paced(
    lib: &Path,
    trace: &Path,
    resolve: &str,
    via: &str,
    loops: u64,
    speed: Option<f64>,
) -> Replayer {
    let out = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    let mut command = Command::new(std::env::current_exe().unwrap());
    if let Some(speed) = speed {
        command.env(format!("{CHILD}_PACE"), speed.to_string());
    }
    let child = command
        .env(CHILD, "1")
        .env(format!("{CHILD}_OUT"), &out)
        .env(format!("{CHILD}_LIB"), lib)
        .env(format!("{CHILD}_TRACE"), trace)
        .env(format!("{CHILD}_RESOLVE"), resolve)
        .env(format!("{CHILD}_VIA"), via)
        .env(format!("{CHILD}_LOOPS"), loops.to_string())
        .spawn()
        .unwrap();
    Replayer {
        child,
        trace: trace.to_path_buf(),
        out,
    }
}

/// Drains the ring while the replayers run; returns their summaries.
fn wait_all(capture: &mut Capture, replayers: Vec<Replayer>) -> Vec<(Pid, Value)> {
    let mut pending: Vec<_> = replayers.into_iter().map(Some).collect();
    let mut out = Vec::new();
    capture.poll_until(|_| {
        for slot in &mut pending {
            let Some(r) = slot else { continue };
            let Some(status) = r.child.try_wait().unwrap() else {
                continue;
            };
            assert!(status.success(), "replayer of {}", r.trace.display());
            let summary: Value = serde_json::from_slice(&std::fs::read(&r.out).unwrap()).unwrap();
            out.push((Pid(summary["pid"].as_u64().unwrap() as u32), summary));
            *slot = None;
        }
        pending.iter().all(Option::is_none)
    });
    // The exit records were written before the parent could see the exits.
    capture.drain_all();
    out
}

fn snippet_of(snippets: &[Snippet], pid: Pid) -> &Snippet {
    let mine: Vec<_> = snippets.iter().filter(|s| s.pid == pid).collect();
    assert_eq!(mine.len(), 1, "one snippet for pid {}", pid.0);
    mine[0]
}

/// Kernel names in order of first launch, as the replayer reports its functions.
fn first_appearances(names: &[std::sync::Arc<str>]) -> Vec<String> {
    let mut seen = HashSet::new();
    names
        .iter()
        .filter(|n| seen.insert(n.to_string()))
        .map(|n| n.to_string())
        .collect()
}

fn assert_complete(snippet: &Snippet, summary: &Value, what: &str) {
    let replayed = summary["replayed"].as_u64().unwrap() as usize;
    assert_eq!(snippet.names.len(), replayed, "{what}: every launch");
    assert_eq!(snippet.unnamed, 0, "{what}: every launch named");
    let expected: Vec<String> = summary["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        first_appearances(&snippet.names),
        expected,
        "{what}: every kernel name, in order of first launch"
    );
}

fn check(name: &str) {
    println!("test {name} ... ok");
}

/// Each trace replayed once inside a window: the snippet holds every launch and every name,
/// and ends at the process's exit while the window stays open.
fn every_trace_every_launch_and_name(
    capture: &mut Capture,
    lib: &Path,
    traces: &[PathBuf],
) -> Vec<(PathBuf, Snippet)> {
    let mut full = Vec::new();
    for (i, trace) in traces.iter().enumerate() {
        let resolve = if i % 2 == 0 { "module" } else { "library" };
        let via = if i % 3 == 0 { "rotate" } else { "launch" };
        capture.open_window().unwrap();
        let done = wait_all(capture, vec![spawn(lib, trace, resolve, via, 1)]);
        let exited = capture.take_snippets();
        capture.close_window().unwrap();
        assert!(capture.take_snippets().is_empty(), "nothing left open");
        let (pid, summary) = &done[0];
        let snippet = snippet_of(&exited, *pid);
        assert_eq!(
            snippet.end,
            SnippetEnd::Exit,
            "ended by the exit, mid-window"
        );
        assert_complete(snippet, summary, &trace.display().to_string());
        println!(
            "  {}: {} launches, {} names ({resolve}, {via}), replayer {:.0} launches/s",
            trace.file_name().unwrap().to_string_lossy(),
            snippet.names.len(),
            summary["functions"].as_array().unwrap().len(),
            summary["launches_per_s"].as_f64().unwrap()
        );
        full.push((trace.clone(), snippet.clone()));
    }
    check("every_trace_every_launch_and_name");
    full
}

/// `capture --json --launches`: the launch log holds the window's launches in the snippet's
/// order, under the snippet's names, each with the configuration the replayer launched it with.
fn the_launch_log_is_the_snippet_with_configurations(
    capture: &mut Capture,
    lib: &Path,
    trace: &Path,
) {
    capture.log_launches(usize::MAX);
    capture.open_window().unwrap();
    let done = wait_all(capture, vec![spawn(lib, trace, "module", "launch", 1)]);
    let exited = capture.take_snippets();
    capture.close_window().unwrap();
    let pid = done[0].0;
    let snippet = snippet_of(&exited, pid);
    let log = capture.launch_log().launches();
    assert!(log.iter().all(|l| l.launch.pid == pid), "only the replayer");
    let logged: Vec<&str> = log.iter().map(|l| &*l.name).collect();
    let named: Vec<&str> = snippet.names.iter().map(|n| &**n).collect();
    assert_eq!(logged, named, "the snippet's names, in its order");
    let seq = replayed_sequence(trace);
    assert_eq!(seq.len(), log.len());
    let dims = |d: Option<[u32; 3]>| d.unwrap_or([1, 1, 1]).map(|v| v.max(1));
    for (l, k) in log.iter().zip(&seq) {
        assert_eq!(&*l.name, &*k.name);
        assert_eq!(l.launch.grid, dims(k.grid), "{}", k.name);
        assert_eq!(l.launch.block, dims(k.block), "{}", k.name);
        assert_eq!(
            l.launch.shared_mem_bytes,
            penrose_standin::abi::saturate_u32(k.shared_memory_bytes.unwrap_or(0)),
            "{}",
            k.name
        );
        assert!(l.launch.timestamp_ns > 0);
    }
    assert_eq!(capture.launch_log().beyond_limit(), 0);
    println!(
        "  launch log: {} launches of {}, names and configurations as launched",
        log.len(),
        trace.file_name().unwrap().to_string_lossy()
    );
    capture.log_launches(0);
    check("the_launch_log_is_the_snippet_with_configurations");
}

fn detached_probes_see_no_launches_but_names(capture: &mut Capture, lib: &Path, trace: &Path) {
    let before = capture.counts();
    let done = wait_all(capture, vec![spawn(lib, trace, "module", "rotate", 1)]);
    let after = capture.counts();
    assert!(!capture.window_open());
    assert_eq!(
        after.launches, before.launches,
        "no launch probe outside windows"
    );
    let names = done[0].1["functions"].as_array().unwrap().len() as u64;
    assert_eq!(
        after.names - before.names,
        names,
        "name probes stay attached"
    );
    assert!(capture.take_snippets().is_empty());
    check("detached_probes_see_no_launches_but_names");
}

fn concurrent_replayers_are_attributed_to_their_pid(
    capture: &mut Capture,
    lib: &Path,
    traces: &[PathBuf],
) {
    capture.open_window().unwrap();
    let replayers: Vec<_> = traces
        .iter()
        .rev()
        .take(3)
        .enumerate()
        .map(|(i, t)| {
            spawn(
                lib,
                t,
                if i == 1 { "library" } else { "module" },
                "launch",
                2,
            )
        })
        .collect();
    let done = wait_all(capture, replayers);
    capture.close_window().unwrap();
    let snippets = capture.take_snippets();
    assert_eq!(snippets.len(), 3);
    for (pid, summary) in &done {
        let snippet = snippet_of(&snippets, *pid);
        assert_eq!(snippet.end, SnippetEnd::Exit);
        assert_complete(snippet, summary, &format!("concurrent pid {}", pid.0));
    }
    check("concurrent_replayers_are_attributed_to_their_pid");
}

/// A window closes while a process keeps launching: its snippet ends with the window, holds
/// the replay's names in replay order, and nothing is lost or seen outside the window.
fn a_window_closes_under_a_running_replay(
    capture: &mut Capture,
    lib: &Path,
    full: &[(PathBuf, Snippet)],
) {
    let (trace, whole) = full.iter().min_by_key(|(_, s)| s.names.len()).unwrap();
    capture.open_window().unwrap();
    let before = capture.counts().launches;
    // Long enough to outlast the detach (~0.7 s): at 20 times the trace's pace, at most a few
    // hundred thousand launches a second, which a debug build of the reader keeps up with
    // (back to back, cheap uprobes now outpace it and the ring would drop).
    let loops = 50;
    let replayer = spawn_paced(lib, trace, "module", "launch", loops, Some(20.0));
    capture.poll_until(|c| c.counts().launches >= before + 5_000);
    capture.close_window().unwrap();
    let in_window = capture.counts().launches - before;
    let done = wait_all(capture, vec![replayer]);
    let snippets = capture.take_snippets();
    let snippet = snippet_of(&snippets, done[0].0);
    assert_eq!(snippet.end, SnippetEnd::WindowEnd);
    assert_eq!(snippet.names.len() as u64, in_window);
    assert!(in_window < done[0].1["replayed"].as_u64().unwrap());
    for (i, name) in snippet.names.iter().enumerate() {
        assert_eq!(name, &whole.names[i % whole.names.len()], "launch {i}");
    }
    assert_eq!(capture.counts().launches_outside_window, 0);
    assert_eq!(capture.drops().unwrap(), 0);
    check("a_window_closes_under_a_running_replay");
}

/// With L smaller than a replay, the snippet is the replay's first L names and ends at L.
fn snippets_end_at_the_limit(lib: &Path, full: &[(PathBuf, Snippet)]) {
    let (trace, whole) = full.iter().max_by_key(|(_, s)| s.names.len()).unwrap();
    let limit = whole.names.len() / 3;
    let mut capture = Capture::start(CaptureConfig {
        sources: LibrarySources {
            explicit: vec![lib.to_path_buf()],
            ldconfig: false,
            proc_maps: false,
            // The stand-in copies live in temporary directories under /tmp.
            allow_untrusted: true,
        },
        window_launches: limit,
        counters: SourceKind::TestStandinRing,
        ..CaptureConfig::default()
    })
    .unwrap();
    capture.open_window().unwrap();
    wait_all(&mut capture, vec![spawn(lib, trace, "module", "launch", 1)]);
    capture.close_window().unwrap();
    let snippets = capture.take_snippets();
    assert_eq!(snippets.len(), 1);
    assert_eq!(snippets[0].end, SnippetEnd::Limit);
    assert_eq!(snippets[0].names, whole.names[..limit]);
    assert_eq!(
        capture.beyond_limit() as usize,
        whole.names.len() - limit,
        "the rest of the window's launches are not kept"
    );
    assert_eq!(capture.drops().unwrap(), 0);
    check("snippets_end_at_the_limit");
}

/// Without privileges the agent exits with status 3 and one line naming what is missing.
fn not_root_is_a_one_line_error() {
    if !is_root() {
        let out = Command::new(env!("CARGO_BIN_EXE_penrose-agent"))
            .args(["capture", "--seconds", "1", "--only-lib"])
            .output()
            .unwrap();
        assert_missing_root(&out);
        check("not_root_is_a_one_line_error");
        return;
    }
    // As root: drop to nobody (setuid clears the effective capabilities).
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_penrose-agent"))
        .args(["capture", "--seconds", "1", "--only-lib"])
        .output();
    match out {
        Ok(out) if out.status.code() != Some(127) && out.status.code() != Some(126) => {
            assert_missing_root(&out);
            check("not_root_is_a_one_line_error");
        }
        _ => println!("SKIPPED: not_root_is_a_one_line_error (setpriv cannot run the agent)"),
    }
}

fn assert_missing_root(out: &std::process::Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "stderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("needs root"), "{stderr}");
}
