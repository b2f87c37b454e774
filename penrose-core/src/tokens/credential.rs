//! The enrolment credential's file: what `penrose-issuer enrol` writes for one host and what
//! the agent reads to ask for tokens. Pure text in, text out; reading and writing the file
//! (mode 0600, readable by the agent alone) is the caller's.
//!
//! ```text
//! penrose-issuer-credential 1                      header: the kind of file and its version
//! # comment lines (starting with '#') and blank lines are ignored
//! 5f0c...e1                                        the 32-byte secret, 64 hex digits
//! ```
//!
//! The header line comes first so that a wrong file (a key set, a certificate, a key ring) is
//! named as such rather than misread; the secret appears exactly once.

use thiserror::Error;

use super::protocol::{CREDENTIAL_BYTES, Credential};

/// The first line of every credential file, before the version.
pub const CREDENTIAL_FILE_MAGIC: &str = "penrose-issuer-credential";

/// The credential file format version this build writes and reads.
pub const CREDENTIAL_FILE_VERSION: u32 = 1;

/// The largest credential file a reader should accept (a few comment lines and the secret).
pub const MAX_CREDENTIAL_FILE: usize = 4096;

/// Why a text is not a credential file.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum CredentialFileError {
    /// The first line is not the credential header: another kind of file.
    #[error(
        "not a penrose issuer credential file (the first line is not `{CREDENTIAL_FILE_MAGIC} 1`)"
    )]
    NotACredential,
    /// A credential file of another version.
    #[error("credential file version {0} is not supported (this build reads version 1)")]
    UnsupportedVersion(String),
    /// Longer than [`MAX_CREDENTIAL_FILE`].
    #[error("a credential file is at most {MAX_CREDENTIAL_FILE} bytes; this one has {0}")]
    TooLarge(usize),
    /// No secret line.
    #[error("the credential file holds no secret line")]
    Missing,
    /// A line that is neither a comment nor 64 hex digits, or a second secret.
    #[error("line {0} of the credential file is not a comment and not the one 64-hex-digit secret")]
    BadLine(usize),
}

impl Credential {
    /// The credential file's text: header, a comment naming `id` (the issuer's short id of the
    /// credential, or anything else the writer wants the operator to see), the secret.
    pub fn to_file(&self, comment: &str) -> String {
        let mut text = format!("{CREDENTIAL_FILE_MAGIC} {CREDENTIAL_FILE_VERSION}\n");
        for line in comment.lines() {
            text.push_str("# ");
            text.push_str(line);
            text.push('\n');
        }
        text.push_str(&crate::hex::encode(&self.0));
        text.push('\n');
        text
    }

    /// Reads a credential file's text; refuses another kind of file, another version, and
    /// anything but exactly one secret line besides comments and blank lines.
    pub fn from_file(text: &str) -> Result<Self, CredentialFileError> {
        if text.len() > MAX_CREDENTIAL_FILE {
            return Err(CredentialFileError::TooLarge(text.len()));
        }
        let mut lines = text.lines();
        let header = lines.next().unwrap_or("").trim_end();
        let version = header
            .strip_prefix(CREDENTIAL_FILE_MAGIC)
            .and_then(|rest| rest.strip_prefix(' '))
            .ok_or(CredentialFileError::NotACredential)?;
        if version != CREDENTIAL_FILE_VERSION.to_string() {
            return Err(CredentialFileError::UnsupportedVersion(
                version.chars().take(16).collect(),
            ));
        }
        let mut secret = None;
        for (index, line) in lines.enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match crate::hex::decode_array::<CREDENTIAL_BYTES>(line) {
                Some(bytes) if secret.is_none() => secret = Some(bytes),
                // Line numbers from 1, the header being line 1.
                _ => return Err(CredentialFileError::BadLine(index + 2)),
            }
        }
        secret.map(Credential).ok_or(CredentialFileError::Missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_names_wrong_files() {
        let credential = Credential([0xa5; CREDENTIAL_BYTES]);
        let text = credential.to_file("id 0123456789abcdef\nenrolled 2026-12-01");
        assert!(text.starts_with("penrose-issuer-credential 1\n# id 0123456789abcdef\n"));
        assert_eq!(Credential::from_file(&text), Ok(credential.clone()));
        assert_eq!(
            Credential::from_file(&text.replace('\n', "\r\n")),
            Ok(credential.clone())
        );

        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        assert_eq!(
            Credential::from_file(pem),
            Err(CredentialFileError::NotACredential)
        );
        assert_eq!(
            Credential::from_file(""),
            Err(CredentialFileError::NotACredential)
        );
        assert_eq!(
            Credential::from_file("penrose-issuer-credential 2\n"),
            Err(CredentialFileError::UnsupportedVersion("2".into()))
        );
        assert_eq!(
            Credential::from_file("penrose-issuer-credential 1\n# nothing\n"),
            Err(CredentialFileError::Missing)
        );
        let twice = format!("{text}{}\n", crate::hex::encode(&credential.0));
        assert_eq!(
            Credential::from_file(&twice),
            Err(CredentialFileError::BadLine(5))
        );
        let short = "penrose-issuer-credential 1\nabcd\n";
        assert_eq!(
            Credential::from_file(short),
            Err(CredentialFileError::BadLine(2))
        );
        let huge = format!("{text}{}", "#".repeat(MAX_CREDENTIAL_FILE));
        assert!(matches!(
            Credential::from_file(&huge),
            Err(CredentialFileError::TooLarge(_))
        ));
    }
}
