//! Opening, decompressing and parsing one trace file.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use flate2::read::MultiGzDecoder;
use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer};
use serde_json::Value;

use crate::error::TraceError;
use crate::kernel::{CorrelationId, DeviceId, Kernel, ProcessId, StreamId};
use crate::trace::Trace;

/// The gzip magic number; compressed traces are recognised by content, not only by extension.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Whether a runtime or driver call's name is a graph launch: `cudaGraphLaunch`,
/// `cuGraphLaunch` and their per-thread-stream (`_ptsz`) and versioned forms.
pub fn is_graph_launch(name: &str) -> bool {
    name.starts_with("cudaGraphLaunch") || name.starts_with("cuGraphLaunch")
}

/// Event categories whose `args.correlation` marks the host-side launch of a GPU activity.
const LAUNCH_CATEGORIES: [&str; 3] = ["cuda_runtime", "cuda_driver", "runtime"];

/// Reads a `.json` or `.json.gz` profiler trace.
pub fn read_trace(path: &Path) -> Result<Trace, TraceError> {
    let bytes = std::fs::read(path).map_err(|source| TraceError::Io {
        path: path.to_owned(),
        source,
    })?;
    read_trace_bytes(path, &bytes)
}

/// Parses a trace already in memory; `path` only names it in errors and in [`Trace::path`].
pub fn read_trace_bytes(path: &Path, bytes: &[u8]) -> Result<Trace, TraceError> {
    let json = if bytes.starts_with(&GZIP_MAGIC) {
        let mut out = Vec::with_capacity(bytes.len() * 8);
        MultiGzDecoder::new(bytes)
            .read_to_end(&mut out)
            .map_err(|source| TraceError::Gzip {
                path: path.to_owned(),
                source,
            })?;
        out
    } else {
        bytes.to_vec()
    };
    parse(path, &json)
}

/// The top level: Kineto writes an object with `traceEvents`; the Chrome trace format also
/// allows a bare array of events.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawFile {
    Object {
        #[serde(rename = "traceEvents")]
        trace_events: Option<Vec<RawEvent>>,
    },
    Array(Vec<RawEvent>),
}

#[derive(Deserialize)]
struct RawEvent {
    #[serde(default, deserialize_with = "lenient")]
    cat: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    name: Option<String>,
    #[serde(default, deserialize_with = "lenient_id")]
    pid: Option<i64>,
    #[serde(default, deserialize_with = "lenient_id")]
    tid: Option<i64>,
    #[serde(default, deserialize_with = "lenient")]
    ts: Option<f64>,
    #[serde(default, deserialize_with = "lenient")]
    dur: Option<f64>,
    #[serde(default, deserialize_with = "lenient")]
    args: Option<RawArgs>,
}

#[derive(Deserialize)]
struct RawArgs {
    #[serde(default, deserialize_with = "lenient_id")]
    stream: Option<i64>,
    #[serde(default, deserialize_with = "lenient_id")]
    device: Option<i64>,
    #[serde(default, deserialize_with = "lenient_id")]
    correlation: Option<i64>,
    #[serde(default, deserialize_with = "lenient")]
    grid: Option<[u32; 3]>,
    #[serde(default, deserialize_with = "lenient")]
    block: Option<[u32; 3]>,
    #[serde(default, rename = "registers per thread", deserialize_with = "lenient")]
    registers_per_thread: Option<u32>,
    #[serde(default, rename = "shared memory", deserialize_with = "lenient")]
    shared_memory: Option<u64>,
    #[serde(
        default,
        rename = "est. achieved occupancy %",
        deserialize_with = "lenient"
    )]
    occupancy: Option<f64>,
    #[serde(default, rename = "blocks per SM", deserialize_with = "lenient")]
    blocks_per_sm: Option<f64>,
}

/// Fields of events we do not interpret (CPU ops, annotations) vary between profiler versions;
/// a value of an unexpected type is treated as absent rather than failing the whole file.
fn lenient<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<Option<T>, D::Error> {
    let value = Value::deserialize(d)?;
    Ok(serde_json::from_value(value).ok())
}

/// Ids are numbers in Kineto but strings in some exporters (`"7"`, or a label).
fn lenient_id<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    })
}

fn parse(path: &Path, json: &[u8]) -> Result<Trace, TraceError> {
    let events = events(path, json)?;
    let launches = launches(&events);
    let kernels = kernels(path, events, &launches)?;
    Ok(Trace::new(path.to_owned(), kernels))
}

