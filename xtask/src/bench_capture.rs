//! `cargo xtask bench-capture`: what capture costs, measured on this machine with the real
//! probes and the stand-in driver (needs root), written to `docs/benchmarks-capture.md`.
//!
//! 1. Per-launch time of the replayer (release `penrose-replay`) unprobed, with the agent's
//!    window open (every launch probe attached), and again after the agent has gone.
//! 2. The BPF launch programs' run time per launch (the kernel's BPF statistics).
//! 3. The agent's CPU time and peak memory (`wait4` rusage of the release `penrose-agent
//!    capture` process) per million captured launches, less what the same agent spends idle.
//! 4. The overhead at the default schedule: for each real trace's launch rate, the window and
//!    gap the budget scheduler (`penrose_agent::capture::schedule`) chooses with the measured
//!    per-launch cost, and the share of the process's CPU time the probes take.
//! 5. The CUDA runtime path ([`paths`]): per-launch cost with the agent probing the stand-in
//!    runtime as well, on `--via runtime` and `--via runtime-legacy` against `--via driver`,
//!    in a process's first window and in a later one, and each BPF program's runs per process.

mod paths;

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use penrose_agent::capture::ProbeCost;
use penrose_agent::capture::schedule::{BudgetConfig, Schedule, WindowCost};
use penrose_agent::capture::window::DEFAULT_WINDOW_LAUNCHES;
use penrose_agent::capture_summary::CaptureSummary;
use penrose_core::sampling::DEFAULT_SAMPLE_PERIOD;

use xtask::machine;
use xtask::workspace::{newest_standin, target_dir, workspace_root};

/// Arguments of `cargo xtask bench-capture`.
#[derive(clap::Args)]
pub struct Args {
    /// Replays per measurement; the median is reported.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Launches per probed replay (each costs a trap).
    #[arg(long, default_value_t = 200_000)]
    probed_launches: u64,
    /// Launches per unprobed replay.
    #[arg(long, default_value_t = 20_000_000)]
    unprobed_launches: u64,
    /// Rounds of the replay-path comparison (driver, runtime, runtime-legacy in turn).
    #[arg(long, default_value_t = 5)]
    path_rounds: usize,
    /// Window length of the replay-path comparison's agents, seconds (at least 2; the first
    /// window also holds the replayer's start).
    #[arg(long, default_value_t = 3.0)]
    window_seconds: f64,
    /// Seconds each unprobed replay of the replay-path comparison is timed.
    #[arg(long, default_value_t = 1.5)]
    unprobed_seconds: f64,
    /// Where to write the report.
    #[arg(long, default_value = "docs/benchmarks-capture.md")]
    out: PathBuf,
    /// Print the results as JSON too.
    #[arg(long)]
    json: bool,
}

#[derive(serde::Serialize)]
struct Results {
    unprobed_ns: f64,
    probed_ns: f64,
    detached_ns: f64,
    bpf_ns_per_launch: f64,
    calibrated: ProbeCost,
    captured_launches: u64,
    drops: u64,
    agent_cpu_s: f64,
    agent_idle_cpu_s: f64,
    agent_cpu_s_per_million: f64,
    agent_peak_rss_mib: f64,
    agent_idle_peak_rss_mib: f64,
    traces: Vec<TraceOverhead>,
    paths: paths::PathResults,
    /// The first bytes at each probed entry point and at the calibration target.
    entries: Vec<EntryBytes>,
}

/// The first instruction bytes of a probed function: what a uprobe replaces.
#[derive(serde::Serialize)]
struct EntryBytes {
    /// The function, as the report names it.
    function: &'static str,
    /// Its first bytes, when the symbol was found.
    bytes: Option<Vec<u8>>,
}

impl EntryBytes {
    /// Whether the first instruction is a register push (`50+r`, or `41 50+r`).
    fn is_push(&self) -> Option<bool> {
        let b = self.bytes.as_deref()?;
        Some(match b {
            [first, ..] if (0x50..=0x57).contains(first) => true,
            [0x41, second, ..] => (0x50..=0x57).contains(second),
            _ => false,
        })
    }

    fn describe(&self) -> String {
        let Some(bytes) = &self.bytes else {
            return format!("`{}` (not found)", self.function);
        };
        let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "`{}` {} ({})",
            self.function,
            hex.join(" "),
            if self.is_push() == Some(true) {
                "a push"
            } else {
                "not a push"
            }
        )
    }
}

