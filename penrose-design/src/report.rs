//! Decrypting the released sums above the contributor threshold, and what architects read.
//!
//! Everything is split by GPU architecture: the aggregation server keeps sums per (class,
//! architecture, counter), since counters of different GPU generations do not add up, and this
//! report adds decrypted sums only within one (class, architecture, counter). Sums of bundles
//! older than version 5 carry no architecture and are reported under `unknown`.
//!
//! A released sum (one epoch's accumulator generation of a (class, architecture, counter)) is
//! decrypted only
//! when its contributor bound reaches k: `penrose_core::release` counts at least
//! ceil(reports / (T x days its epoch spans)) owners behind it, T being the most reports an
//! agent sends per (counter, day). The aggregation server applies the same rule before it
//! exports; this is the key holder's own check, with its own k and T (floors: 10 and 24). A
//! (class, counter) with no sum above the threshold is listed as held back, with its counts,
//! and nothing of it is decrypted. Decrypted sums of one (class, counter) are added bin by bin.
//!
//! A decrypted sum must be a histogram of exactly the samples its reports declared: every bin
//! at most that many, the bins adding up to it. A sum whose decryption fails (a slot carried
//! past its width) or whose bins do not add up was poisoned by a malformed report; it is
//! **quarantined**: listed with the reason, not added, and every other sum still decrypts.
//!
//! The bound counts on each agent sending at most T reports per (counter, day). Where the
//! aggregation server admitted every report of an epoch by a spent admission token (the
//! bundle's epoch summary says so, `EpochSummary::bound_enforced_by_tokens`), the issuer's
//! quota of T tokens per agent enforced that on every sender; otherwise it rests on agents
//! keeping their own cap. The report states which, per (class, counter) and overall.

use std::collections::BTreeMap;

use penrose_core::bundle::{BundleEntry, ClassId, SumId};
use penrose_core::counters::{
    BIN_COUNT, Bin, Binning, Catalogue, CatalogueVersion, CounterId, Joint,
};
use penrose_core::gpu::GpuArch;
use penrose_core::paillier::threshold::{self, KeyShare, PartialDecryption, VerificationKey};
use penrose_core::paillier::{PaillierError, PrivateKey, PublicKey};
use penrose_core::release::{ReportsPerContributor, Threshold, contributors_at_least};
use thiserror::Error;

use crate::archive::{Aggregates, Period, SumOrigin};
use crate::audit::AuditorPartials;

/// Why a sum under a split key was not decrypted while its auditor's partial is missing.
const AWAITING: &str = "awaiting the release auditor's partial decryption (penrose-design audit)";
use crate::joint::{JointSummary, Splits};
use crate::labels::{Label, Labels};

/// Why a report could not be made at all (a single bad sum is quarantined instead).
#[derive(Debug, Error)]
pub enum ReportError {
    /// Sums of the archive are under a key none of the private keys given is.
    #[error(
        "the archive holds sums under key {archive}, and no private key given is it (given: \
         {given}): give every key the sums may be under, one --key each"
    )]
    WrongKey {
        /// The archive's key id that no given key matches.
        archive: penrose_core::paillier::KeyId,
        /// The given keys' ids.
        given: String,
    },
}

