//! Imported bundles: verified against the pinned aggregation server's key, kept verbatim, and
//! merged into the current value of every accumulator.
//!
//! A bundle entry is an accumulator's *current* value, not a delta (`penrose_core::bundle`), so
//! the archive keeps every verified bundle file as it arrived and, when asked, takes per
//! accumulator the entry of the bundle with the highest cursor. Importing a bundle twice, or an
//! older one after a newer one, changes nothing. Every bundle is verified again when merged, so
//! a file altered on disk is refused rather than decrypted.
//!
//! Layout of the archive directory:
//!
//! ```text
//! aggregator.pub            the trusted aggregation server's ed25519 key (64 hex digits),
//!                           pinned at the first import
//! bundles/CURSOR.bundle     each imported bundle, named by its cursor (20 digits)
//! ```

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use ed25519_dalek::VerifyingKey;
use penrose_core::bundle::{Bundle, BundleEntry, BundleError, ClassId, Cursor, Generation};
use penrose_core::counters::{CatalogueVersion, CounterId};
use penrose_core::paillier::KeyId;
use thiserror::Error;

/// Why a bundle could not be imported or the archive read.
#[derive(Debug, Error)]
pub enum ArchiveError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The bundle is malformed, altered, or signed by another server.
    #[error("{path}: {source}")]
    Bundle {
        /// The bundle file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: BundleError,
    },
    /// No aggregation server key is pinned yet and none was given.
    #[error(
        "no aggregation server key is trusted yet: pass --signer with the aggregator's signing-key .pub file"
    )]
    NoTrustedSigner,
    /// A key file is not 64 hex digits of an ed25519 public key.
    #[error("{0}: not an ed25519 public key (64 hex digits)")]
    BadSignerFile(PathBuf),
    /// The archive already trusts another aggregation server.
    #[error("this archive trusts aggregation server {trusted}, not {given}")]
    OtherSigner {
        /// The pinned key.
        trusted: String,
        /// The key given.
        given: String,
    },
    /// The bundle's sums are under another Paillier key than the archive's earlier bundles.
    #[error("bundle is under Paillier key {actual}, the archive holds sums under {expected}")]
    OtherPaillierKey {
        /// The key of the archive's bundles.
        expected: KeyId,
        /// The bundle's key.
        actual: KeyId,
    },
}

/// What an import did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Imported {
    /// A new bundle was added.
    New {
        /// Its cursor.
        cursor: u64,
        /// Its entries.
        entries: usize,
    },
    /// A bundle with this cursor was already imported (identical, or the import is refused).
    AlreadyImported {
        /// Its cursor.
        cursor: u64,
    },
}

/// The key of one accumulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AccumulatorKey {
    /// Class.
    pub class: ClassId,
    /// Catalogue version.
    pub catalogue: CatalogueVersion,
    /// Counter.
    pub counter: CounterId,
    /// Generation.
    pub generation: Generation,
}

/// Every accumulator's current value, merged from the imported bundles.
#[derive(Clone, Debug, Default)]
pub struct Aggregates {
    /// The Paillier key all sums are under (`None` when nothing is imported).
    pub key_id: Option<KeyId>,
    /// The highest cursor imported.
    pub cursor: Cursor,
    /// Bundles merged.
    pub bundles: usize,
    /// The latest entry of every accumulator.
    pub entries: BTreeMap<AccumulatorKey, BundleEntry>,
}

/// An archive directory.
#[derive(Debug)]
pub struct Archive {
    dir: PathBuf,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Reads an ed25519 public key written as 64 hex digits (the aggregator's `*.pub` file).
pub fn read_signer(path: &Path) -> Result<VerifyingKey, ArchiveError> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    parse_signer(text.trim()).ok_or_else(|| ArchiveError::BadSignerFile(path.to_owned()))
}

fn parse_signer(hex: &str) -> Option<VerifyingKey> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut bytes = [0u8; 32];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    VerifyingKey::from_bytes(&bytes).ok()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `bytes` to `path` so that a crash leaves either the old state or the whole file.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), ArchiveError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(bytes).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
    }
    std::fs::rename(&tmp, path).map_err(io(path))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

