//! From snippets to sealed, encrypted reports (DESIGN.md section 3, "Local histograms and
//! reports").
//!
//! Each snippet is fingerprinted and joins the agent's most similar *local application* (at or
//! above tau), or founds one; the local application keeps the hash of its first snippet as its
//! representative, and every report it seals carries that hash, so that the aggregator places
//! all of one application's reports from this agent alike. Each sampled launch's counter
//! values are binned (the catalogue's binning) into one 128-bin histogram per (local
//! application, counter), across windows. A histogram is sealed at the seal size or at its
//! maximum age, whichever comes first, so that slow samplers still contribute; sealing
//! encrypts it with the design server's key under a fresh random report id and a coarse day.
//! The pipeline does no I/O: the daemon records and spools what it returns.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use penrose_core::counters::{Catalogue, CounterId};
use penrose_core::fingerprint::{FingerprintParams, Fingerprinter, ParamsError, SnippetHash};
use penrose_core::histogram::{Histogram, HistogramError};
use penrose_core::paillier::{PaillierError, PublicKey};
use penrose_core::wire::{Day, Message, PackedBytes, Report, ReportId, WireError};
use rand::RngCore;
use thiserror::Error;

use crate::capture::window::Snippet;
use crate::record::{SealReason, SealedRecord};
use crate::spool::hex;

/// Why the pipeline could not seal a histogram.
#[derive(Debug, Error)]
pub enum PipelineError {
    /// The fingerprint parameters are invalid (tau out of range).
    #[error("fingerprint parameters: {0}")]
    Params(#[from] ParamsError),
    /// Encryption failed.
    #[error("encrypting a histogram: {0}")]
    Encrypt(#[from] PaillierError),
    /// The report could not be encoded.
    #[error("encoding a report: {0}")]
    Wire(#[from] WireError),
    /// A histogram overflowed (cannot happen below the seal size).
    #[error("histogram: {0}")]
    Histogram(#[from] HistogramError),
}

/// What the pipeline needs to know.
#[derive(Clone, Debug)]
pub struct PipelineConfig {
    /// Similarity at or above which a snippet joins a local application.
    pub tau: f64,
    /// Most local applications; beyond it the longest idle one is sealed and forgotten.
    pub max_local_apps: usize,
    /// Seal at this many samples (at most [`penrose_core::paillier::MAX_REPORT_SAMPLES`]).
    pub seal_samples: u32,
    /// Seal at this age.
    pub max_age: Duration,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            tau: FingerprintParams::default().tau,
            max_local_apps: 1024,
            seal_samples: 10_000,
            max_age: Duration::from_secs(3600),
        }
    }
}

/// A sealed histogram: the report, its frame, and the plaintext record kept on this machine.
#[derive(Clone, Debug)]
pub struct Sealed {
    /// The encrypted report.
    pub report: Report,
    /// Its wire frame (what the spool holds and the uploader sends).
    pub frame: Vec<u8>,
    /// What was encrypted.
    pub record: SealedRecord,
}

/// Counts for `status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PipelineCounts {
    /// Snippets fingerprinted.
    pub snippets: u64,
    /// Sampled launches with counter values.
    pub samples: u64,
    /// Counter values binned into histograms.
    pub values: u64,
    /// Values that could not be binned (not finite) or name a counter outside the catalogue.
    pub values_refused: u64,
    /// Local applications founded.
    pub local_apps_founded: u64,
    /// Local applications held now.
    pub local_apps: u64,
    /// Histograms open now.
    pub open_histograms: u64,
    /// Histograms sealed.
    pub sealed: u64,
}

struct OpenHistogram {
    histogram: Histogram,
    opened: Instant,
}

struct LocalApp {
    id: u64,
    representative: SnippetHash,
    last_seen: Instant,
    histograms: BTreeMap<CounterId, OpenHistogram>,
}

/// The agent's local applications and their open histograms.
pub struct Pipeline {
    config: PipelineConfig,
    fingerprinter: Fingerprinter,
    key: PublicKey,
    catalogue: &'static Catalogue,
    apps: Vec<LocalApp>,
    next_app: u64,
    counts: PipelineCounts,
}

impl Pipeline {
    /// A pipeline encrypting to `key`.
    pub fn new(config: PipelineConfig, key: PublicKey) -> Result<Self, PipelineError> {
        let fingerprinter = Fingerprinter::new(FingerprintParams {
            tau: config.tau,
            ..FingerprintParams::default()
        })?;
        Ok(Self {
            config,
            fingerprinter,
            key,
            catalogue: Catalogue::current(),
            apps: Vec::new(),
            next_app: 0,
            counts: PipelineCounts::default(),
        })
    }

