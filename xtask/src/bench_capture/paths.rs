//! The replay-path comparison of `cargo xtask bench-capture`: what capture costs per launch on
//! the stand-in runtime, which behaves like CUDA >= 12.4 (`penrose-replay --via runtime`: stubs
//! registered with `__cudaRegisterFunction`, one `__cudaGetKernel` per kernel and process, then
//! every launch `cudaLaunchKernel(CUkernel)` -> `cuLaunchKernel`; `--via runtime-legacy`: the
//! same registration, launches with the stub), against the driver path, with the release agent
//! probing both the stand-in driver and the stand-in runtime (`--only-lib --lib libcuda.so.1
//! --lib libcudart.so.13`: the runtime is probed because its file name says runtime).
//!
//! Each round runs, for each path in turn: (1) a replayer alone; (2) a fresh `penrose-agent
//! capture` with fixed windows and a replayer started once the agent is ready. The first window
//! is the process's first: its stubs were registered, so the agent attaches the runtime's
//! per-launch naming probe on `cudaLaunchKernel` (it cannot tell the new path from the legacy
//! one before a window shows every launch named). The second window is a later one: every
//! launch of the first was named, so the naming probe stays off. The replayer loops until
//! stopped; every few milliseconds the bench reads its launch count (the head of its counter
//! ring) and its thread's CPU time (`/proc/<pid>/schedstat`), and takes wall and CPU time per
//! launch over the part of each window in which the probes were attached (each window's
//! opening is in the agent's debug log, with how long attaching took). The agent's
//! `--bpf-stats` give each BPF program's runs for that one process.
//!
//! Then each path once with one window over a whole process of a fixed number of launches:
//! every probe attached from the process's start to its end, so each program's runs per launch
//! are exact (the rounds' windows cannot split the runs between windows).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use penrose_agent::capture_summary::CaptureSummary;
use penrose_standin_ring::CounterRing;

use super::{AgentLog, AgentRun, run_agent};

/// How often the replayer's launch count and CPU time are read.
const SAMPLE_EVERY: Duration = Duration::from_millis(5);
/// Left out at each end of a measured interval (attach and detach edges, log latency).
const MARGIN: Duration = Duration::from_millis(150);
/// Gap between the windows of a probed run, on top of the window itself.
const GAP_S: f64 = 2.0;
/// How long a replayer may take to load its trace and start launching.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// The agent's log filter: window openings are logged at debug level.
const AGENT_LOG: &str = "info,penrose_agent::capture=debug";

/// The runtime's per-launch naming programs.
const NAMING_PROGRAMS: [&str; 2] = ["cudart_launch_kernel", "cudart_launch_kernel_ptsz"];
/// The runtime's registration probe.
const REGISTER_PROGRAM: &str = "cudart_register_function";
/// `__cudaGetKernel`'s entry and return probes.
const GET_KERNEL_PROGRAMS: [&str; 2] = ["cudart_get_kernel", "cudart_get_kernel_ret"];

/// A replay path of `penrose-replay --via`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReplayPath {
    /// `--via driver`: names through `cuModuleGetFunction`, launches with the `CUfunction`.
    Driver,
    /// `--via runtime`: `__cudaGetKernel` handles (CUDA >= 12.4).
    Runtime,
    /// `--via runtime-legacy`: launches with the stub (`__NV_LEGACY_LAUNCH`).
    RuntimeLegacy,
}

impl ReplayPath {
    /// Every path, in the order each round runs them.
    pub const ALL: [Self; 3] = [Self::Driver, Self::Runtime, Self::RuntimeLegacy];

    /// The `--via` value.
    pub fn via(self) -> &'static str {
        match self {
            Self::Driver => "driver",
            Self::Runtime => "runtime",
            Self::RuntimeLegacy => "runtime-legacy",
        }
    }
}

/// The stand-in libraries, installed side by side in a directory of the bench's own.
pub struct Standin {
    /// `libcuda.so.1`.
    pub cuda: PathBuf,
    /// `libcudart.so.13`.
    pub cudart: PathBuf,
    /// `libpenrose_nvcc_app.so`.
    pub app: PathBuf,
}

/// Time per launch over an interval.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct PerLaunch {
    /// Wall-clock nanoseconds per launch.
    pub wall_ns: f64,
    /// Nanoseconds on a CPU (the replaying thread's, traps included) per launch.
    pub cpu_ns: f64,
    /// Launches in the interval.
    pub launches: u64,
    /// Length of the interval, seconds.
    pub seconds: f64,
}

/// One path in one round.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PathRound {
    /// The path.
    pub path: ReplayPath,
    /// The round.
    pub round: usize,
    /// No agent.
    pub unprobed: PerLaunch,
    /// The process's first window (the naming probe attached).
    pub first_window: PerLaunch,
    /// The second window.
    pub later_window: PerLaunch,
    /// Launch probes the agent attached when the first window opened.
    pub first_window_probes: usize,
    /// Launch probes attached when each later window opened (the most of them).
    pub later_window_probes: usize,
    /// Launches the probed process made in all (windows and gaps).
    pub replayed: u64,
    /// Distinct kernels of its sequence.
    pub distinct_kernels: u64,
    /// `__cudaRegisterFunction` calls the stand-in runtime counted in the process.
    pub register_calls: u64,
    /// `__cudaGetKernel` calls it counted.
    pub get_kernel_calls: u64,
    /// Runs of each BPF program while the process ran (the agent's `--bpf-stats`).
    pub program_runs: BTreeMap<String, u64>,
    /// Launches the agent left unnamed.
    pub unnamed_launches: u64,
    /// Ring-buffer drops.
    pub drops: u64,
}

