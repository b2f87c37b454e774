//! What the fleet replays: the trace folder, or without one a small synthetic workload.

use std::path::{Path, PathBuf};

use anyhow::{Result, ensure};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::Options;

/// The traces of a run.
pub(super) struct Workload {
    /// What was replayed, in words.
    pub describe: String,
    /// Their folder.
    pub traces: PathBuf,
}

/// The trace folder of `options`, or three synthetic applications written in `dir`; said on
/// screen, with how time is compressed.
pub(super) fn prepare(options: &Options, dir: &Path) -> Result<Workload> {
    let workload = match &options.traces {
        Some(folder) => {
            let files = penrose_traces::TraceFolder::open(folder)?.files().to_vec();
            ensure!(!files.is_empty(), "no traces in {}", folder.display());
            Workload {
                describe: format!("{} real traces in {}", files.len(), folder.display()),
                traces: folder.clone(),
            }
        }
        None => {
            let folder = dir.join("synthetic-traces");
            write_synthetic_traces(&folder)?;
            Workload {
                describe: "3 synthetic applications (no trace folder found)".to_string(),
                traces: folder,
            }
        }
    };
    options.say(&format!("workload: {}", workload.describe));
    options.say(
        "compressed time: L = 2,000 launches per window (design: 10,000), 1 launch in 20 sampled \
         (1,000), histograms sealed at 40 samples or 1 s (10,000 or 300 s) and at most 24 per counter and day as in the design, windows of at most 2 s \
         at least 0.3 s apart under a 100% budget (0.02%), uploads after a random delay of at most 5 ms (60 s), \
         a failed admission token fetch tried again after 1 s (600 s)",
    );
    Ok(workload)
}

/// Three synthetic applications as profiler traces, each a loop over its own kernels with
/// trace-like per-kernel fields, for machines without the real traces.
pub(super) fn write_synthetic_traces(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed);
    for app in 0..3 {
        let vocabulary: Vec<String> = (0..40)
            .map(|k| format!("synthetic_app{app}_kernel_{k}"))
            .collect();
        let iteration: Vec<usize> = (0..300)
            .map(|_| rng.random_range(0..vocabulary.len()))
            .collect();
        let mut events = Vec::new();
        let mut ts = 0.0f64;
        for (correlation, &k) in iteration.iter().cycle().take(6_000).enumerate() {
            let dur = rng.random_range(2.0..2_000.0f64);
            events.push(serde_json::json!({
                "ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                "pid": 100 + app, "tid": 1, "ts": ts, "dur": 3.0,
                "args": {"correlation": correlation},
            }));
            events.push(serde_json::json!({
                "ph": "X", "cat": "kernel", "name": vocabulary[k],
                "pid": 0, "tid": 7, "ts": ts + 5.0, "dur": dur,
                "args": {
                    "correlation": correlation, "stream": 7, "device": 0,
                    "grid": [rng.random_range(1..1024u32), 1, 1], "block": [128, 1, 1],
                    "registers per thread": rng.random_range(16..128u32),
                    "shared memory": rng.random_range(0..49_152u32),
                    "est. achieved occupancy %": rng.random_range(5.0..100.0f64),
                    "blocks per SM": rng.random_range(0.1..64.0f64),
                },
            }));
            ts += 50.0;
        }
        let doc = serde_json::json!({ "traceEvents": events });
        std::fs::write(
            dir.join(format!("synthetic-app{app}.json")),
            doc.to_string(),
        )?;
    }
    Ok(())
}
