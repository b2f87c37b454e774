//! Reading a probed process's memory, read-only, with `process_vm_readv`: the words that name
//! kernels registered before the agent attached ([`super::late`]), and kernel names a probe
//! could not read itself.
//!
//! A probe runs where page faults cannot be served, so a name in a page the process has not
//! touched yet (a large library's `.rodata` at load, when it registers its kernels) is out of
//! its reach; the process reads fine from here, where the kernel faults the page in. Every
//! read is bounded and stops at the first address the target cannot give.

use super::events::Pid;

/// The longest name read from a process: the BPF side's capacity, less its NUL.
pub const MAX_NAME_BYTES: usize = penrose_ebpf_common::NAME_CAPACITY - 1;

/// A NUL-terminated string at `address` in `pid`'s memory: its bytes (without the NUL, lossily
/// decoded) and whether it was cut at [`MAX_NAME_BYTES`]. `None` when nothing can be read
/// there (the process exited, or the address is not mapped) or no NUL is found before the
/// readable memory ends.
pub fn read_c_string(pid: Pid, address: u64) -> Option<(String, bool)> {
    let target = libc::pid_t::try_from(pid.0).ok()?;
    let mut buf = vec![0u8; MAX_NAME_BYTES + 1];
    let mut filled = 0;
    // A string can end just before an unmapped page: read page by page, stopping at the
    // first page the target cannot give or the first NUL.
    while filled < buf.len() {
        let at = address.checked_add(filled as u64)?;
        let to_page_end = (PAGE - at % PAGE) as usize;
        let len = to_page_end.min(buf.len() - filled);
        let read = read_into(target, at, &mut buf[filled..filled + len]);
        if read == 0 {
            break;
        }
        if let Some(nul) = buf[filled..filled + read].iter().position(|&b| b == 0) {
            buf.truncate(filled + nul);
            return Some((String::from_utf8_lossy(&buf).into_owned(), false));
        }
        filled += read;
    }
    (filled == buf.len()).then(|| {
        buf.truncate(MAX_NAME_BYTES);
        (String::from_utf8_lossy(&buf).into_owned(), true)
    })
}

/// Pages are at least this large on every target the agent runs on; reads never cross one.
const PAGE: u64 = 4096;

/// Copies up to `local.len()` bytes at `address` of `target` into `local`; the bytes copied.
fn read_into(target: libc::pid_t, address: u64, local: &mut [u8]) -> usize {
    let local_iov = libc::iovec {
        iov_base: local.as_mut_ptr().cast(),
        iov_len: local.len(),
    };
    let remote = libc::iovec {
        iov_base: address as usize as *mut libc::c_void,
        iov_len: local.len(),
    };
    #[allow(unsafe_code)]
    // SAFETY: the local iovec covers `local`, which outlives the call; the kernel checks the
    // remote one against the target's address space and only reads it.
    let read = unsafe { libc::process_vm_readv(target, &local_iov, 1, &remote, 1, 0) };
    usize::try_from(read).unwrap_or(0)
}