/// One decrypted (class, architecture, counter).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CounterReport {
    /// The class.
    pub class: u32,
    /// The GPU generation the counters were read on (`sm_90`; `unknown` for sums of bundles
    /// older than version 5).
    pub arch: String,
    /// Classes the aggregator merged into this one whose released sums are counted here.
    pub merged_from: Vec<u32>,
    /// Catalogue version.
    pub catalogue: u16,
    /// Counter id.
    pub counter: u16,
    /// Counter name (`?` if the catalogue does not know it).
    pub name: String,
    /// Unit suffix.
    pub unit: String,
    /// Reports in the decrypted sums.
    pub reports: u64,
    /// Samples those reports claimed.
    pub samples: u64,
    /// The fewest contributors behind the decrypted sums: the largest bound among the sums
    /// added. Bounds do not add: sums of different epochs (or sub-sums of one) may have the
    /// same owners behind them, and reports carry nothing that would tell.
    pub contributors_at_least: u64,
    /// Released sums decrypted and added (epochs x generations).
    pub sums: usize,
    /// The epochs they come from.
    pub epochs: Vec<u32>,
    /// Reports in released sums held back (below the threshold on their own).
    pub held_back_reports: u64,
    /// Whether every report of the epochs its decrypted sums come from was admitted by an
    /// admission token (the contributor bound enforced on every sender, not only on agents
    /// that keep their cap).
    pub bound_enforced_by_tokens: bool,
    /// Bin sums, 128 of them.
    pub bins: Vec<u64>,
    /// Mean at bin resolution (bin representatives).
    pub mean: Option<f64>,
    /// Median, 90th and 99th percentiles at bin resolution.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// The architect's label of the class (`penrose-design label`), if any.
    pub label: Option<Label>,
    /// For a joint view (two counters binned into one grid): its axes and the shares of its
    /// four quadrants at the split asked for ([`Report::apply_splits`]; `None` for one
    /// counter's histogram).
    pub joint: Option<JointSummary>,
}

/// A (class, architecture, counter) not decrypted: every released sum of it is under the
/// threshold.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HeldBack {
    /// Class.
    pub class: u32,
    /// GPU architecture.
    pub arch: String,
    /// Counter id.
    pub counter: u16,
    /// Reports in it, all sums.
    pub reports: u64,
    /// The largest contributor bound of any of its sums.
    pub contributors_at_least: u64,
}

/// A released sum that decrypted to something no honest reports can add up to.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Quarantined {
    /// Class.
    pub class: u32,
    /// GPU architecture.
    pub arch: String,
    /// Counter id.
    pub counter: u16,
    /// Epoch.
    pub epoch: u32,
    /// Generation.
    pub generation: u32,
    /// Reports in it.
    pub reports: u64,
    /// Why it was not added.
    pub reason: String,
}

/// The whole report.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// The days it covers (`--from`/`--until`): only epochs whose report days all lie within
    /// are added. `None`: every released epoch. Set by the caller ([`Report::covering`]).
    pub period: Option<Period>,
    /// The threshold applied (contributors).
    pub threshold: Threshold,
    /// The report cap per contributor the bound was counted with.
    pub reports_per_contributor: ReportsPerContributor,
    /// Bundles merged.
    pub bundles: usize,
    /// Epochs released.
    pub epochs: usize,
    /// Sums of those epochs the aggregation server withheld under its threshold (never
    /// exported), and the reports in them, from the bundles' epoch summaries.
    pub withheld_sums: u64,
    /// Reports in the withheld sums.
    pub withheld_reports: u64,
    /// The decrypted (class, architecture, counter) histograms.
    pub decrypted: Vec<CounterReport>,
    /// The (class, architecture, counter)s under the threshold.
    pub held_back: Vec<HeldBack>,
    /// Sums that did not decrypt to a valid histogram.
    pub quarantined: Vec<Quarantined>,
    /// Sums under a split key the release auditor has not given its partial decryption of
    /// (`penrose-design audit` asks; it refuses what it must): not decrypted, not lost.
    pub awaiting_auditor: Vec<Quarantined>,
    /// Epochs a restored chain released again, never merged (chain, epoch).
    pub skipped_epochs: Vec<(String, u32)>,
    /// Whether every report of every released epoch was admitted by an admission token.
    pub bound_enforced_by_tokens: bool,
    /// Released epochs with reports admitted without a token (open admission, or bundles
    /// written before admission counts existed).
    pub epochs_without_tokens: usize,
    /// The architects' labels of the classes this report names (decrypted, merged, held
    /// back, quarantined), by class id; filled by [`Report::apply_labels`].
    pub labels: BTreeMap<u32, Label>,
}

impl Report {
    /// Says which days the report covers.
    pub fn covering(mut self, period: Option<Period>) -> Self {
        self.period = period;
        self
    }

