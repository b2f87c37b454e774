//! Export bundles: the released sums the aggregation server hands to the design server, signed
//! by the aggregation server and chained, so that the design server imports only what its own
//! aggregator released, each sum once, in order.
//!
//! ```text
//! bundle  = "PNBD"  version:u8  body  signature:[64]      (ed25519 over everything before it)
//! body    = signer:[32]  keys  instance:[16]  parent:[16]  seq:u64be  prev:[32]
//!           day:u32be  epoch_kind:u8  threshold:u64be  cap:u32be
//!           epoch_count:u32be  epoch * epoch_count  entry_count:u32be  entry * entry_count
//!           merge_count:u32be  merge * merge_count
//! epoch   = id:u32be  first_day:u32be  last_day:u32be  reports:u64be
//!           withheld_sums:u32be  withheld_reports:u64be  reports_with_tokens:u64be
//! keys    = key_count:u8  key_id:[32] * key_count   (version 6; before it one key_id:[32])
//! entry   = epoch:u32be  class:u32be  arch:[2]  key:u8  catalogue:u16be  counter:u16be
//!           generation:u32be  reports:u64be  samples:u64be  n:u8  ct_len:u16be
//!           sums:[n * ct_len]                        (key: version 6, an index into keys)
//! merge   = absorbed:u32be  into:u32be
//! ```
//!
//! **Keys.** The design server's key rolls over (`crate::key_list`), and during the grace days
//! reports of one epoch arrive under two keys; their sums are kept apart. A bundle lists the
//! Paillier keys its sums are under and each entry names its key by index (version 6 on;
//! entries of older bundles are all under their one key).
//!
//! **Release.** A bundle carries only *closed* epochs, and of each only the sums whose
//! contributor bound (`crate::release`) reaches the threshold; the rest are counted in the
//! epoch's `withheld_*` fields and never leave the aggregator. A closed epoch's sums never
//! change and every report is in exactly one of them, so no two released sums can be
//! differenced down to a few reports.
//!
//! **Architecture.** Sums are kept per (class, GPU architecture, counter): counters of different
//! GPU generations do not add up. Each entry names its generation (`crate::gpu`, version 5
//! on); entries of version 3 and 4 bundles, written before reports carried one, read as
//! [`GpuArch::UNKNOWN`] (their sums may mix generations), and a version 5 entry must name a
//! generation a report may name.
//!
//! **Admission.** Each epoch says how many of its reports were admitted by a verified,
//! once-spent admission token (`crate::tokens`; version 4 on, 0 in a version 3 bundle). When
//! all of them were, the contributor bound of its sums rests on the issuer's quota of T tokens
//! per agent, counter and day, enforced on every sender, not on agents keeping their own cap.
//!
//! **Merges.** The aggregator joins classes that turned out to be one application (a snippet
//! matched both). A bundle's entries are under the classes that hold them as of the bundle,
//! and it lists the merges it is the first to apply, so that a design server can count sums an
//! absorbed class released in earlier bundles under the class that absorbed it. A merge goes
//! to an older class (a lower id), and no entry of the bundle is under a class it merges away.
//!
//! **Chain.** Each aggregator store has a random `instance` id; its bundles are numbered
//! `seq` = 1, 2, ... and each names the SHA-256 of the whole previous bundle (`prev`; zeros
//! for the first). The design server accepts bundle n + 1 of the chain it follows only after
//! bundle n, so a forked, gapped or replayed history is refused. A store restored from a backup
//! is a new instance whose `parent` is the instance it was copied from (zeros otherwise).
//!
//! This module lives in the I/O-free core (behind the `bundle` feature) so that the design
//! server can decode and verify bundles without linking the aggregator's storage.

use std::collections::HashSet;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::counters::{CatalogueVersion, CounterId};
use crate::gpu::GpuArch;
use crate::paillier::KeyId;
use crate::wire::{Day, MAX_CIPHERTEXTS, PackedBytes, WireError};

/// The bundle format version this build writes. 6: a bundle lists its Paillier keys and each
/// entry names its own (key rollover); 5: each entry names its GPU architecture (sums
/// per class, architecture and counter); 4: each epoch counts its reports admitted by
/// admission tokens; 3: class merges; 2: epochs, release threshold and the chain; 1 carried
/// running totals, which could be differenced. This build reads 6 to 3 (a version 3 epoch
/// has no token-admitted reports; version 3 and 4 entries are of architecture unknown), and
/// refuses the others.
pub const BUNDLE_VERSION: u8 = 6;

/// The oldest bundle version this build still reads ([`BUNDLE_VERSION`] less the entries'
/// architecture and the admission count), so that archives of bundles written before them
/// keep importing.
pub const OLDEST_READABLE_VERSION: u8 = 3;

const MAGIC: [u8; 4] = *b"PNBD";
const HEADER_BYTES: usize = 4 + 1 + 32 + 32 + 16 + 16 + 8 + 32 + 4 + 1 + 8 + 4 + 4;
const EPOCH_BYTES_V3: usize = 4 + 4 + 4 + 8 + 4 + 8;
const EPOCH_BYTES: usize = EPOCH_BYTES_V3 + 8;
const ENTRY_FIXED_BYTES_V4: usize = 4 + 4 + 2 + 2 + 4 + 8 + 8 + 1 + 2;
const ENTRY_FIXED_BYTES_V5: usize = ENTRY_FIXED_BYTES_V4 + 2;
const ENTRY_FIXED_BYTES: usize = ENTRY_FIXED_BYTES_V5 + 1;
/// Most keys one bundle lists.
pub const MAX_BUNDLE_KEYS: usize = 16;
const MERGE_BYTES: usize = 4 + 4;
const SIGNATURE_BYTES: usize = 64;

