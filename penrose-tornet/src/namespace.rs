//! The safety rule (docs/design.md section 5): a Tor test runs in a network namespace that has
//! only loopback, so that nothing it starts (tor, or arti with its built-in list of public
//! relays) can ever reach another machine.
//!
//! A network namespace belongs to a thread, not a process. [`enter_loopback_namespace`]
//! therefore refuses unless the process has exactly one thread: every thread and child started
//! afterwards inherits the namespace, while a thread started before would stay outside. The
//! check reads `/proc/thread-self/net/dev` (the calling thread's namespace), not
//! `/sys/class/net`, which shows the namespace sysfs was mounted in, i.e. the host's.

// Entering a namespace and reading or setting an interface's flags are system calls without a
// safe wrapper in std; every block says why it is sound.
#![allow(unsafe_code)]

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::error::TorNetError;

/// Where the calling thread's network namespace lists its interfaces.
const THREAD_NET_DEV: &str = "/proc/thread-self/net/dev";

/// Checks that the calling thread is in a network namespace whose only interface is `lo`, and
/// that `lo` is up; [`crate::TorNetwork::start`] calls it before it starts anything.
///
/// # Errors
/// [`TorNetError::NotIsolated`] naming the interfaces seen, or [`TorNetError::LoopbackDown`].
pub fn check_loopback_only() -> Result<(), TorNetError> {
    let text = fs::read_to_string(THREAD_NET_DEV).map_err(|source| TorNetError::Io {
        path: THREAD_NET_DEV.into(),
        source,
    })?;
    let interfaces = interface_names(&text);
    if interfaces.len() != 1 || interfaces[0] != "lo" {
        return Err(TorNetError::NotIsolated { interfaces });
    }
    let flags = lo_flags().map_err(|source| TorNetError::Namespace {
        step: "read the flags of lo",
        source,
    })?;
    if flags & libc::IFF_UP == 0 {
        return Err(TorNetError::LoopbackDown);
    }
    Ok(())
}

/// Moves the process into a new network namespace that has only `lo`, and brings `lo` up.
///
/// Call it first thing in `main` (a CLI's, or a `harness = false` test's), before a tokio
/// runtime or anything else starts a thread: namespaces are per thread, so it refuses while
/// the process has more than one. It needs root (`CAP_SYS_ADMIN`). Afterwards 127.0.0.0/8 is
/// all there is; nothing the process or its children start can reach another machine.
///
/// # Errors
/// [`TorNetError::NotSingleThreaded`]; [`TorNetError::Namespace`] when `unshare` or bringing
/// `lo` up fails (`EPERM` as a plain user); whatever [`check_loopback_only`] says afterwards.
pub fn enter_loopback_namespace() -> Result<(), TorNetError> {
    let threads = thread_count()?;
    if threads != 1 {
        return Err(TorNetError::NotSingleThreaded { threads });
    }
    enter_loopback_namespace_this_thread()
}

/// [`enter_loopback_namespace`] for the calling thread only, without the single-thread check.
fn enter_loopback_namespace_this_thread() -> Result<(), TorNetError> {
    unshare_net().map_err(|source| TorNetError::Namespace {
        step: "unshare(CLONE_NEWNET)",
        source,
    })?;
    bring_lo_up_and_check()
}

/// Brings `lo` up in the calling thread's namespace, then checks it is the only interface.
fn bring_lo_up_and_check() -> Result<(), TorNetError> {
    set_lo_up().map_err(|source| TorNetError::Namespace {
        step: "bring lo up",
        source,
    })?;
    check_loopback_only()
}

