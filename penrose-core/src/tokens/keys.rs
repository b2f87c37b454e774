//! Issuer keys (one per token epoch) and the key set the issuer publishes.

use std::fmt;

use hmac::{Hmac, Mac};
use rand::{CryptoRng, RngCore};
use sha2::{Digest, Sha256};

use super::issuance::{BlindedRequest, IssueResponse};
use super::redemption::Redemption;
use super::suite::{self, Element, Server};
use super::{
    KEY_INFO, KEY_SET_VERSION, MAX_BATCH, MAX_KEY_SET, REDEEM_DOMAIN, Reader, SpentId, TokenEpoch,
    TokenError, TokenKeyId, token_input,
};

/// Bytes of a serialized issuer key: epoch and secret scalar.
pub const ISSUER_KEY_BYTES: usize = 4 + 32;

/// One epoch's issuer key: the secret scalar k with its public key and key id. The issuer
/// issues with it and the aggregation server verifies with it (the tokens are privately
/// verifiable: both hold k). Never printed: `Debug` shows the epoch and key id only.
#[derive(Clone)]
pub struct IssuerKey {
    server: Server,
    entry: KeyEntry,
}

impl IssuerKey {
    /// A fresh key for `epoch`: RFC 9497 DeriveKeyPair of a 32-byte seed drawn from `rng`, with
    /// info `"penrose/token/v1/key" || epoch`.
    pub fn generate<R: RngCore + CryptoRng + ?Sized>(epoch: TokenEpoch, rng: &mut R) -> Self {
        let mut seed = [0u8; 32];
        rng.fill_bytes(&mut seed);
        // DeriveKeyPair fails only for an info longer than 65535 bytes (ours is 24) or after 256
        // zero scalars in a row; fall back to drawing again rather than panicking.
        loop {
            if let Ok(key) = Self::derive(epoch, &seed) {
                return key;
            }
            rng.fill_bytes(&mut seed);
        }
    }

    /// The key of `epoch` derived from `seed` (RFC 9497 DeriveKeyPair, info
    /// `"penrose/token/v1/key" || epoch`): an issuer that keeps one secret seed per epoch, or
    /// tests and benchmarks that need a fixed key.
    pub fn derive(epoch: TokenEpoch, seed: &[u8; 32]) -> Result<Self, TokenError> {
        let mut info = KEY_INFO.to_vec();
        info.extend_from_slice(&epoch.0.to_be_bytes());
        let server = suite::derive_key_pair(seed, &info)?;
        Ok(Self::of_server(epoch, server))
    }

    /// The serialized key, `epoch:u32be || secret scalar`, for the issuer's and the aggregation
    /// server's key stores. Secret: store it readable by the service alone.
    pub fn to_secret_bytes(&self) -> [u8; ISSUER_KEY_BYTES] {
        let mut out = [0u8; ISSUER_KEY_BYTES];
        out[..4].copy_from_slice(&self.entry.epoch.0.to_be_bytes());
        out[4..].copy_from_slice(&suite::secret_of(&self.server));
        out
    }

    /// A key read back from [`to_secret_bytes`](Self::to_secret_bytes); refuses a wrong length
    /// and a scalar that is zero or not reduced.
    pub fn from_secret_bytes(bytes: &[u8]) -> Result<Self, TokenError> {
        if bytes.len() != ISSUER_KEY_BYTES {
            return Err(TokenError::Length {
                what: "issuer key",
                expected: ISSUER_KEY_BYTES,
                got: bytes.len(),
            });
        }
        let mut reader = Reader::new(bytes);
        let epoch = TokenEpoch(reader.u32());
        let secret: [u8; 32] = reader.take();
        let server = suite::server_from_secret(&secret).ok_or(TokenError::InvalidSecretKey)?;
        Ok(Self::of_server(epoch, server))
    }

    fn of_server(epoch: TokenEpoch, server: Server) -> Self {
        let point = server.get_public_key();
        let public_key = suite::encode_element(&point);
        let entry = KeyEntry {
            epoch,
            key_id: TokenKeyId::of_public_key(&public_key),
            public_key,
            point,
        };
        IssuerKey { server, entry }
    }

    /// The epoch this key is for.
    pub fn epoch(&self) -> TokenEpoch {
        self.entry.epoch
    }

    /// The key id (SHA-256 of the public key).
    pub fn key_id(&self) -> TokenKeyId {
        self.entry.key_id
    }

    /// The public part, as it goes into the published [`KeySet`].
    pub fn entry(&self) -> &KeyEntry {
        &self.entry
    }

