//! The `penrose-agent` command line: its clap definition, here in the library so that the
//! binary parses it and `cargo xtask dist` renders man pages and shell completions from it.

use std::path::PathBuf;

use clap::{Args, CommandFactory, Parser, Subcommand};
use penrose_core::sampling::DEFAULT_SAMPLE_PERIOD;

use crate::capture::locate::DEFAULT_MAX_LIBRARIES;
use crate::capture::window::DEFAULT_WINDOW_LAUNCHES;
use crate::config;
use crate::counters::SourceKind;

/// The clap command `penrose-agent` parses (man pages and completions are made from it).
pub fn command() -> clap::Command {
    Cli::command()
}

/// The Penrose agent: watches kernel launches on this machine's GPUs, fingerprints and samples
/// them, and ships only encrypted histograms.
///
/// `run` is the daemon (configured by /etc/penrose/agent.toml; `config --print-default` shows
/// every key); `status` and `inspect` show what it does and exactly what it will send;
/// `capture` runs the eBPF probes for a while and prints what they saw; `fingerprint` and
/// `catalogue` show, offline, the fingerprints it computes and the counters it samples.
///
/// Exit codes (every Penrose binary's): 0 success, 1 error, 2 usage, 3 refused (the
/// configuration file is invalid), 4 unavailable (a host prerequisite of capture is missing:
/// not root / no CAP_BPF, no kernel BTF, no tracefs, the kernel refused the eBPF object, or
/// the configured counter source, NVML/GPM by default, cannot be opened). The agent never falls back to test equipment (trace replay, the stand-in's
/// counter ring): those run only when a setting names them.
#[derive(Parser)]
#[command(version, about, long_about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands (each variant's doc comment is its help text; the type's own doc comment
/// is overridden by [`Cli`]'s).
#[derive(Subcommand)]
pub enum Command {
    /// Run the agent: capture windows, local applications, sealed and encrypted histograms,
    /// the spool and uploads, until SIGINT or SIGTERM.
    ///
    /// Each report (and each retry of it) is uploaded on a QUIC connection of its own, from a
    /// new UDP source port, with a full TLS handshake (no session resumption, no address
    /// token), closed after the ack, so that the aggregator cannot link this machine's reports
    /// by their connection.
    ///
    /// With `enabled = false` in the configuration it logs one line and exits 0 without
    /// capturing or sending. The source is the eBPF capture; when it cannot start (not root,
    /// no BTF, no NVML for the default counters) the agent exits with code 3 and does not
    /// replay or invent anything. Example:
    ///   penrose-agent run --config /etc/penrose/agent.toml
    Run {
        /// The configuration file.
        #[arg(long, default_value = config::DEFAULT_PATH)]
        config: PathBuf,
    },
    /// Show what the running (or last) daemon is doing: windows, probe overhead, spool,
    /// uploads (read from the status file in its state directory).
    Status {
        /// The configuration file (for the state directory).
        #[arg(long, default_value = config::DEFAULT_PATH)]
        config: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show exactly what will leave this machine: for every report still in the spool, its
    /// plaintext histogram (before encryption), counter and snippet hash.
    Inspect {
        /// The configuration file (for the state directory).
        #[arg(long, default_value = config::DEFAULT_PATH)]
        config: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the commented default configuration, or check a configuration file.
    ///
    ///   penrose-agent config --print-default > /etc/penrose/agent.toml
    ///   penrose-agent config --check /etc/penrose/agent.toml
    Config {
        /// Print the default file, every key with its default and what it does.
        #[arg(long, conflicts_with = "check")]
        print_default: bool,
        /// Check this file; errors name the key and the line.
        #[arg(long)]
        check: Option<PathBuf>,
    },
    /// Fingerprint a PyTorch profiler trace offline, as the agent would fingerprint the same
    /// launches captured live.
    ///
    /// Each process's launch sequence (or each stream's, with --per-stream) is cut into
    /// windows of L launches; each window's snippet hash is printed with its similarity to the
    /// sequence's first window. Example:
    ///   penrose-agent fingerprint ../shared/traces/hta-trace_diff--control--control.json.gz
    Fingerprint {
        /// A `.json` or `.json.gz` trace.
        trace: PathBuf,
        /// Launches per window (L).
        #[arg(long, default_value_t = 10_000)]
        window: usize,
        /// One sequence per CUDA stream instead of per process.
        #[arg(long)]
        per_stream: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Capture kernel launches for a while and print the snippets and samples (for debugging
    /// on the operator's own machine; needs root).
    ///
    /// Launch probes are attached only inside windows. By default one window covers the whole
    /// run; --window-seconds and --period-seconds give fixed windows; --budget spaces windows
    /// so that the measured probe cost stays under that share of the probed processes' CPU
    /// time (the daemon's default is 0.02%). The probe cost is measured at start unless
    /// --no-calibrate. One launch in --sample-period is sampled and its counters read from
    /// --counters. Examples:
    /// SIGINT or SIGTERM ends the run early; what was captured is still printed.
    ///   penrose-agent capture --seconds 10 --json
    ///   penrose-agent capture --seconds 600 --budget 0.02 --max-window-seconds 10
    Capture(CaptureArgs),
    /// List the counters the agent samples, their units and binning.
    Catalogue {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// The options of `capture` (its help text is [`Command::Capture`]'s): what
/// [`crate::capture_summary::capture`] runs with.
#[derive(Args)]
pub struct CaptureArgs {
    /// How long to run.
    #[arg(long)]
    pub seconds: f64,
    /// L: launches per process per window.
    #[arg(long, default_value_t = DEFAULT_WINDOW_LAUNCHES)]
    pub window_launches: usize,
    /// A libcuda to probe besides those ldconfig and running processes show (repeatable).
    #[arg(long)]
    pub lib: Vec<PathBuf>,
    /// Probe only the --lib paths (no ldconfig, no /proc/*/maps scan).
    #[arg(long)]
    pub only_lib: bool,
    /// Also probe libraries root does not control (not root's, writable by group or
    /// others, or in such a directory); by default they are counted and skipped.
    #[arg(long)]
    pub allow_untrusted_libs: bool,
    /// Most distinct library files probed.
    #[arg(long, default_value_t = DEFAULT_MAX_LIBRARIES)]
    pub max_libraries: usize,
    /// Window length; defaults to --seconds.
    #[arg(long)]
    pub window_seconds: Option<f64>,
    /// Time between window starts; defaults to --seconds.
    #[arg(long)]
    pub period_seconds: Option<f64>,
    /// Space windows by this overhead budget, in percent of the probed processes' CPU
    /// time (0.02 = 0.02%), instead of a fixed schedule.
    #[arg(long, conflicts_with_all = ["window_seconds", "period_seconds"])]
    pub budget: Option<f64>,
    /// With --budget: the longest a window stays open.
    #[arg(long, default_value_t = 10.0, requires = "budget")]
    pub max_window_seconds: f64,
    /// With --budget: the shortest gap between windows.
    #[arg(long, default_value_t = 60.0, requires = "budget")]
    pub min_gap_seconds: f64,
    /// With --budget: the longest gap between windows.
    #[arg(long, default_value_t = 21_600.0, requires = "budget")]
    pub max_gap_seconds: f64,
    /// S: sample one launch in this many (per CPU).
    #[arg(long, default_value_t = DEFAULT_SAMPLE_PERIOD.get())]
    pub sample_period: u32,
    /// Where sampled launches' counters come from. NVML/GPM by default; when it cannot be
    /// opened the capture fails (exit code 4). test-standin-ring is test equipment.
    #[arg(long, value_enum, default_value_t = SourceKind::Nvml)]
    pub counters: SourceKind,
    /// How long each counter group stays active, seconds.
    #[arg(long, default_value_t = 600.0)]
    pub group_seconds: f64,
    /// Skip the start-up probe-cost measurement (assume 10 us per launch).
    #[arg(long)]
    pub no_calibrate: bool,
    /// Seed of the sampling offsets (reproducible runs).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Reader's sleep when the ring is empty, milliseconds.
    #[arg(long, default_value_t = 1)]
    pub poll_ms: u64,
    /// Report each BPF program's runs and run time (turns on the kernel's BPF statistics
    /// for the run).
    #[arg(long)]
    pub bpf_stats: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// With --json, list every launch's kernel name in each snippet (to compare with a
    /// profiler on the operator's own machine; nothing like it ever leaves the agent).
    #[arg(long, requires = "json")]
    pub all_names: bool,
    /// With --json, also list every recorded launch in the order the agent read it
    /// (`launch_log`): pid, thread, time (CLOCK_MONOTONIC ns), window, driver entry point,
    /// name or identity as in the snippet, grid, block, dynamic shared memory and stream;
    /// at most 1,000,000 (for the same comparison; never sent).
    #[arg(long, requires = "json")]
    pub launches: bool,
}
