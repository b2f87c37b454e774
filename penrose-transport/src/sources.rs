//! Per-source admission: how many connections one source may hold open, and how fast it may
//! open new ones ([`Limits::max_connections_per_source`],
//! [`Limits::new_connections_per_source_per_second`]), so that one source cannot take every
//! connection slot or all of the handshake CPU.
//!
//! A source is an IPv4 address, or the /64 prefix of an IPv6 address (what one host usually
//! holds; IPv4-mapped IPv6 addresses count as their IPv4 address). The server consults this
//! table only for addresses QUIC has validated (a Retry round trip, [`crate::server`]): a
//! spoofed address never gets that far, so nobody can use up another host's allowance.
//!
//! The table is bounded: it holds an entry per source with a connection open (at most
//! [`Limits::max_connections`]) plus recently active ones, and when it reaches
//! [`Sources::capacity`] it forgets sources with nothing open, first those whose allowance has
//! refilled anyway (forgetting them changes nothing), then the rest (which only lets them
//! start again with a full allowance).

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::limits::Limits;

/// The key connections are counted under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum SourceKey {
    /// An IPv4 address.
    V4([u8; 4]),
    /// The first 64 bits of an IPv6 address.
    V6Prefix([u8; 8]),
}

impl SourceKey {
    pub(crate) fn of(ip: IpAddr) -> SourceKey {
        match ip {
            IpAddr::V4(v4) => SourceKey::V4(v4.octets()),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => SourceKey::V4(v4.octets()),
                None => {
                    let mut prefix = [0u8; 8];
                    prefix.copy_from_slice(&v6.octets()[..8]);
                    SourceKey::V6Prefix(prefix)
                }
            },
        }
    }
}

/// Why a source's new connection was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// It already holds [`Limits::max_connections_per_source`] connections.
    Open,
    /// It opened connections faster than [`Limits::new_connections_per_source_per_second`].
    Rate,
}

#[derive(Debug)]
struct Source {
    open: usize,
    /// Token bucket of new connections (capacity and refill rate: the per-second limit).
    tokens: f64,
    last: Instant,
}

/// The per-source table, shared by the accept loop and the connection tasks (whose
/// [`SourceGuard`] gives the connection back when it ends).
#[derive(Clone, Debug)]
pub(crate) struct Sources {
    inner: Arc<Mutex<HashMap<SourceKey, Source>>>,
    per_source: usize,
    rate: Option<f64>,
    capacity: usize,
}

impl Sources {
    pub(crate) fn new(limits: &Limits) -> Sources {
        Sources {
            inner: Arc::new(Mutex::new(HashMap::new())),
            per_source: limits.max_connections_per_source,
            rate: limits
                .new_connections_per_source_per_second
                .map(|r: NonZeroU32| f64::from(r.get())),
            capacity: Sources::capacity(limits),
        }
    }