/// An application class: the aggregator's name for a group of similar snippets. Numbered from
/// 0 in the order classes were founded; stable for the life of an aggregator's data directory
/// (and of stores restored from its backups).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClassId(pub u32);

/// One class joined into an older one: everything of `absorbed`, released before or after,
/// belongs to `into`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClassMerge {
    /// The class merged away.
    pub absorbed: ClassId,
    /// The class that holds it now (older: a lower id).
    pub into: ClassId,
}

/// A merge a [`ClassMap`] refuses.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum MergeRefused {
    /// Merges go to an older class (a lower id), which keeps every chain of merges finite.
    #[error("class {} merged into class {}, which is not older", .0.absorbed.0, .0.into.0)]
    NotOlder(ClassMerge),
    /// A class is merged once.
    #[error("class {} merged twice", .0.absorbed.0)]
    Twice(ClassMerge),
}

/// Where every merged class went: resolves a class to the class that holds it now (its root).
/// The aggregation server keeps one (its tables, and export as of a cursor), the design server
/// another (from the bundles' merges).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassMap {
    into: std::collections::BTreeMap<ClassId, ClassId>,
}

impl ClassMap {
    /// Adds one merge; refuses, changing nothing, a merge into a younger class or of a class
    /// merged already.
    pub fn insert(&mut self, merge: ClassMerge) -> Result<(), MergeRefused> {
        if merge.into >= merge.absorbed {
            return Err(MergeRefused::NotOlder(merge));
        }
        match self.into.entry(merge.absorbed) {
            std::collections::btree_map::Entry::Occupied(_) => Err(MergeRefused::Twice(merge)),
            std::collections::btree_map::Entry::Vacant(slot) => {
                slot.insert(merge.into);
                Ok(())
            }
        }
    }

    /// The class that holds `class` now. Terminates: every step goes to a lower id.
    pub fn root(&self, mut class: ClassId) -> ClassId {
        while let Some(&into) = self.into.get(&class) {
            class = into;
        }
        class
    }

    /// Number of merged classes.
    pub fn len(&self) -> usize {
        self.into.len()
    }

    /// Whether no class was merged.
    pub fn is_empty(&self) -> bool {
        self.into.is_empty()
    }

    /// Every merge, by absorbed class.
    pub fn merges(&self) -> impl Iterator<Item = ClassMerge> + '_ {
        self.into
            .iter()
            .map(|(&absorbed, &into)| ClassMerge { absorbed, into })
    }
}

/// Which accumulator of a (class, counter, epoch) this is: a fresh one starts whenever the
/// previous one reached its report bound, so every generation decrypts on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Generation(pub u32);

/// A point in the aggregator's history (its count of committed write batches). Internal to the
/// aggregator's store; bundles are ordered by their chain instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Cursor(pub u64);

/// An epoch: the unit of release. Under [`EpochKind::Day`] its id is the reports' day number;
/// under [`EpochKind::Count`] a counter from 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EpochId(pub u32);

/// How an aggregator cuts epochs; ids of different kinds are not comparable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EpochKind {
    /// One epoch per report day, closed once no report of that day can still be accepted.
    Day,
    /// Epochs of a set number of reports (or closed by the operator).
    Count,
}

impl EpochKind {
    /// Its byte in bundles and stores.
    pub fn code(self) -> u8 {
        match self {
            EpochKind::Day => 1,
            EpochKind::Count => 2,
        }
    }

    /// The kind of a byte.
    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(EpochKind::Day),
            2 => Some(EpochKind::Count),
            _ => None,
        }
    }
}

/// A store's random identity: the name of its bundle chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct InstanceId(pub [u8; 16]);

crate::hex::text_id!(InstanceId, "instance id");

/// The SHA-256 of a whole bundle file: what the next bundle of the chain names as `prev`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct BundleHash(pub [u8; 32]);

impl BundleHash {
    /// The hash of a bundle's bytes.
    pub fn of(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }
}

crate::hex::text_id!(BundleHash, "bundle hash");

/// Where a bundle sits in its aggregator's history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainLink {
    /// The store that wrote it.
    pub instance: InstanceId,
    /// The store it was restored from, if it was.
    pub parent: Option<InstanceId>,
    /// 1 for the first bundle of the chain.
    pub seq: u64,
    /// The hash of bundle `seq - 1` (zeros for the first).
    pub prev: BundleHash,
}

/// The release rule a bundle states the aggregator applied, as its numbers (a bundle may
/// state a rule under the floors, which the design server then refuses: so not a checked
/// [`crate::release::ReleaseRule`]), so that the design server can check it applies at least as
/// strict a one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatedRule {
    /// How epochs are cut.
    pub epochs: EpochKind,
    /// k, contributors.
    pub threshold: u64,
    /// T, reports per contributor per (counter, day).
    pub cap: u32,
}

/// One closed epoch as released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpochSummary {
    /// Which epoch.
    pub id: EpochId,
    /// The earliest report day in it.
    pub first_day: Day,
    /// The latest report day in it.
    pub last_day: Day,
    /// Reports in it, released or withheld.
    pub reports: u64,
    /// Sums below the threshold, not in the bundle.
    pub withheld_sums: u32,
    /// Reports in those sums.
    pub withheld_reports: u64,
    /// Reports of it (released or withheld) that the aggregation server admitted by a verified
    /// admission token, each spent once (0 in a version 3 bundle).
    pub reports_with_tokens: u64,
}

