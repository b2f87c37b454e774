//! Properties of the token decoders that will face the network (the issuer's request decoder,
//! the agent's response and key set decoders, the aggregation server's redemption decoder):
//! arbitrary bytes never panic, and whatever is accepted is canonical (re-encodes to the bytes
//! it came from), also after any one byte of a valid encoding is changed.
#![cfg(feature = "tokens")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::LazyLock;

use penrose_core::tokens::{
    BlindedRequest, IssueResponse, IssuerKey, KeySet, Redemption, Token, TokenEpoch, TokenRequest,
    TokenScope,
};
use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

struct Fixture {
    set: KeySet,
    request: Vec<u8>,
    response: Vec<u8>,
    redemption: Vec<u8>,
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let mut rng = ChaCha20Rng::seed_from_u64(40);
    let key = IssuerKey::generate(TokenEpoch(3), TokenScope(0), &mut rng);
    let other = IssuerKey::generate(TokenEpoch(4), TokenScope(0), &mut rng);
    let set = KeySet::of_keys([&key, &other]).unwrap();
    let pending =
        TokenRequest::new(set.get(TokenEpoch(3), TokenScope(0)).unwrap(), 4, &mut rng).unwrap();
    let request = pending.request().encode();
    let response = key.issue(pending.request(), &mut rng).unwrap();
    let tokens = pending.finalize(&response).unwrap();
    let redemption = tokens[0].redeem(b"body").encode().to_vec();
    Fixture {
        set,
        request,
        response: response.encode(),
        redemption,
    }
});

/// Every decoder on `bytes`: none panics, and each that accepts re-encodes to `bytes`.
fn decode_all_canonically(bytes: &[u8]) {
    let set = &FIXTURE.set;
    if let Ok(request) = BlindedRequest::decode(bytes, set) {
        assert_eq!(request.encode(), bytes);
    }
    if let Ok(response) = IssueResponse::decode(bytes, set) {
        assert_eq!(response.encode(), bytes);
    }
    if let Ok(redemption) = Redemption::decode(bytes, set) {
        assert_eq!(redemption.encode().as_slice(), bytes);
    }
    if let Ok(keys) = KeySet::decode(bytes) {
        assert_eq!(keys.encode(), bytes);
    }
    if let Ok(token) = Token::from_bytes(bytes) {
        assert_eq!(token.to_bytes().as_slice(), bytes);
    }
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_and_accepted_ones_are_canonical(
        bytes in prop::collection::vec(any::<u8>(), 0..600)
    ) {
        decode_all_canonically(&bytes);
    }

    #[test]
    fn valid_headers_with_arbitrary_bodies(
        which in 0usize..3,
        body in prop::collection::vec(any::<u8>(), 0..400)
    ) {
        // A valid header (epoch, key id, count) keeps the decoders going past the key check,
        // into the elements and the proof.
        let fixture = &*FIXTURE;
        let valid = [&fixture.request, &fixture.response, &fixture.redemption][which];
        let mut bytes = valid[..38.min(valid.len())].to_vec();
        bytes.extend_from_slice(&body);
        decode_all_canonically(&bytes);
    }

    #[test]
    fn one_changed_byte_is_refused_or_still_canonical(
        which in 0usize..4,
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255
    ) {
        let fixture = &*FIXTURE;
        let key_set = fixture.set.encode();
        let valid = [&fixture.request, &fixture.response, &fixture.redemption, &key_set][which];
        let mut bytes = valid.clone();
        let i = at.index(bytes.len());
        bytes[i] ^= flip;
        decode_all_canonically(&bytes);
    }
}
