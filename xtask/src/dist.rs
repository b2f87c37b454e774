//! `cargo xtask dist`: the Debian packages of the five product binaries.
//!
//! It builds the release binaries (`penrose-agent`, `penrose-aggregator`, `penrose-design`,
//! `penrose-issuer`, `penrose-auditor`, in one cargo invocation so they share one feature resolution), renders
//! what the packages carry beside them from the code itself, and runs `cargo deb --no-build`
//! for each:
//!
//! - man pages, from each CLI's clap definition (`penrose_*::cli::command`), one per command
//!   and subcommand, gzipped (`-9n`-like: no name, no time stamp, so the bytes are
//!   reproducible);
//! - bash, zsh and fish completions, from the same definitions;
//! - the agent's conffile `/etc/penrose/agent.toml`: `penrose_agent::config::DEFAULT_FILE`,
//!   the text `penrose-agent config --print-default` prints, so the two cannot drift.
//!
//! The generated files go to `$CARGO_TARGET_DIR/release/penrose-dist/<package>/`, which the
//! `[package.metadata.deb]` assets reference as `target/release/penrose-dist/...` (cargo-deb
//! maps the `target/release/` prefix onto the real target directory). They are never
//! committed. The hand-written packaging sources (systemd units, sysusers.d, the aggregator's
//! configuration, the copyright file) are in `packaging/` (docs/operations.md, "Install from
//! packages").

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use clap_complete::Shell;
use flate2::Compression;
use flate2::write::GzEncoder;

use xtask::workspace::{target_dir, workspace_root};

/// One package.
struct Package {
    /// The cargo package, the Debian package and the binary: one name.
    name: &'static str,
    /// The man page section.
    section: &'static str,
    /// The binary's clap definition.
    command: fn() -> clap::Command,
}

/// The packages. Daemons and system administration commands are man section 8; the design
/// server's CLI, run by the vendor's architects, section 1.
const PACKAGES: [Package; 5] = [
    Package {
        name: "penrose-agent",
        section: "8",
        command: penrose_agent::cli::command,
    },
    Package {
        name: "penrose-aggregator",
        section: "8",
        command: penrose_aggregator::cli::command,
    },
    Package {
        name: "penrose-design",
        section: "1",
        command: penrose_design::cli::command,
    },
    Package {
        name: "penrose-issuer",
        section: "8",
        command: penrose_issuer::cli::command,
    },
    Package {
        name: "penrose-auditor",
        section: "8",
        command: penrose_auditor::cli::command,
    },
];

/// Where the generated assets go, below the release directory of the target directory.
pub const DIST_DIR: &str = "penrose-dist";

