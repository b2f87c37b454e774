//! Bundles made by the aggregator's logic (accumulators of real packed ciphertexts, signed)
//! are imported, verified and decrypted above the threshold, exactly.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;

use ed25519_dalek::SigningKey;
use penrose_core::bundle::{Bundle, BundleEntry, ClassId, Cursor, Generation};
use penrose_core::counters::{BIN_COUNT, CatalogueVersion, CounterId};
use penrose_core::paillier::{Accumulator, KeySize, Keypair};
use penrose_core::wire::{Day, PackedBytes};
use penrose_design::archive::{Archive, ArchiveError, Imported};
use penrose_design::report::{self, Threshold};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

struct Fixture {
    keys: Keypair,
    signing: SigningKey,
    rng: ChaCha8Rng,
}

impl Fixture {
    fn new() -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        Self {
            keys: Keypair::generate_with_size(KeySize::Bits1024, &mut rng),
            signing: SigningKey::from_bytes(&[9u8; 32]),
            rng,
        }
    }

    /// `reports` random histograms summed into one accumulator; returns the entry and the
    /// plaintext sum.
    fn entry(&mut self, class: u32, counter: u16, reports: u64) -> (BundleEntry, [u64; BIN_COUNT]) {
        let public = self.keys.public_key();
        let mut acc = Accumulator::new(public);
        let mut sum = [0u64; BIN_COUNT];
        let mut samples = 0;
        for _ in 0..reports {
            let bins: Vec<u32> = (0..BIN_COUNT)
                .map(|_| self.rng.random_range(0..50))
                .collect();
            for (s, b) in sum.iter_mut().zip(&bins) {
                *s += u64::from(*b);
            }
            let n: u64 = bins.iter().map(|&b| u64::from(b)).sum();
            samples += n;
            let packed = public.encrypt_packed(&bins, &mut self.rng).unwrap();
            acc.absorb_bytes(&packed.to_bytes(), n).unwrap();
        }
        let sums = acc.sum().unwrap();
        let count = sums.ciphertexts().len();
        let entry = BundleEntry {
            class: ClassId(class),
            catalogue: CatalogueVersion(1),
            counter: CounterId(counter),
            generation: Generation(0),
            reports,
            samples,
            sums: PackedBytes::new(sums.to_bytes(), count).unwrap(),
        };
        (entry, sum)
    }

    fn bundle(&self, dir: &Path, cursor: u64, entries: Vec<BundleEntry>) -> std::path::PathBuf {
        let bundle = Bundle {
            signer: [0; 32],
            key_id: self.keys.public_key().key_id(),
            since: Cursor(0),
            cursor: Cursor(cursor),
            day: Day(20_000),
            entries,
        };
        let path = dir.join(format!("b{cursor}.bundle"));
        std::fs::write(&path, bundle.sign(&self.signing).unwrap()).unwrap();
        path
    }
}

#[test]
fn imported_sums_decrypt_exactly_above_the_threshold_and_not_below() {
    let mut f = Fixture::new();
    let dir = tempfile::tempdir().unwrap();
    let (above, above_sum) = f.entry(0, 5, 12);
    let (below, _) = f.entry(1, 5, 3);
    let path = f.bundle(dir.path(), 7, vec![above, below]);
    let archive = Archive::open(&dir.path().join("archive")).unwrap();
    let signer = f.signing.verifying_key();
    assert!(matches!(
        archive.import(&path, None),
        Err(ArchiveError::NoTrustedSigner)
    ));
    assert_eq!(
        archive.import(&path, Some(&signer)).unwrap(),
        Imported::New {
            cursor: 7,
            entries: 2
        }
    );
    // Pinned now: no --signer needed, and importing again changes nothing.
    assert_eq!(
        archive.import(&path, None).unwrap(),
        Imported::AlreadyImported { cursor: 7 }
    );
    let merged = archive.merged().unwrap();
    let report = report::build(&merged, f.keys.private_key(), Threshold(10)).unwrap();
    assert_eq!(report.decrypted.len(), 1);
    let c = &report.decrypted[0];
    assert_eq!((c.class, c.counter, c.reports), (0, 5, 12));
    assert_eq!(c.bins, above_sum.to_vec(), "bin for bin");
    assert_eq!(c.samples, above_sum.iter().sum::<u64>());
    assert_eq!(c.name, "kernel_duration");
    assert!(c.mean.is_some() && c.p50 <= c.p99);
    assert_eq!(report.held_back.len(), 1);
    assert_eq!(report.held_back[0].reports, 3);
    // With k = 3 the small class is decrypted too.
    let low = report::build(&merged, f.keys.private_key(), Threshold(3)).unwrap();
    assert_eq!(low.decrypted.len(), 2);
    let csv = report::to_csv(&report);
    assert!(csv.lines().count() > 1 && csv.starts_with("class,counter"));
}