    /// Evaluates a client's blinded batch with this key and proves, in one batched DLEQ proof,
    /// that the published key was used. `rng` draws the proof's random scalar. Refuses a
    /// request for another epoch or key ([`TokenError::UnknownKey`]) and a batch outside 1 to
    /// [`MAX_BATCH`]. Does not count: the issuer service enforces each credential's quota.
    pub fn issue<R: RngCore + CryptoRng + ?Sized>(
        &self,
        request: &BlindedRequest,
        rng: &mut R,
    ) -> Result<IssueResponse, TokenError> {
        self.check_names(request.epoch(), request.key_id())?;
        let blinded = request.elements();
        if blinded.is_empty() || blinded.len() > MAX_BATCH {
            return Err(TokenError::Count {
                what: "token request",
                count: blinded.len(),
                max: MAX_BATCH,
            });
        }
        let (evaluated, proof) =
            suite::blind_evaluate_batch(&self.server, blinded, &mut super::Rng06(rng))?;
        Ok(IssueResponse::new(
            self.entry.epoch,
            self.entry.key_id,
            evaluated,
            proof,
        ))
    }

    /// Verifies that `redemption` is a token of this key spent on exactly `report_body`:
    /// recomputes the token's output from its nonce with RFC 9497 Evaluate and checks the tag in
    /// constant time. Returns the [`SpentId`] to record; the caller must refuse it if already
    /// recorded (double spending) and record it with the report. Refuses a redemption naming
    /// another epoch or key ([`TokenError::UnknownKey`]) and any tag that does not verify
    /// ([`TokenError::InvalidToken`]: forged, bound to another body, or issued under another
    /// key).
    pub fn verify(
        &self,
        redemption: &Redemption,
        report_body: &[u8],
    ) -> Result<SpentId, TokenError> {
        self.check_names(redemption.epoch(), redemption.key_id())?;
        let input = token_input(self.entry.epoch, &self.entry.key_id, redemption.nonce());
        let output = suite::evaluate(&self.server, &input)?;
        let mut mac = redeem_mac(&output);
        mac.update(report_body);
        mac.verify_slice(redemption.tag())
            .map_err(|_| TokenError::InvalidToken)?;
        Ok(SpentId::of(
            self.entry.epoch,
            &self.entry.key_id,
            redemption.nonce(),
        ))
    }

    fn check_names(&self, epoch: TokenEpoch, key_id: TokenKeyId) -> Result<(), TokenError> {
        if epoch != self.entry.epoch || key_id != self.entry.key_id {
            return Err(TokenError::UnknownKey { epoch, key_id });
        }
        Ok(())
    }
}

impl fmt::Debug for IssuerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuerKey")
            .field("epoch", &self.entry.epoch)
            .field("key_id", &self.entry.key_id)
            .finish_non_exhaustive()
    }
}

/// The MAC of a redemption, keyed by a token's output, with the domain tag already absorbed;
/// the caller adds the report body.
pub(crate) fn redeem_mac(output: &[u8; suite::OUTPUT_BYTES]) -> Hmac<Sha256> {
    // A 64-byte key is exactly SHA-256's block: HMAC uses it as is (RFC 2104).
    let mut mac = <Hmac<Sha256> as hmac::digest::KeyInit>::new(
        hmac::digest::generic_array::GenericArray::from_slice(output),
    );
    mac.update(REDEEM_DOMAIN);
    mac
}

/// One epoch's published key: epoch, public key and key id. What a client needs to request
/// tokens and check the issuer's proof.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyEntry {
    epoch: TokenEpoch,
    key_id: TokenKeyId,
    public_key: [u8; 32],
    point: Element,
}

impl KeyEntry {
    /// The entry of a public key encoding; refuses a non-canonical encoding and the identity.
    pub fn new(epoch: TokenEpoch, public_key: [u8; 32]) -> Result<Self, TokenError> {
        let point = suite::decode_element(&public_key).ok_or(TokenError::InvalidElement {
            what: "public key",
            index: 0,
        })?;
        Ok(KeyEntry {
            epoch,
            key_id: TokenKeyId::of_public_key(&public_key),
            public_key,
            point,
        })
    }

    /// The epoch.
    pub fn epoch(&self) -> TokenEpoch {
        self.epoch
    }

    /// The key id (SHA-256 of the public key).
    pub fn key_id(&self) -> TokenKeyId {
        self.key_id
    }

    /// The public key's 32-byte encoding.
    pub fn public_key(&self) -> &[u8; 32] {
        &self.public_key
    }

    pub(crate) fn point(&self) -> Element {
        self.point
    }
}