/// The first 4 bytes of the function whose symbol `matches` in `path` (dynamic symbols and
/// `.symtab` both searched).
fn entry_bytes(path: &Path, function: &'static str, matches: impl Fn(&str) -> bool) -> EntryBytes {
    use object::{Object, ObjectSection, ObjectSymbol};
    let bytes = (|| {
        let data = std::fs::read(path).ok()?;
        let file = object::File::parse(&*data).ok()?;
        let symbol = file
            .dynamic_symbols()
            .chain(file.symbols())
            .find(|s| s.is_definition() && s.name().is_ok_and(&matches))?;
        let address = symbol.address();
        file.sections().find_map(|section| {
            section
                .data_range(address, 4)
                .ok()
                .flatten()
                .map(<[u8]>::to_vec)
        })
    })();
    EntryBytes { function, bytes }
}

#[derive(serde::Serialize)]
struct TraceOverhead {
    trace: String,
    launches_per_s: f64,
    window_s: f64,
    window_launches: u64,
    gap_s: f64,
    overhead_pct: f64,
    samples_per_hour: f64,
}

/// Runs the task.
pub fn run(args: Args) -> Result<()> {
    ensure!(
        penrose_agent::capture::loader::is_root(),
        "bench-capture loads eBPF programs: run it as root"
    );
    let root = workspace_root()?;
    build_release(&root)?;
    let bins = Installed::new(&target_dir(&root).join("release"))?;
    let (files, trace) = traces()?;
    let per_loop = replay_once(&bins.replay, &bins.standin.cuda, &trace, 1)?.0;
    let loops = |launches: u64| (launches / per_loop.max(1)).max(1);
    let replays = replays(&args, &bins, &trace, &loops)?;
    let entries = entries(&bins);
    eprintln!("replay paths: driver, runtime, runtime-legacy");
    let path_results = paths::measure(
        &bins.agent,
        &bins.replay,
        &bins.standin,
        &trace,
        args.path_rounds,
        args.window_seconds,
        args.unprobed_seconds,
        loops(args.probed_launches),
    )?;
    let results = results(replays, &files, path_results, entries);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    }
    let report = report(&results, &trace, &machine::describe(), &command_line(&args));
    print!("{report}");
    let out = root.join(&args.out);
    std::fs::write(&out, report).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("wrote {}", out.display());
    let _ = std::fs::remove_dir_all(&bins.dir);
    Ok(())
}

/// Builds the release agent and replayer (with the agent's test equipment).
fn build_release(root: &Path) -> Result<()> {
    let status = Command::new(env!("CARGO"))
        .current_dir(root)
        .args([
            "build",
            "--release",
            "-p",
            "penrose-agent",
            "-p",
            "penrose-standin",
            "--bins",
            "--features",
            "penrose-agent/test-util",
        ])
        .status()
        .context("building the release agent and replayer")?;
    ensure!(status.success(), "cargo build --release failed: {status}");
    Ok(())
}

/// The release binaries, and the stand-in libraries installed in a directory of the bench's
/// own.
struct Installed {
    agent: PathBuf,
    replay: PathBuf,
    standin: paths::Standin,
    /// Where the stand-in libraries were installed (removed at the end).
    dir: PathBuf,
}

impl Installed {
    fn new(release: &Path) -> Result<Self> {
        let agent = release.join("penrose-agent");
        let replay = release.join("penrose-replay");
        let lib = newest_standin(release)?;
        let dir = tempfile_dir()?;
        let installed = dir.join("libcuda.so.1");
        std::fs::copy(&lib, &installed).context("installing the stand-in")?;
        // The runtime and the test application come out of the same build script, next to it.
        let built = lib.parent().context("the stand-in's directory")?;
        let install = |name: &str| -> Result<PathBuf> {
            let to = dir.join(name);
            std::fs::copy(built.join(name), &to).with_context(|| format!("installing {name}"))?;
            Ok(to)
        };
        let standin = paths::Standin {
            cuda: installed,
            cudart: install("libcudart.so.13")?,
            app: install("libpenrose_nvcc_app.so")?,
        };
        Ok(Self {
            agent,
            replay,
            standin,
            dir,
        })
    }
}

