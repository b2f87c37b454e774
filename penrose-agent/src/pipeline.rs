//! From snippets to sealed, encrypted reports (docs/design.md section 3, "Local histograms and
//! reports").
//!
//! Each snippet is fingerprinted and joins the agent's most similar *local application* (at or
//! above tau), or founds one. The local application's *representative* (its first snippet's
//! hash) is used only for that matching and never leaves the host. Each sampled launch's
//! counter values are binned (the catalogue's binning) into one 128-bin histogram per (local
//! application, counter), across windows; a sealed report carries the hash of the most recent
//! snippet (window) that contributed samples to *that* histogram (see [`OpenHistogram`]), so
//! reports of one application from different windows carry different hashes and no hash is a
//! lifetime pseudonym of the (host, application) pair.
//!
//! A histogram is *due* at the seal size or at its maximum age, whichever comes first, so that
//! slow samplers still contribute; sealing encrypts it with the design server's key under a
//! fresh random report id and a coarse day. Across all local applications at most T
//! ([`PipelineConfig::reports_per_counter_per_day`], `penrose_core::release`) reports are
//! sealed per (counter, day), the day being the one the report is stamped with: servers count
//! contributors as ceil(reports / T). A due histogram over the cap is *held*: it keeps
//! accumulating up to the seal size, after which that histogram's further values are dropped
//! and counted ([`PipelineCounts::samples_over_cap`]); the next day it seals as usual. At stop
//! (and when its application is evicted) a histogram over the cap is discarded unsealed and
//! counted ([`PipelineCounts::histograms_over_cap`]). The daemon feeds the counts of earlier
//! runs in ([`Pipeline::restore_sealed`], from the sealed record) so that a restart does not
//! reopen a day's cap.
//!
//! The pipeline does no I/O and reads no clock: callers pass the instant and the day (the
//! daemon passes [`today`]); it returns what was sealed, and the daemon records and spools it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use penrose_core::counters::{Bin, Catalogue, CounterId};

use crate::counters::CounterValue;
use penrose_core::fingerprint::{
    Fingerprint, FingerprintParams, Fingerprinter, ParamsError, SnippetHash,
};
use penrose_core::gpu::GpuArch;
use penrose_core::histogram::{DEFAULT_SEAL_MAX_AGE, Histogram, HistogramError};
use penrose_core::paillier::PaillierError;
use penrose_core::release::ReportsPerContributor;
use penrose_core::wire::{Day, Message, PackedBytes, Report, ReportId, WireError};
use rand::RngCore;
use thiserror::Error;

use crate::capture::window::Snippet;
use crate::design_keys::DesignKeys;
use crate::record::{SealReason, SealedPerDay, SealedRecord};

/// Days of per-(counter, day) report counts kept behind the current day, so that a clock set
/// back a little cannot reopen a day's cap.
const CAP_DAYS_KEPT: u32 = 7;

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
    /// The GPU's architecture is of no generation a report may name (a rare or unreleased
    /// part would single out its owner; `penrose_core::gpu`).
    #[error(
        "this GPU's architecture {0} is not one of the generations reports may name (sm_70 to \
         sm_120); reports would single out its owner. Set capture.counters = \"none\" to run \
         without counter values"
    )]
    Arch(GpuArch),
}

/// What the pipeline needs to know.
#[derive(Clone, Debug)]
pub struct PipelineConfig {
    /// Similarity at or above which a snippet joins a local application.
    pub tau: f64,
    /// Most local applications; beyond it the longest idle one is sealed and forgotten.
    pub max_local_apps: usize,
    /// Seal at this many samples (at most [`penrose_core::paillier::MAX_REPORT_SAMPLES`]); also
    /// the most a histogram held by the cap accumulates.
    pub seal_samples: u32,
    /// Seal at this age.
    pub max_age: Duration,
    /// T: the most reports sealed per (counter, day), across all local applications.
    pub reports_per_counter_per_day: ReportsPerContributor,
    /// The architectures of the host's GPUs, from the counter source (empty without counters).
    /// Reports name only a generation: [`Pipeline::new`] coarsens each
    /// ([`GpuArch::generation`]) and refuses any of no generation a report may name. Each
    /// sample carries its own GPU's architecture, and samples of different generations never
    /// share a histogram.
    pub archs: Vec<GpuArch>,
    /// TEST EQUIPMENT (`seal.test_record_joint_values`): keep each joint view's raw (x, y)
    /// values and write them into the sealed record, so that an end-to-end test can compare
    /// the decrypted grid with the values themselves. Off in a product configuration.
    pub test_record_joint_values: bool,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            tau: FingerprintParams::default().tau,
            max_local_apps: 1024,
            seal_samples: 10_000,
            max_age: DEFAULT_SEAL_MAX_AGE,
            reports_per_counter_per_day: ReportsPerContributor::DEFAULT,
            archs: Vec::new(),
            test_record_joint_values: false,
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
    /// Histograms open now that are due but held because their counter's reports for the day
    /// reached the cap; they seal the next day.
    #[serde(default)]
    pub held_over_cap: u64,
    /// Counter values (one sampled launch's value of one counter) not reported because of the
    /// report cap: dropped when their histogram was held and full, or inside a histogram
    /// discarded unsealed (see `histograms_over_cap`).
    #[serde(default)]
    pub samples_over_cap: u64,
    /// Histograms discarded at sealing because the design key list gives their day no key
    /// (a list that starts later than the day: a design server's mistake).
    #[serde(default)]
    pub histograms_without_key: u64,
    /// Histograms discarded unsealed because the cap was reached when the agent stopped (or
    /// its source ended) or their local application was evicted.
    #[serde(default)]
    pub histograms_over_cap: u64,
}