impl EpochSummary {
    /// Days its reports span (at least 1): an agent's cap applies per day.
    pub fn days(&self) -> u32 {
        self.last_day.0.saturating_sub(self.first_day.0) + 1
    }

    /// Whether every report of the epoch was admitted by a spent admission token, so that the
    /// contributor bound of its sums is enforced on every sender by the issuer's quota.
    pub fn bound_enforced_by_tokens(&self) -> bool {
        self.reports_with_tokens == self.reports
    }

    /// Appends the summary as a bundle of `version` holds it (reports with tokens from
    /// version 4).
    fn write(&self, out: &mut Vec<u8>, version: u8) {
        out.extend_from_slice(&self.id.0.to_be_bytes());
        out.extend_from_slice(&self.first_day.0.to_be_bytes());
        out.extend_from_slice(&self.last_day.0.to_be_bytes());
        out.extend_from_slice(&self.reports.to_be_bytes());
        out.extend_from_slice(&self.withheld_sums.to_be_bytes());
        out.extend_from_slice(&self.withheld_reports.to_be_bytes());
        if version >= 4 {
            out.extend_from_slice(&self.reports_with_tokens.to_be_bytes());
        }
    }
}

/// One released sum: its encrypted bins and contributor counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleEntry {
    /// The closed epoch its reports belong to.
    pub epoch: EpochId,
    /// The class the reports were assigned to.
    pub class: ClassId,
    /// The GPU generation the reports' counters were read on ([`GpuArch::UNKNOWN`] in a
    /// bundle older than version 5).
    pub arch: GpuArch,
    /// The Paillier key its sums are under: an index into [`Bundle::keys`] (0 in a bundle
    /// older than version 6).
    pub key: u8,
    /// The catalogue the counter belongs to.
    pub catalogue: CatalogueVersion,
    /// The counter.
    pub counter: CounterId,
    /// Which accumulator of this (class, counter, epoch).
    pub generation: Generation,
    /// Distinct reports multiplied into the sums.
    pub reports: u64,
    /// Samples those reports claimed, summed: what the decrypted bins must add up to.
    pub samples: u64,
    /// The packed ciphertext sums, in a report's encoding.
    pub sums: PackedBytes,
}

impl BundleEntry {
    /// Appends the entry as a bundle of `version` holds it (the architecture from version 5,
    /// the key's index from version 6).
    fn write(&self, out: &mut Vec<u8>, version: u8) {
        out.extend_from_slice(&self.epoch.0.to_be_bytes());
        out.extend_from_slice(&self.class.0.to_be_bytes());
        if version >= 5 {
            out.extend_from_slice(&self.arch.to_bytes());
        }
        if version >= 6 {
            out.push(self.key);
        }
        out.extend_from_slice(&self.catalogue.0.to_be_bytes());
        out.extend_from_slice(&self.counter.0.to_be_bytes());
        out.extend_from_slice(&self.generation.0.to_be_bytes());
        out.extend_from_slice(&self.reports.to_be_bytes());
        out.extend_from_slice(&self.samples.to_be_bytes());
        // PackedBytes guarantees count <= MAX_CIPHERTEXTS and length <= u16::MAX.
        out.push(self.sums.count() as u8);
        out.extend_from_slice(&(self.sums.ciphertext_len() as u16).to_be_bytes());
        out.extend_from_slice(self.sums.as_bytes());
    }

    /// The key of the sum: unique in a chain.
    pub fn key(&self) -> SumId {
        SumId {
            epoch: self.epoch,
            class: self.class,
            arch: self.arch,
            key: self.key,
            catalogue: self.catalogue,
            counter: self.counter,
            generation: self.generation,
        }
    }
}

/// Names one released sum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SumId {
    /// Epoch.
    pub epoch: EpochId,
    /// Class.
    pub class: ClassId,
    /// GPU architecture.
    pub arch: GpuArch,
    /// The key's index in its bundle.
    pub key: u8,
    /// Catalogue version.
    pub catalogue: CatalogueVersion,
    /// Counter.
    pub counter: CounterId,
    /// Generation.
    pub generation: Generation,
}

/// A decoded bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bundle {
    /// The aggregation server's ed25519 public key, which signed the bundle.
    pub signer: [u8; 32],
    /// The Paillier keys the sums are under; each entry names one by index.
    pub keys: Vec<KeyId>,
    /// Its place in the store's chain.
    pub link: ChainLink,
    /// The day the bundle was written.
    pub day: Day,
    /// The release rule applied.
    pub rule: StatedRule,
    /// The epochs it releases, by increasing id.
    pub epochs: Vec<EpochSummary>,
    /// The released sums.
    pub entries: Vec<BundleEntry>,
    /// The class merges this bundle is the first to apply, by absorbed class.
    pub merges: Vec<ClassMerge>,
}

