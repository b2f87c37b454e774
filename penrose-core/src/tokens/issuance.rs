//! Issuance: the client's blinded batch, the issuer's answer, and the client's finalization.

use std::fmt;

use rand::{CryptoRng, RngCore};

use super::keys::{KeyEntry, KeySet};
use super::redemption::Token;
use super::suite::{self, BatchProof, Blinded, Client, ELEMENT_BYTES, Evaluated, PROOF_BYTES};
use super::{MAX_BATCH, Reader, Rng06, TokenEpoch, TokenError, TokenKeyId, token_input};

/// Bytes before the elements of a request or response: epoch, key id, count.
const HEADER_BYTES: usize = 4 + 32 + 2;

/// A client's pending issuance: the nonces and blinds of a batch of tokens, kept until the
/// issuer answers. Secret (the blinds unlink the tokens from the issuance), never printed, and
/// used up by [`finalize`](Self::finalize).
pub struct TokenRequest {
    entry: KeyEntry,
    nonces: Vec<[u8; 32]>,
    inputs: Vec<Vec<u8>>,
    clients: Vec<Client>,
    request: BlindedRequest,
}

impl TokenRequest {
    /// Asks for `count` tokens (1 to [`MAX_BATCH`]) under the published key `entry`: draws a
    /// random 32-byte nonce per token, forms each token input
    /// (`"penrose/token/v1/input" || epoch || key_id || nonce`) and blinds it with a fresh
    /// random blind. Send [`request`](Self::request) to the issuer.
    pub fn new<R: RngCore + CryptoRng + ?Sized>(
        entry: &KeyEntry,
        count: usize,
        rng: &mut R,
    ) -> Result<Self, TokenError> {
        check_count("token request", count)?;
        let mut nonces = Vec::with_capacity(count);
        let mut inputs = Vec::with_capacity(count);
        let mut clients = Vec::with_capacity(count);
        let mut elements = Vec::with_capacity(count);
        for _ in 0..count {
            let mut nonce = [0u8; 32];
            rng.fill_bytes(&mut nonce);
            let input = token_input(entry.epoch(), &entry.key_id(), &nonce);
            let (client, blinded) = suite::blind(&input, &mut Rng06(&mut *rng))?;
            nonces.push(nonce);
            inputs.push(input);
            clients.push(client);
            elements.push(blinded);
        }
        let request = BlindedRequest {
            epoch: entry.epoch(),
            key_id: entry.key_id(),
            elements,
        };
        Ok(TokenRequest {
            entry: entry.clone(),
            nonces,
            inputs,
            clients,
            request,
        })
    }

    /// The message for the issuer.
    pub fn request(&self) -> &BlindedRequest {
        &self.request
    }

    /// Turns the issuer's answer into tokens: checks that it answers this request (epoch, key,
    /// count), verifies the batched proof against the *published* key this request was made
    /// for ([`TokenError::ProofFailed`] if the issuer used any other key), unblinds and derives
    /// each token's output. On any error no token is returned: discard the issuance.
    pub fn finalize(self, response: &IssueResponse) -> Result<Vec<Token>, TokenError> {
        if response.epoch != self.entry.epoch() || response.key_id != self.entry.key_id() {
            return Err(TokenError::Mismatch("another epoch or key"));
        }
        if response.evaluated.len() != self.clients.len() {
            return Err(TokenError::Mismatch("another number of tokens"));
        }
        let outputs = suite::finalize_batch(
            &self.inputs,
            &self.clients,
            &response.evaluated,
            &response.proof,
            self.entry.point(),
        )?
        .ok_or(TokenError::ProofFailed(self.entry.epoch()))?;
        Ok(self
            .nonces
            .iter()
            .zip(outputs)
            .map(|(nonce, output)| {
                Token::new(self.entry.epoch(), self.entry.key_id(), *nonce, output)
            })
            .collect())
    }
}

impl fmt::Debug for TokenRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenRequest")
            .field("epoch", &self.entry.epoch())
            .field("key_id", &self.entry.key_id())
            .field("count", &self.nonces.len())
            .finish_non_exhaustive()
    }
}

/// What the issuer receives: the epoch and key asked for and one blinded element per token.
/// Each element is uniformly random whatever the token's nonce; nothing in it is secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlindedRequest {
    epoch: TokenEpoch,
    key_id: TokenKeyId,
    elements: Vec<Blinded>,
}

impl BlindedRequest {
    /// The epoch asked for.
    pub fn epoch(&self) -> TokenEpoch {
        self.epoch
    }

    /// The key asked for.
    pub fn key_id(&self) -> TokenKeyId {
        self.key_id
    }

    /// Tokens asked for.
    pub fn count(&self) -> usize {
        self.elements.len()
    }

    // A `Vec` because `voprf`'s batch evaluation wants one (see `suite`).
    pub(crate) fn elements(&self) -> &Vec<Blinded> {
        &self.elements
    }

