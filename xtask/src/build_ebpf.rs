//! `cargo xtask build-ebpf`: rebuild the committed eBPF object, or check that it is current.
//!
//! The object is committed so that the main workspace builds without a BPF toolchain
//! (docs/design.md section 8). This task drives the separate toolchain: Debian's `rustc-web`
//! (with `rust-web-src` for `-Z build-std=core`) and `bpf-linker`. Every path that could
//! end up in the object is remapped, so the bytes do not depend on where the checkout,
//! the cargo home or the target directory lie; `--check` relies on that.

use std::{
    env,
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, bail, ensure};

/// The eBPF crate, relative to the workspace root.
const EBPF_DIR: &str = "penrose-ebpf";
/// The committed object, relative to the workspace root.
pub const OBJECT: &str = "penrose-ebpf/penrose.bpf.o";
/// The binary target of `penrose-ebpf` whose output is the object.
const BIN_NAME: &str = "penrose";
const TARGET: &str = "bpfel-unknown-none";
/// Programs read `pt_regs` with this architecture's layout; fixed so the host does not matter.
const BPF_TARGET_ARCH: &str = "x86_64";
/// Where `ci/build-bpf-linker.sh` installs bpf-linker unless `PENROSE_TOOLS` says otherwise.
const TOOLS_DIR: &str = "/var/tmp/penrose-tools";
/// ELF machine number for BPF.
const EM_BPF: u16 = 247;

/// Arguments.
#[derive(clap::Args)]
pub struct Args {
    /// Build into a fresh temporary directory and fail if the result differs from the
    /// committed object (what CI runs).
    #[arg(long)]
    check: bool,
    /// Cargo of the BPF toolchain (Debian's cargo-web package).
    #[arg(long, env = "PENROSE_EBPF_CARGO", default_value = "/usr/bin/cargo")]
    cargo: PathBuf,
    /// Rustc of the BPF toolchain (Debian's rustc-web package, LLVM 22).
    #[arg(long, env = "PENROSE_EBPF_RUSTC", default_value = "/usr/bin/rustc")]
    rustc: PathBuf,
    /// Target directory for the eBPF build [default: `$CARGO_TARGET_DIR/ebpf`, or
    /// `target/ebpf` in the workspace].
    #[arg(long)]
    target_dir: Option<PathBuf>,
}

/// Runs the task.
pub fn run(args: Args) -> anyhow::Result<()> {
    let root = workspace_root()?;
    let committed = root.join(OBJECT);
    let started = Instant::now();
    if args.check {
        let scratch = ScratchDir::new()?;
        let built = build(&args, &root, &scratch.0.join("target"))?;
        compare(&built, &committed)?;
        eprintln!(
            "build-ebpf: {OBJECT} is up to date ({:.1} s)",
            started.elapsed().as_secs_f64()
        );
    } else {
        let target_dir = match &args.target_dir {
            Some(dir) => dir.clone(),
            None => env::var_os("CARGO_TARGET_DIR")
                .map_or_else(|| root.join("target"), PathBuf::from)
                .join("ebpf"),
        };
        let built = build(&args, &root, &target_dir)?;
        fs::copy(&built, &committed)
            .with_context(|| format!("copying {} to {}", built.display(), committed.display()))?;
        eprintln!(
            "build-ebpf: wrote {OBJECT} ({} bytes, {:.1} s)",
            fs::metadata(&committed)?.len(),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// Builds the object and returns the path cargo left it at.
fn build(args: &Args, root: &Path, target_dir: &Path) -> anyhow::Result<PathBuf> {
    let crate_dir = root.join(EBPF_DIR);
    let rustflags = remap_flags(args, root)?;
    let mut cmd = Command::new(&args.cargo);
    clear_outer_cargo_env(&mut cmd);
    cmd.current_dir(&crate_dir)
        .args(["build", "--release", "--locked", "--target", TARGET])
        .arg("--target-dir")
        .arg(target_dir)
        .env("RUSTC", &args.rustc)
        // build-std and the `.cargo/config.toml` `[unstable]` table need a nightly switch;
        // Debian ships no nightly, so the stable compiler is told to allow them.
        .env("RUSTC_BOOTSTRAP", "1")
        .env("AYA_BPF_TARGET_ARCH", BPF_TARGET_ARCH)
        .env("CARGO_ENCODED_RUSTFLAGS", join_flags(&rustflags)?)
        .env("PATH", linker_path()?);
    eprintln!("build-ebpf: compiler {}", compiler_version(&args.rustc));
    eprintln!(
        "build-ebpf: {} build --release --target {TARGET} (in {}, target dir {})",
        args.cargo.display(),
        crate_dir.display(),
        target_dir.display()
    );
    let status = cmd
        .status()
        .with_context(|| format!("running {}", args.cargo.display()))?;
    ensure!(
        status.success(),
        "eBPF build failed ({status}); is the toolchain installed? see docs/build.md"
    );
    let object = target_dir.join(TARGET).join("release").join(BIN_NAME);
    verify_elf(&object)?;
    Ok(object)
}

/// The compiler and LLVM versions, which together with bpf-linker's decide the bytes: a
/// distribution update of either is the usual reason for `--check` to fail.
fn compiler_version(rustc: &Path) -> String {
    let Ok(output) = Command::new(rustc).arg("-vV").output() else {
        return "unknown".to_owned();
    };
    let text = String::from_utf8_lossy(&output.stdout);
    let field = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name))
            .map_or("?", str::trim)
            .to_owned()
    };
    format!(
        "rustc {}, LLVM {}",
        field("release:"),
        field("LLVM version:")
    )
}

