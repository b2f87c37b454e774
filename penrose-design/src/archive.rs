//! Imported bundles: verified against the pinned aggregation server's key, kept verbatim, and
//! accepted only as the next link of the chain the archive follows.
//!
//! A bundle releases closed epochs (`penrose_core::bundle`): each released sum appears in
//! exactly one bundle and never changes. So the archive accepts, per aggregator store
//! (instance), bundle 1, then 2, ..., each naming the hash of the one before, and refuses:
//!
//! - a **fork**: a bundle whose number was already imported with other bytes, or that does
//!   not name the hash of the archived bundle before it;
//! - a **gap**: a bundle beyond the next number;
//! - a **replay** of a bundle already imported is answered "already imported" and changes
//!   nothing (the same bytes);
//! - a **new chain** (another store instance: an aggregation server restored from a backup)
//!   unless imported deliberately with `new_chain`, and only when it descends from the chain
//!   followed so far (its `parent`), so that class ids mean the same. Epochs of a new chain
//!   that an earlier chain already released are never merged: the restored store may hold
//!   another version of them, and two versions of a sum could be differenced. They are listed
//!   as skipped.
//!
//! Every bundle is verified again (signature, chain) when the archive is read, so a file altered
//! on disk is refused rather than decrypted.
//!
//! Layout of the archive directory:
//!
//! ```text
//! aggregator.pub                 the trusted aggregation server's ed25519 key (64 hex
//!                                digits), pinned at the first import
//! chains                         the store instances followed, one per line, oldest first;
//!                                the last is the one imports extend
//! bundles/INSTANCE/SEQ.bundle    each imported bundle (SEQ: 20 digits)
//! bundles/INSTANCE/SEQ.evidence  its contributor evidence, when imported
//!                                (`crate::evidence`), forwarded to the auditor with its pages
//! audit/INSTANCE/SEQ-FIRST.answer the release auditor's answer for the page of that bundle
//!                                starting at entry FIRST (`crate::audit`), verbatim
//! labels                         architects' names for classes (`crate::labels`; mode 0600)
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use ed25519_dalek::VerifyingKey;
use penrose_core::bundle::{
    Bundle, BundleEntry, BundleError, BundleHash, ChainLink, ClassId, ClassMap, EpochId, EpochKind,
    EpochSummary, InstanceId, SumId,
};
use penrose_core::hex::encode as hex;
use penrose_core::paillier::KeyId;
use penrose_core::release::{MIN_CONTRIBUTORS, ReportsPerContributor};
use penrose_core::wire::Day;
use penrose_host::durable::{self, Access};
use thiserror::Error;

/// Why a bundle could not be imported or the archive read.
#[derive(Debug, Error)]
pub enum ArchiveError {
    /// The bundle is malformed, altered, or signed by another server.
    #[error("{path}: {source}")]
    Bundle {
        /// The bundle file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: BundleError,
    },
    /// No aggregation server key is pinned yet and none was given.
    #[error(
        "no aggregation server key is trusted yet: pass --signer with the aggregator's signing-key .pub file"
    )]
    NoTrustedSigner,
    /// A file was not read or written.
    #[error("{0}")]
    File(#[from] penrose_host::FileError),
    /// A key file is not 64 hex digits of an ed25519 public key.
    #[error("{0}: not an ed25519 public key (64 hex digits)")]
    BadSignerFile(PathBuf),
    /// The archive already trusts another aggregation server.
    #[error("this archive trusts aggregation server {trusted}, not {given}")]
    OtherSigner {
        /// The pinned key.
        trusted: String,
        /// The key given.
        given: String,
    },
    /// The labels file is damaged, or a label is refused.
    #[error("{path}: {why}")]
    Labels {
        /// The labels file.
        path: PathBuf,
        /// What is wrong, in words.
        why: String,
    },
    /// The bundle contradicts the chain already imported.
    #[error("{path}: refused, {why}")]
    Chain {
        /// The bundle file (or archived file).
        path: PathBuf,
        /// Fork, gap, new chain: in words, with what to do.
        why: String,
    },
}

impl ArchiveError {
    /// Whether the error is a refusal of the bundle itself (exit code 3), not an I/O failure.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            ArchiveError::Bundle { .. }
                | ArchiveError::OtherSigner { .. }
                | ArchiveError::Chain { .. }
        )
    }
}