impl fmt::Debug for KeyEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyEntry")
            .field("epoch", &self.epoch)
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// The published key set: one public key per epoch, ordered by epoch, no key twice. Canonical,
/// so that clients that got the same set hold the same bytes and [`digest`](Self::digest).
/// Decoders of requests, responses and redemptions take it to refuse keys it does not hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySet {
    entries: Vec<KeyEntry>,
}

impl KeySet {
    /// A set of entries in any order; refuses an empty set, more than [`MAX_KEY_SET`], two
    /// entries of one epoch and one key for two epochs.
    pub fn new(entries: impl IntoIterator<Item = KeyEntry>) -> Result<Self, TokenError> {
        let mut entries: Vec<KeyEntry> = entries.into_iter().collect();
        entries.sort_by_key(|entry| entry.epoch);
        Self::checked(entries)
    }

    /// The published set of these issuer keys (their public parts).
    pub fn of_keys<'a>(keys: impl IntoIterator<Item = &'a IssuerKey>) -> Result<Self, TokenError> {
        Self::new(keys.into_iter().map(|key| key.entry().clone()))
    }

    fn checked(entries: Vec<KeyEntry>) -> Result<Self, TokenError> {
        if entries.is_empty() || entries.len() > MAX_KEY_SET {
            return Err(TokenError::Count {
                what: "key set",
                count: entries.len(),
                max: MAX_KEY_SET,
            });
        }
        if entries
            .windows(2)
            .any(|pair| pair[0].epoch >= pair[1].epoch)
        {
            return Err(TokenError::KeySet(
                "epochs must be strictly increasing, each once",
            ));
        }
        let mut ids: Vec<TokenKeyId> = entries.iter().map(|entry| entry.key_id).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|pair| pair[0] == pair[1]) {
            return Err(TokenError::KeySet("one public key for two epochs"));
        }
        Ok(KeySet { entries })
    }

    /// The entries, by epoch.
    pub fn entries(&self) -> &[KeyEntry] {
        &self.entries
    }

    /// The entry of an epoch.
    pub fn get(&self, epoch: TokenEpoch) -> Option<&KeyEntry> {
        self.entries
            .binary_search_by_key(&epoch, |entry| entry.epoch)
            .ok()
            .and_then(|at| self.entries.get(at))
    }

    /// The entry of an epoch if its key id is `key_id`; [`TokenError::UnknownKey`] otherwise.
    pub fn find(&self, epoch: TokenEpoch, key_id: TokenKeyId) -> Result<&KeyEntry, TokenError> {
        self.get(epoch)
            .filter(|entry| entry.key_id == key_id)
            .ok_or(TokenError::UnknownKey { epoch, key_id })
    }

    /// `version:u8 count:u16be (epoch:u32be public_key:[32]) * count`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(3 + 36 * self.entries.len());
        out.push(KEY_SET_VERSION);
        // `checked` bounds the count by MAX_KEY_SET, well inside u16.
        out.extend_from_slice(&(self.entries.len() as u16).to_be_bytes());
        for entry in &self.entries {
            out.extend_from_slice(&entry.epoch.0.to_be_bytes());
            out.extend_from_slice(&entry.public_key);
        }
        out
    }

    /// Decodes a published set; refuses another version, a wrong length, an invalid public key
    /// and a set that is not canonical (see [`new`](Self::new); the order is not repaired, so
    /// two encodings of one set cannot both be accepted).
    pub fn decode(bytes: &[u8]) -> Result<Self, TokenError> {
        if bytes.len() < 3 {
            return Err(TokenError::Length {
                what: "key set",
                expected: 3,
                got: bytes.len(),
            });
        }
        let mut reader = Reader::new(bytes);
        let [version] = reader.take::<1>();
        if version != KEY_SET_VERSION {
            return Err(TokenError::KeySet("unknown key set version"));
        }
        let count = usize::from(reader.u16());
        if count == 0 || count > MAX_KEY_SET {
            return Err(TokenError::Count {
                what: "key set",
                count,
                max: MAX_KEY_SET,
            });
        }
        let expected = 3 + 36 * count;
        if bytes.len() != expected {
            return Err(TokenError::Length {
                what: "key set",
                expected,
                got: bytes.len(),
            });
        }
        let mut entries = Vec::with_capacity(count);
        for index in 0..count {
            let epoch = TokenEpoch(reader.u32());
            let public_key: [u8; 32] = reader.take();
            let entry =
                KeyEntry::new(epoch, public_key).map_err(|_| TokenError::InvalidElement {
                    what: "public key",
                    index,
                })?;
            entries.push(entry);
        }
        Self::checked(entries)
    }

    /// SHA-256 of the encoding: what clients compare to make sure they were all given the same
    /// set.
    pub fn digest(&self) -> [u8; 32] {
        Sha256::digest(self.encode()).into()
    }
}
