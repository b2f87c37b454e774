//! The issuance protocol: what an agent and the issuer service say to each other, one request
//! and one answer per stream (framing and transport are the service's; these are the bodies).
//!
//! ```text
//! request   = version:u8(=1)  kind:u8  payload
//!   kind 1, key set   (no payload)          asked on a connection of its own, no credential
//!   kind 2, issue     credential:[32]  n:u8  (len:u16be  blinded_request:[len]) * n
//! answer    = version:u8(=1)  status:u8  payload
//!   status 0, key set   key_set bytes (KeySet::encode)
//!   status 1, issued    n:u8  (outcome:u8  payload) * n, one per batch, in order
//!       outcome 0  len:u16be  issue_response:[len]
//!       outcome 1  remaining:u16be       quota of that (epoch, scope) left: ask for at most this
//!       outcome 2                        no key of that epoch and key id (not issued now)
//!       outcome 3                        the batch does not decode (malformed or invalid)
//!   status 2, refused   reason:u8        the whole request (see [`Refusal`])
//! ```
//!
//! Blinded requests and issue responses stay bytes here: only a party holding the key set can
//! decode them ([`BlindedRequest::decode`](super::BlindedRequest::decode),
//! [`IssueResponse::decode`](super::IssueResponse::decode)). Every length is checked against
//! what remains before anything is copied, and the whole message against
//! [`MAX_ISSUER_MESSAGE`] by the transport before it is read.
//!
//! The credential proves fleet membership at issuance only. It never reaches the aggregation
//! server, and the tokens it buys are blinded, so the issuer's records of who asked (credential,
//! epoch, scope, count, time) share no value with the tokens spent on reports. A host's
//! credential is installed as a small text file ([`Credential::to_file`],
//! [`Credential::from_file`] in `super::credential`), the one format the issuer writes and the
//! agent reads.

use thiserror::Error;

use super::MAX_BATCH;

/// The ALPN of the issuer's endpoint (a QUIC request/answer endpoint,
/// `penrose_transport::exchange`): never the report endpoint's, so that neither server can
/// be handed the other's traffic.
pub const ALPN: &[u8] = b"penrose-issuer/1";

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u8 = 1;

/// Bytes of an enrolment credential: a random secret installed on one host.
pub const CREDENTIAL_BYTES: usize = 32;

/// The most batches one issue request may carry: one per scope of an epoch, with room.
pub const MAX_BATCHES: usize = 32;

/// The largest request or answer body either side reads: [`MAX_BATCHES`] batches of
/// [`MAX_BATCH`](super::MAX_BATCH) tokens (about 67 KB of elements), or a full key set of
/// [`MAX_KEY_SET`](super::MAX_KEY_SET) keys (about 156 KB).
pub const MAX_ISSUER_MESSAGE: usize = 160 * 1024;

const KIND_KEY_SET: u8 = 1;
const KIND_ISSUE: u8 = 2;
const STATUS_KEY_SET: u8 = 0;
const STATUS_ISSUED: u8 = 1;
const STATUS_REFUSED: u8 = 2;

/// A host's enrolment credential. Secret: whoever holds it gets that host's tokens. `Debug`
/// never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential(pub [u8; CREDENTIAL_BYTES]);

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credential(..)")
    }
}

/// An agent's request to the issuer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IssuerRequest {
    /// The published key set. Carries nothing about the asker.
    KeySet,
    /// Tokens: one encoded [`BlindedRequest`](super::BlindedRequest) per batch, each under one
    /// (epoch, scope)'s key.
    Issue {
        /// The host's enrolment credential.
        credential: Credential,
        /// The encoded blinded requests, in order.
        batches: Vec<Vec<u8>>,
    },
}

/// What became of one batch of an issue request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchOutcome {
    /// Issued: the encoded [`IssueResponse`](super::IssueResponse).
    Issued(Vec<u8>),
    /// Not issued: the credential has only this many tokens of that (epoch, scope) left (0
    /// when its quota is spent; it is refilled with the next epoch).
    Quota {
        /// Tokens the credential may still ask for under that key.
        remaining: u16,
    },
    /// Not issued: the issuer issues no key of that epoch and key id now (an epoch too far
    /// ahead or past, or a key id it never published).
    UnknownKey,
    /// Not issued: the batch does not decode (wrong length, invalid elements, too many).
    Invalid,
}