/// The file's events, or why it holds none: not JSON, JSON of another shape, or no
/// `traceEvents`.
fn events(path: &Path, json: &[u8]) -> Result<Vec<RawEvent>, TraceError> {
    let raw: RawFile = serde_json::from_slice(json).map_err(|source| {
        if source.is_data() {
            // Valid JSON of the wrong shape: most often a file that is not a trace at all.
            match serde_json::from_slice::<Value>(json) {
                Ok(Value::Object(map)) if !map.contains_key("traceEvents") => {
                    TraceError::NoTraceEvents {
                        path: path.to_owned(),
                    }
                }
                _ => TraceError::MalformedEvents {
                    path: path.to_owned(),
                    source,
                },
            }
        } else {
            TraceError::NotJson {
                path: path.to_owned(),
                source,
            }
        }
    })?;
    match raw {
        RawFile::Object {
            trace_events: Some(events),
        }
        | RawFile::Array(events) => Ok(events),
        RawFile::Object { trace_events: None } => Err(TraceError::NoTraceEvents {
            path: path.to_owned(),
        }),
    }
}

/// A host-side launch of a GPU activity.
#[derive(Clone, Copy)]
struct Launch {
    /// When it was called.
    ts_us: f64,
    /// The launching process.
    pid: Option<i64>,
    /// Whether it launched a CUDA graph.
    graph: bool,
}

/// The launches by correlation id (the first event of each id).
fn launches(events: &[RawEvent]) -> HashMap<i64, Launch> {
    let mut launches: HashMap<i64, Launch> = HashMap::new();
    for event in events {
        let is_launch = event
            .cat
            .as_deref()
            .is_some_and(|cat| LAUNCH_CATEGORIES.contains(&cat));
        if let (true, Some(ts), Some(corr)) = (
            is_launch,
            event.ts,
            event.args.as_ref().and_then(|a| a.correlation),
        ) {
            let graph = event.name.as_deref().is_some_and(is_graph_launch);
            launches.entry(corr).or_insert(Launch {
                ts_us: ts,
                pid: event.pid,
                graph,
            });
        }
    }
    launches
}

/// The kernel events, in order, each joined to its launch; a kernel event without a name or
/// a time stamp fails the file.
fn kernels(
    path: &Path,
    events: Vec<RawEvent>,
    launches: &HashMap<i64, Launch>,
) -> Result<Vec<Kernel>, TraceError> {
    let mut names: HashMap<String, Arc<str>> = HashMap::new();
    let mut kernels = Vec::new();
    // Kernel events carry the device as `pid`; remember which launching processes each such
    // pid maps to, so that kernels without a linked launch join their process when it is
    // unambiguous.
    let mut event_pids = Vec::new();
    let mut launchers: HashMap<Option<i64>, Vec<i64>> = HashMap::new();
    for (index, mut event) in events.into_iter().enumerate() {
        if event.cat.as_deref() != Some("kernel") {
            continue;
        }
        let missing = |field| TraceError::KernelMissingField {
            path: path.to_owned(),
            index,
            field,
        };
        let name = event.name.take().ok_or_else(|| missing("name"))?;
        let ts_us = event.ts.ok_or_else(|| missing("ts"))?;
        let name = names
            .entry(name)
            .or_insert_with_key(|name| Arc::from(name.as_str()))
            .clone();
        let correlation = event.args.as_ref().and_then(|a| a.correlation);
        let launch = correlation.and_then(|c| launches.get(&c).copied());
        if let Some(pid) = launch.and_then(|l| l.pid) {
            let seen = launchers.entry(event.pid).or_default();
            if !seen.contains(&pid) {
                seen.push(pid);
            }
        }
        event_pids.push((event.pid, launch.is_some()));
        kernels.push(kernel(event, name, ts_us, launch));
    }
    for (kernel, (event_pid, linked)) in kernels.iter_mut().zip(event_pids) {
        if let (false, Some([only])) = (linked, launchers.get(&event_pid).map(Vec::as_slice)) {
            kernel.process = ProcessId(*only);
        }
    }
    Ok(kernels)
}

/// A kernel event (its `name` and `ts_us` already taken out of it) with its `launch`, if
/// linked: its process is the launcher's, else the event's own `pid`.
fn kernel(event: RawEvent, name: Arc<str>, ts_us: f64, launch: Option<Launch>) -> Kernel {
    let args = event.args;
    Kernel {
        name,
        ts_us,
        dur_us: event.dur.unwrap_or(0.0),
        launch_ts_us: launch.map(|l| l.ts_us),
        graph_launch: launch.is_some_and(|l| l.graph),
        process: ProcessId(launch.and_then(|l| l.pid).or(event.pid).unwrap_or(0)),
        stream: args
            .as_ref()
            .and_then(|a| a.stream)
            .or(event.tid)
            .map(StreamId),
        device: args.as_ref().and_then(|a| a.device).map(DeviceId),
        correlation: args.as_ref().and_then(|a| a.correlation).map(CorrelationId),
        grid: args.as_ref().and_then(|a| a.grid),
        block: args.as_ref().and_then(|a| a.block),
        registers_per_thread: args.as_ref().and_then(|a| a.registers_per_thread),
        shared_memory_bytes: args.as_ref().and_then(|a| a.shared_memory),
        est_achieved_occupancy_pct: args.as_ref().and_then(|a| a.occupancy),
        blocks_per_sm: args.as_ref().and_then(|a| a.blocks_per_sm),
    }
}