/// The real traces, and the one replayed (`df_index_resolver`, else the first).
fn traces() -> Result<(Vec<PathBuf>, PathBuf)> {
    let folder = penrose_traces::TraceFolder::open(&penrose_traces::TraceFolder::default_dir())
        .context("the real traces (set PENROSE_TRACES)")?;
    let files = folder.files().to_vec();
    let trace = files
        .iter()
        .find(|f| f.to_string_lossy().contains("df_index_resolver"))
        .or(files.first())
        .context("no traces")?
        .clone();
    Ok((files, trace))
}

/// The replayer alone, the agent idle, the replayer under the agent, and the replayer alone
/// again once the agent has gone.
struct Replays {
    /// Median ns per launch, no agent.
    unprobed: f64,
    idle: AgentRun<f64>,
    /// The agent's run; its `ret` is the median ns per launch under it.
    loaded: AgentRun<f64>,
    /// Median ns per launch after the agent left.
    detached: f64,
}

fn replays(
    args: &Args,
    bins: &Installed,
    trace: &Path,
    loops: &dyn Fn(u64) -> u64,
) -> Result<Replays> {
    let (replay, installed) = (&bins.replay, &bins.standin.cuda);
    let unprobed_replays = || {
        median_ns(
            replay,
            installed,
            trace,
            loops(args.unprobed_launches),
            args.rounds,
        )
    };
    eprintln!("unprobed replays of {}", trace.display());
    let unprobed = unprobed_replays()?;

    eprintln!("agent idle (baseline)");
    let idle = run_agent(&bins.agent, &[installed], &[], "info", |_| {
        std::thread::sleep(Duration::from_secs(3));
        Ok(0.0)
    })?;
    eprintln!("probed replays");
    // The idle run's CPU rate is subtracted per second of the loaded run.
    let loaded = run_agent(&bins.agent, &[installed], &[], "info", |_| {
        median_ns(
            replay,
            installed,
            trace,
            loops(args.probed_launches),
            args.rounds,
        )
    })?;
    eprintln!("unprobed replays after the agent left");
    let detached = unprobed_replays()?;
    Ok(Replays {
        unprobed,
        idle,
        loaded,
        detached,
    })
}

/// The first bytes at each probed entry point and at the calibration target.
fn entries(bins: &Installed) -> Vec<EntryBytes> {
    let cudart = &bins.standin.cudart;
    vec![
        entry_bytes(&bins.standin.cuda, "cuLaunchKernel", |n| {
            n == "cuLaunchKernel"
        }),
        entry_bytes(cudart, "cudaLaunchKernel", |n| n == "cudaLaunchKernel"),
        entry_bytes(cudart, "__cudaRegisterFunction", |n| {
            n == "__cudaRegisterFunction"
        }),
        entry_bytes(cudart, "__cudaGetKernel", |n| n == "__cudaGetKernel"),
        entry_bytes(&bins.agent, "the agent's calibration target", |n| {
            n.contains("calibration_target")
        }),
    ]
}

/// The figures the report gives, from the measurements.
fn results(
    replays: Replays,
    files: &[PathBuf],
    paths: paths::PathResults,
    entries: Vec<EntryBytes>,
) -> Results {
    let Replays {
        unprobed,
        idle,
        loaded,
        detached,
    } = replays;
    let summary = &loaded.summary;
    let captured = summary.counts.launches;
    let drops = summary.drops;
    let (runs, run_ns) = summary
        .bpf_stats
        .iter()
        .filter(|p| p.program.starts_with("cu_launch") || p.program.starts_with("cu_graph"))
        .fold((0u64, 0u64), |(r, t), p| (r + p.runs, t + p.run_time_ns));
    let calibrated: ProbeCost = ProbeCost {
        per_launch: summary.probe_cost.per_launch,
        bpf_run: None,
        unprobed_call: Duration::ZERO,
        probed_call: Duration::ZERO,
    };
    let idle_rate = idle.cpu_s / idle.wall_s.max(f64::MIN_POSITIVE);
    let agent_cpu = (loaded.cpu_s - idle_rate * loaded.wall_s).max(0.0);
    let per_launch_cost = ProbeCost {
        per_launch: Duration::from_secs_f64(((loaded.ret - unprobed) * 1e-9).max(0.0)),
        ..calibrated
    };
    let traces = files
        .iter()
        .filter_map(|f| overhead_for(f, &per_launch_cost).ok())
        .collect();
    Results {
        unprobed_ns: unprobed,
        probed_ns: loaded.ret,
        detached_ns: detached,
        bpf_ns_per_launch: run_ns as f64 / runs.max(1) as f64,
        calibrated,
        captured_launches: captured,
        drops,
        agent_cpu_s: loaded.cpu_s,
        agent_idle_cpu_s: idle.cpu_s,
        agent_cpu_s_per_million: agent_cpu / (captured.max(1) as f64 / 1e6),
        agent_peak_rss_mib: loaded.max_rss_kib / 1024.0,
        agent_idle_peak_rss_mib: idle.max_rss_kib / 1024.0,
        traces,
        paths,
        entries,
    }
}

