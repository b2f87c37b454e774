//! The stand-in runtime, the nvcc-named test application and the stripped static library:
//! replays through `penrose-replay --via runtime|runtime-legacy|static`, the ELF facts the
//! agent's late-attach path relies on, and in-process checks of the `__handle` statics.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use object::{Object, ObjectSection, ObjectSymbol, SymbolFlags};
use penrose_standin::{
    AppLaunch, CounterRing, Driver, FunctionHandle, Launch, NVCC_APP_PATH, NvccApp, Runtime,
    RuntimeCounter, STATIC_LIB_PATH, StandinError, StaticLib, StreamHandle, StubAddress,
    install_libcuda, install_libcudart, install_nvcc_app, install_static_lib, ring_path,
};
use penrose_traces::{Kernel, Trace, TraceFolder, read_trace};
use serde_json::Value;

const REPLAY: &str = env!("CARGO_BIN_EXE_penrose-replay");

fn traces() -> Vec<PathBuf> {
    let dir = TraceFolder::default_dir();
    match TraceFolder::open(&dir) {
        Ok(folder) if !folder.files().is_empty() => folder.files().to_vec(),
        _ => {
            eprintln!(
                "skipped: no traces in {} (set PENROSE_TRACES)",
                dir.display()
            );
            Vec::new()
        }
    }
}

/// The replayer with every stand-in library installed side by side in `dir`.
fn replay_cmd(dir: &Path, trace: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(REPLAY);
    cmd.arg("--lib")
        .arg(install_libcuda(dir).unwrap())
        .arg("--cudart")
        .arg(install_libcudart(dir).unwrap())
        .arg("--app")
        .arg(install_nvcc_app(dir).unwrap())
        .arg("--static-lib")
        .arg(install_static_lib(dir).unwrap())
        .args(extra)
        .arg(trace);
    cmd
}

fn summary(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "replayer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn largest_sequence(trace: &Trace) -> Vec<&Kernel> {
    let seqs = trace.process_sequences();
    let (_, seq) = seqs
        .iter()
        .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.cmp(a.0)))
        .unwrap();
    seq.clone()
}

/// Distinct names in order of first launch, as the replayer assigns stubs.
fn names_in_order<'a>(seq: &[&'a Kernel]) -> Vec<&'a str> {
    let mut seen = BTreeSet::new();
    seq.iter()
        .map(|k| &*k.name)
        .filter(|n| seen.insert(*n))
        .collect()
}

fn drain_ring(pid: u32) -> Vec<penrose_standin::CounterRecord> {
    let mut ring = CounterRing::open(pid).unwrap();
    let records = ring.read_new().unwrap();
    assert_eq!(ring.lost(), 0);
    std::fs::remove_file(ring_path(pid)).unwrap();
    records
}

fn pid_of(s: &Value) -> u32 {
    u32::try_from(s["pid"].as_u64().unwrap()).unwrap()
}

/// Launch counts per driver entry point other than `entry` (all must be 0).
fn other_launches(s: &Value, entry: &str) -> u64 {
    s["launches"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != entry)
        .map(|(_, v)| v.as_u64().unwrap())
        .sum()
}

