//! Export: the next bundle ([`penrose_core::bundle`]) of the store's chain: the sums of every
//! epoch closed since the last export that reach the contributor threshold, read from one
//! consistent snapshot of the store while ingest keeps writing.
//!
//! Release happens here, on the aggregation server, before any sum reaches the key holder: a
//! sum of a closed epoch is put in the bundle only when `penrose_core::release` counts at
//! least k contributors behind it (reports / (T x days the epoch spans), rounded up); the
//! others are counted in the bundle's epoch summaries and never exported. Open epochs are never
//! exported. Each export is recorded in the store (the bundle's sequence number, hash, day,
//! rule and epochs, in the meta table), so that the next one chains onto it, and a lost bundle
//! file can be written again byte for byte (`export --seq N`: the sums of closed epochs never
//! change and ed25519 signatures are deterministic). Exports are serialised in the process, and
//! a store is open in one process at a time, so two exports can never fork the chain.
//!
//! **Merged classes.** A class merged into an older one (`crate::tables`, healing a split
//! application) may still hold sums of epochs it accumulated before the merge. An export
//! applies every merge made before it (recorded with the cursor of its batch; the link record
//! keeps the cursor the export ran at, so `export --seq N` applies the same ones): the
//! absorbed class's sums are added homomorphically into the survivor's last generation of the
//! same (epoch, architecture, catalogue, counter) while the accumulator bound allows, else
//! released as the
//! survivor's next generation, and the threshold applies to what is released. The bundle
//! lists the merges made since the previous bundle, so that the design server reports sums the
//! absorbed class released before under the survivor too.
//!
//! The server's signing key (ed25519) lives in its data directory, created on first use with
//! mode 0600 and refused when group or others may read it; its public half is written next to
//! it (hex) for the design server to pin.

use std::path::{Path, PathBuf};

use std::collections::BTreeMap;
use std::sync::Mutex;

use ed25519_dalek::SigningKey;
use penrose_core::bundle::{
    Bundle, BundleEntry, BundleError, BundleHash, ChainLink, ClassMap, ClassMerge, Cursor, EpochId,
    EpochKind, EpochSummary, Generation, InstanceId, StatedRule,
};
use penrose_core::evidence::SumEvidence;
use penrose_core::evidence_file::{EvidenceFileHeader, entry_prefix};
use penrose_core::paillier::{
    ACCUMULATOR_REPORT_BOUND, Accumulator, KeyId, PackedCiphertexts, PublicKey,
};
use penrose_core::release::{ReleaseRule, ReportsPerContributor, Threshold, releasable};
use penrose_core::wire::{Day, PackedBytes, WireError};
use rand::RngCore;
use thiserror::Error;

use crate::aggregate::{AshRecord, SumKey};
use crate::copies;
use crate::design_keys::{DesignKeyError, KeySlot, stored_keys};
use crate::epochs::{self, EpochRecord};
use crate::state::{StateError, check_format, meta};
use crate::store::{Store, StoreError, Table, WriteSet};
use crate::tables::{MERGE_PREFIX, decode_merge};
use penrose_host::clock::today;

const KEY_TAG: &[u8; 5] = b"PNSG\x01";

