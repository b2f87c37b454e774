//! The daemon keeps only the capabilities capture needs, for its whole life.
//!
//! The agent runs as root because loading eBPF programs and attaching uprobes need privileges
//! no ordinary user has, and it attaches launch probes again for every capture window, so it
//! cannot give those up after the first. What it can give up is everything else root holds:
//! [`keep_only_capture_capabilities`] runs at the start of `penrose-agent run`, before any
//! thread exists (capabilities are per thread; threads inherit them), and leaves exactly
//! [`CAPTURE_CAPABILITIES`] in the effective, permitted and bounding sets, none inheritable or
//! ambient, and sets `no_new_privs`, so no later `execve` (none is made) could regain any.
//!
//! | capability | why the daemon keeps it |
//! |---|---|
//! | `CAP_BPF`, `CAP_PERFMON` | load the programs, create maps, open the perf events of the uprobes (Linux >= 5.8) |
//! | `CAP_SYS_ADMIN` | attach uprobes through perf on kernels since mid-2025, mount tracefs where it is missing, and everything BPF on kernels before 5.8 |
//! | `CAP_SYS_PTRACE` | read other users' `/proc/<pid>/maps`, `/proc/<pid>/root` and their memory (`process_vm_readv`) to locate libraries and name kernels registered before the agent started |
//! | `CAP_DAC_READ_SEARCH` | read (never write) files those processes map, wherever they are |
//!
//! Dropped, among others: `CAP_DAC_OVERRIDE` (it cannot write files it does not own),
//! `CAP_CHOWN`, `CAP_FOWNER`, `CAP_SETUID`/`CAP_SETGID`, `CAP_NET_ADMIN`, `CAP_NET_RAW`,
//! `CAP_SYS_MODULE`, `CAP_SYS_RAWIO`, `CAP_KILL`, `CAP_SYS_RESOURCE` (the packaged unit raises
//! `LimitMEMLOCK` for kernels before 5.11, which charge BPF maps to it). A kernel that does not
//! know `CAP_BPF`/`CAP_PERFMON` keeps the others. Not done yet: running as a dedicated user
//! (the capabilities above make such a user as powerful as root for reading, so it would gain
//! little without splitting a small privileged loader from an unprivileged worker).

// FFI to prctl(2), capget(2) and capset(2): the standard library has no wrapper.
#![allow(unsafe_code)]

use thiserror::Error;

/// Capability numbers (`linux/capability.h`).
mod cap {
    pub const DAC_READ_SEARCH: u32 = 2;
    pub const SYS_PTRACE: u32 = 19;
    pub const SYS_ADMIN: u32 = 21;
    pub const PERFMON: u32 = 38;
    pub const BPF: u32 = 39;
}

/// What the daemon keeps (module docs).
pub const CAPTURE_CAPABILITIES: [u32; 5] = [
    cap::DAC_READ_SEARCH,
    cap::SYS_PTRACE,
    cap::SYS_ADMIN,
    cap::PERFMON,
    cap::BPF,
];

/// [`CAPTURE_CAPABILITIES`] as a bit mask.
pub fn capture_mask() -> u64 {
    CAPTURE_CAPABILITIES.iter().fold(0, |m, c| m | (1u64 << c))
}

/// Why the capability sets could not be reduced.
#[derive(Debug, Error)]
pub enum PrivilegeError {
    /// A system call refused.
    #[error("{call}: {source}")]
    Os {
        /// Which call.
        call: &'static str,
        /// The error.
        source: std::io::Error,
    },
}

fn os(call: &'static str) -> PrivilegeError {
    PrivilegeError::Os {
        call,
        source: std::io::Error::last_os_error(),
    }
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn capget() -> Result<[CapData; 2], PrivilegeError> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: `header` and `data` are the layouts capget(2) documents for version 3 (two data
    // elements), alive and writable for the duration of the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut CapHeader,
            data.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(os("capget"));
    }
    Ok(data)
}

/// The highest capability this kernel knows.
fn last_capability() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

/// What the sets hold after [`keep_only_capture_capabilities`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kept {
    /// Effective and permitted set.
    pub permitted: u64,
    /// Capabilities removed from the bounding set.
    pub dropped_from_bounding: u32,
}

/// Reduces this thread's (at start: the process's) capabilities to [`CAPTURE_CAPABILITIES`]
/// (module docs). Call before any other thread exists.
pub fn keep_only_capture_capabilities() -> Result<Kept, PrivilegeError> {
    // SAFETY: prctl with PR_SET_NO_NEW_PRIVS takes integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(os("prctl(PR_SET_NO_NEW_PRIVS)"));
    }
    let keep = capture_mask();
    let mut dropped = 0;
    for c in 0..=last_capability() {
        if keep & (1u64 << c) != 0 {
            continue;
        }
        // SAFETY: prctl with PR_CAPBSET_DROP takes integer arguments only.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(c), 0, 0, 0) } != 0 {
            return Err(os("prctl(PR_CAPBSET_DROP)"));
        }
        dropped += 1;
    }
    let now = capget()?;
    let current = u64::from(now[0].permitted) | (u64::from(now[1].permitted) << 32);
    let permitted = current & keep;
    let data = [
        CapData {
            effective: permitted as u32,
            permitted: permitted as u32,
            inheritable: 0,
        },
        CapData {
            effective: (permitted >> 32) as u32,
            permitted: (permitted >> 32) as u32,
            inheritable: 0,
        },
    ];
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: the version-3 header and two data elements capset(2) documents, alive for the
    // call; the new sets only remove capabilities, which needs no privilege.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) };
    if rc != 0 {
        return Err(os("capset"));
    }
    Ok(Kept {
        permitted,
        dropped_from_bounding: dropped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_capture_set_is_the_five_documented_capabilities() {
        assert_eq!(capture_mask().count_ones(), 5);
        assert_eq!(
            capture_mask(),
            (1 << 2) | (1 << 19) | (1 << 21) | (1 << 38) | (1 << 39)
        );
    }
}