fn tempfile_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("penrose-bench-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// One replay; returns (launches, ns per launch).
fn replay_once(replay: &Path, lib: &Path, trace: &Path, loops: u64) -> Result<(u64, f64)> {
    let out = Command::new(replay)
        .arg("--lib")
        .arg(lib)
        .args(["--json", "--loop", &loops.to_string()])
        .arg(trace)
        .output()
        .context("running penrose-replay")?;
    ensure!(
        out.status.success(),
        "penrose-replay: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let replayed = summary["replayed"].as_u64().context("replayed")?;
    let rate = summary["launches_per_s"]
        .as_f64()
        .context("launches_per_s")?;
    Ok((replayed / loops.max(1), 1e9 / rate))
}

fn median_ns(replay: &Path, lib: &Path, trace: &Path, loops: u64, rounds: usize) -> Result<f64> {
    let mut v = Vec::new();
    for _ in 0..rounds.max(1) {
        v.push(replay_once(replay, lib, trace, loops)?.1);
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

struct AgentRun<T> {
    ret: T,
    /// What the agent printed (`capture --json`), as its own type.
    summary: CaptureSummary,
    cpu_s: f64,
    wall_s: f64,
    max_rss_kib: f64,
}

/// The agent's log lines that mention windows, each with when the bench read it.
#[derive(Default)]
struct AgentLog {
    /// The lines, and whether the agent's stderr has ended.
    state: Mutex<(Vec<(Instant, String)>, bool)>,
    changed: Condvar,
}

impl AgentLog {
    fn push(&self, line: String) {
        if let Ok(mut state) = self.state.lock() {
            state.0.push((Instant::now(), line));
        }
        self.changed.notify_all();
    }

    fn end(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.1 = true;
        }
        self.changed.notify_all();
    }

    /// The lines so far.
    fn lines(&self) -> Vec<(Instant, String)> {
        self.state
            .lock()
            .map(|state| state.0.clone())
            .unwrap_or_default()
    }

    /// Waits until `done` holds for the lines so far; an error after `timeout` or once the
    /// agent's log has ended without it.
    fn wait_until(
        &self,
        timeout: Duration,
        done: impl Fn(&[(Instant, String)]) -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let poisoned = || anyhow::anyhow!("agent log lock");
        let mut state = self.state.lock().map_err(|_| poisoned())?;
        loop {
            if done(&state.0) {
                return Ok(());
            }
            ensure!(!state.1, "the agent's log ended early");
            let left = deadline.saturating_duration_since(Instant::now());
            ensure!(!left.is_zero(), "timed out waiting for the agent's windows");
            state = self
                .changed
                .wait_timeout(state, left)
                .map_err(|_| poisoned())?
                .0;
        }
    }
}

/// The line without terminal colour sequences.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ ... final byte in @..~
            for d in chars.by_ref() {
                if ('@'..='~').contains(&d) && d != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Sends SIGINT to our own child (still unwaited, so its id is still its own).
fn interrupt(child: &Child) -> Result<()> {
    let pid = i32::try_from(child.id())?;
    // SAFETY: kill with a valid signal number has no memory effects; the pid is our child's.
    #[allow(unsafe_code)]
    let sent = unsafe { libc::kill(pid, libc::SIGINT) };
    ensure!(sent == 0, "kill: {}", std::io::Error::last_os_error());
    Ok(())
}

/// Runs `penrose-agent capture` on `libs` while `work` runs (by default one window for the
/// whole run; `extra` adds flags), then stops it with SIGINT and collects its output and
/// resource use. `log_filter` is its `RUST_LOG`; `work` sees its lines about windows.
fn run_agent<T>(
    agent: &Path,
    libs: &[&Path],
    extra: &[&str],
    log_filter: &str,
    work: impl FnOnce(&AgentLog) -> Result<T>,
) -> Result<AgentRun<T>> {
    let mut child = spawn_agent(agent, libs, extra, log_filter)?;
    let started = Instant::now();
    let (log, drain) = follow_log(&mut child)?;
    let ret = work(&log);
    let stopped = stop_agent(&mut child)?;
    let wall_s = started.elapsed().as_secs_f64();
    let _ = drain.join();
    let ret = ret?;
    let summary: CaptureSummary = serde_json::from_str(&stopped.stdout)
        .with_context(|| format!("the agent's JSON: {}", stopped.stdout))?;
    Ok(AgentRun {
        ret,
        summary,
        cpu_s: stopped.cpu_s,
        wall_s,
        max_rss_kib: stopped.max_rss_kib,
    })
}

/// Starts `penrose-agent capture` (see [`run_agent`]), its stdout and stderr piped.
fn spawn_agent(agent: &Path, libs: &[&Path], extra: &[&str], log_filter: &str) -> Result<Child> {
    let mut command = Command::new(agent);
    command
        .args([
            "capture",
            "--seconds",
            "3600",
            "--only-lib",
            "--bpf-stats",
            "--json",
            // Test equipment, named: the stand-in's counter ring, and the stand-in under the
            // build directory (root's, but below /var/tmp, which anyone may write to).
            "--counters",
            "test-standin-ring",
            "--allow-untrusted-libs",
        ])
        .args(["--window-launches", &usize::MAX.to_string()])
        .args(extra);
    for lib in libs {
        command.arg("--lib").arg(lib);
    }
    command
        .env("RUST_LOG", log_filter)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting penrose-agent")
}

/// Waits until the agent is ready (it logs its schedule after loading, calibrating and
/// attaching), then keeps its lines about windows in an [`AgentLog`] on a thread of its own.
fn follow_log(child: &mut Child) -> Result<(Arc<AgentLog>, std::thread::JoinHandle<()>)> {
    let stderr = child.stderr.take().context("agent stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    loop {
        let line = lines
            .next()
            .context("the agent exited before it was ready")??;
        if line.contains("capture:") && line.contains("libraries") {
            break;
        }
    }
    let log = Arc::new(AgentLog::default());
    let drain = {
        let log = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let line = strip_ansi(&line);
                if line.contains("window") {
                    log.push(line);
                }
            }
            log.end();
        })
    };
    Ok((log, drain))
}

/// What a stopped agent printed and used.
struct Stopped {
    stdout: String,
    /// User and system CPU seconds.
    cpu_s: f64,
    max_rss_kib: f64,
}

/// Stops the agent with SIGINT and waits for it, reading its output and resource use.
fn stop_agent(child: &mut Child) -> Result<Stopped> {
    let pid = i32::try_from(child.id())?;
    interrupt(child)?;
    let mut stdout = String::new();
    std::io::Read::read_to_string(
        &mut child.stdout.take().context("agent stdout")?,
        &mut stdout,
    )?;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill in.
    #[allow(unsafe_code)]
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child with valid pointers to a status and a rusage.
    #[allow(unsafe_code)]
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    ensure!(waited == pid, "wait4: {}", std::io::Error::last_os_error());
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    Ok(Stopped {
        stdout,
        cpu_s: tv(usage.ru_utime) + tv(usage.ru_stime),
        max_rss_kib: usage.ru_maxrss as f64,
    })
}

/// The default schedule applied to a trace's own launch rate, assuming its launching process
/// keeps one CPU busy (a smaller CPU share makes the scheduler wait longer, not shorter).
fn overhead_for(trace: &Path, cost: &ProbeCost) -> Result<TraceOverhead> {
    let t = penrose_traces::read_trace(trace)?;
    let seqs = t.process_sequences();
    let (_, seq) = seqs
        .iter()
        .max_by_key(|(_, s)| s.len())
        .context("no kernels")?;
    let first = seq.iter().map(|k| k.ts_us).fold(f64::INFINITY, f64::min);
    let last = seq
        .iter()
        .map(|k| k.ts_us + k.dur_us)
        .fold(f64::NEG_INFINITY, f64::max);
    let span_s = (last - first) * 1e-6;
    if span_s.is_nan() || span_s <= 0.0 {
        bail!("no time span");
    }
    let rate = seq.len() as f64 / span_s;
    let config = BudgetConfig::default();
    let schedule = Schedule::Budget {
        config,
        cost: *cost,
    };
    let l = DEFAULT_WINDOW_LAUNCHES as f64;
    let window_s = (l / rate).min(config.max_window.as_secs_f64());
    let launches = (rate * window_s).round() as u64;
    let window = WindowCost {
        open_for: Duration::from_secs_f64(window_s),
        launches,
        process_cpu: Some(Duration::from_secs_f64(window_s)),
    };
    let gap = schedule.gap_after(&window);
    let overhead =
        penrose_agent::capture::schedule::achieved_overhead(cost, &[(window, gap)]).unwrap_or(0.0);
    let cycle = window_s + gap.as_secs_f64();
    Ok(TraceOverhead {
        trace: trace
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
        launches_per_s: rate,
        window_s,
        window_launches: launches,
        gap_s: gap.as_secs_f64(),
        overhead_pct: 100.0 * overhead,
        samples_per_hour: 3600.0 / cycle * launches as f64 / f64::from(DEFAULT_SAMPLE_PERIOD.get()),
    })
}

/// The command that reproduces a run with these arguments.
fn command_line(args: &Args) -> String {
    format!(
        "cargo run --release -p xtask -- bench-capture --rounds {} --probed-launches {} \
         --unprobed-launches {} --path-rounds {} --window-seconds {} --unprobed-seconds {}",
        args.rounds,
        args.probed_launches,
        args.unprobed_launches,
        args.path_rounds,
        args.window_seconds,
        args.unprobed_seconds
    )
}

fn report(r: &Results, trace: &Path, machine: &str, command: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## Capture\n");
    let _ = writeln!(
        s,
        "Written by `cargo xtask bench-capture` (as root): the release `penrose-replay` replaying \
         `{}` through the stand-in libcuda, with and without the release `penrose-agent capture` \
         attached (every launch probe, one window). Medians of the rounds; these machines are \
         noisy.\n",
        trace
            .file_name()
            .map(|f| f.to_string_lossy())
            .unwrap_or_default()
    );
    let _ = writeln!(s, "Machine: {machine}\n");
    s.push_str(&measures_table(r));
    s.push_str(&overhead_table(r));
    s.push_str(&cost_notes(r));
    s.push_str(&paths::report(&r.paths));
    let _ = writeln!(
        s,
        "Reproduce (as root, from the repository root; `--json` also prints every round): \
         `{command}`."
    );
    s
}

/// The replayer's time per launch with and without the agent, and what the agent used.
fn measures_table(r: &Results) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| measure | value |\n|---|---|");
    let rows = [
        ("per launch, no probe", format!("{:.1} ns", r.unprobed_ns)),
        (
            "per launch, launch probes attached",
            format!("{:.2} µs", r.probed_ns / 1e3),
        ),
        (
            "per launch, after detaching",
            format!("{:.1} ns", r.detached_ns),
        ),
        (
            "probe cost per launch (attached - unprobed)",
            format!("{:.2} µs", (r.probed_ns - r.unprobed_ns) / 1e3),
        ),
        (
            "agent's start-up calibration of the same cost",
            format!("{:.2} µs", r.calibrated.per_launch.as_secs_f64() * 1e6),
        ),
        (
            "BPF launch program run time per launch",
            format!("{:.0} ns", r.bpf_ns_per_launch),
        ),
        (
            "launches captured / ring-buffer drops",
            format!("{} / {}", r.captured_launches, r.drops),
        ),
        (
            "agent CPU per million captured launches (idle polling subtracted)",
            format!("{:.2} s", r.agent_cpu_s_per_million),
        ),
        (
            "agent CPU, loaded run / idle run",
            format!("{:.2} s / {:.2} s", r.agent_cpu_s, r.agent_idle_cpu_s),
        ),
        (
            "agent peak RSS, loaded / idle",
            format!(
                "{:.1} MiB / {:.1} MiB",
                r.agent_peak_rss_mib, r.agent_idle_peak_rss_mib
            ),
        ),
    ];
    for (k, v) in rows {
        let _ = writeln!(s, "| {k} | {v} |");
    }
    s
}

