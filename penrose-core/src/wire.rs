//! The wire format: versioned, length-delimited report and ack messages.
//!
//! ```text
//! frame   = length:u32be  body                 (length = bytes in body, <= MAX_FRAME_BODY)
//! body    = kind:u8  version:u16be  payload
//! report  = key_id:[32]  report_id:[16]  snippet:[32]  locator:[200]  arch:[2]
//!           counter:u16be  catalogue:u16be  day:u32be  samples:u32be
//!           n:u8  ct_len:u16be  ciphertexts:[n * ct_len]
//!           tokens:u8 (bit 0: admission, bit 1: evidence)
//!           admission:[100] (if bit 0)  evidence:[100] (if bit 1)
//! ack     = report_id:[16]  status:u8  reason:u8  throttle_permille:u16be
//! key_list_request =                          (empty: asks for the design server's key list)
//! key_list = list:[..]                        (the signed list, `crate::key_list`, as is)
//! ```
//!
//! An agent asks for the key list on a connection of its own, like a report's: the request
//! carries nothing, so it tells the server no more than that some agent asked. The list is
//! passed on as the design server signed it; the agent verifies it (the server cannot forge
//! one).
//!
//! A report's admission token (`penrose_core::tokens::Redemption`, version 2 on) is bound to
//! the report by a MAC over the body up to and including the ciphertexts: the
//! [`Report::token_binding`], which is everything but the token itself.
//!
//! A report may also carry a contributor evidence token (issue 26 item 2, `crate::evidence`):
//! a token of the same scheme from the auditor's party, bound by its own MAC to the same
//! bytes. The aggregation server cannot verify it (it holds no key of that issuer) and keeps it
//! with the report's binding for the release auditor, who counts contributors from it. The
//! marker byte kept its old values (0: no token, 1: an admission token), so version 3 reports
//! written before evidence existed decode unchanged.
//!
//! Version 3 added the locator (`crate::fingerprint::locator`: how the aggregator finds a
//! snippet's class among many) and the GPU architecture (`crate::gpu`: counters of different
//! generations are summed apart). What each reveals is written down in docs/threat-model.md.
//!
//! A report carries nothing that identifies its sender: no host, no address, no clock finer
//! than a day. The length is checked against [`MAX_FRAME_BODY`] before anything is allocated,
//! so a peer cannot make a reader reserve memory by announcing a large frame. Decoding never
//! panics on any input; every failure is a [`WireError`].

use thiserror::Error;

use crate::counters::{CatalogueVersion, CounterId};
use crate::fingerprint::{LOCATOR_BYTES, Locator, SnippetHash};
use crate::gpu::GpuArch;
use crate::histogram::SampleCount;
use crate::paillier::KeyId;

/// The format version this build writes and reads.
pub const FORMAT_VERSION: u16 = 3;

/// Bytes of an admission token as a report carries it (an encoded
/// `penrose_core::tokens::Redemption`: epoch, key id, nonce, tag).
pub const ADMISSION_TOKEN_BYTES: usize = 4 + 32 + 32 + 32;

/// Largest body a frame may announce. A report of two 512-byte ciphertexts is about 1.2 KB;
/// the limit leaves room for larger keys without letting a peer claim megabytes.
pub const MAX_FRAME_BODY: usize = 8 * 1024;

/// Most ciphertexts one report may carry.
pub const MAX_CIPHERTEXTS: usize = 4;

/// Bytes of the length prefix.
pub const LENGTH_PREFIX: usize = 4;

const KIND_REPORT: u8 = 1;
const KIND_ACK: u8 = 2;
const KIND_KEY_LIST_REQUEST: u8 = 3;
const KIND_KEY_LIST: u8 = 4;

/// A random 128-bit id chosen by the agent per report, so that a retried upload is recognised
/// and counted once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReportId(pub [u8; 16]);

crate::hex::text_id!(ReportId, "report id");

/// Days since the Unix epoch: the only clock a report carries, coarse on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Day(pub u32);

/// One encrypted histogram of one counter for one snippet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// Which public key encrypted the ciphertexts.
    pub key_id: KeyId,
    /// Idempotency key.
    pub report_id: ReportId,
    /// The fingerprint of the snippet the samples belong to.
    pub snippet: SnippetHash,
    /// Band keys of the same snippet, for the aggregator's class search.
    pub locator: Locator,
    /// The GPU architecture the counters were read on.
    pub arch: GpuArch,
    /// The counter the histogram is of.
    pub counter: CounterId,
    /// The catalogue the counter and its binning come from.
    pub catalogue: CatalogueVersion,
    /// The day the histogram was sealed.
    pub day: Day,
    /// Samples in the histogram; lets the aggregator bound sums without decrypting.
    pub samples: SampleCount,
    /// The packed ciphertexts.
    pub ciphertexts: PackedBytes,
    /// The anonymous admission token spent on this report, if the sender has one; servers
    /// that admit only enrolled agents refuse a report without it.
    pub token: Option<AdmissionToken>,
    /// The contributor evidence token spent on this report (`crate::evidence`), which only
    /// the release auditor can verify; the aggregation server keeps it for the auditor.
    pub evidence: Option<EvidenceToken>,
}

