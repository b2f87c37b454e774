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
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Instant;

use penrose_agent::capture::events::Pid;
use penrose_agent::capture::locate::LibrarySources;
use penrose_agent::capture::window::{Snippet, SnippetEnd};
use penrose_agent::capture::{Capture, CaptureConfig};
use penrose_standin::{
    Driver, EntryPoint, Loops, Pace, ProcessSelection, ReplayOptions, ReplayPlan, Resolve, Via,
};
use serde_json::Value;

const CHILD: &str = "PENROSE_CAPTURE_CHILD";

fn main() {
    if std::env::var_os(CHILD).is_some() {
        child();
        return;
    }
    let started = Instant::now();
    not_root_is_a_one_line_error();
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
        },
        window_launches: usize::MAX,
        ..CaptureConfig::default()
    })
    .unwrap();
    assert_eq!(capture.libraries().len(), 2, "two copies are two files");
    // A library that disappears (a container gone) must not stop the agent.
    std::fs::remove_file(&doomed).unwrap();
    capture.rescan().unwrap();

    let full = every_trace_every_launch_and_name(&mut capture, &lib, &traces);
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
    snippets_end_at_the_limit(&lib, &full);
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|f| f.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
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
        pace: Pace::Asap,
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
    let out = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    let child = Command::new(std::env::current_exe().unwrap())
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
    capture.drain();
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
    // Long enough to outlast the detach (~0.7 s) at unprobed speed (~40 M launches/s).
    let loops = 150_000_000 / whole.names.len() as u64;
    let replayer = spawn(lib, trace, "module", "launch", loops);
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
        },
        window_launches: limit,
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
    assert_eq!(out.status.code(), Some(3), "stderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("needs root"), "{stderr}");
}
