//! Admission: which reports may reach the tables at all.
//!
//! With [`Admission::Tokens`] every report must carry an anonymous admission token
//! (`penrose_core::tokens`, Privacy Pass style): a token of the issuer key of the report's own
//! day (token epoch = `Day.0`) and counter (token scope = `CounterId.0`), whose MAC covers
//! exactly this report's body ([`Report::token_binding`]). The issuer hands each enrolled
//! agent at most T tokens per (counter, day), so a sum's contributor bound
//! (`penrose_core::release::contributors_at_least`) holds for every sender, not only for
//! agents that keep their own cap. The checks, all before any table is touched:
//!
//! 1. no token: `TokenRequired`;
//! 2. a token of the report's day when the ring holds no key of that day at all (the
//!    operator has not loaded it yet): `TokenKeyMissing`, which agents treat as "retry later"
//!    and keep their token;
//! 3. a token naming a key the ring does not hold, of another day than the report's, or of
//!    another counter: `InvalidToken` (cheap, before the ciphertexts are parsed);
//! 4. its MAC over the report body does not verify (forged, or moved to another report):
//!    `InvalidToken` (about 36 us of CPU, the last check of validation; it runs on the
//!    handler's task, so verifications spread over the runtime's threads, never on the
//!    writer).
//!
//! A token that passes gives its [`SpentToken`] (epoch and spent id); the writer refuses it
//! when it is already recorded for another report (`TokenSpent`) and records it in the same
//! synced write as the report (`crate::state`).
//!
//! [`Admission::Open`] admits reports without tokens (and ignores any token a report carries):
//! anyone who can reach the server can report. The product binary runs open only when told so
//! explicitly (`serve --open-admission`); library callers choose one or the other.
//!
//! The key ring is the file the issuer exports (`KeyRing`, secret keys of the epochs it issues
//! for, ahead of time). [`TokenRing::load`] refuses a symbolic link and a file that group or
//! others may read, like the design server's private key file.

use std::path::{Path, PathBuf};

use penrose_core::counters::CounterId;
use penrose_core::tokens::{
    IssuerKey, KeyRing, KeySet, Redemption, SpentId, TokenEpoch, TokenError, TokenScope,
};
use penrose_core::wire::{Day, Report};
use penrose_host::FileError;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::validate::Rejection;

/// The largest key ring file read: 4096 keys (the most a ring holds) of 38 bytes and a header.
const MAX_KEY_RING_FILE: u64 = 256 * 1024;

/// How the server admits reports.
#[derive(Debug)]
pub enum Admission {
    /// Every report must carry a valid, unspent admission token of this key ring.
    Tokens(TokenRing),
    /// Reports need no token; anyone who can reach the server can report.
    Open,
}

/// [`Admission::describe`]: how a server admits reports, as the admin replies carry it
/// (`status`, `reload-keys`), so that the CLI prints it from the same type the server wrote.
/// On the wire an object tagged by `mode` (`"open"` or `"tokens"`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum AdmissionDescription {
    /// Reports need no token.
    Open,
    /// Reports need a token of this key ring.
    Tokens {
        /// The file the ring was read from (`None` for a ring handed over in memory).
        key_ring: Option<PathBuf>,
        /// Issuer keys in the ring.
        keys: usize,
        /// The token epochs (days) it holds keys of, in order.
        epochs: Vec<u32>,
        /// Whether it holds keys of today: without, every report of today is refused.
        covers_today: bool,
        /// Whether it holds keys of tomorrow: without, the operator must load the next ring
        /// before midnight.
        covers_tomorrow: bool,
    },
}

/// How `serve` is told to admit reports, before the key ring is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdmissionConfig {
    /// By tokens verified with the key ring in this file (`--token-keys`).
    Tokens(PathBuf),
    /// Without tokens (`--open-admission`).
    Open,
}

impl AdmissionConfig {
    /// Reads the key ring (for [`AdmissionConfig::Tokens`]).
    pub fn load(&self) -> Result<Admission, KeyRingFileError> {
        Ok(match self {
            AdmissionConfig::Tokens(path) => Admission::Tokens(TokenRing::load(path)?),
            AdmissionConfig::Open => Admission::Open,
        })
    }
}

impl Admission {
    /// What `status` and `reload-keys` show of it: the mode and, by tokens, the key ring's
    /// file, epochs and whether it holds keys for `today` and the next day (the issuer exports
    /// rings ahead of time; a server without keys of a day refuses every report of it as
    /// `InvalidToken`).
    pub fn describe(&self, today: Day) -> AdmissionDescription {
        match self {
            Admission::Open => AdmissionDescription::Open,
            Admission::Tokens(ring) => AdmissionDescription::Tokens {
                key_ring: ring.path().map(Path::to_path_buf),
                keys: ring.ring().keys().len(),
                epochs: ring.epochs().iter().map(|e| e.0).collect(),
                covers_today: ring.covers(today),
                covers_tomorrow: ring.covers(Day(today.0.saturating_add(1))),
            },
        }
    }