    /// The fingerprinter in use.
    pub fn fingerprinter(&self) -> &Fingerprinter {
        &self.fingerprinter
    }

    /// Counts so far.
    pub fn counts(&self) -> PipelineCounts {
        let mut c = self.counts;
        c.local_apps = self.apps.len() as u64;
        c.open_histograms = self.apps.iter().map(|a| a.histograms.len() as u64).sum();
        c
    }

    /// The local application a snippet hash belongs to (its index in `apps`), founding one if
    /// none is similar enough; evicts the longest idle application when at the bound.
    fn local_app(
        &mut self,
        hash: SnippetHash,
        now: Instant,
        out: &mut Vec<Sealed>,
    ) -> Result<usize, PipelineError> {
        let tau = self.fingerprinter.params().tau;
        let best = self
            .apps
            .iter()
            .enumerate()
            .map(|(i, a)| (i, self.fingerprinter.similarity(&a.representative, &hash)))
            .filter(|(_, s)| *s >= tau)
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(i, _)| i);
        if let Some(i) = best {
            return Ok(i);
        }
        if self.apps.len() >= self.config.max_local_apps
            && let Some(idle) = self
                .apps
                .iter()
                .enumerate()
                .min_by_key(|(_, a)| a.last_seen)
                .map(|(i, _)| i)
        {
            let app = self.apps.remove(idle);
            self.seal_app(app, SealReason::Evicted, out)?;
        }
        self.apps.push(LocalApp {
            id: self.next_app,
            representative: hash,
            last_seen: now,
            histograms: BTreeMap::new(),
        });
        self.next_app += 1;
        self.counts.local_apps_founded += 1;
        Ok(self.apps.len() - 1)
    }

