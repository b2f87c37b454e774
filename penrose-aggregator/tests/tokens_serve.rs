//! The `serve` binary's admission: it refuses to start without `--token-keys` unless
//! `--open-admission` says so, and refuses a key ring file others may read or a symbolic link;
//! `status --json` shows the admission mode and the key ring's epochs; the ring is read again
//! on `reload-keys` and on SIGHUP, and a refused file leaves the ring in use; the metrics page
//! counts tokens verified and refused and the spent table.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use penrose_aggregator::admission::AdmissionDescription;
use penrose_aggregator::control::reply::{ReloadKeysReply, StatusReply};
use penrose_aggregator::output::{FrameCheck, FrameVerdict};
use penrose_core::counters::CounterId;
use penrose_core::tokens::KeyRing;
use penrose_core::wire::{AckStatus, Day, RejectReason};
use penrose_host::clock::today;
use penrose_transport::{Client, ClientConfig, Trust};

/// Runs `serve` with `args` and returns its exit code and stderr; fails the test if it is
/// still running (serving) after a minute.
fn refused(data: &Path, args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_penrose-aggregator"))
        .arg("serve")
        .arg("--data-dir")
        .arg(data)
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("serve {args:?} started instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status.code(), stderr)
}

fn ring_of(days: &[Day], counters: &[CounterId]) -> KeyRing {
    token_ring(days, counters, 71)
}

#[test]
fn serve_refuses_to_start_without_admission_or_with_an_exposed_or_linked_key_ring() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("public.key");
    std::fs::write(&key, KEYS_2048.public_key().to_bytes()).unwrap();
    let key = key.to_str().unwrap();
    let data = dir.path().join("data");
    let ring = dir.path().join("token-keys");
    write_ring(&ring, &ring_of(&[today()], &[CounterId(4)]));
    let ring = ring.to_str().unwrap();

    // Neither a key ring nor open admission: refused, naming both ways out.
    let (code, stderr) = refused(&data, &["--public-key", key]);
    assert!(matches!(code, Some(c) if c != 0), "{code:?}: {stderr}");
    assert!(
        stderr.contains("--token-keys") && stderr.contains("--open-admission"),
        "{stderr}"
    );
    assert!(!data.exists(), "a refused start leaves no data directory");

    // Both: a usage error.
    let (code, stderr) = refused(
        &data,
        &[
            "--public-key",
            key,
            "--token-keys",
            ring,
            "--open-admission",
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");

    // The same from a configuration file: both keys set.
    let config = dir.path().join("both.toml");
    std::fs::write(
        &config,
        format!("token_keys = \"{ring}\"\nopen_admission = true\n"),
    )
    .unwrap();
    let (code, stderr) = refused(
        &data,
        &["--public-key", key, "--config", config.to_str().unwrap()],
    );
    assert!(matches!(code, Some(c) if c != 0), "{code:?}: {stderr}");
    assert!(stderr.contains("choose one"), "{stderr}");

    // A ring group or others may read, and a symbolic link to a good one.
    let exposed = dir.path().join("exposed");
    std::fs::copy(ring, &exposed).unwrap();
    std::fs::set_permissions(&exposed, std::fs::Permissions::from_mode(0o640)).unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(ring, &link).unwrap();
    for (path, says) in [
        (&exposed, "group or others (mode 640)"),
        (&link, "symbolic link"),
    ] {
        let (code, stderr) = refused(
            &data,
            &["--public-key", key, "--token-keys", path.to_str().unwrap()],
        );
        assert!(matches!(code, Some(c) if c != 0), "{code:?}: {stderr}");
        assert!(
            stderr.contains(says) && stderr.contains(path.to_str().unwrap()),
            "{stderr}"
        );
        assert!(
            !data.exists(),
            "a refused key ring leaves no data directory"
        );
    }
}

/// `check-report --token-keys` checks the frames' tokens as ingest does (not whether they were
/// spent): a frame with a valid token passes, one without and one with a token of another
/// counter are refused with their reasons (exit code 3); without `--token-keys` all pass.
#[test]
fn check_report_checks_tokens_with_a_key_ring() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("public.key");
    std::fs::write(&key, KEYS_2048.public_key().to_bytes()).unwrap();
    let t = today();
    let ring = ring_of(&[t], &[CounterId(4), CounterId(5)]);
    let ring_path = dir.path().join("token-keys");
    write_ring(&ring_path, &ring);
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(75);
    let four = mint(&ring, t, CounterId(4), 1, 76);
    let five = mint(&ring, t, CounterId(5), 1, 77).remove(0);
    let mut frames = Vec::new();
    for body in [
        with_token(
            &report_2048(snippet, CounterId(4), &mut rng).frame,
            &four[0],
        ),
        report_2048(snippet, CounterId(4), &mut rng).frame,
        with_token(&report_2048(snippet, CounterId(4), &mut rng).frame, &five),
    ] {
        frames.extend_from_slice(&(body.len() as u32).to_be_bytes());
        frames.extend_from_slice(&body);
    }
    let file = dir.path().join("captured.frames");
    std::fs::write(&file, &frames).unwrap();
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_penrose-aggregator"))
            .arg("check-report")
            .arg("--key")
            .arg(&key)
            .args(extra)
            .arg(&file)
            .arg("--json")
            .output()
            .unwrap();
        let lines: Vec<FrameCheck> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (out.status.code(), lines)
    };
    let (code, lines) = run(&["--token-keys", ring_path.to_str().unwrap()]);
    assert_eq!(code, Some(3));
    let verdicts: Vec<(bool, String)> = lines
        .iter()
        .map(|l| match &l.verdict {
            FrameVerdict::Valid { .. } => (true, String::new()),
            FrameVerdict::Rejected { reason, .. } => (false, reason.clone()),
        })
        .collect();
    assert_eq!(
        verdicts,
        [
            (true, String::new()),
            (false, "TokenRequired".into()),
            (false, "InvalidToken".into())
        ]
    );
    let (code, lines) = run(&[]);
    assert_eq!(code, Some(0), "{lines:?}");
}

