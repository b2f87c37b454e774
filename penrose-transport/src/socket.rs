//! The server's UDP socket: bound with the receive buffer the limits ask for, and watched for
//! the datagrams the kernel drops when that buffer is full (which QUIC then sends again, late).
//!
//! quinn binds with the kernel's default buffer (208 KiB on most hosts); under the load
//! generator's bursts that dropped about one datagram in eight (docs/benchmarks.md). The drops
//! are counted by the kernel per socket and read here from `/proc/net/udp` by the socket's
//! inode, so an operator sees them on the metrics page rather than as slow acks.

use std::io;
use std::net::{SocketAddr, UdpSocket};

use tracing::warn;

/// A bound socket and what the kernel granted it.
pub(crate) struct Bound {
    pub(crate) socket: UdpSocket,
    /// Receive buffer bytes granted, in the units they were asked in.
    pub(crate) granted: usize,
    /// The socket's inode, by which `/proc/net/udp` lists its drops (Linux only).
    pub(crate) inode: Option<u64>,
}

/// Binds `listen` and asks the kernel for `asked` bytes of receive buffer. Linux stores and
/// reports twice the size it grants, capped by `net.core.rmem_max`; a grant below the ask is
/// logged with the setting to raise.
pub(crate) fn bind(listen: SocketAddr, asked: usize) -> io::Result<Bound> {
    let socket = UdpSocket::bind(listen)?;
    let sock = socket2::SockRef::from(&socket);
    sock.set_recv_buffer_size(asked)?;
    let reported = sock.recv_buffer_size()?;
    let granted = if cfg!(target_os = "linux") {
        reported / 2
    } else {
        reported
    };
    if granted < asked {
        warn!(
            asked,
            granted,
            "the kernel granted a smaller UDP receive buffer than asked; bursts of reports may \
             be dropped and sent again (raise net.core.rmem_max to at least the size asked)"
        );
    }
    let inode = inode_of(&socket);
    Ok(Bound {
        socket,
        granted,
        inode,
    })
}

#[cfg(target_os = "linux")]
fn inode_of(socket: &UdpSocket) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let link = std::fs::read_link(format!("/proc/self/fd/{}", socket.as_raw_fd())).ok()?;
    let link = link.to_str()?;
    link.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

#[cfg(not(target_os = "linux"))]
fn inode_of(_socket: &UdpSocket) -> Option<u64> {
    None
}

/// Datagrams the kernel dropped at the socket with `inode` (full receive buffer, or memory
/// pressure) since it was bound; `None` where the system does not say.
pub(crate) fn drops(inode: u64) -> Option<u64> {
    ["/proc/net/udp", "/proc/net/udp6"].iter().find_map(|path| {
        let table = std::fs::read_to_string(path).ok()?;
        drops_in(&table, inode)
    })
}

/// The `drops` column of the row of `inode` in a `/proc/net/udp` table: the tenth column is the
/// inode, the last the drops.
fn drops_in(table: &str, inode: u64) -> Option<u64> {
    table.lines().skip(1).find_map(|line| {
        let columns: Vec<&str> = line.split_whitespace().collect();
        let row_inode: u64 = columns.get(9)?.parse().ok()?;
        (row_inode == inode).then(|| columns.last()?.parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
 1024: 0100007F:A2BE 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 918273 2 0000000000000000 8829
 1025: 0100007F:B96C 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 918274 2 0000000000000000 0
";

    #[test]
    fn drops_are_read_from_the_row_of_the_inode() {
        assert_eq!(drops_in(TABLE, 918273), Some(8829));
        assert_eq!(drops_in(TABLE, 918274), Some(0));
        assert_eq!(drops_in(TABLE, 1), None);
        assert_eq!(drops_in("header only\n", 918273), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_bound_socket_is_found_by_its_inode_with_no_drops() {
        let bound = bind("127.0.0.1:0".parse().unwrap(), 1 << 20).unwrap();
        let inode = bound.inode.expect("a socket's inode on Linux");
        assert_eq!(drops(inode), Some(0));
        assert!(bound.granted > 0);
    }
}