/// Arguments.
#[derive(clap::Args)]
pub struct Args {
    /// Only write the generated files (man pages, completions, the agent's conffile); build
    /// neither the binaries nor the packages.
    #[arg(long)]
    assets_only: bool,
    /// Package the release binaries already built instead of running `cargo build --release`.
    #[arg(long, conflicts_with = "assets_only")]
    no_build: bool,
    /// Where the .deb files go [default: `$CARGO_TARGET_DIR/debian`].
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Runs the task.
pub fn run(args: Args) -> Result<()> {
    let root = workspace_root()?;
    let release = target_dir(&root).join("release");
    let started = Instant::now();
    if !args.assets_only && !args.no_build {
        eprintln!("dist: building the release binaries");
        let mut build = Command::new(env!("CARGO"));
        build
            .current_dir(&root)
            .args(["build", "--release", "--locked", "--bins"]);
        for package in &PACKAGES {
            build.args(["-p", package.name]);
        }
        let status = build.status().context("running cargo build")?;
        ensure!(status.success(), "cargo build --release failed: {status}");
    }
    let dist = release.join(DIST_DIR);
    let written = write_assets(&dist)?;
    eprintln!("dist: wrote {written} files under {}", dist.display());
    if args.assets_only {
        return Ok(());
    }
    let out = args.out.unwrap_or_else(|| target_dir(&root).join("debian"));
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let have = Command::new(env!("CARGO"))
        .args(["deb", "--version"])
        .output();
    if !have.is_ok_and(|o| o.status.success()) {
        bail!(
            "cargo-deb is not installed: `cargo install cargo-deb --locked` (ci/packages.sh \
             installs it into /var/tmp/penrose-tools/bin)"
        );
    }
    for Package { name: package, .. } in &PACKAGES {
        eprintln!("dist: packaging {package}");
        let status = Command::new(env!("CARGO"))
            .current_dir(&root)
            // Stripped binaries: the release profile keeps line tables for backtraces in
            // development; the packages ship without them.
            .args(["deb", "--no-build", "--strip", "-p", package, "-o"])
            .arg(&out)
            .status()
            .context("running cargo deb")?;
        ensure!(status.success(), "cargo deb -p {package} failed: {status}");
    }
    eprintln!(
        "dist: packages in {} ({:.0} s)",
        out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Writes every generated asset below `dist` (emptied first, so a removed subcommand leaves
/// no stale page for a glob to pick up); returns how many files it wrote.
pub fn write_assets(dist: &Path) -> Result<usize> {
    if dist.exists() {
        fs::remove_dir_all(dist).with_context(|| format!("removing {}", dist.display()))?;
    }
    let mut written = 0;
    for &Package {
        name: package,
        section,
        command,
    } in &PACKAGES
    {
        let dir = dist.join(package);
        let man = dir.join("man");
        fs::create_dir_all(&man).with_context(|| format!("creating {}", man.display()))?;
        for (name, page) in man_pages(command(), section)? {
            write(&man.join(format!("{name}.{section}.gz")), &gzip(&page)?)?;
            written += 1;
        }
        let completions = dir.join("completions");
        fs::create_dir_all(&completions)?;
        for (shell, file) in [
            (Shell::Bash, package.to_string()),
            (Shell::Zsh, format!("_{package}")),
            (Shell::Fish, format!("{package}.fish")),
        ] {
            let mut cmd = command();
            let mut text = Vec::new();
            clap_complete::generate(shell, &mut cmd, package, &mut text);
            write(&completions.join(file), &text)?;
            written += 1;
        }
    }
    // The agent's conffile is the default configuration the code documents.
    write(
        &dist.join("penrose-agent").join("agent.toml"),
        penrose_agent::config::DEFAULT_FILE.as_bytes(),
    )?;
    Ok(written + 1)
}

/// The man pages of `cmd` and of each of its (visible) subcommands, as (name, roff text):
/// `penrose-agent`, `penrose-agent-run`, ... (what `clap_mangen::generate_to` makes, kept in
/// memory so that they can be compressed).
fn man_pages(cmd: clap::Command, section: &str) -> Result<Vec<(String, Vec<u8>)>> {
    fn walk(cmd: clap::Command, section: &str, out: &mut Vec<(String, Vec<u8>)>) -> Result<()> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            walk(sub.clone(), section, out)?;
        }
        let name = cmd
            .get_display_name()
            .unwrap_or_else(|| cmd.get_name())
            .to_string();
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd)
            .section(section)
            .manual("Penrose")
            .render(&mut page)
            .with_context(|| format!("rendering the man page of {name}"))?;
        out.push((name, page));
        Ok(())
    }
    let mut cmd = cmd.disable_help_subcommand(true);
    // Sets each subcommand's display name (`penrose-agent-run`).
    cmd.build();
    let mut out = Vec::new();
    walk(cmd, section, &mut out)?;
    out.sort();
    Ok(out)
}

/// Gzip at the best level, with no file name and a zero time stamp in the header.
fn gzip(data: &[u8]) -> Result<Vec<u8>> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::best());
    encoder.write_all(data)?;
    Ok(encoder.finish()?)
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_command_and_subcommand_has_a_page() {
        let pages = man_pages(penrose_agent::cli::command(), "8").unwrap();
        let names: Vec<&str> = pages.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names.contains(&"penrose-agent"), "{names:?}");
        assert!(names.contains(&"penrose-agent-run"), "{names:?}");
        assert!(!names.iter().any(|n| n.ends_with("-help")), "{names:?}");
        for (name, page) in &pages {
            let text = String::from_utf8_lossy(page);
            assert!(text.contains(".TH"), "{name} has no title line");
        }
    }

    #[test]
    fn gzip_is_reproducible() {
        let a = gzip(b"penrose").unwrap();
        assert_eq!(a, gzip(b"penrose").unwrap());
        // No file name flag, zero mtime (RFC 1952: bytes 3 and 4..8).
        assert_eq!(a[3], 0);
        assert_eq!(&a[4..8], &[0, 0, 0, 0]);
    }
}