/// Why the issuer refused a whole request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum Refusal {
    /// The credential is not enrolled (or was revoked).
    #[error("the credential is not enrolled")]
    UnknownCredential,
    /// The credential asked too often; ask again later.
    #[error("the credential asked too often; retry later")]
    RateLimited,
    /// The request does not decode.
    #[error("the request is malformed")]
    Malformed,
    /// Another protocol version.
    #[error("unsupported issuance protocol version")]
    UnsupportedVersion,
    /// The issuer cannot answer now (its store failed, or it is shutting down).
    #[error("the issuer is unavailable; retry later")]
    Unavailable,
    /// A code this build does not know.
    #[error("refused for reason {0}")]
    Other(u8),
}

impl Refusal {
    /// The stable code.
    pub fn code(self) -> u8 {
        match self {
            Refusal::UnknownCredential => 1,
            Refusal::RateLimited => 2,
            Refusal::Malformed => 3,
            Refusal::UnsupportedVersion => 4,
            Refusal::Unavailable => 5,
            Refusal::Other(code) => code,
        }
    }

    /// The refusal of a code.
    pub fn from_code(code: u8) -> Self {
        match code {
            1 => Refusal::UnknownCredential,
            2 => Refusal::RateLimited,
            3 => Refusal::Malformed,
            4 => Refusal::UnsupportedVersion,
            5 => Refusal::Unavailable,
            other => Refusal::Other(other),
        }
    }

    /// Whether asking again later may succeed.
    pub fn retry_later(self) -> bool {
        matches!(self, Refusal::RateLimited | Refusal::Unavailable)
    }
}

/// The issuer's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IssuerAnswer {
    /// The encoded [`KeySet`](super::KeySet).
    KeySet(Vec<u8>),
    /// One outcome per batch of the request, in order.
    Issued(Vec<BatchOutcome>),
    /// The whole request was refused.
    Refused(Refusal),
}

/// Why a protocol message does not decode.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ProtocolError {
    /// Longer than [`MAX_ISSUER_MESSAGE`].
    #[error("issuer message of {0} bytes exceeds the limit of {MAX_ISSUER_MESSAGE}")]
    TooLarge(usize),
    /// Ended before a field.
    #[error("issuer message truncated while reading {0}")]
    Truncated(&'static str),
    /// Bytes after the message.
    #[error("{0} unexpected bytes after the issuer message")]
    TrailingBytes(usize),
    /// Another protocol version.
    #[error("unsupported issuance protocol version {0} (this build speaks {PROTOCOL_VERSION})")]
    UnsupportedVersion(u8),
    /// An unknown request kind, answer status or batch outcome.
    #[error("unknown {what} {code}")]
    Unknown {
        /// The field.
        what: &'static str,
        /// Its value.
        code: u8,
    },
    /// No batches, or more than [`MAX_BATCHES`].
    #[error("{0} batches in an issue message (1 to {MAX_BATCHES} allowed)")]
    BatchCount(usize),
}

impl IssuerRequest {
    /// The request body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![PROTOCOL_VERSION];
        match self {
            IssuerRequest::KeySet => out.push(KIND_KEY_SET),
            IssuerRequest::Issue {
                credential,
                batches,
            } => {
                out.push(KIND_ISSUE);
                out.extend_from_slice(&credential.0);
                write_batches(&mut out, batches.iter().map(Vec::as_slice));
            }
        }
        out
    }

    /// Decodes a request body; refuses anything that is not exactly one request.
    pub fn decode(bytes: &[u8]) -> Result<Self, ProtocolError> {
        let mut r = Cursor::new(bytes)?;
        let kind = r.u8("request kind")?;
        let request = match kind {
            KIND_KEY_SET => IssuerRequest::KeySet,
            KIND_ISSUE => {
                let credential = Credential(r.array("credential")?);
                let count = batch_count(r.u8("batch count")?)?;
                let mut batches = Vec::with_capacity(count);
                for _ in 0..count {
                    let len = usize::from(r.u16("batch length")?);
                    batches.push(r.bytes(len, "batch")?.to_vec());
                }
                IssuerRequest::Issue {
                    credential,
                    batches,
                }
            }
            code => {
                return Err(ProtocolError::Unknown {
                    what: "request kind",
                    code,
                });
            }
        };
        r.finish()?;
        Ok(request)
    }
}

