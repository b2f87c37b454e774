//! Export: a signed bundle ([`penrose_core::bundle`]) of every sum changed since a cursor, read
//! from one consistent snapshot of the store while ingest keeps writing.
//!
//! The server's signing key (ed25519) lives in its data directory, created on first use with
//! mode 0600 and refused when group or others may read it; its public half is written next to
//! it (hex) for the design server to pin.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ed25519_dalek::{SigningKey, VerifyingKey};
use penrose_core::bundle::{Bundle, BundleEntry, BundleError, Cursor};
use penrose_core::paillier::{ACCUMULATOR_REPORT_BOUND, Accumulator, PublicKey};
use penrose_core::wire::{PackedBytes, WireError};
use rand::RngCore;
use thiserror::Error;

use crate::aggregate::AshRecord;
use crate::ingest::today;
use crate::state::{StateError, check_format, meta};
use crate::store::{Store, StoreError, Table};

const KEY_TAG: &[u8; 5] = b"PNSG\x01";

/// Why a bundle or a signing key could not be made.
#[derive(Debug, Error)]
pub enum ExportError {
    /// Reading the store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The store cannot be read by this build (its format) or is damaged.
    #[error(transparent)]
    State(#[from] StateError),
    /// A stored sum does not parse.
    #[error("stored sum: {0}")]
    Record(String),
    /// A stored sum's ciphertexts do not form a packed histogram.
    #[error("stored sum: {0}")]
    Wire(#[from] WireError),
    /// Encoding or signing failed.
    #[error(transparent)]
    Bundle(#[from] BundleError),
    /// The key file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The key file is readable by others.
    #[error("{path} is readable by group or others (mode {mode:o}); `chmod 600` it")]
    TooOpen {
        /// The file.
        path: PathBuf,
        /// Its mode.
        mode: u32,
    },
    /// The key file is not a signing key.
    #[error("{0} is not a Penrose signing key")]
    NotAKey(PathBuf),
}

/// Reads the signing key at `path`, creating it (0600) and `path.pub` if it does not exist.
pub fn load_or_create_signing_key(path: &Path) -> Result<SigningKey, ExportError> {
    let io = |source| ExportError::Io {
        path: path.to_path_buf(),
        source,
    };
    match OpenOptions::new().read(true).open(path) {
        Ok(mut file) => {
            let mode = file.metadata().map_err(io)?.mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(ExportError::TooOpen {
                    path: path.to_path_buf(),
                    mode,
                });
            }
            let mut bytes = Vec::new();
            Read::by_ref(&mut file)
                .take(64)
                .read_to_end(&mut bytes)
                .map_err(io)?;
            let seed: [u8; 32] = bytes
                .strip_prefix(KEY_TAG.as_slice())
                .and_then(|s| s.try_into().ok())
                .ok_or_else(|| ExportError::NotAKey(path.to_path_buf()))?;
            Ok(SigningKey::from_bytes(&seed))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut seed = [0u8; 32];
            rand::rng().fill_bytes(&mut seed);
            let key = SigningKey::from_bytes(&seed);
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(io)?;
            let mut bytes = KEY_TAG.to_vec();
            bytes.extend_from_slice(&seed);
            file.write_all(&bytes).map_err(io)?;
            file.sync_all().map_err(io)?;
            let public = public_key_path(path);
            std::fs::write(
                &public,
                format!("{}\n", hex(key.verifying_key().as_bytes())),
            )
            .map_err(|source| ExportError::Io {
                path: public,
                source,
            })?;
            Ok(key)
        }
        Err(e) => Err(io(e)),
    }
}

/// Where the public half of the signing key at `path` is written.
pub fn public_key_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".pub");
    PathBuf::from(name)
}

/// Parses a public key as written next to the signing key (64 hex digits).
pub fn parse_public_key(text: &str) -> Option<VerifyingKey> {
    let text = text.trim();
    if text.len() != 64 {
        return None;
    }
    let mut bytes = [0u8; 32];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    VerifyingKey::from_bytes(&bytes).ok()
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Every sum changed after `since`, with the store's cursor, from one snapshot.
///
/// The store holds accumulator states (`STORE_FORMAT`); each is turned back into the sum it
/// stands for here, one exponentiation per record, so that the bundle carries sums a design
/// server can decrypt.
pub fn collect(store: &dyn Store, key: &PublicKey, since: Cursor) -> Result<Bundle, ExportError> {
    check_format(store)?;
    let count = key.size().ciphertexts_per_histogram();
    let mut entries = Vec::new();
    let mut cursor = Cursor(0);
    let mut bad: Option<ExportError> = None;
    store.scan(&[Table::Meta, Table::Ash], &mut |table, k, v| {
        match table {
            Table::Meta if k == meta::CURSOR => {
                if let Ok(b) = <[u8; 8]>::try_from(v) {
                    cursor = Cursor(u64::from_be_bytes(b));
                }
            }
            Table::Ash => match AshRecord::decode(k, v) {
                Ok(record) if record.changed > since => entries.push(record),
                Ok(_) => {}
                Err(e) => bad = Some(ExportError::Record(e.to_string())),
            },
            _ => {}
        }
        Ok(())
    })?;
    if let Some(e) = bad {
        return Err(e);
    }
    let entries = entries
        .into_iter()
        .map(|r| {
            let sums =
                Accumulator::restore(key, ACCUMULATOR_REPORT_BOUND, &r.sums, r.reports, r.samples)
                    .and_then(|state| state.sum())
                    .map_err(|e| {
                        ExportError::Record(format!(
                            "class {} catalogue {} counter {} generation {}: {e}",
                            r.key.class.0, r.key.catalogue.0, r.key.counter.0, r.generation.0
                        ))
                    })?
                    .to_bytes();
            Ok(BundleEntry {
                class: r.key.class,
                catalogue: r.key.catalogue,
                counter: r.key.counter,
                generation: r.generation,
                reports: r.reports,
                samples: r.samples,
                sums: PackedBytes::new(sums, count)?,
            })
        })
        .collect::<Result<_, ExportError>>()?;
    Ok(Bundle {
        signer: [0; 32],
        key_id: key.key_id(),
        since,
        cursor,
        day: today(),
        entries,
    })
}

/// [`collect`], then signed.
pub fn export(
    store: &dyn Store,
    key: &PublicKey,
    since: Cursor,
    signing: &SigningKey,
) -> Result<(Bundle, Vec<u8>), ExportError> {
    let mut bundle = collect(store, key, since)?;
    let bytes = bundle.sign(signing)?;
    bundle.signer = *signing.verifying_key().as_bytes();
    Ok((bundle, bytes))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn signing_key_is_created_private_and_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("server.key");
        let key = load_or_create_signing_key(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = load_or_create_signing_key(&path).unwrap();
        assert_eq!(key.to_bytes(), again.to_bytes());
        let public = std::fs::read_to_string(public_key_path(&path)).unwrap();
        assert_eq!(parse_public_key(&public), Some(key.verifying_key()));

        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        assert!(matches!(
            load_or_create_signing_key(&path),
            Err(ExportError::TooOpen { .. })
        ));
        let other = dir.path().join("junk.key");
        std::fs::write(&other, b"junk").unwrap();
        std::fs::set_permissions(&other, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        assert!(matches!(
            load_or_create_signing_key(&other),
            Err(ExportError::NotAKey(_))
        ));
    }
}
