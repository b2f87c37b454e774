//! Fingerprints of a profiler trace computed offline, window by window, as the agent would
//! compute them from the same launches captured live (`penrose-agent fingerprint`): lets an
//! operator see what a workload's snippet hashes look like and how stable they are, without
//! root or a GPU.

use std::fmt;
use std::path::{Path, PathBuf};

use penrose_core::fingerprint::{FingerprintParams, Fingerprinter, ParamsError};
use penrose_traces::TraceError;
use serde::{Deserialize, Serialize};

/// Why a trace could not be fingerprinted.
#[derive(Debug, thiserror::Error)]
pub enum TraceFingerprintError {
    /// Windows of no launches have no fingerprint.
    #[error("--window must be at least 1")]
    ZeroWindow,
    /// The trace did not read.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The fingerprint parameters are invalid.
    #[error(transparent)]
    Params(#[from] ParamsError),
}

/// One window of one launch sequence and its fingerprint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WindowFingerprint {
    /// The sequence: `pid P`, or `pid P stream S`.
    pub sequence: String,
    /// The window's index within its sequence.
    pub window: usize,
    /// Launches in the window (L, or fewer in a sequence's last window).
    pub launches: usize,
    /// Its snippet hash, in hex.
    pub snippet_hash: String,
    /// The estimated similarity of its snippet to the sequence's first window's.
    pub similarity_to_first: f64,
}

/// Every window of a trace, with what the text header shows.
///
/// Its JSON form (`fingerprint --json`) is the array of [`WindowFingerprint`]s alone.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceFingerprints {
    /// The trace file.
    pub trace: PathBuf,
    /// Kernels in the trace.
    pub kernels: usize,
    /// The fingerprint's parameters (the agent's defaults).
    pub params: FingerprintParams,
    /// The windows, sequence by sequence, in order.
    pub windows: Vec<WindowFingerprint>,
}

/// Reads the trace at `path`, cuts each process's launch sequence (each stream's, with
/// `per_stream`) into windows of `window` launches and fingerprints each with the agent's
/// default parameters.
pub fn fingerprint_trace(
    path: &Path,
    window: usize,
    per_stream: bool,
) -> Result<TraceFingerprints, TraceFingerprintError> {
    if window == 0 {
        return Err(TraceFingerprintError::ZeroWindow);
    }
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
    let mut windows = Vec::new();
    for (label, names) in &sequences {
        let mut first = None;
        for (index, chunk) in names.chunks(window).enumerate() {
            let hash = fingerprinter.snippet_hash(chunk);
            let first = *first.get_or_insert(hash);
            windows.push(WindowFingerprint {
                sequence: label.clone(),
                window: index,
                launches: chunk.len(),
                snippet_hash: hash.to_string(),
                similarity_to_first: fingerprinter.similarity(&first, &hash),
            });
        }
    }
    Ok(TraceFingerprints {
        trace: path.to_owned(),
        kernels: trace.kernels().len(),
        params: *fingerprinter.params(),
        windows,
    })
}

/// The JSON form is the windows alone (an array), as `fingerprint --json` has always printed.
impl Serialize for TraceFingerprints {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.windows.serialize(serializer)
    }
}

/// The text form: the trace and the parameters, then one line per window.
impl fmt::Display for TraceFingerprints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.params;
        writeln!(
            f,
            "{}: {} kernels; {}-grams, k = {}, {:?} MinHash, tau = {}",
            self.trace.display(),
            self.kernels,
            p.ngram_len,
            p.num_hashes,
            p.weighting,
            p.tau
        )?;
        for w in &self.windows {
            // The window and launch counts are not padded to their columns' widths: this
            // line was printed from JSON values, whose `Display` ignores widths, and is kept
            // byte for byte.
            writeln!(
                f,
                "{:<24} window {} ({} launches)  {}  sim to first {:.2}",
                w.sequence,
                w.window,
                w.launches,
                w.snippet_hash,
                // A similarity that is not a number was printed as 0 (JSON has no NaN).
                if w.similarity_to_first.is_finite() {
                    w.similarity_to_first
                } else {
                    0.0
                }
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fingerprints() -> TraceFingerprints {
        TraceFingerprints {
            trace: PathBuf::from("t.json.gz"),
            kernels: 12_345,
            params: FingerprintParams::default(),
            windows: vec![
                WindowFingerprint {
                    sequence: "pid 7".into(),
                    window: 0,
                    launches: 10_000,
                    snippet_hash: "ab".into(),
                    similarity_to_first: 1.0,
                },
                WindowFingerprint {
                    sequence: "pid 7 stream 3".into(),
                    window: 12,
                    launches: 5,
                    snippet_hash: "cd".into(),
                    similarity_to_first: f64::NAN,
                },
            ],
        }
    }

    #[test]
    fn the_text_form_is_the_header_and_one_line_per_window() {
        let p = FingerprintParams::default();
        let header = format!(
            "t.json.gz: 12345 kernels; {}-grams, k = {}, {:?} MinHash, tau = {}",
            p.ngram_len, p.num_hashes, p.weighting, p.tau
        );
        assert_eq!(
            fingerprints().to_string(),
            format!(
                "{header}\n\
                 pid 7                    window 0 (10000 launches)  ab  sim to first 1.00\n\
                 pid 7 stream 3           window 12 (5 launches)  cd  sim to first 0.00\n"
            )
        );
    }

    #[test]
    fn the_json_form_is_the_array_of_windows() {
        let mut f = fingerprints();
        f.windows.truncate(1);
        let json = serde_json::to_string(&f).unwrap();
        assert_eq!(
            json,
            r#"[{"sequence":"pid 7","window":0,"launches":10000,"snippet_hash":"ab","similarity_to_first":1.0}]"#
        );
        let back: Vec<WindowFingerprint> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, f.windows);
    }

    #[test]
    fn a_window_of_no_launches_is_refused_before_reading() {
        let e = fingerprint_trace(Path::new("/nonexistent"), 0, false).unwrap_err();
        assert!(matches!(e, TraceFingerprintError::ZeroWindow), "{e}");
        assert_eq!(e.to_string(), "--window must be at least 1");
    }

    /// A real trace (skipped without PENROSE_TRACES): windows of L cover every launch of
    /// each sequence, and each sequence's first window is identical to itself.
    #[test]
    fn windows_cover_each_sequence_of_a_real_trace() {
        let dir = penrose_traces::TraceFolder::default_dir();
        let path = dir.join("hta-trace_filter--sampled_rank-0.json.gz");
        if !path.exists() {
            penrose_host::skip::skipped(format_args!(
                "SKIPPED: no trace at {} (set PENROSE_TRACES)",
                path.display()
            ));
            return;
        }
        let f = fingerprint_trace(&path, 100, false).unwrap();
        assert_eq!(
            f.windows.iter().map(|w| w.launches).sum::<usize>(),
            f.kernels
        );
        for w in f.windows.iter().filter(|w| w.window == 0) {
            assert_eq!(w.similarity_to_first, 1.0);
        }
        assert!(f.windows.iter().all(|w| w.launches <= 100));
    }
}
