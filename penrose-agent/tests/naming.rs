//! Naming on CUDA >= 12.4 stacks, live, against the stand-in driver and runtime: kernels that
//! nvcc's host stubs register through the runtime (never through the driver's public name
//! functions), on the new (`__cudaGetKernel`) and the legacy path; processes that registered
//! before the agent attached, and across an agent restart; and launches from a stripped
//! library with its own runtime, which get a stable identity instead of a name.
//!
//! Needs root (eBPF); without it every check prints SKIPPED and passes. The binary is its own
//! replayer: with `PENROSE_NAMING_CHILD=1` it replays one trace through the chosen path and
//! writes the replayer's summary as JSON.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use penrose_agent::capture::events::Pid;
use penrose_agent::capture::loader::is_root;
use penrose_agent::capture::locate::LibrarySources;
use penrose_agent::capture::window::Snippet;
use penrose_agent::capture::{Capture, CaptureConfig};
use penrose_agent::counters::SourceKind;
use penrose_standin::{
    Driver, Libraries, Loops, NvccApp, Pace, ProcessSelection, ReplayOptions, ReplayPlan, Resolve,
    Runtime, RuntimeVia, StaticLib, Via,
};
use serde_json::Value;

const CHILD: &str = "PENROSE_NAMING_CHILD";

struct Libs {
    _dir: tempfile::TempDir,
    cuda: PathBuf,
    cudart: PathBuf,
    app: PathBuf,
    static_lib: PathBuf,
}