/// Why a bundle or a signing key could not be made.
#[derive(Debug, Error)]
pub enum ExportError {
    /// Reading the store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The store's design keys could not be read.
    #[error(transparent)]
    Keys(#[from] DesignKeyError),
    /// The store cannot be read by this build (its format) or is damaged.
    #[error(transparent)]
    State(#[from] StateError),
    /// A stored sum does not parse.
    #[error("stored sum: {0}")]
    Record(String),
    /// A stored sum's ciphertexts do not form a packed histogram.
    #[error("stored sum: {0}")]
    Wire(#[from] WireError),
    /// Encoding or signing failed.
    #[error(transparent)]
    Bundle(#[from] BundleError),
    /// A file was not read or written.
    #[error("{0}")]
    File(#[from] penrose_host::FileError),
    /// The key file is unsafe to use (a symbolic link, another user's, open to group or
    /// others) or unreadable: [`penrose_host::secret_file::read`] says which.
    #[error("bundle signing key: {0}")]
    Secret(penrose_host::FileError),
    /// The key file is not a signing key.
    #[error("{0} is not a Penrose signing key")]
    NotAKey(PathBuf),
    /// `export --seq` of a bundle that was never exported.
    #[error("bundle {seq} was never exported (the chain has {last})")]
    NoSuchBundle {
        /// Asked for.
        seq: u64,
        /// The last one exported.
        last: u64,
    },
}

/// Reads the signing key at `path`, creating it (0600) and `path.pub` if it does not exist.
pub fn load_or_create_signing_key(path: &Path) -> Result<SigningKey, ExportError> {
    // The shared secret-file reader: no symbolic link, this user's file, mode 0600 or
    // stricter. A key file is the tag and 32 bytes; anything larger is not one.
    match penrose_host::secret_file::read(path, (KEY_TAG.len() + 32) as u64) {
        Ok(bytes) => {
            let seed: [u8; 32] = bytes
                .strip_prefix(KEY_TAG.as_slice())
                .and_then(|s| s.try_into().ok())
                .ok_or_else(|| ExportError::NotAKey(path.to_path_buf()))?;
            Ok(SigningKey::from_bytes(&seed))
        }
        Err(penrose_host::FileError::TooLarge { .. }) => {
            Err(ExportError::NotAKey(path.to_path_buf()))
        }
        Err(penrose_host::FileError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            let mut seed = [0u8; 32];
            rand::rng().fill_bytes(&mut seed);
            let key = SigningKey::from_bytes(&seed);
            let mut bytes = KEY_TAG.to_vec();
            bytes.extend_from_slice(&seed);
            penrose_host::secret_file::create(path, &bytes).map_err(ExportError::Secret)?;
            let text = penrose_host::key_file::signer_line(&key.verifying_key());
            penrose_host::durable::replace(
                &public_key_path(path),
                text.as_bytes(),
                penrose_host::durable::Access::Public,
            )
            .map_err(ExportError::Secret)?;
            Ok(key)
        }
        Err(e) => Err(ExportError::Secret(e)),
    }
}

/// Where the public half of the signing key at `path` is written.
pub fn public_key_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".pub");
    PathBuf::from(name)
}

/// Lower-case hex (the project's one text form of bytes, `penrose_core::hex`).
pub use penrose_core::hex::encode as hex;

/// Meta-table keys of the export chain.
pub mod chain_keys {
    /// The last bundle's sequence number (u64; absent: none yet).
    pub const SEQ: &[u8] = b"chain/seq";
    /// Prefix of one record per bundle: `chain/link/` + seq (u64be) -> hash [32], day u32,
    /// threshold u64, cap u32, as-of cursor u64 (the merges it applied), then the epoch ids
    /// (u32 each).
    pub const LINK: &[u8] = b"chain/link/";
    /// Prefix of one record per exported epoch: `exported/` + id (u32be) -> seq (u64).
    pub const EXPORTED: &[u8] = b"exported/";
}

/// Contributors' worth of reports in one sub-sum (`crate::aggregate`), in units of the
/// threshold: a sub-sum of 2 k T reports meets the threshold alone on a day epoch with room to
/// spare, so release stays as prompt as for one whole sum, and one bad report costs the
/// design server fewer than 4 k T reports (its sub-sum and a short last one folded into it)
/// where it cost the whole (class, counter, epoch). Smaller means less lost per bad report and
/// more sums to store, export and decrypt (docs/crypto.md, "What one bad report costs").
pub const SUB_SUM_THRESHOLDS: u64 = 2;

/// Reports per sub-sum under `rule`: [`SUB_SUM_THRESHOLDS`] x k x T, at most the accumulator
/// bound.
pub fn sub_sum_reports(rule: &ReleaseRule) -> u64 {
    (SUB_SUM_THRESHOLDS * rule.threshold.get() * u64::from(rule.cap.get()))
        .min(ACCUMULATOR_REPORT_BOUND)
}

/// One exported bundle as the store remembers it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct LinkRecord {
    hash: BundleHash,
    day: Day,
    threshold: u64,
    cap: u32,
    /// The store's cursor when the bundle was made: it applied the merges made up to it.
    as_of: Cursor,
    epochs: Vec<EpochId>,
}

impl LinkRecord {
    fn key(seq: u64) -> Vec<u8> {
        let mut k = chain_keys::LINK.to_vec();
        k.extend_from_slice(&seq.to_be_bytes());
        k
    }

    fn value(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(56 + 4 * self.epochs.len());
        v.extend_from_slice(&self.hash.0);
        v.extend_from_slice(&self.day.0.to_be_bytes());
        v.extend_from_slice(&self.threshold.to_be_bytes());
        v.extend_from_slice(&self.cap.to_be_bytes());
        v.extend_from_slice(&self.as_of.0.to_be_bytes());
        for e in &self.epochs {
            v.extend_from_slice(&e.0.to_be_bytes());
        }
        v
    }

    fn decode(v: &[u8]) -> Option<Self> {
        let (hash, rest) = v.split_first_chunk::<32>()?;
        let (day, rest) = rest.split_first_chunk::<4>()?;
        let (threshold, rest) = rest.split_first_chunk::<8>()?;
        let (cap, rest) = rest.split_first_chunk::<4>()?;
        let (as_of, rest) = rest.split_first_chunk::<8>()?;
        if rest.len() % 4 != 0 {
            return None;
        }
        Some(Self {
            hash: BundleHash(*hash),
            day: Day(u32::from_be_bytes(*day)),
            threshold: u64::from_be_bytes(*threshold),
            cap: u32::from_be_bytes(*cap),
            as_of: Cursor(u64::from_be_bytes(*as_of)),
            epochs: rest
                .chunks_exact(4)
                .map(|c| EpochId(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
        })
    }
}

/// What one snapshot of the store says about release and the chain.
struct Snapshot {
    instance: InstanceId,
    parent: Option<InstanceId>,
    kind: EpochKind,
    seq: u64,
    links: BTreeMap<u64, LinkRecord>,
    closed: BTreeMap<EpochId, EpochRecord>,
    exported: BTreeMap<EpochId, u64>,
    /// Epochs a backup copy holds of its parent, never released here (`crate::copies`).
    elsewhere: std::collections::BTreeSet<EpochId>,
    /// The store's cursor (the last committed batch).
    cursor: Cursor,
    /// Every merge and the cursor of the batch that made it.
    merges: Vec<(ClassMerge, Cursor)>,
    ash: Vec<AshRecord>,
}

impl Snapshot {
    /// The closed epochs this chain has still to release: neither exported nor released
    /// elsewhere.
    fn unexported(&self) -> Vec<EpochId> {
        self.closed
            .keys()
            .filter(|id| !self.exported.contains_key(id) && !self.elsewhere.contains(id))
            .copied()
            .collect()
    }

    /// The merges made up to `as_of`, as a map.
    fn class_map(&self, as_of: Cursor) -> Result<ClassMap, ExportError> {
        let mut map = ClassMap::default();
        for (merge, _) in self.merges.iter().filter(|(_, at)| *at <= as_of) {
            map.insert(*merge)
                .map_err(|e| ExportError::Record(e.to_string()))?;
        }
        Ok(map)
    }

    /// The merges made after `after` up to `as_of`, for the bundle that applies them first.
    fn merges_between(&self, after: Cursor, as_of: Cursor) -> Vec<ClassMerge> {
        let mut out: Vec<ClassMerge> = self
            .merges
            .iter()
            .filter(|(_, at)| *at > after && *at <= as_of)
            .map(|(m, _)| *m)
            .collect();
        out.sort();
        out
    }
}

/// Which sums a snapshot reads.
enum Want<'a> {
    /// Those of closed epochs not yet exported (the next bundle).
    Unexported,
    /// Those of these epochs (a bundle again).
    Epochs(&'a [EpochId]),
    /// Every sum, open epochs included.
    All,
}

/// Reads the meta table, then the sums `want` names: only those are held in memory, so an
/// export costs the epochs it releases, not the store's history. Two reads, but the sums of
/// closed epochs never change, so the second read agrees with the first.
fn snapshot(store: &dyn Store, want: Want<'_>) -> Result<Snapshot, ExportError> {
    check_format(store)?;
    copies::check_home(store)?;
    let mut meta = MetaScan::default();
    // A damaged record does not stop the scan; the last one found is the error.
    let mut bad: Option<ExportError> = None;
    store.scan(&[Table::Meta], &mut |table, k, v| {
        if matches!(table, Table::Meta)
            && let Err(e) = meta.read(k, v)
        {
            bad = Some(e);
        }
        Ok(())
    })?;
    if let Some(e) = bad {
        return Err(e);
    }
    let wanted: Option<std::collections::BTreeSet<EpochId>> = match want {
        Want::Unexported => Some(meta.snap.unexported().into_iter().collect()),
        Want::Epochs(ids) => Some(ids.iter().copied().collect()),
        Want::All => None,
    };
    if wanted.as_ref().is_none_or(|w| !w.is_empty()) {
        meta.snap.ash = read_sums(store, wanted.as_ref())?;
    }
    meta.finish()
}

/// The sums of the epochs in `wanted` (every sum for `None`); a stored sum that does not
/// parse fails the read once the scan is done (the last such one is the error).
fn read_sums(
    store: &dyn Store,
    wanted: Option<&std::collections::BTreeSet<EpochId>>,
) -> Result<Vec<AshRecord>, ExportError> {
    let mut ash = Vec::new();
    let mut bad: Option<ExportError> = None;
    store.scan(&[Table::Ash], &mut |_, k, v| {
        match AshRecord::decode(k, v) {
            Ok(record) => {
                if wanted.is_none_or(|w| w.contains(&record.key.epoch)) {
                    ash.push(record);
                }
            }
            Err(e) => bad = Some(ExportError::Record(e.to_string())),
        }
        Ok(())
    })?;
    match bad {
        Some(e) => Err(e),
        None => Ok(ash),
    }
}

/// A snapshot as the meta table's scan fills it, before the instance id and the epoch kind
/// (which every store holds) are known to be there.
struct MetaScan {
    snap: Snapshot,
    instance: Option<InstanceId>,
    kind: Option<EpochKind>,
}

impl Default for MetaScan {
    fn default() -> Self {
        Self {
            snap: Snapshot {
                instance: InstanceId::default(),
                parent: None,
                kind: EpochKind::Day,
                seq: 0,
                links: BTreeMap::new(),
                closed: BTreeMap::new(),
                exported: BTreeMap::new(),
                elsewhere: std::collections::BTreeSet::new(),
                cursor: Cursor(0),
                merges: Vec::new(),
                ash: Vec::new(),
            },
            instance: None,
            kind: None,
        }
    }
}

/// A meta record whose value does not decode.
fn damaged(what: &str) -> ExportError {
    ExportError::Record(format!("damaged meta record {what}"))
}

/// The value `v` as `N` bytes, or the damaged record `what`.
fn fixed<const N: usize>(v: &[u8], what: &str) -> Result<[u8; N], ExportError> {
    <[u8; N]>::try_from(v).map_err(|_| damaged(what))
}

impl MetaScan {
    /// Takes in one meta record (the others are of no concern to export).
    fn read(&mut self, k: &[u8], v: &[u8]) -> Result<(), ExportError> {
        let snap = &mut self.snap;
        if k == meta::INSTANCE {
            self.instance = Some(InstanceId(fixed(v, "chain/instance")?));
        } else if k == meta::PARENT {
            snap.parent = Some(InstanceId(fixed(v, "chain/parent")?));
        } else if k == epochs::keys::KIND {
            self.kind = v.first().copied().and_then(EpochKind::from_code);
        } else if k == meta::CURSOR {
            snap.cursor = Cursor(u64::from_be_bytes(fixed(v, "cursor")?));
        } else if k.starts_with(MERGE_PREFIX) {
            let merge = decode_merge(k, v).map_err(|e| ExportError::Record(e.to_string()))?;
            snap.merges.push(merge);
        } else if k == chain_keys::SEQ {
            snap.seq = u64::from_be_bytes(fixed(v, "chain/seq")?);
        } else if k.starts_with(chain_keys::LINK) {
            self.read_link(k, v)?;
        } else if k.starts_with(chain_keys::EXPORTED) {
            self.read_exported(k, v)?;
        } else if k.starts_with(copies::keys::ELSEWHERE) {
            let id = copies::decode_elsewhere_key(k).ok_or_else(|| damaged("copy/elsewhere"))?;
            snap.elsewhere.insert(id);
        } else if k.starts_with(epochs::keys::RECORD) {
            match EpochRecord::decode(k, v) {
                Some(r) if r.closed => {
                    snap.closed.insert(r.id, r);
                }
                Some(_) => {}
                None => return Err(damaged("epoch record")),
            }
        }
        Ok(())
    }

    /// A bundle's link record: `chain/link/` + seq.
    fn read_link(&mut self, k: &[u8], v: &[u8]) -> Result<(), ExportError> {
        let seq = k[chain_keys::LINK.len()..]
            .try_into()
            .ok()
            .map(u64::from_be_bytes);
        match (seq, LinkRecord::decode(v)) {
            (Some(seq), Some(link)) => {
                self.snap.links.insert(seq, link);
                Ok(())
            }
            _ => Err(damaged("chain/link")),
        }
    }

    /// The bundle an epoch was exported in: `exported/` + epoch id.
    fn read_exported(&mut self, k: &[u8], v: &[u8]) -> Result<(), ExportError> {
        let id = k[chain_keys::EXPORTED.len()..]
            .try_into()
            .ok()
            .map(u32::from_be_bytes);
        match (id, <[u8; 8]>::try_from(v)) {
            (Some(id), Ok(seq)) => {
                self.snap
                    .exported
                    .insert(EpochId(id), u64::from_be_bytes(seq));
                Ok(())
            }
            _ => Err(damaged("exported")),
        }
    }

    /// The snapshot, once the instance id and the epoch kind are known to be there.
    fn finish(self) -> Result<Snapshot, ExportError> {
        let mut snap = self.snap;
        snap.instance = self
            .instance
            .ok_or_else(|| ExportError::Record("no instance id".into()))?;
        snap.kind = self
            .kind
            .ok_or_else(|| ExportError::Record("no epoch kind".into()))?;
        Ok(snap)
    }
}

/// What one bundle applies: the merges up to its cursor, and those it is the first to apply.
struct Merges {
    map: ClassMap,
    new: Vec<ClassMerge>,
}

/// Builds the bundle of `epochs` (closed ones) under `rule`, as link `seq` after `prev`.
#[allow(clippy::too_many_arguments)]
fn build(
    snap: &Snapshot,
    keys: &[PublicKey],
    epochs: &[EpochId],
    rule: StatedRule,
    seq: u64,
    prev: BundleHash,
    day: Day,
    merges: Merges,
) -> Result<Built, ExportError> {
    let threshold =
        Threshold::new(rule.threshold).map_err(|e| ExportError::Record(e.to_string()))?;
    let cap = ReportsPerContributor::for_servers(rule.cap)
        .map_err(|e| ExportError::Record(e.to_string()))?;
    let mut summaries = epoch_summaries(snap, epochs)?;
    let records = snap
        .ash
        .iter()
        .filter(|r| summaries.contains_key(&r.key.epoch));
    let grouping = Grouping {
        threshold,
        cap,
        summaries: &summaries.clone(),
    };
    let released = combine(keys, records, &merges.map, Some(&grouping))?;
    let mut entries = withhold(released, &mut summaries, threshold, cap);
    let listed = list_keys(keys, &mut entries)?;
    entries.sort_by_key(|r| r.entry.key());
    let (entries, made_of) = entries.into_iter().map(|r| (r.entry, r.made_of)).unzip();
    let bundle = Bundle {
        signer: [0; 32],
        keys: listed,
        link: ChainLink {
            instance: snap.instance,
            parent: snap.parent,
            seq,
            prev,
        },
        day,
        rule,
        epochs: summaries.into_values().collect(),
        entries,
        merges: merges.new,
    };
    Ok(Built { bundle, made_of })
}

/// The summary of each of `epochs` (closed ones), nothing withheld yet.
fn epoch_summaries(
    snap: &Snapshot,
    epochs: &[EpochId],
) -> Result<BTreeMap<EpochId, EpochSummary>, ExportError> {
    let mut summaries: BTreeMap<EpochId, EpochSummary> = BTreeMap::new();
    for id in epochs {
        let record = snap
            .closed
            .get(id)
            .ok_or_else(|| ExportError::Record(format!("epoch {} is not closed", id.0)))?;
        summaries.insert(
            *id,
            EpochSummary {
                id: *id,
                first_day: record.first_day,
                last_day: record.last_day,
                reports: record.reports,
                withheld_sums: 0,
                withheld_reports: 0,
                reports_with_tokens: record.reports_with_tokens,
            },
        );
    }
    Ok(summaries)
}

/// The sums that meet the threshold for their epoch's days; the others are counted as
/// withheld in their epoch's summary (a sum of an epoch without one is dropped).
fn withhold(
    released: Vec<Released>,
    summaries: &mut BTreeMap<EpochId, EpochSummary>,
    threshold: Threshold,
    cap: ReportsPerContributor,
) -> Vec<Released> {
    let mut entries = Vec::new();
    for released in released {
        let entry = &released.entry;
        let Some(summary) = summaries.get_mut(&entry.epoch) else {
            continue;
        };
        if !releasable(entry.reports, summary.days(), threshold, cap) {
            summary.withheld_sums += 1;
            summary.withheld_reports += entry.reports;
            continue;
        }
        entries.push(released);
    }
    entries
}

/// The keys the bundle lists, by slot: those its entries are under (the newest key when it
/// has none); each entry's slot becomes its index in that list.
fn list_keys(keys: &[PublicKey], entries: &mut [Released]) -> Result<Vec<KeyId>, ExportError> {
    let mut slots: Vec<u8> = entries.iter().map(|r| r.entry.key).collect();
    slots.sort_unstable();
    slots.dedup();
    if slots.is_empty() {
        let last = u8::try_from(keys.len().saturating_sub(1))
            .map_err(|_| ExportError::Record("more than 256 design keys".into()))?;
        slots.push(last);
    }
    let listed = slots
        .iter()
        .map(|&slot| {
            keys.get(usize::from(slot))
                .map(PublicKey::key_id)
                .ok_or_else(|| ExportError::Record(format!("no design key in slot {slot}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    for r in entries.iter_mut() {
        r.entry.key = slots
            .iter()
            .position(|&s| s == r.entry.key)
            .unwrap_or_default() as u8;
    }
    Ok(listed)
}

/// A bundle as built, and what each of its entries was made of.
struct Built {
    bundle: Bundle,
    /// Per entry, in the bundle's order: the stored generations added into it.
    made_of: Vec<Vec<(SumKey, Generation)>>,
}

/// One released sum and the stored generations it adds up.
struct Released {
    entry: BundleEntry,
    made_of: Vec<(SumKey, Generation)>,
}

/// The release rule a bundle's sums are grouped by: a group is closed as soon as it alone
/// meets the threshold for its epoch's days.
struct Grouping<'a> {
    threshold: Threshold,
    cap: ReportsPerContributor,
    summaries: &'a BTreeMap<EpochId, EpochSummary>,
}

impl Grouping<'_> {
    fn releasable(&self, reports: u64, epoch: EpochId) -> bool {
        let days = self.summaries.get(&epoch).map_or(1, EpochSummary::days);
        releasable(reports, days, self.threshold, self.cap)
    }
}

/// One released sum in the making.
struct Piece<'a> {
    reports: u64,
    samples: u64,
    sum: PackedCiphertexts,
    /// The record it began with.
    first: &'a AshRecord,
    /// Every record added into it.
    made_of: Vec<(SumKey, Generation)>,
}

impl<'a> Piece<'a> {
    fn of(record: &'a AshRecord, sum: PackedCiphertexts) -> Self {
        Piece {
            reports: record.reports,
            samples: record.samples,
            sum,
            first: record,
            made_of: vec![(record.key, record.generation)],
        }
    }

    /// The released sum it makes: generation `generation` of class `root` under the key in
    /// `slot`.
    fn released(
        self,
        key: &PublicKey,
        root: penrose_core::bundle::ClassId,
        slot: KeySlot,
        generation: Generation,
    ) -> Result<Released, ExportError> {
        let first = self.first;
        let entry = BundleEntry {
            epoch: first.key.epoch,
            class: root,
            arch: first.key.arch,
            key: slot.0,
            catalogue: first.key.catalogue,
            counter: first.key.counter,
            generation,
            reports: self.reports,
            samples: self.samples,
            sums: PackedBytes::new(self.sum.to_bytes(), key.size().ciphertexts_per_histogram())?,
        };
        Ok(Released {
            entry,
            made_of: self.made_of,
        })
    }
}

/// The sums of one (epoch, surviving class, architecture, key slot, catalogue, counter).
type SumGroup = (
    EpochId,
    penrose_core::bundle::ClassId,
    penrose_core::gpu::GpuArch,
    KeySlot,
    u16,
    u16,
);

/// The sums `records` stand for with every class resolved through `map`: per (epoch, class,
/// architecture, catalogue, counter) the surviving class's generations (sub-sums), then each
/// absorbed class's (in class and generation order). Grouped by a release rule, consecutive
/// pieces are added while the group does not yet meet the threshold alone, and a short last
/// group is folded into the one before, so that each released sum is as small as the rule
/// allows (one bad report costs one of them) and no report is withheld that the whole sum
/// would release. Without a rule the survivor's generations stay as they are and absorbed
/// ones are added into the last (for tests and offline checks). Combined reports always stay
/// within the accumulator bound.
fn combine<'a>(
    keys: &[PublicKey],
    records: impl Iterator<Item = &'a AshRecord>,
    map: &ClassMap,
    grouping: Option<&Grouping>,
) -> Result<Vec<Released>, ExportError> {
    let mut groups: BTreeMap<SumGroup, Vec<&AshRecord>> = BTreeMap::new();
    for r in records {
        let root = map.root(r.key.class);
        groups
            .entry((
                r.key.epoch,
                root,
                r.key.arch,
                r.key.key,
                r.key.catalogue.0,
                r.key.counter.0,
            ))
            .or_default()
            .push(r);
    }
    let mut out = Vec::new();
    for ((epoch, root, _, slot, _, _), pieces) in groups {
        let key = keys
            .get(usize::from(slot.0))
            .ok_or_else(|| ExportError::Record(format!("no design key in slot {}", slot.0)))?;
        let sums = add_up(key, epoch, root, pieces, grouping)?;
        for (generation, piece) in sums.into_iter().enumerate() {
            out.push(piece.released(key, root, slot, Generation(generation as u32))?);
        }
    }
    Ok(out)
}

/// One group's stored sums (`pieces`, of `epoch` under surviving class `root`) added up into
/// the sums it releases, as [`combine`] says.
fn add_up<'a>(
    key: &PublicKey,
    epoch: EpochId,
    root: penrose_core::bundle::ClassId,
    mut pieces: Vec<&'a AshRecord>,
    grouping: Option<&Grouping>,
) -> Result<Vec<Piece<'a>>, ExportError> {
    // The survivor's own first, then the absorbed classes', each by generation.
    pieces.sort_by_key(|r| (r.key.class != root, r.key.class, r.generation));
    let joins = |last: &Piece, r: &AshRecord| match grouping {
        Some(rule) => !rule.releasable(last.reports, epoch),
        None => r.key.class != root,
    };
    let mut sums: Vec<Piece> = Vec::new();
    for r in pieces {
        let piece = Piece::of(r, decrypted_form(key, r)?);
        match sums.last_mut() {
            Some(last)
                if last.reports + r.reports <= ACCUMULATOR_REPORT_BOUND && joins(last, r) =>
            {
                add_into(key, last, piece)?;
            }
            _ => sums.push(piece),
        }
    }
    if let Some(rule) = grouping {
        fold_short_last(key, &mut sums, |reports| rule.releasable(reports, epoch))?;
    }
    Ok(sums)
}

/// Adds `piece` into `into` homomorphically.
fn add_into<'a>(
    key: &PublicKey,
    into: &mut Piece<'a>,
    piece: Piece<'a>,
) -> Result<(), ExportError> {
    into.sum = key
        .add_packed(&into.sum, &piece.sum)
        .map_err(|e| record_error(piece.first, e))?;
    into.reports += piece.reports;
    into.samples += piece.samples;
    into.made_of.extend(piece.made_of);
    Ok(())
}

/// Folds a last group that does not meet the rule alone into the one before, while the
/// accumulator bound allows.
fn fold_short_last(
    key: &PublicKey,
    sums: &mut Vec<Piece>,
    releasable: impl Fn(u64) -> bool,
) -> Result<(), ExportError> {
    let short = sums.last().is_some_and(|last| !releasable(last.reports));
    if short && sums.len() >= 2 {
        let fits =
            sums.iter().rev().take(2).map(|p| p.reports).sum::<u64>() <= ACCUMULATOR_REPORT_BOUND;
        if let (true, Some(last)) = (fits, sums.pop())
            && let Some(before) = sums.last_mut()
        {
            add_into(key, before, last)?;
        }
    }
    Ok(())
}

/// Serialises exports in this process (a store is open in one process at a time).
static EXPORTING: Mutex<()> = Mutex::new(());

/// The next bundle of the chain: every epoch closed and not yet exported, its sums at or above
/// the threshold, signed and recorded as exported. `None` when no epoch closed since the last
/// export (nothing is recorded then).
pub fn export(
    store: &dyn Store,
    release: ReleaseRule,
    signing: &SigningKey,
) -> Result<Option<(Bundle, Vec<u8>)>, ExportError> {
    let _one_at_a_time = EXPORTING.lock().unwrap_or_else(|p| p.into_inner());
    let keys = stored_keys(store)?;
    let snap = snapshot(store, Want::Unexported)?;
    let epochs = snap.unexported();
    if epochs.is_empty() {
        return Ok(None);
    }
    let seq = snap.seq + 1;
    let prev = match snap.seq {
        0 => BundleHash::default(),
        last => {
            snap.links
                .get(&last)
                .ok_or_else(|| ExportError::Record(format!("no record of bundle {last}")))?
                .hash
        }
    };
    let rule = StatedRule {
        epochs: snap.kind,
        threshold: release.threshold.get(),
        cap: release.cap.get(),
    };
    let as_of = snap.cursor;
    let after = snap.links.get(&snap.seq).map_or(Cursor(0), |l| l.as_of);
    let merges = Merges {
        map: snap.class_map(as_of)?,
        new: snap.merges_between(after, as_of),
    };
    let mut bundle = build(&snap, &keys, &epochs, rule, seq, prev, today(), merges)?.bundle;
    let bytes = bundle.sign(signing)?;
    bundle.signer = *signing.verifying_key().as_bytes();
    let link = LinkRecord {
        hash: BundleHash::of(&bytes),
        day: bundle.day,
        threshold: rule.threshold,
        cap: rule.cap,
        as_of,
        epochs: epochs.clone(),
    };
    let mut set = WriteSet::new();
    set.put(Table::Meta, chain_keys::SEQ, seq.to_be_bytes().to_vec());
    set.put(Table::Meta, LinkRecord::key(seq), link.value());
    for id in &epochs {
        let mut k = chain_keys::EXPORTED.to_vec();
        k.extend_from_slice(&id.0.to_be_bytes());
        set.put(Table::Meta, k, seq.to_be_bytes().to_vec());
    }
    store.write(set)?;
    Ok(Some((bundle, bytes)))
}

/// Bundle `seq` of the chain again, byte for byte (for a bundle file that was lost), checked
/// against the hash recorded when it was first exported.
pub fn reexport(
    store: &dyn Store,
    seq: u64,
    signing: &SigningKey,
) -> Result<(Bundle, Vec<u8>), ExportError> {
    let (built, bytes) = rebuild(store, seq, signing)?;
    Ok((built.bundle, bytes))
}

/// The contributor evidence of bundle `seq`, one [`SumEvidence`] per entry in the bundle's
/// order: every report kept for the generations each released sum adds up (`crate::evidence`;
/// empty where none was kept). The bundle is rebuilt and checked against the hash recorded
/// when it was first exported, so the evidence is of exactly the sums that were released.
pub fn evidence(
    store: &dyn Store,
    seq: u64,
    signing: &SigningKey,
) -> Result<(Bundle, Vec<SumEvidence>), ExportError> {
    let (built, _) = rebuild(store, seq, signing)?;
    let evidence = built
        .made_of
        .iter()
        .map(|pieces| {
            crate::evidence::sum_evidence(store, pieces)
                .map_err(|e| ExportError::Record(e.to_string()))
        })
        .collect::<Result<_, _>>()?;
    Ok((built.bundle, evidence))
}

/// The epochs released in bundles `1..=through` of this chain: whose evidence the auditor has
/// answered once bundle `through` is answered. [`ExportError::NoSuchBundle`] past the last.
pub fn epochs_exported_through(
    store: &dyn Store,
    through: u64,
) -> Result<std::collections::BTreeSet<EpochId>, ExportError> {
    let snap = snapshot(store, Want::Epochs(&[]))?;
    if through == 0 || through > snap.seq {
        return Err(ExportError::NoSuchBundle {
            seq: through,
            last: snap.seq,
        });
    }
    Ok(snap
        .exported
        .iter()
        .filter(|(_, seq)| **seq <= through)
        .map(|(epoch, _)| *epoch)
        .collect())
}

/// What [`write_evidence`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EvidenceWritten {
    /// Entries of the bundle (one evidence list each).
    pub entries: u64,
    /// Reports listed over all entries.
    pub reports: u64,
    /// Of them, reports that carried an evidence token.
    pub with_tokens: u64,
    /// Bytes written.
    pub bytes: u64,
}

