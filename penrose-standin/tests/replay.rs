//! Replays the real traces through the stand-in with the `penrose-replay` binary and checks
//! what the stand-in counted and recorded against the traces themselves.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use penrose_standin::{
    CounterRing, NextCounters, ProcessSelection, ReplayPlan, install_libcuda, ring_path,
};
use penrose_traces::{Kernel, Trace, TraceFolder, read_trace};
use serde_json::Value;

const REPLAY: &str = env!("CARGO_BIN_EXE_penrose-replay");

fn traces() -> Vec<PathBuf> {
    let dir = TraceFolder::default_dir();
    match TraceFolder::open(&dir) {
        Ok(folder) if !folder.files().is_empty() => folder.files().to_vec(),
        _ => {
            eprintln!(
                "skipped: no traces in {} (set PENROSE_TRACES)",
                dir.display()
            );
            Vec::new()
        }
    }
}

/// Runs the replayer on `trace` with the stand-in installed in a fresh directory.
fn replay_cmd(lib_dir: &Path, trace: &Path, extra: &[&str]) -> Command {
    let lib = install_libcuda(lib_dir).unwrap();
    let mut cmd = Command::new(REPLAY);
    cmd.arg("--lib").arg(lib).args(extra).arg(trace);
    cmd
}

fn summary(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "replayer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The largest process's kernels in launch order, as the replayer chooses them.
fn largest_sequence(trace: &Trace) -> Vec<&Kernel> {
    let seqs = trace.process_sequences();
    let (_, seq) = seqs
        .iter()
        .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.cmp(a.0)))
        .unwrap();
    seq.clone()
}

/// Reads every record a finished replayer left in its ring, then removes the ring.
fn drain_ring(pid: u32) -> Vec<penrose_standin::CounterRecord> {
    let mut ring = CounterRing::open(pid).unwrap();
    let records = ring.read_new().unwrap();
    assert_eq!(ring.lost(), 0);
    std::fs::remove_file(ring_path(pid)).unwrap();
    records
}

#[test]
fn every_trace_replays_launch_for_launch() {
    for path in traces() {
        let trace = read_trace(&path).unwrap();
        let seq = largest_sequence(&trace);
        let names: BTreeSet<&str> = seq.iter().map(|k| &*k.name).collect();
        let dir = tempfile::tempdir().unwrap();
        let out = replay_cmd(dir.path(), &path, &["--json", "--keep-ring"])
            .output()
            .unwrap();
        let s = summary(&out);
        let what = path.display();

        assert_eq!(s["replayed"], seq.len(), "{what}");
        assert_eq!(s["launches"]["cuLaunchKernel"], seq.len(), "{what}");
        let others: u64 = s["launches"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| *k != "cuLaunchKernel")
            .map(|(_, v)| v.as_u64().unwrap())
            .sum();
        assert_eq!(others, 0, "{what}");
        assert_eq!(s["distinct_functions"], names.len(), "{what}");
        let handle_to_name = function_names(&s);
        assert_eq!(
            handle_to_name.len(),
            names.len(),
            "{what}: handles not distinct"
        );
        let stream_handles: BTreeMap<i64, u64> = s["streams"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| {
                (
                    x["trace_stream"].as_i64().unwrap(),
                    x["handle"].as_u64().unwrap(),
                )
            })
            .collect();

        let records = drain_ring(u32::try_from(s["pid"].as_u64().unwrap()).unwrap());
        assert_eq!(records.len(), seq.len(), "{what}: one record per launch");
        for (i, (r, k)) in records.iter().zip(&seq).enumerate() {
            assert_eq!(r.seq, i as u64 + 1, "{what}");
            assert_eq!(handle_to_name[&r.function], *k.name, "{what} launch {i}");
            let stream = k.stream.map_or(0, |s| stream_handles[&s.0]);
            assert_eq!(r.stream, stream, "{what} launch {i}");
            let c = NextCounters::from_kernel(k);
            assert_eq!(r.duration_ns(), Some(c.duration_ns), "{what} launch {i}");
            assert_eq!(r.est_achieved_occupancy_pct(), k.est_achieved_occupancy_pct);
            assert_eq!(r.blocks_per_sm(), k.blocks_per_sm);
            assert_eq!(r.registers_per_thread(), k.registers_per_thread);
            assert_eq!(
                r.shared_memory_bytes().map(u64::from),
                k.shared_memory_bytes,
                "{what} launch {i}"
            );
        }
    }
}

