//! The token store: the agent's unspent admission tokens and the issuer's key set as it was
//! seen, in `<state_dir>/tokens/` (issue 11; the cryptography is `penrose_core::tokens`).
//!
//! - One file per (epoch, scope), `<epoch>-<scope>.tokens`: the tokens not yet spent, and those
//!   *in flight*, each bound to the one report it was attached to until the server's ack says
//!   what became of it. A report keeps its token across retries and restarts (the same token
//!   on the same report gives the same redemption), and a token is never attached to a second
//!   report: the server would see one nonce on two reports and know they came from one agent.
//! - `keys.set`: the published key set as first seen, for the partition check: an (epoch,
//!   scope)'s key never changes once seen ([`TokenStore::merged_key_set`]).
//!
//! Tokens are bearer secrets: every file is written with the agent's state-file rules (mode
//! 0600, `O_NOFOLLOW`, temporary file, sync, rename, directory sync), and one that another user
//! could read (group or others have any access, another owner) or a symbolic link where a file
//! belongs is refused at open ([`TokenStoreError::Unsafe`]). A file whose contents do not
//! parse (a damaged disk) is removed with a warning: its reports wait for new tokens. Nothing
//! here prints a token; [`TokenStore::counts`] is what `status` and `inspect` show.
//!
//! The store is bounded: [`TokenStore::prune`] drops the unspent tokens of epochs the
//! aggregation server no longer accepts (before yesterday) and the in-flight tokens of
//! reports that left the spool; the fetcher asks for at most the issuer's quota per (epoch,
//! scope).
//!
//! File format (integers big-endian):
//!
//! ```text
//! version:u8(=1) epoch:u32 scope:u16 unspent:u16 in_flight:u16
//!   token:[132] * unspent  (report_id:[16] token:[132]) * in_flight
//! ```

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use penrose_core::tokens::{
    KeyEntry, KeySet, TOKEN_BYTES, Token, TokenEpoch, TokenKeyId, TokenScope,
};
use penrose_core::wire::{Day, ReportId};
use penrose_host::FileError;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::spool::{SpoolError, create_private_dir, sync_dir};

/// The store's folder inside the state directory.
pub const TOKEN_DIR: &str = "tokens";
const SUFFIX: &str = ".tokens";
const KEY_SET_FILE: &str = "keys.set";
const TEMP_PREFIX: &str = ".tmp-";
const FILE_VERSION: u8 = 1;
const HEADER_BYTES: usize = 1 + 4 + 2 + 2 + 2;
const IN_FLIGHT_BYTES: usize = 16 + TOKEN_BYTES;
/// Most tokens one file may hold: far above any quota, it bounds what a damaged file can make
/// the agent allocate.
const MAX_FILE_TOKENS: usize = 4096;
/// Largest key set file read (a full set of `penrose_core::tokens::MAX_KEY_SET` keys).
const MAX_KEY_SET_FILE: u64 = 3 + 38 * 4096;

