//! The network: its nodes' keys, torrc files and processes.

// Stopping a tor with SIGTERM (std's Child::kill only sends SIGKILL) needs libc::kill.
#![allow(unsafe_code)]

use std::fs;
use std::io::{self, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::consensus::{self, Expected, Readiness};
use crate::error::TorNetError;
use crate::exits::ExitFinder;
use crate::namespace::check_loopback_only;
use crate::torrc::{self, Role};

/// The nodes: 3 authorities (also guards and middles), 2 middles (also guards), 2 exits.
const LAYOUT: [(&str, Role); 7] = [
    ("auth0", Role::Authority),
    ("auth1", Role::Authority),
    ("auth2", Role::Authority),
    ("middle0", Role::Middle),
    ("middle1", Role::Middle),
    ("exit0", Role::Exit),
    ("exit1", Role::Exit),
];

/// Ports per node: ORPort, DirPort.
const PORTS_PER_NODE: u16 = 2;

/// How long a tor gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// How often [`TorNetwork::wait_ready`] asks the authorities.
const POLL: Duration = Duration::from_millis(500);

/// How to start a network.
#[derive(Debug, Clone)]
pub struct TorNetworkOptions {
    dir: PathBuf,
    base_port: Option<u16>,
    tor: PathBuf,
    tor_gencert: PathBuf,
    voting_interval: Duration,
}

impl TorNetworkOptions {
    /// A network under `dir` (created if missing; one subdirectory per node with its keys,
    /// torrc, state and logs), with ports probed free on 127.0.0.1, Debian's `tor` and
    /// `tor-gencert` from `PATH`, and a 10 s voting interval.
    #[must_use]
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        TorNetworkOptions {
            dir: dir.into(),
            base_port: None,
            tor: "tor".into(),
            tor_gencert: "tor-gencert".into(),
            voting_interval: Duration::from_secs(10),
        }
    }

    /// Use the 14 ports from `base` on (node *i*: ORPort `base + 2i`, DirPort `base + 2i + 1`)
    /// instead of probing for a free block.
    #[must_use]
    pub fn base_port(mut self, base: u16) -> Self {
        self.base_port = Some(base);
        self
    }

    /// The `tor` and `tor-gencert` programs to run.
    #[must_use]
    pub fn programs(mut self, tor: impl Into<PathBuf>, tor_gencert: impl Into<PathBuf>) -> Self {
        self.tor = tor.into();
        self.tor_gencert = tor_gencert.into();
        self
    }

    /// The authorities' voting interval (a new consensus this often; at least 2 s). Shorter
    /// brings the network up sooner and back sooner after a restart, at more CPU.
    #[must_use]
    pub fn voting_interval(mut self, interval: Duration) -> Self {
        self.voting_interval = interval;
        self
    }
}

/// One tor of the network.
#[derive(Debug)]
pub struct Relay {
    nickname: String,
    role: Role,
    dir: PathBuf,
    or_port: u16,
    dir_port: u16,
    fingerprint: String,
    ed25519_identity: String,
    v3ident: Option<String>,
    child: Option<Child>,
}

impl Relay {
    /// Its nickname, unique in the network (`auth0`, `middle1`, `exit0`, ...).
    #[must_use]
    pub fn nickname(&self) -> &str {
        &self.nickname
    }
    /// Its part in the network.
    #[must_use]
    pub fn role(&self) -> Role {
        self.role
    }
    /// Its ORPort on 127.0.0.1.
    #[must_use]
    pub fn or_port(&self) -> u16 {
        self.or_port
    }
    /// Its DirPort on 127.0.0.1.
    #[must_use]
    pub fn dir_port(&self) -> u16 {
        self.dir_port
    }
    /// Its RSA identity fingerprint (40 hex digits, upper case).
    #[must_use]
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }
    /// Its Ed25519 identity (unpadded base64).
    #[must_use]
    pub fn ed25519_identity(&self) -> &str {
        &self.ed25519_identity
    }
    /// An authority's v3 identity (the fingerprint of its authority identity key).
    #[must_use]
    pub fn v3ident(&self) -> Option<&str> {
        self.v3ident.as_deref()
    }
    /// Its directory: data directory, torrc, logs.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// Its process id while it runs.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
    /// Its tor log.
    #[must_use]
    pub fn log(&self) -> PathBuf {
        self.dir.join("notice.log")
    }
}

/// A private Tor network on loopback: 3 directory authorities, 2 middle relays and 2 exits,
/// each a `tor` process of its own. Dropping it stops every process it started.
#[derive(Debug)]
pub struct TorNetwork {
    dir: PathBuf,
    tor: PathBuf,
    relays: Vec<Relay>,
}