/// What an import did.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Imported {
    /// The bundle was added as the next link of its chain.
    New {
        /// The chain (store instance).
        instance: String,
        /// Its number in the chain.
        seq: u64,
        /// Epochs it releases.
        epochs: usize,
        /// Released sums in it.
        entries: usize,
        /// Epochs it holds that an earlier chain released already: never merged.
        skipped_epochs: Vec<u32>,
    },
    /// The same bytes were imported before; nothing changed.
    AlreadyImported {
        /// The chain.
        instance: String,
        /// Its number.
        seq: u64,
    },
}

/// Every released sum the archive holds, merged from its chains.
#[derive(Clone, Debug, Default)]
pub struct Aggregates {
    /// The Paillier keys the sums are under, in the order the archive first met them; an
    /// entry's `key` is an index into it (bundles' own indices are translated on merging).
    pub keys: Vec<KeyId>,
    /// How epochs are cut (`None` when nothing is imported).
    pub epoch_kind: Option<EpochKind>,
    /// The chains followed, oldest first, with their last bundle's number.
    pub chains: Vec<(InstanceId, u64)>,
    /// Bundles merged.
    pub bundles: usize,
    /// The released epochs, each from the first chain that released it.
    pub epochs: BTreeMap<EpochId, EpochSummary>,
    /// Which chain released each epoch.
    pub released_by: BTreeMap<EpochId, InstanceId>,
    /// Every released sum.
    pub entries: BTreeMap<SumId, BundleEntry>,
    /// Epochs a later chain released again: refused, never merged.
    pub skipped: Vec<(InstanceId, EpochId)>,
    /// Classes the aggregator merged into older ones, from every bundle; a later chain's merge
    /// that contradicts an earlier one is ignored (the first chain's stands).
    pub merges: ClassMap,
    /// Where each released sum came from: its chain, bundle and index among the bundle's
    /// entries, which is how the release auditor's partial decryptions name it.
    pub origins: BTreeMap<SumId, SumOrigin>,
}

/// A released sum's place in the archive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SumOrigin {
    /// The chain.
    pub instance: InstanceId,
    /// The bundle's number in it.
    pub seq: u64,
    /// The entry's index in the bundle.
    pub index: u32,
}

/// One archived bundle, verified, with the bytes it was signed as.
#[derive(Clone, Debug)]
pub struct ArchivedBundle {
    /// The chain.
    pub instance: InstanceId,
    /// Its number.
    pub seq: u64,
    /// The bytes as imported (what the auditor checks the signature of).
    pub bytes: Vec<u8>,
    /// The bundle.
    pub bundle: Bundle,
}

impl Aggregates {
    /// The class that holds `class` now: its sums are reported there.
    pub fn root(&self, class: ClassId) -> ClassId {
        self.merges.root(class)
    }

    /// The released epochs whose report days all lie within `period`, with their sums: what
    /// a report over a day or a week adds up. An epoch that straddles the period's edge is
    /// left out whole (its sums cannot be cut, and a part is never made by differencing).
    pub fn within(&self, period: Period) -> Aggregates {
        let kept: BTreeSet<EpochId> = self
            .epochs
            .values()
            .filter(|e| period.contains(e.first_day) && period.contains(e.last_day))
            .map(|e| e.id)
            .collect();
        Aggregates {
            keys: self.keys.clone(),
            epoch_kind: self.epoch_kind,
            chains: self.chains.clone(),
            bundles: self.bundles,
            epochs: filter_by_epoch(&self.epochs, &kept, |&id, _| id),
            released_by: filter_by_epoch(&self.released_by, &kept, |&id, _| id),
            entries: filter_by_epoch(&self.entries, &kept, |id, _| id.epoch),
            skipped: self.skipped.clone(),
            merges: self.merges.clone(),
            origins: filter_by_epoch(&self.origins, &kept, |id, _| id.epoch),
        }
    }
}