/// Why bytes are not a bundle this build accepts.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BundleError {
    /// The file does not start with the bundle tag.
    #[error("not a Penrose bundle (bad magic)")]
    BadMagic,
    /// Written by a format version this build does not read.
    #[error(
        "unsupported bundle version {0} (this build reads {OLDEST_READABLE_VERSION} to \
         {BUNDLE_VERSION})"
    )]
    UnsupportedVersion(u8),
    /// The bytes end before a field.
    #[error("bundle truncated while reading {0}")]
    Truncated(&'static str),
    /// A count cannot fit in the bytes present.
    #[error("bundle announces {announced} {what}, but only {room} could fit")]
    TooMany {
        /// Epochs or entries.
        what: &'static str,
        /// Announced.
        announced: u32,
        /// The most the remaining bytes could hold.
        room: usize,
    },
    /// An entry's ciphertexts are malformed.
    #[error("entry {index}: {source}")]
    Entry {
        /// Which entry.
        index: usize,
        /// What is wrong.
        source: WireError,
    },
    /// The bundle contradicts itself (epochs out of order, an entry of an epoch it does not
    /// release, a sum twice, an unknown epoch kind, a first bundle with a predecessor).
    #[error("inconsistent bundle: {0}")]
    Inconsistent(&'static str),
    /// Bytes between the last entry and the signature.
    #[error("{0} unexpected bytes after the entries")]
    TrailingBytes(usize),
    /// The signer field is not an ed25519 public key.
    #[error("the signer is not a valid ed25519 public key")]
    BadSigner,
    /// The signature does not verify under the signer's key: the bundle was altered.
    #[error("signature does not verify: the bundle was altered or damaged")]
    BadSignature,
    /// The bundle verifies, but under a key other than the one the caller trusts.
    #[error("signed by an aggregation server this design server does not trust")]
    UntrustedSigner,
    /// The bundle is too large to encode.
    #[error("more than u32::MAX epochs or entries")]
    TooLarge,
}

impl Bundle {
    /// Encodes the bundle and signs it with `key`; the signer field is set from `key`.
    pub fn sign(&self, key: &SigningKey) -> Result<Vec<u8>, BundleError> {
        self.sign_as(BUNDLE_VERSION, key)
    }

    /// [`sign`](Self::sign) in format `version` (this one; version 4 without the entries'
    /// architecture; version 3 also without the admission counts: for tests of reading older
    /// bundles).
    fn sign_as(&self, version: u8, key: &SigningKey) -> Result<Vec<u8>, BundleError> {
        let epochs = u32::try_from(self.epochs.len()).map_err(|_| BundleError::TooLarge)?;
        let count = u32::try_from(self.entries.len()).map_err(|_| BundleError::TooLarge)?;
        let merges = u32::try_from(self.merges.len()).map_err(|_| BundleError::TooLarge)?;
        let mut out = Vec::with_capacity(self.encoded_len(version));
        out.extend_from_slice(&MAGIC);
        out.push(version);
        out.extend_from_slice(key.verifying_key().as_bytes());
        self.write_keys(&mut out, version)?;
        self.write_chain_and_rule(&mut out);
        out.extend_from_slice(&epochs.to_be_bytes());
        for e in &self.epochs {
            e.write(&mut out, version);
        }
        out.extend_from_slice(&count.to_be_bytes());
        for e in &self.entries {
            e.write(&mut out, version);
        }
        out.extend_from_slice(&merges.to_be_bytes());
        for m in &self.merges {
            out.extend_from_slice(&m.absorbed.0.to_be_bytes());
            out.extend_from_slice(&m.into.0.to_be_bytes());
        }
        let signature = key.sign(&out);
        out.extend_from_slice(&signature.to_bytes());
        Ok(out)
    }

    /// The length of the bundle signed as `version`, signature included.
    fn encoded_len(&self, version: u8) -> usize {
        let epoch_bytes = if version >= 4 {
            EPOCH_BYTES
        } else {
            EPOCH_BYTES_V3
        };
        HEADER_BYTES
            + self.epochs.len() * epoch_bytes
            + self
                .entries
                .iter()
                .map(|e| entry_fixed_bytes(version) + e.sums.as_bytes().len())
                .sum::<usize>()
            + 4
            + self.merges.len() * MERGE_BYTES
            + SIGNATURE_BYTES
    }

    /// The keys the bundle's sums are under: from version 6 their count (1 to 16) and each
    /// key; before, exactly one key.
    fn write_keys(&self, out: &mut Vec<u8>, version: u8) -> Result<(), BundleError> {
        if version >= 6 {
            if self.keys.is_empty() || self.keys.len() > MAX_BUNDLE_KEYS {
                return Err(BundleError::Inconsistent("a bundle lists 1 to 16 keys"));
            }
            out.push(self.keys.len() as u8);
            for k in &self.keys {
                out.extend_from_slice(&k.0);
            }
        } else {
            let [only] = self.keys.as_slice() else {
                return Err(BundleError::Inconsistent(
                    "a bundle before version 6 has one key",
                ));
            };
            out.extend_from_slice(&only.0);
        }
        Ok(())
    }

    /// The chain link, the day and the release rule.
    fn write_chain_and_rule(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.link.instance.0);
        out.extend_from_slice(&self.link.parent.unwrap_or_default().0);
        out.extend_from_slice(&self.link.seq.to_be_bytes());
        out.extend_from_slice(&self.link.prev.0);
        out.extend_from_slice(&self.day.0.to_be_bytes());
        out.push(self.rule.epochs.code());
        out.extend_from_slice(&self.rule.threshold.to_be_bytes());
        out.extend_from_slice(&self.rule.cap.to_be_bytes());
    }

    /// Decodes a bundle and checks its signature (strict ed25519 verification) under the key it
    /// names; with `trusted`, also that this key is the trusted one; and that it is consistent
    /// (module docs). Nothing is returned from a bundle that fails any check.
    pub fn verify(bytes: &[u8], trusted: Option<&VerifyingKey>) -> Result<Bundle, BundleError> {
        let version = check_header(bytes)?;
        let (signed, signature) = bytes.split_at(bytes.len() - SIGNATURE_BYTES);
        let mut r = Reader(&signed[5..]);
        let signer: [u8; 32] = r.array("signer")?;
        check_signature(signed, signature, &signer, trusted)?;
        let keys = decode_keys(&mut r, version)?;
        let (link, day, rule) = decode_link_and_rule(&mut r)?;
        let epochs = decode_epochs(&mut r, version)?;
        let entries = decode_entries(&mut r, version, keys.len(), &epochs)?;
        let merges = decode_merges(&mut r)?;
        if entries.iter().any(|e| {
            merges
                .binary_search_by_key(&e.class, |m| m.absorbed)
                .is_ok()
        }) {
            return Err(BundleError::Inconsistent(
                "an entry under a class the bundle merges away",
            ));
        }
        if !r.0.is_empty() {
            return Err(BundleError::TrailingBytes(r.0.len()));
        }
        Ok(Bundle {
            signer,
            keys,
            link,
            day,
            rule,
            epochs,
            entries,
            merges,
        })
    }

    /// The summary of one of the bundle's epochs.
    pub fn epoch(&self, id: EpochId) -> Option<&EpochSummary> {
        self.epochs
            .binary_search_by_key(&id, |e| e.id)
            .ok()
            .map(|i| &self.epochs[i])
    }
}

