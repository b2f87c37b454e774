//! Which traces the demo's hosts run: the popular application, and the ones run by one host
//! alone.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use penrose_core::fingerprint::{FingerprintParams, Fingerprinter};

/// What the fleet runs: one trace on every popular host, and one trace on each lone host.
#[derive(Debug)]
pub(super) struct Applications {
    /// The steadiest trace, run by `--agents` hosts.
    pub popular: PathBuf,
    /// Up to two more, each run by one host alone, each of its own job.
    pub alone: Vec<PathBuf>,
}

/// One trace with a single process, ranked by how steady its windows look to the
/// fingerprint.
#[derive(Debug)]
struct Candidate {
    file: PathBuf,
    /// The least similarity of its windows to the first.
    steadiness: f64,
}

/// The popular application and up to two others, each run by one host. Each agent replays
/// its trace in windows of L = 2,000 launches of the looping sequence, and an application
/// whose windows look alike to the fingerprint forms one class at the aggregator: so the
/// traces with one process are ranked by the least similarity of their windows to the first,
/// and the steadiest is the popular one. (Applications whose windows alternate between
/// phases split into several classes today; healing them is the kernel-identity issue's.)
/// The lone ones are the next steadiest of other jobs ([`pick`]).
pub(super) fn choose_applications(folder: &Path) -> Result<Applications> {
    let fingerprinter = Fingerprinter::new(FingerprintParams::default())?;
    let mut ranked = Vec::new();
    for file in penrose_traces::TraceFolder::open(folder)?.files() {
        if let Some(steadiness) = steadiness(&fingerprinter, file)? {
            ranked.push(Candidate {
                file: file.clone(),
                steadiness,
            });
        }
    }
    pick(ranked).context("no trace with a single process to run")
}

/// How steady a trace with a single process looks to the fingerprint: the least similarity
/// of six windows of its looping sequence to the first. `None` for a trace of several
/// processes.
fn steadiness(fingerprinter: &Fingerprinter, file: &Path) -> Result<Option<f64>> {
    const WINDOW: usize = 2_000;
    let trace = penrose_traces::read_trace(file)?;
    let sequences = trace.process_sequences();
    let Some(sequence) = sequences.values().next().filter(|_| sequences.len() == 1) else {
        return Ok(None);
    };
    let windows: Vec<_> = (0..6)
        .map(|w| {
            let names: Vec<&str> = sequence
                .iter()
                .cycle()
                .skip(w * WINDOW)
                .take(WINDOW)
                .map(|k| &*k.name)
                .collect();
            fingerprinter.snippet_hash(&names)
        })
        .collect();
    Ok(Some(
        windows
            .iter()
            .map(|w| fingerprinter.similarity(&windows[0], w))
            .fold(f64::INFINITY, f64::min),
    ))
}

/// The steadiest candidate is the popular application; the lone ones are the next steadiest
/// whose job (`penrose_traces::job_name`: ranks of one distributed job, `x_rank-0` and
/// `x_rank-1`, are one application) differs from the popular one's and from each other's. Two
/// ranks of one job would form one class at the aggregator: with the popular hosts, or
/// together on two lone hosts, where their sums could reach a decryption that the demo counts
/// as a lone application's. `None` without candidates.
fn pick(mut ranked: Vec<Candidate>) -> Option<Applications> {
    ranked.sort_by(|a, b| b.steadiness.total_cmp(&a.steadiness));
    let mut files = ranked.into_iter().map(|c| c.file);
    let popular = files.next()?;
    let mut jobs = BTreeSet::from([trace_name(&popular)]);
    let alone = files
        .filter(|f| jobs.insert(trace_name(f)))
        .take(2)
        .collect();
    Some(Applications { popular, alone })
}

/// The application a trace is of: its job's name.
pub(super) fn trace_name(path: &Path) -> String {
    penrose_traces::job_name(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidates(traces: &[(&str, f64)]) -> Vec<Candidate> {
        traces
            .iter()
            .map(|&(name, steadiness)| Candidate {
                file: PathBuf::from("/traces").join(name),
                steadiness,
            })
            .collect()
    }

    /// A folder whose steadiest three traces are ranks of one job: the lone hosts get traces
    /// of two other jobs, one each, never another rank of the popular job or two ranks of one.
    #[test]
    fn the_lone_applications_are_of_jobs_of_their_own() {
        let chosen = pick(candidates(&[
            ("big_rank-2.json.gz", 0.97),
            ("big_rank-0.json.gz", 0.99),
            ("small_rank0.json", 0.90),
            ("big_rank-1.json.gz", 0.98),
            ("small_rank1.json", 0.95),
            ("other.json", 0.50),
            ("worst.json", 0.10),
        ]))
        .unwrap();
        assert_eq!(chosen.popular, Path::new("/traces/big_rank-0.json.gz"));
        assert_eq!(
            chosen.alone,
            [
                Path::new("/traces/small_rank1.json"),
                Path::new("/traces/other.json")
            ]
        );
        let jobs: BTreeSet<String> = std::iter::once(&chosen.popular)
            .chain(&chosen.alone)
            .map(|f| trace_name(f))
            .collect();
        assert_eq!(jobs.len(), 3, "{jobs:?}");
    }

    /// Without traces of other jobs, fewer lone hosts; without any candidate, nothing.
    #[test]
    fn one_job_alone_has_no_lone_application() {
        let chosen = pick(candidates(&[
            ("a_rank-0.json", 0.9),
            ("a_rank-1.json", 0.8),
        ]));
        assert_eq!(chosen.map(|c| c.alone.len()), Some(0));
        assert!(pick(Vec::new()).is_none());
    }
}