/// Writes the evidence file of bundle `seq` to `out` (`penrose_core::evidence`,
/// `EVIDENCE_FILE_MAGIC`): the header with the bundle's hash, then each entry's evidence in
/// the bundle's order, one entry in memory at a time. The bundle is rebuilt and checked as
/// [`evidence`] does.
pub fn write_evidence(
    store: &dyn Store,
    seq: u64,
    signing: &SigningKey,
    out: &mut dyn std::io::Write,
    path: &Path,
) -> Result<EvidenceWritten, ExportError> {
    let (built, bytes) = rebuild(store, seq, signing)?;
    let io = |source| {
        ExportError::File(penrose_host::FileError::Io {
            path: path.to_path_buf(),
            source,
        })
    };
    let header = EvidenceFileHeader {
        bundle: BundleHash::of(&bytes),
        entries: u32::try_from(built.made_of.len())
            .map_err(|_| ExportError::Record("more entries than a bundle holds".into()))?,
    }
    .encode();
    out.write_all(&header).map_err(io)?;
    let mut written = EvidenceWritten {
        bytes: header.len() as u64,
        ..EvidenceWritten::default()
    };
    for pieces in &built.made_of {
        let listed = crate::evidence::sum_evidence(store, pieces)
            .map_err(|e| ExportError::Record(e.to_string()))?;
        let encoded = listed.encode();
        out.write_all(&entry_prefix(&encoded)).map_err(io)?;
        out.write_all(&encoded).map_err(io)?;
        written.entries += 1;
        written.reports += listed.reports().len() as u64;
        written.with_tokens += listed
            .reports()
            .iter()
            .filter(|r| r.token.is_some())
            .count() as u64;
        written.bytes += 4 + encoded.len() as u64;
    }
    Ok(written)
}