fn entry_fixed_bytes(version: u8) -> usize {
    match version {
        6.. => ENTRY_FIXED_BYTES,
        5 => ENTRY_FIXED_BYTES_V5,
        _ => ENTRY_FIXED_BYTES_V4,
    }
}

/// The version of a bundle whose magic, version and length are right.
fn check_header(bytes: &[u8]) -> Result<u8, BundleError> {
    if bytes.len() < 5 {
        return Err(BundleError::Truncated("header"));
    }
    if bytes[..4] != MAGIC {
        return Err(BundleError::BadMagic);
    }
    let version = bytes[4];
    if !(OLDEST_READABLE_VERSION..=BUNDLE_VERSION).contains(&version) {
        return Err(BundleError::UnsupportedVersion(version));
    }
    if bytes.len() < HEADER_BYTES + SIGNATURE_BYTES {
        return Err(BundleError::Truncated("header"));
    }
    Ok(version)
}

/// Checks the signature over `signed` by `signer`, and that `signer` is `trusted` if given.
fn check_signature(
    signed: &[u8],
    signature: &[u8],
    signer: &[u8; 32],
    trusted: Option<&VerifyingKey>,
) -> Result<(), BundleError> {
    let verifying = VerifyingKey::from_bytes(signer).map_err(|_| BundleError::BadSigner)?;
    let mut sig = [0u8; SIGNATURE_BYTES];
    sig.copy_from_slice(signature);
    verifying
        .verify_strict(signed, &Signature::from_bytes(&sig))
        .map_err(|_| BundleError::BadSignature)?;
    if let Some(trusted) = trusted
        && trusted != &verifying
    {
        return Err(BundleError::UntrustedSigner);
    }
    Ok(())
}

/// The Paillier keys the entries are under (one before version 6).
fn decode_keys(r: &mut Reader<'_>, version: u8) -> Result<Vec<KeyId>, BundleError> {
    if version < 6 {
        return Ok(vec![KeyId(r.array("key id")?)]);
    }
    let [count] = r.array::<1>("key count")?;
    let count = usize::from(count);
    if count == 0 || count > MAX_BUNDLE_KEYS {
        return Err(BundleError::Inconsistent("a bundle lists 1 to 16 keys"));
    }
    (0..count).map(|_| Ok(KeyId(r.array("key id")?))).collect()
}

/// The chain link, the day and the release rule.
fn decode_link_and_rule(r: &mut Reader<'_>) -> Result<(ChainLink, Day, StatedRule), BundleError> {
    let instance = InstanceId(r.array("instance")?);
    let parent = InstanceId(r.array("parent")?);
    let seq = u64::from_be_bytes(r.array("seq")?);
    let prev = BundleHash(r.array("prev")?);
    let day = Day(u32::from_be_bytes(r.array("day")?));
    let [kind] = r.array::<1>("epoch kind")?;
    let epochs =
        EpochKind::from_code(kind).ok_or(BundleError::Inconsistent("unknown epoch kind"))?;
    let threshold = u64::from_be_bytes(r.array("threshold")?);
    let cap = u32::from_be_bytes(r.array("cap")?);
    if seq == 0 || (seq == 1) != (prev == BundleHash::default()) {
        return Err(BundleError::Inconsistent(
            "the first bundle of a chain, and only it, has no predecessor",
        ));
    }
    let link = ChainLink {
        instance,
        parent: (parent != InstanceId::default()).then_some(parent),
        seq,
        prev,
    };
    let rule = StatedRule {
        epochs,
        threshold,
        cap,
    };
    Ok((link, day, rule))
}

/// A count of `what` that the bytes left can hold, each at least `each` bytes.
fn count_within(
    r: &mut Reader<'_>,
    what: &'static str,
    field: &'static str,
    each: usize,
) -> Result<usize, BundleError> {
    let announced = u32::from_be_bytes(r.array(field)?);
    let room = r.0.len() / each;
    if announced as usize > room {
        return Err(BundleError::TooMany {
            what,
            announced,
            room,
        });
    }
    Ok(announced as usize)
}

