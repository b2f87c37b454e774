//! The `penrose-auditor` binary as an operator runs it, with a 2048-bit key (the size every
//! tier requires): init from the dealer's files (0700 directory, 0600 share), its refusals
//! (the design server's share, a share others can read, a weak key, a threshold under the
//! floor, a second init) with exit codes, status, serve on loopback (a ready line, a release
//! over QUIC that combines to the exact sums), follow refused while serving, SIGTERM, then
//! status and follow on the record it left. And the checks on offered key files, with small
//! keys.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{ChainMaker, DAY, Dealing, ENOUGH, KeyFiles, partials};
use ed25519_dalek::SigningKey;
use penrose_auditor::service::{Listening, PROTOCOL};
use penrose_auditor::{AuditorError, keys};
use penrose_core::audit::{AuditAnswer, AuditRequest};
use penrose_core::paillier::KeySize;
use penrose_core::paillier::threshold;
use penrose_transport::exchange::ExchangeClient;
use penrose_transport::{ClientConfig, Trust};
use rand::SeedableRng;
use serde_json::Value;

fn auditor(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_penrose-auditor"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> Value {
    let out = auditor(args);
    assert!(
        out.status.success(),
        "{args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

fn fails(args: &[&str], code: i32, says: &str) {
    let out = auditor(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
    assert!(stderr.contains(says), "{args:?}: {stderr}");
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

fn text(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A child process killed when the test ends, whatever way it ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An operator's files: the dealer's, the aggregation server's key, the data directory.
struct Operator {
    dir: tempfile::TempDir,
    dealing: Dealing,
    files: KeyFiles,
    signing: SigningKey,
    aggregator: PathBuf,
    data: PathBuf,
}

impl Operator {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let dealing = Dealing::new(KeySize::Bits2048, 21);
        let files = dealing.write_files(&dir.path().join("dealer"));
        let signing = SigningKey::from_bytes(&[9; 32]);
        let aggregator = dir.path().join("aggregator-signing.key.pub");
        let key = penrose_host::key_file::signer_line(&signing.verifying_key());
        std::fs::write(&aggregator, key).unwrap();
        let data = dir.path().join("auditor");
        Operator {
            dir,
            dealing,
            files,
            signing,
            aggregator,
            data,
        }
    }

    fn d(&self) -> &str {
        text(&self.data)
    }

    /// `init` with `share` and `public`'s key files and the extra arguments.
    fn init(&self, key: &KeyFiles, share: &Path, extra: &[&str]) -> Vec<String> {
        let mut args = vec![
            "init",
            "--data",
            self.d(),
            "--share",
            text(share),
            "--public-key",
            text(&key.public),
            "--verification-key",
            text(&key.verification),
            "--aggregator-key",
            text(&self.aggregator),
        ];
        args.extend(extra);
        args.into_iter().map(str::to_owned).collect()
    }
}

#[test]
fn an_operator_sets_up_serves_and_repins_an_auditor() {
    let op = Operator::new();
    refusals_make_nothing(&op);
    init_makes_a_private_directory(&op);
    serve_and_release(&op.dealing, &op.signing, op.d());
    repin(&op);
}

fn refusals_make_nothing(op: &Operator) {
    let (files, share) = (&op.files, &op.files.share);
    fails(
        &strs(&op.init(files, &files.design, &[])),
        3,
        "not the release auditor's share",
    );
    fails(
        &strs(&op.init(files, share, &["--threshold", "9"])),
        3,
        "below the floor",
    );
    std::fs::set_permissions(share, std::fs::Permissions::from_mode(0o644)).unwrap();
    fails(
        &strs(&op.init(files, share, &[])),
        1,
        "accessible to group or others",
    );
    std::fs::set_permissions(share, std::fs::Permissions::from_mode(0o600)).unwrap();
    let weak = Dealing::new(KeySize::Bits1024, 3).write_files(&op.dir.path().join("weak"));
    fails(&strs(&op.init(&weak, &weak.share, &[])), 3, "too weak");
    assert!(!op.data.exists());
}

fn init_makes_a_private_directory(op: &Operator) {
    let made = ok(&strs(&op.init(&op.files, &op.files.share, &["--json"])));
    assert_eq!(made["key"], op.dealing.id().to_string());
    assert_eq!(
        (made["threshold"].as_u64(), made["cap"].as_u64()),
        (Some(10), Some(24))
    );
    assert_eq!(mode(&op.data), 0o700);
    let share = op
        .data
        .join("shares")
        .join(format!("{}.share", op.dealing.id()));
    assert_eq!(mode(&share), 0o600);
    assert_eq!(
        std::fs::read(&share).unwrap(),
        std::fs::read(&op.files.share).unwrap()
    );
    let before = common::snapshot(&op.data);
    fails(
        &strs(&op.init(&op.files, &op.files.share, &[])),
        3,
        "already exists",
    );
    let files = &op.files;
    let add = [
        "add-share",
        "--data",
        op.d(),
        "--share",
        text(&files.share),
        "--public-key",
        text(&files.public),
        "--verification-key",
        text(&files.verification),
    ];
    fails(&add, 3, "already holds a share");
    assert_eq!(common::snapshot(&op.data), before);
    let status = ok(&["status", "--data", op.d(), "--json"]);
    assert_eq!(
        (&status["instance"], status["seq"].as_u64()),
        (&Value::Null, Some(0))
    );
    assert_eq!(status["keys"][0], op.dealing.id().to_string());
}

fn repin(op: &Operator) {
    let d = op.d();
    let status = ok(&["status", "--data", d, "--json"]);
    assert_eq!(status["seq"].as_u64(), Some(1));
    assert_eq!(status["instance"], "01".repeat(16));
    assert_eq!(
        status["answered"][0]["epoch"].as_u64(),
        Some(u64::from(DAY))
    );
    let copy = "02".repeat(16);
    let followed = ok(&["follow", "--data", d, "--instance", &copy, "--json"]);
    assert_eq!(followed["already"], Value::Bool(false));
    assert_eq!(followed["now"]["instance"], copy);
    let status = ok(&["status", "--data", d, "--json"]);
    assert_eq!(status["instance"].as_str(), Some(copy.as_str()));
    assert_eq!(status["seq"].as_u64(), Some(0));
    assert_eq!(status["earlier"][0]["instance"], "01".repeat(16));
    assert_eq!(status["answered"].as_array().unwrap().len(), 1);
    let plain = auditor(&["status", "--data", d]);
    assert!(String::from_utf8_lossy(&plain.stdout).contains("epochs answered: 1"));
    fails(&["follow", "--data", d, "--instance", "xyz"], 2, "instance");
}

/// Serves the data directory, asks for one page over QUIC, combines it, stops with SIGTERM.
fn serve_and_release(dealing: &Dealing, signing: &SigningKey, d: &str) {
    let child = Command::new(env!("CARGO_BIN_EXE_penrose-auditor"))
        .args(["serve", "--data", d, "--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = Killed(child);
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let listening: Listening = serde_json::from_str(&line).unwrap();
    assert_eq!(listening.details.keys, [dealing.id()]);
    fails(
        &["follow", "--data", d, "--instance", &"02".repeat(16)],
        4,
        "in use",
    );

    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let (sum, bins) = dealing.sum(0, DAY, 0, ENOUGH, &mut rng);
    let bundle = ChainMaker::new(signing, 1, vec![dealing.id()]).next(&[DAY], vec![sum.clone()]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let answer = runtime.block_on(async {
        let trust = Trust::load_pinned(&listening.certificate).unwrap();
        let address = listening.listening;
        let mut config = ClientConfig::new(address, "localhost", trust);
        config.ack_timeout = Duration::from_secs(60);
        let client = ExchangeClient::new(config, PROTOCOL).unwrap();
        let request = AuditRequest::Release {
            bundle,
            first: 0,
            count: 1,
            evidence: Vec::new(),
        };
        AuditAnswer::decode(&client.exchange(&request.encode()).await.unwrap()).unwrap()
    });
    let (got, _) = partials(answer);
    assert_eq!(dealing.combine(&sum, &got[0].partial), bins);

    let pid = child.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = child.0.wait().unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn offered_key_files_are_checked_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let one = Dealing::new(KeySize::Bits1024, 3);
    let other = Dealing::new(KeySize::Bits1024, 4);
    let a = one.write_files(&dir.path().join("one"));
    let b = other.write_files(&dir.path().join("other"));
    // Another key's share, or verification key.
    assert!(matches!(
        keys::read_offered(&b.share, &a.public, &a.verification),
        Err(AuditorError::Key { .. })
    ));
    assert!(matches!(
        keys::read_offered(&a.share, &a.public, &b.verification),
        Err(AuditorError::Key { .. })
    ));
    // The design server's share.
    assert!(matches!(
        keys::read_offered(&a.design, &a.public, &a.verification),
        Err(AuditorError::NotAuditorShare(_))
    ));
    // A second dealing of the same key: its verification key does not prove this share.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(8);
    let again = threshold::split(one.keys.private_key(), &mut rng).unwrap();
    let second = dir.path().join("second.verification");
    std::fs::write(&second, again.auditor.verification_key().to_bytes()).unwrap();
    assert!(matches!(
        keys::read_offered(&a.share, &a.public, &second),
        Err(AuditorError::VerificationMismatch(_))
    ));
    // Everything right but the size: every tier requires 2048 bits.
    let weak = keys::read_offered(&a.share, &a.public, &a.verification);
    assert!(
        matches!(weak, Err(AuditorError::WeakKey { .. })),
        "{weak:?}"
    );
    assert!(weak.unwrap_err().is_refusal());
}
