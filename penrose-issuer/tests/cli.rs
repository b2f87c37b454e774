//! The `penrose-issuer` binary as an operator runs it: init, enrol (one host and a fleet),
//! status, revoke (exit code 3 for an unknown id), key-set, export-keys (a 0600 ring that
//! verifies what `serve` issued), serve on loopback with enrol and status through its control
//! socket, and the refusals of a seed others can read and of a second init.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use penrose_core::tokens::protocol::{BatchOutcome, Credential, IssuerAnswer, IssuerRequest};
use penrose_core::tokens::{IssueResponse, KeyRing, KeySet, TokenEpoch, TokenRequest, TokenScope};
use penrose_host::clock::{Clock, SystemClock};
use penrose_issuer::service::{Listening, PROTOCOL};
use penrose_transport::exchange::ExchangeClient;
use penrose_transport::{ClientConfig, Trust};
use serde_json::Value;

fn issuer(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_penrose-issuer"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> Value {
    let out = issuer(args);
    assert!(
        out.status.success(),
        "{args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// A child process killed when the test ends, whatever way it ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn an_operator_sets_up_enrols_revokes_and_exports() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let s = state.to_str().unwrap();
    let init = ok(&["init", "--state", s, "--json"]);
    assert_eq!(mode(&state.join("seed")), 0o600);
    assert_eq!(mode(&state), 0o700);
    assert!(init["seed"].as_str().unwrap().ends_with("seed"));
    // A second init changes nothing.
    let seed = std::fs::read(state.join("seed")).unwrap();
    let again = issuer(&["init", "--state", s]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already initialised"));
    assert_eq!(std::fs::read(state.join("seed")).unwrap(), seed);

    let host = dir.path().join("gpu17.credential");
    let one = ok(&[
        "enrol",
        "--state",
        s,
        "--out",
        host.to_str().unwrap(),
        "--label",
        "gpu17",
        "--json",
    ]);
    assert_eq!(mode(&host), 0o600);
    let text = std::fs::read_to_string(&host).unwrap();
    assert!(text.starts_with("penrose-issuer-credential 1\n"));
    let short = one[0]["short_id"].as_str().unwrap().to_string();
    assert_eq!(short.len(), 16);
    // Never over an existing file.
    let twice = issuer(&["enrol", "--state", s, "--out", host.to_str().unwrap()]);
    assert_eq!(twice.status.code(), Some(1));

    let fleet = dir.path().join("fleet");
    let many = ok(&[
        "enrol",
        "--state",
        s,
        "--count",
        "3",
        "--out-dir",
        fleet.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(many.as_array().unwrap().len(), 3);
    assert_eq!(std::fs::read_dir(&fleet).unwrap().count(), 3);

    let status = ok(&["status", "--state", s, "--json"]);
    assert_eq!(
        (status["enrolled"].as_u64(), status["revoked"].as_u64()),
        (Some(4), Some(0))
    );
    assert_eq!(status["serving"], Value::Bool(false));

    let revoked = ok(&["revoke", "--state", s, &short, "--json"]);
    assert_eq!(revoked["already"], Value::Bool(false));
    assert_eq!(revoked["label"], Value::String("gpu17".into()));
    let again = ok(&[
        "revoke",
        "--state",
        s,
        "--credential",
        host.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(again["already"], Value::Bool(true));
    let unknown = issuer(&["revoke", "--state", s, "00000000000000000000"]);
    assert_eq!(unknown.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no enrolled credential"));
    let status = ok(&["status", "--state", s, "--json"]);
    assert_eq!(
        (status["enrolled"].as_u64(), status["revoked"].as_u64()),
        (Some(3), Some(1))
    );

    // The ring: 0600, today-2 ..= today+7 by default, every counter.
    let ring_path = dir.path().join("tokens.ring");
    let ring = ok(&[
        "export-keys",
        "--state",
        s,
        "--out",
        ring_path.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(mode(&ring_path), 0o600);
    let decoded = KeyRing::decode(&std::fs::read(&ring_path).unwrap()).unwrap();
    let counters = penrose_core::counters::Catalogue::current()
        .report_ids()
        .count();
    assert_eq!(decoded.keys().len(), 10 * counters);
    assert_eq!(ring["keys"].as_u64(), Some(10 * counters as u64));
    let today = SystemClock.today();
    assert_eq!(ring["from"].as_u64(), Some(u64::from(today.0 - 2)));
    assert_eq!(ring["to"].as_u64(), Some(u64::from(today.0 + 7)));
    let custom = ok(&[
        "export-keys",
        "--state",
        s,
        "--out",
        ring_path.to_str().unwrap(),
        "--from",
        "today",
        "--to",
        "today+30",
        "--json",
    ]);
    assert_eq!(custom["keys"].as_u64(), Some(31 * counters as u64));
    let backwards = issuer(&[
        "export-keys",
        "--state",
        s,
        "--out",
        ring_path.to_str().unwrap(),
        "--from",
        "today",
        "--to",
        "today-1",
    ]);
    assert_eq!(backwards.status.code(), Some(1));

    // The public set, and its digest.
    let set_path = dir.path().join("keyset.bin");
    let set = ok(&[
        "key-set",
        "--state",
        s,
        "--out",
        set_path.to_str().unwrap(),
        "--json",
    ]);
    let decoded = KeySet::decode(&std::fs::read(&set_path).unwrap()).unwrap();
    assert_eq!(decoded.entries().len(), 5 * counters);
    assert_eq!(
        set["key_set_digest"].as_str().unwrap(),
        penrose_core::hex::encode(&decoded.digest())
    );

    // A seed others can read is refused, naming the file and its mode.
    std::fs::set_permissions(state.join("seed"), std::fs::Permissions::from_mode(0o644)).unwrap();
    for args in [
        vec![
            "export-keys",
            "--state",
            s,
            "--out",
            ring_path.to_str().unwrap(),
        ],
        vec!["serve", "--state", s, "--listen", "127.0.0.1:0"],
    ] {
        let out = issuer(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("seed") && err.contains("644"), "{err}");
    }
    // Usage errors are exit code 2; a quota above T is refused.
    assert_eq!(issuer(&["enrol", "--state", s]).status.code(), Some(2));
    std::fs::set_permissions(state.join("seed"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let over = issuer(&[
        "serve",
        "--state",
        s,
        "--listen",
        "127.0.0.1:0",
        "--tokens-per-epoch",
        "25",
    ]);
    assert_eq!(over.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&over.stderr).contains("1 to 24"));
}

#[tokio::test]
async fn serve_issues_to_an_enrolled_host_and_answers_admin_commands_while_running() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let s = state.to_str().unwrap().to_string();
    ok(&["init", "--state", &s]);
    let host = dir.path().join("host.credential");
    ok(&["enrol", "--state", &s, "--out", host.to_str().unwrap()]);

    let mut child = Killed(
        Command::new(env!("CARGO_BIN_EXE_penrose-issuer"))
            .args(["serve", "--state", &s, "--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let listening: Listening = serde_json::from_str(&line).unwrap();
    assert_eq!(mode(&listening.certificate), 0o644);
    // A second issuer on the same state directory is "unavailable" (exit code 4).
    let second = issuer(&["serve", "--state", &s, "--listen", "127.0.0.1:0"]);
    assert_eq!(
        second.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert_eq!(mode(&state.join("tls/key.pem")), 0o600);

    let trust = Trust::load_pinned(&listening.certificate).unwrap();
    let mut config = ClientConfig::new(listening.listening, "localhost", trust);
    config.ack_timeout = Duration::from_secs(20);
    let client = ExchangeClient::new(config, PROTOCOL).unwrap();
    let answer = client
        .exchange(&IssuerRequest::KeySet.encode())
        .await
        .unwrap();
    let IssuerAnswer::KeySet(bytes) = IssuerAnswer::decode(&answer).unwrap() else {
        panic!("no key set");
    };
    let set = KeySet::decode(&bytes).unwrap();
    assert_eq!(
        penrose_core::hex::encode(&set.digest()),
        listening.details.key_set_digest
    );

    // The host's credential file, as the agent will read it.
    let credential = Credential::from_file(&std::fs::read_to_string(&host).unwrap()).unwrap();
    let today = SystemClock.today();
    let entry = set.get(TokenEpoch(today.0), TokenScope(6)).unwrap();
    let pending = TokenRequest::new(entry, 24, &mut rand::rng()).unwrap();
    let request = IssuerRequest::Issue {
        credential,
        batches: vec![pending.request().encode()],
    };
    let answer = client.exchange(&request.encode()).await.unwrap();
    let IssuerAnswer::Issued(outcomes) = IssuerAnswer::decode(&answer).unwrap() else {
        panic!("refused");
    };
    let BatchOutcome::Issued(response) = &outcomes[0] else {
        panic!("not issued: {outcomes:?}");
    };
    let tokens = pending
        .finalize(&IssueResponse::decode(response, &set).unwrap())
        .unwrap();
    assert_eq!(tokens.len(), 24);

    // Admin commands go through the control socket while the store is the server's.
    let fleet = dir.path().join("fleet");
    ok(&[
        "enrol",
        "--state",
        &s,
        "--count",
        "2",
        "--out-dir",
        fleet.to_str().unwrap(),
    ]);
    let status = ok(&["status", "--state", &s, "--json"]);
    assert_eq!(status["serving"], Value::Bool(true));
    assert_eq!(status["enrolled"].as_u64(), Some(3));
    assert_eq!(status["since_start"]["tokens_issued"].as_u64(), Some(24));
    assert_eq!(status["epochs"][0]["tokens"].as_u64(), Some(24));
    assert_eq!(
        status["epochs"][0]["per_scope"],
        serde_json::json!([{"scope": 6, "tokens": 24}])
    );

    // The ring exported while serving verifies the tokens it issued.
    let ring_path = dir.path().join("ring");
    ok(&[
        "export-keys",
        "--state",
        &s,
        "--out",
        ring_path.to_str().unwrap(),
    ]);
    let ring = KeyRing::decode(&std::fs::read(&ring_path).unwrap()).unwrap();
    let key = ring.find(tokens[0].epoch(), tokens[0].key_id()).unwrap();
    let redemption = tokens[0].redeem(b"body");
    key.verify(&redemption, b"body").unwrap();

    // SIGHUP has nothing to reload: the issuer keeps serving. SIGTERM stops it cleanly.
    let hup = Command::new("kill")
        .args(["-HUP", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "SIGHUP ended the issuer"
    );
    assert_eq!(
        ok(&["status", "--state", &s, "--json"])["serving"],
        Value::Bool(true)
    );
    let killed = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.0.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(!state.join("control.sock").exists());
    // Stopped: the same commands open the store themselves.
    let status = ok(&["status", "--state", &s, "--json"]);
    assert_eq!(status["serving"], Value::Bool(false));
    assert_eq!(status["epochs"][0]["tokens"].as_u64(), Some(24));
}