    /// The report's line on admission: "contributor bound enforced by admission tokens: yes"
    /// or "no", with how many epochs are why.
    pub fn admission_line(&self) -> String {
        if self.bound_enforced_by_tokens {
            "contributor bound enforced by admission tokens: yes".to_string()
        } else if self.epochs == 0 {
            "contributor bound enforced by admission tokens: no (no epoch released)".to_string()
        } else {
            format!(
                "contributor bound enforced by admission tokens: no ({} of {} epochs admitted \
                 reports without tokens; there the bound rests on agents keeping their cap)",
                self.epochs_without_tokens, self.epochs
            )
        }
    }

    /// Attaches the labels of the classes this report names.
    pub fn apply_labels(&mut self, labels: &Labels) {
        let named = self
            .decrypted
            .iter()
            .flat_map(|c| std::iter::once(c.class).chain(c.merged_from.iter().copied()))
            .chain(self.held_back.iter().map(|h| h.class))
            .chain(self.quarantined.iter().map(|q| q.class));
        self.labels = named
            .filter_map(|c| labels.get(c).map(|l| (c, l.clone())))
            .collect();
        for c in &mut self.decrypted {
            c.label = labels.get(c.class).cloned();
        }
    }

    /// Splits every decrypted joint view at `splits` (the report is built with the defaults).
    pub fn apply_splits(&mut self, splits: &Splits) {
        for c in &mut self.decrypted {
            c.joint = joint_summary(c, splits);
        }
    }

    /// Classes with at least one decrypted counter.
    pub fn classes(&self) -> usize {
        let mut classes: Vec<u32> = self.decrypted.iter().map(|c| c.class).collect();
        classes.dedup();
        classes.len()
    }
}

/// Decrypts one released sum and checks it against its declared samples.
/// How the design server decrypts the sums under one key.
pub enum KeyHolding {
    /// The whole private key (generated without `--split`): the design server decrypts alone.
    Whole(PrivateKey),
    /// The design server's share of a split key: every sum also needs the release auditor's
    /// partial decryption (`crate::audit`), and the two are combined with their proofs checked.
    Split {
        /// The design server's share.
        share: KeyShare,
        /// Both holders' verification keys.
        verification: VerificationKey,
    },
}

impl KeyHolding {
    fn public_key(&self) -> &PublicKey {
        match self {
            KeyHolding::Whole(key) => key.public_key(),
            KeyHolding::Split { verification, .. } => verification.public_key(),
        }
    }
}

/// Why a sum was not decrypted.
enum Failure {
    /// It does not decrypt to a histogram of its declared samples: quarantined.
    Bad(String),
    /// The release auditor has not given its partial decryption (yet).
    Awaiting,
}

/// The keys by the archive's key index, and the auditor's partials.
struct Decryptor<'a> {
    by_index: Vec<&'a KeyHolding>,
    auditor: &'a AuditorPartials,
    origins: &'a BTreeMap<SumId, SumOrigin>,
}

impl Decryptor<'_> {
    fn decrypt(&self, entry: &BundleEntry) -> Result<[u64; BIN_COUNT], Failure> {
        let Some(holding) = self.by_index.get(usize::from(entry.key)) else {
            return Err(Failure::Bad("under a key the archive does not list".into()));
        };
        let packed = holding
            .public_key()
            .validate_packed(entry.sums.as_bytes())
            .map_err(|e: PaillierError| Failure::Bad(format!("invalid ciphertext: {e}")))?;
        let bins = match holding {
            KeyHolding::Whole(key) => key.decrypt_packed(&packed),
            KeyHolding::Split {
                share,
                verification,
            } => {
                let theirs = self
                    .origins
                    .get(&entry.key())
                    .and_then(|origin| self.auditor.get(origin))
                    .ok_or(Failure::Awaiting)?;
                let theirs = PartialDecryption::from_bytes(verification.public_key(), theirs)
                    .map_err(|e| Failure::Bad(format!("the auditor's partial: {e}")))?;
                share
                    .partial_decrypt(&packed, &mut rand::rng())
                    .and_then(|mine| threshold::combine(verification, &packed, &mine, &theirs))
            }
        }
        .map_err(|e| Failure::Bad(format!("does not decrypt to a histogram: {e}")))?;
        check_bins(bins, entry).map_err(Failure::Bad)
    }
}

