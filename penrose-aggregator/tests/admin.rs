//! The admin CLI against a running server (through the control socket) and against a stopped
//! one (opening the data directory): status, top, throttle, close-epoch, export (and again with
//! --seq), verify, backup, and the metrics page.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use penrose_aggregator::control::reply::{
    CloseEpochsReply, EvidenceReply, ExportReply, ForgetEvidenceReply, StatusReply, TopReply,
};
use penrose_aggregator::output::VerifyOutput;
use penrose_core::bundle::BundleHash;
use penrose_core::counters::CounterId;
use penrose_core::evidence_file::EvidenceFileHeader;
use penrose_core::wire::AckStatus;
use penrose_transport::{Client, ClientConfig, Trust};
use serde::de::DeserializeOwned;

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

/// A command's `--json` output, read into the type the CLI printed it from.
fn json<T: DeserializeOwned>(data: &Path, args: &[&str]) -> T {
    let (code, out) = cli(data, args);
    assert_eq!(code, 0, "{args:?}: {out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_commands_work_serving_and_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let key = dir.path().join("public.key");
    // The server refuses keys under 2048 bits.
    std::fs::write(&key, KEYS_2048.public_key().to_bytes()).unwrap();
    let (mut server, started) = spawn_serve(
        &data,
        &key,
        &["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"],
    );
    let addr = started.listening;

    // A second server on the same data directory is "unavailable" (exit code 4), not a
    // failure: it can start once the first stops.
    let second = Command::new(env!("CARGO_BIN_EXE_penrose-aggregator"))
        .args([
            "serve",
            "--open-admission",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(&data)
        .arg("--public-key")
        .arg(&key)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(4), "{stderr}");

    let trust = Trust::load_pinned(&data.join("tls").join("cert.pem")).unwrap();
    let client = Client::connect(ClientConfig::new(addr, "localhost", trust))
        .await
        .unwrap();
    let snippets = snippets(2, 1);
    let mut rng = rng(11);
    for i in 0..12 {
        let s = report_2048(snippets[i % 2].1, CounterId(4), &mut rng);
        let mut frame = (s.frame.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&s.frame);
        assert_eq!(
            client.send_raw(&frame).await.unwrap().status,
            AckStatus::Accepted
        );
    }

    let status: StatusReply = json(&data, &["status", "--json"]);
    assert!(status.serving);
    assert_eq!(status.reports_accepted_total, 12);
    assert_eq!(status.classes, 2);
    let top: TopReply = json(&data, &["top", "--limit", "1", "--json"]);
    assert_eq!(top.top.len(), 1);
    assert_eq!(top.top[0].reports, 6);

    let (code, _) = cli(&data, &["throttle", "--rate", "80%"]);
    assert_eq!(code, 0);
    let s = report_2048(snippets[0].1, CounterId(5), &mut rng);
    let mut frame = (s.frame.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&s.frame);
    assert_eq!(
        client.send_raw(&frame).await.unwrap().throttle.permille(),
        800
    );
    let (code, _) = cli(&data, &["throttle", "--rate", "120%"]);
    assert_ne!(code, 0, "a rate above 100% is refused");

    // Nothing is exported while the only epoch (today's) is open.
    let bundle = dir.path().join("sums.bundle");
    let exported: ExportReply = json(
        &data,
        &["export", "--out", bundle.to_str().unwrap(), "--json"],
    );
    assert_eq!(exported.bundle, None);
    assert!(!bundle.exists());
    let closed: CloseEpochsReply = json(&data, &["close-epoch", "--json"]);
    assert_eq!(closed.closed.len(), 1, "{closed:?}");
    assert_eq!(closed.closed[0].reports, 13);
    // 13 reports are far below 10 contributors: the epoch is exported with every sum withheld.
    let exported: ExportReply = json(
        &data,
        &["export", "--out", bundle.to_str().unwrap(), "--json"],
    );
    let made = exported.bundle.expect("a bundle");
    assert_eq!(made.seq, 1);
    assert_eq!(made.entries, 0);
    assert_eq!(made.reports, 0);
    assert_eq!(made.withheld_sums, 3);
    assert_eq!(made.withheld_reports, 13);
    assert_eq!(
        exported.bytes as u64,
        std::fs::metadata(&bundle).unwrap().len()
    );
    let again: ExportReply = json(
        &data,
        &["export", "--out", bundle.to_str().unwrap(), "--json"],
    );
    assert_eq!(again.bundle, None, "nothing closed since");
    // A lost bundle is written again byte for byte.
    let copy = dir.path().join("copy.bundle");
    let rewritten: ExportReply = json(
        &data,
        &[
            "export",
            "--out",
            copy.to_str().unwrap(),
            "--seq",
            "1",
            "--json",
        ],
    );
    assert_eq!(rewritten.bundle.map(|b| b.seq), Some(1));
    assert_eq!(
        std::fs::read(&copy).unwrap(),
        std::fs::read(&bundle).unwrap()
    );
    let (code, _) = cli(
        &data,
        &["export", "--out", copy.to_str().unwrap(), "--seq", "2"],
    );
    assert_ne!(code, 0, "bundle 2 was never exported");
    // Its evidence, for the release auditor, written by the running server: the header names
    // the bundle; it released no sum, so no entry follows.
    let evidence = dir.path().join("sums.evidence");
    let written: EvidenceReply = json(
        &data,
        &[
            "export-evidence",
            "--seq",
            "1",
            "--out",
            evidence.to_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!((written.seq, written.entries, written.reports), (1, 0, 0));
    let file = std::fs::read(&evidence).unwrap();
    assert_eq!(written.bytes, file.len() as u64);
    let header = EvidenceFileHeader::decode(file.as_slice().try_into().unwrap()).unwrap();
    assert_eq!(
        header.bundle,
        BundleHash::of(&std::fs::read(&bundle).unwrap())
    );
    let missing = dir.path().join("none.evidence");
    let (code, _) = cli(
        &data,
        &[
            "export-evidence",
            "--seq",
            "2",
            "--out",
            missing.to_str().unwrap(),
        ],
    );
    assert_ne!(code, 0, "bundle 2 has no evidence");
    assert!(!missing.exists() && !missing.with_extension("partial").exists());
    // Once the auditor answered bundle 1, its evidence goes (none was kept: no
    // --keep-evidence); a bundle never exported is refused.
    let forgot: ForgetEvidenceReply = json(&data, &["forget-evidence", "--through", "1", "--json"]);
    assert_eq!(
        (forgot.through, forgot.epochs.len(), forgot.rows),
        (1, 1, 0)
    );
    let (code, _) = cli(&data, &["forget-evidence", "--through", "2"]);
    assert_ne!(code, 0, "bundle 2 was never exported");
    let signer = data.join("server.key.pub");
    let out = Command::new(env!("CARGO_BIN_EXE_penrose-aggregator"))
        .args(["verify", "--json", "--signer"])
        .arg(&signer)
        .arg(&bundle)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let verified: VerifyOutput = serde_json::from_slice(&out.stdout).unwrap();
    match verified {
        VerifyOutput::Valid(b) => assert_eq!((b.seq, b.reports, b.pinned), (1, 0, true)),
        VerifyOutput::Invalid { error } => panic!("{error}"),
    }
    // A damaged bundle is refused (exit code 3).
    let mut bytes = std::fs::read(&bundle).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    std::fs::write(&bundle, &bytes).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_penrose-aggregator"))
        .arg("verify")
        .arg(&bundle)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let out = Command::new(env!("CARGO_BIN_EXE_penrose-aggregator"))
        .args(["verify", "--json"])
        .arg(&bundle)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let refused: VerifyOutput = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        matches!(refused, VerifyOutput::Invalid { .. }),
        "{refused:?}"
    );

    // Metrics over HTTP on the local port.
    let metrics_addr = started.metrics.expect("a metrics address");
    let mut stream = std::net::TcpStream::connect(metrics_addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut page = String::new();
    stream.read_to_string(&mut page).unwrap();
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("penrose_reports_accepted_total 13"), "{page}");
    assert!(page.contains("penrose_classes 2"), "{page}");
    check_with_promtool(&page);

    let backup = dir.path().join("backup");
    let (code, _) = cli(&data, &["backup", backup.to_str().unwrap()]);
    assert_eq!(code, 0);
    client.close().await;

    // Stopped: the same commands open the data directory (and the backup) themselves.
    server.kill().unwrap();
    server.wait().unwrap();
    let status: StatusReply = json(&data, &["status", "--json"]);
    assert!(!status.serving);
    assert_eq!(status.admission, None, "offline nothing is admitted");
    assert_eq!(status.reports_accepted_total, 13);
    assert_eq!(status.throttle_permille, 800);
    assert!(status.open_epochs.is_empty());
    let restored: StatusReply = json(&backup, &["status", "--json"]);
    assert_eq!(restored.reports_accepted_total, 13);
    // A restored backup is a new bundle chain.
    assert_ne!(restored.instance, status.instance);
    assert_eq!(restored.closed_through, status.closed_through);
}

/// Checks the exposition (the body of an HTTP response) with Prometheus's own linter,
/// `promtool check metrics` (Debian's `prometheus` package; CI installs the one binary). Without
/// it the check says SKIPPED, which CI counts.
fn check_with_promtool(response: &str) {
    use std::process::{Command, Stdio};
    let body = response
        .split_once("\r\n\r\n")
        .map_or(response, |(_, body)| body);
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            penrose_host::skip::skipped(format_args!(
                "SKIPPED: promtool is not installed (ci/install-deps.sh puts it on PATH)"
            ));
            return;
        }
        Err(e) => panic!("promtool: {e}"),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics refused the page:\n{}{}\n{body}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
