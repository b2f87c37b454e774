//! The release auditor's partial decryptions: asked for bundle by bundle, in chain order
//! (`penrose-design audit`), kept in the archive verbatim, and read back by the report, which
//! combines each with the design server's own (`crate::report`).
//!
//! Under a split key (`penrose-design keygen --split`) the design server alone decrypts
//! nothing: each released sum needs the auditor's partial decryption, which the auditor gives
//! once per sum of the one chain it follows, after its own checks (`penrose_core::audit`). The
//! design server forwards each archived bundle exactly as it was signed; the auditor answers a
//! page of entries at a time, since a partial decryption costs it about 165 ms.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use penrose_core::audit::{
    ALPN, AuditAnswer, AuditProtocolError, AuditRefusal, AuditRequest, MAX_AUDIT_MESSAGE,
};
use penrose_core::bundle::{BundleHash, InstanceId};
use penrose_transport::ClientError;
use penrose_transport::exchange::{ExchangeClient, Protocol};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::archive::{Archive, ArchiveError, ArchivedBundle, SumOrigin, io};
use crate::evidence::{EvidenceError, EvidenceFile};

/// The auditor's protocol on the exchange transport.
pub const PROTOCOL: Protocol = Protocol {
    alpn: ALPN,
    max_body: MAX_AUDIT_MESSAGE,
};

/// Entries asked for per exchange: 32 partial decryptions take the auditor about 5 s, well
/// inside the client's answer timeout.
pub const PAGE: u32 = 32;

/// Why the auditor's partials could not be fetched or read.
#[derive(Debug, Error)]
pub enum AuditError {
    /// The archive could not be read.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    /// The auditor could not be reached, or did not answer in time.
    #[error("asking the release auditor: {0}")]
    Transport(#[from] ClientError),
    /// The auditor's answer, or a kept one, does not decode.
    #[error("the release auditor's answer does not decode: {0}")]
    Protocol(#[from] AuditProtocolError),
    /// The auditor refused a bundle; nothing changed on either side.
    #[error("the release auditor refused bundle {seq} of chain {instance}: {refusal}")]
    Refused {
        /// The chain.
        instance: InstanceId,
        /// The bundle.
        seq: u64,
        /// Why.
        refusal: AuditRefusal,
    },
    /// A bundle's kept evidence could not be read, or is not of that bundle.
    #[error(transparent)]
    Evidence(#[from] EvidenceError),
    /// One entry's evidence is too large to travel in a request with its bundle.
    #[error(
        "the evidence of entry {entry} of bundle {seq} ({bytes} bytes) does not fit in one \
         request with its bundle (at most {MAX_AUDIT_MESSAGE} bytes)"
    )]
    TooLarge {
        /// The bundle.
        seq: u64,
        /// The entry.
        entry: u32,
        /// Its evidence's length.
        bytes: usize,
    },
    /// The auditor answered for another bundle or page than the one asked.
    #[error("the release auditor answered bundle {seq} of chain {instance} with {why}")]
    Mismatch {
        /// The chain.
        instance: InstanceId,
        /// The bundle.
        seq: u64,
        /// What does not match.
        why: &'static str,
    },
}

impl AuditError {
    /// Whether the auditor refused (exit code 3, as for a refused bundle).
    pub fn is_refusal(&self) -> bool {
        matches!(self, AuditError::Refused { .. })
    }
}

/// What one `audit` run did.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AuditSummary {
    /// Bundles in the archive.
    pub bundles: usize,
    /// Pages asked for in this run.
    pub pages_asked: usize,
    /// Pages already kept from earlier runs (not asked again).
    pub pages_kept: usize,
    /// Partial decryptions received in this run.
    pub partials: usize,
    /// Entries the auditor withheld in this run (under its own threshold).
    pub withheld: usize,
    /// Bundles whose contributor evidence was forwarded with their pages.
    pub bundles_with_evidence: usize,
}