/// A contributor evidence token as a report carries it: an encoded
/// `penrose_core::tokens::Redemption` of the auditor party's issuer, bound to
/// [`Report::token_binding`] like the admission token.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct EvidenceToken(pub [u8; ADMISSION_TOKEN_BYTES]);

impl std::fmt::Debug for EvidenceToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let epoch = u32::from_be_bytes([self.0[0], self.0[1], self.0[2], self.0[3]]);
        write!(f, "EvidenceToken(epoch {epoch}, ..)")
    }
}

/// Marker bits of the tokens a report carries.
const TOKEN_ADMISSION: u8 = 1;
const TOKEN_EVIDENCE: u8 = 2;

/// An admission token as a report carries it: the bytes of a spent token (a
/// `penrose_core::tokens::Redemption`), checked only by a server that holds the issuer's keys.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct AdmissionToken(pub [u8; ADMISSION_TOKEN_BYTES]);

impl std::fmt::Debug for AdmissionToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The epoch, then enough of the key id to tell keys apart; the nonce and tag are noise.
        let epoch = u32::from_be_bytes([self.0[0], self.0[1], self.0[2], self.0[3]]);
        write!(
            f,
            "AdmissionToken(epoch {epoch}, key {:02x}{:02x}{:02x}{:02x}..)",
            self.0[4], self.0[5], self.0[6], self.0[7]
        )
    }
}

impl Report {
    /// The bytes an admission token is bound to: the frame body of this report up to and
    /// including its ciphertexts (kind, version and every field but the token). The agent
    /// computes the token's tag over them; the server verifies the tag over the same bytes.
    pub fn token_binding(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(3 + 95 + LOCATOR_BYTES + self.ciphertexts.bytes.len());
        out.push(KIND_REPORT);
        out.extend_from_slice(&FORMAT_VERSION.to_be_bytes());
        self.encode_fields(&mut out);
        out
    }

    /// Decodes what [`Report::token_binding`] wrote back into a report without tokens: how the
    /// release auditor reads the reports a sum's evidence lists.
    pub fn from_binding(binding: &[u8]) -> Result<Report, WireError> {
        let mut body = Vec::with_capacity(binding.len() + 1);
        body.extend_from_slice(binding);
        body.push(0);
        match Message::decode_body(&body)? {
            Message::Report(report) => Ok(report),
            _ => Err(WireError::UnknownKind(
                binding.first().copied().unwrap_or(0),
            )),
        }
    }

    fn encode_tokens(&self, out: &mut Vec<u8>) {
        let admission = self.token.map_or(0, |_| TOKEN_ADMISSION);
        let evidence = self.evidence.map_or(0, |_| TOKEN_EVIDENCE);
        out.push(admission | evidence);
        if let Some(token) = &self.token {
            out.extend_from_slice(&token.0);
        }
        if let Some(evidence) = &self.evidence {
            out.extend_from_slice(&evidence.0);
        }
    }

    fn encode_fields(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.key_id.0);
        out.extend_from_slice(&self.report_id.0);
        out.extend_from_slice(&self.snippet.0);
        out.extend_from_slice(&self.locator.to_bytes());
        out.extend_from_slice(&self.arch.to_bytes());
        out.extend_from_slice(&self.counter.0.to_be_bytes());
        out.extend_from_slice(&self.catalogue.0.to_be_bytes());
        out.extend_from_slice(&self.day.0.to_be_bytes());
        out.extend_from_slice(&self.samples.0.to_be_bytes());
        // PackedBytes guarantees count <= MAX_CIPHERTEXTS and length <= u16::MAX.
        out.push(self.ciphertexts.count);
        out.extend_from_slice(&(self.ciphertexts.ciphertext_len() as u16).to_be_bytes());
        out.extend_from_slice(&self.ciphertexts.bytes);
    }
}

/// A report's ciphertexts as they travel: `count` big-endian ciphertexts of one length,
/// concatenated, which is also the form the accumulator reads them in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedBytes {
    count: u8,
    bytes: Vec<u8>,
}

impl PackedBytes {
    /// Wraps `count` concatenated ciphertexts of equal length; refuses a count outside
    /// 1..=[`MAX_CIPHERTEXTS`] and bytes that do not split into `count` non-empty ciphertexts
    /// of at most `u16::MAX` bytes.
    pub fn new(bytes: Vec<u8>, count: usize) -> Result<Self, WireError> {
        if count == 0 || count > MAX_CIPHERTEXTS {
            return Err(WireError::CiphertextCount(count));
        }
        let len = bytes.len() / count;
        if len == 0 || len * count != bytes.len() || len > usize::from(u16::MAX) {
            return Err(WireError::CiphertextLength);
        }
        // count <= MAX_CIPHERTEXTS < 256, checked above.
        Ok(PackedBytes {
            count: count as u8,
            bytes,
        })
    }

