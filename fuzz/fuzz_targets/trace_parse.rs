//! Feeds arbitrary bytes (plain or gzip) to the trace reader: malformed traces must come back
//! as errors, never panics, and a parsed trace's sequences must hold exactly its kernels.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(trace) = penrose_traces::read_trace_bytes(Path::new("fuzz.json"), data) {
        let in_processes: usize = trace.process_sequences().values().map(Vec::len).sum();
        assert_eq!(in_processes, trace.kernels().len());
        let in_streams: usize = trace.stream_sequences().values().map(Vec::len).sum();
        assert!(in_streams <= trace.kernels().len());
    }
});