/// The rows of `map` whose epoch (`epoch_of`) is in `kept`.
fn filter_by_epoch<K: Ord + Clone, V: Clone>(
    map: &BTreeMap<K, V>,
    kept: &BTreeSet<EpochId>,
    epoch_of: impl Fn(&K, &V) -> EpochId,
) -> BTreeMap<K, V> {
    map.iter()
        .filter(|(k, v)| kept.contains(&epoch_of(k, v)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Days a report covers, both ends included (`penrose-design report --from --until`). In
/// JSON: `{"from": "YYYY-MM-DD", "until": "YYYY-MM-DD"}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Period {
    /// The first day.
    pub first: Day,
    /// The last day.
    pub last: Day,
}

impl Period {
    /// Whether `day` is in it.
    pub fn contains(self, day: Day) -> bool {
        self.first <= day && day <= self.last
    }
}

impl serde::Serialize for Period {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use penrose_core::calendar::date_of;
        use serde::ser::SerializeStruct as _;
        let mut out = serializer.serialize_struct("Period", 2)?;
        out.serialize_field("from", &date_of(self.first))?;
        out.serialize_field("until", &date_of(self.last))?;
        out.end()
    }
}

/// The JSON form's reverse: both dates must be `YYYY-MM-DD`.
impl<'de> serde::Deserialize<'de> for Period {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use penrose_core::calendar::day_of_date;
        #[derive(serde::Deserialize)]
        struct Wire {
            from: String,
            until: String,
        }
        let wire = Wire::deserialize(deserializer)?;
        let day = |date: &str| {
            day_of_date(date)
                .ok_or_else(|| serde::de::Error::custom(format!("{date:?} is no YYYY-MM-DD date")))
        };
        Ok(Period {
            first: day(&wire.from)?,
            last: day(&wire.until)?,
        })
    }
}

impl std::fmt::Display for Period {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use penrose_core::calendar::date_of;
        write!(f, "{} to {}", date_of(self.first), date_of(self.last))
    }
}

/// An archive directory.
#[derive(Debug)]
pub struct Archive {
    dir: PathBuf,
}

pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ArchiveError + '_ {
    move |source| {
        ArchiveError::File(penrose_host::FileError::Io {
            path: path.to_owned(),
            source,
        })
    }
}

/// Reads the aggregation server's bundle-signing key (its `*.pub` file) with the signer reader
/// every tier uses.
pub fn read_signer(path: &Path) -> Result<VerifyingKey, ArchiveError> {
    use penrose_host::key_file::KeyFileError;
    penrose_host::key_file::read_signer(path).map_err(|e| match e {
        KeyFileError::File(e) => ArchiveError::File(e),
        _ => ArchiveError::BadSignerFile(path.to_owned()),
    })
}

/// A refusal of the bundle at `path`: it is not the next link of the chain.
fn refuse(path: &Path, why: String) -> ArchiveError {
    ArchiveError::Chain {
        path: path.to_owned(),
        why,
    }
}

/// Refuses a bundle released under a rule below the floors, or with epochs cut otherwise than
/// the archive's.
fn check_rule(path: &Path, bundle: &Bundle, current: &Aggregates) -> Result<(), ArchiveError> {
    if bundle.rule.threshold < MIN_CONTRIBUTORS
        || bundle.rule.cap < ReportsPerContributor::DEFAULT.get()
    {
        return Err(refuse(
            path,
            format!(
                "released under k = {} and T = {}, below the floors (k >= {MIN_CONTRIBUTORS}, \
                 T >= {})",
                bundle.rule.threshold,
                bundle.rule.cap,
                ReportsPerContributor::DEFAULT.get()
            ),
        ));
    }
    if let Some(kind) = current.epoch_kind
        && kind != bundle.rule.epochs
    {
        return Err(refuse(
            path,
            format!(
                "its epochs are cut by {:?}, the archive's by {kind:?}",
                bundle.rule.epochs
            ),
        ));
    }
    Ok(())
}

/// Refuses a bundle of a chain this archive does not follow: a replaced chain, another chain
/// without `new_chain`, or a new chain that does not descend from the followed one.
fn check_lineage(
    path: &Path,
    link: ChainLink,
    chains: &[InstanceId],
    new_chain: bool,
) -> Result<(), ArchiveError> {
    let followed = chains.last().copied();
    let instance = link.instance;
    let why = match followed {
        Some(f) if f == instance => return Ok(()),
        _ if chains.contains(&instance) => format!(
            "chain {instance} was replaced by chain {}; its later bundles are not imported",
            followed.map_or_else(String::new, |f| f.to_string())
        ),
        Some(f) if !new_chain => format!(
            "it is bundle {} of chain {instance}{}, but this archive follows chain {f}. An \
             aggregation server restored from a backup starts a new chain: if that is what \
             happened, import its bundle 1 with --new-chain",
            link.seq,
            link.parent
                .map_or_else(String::new, |p| format!(" (restored from {p})")),
        ),
        Some(f) if link.parent != Some(f) => format!(
            "chain {instance} does not descend from the chain this archive follows ({f}): its \
             class ids mean other applications; use a new archive"
        ),
        _ => return Ok(()),
    };
    Err(refuse(path, why))
}

