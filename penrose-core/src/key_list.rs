//! The design server's signed key list: which Paillier key encrypts the reports of which day,
//! so that the key can be replaced without stopping the fleet or losing a report.
//!
//! ```text
//! list    = "PNKL"  version:u8  sequence:u64be  grace_days:u8  count:u8  key * count
//!           signature:[64]                     (ed25519 over everything before it)
//! key     = from_day:u32be  length:u16be  public_key:[length]
//! ```
//!
//! **Who signs.** The design server, with a signing key of its own that agents and the
//! aggregation server pin (`penrose-design key-list`). The aggregation server only passes the
//! list on: it cannot put a key of its own into it, so it cannot make agents encrypt under a
//! key it holds the private half of, which would let it read single reports.
//!
//! **The schedule.** Keys are listed by strictly increasing first day; the key of day `d` is
//! the last one whose first day is at or before `d`. A report of day `d` is accepted under the
//! key of day `d`, or under the key before it while `d` is less than `grace_days` after the
//! new key's first day: an agent that has not yet learned the new key keeps reporting for that
//! long. Older keys stay in the list while their days' reports may still arrive; sums never
//! mix keys (the aggregation server keeps one accumulator per key).
//!
//! **Rollback.** `sequence` grows with every list the design server signs; a holder refuses a
//! list older than the one it has, so an old list cannot be replayed to bring back a retired
//! key, and a list with the held one's sequence but other contents (a fork of the signed
//! history: two lists signed under one number) instead of taking the later-seen one.
//!
//! **What it reveals, and the limit.** Every agent should hold the same list. A key holder
//! that signed a different list for each agent (or the aggregation server choosing which of
//! several signed lists to hand out) would make reports linkable by their key id. Agents
//! bound this: a list holds at most [`MAX_KEYS`] keys, and docs/threat-model.md ("Key
//! rollover") says what is and is not tested.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use thiserror::Error;

use crate::paillier::{KeyId, PaillierError, PublicKey};
use crate::wire::Day;

/// The list's tag.
pub const MAGIC: &[u8; 4] = b"PNKL";
/// The format version this build writes and reads.
pub const VERSION: u8 = 1;
/// Most keys one list holds: the current one, the one before it (grace), one announced.
pub const MAX_KEYS: usize = 4;
/// Days a replaced key is still accepted for, by default.
pub const DEFAULT_GRACE_DAYS: u8 = 2;
/// Largest encoded list read (four 4096-bit public keys and the rest fit in a quarter of it).
pub const MAX_LIST_BYTES: usize = 16 * 1024;
const SIGNATURE_BYTES: usize = 64;
/// Largest list-signing public key file read (one line of hex and a comment).
pub const MAX_SIGNER_FILE: u64 = 4096;

/// The list-signing public key as its file holds it: a comment line, then 64 hex digits.
/// Written by the design server, pinned by the aggregation server and the agents.
pub fn signer_text(signer: &VerifyingKey) -> String {
    format!(
        "# Penrose design server: the key its key lists are signed with (pin it)\n{}\n",
        crate::hex::encode(signer.as_bytes())
    )
}

/// Reads [`signer_text`]'s form back: the first line that is neither empty nor a `#`
/// comment must be 64 hex digits naming an ed25519 key.
pub fn parse_signer(text: &str) -> Option<VerifyingKey> {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))?;
    VerifyingKey::from_bytes(&crate::hex::decode_array::<32>(line)?).ok()
}

/// One key and the first day it encrypts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledKey {
    /// The first report day encrypted under it.
    pub from: Day,
    /// The design server's public key.
    pub key: PublicKey,
}

/// A verified (or about to be signed) key list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyList {
    sequence: u64,
    grace_days: u8,
    keys: Vec<ScheduledKey>,
}

