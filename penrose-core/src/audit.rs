//! The release auditor's protocol: how the design server asks the second key holder for its
//! partial decryptions of a bundle's released sums (issue 26; `docs/crypto.md`, "Threshold
//! decryption (2-of-2)").
//!
//! The Paillier key is split at generation between the design server and the auditor
//! ([`crate::paillier::threshold`]), so a sum decrypts only with a partial decryption from
//! each. The auditor follows exactly one aggregation server's bundle chain: the design server
//! forwards each bundle it imported, in chain order, exactly as signed, and the auditor checks
//! it (the pinned signer, the chain link, that none of its epochs was answered before under
//! any chain, its own threshold) before it returns one partial decryption per released sum.
//!
//! One request and one answer per exchange (`penrose_transport::exchange`, ALPN [`ALPN`]),
//! each body at most [`MAX_AUDIT_MESSAGE`] bytes. A bundle's partials come in pages of at most
//! [`MAX_PARTIALS_PER_PAGE`] entries: the request names the page, and carries the bundle again
//! (the auditor keeps no bundle, only what it answered).
//!
//! Bodies are `version:u8 kind:u8 ...`, integers big-endian, byte strings `len:u32be bytes`.

use thiserror::Error;

use crate::bundle::{BundleHash, EpochId, InstanceId};

/// The auditor endpoint's one ALPN.
pub const ALPN: &[u8] = b"penrose-auditor/1";

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u8 = 1;

/// The largest request or answer body: a bundle of about 60,000 sums, or a page of partials.
pub const MAX_AUDIT_MESSAGE: usize = 64 << 20;

/// The most partial decryptions one answer carries: 16,384 x 2,218 bytes (a 2048-bit key's
/// partial with its proofs) is 36 MB, inside [`MAX_AUDIT_MESSAGE`].
pub const MAX_PARTIALS_PER_PAGE: u32 = 16_384;

const KIND_RELEASE: u8 = 1;
const KIND_STATUS: u8 = 2;
/// A release that carries the page's contributor evidence (`crate::evidence`).
const KIND_RELEASE_EVIDENCED: u8 = 3;

const ANSWER_PARTIALS: u8 = 0;
const ANSWER_STATUS: u8 = 1;
const ANSWER_REFUSED: u8 = 2;

/// What the design server asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuditRequest {
    /// Partial decryptions of entries `first..first + count` of `bundle` (its bytes as
    /// signed by the aggregation server).
    Release {
        /// The signed bundle.
        bundle: Vec<u8>,
        /// The first entry of the page.
        first: u32,
        /// Entries in the page (1 to [`MAX_PARTIALS_PER_PAGE`]).
        count: u32,
        /// The encoded [`SumEvidence`](crate::evidence::SumEvidence) of each entry of the
        /// page, in order (`count` of them), as the aggregation server exported it; empty
        /// when the design server has none. An auditor that counts contributors itself
        /// refuses a page without it.
        evidence: Vec<Vec<u8>>,
    },
    /// Where the auditor stands in its chain.
    Status,
}

/// One released sum's partial decryption: its index in the bundle's entries and the
/// [`PartialDecryption`](crate::paillier::threshold::PartialDecryption) bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryPartial {
    /// Index into the bundle's entries.
    pub entry: u32,
    /// The encoded partial decryption.
    pub partial: Vec<u8>,
}

/// Where the auditor stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuditStatus {
    /// The chain it follows (`None` before its first bundle).
    pub instance: Option<InstanceId>,
    /// The last bundle it took (0: none).
    pub seq: u64,
    /// That bundle's hash (all zeros: none).
    pub hash: BundleHash,
}

/// The auditor's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuditAnswer {
    /// The page's partials: one per entry of the page that the auditor's own rule releases;
    /// the page's other entries are listed as withheld.
    Partials {
        /// The bundle answered.
        hash: BundleHash,
        /// Partials, by entry.
        partials: Vec<EntryPartial>,
        /// Entries of the page under the auditor's threshold.
        withheld: Vec<u32>,
    },
    /// The chain position.
    Status(AuditStatus),
    /// Nothing answered, and nothing changed at the auditor.
    Refused(AuditRefusal),
}

