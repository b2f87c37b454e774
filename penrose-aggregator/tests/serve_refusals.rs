//! What `serve` refuses before it serves anything: a Paillier key under 2048 bits, and a
//! release rule below the floors (k = 10 contributors, T = 24 reports per contributor), from
//! flags or from the configuration file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Runs `serve` with `args` (and open admission) and returns its exit code and stderr; fails
/// the test if it is still running (serving) after a minute.
fn refused(data: &Path, args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_penrose-aggregator"))
        .arg("serve")
        .arg("--data-dir")
        .arg(data)
        .args(["--listen", "127.0.0.1:0"])
        // Admission is not what these tests refuse (tests/tokens_serve.rs is about it).
        .arg("--open-admission")
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

#[test]
fn serve_refuses_a_1024_bit_key_naming_the_file_and_the_floor() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("weak.key");
    std::fs::write(&key, KEYS.public_key().to_bytes()).unwrap();
    let data = dir.path().join("data");
    let (code, stderr) = refused(&data, &["--public-key", key.to_str().unwrap()]);
    assert!(matches!(code, Some(c) if c != 0), "{code:?}: {stderr}");
    assert!(stderr.contains(key.to_str().unwrap()), "{stderr}");
    assert!(stderr.contains("2048"), "{stderr}");
    assert!(!data.exists(), "a refused key leaves no data directory");
}

#[test]
fn serve_refuses_a_threshold_or_cap_below_the_floor() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("public.key");
    std::fs::write(&key, KEYS_2048.public_key().to_bytes()).unwrap();
    let key = key.to_str().unwrap();
    let data = dir.path().join("data");
    let cases: [(&str, &[&str], &str); 2] = [
        ("threshold", &["--threshold", "5"], "floor of 10"),
        (
            "reports per contributor",
            &["--reports-per-contributor", "10"],
            "cap of 24",
        ),
    ];
    for (what, flags, floor) in cases {
        let mut args = vec!["--public-key", key];
        args.extend_from_slice(flags);
        let (code, stderr) = refused(&data, &args);
        assert!(
            matches!(code, Some(c) if c != 0),
            "{what}: {code:?}: {stderr}"
        );
        assert!(stderr.contains(floor), "{what}: {stderr}");
    }
    // The same from the configuration file.
    let config = dir.path().join("aggregator.toml");
    for (line, floor) in [
        ("threshold = 9", "floor of 10"),
        ("reports_per_contributor = 23", "cap of 24"),
    ] {
        std::fs::write(&config, format!("{line}\n")).unwrap();
        let (code, stderr) = refused(
            &data,
            &["--public-key", key, "--config", config.to_str().unwrap()],
        );
        assert!(
            matches!(code, Some(c) if c != 0),
            "{line}: {code:?}: {stderr}"
        );
        assert!(stderr.contains(floor), "{line}: {stderr}");
    }
    // The rule is checked before the data directory is touched.
    assert!(
        !data.join("db").exists(),
        "a refused rule created the store"
    );
}