    /// Most sources the table remembers: twice the connection limit (entries with a
    /// connection open never exceed it), at least 1,024.
    pub(crate) fn capacity(limits: &Limits) -> usize {
        limits.max_connections.saturating_mul(2).max(1024)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<SourceKey, Source>> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Admits one new connection from `ip` at `now`, or says why not. The guard gives the
    /// connection back when dropped.
    pub(crate) fn admit(&self, ip: IpAddr, now: Instant) -> Result<SourceGuard, Refusal> {
        let key = SourceKey::of(ip);
        let mut table = self.lock();
        if !table.contains_key(&key) && table.len() >= self.capacity {
            self.forget_idle(&mut table, now);
        }
        let burst = self.rate.unwrap_or(0.0);
        let source = table.entry(key).or_insert(Source {
            open: 0,
            tokens: burst,
            last: now,
        });
        if source.open >= self.per_source {
            return Err(Refusal::Open);
        }
        if let Some(rate) = self.rate {
            let elapsed = now.saturating_duration_since(source.last).as_secs_f64();
            source.tokens = (source.tokens + elapsed * rate).min(rate);
            source.last = now;
            if source.tokens < 1.0 {
                return Err(Refusal::Rate);
            }
            source.tokens -= 1.0;
        }
        source.open += 1;
        Ok(SourceGuard {
            sources: self.clone(),
            key,
        })
    }

    fn forget_idle(&self, table: &mut HashMap<SourceKey, Source>, now: Instant) {
        let rate = self.rate;
        let refilled = |s: &Source| match rate {
            None => true,
            Some(rate) => {
                s.tokens + now.saturating_duration_since(s.last).as_secs_f64() * rate >= rate
            }
        };
        table.retain(|_, s| s.open > 0 || !refilled(s));
        if table.len() >= self.capacity {
            table.retain(|_, s| s.open > 0);
        }
    }

    /// Sources remembered now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// One admitted connection of a source; dropping it gives the connection back.
#[derive(Debug)]
pub(crate) struct SourceGuard {
    sources: Sources,
    key: SourceKey,
}

impl Drop for SourceGuard {
    fn drop(&mut self) {
        let mut table = self.sources.lock();
        if let Some(source) = table.get_mut(&self.key) {
            source.open = source.open.saturating_sub(1);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};
    use std::time::Duration;

    use super::*;

    fn limits(per_source: usize, rate: u32, max_connections: usize) -> Limits {
        Limits {
            max_connections,
            max_connections_per_source: per_source,
            new_connections_per_source_per_second: NonZeroU32::new(rate),
            ..Limits::default()
        }
    }

    #[test]
    fn a_source_is_an_ipv4_address_or_an_ipv6_slash_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(SourceKey::of(a), SourceKey::of(b));
        assert_ne!(SourceKey::of(a), SourceKey::of(c));
        let mapped = IpAddr::V6(Ipv4Addr::new(192, 0, 2, 7).to_ipv6_mapped());
        assert_eq!(
            SourceKey::of(mapped),
            SourceKey::of(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)))
        );
        assert_ne!(
            SourceKey::of(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7))),
            SourceKey::of(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 8)))
        );
        assert_ne!(
            SourceKey::of(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            SourceKey::of(IpAddr::V4(Ipv4Addr::LOCALHOST))
        );
    }

    #[test]
    fn open_connections_per_source_are_capped_and_given_back() {
        let sources = Sources::new(&limits(2, 0, 100));
        let now = Instant::now();
        let one: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        let a = sources.admit(one, now).unwrap();
        let _b = sources.admit(one, now).unwrap();
        assert_eq!(sources.admit(one, now).unwrap_err(), Refusal::Open);
        let _c = sources
            .admit(other, now)
            .expect("another source is not affected");
        drop(a);
        let _d = sources
            .admit(one, now)
            .expect("a closed connection frees its place");
    }

    #[test]
    fn new_connections_per_source_are_rate_limited() {
        let sources = Sources::new(&limits(1_000, 5, 100));
        let start = Instant::now();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let mut held = Vec::new();
        for _ in 0..5 {
            held.push(sources.admit(ip, start).unwrap());
        }
        assert_eq!(sources.admit(ip, start).unwrap_err(), Refusal::Rate);
        // A refused attempt costs no token: 200 ms later exactly one more is allowed.
        let later = start + Duration::from_millis(200);
        held.push(sources.admit(ip, later).unwrap());
        assert_eq!(sources.admit(ip, later).unwrap_err(), Refusal::Rate);
        let much_later = start + Duration::from_secs(10);
        for _ in 0..5 {
            held.push(sources.admit(ip, much_later).unwrap());
        }
        assert_eq!(
            sources.admit(ip, much_later).unwrap_err(),
            Refusal::Rate,
            "the burst is capped at one second's worth"
        );
    }

    #[test]
    fn the_table_stays_bounded_under_many_sources() {
        let l = limits(4, 10, 10);
        let capacity = Sources::capacity(&l);
        let sources = Sources::new(&l);
        let now = Instant::now();
        // Ten sources keep a connection open; a hundred thousand others come and go.
        let held: Vec<_> = (0..10u32)
            .map(|i| {
                sources
                    .admit(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)), now)
                    .unwrap()
            })
            .collect();
        for i in 0..100_000u32 {
            let ip = IpAddr::V4(Ipv4Addr::from(0x0b00_0000 + i));
            drop(sources.admit(ip, now).unwrap());
            assert!(sources.len() <= capacity, "{} > {capacity}", sources.len());
        }
        // The sources with a connection open were never forgotten.
        for guard in &held {
            let table = sources.lock();
            assert_eq!(table.get(&guard.key).map(|s| s.open), Some(1));
        }
    }
}
