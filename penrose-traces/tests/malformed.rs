//! Malformed files give typed errors, never a panic or an empty trace.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;

use flate2::Compression;
use flate2::write::GzEncoder;
use penrose_traces::{TraceError, read_trace_bytes};

const GOOD: &str = r#"{"traceEvents": [
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 42, "tid": 1,
   "ts": 10, "dur": 2, "args": {"correlation": 7}},
  {"ph": "X", "cat": "kernel", "name": "b", "pid": 0, "tid": 7, "ts": 20, "dur": 3,
   "args": {"stream": 7, "device": 0, "correlation": 8, "grid": [1, 2, 3]}},
  {"ph": "X", "cat": "kernel", "name": "a", "pid": 0, "tid": 9, "ts": 15, "dur": 3,
   "args": {"stream": 9, "device": 0, "correlation": 7, "grid": [1, 2, 3]}},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 42, "tid": 1,
   "ts": 12, "dur": 2, "args": {"correlation": 8}}
]}"#;

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

fn read(bytes: &[u8]) -> Result<penrose_traces::Trace, TraceError> {
    read_trace_bytes(Path::new("t.json"), bytes)
}

#[test]
fn good_trace_plain_and_gzipped() {
    for bytes in [GOOD.as_bytes().to_vec(), gzip(GOOD.as_bytes())] {
        let trace = read(&bytes).unwrap();
        assert_eq!(trace.kernels().len(), 2);
        let seqs = trace.process_sequences();
        // Both kernels belong to the launching process 42 and are ordered by launch time.
        let names: Vec<_> = seqs[&penrose_traces::ProcessId(42)]
            .iter()
            .map(|k| &*k.name)
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(trace.stream_sequences().len(), 2);
    }
}

#[test]
fn launch_order_differs_from_execution_order_when_linked() {
    // Kernel "b" is launched at 12 after "a" at 10 but runs on another stream.
    let swapped = GOOD.replace("\"ts\": 15", "\"ts\": 25");
    let trace = read(swapped.as_bytes()).unwrap();
    let seq = &trace.process_sequences()[&penrose_traces::ProcessId(42)];
    assert_eq!(seq[0].name.as_ref(), "a");
    assert!(seq[0].ts_us > seq[1].ts_us);
}

#[test]
fn not_json() {
    assert!(matches!(read(b"hello"), Err(TraceError::NotJson { .. })));
    let cut = &GOOD.as_bytes()[..GOOD.len() / 2];
    assert!(matches!(read(cut), Err(TraceError::NotJson { .. })));
}

#[test]
fn no_trace_events() {
    assert!(matches!(
        read(br#"{"schemaVersion": 1}"#),
        Err(TraceError::NoTraceEvents { .. })
    ));
    assert!(matches!(
        read(br#"{"traceEvents": 3}"#),
        Err(TraceError::MalformedEvents { .. })
    ));
}

#[test]
fn truncated_gzip() {
    let gz = gzip(GOOD.as_bytes());
    let err = read(&gz[..gz.len() - 10]).unwrap_err();
    assert!(matches!(err, TraceError::Gzip { .. }), "{err}");
}

#[test]
fn kernel_without_name() {
    let bad = GOOD.replace("\"name\": \"b\",", "");
    let err = read(bad.as_bytes()).unwrap_err();
    assert!(
        matches!(
            err,
            TraceError::KernelMissingField {
                field: "name",
                index: 1,
                ..
            }
        ),
        "{err}"
    );
}