/// Rustc flags that replace every machine-specific path with a fixed one.
fn remap_flags(args: &Args, root: &Path) -> anyhow::Result<Vec<OsString>> {
    let sysroot = Command::new(&args.rustc)
        .args(["--print", "sysroot"])
        .output()
        .with_context(|| format!("running {} --print sysroot", args.rustc.display()))?;
    ensure!(
        sysroot.status.success(),
        "{} --print sysroot failed",
        args.rustc.display()
    );
    let sysroot = PathBuf::from(String::from_utf8(sysroot.stdout)?.trim());
    let cargo_home = env::var_os("CARGO_HOME").map_or_else(
        || env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")),
        |home| Some(PathBuf::from(home)),
    );
    // Longest prefixes last: rustc applies the last matching remap.
    let mut pairs = vec![(sysroot.join("lib/rustlib/src/rust"), "/rustc/src")];
    if let Some(cargo_home) = cargo_home {
        pairs.push((cargo_home, "/cargo"));
    }
    pairs.push((root.to_path_buf(), "/penrose"));
    let mut flags = Vec::new();
    for (from, to) in pairs {
        let mut flag = OsString::from("--remap-path-prefix=");
        flag.push(from.as_os_str());
        flag.push("=");
        flag.push(to);
        flags.push(flag);
    }
    Ok(flags)
}