/// Why the token store refused.
#[derive(Debug, Error)]
pub enum TokenStoreError {
    /// A file was not read or written.
    #[error("token store {0}")]
    File(#[from] penrose_host::FileError),
    /// A file another user could read or replace, a symbolic link where a file belongs, or a
    /// file larger than any token file: [`penrose_host::secret_file::read`] says which.
    #[error("token store: {0}; refusing to use it")]
    Unsafe(FileError),
    /// The folder itself (see [`create_private_dir`]).
    #[error(transparent)]
    Dir(#[from] SpoolError),
}

impl TokenStoreError {
    /// A refusal of the secret-file reader: its I/O errors as such, the rest as unsafe.
    fn from_secret(e: FileError) -> Self {
        match e {
            e @ FileError::Io { .. } => TokenStoreError::File(e),
            e => TokenStoreError::Unsafe(e),
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TokenStoreError + '_ {
    move |source| {
        TokenStoreError::File(penrose_host::FileError::Io {
            path: path.to_owned(),
            source,
        })
    }
}

/// A key set that contradicts the one seen before: the issuer showing this agent keys other
/// agents do not get would let it tell their tokens apart (a partition attempt).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum KeySetConflict {
    /// An (epoch, scope)'s key changed.
    #[error("the key of epoch {epoch}, scope {scope} changed from {seen} to {now}")]
    Changed {
        /// The epoch.
        epoch: TokenEpoch,
        /// The scope.
        scope: TokenScope,
        /// The key id seen before.
        seen: TokenKeyId,
        /// The key id offered now.
        now: TokenKeyId,
    },
    /// One key offered for two (epoch, scope) pairs across the old and the new set.
    #[error("one key is offered for two (epoch, scope) pairs")]
    Reused,
}

/// Tokens of one (epoch, scope), for `status` and `inspect`: counts only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenCount {
    /// The epoch (the day of the reports they admit).
    pub epoch: u32,
    /// The scope (the counter of the reports they admit).
    pub scope: u16,
    /// Tokens not attached to any report.
    pub unspent: u32,
    /// Tokens attached to a report whose ack has not come yet.
    pub in_flight: u32,
}

/// What a prune removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Unspent tokens of epochs the server no longer accepts.
    pub expired: u64,
    /// In-flight tokens whose report left the spool (dropped for room, or moved aside).
    pub orphaned: u64,
}

#[derive(Clone, Default)]
struct Slot {
    unspent: Vec<Token>,
    in_flight: Vec<(ReportId, Token)>,
}

impl Slot {
    fn is_empty(&self) -> bool {
        self.unspent.is_empty() && self.in_flight.is_empty()
    }

    fn encode(&self, epoch: TokenEpoch, scope: TokenScope) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            HEADER_BYTES
                + TOKEN_BYTES * self.unspent.len()
                + IN_FLIGHT_BYTES * self.in_flight.len(),
        );
        out.push(FILE_VERSION);
        out.extend_from_slice(&epoch.0.to_be_bytes());
        out.extend_from_slice(&scope.0.to_be_bytes());
        // Both bounded by MAX_FILE_TOKENS (`add` refuses more).
        out.extend_from_slice(&(self.unspent.len() as u16).to_be_bytes());
        out.extend_from_slice(&(self.in_flight.len() as u16).to_be_bytes());
        for token in &self.unspent {
            out.extend_from_slice(&token.to_bytes());
        }
        for (report, token) in &self.in_flight {
            out.extend_from_slice(&report.0);
            out.extend_from_slice(&token.to_bytes());
        }
        out
    }

    /// Decodes a file of (`epoch`, `scope`); `None` for anything else.
    fn decode(bytes: &[u8], epoch: TokenEpoch, scope: TokenScope) -> Option<Slot> {
        let (header, mut rest) = bytes.split_first_chunk::<HEADER_BYTES>()?;
        let [version, e0, e1, e2, e3, s0, s1, u0, u1, f0, f1] = *header;
        let unspent = usize::from(u16::from_be_bytes([u0, u1]));
        let in_flight = usize::from(u16::from_be_bytes([f0, f1]));
        if version != FILE_VERSION
            || TokenEpoch(u32::from_be_bytes([e0, e1, e2, e3])) != epoch
            || TokenScope(u16::from_be_bytes([s0, s1])) != scope
            || unspent + in_flight > MAX_FILE_TOKENS
            || rest.len() != TOKEN_BYTES * unspent + IN_FLIGHT_BYTES * in_flight
        {
            return None;
        }
        let mut slot = Slot::default();
        for _ in 0..unspent {
            let (token, tail) = rest.split_at(TOKEN_BYTES);
            let token = Token::from_bytes(token).ok()?;
            (token.epoch() == epoch).then_some(())?;
            slot.unspent.push(token);
            rest = tail;
        }
        for _ in 0..in_flight {
            let (report, tail) = rest.split_first_chunk::<16>()?;
            let (token, tail) = tail.split_at(TOKEN_BYTES);
            let token = Token::from_bytes(token).ok()?;
            (token.epoch() == epoch).then_some(())?;
            slot.in_flight.push((ReportId(*report), token));
            rest = tail;
        }
        Some(slot)
    }
}