/// A decrypted sum must be a histogram of exactly the samples its reports declared.
fn check_bins(bins: [u64; BIN_COUNT], entry: &BundleEntry) -> Result<[u64; BIN_COUNT], String> {
    if let Some((i, b)) = bins.iter().enumerate().find(|(_, b)| **b > entry.samples) {
        return Err(format!(
            "bin {i} holds {b}, more than the {} samples its reports declared",
            entry.samples
        ));
    }
    let total: u64 = bins.iter().sum();
    if total != entry.samples {
        return Err(format!(
            "bins add up to {total}, its reports declared {} samples",
            entry.samples
        ));
    }
    Ok(bins)
}

/// Decrypts every released sum whose contributor bound reaches `threshold`, counting
/// contributors with `cap`, each with the private key of `keys` it is under (a key rollover
/// leaves sums under several); quarantines sums that do not decrypt to their declared
/// samples. Every key the archive's sums are under must be given.
pub fn build(
    aggregates: &Aggregates,
    keys: &[PrivateKey],
    threshold: Threshold,
    cap: ReportsPerContributor,
) -> Result<Report, ReportError> {
    let holdings: Vec<KeyHolding> = keys.iter().cloned().map(KeyHolding::Whole).collect();
    build_with(
        aggregates,
        &holdings,
        &AuditorPartials::default(),
        threshold,
        cap,
    )
}

/// [`build`] with keys held whole or split: a sum under a split key is decrypted with the
/// design server's share and the release auditor's partial from `auditor`, and listed as
/// awaiting the auditor where it has none.
pub fn build_with(
    aggregates: &Aggregates,
    keys: &[KeyHolding],
    auditor: &AuditorPartials,
    threshold: Threshold,
    cap: ReportsPerContributor,
) -> Result<Report, ReportError> {
    let decryptor = Decryptor {
        by_index: keys_by_index(aggregates, keys)?,
        auditor,
        origins: &aggregates.origins,
    };
    let rule = Rule { threshold, cap };
    let mut out = Outcomes::default();
    for (group, entries) in grouped(aggregates) {
        let tally = out.tally(group, &entries, aggregates, &decryptor, rule);
        out.conclude(group, tally);
    }
    Ok(assemble(aggregates, out, rule))
}

/// The given key of each key the archive's sums are under, in the archive's order.
fn keys_by_index<'a>(
    aggregates: &Aggregates,
    keys: &'a [KeyHolding],
) -> Result<Vec<&'a KeyHolding>, ReportError> {
    aggregates
        .keys
        .iter()
        .map(|archive| {
            keys.iter()
                .find(|k| k.public_key().key_id() == *archive)
                .ok_or_else(|| ReportError::WrongKey {
                    archive: *archive,
                    given: keys
                        .iter()
                        .map(|k| k.public_key().key_id().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                })
        })
        .collect()
}

/// What an aggregate is of: class (after merges), architecture, catalogue, counter.
type Group = (ClassId, GpuArch, CatalogueVersion, CounterId);

/// The released sums of each aggregate.
fn grouped(aggregates: &Aggregates) -> BTreeMap<Group, Vec<&BundleEntry>> {
    let mut grouped: BTreeMap<Group, Vec<&BundleEntry>> = BTreeMap::new();
    for (k, entry) in &aggregates.entries {
        grouped
            .entry((aggregates.root(k.class), k.arch, k.catalogue, k.counter))
            .or_default()
            .push(entry);
    }
    grouped
}

/// k and T, as the report applies them.
#[derive(Clone, Copy)]
struct Rule {
    threshold: Threshold,
    cap: ReportsPerContributor,
}

/// One aggregate's decrypted sums added up, and what was held back.
struct Tally {
    bins: [u64; BIN_COUNT],
    reports: u64,
    samples: u64,
    sums: usize,
    contributors: u64,
    held: u64,
    best_held: u64,
    epochs: Vec<u32>,
    merged_from: Vec<u32>,
    by_tokens: bool,
}

impl Tally {
    fn new() -> Self {
        Tally {
            bins: [0; BIN_COUNT],
            reports: 0,
            samples: 0,
            sums: 0,
            contributors: 0,
            held: 0,
            best_held: 0,
            epochs: Vec::new(),
            merged_from: Vec::new(),
            by_tokens: true,
        }
    }

