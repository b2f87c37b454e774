//! The workspace root, the target directory and what the tasks build there.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The cargo features that compile the test equipment into the agent (the trace replay, the
/// stand-in ring) and the aggregation server (the load generator): what the demo and the
/// benchmarks build their release binaries with. `cargo xtask dist` never names them, so the
/// packages' binaries have none of it.
pub const TEST_EQUIPMENT_FEATURES: &str = "penrose-agent/test-util,penrose-aggregator/test-util";

/// The workspace root: xtask lives one level below it.
pub fn workspace_root() -> Result<PathBuf> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map(Path::to_path_buf)
        .context("xtask has no parent directory")
}

/// Cargo's target directory (`CARGO_TARGET_DIR` when set, else `target` under the root):
/// where the tasks find the binaries the builds they ran wrote.
pub fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

/// The stand-in library a build compiled into `release` (build scripts put it under
/// `build/*/out`); the newest, when several builds left one.
pub fn newest_standin(release: &Path) -> Result<PathBuf> {
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    for entry in std::fs::read_dir(release.join("build"))? {
        let path = entry?.path().join("out/libcuda.so.1");
        if let Ok(meta) = std::fs::metadata(&path) {
            let modified = meta.modified()?;
            if best.as_ref().is_none_or(|(t, _)| modified > *t) {
                best = Some((modified, path));
            }
        }
    }
    best.map(|(_, p)| p)
        .with_context(|| format!("no stand-in libcuda.so.1 under {}/build", release.display()))
}