/// The overhead at the default schedule for each real trace's launch rate.
fn overhead_table(r: &Results) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nOverhead at the default schedule (budget 0.02% of the probed process's CPU time, L = \
         10,000, windows at most 10 s, gaps 60 s to 6 h, S = {}), for each real trace's launch \
         rate (launches over the span of its largest process), with the measured probe cost above \
         and the launching process assumed to keep one CPU busy. The paper we compete with \
         reports 0.045% overall.\n",
        DEFAULT_SAMPLE_PERIOD.get()
    );
    let _ = writeln!(
        s,
        "| trace | launches/s | window | launches in window | gap | overhead | samples per hour |\n|---|---|---|---|---|---|---|"
    );
    for t in &r.traces {
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.2} s | {} | {:.0} s | {:.4}% | {:.2} |",
            t.trace,
            t.launches_per_s,
            t.window_s,
            t.window_launches,
            t.gap_s,
            t.overhead_pct,
            t.samples_per_hour
        );
    }
    s
}

/// Where a probe's cost goes: the BPF program, the trap, the instruction it replaces.
fn cost_notes(r: &Results) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nThe budget binds whenever the computed gap exceeds the 60 s minimum, so the overhead \
         is the budget (0.0200%) for every application that launches fast enough to fill a \
         window's probe time; slower launchers sit at the minimum gap and cost less. The BPF \
         program is {:.0} ns of the {:.2} µs a probe adds per launch; the rest is the uprobe \
         trap.\n",
        r.bpf_ns_per_launch,
        (r.probed_ns - r.unprobed_ns) / 1e3
    );
    let measured = (r.probed_ns - r.unprobed_ns).max(f64::MIN_POSITIVE);
    let calibrated = r.calibrated.per_launch.as_secs_f64() * 1e9;
    let entries: Vec<String> = r.entries.iter().map(EntryBytes::describe).collect();
    let _ = writeln!(
        s,
        "A uprobe's cost depends on the instruction it replaces: x86 uprobes emulate a few \
         instructions at the trap, a register push among them, and single-step the others out \
         of line after it, a second exception. First bytes of the probed functions in this run: \
         {}. The agent's start-up calibration measured {:.2} µs per probed call, {:.1}x the \
         cost measured on the stand-in driver above; the budget scheduler uses the \
         calibration. A real driver's entry points begin with whatever its compiler emitted.\n",
        entries.join(", "),
        calibrated / 1e3,
        calibrated / measured
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pushes_are_told_from_other_first_instructions() {
        let entry = |bytes: &[u8]| EntryBytes {
            function: "f",
            bytes: Some(bytes.to_vec()),
        };
        assert_eq!(entry(&[0x55, 0x48, 0x89, 0xe5]).is_push(), Some(true));
        assert_eq!(entry(&[0x41, 0x57, 0x41, 0x56]).is_push(), Some(true));
        assert_eq!(entry(&[0x31, 0xd6, 0x44, 0x31]).is_push(), Some(false));
        assert_eq!(entry(&[0xf3, 0x0f, 0x1e, 0xfa]).is_push(), Some(false));
        assert_eq!(
            EntryBytes {
                function: "g",
                bytes: None
            }
            .is_push(),
            None
        );
        assert_eq!(entry(&[0x55, 0x48]).describe(), "`f` 55 48 (a push)");
    }

    #[test]
    fn colour_sequences_are_stripped() {
        assert_eq!(
            strip_ansi("\u{1b}[2m2026\u{1b}[0m \u{1b}[34mDEBUG\u{1b}[0m window opened: 8"),
            "2026 DEBUG window opened: 8"
        );
    }
}

