//! The issuer's store: RocksDB in `STATE/db`, one column family per [`Table`], every write one
//! synced `WriteBatch` (WAL synced before it returns), so that a count is durable before the
//! tokens it counts leave the issuer.
//!
//! ```text
//! credentials  id:[32]                         -> enrolled:u32be revoked:u8 revoked_day:u32be
//!                                                 label_len:u8 label:[label_len]
//! issued       epoch:u32be scope:u16be id:[32] -> tokens:u16be
//! rate         id:[32]                         -> level:u64be at_seconds:u64be  (level in 1/3600 request)
//! meta         "format"                        -> u32be (STORE_FORMAT)
//!              "seed_id"                       -> [32], SHA-256 of the seed under a domain tag
//!              "prune_floor"                   -> u32be, the oldest epoch whose counts are kept
//! ```
//!
//! `id` is a [`crate::CredentialId`], never the credential. Nothing of an
//! issuance but its count is kept: no blinded element, no evaluated element, no proof, no
//! time beyond the rate record's last request. Issued rows sort by epoch first so that whole
//! past epochs are pruned with one range deletion.

use std::collections::BTreeSet;
use std::path::Path;

use penrose_core::tokens::{TokenEpoch, TokenScope};
use penrose_core::wire::Day;
use penrose_kv::{Kv, Table as _, plain_families};
use rocksdb::Options;

use crate::credential::CredentialId;
use crate::error::IssuerError;

/// The store format this build writes and reads.
pub const STORE_FORMAT: u32 = 1;

/// The tables (column families).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// Enrolled credentials by id.
    Credentials,
    /// Tokens issued per (epoch, scope, credential id).
    Issued,
    /// Each credential's request-rate bucket.
    Rate,
    /// The store's own settings: format, seed id, prune floor.
    Meta,
}

impl Table {
    /// Every table, in a fixed order.
    pub const ALL: [Table; 4] = [Table::Credentials, Table::Issued, Table::Rate, Table::Meta];
}

impl penrose_kv::Table for Table {
    fn name(self) -> &'static str {
        match self {
            Table::Credentials => "credentials",
            Table::Issued => "issued",
            Table::Rate => "rate",
            Table::Meta => "meta",
        }
    }
}

/// Meta key of the format version.
pub const META_FORMAT: &[u8] = b"format";
/// Meta key of the seed's id.
pub const META_SEED_ID: &[u8] = b"seed_id";
/// Meta key of the prune floor.
pub const META_PRUNE_FLOOR: &[u8] = b"prune_floor";

/// Writes that become durable together or not at all, in the order they were added.
pub type WriteSet = penrose_kv::WriteSet<Table>;

/// A visitor over (table, key, value) rows; an error stops the scan.
pub type Visitor<'a> = penrose_kv::Visitor<'a, Table, IssuerError>;

/// The RocksDB store.
#[derive(Debug)]
pub struct Store {
    kv: Kv<Table>,
}

fn options(create: bool) -> Options {
    let mut options = Options::default();
    options.create_if_missing(create);
    options.create_missing_column_families(create);
    options.set_keep_log_file_num(4);
    options
}

impl Store {
    /// Creates a new store at `path` for the seed whose id is `seed_id`; refuses a directory
    /// that already holds a database.
    pub fn create(path: &Path, seed_id: [u8; 32]) -> Result<Self, IssuerError> {
        if path.join("CURRENT").exists() {
            return Err(IssuerError::AlreadyInitialised(path.to_owned()));
        }
        let store = Store {
            kv: Kv::open(path, &options(true), plain_families(&Table::ALL))?,
        };
        let mut set = WriteSet::new();
        set.put(Table::Meta, META_FORMAT, STORE_FORMAT.to_be_bytes());
        set.put(Table::Meta, META_SEED_ID, seed_id);
        store.write(set)?;
        Ok(store)
    }

