//! What the auditor's tests share: real Paillier keys split by the dealer's `threshold::split`,
//! bundles built and signed as the aggregation server signs them, chained, and an auditor
//! data directory made by `admin::init` in a temporary directory.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, missing_docs)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;
use penrose_auditor::{Auditor, DataDir, InitOptions, Policy, admin};
use penrose_core::audit::{AuditAnswer, AuditRequest, EntryPartial};
use penrose_core::bundle::{
    Bundle, BundleEntry, BundleHash, ChainLink, ClassId, EpochId, EpochKind, EpochSummary,
    Generation, InstanceId, StatedRule,
};
use penrose_core::counters::{BIN_COUNT, CatalogueVersion, CounterId};
use penrose_core::paillier::threshold::{self, KeyShare, PartialDecryption};
use penrose_core::paillier::{KeyId, KeySize, Keypair};
use penrose_core::wire::{Day, PackedBytes};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Reports a one-day sum needs for 10 contributors at T = 24: ceil(217 / 24) = 10.
pub const ENOUGH: u64 = 217;
/// The first epoch (a day number) the tests release.
pub const DAY: u32 = 20_000;

/// A key split by the dealer.
pub struct Dealing {
    pub keys: Keypair,
    pub design: KeyShare,
    pub auditor: KeyShare,
}

impl Dealing {
    pub fn new(size: KeySize, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let keys = Keypair::generate_with_size(size, &mut rng);
        let dealt = threshold::split(keys.private_key(), &mut rng).unwrap();
        Dealing {
            keys,
            design: dealt.design,
            auditor: dealt.auditor,
        }
    }

    pub fn id(&self) -> KeyId {
        self.keys.public_key().key_id()
    }

    /// The dealer's files in `dir`, as `penrose-design keygen --split` hands them over.
    pub fn write_files(&self, dir: &Path) -> KeyFiles {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir).unwrap();
        let files = KeyFiles {
            share: dir.join("auditor.share"),
            design: dir.join("design.share"),
            public: dir.join("public.key"),
            verification: dir.join("verification.key"),
        };
        std::fs::write(&files.public, self.keys.public_key().to_bytes()).unwrap();
        let verification = self.auditor.verification_key().to_bytes();
        std::fs::write(&files.verification, verification).unwrap();
        for (path, share) in [(&files.share, &self.auditor), (&files.design, &self.design)] {
            std::fs::write(path, share.to_bytes()).unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        files
    }

    /// A released sum of this key (index `key` in its bundle's list): one random histogram,
    /// encrypted, whose entry claims `reports` reports. Returns the entry and its bins.
    pub fn sum(
        &self,
        key: u8,
        epoch: u32,
        class: u32,
        reports: u64,
        rng: &mut impl Rng,
    ) -> (BundleEntry, [u64; BIN_COUNT]) {
        let mut bins = [0u32; BIN_COUNT];
        for _ in 0..6 {
            bins[rng.random_range(0..BIN_COUNT)] += rng.random_range(1..50);
        }
        let packed = self
            .keys
            .public_key()
            .encrypt_packed(&bins, &mut rand::rng())
            .unwrap();
        let count = packed.ciphertexts().len();
        let entry = BundleEntry {
            epoch: EpochId(epoch),
            class: ClassId(class),
            arch: penrose_core::gpu::GpuArch::new(9, 0),
            key,
            catalogue: CatalogueVersion(1),
            counter: CounterId(5),
            generation: Generation(0),
            reports,
            samples: bins.iter().map(|&b| u64::from(b)).sum(),
            sums: PackedBytes::new(packed.to_bytes(), count).unwrap(),
        };
        (entry, bins.map(u64::from))
    }

    /// The bins of `entry` from the auditor's partial and the design server's own, through
    /// `threshold::combine` (which checks both proofs).
    pub fn combine(&self, entry: &BundleEntry, auditor: &[u8]) -> [u64; BIN_COUNT] {
        let public = self.keys.public_key();
        let sums = public.validate_packed(entry.sums.as_bytes()).unwrap();
        let theirs = PartialDecryption::from_bytes(public, auditor).unwrap();
        let ours = self
            .design
            .partial_decrypt(&sums, &mut rand::rng())
            .unwrap();
        threshold::combine(self.design.verification_key(), &sums, &ours, &theirs).unwrap()
    }
}

/// Where a dealing's files are.
pub struct KeyFiles {
    pub share: PathBuf,
    pub design: PathBuf,
    pub public: PathBuf,
    pub verification: PathBuf,
}

/// One aggregation server store's chain of signed bundles.
pub struct ChainMaker {
    pub signing: SigningKey,
    pub instance: InstanceId,
    pub parent: Option<InstanceId>,
    pub keys: Vec<KeyId>,
    /// The last bundle made, for the next one's `prev`.
    pub last: Option<Vec<u8>>,
    pub seq: u64,
}