    /// Number of ciphertexts.
    pub fn count(&self) -> usize {
        usize::from(self.count)
    }

    /// Bytes of each ciphertext.
    pub fn ciphertext_len(&self) -> usize {
        self.bytes.len() / self.count()
    }

    /// All ciphertexts, concatenated.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Each ciphertext's bytes.
    pub fn ciphertexts(&self) -> impl Iterator<Item = &[u8]> {
        self.bytes.chunks_exact(self.ciphertext_len())
    }
}

/// What the server did with a report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckStatus {
    /// Stored durably and counted.
    Accepted,
    /// Already stored and counted under this report id; the sender may forget it.
    Duplicate,
    /// Refused. Resending the same bytes will be refused again, except for the reasons that
    /// say "retry later" ([`RejectReason::retry_later`]): the report is fine, the server
    /// cannot take it now.
    Rejected(RejectReason),
}

/// Why a report was refused. Codes are stable on the wire: a code is never reused for another
/// meaning, and new reasons take the next free code. An unknown code from a newer server is
/// kept as [`RejectReason::Other`] so an older agent still understands "rejected"; it treats
/// it as final (not [`retry_later`](RejectReason::retry_later)), so a new retry-later reason
/// reaches older agents as a refusal they set aside (docs/transport.md, "Ack statuses").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectReason {
    /// The format version is not one the server reads.
    UnsupportedVersion,
    /// The frame could not be decoded.
    Malformed,
    /// The frame was larger than the server accepts.
    TooLarge,
    /// The report was encrypted under a key the server does not aggregate for.
    UnknownKey,
    /// The catalogue version is unknown, or the counter is not in it.
    UnknownCounter,
    /// A ciphertext is zero, not below n^2, not a unit, or of the wrong length.
    InvalidCiphertext,
    /// The sample count is zero or above what one report may hold.
    SampleCountOutOfRange,
    /// The server is over capacity; retry later at the throttled rate.
    Overloaded,
    /// The report's day is too far from the server's, or its epoch is already closed and
    /// released: counting it would change a released sum.
    DayOutOfRange,
    /// The snippet hash cannot have come from the fingerprinter: bits beyond its k b-bit
    /// values are set, or all k values are equal (all zeros; the hash of an empty window)
    /// ([`SnippetHash::check`](crate::fingerprint::SnippetHash::check)).
    InvalidSnippet,
    /// The report's snippet would found a new application class, and the server has founded
    /// as many classes as it may for now; retry later (the report itself is fine).
    NewClassLimit,
    /// The server admits only reports that carry an anonymous admission token, and this one
    /// carries none. The report is kept and sent again once the agent holds a token.
    TokenRequired,
    /// The report's admission token does not verify: forged, bound to another report, of
    /// another scope (counter) or of an epoch other than the report's day, or of a key the
    /// server does not hold. The agent discards that token and sends the report again once
    /// with another; refused again, the report is moved aside.
    InvalidToken,
    /// The report's token was already spent on another report. The agent discards that token
    /// and sends the report again once with another, as for `InvalidToken`.
    TokenSpent,
    /// The server holds no key of the token's epoch (the report's day) yet: its key ring does
    /// not reach that day. The report and its token are fine; the sender keeps both and sends
    /// them again later, when the operator has loaded the day's keys.
    TokenKeyMissing,
    /// The report names a GPU architecture that is not a shipping generation
    /// ([`GpuArch::is_reportable`](crate::gpu::GpuArch::is_reportable)): unknown, a minor
    /// version (too fine), or a generation the server does not know. Final.
    InvalidArch,
    /// A reason this build does not know.
    Other(u8),
}

impl RejectReason {
    /// The stable wire code.
    pub fn code(self) -> u8 {
        match self {
            RejectReason::UnsupportedVersion => 1,
            RejectReason::Malformed => 2,
            RejectReason::TooLarge => 3,
            RejectReason::UnknownKey => 4,
            RejectReason::UnknownCounter => 5,
            RejectReason::InvalidCiphertext => 6,
            RejectReason::SampleCountOutOfRange => 7,
            RejectReason::Overloaded => 8,
            RejectReason::DayOutOfRange => 9,
            RejectReason::InvalidSnippet => 10,
            RejectReason::NewClassLimit => 11,
            RejectReason::TokenRequired => 12,
            RejectReason::InvalidToken => 13,
            RejectReason::TokenSpent => 14,
            RejectReason::TokenKeyMissing => 15,
            RejectReason::InvalidArch => 16,
            RejectReason::Other(code) => code,
        }
    }