impl PathRound {
    fn runs(&self, program: &str) -> u64 {
        runs(&self.program_runs, program)
    }
}

fn runs(program_runs: &BTreeMap<String, u64>, program: &str) -> u64 {
    program_runs.get(program).copied().unwrap_or(0)
}

/// One window over a whole process: the replayer's fixed number of launches all made with
/// every probe attached, the runtime's naming probe included.
#[derive(Clone, Debug, serde::Serialize)]
pub struct WholeProcess {
    /// The path.
    pub path: ReplayPath,
    /// Launches the process made.
    pub replayed: u64,
    /// Wall time per launch (the replayer's own timing of its launch loop).
    pub wall_ns: f64,
    /// Distinct kernels of its sequence.
    pub distinct_kernels: u64,
    /// `__cudaRegisterFunction` calls the stand-in runtime counted.
    pub register_calls: u64,
    /// `__cudaGetKernel` calls it counted.
    pub get_kernel_calls: u64,
    /// Runs of each BPF program while the process ran.
    pub program_runs: BTreeMap<String, u64>,
}

impl WholeProcess {
    fn runs(&self, program: &str) -> u64 {
        runs(&self.program_runs, program)
    }

    fn launch_runs(&self) -> u64 {
        self.program_runs
            .iter()
            .filter(|(name, _)| name.starts_with("cu_launch") || name.starts_with("cu_graph"))
            .map(|(_, runs)| runs)
            .sum()
    }

    fn naming_runs(&self) -> u64 {
        NAMING_PROGRAMS.iter().map(|p| self.runs(p)).sum()
    }

    fn per_launch(&self, runs: u64) -> f64 {
        runs as f64 / self.replayed.max(1) as f64
    }
}

/// What [`measure`] found.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PathResults {
    /// Every path in every round, first and next window.
    pub rounds: Vec<PathRound>,
    /// Every path once, one window over the whole process.
    pub whole: Vec<WholeProcess>,
    /// Launches per whole-process run.
    pub whole_launches: u64,
    /// Window length of the rounds' agents, seconds.
    pub window_s: f64,
    /// Seconds each unprobed replay was timed.
    pub unprobed_s: f64,
}

/// A fresh agent with one window for its whole run, and a replayer of `loops` loops started
/// once the agent is ready.
fn whole_process_run(
    agent: &Path,
    replay: &Path,
    libs: &Standin,
    trace: &Path,
    path: ReplayPath,
    loops: u64,
) -> Result<WholeProcess> {
    let run = run_agent(
        agent,
        &[&libs.cuda, &libs.cudart],
        &["--no-calibrate"],
        "info",
        |_: &AgentLog| {
            let out = Command::new(replay)
                .arg("--lib")
                .arg(&libs.cuda)
                .arg("--cudart")
                .arg(&libs.cudart)
                .arg("--app")
                .arg(&libs.app)
                .args(["--via", path.via(), "--json", "--loop", &loops.to_string()])
                .arg(trace)
                .output()
                .context("running penrose-replay")?;
            ensure!(
                out.status.success(),
                "penrose-replay: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let summary: serde_json::Value =
                serde_json::from_slice(&out.stdout).context("penrose-replay's summary")?;
            Ok(summary)
        },
    )?;
    let summary = run.ret;
    let runtime = &summary["runtime"];
    Ok(WholeProcess {
        path,
        replayed: summary["replayed"].as_u64().context("replayed")?,
        wall_ns: 1e9
            / summary["launches_per_s"]
                .as_f64()
                .context("launches_per_s")?,
        distinct_kernels: summary["functions"]
            .as_array()
            .map_or(0, |f| f.len() as u64),
        register_calls: runtime["register_function"].as_u64().unwrap_or(0),
        get_kernel_calls: runtime["get_kernel"].as_u64().unwrap_or(0),
        program_runs: program_runs(&run.summary),
    })
}

/// Each BPF program's runs in the agent's `--bpf-stats` (those that ran).
fn program_runs(summary: &CaptureSummary) -> BTreeMap<String, u64> {
    summary
        .bpf_stats
        .iter()
        .map(|p| (p.program.clone(), p.runs))
        .collect()
}

/// Runs `rounds` rounds of every path, each path in turn within a round (so that the
/// machine's changing load falls on all of them alike), then every path once with one window
/// over a whole process of `whole_loops` loops of the trace.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    agent: &Path,
    replay: &Path,
    libs: &Standin,
    trace: &Path,
    rounds: usize,
    window_s: f64,
    unprobed_s: f64,
    whole_loops: u64,
) -> Result<PathResults> {
    ensure!(
        window_s >= 2.0,
        "--window-seconds {window_s}: at least 2 (the first window also holds the replayer's start)"
    );
    let mut out = Vec::new();
    for round in 0..rounds.max(1) {
        for path in ReplayPath::ALL {
            eprintln!("round {}: --via {}", round + 1, path.via());
            let unprobed = unprobed_run(replay, libs, trace, path, unprobed_s)
                .with_context(|| format!("--via {} alone, round {}", path.via(), round + 1))?;
            let probed =
                probed_run(agent, replay, libs, trace, path, window_s).with_context(|| {
                    format!("--via {} with the agent, round {}", path.via(), round + 1)
                })?;
            out.push(probed.into_round(round, unprobed));
        }
    }
    let mut whole = Vec::new();
    for path in ReplayPath::ALL {
        eprintln!("one window over a whole process: --via {}", path.via());
        whole.push(
            whole_process_run(agent, replay, libs, trace, path, whole_loops)
                .with_context(|| format!("--via {} in one window", path.via()))?,
        );
    }
    Ok(PathResults {
        rounds: out,
        whole_launches: whole.first().map_or(0, |w| w.replayed),
        whole,
        window_s,
        unprobed_s,
    })
}

