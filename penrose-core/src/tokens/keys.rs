//! Issuer keys (one per token epoch and scope) and the key set the issuer publishes.

use std::fmt;

use hmac::{Hmac, Mac};
use rand::{CryptoRng, RngCore};
use sha2::{Digest, Sha256};

use super::issuance::{BlindedRequest, IssueResponse};
use super::redemption::Redemption;
use super::suite::{self, Element, Server};
use super::{
    KEY_INFO, KEY_SET_VERSION, MAX_BATCH, MAX_KEY_SET, REDEEM_DOMAIN, Reader, SpentId, TokenEpoch,
    TokenError, TokenKeyId, TokenScope, token_input,
};

/// Bytes of a serialized issuer key: epoch, scope and secret scalar.
pub const ISSUER_KEY_BYTES: usize = 4 + 2 + 32;

/// Bytes of one key set entry: epoch, scope and public key.
const ENTRY_BYTES: usize = 4 + 2 + 32;

/// One (epoch, scope)'s issuer key: the secret scalar k with its public key and key id. The
/// issuer issues with it and the aggregation server verifies with it (the tokens are privately
/// verifiable: both hold k). Never printed: `Debug` shows the epoch, scope and key id only.
#[derive(Clone)]
pub struct IssuerKey {
    server: Server,
    entry: KeyEntry,
}

impl IssuerKey {
    /// A fresh key for `epoch` and `scope`: RFC 9497 DeriveKeyPair of a 32-byte seed drawn
    /// from `rng`, with info `"penrose/token/v1/key" || epoch || scope`.
    pub fn generate<R: RngCore + CryptoRng + ?Sized>(
        epoch: TokenEpoch,
        scope: TokenScope,
        rng: &mut R,
    ) -> Self {
        let mut seed = [0u8; 32];
        rng.fill_bytes(&mut seed);
        // DeriveKeyPair fails only for an info longer than 65535 bytes (ours is 24) or after 256
        // zero scalars in a row; fall back to drawing again rather than panicking.
        loop {
            if let Ok(key) = Self::derive(epoch, scope, &seed) {
                return key;
            }
            rng.fill_bytes(&mut seed);
        }
    }

    /// The key of `epoch` and `scope` derived from `seed` (RFC 9497 DeriveKeyPair, info
    /// `"penrose/token/v1/key" || epoch:u32be || scope:u16be`): an issuer that keeps one
    /// secret seed and derives every epoch's keys from it, or tests that need a fixed key.
    pub fn derive(
        epoch: TokenEpoch,
        scope: TokenScope,
        seed: &[u8; 32],
    ) -> Result<Self, TokenError> {
        let mut info = KEY_INFO.to_vec();
        info.extend_from_slice(&epoch.0.to_be_bytes());
        info.extend_from_slice(&scope.0.to_be_bytes());
        let server = suite::derive_key_pair(seed, &info)?;
        Ok(Self::of_server(epoch, scope, server))
    }

    /// The serialized key, `epoch:u32be || scope:u16be || secret scalar`, for the issuer's and
    /// the aggregation server's key stores. Secret: store it readable by the service alone.
    pub fn to_secret_bytes(&self) -> [u8; ISSUER_KEY_BYTES] {
        let mut out = [0u8; ISSUER_KEY_BYTES];
        out[..4].copy_from_slice(&self.entry.epoch.0.to_be_bytes());
        out[4..6].copy_from_slice(&self.entry.scope.0.to_be_bytes());
        out[6..].copy_from_slice(&suite::secret_of(&self.server));
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
        let scope = TokenScope(reader.u16());
        let secret: [u8; 32] = reader.take();
        let server = suite::server_from_secret(&secret).ok_or(TokenError::InvalidSecretKey)?;
        Ok(Self::of_server(epoch, scope, server))
    }

