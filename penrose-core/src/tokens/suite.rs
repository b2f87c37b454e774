//! The RFC 9497 operations the tokens use, VOPRF mode with ristretto255-SHA512, in one place:
//! the token code calls only these, and the RFC's test vectors (`vectors.rs`) run through the
//! same functions with the RFC's blinds and proof scalars.

use rand_core_06::{CryptoRng, RngCore};
use voprf::{BlindedElement, EvaluationElement, Group, Proof, VoprfClient, VoprfServer};

use super::TokenError;

/// The ciphersuite: ristretto255-SHA512 (RFC 9497 section 4.1).
pub(crate) type Suite = voprf::Ristretto255;
/// A ristretto255 group element.
pub(crate) type Element = <Suite as Group>::Elem;
/// The client's state for one blinded input (its blind scalar).
pub(crate) type Client = VoprfClient<Suite>;
/// The server: secret scalar and public key.
pub(crate) type Server = VoprfServer<Suite>;
/// A blinded element as the client sends it.
pub(crate) type Blinded = BlindedElement<Suite>;
/// An evaluated element as the server returns it.
pub(crate) type Evaluated = EvaluationElement<Suite>;
/// The batched DLEQ proof.
pub(crate) type BatchProof = Proof<Suite>;

/// Bytes of an element and of a scalar.
pub(crate) const ELEMENT_BYTES: usize = 32;
/// Bytes of a proof (two scalars).
pub(crate) const PROOF_BYTES: usize = 64;
/// Bytes of a VOPRF output (SHA-512).
pub(crate) const OUTPUT_BYTES: usize = 64;

/// RFC 9497 DeriveKeyPair: the key pair of `seed` and `info`.
pub(crate) fn derive_key_pair(seed: &[u8; 32], info: &[u8]) -> Result<Server, TokenError> {
    Server::new_from_seed(seed, info).map_err(|_| TokenError::Voprf)
}

/// The server of a serialized secret scalar (canonical, non-zero); the public key is recomputed.
pub(crate) fn server_from_secret(secret: &[u8; 32]) -> Option<Server> {
    Server::new_with_key(secret).ok()
}

/// The serialized secret scalar of a server.
pub(crate) fn secret_of(server: &Server) -> [u8; 32] {
    let mut secret = [0u8; 32];
    // VoprfServer serializes as skS || pkS.
    secret.copy_from_slice(&server.serialize()[..32]);
    secret
}

/// Serializes an element.
pub(crate) fn encode_element(element: &Element) -> [u8; 32] {
    <Suite as Group>::serialize_elem(*element).into()
}

/// Deserializes an element: canonical encodings of non-identity points only.
pub(crate) fn decode_element(bytes: &[u8]) -> Option<Element> {
    <Suite as Group>::deserialize_elem(bytes).ok()
}

/// RFC 9497 Blind: a fresh blind from `rng` and the blinded element of `input`.
pub(crate) fn blind<R: RngCore + CryptoRng>(
    input: &[u8],
    rng: &mut R,
) -> Result<(Client, Blinded), TokenError> {
    let result = Client::blind(input, rng).map_err(|_| TokenError::Voprf)?;
    Ok((result.state, result.message))
}

/// RFC 9497 BlindEvaluate over a batch, with one proof for the whole batch (section 2.2.1's
/// composite DLEQ); `rng` draws the proof's random scalar.
// `voprf`'s batch functions take `&I` where `&I: IntoIterator` and `I: Sized`: a `Vec`, not a
// slice.
#[allow(clippy::ptr_arg)]
pub(crate) fn blind_evaluate_batch<R: RngCore + CryptoRng>(
    server: &Server,
    blinded: &Vec<Blinded>,
    rng: &mut R,
) -> Result<(Vec<Evaluated>, BatchProof), TokenError> {
    let result = server
        .batch_blind_evaluate(rng, blinded)
        .map_err(|_| TokenError::Voprf)?;
    Ok((result.messages, result.proof))
}

/// RFC 9497 Finalize over a batch: verifies the proof against `public_key`, unblinds and hashes.
/// `None` when the proof does not verify.
// As above: `Vec`s because of `voprf`'s bounds.
#[allow(clippy::ptr_arg)]
pub(crate) fn finalize_batch(
    inputs: &Vec<Vec<u8>>,
    clients: &Vec<Client>,
    evaluated: &Vec<Evaluated>,
    proof: &BatchProof,
    public_key: Element,
) -> Result<Option<Vec<[u8; OUTPUT_BYTES]>>, TokenError> {
    if inputs.len() != clients.len() || clients.len() != evaluated.len() {
        return Err(TokenError::Mismatch("batch sizes differ"));
    }
    let outputs = match Client::batch_finalize(inputs, clients, evaluated, proof, public_key) {
        Ok(outputs) => outputs,
        Err(voprf::Error::ProofVerification) => return Ok(None),
        Err(_) => return Err(TokenError::Voprf),
    };
    let mut out = Vec::with_capacity(inputs.len());
    for output in outputs {
        out.push(output.map_err(|_| TokenError::Voprf)?.into());
    }
    Ok(Some(out))
}

/// RFC 9497 Evaluate: the output of `input` computed with the secret key alone (how the
/// verifier recomputes a token's output).
pub(crate) fn evaluate(server: &Server, input: &[u8]) -> Result<[u8; OUTPUT_BYTES], TokenError> {
    Ok(server
        .evaluate(input)
        .map_err(|_| TokenError::Voprf)?
        .into())
}

/// Serializes a proof.
pub(crate) fn encode_proof(proof: &BatchProof) -> [u8; PROOF_BYTES] {
    proof.serialize().into()
}

/// Deserializes a proof: two canonical non-zero scalars.
pub(crate) fn decode_proof(bytes: &[u8]) -> Option<BatchProof> {
    BatchProof::deserialize(bytes).ok()
}
