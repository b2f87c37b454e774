//! MIG instances in the stand-in: how a GPU in MIG mode (`PENROSE_STANDIN_GPUS=9.0/3`) shows
//! up in a process's CUDA devices, what `cuDeviceGetUuid` and `cuDeviceGetUuid_v2` answer for
//! an instance, and how a launch on one is stamped in the ring.
//!
//! The stand-in reads its environment once, in `cuInit`, so every case runs in a child process
//! of its own: this test binary again, running only [`child`] with [`CHILD_OUT`] set, which
//! writes what it saw to a file (the harness's own output shares stdout).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use penrose_standin::ring::{GPUS_VAR, standin_mig_uuid, standin_uuid};
use penrose_standin::{CounterRing, Driver, EntryPoint, LIBCUDA_PATH, Launch, ring_path};
use serde_json::{Value, json};

/// Where the child writes what it saw; set only in the child.
const CHILD_OUT: &str = "PENROSE_STANDIN_MIG_CHILD_OUT";
/// Ordinals the child launches one kernel on, in turn (comma-separated); optional.
const CHILD_LAUNCH: &str = "PENROSE_STANDIN_MIG_CHILD_LAUNCH";

/// GPU 0 whole, GPU 1 with three instances, GPU 2 (an older architecture) with two, GPU 3
/// whole.
const HOST: &str = "9.0,9.0/3,8.0/2,9.0";

/// What a process saw: per ordinal, the v1 and v2 UUIDs; per launch, the record's `device`.
#[derive(Debug)]
struct Seen {
    v1: Vec<[u8; 16]>,
    v2: Vec<[u8; 16]>,
    ran: Vec<u32>,
}

fn hex(uuid: &[u8; 16]) -> String {
    uuid.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    out
}

