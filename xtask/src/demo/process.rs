//! What every step of the demo runs its processes with: the binaries, the children it
//! started (killed on any error), one-shot commands and the progress spinner.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use indicatif::{ProgressBar, ProgressStyle};

/// The folder of the binaries a run starts, each checked to be there.
pub(super) struct Bins(PathBuf);

impl Bins {
    /// Every binary the demo runs must be in `dir`.
    pub(super) fn check(dir: &Path) -> Result<Self> {
        let bins = Bins(dir.to_path_buf());
        for name in [
            "penrose-agent",
            "penrose-aggregator",
            "penrose-issuer",
            "penrose-design",
            "penrose-auditor",
            "penrose-replay",
        ] {
            ensure!(
                bins.path(name).exists(),
                "{} is missing (build the workspace's binaries first)",
                bins.path(name).display()
            );
        }
        Ok(bins)
    }

    /// The binary `name`.
    pub(super) fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// A command of the binary `name`.
    pub(super) fn command(&self, name: &str) -> Command {
        Command::new(self.path(name))
    }
}

/// Seconds per stage of the run, by the stage's name (the outcome's `seconds`).
#[derive(Default)]
pub(super) struct Stages(BTreeMap<String, f64>);

impl Stages {
    /// The stage `name` ran from `since` until now.
    pub(super) fn record(&mut self, name: &str, since: Instant) {
        self.0
            .insert(name.to_string(), since.elapsed().as_secs_f64());
    }

    /// Every stage's seconds.
    pub(super) fn into_seconds(self) -> BTreeMap<String, f64> {
        self.0
    }
}

/// Child processes, killed when dropped (an error never leaves servers behind).
#[derive(Default)]
pub(super) struct Children(Vec<(&'static str, Child)>);

impl Children {
    pub(super) fn push(&mut self, name: &'static str, child: Child) -> usize {
        self.0.push((name, child));
        self.0.len() - 1
    }

    /// SIGTERM, then waits up to `grace` before SIGKILL.
    pub(super) fn stop(
        &mut self,
        index: usize,
        grace: Duration,
    ) -> Result<std::process::ExitStatus> {
        let (name, child) = &mut self.0[index];
        terminate(child.id());
        let deadline = Instant::now() + grace;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("{name} did not stop within {grace:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL (a fault), and reaps it.
    pub(super) fn kill(&mut self, index: usize) -> Result<()> {
        let (_, child) = &mut self.0[index];
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    /// The process at `index` is now `child` (restarted after [`Children::kill`]).
    pub(super) fn replace(&mut self, index: usize, child: Child) {
        self.0[index].1 = child;
    }

    /// Whether the process at `index` has exited, and how.
    pub(super) fn exited(&mut self, index: usize) -> Result<Option<std::process::ExitStatus>> {
        Ok(self.0[index].1.try_wait()?)
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

fn terminate(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: sends SIGTERM to a child of ours that has not been waited for.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
}

/// Runs `cmd` to its end: its stdout, or an error with its stderr.
pub(super) fn output(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    ensure!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `cmd` (a `--json` command) to its end and reads what it printed as `T`, the type the
/// command prints.
pub(super) fn json_output<T: serde::de::DeserializeOwned>(
    cmd: &mut Command,
    what: &str,
) -> Result<T> {
    let out = output(cmd, what)?;
    serde_json::from_str(&out).with_context(|| format!("reading what {what} printed"))
}

pub(super) fn spinner(quiet: bool, prefix: &'static str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} {prefix:<12} {elapsed:>4} {msg}") {
        bar.set_style(style);
    }
    bar.set_prefix(prefix);
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

pub(super) fn wait_for(limit: Duration, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + limit;
    while !done()? {
        ensure!(Instant::now() < deadline, "timed out after {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}
