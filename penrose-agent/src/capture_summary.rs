//! A capture run on the operator's own machine (`penrose-agent capture`) and what it saw.
//!
//! The probes run for as long as asked, or until SIGINT or SIGTERM, and the run is summarised
//! in one typed value: the command prints it as text or as JSON, and readers of the JSON
//! (`cargo xtask bench-capture`) take it back as the same type. Nothing here is ever sent:
//! kernel names in particular stay on the machine.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::num::NonZeroU32;
use std::time::{Duration, Instant, TryFromFloatSecsError};

use penrose_core::counters::Catalogue;
use penrose_core::fingerprint::{FingerprintParams, Fingerprinter, ParamsError};
use penrose_core::sampling::SamplePeriod;
use serde::{Deserialize, Serialize};

use crate::capture::launch_log::{LaunchLine, LoggedLaunch, MAX_LOGGED_LAUNCHES};
use crate::capture::loader::{ProgramStats, enable_run_stats};
use crate::capture::locate::LibrarySources;
use crate::capture::schedule::{BudgetConfig, OverheadBudget, ProbeCost, Schedule};
use crate::capture::window::{Snippet, SnippetEnd};
use crate::capture::{Capture, CaptureConfig, CaptureError, Counts, WindowRecord};
use crate::cli::CaptureArgs;

/// Snippet names listed in [`SnippetSummary::first_names`].
const FIRST_NAMES: usize = 5;

/// Why a capture run could not start or failed.
#[derive(Debug, thiserror::Error)]
pub enum CaptureRunError {
    /// A duration option is negative, not a number or too large.
    #[error("--{option} {value}")]
    Duration {
        /// The option, without its dashes.
        option: &'static str,
        /// What it was given.
        value: f64,
        /// Why that is no duration.
        source: TryFromFloatSecsError,
    },
    /// `--sample-period 0`.
    #[error("--sample-period must be at least 1")]
    SamplePeriod,
    /// `--budget` outside (0, 100].
    #[error("--budget {0}: must be above 0 and at most 100")]
    Budget(f64),
    /// The capture could not start or run.
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// The fingerprint parameters are invalid.
    #[error(transparent)]
    Fingerprint(#[from] ParamsError),
    /// The SIGINT/SIGTERM handlers could not be installed.
    #[error("installing signal handlers")]
    Signals(#[source] std::io::Error),
}

impl CaptureRunError {
    /// A host prerequisite of capture is missing (not root, no BTF, no counter source, ...):
    /// exit code 4 (unavailable).
    pub fn is_missing_prerequisite(&self) -> bool {
        matches!(self, Self::Capture(e) if e.is_missing_prerequisite())
    }
}

/// What a capture run saw (`capture --json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CaptureSummary {
    /// Each BPF program that ran, with `--bpf-stats` (empty without).
    pub bpf_stats: Vec<ProgramRuns>,
    /// The library files probed.
    pub libraries: Vec<String>,
    /// How long the run lasted, seconds.
    pub elapsed_s: f64,
    /// What the reader saw.
    pub counts: Counts,
    /// Records the ring buffer dropped.
    pub drops: u64,
    /// Launches past L in a window, not kept.
    pub beyond_limit: u64,
    /// Where counter values came from.
    pub counter_source: String,
    /// The probe cost the schedule used (measured, or assumed with `--no-calibrate`).
    pub probe_cost: ProbeCost,
    /// Every window, in order.
    pub windows: Vec<WindowRecord>,
    /// Records read per second of the run.
    pub events_per_s: f64,
    /// Every snippet, in the order they ended.
    pub snippets: Vec<SnippetSummary>,
    /// Every launch recorded, in reading order, with `--launches` (`None` without).
    pub launch_log: Option<Vec<LaunchLine>>,
    /// Launches not in the launch log because it was full.
    pub launch_log_beyond_limit: u64,
}

/// One BPF program's runs (kernel statistics, `--bpf-stats`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProgramRuns {
    /// The program.
    pub program: String,
    /// Times it ran.
    pub runs: u64,
    /// Its total run time, nanoseconds.
    pub run_time_ns: u64,
    /// Its mean run time, nanoseconds.
    pub ns_per_run: f64,
}

/// One snippet: one process's launches in one window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SnippetSummary {
    /// The process.
    pub pid: u32,
    /// The window.
    pub window: u64,
    /// Launches recorded.
    pub launches: usize,
    /// Of those, launches whose handle had no name.
    pub unnamed: u64,
    /// Of those, launches given an identity from their call site.
    pub identified: u64,
    /// Launches recorded by their launch shape (no name, no identity).
    pub shapes: usize,
    /// Distinct names (identities and shape labels included).
    pub names: usize,
    /// Why it ended.
    pub end: SnippetEnd,
    /// Its snippet hash, in hex.
    pub snippet_hash: String,
    /// Its first few names.
    pub first_names: Vec<String>,
    /// Every launch's name, with `--all-names` (`None` without).
    pub all_names: Option<Vec<String>>,
    /// Its sampled launches with counter values.
    pub samples: Vec<SampleSummary>,
}