impl TorNetwork {
    /// Creates the keys and torrc files of every node under the options' directory and starts
    /// all seven tors. It returns once they are spawned; [`TorNetwork::wait_ready`] waits until
    /// a client can use them.
    ///
    /// # Errors
    /// [`TorNetError::NotIsolated`] or [`TorNetError::LoopbackDown`] outside a loopback-only
    /// network namespace (the safety rule: see [`crate::enter_loopback_namespace`]);
    /// [`TorNetError::ToolMissing`] without tor; errors of key generation, files or spawning.
    pub fn start(options: TorNetworkOptions) -> Result<TorNetwork, TorNetError> {
        check_loopback_only()?;
        create_private_dir(&options.dir)?;
        let dir = fs::canonicalize(&options.dir).map_err(|source| TorNetError::Io {
            path: options.dir.clone(),
            source,
        })?;
        let base = match options.base_port {
            Some(base) => base,
            None => free_port_block(LAYOUT.len() as u16 * PORTS_PER_NODE)?,
        };
        let mut relays = Vec::with_capacity(LAYOUT.len());
        for (i, (nickname, role)) in LAYOUT.iter().enumerate() {
            let node_dir = dir.join(nickname);
            create_private_dir(&node_dir)?;
            let or_port = port(base, i, 0)?;
            let dir_port = port(base, i, 1)?;
            let own = torrc::Own {
                nickname,
                role: *role,
                data_dir: &node_dir,
                or_port,
                dir_port,
            };
            let v3ident = if *role == Role::Authority {
                Some(authority_keys(&options.tor_gencert, &node_dir, dir_port)?)
            } else {
                None
            };
            let (fingerprint, ed25519_identity) = relay_keys(&options.tor, &own)?;
            relays.push(Relay {
                nickname: (*nickname).to_owned(),
                role: *role,
                dir: node_dir,
                or_port,
                dir_port,
                fingerprint,
                ed25519_identity,
                v3ident,
                child: None,
            });
        }
        write_torrcs(&relays, options.voting_interval)?;
        let mut network = TorNetwork {
            dir,
            tor: options.tor,
            relays,
        };
        network.restart()?;
        Ok(network)
    }

    /// The network's nodes, authorities first.
    #[must_use]
    pub fn relays(&self) -> &[Relay] {
        &self.relays
    }

    /// The directory the network lives in.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Tells a server on 127.0.0.1 which exit (if any) made a connection it accepted: exit
    /// connections to loopback all come from 127.0.0.1, so the address alone cannot (see
    /// [`ExitFinder`]). A snapshot of the exits' process ids; take a new one after
    /// [`TorNetwork::restart`].
    #[must_use]
    pub fn exit_finder(&self) -> ExitFinder {
        ExitFinder {
            exits: self
                .relays
                .iter()
                .filter(|r| r.role == Role::Exit)
                .filter_map(|r| Some((r.nickname.clone(), r.pid()?)))
                .collect(),
        }
    }

    /// The authorities' directory ports, where clients fetch the consensus.
    #[must_use]
    pub fn authority_dir_addrs(&self) -> Vec<SocketAddr> {
        self.relays
            .iter()
            .filter(|r| r.role == Role::Authority)
            .map(|r| SocketAddr::from((Ipv4Addr::LOCALHOST, r.dir_port)))
            .collect()
    }

    /// The process ids of the tors now running.
    #[must_use]
    pub fn pids(&self) -> Vec<u32> {
        self.relays.iter().filter_map(Relay::pid).collect()
    }

    /// One look at what a client would get from the authorities now.
    ///
    /// # Errors
    /// [`TorNetError::Exited`] when a tor that should run has exited.
    pub fn check_ready(&mut self) -> Result<Readiness, TorNetError> {
        self.check_running()?;
        let relays: Vec<SocketAddr> = self
            .relays
            .iter()
            .map(|r| SocketAddr::from((Ipv4Addr::LOCALHOST, r.dir_port)))
            .collect();
        Ok(consensus::check(
            &self.authority_dir_addrs(),
            &relays,
            &self.expected(),
        ))
    }