/// The released epochs, in increasing order.
fn decode_epochs(r: &mut Reader<'_>, version: u8) -> Result<Vec<EpochSummary>, BundleError> {
    let epoch_bytes = if version >= 4 {
        EPOCH_BYTES
    } else {
        EPOCH_BYTES_V3
    };
    let count = count_within(r, "epochs", "epoch count", epoch_bytes)?;
    let mut epochs: Vec<EpochSummary> = Vec::with_capacity(count);
    for _ in 0..count {
        let e = EpochSummary {
            id: EpochId(u32::from_be_bytes(r.array("epoch id")?)),
            first_day: Day(u32::from_be_bytes(r.array("epoch first day")?)),
            last_day: Day(u32::from_be_bytes(r.array("epoch last day")?)),
            reports: u64::from_be_bytes(r.array("epoch reports")?),
            withheld_sums: u32::from_be_bytes(r.array("epoch withheld sums")?),
            withheld_reports: u64::from_be_bytes(r.array("epoch withheld reports")?),
            reports_with_tokens: if version >= 4 {
                u64::from_be_bytes(r.array("epoch reports with tokens")?)
            } else {
                0
            },
        };
        if e.reports_with_tokens > e.reports {
            return Err(BundleError::Inconsistent(
                "an epoch with more token-admitted reports than reports",
            ));
        }
        if epochs.last().is_some_and(|last| last.id >= e.id) {
            return Err(BundleError::Inconsistent("epochs not in increasing order"));
        }
        if e.last_day < e.first_day {
            return Err(BundleError::Inconsistent("an epoch ends before it starts"));
        }
        epochs.push(e);
    }
    Ok(epochs)
}

/// The released sums: each under a listed key, of a released epoch, and once.
fn decode_entries(
    r: &mut Reader<'_>,
    version: u8,
    keys: usize,
    epochs: &[EpochSummary],
) -> Result<Vec<BundleEntry>, BundleError> {
    let count = count_within(r, "entries", "entry count", entry_fixed_bytes(version))?;
    let mut entries = Vec::with_capacity(count);
    let mut sum_ids = HashSet::with_capacity(count);
    for index in 0..count {
        let entry = decode_entry(r, index, version)?;
        if usize::from(entry.key) >= keys {
            return Err(BundleError::Inconsistent(
                "an entry under a key the bundle does not list",
            ));
        }
        if version >= 5 && !entry.arch.is_reportable() {
            return Err(BundleError::Inconsistent(
                "an entry under an architecture no report may name",
            ));
        }
        if epochs.binary_search_by_key(&entry.epoch, |e| e.id).is_err() {
            return Err(BundleError::Inconsistent(
                "an entry of an epoch the bundle does not release",
            ));
        }
        if !sum_ids.insert(entry.key()) {
            return Err(BundleError::Inconsistent("the same sum twice"));
        }
        entries.push(entry);
    }
    Ok(entries)
}

/// The class merges, each into an older class, in increasing order of the merged class.
fn decode_merges(r: &mut Reader<'_>) -> Result<Vec<ClassMerge>, BundleError> {
    let count = count_within(r, "merges", "merge count", MERGE_BYTES)?;
    let mut merges: Vec<ClassMerge> = Vec::with_capacity(count);
    for _ in 0..count {
        let m = ClassMerge {
            absorbed: ClassId(u32::from_be_bytes(r.array("merged class")?)),
            into: ClassId(u32::from_be_bytes(r.array("merge survivor")?)),
        };
        if m.into >= m.absorbed {
            return Err(BundleError::Inconsistent(
                "a class merged into a younger class or itself",
            ));
        }
        if merges
            .last()
            .is_some_and(|last| last.absorbed >= m.absorbed)
        {
            return Err(BundleError::Inconsistent(
                "merges not in increasing order of the merged class",
            ));
        }
        merges.push(m);
    }
    Ok(merges)
}

