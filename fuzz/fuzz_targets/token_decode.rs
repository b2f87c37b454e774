//! Feeds arbitrary bytes to the anonymous token decoders that face the network: the issuer's
//! request decoders (the issuance protocol's messages and the blinded batches in them), the
//! agent's answer, response and key set decoders, the aggregation server's redemption decoder
//! and its key ring file. They must return errors, never panic, and whatever they accept must
//! re-encode to the bytes it came from. The bytes are tried as they are and behind a valid
//! (epoch, key id) header, so that the element and proof checks are reached too.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use penrose_core::tokens::protocol::{IssuerAnswer, IssuerRequest};
use penrose_core::tokens::{
    BlindedRequest, IssueResponse, IssuerKey, KeyRing, KeySet, Redemption, Token, TokenEpoch,
    TokenScope,
};

static KEYS: LazyLock<(KeySet, Vec<u8>)> = LazyLock::new(|| {
    let one =
        IssuerKey::derive(TokenEpoch(1), TokenScope(0), &[1; 32]).expect("a fixed key derives");
    let two =
        IssuerKey::derive(TokenEpoch(2), TokenScope(3), &[2; 32]).expect("a fixed key derives");
    let set = KeySet::of_keys([&one, &two]).expect("two epochs make a set");
    let mut header = 1u32.to_be_bytes().to_vec();
    header.extend_from_slice(&one.key_id().0);
    (set, header)
});

fn decode_all(set: &KeySet, data: &[u8]) {
    if let Ok(request) = BlindedRequest::decode(data, set) {
        assert_eq!(request.encode(), data);
    }
    if let Ok(response) = IssueResponse::decode(data, set) {
        assert_eq!(response.encode(), data);
    }
    if let Ok(redemption) = Redemption::decode(data, set) {
        assert_eq!(redemption.encode().as_slice(), data);
    }
    if let Ok(keys) = KeySet::decode(data) {
        assert_eq!(keys.encode(), data);
    }
    if let Ok(token) = Token::from_bytes(data) {
        assert_eq!(token.to_bytes().as_slice(), data);
    }
    if let Ok(ring) = KeyRing::decode(data) {
        assert_eq!(ring.encode(), data);
    }
    if let Ok(request) = IssuerRequest::decode(data) {
        assert_eq!(request.encode(), data);
    }
    if let Ok(answer) = IssuerAnswer::decode(data) {
        assert_eq!(answer.encode(), data);
    }
}

fuzz_target!(|data: &[u8]| {
    let (set, header) = &*KEYS;
    decode_all(set, data);
    let mut framed = header.clone();
    framed.extend_from_slice(data);
    decode_all(set, &framed);
});
