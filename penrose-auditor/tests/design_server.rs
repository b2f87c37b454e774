//! The design server and the release auditor together, each as the product runs it: the key
//! dealt by `penrose-design`'s own `keyfile::write_split` (no private key ever written), the
//! auditor as its own process (`penrose-auditor init` and `serve`), the design server's
//! archive importing signed bundles and asking the auditor over QUIC with its pinned
//! certificate (`penrose_design::audit::fetch`), and its report combining both partials
//! (`penrose_design::report::build_with`).
//!
//! What it shows: the design server alone decrypts nothing; the auditor's own threshold holds
//! a sum back that the design server's rule would release; a copy of the chain (another store
//! instance releasing the same epoch) is refused and the design server keeps nothing of it;
//! asking again asks nothing twice.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{ChainMaker, DAY, Dealing};
use ed25519_dalek::SigningKey;
use penrose_auditor::service::Listening;
use penrose_core::audit::AuditRefusal;
use penrose_core::paillier::threshold::KeyShare;
use penrose_core::paillier::{KeySize, Keypair};
use penrose_core::release::{ReportsPerContributor, Threshold};
use penrose_design::archive::Archive;
use penrose_design::audit::{self, AuditError, AuditorPartials};
use penrose_design::keyfile;
use penrose_design::report::{self, KeyHolding};
use penrose_transport::exchange::ExchangeClient;
use penrose_transport::{ClientConfig, Trust};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// A child process killed when the test ends, whatever way it ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn auditor_cmd() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_penrose-auditor"));
    cmd.env("RUST_LOG", "warn");
    cmd
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn report_of(archive: &Archive, keys: &[KeyHolding]) -> report::Report {
    report::build_with(
        &archive.merged().unwrap(),
        keys,
        &AuditorPartials::load(archive).unwrap(),
        Threshold::DEFAULT,
        ReportsPerContributor::DEFAULT,
    )
    .unwrap()
}

fn import(archive: &Archive, dir: &Path, name: &str, bytes: &[u8], signing: &SigningKey) {
    let file = dir.join(name);
    std::fs::write(&file, bytes).unwrap();
    archive
        .import(&file, Some(&signing.verifying_key()), false)
        .unwrap();
}