/// A new, empty network namespace for the calling thread.
fn unshare_net() -> io::Result<()> {
    // SAFETY: unshare takes a flag word and touches no memory of ours; CLONE_NEWNET only
    // changes which network namespace the calling thread belongs to.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The interface names in a `/proc/net/dev` listing (after its two header lines).
fn interface_names(text: &str) -> Vec<String> {
    text.lines()
        .skip(2)
        .filter_map(|line| line.split_once(':'))
        .map(|(name, _)| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .collect()
}

/// The process's thread count, from `/proc/self/status`.
fn thread_count() -> Result<usize, TorNetError> {
    let path = "/proc/self/status";
    let status = fs::read_to_string(path).map_err(|source| TorNetError::Io {
        path: path.into(),
        source,
    })?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| TorNetError::Parse {
            what: path.into(),
            detail: "no Threads: line".into(),
        })
}

/// An `AF_INET` datagram socket in the calling thread's namespace, for interface ioctls.
fn ioctl_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket takes plain integers and returns a new descriptor or -1.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a descriptor socket just returned to us and nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An `ifreq` naming `lo`, its union zeroed.
fn lo_request() -> libc::ifreq {
    // SAFETY: ifreq is a plain C struct (a name array and a union of integers, sockaddrs and
    // a pointer) for which all-zero bytes are a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    req
}

/// The interface flags of `lo` (`SIOCGIFFLAGS`).
fn lo_flags() -> io::Result<libc::c_int> {
    let sock = ioctl_socket()?;
    let mut req = lo_request();
    // SAFETY: SIOCGIFFLAGS reads ifr_name and writes ifr_ifru.ifru_flags of the ifreq we pass,
    // which lives for the whole call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a successful SIOCGIFFLAGS filled in the flags member of the union.
    Ok(libc::c_int::from(unsafe { req.ifr_ifru.ifru_flags }))
}

/// Sets `IFF_UP` on `lo` (what `ip link set lo up` does).
fn set_lo_up() -> io::Result<()> {
    let flags = lo_flags()?;
    let sock = ioctl_socket()?;
    let mut req = lo_request();
    // Interface flags fit in the kernel's short (IFF_UP is bit 0).
    req.ifr_ifru.ifru_flags = (flags | libc::IFF_UP) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads ifr_name and ifr_ifru.ifru_flags of the ifreq we pass, which
    // lives for the whole call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use penrose_host::skip::skipped;

    #[test]
    fn interface_names_are_read_from_proc_net_dev() {
        let text = "Inter-|   Receive   |  Transmit\n face |bytes packets|bytes\n    \
                    lo:       0       0    0\n  eth0: 12 3 4\n";
        assert_eq!(interface_names(text), ["lo", "eth0"]);
    }

    #[test]
    fn the_check_fails_in_the_hosts_namespace() {
        let Ok(text) = fs::read_to_string(THREAD_NET_DEV) else {
            skipped(format_args!("SKIPPED: no {THREAD_NET_DEV} here"));
            return;
        };
        if interface_names(&text).iter().all(|name| name == "lo") {
            skipped(format_args!(
                "SKIPPED: this host's namespace has only lo, so the check cannot fail here"
            ));
            return;
        }
        match check_loopback_only() {
            Err(TorNetError::NotIsolated { interfaces }) => {
                assert!(interfaces.iter().any(|name| name != "lo"), "{interfaces:?}");
            }
            other => panic!("the host's namespace passed as loopback-only: {other:?}"),
        }
    }

    #[test]
    fn the_check_passes_in_a_fresh_namespace_once_lo_is_up() {
        // A thread of its own: the namespace is the thread's, and goes with it.
        let outcome = std::thread::spawn(|| -> io::Result<_> {
            unshare_net()?;
            let down = check_loopback_only();
            let up = bring_lo_up_and_check();
            Ok((down, up))
        })
        .join()
        .expect("the namespace thread panicked");
        match outcome {
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                skipped(format_args!(
                    "SKIPPED: unshare(CLONE_NEWNET) needs root (CAP_SYS_ADMIN): {e}"
                ));
            }
            Err(e) => panic!("unshare failed: {e}"),
            Ok((down, up)) => {
                assert!(
                    matches!(down, Err(TorNetError::LoopbackDown)),
                    "lo starts down in a new namespace: {down:?}"
                );
                assert!(up.is_ok(), "{up:?}");
            }
        }
    }

    #[test]
    fn entering_refuses_while_other_threads_run() {
        // libtest runs this on a thread of its own, besides the main thread.
        let keep = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_millis(200)));
        let result = enter_loopback_namespace();
        let _ = keep.join();
        assert!(
            matches!(result, Err(TorNetError::NotSingleThreaded { threads }) if threads > 1),
            "{result:?}"
        );
    }
}
