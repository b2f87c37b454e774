//! A full disk, for real: the state directory on a 256 KiB tmpfs. Writes fail with the file
//! system's error and change nothing (the spool lists exactly what is on disk, no temporary
//! file is left, the sealed record stays readable with at most one torn line), and once a prune
//! makes room the agent's writes work again. Needs root (mount); CI runs as root.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use penrose_agent::record::{
    RecordBounds, RecordLog, SealReason, SealedRecord, read_records_counted,
};
use penrose_agent::spool::Spool;
use penrose_core::wire::{Day, ReportId};

/// Unmounts the tmpfs when the test ends, whatever happens.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn mount_small_tmpfs(dir: &Path) -> Mounted {
    let status = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=256k,mode=0700",
            "penrose-full-disk",
        ])
        .arg(dir)
        .status()
        .expect("running mount");
    assert!(status.success(), "mount tmpfs failed: {status}");
    Mounted(dir.to_owned())
}

fn record(i: u32, day: u32) -> SealedRecord {
    SealedRecord {
        report_id: format!("{i:032x}").parse().unwrap(),
        snippet: penrose_core::fingerprint::SnippetHash([0; 32]),
        local_app: 0,
        counter: 4,
        counter_name: "sm_active_pct".into(),
        catalogue: 1,
        day,
        arch: "sm_90".into(),
        samples: 128,
        bins: vec![1; 128],
        reason: SealReason::Size,
        joint_values: Vec::new(),
    }
}

#[test]
fn a_full_disk_changes_nothing_and_a_prune_makes_room() {
    if !penrose_agent::capture::loader::is_root() {
        panic!("this test mounts a tmpfs: run it as root (CI does)");
    }
    let outer = tempfile::tempdir().unwrap();
    let state = outer.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let _mounted = mount_small_tmpfs(&state);
    let log = RecordLog::in_state_dir(&state);
    let mut spool = Spool::open(&state.join("spool"), 64 * 1024 * 1024).unwrap();
    let frame = vec![0xa5u8; 3_000];
    let today = Day(20_400);

    // Fill the disk the way the daemon writes: record, then spool.
    let mut written = 0u32;
    let failure = loop {
        // Old days first, so that a prune has something to drop.
        let day = if written < 40 { today.0 - 40 } else { today.0 };
        if let Err(e) = log.append(&record(written, day)) {
            break format!("record: {e}");
        }
        if let Err(e) = spool.push(ReportId([written as u8; 16]), &frame) {
            break format!("spool: {e}");
        }
        written += 1;
        assert!(written < 1_000, "the 256 KiB disk never filled");
    };
    assert!(
        failure.contains("No space left"),
        "expected ENOSPC, got {failure}"
    );
    assert!(written > 20, "only {written} reports fit");

    // Nothing half-done: the spool on disk is what the spool lists, no temporary files, and
    // the record reads back with at most one torn line.
    let listed = spool.entries().len();
    let reopened = Spool::open(&state.join("spool"), 64 * 1024 * 1024).unwrap();
    assert_eq!(reopened.entries().len(), listed);
    let leftovers: Vec<_> = std::fs::read_dir(state.join("spool"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    let (records, damaged) = read_records_counted(log.path()).unwrap();
    assert!(damaged <= 1, "{damaged} damaged lines");
    assert!(records.len() as u32 >= written, "{} records", records.len());

    // Room again: the spool delivers (drops) its reports and the record is pruned by age;
    // then writes work.
    let entries: Vec<_> = spool.entries().to_vec();
    for entry in &entries {
        spool.remove_delivered(entry).unwrap();
    }
    let pruned = log
        .prune(
            RecordBounds {
                max_bytes: 1 << 20,
                max_age_days: 30,
            },
            today,
            Day(today.0 - 1),
        )
        .unwrap();
    assert_eq!(pruned.too_old, 40);
    assert_eq!(pruned.damaged, damaged as u64);
    log.append(&record(9_999, today.0)).unwrap();
    spool.push(ReportId([0xee; 16]), &frame).unwrap();
    let (records, damaged) = read_records_counted(log.path()).unwrap();
    assert_eq!(damaged, 0);
    assert!(records.iter().all(|r| r.day == today.0));
}
