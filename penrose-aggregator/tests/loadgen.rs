//! The load generator against the real server: the server folds exact copies of a ciphertext,
//! so every valid report the generator sends must carry ciphertexts of its own to be counted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};

use common::*;
use penrose_aggregator::fleet::SimilarityProfile;
use penrose_aggregator::loadgen::{Args, ConnectionMode, generate};
use penrose_aggregator::serve::Listening;
use penrose_core::counters::Catalogue;
use penrose_core::fingerprint::FingerprintParams;
use penrose_core::wire::Day;
use penrose_host::clock::today;
use penrose_traces::TraceFolder;

/// The arguments every test here shares: the server `serve` started, its certificate, the
/// key, 16 clients on 2 connections, a pool of 4 histograms (far fewer than reports: their
/// ciphertexts must still all differ), one window of 2,000 launches per trace, JSON output.
fn args(started: &Listening, data: &std::path::Path, key: std::path::PathBuf) -> Args {
    Args {
        server: started.listening,
        cert: data.join("tls").join("cert.pem"),
        public_key: key,
        reports: 0,
        clients: 16,
        connection_mode: ConnectionMode::Shared,
        connections: 2,
        invalid_share: 0.0,
        pool: 4,
        windows: 1,
        window_len: 2_000,
        traces: None,
        seed: 0,
        json: true,
        token_keys: None,
        fleet_apps: None,
        new_app_share: 0.0,
        founded: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_valid_loadgen_report_is_counted_once_and_every_invalid_one_refused() {
    if !traces_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let key = dir.path().join("public.key");
    std::fs::write(&key, KEYS_2048.public_key().to_bytes()).unwrap();
    let (mut server, started) = spawn_serve(&data, &key, &["--listen", "127.0.0.1:0"]);
    let args = Args {
        reports: 400,
        invalid_share: 0.05,
        seed: 3,
        ..args(&started, &data, key)
    };
    let outcome = generate(&args).await.unwrap();
    server.kill().unwrap();
    server.wait().unwrap();
    assert_eq!(outcome.invalid, 20);
    assert_eq!(outcome.valid, 380);
    assert_eq!(outcome.errors, 0);
    assert_eq!(outcome.duplicate, 0, "valid reports were folded as copies");
    assert_eq!(outcome.accepted, outcome.valid);
    assert_eq!(outcome.rejected_invalid, outcome.invalid);
    assert_eq!(outcome.invalid_accepted, 0);
}

/// With `--token-keys` the generator mints a token per report and spends it: against a server
/// admitting by tokens every valid report is counted once, and every invalid one (seven kinds,
/// among them reports without a token and with a forged one) refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loadgen_with_tokens_is_counted_by_a_server_admitting_by_tokens() {
    if !traces_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let key = dir.path().join("public.key");
    std::fs::write(&key, KEYS_2048.public_key().to_bytes()).unwrap();
    let t = today();
    let counters: Vec<_> = Catalogue::current().report_ids().collect();
    let ring = token_ring(&[t, Day(t.0 + 1)], &counters, 81);
    let ring_path = dir.path().join("token-keys");
    write_ring(&ring_path, &ring);
    let (mut server, started) = spawn_serve(
        &data,
        &key,
        &[
            "--listen",
            "127.0.0.1:0",
            "--token-keys",
            ring_path.to_str().unwrap(),
        ],
    );
    let args = Args {
        reports: 420,
        invalid_share: 0.05,
        seed: 4,
        token_keys: Some(ring_path),
        ..args(&started, &data, key)
    };
    let outcome = generate(&args).await.unwrap();
    server.kill().unwrap();
    server.wait().unwrap();
    assert!(outcome.tokens);
    assert_eq!(outcome.invalid, 21);
    assert_eq!(outcome.errors, 0);
    assert_eq!(outcome.accepted, outcome.valid);
    assert_eq!(outcome.rejected_invalid, outcome.invalid);
    assert_eq!(outcome.invalid_accepted, 0);
    assert_eq!(outcome.reasons.get("token_required"), Some(&3));
    assert_eq!(outcome.reasons.get("invalid_token"), Some(&3));
    let (_, state) = reopen_served(&data);
    assert_eq!(state.accepted(), outcome.valid);
    let tokened: u64 = state.epochs().open().map(|e| e.reports_with_tokens).sum();
    assert_eq!(tokened, outcome.valid);
}

/// With `--fleet-apps` every report carries a fresh fingerprint of a synthetic fleet: the
/// founders found one class per application before the timed phase, and the reports then join
/// their applications' classes (the locator finds them), apart from the share of new
/// applications, which found their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synthetic_fleet_founds_its_classes_and_fresh_snippets_join_them() {
    if !traces_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let key = dir.path().join("public.key");
    std::fs::write(&key, KEYS_2048.public_key().to_bytes()).unwrap();
    let (mut server, started) = spawn_serve(
        &data,
        &key,
        &[
            "--listen",
            "127.0.0.1:0",
            "--new-classes-per-hour",
            "100000",
        ],
    );
    let args = Args {
        reports: 400,
        seed: 5,
        fleet_apps: Some(60),
        new_app_share: 0.05,
        ..args(&started, &data, key)
    };
    let outcome = generate(&args).await.unwrap();
    server.kill().unwrap();
    server.wait().unwrap();
    assert_eq!(outcome.founders, 60);
    assert_eq!(outcome.accepted, 400);
    assert_eq!(outcome.snippets, 460, "every report a fresh snippet");
    let (_, state) = reopen_served(&data);
    let tables = state.tables();
    assert_eq!(tables.snippet_count(), 460);
    // 60 applications and about 20 new ones (5% of 400); a report whose window is below tau
    // from its application's (the real traces' profile at L = 2,000 has some) may found a
    // class too, but the rest join.
    let profile =
        SimilarityProfile::from_traces(&TraceFolder::default_dir(), 12, 2_000, 5).unwrap();
    let below = profile.share_below(FingerprintParams::default().tau);
    let most = 60.0 + 20.0 * 1.5 + 400.0 * below * 1.5 + 5.0;
    let classes = tables.class_count();
    assert!(
        (70..=most as usize).contains(&classes),
        "{classes} classes, at most {most:.0} expected ({below:.3} of windows below tau)"
    );
    assert!(
        tables.search_stats().searches == 0,
        "a reopened server has searched nothing yet"
    );
}

