//! Anonymous admission tokens: only enrolled agents can report, at a bounded rate, and nobody
//! can link a token to the agent it was issued to (issue 11).
//!
//! The scheme is Privacy Pass's privately verifiable token (RFC 9576 architecture, RFC 9577 and
//! RFC 9578 issuance, the batched issuance of the Privacy Pass batched-tokens draft) on the
//! RFC 9497 VOPRF in verifiable mode (0x01) with the ciphersuite ristretto255-SHA512, through
//! the `voprf` crate. This module is only its cryptographic core and byte encodings: no I/O, no
//! clock. Who issues to whom, how many, over which connection, and where spent tokens are
//! recorded belong to the issuer service, the agent and the aggregation server.
//!
//! # Roles and flow
//!
//! ```text
//!  issuer (IssuerKey per epoch)        agent                           aggregation server
//!  publishes KeySet ------------------> KeySet::decode                  (same IssuerKey)
//!                                       TokenRequest::new(entry, n)
//!  BlindedRequest::decode <------------ request().encode()
//!  IssuerKey::issue -> IssueResponse --> IssueResponse::decode
//!                                       finalize -> n x Token (stored)
//!                                       Token::redeem(report body)
//!                                       Redemption in the report ---->  Redemption::decode
//!                                                                       IssuerKey::verify -> SpentId
//!                                                                       (recorded as spent)
//! ```
//!
//! - **Keys rotate per token epoch** ([`TokenEpoch`], Penrose uses the report's day) and are
//!   split by [`TokenScope`] (Penrose uses the report's counter id). Each (epoch, scope) has its
//!   own [`IssuerKey`]: a secret scalar k, its public key `pkS = k G`, and a key id, the SHA-256
//!   of the public key's 32-byte encoding. The issuer publishes the [`KeySet`] ((epoch, scope)
//!   -> public key); it is encoded canonically (pairs strictly increasing, no key twice), so
//!   every client can compare the same bytes ([`KeySet::digest`]). Scopes are public and the
//!   same for everybody: they let the issuer count a quota per counter (it cannot see inside
//!   a blinded token), not tell clients apart.
//! - **A token input** is `"penrose/token/v1/input" || epoch:u32be || key_id:[32] || nonce:[32]`
//!   with a fresh random 32-byte nonce per token. The agent blinds a batch of inputs
//!   ([`TokenRequest::new`]) and sends the blinded elements ([`BlindedRequest`]); the issuer
//!   multiplies each by k and proves, with one batched DLEQ proof, that it used the k behind the
//!   published key ([`IssuerKey::issue`], [`IssueResponse`]). The agent checks the proof
//!   against the *published* key and unblinds ([`TokenRequest::finalize`]): a [`Token`] holds
//!   the epoch, key id, nonce and the 64-byte VOPRF output `SHA-512(.. input .. k H(input) ..)`.
//! - **A token is spent on one report** ([`Token::redeem`]): the report carries a
//!   [`Redemption`] = epoch, key id, nonce and `tag = HMAC-SHA256(output,
//!   "penrose/token/v1/redeem" || report body)`. The output never leaves the agent, so whoever
//!   sees a report (a network observer, a relay) cannot move its token to another report: a new
//!   body needs a new tag, and the tag needs the output.
//! - **Verification is private** ([`IssuerKey::verify`]): the aggregation server holds the
//!   epoch's secret key, recomputes the output from the nonce with the VOPRF's `Evaluate`, and
//!   compares the tag in constant time. It returns the [`SpentId`], `SHA-256(
//!   "penrose/token/v1/spent" || epoch || key_id || nonce)`, which the server must record in
//!   the same synced write as the report and refuse the second time.
//!
//! # Why this is unlinkable
//!
//! The issuer sees, per token, the blinded element `r H(input)` for a uniformly random blind r
//! the agent never reveals: a uniformly random group element, independent of the input. It
//! answers with `k r H(input)` and a proof, also determined by r. The redemption carries the
//! nonce and a MAC tag, neither of which the issuer saw, and without r nothing ties `H(input)`
//! to any blinded element: the issuer's record of an issuance and the aggregator's record of a
//! redemption share no value (test: `issuer_transcript_and_redemption_share_no_bytes` in
//! `penrose-core/tests/tokens.rs`). What remains is the epoch and key id, which every client of
//! that epoch shares.
//!
//! Blindness alone would not stop an issuer from *partitioning* clients: answering each client
//! with its own key and, at redemption, trying every key to learn whose token it is. Verifiable
//! mode closes that: the client accepts an issuance only with a proof that the published key of
//! the epoch was used, and the published set has one key per (epoch, scope), identical for everybody
//! (so a set that grows per client is itself visible). The agent must fetch the key set over
//! the same anonymous path as its reports, and refuse one whose digest differs from what other
//! paths show; distributing and pinning the set is the issuer service's job.
//!
//! # Limits
//!
//! - *Privately* verifiable: whoever holds an epoch's secret key (the issuer and the
//!   aggregation server) can mint tokens for it. Tokens keep outsiders out and bound what one
//!   enrolled agent can send; they do not stop the vendor itself from fabricating contributors.
//!   That needs a publicly verifiable token (RFC 9578's blind RSA) whose issuer is run by
//!   another party, which this module does not provide.
//! - The token's nonce and output are bearer secrets until spent: an agent must store unspent
//!   tokens as carefully as its other spooled data ([`Token::to_bytes`]).
//! - Double spending is refused only by the server's spent set; this module produces the
//!   [`SpentId`] and nothing else.
//!
//! # Encodings (all integers big-endian, all lengths fixed by the counts)
//!
//! ```text
//! key set     = version:u8(=2)  count:u16  (epoch:u32  scope:u16  public_key:[32]) * count
//! request     = epoch:u32  key_id:[32]  count:u16  blinded_element:[32] * count
//! response    = epoch:u32  key_id:[32]  count:u16  evaluated_element:[32] * count  proof:[64]
//! redemption  = epoch:u32  key_id:[32]  nonce:[32]  tag:[32]                  (100 bytes)
//! token       = epoch:u32  key_id:[32]  nonce:[32]  output:[64]               (132 bytes)
//! ```
//!
//! These are Penrose's own encodings, not Privacy Pass's wire format (which has a token type,
//! 0x0005 for this suite in the batched-tokens draft, and a challenge from an origin): there is
//! no origin here, and the report body takes the challenge's place. Requests, responses and
//! redemptions carry no version of their own: they travel inside the versioned messages of the
//! issuance protocol and of reports. The key set is published on its own and so carries one.
//! Every decoder checks the exact length before it allocates, refuses elements that are not
//! canonical ristretto255 encodings or are the identity, and refuses an epoch and key id that
//! the key set it is given does not hold.