/// `CARGO_ENCODED_RUSTFLAGS` separates flags with 0x1f, so paths may contain spaces.
fn join_flags(flags: &[OsString]) -> anyhow::Result<String> {
    let strings = flags
        .iter()
        .map(|flag| {
            flag.to_str()
                .map(str::to_owned)
                .with_context(|| format!("path is not UTF-8: {}", flag.display()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(strings.join("\u{1f}"))
}

/// Drops what the outer (rustup) cargo exported, so it cannot steer the inner build.
fn clear_outer_cargo_env(cmd: &mut Command) {
    for (key, _) in env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        let inherited_cargo = key.starts_with("CARGO") && key != "CARGO_HOME";
        let toolchain = key.starts_with("RUSTUP_")
            || key.starts_with("RUSTC")
            || key == "RUSTFLAGS"
            || key == "RUSTDOCFLAGS";
        if inherited_cargo || toolchain {
            cmd.env_remove(key);
        }
    }
}

/// `PATH` with the bpf-linker install location first, for rustc to find the linker.
///
/// The project's own install wins over one elsewhere on `PATH`, which may be built against
/// another LLVM and so produce different bytes.
fn linker_path() -> anyhow::Result<OsString> {
    let tools = env::var_os("PENROSE_TOOLS")
        .map_or_else(|| PathBuf::from(TOOLS_DIR), PathBuf::from)
        .join("bin");
    let mut dirs = vec![tools];
    if let Some(path) = env::var_os("PATH") {
        dirs.extend(env::split_paths(&path));
    }
    let linker = dirs
        .iter()
        .map(|dir| dir.join("bpf-linker"))
        .find(|candidate| candidate.is_file())
        .context(
            "bpf-linker not found in $PENROSE_TOOLS/bin or on PATH; run ci/build-bpf-linker.sh",
        )?;
    let version = Command::new(&linker).arg("--version").output();
    if let Ok(version) = version {
        eprintln!(
            "build-ebpf: linker {} ({})",
            linker.display(),
            String::from_utf8_lossy(&version.stdout).trim()
        );
    }
    Ok(env::join_paths(dirs)?)
}

/// A cheap sanity check that cargo produced a BPF ELF object, not something else.
fn verify_elf(object: &Path) -> anyhow::Result<()> {
    let bytes = fs::read(object).with_context(|| format!("reading {}", object.display()))?;
    ensure!(
        bytes.starts_with(b"\x7fELF"),
        "{} is not an ELF file",
        object.display()
    );
    let machine = bytes
        .get(18..20)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .context("ELF header too short")?;
    ensure!(
        machine == EM_BPF,
        "{} has ELF machine {machine}, expected BPF ({EM_BPF})",
        object.display()
    );
    Ok(())
}

/// Fails with a pointer at the first differing byte when the two objects are not identical.
fn compare(built: &Path, committed: &Path) -> anyhow::Result<()> {
    let new = fs::read(built).with_context(|| format!("reading {}", built.display()))?;
    let old = fs::read(committed).with_context(|| {
        format!(
            "reading {}; run `cargo xtask build-ebpf` to create it",
            committed.display()
        )
    })?;
    if new == old {
        return Ok(());
    }
    let first = new
        .iter()
        .zip(&old)
        .position(|(a, b)| a != b)
        .unwrap_or(new.len().min(old.len()));
    bail!(
        "{} differs from a fresh build ({} vs {} bytes, first difference at byte {first}); \
         run `cargo xtask build-ebpf` and commit the result (or, if the toolchain changed, \
         see docs/build.md)",
        committed.display(),
        old.len(),
        new.len()
    )
}

/// The workspace root: the parent of this crate's manifest directory.
///
/// Read at run time (`cargo run` sets it), because the binary may be a cached build from a
/// checkout at another path.
fn workspace_root() -> anyhow::Result<PathBuf> {
    let manifest = env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    manifest
        .parent()
        .map(Path::to_path_buf)
        .context("xtask has no parent directory")
}

/// A temporary directory, removed on drop.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new() -> anyhow::Result<Self> {
        let dir = env::temp_dir().join(format!("penrose-ebpf-check-{}", std::process::id()));
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        // Best effort: a leftover directory in the temp dir harms nothing.
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let path = dir.join(name);
        fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn compare_accepts_equal_and_names_the_first_differing_byte() {
        let scratch = ScratchDir::new().unwrap();
        let a = write(&scratch.0, "a", b"\x7fELF-same");
        let b = write(&scratch.0, "b", b"\x7fELF-same");
        let c = write(&scratch.0, "c", b"\x7fELF-sXme");
        assert!(compare(&a, &b).is_ok());
        let err = compare(&a, &c).unwrap_err().to_string();
        assert!(err.contains("first difference at byte 6"), "{err}");
    }

    #[test]
    fn encoded_rustflags_keep_spaces_inside_one_flag() {
        let flags = [OsString::from("--a=/x y"), OsString::from("--b")];
        assert_eq!(join_flags(&flags).unwrap(), "--a=/x y\u{1f}--b");
    }
}
