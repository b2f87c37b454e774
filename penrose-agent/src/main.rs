//! `penrose-agent`: parses the command line (its definition is `penrose_agent::cli`) and runs it.

use std::collections::HashSet;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use penrose_agent::capture::launch_log::{LoggedLaunch, MAX_LOGGED_LAUNCHES};
use penrose_agent::capture::loader::enable_run_stats;
use penrose_agent::capture::locate::LibrarySources;
use penrose_agent::capture::schedule::{BudgetConfig, OverheadBudget, Schedule};
use penrose_agent::capture::{Capture, CaptureConfig, CaptureError};
use penrose_agent::cli::{Cli, Command};
use penrose_agent::config::{self, AgentConfig, ConfigError};
use penrose_agent::daemon::{DaemonError, RunOutcome};
use penrose_agent::record::read_records;
use penrose_agent::status::AgentStatus;
use penrose_core::counters::Catalogue;
use penrose_core::fingerprint::{FingerprintParams, Fingerprinter};
use penrose_core::sampling::SamplePeriod;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            // The capture's start-up settings and warnings are worth seeing without RUST_LOG.
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            let missing = e
                .downcast_ref::<CaptureError>()
                .is_some_and(CaptureError::is_missing_prerequisite)
                || e.downcast_ref::<DaemonError>()
                    .is_some_and(DaemonError::is_missing_prerequisite);
            let bad_config = e.downcast_ref::<ConfigError>().is_some();
            ExitCode::from(if missing {
                3
            } else if bad_config {
                4
            } else {
                1
            })
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Run { config } => daemon_run(&config),
        Command::Status { config, json } => status(&config, json),
        Command::Inspect { config, json } => inspect(&config, json),
        Command::Config {
            print_default,
            check,
        } => match (print_default, check) {
            (_, Some(path)) => {
                let config = AgentConfig::load(&path)?;
                println!(
                    "{}: valid (state directory {}, aggregator {}, {})",
                    path.display(),
                    config.state_dir.display(),
                    config.aggregator.address,
                    if config.enabled {
                        "enabled"
                    } else {
                        "disabled"
                    }
                );
                let c = &config.capture;
                if c.source.is_test_equipment() || c.counters.is_test_equipment() {
                    println!(
                        "warning: test equipment configured (capture.source = {:?}, capture.counters = {:?}): for tests and the demo, never a production host",
                        c.source.name(),
                        c.counters.name()
                    );
                }
                Ok(())
            }
            (true, None) => {
                print!("{}", config::DEFAULT_FILE);
                Ok(())
            }
            (false, None) => anyhow::bail!("give --print-default or --check FILE"),
        },
        Command::Fingerprint {
            trace,
            window,
            per_stream,
            json,
        } => fingerprint(&trace, window, per_stream, json),
        Command::Catalogue { json } => catalogue(json),
        Command::Capture {
            seconds,
            window_launches,
            lib,
            only_lib,
            allow_untrusted_libs,
            max_libraries,
            window_seconds,
            period_seconds,
            budget,
            max_window_seconds,
            min_gap_seconds,
            max_gap_seconds,
            sample_period,
            counters,
            group_seconds,
            no_calibrate,
            seed,
            poll_ms,
            bpf_stats,
            json,
            all_names,
            launches,
        } => {
            let secs = |s: f64, what: &str| {
                Duration::try_from_secs_f64(s).with_context(|| format!("--{what} {s}"))
            };
            let total = secs(seconds, "seconds")?;
            let sample_period = std::num::NonZeroU32::new(sample_period)
                .map(SamplePeriod)
                .context("--sample-period must be at least 1")?;
            let config = CaptureConfig {
                sources: LibrarySources {
                    explicit: lib,
                    ldconfig: !only_lib,
                    proc_maps: !only_lib,
                    allow_untrusted: allow_untrusted_libs,
                },
                max_libraries: max_libraries.max(1),
                window_launches,
                poll_interval: Duration::from_millis(poll_ms),
                sample_period,
                group_period: secs(group_seconds, "group-seconds")?,
                counters,
                calibrate: !no_calibrate,
                seed,
                ..CaptureConfig::default()
            };
            let mut capture = Capture::start(config)?;
            if launches {
                capture.log_launches(MAX_LOGGED_LAUNCHES);
            }
            let schedule = match budget {
                Some(percent) => Schedule::Budget {
                    config: BudgetConfig {
                        budget: OverheadBudget::new(percent / 100.0).with_context(|| {
                            format!("--budget {percent}: must be above 0 and at most 100")
                        })?,
                        max_window: secs(max_window_seconds, "max-window-seconds")?,
                        min_gap: secs(min_gap_seconds, "min-gap-seconds")?,
                        max_gap: secs(max_gap_seconds, "max-gap-seconds")?,
                    },
                    cost: capture.probe_cost(),
                },
                None => Schedule::Fixed {
                    duration: secs(window_seconds.unwrap_or(seconds), "window-seconds")?,
                    period: secs(period_seconds.unwrap_or(seconds), "period-seconds")?,
                },
            };
            run_capture(&mut capture, total, &schedule, bpf_stats, json, all_names)
        }
    }
}