fn function_names(s: &Value) -> BTreeMap<u64, String> {
    s["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["handle"].as_u64().unwrap(),
                f["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn runtime_path_names_every_launch_of_every_trace_without_public_name_calls() {
    for path in traces() {
        let trace = read_trace(&path).unwrap();
        let seq = largest_sequence(&trace);
        let names = names_in_order(&seq);
        let what = path.display();
        let dir = tempfile::tempdir().unwrap();
        let out = replay_cmd(
            dir.path(),
            &path,
            &["--json", "--keep-ring", "--via", "runtime", "--loop", "2"],
        )
        .output()
        .unwrap();
        let s = summary(&out);
        let n = seq.len() as u64;

        assert_eq!(s["replayed"], 2 * n, "{what}");
        assert_eq!(s["launches"]["cuLaunchKernel"], 2 * n, "{what}");
        assert_eq!(other_launches(&s, "cuLaunchKernel"), 0, "{what}");
        // The private path made every handle; no public name function was called.
        assert_eq!(s["name_calls"], 0, "{what}");
        assert_eq!(s["private_kernels"], names.len(), "{what}");
        assert_eq!(s["distinct_functions"], names.len(), "{what}");
        let rt = &s["runtime"];
        assert_eq!(rt["register_function"], names.len(), "{what}");
        // nvcc's stubs ask once per kernel per process, however often they launch.
        assert_eq!(rt["get_kernel"], names.len(), "{what}");
        assert_eq!(rt["launch_by_handle"], 2 * n, "{what}");
        assert_eq!(rt["launch_by_stub"], 0, "{what}");

        let functions = s["functions"].as_array().unwrap();
        assert_eq!(functions.len(), names.len());
        for (i, (f, name)) in functions.iter().zip(&names).enumerate() {
            assert_eq!(f["name"], *name, "{what}");
            assert_eq!(
                f["registered_name"], *name,
                "{what}: registered with the trace's name"
            );
            assert!(f["stub"].as_u64().unwrap() != 0, "{what}: stub {i}");
        }
        let handle_to_name = function_names(&s);
        assert_eq!(
            handle_to_name.len(),
            names.len(),
            "{what}: handles not distinct"
        );

        // Every driver launch carries a handle that registration named.
        let records = drain_ring(pid_of(&s));
        assert_eq!(records.len() as u64, 2 * n, "{what}");
        for (i, r) in records.iter().enumerate() {
            let k = seq[i % seq.len()];
            assert_eq!(handle_to_name[&r.function], *k.name, "{what} launch {i}");
            assert_eq!(
                r.duration_ns(),
                Some(penrose_standin::abi::duration_ns(k.dur_us))
            );
        }
    }
}

#[test]
fn legacy_path_launches_with_stub_addresses_and_never_asks_for_handles() {
    let Some(path) = traces().into_iter().next() else {
        return;
    };
    let trace = read_trace(&path).unwrap();
    let seq = largest_sequence(&trace);
    let names = names_in_order(&seq);
    let dir = tempfile::tempdir().unwrap();
    let out = replay_cmd(
        dir.path(),
        &path,
        &[
            "--json",
            "--keep-ring",
            "--via",
            "runtime-legacy",
            "--entry",
            "launch-kernel-ptsz",
        ],
    )
    .output()
    .unwrap();
    let s = summary(&out);
    let n = seq.len() as u64;
    assert_eq!(s["launches"]["cuLaunchKernel_ptsz"], n);
    assert_eq!(other_launches(&s, "cuLaunchKernel_ptsz"), 0);
    assert_eq!(s["name_calls"], 0);
    let rt = &s["runtime"];
    assert_eq!(rt["get_kernel"], 0);
    assert_eq!(rt["launch_by_stub"], n);
    assert_eq!(rt["launch_by_handle"], 0);
    assert_eq!(rt["register_function"], names.len());
    let handle_to_name = function_names(&s);
    for (i, (r, k)) in drain_ring(pid_of(&s)).iter().zip(&seq).enumerate() {
        assert_eq!(handle_to_name[&r.function], *k.name, "launch {i}");
    }
}

#[test]
fn self_named_registration_uses_the_stubs_own_mangled_names() {
    let Some(path) = traces().into_iter().next() else {
        return;
    };
    let trace = read_trace(&path).unwrap();
    let names = names_in_order(&largest_sequence(&trace));
    let dir = tempfile::tempdir().unwrap();
    let out = replay_cmd(
        dir.path(),
        &path,
        &["--json", "--via", "runtime", "--self-named"],
    )
    .output()
    .unwrap();
    let s = summary(&out);
    for (i, (f, name)) in s["functions"]
        .as_array()
        .unwrap()
        .iter()
        .zip(&names)
        .enumerate()
    {
        assert_eq!(f["name"], *name);
        assert_eq!(f["registered_name"], format!("_Z13penrose_k{i:04}Pv"));
    }
    assert!(!ring_path(pid_of(&s)).exists(), "ring not removed");
}

#[test]
fn static_library_launches_distinct_hidden_kernels_through_the_driver() {
    let Some(path) = traces().into_iter().next() else {
        return;
    };
    let trace = read_trace(&path).unwrap();
    let seq = largest_sequence(&trace);
    let names = names_in_order(&seq);
    let dir = tempfile::tempdir().unwrap();
    let out = replay_cmd(
        dir.path(),
        &path,
        &["--json", "--keep-ring", "--via", "static"],
    )
    .output()
    .unwrap();
    let s = summary(&out);
    let n = seq.len() as u64;
    assert_eq!(s["launches"]["cuLaunchKernel"], n);
    assert_eq!(other_launches(&s, "cuLaunchKernel"), 0);
    assert_eq!(s["name_calls"], 0);
    assert_eq!(
        s["private_kernels"], 4,
        "the library registers its four kernels"
    );
    assert!(s.get("runtime").is_none());
    assert_eq!(s["functions"].as_array().unwrap().len(), 0);
    let records = drain_ring(pid_of(&s));
    assert_eq!(records.len() as u64, n);
    // Name i is the library's kernel i mod 4: as many distinct handles as that makes.
    let index: BTreeMap<&str, usize> = names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let mut by_kernel: BTreeMap<usize, BTreeSet<u64>> = BTreeMap::new();
    for (r, k) in records.iter().zip(&seq) {
        by_kernel
            .entry(index[&*k.name] % 4)
            .or_default()
            .insert(r.function);
    }
    assert_eq!(by_kernel.len(), names.len().min(4));
    let all: BTreeSet<u64> = by_kernel.values().flatten().copied().collect();
    assert_eq!(all.len(), by_kernel.len(), "one handle per library kernel");
    assert!(by_kernel.values().all(|h| h.len() == 1));
}

#[test]
fn bad_flag_combinations_are_refused() {
    let Some(path) = traces().into_iter().next() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for extra in [
        &["--via", "static", "--entry", "launch-kernel-ptsz"][..],
        &["--via", "runtime", "--entry", "rotate"],
        &["--self-named"],
    ] {
        let out = replay_cmd(dir.path(), &path, extra).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{extra:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

// ---- ELF facts (what the agent's late-attach path reads) ----

const STB_LOCAL: u8 = 0;
const STT_OBJECT: u8 = 1;
const STT_FUNC: u8 = 2;

/// `(bind, type)` of each `.symtab` symbol by name.
fn symtab(path: &str) -> BTreeMap<String, (u8, u8, u64)> {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.symbols()
        .filter_map(|s| {
            let SymbolFlags::Elf { st_info, .. } = s.flags() else {
                return None;
            };
            Some((
                s.name().ok()?.to_owned(),
                (st_info >> 4, st_info & 0xf, s.address()),
            ))
        })
        .collect()
}

fn stub_symbol(i: u32) -> String {
    format!("_ZL33__device_stub__Z13penrose_k{i:04}PvPv")
}

fn handle_symbol(i: u32) -> String {
    format!("_ZZL33__device_stub__Z13penrose_k{i:04}PvPvE8__handle")
}

fn host_symbol(i: u32) -> String {
    format!("_Z13penrose_k{i:04}Pv")
}

#[test]
fn app_symtab_holds_nvcc_named_local_stubs_and_handle_statics() {
    let symbols = symtab(NVCC_APP_PATH);
    let data = std::fs::read(NVCC_APP_PATH).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let exported: BTreeSet<String> = file
        .dynamic_symbols()
        .filter(|s| s.is_definition())
        .filter_map(|s| s.name().ok().map(str::to_owned))
        .collect();
    for i in 0..2048 {
        for (name, kind) in [
            (stub_symbol(i), STT_FUNC),
            (handle_symbol(i), STT_OBJECT),
            (host_symbol(i), STT_FUNC),
        ] {
            let Some(&(bind, ty, address)) = symbols.get(&name) else {
                panic!("{name} not in .symtab");
            };
            assert_eq!((bind, ty), (STB_LOCAL, kind), "{name}");
            assert_ne!(address, 0, "{name}");
            assert!(!exported.contains(&name), "{name} is exported");
        }
    }
    assert!(
        !symbols.contains_key(&stub_symbol(2048)),
        "pool larger than 2048"
    );
    for entry in [
        "penrose_nvcc_app_stub_count",
        "penrose_nvcc_app_stub",
        "penrose_nvcc_app_kernel_name",
        "penrose_nvcc_app_launch",
    ] {
        assert!(exported.contains(entry), "{entry} not exported");
    }
}

#[test]
fn static_library_is_stripped_with_a_build_id_and_a_small_api() {
    let data = std::fs::read(STATIC_LIB_PATH).unwrap();
    let file = object::File::parse(&*data).unwrap();
    assert!(file.section_by_name(".symtab").is_none(), "has a .symtab");
    assert!(file.symbols().next().is_none());
    let note = file
        .section_by_name(".note.gnu.build-id")
        .expect("no build-id note");
    assert!(note.size() > 0);
    let id = file.build_id().unwrap().expect("no build-id");
    assert_eq!(id.len(), 20, "sha1 build-id");
    let exported: BTreeSet<&str> = file
        .dynamic_symbols()
        .filter(|s| s.is_definition())
        .filter_map(|s| s.name().ok())
        .collect();
    assert_eq!(
        exported,
        BTreeSet::from(["penrose_static_kernel_count", "penrose_static_launch"])
    );
}

// ---- In process: the libraries loaded as an application loads them ----

struct Stack {
    driver: Driver,
    runtime: Runtime,
    app: NvccApp,
    statics: StaticLib,
    _dir: tempfile::TempDir,
}

/// One copy of every library for the in-process tests (state is per loaded copy).
fn stack() -> &'static Stack {
    static STACK: OnceLock<Stack> = OnceLock::new();
    STACK.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let driver = Driver::load(&install_libcuda(dir.path()).unwrap()).unwrap();
        driver.init().unwrap();
        driver.create_context(0).unwrap();
        let runtime = Runtime::load(&install_libcudart(dir.path()).unwrap(), &driver).unwrap();
        let app = NvccApp::load(&install_nvcc_app(dir.path()).unwrap(), &runtime).unwrap();
        let statics = StaticLib::load(&install_static_lib(dir.path()).unwrap(), &driver).unwrap();
        Stack {
            driver,
            runtime,
            app,
            statics,
            _dir: dir,
        }
    })
}

fn a_launch() -> Launch {
    Launch {
        grid: [2, 1, 1],
        block: [64, 1, 1],
        shared_mem_bytes: 0,
        stream: StreamHandle(0x5e00),
    }
}

/// Reads a pointer from this process's memory the way the agent reads another's.
fn read_pointer(address: u64) -> u64 {
    let mut mem = std::fs::File::open("/proc/self/mem").unwrap();
    mem.seek(SeekFrom::Start(address)).unwrap();
    let mut buf = [0u8; 8];
    mem.read_exact(&mut buf).unwrap();
    u64::from_ne_bytes(buf)
}

#[test]
fn handle_statics_hold_the_kernels_after_the_first_launch() {
    let st = stack();
    let (rt, app) = (&st.runtime, &st.app);
    // Stubs 100..104: this test's own (stub state lives for the process).
    let stubs: Vec<u32> = (100..104).collect();
    let h = rt.register_fat_binary().unwrap();
    for &i in &stubs {
        let name = CString::new(format!("late_attach_kernel_{i}")).unwrap();
        rt.register_function(h, app.stub(i).unwrap(), &name)
            .unwrap();
    }
    rt.register_fat_binary_end(h);
    assert_eq!(
        app.kernel_name(100).unwrap().to_str().unwrap(),
        host_symbol(100)
    );
    assert!(app.stub(2048).is_none() && app.kernel_name(2048).is_none());

    let symbols = symtab(NVCC_APP_PATH);
    // The load base, from a stub's run-time address and its .symtab value.
    let base = app.stub(stubs[0]).unwrap().0 as u64 - symbols[&host_symbol(stubs[0])].2;
    for &i in &stubs {
        let handle_at = base + symbols[&handle_symbol(i)].2;
        assert_eq!(read_pointer(handle_at), 0, "stub {i} never launched yet");
        let get_kernel = rt.count(RuntimeCounter::GetKernel);
        for _ in 0..3 {
            app.launch(i, &a_launch(), AppLaunch::default()).unwrap();
        }
        assert_eq!(rt.count(RuntimeCounter::GetKernel), get_kernel + 1);
        let kernel = rt.lookup(app.stub(i).unwrap()).unwrap();
        assert_eq!(
            read_pointer(handle_at),
            kernel.0 as u64,
            "stub {i}'s __handle"
        );
        assert_eq!(
            app.stub(i).unwrap().0 as u64,
            base + symbols[&host_symbol(i)].2,
            "the registered address is the host function"
        );
    }
}

#[test]
fn runtime_launches_by_handle_and_stub_and_refuses_unknown_ones() {
    let st = stack();
    let (rt, app, d) = (&st.runtime, &st.app, &st.driver);
    let stub = app.stub(200).unwrap();
    let h = rt.register_fat_binary().unwrap();
    rt.register_function(h, stub, c"direct_kernel").unwrap();
    let k = rt.get_kernel(stub).unwrap();
    assert_eq!(k, rt.lookup(stub).unwrap());
    assert_eq!(
        k,
        d.private_kernel(c"direct_kernel").unwrap(),
        "one kernel per name"
    );

    let by_stub = rt.count(RuntimeCounter::LaunchByStub);
    let by_handle = rt.count(RuntimeCounter::LaunchByHandle);
    rt.launch_kernel(stub.0, &a_launch(), false).unwrap();
    rt.launch_kernel(k.0, &a_launch(), true).unwrap();
    assert!(rt.count(RuntimeCounter::LaunchByStub) > by_stub);
    assert!(rt.count(RuntimeCounter::LaunchByHandle) > by_handle);

    // Unknown stubs and made-up handles.
    let bad =
        |r: Result<(), StandinError>| matches!(r, Err(StandinError::Runtime { code: 98, .. }));
    assert!(bad(rt.launch_kernel(0x1234, &a_launch(), false)));
    assert!(rt.get_kernel(StubAddress(0x1234)).is_err());
    assert!(bad(app.launch(201, &a_launch(), AppLaunch::default())));
    assert!(bad(app.launch(
        202,
        &a_launch(),
        AppLaunch {
            legacy: true,
            ..AppLaunch::default()
        }
    )));
    assert!(matches!(
        app.launch(5000, &a_launch(), AppLaunch::default()),
        Err(StandinError::Runtime { code: 1, .. })
    ));

    // Unregistering the fat binary forgets its stubs.
    rt.unregister_fat_binary(h);
    assert!(rt.lookup(stub).is_err());
    assert!(bad(rt.launch_kernel(stub.0, &a_launch(), false)));
    // The CUkernel itself stays a valid driver handle.
    d.launch(
        penrose_standin::EntryPoint::LaunchKernelEx,
        FunctionHandle(k.0),
        &a_launch(),
    )
    .unwrap();
}

#[test]
fn static_library_launches_in_process_with_no_name_calls_of_its_own() {
    let st = stack();
    let lib = &st.statics;
    assert_eq!(lib.kernel_count(), 4);
    let mut ring = CounterRing::open(std::process::id()).unwrap();
    ring.skip_to_head().unwrap();
    for i in 0..4 {
        let mut l = a_launch();
        l.stream = StreamHandle(0x57a7 + i as usize);
        lib.launch(i, &l).unwrap();
    }
    assert!(matches!(
        lib.launch(4, &a_launch()),
        Err(StandinError::Cuda { code, .. }) if code.0 == 1
    ));
    let ours: Vec<u64> = ring
        .read_new()
        .unwrap()
        .into_iter()
        .filter(|r| (0x57a7..0x57a7 + 4).contains(&r.stream))
        .map(|r| r.function)
        .collect();
    assert_eq!(ours.len(), 4);
    assert_eq!(
        ours.iter().collect::<BTreeSet<_>>().len(),
        4,
        "distinct kernels"
    );
    // The only in-process test that reads the ring: remove it (the mapping stays valid).
    let _ = std::fs::remove_file(ring_path(std::process::id()));
}