    fn of_server(epoch: TokenEpoch, scope: TokenScope, server: Server) -> Self {
        let point = server.get_public_key();
        let public_key = suite::encode_element(&point);
        let entry = KeyEntry {
            epoch,
            scope,
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

    /// The scope: which reports its tokens admit.
    pub fn scope(&self) -> TokenScope {
        self.entry.scope
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
            .field("scope", &self.entry.scope)
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

/// One (epoch, scope)'s published key: epoch, scope, public key and key id. What a client
/// needs to request tokens and check the issuer's proof.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyEntry {
    epoch: TokenEpoch,
    scope: TokenScope,
    key_id: TokenKeyId,
    public_key: [u8; 32],
    point: Element,
}

impl KeyEntry {
    /// The entry of a public key encoding; refuses a non-canonical encoding and the identity.
    pub fn new(
        epoch: TokenEpoch,
        scope: TokenScope,
        public_key: [u8; 32],
    ) -> Result<Self, TokenError> {
        let point = suite::decode_element(&public_key).ok_or(TokenError::InvalidElement {
            what: "public key",
            index: 0,
        })?;
        Ok(KeyEntry {
            epoch,
            scope,
            key_id: TokenKeyId::of_public_key(&public_key),
            public_key,
            point,
        })
    }

    /// The epoch.
    pub fn epoch(&self) -> TokenEpoch {
        self.epoch
    }

    /// The scope: which reports its tokens admit.
    pub fn scope(&self) -> TokenScope {
        self.scope
    }

    /// The key id (SHA-256 of the public key).
    pub fn key_id(&self) -> TokenKeyId {
        self.key_id
    }

    /// The public key's 32-byte encoding.
    pub fn public_key(&self) -> &[u8; 32] {
        &self.public_key
    }

    /// (epoch, scope): what the key set is ordered and looked up by.
    pub fn name(&self) -> (TokenEpoch, TokenScope) {
        (self.epoch, self.scope)
    }

    pub(crate) fn point(&self) -> Element {
        self.point
    }
}

impl fmt::Debug for KeyEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyEntry")
            .field("epoch", &self.epoch)
            .field("scope", &self.scope)
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// The published key set: one public key per (epoch, scope), ordered by epoch and scope, no
/// key twice. Canonical, so that clients that got the same set hold the same bytes and
/// [`digest`](Self::digest).
/// Decoders of requests, responses and redemptions take it to refuse keys it does not hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySet {
    entries: Vec<KeyEntry>,
}

impl KeySet {
    /// A set of entries in any order; refuses an empty set, more than [`MAX_KEY_SET`], two
    /// entries of one (epoch, scope) and one key for two.
    pub fn new(entries: impl IntoIterator<Item = KeyEntry>) -> Result<Self, TokenError> {
        let mut entries: Vec<KeyEntry> = entries.into_iter().collect();
        entries.sort_by_key(KeyEntry::name);
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
            .any(|pair| pair[0].name() >= pair[1].name())
        {
            return Err(TokenError::KeySet(
                "(epoch, scope) pairs must be strictly increasing, each once",
            ));
        }
        let mut ids: Vec<TokenKeyId> = entries.iter().map(|entry| entry.key_id).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|pair| pair[0] == pair[1]) {
            return Err(TokenError::KeySet(
                "one public key for two (epoch, scope) pairs",
            ));
        }
        Ok(KeySet { entries })
    }

    /// The entries, by epoch and scope.
    pub fn entries(&self) -> &[KeyEntry] {
        &self.entries
    }

    /// The entry of an (epoch, scope).
    pub fn get(&self, epoch: TokenEpoch, scope: TokenScope) -> Option<&KeyEntry> {
        self.entries
            .binary_search_by_key(&(epoch, scope), KeyEntry::name)
            .ok()
            .and_then(|at| self.entries.get(at))
    }

    /// The entries of one epoch, by scope.
    pub fn epoch(&self, epoch: TokenEpoch) -> &[KeyEntry] {
        let start = self.entries.partition_point(|entry| entry.epoch < epoch);
        let end = self.entries.partition_point(|entry| entry.epoch <= epoch);
        &self.entries[start..end]
    }

    /// The epochs the set holds keys for, each once, in order.
    pub fn epochs(&self) -> impl Iterator<Item = TokenEpoch> + '_ {
        self.entries
            .chunk_by(|a, b| a.epoch == b.epoch)
            .filter_map(|run| run.first().map(|entry| entry.epoch))
    }

    /// The entry of an epoch whose key id is `key_id` (whatever its scope);
    /// [`TokenError::UnknownKey`] otherwise.
    pub fn find(&self, epoch: TokenEpoch, key_id: TokenKeyId) -> Result<&KeyEntry, TokenError> {
        self.epoch(epoch)
            .iter()
            .find(|entry| entry.key_id == key_id)
            .ok_or(TokenError::UnknownKey { epoch, key_id })
    }