    /// The reason for a wire code.
    pub fn from_code(code: u8) -> RejectReason {
        match code {
            1 => RejectReason::UnsupportedVersion,
            2 => RejectReason::Malformed,
            3 => RejectReason::TooLarge,
            4 => RejectReason::UnknownKey,
            5 => RejectReason::UnknownCounter,
            6 => RejectReason::InvalidCiphertext,
            7 => RejectReason::SampleCountOutOfRange,
            8 => RejectReason::Overloaded,
            9 => RejectReason::DayOutOfRange,
            10 => RejectReason::InvalidSnippet,
            11 => RejectReason::NewClassLimit,
            12 => RejectReason::TokenRequired,
            13 => RejectReason::InvalidToken,
            14 => RejectReason::TokenSpent,
            15 => RejectReason::TokenKeyMissing,
            16 => RejectReason::InvalidArch,
            other => RejectReason::Other(other),
        }
    }

    /// Whether the report itself is fine and the sender should keep it and send it again
    /// later: the server is overloaded, founds no new class for now, or does not hold the
    /// key of the report's token yet. Every other reason is final for these bytes.
    pub fn retry_later(self) -> bool {
        matches!(
            self,
            RejectReason::Overloaded | RejectReason::NewClassLimit | RejectReason::TokenKeyMissing
        )
    }

    /// Whether the refusal is about the report's admission token, not the report: the sender
    /// keeps the report and sends it again with a token (once, after discarding this one, for
    /// [`InvalidToken`](RejectReason::InvalidToken) and
    /// [`TokenSpent`](RejectReason::TokenSpent)).
    pub fn token_problem(self) -> bool {
        matches!(
            self,
            RejectReason::TokenRequired | RejectReason::InvalidToken | RejectReason::TokenSpent
        )
    }
}

/// The rate the server wants from agents, in thousandths of their normal upload rate; agents
/// stretch their upload delays by its inverse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ThrottleHint(u16);

impl ThrottleHint {
    /// Upload at the normal rate.
    pub const FULL_RATE: ThrottleHint = ThrottleHint(1000);

    /// A hint of `permille` thousandths of the normal rate; `None` above 1000.
    pub fn from_permille(permille: u16) -> Option<ThrottleHint> {
        (permille <= 1000).then_some(ThrottleHint(permille))
    }

    /// Thousandths of the normal rate.
    pub fn permille(self) -> u16 {
        self.0
    }
}

/// The server's answer to one report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ack {
    /// The report this answers.
    pub report_id: ReportId,
    /// What happened to it.
    pub status: AckStatus,
    /// The rate the server wants from now on.
    pub throttle: ThrottleHint,
}

/// A decoded frame.
// A report with its token is about 230 bytes on the stack against an ack's 24; one message is
// decoded per stream and moved once, so boxing would only add an allocation per report.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// Agent to server.
    Report(Report),
    /// Server to agent.
    Ack(Ack),
    /// Agent to server: send me the design server's key list.
    KeyListRequest,
    /// Server to agent: the design server's signed key list, unverified (the agent checks
    /// its signature under the key it pins).
    KeyList(Vec<u8>),
}

/// Why bytes could not be decoded (or a message encoded).
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum WireError {
    /// More bytes are needed to finish the frame; not an error for a streaming reader.
    #[error("incomplete frame: {needed} more bytes needed")]
    Incomplete {
        /// Bytes missing from the buffer.
        needed: usize,
    },
    /// The announced body is larger than [`MAX_FRAME_BODY`].
    #[error("frame body of {announced} bytes exceeds the limit of {MAX_FRAME_BODY}")]
    TooLarge {
        /// The length the frame announced.
        announced: usize,
    },
    /// The body ended before a field it must contain.
    #[error("frame body truncated while reading {field}")]
    Truncated {
        /// The field being read.
        field: &'static str,
    },
    /// Bytes were left after the message.
    #[error("{0} unexpected bytes after the message")]
    TrailingBytes(usize),
    /// The message kind byte is unknown.
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    /// The format version is not [`FORMAT_VERSION`].
    #[error("unsupported format version {0} (this build reads {FORMAT_VERSION})")]
    UnsupportedVersion(u16),
    /// The ciphertext count is zero or above [`MAX_CIPHERTEXTS`].
    #[error("{0} ciphertexts in a report (1 to {MAX_CIPHERTEXTS} allowed)")]
    CiphertextCount(usize),
    /// Ciphertexts of a report must be non-empty and of equal length.
    #[error("ciphertexts of a report must be non-empty and of equal length")]
    CiphertextLength,
    /// The ack status byte is unknown.
    #[error("unknown ack status {0}")]
    UnknownStatus(u8),
    /// An accepted or duplicate ack carried a reject reason; each message has one encoding.
    #[error("reason code {0} on an ack that is not a rejection")]
    UnexpectedReason(u8),
    /// A report's token marker has bits other than admission (1) and evidence (2).
    #[error("unknown token marker {0} (bit 0: admission token, bit 1: evidence token)")]
    TokenCount(u8),
    /// The throttle hint is above 1000 permille.
    #[error("throttle hint {0} permille is above 1000")]
    ThrottleOutOfRange(u16),
}

