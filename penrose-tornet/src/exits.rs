//! Which connections came through Tor: a server on 127.0.0.1 asks which exit made a TCP
//! connection it accepted.
//!
//! tor binds its exit connections to `OutboundBindAddressExit` only when the destination is
//! not loopback (`connection_connect` in tor's `connection.c` skips the bind for 127.0.0.0/8
//! and ::1), so on a loopback network every exit connection comes from 127.0.0.1 like
//! everything else. What does tell them apart is who owns the far end of the connection: the
//! server's peer address is the local address of a socket in one exit's process. This looks
//! it up in `/proc`: the socket's inode in the namespace's TCP table, then the exits' open
//! descriptors.

use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

use crate::error::TorNetError;

/// The exits' process ids at one moment, to ask about connections from another task or
/// thread. Take a new one after [`crate::TorNetwork::restart`]: the exits' pids change.
#[derive(Debug, Clone)]
pub struct ExitFinder {
    /// (nickname, pid) of each running exit.
    pub(crate) exits: Vec<(String, u32)>,
}

impl ExitFinder {
    /// The nickname of the exit whose process holds the other end of the connection from
    /// `peer` to `server` (as the accepting server sees it: its peer, and its own local
    /// address); `None` when no exit does, i.e. the connection did not come out of this Tor
    /// network. Ask while the connection is open (at accept, say): once closed, its socket is
    /// gone.
    ///
    /// # Errors
    /// [`TorNetError::Io`] when the namespace's TCP table cannot be read.
    pub fn exit_of(
        &self,
        peer: SocketAddr,
        server: SocketAddr,
    ) -> Result<Option<&str>, TorNetError> {
        Ok(match self.holder_of(peer, server)? {
            Holder::Exit(nickname) => Some(nickname),
            Holder::Other | Holder::Gone => None,
        })
    }

    /// Who holds the far end of the connection from `peer` to `server`: an exit (by
    /// nickname), some other process, or nobody any more (the socket is closed or orphaned,
    /// so the question came too late to answer). The socket is found by both its ends: the
    /// kernel gives one local port to several connections that go to different places (an
    /// exit's port to the server may also be another process's port to a relay).
    ///
    /// # Errors
    /// [`TorNetError::Io`] when the namespace's TCP table cannot be read.
    pub fn holder_of(
        &self,
        peer: SocketAddr,
        server: SocketAddr,
    ) -> Result<Holder<'_>, TorNetError> {
        let Some(inode) = socket_inode(peer, server)? else {
            return Ok(Holder::Gone);
        };
        let wanted = format!("socket:[{inode}]");
        for (nickname, pid) in &self.exits {
            if process_holds(*pid, &wanted) {
                return Ok(Holder::Exit(nickname));
            }
        }
        // An exit that closed the socket between the two reads would look like another
        // process: only a socket still there is held by one.
        if socket_inode(peer, server)? == Some(inode) {
            Ok(Holder::Other)
        } else {
            Ok(Holder::Gone)
        }
    }
}

/// The TCP connections established now to one of `ports` on this thread's namespace's IPv4
/// addresses, as (the server's address, the peer's): what a test server has open, to ask
/// [`ExitFinder::holder_of`] about.
///
/// # Errors
/// [`TorNetError::Io`] when the namespace's TCP table cannot be read.
pub fn connections_to(ports: &[u16]) -> Result<Vec<(SocketAddr, SocketAddr)>, TorNetError> {
    Ok(tcp_table("/proc/thread-self/net/tcp")?
        .into_iter()
        // 01 is ESTABLISHED.
        .filter(|s| s.state == 0x01 && ports.contains(&s.local.port()))
        .map(|s| (s.local, s.remote))
        .collect())
}

/// One line of `/proc/net/tcp{,6}`.
struct TcpSocket {
    local: SocketAddr,
    remote: SocketAddr,
    state: u8,
    inode: u64,
}