/// Why a key list was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum KeyListError {
    /// Not a key list.
    #[error("not a Penrose key list (bad magic)")]
    BadMagic,
    /// Another format version.
    #[error("unsupported key list version {0} (this build reads {VERSION})")]
    UnsupportedVersion(u8),
    /// The bytes end before a field.
    #[error("key list truncated while reading {0}")]
    Truncated(&'static str),
    /// Bytes after the signature's place, or a list over [`MAX_LIST_BYTES`].
    #[error("key list of {0} bytes has the wrong length")]
    Length(usize),
    /// No keys, or more than [`MAX_KEYS`].
    #[error("a key list holds 1 to {MAX_KEYS} keys, this one {0}")]
    KeyCount(usize),
    /// First days not strictly increasing.
    #[error("key list days must strictly increase (day {0} follows day {1})")]
    Order(u32, u32),
    /// The same key twice.
    #[error("key {0} is listed twice")]
    Duplicate(KeyId),
    /// A listed key does not parse.
    #[error("key {index}: {source}")]
    Key {
        /// Which key.
        index: usize,
        /// Why.
        source: PaillierError,
    },
    /// The signature does not verify under the pinned signing key.
    #[error("the key list's signature does not verify under the pinned signing key")]
    BadSignature,
    /// The sequence of the list already held, with other contents: two lists signed under
    /// one number, a fork of the signer's history (a compromised or misused signing key) that
    /// no agent or server follows.
    #[error(
        "key list {sequence} differs from the list {sequence} already held: a fork of the signed history, refused"
    )]
    Fork {
        /// The sequence both lists carry.
        sequence: u64,
    },
    /// Older than the list already held.
    #[error("key list {offered} is older than list {held}, which is already held")]
    Rollback {
        /// The offered list's sequence.
        offered: u64,
        /// The held list's sequence.
        held: u64,
    },
}

impl KeyList {
    /// A list to sign: keys by strictly increasing first day, 1 to [`MAX_KEYS`] of them,
    /// each once.
    pub fn new(
        sequence: u64,
        grace_days: u8,
        keys: Vec<ScheduledKey>,
    ) -> Result<Self, KeyListError> {
        if keys.is_empty() || keys.len() > MAX_KEYS {
            return Err(KeyListError::KeyCount(keys.len()));
        }
        for pair in keys.windows(2) {
            if pair[1].from <= pair[0].from {
                return Err(KeyListError::Order(pair[1].from.0, pair[0].from.0));
            }
        }
        for (i, k) in keys.iter().enumerate() {
            if keys[..i].iter().any(|o| o.key.key_id() == k.key.key_id()) {
                return Err(KeyListError::Duplicate(k.key.key_id()));
            }
        }
        Ok(Self {
            sequence,
            grace_days,
            keys,
        })
    }

    /// A list of one key for every day: what a single configured public key means.
    pub fn single(key: PublicKey) -> Self {
        Self {
            sequence: 0,
            grace_days: 0,
            keys: vec![ScheduledKey { from: Day(0), key }],
        }
    }

    /// Grows with every list signed.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// Days a replaced key is still accepted for.
    pub fn grace_days(&self) -> u8 {
        self.grace_days
    }

    /// The keys, by first day.
    pub fn keys(&self) -> &[ScheduledKey] {
        &self.keys
    }

    /// The key that encrypts reports of `day`; `None` before the first key's first day.
    pub fn key_for(&self, day: Day) -> Option<&PublicKey> {
        self.index_for(day).map(|i| &self.keys[i].key)
    }

    fn index_for(&self, day: Day) -> Option<usize> {
        self.keys.iter().rposition(|k| k.from <= day)
    }

    /// The key with id `id` if a report of `day` may be under it (module docs: the day's
    /// key, or the one before it within the grace days).
    pub fn accepts(&self, id: KeyId, day: Day) -> Option<&PublicKey> {
        let i = self.index_for(day)?;
        let current = &self.keys[i];
        if current.key.key_id() == id {
            return Some(&current.key);
        }
        let previous = &self.keys[i.checked_sub(1)?];
        let within_grace =
            u64::from(day.0) < u64::from(current.from.0) + u64::from(self.grace_days);
        (previous.key.key_id() == id && within_grace).then_some(&previous.key)
    }