#[test]
fn the_design_server_decrypts_only_what_the_auditor_answers_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(26);

    // The dealer: penrose-design keygen --split's own code, at the product's key size.
    let keys = Keypair::generate_with_size(KeySize::Bits2048, &mut rng);
    std::fs::create_dir_all(dir.path().join("keys")).unwrap();
    let split = keyfile::write_split(&dir.path().join("keys"), &keys, &mut rng).unwrap();
    assert!(
        !dir.path()
            .join("keys")
            .join(keyfile::PRIVATE_KEY_FILE)
            .exists()
    );
    let public = keyfile::read_public_key(&split.public).unwrap();
    let design = keyfile::read_design_share(&split.design, &public).unwrap();
    let verification = keyfile::read_verification_key(&split.verification, &public).unwrap();
    let auditor_share =
        KeyShare::from_bytes(&public, &std::fs::read(&split.auditor).unwrap()).unwrap();
    let dealing = Dealing {
        keys,
        design: design.clone(),
        auditor: auditor_share,
    };

    // The auditor's operator: init with the auditor's share and k = 20, then serve.
    let signing = SigningKey::from_bytes(&[9; 32]);
    let aggregator = dir.path().join("aggregator.pub");
    std::fs::write(
        &aggregator,
        penrose_host::key_file::signer_line(&signing.verifying_key()),
    )
    .unwrap();
    let data = dir.path().join("auditor");
    let init = auditor_cmd()
        .args([
            "init",
            "--data",
            path(&data),
            "--share",
            path(&split.auditor),
        ])
        .args(["--public-key", path(&split.public)])
        .args(["--verification-key", path(&split.verification)])
        .args(["--aggregator-key", path(&aggregator), "--threshold", "20"])
        .output()
        .unwrap();
    assert!(init.status.success(), "{init:?}");
    let mut child = Killed(
        auditor_cmd()
            .args(["serve", "--data", path(&data), "--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let listening: Listening = serde_json::from_str(&line).unwrap();
    let trust = Trust::load_pinned(&listening.certificate).unwrap();
    let mut config = ClientConfig::new(listening.listening, "localhost", trust);
    config.ack_timeout = Duration::from_secs(120);
    let client = ExchangeClient::new(config, audit::PROTOCOL).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();

    // Chain A: bundle 1 with a sum of 30 contributors and one of 12 (released by the design
    // server's k = 10, held back by the auditor's k = 20), bundle 2 with one of 25.
    let mut chain = ChainMaker::new(&signing, 1, vec![dealing.id()]);
    let (big, big_bins) = dealing.sum(0, DAY, 0, 30 * 24, &mut rng);
    let (small, _) = dealing.sum(0, DAY, 1, 12 * 24, &mut rng);
    let (later, later_bins) = dealing.sum(0, DAY + 1, 0, 25 * 24, &mut rng);
    let b1 = chain.next(&[DAY], vec![big, small]);
    let b2 = chain.next(&[DAY + 1], vec![later]);
    let archive = Archive::open(&dir.path().join("archive")).unwrap();
    import(&archive, dir.path(), "a1.bundle", &b1, &signing);
    import(&archive, dir.path(), "a2.bundle", &b2, &signing);
    let holdings = [KeyHolding::Split {
        share: design,
        verification,
    }];

    // Before the auditor answers, the design server decrypts nothing.
    let alone = report_of(&archive, &holdings);
    assert!(alone.decrypted.is_empty());
    assert_eq!(alone.awaiting_auditor.len(), 3);

    let summary = runtime.block_on(audit::fetch(&archive, &client)).unwrap();
    assert_eq!(
        (
            summary.bundles,
            summary.pages_asked,
            summary.partials,
            summary.withheld
        ),
        (2, 2, 2, 1)
    );
    let both = report_of(&archive, &holdings);
    let decrypted: Vec<(u32, u32, Vec<u64>)> = both
        .decrypted
        .iter()
        .map(|c| (c.class, c.epochs.len() as u32, c.bins.clone()))
        .collect();
    let added: Vec<u64> = big_bins
        .iter()
        .zip(&later_bins)
        .map(|(a, b)| a + b)
        .collect();
    assert_eq!(decrypted, [(0, 2, added)]);
    assert_eq!(both.awaiting_auditor.len(), 1);
    assert_eq!(both.awaiting_auditor[0].class, 1);
    assert!(both.quarantined.is_empty());

    // Asked again: nothing is asked twice.
    let again = runtime.block_on(audit::fetch(&archive, &client)).unwrap();
    assert_eq!((again.pages_asked, again.pages_kept), (0, 2));

    // A copy of the store (another instance) releases its own version of epoch DAY: the
    // auditor refuses it, and the design server that asked keeps nothing.
    let mut copy = ChainMaker::new(&signing, 2, vec![dealing.id()]);
    let (copied, _) = dealing.sum(0, DAY, 0, 29 * 24, &mut rng);
    let c1 = copy.next(&[DAY], vec![copied]);
    let other = Archive::open(&dir.path().join("other-archive")).unwrap();
    import(&other, dir.path(), "c1.bundle", &c1, &signing);
    let refused = runtime.block_on(audit::fetch(&other, &client)).unwrap_err();
    assert!(
        matches!(
            refused,
            AuditError::Refused {
                refusal: AuditRefusal::OtherChain,
                ..
            }
        ),
        "{refused}"
    );
    assert!(refused.is_refusal());
    assert!(AuditorPartials::load(&other).unwrap().is_empty());
    assert!(report_of(&other, &holdings).decrypted.is_empty());
}