#[test]
fn library_api_and_every_launch_variant_replay_too() {
    let Some(path) = traces().into_iter().next() else {
        return;
    };
    let seq_len = largest_sequence(&read_trace(&path).unwrap()).len() as u64;
    let dir = tempfile::tempdir().unwrap();
    let out = replay_cmd(
        dir.path(),
        &path,
        &[
            "--json",
            "--resolve",
            "library",
            "--entry",
            "rotate",
            "--loop",
            "2",
        ],
    )
    .output()
    .unwrap();
    let s = summary(&out);
    let counts = s["launches"].as_object().unwrap();
    let total: u64 = counts.values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(total, 2 * seq_len);
    for (entry, n) in counts {
        let n = n.as_u64().unwrap();
        if entry.starts_with("cuGraphLaunch") {
            assert_eq!(n, 0, "{entry}");
        } else {
            // Rotation: each of the six variants gets a sixth, give or take one.
            assert!(n.abs_diff(2 * seq_len / 6) <= 1, "{entry}: {n}");
        }
    }
    assert!(
        !ring_path(s["pid"].as_u64().unwrap() as u32).exists(),
        "ring not removed"
    );
}

/// The handle-to-name map of a `--json` summary.
fn function_names(s: &Value) -> BTreeMap<u64, String> {
    s["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["handle"].as_u64().unwrap(),
                f["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Waits until process `pid` has created its ring (it is launching), at most 30 s.
/// Waits until the process `pid`, spawned at `spawned`, has created its ring. A ring older
/// than the spawn is another, dead process's with the same pid (pids wrap; the stand-in only
/// sweeps such rings after a minute), and it must not be taken for this one's: the SIGTERM
/// that follows would then reach a process that has not yet installed its handler.
fn wait_for_ring(pid: u32, spawned: std::time::SystemTime) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    // The file's clock is the kernel's coarse one; a second is far less than any pid wrap.
    let since = spawned - Duration::from_secs(1);
    let created = || {
        std::fs::metadata(ring_path(pid))
            .and_then(|m| m.modified())
            .is_ok_and(|t| t >= since)
    };
    while !created() {
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid} never started launching"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn terminate(pid: u32) {
    let killed = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
}

#[test]
fn concurrent_replayers_keep_separate_counts_and_rings() {
    let files = traces();
    if files.len() < 2 {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spawned = std::time::SystemTime::now();
    // Two different traces, both looping until told to stop, so they surely overlap.
    let children: Vec<_> = files[..2]
        .iter()
        .map(|path| {
            let child = replay_cmd(
                dir.path(),
                path,
                &["--json", "--keep-ring", "--loop-forever"],
            )
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
            (path, child)
        })
        .collect();
    for (_, child) in &children {
        wait_for_ring(child.id(), spawned);
    }
    std::thread::sleep(Duration::from_millis(200));
    for (_, child) in &children {
        terminate(child.id());
    }
    let mut heads = BTreeSet::new();
    for (path, child) in children {
        let pid = child.id();
        let s = summary(&child.wait_with_output().unwrap());
        let what = path.display();
        assert_eq!(s["pid"], pid);
        let replayed = s["replayed"].as_u64().unwrap();
        assert_eq!(s["launches"]["cuLaunchKernel"], replayed, "{what}");
        let mut ring = CounterRing::open(pid).unwrap();
        assert_eq!(ring.pid(), pid);
        assert_eq!(
            ring.head().unwrap(),
            replayed,
            "{what}: ring holds another process's launches?"
        );
        heads.insert(replayed);
        // The records still held follow this trace's own sequence, loop after loop.
        let trace = read_trace(path).unwrap();
        let seq = largest_sequence(&trace);
        let names = function_names(&s);
        let records = ring.read_new().unwrap();
        assert_eq!(records.len() as u64, replayed.min(ring.capacity()));
        for r in &records {
            let k = seq[((r.seq - 1) % seq.len() as u64) as usize];
            assert_eq!(names[&r.function], *k.name, "{what}: launch {}", r.seq);
        }
        drop(ring);
        std::fs::remove_file(ring_path(pid)).unwrap();
    }
    assert_eq!(heads.len(), 2, "both processes counted the same: {heads:?}");
}

/// A pid no process holds now: a child's, once it has been waited for.
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

#[test]
fn a_new_ring_sweeps_rings_of_dead_processes_once_they_are_idle() {
    let Some(path) = traces().into_iter().next() else {
        return;
    };
    let stale = ring_path(dead_pid());
    let recent = ring_path(dead_pid());
    for ring in [&stale, &recent] {
        std::fs::write(ring, b"left behind").unwrap();
    }
    let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&stale)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = replay_cmd(dir.path(), &path, &["--json"]).output().unwrap();
    summary(&out);
    let (stale_left, recent_left) = (stale.exists(), recent.exists());
    let _ = std::fs::remove_file(&stale);
    let _ = std::fs::remove_file(&recent);
    assert!(!stale_left, "{} was not swept", stale.display());
    assert!(
        recent_left,
        "{} was swept while a reader may still drain it",
        recent.display()
    );
}

#[test]
fn a_malformed_trace_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("broken.json");
    std::fs::write(&bad, b"{\"traceEvents\": [ {\"cat\": ").unwrap();
    let out = replay_cmd(dir.path(), &bad, &[]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("broken.json") && err.contains("not valid JSON"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");

    let empty = dir.path().join("empty.json");
    std::fs::write(&empty, b"{\"traceEvents\": []}").unwrap();
    let out = replay_cmd(dir.path(), &empty, &[]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no kernels"));

    let out = replay_cmd(dir.path(), &dir.path().join("absent.json"), &[])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("absent.json"));
}

#[test]
fn trace_pace_takes_about_the_scaled_trace_duration() {
    // The shortest trace, compressed so that the replay should take about 0.4 s.
    let Some((path, period)) = traces()
        .into_iter()
        .map(|p| {
            let plan = ReplayPlan::from_trace(&read_trace(&p).unwrap(), ProcessSelection::Largest)
                .unwrap();
            (p, plan.period())
        })
        .filter(|(_, period)| *period > Duration::from_millis(50))
        .min_by_key(|(_, period)| *period)
    else {
        return;
    };
    let target = 0.4;
    let speed = period.as_secs_f64() / target;
    let dir = tempfile::tempdir().unwrap();
    let out = replay_cmd(
        dir.path(),
        &path,
        &["--json", "--pace", "trace", "--speed", &speed.to_string()],
    )
    .output()
    .unwrap();
    let s = summary(&out);
    let elapsed = s["elapsed_s"].as_f64().unwrap();
    assert!(
        elapsed >= 0.5 * target,
        "{elapsed} s, expected about {target} s"
    );
    // Full speed is orders of magnitude faster, so pacing really happened.
    let out = replay_cmd(dir.path(), &path, &["--json"]).output().unwrap();
    assert!(summary(&out)["elapsed_s"].as_f64().unwrap() < elapsed);
}

#[test]
fn loop_forever_stops_on_sigterm_with_a_summary() {
    let Some(path) = traces().into_iter().next() else {
        return;
    };
    let seq_len = largest_sequence(&read_trace(&path).unwrap()).len() as u64;
    let dir = tempfile::tempdir().unwrap();
    let spawned = std::time::SystemTime::now();
    let child = replay_cmd(dir.path(), &path, &["--json", "--loop-forever"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    wait_for_ring(pid, spawned);
    std::thread::sleep(Duration::from_millis(300));
    terminate(pid);
    let s = summary(&child.wait_with_output().unwrap());
    let replayed = s["replayed"].as_u64().unwrap();
    assert!(
        replayed > seq_len,
        "{replayed} launches: looped less than once"
    );
    assert_eq!(s["launches"]["cuLaunchKernel"], replayed);
    assert!(!ring_path(pid).exists(), "ring not removed on SIGTERM");
}