/// One replayer alone, timed over `seconds` once it launches.
fn unprobed_run(
    replay: &Path,
    libs: &Standin,
    trace: &Path,
    path: ReplayPath,
    seconds: f64,
) -> Result<PerLaunch> {
    let replayer = Replayer::spawn(replay, libs, trace, path)?;
    let first = replayer.sampler.wait_launching(START_TIMEOUT)?;
    let from = first + MARGIN;
    let to = from + Duration::from_secs_f64(seconds);
    std::thread::sleep(to.saturating_duration_since(Instant::now()) + SAMPLE_EVERY * 4);
    let (samples, _) = replayer.finish()?;
    per_launch(&samples, from, to).context("unprobed replay")
}

/// A window's opening in the agent's log.
#[derive(Clone, Copy, Debug)]
struct Opening {
    /// When the bench read the line (probes attached by then).
    at: Instant,
    /// Launch probes attached.
    probes: usize,
    /// How long attaching took (the window's clock started before it).
    attach: Duration,
}

/// What a probed run measured (a [`PathRound`] without the unprobed replay).
struct ProbedRun {
    path: ReplayPath,
    first_window: PerLaunch,
    later_window: PerLaunch,
    first_window_probes: usize,
    later_window_probes: usize,
    replayed: u64,
    distinct_kernels: u64,
    register_calls: u64,
    get_kernel_calls: u64,
    program_runs: BTreeMap<String, u64>,
    unnamed_launches: u64,
    drops: u64,
}

impl ProbedRun {
    fn into_round(self, round: usize, unprobed: PerLaunch) -> PathRound {
        PathRound {
            path: self.path,
            round,
            unprobed,
            first_window: self.first_window,
            later_window: self.later_window,
            first_window_probes: self.first_window_probes,
            later_window_probes: self.later_window_probes,
            replayed: self.replayed,
            distinct_kernels: self.distinct_kernels,
            register_calls: self.register_calls,
            get_kernel_calls: self.get_kernel_calls,
            program_runs: self.program_runs,
            unnamed_launches: self.unnamed_launches,
            drops: self.drops,
        }
    }
}

/// What the replayer of a probed run left: when it first launched, its readings, its summary,
/// and the agent's lines about windows.
struct WindowedReplay {
    first_launch: Instant,
    samples: Vec<Sample>,
    summary: serde_json::Value,
    lines: Vec<(Instant, String)>,
}

/// A fresh agent with fixed windows, and one replayer from its first window to the end of its
/// second.
fn probed_run(
    agent: &Path,
    replay: &Path,
    libs: &Standin,
    trace: &Path,
    path: ReplayPath,
    window_s: f64,
) -> Result<ProbedRun> {
    let run = replay_under_windows(agent, replay, libs, trace, path, window_s)?;
    let replayed = &run.ret;
    let openings = openings(&replayed.lines)?;
    let window = Duration::from_secs_f64(window_s);
    // The window's clock starts before attaching; it closes when that clock reaches the window
    // length, and detaching starts then.
    let closes = |o: &Opening| o.at - o.attach + window - MARGIN;
    let first_window = per_launch(
        &replayed.samples,
        openings[0].at.max(replayed.first_launch) + MARGIN,
        closes(&openings[0]),
    )
    .context("the first window")?;
    let later_window = per_launch(
        &replayed.samples,
        openings[1].at + MARGIN,
        closes(&openings[1]),
    )
    .context("the second window")?;

    let program_runs = program_runs(&run.summary);
    let summary = &replayed.summary;
    let runtime = &summary["runtime"];
    Ok(ProbedRun {
        path,
        first_window,
        later_window,
        first_window_probes: openings[0].probes,
        later_window_probes: openings[1..].iter().map(|o| o.probes).max().unwrap_or(0),
        replayed: summary["replayed"].as_u64().context("replayed")?,
        distinct_kernels: summary["functions"]
            .as_array()
            .map_or(0, |f| f.len() as u64),
        register_calls: runtime["register_function"].as_u64().unwrap_or(0),
        get_kernel_calls: runtime["get_kernel"].as_u64().unwrap_or(0),
        program_runs,
        unnamed_launches: run.summary.counts.unnamed_launches,
        drops: run.summary.drops,
    })
}