/// The agent's admission tokens and the key set it has seen (module docs).
#[derive(Debug)]
pub struct TokenStore {
    dir: PathBuf,
    slots: BTreeMap<(TokenEpoch, TokenScope), Slot>,
    key_set: Option<KeySet>,
    generation: u64,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Slot({} unspent, {} in flight)",
            self.unspent.len(),
            self.in_flight.len()
        )
    }
}

/// The store's folder in a state directory.
pub fn token_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(TOKEN_DIR)
}

/// The evidence token store's directory under the agent's state directory.
pub fn evidence_token_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("evidence-tokens")
}

impl TokenStore {
    /// Opens (creating, 0700) the store in `dir` and loads it: removes temporary files a crash
    /// left and files that do not parse (warning), and refuses files others could read or
    /// replace and symbolic links.
    pub fn open(dir: &Path) -> Result<Self, TokenStoreError> {
        create_private_dir(dir)?;
        let (slots, key_set) = load(dir, true)?;
        Ok(Self {
            dir: dir.to_owned(),
            slots,
            key_set,
            generation: 0,
        })
    }

    /// Its folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A number that changes whenever tokens are added or removed (the uploader looks again
    /// at reports that waited for tokens when it moves).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Tokens per (epoch, scope), oldest epoch first.
    pub fn counts(&self) -> Vec<TokenCount> {
        counts_of(&self.slots)
    }

    /// Unspent tokens of (`epoch`, `scope`).
    pub fn unspent(&self, epoch: TokenEpoch, scope: TokenScope) -> usize {
        self.slots
            .get(&(epoch, scope))
            .map_or(0, |slot| slot.unspent.len())
    }

    /// Whether any scope has an unspent token of `epoch`.
    pub fn has_unspent_for(&self, epoch: TokenEpoch) -> bool {
        self.slots
            .range((epoch, TokenScope(0))..=(epoch, TokenScope(u16::MAX)))
            .any(|(_, slot)| !slot.unspent.is_empty())
    }

    /// The token attached to `report`, with its (epoch, scope), if one is.
    pub fn in_flight_for(&self, report: &ReportId) -> Option<(TokenEpoch, TokenScope, Token)> {
        self.slots.iter().find_map(|(&(epoch, scope), slot)| {
            slot.in_flight
                .iter()
                .find(|(id, _)| id == report)
                .map(|(_, token)| (epoch, scope, token.clone()))
        })
    }

    /// Attaches an unspent token of (`epoch`, `scope`) to `report`, durably, and returns it;
    /// `None` when there is none. A report that already has a token gets that one back.
    pub fn reserve(
        &mut self,
        epoch: TokenEpoch,
        scope: TokenScope,
        report: ReportId,
    ) -> Result<Option<Token>, TokenStoreError> {
        if let Some((e, s, token)) = self.in_flight_for(&report)
            && (e, s) == (epoch, scope)
        {
            return Ok(Some(token));
        }
        if self.unspent(epoch, scope) == 0 {
            return Ok(None);
        }
        self.update(epoch, scope, |slot| {
            let token = slot.unspent.pop();
            if let Some(token) = &token {
                slot.in_flight.push((report, token.clone()));
            }
            token
        })
    }

    /// Removes the token attached to `report`, durably: the server took the report (the
    /// token is spent) or refused the token, or the report is gone. Whether there was one.
    pub fn forget_in_flight(&mut self, report: &ReportId) -> Result<bool, TokenStoreError> {
        let Some((epoch, scope, _)) = self.in_flight_for(report) else {
            return Ok(false);
        };
        self.update(epoch, scope, |slot| {
            slot.in_flight.retain(|(id, _)| id != report);
        })?;
        Ok(true)
    }