/// A sampled launch and its counter values.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SampleSummary {
    /// Its position in the snippet.
    pub position: usize,
    /// Its kernel name.
    pub kernel: String,
    /// The counter group that was active.
    pub group: u8,
    /// Each value by counter name (`?` for a counter the catalogue does not know); `None`
    /// for a value that is not a finite number (JSON `null`).
    pub values: BTreeMap<String, Option<f64>>,
}

/// Runs the capture `args` describe: starts the probes, runs the schedule for `--seconds` or
/// until SIGINT or SIGTERM, and summarises what was captured.
pub fn capture(args: &CaptureArgs) -> Result<CaptureSummary, CaptureRunError> {
    let secs = |value: f64, option: &'static str| {
        Duration::try_from_secs_f64(value).map_err(|source| CaptureRunError::Duration {
            option,
            value,
            source,
        })
    };
    let total = secs(args.seconds, "seconds")?;
    let sample_period = NonZeroU32::new(args.sample_period)
        .map(SamplePeriod)
        .ok_or(CaptureRunError::SamplePeriod)?;
    let config = CaptureConfig {
        sources: LibrarySources {
            explicit: args.lib.clone(),
            ldconfig: !args.only_lib,
            proc_maps: !args.only_lib,
            allow_untrusted: args.allow_untrusted_libs,
        },
        max_libraries: args.max_libraries.max(1),
        window_launches: args.window_launches,
        poll_interval: Duration::from_millis(args.poll_ms),
        sample_period,
        group_period: secs(args.group_seconds, "group-seconds")?,
        counters: args.counters,
        calibrate: !args.no_calibrate,
        seed: args.seed,
    };
    let mut capture = Capture::start(config)?;
    if args.launches {
        capture.log_launches(MAX_LOGGED_LAUNCHES);
    }
    let schedule = match args.budget {
        Some(percent) => Schedule::Budget {
            config: BudgetConfig {
                budget: OverheadBudget::new(percent / 100.0)
                    .ok_or(CaptureRunError::Budget(percent))?,
                max_window: secs(args.max_window_seconds, "max-window-seconds")?,
                min_gap: secs(args.min_gap_seconds, "min-gap-seconds")?,
                max_gap: secs(args.max_gap_seconds, "max-gap-seconds")?,
            },
            cost: capture.probe_cost(),
        },
        None => Schedule::Fixed {
            duration: secs(
                args.window_seconds.unwrap_or(args.seconds),
                "window-seconds",
            )?,
            period: secs(
                args.period_seconds.unwrap_or(args.seconds),
                "period-seconds",
            )?,
        },
    };
    run(
        &mut capture,
        total,
        &schedule,
        args.bpf_stats,
        args.all_names,
    )
}

/// Runs a started capture and summarises it.
fn run(
    capture: &mut Capture,
    total: Duration,
    schedule: &Schedule,
    bpf_stats: bool,
    all_names: bool,
) -> Result<CaptureSummary, CaptureRunError> {
    let fingerprinter = Fingerprinter::new(FingerprintParams::default())?;
    let catalogue = Catalogue::current();
    // Kernel BPF statistics stay on until the programs' figures are read below.
    let _stats = bpf_stats.then(enable_run_stats).transpose()?;
    match schedule {
        Schedule::Fixed { period, duration } => tracing::info!(
            "capture: {} s, windows of {duration:?} every {period:?} (duty cycle at most {:.1}%), {} libraries",
            total.as_secs_f64(),
            100.0 * schedule.fixed_duty_cycle().unwrap_or(1.0),
            capture.libraries().len()
        ),
        Schedule::Budget { config, cost } => tracing::info!(
            "capture: {} s, windows spaced by an overhead budget of {}% of the probed processes' CPU time (probe cost {:?} per launch; windows at most {:?}, gaps {:?} to {:?}), {} libraries",
            total.as_secs_f64(),
            100.0 * config.budget.fraction(),
            cost.per_launch,
            config.max_window,
            config.min_gap,
            config.max_gap,
            capture.libraries().len()
        ),
    }
    let started = Instant::now();
    let stop = penrose_host::process::stop_on_signals().map_err(CaptureRunError::Signals)?;
    capture.run_until(total, schedule, stop)?;
    let elapsed_s = started.elapsed().as_secs_f64();
    let snippets = capture
        .take_snippets()
        .iter()
        .map(|s| SnippetSummary::of(s, &fingerprinter, catalogue, all_names))
        .collect();
    let counts = capture.counts();
    let drops = capture.drops()?;
    let libraries = capture
        .libraries()
        .iter()
        .map(|l| l.path.display().to_string())
        .collect();
    let programs = capture
        .run_stats()
        .into_iter()
        .filter(|p| bpf_stats && p.runs > 0)
        .map(|p| ProgramRuns::of(&p))
        .collect();
    let log = capture.launch_log();
    Ok(CaptureSummary {
        bpf_stats: programs,
        libraries,
        elapsed_s,
        counts,
        drops,
        beyond_limit: capture.beyond_limit(),
        counter_source: capture.counter_source().to_string(),
        probe_cost: capture.probe_cost(),
        windows: capture.history().to_vec(),
        events_per_s: counts.events as f64 / elapsed_s.max(f64::MIN_POSITIVE),
        snippets,
        launch_log: log
            .is_on()
            .then(|| log.launches().iter().map(LoggedLaunch::line).collect()),
        launch_log_beyond_limit: log.beyond_limit(),
    })
}