    /// The listed key with id `id`, whatever its days.
    pub fn find(&self, id: KeyId) -> Option<&PublicKey> {
        self.keys.iter().map(|k| &k.key).find(|k| k.key_id() == id)
    }

    fn body(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&self.sequence.to_be_bytes());
        out.push(self.grace_days);
        out.push(self.keys.len() as u8);
        for k in &self.keys {
            let bytes = k.key.to_bytes();
            out.extend_from_slice(&k.from.0.to_be_bytes());
            out.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
            out.extend_from_slice(&bytes);
        }
        out
    }

    /// The signed encoding.
    pub fn sign(&self, signing: &SigningKey) -> Vec<u8> {
        let mut out = self.body();
        let signature = signing.sign(&out);
        out.extend_from_slice(&signature.to_bytes());
        out
    }

    /// Decodes a signed list and checks its signature under `signer` and everything
    /// [`KeyList::new`] checks. Never panics on any input.
    pub fn verify(bytes: &[u8], signer: &VerifyingKey) -> Result<Self, KeyListError> {
        if bytes.len() > MAX_LIST_BYTES || bytes.len() < SIGNATURE_BYTES {
            return Err(KeyListError::Length(bytes.len()));
        }
        let (body, signature) = bytes.split_at(bytes.len() - SIGNATURE_BYTES);
        let mut r = Reader(body);
        if r.take(4, "magic")? != MAGIC {
            return Err(KeyListError::BadMagic);
        }
        let version = r.take(1, "version")?[0];
        if version != VERSION {
            return Err(KeyListError::UnsupportedVersion(version));
        }
        let signature = Signature::from_slice(signature).map_err(|_| KeyListError::BadSignature)?;
        signer
            .verify_strict(body, &signature)
            .map_err(|_| KeyListError::BadSignature)?;
        let sequence = u64::from_be_bytes(r.array("sequence")?);
        let grace_days = r.take(1, "grace days")?[0];
        let count = usize::from(r.take(1, "key count")?[0]);
        if count == 0 || count > MAX_KEYS {
            return Err(KeyListError::KeyCount(count));
        }
        let mut keys = Vec::with_capacity(count);
        for index in 0..count {
            let from = Day(u32::from_be_bytes(r.array("first day")?));
            let len = usize::from(u16::from_be_bytes(r.array("key length")?));
            let key = PublicKey::from_bytes(r.take(len, "public key")?)
                .map_err(|source| KeyListError::Key { index, source })?;
            keys.push(ScheduledKey { from, key });
        }
        if !r.0.is_empty() {
            return Err(KeyListError::Length(bytes.len()));
        }
        Self::new(sequence, grace_days, keys)
    }

    /// Refuses `self` when it is older than `held` (module docs, "Rollback"), or carries
    /// `held`'s sequence with other contents (a fork).
    pub fn check_not_older_than(&self, held: &KeyList) -> Result<(), KeyListError> {
        if self.sequence < held.sequence {
            return Err(KeyListError::Rollback {
                offered: self.sequence,
                held: held.sequence,
            });
        }
        if self.sequence == held.sequence && self != held {
            return Err(KeyListError::Fork {
                sequence: self.sequence,
            });
        }
        Ok(())
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], KeyListError> {
        if self.0.len() < n {
            return Err(KeyListError::Truncated(field));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], KeyListError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, field)?);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::paillier::{KeySize, Keypair};

    fn keys(n: usize) -> Vec<PublicKey> {
        (0..n)
            .map(|_| {
                Keypair::generate_with_size(KeySize::Bits512, &mut rand::rng())
                    .public_key()
                    .clone()
            })
            .collect()
    }

    fn list(sequence: u64, keys: &[PublicKey], days: &[u32]) -> KeyList {
        KeyList::new(
            sequence,
            DEFAULT_GRACE_DAYS,
            keys.iter()
                .zip(days)
                .map(|(k, &d)| ScheduledKey {
                    from: Day(d),
                    key: k.clone(),
                })
                .collect(),
        )
        .unwrap()
    }

    fn signer() -> SigningKey {
        SigningKey::from_bytes(&[7; 32])
    }

    #[test]
    fn a_signed_list_verifies_and_any_changed_byte_is_refused() {
        let k = keys(2);
        let l = list(3, &k, &[100, 110]);
        let bytes = l.sign(&signer());
        assert_eq!(KeyList::verify(&bytes, &signer().verifying_key()), Ok(l));
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            assert!(
                KeyList::verify(&bad, &signer().verifying_key()).is_err(),
                "byte {i} changed and still verified"
            );
        }
        let other = SigningKey::from_bytes(&[8; 32]).verifying_key();
        assert_eq!(
            KeyList::verify(&bytes, &other),
            Err(KeyListError::BadSignature)
        );
        for cut in 0..bytes.len() {
            assert!(KeyList::verify(&bytes[..cut], &signer().verifying_key()).is_err());
        }
    }

    #[test]
    fn each_day_has_one_key_and_the_old_one_is_accepted_only_within_the_grace_days() {
        let k = keys(2);
        let l = list(1, &k, &[100, 110]);
        let (old, new) = (k[0].key_id(), k[1].key_id());
        assert_eq!(l.key_for(Day(99)), None);
        assert_eq!(l.key_for(Day(100)), Some(&k[0]));
        assert_eq!(l.key_for(Day(109)), Some(&k[0]));
        assert_eq!(l.key_for(Day(110)), Some(&k[1]));
        assert!(l.accepts(old, Day(109)).is_some());
        assert!(
            l.accepts(new, Day(109)).is_none(),
            "a key before its first day"
        );
        assert!(l.accepts(new, Day(110)).is_some());
        assert!(
            l.accepts(old, Day(111)).is_some(),
            "within the 2 grace days"
        );
        assert!(l.accepts(old, Day(112)).is_none(), "after the grace days");
        assert!(l.accepts(old, Day(99)).is_none());
        assert!(l.accepts(KeyId([0; 32]), Day(110)).is_none());
        assert_eq!(l.find(old), Some(&k[0]));
    }

    #[test]
    fn a_signer_file_reads_back_and_anything_else_is_refused() {
        let key = signer().verifying_key();
        assert_eq!(parse_signer(&signer_text(&key)), Some(key));
        for bad in ["", "# only a comment\n", "abcd\n", &"zz".repeat(32)] {
            assert_eq!(parse_signer(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn malformed_lists_are_refused_with_their_reason() {
        let k = keys(MAX_KEYS + 1);
        let at = |d: u32, i: usize| ScheduledKey {
            from: Day(d),
            key: k[i].clone(),
        };
        assert_eq!(KeyList::new(1, 2, vec![]), Err(KeyListError::KeyCount(0)));
        assert_eq!(
            KeyList::new(1, 2, (0..=MAX_KEYS).map(|i| at(i as u32, i)).collect()),
            Err(KeyListError::KeyCount(MAX_KEYS + 1))
        );
        assert_eq!(
            KeyList::new(1, 2, vec![at(5, 0), at(5, 1)]),
            Err(KeyListError::Order(5, 5))
        );
        assert_eq!(
            KeyList::new(1, 2, vec![at(5, 0), at(6, 0)]),
            Err(KeyListError::Duplicate(k[0].key_id()))
        );
        let newer = list(4, &k[..1], &[1]);
        let older = list(3, &k[..1], &[1]);
        assert_eq!(
            older.check_not_older_than(&newer),
            Err(KeyListError::Rollback {
                offered: 3,
                held: 4
            })
        );
        assert_eq!(newer.check_not_older_than(&older), Ok(()));
        assert_eq!(newer.check_not_older_than(&newer.clone()), Ok(()));
        let fork = list(4, &k[1..2], &[1]);
        assert_eq!(
            fork.check_not_older_than(&newer),
            Err(KeyListError::Fork { sequence: 4 })
        );
        assert_eq!(
            KeyList::verify(&[0; 100], &signer().verifying_key()),
            Err(KeyListError::BadMagic)
        );
    }
}