/// Why the auditor answered nothing. Each is final for that request: sending it again gets
/// the same answer, except [`AuditRefusal::Unavailable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum AuditRefusal {
    /// The request or the bundle does not decode.
    #[error("the request or its bundle does not decode")]
    Malformed,
    /// The bundle is not signed by the aggregation server the auditor follows.
    #[error("the bundle is not signed by the aggregation server this auditor follows")]
    WrongSigner,
    /// The bundle belongs to another chain (a backup or copy of the store makes a new one).
    #[error("the bundle belongs to another chain than the one this auditor follows")]
    OtherChain,
    /// The bundle is not the next of the chain.
    #[error("bundle {got} is not the next of the chain (the auditor expects {expected})")]
    OutOfOrder {
        /// The sequence number the auditor takes next.
        expected: u64,
        /// The bundle's.
        got: u64,
    },
    /// A bundle of this sequence number was taken with other bytes: the chain forked.
    #[error("bundle {seq} was taken before with other bytes: the chain forked")]
    Forked {
        /// The sequence number.
        seq: u64,
    },
    /// An epoch of the bundle was answered before, in this chain or another.
    #[error("epoch {} was answered before", .epoch.0)]
    EpochAnsweredBefore {
        /// The epoch.
        epoch: EpochId,
    },
    /// The bundle's sums are under a key the auditor holds no share of.
    #[error("the bundle's sums are under a key this auditor holds no share of")]
    UnknownKey,
    /// The page is empty, too long or beyond the bundle's entries.
    #[error(
        "the page asked for is empty, longer than {MAX_PARTIALS_PER_PAGE} or past the bundle's entries"
    )]
    BadPage,
    /// The auditor could not answer now (busy, or its record could not be written).
    #[error("the auditor cannot answer now; ask again later")]
    Unavailable,
    /// The auditor counts contributors from evidence, and the page's evidence for this entry
    /// is missing or does not list exactly that sum's reports (the aggregation server's
    /// doing: a client's bad token only goes uncounted).
    #[error("the evidence of entry {entry} is missing or does not list exactly its sum's reports")]
    BadEvidence {
        /// The entry.
        entry: u32,
    },
}

impl AuditRefusal {
    fn code(self) -> u8 {
        match self {
            AuditRefusal::Malformed => 1,
            AuditRefusal::WrongSigner => 2,
            AuditRefusal::OtherChain => 3,
            AuditRefusal::OutOfOrder { .. } => 4,
            AuditRefusal::Forked { .. } => 5,
            AuditRefusal::EpochAnsweredBefore { .. } => 6,
            AuditRefusal::UnknownKey => 7,
            AuditRefusal::BadPage => 8,
            AuditRefusal::Unavailable => 9,
            AuditRefusal::BadEvidence { .. } => 10,
        }
    }

    fn encode(self, out: &mut Vec<u8>) {
        out.push(self.code());
        match self {
            AuditRefusal::OutOfOrder { expected, got } => {
                out.extend_from_slice(&expected.to_be_bytes());
                out.extend_from_slice(&got.to_be_bytes());
            }
            AuditRefusal::Forked { seq } => out.extend_from_slice(&seq.to_be_bytes()),
            AuditRefusal::EpochAnsweredBefore { epoch } => {
                out.extend_from_slice(&epoch.0.to_be_bytes());
            }
            AuditRefusal::BadEvidence { entry } => out.extend_from_slice(&entry.to_be_bytes()),
            _ => {}
        }
    }

    fn decode(r: &mut Reader) -> Result<Self, AuditProtocolError> {
        Ok(match r.u8("refusal")? {
            1 => AuditRefusal::Malformed,
            2 => AuditRefusal::WrongSigner,
            3 => AuditRefusal::OtherChain,
            4 => AuditRefusal::OutOfOrder {
                expected: r.u64("expected sequence")?,
                got: r.u64("sequence")?,
            },
            5 => AuditRefusal::Forked {
                seq: r.u64("sequence")?,
            },
            6 => AuditRefusal::EpochAnsweredBefore {
                epoch: EpochId(r.u32("epoch")?),
            },
            7 => AuditRefusal::UnknownKey,
            8 => AuditRefusal::BadPage,
            9 => AuditRefusal::Unavailable,
            10 => AuditRefusal::BadEvidence {
                entry: r.u32("entry")?,
            },
            code => {
                return Err(AuditProtocolError::Unknown {
                    what: "refusal",
                    code,
                });
            }
        })
    }
}