    /// Whether reports are admitted by tokens.
    pub fn by_tokens(&self) -> bool {
        matches!(self, Admission::Tokens(_))
    }

    /// The cheap half of the token check (module docs, 1 and 2): the report carries a token
    /// of a key this ring holds, of the report's day and counter. `None` under open admission.
    /// The MAC is checked by [`ClaimedToken::verify`], after the rest of validation.
    pub fn claim(&self, report: &Report) -> Result<Option<ClaimedToken<'_>>, Rejection> {
        let Admission::Tokens(ring) = self else {
            return Ok(None);
        };
        let token = report.token.as_ref().ok_or(Rejection::TokenRequired)?;
        // A token of the report's day when no key of that day is loaded: the operator's ring
        // does not reach it yet. Refusing it as invalid would make agents throw good tokens
        // away; they keep report and token and retry instead.
        let [a, b, c, d, ..] = token.0;
        let claimed = TokenEpoch(u32::from_be_bytes([a, b, c, d]));
        if claimed == TokenEpoch(report.day.0) && ring.set.epoch(claimed).is_empty() {
            return Err(Rejection::TokenKeyMissing(report.day.0));
        }
        let redemption =
            Redemption::decode(&token.0, &ring.set).map_err(TokenRefusal::UnknownKey)?;
        let key = ring
            .ring
            .find(redemption.epoch(), redemption.key_id())
            .map_err(TokenRefusal::UnknownKey)?;
        if key.epoch() != TokenEpoch(report.day.0) {
            return Err(TokenRefusal::OtherDay {
                token: key.epoch(),
                day: report.day,
            }
            .into());
        }
        if key.scope() != TokenScope(report.counter.0) {
            return Err(TokenRefusal::OtherCounter {
                scope: key.scope(),
                counter: report.counter,
            }
            .into());
        }
        Ok(Some(ClaimedToken { key, redemption }))
    }
}

/// A token that named the right key (epoch and scope) for its report; not yet verified.
#[derive(Debug)]
pub struct ClaimedToken<'a> {
    key: &'a IssuerKey,
    redemption: Redemption,
}

impl ClaimedToken<'_> {
    /// Verifies the token's MAC over `report`'s body (the report it was claimed for) and
    /// returns what the writer records as spent.
    pub fn verify(self, report: &Report) -> Result<SpentToken, Rejection> {
        let id = self
            .key
            .verify(&self.redemption, &report.token_binding())
            .map_err(TokenRefusal::DoesNotVerify)?;
        Ok(SpentToken {
            epoch: self.key.epoch(),
            id,
        })
    }
}

/// A verified token: what the spent table records (keyed by epoch, which is the report's day,
/// so that spent ids expire with the day).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpentToken {
    /// The token's epoch (= the report's day).
    pub epoch: TokenEpoch,
    /// Its spent id.
    pub id: SpentId,
}

/// Why a report's token was refused (`InvalidToken`): the detail for the log.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum TokenRefusal {
    /// The token names a key the ring does not hold (an epoch not issued for, a retired or
    /// foreign key).
    #[error("{0}")]
    UnknownKey(TokenError),
    /// The token's key is of another day than the report's.
    #[error("token of epoch {token} on a report of day {}", .day.0)]
    OtherDay {
        /// The token's epoch.
        token: TokenEpoch,
        /// The report's day.
        day: Day,
    },
    /// The token's key is of another counter than the report's.
    #[error("token of scope {scope} on a report of counter {}", .counter.0)]
    OtherCounter {
        /// The token's scope.
        scope: TokenScope,
        /// The report's counter.
        counter: CounterId,
    },
    /// The MAC does not verify: forged, or bound to another report body.
    #[error("{0}")]
    DoesNotVerify(TokenError),
}

/// The issuer's secret keys the server verifies with, and their public set (which redemptions
/// are decoded against).
#[derive(Debug)]
pub struct TokenRing {
    ring: KeyRing,
    set: KeySet,
    path: Option<PathBuf>,
}

impl TokenRing {
    /// A ring held in memory (tests, tools).
    pub fn new(ring: KeyRing) -> Self {
        let set = ring.key_set();
        TokenRing {
            ring,
            set,
            path: None,
        }
    }

    /// Reads the key ring file the issuer exported (module docs: refuses a symbolic link and a
    /// file group or others may read).
    pub fn load(path: &Path) -> Result<Self, KeyRingFileError> {
        let ring = read_key_ring(path)?;
        Ok(TokenRing {
            path: Some(path.to_path_buf()),
            ..TokenRing::new(ring)
        })
    }

    /// The keys.
    pub fn ring(&self) -> &KeyRing {
        &self.ring
    }

    /// The file it was read from, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The epochs it holds keys for, in order.
    pub fn epochs(&self) -> Vec<TokenEpoch> {
        self.set.epochs().collect()
    }