/// The agent with fixed windows of `window_s`, and a replayer on `path` from once the agent is
/// ready until the agent has logged two windows.
fn replay_under_windows(
    agent: &Path,
    replay: &Path,
    libs: &Standin,
    trace: &Path,
    path: ReplayPath,
    window_s: f64,
) -> Result<AgentRun<WindowedReplay>> {
    let window = format!("{window_s}");
    let period = format!("{}", window_s + GAP_S);
    let extra = [
        "--window-seconds",
        &window,
        "--period-seconds",
        &period,
        "--no-calibrate",
    ];
    let timeout = Duration::from_secs_f64(3.0 * (window_s + GAP_S)) + START_TIMEOUT;
    run_agent(
        agent,
        &[&libs.cuda, &libs.cudart],
        &extra,
        AGENT_LOG,
        |log: &AgentLog| {
            let replayer = Replayer::spawn(replay, libs, trace, path)?;
            let first_launch = replayer.sampler.wait_launching(START_TIMEOUT)?;
            log.wait_until(timeout, |lines| {
                lines.iter().filter(|(_, l)| window_record(l)).count() >= 2
            })?;
            let (samples, summary) = replayer.finish()?;
            Ok(WindowedReplay {
                first_launch,
                samples,
                summary,
                lines: log.lines(),
            })
        },
    )
}

/// The window openings among the agent's lines: at least two.
fn openings(lines: &[(Instant, String)]) -> Result<Vec<Opening>> {
    let openings: Vec<Opening> = lines
        .iter()
        .filter_map(|(at, line)| {
            opening(line).map(|(probes, attach)| Opening {
                at: *at,
                probes,
                attach,
            })
        })
        .collect();
    ensure!(
        openings.len() >= 2,
        "the agent logged {} window openings, not 2",
        openings.len()
    );
    Ok(openings)
}

/// `window 3: 1200 launches in ...`: the agent's record of a closed window.
fn window_record(line: &str) -> bool {
    line.split("window ").skip(1).any(|rest| {
        rest.split_once(':')
            .is_some_and(|(index, _)| index.parse::<u64>().is_ok())
    })
}

/// `window opened: 10 launch probes in 3.2ms`: the probes attached and how long it took.
fn opening(line: &str) -> Option<(usize, Duration)> {
    let rest = line.split_once("window opened: ")?.1;
    let mut words = rest.split_whitespace();
    let probes = words.next()?.parse().ok()?;
    let attach = words.nth(3).and_then(parse_debug_duration)?;
    Some((probes, attach))
}

/// A `Duration` as `{:?}` prints it (`850ns`, `3.2µs`, `12.5ms`, `1.02s`).
fn parse_debug_duration(text: &str) -> Option<Duration> {
    let units = [
        ("ns", 1e-9),
        ("µs", 1e-6),
        ("us", 1e-6),
        ("ms", 1e-3),
        ("s", 1.0),
    ];
    let (number, scale) = units
        .iter()
        .find_map(|(unit, scale)| Some((text.strip_suffix(unit)?, *scale)))?;
    let value: f64 = number.parse().ok()?;
    Duration::try_from_secs_f64(value * scale).ok()
}

/// One reading of the replayer.
#[derive(Clone, Copy, Debug)]
struct Sample {
    at: Instant,
    /// Launches so far (its ring's head).
    head: u64,
    /// Its thread's time on a CPU so far, nanoseconds.
    cpu_ns: u64,
}

/// Time per launch between the first reading at or after `from` and the last at or before
/// `to`.
fn per_launch(samples: &[Sample], from: Instant, to: Instant) -> Result<PerLaunch> {
    let a = samples.iter().find(|s| s.at >= from);
    let b = samples.iter().rev().find(|s| s.at <= to);
    let (Some(a), Some(b)) = (a, b) else {
        bail!("no readings in the interval");
    };
    let seconds = b.at.saturating_duration_since(a.at).as_secs_f64();
    let launches = b.head.saturating_sub(a.head);
    ensure!(
        seconds >= 0.3 && launches >= 1_000,
        "too short to measure ({seconds:.2} s, {launches} launches): raise --window-seconds"
    );
    Ok(PerLaunch {
        wall_ns: seconds * 1e9 / launches as f64,
        cpu_ns: b.cpu_ns.saturating_sub(a.cpu_ns) as f64 / launches as f64,
        launches,
        seconds,
    })
}