/// Why an auditor message does not decode.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum AuditProtocolError {
    /// Longer than [`MAX_AUDIT_MESSAGE`].
    #[error("auditor message of {0} bytes exceeds the limit of {MAX_AUDIT_MESSAGE}")]
    TooLarge(usize),
    /// Ended before a field.
    #[error("auditor message truncated while reading {0}")]
    Truncated(&'static str),
    /// Bytes after the message.
    #[error("{0} unexpected bytes after the auditor message")]
    TrailingBytes(usize),
    /// Another protocol version.
    #[error("unsupported auditor protocol version {0} (this build speaks {PROTOCOL_VERSION})")]
    UnsupportedVersion(u8),
    /// An unknown request kind, answer status or refusal.
    #[error("unknown {what} {code}")]
    Unknown {
        /// The field.
        what: &'static str,
        /// Its value.
        code: u8,
    },
    /// More partials or withheld entries than a page holds.
    #[error("{0} entries in one answer (at most {MAX_PARTIALS_PER_PAGE})")]
    PageTooLong(usize),
    /// A release whose evidence is not one per entry of its page.
    #[error("{evidence} evidence lists for a page of {count} entries")]
    EvidenceCount {
        /// Entries in the page.
        count: u32,
        /// Evidence lists sent.
        evidence: usize,
    },
}

impl AuditRequest {
    /// The request body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![PROTOCOL_VERSION];
        match self {
            AuditRequest::Release {
                bundle,
                first,
                count,
                evidence,
            } => {
                out.push(if evidence.is_empty() {
                    KIND_RELEASE
                } else {
                    KIND_RELEASE_EVIDENCED
                });
                out.extend_from_slice(&first.to_be_bytes());
                out.extend_from_slice(&count.to_be_bytes());
                write_bytes(&mut out, bundle);
                if !evidence.is_empty() {
                    write_count(&mut out, evidence.len());
                    for e in evidence {
                        write_bytes(&mut out, e);
                    }
                }
            }
            AuditRequest::Status => out.push(KIND_STATUS),
        }
        out
    }

    /// Decodes a request body; refuses anything that is not exactly one request.
    pub fn decode(bytes: &[u8]) -> Result<Self, AuditProtocolError> {
        let mut r = Reader::new(bytes)?;
        let request = match r.u8("request kind")? {
            kind @ (KIND_RELEASE | KIND_RELEASE_EVIDENCED) => {
                let first = r.u32("first entry")?;
                let count = r.u32("entry count")?;
                let bundle = r.bytes("bundle")?.to_vec();
                let evidence = if kind == KIND_RELEASE_EVIDENCED {
                    decode_evidence(&mut r, count)?
                } else {
                    Vec::new()
                };
                AuditRequest::Release {
                    bundle,
                    first,
                    count,
                    evidence,
                }
            }
            KIND_STATUS => AuditRequest::Status,
            code => {
                return Err(AuditProtocolError::Unknown {
                    what: "request kind",
                    code,
                });
            }
        };
        r.finish()?;
        Ok(request)
    }
}

impl AuditAnswer {
    /// The answer body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![PROTOCOL_VERSION];
        match self {
            AuditAnswer::Partials {
                hash,
                partials,
                withheld,
            } => {
                out.push(ANSWER_PARTIALS);
                out.extend_from_slice(&hash.0);
                write_count(&mut out, partials.len());
                for p in partials {
                    out.extend_from_slice(&p.entry.to_be_bytes());
                    write_bytes(&mut out, &p.partial);
                }
                write_count(&mut out, withheld.len());
                for w in withheld {
                    out.extend_from_slice(&w.to_be_bytes());
                }
            }
            AuditAnswer::Status(status) => {
                out.push(ANSWER_STATUS);
                match status.instance {
                    None => out.push(0),
                    Some(id) => {
                        out.push(1);
                        out.extend_from_slice(&id.0);
                    }
                }
                out.extend_from_slice(&status.seq.to_be_bytes());
                out.extend_from_slice(&status.hash.0);
            }
            AuditAnswer::Refused(refusal) => {
                out.push(ANSWER_REFUSED);
                refusal.encode(&mut out);
            }
        }
        out
    }

    /// Decodes an answer body; refuses anything that is not exactly one answer.
    pub fn decode(bytes: &[u8]) -> Result<Self, AuditProtocolError> {
        let mut r = Reader::new(bytes)?;
        let answer = match r.u8("answer status")? {
            ANSWER_PARTIALS => decode_partials(&mut r)?,
            ANSWER_STATUS => AuditAnswer::Status(decode_status(&mut r)?),
            ANSWER_REFUSED => AuditAnswer::Refused(AuditRefusal::decode(&mut r)?),
            code => {
                return Err(AuditProtocolError::Unknown {
                    what: "answer status",
                    code,
                });
            }
        };
        r.finish()?;
        Ok(answer)
    }
}