    /// Adds freshly issued tokens of (`epoch`, `scope`), durably. Tokens of another epoch are
    /// not taken; a file is never made to hold more than a bound far above any quota.
    pub fn add(
        &mut self,
        epoch: TokenEpoch,
        scope: TokenScope,
        tokens: Vec<Token>,
    ) -> Result<usize, TokenStoreError> {
        let held = self
            .slots
            .get(&(epoch, scope))
            .map_or(0, |s| s.unspent.len() + s.in_flight.len());
        let room = MAX_FILE_TOKENS.saturating_sub(held);
        let tokens: Vec<Token> = tokens
            .into_iter()
            .filter(|t| t.epoch() == epoch)
            .take(room)
            .collect();
        let n = tokens.len();
        if n > 0 {
            self.update(epoch, scope, |slot| slot.unspent.extend(tokens))?;
        }
        Ok(n)
    }

    /// Drops the unspent tokens of epochs before yesterday (the aggregation server accepts a
    /// report's day within one day of its own, and a token's epoch must be the report's day),
    /// the in-flight tokens of reports no longer in `spooled`, and the key set's entries of
    /// epochs before yesterday. In-flight tokens of a spooled report stay, whatever their
    /// epoch: the report keeps its day once sent, and its token with it.
    pub fn prune(
        &mut self,
        today: Day,
        spooled: &HashSet<ReportId>,
    ) -> Result<Pruned, TokenStoreError> {
        let oldest = TokenEpoch(today.0.saturating_sub(1));
        let mut pruned = Pruned::default();
        let keys: Vec<_> = self.slots.keys().copied().collect();
        for (epoch, scope) in keys {
            let Some(slot) = self.slots.get(&(epoch, scope)) else {
                continue;
            };
            let expired = if epoch < oldest {
                slot.unspent.len()
            } else {
                0
            };
            let orphaned = slot
                .in_flight
                .iter()
                .filter(|(id, _)| !spooled.contains(id))
                .count();
            if expired + orphaned == 0 {
                continue;
            }
            self.update(epoch, scope, |slot| {
                if epoch < oldest {
                    slot.unspent.clear();
                }
                slot.in_flight.retain(|(id, _)| spooled.contains(id));
            })?;
            pruned.expired += expired as u64;
            pruned.orphaned += orphaned as u64;
        }
        if let Some(set) = &self.key_set
            && set.entries().iter().any(|e| e.epoch() < oldest)
        {
            let kept = set
                .entries()
                .iter()
                .filter(|e| e.epoch() >= oldest)
                .cloned()
                .collect::<Vec<_>>();
            let kept = if kept.is_empty() {
                None
            } else {
                KeySet::new(kept).ok()
            };
            self.set_key_set(kept)?;
        }
        Ok(pruned)
    }

    /// The key set seen so far (epochs from yesterday on).
    pub fn key_set(&self) -> Option<&KeySet> {
        self.key_set.as_ref()
    }

    /// The set to remember after the issuer published `published` on `today`: the keys seen
    /// before and the new ones, epochs from yesterday on. Refuses a set in which an (epoch,
    /// scope) seen before has another key, or one key serves two (epoch, scope) pairs
    /// ([`KeySetConflict`]): the issuer would be showing this agent keys of its own.
    pub fn merged_key_set(
        &self,
        published: &KeySet,
        today: Day,
    ) -> Result<Option<KeySet>, KeySetConflict> {
        let oldest = TokenEpoch(today.0.saturating_sub(1));
        let mut merged: BTreeMap<(TokenEpoch, TokenScope), KeyEntry> = BTreeMap::new();
        if let Some(seen) = &self.key_set {
            for entry in seen.entries() {
                merged.insert(entry.name(), entry.clone());
            }
        }
        for entry in published.entries() {
            match merged.get(&entry.name()) {
                Some(seen) if seen.public_key() != entry.public_key() => {
                    return Err(KeySetConflict::Changed {
                        epoch: entry.epoch(),
                        scope: entry.scope(),
                        seen: seen.key_id(),
                        now: entry.key_id(),
                    });
                }
                Some(_) => {}
                None => {
                    merged.insert(entry.name(), entry.clone());
                }
            }
        }
        let kept: Vec<KeyEntry> = merged
            .into_values()
            .filter(|e| e.epoch() >= oldest)
            .collect();
        if kept.is_empty() {
            return Ok(None);
        }
        KeySet::new(kept)
            .map(Some)
            .map_err(|_| KeySetConflict::Reused)
    }