fn decode_entry(r: &mut Reader<'_>, index: usize, version: u8) -> Result<BundleEntry, BundleError> {
    let epoch = EpochId(u32::from_be_bytes(r.array("epoch")?));
    let class = ClassId(u32::from_be_bytes(r.array("class")?));
    let arch = if version >= 5 {
        GpuArch::from_bytes(r.array("arch")?)
    } else {
        GpuArch::UNKNOWN
    };
    let key = if version >= 6 {
        r.array::<1>("key")?[0]
    } else {
        0
    };
    let catalogue = CatalogueVersion(u16::from_be_bytes(r.array("catalogue")?));
    let counter = CounterId(u16::from_be_bytes(r.array("counter")?));
    let generation = Generation(u32::from_be_bytes(r.array("generation")?));
    let reports = u64::from_be_bytes(r.array("reports")?);
    let samples = u64::from_be_bytes(r.array("samples")?);
    let [n] = r.array::<1>("ciphertext count")?;
    let len = usize::from(u16::from_be_bytes(r.array("ciphertext length")?));
    let n = usize::from(n);
    if n == 0 || n > MAX_CIPHERTEXTS {
        return Err(BundleError::Entry {
            index,
            source: WireError::CiphertextCount(n),
        });
    }
    let bytes = r.bytes(n * len, "sums")?;
    let sums = PackedBytes::new(bytes.to_vec(), n)
        .map_err(|source| BundleError::Entry { index, source })?;
    Ok(BundleEntry {
        epoch,
        class,
        arch,
        key,
        catalogue,
        counter,
        generation,
        reports,
        samples,
        sums,
    })
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], BundleError> {
        if self.0.len() < n {
            return Err(BundleError::Truncated(field));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], BundleError> {
        let (head, tail) = self
            .0
            .split_first_chunk::<N>()
            .ok_or(BundleError::Truncated(field))?;
        self.0 = tail;
        Ok(*head)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn bundle() -> Bundle {
        Bundle {
            signer: [0; 32],
            keys: vec![KeyId([7; 32])],
            link: ChainLink {
                instance: InstanceId([5; 16]),
                parent: None,
                seq: 2,
                prev: BundleHash([9; 32]),
            },
            day: Day(20_000),
            rule: StatedRule {
                epochs: EpochKind::Day,
                threshold: 10,
                cap: 24,
            },
            epochs: vec![
                EpochSummary {
                    id: EpochId(19_998),
                    first_day: Day(19_998),
                    last_day: Day(19_998),
                    reports: 500,
                    withheld_sums: 1,
                    withheld_reports: 3,
                    reports_with_tokens: 500,
                },
                EpochSummary {
                    id: EpochId(19_999),
                    first_day: Day(19_999),
                    last_day: Day(19_999),
                    reports: 400,
                    withheld_sums: 0,
                    withheld_reports: 0,
                    reports_with_tokens: 17,
                },
            ],
            entries: (0..3)
                .map(|i| BundleEntry {
                    epoch: EpochId(19_998 + i % 2),
                    class: ClassId(i),
                    arch: crate::gpu::GENERATIONS[i as usize % 2 + 1],
                    key: 0,
                    catalogue: CatalogueVersion(1),
                    counter: CounterId(i as u16 + 4),
                    generation: Generation(0),
                    reports: 300 + u64::from(i),
                    samples: 1000,
                    sums: PackedBytes::new(vec![i as u8 + 1; 64], 2).unwrap(),
                })
                .collect(),
            merges: vec![
                ClassMerge {
                    absorbed: ClassId(5),
                    into: ClassId(1),
                },
                ClassMerge {
                    absorbed: ClassId(9),
                    into: ClassId(5),
                },
            ],
        }
    }

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    #[test]
    fn round_trip_verifies_under_the_signer() {
        let key = key(1);
        let bytes = bundle().sign(&key).unwrap();
        let decoded = Bundle::verify(&bytes, Some(&key.verifying_key())).unwrap();
        let mut expected = bundle();
        expected.signer = *key.verifying_key().as_bytes();
        assert_eq!(decoded, expected);
        assert_eq!(decoded.epoch(EpochId(19_999)).map(|e| e.reports), Some(400));
        assert_eq!(decoded.epoch(EpochId(1)), None);
    }

    #[test]
    fn any_flipped_byte_is_refused() {
        let key = key(1);
        let bytes = bundle().sign(&key).unwrap();
        for i in 0..bytes.len() {
            let mut altered = bytes.clone();
            altered[i] ^= 0x01;
            assert!(Bundle::verify(&altered, None).is_err(), "byte {i}");
        }
        for cut in 0..bytes.len() {
            assert!(Bundle::verify(&bytes[..cut], None).is_err(), "cut {cut}");
        }
    }

    #[test]
    fn another_servers_bundle_is_untrusted() {
        let bytes = bundle().sign(&key(1)).unwrap();
        assert_eq!(
            Bundle::verify(&bytes, Some(&key(2).verifying_key())),
            Err(BundleError::UntrustedSigner)
        );
    }

    #[test]
    fn re_signed_alterations_are_still_refused_by_a_pinned_key() {
        // An attacker who changes a count and re-signs with their own key is caught by pinning.
        let mut altered = bundle();
        altered.entries[0].reports = 1_000_000;
        let bytes = altered.sign(&key(3)).unwrap();
        assert!(Bundle::verify(&bytes, None).is_ok());
        assert_eq!(
            Bundle::verify(&bytes, Some(&key(1).verifying_key())),
            Err(BundleError::UntrustedSigner)
        );
    }

    #[test]
    fn self_contradicting_bundles_are_refused_even_when_signed() {
        let key = key(1);
        let refused = |b: Bundle| {
            let bytes = b.sign(&key).unwrap();
            matches!(
                Bundle::verify(&bytes, None),
                Err(BundleError::Inconsistent(_))
            )
        };
        let mut b = bundle();
        b.entries[1] = b.entries[0].clone();
        assert!(refused(b), "a sum twice");
        let mut b = bundle();
        b.entries[0].epoch = EpochId(7);
        assert!(refused(b), "an entry outside the released epochs");
        let mut b = bundle();
        b.epochs.swap(0, 1);
        assert!(refused(b), "epochs out of order");
        let mut b = bundle();
        b.link.seq = 1;
        assert!(refused(b), "a first bundle with a predecessor");
        let mut b = bundle();
        b.link.prev = BundleHash::default();
        assert!(refused(b), "a later bundle without one");
        let mut b = bundle();
        b.merges[0].into = ClassId(6);
        assert!(refused(b), "a merge into a younger class");
        let mut b = bundle();
        b.merges.swap(0, 1);
        assert!(refused(b), "merges out of order");
        let mut b = bundle();
        b.merges[0].absorbed = ClassId(2);
        assert!(refused(b), "an entry under a class merged away");
        let mut b = bundle();
        b.epochs[1].reports_with_tokens = 401;
        assert!(refused(b), "more token-admitted reports than reports");
    }

    #[test]
    fn a_class_map_resolves_chains_and_refuses_bad_merges_unchanged() {
        let m = |absorbed, into| ClassMerge {
            absorbed: ClassId(absorbed),
            into: ClassId(into),
        };
        let mut map = ClassMap::default();
        map.insert(m(5, 1)).unwrap();
        map.insert(m(9, 5)).unwrap();
        assert_eq!(map.root(ClassId(9)), ClassId(1));
        assert_eq!(map.root(ClassId(2)), ClassId(2));
        let before = map.clone();
        assert_eq!(map.insert(m(9, 2)), Err(MergeRefused::Twice(m(9, 2))));
        assert_eq!(map.insert(m(3, 4)), Err(MergeRefused::NotOlder(m(3, 4))));
        assert_eq!(map, before);
        assert_eq!(map.merges().collect::<Vec<_>>(), vec![m(5, 1), m(9, 5)]);
    }

    #[test]
    fn instance_ids_read_back_what_they_print() {
        let id = InstanceId([0xa5; 16]);
        assert_eq!(id.to_string().parse::<InstanceId>(), Ok(id));
        assert!("a5".parse::<InstanceId>().is_err());
        assert!("zz".repeat(16).parse::<InstanceId>().is_err());
    }

    #[test]
    fn version_3_bundles_still_verify_with_no_token_admitted_reports() {
        let key = key(1);
        let bytes = bundle().sign_as(3, &key).unwrap();
        assert_eq!(bytes[4], 3);
        assert_eq!(
            bytes.len() + 2 * 8 + 3 * 2 + 1 + 3,
            bundle().sign(&key).unwrap().len(),
            "version 4 adds a count per epoch, version 5 an architecture per entry, version 6 a \
             key count and a key per entry"
        );
        let decoded = Bundle::verify(&bytes, Some(&key.verifying_key())).unwrap();
        let mut expected = bundle();
        expected.signer = *key.verifying_key().as_bytes();
        for e in &mut expected.epochs {
            e.reports_with_tokens = 0;
        }
        for e in &mut expected.entries {
            e.arch = GpuArch::UNKNOWN;
        }
        assert_eq!(decoded, expected);
        assert!(decoded.epochs.iter().all(|e| !e.bound_enforced_by_tokens()));
        let current = Bundle::verify(&bundle().sign(&key).unwrap(), None).unwrap();
        assert_eq!(
            current
                .epochs
                .iter()
                .map(EpochSummary::bound_enforced_by_tokens)
                .collect::<Vec<_>>(),
            [true, false]
        );
    }

    #[test]
    fn version_5_bundles_still_verify_with_every_entry_under_their_one_key() {
        let key = key(1);
        let bytes = bundle().sign_as(5, &key).unwrap();
        assert_eq!(bytes[4], 5);
        let decoded = Bundle::verify(&bytes, Some(&key.verifying_key())).unwrap();
        let mut expected = bundle();
        expected.signer = *key.verifying_key().as_bytes();
        assert_eq!(decoded, expected);
        let mut two = bundle();
        two.keys.push(KeyId([8; 32]));
        assert!(
            two.sign_as(5, &key).is_err(),
            "version 5 cannot carry two keys"
        );
    }

    #[test]
    fn a_version_6_bundle_keeps_sums_under_two_keys_apart() {
        let key = key(1);
        let mut two = bundle();
        two.keys.push(KeyId([8; 32]));
        let mut other = two.entries[0].clone();
        other.key = 1;
        two.entries.push(other);
        let decoded = Bundle::verify(&two.sign(&key).unwrap(), None).unwrap();
        assert_eq!(decoded.keys, two.keys);
        assert_eq!(decoded.entries, two.entries);
        let mut bad = two.clone();
        bad.entries[0].key = 2;
        assert_eq!(
            Bundle::verify(&bad.sign(&key).unwrap(), None),
            Err(BundleError::Inconsistent(
                "an entry under a key the bundle does not list"
            ))
        );
        let mut none = bundle();
        none.keys.clear();
        assert!(none.sign(&key).is_err());
    }

    #[test]
    fn version_4_bundles_still_verify_with_entries_of_architecture_unknown() {
        let key = key(1);
        let bytes = bundle().sign_as(4, &key).unwrap();
        assert_eq!(bytes[4], 4);
        assert_eq!(
            bytes.len() + 3 * 2 + 1 + 3,
            bundle().sign(&key).unwrap().len()
        );
        let decoded = Bundle::verify(&bytes, Some(&key.verifying_key())).unwrap();
        let mut expected = bundle();
        expected.signer = *key.verifying_key().as_bytes();
        for e in &mut expected.entries {
            e.arch = GpuArch::UNKNOWN;
        }
        assert_eq!(decoded, expected);
        // Version 5 carries each entry's architecture, and sums of one class and counter
        // under two architectures are two sums.
        let current = Bundle::verify(&bundle().sign(&key).unwrap(), None).unwrap();
        assert_eq!(current.entries, bundle().entries);
        let mut two = bundle();
        let mut other = two.entries[0].clone();
        other.arch = crate::gpu::GENERATIONS[0];
        two.entries.push(other);
        assert!(Bundle::verify(&two.sign(&key).unwrap(), None).is_ok());
        // A version 5 entry must name a generation a report may name.
        for arch in [GpuArch::UNKNOWN, GpuArch::new(8, 6), GpuArch::new(13, 0)] {
            let mut b = bundle();
            b.entries[0].arch = arch;
            assert_eq!(
                Bundle::verify(&b.sign(&key).unwrap(), None),
                Err(BundleError::Inconsistent(
                    "an entry under an architecture no report may name"
                )),
                "{arch}"
            );
        }
    }

    #[test]
    fn other_versions_are_refused_by_version() {
        for version in [1, 2, 7] {
            let mut bytes = bundle().sign(&key(1)).unwrap();
            bytes[4] = version;
            assert_eq!(
                Bundle::verify(&bytes, None),
                Err(BundleError::UnsupportedVersion(version))
            );
        }
    }
}
