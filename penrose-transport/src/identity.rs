//! The server's certificate and key, and how a client decides to trust them.
//!
//! An aggregator usually runs with a self-signed certificate whose DER the agents pin
//! (docs/design.md section 5): no public CA is involved, and a vendor that has its own CA can use
//! [`Trust::Ca`] instead. Files are PEM (what operators expect) or raw DER (what the agent's
//! package ships); [`Identity::load`] and [`load_certificates`] tell them apart by content.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::error::IdentityError;

/// A certificate chain (end-entity first) and its private key, all DER. What a server proves
/// itself with.
#[derive(Debug)]
pub struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Identity {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

/// How a file is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// Base64 armour: `CERTIFICATE` blocks and one `PRIVATE KEY` (PKCS#8) block.
    Pem,
    /// Raw DER: exactly one certificate per file, the key as PKCS#8.
    Der,
}

impl Identity {
    /// An identity from DER parts; the chain must hold at least the end-entity certificate.
    /// rustls checks that key and certificate belong together when a server starts.
    pub fn new(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Identity, IdentityError> {
        if chain.is_empty() {
            return Err(IdentityError::NoCertificate(PathBuf::from("<memory>")));
        }
        Ok(Identity { chain, key })
    }

    /// A fresh ECDSA P-256 key and a self-signed certificate for `names` (DNS names or IP
    /// addresses), for a server whose agents pin the certificate, and for tests.
    pub fn self_signed<S: Into<String>>(
        names: impl IntoIterator<Item = S>,
    ) -> Result<Identity, IdentityError> {
        let names: Vec<String> = names.into_iter().map(Into::into).collect();
        let certified = rcgen::generate_simple_self_signed(names)?;
        let key = PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der());
        Ok(Identity {
            chain: vec![certified.cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(key),
        })
    }

    /// The end-entity certificate, which is what [`Trust::Pinned`] compares against.
    pub fn certificate(&self) -> &CertificateDer<'static> {
        // `new`, `self_signed` and `load` all refuse an empty chain.
        &self.chain[0]
    }

    /// The chain, end-entity first.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.chain
    }

    /// The private key.
    pub fn key(&self) -> &PrivateKeyDer<'static> {
        &self.key
    }

    /// Reads a certificate file and a key file, each PEM or DER.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Identity, IdentityError> {
        let chain = load_certificates(cert_path)?;
        let bytes = read(key_path)?;
        let key = if is_pem(&bytes) {
            PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| IdentityError::NoKey {
                path: key_path.to_owned(),
                reason: e.to_string(),
            })?
        } else {
            PrivateKeyDer::try_from(bytes).map_err(|reason| IdentityError::NoKey {
                path: key_path.to_owned(),
                reason: reason.to_owned(),
            })?
        };
        Ok(Identity { chain, key })
    }

    /// Writes the certificate and key files; the key file is created readable by its owner
    /// only. DER holds one certificate, so a longer chain must be saved as PEM.
    pub fn save(
        &self,
        cert_path: &Path,
        key_path: &Path,
        encoding: Encoding,
    ) -> Result<(), IdentityError> {
        let (certs, key) = match encoding {
            Encoding::Pem => {
                let blocks: Vec<pem::Pem> = self
                    .chain
                    .iter()
                    .map(|c| pem::Pem::new("CERTIFICATE", c.as_ref()))
                    .collect();
                let key = pem::Pem::new(key_tag(&self.key), self.key.secret_der());
                (
                    pem::encode_many(&blocks).into_bytes(),
                    pem::encode(&key).into_bytes(),
                )
            }
            Encoding::Der => {
                if self.chain.len() != 1 {
                    return Err(IdentityError::Io {
                        path: cert_path.to_owned(),
                        source: std::io::Error::new(
                            std::io::ErrorKind::InvalidInput,
                            "a DER file holds one certificate; save a chain as PEM",
                        ),
                    });
                }
                (
                    self.chain[0].as_ref().to_vec(),
                    self.key.secret_der().to_vec(),
                )
            }
        };
        write(cert_path, &certs, false)?;
        write(key_path, &key, true)
    }
}

/// What a client accepts as the server's certificate.
#[derive(Clone, Debug)]
pub enum Trust {
    /// Exactly this end-entity certificate (byte for byte); nothing else, whatever signed it.
    /// Names and validity dates are not checked: the pin is the whole decision.
    Pinned(CertificateDer<'static>),
    /// Any certificate for the server name that chains to one of these CA certificates.
    Ca(Vec<CertificateDer<'static>>),
}

impl Trust {
    /// Pins `identity`'s end-entity certificate.
    pub fn pin(identity: &Identity) -> Trust {
        Trust::Pinned(identity.certificate().clone())
    }

    /// Pins the first certificate in a PEM or DER file.
    pub fn load_pinned(path: &Path) -> Result<Trust, IdentityError> {
        let mut certs = load_certificates(path)?;
        Ok(Trust::Pinned(certs.swap_remove(0)))
    }

    /// Trusts the CA certificates in a PEM or DER file.
    pub fn load_ca(path: &Path) -> Result<Trust, IdentityError> {
        Ok(Trust::Ca(load_certificates(path)?))
    }
}

/// Reads the certificates of a PEM file (all `CERTIFICATE` blocks, in order) or the one
/// certificate of a DER file; refuses a file with none.
pub fn load_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, IdentityError> {
    let bytes = read(path)?;
    let certs = if is_pem(&bytes) {
        CertificateDer::pem_slice_iter(&bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| IdentityError::Pem {
                path: path.to_owned(),
                reason: e.to_string(),
            })?
    } else if bytes.first() == Some(&0x30) {
        // A DER certificate is an ASN.1 SEQUENCE; rustls checks the rest when it is used.
        vec![CertificateDer::from(bytes)]
    } else {
        Vec::new()
    };
    if certs.is_empty() {
        return Err(IdentityError::NoCertificate(path.to_owned()));
    }
    Ok(certs)
}

fn key_tag(key: &PrivateKeyDer<'_>) -> &'static str {
    match key {
        PrivateKeyDer::Pkcs1(_) => "RSA PRIVATE KEY",
        PrivateKeyDer::Sec1(_) => "EC PRIVATE KEY",
        _ => "PRIVATE KEY",
    }
}

fn is_pem(bytes: &[u8]) -> bool {
    bytes
        .windows(b"-----BEGIN".len())
        .any(|w| w == b"-----BEGIN")
}

fn read(path: &Path) -> Result<Vec<u8>, IdentityError> {
    fs::read(path).map_err(|source| IdentityError::Io {
        path: path.to_owned(),
        source,
    })
}

fn write(path: &Path, bytes: &[u8], secret: bool) -> Result<(), IdentityError> {
    let io = |source| IdentityError::Io {
        path: path.to_owned(),
        source,
    };
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut file = options.open(path).map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.sync_all().map_err(io)
}