impl WireError {
    /// The reject reason a server answers this decode failure with.
    pub fn reject_reason(self) -> RejectReason {
        match self {
            WireError::TooLarge { .. } => RejectReason::TooLarge,
            WireError::UnsupportedVersion(_) => RejectReason::UnsupportedVersion,
            _ => RejectReason::Malformed,
        }
    }
}

impl Message {
    /// Appends this message as one frame to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        let start = out.len();
        out.extend_from_slice(&[0; LENGTH_PREFIX]);
        match self {
            Message::Report(r) => {
                out.push(KIND_REPORT);
                out.extend_from_slice(&FORMAT_VERSION.to_be_bytes());
                r.encode_fields(out);
                r.encode_tokens(out);
            }
            Message::Ack(a) => {
                out.push(KIND_ACK);
                out.extend_from_slice(&FORMAT_VERSION.to_be_bytes());
                out.extend_from_slice(&a.report_id.0);
                let (status, reason) = match a.status {
                    AckStatus::Accepted => (0, 0),
                    AckStatus::Duplicate => (1, 0),
                    AckStatus::Rejected(r) => (2, r.code()),
                };
                out.extend_from_slice(&[status, reason]);
                out.extend_from_slice(&a.throttle.0.to_be_bytes());
            }
            Message::KeyListRequest => {
                out.push(KIND_KEY_LIST_REQUEST);
                out.extend_from_slice(&FORMAT_VERSION.to_be_bytes());
            }
            Message::KeyList(list) => {
                out.push(KIND_KEY_LIST);
                out.extend_from_slice(&FORMAT_VERSION.to_be_bytes());
                out.extend_from_slice(list);
            }
        }
        let body = out.len() - start - LENGTH_PREFIX;
        if body > MAX_FRAME_BODY {
            out.truncate(start);
            return Err(WireError::TooLarge { announced: body });
        }
        // body <= MAX_FRAME_BODY fits u32.
        out[start..start + LENGTH_PREFIX].copy_from_slice(&(body as u32).to_be_bytes());
        Ok(())
    }

    /// This message as one frame.
    pub fn to_frame(&self) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::new();
        self.encode(&mut out)?;
        Ok(out)
    }

    /// Decodes one frame from the front of `buf`, returning the message and the bytes consumed.
    /// [`WireError::Incomplete`] means the buffer holds the start of a valid-sized frame.
    pub fn decode(buf: &[u8]) -> Result<(Message, usize), WireError> {
        let body_len = body_length(buf)?;
        let total = LENGTH_PREFIX + body_len;
        if buf.len() < total {
            return Err(WireError::Incomplete {
                needed: total - buf.len(),
            });
        }
        let message = Message::decode_body(&buf[LENGTH_PREFIX..total])?;
        Ok((message, total))
    }

    /// Decodes a frame body (without its length prefix), which must hold exactly one message.
    pub fn decode_body(body: &[u8]) -> Result<Message, WireError> {
        if body.len() > MAX_FRAME_BODY {
            return Err(WireError::TooLarge {
                announced: body.len(),
            });
        }
        let mut r = Reader(body);
        let kind = r.u8("kind")?;
        let version = r.u16("version")?;
        if version != FORMAT_VERSION {
            return Err(WireError::UnsupportedVersion(version));
        }
        let message = match kind {
            KIND_REPORT => Message::Report(decode_report(&mut r)?),
            KIND_ACK => Message::Ack(decode_ack(&mut r)?),
            KIND_KEY_LIST_REQUEST => Message::KeyListRequest,
            KIND_KEY_LIST => {
                let list = r.0.to_vec();
                r.0 = &[];
                Message::KeyList(list)
            }
            other => return Err(WireError::UnknownKind(other)),
        };
        if !r.0.is_empty() {
            return Err(WireError::TrailingBytes(r.0.len()));
        }
        Ok(message)
    }
}

/// Reads the length prefix and checks it against the limit, so that a streaming reader knows
/// how much to read before it allocates anything.
pub fn body_length(buf: &[u8]) -> Result<usize, WireError> {
    let Some(prefix) = buf.first_chunk::<LENGTH_PREFIX>() else {
        return Err(WireError::Incomplete {
            needed: LENGTH_PREFIX - buf.len(),
        });
    };
    let announced = u32::from_be_bytes(*prefix) as usize;
    if announced > MAX_FRAME_BODY {
        return Err(WireError::TooLarge { announced });
    }
    Ok(announced)
}

/// The report id of a report frame body (without its length prefix) whose header gets that far,
/// whatever follows: so that even a rejection names the report it answers. `None` for another
/// kind of message or a body cut before the id.
pub fn peek_report_id(body: &[u8]) -> Option<ReportId> {
    let mut r = Reader(body);
    if r.u8("kind").ok()? != KIND_REPORT {
        return None;
    }
    r.u16("version").ok()?;
    // Read as `decode_report` reads: the key id, then the report id.
    r.array::<32>("key id").ok()?;
    r.array("report id").ok().map(ReportId)
}