/// Asks the auditor for every page of every archived bundle not yet answered, in chain order,
/// and keeps each answer in the archive before asking the next. Stops at the first refusal.
pub async fn fetch(archive: &Archive, client: &ExchangeClient) -> Result<AuditSummary, AuditError> {
    let bundles = archive.bundles()?;
    let mut summary = AuditSummary {
        bundles: bundles.len(),
        ..AuditSummary::default()
    };
    for bundle in &bundles {
        let evidence = kept_evidence(archive, bundle)?;
        for (first, count) in pages(bundle, evidence.as_ref())? {
            let path = archive.answer_path(bundle.instance, bundle.seq, first);
            if kept_answer(&path, bundle)?.is_some() {
                summary.pages_kept += 1;
                continue;
            }
            let request = AuditRequest::Release {
                bundle: bundle.bytes.clone(),
                first,
                count,
                evidence: match &evidence {
                    Some(file) => file.read(first, count)?,
                    None => Vec::new(),
                },
            };
            let body = client.exchange(&request.encode()).await?;
            let (partials, withheld) = check_answer(&body, bundle, first, count)?;
            write_durably(&path, &body)?;
            summary.pages_asked += 1;
            summary.partials += partials;
            summary.withheld += withheld;
        }
        summary.bundles_with_evidence += usize::from(evidence.is_some());
    }
    Ok(summary)
}

/// The evidence kept for `bundle`, checked to be of it; `None` when none was imported.
fn kept_evidence(
    archive: &Archive,
    bundle: &ArchivedBundle,
) -> Result<Option<EvidenceFile>, AuditError> {
    let path = archive.evidence_path(bundle.instance, bundle.seq);
    if !path.exists() {
        return Ok(None);
    }
    let file = EvidenceFile::open(&path)?;
    let header = file.header();
    if header.bundle != BundleHash::of(&bundle.bytes)
        || header.entries as usize != bundle.bundle.entries.len()
    {
        return Err(AuditError::Mismatch {
            instance: bundle.instance,
            seq: bundle.seq,
            why: "kept evidence of another bundle",
        });
    }
    Ok(Some(file))
}

/// The pages of a bundle: (first entry, count), at most [`PAGE`] entries each and, with
/// evidence, at most what fits in one request beside the bundle. A bundle with no entries is
/// one empty page, so that the auditor still takes it as the next link of its chain.
fn pages(
    bundle: &ArchivedBundle,
    evidence: Option<&EvidenceFile>,
) -> Result<Vec<(u32, u32)>, AuditError> {
    // A bundle is read whole into memory: far fewer than 2^32 entries.
    let entries = bundle.bundle.entries.len() as u32;
    if entries == 0 {
        return Ok(vec![(0, 0)]);
    }
    let Some(evidence) = evidence else {
        return Ok((0..entries)
            .step_by(PAGE as usize)
            .map(|first| (first, PAGE.min(entries - first)))
            .collect());
    };
    // The request's own fields: version, kind, first, count, two lengths and a count.
    let room = MAX_AUDIT_MESSAGE.saturating_sub(bundle.bytes.len() + 64);
    let sizes: Vec<usize> = (0..entries)
        .map(|entry| evidence.len_of(entry).unwrap_or(0) + 4)
        .collect();
    split_pages(&sizes, room).map_err(|entry| AuditError::TooLarge {
        seq: bundle.seq,
        entry,
        bytes: sizes[entry as usize],
    })
}

/// Pages over entries of `sizes` bytes each (at least one entry): at most [`PAGE`] entries
/// and `room` bytes a page. `Err(entry)` when that entry alone exceeds `room`.
fn split_pages(sizes: &[usize], room: usize) -> Result<Vec<(u32, u32)>, u32> {
    let mut pages = Vec::new();
    let (mut first, mut count, mut used) = (0u32, 0u32, 0usize);
    for (entry, &bytes) in (0u32..).zip(sizes) {
        if bytes > room {
            return Err(entry);
        }
        if count == PAGE || used + bytes > room {
            pages.push((first, count));
            (first, count, used) = (entry, 0, 0);
        }
        count += 1;
        used += bytes;
    }
    pages.push((first, count));
    Ok(pages)
}