impl Archive {
    /// Opens (creating) the archive in `dir`.
    pub fn open(dir: &Path) -> Result<Self, ArchiveError> {
        std::fs::create_dir_all(dir.join("bundles")).map_err(io(dir))?;
        Ok(Self {
            dir: dir.to_owned(),
        })
    }

    fn signer_path(&self) -> PathBuf {
        self.dir.join("aggregator.pub")
    }

    fn bundle_path(&self, cursor: Cursor) -> PathBuf {
        self.dir
            .join("bundles")
            .join(format!("{:020}.bundle", cursor.0))
    }

    /// The pinned aggregation server key, if any.
    pub fn trusted_signer(&self) -> Result<Option<VerifyingKey>, ArchiveError> {
        let path = self.signer_path();
        if !path.exists() {
            return Ok(None);
        }
        read_signer(&path).map(Some)
    }

    /// Verifies the bundle at `path` (signature, and signer against the pinned key, or against
    /// `signer` which is then pinned) and adds it. A bundle that fails any check changes
    /// nothing.
    pub fn import(
        &self,
        path: &Path,
        signer: Option<&VerifyingKey>,
    ) -> Result<Imported, ArchiveError> {
        let trusted = match (self.trusted_signer()?, signer) {
            (Some(pinned), Some(given)) if pinned != *given => {
                return Err(ArchiveError::OtherSigner {
                    trusted: hex(pinned.as_bytes()),
                    given: hex(given.as_bytes()),
                });
            }
            (Some(pinned), _) => pinned,
            (None, Some(given)) => *given,
            (None, None) => return Err(ArchiveError::NoTrustedSigner),
        };
        let bytes = std::fs::read(path).map_err(io(path))?;
        let bundle =
            Bundle::verify(&bytes, Some(&trusted)).map_err(|source| ArchiveError::Bundle {
                path: path.to_owned(),
                source,
            })?;
        let current = self.merged()?;
        if let Some(expected) = current.key_id
            && expected != bundle.key_id
        {
            return Err(ArchiveError::OtherPaillierKey {
                expected,
                actual: bundle.key_id,
            });
        }
        let target = self.bundle_path(bundle.cursor);
        if target.exists() {
            return Ok(Imported::AlreadyImported {
                cursor: bundle.cursor.0,
            });
        }
        if self.trusted_signer()?.is_none() {
            write_atomically(
                &self.signer_path(),
                format!("{}\n", hex(trusted.as_bytes())).as_bytes(),
            )?;
        }
        write_atomically(&target, &bytes)?;
        Ok(Imported::New {
            cursor: bundle.cursor.0,
            entries: bundle.entries.len(),
        })
    }

    /// Every imported bundle, verified again, merged: per accumulator the entry of the bundle
    /// with the highest cursor.
    pub fn merged(&self) -> Result<Aggregates, ArchiveError> {
        let mut out = Aggregates::default();
        let Some(trusted) = self.trusted_signer()? else {
            return Ok(out);
        };
        let dir = self.dir.join("bundles");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(io(&dir))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "bundle"))
            .collect();
        // Names are zero-padded cursors: sorted names are sorted cursors.
        files.sort();
        for path in files {
            let bytes = std::fs::read(&path).map_err(io(&path))?;
            let bundle =
                Bundle::verify(&bytes, Some(&trusted)).map_err(|source| ArchiveError::Bundle {
                    path: path.clone(),
                    source,
                })?;
            out.key_id = Some(bundle.key_id);
            out.cursor = out.cursor.max(bundle.cursor);
            out.bundles += 1;
            for entry in bundle.entries {
                let key = AccumulatorKey {
                    class: entry.class,
                    catalogue: entry.catalogue,
                    counter: entry.counter,
                    generation: entry.generation,
                };
                out.entries.insert(key, entry);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signer_files_are_64_hex_digits_of_a_valid_key() {
        let key = ed25519_dalek::SigningKey::from_bytes(&[7u8; 32]).verifying_key();
        assert_eq!(parse_signer(&hex(key.as_bytes())), Some(key));
        assert_eq!(parse_signer("00"), None);
        assert_eq!(parse_signer(&"zz".repeat(32)), None);
        assert_eq!(parse_signer(&"é".repeat(32)), None);
    }
}