    /// Opens the store at `path`; refuses a missing store, a database that is not an issuer's,
    /// another format, and (when `seed_id` is given) a store made for another seed.
    pub fn open(path: &Path, seed_id: Option<[u8; 32]>) -> Result<Self, IssuerError> {
        if !path.join("CURRENT").exists() {
            return Err(IssuerError::NotInitialised(
                path.parent().unwrap_or(path).to_owned(),
            ));
        }
        let families: BTreeSet<String> = Kv::<Table>::existing_tables(path)?.into_iter().collect();
        let ours = Table::ALL
            .iter()
            .all(|table| families.contains(table.name()));
        if !ours {
            return Err(IssuerError::Format {
                path: path.to_owned(),
                found: 0,
                expected: STORE_FORMAT,
            });
        }
        let store = Store {
            kv: Kv::open(path, &options(false), plain_families(&Table::ALL))?,
        };
        let found = store.kv.format(Table::Meta, META_FORMAT)?.unwrap_or(0);
        if found != STORE_FORMAT {
            return Err(IssuerError::Format {
                path: path.to_owned(),
                found,
                expected: STORE_FORMAT,
            });
        }
        if let Some(seed_id) = seed_id
            && store.get(Table::Meta, META_SEED_ID)?.as_deref() != Some(&seed_id[..])
        {
            return Err(IssuerError::SeedMismatch(path.to_owned()));
        }
        Ok(store)
    }

    /// Where the database lives.
    pub fn path(&self) -> &Path {
        self.kv.path()
    }

    /// One value.
    pub fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, IssuerError> {
        Ok(self.kv.get(table, key)?)
    }

    /// Applies every change atomically and returns once it is durable (WAL synced).
    pub fn write(&self, set: WriteSet) -> Result<(), IssuerError> {
        Ok(self.kv.write(set)?)
    }

    /// Visits every row of `tables`, all read at one point in time; a visitor error stops the
    /// scan and is returned.
    pub fn scan(&self, tables: &[Table], visit: &mut Visitor<'_>) -> Result<(), IssuerError> {
        self.kv.scan(tables, visit)
    }

    /// The oldest epoch whose counts are kept (0 before the first prune).
    pub fn prune_floor(&self) -> Result<Day, IssuerError> {
        Ok(Day(self
            .kv
            .format(Table::Meta, META_PRUNE_FLOOR)?
            .unwrap_or(0)))
    }

    /// Forgets the counts of every epoch before `floor` and records the floor (never lowers
    /// it). Returns whether anything changed.
    pub fn prune_before(&self, floor: Day) -> Result<bool, IssuerError> {
        if floor <= self.prune_floor()? {
            return Ok(false);
        }
        let mut set = WriteSet::new();
        set.delete_range(Table::Issued, 0u32.to_be_bytes(), floor.0.to_be_bytes());
        set.put(Table::Meta, META_PRUNE_FLOOR, floor.0.to_be_bytes());
        self.write(set)?;
        Ok(true)
    }

    /// Tokens issued to `id` under (epoch, scope).
    pub fn issued(
        &self,
        epoch: TokenEpoch,
        scope: TokenScope,
        id: &CredentialId,
    ) -> Result<u16, IssuerError> {
        match self.get(Table::Issued, &issued_key(epoch, scope, id))? {
            None => Ok(0),
            Some(value) => <[u8; 2]>::try_from(value.as_slice())
                .map(u16::from_be_bytes)
                .map_err(|_| IssuerError::Corrupt {
                    table: "issued",
                    what: "a count is not 2 bytes",
                }),
        }
    }

    /// A credential's record.
    pub fn credential(&self, id: &CredentialId) -> Result<Option<CredentialRecord>, IssuerError> {
        self.get(Table::Credentials, &id.0)?
            .map(|value| CredentialRecord::decode(&value))
            .transpose()
    }

    /// A credential's rate record.
    pub fn rate(&self, id: &CredentialId) -> Result<Option<RateRecord>, IssuerError> {
        self.get(Table::Rate, &id.0)?
            .map(|value| RateRecord::decode(&value))
            .transpose()
    }
}

