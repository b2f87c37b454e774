//! Spending a token on a report, and what the report carries.

use std::fmt;

use hmac::Mac;

use super::keys::{KeySet, redeem_mac};
use super::suite::OUTPUT_BYTES;
use super::{REDEMPTION_BYTES, Reader, TOKEN_BYTES, TokenEpoch, TokenError, TokenKeyId};

/// An unspent token: epoch, key id, nonce and the VOPRF output of its input. The output is the
/// secret that lets its holder spend it, so `Debug` never shows it; store tokens with
/// [`to_bytes`](Self::to_bytes) as carefully as the reports they will admit.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    epoch: TokenEpoch,
    key_id: TokenKeyId,
    nonce: [u8; 32],
    output: [u8; OUTPUT_BYTES],
}

impl Token {
    pub(crate) fn new(
        epoch: TokenEpoch,
        key_id: TokenKeyId,
        nonce: [u8; 32],
        output: [u8; OUTPUT_BYTES],
    ) -> Self {
        Token {
            epoch,
            key_id,
            nonce,
            output,
        }
    }

    /// The epoch of the key it was issued under (it can be spent only while the aggregation
    /// server still accepts that epoch).
    pub fn epoch(&self) -> TokenEpoch {
        self.epoch
    }

    /// The key it was issued under.
    pub fn key_id(&self) -> TokenKeyId {
        self.key_id
    }

    /// Spends the token on one report: the redemption the report carries, with
    /// `tag = HMAC-SHA256(output, "penrose/token/v1/redeem" || report_body)`. The body must be
    /// the exact bytes the aggregation server will verify against (the report without its
    /// redemption). Calling it again for the same body gives the same redemption, so a retried
    /// upload can resend it; the server accepts a token once, so one token admits one report.
    pub fn redeem(&self, report_body: &[u8]) -> Redemption {
        let mut mac = redeem_mac(&self.output);
        mac.update(report_body);
        Redemption {
            epoch: self.epoch,
            key_id: self.key_id,
            nonce: self.nonce,
            tag: mac.finalize().into_bytes().into(),
        }
    }

    /// `epoch:u32be key_id:[32] nonce:[32] output:[64]`, for the agent's token store.
    pub fn to_bytes(&self) -> [u8; TOKEN_BYTES] {
        let mut out = [0u8; TOKEN_BYTES];
        out[..4].copy_from_slice(&self.epoch.0.to_be_bytes());
        out[4..36].copy_from_slice(&self.key_id.0);
        out[36..68].copy_from_slice(&self.nonce);
        out[68..].copy_from_slice(&self.output);
        out
    }

    /// A token read back from [`to_bytes`](Self::to_bytes); refuses a wrong length. Whether it
    /// is genuine only the verifier can tell.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, TokenError> {
        if bytes.len() != TOKEN_BYTES {
            return Err(TokenError::Length {
                what: "token",
                expected: TOKEN_BYTES,
                got: bytes.len(),
            });
        }
        let mut reader = Reader::new(bytes);
        Ok(Token {
            epoch: TokenEpoch(reader.u32()),
            key_id: TokenKeyId(reader.take()),
            nonce: reader.take(),
            output: reader.take(),
        })
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token")
            .field("epoch", &self.epoch)
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// A token spent on a report: what the report carries and the aggregation server verifies with
/// [`IssuerKey::verify`](super::IssuerKey::verify). Carries nothing the issuer saw.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Redemption {
    epoch: TokenEpoch,
    key_id: TokenKeyId,
    nonce: [u8; 32],
    tag: [u8; 32],
}

impl Redemption {
    /// The epoch of the key the token claims.
    pub fn epoch(&self) -> TokenEpoch {
        self.epoch
    }

    /// The key the token claims.
    pub fn key_id(&self) -> TokenKeyId {
        self.key_id
    }

    /// The token's nonce.
    pub fn nonce(&self) -> &[u8; 32] {
        &self.nonce
    }

    /// The MAC binding the token to the report body.
    pub fn tag(&self) -> &[u8; 32] {
        &self.tag
    }

    /// `epoch:u32be key_id:[32] nonce:[32] tag:[32]`: [`REDEMPTION_BYTES`] bytes.
    pub fn encode(&self) -> [u8; REDEMPTION_BYTES] {
        let mut out = [0u8; REDEMPTION_BYTES];
        out[..4].copy_from_slice(&self.epoch.0.to_be_bytes());
        out[4..36].copy_from_slice(&self.key_id.0);
        out[36..68].copy_from_slice(&self.nonce);
        out[68..].copy_from_slice(&self.tag);
        out
    }

    /// Decodes a redemption (the aggregation server's side); refuses a wrong length and a key
    /// that `keys` (the epochs the server accepts) does not hold. The tag is checked by
    /// [`IssuerKey::verify`](super::IssuerKey::verify).
    pub fn decode(bytes: &[u8], keys: &KeySet) -> Result<Self, TokenError> {
        if bytes.len() != REDEMPTION_BYTES {
            return Err(TokenError::Length {
                what: "redemption",
                expected: REDEMPTION_BYTES,
                got: bytes.len(),
            });
        }
        let mut reader = Reader::new(bytes);
        let redemption = Redemption {
            epoch: TokenEpoch(reader.u32()),
            key_id: TokenKeyId(reader.take()),
            nonce: reader.take(),
            tag: reader.take(),
        };
        keys.find(redemption.epoch, redemption.key_id)?;
        Ok(redemption)
    }
}

impl fmt::Debug for Redemption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redemption")
            .field("epoch", &self.epoch)
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}