/// Reads one 8-byte word at each address of `pid`'s memory; `None` where it cannot be read.
/// Read-only: `process_vm_readv` copies from the target into the agent.
pub fn read_words(pid: Pid, addresses: &[u64]) -> Vec<Option<u64>> {
    const BATCH: usize = 512;
    let mut out = Vec::with_capacity(addresses.len());
    for chunk in addresses.chunks(BATCH) {
        let mut words = vec![0u64; chunk.len()];
        let local: Vec<libc::iovec> = words
            .iter_mut()
            .map(|w| libc::iovec {
                iov_base: std::ptr::from_mut(w).cast(),
                iov_len: 8,
            })
            .collect();
        let remote: Vec<libc::iovec> = chunk
            .iter()
            .map(|&a| libc::iovec {
                iov_base: a as usize as *mut libc::c_void,
                iov_len: 8,
            })
            .collect();
        let Ok(target) = libc::pid_t::try_from(pid.0) else {
            out.extend(std::iter::repeat_n(None, chunk.len()));
            continue;
        };
        #[allow(unsafe_code)]
        // SAFETY: every local iovec points at an 8-byte word of `words`, which outlives the
        // call; the remote iovecs are only read by the kernel, which checks them against the
        // target's address space and stops at the first unreadable one.
        let read = unsafe {
            libc::process_vm_readv(
                target,
                local.as_ptr(),
                local.len() as libc::c_ulong,
                remote.as_ptr(),
                remote.len() as libc::c_ulong,
                0,
            )
        };
        // The kernel stops at the first address it cannot read: whole words before it are
        // good, the rest are retried one by one.
        let whole = usize::try_from(read).map_or(0, |bytes| bytes / 8);
        for (i, word) in words.iter().enumerate() {
            if i < whole {
                out.push(Some(*word));
            } else {
                out.push(read_one(target, chunk[i]));
            }
        }
    }
    out
}

fn read_one(target: libc::pid_t, address: u64) -> Option<u64> {
    let mut word = 0u64;
    let local = libc::iovec {
        iov_base: std::ptr::from_mut(&mut word).cast(),
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: address as usize as *mut libc::c_void,
        iov_len: 8,
    };
    #[allow(unsafe_code)]
    // SAFETY: one local iovec over `word`, which outlives the call; the kernel checks the
    // remote one against the target's address space.
    let read = unsafe { libc::process_vm_readv(target, &local, 1, &remote, 1, 0) };
    (read == 8).then_some(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own() -> Pid {
        Pid(std::process::id())
    }

    #[test]
    fn a_string_is_read_up_to_its_nul() {
        let name = c"_Z6kernelPf";
        let read = read_c_string(own(), name.as_ptr() as u64);
        assert_eq!(read, Some(("_Z6kernelPf".to_owned(), false)));
    }

    #[test]
    fn a_string_that_ends_at_the_last_readable_byte_is_read_and_one_without_nul_is_not() {
        // Two pages, the second made unreadable: a name ending right before it is read whole,
        // bytes running into it without a NUL are refused.
        let page = PAGE as usize;
        #[allow(unsafe_code)]
        // SAFETY: an anonymous private mapping of two pages, unmapped at the end of the test.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        #[allow(unsafe_code)]
        // SAFETY: `base` maps two writable pages; the slice covers the first one only.
        let first = unsafe { std::slice::from_raw_parts_mut(base.cast::<u8>(), page) };
        first.fill(b'a');
        first[page - 1] = 0;
        #[allow(unsafe_code)]
        // SAFETY: the second page of the mapping above.
        let rc = unsafe { libc::mprotect(base.cast::<u8>().add(page).cast(), page, 0) };
        assert_eq!(rc, 0);
        let start = base as u64 + PAGE - 11;
        assert_eq!(read_c_string(own(), start), Some(("a".repeat(10), false)));
        first[page - 1] = b'a';
        assert_eq!(read_c_string(own(), start), None);
        #[allow(unsafe_code)]
        // SAFETY: the mapping made above, no longer referenced.
        unsafe {
            libc::munmap(base, 2 * page)
        };
    }

    #[test]
    fn a_name_longer_than_the_bound_is_cut_and_flagged() {
        let long = std::ffi::CString::new("k".repeat(MAX_NAME_BYTES + 100)).unwrap();
        let (name, truncated) = read_c_string(own(), long.as_ptr() as u64).unwrap();
        assert_eq!(name.len(), MAX_NAME_BYTES);
        assert!(truncated);
    }

    #[test]
    fn nothing_is_read_from_an_unmapped_address_or_a_gone_process() {
        assert_eq!(read_c_string(own(), 8), None);
        assert_eq!(read_c_string(Pid(u32::MAX - 1), 0x1000), None);
    }
}