/// The key of an issued count: `epoch:u32be scope:u16be id:[32]`.
pub fn issued_key(epoch: TokenEpoch, scope: TokenScope, id: &CredentialId) -> [u8; 38] {
    let mut key = [0u8; 38];
    key[..4].copy_from_slice(&epoch.0.to_be_bytes());
    key[4..6].copy_from_slice(&scope.0.to_be_bytes());
    key[6..].copy_from_slice(&id.0);
    key
}

/// An issued row's key read back.
pub fn parse_issued_key(key: &[u8]) -> Option<(TokenEpoch, TokenScope, CredentialId)> {
    let key: &[u8; 38] = key.try_into().ok()?;
    let epoch = TokenEpoch(u32::from_be_bytes([key[0], key[1], key[2], key[3]]));
    let scope = TokenScope(u16::from_be_bytes([key[4], key[5]]));
    let mut id = [0u8; 32];
    id.copy_from_slice(&key[6..]);
    Some((epoch, scope, CredentialId(id)))
}

/// Units of a [`RateRecord`]'s level per request.
pub const RATE_UNITS: u64 = 3600;

/// The most bytes of an operator's label.
pub const MAX_LABEL: usize = 64;

/// What the issuer knows about an enrolled credential.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CredentialRecord {
    /// The day it was enrolled.
    pub enrolled: Day,
    /// The day it was revoked, if it was.
    pub revoked: Option<Day>,
    /// The operator's label (a host name, an asset tag), if one was given.
    pub label: Option<String>,
}

impl CredentialRecord {
    /// Checks an operator's label: 1 to [`MAX_LABEL`] bytes, no control characters.
    pub fn check_label(label: &str) -> Result<(), IssuerError> {
        if label.is_empty() || label.len() > MAX_LABEL || label.chars().any(char::is_control) {
            return Err(IssuerError::BadLabel);
        }
        Ok(())
    }

    /// The stored value.
    pub fn encode(&self) -> Vec<u8> {
        let label = self.label.as_deref().unwrap_or("").as_bytes();
        let label = &label[..label.len().min(MAX_LABEL)];
        let mut out = Vec::with_capacity(10 + label.len());
        out.extend_from_slice(&self.enrolled.0.to_be_bytes());
        out.push(u8::from(self.revoked.is_some()));
        out.extend_from_slice(&self.revoked.map_or(0, |d| d.0).to_be_bytes());
        // At most MAX_LABEL (64) bytes.
        out.push(label.len() as u8);
        out.extend_from_slice(label);
        out
    }

    /// A stored value read back.
    pub fn decode(value: &[u8]) -> Result<Self, IssuerError> {
        let corrupt = |what| IssuerError::Corrupt {
            table: "credentials",
            what,
        };
        let (head, label) = value
            .split_at_checked(10)
            .ok_or(corrupt("shorter than 10 bytes"))?;
        let enrolled = Day(u32::from_be_bytes([head[0], head[1], head[2], head[3]]));
        let revoked = match head[4] {
            0 => None,
            1 => Some(Day(u32::from_be_bytes([
                head[5], head[6], head[7], head[8],
            ]))),
            _ => return Err(corrupt("revoked flag is neither 0 nor 1")),
        };
        if label.len() != usize::from(head[9]) {
            return Err(corrupt("label length"));
        }
        let label = match label {
            [] => None,
            bytes => {
                Some(String::from_utf8(bytes.to_vec()).map_err(|_| corrupt("label is not UTF-8"))?)
            }
        };
        Ok(CredentialRecord {
            enrolled,
            revoked,
            label,
        })
    }
}

/// A credential's request-rate bucket as stored: its level in 3600ths of a request (so that a
/// bucket of N requests an hour refills by exactly N units a second, without rounding) and
/// when it was last updated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateRecord {
    /// Requests left, in 3600ths ([`RATE_UNITS`] a request).
    pub level: u64,
    /// Seconds since the Unix epoch of the last update.
    pub at: u64,
}