    /// Remembers `set` (from [`merged_key_set`](Self::merged_key_set)), durably.
    pub fn set_key_set(&mut self, set: Option<KeySet>) -> Result<(), TokenStoreError> {
        let path = self.dir.join(KEY_SET_FILE);
        match &set {
            Some(set) => replace(&path, &set.encode())?,
            None => remove(&self.dir, &path)?,
        }
        self.key_set = set;
        Ok(())
    }

    /// Changes one slot through a copy, writes it, and only then keeps it: a failed write
    /// leaves memory and disk as they were.
    fn update<R>(
        &mut self,
        epoch: TokenEpoch,
        scope: TokenScope,
        change: impl FnOnce(&mut Slot) -> R,
    ) -> Result<R, TokenStoreError> {
        let mut slot = self.slots.get(&(epoch, scope)).cloned().unwrap_or_default();
        let out = change(&mut slot);
        let path = self.dir.join(file_name(epoch, scope));
        if slot.is_empty() {
            remove(&self.dir, &path)?;
            self.slots.remove(&(epoch, scope));
        } else {
            replace(&path, &slot.encode(epoch, scope))?;
            self.slots.insert((epoch, scope), slot);
        }
        self.generation += 1;
        Ok(out)
    }
}

/// The counts of the store in `dir`, read without changing anything (for `inspect` while the
/// daemon runs); empty when there is no store.
pub fn read_counts(dir: &Path) -> Result<Vec<TokenCount>, TokenStoreError> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let (slots, _) = load(dir, false)?;
    Ok(counts_of(&slots))
}

fn counts_of(slots: &BTreeMap<(TokenEpoch, TokenScope), Slot>) -> Vec<TokenCount> {
    slots
        .iter()
        .map(|(&(epoch, scope), slot)| TokenCount {
            epoch: epoch.0,
            scope: scope.0,
            unspent: u32::try_from(slot.unspent.len()).unwrap_or(u32::MAX),
            in_flight: u32::try_from(slot.in_flight.len()).unwrap_or(u32::MAX),
        })
        .collect()
}

fn file_name(epoch: TokenEpoch, scope: TokenScope) -> String {
    format!("{}-{}{SUFFIX}", epoch.0, scope.0)
}

fn parse_file_name(name: &str) -> Option<(TokenEpoch, TokenScope)> {
    let (epoch, scope) = name.strip_suffix(SUFFIX)?.split_once('-')?;
    let canonical = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !canonical(epoch) || !canonical(scope) {
        return None;
    }
    Some((
        TokenEpoch(epoch.parse().ok()?),
        TokenScope(scope.parse().ok()?),
    ))
}

type Loaded = (BTreeMap<(TokenEpoch, TokenScope), Slot>, Option<KeySet>);

/// Reads every file of the store; with `repair`, removes temporary files and files that do
/// not parse (else skips them).
fn load(dir: &Path, repair: bool) -> Result<Loaded, TokenStoreError> {
    let mut slots = BTreeMap::new();
    let mut key_set = None;
    for item in fs::read_dir(dir).map_err(io(dir))? {
        let item = item.map_err(io(dir))?;
        let path = item.path();
        let Some(name) = item.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        // `.tmp-` named them before the shared durable writer did.
        if name.starts_with(TEMP_PREFIX) || penrose_host::durable::is_temp_name(&name) {
            if repair {
                tracing::info!("token store: removing {name}, left by an interrupted write");
                fs::remove_file(&path).map_err(io(&path))?;
            }
            continue;
        }
        let slot_name = parse_file_name(&name);
        if slot_name.is_none() && name != KEY_SET_FILE {
            tracing::warn!("token store: ignoring {name}, not a token file");
            continue;
        }
        let limit = if slot_name.is_some() {
            (HEADER_BYTES + IN_FLIGHT_BYTES * MAX_FILE_TOKENS) as u64
        } else {
            MAX_KEY_SET_FILE
        };
        let bytes = read_private(&path, limit)?;
        let parsed = match slot_name {
            Some((epoch, scope)) => Slot::decode(&bytes, epoch, scope)
                .map(|slot| {
                    slots.insert((epoch, scope), slot);
                })
                .is_some(),
            None => KeySet::decode(&bytes)
                .map(|set| key_set = Some(set))
                .is_ok(),
        };
        if !parsed {
            tracing::warn!(
                "token store: {} does not parse (a damaged disk?); {}",
                path.display(),
                if repair {
                    "removed, new tokens will be fetched"
                } else {
                    "skipped"
                }
            );
            if repair {
                remove(dir, &path)?;
            }
        }
    }
    Ok((slots, key_set))
}