/// Bundle `seq` rebuilt from the store, with what each entry is made of, and its signed bytes,
/// which must hash to what was recorded at its export.
fn rebuild(
    store: &dyn Store,
    seq: u64,
    signing: &SigningKey,
) -> Result<(Built, Vec<u8>), ExportError> {
    let keys = stored_keys(store)?;
    let meta = snapshot(store, Want::Epochs(&[]))?;
    let epochs = meta
        .links
        .get(&seq)
        .map(|l| l.epochs.clone())
        .unwrap_or_default();
    let snap = snapshot(store, Want::Epochs(&epochs))?;
    let link = snap
        .links
        .get(&seq)
        .filter(|_| seq >= 1 && seq <= snap.seq)
        .ok_or(ExportError::NoSuchBundle {
            seq,
            last: snap.seq,
        })?;
    let prev = match seq {
        1 => BundleHash::default(),
        n => {
            snap.links
                .get(&(n - 1))
                .ok_or_else(|| ExportError::Record(format!("no record of bundle {}", n - 1)))?
                .hash
        }
    };
    let rule = StatedRule {
        epochs: snap.kind,
        threshold: link.threshold,
        cap: link.cap,
    };
    let after = match seq {
        1 => Cursor(0),
        n => snap.links.get(&(n - 1)).map_or(Cursor(0), |l| l.as_of),
    };
    let merges = Merges {
        map: snap.class_map(link.as_of)?,
        new: snap.merges_between(after, link.as_of),
    };
    let mut built = build(
        &snap,
        &keys,
        &link.epochs,
        rule,
        seq,
        prev,
        link.day,
        merges,
    )?;
    let bytes = built.bundle.sign(signing)?;
    built.bundle.signer = *signing.verifying_key().as_bytes();
    if BundleHash::of(&bytes) != link.hash {
        return Err(ExportError::Record(format!(
            "bundle {seq} no longer rebuilds to the bytes first exported (the store changed \
             under a released epoch, or the signing key did)"
        )));
    }
    Ok((built, bytes))
}

