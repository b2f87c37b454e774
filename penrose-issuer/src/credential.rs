//! Enrolment credentials: a random 32-byte secret per host, installed with the agent package
//! and shown to the issuer at issuance only. The issuer never stores the secret: it keys every
//! record by the credential's [`CredentialId`], a SHA-256 of the secret under a domain tag.
//!
//! The file the host gets is `penrose_core::tokens`' credential file (a header line, comment
//! lines, the secret in hex), written here with mode 0600 and never over an existing file.

use std::fmt;
use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::str::FromStr;

use penrose_core::tokens::MAX_CREDENTIAL_FILE;
use penrose_core::tokens::protocol::{CREDENTIAL_BYTES, Credential};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::error::IssuerError;

/// Domain tag of a credential's id.
const ID_DOMAIN: &[u8] = b"penrose/issuer/v1/credential";

/// Bytes of the short id `enrol` prints and `revoke` accepts (16 hex digits).
pub const SHORT_ID_BYTES: usize = 8;

/// A credential's id: `SHA-256("penrose/issuer/v1/credential" || secret)`, the key of every
/// record the issuer keeps about it. Written as hex; its first 16 digits are the short id.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CredentialId(pub [u8; 32]);

impl CredentialId {
    /// The id of a credential.
    pub fn of(credential: &Credential) -> Self {
        CredentialId(
            Sha256::new()
                .chain_update(ID_DOMAIN)
                .chain_update(credential.0)
                .finalize()
                .into(),
        )
    }

    /// The first 16 hex digits: what operators see and type.
    pub fn short(&self) -> String {
        penrose_core::hex::encode(&self.0[..SHORT_ID_BYTES])
    }
}

impl fmt::Display for CredentialId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&penrose_core::hex::encode(&self.0))
    }
}

impl fmt::Debug for CredentialId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CredentialId({})", self.short())
    }
}

impl FromStr for CredentialId {
    type Err = IssuerError;

    /// The full 64-digit id.
    fn from_str(text: &str) -> Result<Self, IssuerError> {
        penrose_core::hex::decode_array(text)
            .map(CredentialId)
            .ok_or_else(|| IssuerError::BadId(text.chars().take(80).collect()))
    }
}

/// A prefix of an id, as `revoke` takes it: 16 to 64 hex digits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdPrefix(Vec<u8>);

impl IdPrefix {
    /// The bytes of the prefix.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl FromStr for IdPrefix {
    type Err = IssuerError;

    fn from_str(text: &str) -> Result<Self, IssuerError> {
        let bad = || IssuerError::BadId(text.chars().take(80).collect());
        if text.len() < 2 * SHORT_ID_BYTES || text.len() > 64 {
            return Err(bad());
        }
        penrose_core::hex::decode(text)
            .map(IdPrefix)
            .ok_or_else(bad)
    }
}

impl fmt::Display for IdPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&penrose_core::hex::encode(&self.0))
    }
}

/// A fresh credential from the operating system's generator.
pub fn generate() -> Credential {
    let mut secret = [0u8; CREDENTIAL_BYTES];
    rand::rng().fill_bytes(&mut secret);
    Credential(secret)
}

/// Writes a credential file at `path` (mode 0600, never replacing a file or following a link,
/// synced), with a comment naming its short id.
pub fn write_file(path: &Path, credential: &Credential) -> Result<(), IssuerError> {
    let id = CredentialId::of(credential);
    let text = credential.to_file(&format!(
        "Penrose token issuer enrolment credential {}.\nSecret: readable by the agent alone \
         (mode 0600). Revoke with `penrose-issuer revoke {}`.",
        id.short(),
        id.short()
    ));
    crate::seed::create_secret(path, text.as_bytes())
}

/// Reads a credential file (at most [`MAX_CREDENTIAL_FILE`] bytes).
pub fn read_file(path: &Path) -> Result<Credential, IssuerError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(IssuerError::io(path))?;
    let mut bytes = Vec::new();
    file.take(MAX_CREDENTIAL_FILE as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(IssuerError::io(path))?;
    let text = String::from_utf8_lossy(&bytes);
    Credential::from_file(&text).map_err(|source| IssuerError::CredentialFile {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn files_round_trip_owner_only_and_ids_parse() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.credential");
        let credential = generate();
        write_file(&path, &credential).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(read_file(&path).unwrap(), credential);
        assert!(matches!(
            write_file(&path, &credential),
            Err(IssuerError::Exists(_))
        ));
        let id = CredentialId::of(&credential);
        assert_eq!(id.to_string().parse::<CredentialId>().unwrap(), id);
        assert_eq!(
            id.short().parse::<IdPrefix>().unwrap().bytes(),
            &id.0[..SHORT_ID_BYTES]
        );
        assert!("abc".parse::<IdPrefix>().is_err());
        assert!("zz".repeat(8).parse::<IdPrefix>().is_err());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(&id.short()));
        assert!(!text.contains(&id.to_string()));

        let wrong = dir.path().join("wrong");
        std::fs::write(&wrong, "-----BEGIN CERTIFICATE-----\n").unwrap();
        let err = read_file(&wrong).unwrap_err().to_string();
        assert!(
            err.contains("not a penrose issuer credential file"),
            "{err}"
        );
    }
}