mod credential;
mod issuance;
mod keys;
pub mod protocol;
mod redemption;
mod suite;
#[cfg(test)]
mod vectors;

use std::fmt;

use sha2::{Digest, Sha256};
use thiserror::Error;

pub use credential::{
    CREDENTIAL_FILE_MAGIC, CREDENTIAL_FILE_VERSION, CredentialFileError, MAX_CREDENTIAL_FILE,
};
pub use issuance::{BlindedRequest, IssueResponse, TokenRequest};
pub use keys::{ISSUER_KEY_BYTES, IssuerKey, KEY_RING_VERSION, KeyEntry, KeyRing, KeySet};
pub use redemption::{Redemption, Token};

/// The most tokens one request may ask for (and one issuance answer). It bounds what a single
/// request costs the issuer (one scalar multiplication per token and a proof linear in the
/// batch) and the size of a response (about 2 KB); an agent that needs more asks again, and the
/// issuer's per-credential quota, not this number, is what limits how many it gets.
pub const MAX_BATCH: usize = 64;

/// The most keys a published key set may hold: with daily epochs and one scope per counter,
/// more than a year of keys. It bounds the decoder's allocation; a real set holds the few
/// epochs that reports may still be for.
pub const MAX_KEY_SET: usize = 4096;

/// The key set format version this build writes and reads.
pub const KEY_SET_VERSION: u8 = 2;

/// Bytes of an encoded [`Redemption`]: what a token adds to a report.
pub const REDEMPTION_BYTES: usize = 4 + 32 + 32 + 32;

/// Bytes of an encoded [`Token`] (as the agent stores it until spent).
pub const TOKEN_BYTES: usize = 4 + 32 + 32 + 64;

/// Domain tag of token inputs: a VOPRF output under this tag is useful for nothing else.
pub(crate) const INPUT_DOMAIN: &[u8] = b"penrose/token/v1/input";
/// Domain tag of the MAC that binds a token to a report body.
pub(crate) const REDEEM_DOMAIN: &[u8] = b"penrose/token/v1/redeem";
/// Domain tag of the spent-token identifier.
const SPENT_DOMAIN: &[u8] = b"penrose/token/v1/spent";
/// `info` of RFC 9497's DeriveKeyPair when an issuer key is made (followed by epoch and scope).
pub(crate) const KEY_INFO: &[u8] = b"penrose/token/v1/key";

/// A token epoch: the period one issuer key is valid for (for example a day number). Keys, and
/// so tokens, of different epochs are unrelated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenEpoch(pub u32);

impl fmt::Display for TokenEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// What a token admits: reports of one kind, named by a number the tiers agree on (Penrose
/// uses the report's counter id). Each (epoch, scope) has its own key, and the issuer's quota
/// is per (credential, epoch, scope), so one agent can put at most its quota of reports into
/// the sums of one counter and day: the bound the contributor threshold counts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenScope(pub u16);

impl fmt::Display for TokenScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// An issuer key's id: the SHA-256 of its public key's 32-byte encoding (as Privacy Pass's
/// `token_key_id`), so a client can name the key it expects and the server check it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenKeyId(pub [u8; 32]);

impl TokenKeyId {
    /// The id of a public key encoding.
    pub fn of_public_key(public_key: &[u8; 32]) -> Self {
        TokenKeyId(Sha256::digest(public_key).into())
    }
}

impl fmt::Display for TokenKeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for TokenKeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TokenKeyId({self})")
    }
}