/// Reads a store file with the shared secret-file reader (`penrose_host::secret_file::read`): not a
/// symbolic link, a regular file of the agent's user (or root) that neither group nor others
/// may access, at most `limit` bytes.
fn read_private(path: &Path, limit: u64) -> Result<Vec<u8>, TokenStoreError> {
    penrose_host::secret_file::read(path, limit).map_err(TokenStoreError::from_secret)
}

/// Writes `bytes` at `path` atomically, readable by the agent's user only.
fn replace(path: &Path, bytes: &[u8]) -> Result<(), TokenStoreError> {
    penrose_host::durable::replace(path, bytes, penrose_host::durable::Access::Owner)
        .map_err(TokenStoreError::from_secret)
}

fn remove(dir: &Path, path: &Path) -> Result<(), TokenStoreError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(sync_dir(dir)?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(path)(e)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::os::unix::fs::PermissionsExt;

    use penrose_core::tokens::{IssuerKey, TokenRequest};

    use super::*;

    /// `n` genuine tokens of (epoch, scope) and the key set of that key.
    pub(crate) fn issue(epoch: u32, scope: u16, n: usize) -> (Vec<Token>, KeySet) {
        let mut rng = rand::rng();
        let key =
            IssuerKey::derive(TokenEpoch(epoch), TokenScope(scope), &[scope as u8; 32]).unwrap();
        let request = TokenRequest::new(key.entry(), n, &mut rng).unwrap();
        let response = key.issue(request.request(), &mut rng).unwrap();
        let set = KeySet::of_keys([&key]).unwrap();
        (request.finalize(&response).unwrap(), set)
    }

    #[test]
    fn tokens_are_reserved_per_report_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        let mut store = TokenStore::open(&path).unwrap();
        let (e, s) = (TokenEpoch(20_000), TokenScope(3));
        let (tokens, set) = issue(e.0, s.0, 3);
        assert_eq!(store.add(e, s, tokens).unwrap(), 3);
        let report = ReportId([1; 16]);
        let first = store.reserve(e, s, report).unwrap().unwrap();
        // The same report gets the same token back; another gets another.
        assert_eq!(store.reserve(e, s, report).unwrap().unwrap(), first);
        let other = store.reserve(e, s, ReportId([2; 16])).unwrap().unwrap();
        assert_ne!(other, first);
        assert_eq!(
            store.counts(),
            vec![TokenCount {
                epoch: e.0,
                scope: s.0,
                unspent: 1,
                in_flight: 2
            }]
        );
        store
            .set_key_set(store.merged_key_set(&set, Day(e.0)).unwrap())
            .unwrap();
        drop(store);
        let mut store = TokenStore::open(&path).unwrap();
        assert_eq!(store.in_flight_for(&report).unwrap().2, first);
        assert_eq!(store.key_set(), Some(&set));
        assert!(store.forget_in_flight(&report).unwrap());
        assert!(!store.forget_in_flight(&report).unwrap());
        assert_eq!(store.unspent(e, s), 1);
        assert!(store.has_unspent_for(e) && !store.has_unspent_for(TokenEpoch(e.0 + 1)));
        // Files are the owner's alone.
        for item in fs::read_dir(&path).unwrap() {
            let mode = item.unwrap().metadata().unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "{mode:o}");
        }
        assert_eq!(read_counts(&path).unwrap(), store.counts());
        // Nothing secret in the debug form.
        let shown = format!("{store:?}");
        assert!(shown.contains("1 unspent"), "{shown}");
    }

    #[test]
    fn prune_drops_expired_unspent_tokens_and_orphans_but_keeps_a_spooled_reports_token() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = TokenStore::open(dir.path()).unwrap();
        let s = TokenScope(0);
        for day in [9, 10, 11] {
            store.add(TokenEpoch(day), s, issue(day, 0, 2).0).unwrap();
        }
        let kept = ReportId([7; 16]);
        let gone = ReportId([8; 16]);
        store.reserve(TokenEpoch(9), s, kept).unwrap().unwrap();
        store.reserve(TokenEpoch(11), s, gone).unwrap().unwrap();
        let pruned = store.prune(Day(11), &HashSet::from([kept])).unwrap();
        assert_eq!(
            pruned,
            Pruned {
                expired: 1,
                orphaned: 1
            }
        );
        let counts: Vec<_> = store
            .counts()
            .iter()
            .map(|c| (c.epoch, c.unspent, c.in_flight))
            .collect();
        assert_eq!(counts, vec![(9, 0, 1), (10, 2, 0), (11, 1, 0)]);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 3);
        store.forget_in_flight(&kept).unwrap();
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            2,
            "empty files go"
        );
    }

    #[test]
    fn a_changed_key_is_a_conflict_and_new_epochs_are_merged() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = TokenStore::open(dir.path()).unwrap();
        let (_, day10) = issue(10, 0, 1);
        store
            .set_key_set(store.merged_key_set(&day10, Day(10)).unwrap())
            .unwrap();
        let (_, day11) = issue(11, 0, 1);
        let merged = store.merged_key_set(&day11, Day(10)).unwrap().unwrap();
        assert_eq!(merged.entries().len(), 2);
        store.set_key_set(Some(merged)).unwrap();
        // The same (10, 0) under another key.
        let rogue = IssuerKey::derive(TokenEpoch(10), TokenScope(0), &[99; 32]).unwrap();
        let rogue_set = KeySet::of_keys([&rogue]).unwrap();
        let conflict = store.merged_key_set(&rogue_set, Day(10)).unwrap_err();
        assert!(
            matches!(
                conflict,
                KeySetConflict::Changed {
                    epoch: TokenEpoch(10),
                    ..
                }
            ),
            "{conflict}"
        );
        // Two days later the old epochs are forgotten.
        store.prune(Day(13), &HashSet::new()).unwrap();
        assert_eq!(store.key_set(), None);
    }

    /// A token file group or others could read, one of another owner, or a symbolic link
    /// where one belongs: the store refuses to open, naming the file; what a link points to
    /// is not read.
    #[test]
    fn unsafe_token_files_and_symlinks_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        let mut store = TokenStore::open(&path).unwrap();
        store
            .add(TokenEpoch(5), TokenScope(1), issue(5, 1, 1).0)
            .unwrap();
        drop(store);
        let file = path.join("5-1.tokens");
        fs::set_permissions(&file, fs::Permissions::from_mode(0o640)).unwrap();
        let e = TokenStore::open(&path).unwrap_err().to_string();
        assert!(e.contains("5-1.tokens") && e.contains("mode 640"), "{e}");
        assert!(read_counts(&path).is_err());
        fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
        TokenStore::open(&path).unwrap();
        let elsewhere = dir.path().join("elsewhere");
        fs::rename(&file, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &file).unwrap();
        let e = TokenStore::open(&path).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        fs::remove_file(&file).unwrap();
        // A damaged file is removed, not fatal.
        crate::spool::write_synced(&file, b"garbage").unwrap();
        let store = TokenStore::open(&path).unwrap();
        assert!(store.counts().is_empty());
        assert!(!file.exists());
    }
}