impl ChainMaker {
    pub fn new(signing: &SigningKey, instance: u8, keys: Vec<KeyId>) -> Self {
        ChainMaker {
            signing: signing.clone(),
            instance: InstanceId([instance; 16]),
            parent: None,
            keys,
            last: None,
            seq: 0,
        }
    }

    /// The next bundle of the chain, releasing `epochs` (one day each) with `entries`.
    pub fn next(&mut self, epochs: &[u32], entries: Vec<BundleEntry>) -> Vec<u8> {
        let prev = self
            .last
            .as_ref()
            .map_or(BundleHash::default(), |b| BundleHash::of(b));
        let bytes = self.sign(self.seq + 1, prev, epochs, entries);
        self.seq += 1;
        self.last = Some(bytes.clone());
        bytes
    }

    /// A bundle at any place, without moving the chain on.
    pub fn sign(
        &self,
        seq: u64,
        prev: BundleHash,
        epochs: &[u32],
        entries: Vec<BundleEntry>,
    ) -> Vec<u8> {
        self.bundle(seq, prev, epochs, entries)
            .sign(&self.signing)
            .unwrap()
    }

    pub fn bundle(
        &self,
        seq: u64,
        prev: BundleHash,
        epochs: &[u32],
        entries: Vec<BundleEntry>,
    ) -> Bundle {
        let summaries = epochs
            .iter()
            .map(|&e| EpochSummary {
                id: EpochId(e),
                first_day: Day(e),
                last_day: Day(e),
                reports: entries
                    .iter()
                    .filter(|x| x.epoch.0 == e)
                    .map(|x| x.reports)
                    .sum(),
                withheld_sums: 0,
                withheld_reports: 0,
                reports_with_tokens: 0,
            })
            .collect();
        Bundle {
            signer: [0; 32],
            keys: self.keys.clone(),
            link: ChainLink {
                instance: self.instance,
                parent: self.parent,
                seq,
                prev,
            },
            day: Day(DAY + 40),
            rule: StatedRule {
                epochs: EpochKind::Day,
                threshold: 10,
                cap: 24,
            },
            epochs: summaries,
            entries,
            merges: Vec::new(),
        }
    }
}

/// An initialised auditor data directory, its key and the aggregation server's key.
pub struct Setup {
    pub dir: tempfile::TempDir,
    pub data: DataDir,
    pub dealing: Dealing,
    pub aggregator: SigningKey,
    pub rng: ChaCha8Rng,
}

impl Setup {
    /// A 1024-bit dealing and an auditor with `policy`, following the first chain it sees
    /// (or `instance`).
    pub fn new(policy: Policy, instance: Option<InstanceId>) -> Self {
        Self::make(KeySize::Bits1024, policy, instance)
    }

    /// A dealing of `size` bits and an auditor with `policy`, following the first chain.
    pub fn with_key_size(size: KeySize, policy: Policy) -> Self {
        Self::make(size, policy, None)
    }

    fn make(size: KeySize, policy: Policy, instance: Option<InstanceId>) -> Self {
        let dealing = Dealing::new(size, 5);
        let aggregator = SigningKey::from_bytes(&[9; 32]);
        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::new(dir.path().join("auditor"));
        let options = InitOptions {
            share: dealing.auditor.clone(),
            aggregator: aggregator.verifying_key(),
            policy,
            instance,
        };
        admin::init(&data, options).unwrap();
        Setup {
            dir,
            data,
            dealing,
            aggregator,
            rng: ChaCha8Rng::seed_from_u64(77),
        }
    }

    pub fn auditor(&self) -> Auditor {
        Auditor::open(&self.data).unwrap()
    }

    /// A chain of this setup's aggregation server, under its one key.
    pub fn chain(&self, instance: u8) -> ChainMaker {
        ChainMaker::new(&self.aggregator, instance, vec![self.dealing.id()])
    }

    /// A sum of this setup's key (index 0).
    pub fn sum(&mut self, epoch: u32, class: u32, reports: u64) -> (BundleEntry, [u64; BIN_COUNT]) {
        self.dealing.sum(0, epoch, class, reports, &mut self.rng)
    }

    /// Every file of the data directory and its bytes.
    pub fn files(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        snapshot(self.data.path())
    }
}

/// Every file under `dir` and its bytes.
pub fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(snapshot(&path));
        } else {
            files.insert(path.clone(), std::fs::read(&path).unwrap());
        }
    }
    files
}

pub fn release(auditor: &Auditor, bundle: &[u8], first: u32, count: u32) -> AuditAnswer {
    let request = AuditRequest::Release {
        bundle: bundle.to_vec(),
        first,
        count,
        evidence: Vec::new(),
    };
    AuditAnswer::decode(&auditor.answer(&request.encode())).unwrap()
}

/// The partials and withheld entries of an answer that must be partials.
pub fn partials(answer: AuditAnswer) -> (Vec<EntryPartial>, Vec<u32>) {
    match answer {
        AuditAnswer::Partials {
            partials, withheld, ..
        } => (partials, withheld),
        other => panic!("expected partials, got {other:?}"),
    }
}