/// One (local application, counter) histogram being filled.
///
/// The snippet hash a report carries is kept here, per histogram rather than per local
/// application: a histogram's report then always carries the hash of a window whose samples
/// it holds. Counter groups rotate, so an application's latest window may have contributed
/// nothing to a given counter; a per-application hash would label that counter's report with
/// a window that is not in it. Reports of one application sealed from different windows carry
/// those windows' own (differing) hashes, never a stable representative.
struct OpenHistogram {
    histogram: Histogram,
    opened: Instant,
    /// The fingerprint of the most recent snippet that contributed samples to this histogram.
    snippet: Fingerprint,
    /// Due, but held back by the report cap.
    held: bool,
    /// A joint view's raw (x, y) values, kept only with
    /// [`PipelineConfig::test_record_joint_values`] (test equipment).
    joint_values: Vec<[f64; 2]>,
}

struct LocalApp {
    id: u64,
    /// The first snippet's hash: matches later snippets to this application; never reported.
    representative: SnippetHash,
    last_seen: Instant,
    histograms: BTreeMap<HistogramKey, OpenHistogram>,
}

/// Which histogram of a local application a value goes into: one per counter and GPU
/// generation, so that values read on different architectures never mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct HistogramKey {
    /// The generation reports name ([`GpuArch::generation`]).
    arch: GpuArch,
    /// The counter (or joint view).
    counter: CounterId,
}

/// The agent's local applications and their open histograms.
pub struct Pipeline {
    config: PipelineConfig,
    fingerprinter: Fingerprinter,
    keys: DesignKeys,
    catalogue: &'static Catalogue,
    apps: Vec<LocalApp>,
    next_app: u64,
    /// Reports sealed per (day stamped, counter), for the cap; days long past are pruned.
    sealed_per_day: SealedPerDay,
    counts: PipelineCounts,
}

impl Pipeline {
    /// A pipeline encrypting to `keys`: one public key, or the design server's key list
    /// (each histogram under the key of the day it is stamped with).
    pub fn new(
        mut config: PipelineConfig,
        keys: impl Into<DesignKeys>,
    ) -> Result<Self, PipelineError> {
        let keys = keys.into();
        let archs = config
            .archs
            .iter()
            .filter(|a| !a.is_unknown())
            .map(|a| a.generation().ok_or(PipelineError::Arch(*a)))
            .collect::<Result<Vec<_>, _>>()?;
        config.archs = crate::capture::distinct_archs(archs);
        let fingerprinter = Fingerprinter::new(FingerprintParams {
            tau: config.tau,
            ..FingerprintParams::default()
        })?;
        Ok(Self {
            config,
            fingerprinter,
            keys,
            catalogue: Catalogue::current(),
            apps: Vec::new(),
            next_app: 0,
            sealed_per_day: BTreeMap::new(),
            counts: PipelineCounts::default(),
        })
    }

    /// The generations reports name: those of the host's GPUs, each once (empty without
    /// counters).
    pub fn archs(&self) -> &[GpuArch] {
        &self.config.archs
    }

    /// Takes in the reports sealed before this pipeline started (the daemon reads them from
    /// the sealed record), so that a restart does not reopen a day's cap.
    pub fn restore_sealed(&mut self, sealed: &SealedPerDay) {
        for (&key, &n) in sealed {
            let count = self.sealed_per_day.entry(key).or_insert(0);
            *count = count.saturating_add(n);
        }
    }

    /// The oldest day whose sealed reports count towards the cap when today is `day`.
    pub fn oldest_capped_day(day: Day) -> Day {
        Day(day.0.saturating_sub(CAP_DAYS_KEPT))
    }

    /// The fingerprinter in use.
    pub fn fingerprinter(&self) -> &Fingerprinter {
        &self.fingerprinter
    }

    /// Counts so far.
    pub fn counts(&self) -> PipelineCounts {
        let mut c = self.counts;
        let open = || self.apps.iter().flat_map(|a| a.histograms.values());
        c.local_apps = self.apps.len() as u64;
        c.open_histograms = open().count() as u64;
        c.held_over_cap = open().filter(|h| h.held).count() as u64;
        c
    }

    /// Whether `counter` already has its T reports stamped `day`.
    fn cap_reached(&self, counter: CounterId, day: Day) -> bool {
        self.sealed_per_day
            .get(&(day, counter))
            .is_some_and(|&n| n >= self.config.reports_per_counter_per_day.get())
    }