#[test]
fn a_newer_bundle_replaces_an_accumulator_and_an_older_one_does_not() {
    let mut f = Fixture::new();
    let dir = tempfile::tempdir().unwrap();
    let (old, _) = f.entry(0, 2, 10);
    let (new, new_sum) = f.entry(0, 2, 11);
    let newer = f.bundle(dir.path(), 9, vec![new]);
    let older = f.bundle(dir.path(), 4, vec![old]);
    let archive = Archive::open(&dir.path().join("archive")).unwrap();
    archive
        .import(&newer, Some(&f.signing.verifying_key()))
        .unwrap();
    archive.import(&older, None).unwrap();
    let merged = archive.merged().unwrap();
    assert_eq!(merged.bundles, 2);
    let report = report::build(&merged, f.keys.private_key(), Threshold(10)).unwrap();
    assert_eq!(report.decrypted[0].reports, 11);
    assert_eq!(report.decrypted[0].bins, new_sum.to_vec());
}

#[test]
fn altered_foreign_and_truncated_bundles_are_refused_and_change_nothing() {
    let mut f = Fixture::new();
    let dir = tempfile::tempdir().unwrap();
    let (entry, _) = f.entry(0, 1, 10);
    let good = f.bundle(dir.path(), 3, vec![entry.clone()]);
    let archive_dir = dir.path().join("archive");
    let archive = Archive::open(&archive_dir).unwrap();
    archive
        .import(&good, Some(&f.signing.verifying_key()))
        .unwrap();
    let before = std::fs::read_dir(archive_dir.join("bundles"))
        .unwrap()
        .count();

    // One flipped byte in the sums.
    let mut bytes = std::fs::read(&good).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 1;
    let altered = dir.path().join("altered.bundle");
    std::fs::write(&altered, &bytes).unwrap();
    let err = archive.import(&altered, None).unwrap_err();
    assert!(err.to_string().contains("signature"), "{err}");

    // Signed by another aggregation server.
    let other = Fixture {
        signing: SigningKey::from_bytes(&[1u8; 32]),
        ..Fixture::new()
    };
    let foreign = other.bundle(&dir.path().join(""), 8, vec![entry]);
    assert!(matches!(
        archive.import(&foreign, None),
        Err(ArchiveError::Bundle { .. })
    ));
    assert!(matches!(
        archive.import(&foreign, Some(&other.signing.verifying_key())),
        Err(ArchiveError::OtherSigner { .. })
    ));

    // Cut short.
    let truncated = dir.path().join("short.bundle");
    std::fs::write(&truncated, &std::fs::read(&good).unwrap()[..40]).unwrap();
    assert!(archive.import(&truncated, None).is_err());

    let after = std::fs::read_dir(archive_dir.join("bundles"))
        .unwrap()
        .count();
    assert_eq!(before, after, "nothing was added");
    assert_eq!(archive.merged().unwrap().bundles, 1);
}

#[test]
fn the_cli_refuses_a_tampered_bundle_with_exit_code_3() {
    let mut f = Fixture::new();
    let dir = tempfile::tempdir().unwrap();
    let (entry, _) = f.entry(0, 1, 10);
    let good = f.bundle(dir.path(), 3, vec![entry]);
    let signer = dir.path().join("agg.pub");
    let hex: String = f
        .signing
        .verifying_key()
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    std::fs::write(&signer, format!("{hex}\n")).unwrap();
    let mut bytes = std::fs::read(&good).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x80;
    let bad = dir.path().join("bad.bundle");
    std::fs::write(&bad, bytes).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_penrose-design"))
        .arg("import")
        .arg("--archive")
        .arg(dir.path().join("archive"))
        .arg("--signer")
        .arg(&signer)
        .arg(&bad)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("bad.bundle"), "{stderr}");
}