    /// Adds a decrypted sum. Its contributor bound does not add to the others': the same
    /// owners may be behind each, so the aggregate claims the largest.
    fn add(&mut self, entry: &BundleEntry, sum: [u64; BIN_COUNT], bound: u64, root: ClassId) {
        for (b, s) in self.bins.iter_mut().zip(sum) {
            *b += s;
        }
        self.reports += entry.reports;
        self.samples += entry.samples;
        self.contributors = self.contributors.max(bound);
        self.sums += 1;
        if !self.epochs.contains(&entry.epoch.0) {
            self.epochs.push(entry.epoch.0);
        }
        if entry.class != root && !self.merged_from.contains(&entry.class.0) {
            self.merged_from.push(entry.class.0);
        }
    }
}

/// What the report lists, as it is built.
#[derive(Default)]
struct Outcomes {
    decrypted: Vec<CounterReport>,
    held_back: Vec<HeldBack>,
    quarantined: Vec<Quarantined>,
    awaiting: Vec<Quarantined>,
}

impl Outcomes {
    /// Decrypts the sums of `group` that meet the rule and adds them up; lists those that
    /// do not decrypt as quarantined or awaiting the auditor.
    fn tally(
        &mut self,
        group: Group,
        entries: &[&BundleEntry],
        aggregates: &Aggregates,
        decryptor: &Decryptor<'_>,
        rule: Rule,
    ) -> Tally {
        let (class, arch, _, counter) = group;
        let mut tally = Tally::new();
        for &entry in entries {
            let epoch = aggregates.epochs.get(&entry.epoch);
            let days = epoch.map_or(1, |e| e.days());
            let bound = contributors_at_least(entry.reports, days, rule.cap);
            if bound < rule.threshold.get() {
                tally.held += entry.reports;
                tally.best_held = tally.best_held.max(bound);
                continue;
            }
            // The archive lists every key its entries are under; an entry beyond the list is
            // a bug, quarantined like a sum that does not decrypt.
            match decryptor.decrypt(entry) {
                Ok(sum) => {
                    tally.add(entry, sum, bound, class);
                    tally.by_tokens &= epoch.is_some_and(|e| e.bound_enforced_by_tokens());
                }
                Err(failure) => {
                    let (list, reason) = match failure {
                        Failure::Bad(reason) => (&mut self.quarantined, reason),
                        Failure::Awaiting => (&mut self.awaiting, AWAITING.to_string()),
                    };
                    list.push(Quarantined {
                        class: class.0,
                        arch: arch.to_string(),
                        counter: counter.0,
                        epoch: entry.epoch.0,
                        generation: entry.generation.0,
                        reports: entry.reports,
                        reason,
                    });
                }
            }
        }
        tally
    }

    /// Lists `group` as decrypted, or as held back when nothing of it was decrypted.
    fn conclude(&mut self, group: Group, mut tally: Tally) {
        let (class, arch, catalogue, counter) = group;
        if tally.sums == 0 {
            if tally.held > 0 {
                self.held_back.push(HeldBack {
                    class: class.0,
                    arch: arch.to_string(),
                    counter: counter.0,
                    reports: tally.held,
                    contributors_at_least: tally.best_held,
                });
            }
            return;
        }
        let cat = Catalogue::by_version(catalogue);
        let known = cat.and_then(|c| c.counter(counter));
        let binning = known.map(|c| c.binning);
        tally.epochs.sort_unstable();
        tally.merged_from.sort_unstable();
        let bins = tally.bins;
        let mut report = CounterReport {
            class: class.0,
            arch: arch.to_string(),
            merged_from: tally.merged_from,
            catalogue: catalogue.0,
            counter: counter.0,
            name: cat
                .and_then(|c| c.name_of(counter))
                .unwrap_or("?")
                .to_string(),
            unit: known.map_or(String::new(), |c| c.unit.suffix().to_string()),
            reports: tally.reports,
            samples: tally.samples,
            contributors_at_least: tally.contributors,
            sums: tally.sums,
            epochs: tally.epochs,
            held_back_reports: tally.held,
            bound_enforced_by_tokens: tally.by_tokens,
            mean: binning.and_then(|b| mean(&bins, &b)),
            p50: binning.and_then(|b| quantile(&bins, &b, 0.5)),
            p90: binning.and_then(|b| quantile(&bins, &b, 0.9)),
            p99: binning.and_then(|b| quantile(&bins, &b, 0.99)),
            bins: bins.to_vec(),
            label: None,
            joint: None,
        };
        report.joint = joint_summary(&report, &Splits::default());
        self.decrypted.push(report);
    }
}