    /// Forgets the counts of days long before `day`.
    fn prune(&mut self, day: Day) {
        let oldest = Self::oldest_capped_day(day);
        self.sealed_per_day.retain(|(d, _), _| *d >= oldest);
    }

    /// The local application a snippet hash belongs to (its index in `apps`), founding one if
    /// none is similar enough; evicts the longest idle application when at the bound.
    fn local_app(
        &mut self,
        hash: SnippetHash,
        now: Instant,
        day: Day,
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
            self.seal_app(app, SealReason::Evicted, day, out)?;
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

    /// Takes one snippet in at `now` on `day`; returns the histograms that reached the seal
    /// size (within the cap).
    pub fn ingest(
        &mut self,
        snippet: &Snippet,
        now: Instant,
        day: Day,
    ) -> Result<Vec<Sealed>, PipelineError> {
        let mut out = Vec::new();
        if snippet.names.is_empty() {
            return Ok(out);
        }
        self.prune(day);
        self.counts.snippets += 1;
        let fingerprint = snippet.fingerprint(&self.fingerprinter);
        let index = self.local_app(fingerprint.hash, now, day, &mut out)?;
        self.apps[index].last_seen = now;
        let limit = self.config.seal_samples;
        for sample in &snippet.samples {
            if !sample.values.is_empty() {
                self.counts.samples += 1;
            }
            // A sample of a GPU of no reportable generation is refused (the start-up check
            // refuses such a host; this keeps a source that names one from reaching a report).
            let Some(arch) = sample.arch.generation() else {
                self.counts.values_refused += sample.values.len() as u64;
                continue;
            };
            for (counter, bin, pair) in self.bins_of(&sample.values) {
                let id = HistogramKey { arch, counter };
                let full = self.apps[index]
                    .histograms
                    .get(&id)
                    .is_some_and(|h| h.histogram.samples().0 >= limit);
                // A full histogram is one the cap held back: seal it if a new day made room,
                // else this value is dropped (and counted).
                if full && !self.try_seal(index, id, SealReason::Size, day, &mut out)? {
                    self.counts.samples_over_cap += 1;
                    continue;
                }
                let open = self.apps[index]
                    .histograms
                    .entry(id)
                    .or_insert(OpenHistogram {
                        histogram: Histogram::new(),
                        opened: now,
                        snippet: fingerprint,
                        held: false,
                        joint_values: Vec::new(),
                    });
                open.histogram.record(bin)?;
                open.snippet = fingerprint;
                if let Some(pair) = pair.filter(|_| self.config.test_record_joint_values) {
                    open.joint_values.push(pair);
                }
                self.counts.values += 1;
                if open.histogram.samples().0 >= limit {
                    self.try_seal(index, id, SealReason::Size, day, &mut out)?;
                }
            }
        }
        Ok(out)
    }

    /// The histogram bins one sampled launch's values go into: each counter's own bin, then
    /// the cell of every joint view of the catalogue whose two counters were both read on
    /// this launch (a joint view needs the pair from the same launch; the counters of one
    /// group are). Values of counters outside the catalogue, and NaN, are refused and counted.
    /// A joint view's bin comes with the pair of values it was binned from.
    fn bins_of(&mut self, values: &[CounterValue]) -> Vec<(CounterId, Bin, Option<[f64; 2]>)> {
        let mut bins = Vec::with_capacity(values.len() + self.catalogue.joints.len());
        for value in values {
            match self
                .catalogue
                .counter(value.counter)
                .map(|c| c.binning.bin(value.value))
            {
                Some(Ok(bin)) => bins.push((value.counter, bin, None)),
                _ => self.counts.values_refused += 1,
            }
        }
        let read = |id: CounterId| {
            values
                .iter()
                .find(|v| v.counter == id && !v.value.is_nan())
                .map(|v| v.value)
        };
        for joint in self.catalogue.joint_views() {
            let (Some(x), Some(y)) = (read(joint.view.x), read(joint.view.y)) else {
                continue;
            };
            if let Ok(bin) = joint.bin(x, y) {
                bins.push((joint.view.id, bin, Some([x, y])));
            }
        }
        bins
    }

    /// Seals, oldest first and within the cap, every histogram that is due on `day`: at least
    /// the maximum age old at `now`, or at the seal size (held back by the cap until now).
    pub fn tick(&mut self, now: Instant, day: Day) -> Result<Vec<Sealed>, PipelineError> {
        self.prune(day);
        let (max_age, limit) = (self.config.max_age, self.config.seal_samples);
        let mut due = Vec::new();
        for (index, app) in self.apps.iter().enumerate() {
            for (&key, h) in &app.histograms {
                let reason = if h.histogram.samples().0 >= limit {
                    SealReason::Size
                } else if now.saturating_duration_since(h.opened) >= max_age {
                    SealReason::Age
                } else {
                    continue;
                };
                due.push((h.opened, index, key, reason));
            }
        }
        due.sort_by_key(|&(opened, index, key, _)| (opened, index, key));
        let mut out = Vec::new();
        for (_, index, key, reason) in due {
            self.try_seal(index, key, reason, day, &mut out)?;
        }
        Ok(out)
    }

    /// Seals everything held, within the cap, stamped `day` (the agent is stopping, or its
    /// source ended). Histograms over the cap are discarded and counted.
    pub fn flush(&mut self, day: Day) -> Result<Vec<Sealed>, PipelineError> {
        let mut out = Vec::new();
        for app in std::mem::take(&mut self.apps) {
            self.seal_app(app, SealReason::Flush, day, &mut out)?;
        }
        Ok(out)
    }

    /// Seals `apps[index]`'s histogram of `counter` unless the cap for (`counter`, `day`) is
    /// reached, in which case it is marked held. Whether it was sealed.
    fn try_seal(
        &mut self,
        index: usize,
        key: HistogramKey,
        reason: SealReason,
        day: Day,
        out: &mut Vec<Sealed>,
    ) -> Result<bool, PipelineError> {
        let capped = self.cap_reached(key.counter, day);
        let app = &mut self.apps[index];
        if capped {
            if let Some(h) = app.histograms.get_mut(&key) {
                h.held = true;
            }
            return Ok(false);
        }
        let id = app.id;
        let Some(open) = app.histograms.remove(&key) else {
            return Ok(false);
        };
        out.extend(self.seal(id, key, open, reason, day)?);
        Ok(true)
    }

    /// Seals a local application's histograms that fit under the cap, discarding (and
    /// counting) the others.
    fn seal_app(
        &mut self,
        app: LocalApp,
        reason: SealReason,
        day: Day,
        out: &mut Vec<Sealed>,
    ) -> Result<(), PipelineError> {
        for (key, open) in app.histograms {
            if self.cap_reached(key.counter, day) {
                self.counts.histograms_over_cap += 1;
                self.counts.samples_over_cap += u64::from(open.histogram.samples().0);
                continue;
            }
            out.extend(self.seal(app.id, key, open, reason, day)?);
        }
        Ok(())
    }

    /// Encrypts a histogram under the key of `day` (`None`, and counted, when the key list
    /// gives that day no key: the histogram is discarded).
    fn seal(
        &mut self,
        local_app: u64,
        key: HistogramKey,
        open: OpenHistogram,
        reason: SealReason,
        day: Day,
    ) -> Result<Option<Sealed>, PipelineError> {
        let HistogramKey { arch, counter } = key;
        let OpenHistogram {
            histogram,
            snippet,
            joint_values,
            ..
        } = open;
        let Some(key) = self.keys.key_for(day) else {
            self.counts.histograms_without_key += 1;
            return Ok(None);
        };
        let mut rng = rand::rng();
        let packed = key.encrypt_packed(histogram.bins(), &mut rng)?;
        let mut id = [0u8; 16];
        rng.fill_bytes(&mut id);
        let report_id = ReportId(id);
        let report = Report {
            key_id: key.key_id(),
            report_id,
            snippet: snippet.hash,
            locator: snippet.locator,
            arch,
            counter,
            catalogue: self.catalogue.version,
            day,
            samples: histogram.samples(),
            ciphertexts: PackedBytes::new(packed.to_bytes(), packed.ciphertexts().len())?,
            token: None,
            evidence: None,
        };
        let frame = Message::Report(report.clone()).to_frame()?;
        let record = SealedRecord {
            report_id,
            snippet: snippet.hash,
            local_app,
            counter: counter.0,
            counter_name: self.catalogue.name_of(counter).unwrap_or("?").to_string(),
            catalogue: self.catalogue.version.0,
            day: day.0,
            arch: arch.to_string(),
            samples: histogram.samples().0,
            bins: histogram.bins().to_vec(),
            reason,
            joint_values,
        };
        self.counts.sealed += 1;
        *self.sealed_per_day.entry((day, counter)).or_insert(0) += 1;
        Ok(Some(Sealed {
            report,
            frame,
            record,
        }))
    }
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

    /// The day the tests' reports are stamped with.
    const DAY: Day = Day(20_000);

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
                arch: GpuArch::new(9, 0),
                values: vec![CounterValue {
                    counter: duration,
                    value: duration_ns,
                }],
            })
            .collect();
        Snippet {
            names,
            end: SnippetEnd::Limit,
            samples,
            ..Snippet::new(Pid(app), 0)
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
        p.ingest(&snippet(1, 2000, 100, 5e3), now, DAY).unwrap();
        p.ingest(&snippet(1, 1800, 100, 5e3), now, DAY).unwrap();
        assert_eq!(p.counts().local_apps, 1, "the same application twice");
        p.ingest(&snippet(2, 2000, 100, 5e3), now, DAY).unwrap();
        assert_eq!(p.counts().local_apps, 2, "another application");
        let sealed = p.flush(DAY).unwrap();
        assert_eq!(sealed.len(), 2, "one histogram per (application, counter)");
        let first = sealed.iter().find(|s| s.record.local_app == 0).unwrap();
        assert_eq!(first.record.samples, 20 + 18);
        // The report carries the hash of the last window that contributed to it, not the
        // application's representative (its first snippet's hash).
        let rep = p
            .fingerprinter()
            .snippet_hash(&snippet(1, 2000, 100, 5e3).names);
        let last = p
            .fingerprinter()
            .snippet_hash(&snippet(1, 1800, 100, 5e3).names);
        assert_ne!(rep, last, "the two windows' snippets differ");
        assert_eq!(first.report.snippet, last);
        assert_eq!(first.record.snippet, last);
        assert_ne!(first.report.snippet, rep);
    }

    /// A launch whose occupancy, duration and registers were read lands in the three
    /// counters' histograms and in the cells of both joint views of group 2; a launch without
    /// occupancy lands in no joint view of it; the grids decrypt to what the values give,
    /// and with the test setting the raw pairs are in the record.
    #[test]
    fn a_launch_read_with_both_counters_of_a_joint_view_lands_in_its_grid() {
        let catalogue = Catalogue::current();
        let id = |name: &str| catalogue.counter_by_name(name).unwrap().id;
        let mut snippet = snippet(1, 2000, 100, 5e3);
        let values = [
            (40_000.0, 80.0, 96.0),
            (300.0, 12.0, 255.0),
            (2e6, 50.0, 32.0),
        ];
        for (i, sample) in snippet.samples.iter_mut().enumerate() {
            let (duration, occupancy, registers) = values[i % values.len()];
            sample.values = vec![
                CounterValue {
                    counter: id("kernel_duration"),
                    value: duration,
                },
                CounterValue {
                    counter: id("registers_per_thread"),
                    value: registers,
                },
            ];
            // Every fifth launch has no occupancy: it belongs to no joint view.
            if i % 5 != 4 {
                sample.values.push(CounterValue {
                    counter: id("achieved_occupancy"),
                    value: occupancy,
                });
            }
        }
        let mut p = Pipeline::new(
            PipelineConfig {
                test_record_joint_values: true,
                ..PipelineConfig::default()
            },
            keys().public_key().clone(),
        )
        .unwrap();
        p.ingest(&snippet, Instant::now(), DAY).unwrap();
        let sealed = p.flush(DAY).unwrap();
        let joint = catalogue.joint_by_name("duration_x_occupancy").unwrap();
        let grid = sealed
            .iter()
            .find(|s| s.report.counter == joint.view.id)
            .expect("the joint view was sealed");
        assert_eq!(grid.record.counter_name, "duration_x_occupancy");
        assert_eq!(grid.record.samples, 16, "20 samples, 4 without occupancy");
        let mut expected = [0u64; penrose_core::counters::BIN_COUNT];
        for (i, _) in snippet
            .samples
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 5 != 4)
        {
            let (duration, occupancy, _) = values[i % values.len()];
            expected[joint.bin(duration, occupancy).unwrap().index()] += 1;
        }
        let packed = keys()
            .public_key()
            .validate_packed(grid.report.ciphertexts.as_bytes())
            .unwrap();
        assert_eq!(keys().decrypt_packed(&packed).unwrap(), expected);
        assert_eq!(grid.record.joint_values.len(), 16);
        assert_eq!(grid.record.joint_values[0], [40_000.0, 80.0]);
        // (40 us, 80%) is cell (5, 6); (300 ns, 12%) cell (0, 0); (2 ms, 50%) cell (8, 4).
        assert_eq!(joint.cell_of(joint.bin(40_000.0, 80.0).unwrap()), (5, 6));
        assert_eq!(joint.cell_of(joint.bin(300.0, 12.0).unwrap()), (0, 0));
        assert_eq!(joint.cell_of(joint.bin(2e6, 50.0).unwrap()), (8, 4));
        let registers = catalogue.joint_by_name("registers_x_occupancy").unwrap();
        assert!(sealed.iter().any(|s| s.report.counter == registers.view.id));
        let tensor = catalogue.joint_by_name("tensor_x_dram").unwrap();
        assert!(!sealed.iter().any(|s| s.report.counter == tensor.view.id));
        // Single counters keep no raw values.
        assert!(
            sealed
                .iter()
                .filter(|s| catalogue.counter(s.report.counter).is_some())
                .all(|s| s.record.joint_values.is_empty())
        );
        // Without the test setting no raw value is kept.
        let mut p = pipeline(10_000, Duration::from_secs(3600));
        p.ingest(&snippet, Instant::now(), DAY).unwrap();
        assert!(
            p.flush(DAY)
                .unwrap()
                .iter()
                .all(|s| s.record.joint_values.is_empty())
        );
    }

    #[test]
    fn sealed_by_size_and_the_ciphertext_decrypts_to_the_record() {
        let mut p = pipeline(25, Duration::from_secs(3600));
        let now = Instant::now();
        // 60 samples of one value: two reports of 25, 10 left open.
        let sealed = p.ingest(&snippet(1, 6000, 100, 1.5e6), now, DAY).unwrap();
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
        assert_eq!(p.flush(DAY).unwrap()[0].record.samples, 10);
    }

    /// Reports name the GPU's generation (major version, minor zeroed), never its model, and a
    /// GPU of no listed generation is refused before anything is sealed.
    #[test]
    fn reports_name_the_generation_of_the_gpu_never_its_model() {
        let with_archs = |archs| {
            Pipeline::new(
                PipelineConfig {
                    seal_samples: 25,
                    archs,
                    ..PipelineConfig::default()
                },
                keys().public_key().clone(),
            )
        };
        let mut p = with_archs(vec![GpuArch::new(8, 6), GpuArch::new(8, 0)]).unwrap();
        assert_eq!(p.archs(), [GpuArch::new(8, 0)]);
        let mut on_ampere = snippet(1, 3000, 100, 1.5e6);
        for sample in &mut on_ampere.samples {
            sample.arch = GpuArch::new(8, 6);
        }
        let sealed = p.ingest(&on_ampere, Instant::now(), DAY).unwrap();
        assert!(!sealed.is_empty());
        for s in &sealed {
            assert_eq!(s.report.arch, GpuArch::new(8, 0));
            assert_eq!(s.record.arch, "sm_80");
            let (decoded, _) = Message::decode(&s.frame).unwrap();
            assert!(matches!(decoded, Message::Report(r) if r.arch == GpuArch::new(8, 0)));
        }
        for rare in [GpuArch::new(13, 0), GpuArch::new(6, 1)] {
            let host = vec![GpuArch::new(9, 0), rare];
            assert!(matches!(with_archs(host), Err(PipelineError::Arch(a)) if a == rare));
        }
        // Without counters (no samples, so no reports) there is no architecture.
        assert!(with_archs(Vec::new()).unwrap().archs().is_empty());
    }

    /// One application on a host with two architectures: the samples of each GPU fill
    /// histograms of their own generation; no report mixes them.
    #[test]
    fn samples_of_different_architectures_never_share_a_histogram() {
        let mut p = Pipeline::new(
            PipelineConfig {
                seal_samples: 10_000,
                archs: vec![GpuArch::new(9, 0), GpuArch::new(8, 0)],
                ..PipelineConfig::default()
            },
            keys().public_key().clone(),
        )
        .unwrap();
        let mut mixed = snippet(1, 3000, 100, 1.5e6);
        for (i, sample) in mixed.samples.iter_mut().enumerate() {
            if i % 3 == 0 {
                sample.arch = GpuArch::new(8, 0);
            }
        }
        let hopper = mixed.samples.iter().filter(|s| s.arch.major == 9).count() as u32;
        let ampere = mixed.samples.len() as u32 - hopper;
        assert!(p.ingest(&mixed, Instant::now(), DAY).unwrap().is_empty());
        let sealed = p.flush(DAY).unwrap();
        let samples_of = |arch: GpuArch| -> Vec<u32> {
            sealed
                .iter()
                .filter(|s| s.report.arch == arch)
                .map(|s| s.record.samples)
                .collect()
        };
        // Each counter's histogram of one generation holds exactly that generation's samples.
        assert!(samples_of(GpuArch::new(9, 0)).iter().all(|&n| n == hopper));
        assert!(samples_of(GpuArch::new(8, 0)).iter().all(|&n| n == ampere));
        assert!(!samples_of(GpuArch::new(9, 0)).is_empty());
        assert_eq!(
            samples_of(GpuArch::new(9, 0)).len(),
            samples_of(GpuArch::new(8, 0)).len()
        );
    }

    #[test]
    fn sealed_by_age() {
        let mut p = pipeline(10_000, Duration::from_secs(60));
        let t0 = Instant::now();
        p.ingest(&snippet(1, 1000, 100, 5e3), t0, DAY).unwrap();
        assert!(
            p.tick(t0 + Duration::from_secs(59), DAY)
                .unwrap()
                .is_empty()
        );
        let sealed = p.tick(t0 + Duration::from_secs(60), DAY).unwrap();
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
        p.ingest(&snippet(1, 500, 100, 5e3), t0, DAY).unwrap();
        p.ingest(&snippet(2, 500, 100, 5e3), t0 + Duration::from_secs(1), DAY)
            .unwrap();
        let sealed = p
            .ingest(&snippet(3, 500, 100, 5e3), t0 + Duration::from_secs(2), DAY)
            .unwrap();
        assert_eq!(p.counts().local_apps, 2);
        assert_eq!(sealed.len(), 1, "the idlest application's histogram sealed");
        assert_eq!(sealed[0].record.reason, SealReason::Evicted);
        assert_eq!(sealed[0].record.local_app, 0);
    }

    /// `s` with every sampled value recorded under the counter named `name` instead.
    fn as_counter(mut s: Snippet, name: &str) -> Snippet {
        let id = Catalogue::current().counter_by_name(name).unwrap().id;
        for sample in &mut s.samples {
            for v in &mut sample.values {
                v.counter = id;
            }
        }
        s
    }

    fn capped(seal_samples: u32, max_age: Duration, cap: u32) -> Pipeline {
        Pipeline::new(
            PipelineConfig {
                seal_samples,
                max_age,
                reports_per_counter_per_day: ReportsPerContributor::for_agent(cap).unwrap(),
                ..PipelineConfig::default()
            },
            keys().public_key().clone(),
        )
        .unwrap()
    }

    /// One application seen in two windows with different snippets seals two reports, each
    /// carrying its own window's hash (not the application's representative).
    #[test]
    fn reports_from_different_windows_carry_those_windows_hashes() {
        let mut p = pipeline(10_000, Duration::from_secs(60));
        let t0 = Instant::now();
        let (a, b) = (snippet(1, 2000, 100, 5e3), snippet(1, 1800, 100, 5e3));
        let (hash_a, hash_b) = (
            p.fingerprinter().snippet_hash(&a.names),
            p.fingerprinter().snippet_hash(&b.names),
        );
        assert_ne!(hash_a, hash_b);
        p.ingest(&a, t0, DAY).unwrap();
        let first = p.tick(t0 + Duration::from_secs(60), DAY).unwrap();
        p.ingest(&b, t0 + Duration::from_secs(61), DAY).unwrap();
        assert_eq!(p.counts().local_apps, 1, "both windows are one application");
        let second = p.tick(t0 + Duration::from_secs(121), DAY).unwrap();
        assert_eq!((first.len(), second.len()), (1, 1));
        let (first, second) = (&first[0], &second[0]);
        assert_eq!(first.record.local_app, second.record.local_app);
        assert_eq!(first.report.snippet, hash_a);
        assert_eq!(second.report.snippet, hash_b);
        assert_ne!(first.report.snippet, second.report.snippet);
    }

    /// A window whose launches have no names: its report carries the fingerprint of the
    /// launches' shapes (not of their labels, nor of one placeholder), and the
    /// frame that leaves the host holds nothing of the labels or configurations.
    #[test]
    fn unnamed_launches_report_their_shape_fingerprint_and_nothing_more() {
        use crate::capture::events::Launch;
        use crate::capture::window::{Naming, Window};
        let mut p = pipeline(10_000, Duration::from_secs(3600));
        let duration = Catalogue::current()
            .counter_by_name("kernel_duration")
            .unwrap()
            .id;
        let mut w = Window::new(0, 10_000);
        for i in 0..2_000u32 {
            let k = (i * 7 + i / 3) % 50;
            let launch = Launch {
                pid: Pid(7),
                tid: 7,
                sampled: i % 100 == 0,
                graph_position: 0,
                in_graph: false,
                timestamp_ns: 0,
                function: 0x7f00_0000 + u64::from(k) * 0x40,
                stream: 0,
                grid: [1 + k % 9, 1, 1],
                block: [128, 1, 1],
                shared_mem_bytes: 0,
                entry: penrose_ebpf_common::EntryPoint::LaunchKernel,
                caller: 0,
            };
            let sample = launch
                .sampled
                .then(|| crate::capture::window::SampledValues {
                    group: CounterGroup(2),
                    arch: GpuArch::new(9, 0),
                    values: vec![CounterValue {
                        counter: duration,
                        value: 5e3,
                    }],
                });
            w.record(&launch, Naming::None, sample);
        }
        let (snippets, _) = w.close();
        let s = &snippets[0];
        assert_eq!(s.shapes.len(), 2_000);
        let f = p.fingerprinter().clone();
        p.ingest(s, Instant::now(), DAY).unwrap();
        let sealed = p.flush(DAY).unwrap();
        assert_eq!(sealed.len(), 1);
        assert_eq!(sealed[0].report.snippet, s.snippet_hash(&f));
        assert_ne!(sealed[0].report.snippet, f.snippet_hash(&s.names));
        let frame = &sealed[0].frame;
        for (label, shape) in s.names.iter().zip(&s.shapes).take(50) {
            assert!(!contains(frame, label.as_bytes()));
            assert!(!contains(frame, &shape.digest.0[..8]), "no shape digest");
        }
    }

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle)
    }

    /// The hash is kept per (application, counter) histogram: a counter whose samples came
    /// only from the first window reports that window's hash even after a later window fed
    /// another counter.
    #[test]
    fn each_histogram_carries_the_last_window_that_fed_it() {
        let mut p = pipeline(10_000, Duration::from_secs(3600));
        let now = Instant::now();
        let a = snippet(1, 2000, 100, 5e3);
        let b = as_counter(snippet(1, 1800, 100, 50.0), "sm_active");
        let (hash_a, hash_b) = (
            p.fingerprinter().snippet_hash(&a.names),
            p.fingerprinter().snippet_hash(&b.names),
        );
        p.ingest(&a, now, DAY).unwrap();
        p.ingest(&b, now, DAY).unwrap();
        assert_eq!(p.counts().local_apps, 1);
        let sealed = p.flush(DAY).unwrap();
        assert_eq!(sealed.len(), 2);
        for s in &sealed {
            let expected = if s.record.counter_name == "kernel_duration" {
                hash_a
            } else {
                hash_b
            };
            assert_eq!(s.report.snippet, expected, "{}", s.record.counter_name);
        }
    }

    /// More than T histograms of one counter due in one day: exactly T reports that day, the
    /// rest held (still accumulating) and sealed the next day, stamped with it.
    #[test]
    fn the_report_cap_holds_the_excess_until_the_next_day() {
        let t = ReportsPerContributor::DEFAULT.get();
        let mut p = pipeline(10_000, Duration::from_secs(60));
        let t0 = Instant::now();
        let apps = t + 6;
        for app in 0..apps {
            p.ingest(&snippet(app, 500, 100, 5e3), t0, DAY).unwrap();
        }
        assert_eq!(p.counts().local_apps, u64::from(apps));
        let sealed = p.tick(t0 + Duration::from_secs(60), DAY).unwrap();
        assert_eq!(
            sealed.len(),
            t as usize,
            "exactly T reports for the counter"
        );
        assert!(sealed.iter().all(|s| s.report.day == DAY));
        assert_eq!(p.counts().held_over_cap, 6);
        assert_eq!(p.counts().open_histograms, 6);
        // Later the same day: nothing more for that counter, but another counter is not
        // limited by it.
        assert!(
            p.tick(t0 + Duration::from_secs(600), DAY)
                .unwrap()
                .is_empty()
        );
        let other = as_counter(snippet(0, 500, 100, 50.0), "sm_active");
        p.ingest(&other, t0 + Duration::from_secs(600), DAY)
            .unwrap();
        let other = p.tick(t0 + Duration::from_secs(660), DAY).unwrap();
        assert_eq!(other.len(), 1);
        assert_eq!(other[0].record.counter_name, "sm_active");
        // A held histogram keeps accumulating.
        p.ingest(
            &snippet(t, 500, 100, 5e3),
            t0 + Duration::from_secs(700),
            DAY,
        )
        .unwrap();
        // The next day the held histograms seal, stamped with the new day.
        let next = Day(DAY.0 + 1);
        let sealed = p.tick(t0 + Duration::from_secs(700), next).unwrap();
        assert_eq!(sealed.len(), 6);
        assert!(sealed.iter().all(|s| s.report.day == next));
        assert_eq!(
            sealed.iter().map(|s| s.record.samples).sum::<u32>(),
            6 * 5 + 5
        );
        assert_eq!(p.counts().held_over_cap, 0);
        assert_eq!(p.counts().samples_over_cap, 0);
        assert_eq!(p.counts().sealed, u64::from(t) + 1 + 6);
    }

    /// A histogram held by the cap at the seal size drops further values of its counter and
    /// counts them; the next day it seals; at stop what exceeds the cap is discarded, counted.
    #[test]
    fn values_beyond_a_full_held_histogram_are_dropped_and_counted() {
        let mut p = capped(10, Duration::from_secs(3600), 1);
        let t0 = Instant::now();
        // 60 samples: one report of 10, a second histogram of 10 held, 40 values dropped.
        let sealed = p.ingest(&snippet(1, 6000, 100, 1.5e6), t0, DAY).unwrap();
        assert_eq!(sealed.len(), 1);
        assert_eq!(sealed[0].record.samples, 10);
        let c = p.counts();
        assert_eq!((c.held_over_cap, c.open_histograms), (1, 1));
        assert_eq!(c.samples_over_cap, 40);
        assert_eq!(c.values, 20);
        // Another application's values of that counter share the cap (it is per agent).
        p.ingest(&snippet(2, 500, 100, 1.5e6), t0, DAY).unwrap();
        assert_eq!(p.counts().held_over_cap, 1, "5 samples: not due, only open");
        assert_eq!(p.counts().open_histograms, 2);
        // The next day the held full histogram seals first (stamped with the new day); the new
        // window's values fill its successor, which the spent cap holds again.
        let next = Day(DAY.0 + 1);
        let sealed = p.ingest(&snippet(1, 6000, 100, 1.5e6), t0, next).unwrap();
        assert_eq!(sealed.len(), 1);
        assert_eq!(sealed[0].record.samples, 10);
        assert_eq!(sealed[0].record.reason, SealReason::Size);
        assert_eq!(sealed[0].report.day, next);
        assert_eq!(p.counts().samples_over_cap, 40 + 50);
        // Stopping the same day: the cap (1) is spent, so both open histograms are discarded.
        assert!(p.flush(next).unwrap().is_empty());
        let c = p.counts();
        assert_eq!(c.histograms_over_cap, 2);
        assert_eq!(c.samples_over_cap, 40 + 50 + 10 + 5);
        assert_eq!(c.open_histograms, 0);
        assert_eq!(c.sealed, 2);
    }

    /// Reports sealed before a restart (from the sealed record) count towards the cap.
    #[test]
    fn restored_counts_keep_the_cap_across_a_restart() {
        let mut p = capped(10_000, Duration::from_secs(60), 2);
        let duration = Catalogue::current()
            .counter_by_name("kernel_duration")
            .unwrap()
            .id;
        let restored: SealedPerDay = [((DAY, duration), 1)].into_iter().collect();
        p.restore_sealed(&restored);
        let t0 = Instant::now();
        for app in 0..3 {
            p.ingest(&snippet(app, 500, 100, 5e3), t0, DAY).unwrap();
        }
        let sealed = p.tick(t0 + Duration::from_secs(60), DAY).unwrap();
        assert_eq!(
            sealed.len(),
            1,
            "one of the day's two reports was sealed before"
        );
        assert_eq!(p.counts().held_over_cap, 2);
    }
}