fn decode_report(r: &mut Reader<'_>) -> Result<Report, WireError> {
    let key_id = KeyId(r.array("key id")?);
    let report_id = ReportId(r.array("report id")?);
    let snippet = SnippetHash(r.array("snippet hash")?);
    let locator = Locator::from_bytes(&r.array("locator")?);
    let arch = GpuArch::from_bytes(r.array("GPU architecture")?);
    let counter = CounterId(r.u16("counter id")?);
    let catalogue = CatalogueVersion(r.u16("catalogue version")?);
    let day = Day(r.u32("day")?);
    let samples = SampleCount(r.u32("sample count")?);
    let count = usize::from(r.u8("ciphertext count")?);
    if count == 0 || count > MAX_CIPHERTEXTS {
        return Err(WireError::CiphertextCount(count));
    }
    let len = usize::from(r.u16("ciphertext length")?);
    if len == 0 {
        return Err(WireError::CiphertextLength);
    }
    // `bytes` checks the whole payload is present before anything is copied.
    let ciphertexts = PackedBytes::new(r.bytes(count * len, "ciphertexts")?.to_vec(), count)?;
    let marker = r.u8("token marker")?;
    if marker & !(TOKEN_ADMISSION | TOKEN_EVIDENCE) != 0 {
        return Err(WireError::TokenCount(marker));
    }
    let token = match marker & TOKEN_ADMISSION {
        0 => None,
        _ => Some(AdmissionToken(r.array("admission token")?)),
    };
    let evidence = match marker & TOKEN_EVIDENCE {
        0 => None,
        _ => Some(EvidenceToken(r.array("evidence token")?)),
    };
    Ok(Report {
        key_id,
        report_id,
        snippet,
        locator,
        arch,
        counter,
        catalogue,
        day,
        samples,
        ciphertexts,
        token,
        evidence,
    })
}

fn decode_ack(r: &mut Reader<'_>) -> Result<Ack, WireError> {
    let report_id = ReportId(r.array("report id")?);
    let status = r.u8("status")?;
    let reason = r.u8("reason")?;
    let status = match (status, reason) {
        (0, 0) => AckStatus::Accepted,
        (1, 0) => AckStatus::Duplicate,
        (2, reason) => AckStatus::Rejected(RejectReason::from_code(reason)),
        (0 | 1, reason) => return Err(WireError::UnexpectedReason(reason)),
        (other, _) => return Err(WireError::UnknownStatus(other)),
    };
    let permille = r.u16("throttle")?;
    let throttle =
        ThrottleHint::from_permille(permille).ok_or(WireError::ThrottleOutOfRange(permille))?;
    Ok(Ack {
        report_id,
        status,
        throttle,
    })
}