fn fingerprint(path: &Path, window: usize, per_stream: bool, json: bool) -> Result<()> {
    anyhow::ensure!(window > 0, "--window must be at least 1");
    let trace = penrose_traces::read_trace(path)?;
    let fingerprinter = Fingerprinter::new(FingerprintParams::default())?;
    let sequences: Vec<(String, Vec<&str>)> = if per_stream {
        trace
            .stream_sequences()
            .into_iter()
            .map(|((pid, stream), ks)| {
                let label = format!("pid {} stream {}", pid.0, stream.0);
                (label, ks.iter().map(|k| &*k.name).collect())
            })
            .collect()
    } else {
        trace
            .process_sequences()
            .into_iter()
            .map(|(pid, ks)| {
                (
                    format!("pid {}", pid.0),
                    ks.iter().map(|k| &*k.name).collect(),
                )
            })
            .collect()
    };
    let mut out = Vec::new();
    for (label, names) in &sequences {
        let mut first = None;
        for (index, chunk) in names.chunks(window).enumerate() {
            let hash = fingerprinter.snippet_hash(chunk);
            let first = *first.get_or_insert(hash);
            out.push(serde_json::json!({
                "sequence": label,
                "window": index,
                "launches": chunk.len(),
                "snippet_hash": hash.to_string(),
                "similarity_to_first": fingerprinter.similarity(&first, &hash),
            }));
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let params = fingerprinter.params();
    println!(
        "{}: {} kernels; {}-grams, k = {}, {:?} MinHash, tau = {}",
        path.display(),
        trace.kernels().len(),
        params.ngram_len,
        params.num_hashes,
        params.weighting,
        params.tau
    );
    for row in &out {
        println!(
            "{:<24} window {:>3} ({:>5} launches)  {}  sim to first {:.2}",
            row["sequence"].as_str().unwrap_or_default(),
            row["window"],
            row["launches"],
            row["snippet_hash"].as_str().unwrap_or_default(),
            row["similarity_to_first"].as_f64().unwrap_or_default()
        );
    }
    Ok(())
}

fn run_capture(
    capture: &mut Capture,
    total: Duration,
    schedule: &Schedule,
    bpf_stats: bool,
    json: bool,
    all_names: bool,
) -> Result<()> {
    let fingerprinter = Fingerprinter::new(FingerprintParams::default())?;
    let catalogue = Catalogue::current();
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
    let stop = penrose_agent::signal::stop_on_signals().context("installing signal handlers")?;
    capture.run_until(total, schedule, stop)?;
    let elapsed = started.elapsed().as_secs_f64();
    let snippets: Vec<_> = capture
        .take_snippets()
        .into_iter()
        .map(|s| {
            let distinct: HashSet<&str> = s.names.iter().map(|n| &**n).collect();
            serde_json::json!({
                "pid": s.pid.0,
                "window": s.window,
                "launches": s.names.len(),
                "unnamed": s.unnamed,
                "identified": s.identified,
                "tokens": s.tokens.len(),
                "names": distinct.len(),
                "end": s.end,
                "snippet_hash": s.snippet_hash(&fingerprinter).to_string(),
                "first_names": s.names.iter().take(5).map(|n| &**n).collect::<Vec<_>>(),
                "all_names": all_names.then(|| s.names.iter().map(|n| &**n).collect::<Vec<_>>()),
                "samples": s.samples.iter().map(|sample| serde_json::json!({
                    "position": sample.position,
                    "kernel": &*sample.kernel,
                    "group": sample.group.0,
                    "values": sample.values.iter().map(|v| {
                        let name = catalogue.counter(v.counter).map_or("?", |c| c.name);
                        (name.to_string(), serde_json::json!(v.value))
                    }).collect::<serde_json::Map<_, _>>(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let counts = capture.counts();
    let drops = capture.drops()?;
    let libraries: Vec<_> = capture
        .libraries()
        .iter()
        .map(|l| l.path.display().to_string())
        .collect();
    let programs: Vec<_> = capture
        .run_stats()
        .into_iter()
        .filter(|p| bpf_stats && p.runs > 0)
        .map(|p| {
            serde_json::json!({
                "program": p.program,
                "runs": p.runs,
                "run_time_ns": p.run_time.as_nanos() as u64,
                "ns_per_run": p.run_time.as_nanos() as f64 / p.runs as f64,
            })
        })
        .collect();
    if json {
        let log = capture.launch_log();
        let doc = serde_json::json!({
            "bpf_stats": programs,
            "libraries": libraries,
            "elapsed_s": elapsed,
            "counts": counts,
            "drops": drops,
            "beyond_limit": capture.beyond_limit(),
            "counter_source": capture.counter_source(),
            "probe_cost": capture.probe_cost(),
            "windows": capture.history(),
            "events_per_s": counts.events as f64 / elapsed.max(f64::MIN_POSITIVE),
            "snippets": snippets,
            "launch_log": log.is_on().then(|| log.launches().iter().map(LoggedLaunch::to_json).collect::<Vec<_>>()),
            "launch_log_beyond_limit": log.beyond_limit(),
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!(
        "libraries: {}; not probed: {} root does not control, {} over the cap",
        libraries.join(", "),
        counts.libraries_untrusted,
        counts.libraries_over_cap
    );
    println!(
        "{} events ({} launches, {} names, {} exits) in {elapsed:.1} s; {drops} dropped",
        counts.events, counts.launches, counts.names, counts.exits
    );
    println!(
        "{} sampled launches, {} with counter values from {}; probe cost {:?} per launch",
        counts.sampled,
        counts.samples_with_values,
        capture.counter_source(),
        capture.probe_cost().per_launch
    );
    for w in capture.history() {
        println!(
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
        );
    }
    for p in &programs {
        println!(
            "{:<36} {:>9} runs, {:.0} ns per run",
            p["program"].as_str().unwrap_or_default(),
            p["runs"],
            p["ns_per_run"].as_f64().unwrap_or_default()
        );
    }
    for s in &snippets {
        println!(
            "pid {:>7} window {:>3}: {:>6} launches, {:>4} names, ended by {}, {}",
            s["pid"],
            s["window"],
            s["launches"],
            s["names"],
            s["end"].as_str().unwrap_or_default(),
            s["snippet_hash"].as_str().unwrap_or_default(),
        );
    }
    Ok(())
}

fn catalogue(json: bool) -> Result<()> {
    let catalogue = Catalogue::current();
    if json {
        let counters: Vec<_> = catalogue
            .counters
            .iter()
            .map(|c| {
                serde_json::json!({
                    "id": c.id.0, "name": c.name, "unit": c.unit.suffix(),
                    "group": c.group.0, "binning": format!("{:?}", c.binning),
                    "description": c.description,
                })
            })
            .collect();
        let doc = serde_json::json!({"version": catalogue.version.0, "counters": counters});
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).context("encoding JSON")?
        );
        return Ok(());
    }
    println!("counter catalogue version {}", catalogue.version.0);
    for c in catalogue.counters {
        println!(
            "{:>3}  {:<22} group {}  {:<4} {:?}\n     {}",
            c.id.0,
            c.name,
            c.group.0,
            c.unit.suffix(),
            c.binning,
            c.description
        );
    }
    Ok(())
}

fn daemon_run(path: &Path) -> Result<()> {
    let config = AgentConfig::load(path)?;
    if !config.enabled {
        tracing::info!(
            "penrose-agent is disabled by {} (enabled = false): nothing is captured or sent",
            path.display()
        );
        return Ok(());
    }
    // Before any thread exists: capabilities are per thread, and threads inherit them.
    if penrose_agent::capture::loader::is_root() {
        let kept = penrose_agent::privilege::keep_only_capture_capabilities()
            .context("dropping the capabilities capture does not need")?;
        tracing::info!(
            "capabilities: kept {:#x} (BPF, PERFMON, SYS_ADMIN, SYS_PTRACE, DAC_READ_SEARCH), \
             {} removed from the bounding set, no_new_privs set",
            kept.permitted,
            kept.dropped_from_bounding
        );
    }
    let signals = penrose_agent::signal::stop_on_signals().context("installing signal handlers")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let outcome = runtime.block_on(async {
        let watcher = {
            let stop = stop.clone();
            tokio::spawn(async move {
                while !signals.load(std::sync::atomic::Ordering::Relaxed)
                    && !stop.load(std::sync::atomic::Ordering::Relaxed)
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            })
        };
        let r = penrose_agent::daemon::run(config, stop.clone()).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = watcher.await;
        r
    })?;
    if let RunOutcome::Stopped(status) = outcome {
        tracing::info!(
            "stopped: {} windows, {} histograms sealed, {} delivered, {} still spooled",
            status.windows,
            status.pipeline.sealed,
            status.uploads.accepted + status.uploads.duplicate,
            status.spool.reports
        );
    }
    Ok(())
}

fn status(path: &Path, json: bool) -> Result<()> {
    let config = AgentConfig::load(path)?;
    let s = AgentStatus::read(&config.state_dir).map_err(anyhow::Error::msg)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    println!(
        "agent pid {} ({}), source {} (counters: {})",
        s.pid,
        if s.running { "running" } else { "stopped" },
        s.source.kind,
        s.source.counters
    );
    match (&s.arch, &s.source.gpu_arch) {
        (Some(arch), Some(read)) => println!(
            "GPU architecture: {read}; reports name its generation {arch} (the major version only)"
        ),
        (Some(arch), None) => println!("GPU architecture: reports name {arch}"),
        (None, _) => println!("GPU architecture: none (no counter values, so no reports)"),
    }
    if s.source.kind == "ebpf" {
        println!(
            "libraries probed: {}; not probed: {} root does not control, {} over capture.max_libraries",
            s.source.inputs.len(),
            s.source.libraries_untrusted,
            s.source.libraries_over_cap
        );
    }
    println!(
        "windows: {} ({} launches), probe time {:.3} s, probe overhead {} (budget {}%)",
        s.windows,
        s.launches,
        s.probe_s,
        s.probe_overhead_percent
            .map_or("unknown".into(), |p| format!("{p:.4}%")),
        s.budget_percent
    );
    println!(
        "pipeline: {} snippets, {} samples, {} local applications, {} open histograms, {} sealed",
        s.pipeline.snippets,
        s.pipeline.samples,
        s.pipeline.local_apps,
        s.pipeline.open_histograms,
        s.pipeline.sealed
    );
    println!(
        "report cap: {} histograms held until the next day, {} samples and {} histograms dropped over the cap",
        s.pipeline.held_over_cap, s.pipeline.samples_over_cap, s.pipeline.histograms_over_cap
    );
    println!(
        "spool: {} reports, {} of {} bytes; {} dropped when full, {} write failures",
        s.spool.reports,
        s.spool.bytes,
        s.spool.max_bytes,
        s.spool.counts.dropped,
        s.spool.counts.write_failures
    );
    println!(
        "uploads: {} accepted, {} duplicate, {} rejected, {} overloaded, {} held for a new class, {} failed; server {}, throttle {}/1000{}",
        s.uploads.accepted,
        s.uploads.duplicate,
        s.uploads.rejected,
        s.uploads.overloaded,
        s.uploads.new_class_limit,
        s.uploads.failed,
        if s.uploads.server_reachable {
            "reachable"
        } else {
            "not reached"
        },
        s.uploads.throttle_permille,
        s.uploads
            .last_error
            .as_ref()
            .map_or(String::new(), |e| format!("; last error: {e}"))
    );
    let t = &s.tokens;
    if t.configured || t.token_required > 0 {
        println!(
            "admission tokens: {}; {} fetches ({} failed), {} received, {} spent, {} discarded, \
             {} reports re-stamped to today, {} reports waiting for one, {} TokenRequired acks, \
             {} partition warnings{}",
            if t.configured {
                "configured"
            } else {
                "NOT configured, and the server requires them"
            },
            t.fetches,
            t.fetch_failures,
            t.issued,
            t.spent,
            t.discarded,
            t.restamped,
            t.waiting,
            t.token_required,
            t.partition_warnings,
            t.last_fetch_error
                .as_ref()
                .map_or(String::new(), |e| format!("; last fetch: {e}"))
        );
        print_token_counts(&t.held);
    }
    if let Some(e) = &s.last_error {
        println!("last error: {e}");
    }
    Ok(())
}

/// Tokens held per (day, counter): counts only, never a token.
fn print_token_counts(held: &[penrose_agent::tokens::TokenCount]) {
    let catalogue = Catalogue::current();
    for c in held {
        let name = catalogue
            .counter(penrose_core::counters::CounterId(c.scope))
            .map_or("?", |counter| counter.name);
        println!(
            "  day {} counter {} ({name}): {} unspent, {} attached to a report in flight",
            c.epoch, c.scope, c.unspent, c.in_flight
        );
    }
}

fn inspect(path: &Path, json: bool) -> Result<()> {
    let config = AgentConfig::load(path)?;
    let spooled: HashSet<_> =
        penrose_agent::spool::list_ids(&penrose_agent::daemon::spool_dir(&config.state_dir))?
            .into_iter()
            .collect();
    // The day each spooled report carries now (a report re-stamped to another day for want of
    // an admission token carries that day, not the one it was sealed on).
    let days =
        penrose_agent::spool::spooled_days(&penrose_agent::daemon::spool_dir(&config.state_dir))?;
    let mut restamped = HashSet::new();
    let records: Vec<_> =
        read_records(penrose_agent::record::RecordLog::in_state_dir(&config.state_dir).path())?
            .into_iter()
            .filter(|r| spooled.contains(&r.report_id))
            .map(|mut r| {
                if let Some(day) = days.get(&r.report_id)
                    && day.0 != r.day
                {
                    restamped.insert(r.report_id);
                    r.day = day.0;
                }
                r
            })
            .collect();
    if json {
        println!("{}", serde_json::to_string_pretty(&records)?);
        return Ok(());
    }
    let catalogue = Catalogue::current();
    println!(
        "{} reports waiting to be sent; each carries only what is shown here, encrypted \
         (the bins), plus the snippet hash, counter, GPU generation (the compute capability's \
         major version), sample count and day in clear{}.",
        records.len(),
        if config.admission.is_configured() {
            ", and an anonymous admission token of that day and counter (a key id every agent \
             shares for them, a random nonce and a tag binding it to the report)"
        } else {
            ""
        }
    );
    let held =
        penrose_agent::tokens::read_counts(&penrose_agent::tokens::token_dir(&config.state_dir))?;
    if !held.is_empty() {
        println!("admission tokens held (counts only; the tokens are secrets):");
        print_token_counts(&held);
    }
    for r in &records {
        println!(
            "\nreport {}  snippet {}  {} on {} ({} samples, day {}{}, sealed by {:?})",
            r.report_id,
            r.snippet,
            r.counter_name,
            if r.arch.is_empty() {
                "unknown"
            } else {
                &r.arch
            },
            r.samples,
            r.day,
            if restamped.contains(&r.report_id) {
                ", re-stamped for want of a token of the day it was sealed on"
            } else {
                ""
            },
            r.reason
        );
        let binning = catalogue
            .counter(penrose_core::counters::CounterId(r.counter))
            .map(|c| (c.binning, c.unit.suffix()));
        for (i, &count) in r.bins.iter().enumerate() {
            if count == 0 {
                continue;
            }
            let range = binning
                .as_ref()
                .and_then(|(b, unit)| {
                    penrose_core::counters::Bin::new(i).map(|bin| {
                        let (lo, hi) = b.edges(bin);
                        format!("[{lo:.3}, {hi:.3}) {unit}")
                    })
                })
                .unwrap_or_default();
            println!("  bin {i:>3} {range:<32} {count}");
        }
    }
    Ok(())
}