    /// `epoch:u32be key_id:[32] count:u16be blinded_element:[32] * count`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::encoded_len(self.elements.len()));
        write_header(&mut out, self.epoch, &self.key_id, self.elements.len());
        for element in &self.elements {
            out.extend_from_slice(&element.serialize());
        }
        out
    }

    /// Bytes of the encoding of a request for `count` tokens.
    pub fn encoded_len(count: usize) -> usize {
        HEADER_BYTES + ELEMENT_BYTES * count
    }

    /// Decodes a request (the issuer's side); refuses a wrong length, a count outside 1 to
    /// [`MAX_BATCH`], a key that `keys` does not hold and any element that is not a canonical,
    /// non-identity ristretto255 encoding.
    pub fn decode(bytes: &[u8], keys: &KeySet) -> Result<Self, TokenError> {
        let (epoch, key_id, count, mut reader) =
            read_header("token request", bytes, keys, |count| {
                Self::encoded_len(count)
            })?;
        let mut elements = Vec::with_capacity(count);
        for index in 0..count {
            let raw: [u8; ELEMENT_BYTES] = reader.take();
            let element = Blinded::deserialize(&raw).map_err(|_| TokenError::InvalidElement {
                what: "blinded element",
                index,
            })?;
            elements.push(element);
        }
        Ok(BlindedRequest {
            epoch,
            key_id,
            elements,
        })
    }
}

/// What the issuer answers: one evaluated element per blinded element, in order, and one
/// batched DLEQ proof that all were made with the published key of the epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssueResponse {
    epoch: TokenEpoch,
    key_id: TokenKeyId,
    evaluated: Vec<Evaluated>,
    proof: BatchProof,
}

impl IssueResponse {
    pub(crate) fn new(
        epoch: TokenEpoch,
        key_id: TokenKeyId,
        evaluated: Vec<Evaluated>,
        proof: BatchProof,
    ) -> Self {
        IssueResponse {
            epoch,
            key_id,
            evaluated,
            proof,
        }
    }

    /// The epoch answered for.
    pub fn epoch(&self) -> TokenEpoch {
        self.epoch
    }

    /// The key the issuer claims to have used (the proof is what shows it).
    pub fn key_id(&self) -> TokenKeyId {
        self.key_id
    }

    /// Tokens answered.
    pub fn count(&self) -> usize {
        self.evaluated.len()
    }

    /// `epoch:u32be key_id:[32] count:u16be evaluated_element:[32] * count proof:[64]`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::encoded_len(self.evaluated.len()));
        write_header(&mut out, self.epoch, &self.key_id, self.evaluated.len());
        for element in &self.evaluated {
            out.extend_from_slice(&element.serialize());
        }
        out.extend_from_slice(&suite::encode_proof(&self.proof));
        out
    }

    /// Bytes of the encoding of a response for `count` tokens.
    pub fn encoded_len(count: usize) -> usize {
        HEADER_BYTES + ELEMENT_BYTES * count + PROOF_BYTES
    }

    /// Decodes a response (the client's side); refuses a wrong length, a count outside 1 to
    /// [`MAX_BATCH`], a key that `keys` does not hold, an element that is not a canonical,
    /// non-identity ristretto255 encoding and a proof that is not two canonical non-zero
    /// scalars. Whether the proof *verifies* is checked by [`TokenRequest::finalize`].
    pub fn decode(bytes: &[u8], keys: &KeySet) -> Result<Self, TokenError> {
        let (epoch, key_id, count, mut reader) =
            read_header("issue response", bytes, keys, |count| {
                Self::encoded_len(count)
            })?;
        let mut evaluated = Vec::with_capacity(count);
        for index in 0..count {
            let raw: [u8; ELEMENT_BYTES] = reader.take();
            let element = Evaluated::deserialize(&raw).map_err(|_| TokenError::InvalidElement {
                what: "evaluated element",
                index,
            })?;
            evaluated.push(element);
        }
        let proof = suite::decode_proof(reader.rest()).ok_or(TokenError::InvalidProof)?;
        Ok(IssueResponse {
            epoch,
            key_id,
            evaluated,
            proof,
        })
    }
}

fn check_count(what: &'static str, count: usize) -> Result<(), TokenError> {
    if count == 0 || count > MAX_BATCH {
        return Err(TokenError::Count {
            what,
            count,
            max: MAX_BATCH,
        });
    }
    Ok(())
}

fn write_header(out: &mut Vec<u8>, epoch: TokenEpoch, key_id: &TokenKeyId, count: usize) {
    out.extend_from_slice(&epoch.0.to_be_bytes());
    out.extend_from_slice(&key_id.0);
    // Every constructor bounds the count by MAX_BATCH, well inside u16.
    out.extend_from_slice(&(count as u16).to_be_bytes());
}

/// Reads and checks the common header: the length against the count (before anything is
/// allocated), the count against [`MAX_BATCH`], the key against the key set.
fn read_header<'a>(
    what: &'static str,
    bytes: &'a [u8],
    keys: &KeySet,
    encoded_len: impl Fn(usize) -> usize,
) -> Result<(TokenEpoch, TokenKeyId, usize, Reader<'a>), TokenError> {
    if bytes.len() < HEADER_BYTES {
        return Err(TokenError::Length {
            what,
            expected: HEADER_BYTES,
            got: bytes.len(),
        });
    }
    let mut reader = Reader::new(bytes);
    let epoch = TokenEpoch(reader.u32());
    let key_id = TokenKeyId(reader.take());
    let count = usize::from(reader.u16());
    check_count(what, count)?;
    let expected = encoded_len(count);
    if bytes.len() != expected {
        return Err(TokenError::Length {
            what,
            expected,
            got: bytes.len(),
        });
    }
    keys.find(epoch, key_id)?;
    Ok((epoch, key_id, count, reader))
}