fn tcp_table(path: &str) -> Result<Vec<TcpSocket>, TorNetError> {
    let text = fs::read_to_string(path).map_err(|source| TorNetError::Io {
        path: path.into(),
        source,
    })?;
    Ok(text
        .lines()
        .skip(1)
        .filter_map(|line| {
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            let fields: Vec<&str> = line.split_ascii_whitespace().collect();
            Some(TcpSocket {
                local: parse_proc_addr(fields.get(1)?)?,
                remote: parse_proc_addr(fields.get(2)?)?,
                state: u8::from_str_radix(fields.get(3)?, 16).ok()?,
                inode: fields.get(9)?.parse().ok()?,
            })
        })
        .collect())
}

/// Who holds the far end of a connection ([`ExitFinder::holder_of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder<'a> {
    /// The exit of this nickname.
    Exit(&'a str),
    /// A live socket that no exit holds: the connection did not come out of this network.
    Other,
    /// No live socket has that address any more.
    Gone,
}

/// The inode of the TCP socket in this thread's namespace whose local address is `local` and
/// whose remote address is `remote` (any state but LISTEN).
fn socket_inode(local: SocketAddr, remote: SocketAddr) -> Result<Option<u64>, TorNetError> {
    let table = match local.ip() {
        IpAddr::V4(_) => "/proc/thread-self/net/tcp",
        IpAddr::V6(_) => "/proc/thread-self/net/tcp6",
    };
    // 0A is LISTEN; an inode of 0 is a socket no process holds any more.
    Ok(tcp_table(table)?
        .into_iter()
        .find(|s| s.local == local && s.remote == remote && s.state != 0x0A && s.inode != 0)
        .map(|s| s.inode))
}

/// An address as `/proc/net/tcp{,6}` writes it: the address's bytes as native-endian 32-bit
/// words in hex, a colon, the port in hex.
fn parse_proc_addr(text: &str) -> Option<SocketAddr> {
    let (addr, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let hex = addr.get(i * 8..i * 8 + 8)?;
        Some(u32::from_str_radix(hex, 16).ok()?.to_ne_bytes())
    };
    let ip = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for (i, chunk) in bytes.chunks_exact_mut(4).enumerate() {
                chunk.copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Whether a process has a descriptor open on `target` (`socket:[inode]`).
fn process_holds(pid: u32, target: &str) -> bool {
    let fds = Path::new("/proc").join(pid.to_string()).join("fd");
    let Ok(entries) = fs::read_dir(fds) else {
        return false;
    };
    entries
        .flatten()
        .any(|entry| fs::read_link(entry.path()).is_ok_and(|link| link.as_os_str() == target))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn proc_addresses_parse() {
        let v4 = parse_proc_addr("0100007F:1F90").unwrap();
        if cfg!(target_endian = "little") {
            assert_eq!(v4, "127.0.0.1:8080".parse().unwrap());
        }
        assert!(parse_proc_addr("zz:1").is_none());
    }

    #[test]
    fn a_connection_of_ours_is_found_and_attributed() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap();
        let client = TcpStream::connect(server).unwrap();
        let (_server_side, peer) = listener.accept().unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        let mine = ExitFinder {
            exits: vec![("me".into(), std::process::id())],
        };
        assert_eq!(mine.exit_of(peer, server).unwrap(), Some("me"));
        assert!(
            connections_to(&[server.port()])
                .unwrap()
                .contains(&(server, peer))
        );
        // PID 1 is not us and holds no socket of this test.
        let other = ExitFinder {
            exits: vec![("init".into(), 1)],
        };
        assert_eq!(other.exit_of(peer, server).unwrap(), None);
        assert_eq!(other.holder_of(peer, server).unwrap(), Holder::Other);
        // The same local port towards another server is another connection.
        let elsewhere = TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(
            mine.holder_of(peer, elsewhere.local_addr().unwrap())
                .unwrap(),
            Holder::Gone
        );
        drop(client);
        drop(_server_side);
        // Both ends closed: the peer's socket is gone (or orphaned in a closing state).
        assert_eq!(mine.holder_of(peer, server).unwrap(), Holder::Gone);
    }
}