/// Reads a process's launch count and CPU time on a thread of its own.
struct Sampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Sampler {
    fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, samples) = (stop.clone(), samples.clone());
            std::thread::spawn(move || -> Result<()> {
                let deadline = Instant::now() + START_TIMEOUT;
                // The ring appears at the replayer's cuInit.
                let ring = loop {
                    match CounterRing::open(pid) {
                        Ok(ring) => break ring,
                        Err(e) => {
                            if stop.load(Ordering::Relaxed) || Instant::now() > deadline {
                                bail!("the replayer's counter ring: {e}");
                            }
                            std::thread::sleep(Duration::from_millis(2));
                        }
                    }
                };
                let schedstat = format!("/proc/{pid}/schedstat");
                while !stop.load(Ordering::Relaxed) {
                    let at = Instant::now();
                    let Ok(head) = ring.head() else {
                        break; // the ring is gone or damaged: the process is ending
                    };
                    let Some(cpu_ns) = std::fs::read_to_string(&schedstat)
                        .ok()
                        .and_then(|s| s.split_whitespace().next()?.parse().ok())
                    else {
                        break; // it exited
                    };
                    samples
                        .lock()
                        .map_err(|_| anyhow::anyhow!("sampler lock"))?
                        .push(Sample { at, head, cpu_ns });
                    std::thread::sleep(SAMPLE_EVERY);
                }
                Ok(())
            })
        };
        Self {
            stop,
            samples,
            thread: Some(thread),
        }
    }

    /// When the first launch was seen.
    fn wait_launching(&self, timeout: Duration) -> Result<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            let first = self
                .samples
                .lock()
                .map_err(|_| anyhow::anyhow!("sampler lock"))?
                .iter()
                .find(|s| s.head > 0)
                .map(|s| s.at);
            if let Some(at) = first {
                return Ok(at);
            }
            if self.thread.as_ref().is_none_or(|t| t.is_finished()) {
                bail!("the replayer stopped before launching");
            }
            ensure!(
                Instant::now() < deadline,
                "the replayer did not start launching"
            );
            std::thread::sleep(SAMPLE_EVERY);
        }
    }

    fn stop(&mut self) -> Result<Vec<Sample>> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread
                .join()
                .map_err(|_| anyhow::anyhow!("the sampler panicked"))??;
        }
        let samples = self
            .samples
            .lock()
            .map_err(|_| anyhow::anyhow!("sampler lock"))?;
        Ok(samples.clone())
    }
}

/// `penrose-replay --loop-forever` on one path, read by a [`Sampler`]; killed if dropped
/// before [`Replayer::finish`].
struct Replayer {
    child: Option<Child>,
    sampler: Sampler,
}

impl Replayer {
    fn spawn(replay: &Path, libs: &Standin, trace: &Path, path: ReplayPath) -> Result<Self> {
        let child = Command::new(replay)
            .arg("--lib")
            .arg(&libs.cuda)
            .arg("--cudart")
            .arg(&libs.cudart)
            .arg("--app")
            .arg(&libs.app)
            .args(["--via", path.via(), "--loop-forever", "--json"])
            .arg(trace)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting penrose-replay")?;
        let sampler = Sampler::start(child.id());
        Ok(Self {
            child: Some(child),
            sampler,
        })
    }