    /// Waits until a client can bootstrap and build circuits: every authority serves a
    /// consensus that lists all seven relays Running and Valid, guards on the authorities and
    /// middles and Exit on the exits, and serves every relay's microdescriptor (arti fetches
    /// those before it builds a circuit); and every relay has that consensus too (an exit
    /// without one ends every stream at once, END reason MISC). Returns what the last check
    /// saw.
    ///
    /// After [`TorNetwork::restart`] of relays, the consensus may still list them from before:
    /// a client then finds out by trying (its circuits fail until the relays are back).
    ///
    /// # Errors
    /// [`TorNetError::NotReady`] after `timeout`; [`TorNetError::Exited`] as soon as a tor
    /// exits.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<Readiness, TorNetError> {
        let started = Instant::now();
        loop {
            let state = self.check_ready()?;
            if state.is_ready() {
                return Ok(state);
            }
            if started.elapsed() >= timeout {
                return Err(TorNetError::NotReady {
                    waited: started.elapsed(),
                    state,
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// Stops the middles and exits (SIGTERM, SIGKILL after a grace), keeping their keys and
    /// data directories; the authorities keep running. [`TorNetwork::restart`] brings them back.
    ///
    /// # Errors
    /// [`TorNetError::Stop`] when a process could not be signalled or reaped.
    pub fn stop_relays(&mut self) -> Result<(), TorNetError> {
        stop_children(
            self.relays
                .iter_mut()
                .filter(|r| r.role != Role::Authority)
                .collect(),
        )
    }

    /// Stops every tor of the network (SIGTERM, SIGKILL after a grace) and reaps them, keeping
    /// keys and data directories: [`TorNetwork::restart`] can bring them back.
    ///
    /// # Errors
    /// [`TorNetError::Stop`] when a process could not be signalled or reaped.
    pub fn stop(&mut self) -> Result<(), TorNetError> {
        stop_children(self.relays.iter_mut().collect())
    }

    /// Starts every node that is not running, with its keys, data directory and ports of
    /// before. The authorities come first (the others upload their descriptors to them).
    ///
    /// # Errors
    /// [`TorNetError::NotIsolated`] outside a loopback-only namespace; spawning errors.
    pub fn restart(&mut self) -> Result<(), TorNetError> {
        check_loopback_only()?;
        for relay in &mut self.relays {
            if relay.child.is_none() {
                relay.child = Some(spawn_tor(&self.tor, relay)?);
            }
        }
        Ok(())
    }

    /// Checks that every tor that should run still does.
    ///
    /// # Errors
    /// [`TorNetError::Exited`] naming the first that exited, with the end of its log.
    pub fn check_running(&mut self) -> Result<(), TorNetError> {
        for relay in &mut self.relays {
            let Some(child) = relay.child.as_mut() else {
                continue;
            };
            let exited = child.try_wait().map_err(|source| TorNetError::Stop {
                nickname: relay.nickname.clone(),
                pid: child.id(),
                source,
            })?;
            if let Some(status) = exited {
                relay.child = None;
                return Err(TorNetError::Exited {
                    nickname: relay.nickname.clone(),
                    status,
                    log: relay.log(),
                    tail: log_tail(relay),
                });
            }
        }
        Ok(())
    }

    /// Every relay that should be listed, with the flags it must carry.
    fn expected(&self) -> Expected {
        Expected {
            relays: self
                .relays
                .iter()
                .map(|r| {
                    let flags = match r.role {
                        Role::Authority | Role::Middle => vec!["Guard"],
                        Role::Exit => vec!["Exit"],
                    };
                    (r.nickname.clone(), r.or_port, flags)
                })
                .collect(),
        }
    }
}

impl Drop for TorNetwork {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Port `which` (0: ORPort, 1: DirPort) of node `index`.
fn port(base: u16, index: usize, which: u16) -> Result<u16, TorNetError> {
    u16::try_from(index)
        .ok()
        .and_then(|i| i.checked_mul(PORTS_PER_NODE))
        .and_then(|offset| base.checked_add(offset + which))
        .ok_or(TorNetError::NoFreePorts {
            count: LAYOUT.len() as u16 * PORTS_PER_NODE,
            tries: 0,
        })
}

/// A block of `count` consecutive ports that are free on 127.0.0.1 now, probed by binding
/// each; the starting points vary with the process id so that two networks started at once
/// (each in its own namespace, or not) rarely probe the same block. The block lies below
/// Linux's ephemeral range (32768 and up by default): there the tors' own outgoing
/// connections, and other tests', took a probed port before its relay bound it (a CI run saw
/// "Could not bind to 127.0.0.1:58708: Address already in use").
fn free_port_block(count: u16) -> Result<u16, TorNetError> {
    const LOW: u32 = 20_000;
    const HIGH: u32 = 32_000;
    const TRIES: u32 = 50;
    let span = HIGH - LOW;
    let mut start = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..TRIES {
        let base = u16::try_from(LOW + start - start % 100).unwrap_or(20_000);
        let free = (0..count).all(|i| TcpListener::bind((Ipv4Addr::LOCALHOST, base + i)).is_ok());
        if free {
            return Ok(base);
        }
        start = (start + 1_000) % span;
    }
    Err(TorNetError::NoFreePorts {
        count,
        tries: TRIES,
    })
}

/// Creates a directory (and its parents) readable only by us, as tor wants its data
/// directory.
fn create_private_dir(dir: &Path) -> Result<(), TorNetError> {
    let io_err = |source| TorNetError::Io {
        path: dir.to_owned(),
        source,
    };
    fs::create_dir_all(dir).map_err(io_err)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io_err)
}

/// Writes a file, naming it in the error.
fn write_file(path: &Path, contents: &str) -> Result<(), TorNetError> {
    fs::write(path, contents).map_err(|source| TorNetError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Reads a file, naming it in the error.
fn read_file(path: &Path) -> Result<String, TorNetError> {
    fs::read_to_string(path).map_err(|source| TorNetError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Runs a key-generation command to completion, feeding it `stdin`.
fn run_tool(
    program: &Path,
    mut command: Command,
    stdin: &[u8],
    what: &str,
) -> Result<(), TorNetError> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| TorNetError::ToolMissing {
            program: program.to_owned(),
            source,
        })?;
    if let Some(mut input) = child.stdin.take() {
        // A tool that exits before reading its input closes the pipe; its status says why.
        let _ = input.write_all(stdin);
    }
    let output = child.wait_with_output().map_err(|source| TorNetError::Io {
        path: program.to_owned(),
        source,
    })?;
    if output.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    Err(TorNetError::ToolFailed {
        what: what.to_owned(),
        status: output.status,
        output: tail(&text, 20),
    })
}

/// Creates an authority's identity key, signing key and certificate (`tor-gencert`, with an
/// empty passphrase on stdin) in `node_dir/keys`; returns its v3 identity.
fn authority_keys(
    tor_gencert: &Path,
    node_dir: &Path,
    dir_port: u16,
) -> Result<String, TorNetError> {
    let keys = node_dir.join("keys");
    create_private_dir(&keys)?;
    let certificate = keys.join("authority_certificate");
    if !certificate.exists() {
        let mut command = Command::new(tor_gencert);
        command
            .current_dir(&keys)
            .arg("--create-identity-key")
            .args(["-m", "12"])
            .args(["-a", &format!("127.0.0.1:{dir_port}")])
            .args(["-i", "authority_identity_key"])
            .args(["-s", "authority_signing_key"])
            .args(["-c", "authority_certificate"])
            .args(["--passphrase-fd", "0"]);
        run_tool(tor_gencert, command, b"\n", "tor-gencert")?;
    }
    let text = read_file(&certificate)?;
    text.lines()
        .find_map(|line| line.strip_prefix("fingerprint "))
        .map(|fp| fp.trim().to_owned())
        .filter(|fp| is_fingerprint(fp))
        .ok_or_else(|| TorNetError::Parse {
            what: certificate.display().to_string(),
            detail: "no fingerprint line".into(),
        })
}

/// Creates a relay's identity keys (`tor --list-fingerprint`); returns its RSA fingerprint and
/// Ed25519 identity.
fn relay_keys(tor: &Path, own: &torrc::Own<'_>) -> Result<(String, String), TorNetError> {
    let rc = own.data_dir.join("keygen.torrc");
    write_file(&rc, &torrc::keygen(own))?;
    let empty = own.data_dir.join("empty.torrc");
    write_file(&empty, "")?;
    let mut command = Command::new(tor);
    command
        .arg("--list-fingerprint")
        .arg("-f")
        .arg(&rc)
        .arg("--defaults-torrc")
        .arg(&empty);
    run_tool(tor, command, b"", "tor --list-fingerprint")?;
    let fingerprint = second_word(&own.data_dir.join("fingerprint"))?;
    let ed25519 = second_word(&own.data_dir.join("fingerprint-ed25519"))?;
    if !is_fingerprint(&fingerprint) {
        return Err(TorNetError::Parse {
            what: "fingerprint file".into(),
            detail: fingerprint,
        });
    }
    Ok((fingerprint, ed25519))
}

/// The second word of a `nickname value` file (tor's `fingerprint` files).
fn second_word(path: &Path) -> Result<String, TorNetError> {
    read_file(path)?
        .split_ascii_whitespace()
        .nth(1)
        .map(str::to_owned)
        .ok_or_else(|| TorNetError::Parse {
            what: path.display().to_string(),
            detail: "expected `nickname value`".into(),
        })
}

/// 40 hex digits.
fn is_fingerprint(text: &str) -> bool {
    text.len() == 40 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Writes every node's torrc (and an exit's resolv.conf), now that all keys are known.
fn write_torrcs(relays: &[Relay], voting_interval: Duration) -> Result<(), TorNetError> {
    let dir_authorities: Vec<String> = relays
        .iter()
        .filter_map(|r| {
            r.v3ident.as_ref().map(|v3| {
                format!(
                    "DirAuthority {} orport={} no-v2 v3ident={v3} 127.0.0.1:{} {}",
                    r.nickname, r.or_port, r.dir_port, r.fingerprint
                )
            })
        })
        .collect();
    let fingerprints = |wanted: &[Role]| -> Vec<String> {
        relays
            .iter()
            .filter(|r| wanted.contains(&r.role))
            .map(|r| format!("${}", r.fingerprint))
            .collect()
    };
    let guards = fingerprints(&[Role::Authority, Role::Middle]);
    let exits = fingerprints(&[Role::Exit]);
    let shared = torrc::Shared {
        dir_authorities: &dir_authorities,
        guards: &guards,
        exits: &exits,
        voting_interval,
        owner_pid: std::process::id(),
    };
    for relay in relays {
        let own = torrc::Own {
            nickname: &relay.nickname,
            role: relay.role,
            data_dir: &relay.dir,
            or_port: relay.or_port,
            dir_port: relay.dir_port,
        };
        write_file(&relay.dir.join("torrc"), &torrc::render(&own, &shared))?;
        if relay.role == Role::Exit {
            write_file(&relay.dir.join("resolv.conf"), "nameserver 127.0.0.1\n")?;
        }
    }
    Ok(())
}

/// Starts one tor on its torrc, its console output appended to `console.log`.
fn spawn_tor(tor: &Path, relay: &Relay) -> Result<Child, TorNetError> {
    let console_path = relay.dir.join("console.log");
    let console = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&console_path)
        .map_err(|source| TorNetError::Io {
            path: console_path.clone(),
            source,
        })?;
    let console_err = console.try_clone().map_err(|source| TorNetError::Io {
        path: console_path,
        source,
    })?;
    Command::new(tor)
        .arg("-f")
        .arg(relay.dir.join("torrc"))
        .arg("--defaults-torrc")
        .arg(relay.dir.join("empty.torrc"))
        .stdin(Stdio::null())
        .stdout(console)
        .stderr(console_err)
        .spawn()
        .map_err(|source| TorNetError::ToolMissing {
            program: tor.to_owned(),
            source,
        })
}

/// Stops the given relays' tors together: SIGTERM to all, then waits for each, with SIGKILL
/// for any still there after the grace. Every one is reaped.
fn stop_children(relays: Vec<&mut Relay>) -> Result<(), TorNetError> {
    let mut first_error = None;
    for relay in &relays {
        if let Some(child) = &relay.child {
            // SIGTERM makes tor exit at once (ShutdownWaitLength 0 in any case).
            if let Err(source) = signal(child, libc::SIGTERM) {
                first_error.get_or_insert(TorNetError::Stop {
                    nickname: relay.nickname.clone(),
                    pid: child.id(),
                    source,
                });
            }
        }
    }
    let deadline = Instant::now() + STOP_GRACE;
    for relay in relays {
        let Some(mut child) = relay.child.take() else {
            continue;
        };
        if let Err(source) = reap(&mut child, deadline) {
            first_error.get_or_insert(TorNetError::Stop {
                nickname: relay.nickname.clone(),
                pid: child.id(),
                source,
            });
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Sends a signal to a child we have not reaped yet.
fn signal(child: &Child, signal: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(child.id())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: kill takes plain integers. The pid is our own child's, not yet reaped (we hold
    // its Child and only wait through it), so it cannot have been reused by another process.
    let rc = unsafe { libc::kill(pid, signal) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Waits for a child until `deadline`, then SIGKILLs and waits for it.
fn reap(child: &mut Child, deadline: Instant) -> io::Result<()> {
    loop {
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill()?;
    child.wait().map(|_| ())
}

/// The last lines of a relay's log (or of its console output, when tor died before it opened
/// its log).
fn log_tail(relay: &Relay) -> String {
    let log = fs::read_to_string(relay.log()).unwrap_or_default();
    let console = fs::read_to_string(relay.dir.join("console.log")).unwrap_or_default();
    let text = if log.trim().is_empty() { console } else { log };
    tail(&text, 15)
}

/// The last `lines` lines of a text.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