/// The whole report from the aggregates' epochs and what was listed.
fn assemble(aggregates: &Aggregates, out: Outcomes, rule: Rule) -> Report {
    let epochs = &aggregates.epochs;
    let epochs_without_tokens = epochs
        .values()
        .filter(|e| !e.bound_enforced_by_tokens())
        .count();
    Report {
        period: None,
        bound_enforced_by_tokens: !epochs.is_empty() && epochs_without_tokens == 0,
        epochs_without_tokens,
        threshold: rule.threshold,
        reports_per_contributor: rule.cap,
        bundles: aggregates.bundles,
        epochs: epochs.len(),
        withheld_sums: epochs.values().map(|e| u64::from(e.withheld_sums)).sum(),
        withheld_reports: epochs.values().map(|e| e.withheld_reports).sum(),
        decrypted: out.decrypted,
        held_back: out.held_back,
        quarantined: out.quarantined,
        awaiting_auditor: out.awaiting,
        labels: BTreeMap::new(),
        skipped_epochs: aggregates
            .skipped
            .iter()
            .map(|(i, e)| (i.to_string(), e.0))
            .collect(),
    }
}

fn bin(i: usize) -> Bin {
    Bin::new(i).unwrap_or(Bin::LAST)
}

/// The joint view a decrypted (class, counter) is, if it is one its catalogue knows.
pub fn joint_of(c: &CounterReport) -> Option<Joint> {
    Catalogue::by_version(CatalogueVersion(c.catalogue))?.joint(CounterId(c.counter))
}

/// The summary of a decrypted joint view at its split in `splits` (`None` for a counter, or a
/// view of a catalogue whose views this build's splits do not name).
fn joint_summary(c: &CounterReport, splits: &Splits) -> Option<JointSummary> {
    let joint = joint_of(c)?;
    let split = splits.of(joint.view.name)?;
    Some(JointSummary::new(&joint, &c.bins, split))
}

/// The mean of the bins' representative values, weighted by their counts.
pub fn mean(bins: &[u64; BIN_COUNT], binning: &Binning) -> Option<f64> {
    let total: u64 = bins.iter().sum();
    if total == 0 {
        return None;
    }
    let sum: f64 = bins
        .iter()
        .enumerate()
        .map(|(i, &c)| c as f64 * binning.representative(bin(i)))
        .sum();
    Some(sum / total as f64)
}

/// The representative value of the bin holding the q-quantile.
pub fn quantile(bins: &[u64; BIN_COUNT], binning: &Binning, q: f64) -> Option<f64> {
    let total: u64 = bins.iter().sum();
    if total == 0 || !(0.0..=1.0).contains(&q) {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).max(1);
    let mut seen = 0u64;
    for (i, &c) in bins.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return Some(binning.representative(bin(i)));
        }
    }
    None
}