    /// Stops the replayer (SIGINT: it prints its summary) and returns the readings and the
    /// summary.
    fn finish(mut self) -> Result<(Vec<Sample>, serde_json::Value)> {
        let samples = self.sampler.stop()?;
        let child = self.child.take().context("replayer already finished")?;
        super::interrupt(&child)?;
        let out = child
            .wait_with_output()
            .context("waiting for penrose-replay")?;
        ensure!(
            out.status.success(),
            "penrose-replay: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let summary = serde_json::from_slice(&out.stdout).context("penrose-replay's summary")?;
        Ok((samples, summary))
    }
}

impl Drop for Replayer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Our own child, still unwaited: its id is still its own.
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = self.sampler.stop();
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// `48.4 ns`, `12.22 µs`; with `signed`, a leading `+` or `-`.
fn ns(x: f64, signed: bool) -> String {
    let sign = if !signed {
        ""
    } else if x < 0.0 {
        "-"
    } else {
        "+"
    };
    let a = if signed { x.abs() } else { x };
    if a >= 1e3 {
        format!("{sign}{:.2} µs", a / 1e3)
    } else {
        format!("{sign}{a:.1} ns")
    }
}

/// The medians of one measure per path, `wall / CPU`.
fn wall_cpu(
    rounds: &[PathRound],
    path: ReplayPath,
    f: impl Fn(&PathRound) -> PerLaunch,
) -> (f64, f64) {
    let of = |g: &dyn Fn(PerLaunch) -> f64| {
        median(
            rounds
                .iter()
                .filter(|r| r.path == path)
                .map(|r| g(f(r)))
                .collect(),
        )
    };
    (of(&|p| p.wall_ns), of(&|p| p.cpu_ns))
}

/// What the probes add per launch in one round's measure: the measure less the same path's
/// unprobed time per launch, `(wall, CPU)`.
fn probe_cost(r: &PathRound, f: &impl Fn(&PathRound) -> PerLaunch) -> (f64, f64) {
    let (m, u) = (f(r), r.unprobed);
    (m.wall_ns - u.wall_ns, m.cpu_ns - u.cpu_ns)
}

/// The median over rounds of `path`'s probe cost.
fn cost_of(
    rounds: &[PathRound],
    path: ReplayPath,
    f: impl Fn(&PathRound) -> PerLaunch,
) -> (f64, f64) {
    let costs: Vec<(f64, f64)> = rounds
        .iter()
        .filter(|r| r.path == path)
        .map(|r| probe_cost(r, &f))
        .collect();
    (
        median(costs.iter().map(|c| c.0).collect()),
        median(costs.iter().map(|c| c.1).collect()),
    )
}

/// The median over rounds of `path`'s probe cost less the driver path's probe cost in the
/// same round.
fn over_driver(
    rounds: &[PathRound],
    path: ReplayPath,
    f: impl Fn(&PathRound) -> PerLaunch,
) -> (f64, f64) {
    let differences: Vec<(f64, f64)> = rounds
        .iter()
        .filter(|r| r.path == path)
        .filter_map(|r| {
            let driver = rounds
                .iter()
                .find(|d| d.path == ReplayPath::Driver && d.round == r.round)?;
            let (p, d) = (probe_cost(r, &f), probe_cost(driver, &f));
            Some((p.0 - d.0, p.1 - d.1))
        })
        .collect();
    (
        median(differences.iter().map(|c| c.0).collect()),
        median(differences.iter().map(|c| c.1).collect()),
    )
}

fn median_u64(rounds: &[PathRound], path: ReplayPath, f: impl Fn(&PathRound) -> u64) -> u64 {
    median(
        rounds
            .iter()
            .filter(|r| r.path == path)
            .map(|r| f(r) as f64)
            .collect(),
    )
    .round() as u64
}

/// The report's section on the replay paths.
pub fn report(results: &PathResults) -> String {
    let mut s = rounds_intro(results);
    s.push_str(&rounds_table(&results.rounds));
    s.push_str(&whole_table(results));
    s.push_str(&reading(results));
    s.push_str(&drops_note(&results.rounds));
    s
}

/// The section's heading and how the rounds were run.
fn rounds_intro(results: &PathResults) -> String {
    let (window_s, unprobed_s) = (results.window_s, results.unprobed_s);
    let n = results
        .rounds
        .iter()
        .filter(|r| r.path == ReplayPath::Driver)
        .count();
    let mut s = String::new();
    let _ = writeln!(s, "### The CUDA runtime path (CUDA >= 12.4 stand-in)\n");
    let _ = writeln!(
        s,
        "The release agent probes the stand-in driver and the stand-in runtime \
         (`libcudart.so.13`: `__cudaRegisterFunction`, `__cudaGetKernel` entry and return, and \
         in windows that need it the per-launch naming probe on `cudaLaunchKernel`) while \
         `penrose-replay --loop-forever` replays the same trace through the driver (`--via \
         driver`), through the runtime and the nvcc-named test application (`--via runtime`: \
         one `__cudaGetKernel` per kernel and process, then `cudaLaunchKernel(CUkernel)`), or \
         with stub launches (`--via runtime-legacy`). {n} rounds, each running the three paths \
         in turn: a replayer alone ({unprobed_s} s timed), then a fresh agent with fixed \
         {window_s} s windows and a new replayer started once the agent was ready, timed in its \
         first window and in the next one. Time per launch is read from the replayer's counter \
         ring and its thread's CPU time (`/proc/<pid>/schedstat`) over the part of each window \
         with every probe attached; wall time includes what the shared machine gave to other \
         work, CPU time does not (a trap is charged to the trapping thread). Medians of the \
         rounds, shown as wall / CPU; differences between paths are medians of the rounds' \
         differences.\n"
    );
    s
}

/// The paths as the tables' column headings.
fn path_header() -> String {
    ReplayPath::ALL
        .iter()
        .map(|p| format!("`--via {}`", p.via()))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// A table row: `label`, then `cell` of each path.
fn path_row(s: &mut String, label: &str, cell: impl Fn(ReplayPath) -> String) {
    let cells = ReplayPath::ALL
        .iter()
        .map(|p| cell(*p))
        .collect::<Vec<_>>()
        .join(" | ");
    let _ = writeln!(s, "| {label} | {cells} |");
}

/// `wall / CPU`.
fn pair((w, c): (f64, f64), signed: bool) -> String {
    format!("{} / {}", ns(w, signed), ns(c, signed))
}

/// A round's first window.
fn first(r: &PathRound) -> PerLaunch {
    r.first_window
}

/// A round's later window.
fn later(r: &PathRound) -> PerLaunch {
    r.later_window
}

/// The rounds' medians, each path a column.
fn rounds_table(rounds: &[PathRound]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| measure | {} |\n|---|---|---|---|", path_header());
    time_rows(&mut s, rounds);
    count_rows(&mut s, rounds);
    s.push('\n');
    s
}

/// Time per launch and what the probes add to it.
fn time_rows(s: &mut String, rounds: &[PathRound]) {
    path_row(s, "per launch, no agent", |p| {
        pair(wall_cpu(rounds, p, |r| r.unprobed), false)
    });
    path_row(
        s,
        "per launch, agent attached, the process's first window",
        |p| pair(wall_cpu(rounds, p, first), false),
    );
    path_row(s, "per launch, agent attached, its next window", |p| {
        pair(wall_cpu(rounds, p, later), false)
    });
    path_row(s, "launch probes attached, first / next window", |p| {
        format!(
            "{} / {}",
            median_u64(rounds, p, |r| r.first_window_probes as u64),
            median_u64(rounds, p, |r| r.later_window_probes as u64)
        )
    });
    path_row(
        s,
        "probe cost per launch, first window (attached - no agent)",
        |p| pair(cost_of(rounds, p, first), false),
    );
    path_row(
        s,
        "probe cost per launch, next window (attached - no agent)",
        |p| pair(cost_of(rounds, p, later), false),
    );
    let versus = |f: fn(&PathRound) -> PerLaunch| {
        move |p: ReplayPath| {
            if p == ReplayPath::Driver {
                "(baseline)".to_string()
            } else {
                pair(over_driver(rounds, p, f), true)
            }
        }
    };
    path_row(
        s,
        "probe cost over the driver path's, first window",
        versus(first),
    );
    path_row(
        s,
        "probe cost over the driver path's, next window",
        versus(later),
    );
}

/// Launches, kernels, probe runs and losses per process.
fn count_rows(s: &mut String, rounds: &[PathRound]) {
    path_row(s, "launches per process (windows and gaps)", |p| {
        median_u64(rounds, p, |r| r.replayed).to_string()
    });
    path_row(
        s,
        "distinct kernels (stubs registered on the runtime paths)",
        |p| median_u64(rounds, p, |r| r.distinct_kernels).to_string(),
    );
    path_row(
        s,
        "`cudart_register_function` runs per process / `__cudaRegisterFunction` calls",
        |p| {
            format!(
                "{} / {}",
                median_u64(rounds, p, |r| r.runs(REGISTER_PROGRAM)),
                median_u64(rounds, p, |r| r.register_calls)
            )
        },
    );
    path_row(
        s,
        "`cudart_get_kernel` / `cudart_get_kernel_ret` runs per process / `__cudaGetKernel` calls",
        |p| {
            format!(
                "{} / {} / {}",
                median_u64(rounds, p, |r| r.runs(GET_KERNEL_PROGRAMS[0])),
                median_u64(rounds, p, |r| r.runs(GET_KERNEL_PROGRAMS[1])),
                median_u64(rounds, p, |r| r.get_kernel_calls)
            )
        },
    );
    path_row(
        s,
        "registration and `__cudaGetKernel` probe runs per launch",
        |p| format!("{:.1e}", once_per_launch(rounds, p)),
    );
    path_row(s, "unnamed launches / ring-buffer drops, all rounds", |p| {
        let of =
            |f: fn(&PathRound) -> u64| rounds.iter().filter(|r| r.path == p).map(f).sum::<u64>();
        format!("{} / {}", of(|r| r.unnamed_launches), of(|r| r.drops))
    });
}

/// The whole-process run of `path`.
fn whole_of(results: &PathResults, path: ReplayPath) -> Option<&WholeProcess> {
    results.whole.iter().find(|w| w.path == path)
}

/// The one-window runs over a whole process: runs of each BPF program per launch.
fn whole_table(results: &PathResults) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "One window over a whole process, each path once: a fresh agent, then a replayer of a \
         fixed {} launches with every probe attached from its start to its end (the naming \
         probe included, as in any process's first window); runs of each BPF program per \
         launch.\n",
        results.whole_launches
    );
    let _ = writeln!(
        s,
        "| one window, whole process | {} |\n|---|---|---|---|",
        path_header()
    );
    let whole_row = |s: &mut String, label: &str, cell: &dyn Fn(&WholeProcess) -> String| {
        path_row(s, label, |p| {
            whole_of(results, p).map_or_else(|| "-".to_string(), cell)
        });
    };
    whole_row(&mut s, "launches", &|w| w.replayed.to_string());
    whole_row(
        &mut s,
        "per launch (wall, the replayer's own timing)",
        &|w| ns(w.wall_ns, false),
    );
    whole_row(&mut s, "driver launch probe runs per launch", &|w| {
        format!("{:.3}", w.per_launch(w.launch_runs()))
    });
    whole_row(
        &mut s,
        "`cudart_launch_kernel` (naming) runs per launch",
        &|w| format!("{:.3}", w.per_launch(w.naming_runs())),
    );
    whole_row(
        &mut s,
        "`cudart_register_function` runs / `__cudaRegisterFunction` calls",
        &|w| format!("{} / {}", w.runs(REGISTER_PROGRAM), w.register_calls),
    );
    whole_row(
        &mut s,
        "`cudart_get_kernel` / `cudart_get_kernel_ret` runs / `__cudaGetKernel` calls",
        &|w| {
            format!(
                "{} / {} / {}",
                w.runs(GET_KERNEL_PROGRAMS[0]),
                w.runs(GET_KERNEL_PROGRAMS[1]),
                w.get_kernel_calls
            )
        },
    );
    s.push('\n');
    s
}