/// The reports' text on fixed, made-up results.
#[cfg(test)]
mod report_tests {
    use super::paths::{PathResults, PathRound, PerLaunch, ReplayPath, WholeProcess};
    use super::*;
    use std::collections::BTreeMap;

    fn per(x: f64) -> PerLaunch {
        PerLaunch {
            wall_ns: 1000.0 + 37.3 * x,
            cpu_ns: 800.0 + 29.1 * x,
            launches: 10_000 + x as u64,
            seconds: 1.5 + x / 100.0,
        }
    }

    fn runs(scale: u64) -> BTreeMap<String, u64> {
        [
            ("cu_launch_kernel", 1000 * scale),
            ("cu_graph_launch", 7 * scale),
            ("cudart_launch_kernel", 900 * scale),
            ("cudart_launch_kernel_ptsz", 3 * scale),
            ("cudart_register_function", 41),
            ("cudart_get_kernel", 40 + scale),
            ("cudart_get_kernel_ret", 40),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    pub(super) fn paths_sample(drops: bool) -> PathResults {
        let mut rounds = Vec::new();
        for round in 0..3 {
            for (i, path) in ReplayPath::ALL.into_iter().enumerate() {
                let x = (round * 3 + i) as f64;
                rounds.push(PathRound {
                    path,
                    round,
                    unprobed: per(x),
                    first_window: per(x * 2.5 + 10.0),
                    later_window: per(x * 1.7 + 3.0),
                    first_window_probes: 12 + i,
                    later_window_probes: 10 + round,
                    replayed: 123_456 + x as u64 * 1000,
                    distinct_kernels: 77,
                    register_calls: 41 + i as u64,
                    get_kernel_calls: 40 * i as u64,
                    program_runs: runs(1 + i as u64),
                    unnamed_launches: round as u64,
                    drops: if drops { (round * i) as u64 * 5 } else { 0 },
                });
            }
        }
        let whole = ReplayPath::ALL
            .into_iter()
            .enumerate()
            .map(|(i, path)| WholeProcess {
                path,
                replayed: 200_000 + i as u64,
                wall_ns: 1234.5 + i as f64 * 17.25,
                distinct_kernels: 77,
                register_calls: 41,
                get_kernel_calls: 40 * i as u64,
                program_runs: runs(3 + i as u64),
            })
            .collect();
        PathResults {
            rounds,
            whole,
            whole_launches: 200_000,
            window_s: 3.0,
            unprobed_s: 1.5,
        }
    }

    fn results(drops: bool) -> Results {
        Results {
            unprobed_ns: 123.456,
            probed_ns: 4567.891,
            detached_ns: 130.2,
            bpf_ns_per_launch: 345.6,
            calibrated: ProbeCost {
                per_launch: Duration::from_nanos(5123),
                bpf_run: None,
                unprobed_call: Duration::ZERO,
                probed_call: Duration::ZERO,
            },
            captured_launches: 1_234_567,
            drops: 3,
            agent_cpu_s: 12.345,
            agent_idle_cpu_s: 0.5,
            agent_cpu_s_per_million: 2.5,
            agent_peak_rss_mib: 45.67,
            agent_idle_peak_rss_mib: 30.1,
            traces: vec![
                TraceOverhead {
                    trace: "a.json.gz".into(),
                    launches_per_s: 12345.6,
                    window_s: 0.81,
                    window_launches: 10_000,
                    gap_s: 612.3,
                    overhead_pct: 0.02,
                    samples_per_hour: 123.45,
                },
                TraceOverhead {
                    trace: "b.json.gz".into(),
                    launches_per_s: 123.4,
                    window_s: 10.0,
                    window_launches: 1234,
                    gap_s: 60.0,
                    overhead_pct: 0.0012,
                    samples_per_hour: 45.6,
                },
            ],
            paths: paths_sample(drops),
            entries: vec![
                EntryBytes {
                    function: "cuLaunchKernel",
                    bytes: Some(vec![0x55, 0x48, 0x89, 0xe5]),
                },
                EntryBytes {
                    function: "cudaLaunchKernel",
                    bytes: Some(vec![0xf3, 0x0f, 0x1e, 0xfa]),
                },
                EntryBytes {
                    function: "__cudaGetKernel",
                    bytes: None,
                },
            ],
        }
    }

    #[test]
    fn the_report_has_every_section_and_the_drops_note_only_after_drops() {
        for drops in [false, true] {
            let text = report(
                &results(drops),
                Path::new("/x/y/trace.json.gz"),
                "machine M",
                "cmd --x",
            );
            for part in [
                "## Capture\n",
                "replaying `trace.json.gz` through",
                "Machine: machine M\n",
                "| per launch, no probe | 123.5 ns |",
                "| trace | launches/s |",
                "| b.json.gz | 123 | 10.00 s | 1234 | 60 s | 0.0012% | 45.60 |",
                "`cuLaunchKernel` 55 48 89 e5 (a push), `cudaLaunchKernel` f3 0f 1e fa (not a push)",
                "### The CUDA runtime path",
                "| one window, whole process |",
                "`cmd --x`.",
            ] {
                assert!(text.contains(part), "{part:?} missing");
            }
            assert_eq!(text.contains("ring buffer dropped"), drops);
        }
    }

    #[test]
    fn every_row_of_the_path_tables_has_a_cell_per_path() {
        let text = super::paths::report(&paths_sample(true));
        let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("| ")).collect();
        // 15 rows and the header of the rounds' table, 6 and the header of the whole process'.
        assert_eq!(rows.len(), 15 + 7, "{text}");
        for row in rows {
            assert_eq!(row.matches(" | ").count(), ReplayPath::ALL.len(), "{row}");
        }
    }
}