impl RateRecord {
    /// The stored value.
    pub fn encode(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.level.to_be_bytes());
        out[8..].copy_from_slice(&self.at.to_be_bytes());
        out
    }

    /// A stored value read back.
    pub fn decode(value: &[u8]) -> Result<Self, IssuerError> {
        let value: &[u8; 16] = value.try_into().map_err(|_| IssuerError::Corrupt {
            table: "rate",
            what: "a rate record is not 16 bytes",
        })?;
        let mut level = [0u8; 8];
        let mut at = [0u8; 8];
        level.copy_from_slice(&value[..8]);
        at.copy_from_slice(&value[8..]);
        Ok(RateRecord {
            level: u64::from_be_bytes(level),
            at: u64::from_be_bytes(at),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn created_stores_reopen_and_other_formats_and_seeds_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        assert!(matches!(
            Store::open(&path, None),
            Err(IssuerError::NotInitialised(_))
        ));
        let store = Store::create(&path, [1; 32]).unwrap();
        let id = CredentialId([9; 32]);
        let record = CredentialRecord {
            enrolled: Day(20_000),
            revoked: None,
            label: Some("gpu-host-17".into()),
        };
        let mut set = WriteSet::new();
        set.put(Table::Credentials, id.0, record.encode());
        set.put(
            Table::Issued,
            issued_key(TokenEpoch(5), TokenScope(1), &id),
            7u16.to_be_bytes(),
        );
        set.put(
            Table::Issued,
            issued_key(TokenEpoch(9), TokenScope(1), &id),
            3u16.to_be_bytes(),
        );
        store.write(set).unwrap();
        assert!(matches!(
            Store::open(&path, None),
            Err(IssuerError::Busy(_))
        ));
        drop(store);
        assert!(matches!(
            Store::create(&path, [1; 32]),
            Err(IssuerError::AlreadyInitialised(_))
        ));
        assert!(matches!(
            Store::open(&path, Some([2; 32])),
            Err(IssuerError::SeedMismatch(_))
        ));
        let store = Store::open(&path, Some([1; 32])).unwrap();
        assert_eq!(store.credential(&id).unwrap(), Some(record));
        assert_eq!(store.issued(TokenEpoch(5), TokenScope(1), &id).unwrap(), 7);
        assert!(store.prune_before(Day(6)).unwrap());
        assert!(!store.prune_before(Day(4)).unwrap());
        assert_eq!(store.prune_floor().unwrap(), Day(6));
        assert_eq!(store.issued(TokenEpoch(5), TokenScope(1), &id).unwrap(), 0);
        assert_eq!(store.issued(TokenEpoch(9), TokenScope(1), &id).unwrap(), 3);

        let mut set = WriteSet::new();
        set.put(Table::Meta, META_FORMAT, 2u32.to_be_bytes());
        store.write(set).unwrap();
        drop(store);
        let err = Store::open(&path, None).unwrap_err();
        assert!(
            matches!(
                err,
                IssuerError::Format {
                    found: 2,
                    expected: 1,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn records_round_trip_and_damage_is_named() {
        for record in [
            CredentialRecord {
                enrolled: Day(1),
                revoked: Some(Day(3)),
                label: None,
            },
            CredentialRecord {
                enrolled: Day(20_000),
                revoked: None,
                label: Some("rack 4, slot 2".into()),
            },
        ] {
            assert_eq!(CredentialRecord::decode(&record.encode()).unwrap(), record);
        }
        assert!(CredentialRecord::decode(&[0; 9]).is_err());
        assert!(CredentialRecord::decode(&[0, 0, 0, 0, 2, 0, 0, 0, 0, 0]).is_err());
        assert!(CredentialRecord::decode(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 1]).is_err());
        let rate = RateRecord {
            level: 12_000,
            at: 1_700_000_000,
        };
        assert_eq!(RateRecord::decode(&rate.encode()).unwrap(), rate);
        assert!(RateRecord::decode(&[0; 15]).is_err());
        assert!(CredentialRecord::check_label("ok").is_ok());
        for bad in ["", "a\nb", &"x".repeat(65)] {
            assert!(CredentialRecord::check_label(bad).is_err());
        }
        let id = CredentialId([4; 32]);
        let key = issued_key(TokenEpoch(7), TokenScope(3), &id);
        assert_eq!(
            parse_issued_key(&key),
            Some((TokenEpoch(7), TokenScope(3), id))
        );
    }
}