/// A cursor over a body that fails with the name of the field it could not read.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], WireError> {
        if self.0.len() < n {
            return Err(WireError::Truncated { field });
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], WireError> {
        let (head, tail) = self
            .0
            .split_first_chunk::<N>()
            .ok_or(WireError::Truncated { field })?;
        self.0 = tail;
        Ok(*head)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, WireError> {
        Ok(u8::from_be_bytes(self.array(field)?))
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.array(field)?))
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn report(n: usize, len: usize) -> Report {
        Report {
            key_id: KeyId([1; 32]),
            report_id: ReportId([2; 16]),
            snippet: SnippetHash([3; 32]),
            locator: crate::fingerprint::Locator([0; crate::fingerprint::LOCATOR_BANDS]),
            arch: crate::gpu::GpuArch::UNKNOWN,
            counter: CounterId(5),
            catalogue: CatalogueVersion(1),
            day: Day(20_000),
            samples: SampleCount(10_000),
            ciphertexts: PackedBytes::new((0..n).flat_map(|i| vec![i as u8 + 7; len]).collect(), n)
                .unwrap(),
            token: None,
            evidence: None,
        }
    }

    #[test]
    fn the_report_id_is_read_from_a_body_that_goes_no_further_and_only_from_a_report() {
        let r = report(2, 8);
        let frame = Message::Report(r.clone()).to_frame().unwrap();
        let body = &frame[LENGTH_PREFIX..];
        assert_eq!(peek_report_id(body), Some(r.report_id));
        // The id is the last thing read: a body cut right after it still names the report.
        let cut = 1 + 2 + 32 + 16;
        assert_eq!(peek_report_id(&body[..cut]), Some(r.report_id));
        assert_eq!(peek_report_id(&body[..cut - 1]), None);
        let ack = Message::Ack(Ack {
            report_id: r.report_id,
            status: AckStatus::Accepted,
            throttle: ThrottleHint(0),
        })
        .to_frame()
        .unwrap();
        assert_eq!(peek_report_id(&ack[LENGTH_PREFIX..]), None);
    }

    #[test]
    fn report_round_trip_and_size() {
        let msg = Message::Report(report(2, 512));
        let frame = msg.to_frame().unwrap();
        // 4 + 3 + 32 + 16 + 32 + 200 + 2 + 2 + 2 + 4 + 4 + 1 + 2 + 1024 + 1
        assert_eq!(frame.len(), 1329);
        assert_eq!(Message::decode(&frame), Ok((msg, frame.len())));
    }

    #[test]
    fn a_token_adds_its_bytes_and_is_not_part_of_what_it_is_bound_to() {
        let plain = report(2, 512);
        let mut tokened = plain.clone();
        tokened.token = Some(AdmissionToken([0xab; ADMISSION_TOKEN_BYTES]));
        let a = Message::Report(plain.clone()).to_frame().unwrap();
        let b = Message::Report(tokened.clone()).to_frame().unwrap();
        assert_eq!(b.len(), a.len() + ADMISSION_TOKEN_BYTES);
        assert_eq!(
            Message::decode(&b),
            Ok((Message::Report(tokened.clone()), b.len()))
        );
        // The binding is the body up to the token marker, the same with or without a token.
        let binding = plain.token_binding();
        assert_eq!(binding, tokened.token_binding());
        assert_eq!(
            &a[LENGTH_PREFIX..LENGTH_PREFIX + binding.len()],
            &binding[..]
        );
        assert_eq!(
            &b[LENGTH_PREFIX..LENGTH_PREFIX + binding.len()],
            &binding[..]
        );
        // Every field changes it.
        let mut other = plain.clone();
        other.day = Day(plain.day.0 + 1);
        assert_ne!(other.token_binding(), binding);
        // A marker with an unknown bit and a token cut short are refused.
        let mut marker = a.clone();
        *marker.last_mut().unwrap() = 4;
        assert_eq!(Message::decode(&marker), Err(WireError::TokenCount(4)));
        let mut short = b[..b.len() - 1].to_vec();
        let len = (short.len() - LENGTH_PREFIX) as u32;
        short[..LENGTH_PREFIX].copy_from_slice(&len.to_be_bytes());
        assert_eq!(
            Message::decode(&short),
            Err(WireError::Truncated {
                field: "admission token"
            })
        );
    }

    #[test]
    fn an_evidence_token_follows_the_admission_token_and_is_bound_to_the_same_bytes() {
        let plain = report(2, 512);
        let mut both = plain.clone();
        both.token = Some(AdmissionToken([0xab; ADMISSION_TOKEN_BYTES]));
        both.evidence = Some(EvidenceToken([0xcd; ADMISSION_TOKEN_BYTES]));
        let mut evidence_only = plain.clone();
        evidence_only.evidence = both.evidence;
        let a = Message::Report(plain.clone()).to_frame().unwrap();
        for (report, marker) in [(&both, 3u8), (&evidence_only, 2)] {
            let frame = Message::Report(report.clone()).to_frame().unwrap();
            let tokens = usize::from(marker.count_ones() as u8);
            assert_eq!(frame.len(), a.len() + tokens * ADMISSION_TOKEN_BYTES);
            assert_eq!(frame[a.len() - 1], marker);
            assert_eq!(
                Message::decode(&frame),
                Ok((Message::Report(report.clone()), frame.len()))
            );
            assert_eq!(report.token_binding(), plain.token_binding());
        }
        // The admission token comes first: swapping the two is another report.
        let frame = Message::Report(both.clone()).to_frame().unwrap();
        assert_eq!(&frame[a.len()..a.len() + 4], &[0xab; 4]);
        // The binding decodes back to the report without its tokens, and nothing else does.
        assert_eq!(
            Report::from_binding(&both.token_binding()),
            Ok(plain.clone())
        );
        let binding = plain.token_binding();
        for cut in [1, 100, 1024] {
            assert!(matches!(
                Report::from_binding(&binding[..binding.len() - cut]),
                Err(WireError::Truncated { .. })
            ));
        }
        let mut ack = Vec::new();
        Message::KeyListRequest.encode(&mut ack).unwrap();
        assert!(Report::from_binding(&ack[LENGTH_PREFIX..]).is_err());
    }

    #[test]
    fn ack_round_trip_every_status() {
        for status in [
            AckStatus::Accepted,
            AckStatus::Duplicate,
            AckStatus::Rejected(RejectReason::InvalidCiphertext),
            AckStatus::Rejected(RejectReason::Other(200)),
        ] {
            let msg = Message::Ack(Ack {
                report_id: ReportId([9; 16]),
                status,
                throttle: ThrottleHint::from_permille(800).unwrap(),
            });
            let frame = msg.to_frame().unwrap();
            assert_eq!(Message::decode(&frame).unwrap().0, msg);
        }
    }

    #[test]
    fn reject_codes_round_trip() {
        for code in 0..=u8::MAX {
            assert_eq!(RejectReason::from_code(code).code(), code);
        }
        // Codes are stable: the two added with flood resistance keep 10 and 11.
        assert_eq!(RejectReason::InvalidSnippet.code(), 10);
        assert_eq!(RejectReason::NewClassLimit.code(), 11);
        let later: Vec<u8> = (0..=u8::MAX)
            .filter(|&c| RejectReason::from_code(c).retry_later())
            .collect();
        assert_eq!(
            later,
            [8, 11, 15],
            "only Overloaded, NewClassLimit and TokenKeyMissing are retried"
        );
        let token: Vec<u8> = (0..=u8::MAX)
            .filter(|&c| RejectReason::from_code(c).token_problem())
            .collect();
        assert_eq!(token, [12, 13, 14]);
    }

    #[test]
    fn oversized_announcement_is_refused_before_reading() {
        let mut frame = ((MAX_FRAME_BODY + 1) as u32).to_be_bytes().to_vec();
        frame.push(KIND_REPORT);
        assert_eq!(
            Message::decode(&frame),
            Err(WireError::TooLarge {
                announced: MAX_FRAME_BODY + 1
            })
        );
        assert_eq!(
            body_length(&u32::MAX.to_be_bytes()),
            Err(WireError::TooLarge {
                announced: u32::MAX as usize
            })
        );
    }

    #[test]
    fn packed_bytes_refuses_bad_shapes() {
        assert_eq!(
            PackedBytes::new(vec![1; 512], 0),
            Err(WireError::CiphertextCount(0))
        );
        assert_eq!(
            PackedBytes::new(vec![1; 80], 5),
            Err(WireError::CiphertextCount(5))
        );
        assert_eq!(
            PackedBytes::new(vec![1; 33], 2),
            Err(WireError::CiphertextLength)
        );
        assert_eq!(
            PackedBytes::new(vec![], 1),
            Err(WireError::CiphertextLength)
        );
        let p = PackedBytes::new((0..6).collect(), 3).unwrap();
        assert_eq!(
            p.ciphertexts().collect::<Vec<_>>(),
            [[0, 1], [2, 3], [4, 5]]
        );
    }

    #[test]
    fn encode_refuses_oversized_reports() {
        assert!(matches!(
            Message::Report(report(4, 4000)).to_frame(),
            Err(WireError::TooLarge { .. })
        ));
        let mut out = vec![42];
        assert!(Message::Report(report(4, 4000)).encode(&mut out).is_err());
        assert_eq!(out, vec![42], "a failed encode leaves the buffer as it was");
    }

    #[test]
    fn wrong_version_and_kind_are_typed() {
        let mut frame = Message::Report(report(1, 8)).to_frame().unwrap();
        frame[6] = 9;
        assert_eq!(
            Message::decode(&frame),
            Err(WireError::UnsupportedVersion(9))
        );
        assert_eq!(
            WireError::UnsupportedVersion(9).reject_reason(),
            RejectReason::UnsupportedVersion
        );
        let mut frame = Message::Report(report(1, 8)).to_frame().unwrap();
        frame[4] = 77;
        assert_eq!(Message::decode(&frame), Err(WireError::UnknownKind(77)));
    }

    #[test]
    fn key_list_messages_round_trip_and_a_request_carries_nothing() {
        let request = Message::KeyListRequest.to_frame().unwrap();
        assert_eq!(request.len(), LENGTH_PREFIX + 3, "kind and version only");
        assert_eq!(
            Message::decode(&request),
            Ok((Message::KeyListRequest, request.len()))
        );
        let mut with_payload = request.clone();
        with_payload.push(0);
        with_payload[3] += 1;
        assert_eq!(
            Message::decode(&with_payload),
            Err(WireError::TrailingBytes(1))
        );
        let list = Message::KeyList(vec![7; 3000]);
        let frame = list.to_frame().unwrap();
        assert_eq!(Message::decode(&frame), Ok((list, frame.len())));
        assert!(
            Message::KeyList(vec![0; MAX_FRAME_BODY])
                .to_frame()
                .is_err()
        );
    }

    #[test]
    fn every_truncation_of_a_valid_frame_is_an_error() {
        let frame = Message::Report(report(2, 64)).to_frame().unwrap();
        for cut in 0..frame.len() {
            assert!(
                matches!(
                    Message::decode(&frame[..cut]),
                    Err(WireError::Incomplete { .. })
                ),
                "cut at {cut}"
            );
            // The same truncation presented as a complete body is a decode error.
            if cut > LENGTH_PREFIX {
                assert!(Message::decode_body(&frame[LENGTH_PREFIX..cut]).is_err());
            }
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = Message::decode(&bytes);
            let _ = Message::decode_body(&bytes);
        }

        #[test]
        fn mutated_frames_never_panic_and_round_trip_when_valid(
            n in 1usize..=4, len in 1usize..300, flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8)
        ) {
            let mut frame = Message::Report(report(n, len)).to_frame().unwrap();
            for (pos, val) in flips {
                let i = pos % frame.len();
                frame[i] = val;
            }
            if let Ok((msg, used)) = Message::decode(&frame) {
                // Whatever decodes re-encodes to the same bytes: the format has one encoding.
                prop_assert_eq!(msg.to_frame().unwrap(), frame[..used].to_vec());
            }
        }
    }
}
