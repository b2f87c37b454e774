//! Every issuer key, derived from the master seed per (day, counter): token epochs are days
//! (`penrose_core::wire::Day`), scopes are the counter ids of the current catalogue. Nothing
//! rotates by hand: a new day's keys exist as soon as the day does, the same on every machine
//! that holds the seed.
//!
//! - The **published key set** ([`Published`]) holds the public keys of the days from
//!   `today - before` to `today + after` (2 and 2 by default) for every counter: one set for
//!   everybody, so that clients cannot be told apart by key, and a set that grew per client
//!   would be visible to anyone comparing [`KeySet::digest`]s.
//! - **Key rings** ([`key_ring`]) hold the secret keys of a range of days, for the aggregation
//!   server that verifies tokens (`penrose-issuer export-keys`); export ahead of time.

use std::sync::{Arc, Mutex};

use penrose_core::counters::Catalogue;
use penrose_core::tokens::{IssuerKey, KeyRing, KeySet, MAX_KEY_SET, TokenEpoch, TokenScope};
use penrose_core::wire::Day;

use crate::error::IssuerError;
use crate::seed::MasterSeed;

/// The scopes tokens are issued for: every id a report of the current catalogue may carry
/// (each counter and each joint view: the agent's cap of T reports applies to each).
pub fn scopes() -> Vec<TokenScope> {
    Catalogue::current()
        .report_ids()
        .map(|id| TokenScope(id.0))
        .collect()
}

/// The secret keys of every day from `from` to `to` (inclusive) and every scope.
pub fn keys(seed: &MasterSeed, from: Day, to: Day) -> Result<Vec<IssuerKey>, IssuerError> {
    let scopes = scopes();
    let days = u64::from(to.0.saturating_sub(from.0)) + 1;
    if to < from || days * scopes.len() as u64 > MAX_KEY_SET as u64 {
        return Err(IssuerError::Config(format!(
            "a key range runs from a day to the same or a later one, at most {} days ({} keys \
             of {} counters); asked for days {} to {}",
            MAX_KEY_SET / scopes.len().max(1),
            MAX_KEY_SET,
            scopes.len(),
            from.0,
            to.0
        )));
    }
    let mut keys = Vec::with_capacity(days as usize * scopes.len());
    for day in from.0..=to.0 {
        for &scope in &scopes {
            keys.push(seed.key(TokenEpoch(day), scope)?);
        }
    }
    Ok(keys)
}

/// The key ring of days `from` to `to` for the aggregation server.
pub fn key_ring(seed: &MasterSeed, from: Day, to: Day) -> Result<KeyRing, IssuerError> {
    Ok(KeyRing::new(keys(seed, from, to)?)?)
}

/// Which days the published set holds around today.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublishWindow {
    /// Days before today.
    pub before: u32,
    /// Days after today.
    pub after: u32,
}

impl Default for PublishWindow {
    fn default() -> Self {
        PublishWindow {
            before: 2,
            after: 2,
        }
    }
}

impl PublishWindow {
    /// The first and last day published on `today`.
    pub fn range(self, today: Day) -> (Day, Day) {
        (
            Day(today.0.saturating_sub(self.before)),
            Day(today.0.saturating_add(self.after)),
        )
    }
}

/// The key set published on one day, with the secret keys behind it.
#[derive(Debug)]
pub struct Published {
    /// The day it was made for.
    pub day: Day,
    /// The public set.
    pub set: KeySet,
    /// Its encoding (what the issuer answers a key set request with).
    pub encoded: Vec<u8>,
    keys: KeyRing,
}

impl Published {
    /// The set of `today` under `window`.
    pub fn of(seed: &MasterSeed, window: PublishWindow, today: Day) -> Result<Self, IssuerError> {
        let (from, to) = window.range(today);
        let keys = key_ring(seed, from, to)?;
        let set = keys.key_set();
        let encoded = set.encode();
        Ok(Published {
            day: today,
            set,
            encoded,
            keys,
        })
    }

    /// The secret key of an (epoch, scope) the set holds.
    pub fn key(&self, epoch: TokenEpoch, scope: TokenScope) -> Option<&IssuerKey> {
        self.keys.get(epoch, scope)
    }
}

/// The published set of the current day, remade when the day changes.
#[derive(Debug)]
pub struct Keys {
    seed: MasterSeed,
    window: PublishWindow,
    current: Mutex<Option<Arc<Published>>>,
}

impl Keys {
    /// Keys derived from `seed`, published over `window`.
    pub fn new(seed: MasterSeed, window: PublishWindow) -> Self {
        Keys {
            seed,
            window,
            current: Mutex::new(None),
        }
    }

    /// The set published on `today`.
    pub fn published(&self, today: Day) -> Result<Arc<Published>, IssuerError> {
        let mut current = self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(published) = current.as_ref()
            && published.day == today
        {
            return Ok(Arc::clone(published));
        }
        let published = Arc::new(Published::of(&self.seed, self.window, today)?);
        *current = Some(Arc::clone(&published));
        Ok(published)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_published_set_covers_the_window_and_every_counter_and_matches_the_ring() {
        let seed = MasterSeed::from_bytes([3; 32]);
        let published = Published::of(&seed, PublishWindow::default(), Day(20_000)).unwrap();
        let epochs: Vec<u32> = published.set.epochs().map(|e| e.0).collect();
        assert_eq!(epochs, (19_998..=20_002).collect::<Vec<_>>());
        assert_eq!(scopes().len(), Catalogue::current().report_ids().count());
        assert_eq!(published.set.entries().len(), 5 * scopes().len());
        let ring = key_ring(&seed, Day(19_990), Day(20_010)).unwrap();
        for entry in published.set.entries() {
            let key = ring.get(entry.epoch(), entry.scope()).unwrap();
            assert_eq!(key.key_id(), entry.key_id());
        }
        // Another seed, other keys.
        let other = Published::of(
            &MasterSeed::from_bytes([4; 32]),
            PublishWindow::default(),
            Day(20_000),
        )
        .unwrap();
        assert_ne!(other.set.digest(), published.set.digest());
        assert!(key_ring(&seed, Day(5), Day(4)).is_err());
        assert!(key_ring(&seed, Day(0), Day(100_000)).is_err());
    }
}
