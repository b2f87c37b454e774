//! `penrose-agent run` as a child process against a loopback stand-in aggregator (a
//! penrose-transport server whose handler decodes reports and deduplicates by report id), with
//! the trace-replay source (no root needed, fast). The live eBPF path has its own test
//! (`daemon_live.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use penrose_core::wire::{Message, ReportId};
use tokio::net::UdpSocket;

const LONG: Duration = Duration::from_secs(90);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// A UDP relay on loopback that keeps every datagram in either direction: the raw bytes the
/// agent puts on the wire.
async fn relay(server: SocketAddr) -> (SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>) {
    let front = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    let back = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    back.connect(server).await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let client: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
    {
        let (front, back, seen, client) =
            (front.clone(), back.clone(), seen.clone(), client.clone());
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65_536];
            while let Ok((n, from)) = front.recv_from(&mut buf).await {
                *client.lock().unwrap() = Some(from);
                seen.lock().unwrap().push(buf[..n].to_vec());
                let _ = back.send(&buf[..n]).await;
            }
        });
    }
    {
        let (front, seen) = (front.clone(), seen.clone());
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65_536];
            while let Ok(n) = back.recv(&mut buf).await {
                seen.lock().unwrap().push(buf[..n].to_vec());
                let to = *client.lock().unwrap();
                if let Some(to) = to {
                    let _ = front.send_to(&buf[..n], to).await;
                }
            }
        });
    }
    (front.local_addr().unwrap(), seen)
}