impl ProgramRuns {
    /// The figures of a program that ran at least once.
    fn of(p: &ProgramStats) -> Self {
        Self {
            program: p.program.clone(),
            runs: p.runs,
            run_time_ns: p.run_time.as_nanos() as u64,
            ns_per_run: p.run_time.as_nanos() as f64 / p.runs as f64,
        }
    }
}

impl SnippetSummary {
    /// The summary of `s`, with every name when `all_names`.
    fn of(
        s: &Snippet,
        fingerprinter: &Fingerprinter,
        catalogue: &Catalogue,
        all_names: bool,
    ) -> Self {
        let distinct: HashSet<&str> = s.names.iter().map(|n| &**n).collect();
        Self {
            pid: s.pid.0,
            window: s.window,
            launches: s.names.len(),
            unnamed: s.unnamed,
            identified: s.identified,
            shapes: s.shapes.len(),
            names: distinct.len(),
            end: s.end,
            snippet_hash: s.snippet_hash(fingerprinter).to_string(),
            first_names: s
                .names
                .iter()
                .take(FIRST_NAMES)
                .map(|n| n.to_string())
                .collect(),
            all_names: all_names.then(|| s.names.iter().map(|n| n.to_string()).collect()),
            samples: s
                .samples
                .iter()
                .map(|sample| SampleSummary {
                    position: sample.position,
                    kernel: sample.kernel.to_string(),
                    group: sample.group.0,
                    values: sample
                        .values
                        .iter()
                        .map(|v| {
                            let name = catalogue.counter(v.counter).map_or("?", |c| c.name);
                            (name.to_string(), v.value.is_finite().then_some(v.value))
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

/// The text form: libraries, counts, probe cost, one line per window, per BPF program and
/// per snippet.
impl fmt::Display for CaptureSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counts = &self.counts;
        writeln!(
            f,
            "libraries: {}; not probed: {} root does not control, {} over the cap",
            self.libraries.join(", "),
            counts.libraries_untrusted,
            counts.libraries_over_cap
        )?;
        writeln!(
            f,
            "{} events ({} launches, {} names, {} exits) in {:.1} s; {} dropped",
            counts.events, counts.launches, counts.names, counts.exits, self.elapsed_s, self.drops
        )?;
        writeln!(
            f,
            "{} sampled launches, {} with counter values from {}; probe cost {:?} per launch",
            counts.sampled,
            counts.samples_with_values,
            self.counter_source,
            self.probe_cost.per_launch
        )?;
        for w in &self.windows {
            writeln!(
                f,
                "window {:>3}: {:>7} launches in {:>8.3} s{}, probe time {:.3} s, processes' CPU {}, then {:.0} s closed",
                w.index,
                w.cost.launches,
                w.cost.open_for.as_secs_f64(),
                if w.closed_early { " (all at L)" } else { "" },
                w.probe_time.as_secs_f64(),
                w.cost
                    .process_cpu
                    .map_or("unknown".to_string(), |c| format!(
                        "{:.3} s",
                        c.as_secs_f64()
                    )),
                w.gap.as_secs_f64()
            )?;
        }
        // The runs and the snippets' numbers are not padded to their columns' widths: these
        // lines were printed from JSON values, whose `Display` ignores widths, and are kept
        // byte for byte.
        for p in &self.bpf_stats {
            writeln!(
                f,
                "{:<36} {} runs, {:.0} ns per run",
                p.program, p.runs, p.ns_per_run
            )?;
        }
        for s in &self.snippets {
            writeln!(
                f,
                "pid {} window {}: {} launches, {} names, ended by {}, {}",
                s.pid,
                s.window,
                s.launches,
                s.names,
                s.end.name(),
                s.snippet_hash
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::schedule::WindowCost;

    fn summary() -> CaptureSummary {
        CaptureSummary {
            bpf_stats: vec![ProgramRuns {
                program: "cu_launch_kernel".into(),
                runs: 3462,
                run_time_ns: 1_274_335,
                ns_per_run: 368.09,
            }],
            libraries: vec!["/lib/a.so.1".into(), "/lib/b.so.1".into()],
            elapsed_s: 4.76,
            counts: Counts {
                events: 3690,
                launches: 3462,
                names: 194,
                exits: 34,
                sampled: 69,
                samples_with_values: 68,
                libraries_untrusted: 1,
                libraries_over_cap: 2,
                ..Counts::default()
            },
            drops: 3,
            beyond_limit: 0,
            counter_source: "test-standin-ring".into(),
            probe_cost: ProbeCost::ASSUMED,
            windows: vec![WindowRecord {
                index: 0,
                cost: WindowCost {
                    open_for: Duration::from_millis(4767),
                    launches: 3462,
                    process_cpu: None,
                },
                probe_time: Duration::from_millis(35),
                gap: Duration::from_secs(2),
                closed_early: true,
            }],
            events_per_s: 775.2,
            snippets: vec![SnippetSummary {
                pid: 8260,
                window: 0,
                launches: 3462,
                unnamed: 0,
                identified: 0,
                shapes: 0,
                names: 194,
                end: SnippetEnd::Exit,
                snippet_hash: "8468".into(),
                first_names: vec!["k".into()],
                all_names: None,
                samples: vec![SampleSummary {
                    position: 1,
                    kernel: "k".into(),
                    group: 2,
                    values: BTreeMap::from([
                        ("achieved_occupancy".to_string(), Some(19.0)),
                        ("?".to_string(), None),
                    ]),
                }],
            }],
            launch_log: None,
            launch_log_beyond_limit: 0,
        }
    }

    /// The text form, line by line as the command has always printed it.
    #[test]
    fn the_text_form_is_kept_byte_for_byte() {
        assert_eq!(
            summary().to_string(),
            "libraries: /lib/a.so.1, /lib/b.so.1; not probed: 1 root does not control, 2 over the cap\n\
             3690 events (3462 launches, 194 names, 34 exits) in 4.8 s; 3 dropped\n\
             69 sampled launches, 68 with counter values from test-standin-ring; probe cost 10µs per launch\n\
             window   0:    3462 launches in    4.767 s (all at L), probe time 0.035 s, processes' CPU unknown, then 2 s closed\n\
             cu_launch_kernel                     3462 runs, 368 ns per run\n\
             pid 8260 window 0: 3462 launches, 194 names, ended by exit, 8468\n"
        );
    }

    /// What `capture --json` prints reads back as the same summary, under the field names
    /// readers (the GPU check's comparison, the capture bench) look up.
    #[test]
    fn the_json_form_round_trips_under_its_field_names() {
        let summary = summary();
        let json = serde_json::to_string_pretty(&summary).unwrap();
        let back: CaptureSummary = serde_json::from_str(&json).unwrap();
        assert_eq!(back, summary);
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["counts"]["launches"], 3462);
        assert_eq!(value["probe_cost"]["per_launch"]["nanos"], 10_000);
        assert_eq!(value["bpf_stats"][0]["run_time_ns"], 1_274_335);
        assert_eq!(value["snippets"][0]["end"], "exit");
        assert_eq!(value["snippets"][0]["all_names"], serde_json::Value::Null);
        assert_eq!(
            value["snippets"][0]["samples"][0]["values"]["?"],
            serde_json::Value::Null
        );
        assert_eq!(value["launch_log"], serde_json::Value::Null);
        let mut keys: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "beyond_limit",
                "bpf_stats",
                "counter_source",
                "counts",
                "drops",
                "elapsed_s",
                "events_per_s",
                "launch_log",
                "launch_log_beyond_limit",
                "libraries",
                "probe_cost",
                "snippets",
                "windows"
            ]
        );
    }

    #[test]
    fn bad_options_name_themselves_and_only_missing_prerequisites_are_unavailable() {
        let e = Duration::try_from_secs_f64(-1.0).map_err(|source| CaptureRunError::Duration {
            option: "seconds",
            value: -1.0,
            source,
        });
        let e = e.unwrap_err();
        assert_eq!(e.to_string(), "--seconds -1");
        assert!(std::error::Error::source(&e).is_some());
        assert!(!e.is_missing_prerequisite());
        assert_eq!(
            CaptureRunError::Budget(200.0).to_string(),
            "--budget 200: must be above 0 and at most 100"
        );
    }
}
