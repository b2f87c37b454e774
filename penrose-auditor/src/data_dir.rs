//! The data directory's layout, and the lock that lets one process change it at a time.
//!
//! ```text
//! DATA/                         0700, made by `init` (whole, or not at all)
//! DATA/policy.json              the auditor's own threshold k and cap T
//! DATA/aggregator.pub           the pinned aggregation server's bundle-signing key (64 hex
//!                               digits, as the aggregation server writes its .pub file)
//! DATA/record.json              the chain followed, its last bundle (seq, hash), every epoch
//!                               ever answered with the bundle it was answered in, and the
//!                               chains followed before; replaced durably on every change
//! DATA/evidence-keys           optional: the auditor party's token key ring (0600); with it,
//!                               every release is counted from the page's evidence
//! DATA/spent                    every evidence token counted, with the sum it was counted for
//!                               (append-only, synced before an answer leaves)
//! DATA/shares/ID.share          the auditor's share of key ID (0600; ID: the key id in hex)
//! DATA/shares/ID.public         the public key it belongs to
//! DATA/shares/ID.verification   the dealing's verification key
//! DATA/tls/cert.pem             the QUIC certificate the design server pins (self-signed on
//! DATA/tls/key.pem              the first `serve` unless --cert/--key name others), key 0600
//! DATA/lock                     locked by the process that may change the directory
//! ```
//!
//! What to back up: `shares/` (losing the share loses every sum under its key: the split is
//! 2-of-2), `record.json` (losing it would let a restored auditor answer epochs again) and
//! `spent` (losing it would let tokens count again, in another sum).

use std::fs::{File, OpenOptions, TryLockError};
use std::path::PathBuf;

use penrose_core::paillier::KeyId;
use penrose_host::data_dir::ServerDir;

use crate::error::AuditorError;

/// Paths inside a data directory.
#[derive(Clone, Debug)]
pub struct DataDir(ServerDir);

impl std::ops::Deref for DataDir {
    type Target = ServerDir;

    fn deref(&self) -> &ServerDir {
        &self.0
    }
}

impl DataDir {
    /// The data directory at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        DataDir(ServerDir::new(path))
    }

    /// The policy file.
    pub fn policy(&self) -> PathBuf {
        self.0.file("policy.json")
    }

    /// The pinned aggregation server key.
    pub fn aggregator_key(&self) -> PathBuf {
        self.0.file("aggregator.pub")
    }

    /// The record of the chain and the answered epochs.
    pub fn record(&self) -> PathBuf {
        self.0.file("record.json")
    }

    /// The auditor party's token key ring (optional: with it, releases need evidence).
    pub fn evidence_keys(&self) -> PathBuf {
        self.0.file("evidence-keys")
    }

    /// The tokens counted so far, with the sums they were counted for.
    pub fn spent(&self) -> PathBuf {
        self.0.file("spent")
    }

    /// The directory of key shares.
    pub fn shares(&self) -> PathBuf {
        self.0.file("shares")
    }

    /// The share of key `id`.
    pub fn share(&self, id: &KeyId) -> PathBuf {
        self.shares().join(format!("{id}.share"))
    }

    /// The public key of key `id`.
    pub fn public_key(&self, id: &KeyId) -> PathBuf {
        self.shares().join(format!("{id}.public"))
    }

    /// The verification key of key `id`'s dealing.
    pub fn verification_key(&self, id: &KeyId) -> PathBuf {
        self.shares().join(format!("{id}.verification"))
    }

    /// The lock file.
    pub fn lock_file(&self) -> PathBuf {
        self.0.file("lock")
    }

    /// Refuses a directory `init` did not make (its record is the mark).
    pub fn check_initialised(&self) -> Result<(), AuditorError> {
        if self.record().is_file() {
            Ok(())
        } else {
            Err(AuditorError::NotInitialised(self.path().to_owned()))
        }
    }

    /// Locks the directory for this process (`serve` holds it while it runs; `add-share` and
    /// `follow` while they change it), refusing when another process holds it: a running
    /// auditor keeps its record in memory and would overwrite a change made under it.
    pub fn lock(&self) -> Result<DirLock, AuditorError> {
        self.check_initialised()?;
        let path = self.lock_file();
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(AuditorError::io(&path))?;
        match file.try_lock() {
            Ok(()) => Ok(DirLock { _file: file }),
            Err(TryLockError::WouldBlock) => Err(AuditorError::Busy(self.path().to_owned())),
            Err(TryLockError::Error(e)) => Err(AuditorError::io(path)(e)),
        }
    }

    /// The ids of the keys a share is held of, from the share files' names.
    pub fn held_key_ids(&self) -> Result<Vec<KeyId>, AuditorError> {
        let dir = self.shares();
        let mut ids = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(AuditorError::io(&dir))? {
            let entry = entry.map_err(AuditorError::io(&dir))?;
            let name = entry.file_name();
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".share")) else {
                continue;
            };
            let id = stem
                .parse::<KeyId>()
                .map_err(|e| AuditorError::corrupt(entry.path(), e))?;
            ids.push(id);
        }
        ids.sort();
        Ok(ids)
    }
}

/// Held while a process may change the data directory; released when dropped (or when the
/// process ends, however it ends).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}