    /// `version:u8 count:u16be (epoch:u32be scope:u16be public_key:[32]) * count`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(3 + ENTRY_BYTES * self.entries.len());
        out.push(KEY_SET_VERSION);
        // `checked` bounds the count by MAX_KEY_SET, well inside u16.
        out.extend_from_slice(&(self.entries.len() as u16).to_be_bytes());
        for entry in &self.entries {
            out.extend_from_slice(&entry.epoch.0.to_be_bytes());
            out.extend_from_slice(&entry.scope.0.to_be_bytes());
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
        let expected = 3 + ENTRY_BYTES * count;
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
            let scope = TokenScope(reader.u16());
            let public_key: [u8; 32] = reader.take();
            let entry = KeyEntry::new(epoch, scope, public_key).map_err(|_| {
                TokenError::InvalidElement {
                    what: "public key",
                    index,
                }
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

/// A set of issuer keys with their secrets, one per (epoch, scope): what the issuer hands the
/// aggregation server so that it can verify tokens (`penrose-issuer export-keys`), and what
/// the server loads. Secret as a whole; store it readable by the service alone.
#[derive(Clone, Debug)]
pub struct KeyRing {
    keys: Vec<IssuerKey>,
}

/// The key ring file format version this build writes and reads.
pub const KEY_RING_VERSION: u8 = 1;

/// What a key ring file starts with, so that a key set or any other file given by mistake is
/// named as such rather than misread.
const KEY_RING_MAGIC: &[u8; 18] = b"penrose-token-keys";

impl KeyRing {
    /// A ring of keys in any order; refuses an empty ring, more than [`MAX_KEY_SET`] keys and
    /// two keys of one (epoch, scope).
    pub fn new(keys: impl IntoIterator<Item = IssuerKey>) -> Result<Self, TokenError> {
        let mut keys: Vec<IssuerKey> = keys.into_iter().collect();
        keys.sort_by_key(|key| key.entry().name());
        // The key set applies every rule (count, order, no key twice) to the public parts.
        KeySet::checked(keys.iter().map(|key| key.entry().clone()).collect())?;
        Ok(KeyRing { keys })
    }

    /// The keys, by epoch and scope.
    pub fn keys(&self) -> &[IssuerKey] {
        &self.keys
    }

    /// The key of an (epoch, scope).
    pub fn get(&self, epoch: TokenEpoch, scope: TokenScope) -> Option<&IssuerKey> {
        self.keys
            .binary_search_by_key(&(epoch, scope), |key| key.entry().name())
            .ok()
            .and_then(|at| self.keys.get(at))
    }

    /// The key of an epoch with this key id (whatever its scope); [`TokenError::UnknownKey`]
    /// otherwise.
    pub fn find(&self, epoch: TokenEpoch, key_id: TokenKeyId) -> Result<&IssuerKey, TokenError> {
        let start = self.keys.partition_point(|key| key.epoch() < epoch);
        self.keys[start..]
            .iter()
            .take_while(|key| key.epoch() == epoch)
            .find(|key| key.key_id() == key_id)
            .ok_or(TokenError::UnknownKey { epoch, key_id })
    }

    /// The public key set of these keys.
    pub fn key_set(&self) -> KeySet {
        KeySet {
            entries: self.keys.iter().map(|key| key.entry().clone()).collect(),
        }
    }

    /// `"penrose-token-keys" version:u8 count:u16be (epoch:u32be scope:u16be secret:[32]) *
    /// count`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(KEY_RING_MAGIC.len() + 3 + ISSUER_KEY_BYTES * self.keys.len());
        out.extend_from_slice(KEY_RING_MAGIC);
        out.push(KEY_RING_VERSION);
        // `new` bounds the count by MAX_KEY_SET, well inside u16.
        out.extend_from_slice(&(self.keys.len() as u16).to_be_bytes());
        for key in &self.keys {
            out.extend_from_slice(&key.to_secret_bytes());
        }
        out
    }

    /// Reads a ring back; refuses another file, another version, a wrong length, an invalid
    /// secret and a ring out of order or with a key twice (not repaired).
    pub fn decode(bytes: &[u8]) -> Result<Self, TokenError> {
        let header = KEY_RING_MAGIC.len() + 3;
        if bytes.len() < header {
            return Err(TokenError::Length {
                what: "key ring",
                expected: header,
                got: bytes.len(),
            });
        }
        if !bytes.starts_with(KEY_RING_MAGIC) {
            return Err(TokenError::KeySet("not a penrose token key ring"));
        }
        let mut reader = Reader::new(&bytes[KEY_RING_MAGIC.len()..]);
        let [version] = reader.take::<1>();
        if version != KEY_RING_VERSION {
            return Err(TokenError::KeySet("unknown key ring version"));
        }
        let count = usize::from(reader.u16());
        if count == 0 || count > MAX_KEY_SET {
            return Err(TokenError::Count {
                what: "key ring",
                count,
                max: MAX_KEY_SET,
            });
        }
        let expected = header + ISSUER_KEY_BYTES * count;
        if bytes.len() != expected {
            return Err(TokenError::Length {
                what: "key ring",
                expected,
                got: bytes.len(),
            });
        }
        let keys = reader
            .rest()
            .chunks_exact(ISSUER_KEY_BYTES)
            .map(IssuerKey::from_secret_bytes)
            .collect::<Result<Vec<_>, _>>()?;
        if keys
            .windows(2)
            .any(|pair| pair[0].entry().name() >= pair[1].entry().name())
        {
            return Err(TokenError::KeySet(
                "(epoch, scope) pairs must be strictly increasing, each once",
            ));
        }
        Self::new(keys)
    }
}