/// What the rows say, in the measured figures (CPU time: the shared machine's other work is
/// not in it).
fn reading(results: &PathResults) -> String {
    let rounds = &results.rounds[..];
    let whole = |p: ReplayPath| whole_of(results, p);
    let (rt, legacy) = (ReplayPath::Runtime, ReplayPath::RuntimeLegacy);
    let driver_cost = cost_of(rounds, ReplayPath::Driver, later).1;
    let share = |x: f64| x / driver_cost.max(f64::MIN_POSITIVE);
    let (later_rt, later_legacy) = (
        over_driver(rounds, rt, later).1,
        over_driver(rounds, legacy, later).1,
    );
    let (first_rt, first_legacy) = (
        over_driver(rounds, rt, first).1,
        over_driver(rounds, legacy, first).1,
    );
    let naming = |p: ReplayPath| whole(p).map_or(f64::NAN, |w| w.per_launch(w.naming_runs()));
    let mut s = String::new();
    let _ = writeln!(
        s,
        "On the new path the registration and `__cudaGetKernel` probes ran {} and {} times per \
         process for {} distinct kernels, whether the process made {} launches (the rounds' \
         median) or {} ({} and {} runs): once per kernel and process, nothing per launch. In a \
         process's next window the new path's probe cost per launch is {} CPU from the driver \
         path's ({:+.1}% of its {}), the legacy path's {} ({:+.1}%), with the same {} launch \
         probes attached as on the driver path: once a window has named every launch, the \
         handles stay named and no runtime probe runs per launch, so any difference is the \
         driver probe's trap on a longer call path, not a runtime probe. A \
         process's first window costs more: it registered stubs, so the agent attaches the \
         `cudaLaunchKernel` naming probe, which fires on every launch on both runtime paths \
         ({:.3} and {:.3} runs per launch; the agent cannot tell the new path from the legacy \
         one until a window shows every launch named), adding {} (new path, {:.2}x the driver \
         path's probe cost) and {} (legacy, {:.2}x) CPU per launch. The budget scheduler \
         counts those traps as launches.\n",
        median_u64(rounds, rt, |r| r.runs(REGISTER_PROGRAM)),
        median_u64(rounds, rt, |r| r.runs(GET_KERNEL_PROGRAMS[0])),
        median_u64(rounds, rt, |r| r.distinct_kernels),
        median_u64(rounds, rt, |r| r.replayed),
        whole(rt).map_or(0, |w| w.replayed),
        whole(rt).map_or(0, |w| w.runs(REGISTER_PROGRAM)),
        whole(rt).map_or(0, |w| w.runs(GET_KERNEL_PROGRAMS[0])),
        ns(later_rt, true),
        100.0 * share(later_rt),
        ns(driver_cost, false),
        ns(later_legacy, true),
        100.0 * share(later_legacy),
        median_u64(rounds, rt, |r| r.later_window_probes as u64),
        naming(rt),
        naming(legacy),
        ns(first_rt, true),
        share(first_rt),
        ns(first_legacy, true),
        share(first_legacy),
    );
    s
}

