//! The aggregation server started as its own process, as the demo and the benchmarks run it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};
use penrose_aggregator::config::DataDir;

/// Starts `penrose-aggregator serve` with `admission` (`--open-admission`, or `--token-keys
/// PATH`) and returns it with the address it listens on.
pub fn start_server<'a, S: AsRef<std::ffi::OsStr>>(
    bin: &Path,
    agg: &DataDir,
    listen: &str,
    key: impl Into<ServerKey<'a>>,
    admission: &[S],
) -> Result<(Child, String)> {
    let (server, ready) = start_server_ready(bin, agg, listen, key, admission)?;
    let listen = ready["listening"]
        .as_str()
        .context("listening address")?
        .to_string();
    Ok((server, listen))
}

/// The design server's key(s) an aggregation server is started with.
#[derive(Clone, Copy)]
pub enum ServerKey<'a> {
    /// `--public-key KEY`: one key for every day.
    Public(&'a Path),
    /// `--key-list LIST --key-list-signer SIGNER`: the design server's signed key list.
    List {
        /// The signed key list.
        list: &'a Path,
        /// The key that signed it, which the server checks the list against.
        signer: &'a Path,
    },
}

impl<'a> From<&'a Path> for ServerKey<'a> {
    fn from(key: &'a Path) -> Self {
        ServerKey::Public(key)
    }
}

impl<'a> From<&'a PathBuf> for ServerKey<'a> {
    fn from(key: &'a PathBuf) -> Self {
        ServerKey::Public(key)
    }
}

/// [`start_server`], with more flags after the key's if need be (`args`), returning the
/// JSON line the server printed once ready (`listening`, `stream_listening`, `metrics`, ...).
pub fn start_server_ready<'a, S: AsRef<std::ffi::OsStr>>(
    bin: &Path,
    agg: &DataDir,
    listen: &str,
    key: impl Into<ServerKey<'a>>,
    args: &[S],
) -> Result<(Child, serde_json::Value)> {
    let mut command = Command::new(bin);
    command
        .arg("serve")
        .arg("-d")
        .arg(agg.path())
        .args(["--listen", listen]);
    match key.into() {
        ServerKey::Public(key) => command.arg("--public-key").arg(key),
        ServerKey::List { list, signer } => command
            .arg("--key-list")
            .arg(list)
            .arg("--key-list-signer")
            .arg(signer),
    };
    let mut server = command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting penrose-aggregator serve")?;
    let mut line = String::new();
    BufReader::new(server.stdout.take().context("server stdout")?).read_line(&mut line)?;
    match serde_json::from_str(&line) {
        Ok(ready) => Ok((server, ready)),
        Err(e) => {
            let _ = server.kill();
            let _ = server.wait();
            Err(e).with_context(|| format!("the aggregator's first line: {line:?}"))
        }
    }
}