/// Checks an answer is the partials of this bundle's page: (partials, withheld).
fn check_answer(
    body: &[u8],
    bundle: &ArchivedBundle,
    first: u32,
    count: u32,
) -> Result<(usize, usize), AuditError> {
    let mismatch = |why| AuditError::Mismatch {
        instance: bundle.instance,
        seq: bundle.seq,
        why,
    };
    match AuditAnswer::decode(body)? {
        AuditAnswer::Partials {
            hash,
            partials,
            withheld,
        } => {
            if hash != BundleHash::of(&bundle.bytes) {
                return Err(mismatch("another bundle's hash"));
            }
            let page = first..first.saturating_add(count);
            let mut seen: Vec<u32> = partials.iter().map(|p| p.entry).collect();
            seen.extend(&withheld);
            seen.sort_unstable();
            if seen != page.clone().collect::<Vec<u32>>() {
                return Err(mismatch("entries other than the page asked for"));
            }
            Ok((partials.len(), withheld.len()))
        }
        AuditAnswer::Refused(refusal) => Err(AuditError::Refused {
            instance: bundle.instance,
            seq: bundle.seq,
            refusal,
        }),
        AuditAnswer::Status(_) => Err(mismatch("its status")),
    }
}

/// A kept answer for the page at `path`, if there is one.
fn kept_answer(path: &Path, bundle: &ArchivedBundle) -> Result<Option<Vec<u8>>, AuditError> {
    match std::fs::read(path) {
        Ok(body) => match AuditAnswer::decode(&body)? {
            AuditAnswer::Partials { hash, .. } if hash == BundleHash::of(&bundle.bytes) => {
                Ok(Some(body))
            }
            _ => Err(AuditError::Mismatch {
                instance: bundle.instance,
                seq: bundle.seq,
                why: "a kept answer of another bundle",
            }),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(path)(e).into()),
    }
}

/// Writes `bytes` to `path` so that a crash leaves the old file or the new one, never a part
/// (its directory made first).
fn write_durably(path: &Path, bytes: &[u8]) -> Result<(), AuditError> {
    let dir = penrose_host::durable::parent(path);
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    penrose_host::durable::replace(path, bytes, penrose_host::durable::Access::Public)
        .map_err(|e| AuditError::Archive(e.into()))
}

/// The auditor's partial decryptions kept in the archive, by the sum they are of.
#[derive(Clone, Debug, Default)]
pub struct AuditorPartials {
    partials: BTreeMap<(InstanceId, u64, u32), Vec<u8>>,
}

impl AuditorPartials {
    /// Reads every kept answer of every archived bundle.
    pub fn load(archive: &Archive) -> Result<Self, AuditError> {
        let mut out = Self::default();
        for bundle in archive.bundles()? {
            let evidence = kept_evidence(archive, &bundle)?;
            for (first, _) in pages(&bundle, evidence.as_ref())? {
                let path = archive.answer_path(bundle.instance, bundle.seq, first);
                let Some(body) = kept_answer(&path, &bundle)? else {
                    continue;
                };
                if let AuditAnswer::Partials { partials, .. } = AuditAnswer::decode(&body)? {
                    for p in partials {
                        out.partials
                            .insert((bundle.instance, bundle.seq, p.entry), p.partial);
                    }
                }
            }
        }
        Ok(out)
    }

    /// The auditor's partial decryption of the sum at `origin`, as it sent it.
    pub fn get(&self, origin: &SumOrigin) -> Option<&[u8]> {
        self.partials
            .get(&(origin.instance, origin.seq, origin.index))
            .map(Vec::as_slice)
    }

    /// How many are kept.
    pub fn len(&self) -> usize {
        self.partials.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.partials.is_empty()
    }
}

/// Where answers of the archive at `dir` are kept (for operators and tests).
pub fn answers_dir(dir: &Path) -> PathBuf {
    dir.join("audit")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_hold_at_most_a_page_of_entries_and_a_requests_room_of_evidence() {
        assert_eq!(
            split_pages(&[1; 70], 1000),
            Ok(vec![(0, 32), (32, 32), (64, 6)])
        );
        assert_eq!(
            split_pages(&[400, 400, 400, 100, 900], 1000),
            Ok(vec![(0, 2), (2, 2), (4, 1)])
        );
        assert_eq!(split_pages(&[1000], 1000), Ok(vec![(0, 1)]));
        assert_eq!(split_pages(&[10, 1001, 10], 1000), Err(1));
    }
}