fn cli(data: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_penrose-aggregator"))
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
    )
}

fn status(data: &Path) -> StatusReply {
    let (code, out) = cli(data, &["status", "--json"]);
    assert_eq!(code, 0, "{out}");
    serde_json::from_str(&out).unwrap()
}

/// The key ring a serving server's `status` shows: (keys, epochs, today and tomorrow
/// covered).
fn ring_status(data: &Path) -> (usize, Vec<u32>, bool, bool) {
    let s = status(data);
    match s.admission.as_ref().map(|a| &a.admission) {
        Some(AdmissionDescription::Tokens {
            keys,
            epochs,
            covers_today,
            covers_tomorrow,
            ..
        }) => (*keys, epochs.clone(), *covers_today, *covers_tomorrow),
        _ => panic!("not admitting by tokens: {s:?}"),
    }
}

fn replace_ring(path: &Path, ring: &KeyRing) {
    let tmp = path.with_extension("new");
    write_ring(&tmp, ring);
    std::fs::rename(&tmp, path).unwrap();
}

fn metrics(addr: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut page = String::new();
    stream.read_to_string(&mut page).unwrap();
    page
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_admission_and_the_key_ring_reloads_on_command_and_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let key = dir.path().join("public.key");
    std::fs::write(&key, KEYS_2048.public_key().to_bytes()).unwrap();
    let t = today();
    let tomorrow = Day(t.0 + 1);
    // Today's keys for counter 4 only; the next ring adds counter 5 and tomorrow.
    let first = ring_of(&[t], &[CounterId(4)]);
    let second = ring_of(&[t, tomorrow], &[CounterId(4), CounterId(5)]);
    let ring_path = dir.path().join("token-keys");
    write_ring(&ring_path, &first);
    let (mut server, started) = spawn_serve(
        &data,
        &key,
        &[
            "--listen",
            "127.0.0.1:0",
            "--metrics",
            "127.0.0.1:0",
            "--token-keys",
            ring_path.to_str().unwrap(),
        ],
    );
    let addr = started.listening;
    let metrics_addr = started.metrics.expect("a metrics address").to_string();

    let s = status(&data);
    assert_eq!(
        s.admission.map(|a| a.admission),
        Some(AdmissionDescription::Tokens {
            key_ring: Some(ring_path.clone()),
            keys: 1,
            epochs: vec![t.0],
            covers_today: true,
            covers_tomorrow: false,
        })
    );
    let (_, text) = cli(&data, &["status"]);
    assert!(text.contains("admission:            tokens"), "{text}");

    let trust = Trust::load_pinned(&data.join("tls").join("cert.pem")).unwrap();
    let client = Client::connect(ClientConfig::new(addr, "localhost", trust))
        .await
        .unwrap();
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(72);
    let send = |body: Vec<u8>| {
        let client = client.clone();
        async move {
            let mut frame = (body.len() as u32).to_be_bytes().to_vec();
            frame.extend_from_slice(&body);
            client.send_raw(&frame).await.unwrap().status
        }
    };
    let four = mint(&second, t, CounterId(4), 2, 73);
    let five = mint(&second, t, CounterId(5), 1, 74).remove(0);
    // The first ring and the second hold the same key of (today, counter 4): one seed.
    let body = with_token(
        &report_2048(snippet, CounterId(4), &mut rng).frame,
        &four[0],
    );
    assert_eq!(send(body).await, AckStatus::Accepted);
    let counter5 = report_2048(snippet, CounterId(5), &mut rng).frame;
    assert_eq!(
        send(with_token(&counter5, &five)).await,
        AckStatus::Rejected(RejectReason::InvalidToken),
        "no key of counter 5 yet"
    );

    // reload-keys puts the issuer's next ring in use.
    replace_ring(&ring_path, &second);
    let (code, out) = cli(&data, &["reload-keys", "--json"]);
    assert_eq!(code, 0, "{out}");
    let reloaded: ReloadKeysReply = serde_json::from_str(&out).unwrap();
    assert!(
        matches!(
            &reloaded.admission,
            AdmissionDescription::Tokens { epochs, .. } if *epochs == [t.0, tomorrow.0]
        ),
        "{reloaded:?}"
    );
    assert_eq!(
        send(with_token(&counter5, &five)).await,
        AckStatus::Accepted
    );
    assert!(ring_status(&data).3, "tomorrow covered");

    // A ring others could read is refused and the one in use stays.
    std::fs::set_permissions(&ring_path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, _) = cli(&data, &["reload-keys"]);
    assert_ne!(code, 0);
    assert_eq!(ring_status(&data).0, 4);

    // SIGHUP reads the file again.
    let third = ring_of(&[t], &[CounterId(4)]);
    replace_ring(&ring_path, &third);
    let hup = Command::new("kill")
        .args(["-HUP", &server.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    let waited = Instant::now();
    while ring_status(&data).0 != 1 {
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "SIGHUP did not reload"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let body = with_token(
        &report_2048(snippet, CounterId(4), &mut rng).frame,
        &four[1],
    );
    assert_eq!(send(body).await, AckStatus::Accepted);

    let page = metrics(&metrics_addr);
    for line in [
        "penrose_tokens_verified_total 3",
        "penrose_reports_rejected_total{reason=\"invalid_token\"} 1",
        "penrose_reports_accepted_total 3",
    ] {
        assert!(page.contains(line), "{line} missing:\n{page}");
    }
    assert!(page.contains("penrose_spent_tokens "), "{page}");
    let s = status(&data);
    assert_eq!(s.admission.map(|a| a.tokens_verified), Some(3));
    client.close().await;
    server.kill().unwrap();
    server.wait().unwrap();

    // Stopped: status opens the data directory itself and admits nothing.
    let s = status(&data);
    assert!(!s.serving);
    assert_eq!(s.admission, None);
    let (code, _) = cli(&data, &["reload-keys"]);
    assert_ne!(code, 0, "no server to reload");
}