impl IssuerAnswer {
    /// The answer body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![PROTOCOL_VERSION];
        match self {
            IssuerAnswer::KeySet(set) => {
                out.push(STATUS_KEY_SET);
                out.extend_from_slice(set);
            }
            IssuerAnswer::Issued(outcomes) => {
                out.push(STATUS_ISSUED);
                // Outcomes answer a request's batches, at most MAX_BATCHES < 256.
                out.push(outcomes.len().min(usize::from(u8::MAX)) as u8);
                for outcome in outcomes.iter().take(usize::from(u8::MAX)) {
                    match outcome {
                        BatchOutcome::Issued(response) => {
                            out.push(0);
                            push_len(&mut out, response.len());
                            out.extend_from_slice(response);
                        }
                        BatchOutcome::Quota { remaining } => {
                            out.push(1);
                            out.extend_from_slice(&remaining.to_be_bytes());
                        }
                        BatchOutcome::UnknownKey => out.push(2),
                        BatchOutcome::Invalid => out.push(3),
                    }
                }
            }
            IssuerAnswer::Refused(refusal) => {
                out.push(STATUS_REFUSED);
                out.push(refusal.code());
            }
        }
        out
    }

    /// Decodes an answer body.
    pub fn decode(bytes: &[u8]) -> Result<Self, ProtocolError> {
        let mut r = Cursor::new(bytes)?;
        let answer = match r.u8("answer status")? {
            STATUS_KEY_SET => IssuerAnswer::KeySet(r.rest().to_vec()),
            STATUS_ISSUED => {
                let count = batch_count(r.u8("batch count")?)?;
                let mut outcomes = Vec::with_capacity(count);
                for _ in 0..count {
                    let outcome = match r.u8("batch outcome")? {
                        0 => {
                            let len = usize::from(r.u16("response length")?);
                            BatchOutcome::Issued(r.bytes(len, "response")?.to_vec())
                        }
                        1 => BatchOutcome::Quota {
                            remaining: r.u16("remaining quota")?,
                        },
                        2 => BatchOutcome::UnknownKey,
                        3 => BatchOutcome::Invalid,
                        code => {
                            return Err(ProtocolError::Unknown {
                                what: "batch outcome",
                                code,
                            });
                        }
                    };
                    outcomes.push(outcome);
                }
                IssuerAnswer::Issued(outcomes)
            }
            STATUS_REFUSED => IssuerAnswer::Refused(Refusal::from_code(r.u8("refusal")?)),
            code => {
                return Err(ProtocolError::Unknown {
                    what: "answer status",
                    code,
                });
            }
        };
        r.finish()?;
        Ok(answer)
    }
}

fn batch_count(count: u8) -> Result<usize, ProtocolError> {
    let count = usize::from(count);
    if count == 0 || count > MAX_BATCHES {
        return Err(ProtocolError::BatchCount(count));
    }
    Ok(count)
}

fn write_batches<'a>(out: &mut Vec<u8>, batches: impl ExactSizeIterator<Item = &'a [u8]>) {
    // Callers build at most MAX_BATCHES batches of at most MAX_BATCH elements (about 2 KB each).
    out.push(batches.len().min(usize::from(u8::MAX)) as u8);
    for batch in batches {
        push_len(out, batch.len());
        out.extend_from_slice(batch);
    }
}

fn push_len(out: &mut Vec<u8>, len: usize) {
    // Batches and responses of at most MAX_BATCH elements are far below 64 KiB.
    debug_assert!(len <= usize::from(u16::MAX) && MAX_BATCH * 32 + 102 <= usize::from(u16::MAX));
    out.extend_from_slice(&(len.min(usize::from(u16::MAX)) as u16).to_be_bytes());
}