/// One evidence list per entry of a page of `count` entries (at least one).
fn decode_evidence(r: &mut Reader, count: u32) -> Result<Vec<Vec<u8>>, AuditProtocolError> {
    let n = r.count("evidence count")?;
    if n != count as usize || n == 0 {
        return Err(AuditProtocolError::EvidenceCount { count, evidence: n });
    }
    (0..n)
        .map(|_| r.bytes("evidence").map(<[u8]>::to_vec))
        .collect()
}

fn decode_partials(r: &mut Reader) -> Result<AuditAnswer, AuditProtocolError> {
    let hash = BundleHash(r.array("bundle hash")?);
    let count = r.count("partial count")?;
    let mut partials = Vec::with_capacity(count);
    for _ in 0..count {
        let entry = r.u32("entry")?;
        let partial = r.bytes("partial")?.to_vec();
        partials.push(EntryPartial { entry, partial });
    }
    let count = r.count("withheld count")?;
    let mut withheld = Vec::with_capacity(count);
    for _ in 0..count {
        withheld.push(r.u32("withheld entry")?);
    }
    Ok(AuditAnswer::Partials {
        hash,
        partials,
        withheld,
    })
}

fn decode_status(r: &mut Reader) -> Result<AuditStatus, AuditProtocolError> {
    let instance = match r.u8("instance flag")? {
        0 => None,
        1 => Some(InstanceId(r.array("instance")?)),
        code => {
            return Err(AuditProtocolError::Unknown {
                what: "instance flag",
                code,
            });
        }
    };
    Ok(AuditStatus {
        instance,
        seq: r.u64("sequence")?,
        hash: BundleHash(r.array("bundle hash")?),
    })
}

fn write_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    // Bodies are at most MAX_AUDIT_MESSAGE (64 MiB), so a length fits a u32.
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn write_count(out: &mut Vec<u8>, count: usize) {
    out.extend_from_slice(&(count as u32).to_be_bytes());
}