/// One CSV field: quoted when it holds a comma, quote or line break (RFC 4180), and a text
/// that a spreadsheet would take for a formula (`=`, `+`, `-`, `@`) prefixed with `'`.
fn csv_text(text: &str) -> String {
    let text = if text.starts_with(['=', '+', '-', '@']) {
        format!("'{text}")
    } else {
        text.to_string()
    };
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

fn csv_number(v: Option<f64>) -> String {
    v.map_or(String::new(), |v| v.to_string())
}

fn csv_ids(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
}

/// The report as CSV, one row per decrypted (class, architecture, counter) with what the text
/// report shows: `class,label,arch,counter,name,unit,catalogue,reports,samples,contributors_at_least,sums,
/// epochs,held_back_reports,bound_enforced_by_tokens,mean,p50,p90,p99,merged_from` (epochs and
/// merged_from: ids separated by spaces; statistics empty where unknown).
pub fn to_csv_table(report: &Report) -> String {
    let mut out = String::from(
        "class,label,arch,counter,name,unit,catalogue,reports,samples,contributors_at_least,sums,\
         epochs,held_back_reports,bound_enforced_by_tokens,mean,p50,p90,p99,merged_from\n",
    );
    for c in &report.decrypted {
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
            c.class,
            csv_text(c.label.as_ref().map_or("", Label::as_str)),
            c.arch,
            c.counter,
            csv_text(&c.name),
            csv_text(&c.unit),
            c.catalogue,
            c.reports,
            c.samples,
            c.contributors_at_least,
            c.sums,
            csv_ids(&c.epochs),
            c.held_back_reports,
            c.bound_enforced_by_tokens,
            csv_number(c.mean),
            csv_number(c.p50),
            csv_number(c.p90),
            csv_number(c.p99),
            csv_ids(&c.merged_from),
        ));
    }
    out
}

/// The bins as CSV: one row per non-empty bin of each decrypted (class, architecture, counter),
/// with the bin's edges from the catalogue (empty for a counter it does not know), so a
/// spreadsheet can plot it: `class,label,arch,counter,name,unit,reports,samples,bin,low,high,
/// count,x_low,x_high,y_low,y_high` (a joint view's cell: `low` and `high` empty, the edges
/// of its two counters in the last four columns, empty for a counter's bin).
pub fn to_csv_bins(report: &Report) -> String {
    let mut out = String::from(
        "class,label,arch,counter,name,unit,reports,samples,bin,low,high,count,x_low,x_high,\
         y_low,y_high\n",
    );
    for c in &report.decrypted {
        let binning = crate::scale::binning(c);
        let joint = joint_of(c);
        for (i, &count) in c.bins.iter().enumerate() {
            if count == 0 {
                continue;
            }
            let (lo, hi) = binning.map_or((None, None), |b| {
                let (lo, hi) = b.edges(bin(i));
                (Some(lo), Some(hi))
            });
            let cell = joint.map_or([None; 4], |j| {
                let (cx, cy) = j.cell_of(bin(i));
                let ((xl, xh), (yl, yh)) = (j.x.edges(cx), j.y.edges(cy));
                [Some(xl), Some(xh), Some(yl), Some(yh)]
            });
            out.push_str(&format!(
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
                c.class,
                csv_text(c.label.as_ref().map_or("", Label::as_str)),
                c.arch,
                c.counter,
                csv_text(&c.name),
                csv_text(&c.unit),
                c.reports,
                c.samples,
                i,
                csv_number(lo),
                csv_number(hi),
                count,
                csv_number(cell[0]),
                csv_number(cell[1]),
                csv_number(cell[2]),
                csv_number(cell[3]),
            ));
        }
    }
    out
}