/// A cursor over a message that names the field it could not read.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    /// Checks the size and the version, and starts after the version.
    fn new(bytes: &'a [u8]) -> Result<Self, ProtocolError> {
        if bytes.len() > MAX_ISSUER_MESSAGE {
            return Err(ProtocolError::TooLarge(bytes.len()));
        }
        let mut r = Cursor(bytes);
        let version = r.u8("version")?;
        if version != PROTOCOL_VERSION {
            return Err(ProtocolError::UnsupportedVersion(version));
        }
        Ok(r)
    }

    fn bytes(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], ProtocolError> {
        if self.0.len() < n {
            return Err(ProtocolError::Truncated(field));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], ProtocolError> {
        let (head, tail) = self
            .0
            .split_first_chunk::<N>()
            .ok_or(ProtocolError::Truncated(field))?;
        self.0 = tail;
        Ok(*head)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, ProtocolError> {
        Ok(u8::from_be_bytes(self.array(field)?))
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, ProtocolError> {
        Ok(u16::from_be_bytes(self.array(field)?))
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }

    fn finish(self) -> Result<(), ProtocolError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ProtocolError::TrailingBytes(self.0.len()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requests() -> Vec<IssuerRequest> {
        vec![
            IssuerRequest::KeySet,
            IssuerRequest::Issue {
                credential: Credential([7; 32]),
                batches: vec![vec![1, 2, 3], vec![], vec![9; 300]],
            },
        ]
    }

    fn answers() -> Vec<IssuerAnswer> {
        vec![
            IssuerAnswer::KeySet(vec![2, 0, 1, 5]),
            IssuerAnswer::Issued(vec![
                BatchOutcome::Issued(vec![4; 100]),
                BatchOutcome::Quota { remaining: 3 },
                BatchOutcome::UnknownKey,
                BatchOutcome::Invalid,
            ]),
            IssuerAnswer::Refused(Refusal::RateLimited),
            IssuerAnswer::Refused(Refusal::Other(77)),
        ]
    }

    #[test]
    fn messages_round_trip() {
        for request in requests() {
            assert_eq!(IssuerRequest::decode(&request.encode()), Ok(request));
        }
        for answer in answers() {
            assert_eq!(IssuerAnswer::decode(&answer.encode()), Ok(answer));
        }
        for code in 0..=u8::MAX {
            assert_eq!(Refusal::from_code(code).code(), code);
        }
    }

    #[test]
    fn every_truncation_and_extension_is_refused() {
        for request in requests() {
            let bytes = request.encode();
            for cut in 0..bytes.len() {
                assert!(
                    IssuerRequest::decode(&bytes[..cut]).is_err(),
                    "cut at {cut}"
                );
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert_eq!(
                IssuerRequest::decode(&longer),
                Err(ProtocolError::TrailingBytes(1))
            );
        }
        for answer in answers() {
            let bytes = answer.encode();
            // A key set answer takes the rest of the message; its decoder checks the length.
            if matches!(answer, IssuerAnswer::KeySet(_)) {
                continue;
            }
            for cut in 0..bytes.len() {
                assert!(IssuerAnswer::decode(&bytes[..cut]).is_err(), "cut at {cut}");
            }
        }
    }

    #[test]
    fn bad_versions_kinds_counts_and_sizes_are_typed() {
        let mut bytes = IssuerRequest::KeySet.encode();
        bytes[0] = 9;
        assert_eq!(
            IssuerRequest::decode(&bytes),
            Err(ProtocolError::UnsupportedVersion(9))
        );
        assert!(matches!(
            IssuerRequest::decode(&[PROTOCOL_VERSION, 7]),
            Err(ProtocolError::Unknown { code: 7, .. })
        ));
        let mut none = vec![PROTOCOL_VERSION, KIND_ISSUE];
        none.extend_from_slice(&[0; 32]);
        none.push(0);
        assert_eq!(
            IssuerRequest::decode(&none),
            Err(ProtocolError::BatchCount(0))
        );
        let huge = vec![PROTOCOL_VERSION; MAX_ISSUER_MESSAGE + 1];
        assert_eq!(
            IssuerRequest::decode(&huge),
            Err(ProtocolError::TooLarge(MAX_ISSUER_MESSAGE + 1))
        );
        assert!(matches!(
            IssuerAnswer::decode(&[PROTOCOL_VERSION, 1, 1, 9]),
            Err(ProtocolError::Unknown { code: 9, .. })
        ));
        assert!(!format!("{:?}", Credential([0x5a; 32])).contains("5a"));
    }
}