/// Every sum of the store, open epochs included, summed and merged by the same code export
/// uses (every merge so far applied), for tests and offline checks that compare the store
/// with what was sent. Never signed, never released.
pub fn all_sums(store: &dyn Store) -> Result<Vec<BundleEntry>, ExportError> {
    let keys = stored_keys(store)?;
    let snap = snapshot(store, Want::All)?;
    let released = combine(&keys, snap.ash.iter(), &snap.class_map(snap.cursor)?, None)?;
    Ok(released.into_iter().map(|r| r.entry).collect())
}

/// The sum a stored accumulator state stands for: one exponentiation to take out the
/// Montgomery factor the state carries.
fn decrypted_form(key: &PublicKey, r: &AshRecord) -> Result<PackedCiphertexts, ExportError> {
    Accumulator::restore(key, ACCUMULATOR_REPORT_BOUND, &r.sums, r.reports, r.samples)
        .and_then(|state| state.sum())
        .map_err(|e| record_error(r, e))
}

fn record_error(r: &AshRecord, e: impl std::fmt::Display) -> ExportError {
    ExportError::Record(format!(
        "class {} arch {} catalogue {} counter {} epoch {} key slot {} generation {}: {e}",
        r.key.class.0,
        r.key.arch,
        r.key.catalogue.0,
        r.key.counter.0,
        r.key.epoch.0,
        r.key.key.0,
        r.generation.0
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn signing_key_is_created_private_and_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("server.key");
        let key = load_or_create_signing_key(&path).unwrap();
        let mode = std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(&path).unwrap()) & 0o777;
        assert_eq!(mode, 0o600);
        let again = load_or_create_signing_key(&path).unwrap();
        assert_eq!(key.to_bytes(), again.to_bytes());
        let public = penrose_host::key_file::read_signer(&public_key_path(&path)).unwrap();
        assert_eq!(public, key.verifying_key());

        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        assert!(matches!(
            load_or_create_signing_key(&path),
            Err(ExportError::Secret(penrose_host::FileError::TooOpen {
                mode: 0o644,
                ..
            }))
        ));
        let other = dir.path().join("junk.key");
        std::fs::write(&other, b"junk").unwrap();
        std::fs::set_permissions(&other, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        assert!(matches!(
            load_or_create_signing_key(&other),
            Err(ExportError::NotAKey(_))
        ));
    }
}