/// The joint views' quadrants as CSV, one row per quadrant of each decrypted joint view:
/// `class,label,arch,counter,view,reports,samples,x_counter,x_split,x_high,y_counter,y_split,
/// y_high,quadrant_samples,share,time_share,time_share_low,time_share_high` (shares 0 to 1;
/// time shares empty where no axis is a duration).
pub fn to_csv_quadrants(report: &Report) -> String {
    let mut out = String::from(
        "class,label,arch,counter,view,reports,samples,x_counter,x_split,x_high,y_counter,\
         y_split,y_high,quadrant_samples,share,time_share,time_share_low,time_share_high\n",
    );
    for c in &report.decrypted {
        let Some(j) = &c.joint else { continue };
        for q in &j.quadrants {
            let t = q.time_share;
            out.push_str(&format!(
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
                c.class,
                csv_text(c.label.as_ref().map_or("", Label::as_str)),
                c.arch,
                c.counter,
                csv_text(&j.view),
                c.reports,
                c.samples,
                csv_text(&j.x.counter),
                j.x.split,
                q.x_high,
                csv_text(&j.y.counter),
                j.y.split,
                q.y_high,
                q.samples,
                q.share,
                csv_number(t.map(|t| t.estimate)),
                csv_number(t.map(|t| t.low)),
                csv_number(t.map(|t| t.high)),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_quantiles_follow_the_bins() {
        let binning = Binning::Linear {
            min: 0.0,
            max: 128.0,
        };
        let mut bins = [0u64; BIN_COUNT];
        bins[10] = 90;
        bins[100] = 10;
        assert_eq!(quantile(&bins, &binning, 0.5), Some(10.5));
        assert_eq!(quantile(&bins, &binning, 0.9), Some(10.5));
        assert_eq!(quantile(&bins, &binning, 0.99), Some(100.5));
        let m = mean(&bins, &binning).unwrap();
        assert!((m - (0.9 * 10.5 + 0.1 * 100.5)).abs() < 1e-9);
        assert_eq!(mean(&[0; BIN_COUNT], &binning), None);
    }

    #[test]
    fn csv_fields_are_quoted_and_formulas_defused() {
        assert_eq!(csv_text("bert-train"), "bert-train");
        assert_eq!(csv_text("a,b"), "\"a,b\"");
        assert_eq!(csv_text("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_text("=cmd()"), "'=cmd()");
        assert_eq!(csv_text("-1,2"), "\"'-1,2\"");
    }

    /// `report --json` reads back into the report it was written from (the demo reads it so),
    /// and writes the same JSON again: every field, the period's dates, labels by class and a
    /// joint view's quadrants included.
    #[test]
    fn a_report_reads_back_from_its_json() {
        use crate::plot::tests::{counter, joint_counter};
        let mut labelled = counter(7, &[(3, 40), (50, 2)]);
        labelled.label = Some(Label::new("llama decode").unwrap());
        let quarantined = Quarantined {
            class: 9,
            arch: "sm_80".into(),
            counter: 2,
            epoch: 20_001,
            generation: 1,
            reports: 4,
            reason: "bins add up to 5, not 4".into(),
        };
        let report = Report {
            period: Some(Period {
                first: penrose_core::wire::Day(20_000),
                last: penrose_core::wire::Day(20_006),
            }),
            threshold: Threshold::new(12).unwrap(),
            reports_per_contributor: ReportsPerContributor::for_servers(48).unwrap(),
            bundles: 2,
            epochs: 3,
            withheld_sums: 4,
            withheld_reports: 55,
            decrypted: vec![labelled.clone(), joint_counter(8)],
            held_back: vec![HeldBack {
                class: 11,
                arch: "sm_90".into(),
                counter: 5,
                reports: 100,
                contributors_at_least: 5,
            }],
            quarantined: vec![quarantined.clone()],
            awaiting_auditor: vec![quarantined],
            skipped_epochs: vec![("aa".repeat(16), 19_999)],
            bound_enforced_by_tokens: true,
            epochs_without_tokens: 0,
            labels: [(7, labelled.label.clone().unwrap())].into(),
        };
        let written = serde_json::to_string_pretty(&report).unwrap();
        assert!(written.contains(r#""from": "2024-10-04""#), "{written}");
        let back: Report = serde_json::from_str(&written).unwrap();
        // Floats up to their last bit, which serde_json's parsing (without its
        // float_roundtrip feature) may not give back; everything else exactly.
        assert!(
            same_json(
                &serde_json::to_value(&back).unwrap(),
                &serde_json::to_value(&report).unwrap()
            ),
            "{back:?}"
        );
        assert_eq!(back.decrypted[0], report.decrypted[0]);
        assert_eq!(back.labels, report.labels);
        assert_eq!(back.period, report.period);
        // The floors hold on the way back in too.
        let low = written.replace(r#""threshold": 12"#, r#""threshold": 9"#);
        assert!(serde_json::from_str::<Report>(&low).is_err());
    }

    /// `a` and `b` hold the same JSON, numbers within a relative 1e-15.
    fn same_json(a: &serde_json::Value, b: &serde_json::Value) -> bool {
        use serde_json::Value;
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
                (Some(x), Some(y)) => (x - y).abs() <= 1e-15 * x.abs().max(y.abs()),
                _ => x == y,
            },
            (Value::Array(x), Value::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
            }
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len()
                    && x.iter()
                        .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
            }
            _ => a == b,
        }
    }
}