/// A note on the ring buffer's drops, when it dropped any.
fn drops_note(rounds: &[PathRound]) -> String {
    let mut s = String::new();
    let drops: u64 = rounds.iter().map(|r| r.drops).sum();
    if drops == 0 {
        return s;
    }
    let of = |p: ReplayPath| {
        rounds
            .iter()
            .filter(|r| r.path == p)
            .map(|r| r.drops)
            .sum::<u64>()
    };
    let _ = writeln!(
        s,
        "The agent's ring buffer dropped {} / {} / {} records (driver / runtime / legacy, all \
         rounds): at the replayer's full speed a first window on a runtime path writes two \
         records per launch, and the agent reads them on the same two shared cores. A \
         dropped record costs its probe a little less than a written one; {} launches went \
         unnamed.\n",
        of(ReplayPath::Driver),
        of(ReplayPath::Runtime),
        of(ReplayPath::RuntimeLegacy),
        rounds.iter().map(|r| r.unnamed_launches).sum::<u64>()
    );
    s
}

/// Registration and `__cudaGetKernel` probe runs per launch of the process, median of the
/// rounds.
fn once_per_launch(rounds: &[PathRound], path: ReplayPath) -> f64 {
    median(
        rounds
            .iter()
            .filter(|r| r.path == path)
            .map(|r| {
                let runs = r.runs(REGISTER_PROGRAM)
                    + GET_KERNEL_PROGRAMS.iter().map(|g| r.runs(g)).sum::<u64>();
                runs as f64 / r.replayed.max(1) as f64
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_log_lines_parse() {
        let line = "2026-12-02T10:00:00.1Z DEBUG penrose_agent::capture: window opened: 10 launch probes in 3.25ms";
        let (probes, attach) = opening(line).unwrap();
        assert_eq!(probes, 10);
        assert_eq!(attach, Duration::from_micros(3250));
        assert!(!window_record(line));
        assert!(window_record(
            "INFO penrose_agent::capture: window 1: 5000 launches in 3.1s, probe time 0.05s"
        ));
        assert!(!window_record(
            "DEBUG window closed: launch probes detached in 800ms"
        ));
        assert_eq!(
            parse_debug_duration("850ns"),
            Some(Duration::from_nanos(850))
        );
        assert_eq!(
            parse_debug_duration("1.5s"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(parse_debug_duration("2µs"), Some(Duration::from_micros(2)));
        assert_eq!(parse_debug_duration("x"), None);
    }

    #[test]
    fn per_launch_takes_the_readings_inside_the_interval() {
        let t0 = Instant::now();
        let samples: Vec<Sample> = (0..100u64)
            .map(|i| Sample {
                at: t0 + Duration::from_millis(10 * i),
                head: 1_000 * i,
                cpu_ns: 5_000_000 * i,
            })
            .collect();
        let p = per_launch(
            &samples,
            t0 + Duration::from_millis(95),
            t0 + Duration::from_millis(605),
        )
        .unwrap();
        // Readings at 100 ms and 600 ms: 50,000 launches in 0.5 s.
        assert_eq!(p.launches, 50_000);
        assert!((p.wall_ns - 10_000.0).abs() < 1e-6);
        assert!((p.cpu_ns - 5_000.0).abs() < 1e-6);
        assert!(per_launch(&samples, t0, t0 + Duration::from_millis(100)).is_err());
    }

    #[test]
    fn medians_and_signed_figures() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(ns(48.44, false), "48.4 ns");
        assert_eq!(ns(12_220.0, false), "12.22 µs");
        assert_eq!(ns(-35.0, true), "-35.0 ns");
        assert_eq!(ns(12_000.0, true), "+12.00 µs");
    }
}