/// The metrics page of a server, as name{labels} -> value.
fn metrics(addr: std::net::SocketAddr) -> BTreeMap<String, u64> {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut page = String::new();
    stream.read_to_string(&mut page).unwrap();
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// `--connection-mode fresh-per-report` sends as agents do: with tokens, every report is
/// acknowledged and counted, and the server saw one connection (and one address-validation
/// Retry) per report, so no two reports shared a connection. The shared mode, run after it
/// against the same server, adds only its 2 connections for its reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_per_report_mode_sends_every_report_on_a_connection_of_its_own() {
    if !traces_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let key = dir.path().join("public.key");
    std::fs::write(&key, KEYS_2048.public_key().to_bytes()).unwrap();
    let t = today();
    let counters: Vec<_> = Catalogue::current().report_ids().collect();
    let ring = token_ring(&[t, Day(t.0 + 1)], &counters, 82);
    let ring_path = dir.path().join("token-keys");
    write_ring(&ring_path, &ring);
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
            "--connections-per-source",
            "100000",
            "--new-connections-per-source",
            "0",
        ],
    );
    let metrics_at = started.metrics.unwrap();
    let connections = |m: &BTreeMap<String, u64>, outcome: &str| {
        m[&format!("penrose_transport_connections_total{{outcome=\"{outcome}\"}}")]
    };
    let before = metrics(metrics_at);
    let fresh = Args {
        reports: 200,
        invalid_share: 0.05,
        seed: 6,
        token_keys: Some(ring_path.clone()),
        connection_mode: ConnectionMode::FreshPerReport,
        ..args(&started, &data, key.clone())
    };
    let outcome = generate(&fresh).await.unwrap();
    let after = metrics(metrics_at);
    assert_eq!(outcome.connection_mode, ConnectionMode::FreshPerReport);
    assert_eq!(outcome.errors, 0);
    assert_eq!(outcome.invalid, 10);
    assert_eq!(
        outcome.accepted, outcome.valid,
        "every valid report accepted"
    );
    assert_eq!(outcome.rejected_invalid, outcome.invalid);
    assert_eq!(outcome.invalid_accepted, 0);
    let opened = connections(&after, "accepted") - connections(&before, "accepted");
    assert_eq!(opened, 200, "one connection per report, and no other");
    let retries = connections(&after, "retry_sent") - connections(&before, "retry_sent");
    assert_eq!(
        retries, 200,
        "every report's connection was validated by a Retry"
    );

    // The control: the shared mode's 200 reports ride on its 2 connections.
    let shared = Args {
        reports: 200,
        seed: 7,
        token_keys: Some(ring_path),
        ..args(&started, &data, key)
    };
    let outcome = generate(&shared).await.unwrap();
    let last = metrics(metrics_at);
    server.kill().unwrap();
    server.wait().unwrap();
    assert_eq!(outcome.accepted, 200);
    assert_eq!(
        connections(&last, "accepted") - connections(&after, "accepted"),
        2
    );
    let (_, state) = reopen_served(&data);
    assert_eq!(state.accepted(), 190 + 200);
}

/// The load generator is test equipment: a build with `test-util` (this one) parses
/// `loadgen`, and the product's command, which the packages' man pages and completions are
/// made from, never lists it (ci/packages.sh checks the packaged binary refuses it).
#[test]
fn loadgen_is_parsed_by_test_builds_and_never_listed_by_the_product_command() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_penrose-aggregator"))
        .args(["loadgen", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("--token-keys"));
    let product = penrose_aggregator::cli::command();
    assert!(product.find_subcommand("serve").is_some());
    assert!(product.find_subcommand("loadgen").is_none());
}