/// `prefix` then the UUID as NVML and `CUDA_VISIBLE_DEVICES` write it: 8-4-4-4-12 hex digits.
fn text(prefix: &str, uuid: &[u8; 16]) -> String {
    let h = hex(uuid);
    format!(
        "{prefix}{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// Runs [`child`] in a new process with `PENROSE_STANDIN_GPUS=HOST` and the given CUDA
/// variables (`None`: unset), launching on `launch_on`.
fn run(visible: Option<&str>, order: Option<&str>, launch_on: &[i32]) -> Seen {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("seen.json");
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_OUT, &out)
        .env(GPUS_VAR, HOST)
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("CUDA_DEVICE_ORDER");
    if let Some(v) = visible {
        cmd.env("CUDA_VISIBLE_DEVICES", v);
    }
    if let Some(o) = order {
        cmd.env("CUDA_DEVICE_ORDER", o);
    }
    if !launch_on.is_empty() {
        let list: Vec<String> = launch_on.iter().map(i32::to_string).collect();
        cmd.env(CHILD_LAUNCH, list.join(","));
    }
    let output = cmd.output().unwrap();
    assert!(
        output.status.success(),
        "child: {}\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let uuids = |key: &str| -> Vec<[u8; 16]> {
        seen[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| unhex(u.as_str().unwrap()))
            .collect()
    };
    let count = seen["count"].as_u64().unwrap() as usize;
    let v1 = uuids("v1");
    assert_eq!(v1.len(), count);
    Seen {
        v1,
        v2: uuids("v2"),
        ran: seen["ran"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as u32)
            .collect(),
    }
}

/// The child's side of [`run`]; does nothing in an ordinary test run.
#[test]
fn child() {
    let Some(out) = std::env::var_os(CHILD_OUT) else {
        return;
    };
    let d = Driver::load(Path::new(LIBCUDA_PATH)).unwrap();
    d.init().unwrap();
    let count = d.device_count().unwrap();
    let v1: Vec<String> = (0..count)
        .map(|o| hex(&d.device_uuid_v1(o).unwrap()))
        .collect();
    let v2: Vec<String> = (0..count)
        .map(|o| hex(&d.device_uuid(o).unwrap()))
        .collect();
    let mut ran = Vec::new();
    if let Ok(list) = std::env::var(CHILD_LAUNCH) {
        let module = d.module_load_data(c"mig test image").unwrap();
        let f = d.module_get_function(module, c"mig_kernel").unwrap();
        let mut ring = CounterRing::open(std::process::id()).unwrap();
        for ordinal in list.split(',') {
            d.use_device(ordinal.parse().unwrap()).unwrap();
            let launch = Launch {
                grid: [1, 1, 1],
                block: [32, 1, 1],
                shared_mem_bytes: 0,
                stream: d.stream_create().unwrap(),
            };
            d.launch(EntryPoint::LaunchKernel, f, &launch).unwrap();
            let records = ring.read_new().unwrap();
            assert_eq!(records.len(), 1);
            ran.push(records[0].device);
        }
    }
    let _ = std::fs::remove_file(ring_path(std::process::id()));
    let seen = json!({ "count": count, "v1": v1, "v2": v2, "ran": ran });
    std::fs::write(out, serde_json::to_vec(&seen).unwrap()).unwrap();
}

#[test]
fn a_partitioned_gpu_enumerates_as_its_first_instance() {
    let pci = run(None, Some("PCI_BUS_ID"), &[]);
    assert_eq!(
        pci.v1,
        [0, 1, 2, 3].map(standin_uuid),
        "v1 names the physical GPU"
    );
    assert_eq!(
        pci.v2,
        [
            standin_uuid(0),
            standin_mig_uuid(1, 1),
            standin_mig_uuid(2, 1),
            standin_uuid(3)
        ],
        "v2 names the instance"
    );
    // Fastest first (the default order): the 8.0 GPU last.
    let fastest = run(None, None, &[]);
    assert_eq!(fastest.v1, [0, 1, 3, 2].map(standin_uuid));
    assert_eq!(
        fastest.v2,
        [
            standin_uuid(0),
            standin_mig_uuid(1, 1),
            standin_uuid(3),
            standin_mig_uuid(2, 1)
        ]
    );
    // An index or a GPU UUID of a partitioned GPU: its first instance too.
    let by_gpu = run(
        Some(&format!("2,{}", text("GPU-", &standin_uuid(1)))),
        Some("PCI_BUS_ID"),
        &[],
    );
    assert_eq!(by_gpu.v1, [standin_uuid(2), standin_uuid(1)]);
    assert_eq!(by_gpu.v2, [standin_mig_uuid(2, 1), standin_mig_uuid(1, 1)]);
}

#[test]
fn an_instance_uuid_picks_that_instance() {
    let full = text("MIG-", &standin_mig_uuid(1, 2));
    let seen = run(Some(&full), None, &[]);
    assert_eq!(seen.v1, [standin_uuid(1)]);
    assert_eq!(seen.v2, [standin_mig_uuid(1, 2)]);
    // Upper-case hex, and a unique prefix, name it as well.
    let upper = format!("MIG-{}", full[4..].to_uppercase());
    assert_eq!(run(Some(&upper), None, &[]).v2, [standin_mig_uuid(1, 2)]);
    let prefix = &full[..full.len() - 2];
    assert_eq!(run(Some(prefix), None, &[]).v2, [standin_mig_uuid(1, 2)]);
    // Two instances at once, in the order listed.
    let both = format!("{},{full}", text("MIG-", &standin_mig_uuid(2, 2)));
    let seen = run(Some(&both), None, &[]);
    assert_eq!(seen.v1, [standin_uuid(2), standin_uuid(1)]);
    assert_eq!(seen.v2, [standin_mig_uuid(2, 2), standin_mig_uuid(1, 2)]);
}

#[test]
fn the_older_mig_gpu_form_picks_an_instance() {
    let old = format!("MIG-{}/3/0", text("GPU-", &standin_uuid(1)));
    let seen = run(Some(&old), None, &[]);
    assert_eq!(seen.v1, [standin_uuid(1)]);
    assert_eq!(seen.v2, [standin_mig_uuid(1, 3)]);
}

#[test]
fn an_entry_naming_no_instance_ends_the_list() {
    let gpu1 = text("GPU-", &standin_uuid(1));
    for (visible, expected) in [
        // GPU 1 has three instances, not four; compute instances other than 0 do not exist.
        (format!("MIG-{gpu1}/4/0"), 0),
        (format!("MIG-{gpu1}/1/1"), 0),
        // GPU 0 is not in MIG mode.
        (text("MIG-", &standin_mig_uuid(0, 1)), 0),
        (format!("MIG-{}/1/0", text("GPU-", &standin_uuid(0))), 0),
        // The list ends there; what came before stays.
        (format!("0,MIG-{gpu1}/9/0,3"), 1),
        // A prefix that two instances start with.
        (
            format!("3,{}", &text("MIG-", &standin_mig_uuid(1, 1))[..30]),
            1,
        ),
        // The same instance twice (GPU 1 by index is its instance 1).
        (format!("1,{}", text("MIG-", &standin_mig_uuid(1, 1))), 1),
    ] {
        let seen = run(Some(&visible), Some("PCI_BUS_ID"), &[]);
        assert_eq!(seen.v1.len(), expected, "{visible}");
    }
}

#[test]
fn a_launch_on_an_instance_stamps_its_gpu_and_instance() {
    let visible = format!("{},0", text("MIG-", &standin_mig_uuid(2, 2)));
    let seen = run(Some(&visible), None, &[0, 1, 0]);
    assert_eq!(seen.ran, [3 | 2 << 16, 1, 3 | 2 << 16]);
    let record = penrose_standin::CounterRecord {
        device: seen.ran[0],
        ..zeroed_record()
    };
    assert_eq!(record.host_device(), Some(2));
    assert_eq!(record.gpu_instance(), Some(2));
    let whole = penrose_standin::CounterRecord {
        device: seen.ran[1],
        ..zeroed_record()
    };
    assert_eq!(whole.host_device(), Some(0));
    assert_eq!(whole.gpu_instance(), None);
}

fn zeroed_record() -> penrose_standin::CounterRecord {
    penrose_standin::CounterRecord::from_bytes(&[0; penrose_standin::ring::RECORD_SIZE])
}