    /// Whether it holds any key of `day`'s epoch.
    pub fn covers(&self, day: Day) -> bool {
        !self.set.epoch(TokenEpoch(day.0)).is_empty()
    }
}

/// Why a key ring file was not loaded.
#[derive(Debug, Error)]
pub enum KeyRingFileError {
    /// The file is unsafe to use (a symbolic link, not a regular file, another user's, open to
    /// group or others; whoever holds its keys can mint tokens), larger than any ring, or
    /// unreadable: [`penrose_host::secret_file::read`] says which.
    #[error("token key ring: {0}")]
    Secret(FileError),
    /// Not a key ring this build reads.
    #[error("{path} is not a valid token key ring: {source}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: TokenError,
    },
    /// The file already exists (writing never replaces a ring).
    #[error("{0} already exists; key rings are never overwritten")]
    Exists(PathBuf),
}

// Not `#[from]`: the message already shows the inner error, which would otherwise also be the
// source and print twice in a chain.
impl From<FileError> for KeyRingFileError {
    fn from(e: FileError) -> Self {
        KeyRingFileError::Secret(e)
    }
}

/// Reads a key ring file with the shared secret-file reader (`penrose_host::secret_file::read`):
/// refused when it is a symbolic link, not a regular file, another user's, accessible to
/// group or others, or larger than any ring.
pub fn read_key_ring(path: &Path) -> Result<KeyRing, KeyRingFileError> {
    let bytes = penrose_host::secret_file::read(path, MAX_KEY_RING_FILE)?;
    KeyRing::decode(&bytes).map_err(|source| KeyRingFileError::Invalid {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes a key ring file readable by its owner alone (0600), never replacing one: for tests
/// and test equipment (the issuer exports the real ones).
pub fn write_key_ring(path: &Path, ring: &KeyRing) -> Result<(), KeyRingFileError> {
    penrose_host::secret_file::create(path, &ring.encode()).map_err(|e| match e {
        penrose_host::FileError::Exists(path) => KeyRingFileError::Exists(path),
        e => KeyRingFileError::from(e),
    })
}

/// Test equipment: a key ring of fresh issuer keys for every counter and joint view of the
/// current catalogue
/// and every day from `first` to `last`, as an issuer would export it (tests, benchmarks,
/// `examples/token_keys.rs`). A real server verifies with the issuer's export instead; a
/// build without the `test-util` feature does not have it.
#[cfg(feature = "test-util")]
pub fn test_equipment_key_ring(first: Day, last: Day) -> Result<KeyRing, TokenError> {
    let mut rng = rand::rng();
    let mut keys = Vec::new();
    for epoch in first.0..=last.0 {
        for counter in penrose_core::counters::Catalogue::current().report_ids() {
            keys.push(IssuerKey::generate(
                TokenEpoch(epoch),
                TokenScope(counter.0),
                &mut rng,
            ));
        }
    }
    KeyRing::new(keys)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use penrose_core::tokens::IssuerKey;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    use super::*;

    fn ring() -> KeyRing {
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        KeyRing::new(
            [(7, 4), (7, 5), (8, 4)]
                .map(|(e, s)| IssuerKey::generate(TokenEpoch(e), TokenScope(s), &mut rng)),
        )
        .unwrap()
    }

    #[test]
    fn key_ring_files_are_owner_only_and_never_links() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ring");
        write_key_ring(&path, &ring()).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let loaded = TokenRing::load(&path).unwrap();
        assert_eq!(loaded.epochs(), [TokenEpoch(7), TokenEpoch(8)]);
        assert!(loaded.covers(Day(8)) && !loaded.covers(Day(9)));
        assert_eq!(loaded.path(), Some(path.as_path()));
        assert!(matches!(
            write_key_ring(&path, &ring()),
            Err(KeyRingFileError::Exists(_))
        ));

        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(matches!(
            TokenRing::load(&link),
            Err(KeyRingFileError::Secret(FileError::Symlink(_)))
        ));

        for mode in [0o640, 0o604, 0o644] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            match TokenRing::load(&path) {
                Err(KeyRingFileError::Secret(FileError::TooOpen { mode: m, .. })) => {
                    assert_eq!(m, mode)
                }
                other => panic!("mode {mode:o}: {other:?}"),
            }
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(TokenRing::load(&path).is_ok());

        let other = dir.path().join("other");
        std::fs::write(&other, b"penrose-token-keys but not really").unwrap();
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            TokenRing::load(&other),
            Err(KeyRingFileError::Invalid { .. })
        ));
        assert!(matches!(
            TokenRing::load(dir.path()),
            Err(KeyRingFileError::Secret(FileError::NotAFile(_)))
        ));
        assert!(matches!(
            TokenRing::load(&dir.path().join("missing")),
            Err(KeyRingFileError::Secret(FileError::Io { .. }))
        ));
    }
}