/// The epochs of the bundle an earlier chain released (skipped, never merged twice); an
/// epoch an earlier bundle of the same chain released is refused.
fn skipped_epochs(
    path: &Path,
    bundle: &Bundle,
    current: &Aggregates,
) -> Result<Vec<u32>, ArchiveError> {
    let mut skipped = Vec::new();
    for e in &bundle.epochs {
        match current.released_by.get(&e.id) {
            Some(by) if *by == bundle.link.instance => {
                return Err(refuse(
                    path,
                    format!(
                        "epoch {} was already released by an earlier bundle of this chain",
                        e.id.0
                    ),
                ));
            }
            Some(_) => skipped.push(e.id.0),
            None => {}
        }
    }
    Ok(skipped)
}

/// Writes `bytes` to `path` so that a crash leaves either the old state or the whole file.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), ArchiveError> {
    Ok(durable::replace(path, bytes, Access::Public)?)
}

/// One chain as found on disk, verified.
struct Chain {
    instance: InstanceId,
    bundles: Vec<(PathBuf, Vec<u8>, Bundle)>,
}

impl Archive {
    /// Opens (creating) the archive in `dir`.
    pub fn open(dir: &Path) -> Result<Self, ArchiveError> {
        std::fs::create_dir_all(dir.join("bundles")).map_err(io(dir))?;
        Ok(Self {
            dir: dir.to_owned(),
        })
    }