/// (a) Nothing in plaintext leaves the agent: not a kernel name, not a counter value or a
/// plaintext histogram, not the host name, not the machine id; checked on every frame body the
/// server received and on every raw UDP datagram between agent and server.
#[test]
fn no_plaintext_leaves_the_agent() {
    let rt = runtime();
    let Some(fx) = Fixture::new() else {
        return;
    };
    let (server, handler) = rt.block_on(start_server(&fx.identity, "127.0.0.1:0".parse().unwrap()));
    let (front, datagrams) = rt.block_on(relay(server.local_addr()));
    let config = fx.config(front, "", "");
    let log = fx.dir.path().join("agent.log");
    // As root the agent runs in a UTS namespace with a long, recognisable host name (this
    // machine's may be two letters, which random ciphertext bytes contain by chance).
    let host = if is_root() {
        "penrose-host-name-canary-7f3a".to_string()
    } else {
        nix_hostname()
    };
    let mut child = if is_root() {
        let mut c = Command::new("unshare");
        c.args([
            "--uts",
            "sh",
            "-c",
            &format!("hostname {host} && exec \"$0\" \"$@\""),
            agent_binary(),
        ]);
        spawn_agent_with(c, &config, &log)
    } else {
        spawn_agent(&config, &log)
    };
    wait_until(
        LONG,
        || handler.ids().len() >= 12,
        || {
            format!(
                "{} reports stored; log:\n{}",
                handler.ids().len(),
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        },
    );
    assert!(terminate(&mut child).success());
    rt.block_on(server.shutdown());

    let bodies = handler.bodies.lock().unwrap().clone();
    let datagrams = datagrams.lock().unwrap().clone();
    assert!(!bodies.is_empty() && !datagrams.is_empty());
    // Every body is a report under the design server's key, and the record knows it.
    let records = fx.records();
    let recorded: HashSet<ReportId> = records.iter().map(|r| r.report_id).collect();
    for body in &bodies {
        let Message::Report(r) = Message::decode_body(body).unwrap() else {
            panic!("not a report")
        };
        assert_eq!(r.key_id, public_key().key_id());
        assert!(recorded.contains(&r.report_id));
    }

    // What must not appear: kernel names and counter values of the replayed traces ...
    let mut needles: Vec<(String, Vec<u8>)> = Vec::new();
    for trace in penrose_traces::TraceFolder::open(&fx.traces)
        .unwrap()
        .read_all()
        .unwrap()
    {
        let mut names = HashSet::new();
        for k in trace.kernels() {
            if k.name.len() >= 8 && names.insert(k.name.clone()) {
                needles.push((
                    format!("kernel name {}", k.name),
                    k.name.as_bytes().to_vec(),
                ));
            }
        }
        for k in trace.kernels().iter().take(300) {
            let ns = (k.dur_us * 1000.0).round();
            needles.push((format!("duration {ns} as f64"), ns.to_le_bytes().to_vec()));
            needles.push((
                format!("duration {ns} as f64 BE"),
                ns.to_be_bytes().to_vec(),
            ));
            if let Some(o) = k.est_achieved_occupancy_pct.filter(|o| *o != 0.0) {
                needles.push((format!("occupancy {o}"), o.to_le_bytes().to_vec()));
            }
        }
    }
    // ... the plaintext histograms (bins as 32- and 16-bit integers, either byte order) ...
    for r in &records {
        let first = r.bins.iter().position(|&b| b != 0).unwrap();
        let last = r.bins.iter().rposition(|&b| b != 0).unwrap();
        let span = &r.bins[first..=last];
        if span.len() >= 3 {
            let be32: Vec<u8> = span.iter().flat_map(|b| b.to_be_bytes()).collect();
            let le32: Vec<u8> = span.iter().flat_map(|b| b.to_le_bytes()).collect();
            let be16: Vec<u8> = span
                .iter()
                .flat_map(|&b| (b as u16).to_be_bytes())
                .collect();
            let le16: Vec<u8> = span
                .iter()
                .flat_map(|&b| (b as u16).to_le_bytes())
                .collect();
            for (what, bytes) in [
                ("u32 BE", be32),
                ("u32 LE", le32),
                ("u16 BE", be16),
                ("u16 LE", le16),
            ] {
                needles.push((format!("histogram {} bins as {what}", r.report_id), bytes));
            }
        }
    }
    // ... the host name and the machine id (as text and as its 16 bytes).
    if host.len() >= 6 {
        needles.push(("host name".into(), host.as_bytes().to_vec()));
    }
    if let Ok(id) = std::fs::read_to_string("/etc/machine-id") {
        let id = id.trim().to_string();
        needles.push(("machine id".into(), id.as_bytes().to_vec()));
        if let Some(raw) = penrose_core::hex::decode(&id) {
            needles.push(("machine id bytes".into(), raw));
        }
    }
    assert!(needles.len() > 100, "enough to look for: {}", needles.len());
    for (what, needle) in &needles {
        for body in &bodies {
            assert!(!contains(body, needle), "{what} in a frame body");
        }
        for d in &datagrams {
            assert!(!contains(d, needle), "{what} in a UDP datagram");
        }
    }
}

fn nix_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// (b) SIGKILL while reports are spooled, restart: every spooled report arrives, and the server
/// stores each exactly once.
#[test]
fn killed_agent_delivers_every_spooled_report_exactly_once_after_restart() {
    let rt = runtime();
    let Some(fx) = Fixture::new() else {
        return;
    };
    let addr = free_addr();
    let config = fx.config(addr, "", "");
    let log = fx.dir.path().join("agent.log");
    // The server is not up yet: reports pile up in the spool.
    let mut child = spawn_agent(&config, &log);
    wait_until(
        LONG,
        || fx.spool_ids().len() >= 8,
        || format!("{} spooled", fx.spool_ids().len()),
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let spooled: HashSet<ReportId> = fx.spool_ids().into_iter().collect();
    assert!(spooled.len() >= 8);
    let (server, handler) = rt.block_on(start_server(&fx.identity, addr));
    let mut child = spawn_agent(&config, &log);
    wait_until(
        LONG,
        || {
            let ids: HashSet<_> = handler.ids().into_iter().collect();
            spooled.is_subset(&ids)
        },
        || {
            format!(
                "{} of {} delivered",
                spooled.iter().filter(|i| handler.ids().contains(i)).count(),
                spooled.len()
            )
        },
    );
    assert!(terminate(&mut child).success());
    rt.block_on(server.shutdown());
    let stored = handler.stored.lock().unwrap();
    for id in &spooled {
        assert_eq!(stored[id].0, 1, "stored exactly once");
    }
    // Everything the server holds was sealed by the agent, and each stored once.
    let recorded: HashSet<ReportId> = fx.records().iter().map(|r| r.report_id).collect();
    for (id, (accepted, _)) in stored.iter() {
        assert_eq!(*accepted, 1);
        assert!(recorded.contains(id));
    }
}

/// (c) Server down: the agent keeps capturing and spooling, then delivers everything when the
/// server comes up.
#[test]
fn server_down_then_up_delivers_everything() {
    let rt = runtime();
    let Some(fx) = Fixture::new() else {
        return;
    };
    let addr = free_addr();
    let config = fx.config(addr, "", "");
    let log = fx.dir.path().join("agent.log");
    let mut child = spawn_agent(&config, &log);
    wait_until(
        LONG,
        || {
            fx.status()
                .is_some_and(|s| s.windows >= 5 && s.uploads.failed >= 1 && s.spool.reports >= 5)
        },
        || format!("{:?}", fx.status()),
    );
    let before: HashSet<ReportId> = fx.spool_ids().into_iter().collect();
    let windows_before = fx.status().unwrap().windows;
    let (server, handler) = rt.block_on(start_server(&fx.identity, addr));
    wait_until(
        LONG,
        || before.is_subset(&handler.ids().into_iter().collect()),
        || format!("{} stored, status {:?}", handler.ids().len(), fx.status()),
    );
    assert!(
        fx.status().unwrap().windows > windows_before,
        "capture went on meanwhile"
    );
    assert!(terminate(&mut child).success());
    rt.block_on(server.shutdown());
    // Every sealed report was delivered or is still spooled (sealed at stop), none lost.
    let stored: HashSet<ReportId> = handler.ids().into_iter().collect();
    let spooled: HashSet<ReportId> = fx.spool_ids().into_iter().collect();
    for r in fx.records() {
        let id = r.report_id;
        assert!(
            stored.contains(&id) || spooled.contains(&id),
            "report {} lost",
            r.report_id
        );
    }
    let status = fx.status().unwrap();
    assert!(!status.running);
    assert!(status.uploads.accepted as usize >= before.len());
    // The explicit test settings work, and say loudly what they are.
    assert_eq!(status.source.kind, "test-replay");
    let text = std::fs::read_to_string(&log).unwrap();
    for setting in [
        "TEST EQUIPMENT: capture.source = \"test-replay\"",
        "TEST EQUIPMENT: capture.counters = \"test-standin-ring\"",
    ] {
        assert!(
            text.lines()
                .any(|l| l.contains("WARN") && l.contains(setting)),
            "no warning for {setting}: {text}"
        );
    }
}

/// A configuration that leaves the source and counters at their defaults, on a host where
/// the live capture cannot start, is an error (exit code 4, saying why) and never a replay of
/// the traces it names: the agent captures nothing, creates no state and sends nothing. Tried
/// as a plain user (uid 65534: `setpriv` when the test runs as root), as root without kernel
/// BTF (a mount namespace hides it), and as root without NVML for the default counters.
#[test]
fn a_default_agent_that_cannot_capture_exits_with_an_error_instead_of_replaying() {
    let Some(fx) = Fixture::new() else {
        return;
    };
    let config = fx.config(free_addr(), "", "");
    // The defaults: drop the fixture's test-equipment lines, keep [replay] (a fallback would
    // find its traces).
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("source = \"test-replay\"\n", "")
        .replace("counters = \"test-standin-ring\"\n", "");
    assert!(!text.contains("test-"), "{text}");
    // A copy a plain user can read.
    let public = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(public.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = public.path().join("agent.toml");
    std::fs::write(&config, text).unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();

    let check = |what: &str, out: std::process::Output, expected: &str| {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{what}: {err}");
        let line = err
            .lines()
            .find(|l| l.starts_with("error:"))
            .unwrap_or_else(|| panic!("{what}: no error line: {err}"));
        assert!(line.contains(expected), "{what}: {err}");
        assert!(!err.contains("TEST EQUIPMENT"), "{what}: {err}");
        assert!(!err.contains("replay"), "{what}: {err}");
        assert!(!fx.state_dir().exists(), "{what}: state created");
        eprintln!("{what}: {line}");
    };
    let run = |mut command: Command| {
        command
            .args(["run", "--config"])
            .arg(&config)
            .env("RUST_LOG", "info")
            .output()
            .unwrap()
    };
    if !is_root() {
        check(
            "plain user",
            run(Command::new(agent_binary())),
            "needs root",
        );
        return;
    }
    let mut nobody = Command::new("setpriv");
    nobody
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(agent_binary());
    let out = run(nobody);
    if matches!(out.status.code(), Some(126 | 127)) {
        skipped(format_args!(
            "SKIPPED (plain user): setpriv cannot run the agent here"
        ));
    } else {
        check("plain user (uid 65534)", out, "needs root");
    }
    let mut no_btf = Command::new("unshare");
    no_btf.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        "mount -t tmpfs none /sys/kernel/btf && exec \"$0\" \"$@\"",
        agent_binary(),
    ]);
    let out = run(no_btf);
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("unshare failed") || err.contains("mount:") || out.status.code() == Some(127) {
        skipped(format_args!(
            "SKIPPED (no BTF): no mount namespace here: {err}"
        ));
    } else {
        check("root without kernel BTF", out, "kernel BTF is missing");
    }
    if std::path::Path::new("/dev/nvidiactl").exists() {
        skipped(format_args!(
            "SKIPPED (no NVML): this host has an NVIDIA driver"
        ));
    } else {
        check(
            "root without NVML",
            run(Command::new(agent_binary())),
            "capture.counters = \"nvml\" cannot be used on this host",
        );
    }
}

/// (c) A full spool drops the oldest reports with a counted warning and the agent runs on;
/// `status` and `inspect` show it.
#[test]
fn a_full_spool_drops_the_oldest_and_the_agent_runs_on() {
    let Some(fx) = Fixture::new() else {
        return;
    };
    let config = fx.config(free_addr(), "", "[spool]\nmax_bytes = 4096\n");
    let log = fx.dir.path().join("agent.log");
    let mut child = spawn_agent(&config, &log);
    wait_until(
        LONG,
        || fx.status().is_some_and(|s| s.spool.counts.dropped >= 5),
        || format!("{:?}", fx.status()),
    );
    assert!(child.try_wait().unwrap().is_none(), "still running");
    let status = fx.status().unwrap();
    assert!(status.spool.bytes <= 4096);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("spool full"), "warning logged:\n{text}");

    // `status` reads the status file; `inspect` shows exactly the spooled reports.
    let out = Command::new(agent_binary())
        .args(["status", "--json", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success());
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(s["spool"]["counts"]["dropped"].as_u64().unwrap() >= 5);
    assert!(terminate(&mut child).success());
    let out = Command::new(agent_binary())
        .args(["inspect", "--json", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success());
    let shown: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    // Ids in their text form (parsed back: the JSON is that form).
    let shown: HashSet<ReportId> = shown
        .iter()
        .map(|r| r["report_id"].as_str().unwrap().parse().unwrap())
        .collect();
    let spooled: HashSet<ReportId> = fx.spool_ids().into_iter().collect();
    assert_eq!(shown, spooled);
    assert!(!spooled.is_empty());
    let text = Command::new(agent_binary())
        .args(["inspect", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("bin "));
}

/// (d) Invalid configuration files: the error names the key and the line; exit code 3 (refused).
#[test]
fn invalid_configuration_names_the_key_and_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "enabled = true\n\n[capture]\nbudget_percent = \"low\"\n",
            "bad.toml:4: key `capture.budget_percent`",
        ),
        (
            "[upload]\ndelay_max_secs = 3\n",
            "bad.toml:2: key `upload.delay_max_secs`",
        ),
        ("[seal]\nsamples = 0\n", "bad.toml:2: key `seal.samples`"),
        (
            "[seal]\nmax_reports_per_counter_per_day = 48\n",
            "bad.toml:2: key `seal.max_reports_per_counter_per_day`",
        ),
        (
            "[spool]\n\nmax_bytes = -1\n",
            "bad.toml:3: key `spool.max_bytes`",
        ),
    ];
    for (text, expected) in cases {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, text).unwrap();
        for args in [&["config", "--check"][..], &["run", "--config"][..]] {
            let out = Command::new(agent_binary())
                .args(args)
                .arg(&path)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(3), "{args:?} {text:?}: {err}");
            assert!(err.contains(expected), "{args:?} {text:?}: {err}");
        }
    }
    // The printed default passes the check.
    let out = Command::new(agent_binary())
        .args(["config", "--print-default"])
        .output()
        .unwrap();
    let path = dir.path().join("default.toml");
    std::fs::write(&path, &out.stdout).unwrap();
    let out = Command::new(agent_binary())
        .args(["config", "--check"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A design key under 2048 bits: `run` refuses to start, in one line naming the key file,
/// before anything is captured or spooled.
#[test]
fn a_weak_design_key_is_refused_at_start() {
    use penrose_core::paillier::{KeySize, Keypair};
    let Some(fx) = Fixture::new() else {
        return;
    };
    let weak = Keypair::generate_with_size(KeySize::Bits1024, &mut rand::rng());
    std::fs::write(&fx.key_path, weak.public_key().to_bytes()).unwrap();
    let config = fx.config(free_addr(), "", "");
    let out = Command::new(agent_binary())
        .args(["run", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("no error line: {err}"));
    assert!(
        line.contains(&fx.key_path.display().to_string()) && line.contains("1024-bit"),
        "{err}"
    );
    assert!(!penrose_agent::daemon::spool_dir(&fx.state_dir()).exists());
}

/// The opt-out: `enabled = false` logs one line and exits 0 at once, capturing and sending
/// nothing (not even creating its state directory).
#[test]
fn opted_out_agent_does_nothing() {
    let Some(fx) = Fixture::new() else {
        return;
    };
    let config = fx.config(free_addr(), "enabled = false", "");
    let log = fx.dir.path().join("agent.log");
    let mut child = spawn_agent(&config, &log);
    let status = wait_exit(&mut child, Duration::from_secs(10));
    assert!(status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("disabled"), "{text}");
    assert!(!fx.state_dir().exists());
}

/// A running daemon holds only the capabilities capture needs (effective, permitted and
/// bounding sets), none inheritable or ambient, with no_new_privs set; and it still does its
/// job (windows, sealed reports) with them. Read from /proc of the live process.
#[test]
fn a_running_daemon_keeps_only_the_capture_capabilities() {
    if !penrose_agent::capture::loader::is_root() {
        skipped(format_args!(
            "SKIPPED: dropping capabilities needs the agent to start as root (CI runs as root)"
        ));
        return;
    }
    let Some(fx) = Fixture::new() else {
        return;
    };
    let config = fx.config(free_addr(), "", "");
    let log = fx.dir.path().join("agent.log");
    let mut child = spawn_agent(&config, &log);
    wait_until(
        LONG,
        || {
            fx.status()
                .is_some_and(|s| s.windows >= 2 && s.pipeline.sealed >= 1)
        },
        || format!("{:?}", fx.status()),
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let field = |name: &str| -> String {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|| panic!("{name} missing in {status}"))
    };
    let mask = |name: &str| u64::from_str_radix(&field(name), 16).unwrap();
    let ours: u64 = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("CapPrm:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    let want = penrose_agent::privilege::capture_mask() & ours;
    assert_eq!(mask("CapEff:"), want, "effective");
    assert_eq!(mask("CapPrm:"), want, "permitted");
    assert_eq!(mask("CapBnd:"), want, "bounding");
    assert_eq!(mask("CapInh:"), 0, "inheritable");
    assert_eq!(mask("CapAmb:"), 0, "ambient");
    assert_eq!(field("NoNewPrivs:"), "1");
    // Every thread, not only the main one.
    for task in std::fs::read_dir(format!("/proc/{}/task", child.id())).unwrap() {
        let path = task.unwrap().path().join("status");
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue; // the thread ended meanwhile
        };
        let eff = text
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
            .unwrap();
        assert_eq!(eff, want, "{}", path.display());
    }
    assert!(terminate(&mut child).success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("capabilities: kept"), "{text}");
}

/// Key rollover on the agent: with `design.key_list_signer` pinned it asks the aggregation
/// server for the design server's key list, encrypts today's reports under the key the list
/// gives today, and keeps the list for its next start. A list the pinned key did not sign
/// (the aggregation server's own, say) is refused: the agent stays on the key it has.
#[test]
fn the_agent_follows_a_signed_key_list_and_refuses_a_forged_one() {
    use ed25519_dalek::SigningKey;
    use penrose_core::key_list::{KeyList, ScheduledKey};
    use penrose_core::paillier::Keypair;
    use penrose_core::wire::Day;
    use std::sync::atomic::Ordering;

    let rt = runtime();
    let Some(fx) = Fixture::new() else {
        return;
    };
    let designer = SigningKey::from_bytes(&[12; 32]);
    let signer_path = fx.dir.path().join("list-signing.pub");
    std::fs::write(
        &signer_path,
        format!(
            "# the design server's list-signing key\n{}\n",
            penrose_core::hex::encode(designer.verifying_key().as_bytes())
        ),
    )
    .unwrap();
    let new = Keypair::generate(&mut rand::rng());
    let today = penrose_host::clock::today();
    let list = |sequence| {
        KeyList::new(
            sequence,
            2,
            vec![
                ScheduledKey {
                    from: Day(0),
                    key: public_key().clone(),
                },
                ScheduledKey {
                    from: today,
                    key: new.public_key().clone(),
                },
            ],
        )
        .unwrap()
    };
    let addr = free_addr();
    let (server, handler) = rt.block_on(start_server(&fx.identity, addr));
    handler
        .also_accepted
        .lock()
        .unwrap()
        .push(new.public_key().key_id());
    let config = fx.config(addr, "", "");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "[design]\n",
        &format!(
            "[design]\nkey_list_signer = \"{}\"\n",
            signer_path.display()
        ),
    );
    std::fs::write(&config, text).unwrap();
    let log = fx.dir.path().join("agent.log");
    let held = fx
        .state_dir()
        .join(penrose_agent::design_keys::KEY_LIST_FILE);

    // A list signed by another key: served, refused, nothing stored, the old key used.
    let mallory = SigningKey::from_bytes(&[13; 32]);
    *handler.key_list.lock().unwrap() = Some(list(1).sign(&mallory));
    let mut child = spawn_agent(&config, &log);
    wait_until(
        LONG,
        || handler.key_lists_served.load(Ordering::SeqCst) >= 1 && handler.ids().len() >= 3,
        || format!("{} stored", handler.ids().len()),
    );
    // SIGHUP is ignored (nothing to reload; it must not end the agent without its status).
    let hup = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.try_wait().unwrap().is_none(),
        "SIGHUP ended the agent"
    );
    assert!(terminate(&mut child).success());
    assert!(!held.exists(), "a forged list was kept");
    assert!(
        handler
            .keys_seen
            .lock()
            .unwrap()
            .iter()
            .all(|k| *k == public_key().key_id()),
        "a report went under a key of a forged list"
    );

    // The designer's list: fetched, kept, and today's reports go under the new key. (A fresh
    // state directory: the first run used up today's report cap.)
    std::fs::remove_dir_all(fx.state_dir()).unwrap();
    handler.keys_seen.lock().unwrap().clear();
    let signed = list(1).sign(&designer);
    *handler.key_list.lock().unwrap() = Some(signed.clone());
    let mut child = spawn_agent(&config, &log);
    wait_until(
        LONG,
        || {
            handler
                .keys_seen
                .lock()
                .unwrap()
                .iter()
                .filter(|k| **k == new.public_key().key_id())
                .count()
                >= 3
        },
        || std::fs::read_to_string(&log).unwrap_or_default(),
    );
    assert!(terminate(&mut child).success());
    assert_eq!(
        std::fs::read(&held).unwrap(),
        signed,
        "the list is kept as signed"
    );
    rt.block_on(server.shutdown());
}