fn main() {
    if std::env::var_os(CHILD).is_some() {
        child();
        return;
    }
    if !is_root() {
        println!("SKIPPED: live naming tests need root (CI runs them as root)");
        return;
    }
    let Some(traces) = traces() else {
        println!("SKIPPED: no traces (set PENROSE_TRACES)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let libs = Libs {
        cuda: penrose_standin::install_libcuda(dir.path()).unwrap(),
        cudart: penrose_standin::install_libcudart(dir.path()).unwrap(),
        app: penrose_standin::install_nvcc_app(dir.path()).unwrap(),
        static_lib: penrose_standin::install_static_lib(dir.path()).unwrap(),
        _dir: dir,
    };
    every_launch_of_every_trace_is_named_through_the_runtime(&libs, &traces);
    every_launch_on_the_legacy_path_is_named(&libs, &traces);
    names_in_pages_the_process_never_touched_are_read_from_the_process(&libs, &traces[0]);
    processes_running_before_the_agent_and_across_a_restart_are_named(&libs, &traces[0], false);
    processes_running_before_the_agent_and_across_a_restart_are_named(&libs, &traces[0], true);
    stripped_library_launches_have_identities_equal_across_processes_and_runs(&libs, &traces[0]);
}

fn traces() -> Option<Vec<PathBuf>> {
    let dir = penrose_traces::TraceFolder::default_dir();
    let folder = penrose_traces::TraceFolder::open(&dir).ok()?;
    Some(folder.files().to_vec()).filter(|f| !f.is_empty())
}

fn capture(libs: &Libs) -> Capture {
    Capture::start(CaptureConfig {
        sources: LibrarySources {
            explicit: vec![libs.cuda.clone(), libs.cudart.clone()],
            ldconfig: false,
            proc_maps: false,
            // The stand-in copies live in temporary directories under /tmp.
            allow_untrusted: true,
        },
        window_launches: usize::MAX,
        calibrate: false,
        counters: SourceKind::TestStandinRing,
        ..CaptureConfig::default()
    })
    .unwrap()
}

fn child() {
    let var = |k: &str| std::env::var(format!("{CHILD}_{k}")).unwrap();
    let trace = penrose_traces::read_trace(Path::new(&var("TRACE"))).unwrap();
    let plan = ReplayPlan::from_trace(&trace, ProcessSelection::Largest).unwrap();
    let driver = Driver::load(Path::new(&var("CUDA"))).unwrap();
    let runtime = Runtime::load(Path::new(&var("CUDART")), &driver).unwrap();
    let app = NvccApp::load(Path::new(&var("APP")), &runtime).unwrap();
    let static_lib = StaticLib::load(Path::new(&var("STATIC")), &driver).unwrap();
    let via = match var("VIA").as_str() {
        "static" => Via::Static,
        path => Via::Runtime(RuntimeVia {
            legacy: path == "legacy",
            per_thread_stream: false,
            self_named: var("SELF_NAMED") == "1",
            names_untouched: path == "runtime-untouched",
        }),
    };
    let stop = AtomicBool::new(false);
    let loops: u64 = var("LOOPS").parse().unwrap();
    // A looping child stops when its stop file appears.
    let stop_file = PathBuf::from(var("STOP"));
    std::thread::scope(|scope| {
        if loops == 0 {
            scope.spawn(|| {
                while !stop_file.exists() {
                    std::thread::sleep(Duration::from_millis(20));
                }
                stop.store(true, Ordering::Relaxed);
            });
        }
        let options = ReplayOptions {
            pace: if loops == 0 {
                Pace::Trace { speed: 1.0 }
            } else {
                Pace::Asap
            },
            loops: if loops == 0 {
                Loops::Forever
            } else {
                Loops::Count(loops)
            },
            resolve: Resolve::Module,
            via,
            stop: Some(&stop),
            devices: penrose_standin::DevicePlan::default(),
        };
        let libs = Libraries {
            driver: &driver,
            runtime: Some(&runtime),
            app: Some(&app),
            static_lib: Some(&static_lib),
        };
        let summary = penrose_standin::replay_with(&libs, &plan, &options).unwrap();
        std::fs::write(var("OUT"), serde_json::to_vec(&summary).unwrap()).unwrap();
    });
}

struct Replayer {
    child: Child,
    out: tempfile::TempPath,
    stop: PathBuf,
    _stop_dir: tempfile::TempDir,
}

/// `loops` 0: until [`Replayer::stop`].
fn spawn(libs: &Libs, trace: &Path, via: &str, self_named: bool, loops: u64) -> Replayer {
    let out = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    let stop_dir = tempfile::tempdir().unwrap();
    let stop = stop_dir.path().join("stop");
    let child = Command::new(std::env::current_exe().unwrap())
        .env(CHILD, "1")
        .env(format!("{CHILD}_OUT"), &out)
        .env(format!("{CHILD}_CUDA"), &libs.cuda)
        .env(format!("{CHILD}_CUDART"), &libs.cudart)
        .env(format!("{CHILD}_APP"), &libs.app)
        .env(format!("{CHILD}_STATIC"), &libs.static_lib)
        .env(format!("{CHILD}_TRACE"), trace)
        .env(format!("{CHILD}_VIA"), via)
        .env(
            format!("{CHILD}_SELF_NAMED"),
            if self_named { "1" } else { "0" },
        )
        .env(format!("{CHILD}_LOOPS"), loops.to_string())
        .env(format!("{CHILD}_STOP"), &stop)
        .spawn()
        .unwrap();
    Replayer {
        child,
        out,
        stop,
        _stop_dir: stop_dir,
    }
}

impl Replayer {
    fn pid(&self) -> Pid {
        Pid(self.child.id())
    }

    /// Waits for the child, draining `capture` if given; returns its summary.
    fn finish(mut self, capture: Option<&mut Capture>) -> Value {
        std::fs::write(&self.stop, b"").unwrap();
        match capture {
            Some(capture) => {
                capture.poll_until(|_| self.child.try_wait().unwrap().is_some());
                capture.drain_all();
            }
            None => {
                self.child.wait().unwrap();
            }
        }
        let status = self.child.wait().unwrap();
        assert!(status.success(), "replayer failed: {status}");
        serde_json::from_slice(&std::fs::read(&self.out).unwrap()).unwrap()
    }
}

fn check(name: &str) {
    println!("test {name} ... ok");
}

fn launches_of(snippets: &[Snippet], pid: Pid) -> Vec<Arc<str>> {
    snippets
        .iter()
        .filter(|s| s.pid == pid)
        .flat_map(|s| s.names.iter().cloned())
        .collect()
}

/// Every trace replayed once through the stand-in runtime (new path) inside one window: every
/// launch named with the trace's kernel name, although the driver's public name functions
/// were never called (registration went through its private path).
fn every_launch_of_every_trace_is_named_through_the_runtime(libs: &Libs, traces: &[PathBuf]) {
    let mut capture = capture(libs);
    let mut total = 0;
    for trace in traces {
        capture.open_window().unwrap();
        let replayer = spawn(libs, trace, "runtime", false, 1);
        let pid = replayer.pid();
        let summary = replayer.finish(Some(&mut capture));
        capture.drain_all();
        let mut snippets = capture.take_snippets();
        capture.close_window().unwrap();
        snippets.extend(capture.take_snippets());
        assert_eq!(summary["name_calls"], 0, "no public name function was used");
        let names = launches_of(&snippets, pid);
        let replayed = summary["replayed"].as_u64().unwrap() as usize;
        assert_eq!(names.len(), replayed, "{}: every launch", trace.display());
        assert_named_from_trace(&names, &summary, trace, "runtime");
        total += replayed;
    }
    assert_eq!(capture.drops().unwrap(), 0);
    println!(
        "  runtime path: {total} launches of {} traces, all named",
        traces.len()
    );
    check("every_launch_of_every_trace_is_named_through_the_runtime");
}

/// A process registers its kernels with names straight from pages it never touched (each name
/// alone on its page table, as a large library's `.rodata` at load; a real CUDA 13 PyTorch
/// process registered most of its kernels so). The probe cannot fault those pages in, so it
/// reads none of the names; the agent reads each from the running process instead, and every
/// launch is named. A process that is gone before the agent reads its records leaves its
/// names unreadable: counted, and its launches unnamed rather than misnamed.
fn names_in_pages_the_process_never_touched_are_read_from_the_process(libs: &Libs, trace: &Path) {
    let mut capture = capture(libs);
    capture.open_window().unwrap();
    let replayer = spawn(libs, trace, "runtime-untouched", false, 0);
    let pid = replayer.pid();
    let until = Instant::now() + Duration::from_millis(1500);
    capture.poll_until(|_| Instant::now() >= until);
    capture.close_window().unwrap();
    let names = launches_of(&capture.take_snippets(), pid);
    let seen = capture.counts();
    let summary = replayer.finish(Some(&mut capture));
    let registered = summary["functions"].as_array().unwrap().len() as u64;
    assert_eq!(
        (seen.names_read_from_process, seen.names_unreadable),
        (registered, 0),
        "every registration's name came from the process, none from the probe: {seen:?}"
    );
    assert!(!names.is_empty(), "launches seen");
    assert_eq!(seen.unnamed_launches, 0, "every launch named");
    assert_named_from_trace(&names, &summary, trace, "runtime-untouched");

    // Gone before the agent reads: the records stay in the ring until the process exited.
    let mut capture = self::capture(libs);
    capture.open_window().unwrap();
    let replayer = spawn(libs, trace, "runtime-untouched", false, 1);
    let late_pid = replayer.pid();
    let summary = replayer.finish(None);
    capture.drain_all();
    capture.close_window().unwrap();
    let late = capture.counts();
    assert_eq!(late.names_read_from_process, 0, "{late:?}");
    assert_eq!(
        late.names_unreadable,
        summary["functions"].as_array().unwrap().len() as u64
    );
    let expected = known_names(&summary);
    let misnamed = launches_of(&capture.take_snippets(), late_pid)
        .into_iter()
        .filter(|n| expected.contains(&**n))
        .count();
    assert_eq!(misnamed, 0, "no launch of an unread name got a name");
    println!(
        "  untouched names: {registered} read from the running process, {} launches named; \
         {} unreadable once the process had exited",
        names.len(),
        late.names_unreadable
    );
    check("names_in_pages_the_process_never_touched_are_read_from_the_process");
}

/// The legacy path (`cudaLaunchKernel(stub)`): every trace replayed in a loop, registered
/// before the window opens (as a process does at load); every launch of the window named.
fn every_launch_on_the_legacy_path_is_named(libs: &Libs, traces: &[PathBuf]) {
    let mut capture = capture(libs);
    let mut total = 0;
    for trace in traces {
        let names_before = capture.counts().names;
        let replayer = spawn(libs, trace, "legacy", false, 0);
        let pid = replayer.pid();
        // The process registers its kernels at load, before its first launch; the window
        // opens after that, as it would on a host where the process started between windows.
        let deadline = Instant::now() + Duration::from_secs(30);
        capture.poll_until(|c| c.counts().names > names_before || Instant::now() > deadline);
        std::thread::sleep(Duration::from_millis(100));
        capture.drain_all();
        capture.open_window().unwrap();
        let until = Instant::now() + Duration::from_millis(700);
        capture.poll_until(|_| Instant::now() >= until);
        capture.close_window().unwrap();
        let names = launches_of(&capture.take_snippets(), pid);
        let summary = replayer.finish(Some(&mut capture));
        capture.drain_all();
        capture.take_snippets();
        assert!(!names.is_empty(), "{}: launches seen", trace.display());
        assert_named_from_trace(&names, &summary, trace, "legacy");
        total += names.len();
    }
    assert_eq!(capture.drops().unwrap(), 0);
    println!(
        "  legacy path: {total} launches of {} traces, all named",
        traces.len()
    );
    check("every_launch_on_the_legacy_path_is_named");
}

fn known_names(summary: &Value) -> HashSet<String> {
    summary["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_string())
        .collect()
}

fn assert_named_from_trace(names: &[Arc<str>], summary: &Value, trace: &Path, via: &str) {
    let expected = known_names(summary);
    for name in names {
        assert!(
            expected.contains(&**name),
            "{} ({via}): launch named {name:?}, not one of the trace's kernels",
            trace.display()
        );
    }
}

/// A replayer registers and launches before any agent runs; an agent started then names at
/// least 99% of the launches of its first window from the process's symbols and memory, and
/// so does a second agent started after the first one stopped (a restart).
fn processes_running_before_the_agent_and_across_a_restart_are_named(
    libs: &Libs,
    trace: &Path,
    legacy: bool,
) {
    let via = if legacy { "legacy" } else { "runtime" };
    let replayer = spawn(libs, trace, via, true, 0);
    let pid = replayer.pid();
    // Let it register and launch every kernel at least once with no agent attached.
    std::thread::sleep(Duration::from_millis(1500));
    for run in ["start", "restart"] {
        let mut capture = capture(libs);
        capture.open_window().unwrap();
        let until = Instant::now() + Duration::from_millis(1500);
        capture.poll_until(|_| Instant::now() >= until);
        capture.close_window().unwrap();
        let snippets = capture.take_snippets();
        let names = launches_of(&snippets, pid);
        // A launch without a name is its identity (`<bid:...>`) or its launch shape's
        // label (`<shape:...>`), and the snippet counts it.
        let unnamed = names.iter().filter(|n| n.starts_with('<')).count();
        let counted: u64 = snippets
            .iter()
            .filter(|s| s.pid == pid)
            .map(|s| s.unnamed)
            .sum();
        assert_eq!(
            unnamed as u64, counted,
            "{via} {run}: unnamed launches counted"
        );
        let share = 1.0 - unnamed as f64 / names.len().max(1) as f64;
        println!(
            "  {via}, agent {run}: {} launches, {:.2}% named (late: {:?})",
            names.len(),
            100.0 * share,
            capture.late_counts()
        );
        assert!(names.len() > 100, "{via} {run}: launches seen");
        assert!(share >= 0.99, "{via} {run}: {:.2}% named", 100.0 * share);
        for name in names.iter().filter(|n| !n.starts_with('<')) {
            assert!(
                name.starts_with("_Z13penrose_k") && name.ends_with("Pv"),
                "{via} {run}: {name}"
            );
        }
    }
    replayer.finish(None);
    check(&format!(
        "processes_running_before_the_agent_and_across_a_restart_are_named ({via})"
    ));
}

/// Launches from the stripped library with its own runtime have no name; they get identities
/// that are equal across two processes and across two agent runs, and that differ between
/// launch configurations.
fn stripped_library_launches_have_identities_equal_across_processes_and_runs(
    libs: &Libs,
    trace: &Path,
) {
    let mut runs: Vec<Vec<HashSet<String>>> = Vec::new();
    for _ in 0..2 {
        let mut capture = capture(libs);
        // Two processes replaying at the trace's own pace, alive while the window runs (an
        // identity is read from the process's maps, which vanish with it).
        let a = spawn(libs, trace, "static", false, 0);
        let b = spawn(libs, trace, "static", false, 0);
        let (pa, pb) = (a.pid(), b.pid());
        std::thread::sleep(Duration::from_millis(300));
        capture.drain_all();
        capture.open_window().unwrap();
        let until = Instant::now() + Duration::from_millis(1500);
        capture.poll_until(|_| Instant::now() >= until);
        capture.close_window().unwrap();
        let snippets = capture.take_snippets();
        a.finish(Some(&mut capture));
        b.finish(Some(&mut capture));
        assert_eq!(capture.drops().unwrap(), 0);
        let mut per_process = Vec::new();
        for pid in [pa, pb] {
            let names = launches_of(&snippets, pid);
            assert!(!names.is_empty());
            assert!(
                names.iter().all(|n| n.starts_with("<bid:")),
                "every launch identified by build id: {:?}",
                names.iter().find(|n| !n.starts_with("<bid:"))
            );
            let (identified, tokens) = snippets
                .iter()
                .filter(|s| s.pid == pid)
                .fold((0, 0), |(i, t), s| (i + s.identified, t + s.shapes.len()));
            assert_eq!((identified, tokens), (names.len() as u64, 0), "counted");
            per_process.push(names.iter().map(|n| n.to_string()).collect::<HashSet<_>>());
        }
        assert_eq!(per_process[0], per_process[1], "equal across processes");
        runs.push(per_process);
    }
    assert_eq!(runs[0][0], runs[1][0], "equal across agent runs");
    let ids = &runs[0][0];
    // The library has 4 kernels, each from its own call site; the trace's launch
    // configurations vary, and each (site, configuration) is its own identity.
    let sites: HashSet<&str> = ids.iter().map(|i| i.split(' ').next().unwrap()).collect();
    assert_eq!(
        sites.len(),
        4,
        "one call site per library kernel: {sites:?}"
    );
    assert!(
        ids.len() > sites.len(),
        "configurations tell launches apart"
    );
    println!(
        "  stripped library: {} identities over {} call sites, equal across 2 processes and 2 runs",
        ids.len(),
        sites.len()
    );
    check("stripped_library_launches_have_identities_equal_across_processes_and_runs");
}