/// What the aggregation server records as spent for a verified token:
/// `SHA-256("penrose/token/v1/spent" || epoch:u32be || key_id || nonce)`. It is derived only
/// from what the redemption carries and the issuer never saw, so the spent table and the
/// issuer's records share no value.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpentId(pub [u8; 32]);

impl SpentId {
    pub(crate) fn of(epoch: TokenEpoch, key_id: &TokenKeyId, nonce: &[u8; 32]) -> Self {
        let digest = Sha256::new()
            .chain_update(SPENT_DOMAIN)
            .chain_update(epoch.0.to_be_bytes())
            .chain_update(key_id.0)
            .chain_update(nonce)
            .finalize();
        SpentId(digest.into())
    }
}

impl fmt::Display for SpentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for SpentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SpentId({self})")
    }
}

/// Why a token operation or a decoder refused. Decoders name the field, so that a peer's
/// malformed message can be told from a forged token in logs and counters.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum TokenError {
    /// An encoding is not exactly as long as its counts say.
    #[error("{what} is {got} bytes; expected {expected}")]
    Length {
        /// The encoding.
        what: &'static str,
        /// Bytes its header implies.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// A batch is empty or larger than [`MAX_BATCH`] (or a key set larger than
    /// [`MAX_KEY_SET`]).
    #[error("{what} holds {count} entries; allowed 1 to {max}")]
    Count {
        /// The encoding or request.
        what: &'static str,
        /// Entries asked for or found.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A group element is not a canonical ristretto255 encoding, or is the identity.
    #[error("{what} {index} is not a valid ristretto255 element")]
    InvalidElement {
        /// The field.
        what: &'static str,
        /// Its position in the batch (0 for a single element).
        index: usize,
    },
    /// The proof is not two canonical, non-zero scalars.
    #[error("the issuance proof is not two canonical non-zero scalars")]
    InvalidProof,
    /// No key of this epoch and key id is known here (another epoch's key, a retired key, or an
    /// issuer answering with a key it did not publish).
    #[error("no key of epoch {epoch} with key id {key_id} is known")]
    UnknownKey {
        /// The epoch named.
        epoch: TokenEpoch,
        /// The key id named.
        key_id: TokenKeyId,
    },
    /// A key set that is not canonical: a version other than [`KEY_SET_VERSION`], (epoch,
    /// scope) pairs out of order or repeated, or one key for two of them.
    #[error("invalid key set: {0}")]
    KeySet(&'static str),
    /// A stored issuer key whose secret is not a canonical non-zero scalar.
    #[error("the issuer key's secret is not a canonical non-zero scalar")]
    InvalidSecretKey,
    /// The issuer's proof does not verify against the published key: it evaluated with
    /// another key (possibly one made for this client alone). The issuance must be discarded.
    #[error("the issuer's proof does not verify against the published key of epoch {0}")]
    ProofFailed(TokenEpoch),
    /// A response that does not answer this request (other epoch, key or count).
    #[error("the response does not answer the request: {0}")]
    Mismatch(&'static str),
    /// A redemption whose tag does not verify: a forged token, a token spent on another report
    /// body, or a token of another key presented under this one.
    #[error("the token does not verify")]
    InvalidToken,
    /// The VOPRF refused an input it should never refuse (an input longer than 65535 bytes or
    /// hashing to the identity). Not reachable with the inputs this module builds.
    #[error("the VOPRF refused an input")]
    Voprf,
}

/// The VOPRF input of the token with this epoch, key id and nonce.
pub(crate) fn token_input(epoch: TokenEpoch, key_id: &TokenKeyId, nonce: &[u8; 32]) -> Vec<u8> {
    let mut input = Vec::with_capacity(INPUT_DOMAIN.len() + 4 + 32 + 32);
    input.extend_from_slice(INPUT_DOMAIN);
    input.extend_from_slice(&epoch.0.to_be_bytes());
    input.extend_from_slice(&key_id.0);
    input.extend_from_slice(nonce);
    input
}

/// Lends a generator of the workspace's `rand` (0.9) to `voprf`, which takes `rand_core` 0.6's
/// traits (as curve25519-dalek 4 does). It forwards every call; the `CryptoRng` marker is
/// implemented only for generators that carry `rand`'s.
pub(crate) struct Rng06<'a, R: ?Sized>(pub(crate) &'a mut R);

impl<R: rand::RngCore + ?Sized> rand_core_06::RngCore for Rng06<'_, R> {
    fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }

    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.0.fill_bytes(dest);
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core_06::Error> {
        self.0.fill_bytes(dest);
        Ok(())
    }
}

impl<R: rand::CryptoRng + ?Sized> rand_core_06::CryptoRng for Rng06<'_, R> {}

fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    bytes.iter().try_for_each(|b| write!(f, "{b:02x}"))
}

/// Reads fixed fields off the front of a byte string whose total length was checked before.
pub(crate) struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader(bytes)
    }

    pub(crate) fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        // Callers check the whole length first; a short read leaves zeros rather than panics.
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }

    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_be_bytes(self.take())
    }

    pub(crate) fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.take())
    }

    pub(crate) fn rest(&self) -> &'a [u8] {
        self.0
    }
}
