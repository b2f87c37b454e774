//! The file a bundle's contributor evidence travels in, from the aggregation server to the
//! design server and on to the release auditor page by page (`crate::evidence` for what each
//! entry holds and how the auditor counts it). Only the framing lives here, so that the design
//! server, which forwards entries without reading them, needs no token code.

use thiserror::Error;

use crate::bundle::BundleHash;

/// The largest encoded evidence of one sum: about 36,000 reports of two 2048-bit ciphertexts.
/// A sub-sum holds 2 k T = 480 (`export::sub_sum_reports`), about 0.6 MB.
pub const MAX_SUM_EVIDENCE_BYTES: usize = 48 << 20;

/// Why an evidence file's framing is refused.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum EvidenceFileError {
    /// Not an evidence file.
    #[error("not a penrose evidence file")]
    NotEvidence,
    /// Another version of the format.
    #[error("evidence file version {0}, this build reads 1")]
    Version(u8),
    /// An entry longer than any sum's evidence.
    #[error("an evidence entry of {0} bytes, over the limit of {MAX_SUM_EVIDENCE_BYTES}")]
    EntryTooLarge(usize),
}

/// What a bundle's evidence file starts with (`penrose-aggregator export-evidence` writes it,
/// the design server forwards its entries page by page): `magic version:u8 bundle:[32]
/// entries:u32be`, then per entry of the bundle, in order, `len:u32be` and that entry's
/// [`SumEvidence::encode`]. Entries are read one at a time, so a file can be far larger than
/// memory.
pub const EVIDENCE_FILE_MAGIC: &[u8; 16] = b"penrose-evidence";

/// The evidence file version this build writes and reads.
pub const EVIDENCE_FILE_VERSION: u8 = 1;

/// The header's length.
pub const EVIDENCE_FILE_HEADER_BYTES: usize = EVIDENCE_FILE_MAGIC.len() + 1 + 32 + 4;

/// The header of a bundle's evidence file: which bundle (its hash) and how many entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EvidenceFileHeader {
    /// The hash of the signed bundle the evidence is of.
    pub bundle: BundleHash,
    /// Its entries (one evidence list each).
    pub entries: u32,
}

impl EvidenceFileHeader {
    /// The header bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(EVIDENCE_FILE_HEADER_BYTES);
        out.extend_from_slice(EVIDENCE_FILE_MAGIC);
        out.push(EVIDENCE_FILE_VERSION);
        out.extend_from_slice(&self.bundle.0);
        out.extend_from_slice(&self.entries.to_be_bytes());
        out
    }

    /// Reads a header; refuses another file or another version.
    pub fn decode(bytes: &[u8; EVIDENCE_FILE_HEADER_BYTES]) -> Result<Self, EvidenceFileError> {
        let (magic, rest) = bytes.split_at(EVIDENCE_FILE_MAGIC.len());
        if magic != EVIDENCE_FILE_MAGIC {
            return Err(EvidenceFileError::NotEvidence);
        }
        let (version, rest) = rest.split_at(1);
        if version != [EVIDENCE_FILE_VERSION] {
            return Err(EvidenceFileError::Version(version[0]));
        }
        let (hash, count) = rest.split_at(32);
        let mut bundle = [0u8; 32];
        bundle.copy_from_slice(hash);
        let mut entries = [0u8; 4];
        entries.copy_from_slice(count);
        Ok(EvidenceFileHeader {
            bundle: BundleHash(bundle),
            entries: u32::from_be_bytes(entries),
        })
    }
}

/// The length prefix of one entry of an evidence file.
pub fn entry_prefix(encoded: &[u8]) -> [u8; 4] {
    // Evidence is refused over MAX_SUM_EVIDENCE_BYTES when decoded, far inside u32.
    (encoded.len() as u32).to_be_bytes()
}

/// An entry's length from its prefix, refused over [`MAX_SUM_EVIDENCE_BYTES`] before anything
/// is allocated for it.
pub fn entry_len(prefix: [u8; 4]) -> Result<usize, EvidenceFileError> {
    let len = u32::from_be_bytes(prefix) as usize;
    if len > MAX_SUM_EVIDENCE_BYTES {
        return Err(EvidenceFileError::EntryTooLarge(len));
    }
    Ok(len)
}