/// Reads fields off a body, each checked against what is left before anything is allocated.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Result<Self, AuditProtocolError> {
        if bytes.len() > MAX_AUDIT_MESSAGE {
            return Err(AuditProtocolError::TooLarge(bytes.len()));
        }
        let mut r = Reader { rest: bytes };
        match r.u8("version")? {
            PROTOCOL_VERSION => Ok(r),
            other => Err(AuditProtocolError::UnsupportedVersion(other)),
        }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], AuditProtocolError> {
        if self.rest.len() < n {
            return Err(AuditProtocolError::Truncated(what));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], AuditProtocolError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, AuditProtocolError> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, AuditProtocolError> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, AuditProtocolError> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }

    fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], AuditProtocolError> {
        let len = self.u32(what)? as usize;
        self.take(len, what)
    }

    /// A count of page entries, refused beyond a page before anything is allocated.
    fn count(&mut self, what: &'static str) -> Result<usize, AuditProtocolError> {
        let count = self.u32(what)? as usize;
        if count > MAX_PARTIALS_PER_PAGE as usize {
            return Err(AuditProtocolError::PageTooLong(count));
        }
        Ok(count)
    }

    fn finish(self) -> Result<(), AuditProtocolError> {
        match self.rest.len() {
            0 => Ok(()),
            n => Err(AuditProtocolError::TrailingBytes(n)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn answers() -> Vec<AuditAnswer> {
        let refusals = [
            AuditRefusal::Malformed,
            AuditRefusal::WrongSigner,
            AuditRefusal::OtherChain,
            AuditRefusal::OutOfOrder {
                expected: 4,
                got: 9,
            },
            AuditRefusal::Forked { seq: 3 },
            AuditRefusal::EpochAnsweredBefore {
                epoch: EpochId(20_000),
            },
            AuditRefusal::UnknownKey,
            AuditRefusal::BadPage,
            AuditRefusal::Unavailable,
            AuditRefusal::BadEvidence { entry: 70_000 },
        ];
        let mut all: Vec<AuditAnswer> = refusals.into_iter().map(AuditAnswer::Refused).collect();
        all.push(AuditAnswer::Partials {
            hash: BundleHash([7; 32]),
            partials: vec![
                EntryPartial {
                    entry: 0,
                    partial: vec![1, 2, 3],
                },
                EntryPartial {
                    entry: 5,
                    partial: vec![9; 40],
                },
            ],
            withheld: vec![1, 2],
        });
        all.push(AuditAnswer::Status(AuditStatus {
            instance: None,
            seq: 0,
            hash: BundleHash::default(),
        }));
        all.push(AuditAnswer::Status(AuditStatus {
            instance: Some(InstanceId([3; 16])),
            seq: 12,
            hash: BundleHash([1; 32]),
        }));
        all
    }

    #[test]
    fn a_release_carries_one_evidence_list_per_entry_of_its_page() {
        let release = |count, evidence| AuditRequest::Release {
            bundle: vec![5; 30],
            first: 0,
            count,
            evidence,
        };
        for (count, lists) in [(3, 2), (2, 3)] {
            let bytes = release(count, vec![vec![1u8; 4]; lists]).encode();
            assert_eq!(
                AuditRequest::decode(&bytes),
                Err(AuditProtocolError::EvidenceCount {
                    count,
                    evidence: lists
                })
            );
        }
        // A release without evidence is the version-1 request, byte for byte.
        let plain = release(2, Vec::new()).encode();
        assert_eq!(plain[1], KIND_RELEASE);
        assert_eq!(
            release(1, vec![Vec::new()]).encode()[1],
            KIND_RELEASE_EVIDENCED
        );
    }

    #[test]
    fn every_message_round_trips_and_every_cut_or_extension_is_refused() {
        let requests = [
            AuditRequest::Status,
            AuditRequest::Release {
                bundle: vec![5; 300],
                first: 2,
                count: 10,
                evidence: Vec::new(),
            },
            AuditRequest::Release {
                bundle: vec![5; 300],
                first: 2,
                count: 3,
                evidence: vec![vec![1; 20], Vec::new(), vec![3; 7]],
            },
        ];
        for request in &requests {
            let bytes = request.encode();
            assert_eq!(&AuditRequest::decode(&bytes).unwrap(), request);
            for cut in 0..bytes.len() {
                assert!(AuditRequest::decode(&bytes[..cut]).is_err(), "{cut}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert_eq!(
                AuditRequest::decode(&longer),
                Err(AuditProtocolError::TrailingBytes(1))
            );
        }
        for answer in answers() {
            let bytes = answer.encode();
            assert_eq!(AuditAnswer::decode(&bytes).unwrap(), answer);
            for cut in 0..bytes.len() {
                assert!(
                    AuditAnswer::decode(&bytes[..cut]).is_err(),
                    "{answer:?} {cut}"
                );
            }
        }
    }

    #[test]
    fn unknown_versions_kinds_and_oversized_pages_are_refused() {
        let mut bytes = AuditRequest::Status.encode();
        bytes[0] = 2;
        assert_eq!(
            AuditRequest::decode(&bytes),
            Err(AuditProtocolError::UnsupportedVersion(2))
        );
        assert!(matches!(
            AuditRequest::decode(&[PROTOCOL_VERSION, 77]),
            Err(AuditProtocolError::Unknown { code: 77, .. })
        ));
        assert!(matches!(
            AuditAnswer::decode(&[PROTOCOL_VERSION, ANSWER_REFUSED, 200]),
            Err(AuditProtocolError::Unknown { code: 200, .. })
        ));
        let mut page = vec![PROTOCOL_VERSION, ANSWER_PARTIALS];
        page.extend_from_slice(&[0; 32]);
        page.extend_from_slice(&(MAX_PARTIALS_PER_PAGE + 1).to_be_bytes());
        assert_eq!(
            AuditAnswer::decode(&page),
            Err(AuditProtocolError::PageTooLong(
                MAX_PARTIALS_PER_PAGE as usize + 1
            ))
        );
        let huge = vec![PROTOCOL_VERSION; MAX_AUDIT_MESSAGE + 1];
        assert_eq!(
            AuditRequest::decode(&huge),
            Err(AuditProtocolError::TooLarge(MAX_AUDIT_MESSAGE + 1))
        );
    }
}