    /// The archive directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn signer_path(&self) -> PathBuf {
        self.dir.join("aggregator.pub")
    }

    fn chains_path(&self) -> PathBuf {
        self.dir.join("chains")
    }

    fn chain_dir(&self, instance: InstanceId) -> PathBuf {
        self.dir.join("bundles").join(instance.to_string())
    }

    fn bundle_path(&self, instance: InstanceId, seq: u64) -> PathBuf {
        self.chain_dir(instance).join(format!("{seq:020}.bundle"))
    }

    /// Where the contributor evidence of bundle `seq` of `instance` is kept.
    pub fn evidence_path(&self, instance: InstanceId, seq: u64) -> PathBuf {
        self.chain_dir(instance).join(format!("{seq:020}.evidence"))
    }

    /// The pinned aggregation server key, if any.
    pub fn trusted_signer(&self) -> Result<Option<VerifyingKey>, ArchiveError> {
        let path = self.signer_path();
        if !path.exists() {
            return Ok(None);
        }
        read_signer(&path).map(Some)
    }

    /// The chains followed, oldest first.
    fn chain_ids(&self) -> Result<Vec<InstanceId>, ArchiveError> {
        let path = self.chains_path();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&path)(e)),
        };
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                l.trim()
                    .parse::<InstanceId>()
                    .map_err(|_| ArchiveError::Chain {
                        path: path.clone(),
                        why: format!("damaged chain list line {l:?}"),
                    })
            })
            .collect()
    }

    /// Reads and verifies one chain: every file 1..=n present, signed by `trusted`, of this
    /// instance, numbered as named, each naming its predecessor's hash.
    fn read_chain(
        &self,
        instance: InstanceId,
        trusted: &VerifyingKey,
    ) -> Result<Chain, ArchiveError> {
        let dir = self.chain_dir(instance);
        let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
            Ok(entries) => entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "bundle"))
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io(&dir)(e)),
        };
        // Names are zero-padded numbers: sorted names are sorted numbers.
        files.sort();
        let mut bundles: Vec<(PathBuf, Vec<u8>, Bundle)> = Vec::with_capacity(files.len());
        for (i, path) in files.into_iter().enumerate() {
            let bytes = std::fs::read(&path).map_err(io(&path))?;
            let bundle =
                Bundle::verify(&bytes, Some(trusted)).map_err(|source| ArchiveError::Bundle {
                    path: path.clone(),
                    source,
                })?;
            let prev = bundles
                .last()
                .map_or(BundleHash::default(), |(_, b, _)| BundleHash::of(b));
            let seq = i as u64 + 1;
            if bundle.link.instance != instance
                || bundle.link.seq != seq
                || bundle.link.prev != prev
                || path != self.bundle_path(instance, seq)
            {
                return Err(ArchiveError::Chain {
                    path,
                    why: format!("the archived chain {instance} is broken at bundle {seq}"),
                });
            }
            bundles.push((path, bytes, bundle));
        }
        Ok(Chain { instance, bundles })
    }

    /// Verifies the bundle at `path` (signature; signer against the pinned key, or against
    /// `signer` which is then pinned) and adds it if it is the next link of the chain this
    /// archive follows, or, with `new_chain`, the first link of a chain restored from it
    /// (module docs). A bundle that fails any check changes nothing.
    pub fn import(
        &self,
        path: &Path,
        signer: Option<&VerifyingKey>,
        new_chain: bool,
    ) -> Result<Imported, ArchiveError> {
        let trusted = self.signer_for(signer)?;
        let bytes = std::fs::read(path).map_err(io(path))?;
        let bundle =
            Bundle::verify(&bytes, Some(&trusted)).map_err(|source| ArchiveError::Bundle {
                path: path.to_owned(),
                source,
            })?;
        // Bundles may be under several Paillier keys (key rollover): each sum is decrypted
        // with the key it is under (`Aggregates::keys`).
        let current = self.merged()?;
        check_rule(path, &bundle, &current)?;
        let chains = self.chain_ids()?;
        let followed = chains.last().copied();
        check_lineage(path, bundle.link, &chains, new_chain)?;
        let instance = bundle.link.instance;
        let head = current
            .chains
            .iter()
            .find(|(i, _)| *i == instance)
            .map_or(0, |(_, seq)| *seq);
        if let Some(already) = self.check_position(path, &bundle, &bytes, head)? {
            return Ok(already);
        }
        let skipped = skipped_epochs(path, &bundle, &current)?;
        self.keep(&bundle, &bytes, &trusted, &chains, followed)?;
        Ok(Imported::New {
            instance: instance.to_string(),
            seq: bundle.link.seq,
            epochs: bundle.epochs.len(),
            entries: bundle.entries.len(),
            skipped_epochs: skipped,
        })
    }

    /// The signer to check a bundle with: the pinned one, or `given` when none is pinned yet;
    /// a given one that differs from the pinned one is refused.
    fn signer_for(&self, given: Option<&VerifyingKey>) -> Result<VerifyingKey, ArchiveError> {
        match (self.trusted_signer()?, given) {
            (Some(pinned), Some(given)) if pinned != *given => Err(ArchiveError::OtherSigner {
                trusted: hex(pinned.as_bytes()),
                given: hex(given.as_bytes()),
            }),
            (Some(pinned), _) => Ok(pinned),
            (None, Some(given)) => Ok(*given),
            (None, None) => Err(ArchiveError::NoTrustedSigner),
        }
    }

    /// Whether the bundle is the next of its chain: `Some` when it was imported before with
    /// the same bytes, an error for a fork or a gap.
    fn check_position(
        &self,
        path: &Path,
        bundle: &Bundle,
        bytes: &[u8],
        head: u64,
    ) -> Result<Option<Imported>, ArchiveError> {
        let link = bundle.link;
        let instance = link.instance;
        if link.seq <= head {
            let archived = self.bundle_path(instance, link.seq);
            let have = std::fs::read(&archived).map_err(io(&archived))?;
            if have == bytes {
                return Ok(Some(Imported::AlreadyImported {
                    instance: instance.to_string(),
                    seq: link.seq,
                }));
            }
            return Err(refuse(
                path,
                format!(
                    "fork: bundle {} of chain {instance} was already imported with other contents",
                    link.seq
                ),
            ));
        }
        if link.seq > head + 1 {
            return Err(refuse(
                path,
                format!(
                    "gap: the archive holds chain {instance} up to bundle {head}; import bundle \
                     {} first (`penrose-aggregator export --seq {}` writes it again)",
                    head + 1,
                    head + 1
                ),
            ));
        }
        if head > 0 {
            let last = self.bundle_path(instance, head);
            let have = std::fs::read(&last).map_err(io(&last))?;
            if link.prev != BundleHash::of(&have) {
                return Err(refuse(
                    path,
                    format!(
                        "fork: bundle {} does not follow the archived bundle {head} of chain \
                         {instance}",
                        link.seq
                    ),
                ));
            }
        }
        Ok(None)
    }

    /// Writes the bundle (and, the first time, the signer it was checked with, and a chain
    /// it starts) durably.
    fn keep(
        &self,
        bundle: &Bundle,
        bytes: &[u8],
        trusted: &VerifyingKey,
        chains: &[InstanceId],
        followed: Option<InstanceId>,
    ) -> Result<(), ArchiveError> {
        let instance = bundle.link.instance;
        if self.trusted_signer()?.is_none() {
            write_atomically(
                &self.signer_path(),
                penrose_host::key_file::signer_line(trusted).as_bytes(),
            )?;
        }
        let dir = self.chain_dir(instance);
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        write_atomically(&self.bundle_path(instance, bundle.link.seq), bytes)?;
        if followed != Some(instance) {
            let mut list: String = chains.iter().map(|c| format!("{c}\n")).collect();
            list.push_str(&format!("{instance}\n"));
            write_atomically(&self.chains_path(), list.as_bytes())?;
        }
        Ok(())
    }

    /// Every archived bundle, verified again, chain by chain (oldest chain first) in order.
    pub fn bundles(&self) -> Result<Vec<ArchivedBundle>, ArchiveError> {
        let Some(trusted) = self.trusted_signer()? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for instance in self.chain_ids()? {
            for (_, bytes, bundle) in self.read_chain(instance, &trusted)?.bundles {
                out.push(ArchivedBundle {
                    instance,
                    seq: bundle.link.seq,
                    bytes,
                    bundle,
                });
            }
        }
        Ok(out)
    }

    /// Where the auditor's answer for the page of bundle `seq` of `instance` starting at
    /// entry `first` is kept.
    pub fn answer_path(&self, instance: InstanceId, seq: u64, first: u32) -> PathBuf {
        self.dir
            .join("audit")
            .join(instance.to_string())
            .join(format!("{seq:020}-{first:010}.answer"))
    }

    /// Every chain's bundles, verified again, merged: each released epoch from the first
    /// chain that released it.
    pub fn merged(&self) -> Result<Aggregates, ArchiveError> {
        let mut out = Aggregates::default();
        let Some(trusted) = self.trusted_signer()? else {
            return Ok(out);
        };
        for instance in self.chain_ids()? {
            let chain = self.read_chain(instance, &trusted)?;
            let mut mine: BTreeSet<EpochId> = BTreeSet::new();
            for (_, _, bundle) in &chain.bundles {
                // The bundle's key indices, translated into the archive's.
                let mut index = Vec::with_capacity(bundle.keys.len());
                for id in &bundle.keys {
                    let at = match out.keys.iter().position(|k| k == id) {
                        Some(at) => at,
                        None => {
                            out.keys.push(*id);
                            out.keys.len() - 1
                        }
                    };
                    index.push(u8::try_from(at).map_err(|_| ArchiveError::Chain {
                        path: self.chains_path(),
                        why: "sums under more than 256 Paillier keys".into(),
                    })?);
                }
                out.epoch_kind = Some(bundle.rule.epochs);
                out.bundles += 1;
                for e in &bundle.epochs {
                    if out.epochs.contains_key(&e.id) && !mine.contains(&e.id) {
                        out.skipped.push((chain.instance, e.id));
                        continue;
                    }
                    mine.insert(e.id);
                    out.epochs.insert(e.id, *e);
                    out.released_by.insert(e.id, chain.instance);
                }
                for (at, entry) in bundle.entries.iter().enumerate() {
                    if mine.contains(&entry.epoch) {
                        let mut entry = entry.clone();
                        // The bundle was verified: every entry's key is listed.
                        entry.key = index.get(usize::from(entry.key)).copied().unwrap_or(0);
                        let origin = SumOrigin {
                            instance: chain.instance,
                            seq: bundle.link.seq,
                            // A bundle holds far fewer than 2^32 entries (it is read whole).
                            index: at as u32,
                        };
                        out.origins.insert(entry.key(), origin);
                        out.entries.insert(entry.key(), entry);
                    }
                }
                for merge in &bundle.merges {
                    // A repeat (a restored chain's first bundle lists its parent's merges) or
                    // a contradiction changes nothing: the first chain's merge stands.
                    let _ = out.merges.insert(*merge);
                }
            }
            out.chains
                .push((chain.instance, chain.bundles.len() as u64));
        }
        Ok(out)
    }
}