    /// Takes one snippet in; returns the histograms that reached the seal size.
    pub fn ingest(
        &mut self,
        snippet: &Snippet,
        now: Instant,
    ) -> Result<Vec<Sealed>, PipelineError> {
        let mut out = Vec::new();
        if snippet.names.is_empty() {
            return Ok(out);
        }
        self.counts.snippets += 1;
        let hash = self.fingerprinter.snippet_hash(&snippet.names);
        let index = self.local_app(hash, now, &mut out)?;
        self.apps[index].last_seen = now;
        for sample in &snippet.samples {
            if !sample.values.is_empty() {
                self.counts.samples += 1;
            }
            for value in &sample.values {
                let Some(counter) = self.catalogue.counter(value.counter) else {
                    self.counts.values_refused += 1;
                    continue;
                };
                let Ok(bin) = counter.binning.bin(value.value) else {
                    self.counts.values_refused += 1;
                    continue;
                };
                let app = &mut self.apps[index];
                let open = app.histograms.entry(counter.id).or_insert(OpenHistogram {
                    histogram: Histogram::new(),
                    opened: now,
                });
                open.histogram.record(bin)?;
                self.counts.values += 1;
                if open.histogram.samples().0 >= self.config.seal_samples {
                    let (id, representative) = (app.id, app.representative);
                    if let Some(full) = app.histograms.remove(&counter.id) {
                        out.push(self.seal(
                            id,
                            representative,
                            counter.id,
                            full.histogram,
                            SealReason::Size,
                        )?);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Seals every histogram at least the maximum age old.
    pub fn tick(&mut self, now: Instant) -> Result<Vec<Sealed>, PipelineError> {
        let max_age = self.config.max_age;
        let mut due = Vec::new();
        for app in &mut self.apps {
            let old: Vec<CounterId> = app
                .histograms
                .iter()
                .filter(|(_, h)| now.saturating_duration_since(h.opened) >= max_age)
                .map(|(&c, _)| c)
                .collect();
            for c in old {
                if let Some(h) = app.histograms.remove(&c) {
                    due.push((app.id, app.representative, c, h.histogram));
                }
            }
        }
        due.into_iter()
            .map(|(id, rep, c, h)| self.seal(id, rep, c, h, SealReason::Age))
            .collect()
    }

    /// Seals everything held (the agent is stopping, or its source ended).
    pub fn flush(&mut self) -> Result<Vec<Sealed>, PipelineError> {
        let mut out = Vec::new();
        for app in std::mem::take(&mut self.apps) {
            self.seal_app(app, SealReason::Flush, &mut out)?;
        }
        Ok(out)
    }

    fn seal_app(
        &mut self,
        app: LocalApp,
        reason: SealReason,
        out: &mut Vec<Sealed>,
    ) -> Result<(), PipelineError> {
        for (c, h) in app.histograms {
            out.push(self.seal(app.id, app.representative, c, h.histogram, reason)?);
        }
        Ok(())
    }

    fn seal(
        &mut self,
        local_app: u64,
        snippet: SnippetHash,
        counter: CounterId,
        histogram: Histogram,
        reason: SealReason,
    ) -> Result<Sealed, PipelineError> {
        let mut rng = rand::rng();
        let packed = self.key.encrypt_packed(histogram.bins(), &mut rng)?;
        let mut id = [0u8; 16];
        rng.fill_bytes(&mut id);
        let report_id = ReportId(id);
        let day = today();
        let report = Report {
            key_id: self.key.key_id(),
            report_id,
            snippet,
            counter,
            catalogue: self.catalogue.version,
            day,
            samples: histogram.samples(),
            ciphertexts: PackedBytes::new(packed.to_bytes(), packed.ciphertexts().len())?,
        };
        let frame = Message::Report(report.clone()).to_frame()?;
        let record = SealedRecord {
            report_id: hex(&report_id.0),
            snippet: hex(&snippet.0),
            local_app,
            counter: counter.0,
            counter_name: self
                .catalogue
                .counter(counter)
                .map_or_else(|| "?".into(), |c| c.name.to_string()),
            catalogue: self.catalogue.version.0,
            day: day.0,
            samples: histogram.samples().0,
            bins: histogram.bins().to_vec(),
            reason,
        };
        self.counts.sealed += 1;
        Ok(Sealed {
            report,
            frame,
            record,
        })
    }
}

/// Days since the epoch: the only clock a report carries.
pub fn today() -> Day {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    Day(u32::try_from(secs / 86_400).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::sync::{Arc, OnceLock};

    use penrose_core::counters::CounterGroup;
    use penrose_core::paillier::{KeySize, Keypair, PrivateKey};

    use super::*;
    use crate::capture::events::Pid;
    use crate::capture::window::{Sample, SnippetEnd};
    use crate::counters::CounterValue;

    /// A small key keeps the unit tests fast; the daemon tests use 2048 bits.
    fn keys() -> &'static PrivateKey {
        static KEYS: OnceLock<PrivateKey> = OnceLock::new();
        KEYS.get_or_init(|| {
            Keypair::generate_with_size(KeySize::Bits1024, &mut rand::rng()).into_private_key()
        })
    }

    /// A snippet of `app`'s kernels: a repeating iteration from its own alphabet; with a sample
    /// of `duration_ns` every `every` launches.
    fn snippet(app: u32, len: usize, every: usize, duration_ns: f64) -> Snippet {
        let catalogue = Catalogue::current();
        let duration = catalogue.counter_by_name("kernel_duration").unwrap().id;
        let names: Vec<Arc<str>> = (0..len)
            .map(|i| Arc::from(format!("app{app}_kernel_{}", (i * 7 + i / 3) % 50)))
            .collect();
        let samples = (0..len)
            .step_by(every)
            .map(|position| Sample {
                position,
                kernel: names[position].clone(),
                group: CounterGroup(2),
                values: vec![CounterValue {
                    counter: duration,
                    value: duration_ns,
                }],
            })
            .collect();
        Snippet {
            pid: Pid(app),
            window: 0,
            names,
            unnamed: 0,
            end: SnippetEnd::Limit,
            samples,
        }
    }

    fn pipeline(seal_samples: u32, max_age: Duration) -> Pipeline {
        Pipeline::new(
            PipelineConfig {
                seal_samples,
                max_age,
                ..PipelineConfig::default()
            },
            keys().public_key().clone(),
        )
        .unwrap()
    }

    #[test]
    fn similar_snippets_share_a_local_app_and_others_found_their_own() {
        let mut p = pipeline(10_000, Duration::from_secs(3600));
        let now = Instant::now();
        p.ingest(&snippet(1, 2000, 100, 5e3), now).unwrap();
        p.ingest(&snippet(1, 1800, 100, 5e3), now).unwrap();
        assert_eq!(p.counts().local_apps, 1, "the same application twice");
        p.ingest(&snippet(2, 2000, 100, 5e3), now).unwrap();
        assert_eq!(p.counts().local_apps, 2, "another application");
        let sealed = p.flush().unwrap();
        assert_eq!(sealed.len(), 2, "one histogram per (application, counter)");
        let first = sealed.iter().find(|s| s.record.local_app == 0).unwrap();
        assert_eq!(first.record.samples, 20 + 18);
        // The report carries the application's representative: its first snippet's hash.
        let rep = p
            .fingerprinter()
            .snippet_hash(&snippet(1, 2000, 100, 5e3).names);
        assert_eq!(first.report.snippet, rep);
    }

    #[test]
    fn sealed_by_size_and_the_ciphertext_decrypts_to_the_record() {
        let mut p = pipeline(25, Duration::from_secs(3600));
        let now = Instant::now();
        // 60 samples of one value: two reports of 25, 10 left open.
        let sealed = p.ingest(&snippet(1, 6000, 100, 1.5e6), now).unwrap();
        assert_eq!(sealed.len(), 2);
        for s in &sealed {
            assert_eq!(s.record.samples, 25);
            assert_eq!(s.report.samples.0, 25);
            assert_eq!(s.record.reason, SealReason::Size);
            let packed = keys()
                .public_key()
                .validate_packed(s.report.ciphertexts.as_bytes())
                .unwrap();
            let bins = keys().decrypt_packed(&packed).unwrap().to_vec();
            let expected: Vec<u64> = s.record.bins.iter().map(|&b| u64::from(b)).collect();
            assert_eq!(bins, expected);
            assert_eq!(bins.iter().sum::<u64>(), 25);
            let (decoded, _) = Message::decode(&s.frame).unwrap();
            assert_eq!(decoded, Message::Report(s.report.clone()));
        }
        assert_ne!(sealed[0].report.report_id, sealed[1].report.report_id);
        assert_eq!(p.counts().open_histograms, 1);
        assert_eq!(p.flush().unwrap()[0].record.samples, 10);
    }

    #[test]
    fn sealed_by_age() {
        let mut p = pipeline(10_000, Duration::from_secs(60));
        let t0 = Instant::now();
        p.ingest(&snippet(1, 1000, 100, 5e3), t0).unwrap();
        assert!(p.tick(t0 + Duration::from_secs(59)).unwrap().is_empty());
        let sealed = p.tick(t0 + Duration::from_secs(60)).unwrap();
        assert_eq!(sealed.len(), 1);
        assert_eq!(sealed[0].record.reason, SealReason::Age);
        assert_eq!(sealed[0].record.samples, 10);
        // The local application stays; its next histogram starts afresh.
        assert_eq!(p.counts().local_apps, 1);
        assert_eq!(p.counts().open_histograms, 0);
    }

    #[test]
    fn local_apps_are_bounded() {
        let mut p = Pipeline::new(
            PipelineConfig {
                max_local_apps: 2,
                ..PipelineConfig::default()
            },
            keys().public_key().clone(),
        )
        .unwrap();
        let t0 = Instant::now();
        p.ingest(&snippet(1, 500, 100, 5e3), t0).unwrap();
        p.ingest(&snippet(2, 500, 100, 5e3), t0 + Duration::from_secs(1))
            .unwrap();
        let sealed = p
            .ingest(&snippet(3, 500, 100, 5e3), t0 + Duration::from_secs(2))
            .unwrap();
        assert_eq!(p.counts().local_apps, 2);
        assert_eq!(sealed.len(), 1, "the idlest application's histogram sealed");
        assert_eq!(sealed[0].record.reason, SealReason::Evicted);
        assert_eq!(sealed[0].record.local_app, 0);
    }
}
