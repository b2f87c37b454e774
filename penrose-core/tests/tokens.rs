//! The anonymous token scheme end to end through its byte encodings, as the issuer, the agent
//! and the aggregation server will use it, and every refusal the issue asks for. The RFC 9497
//! vectors are unit tests of the module (`src/tokens/vectors.rs`).
#![cfg(feature = "tokens")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;

use penrose_core::tokens::{
    BlindedRequest, ISSUER_KEY_BYTES, IssueResponse, IssuerKey, KeyEntry, KeyRing, KeySet,
    MAX_BATCH, REDEMPTION_BYTES, Redemption, SpentId, TOKEN_BYTES, Token, TokenEpoch, TokenError,
    TokenKeyId, TokenRequest, TokenScope,
};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

fn rng(seed: u64) -> ChaCha20Rng {
    ChaCha20Rng::seed_from_u64(seed)
}

/// The issuer's keys of epochs 7 and 8 and the set it publishes.
fn setup() -> (IssuerKey, IssuerKey, KeySet) {
    let mut r = rng(1);
    let key7 = IssuerKey::generate(TokenEpoch(7), TokenScope(0), &mut r);
    let key8 = IssuerKey::generate(TokenEpoch(8), TokenScope(0), &mut r);
    let set = KeySet::of_keys([&key7, &key8]).unwrap();
    (key7, key8, set)
}

/// Issues `count` tokens of `key` through the encodings: the client decodes the published set,
/// the issuer decodes the request, the client decodes the response. Returns the tokens and the
/// issuer's transcript (request and response bytes).
fn issue(key: &IssuerKey, set: &KeySet, count: usize, seed: u64) -> (Vec<Token>, Vec<Vec<u8>>) {
    let mut client_rng = rng(seed);
    let mut issuer_rng = rng(seed + 1000);
    let published = KeySet::decode(&set.encode()).unwrap();
    assert_eq!(published.digest(), set.digest());
    let entry = published.get(key.epoch(), key.scope()).unwrap();
    let pending = TokenRequest::new(entry, count, &mut client_rng).unwrap();
    let request_bytes = pending.request().encode();
    assert_eq!(request_bytes.len(), BlindedRequest::encoded_len(count));

    let received = BlindedRequest::decode(&request_bytes, set).unwrap();
    let response = key.issue(&received, &mut issuer_rng).unwrap();
    let response_bytes = response.encode();
    assert_eq!(response_bytes.len(), IssueResponse::encoded_len(count));

    let answer = IssueResponse::decode(&response_bytes, &published).unwrap();
    let tokens = pending.finalize(&answer).unwrap();
    (tokens, vec![request_bytes, response_bytes])
}

fn report_body(i: usize) -> Vec<u8> {
    format!("report body {i}: ciphertexts and all").into_bytes()
}

#[test]
fn issue_finalize_redeem_verify_round_trip() {
    let (key7, _, set) = setup();
    let (tokens, _) = issue(&key7, &set, 24, 2);
    assert_eq!(tokens.len(), 24);
    let mut spent = HashSet::new();
    for (i, token) in tokens.iter().enumerate() {
        assert_eq!(token.epoch(), TokenEpoch(7));
        assert_eq!(token.key_id(), key7.key_id());
        // The agent stores the token and reads it back before spending it.
        let stored = Token::from_bytes(&token.to_bytes()).unwrap();
        assert_eq!(&stored, token);
        let body = report_body(i);
        let wire = stored.redeem(&body).encode();
        assert_eq!(wire.len(), REDEMPTION_BYTES);

        let redemption = Redemption::decode(&wire, &set).unwrap();
        let id = key7.verify(&redemption, &body).unwrap();
        assert!(spent.insert(id), "every token has its own spent id");
    }
}

#[test]
fn one_token_spent_twice_gives_one_spent_id() {
    // The server refuses the second use by its spent id; a retried upload of the same report
    // and the same token on another report both map to it.
    let (key7, _, set) = setup();
    let (tokens, _) = issue(&key7, &set, 1, 3);
    let token = &tokens[0];
    let first = key7.verify(&token.redeem(b"a"), b"a").unwrap();
    let retry = key7.verify(&token.redeem(b"a"), b"a").unwrap();
    let elsewhere = key7.verify(&token.redeem(b"b"), b"b").unwrap();
    assert_eq!(first, retry);
    assert_eq!(first, elsewhere);
}

#[test]
fn a_forged_token_is_refused() {
    let (key7, _, set) = setup();
    let mut r = rng(4);
    for _ in 0..16 {
        // Right epoch and key id, random nonce and output.
        let mut bytes = [0u8; TOKEN_BYTES];
        bytes[..4].copy_from_slice(&7u32.to_be_bytes());
        bytes[4..36].copy_from_slice(&key7.key_id().0);
        r.fill_bytes(&mut bytes[36..]);
        let forged = Token::from_bytes(&bytes).unwrap();
        let redemption = Redemption::decode(&forged.redeem(b"body").encode(), &set).unwrap();
        assert_eq!(
            key7.verify(&redemption, b"body"),
            Err(TokenError::InvalidToken)
        );
    }
    // A real token's nonce with a random tag.
    let (tokens, _) = issue(&key7, &set, 1, 5);
    let mut wire = tokens[0].redeem(b"body").encode();
    r.fill_bytes(&mut wire[68..]);
    let redemption = Redemption::decode(&wire, &set).unwrap();
    assert_eq!(
        key7.verify(&redemption, b"body"),
        Err(TokenError::InvalidToken)
    );
}

#[test]
fn a_token_of_another_epochs_key_is_refused() {
    let (key7, key8, set) = setup();
    let (tokens, _) = issue(&key7, &set, 1, 6);
    let redemption = tokens[0].redeem(b"body");
    // Presented as what it is, to the other epoch's key.
    assert_eq!(
        key8.verify(&redemption, b"body"),
        Err(TokenError::UnknownKey {
            epoch: TokenEpoch(7),
            key_id: key7.key_id()
        })
    );
    // Relabelled as a token of epoch 8: it names the right key, and its tag does not verify.
    let mut wire = redemption.encode();
    wire[..4].copy_from_slice(&8u32.to_be_bytes());
    wire[4..36].copy_from_slice(&key8.key_id().0);
    let relabelled = Redemption::decode(&wire, &set).unwrap();
    assert_eq!(
        key8.verify(&relabelled, b"body"),
        Err(TokenError::InvalidToken)
    );
    // An epoch whose key was retired from the server's set is refused at decoding.
    let only8 = KeySet::of_keys([&key8]).unwrap();
    assert!(matches!(
        Redemption::decode(&redemption.encode(), &only8),
        Err(TokenError::UnknownKey { .. })
    ));
}

#[test]
fn a_token_bound_to_another_report_body_is_refused() {
    let (key7, _, set) = setup();
    let (tokens, _) = issue(&key7, &set, 2, 7);
    let redemption = tokens[0].redeem(&report_body(1));
    assert!(key7.verify(&redemption, &report_body(1)).is_ok());
    for other in [report_body(2), Vec::new(), {
        let mut longer = report_body(1);
        longer.push(0);
        longer
    }] {
        assert_eq!(
            key7.verify(&redemption, &other),
            Err(TokenError::InvalidToken)
        );
    }
    // Another token's nonce under this token's tag.
    let mut wire = redemption.encode();
    let other = tokens[1].redeem(&report_body(1)).encode();
    wire[36..68].copy_from_slice(&other[36..68]);
    let swapped = Redemption::decode(&wire, &set).unwrap();
    assert_eq!(
        key7.verify(&swapped, &report_body(1)),
        Err(TokenError::InvalidToken)
    );
}

#[test]
fn an_issuance_whose_proof_does_not_verify_is_refused() {
    // A partitioning issuer: it answers with a key it did not publish (one made for this
    // client) while naming the published one. The client must refuse the whole issuance.
    let (key7, _, set) = setup();
    let rogue = IssuerKey::generate(TokenEpoch(7), TokenScope(0), &mut rng(8));
    let rogue_set = KeySet::of_keys([&rogue]).unwrap();

    let entry = set.get(TokenEpoch(7), TokenScope(0)).unwrap();
    let pending = TokenRequest::new(entry, 4, &mut rng(9)).unwrap();
    let mut request = pending.request().encode();
    request[4..36].copy_from_slice(&rogue.key_id().0);
    let received = BlindedRequest::decode(&request, &rogue_set).unwrap();
    let answer = rogue.issue(&received, &mut rng(10)).unwrap();
    let mut response = answer.encode();
    response[4..36].copy_from_slice(&key7.key_id().0);
    let decoded = IssueResponse::decode(&response, &set).unwrap();
    assert_eq!(
        pending.finalize(&decoded),
        Err(TokenError::ProofFailed(TokenEpoch(7)))
    );

    // An honest answer whose proof was altered (another valid proof: the one of another batch).
    let pending = TokenRequest::new(entry, 4, &mut rng(11)).unwrap();
    let honest = key7.issue(pending.request(), &mut rng(12)).unwrap();
    let other_batch = TokenRequest::new(entry, 4, &mut rng(13)).unwrap();
    let other = key7.issue(other_batch.request(), &mut rng(14)).unwrap();
    let mut spliced = honest.encode();
    let proof_at = spliced.len() - 64;
    spliced[proof_at..].copy_from_slice(&other.encode()[proof_at..]);
    let spliced = IssueResponse::decode(&spliced, &set).unwrap();
    assert_eq!(
        pending.finalize(&spliced),
        Err(TokenError::ProofFailed(TokenEpoch(7)))
    );
}

#[test]
fn a_response_to_another_request_is_refused() {
    let (key7, key8, set) = setup();
    let pending = TokenRequest::new(
        set.get(TokenEpoch(7), TokenScope(0)).unwrap(),
        3,
        &mut rng(15),
    )
    .unwrap();
    // Another epoch.
    let for8 = TokenRequest::new(
        set.get(TokenEpoch(8), TokenScope(0)).unwrap(),
        3,
        &mut rng(16),
    )
    .unwrap();
    let answer8 = key8.issue(for8.request(), &mut rng(17)).unwrap();
    assert!(matches!(
        pending.finalize(&answer8),
        Err(TokenError::Mismatch(_))
    ));
    // Another count.
    let pending = TokenRequest::new(
        set.get(TokenEpoch(7), TokenScope(0)).unwrap(),
        3,
        &mut rng(18),
    )
    .unwrap();
    let two = TokenRequest::new(
        set.get(TokenEpoch(7), TokenScope(0)).unwrap(),
        2,
        &mut rng(19),
    )
    .unwrap();
    let answer2 = key7.issue(two.request(), &mut rng(20)).unwrap();
    assert!(matches!(
        pending.finalize(&answer2),
        Err(TokenError::Mismatch(_))
    ));
    // The issuer refuses a request for a key that is not its own.
    assert!(matches!(
        key7.issue(for8.request(), &mut rng(21)),
        Err(TokenError::UnknownKey { .. })
    ));
}

fn windows(bytes: &[u8]) -> HashSet<[u8; 16]> {
    bytes.windows(16).map(|w| w.try_into().unwrap()).collect()
}

#[test]
fn issuer_transcript_and_redemption_share_no_bytes() {
    // What the issuer sees at issuance (request and response, as stored or logged) against
    // what the aggregation server sees and records at redemption (redemption bytes and spent
    // ids): no 16-byte run in common, except inside the published key set entry (epoch and key
    // id), which every client of the epoch shares.
    let (key7, _, set) = setup();
    let (tokens, transcript) = issue(&key7, &set, 24, 22);
    let mut redeemed: Vec<Vec<u8>> = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        let body = report_body(i);
        let redemption = token.redeem(&body);
        let spent: SpentId = key7.verify(&redemption, &body).unwrap();
        redeemed.push(redemption.encode().to_vec());
        redeemed.push(spent.0.to_vec());
    }
    let mut public = set.encode();
    for entry in set.entries() {
        public.extend_from_slice(&entry.epoch().0.to_be_bytes());
        public.extend_from_slice(&entry.key_id().0);
    }
    let public = windows(&public);
    let issuer_seen: HashSet<[u8; 16]> = transcript.iter().flat_map(|b| windows(b)).collect();
    let server_seen: HashSet<[u8; 16]> = redeemed.iter().flat_map(|b| windows(b)).collect();
    // The key id is in both, as it must be (the server has to know which key to verify with):
    // the check below is not vacuous.
    assert!(issuer_seen.intersection(&server_seen).next().is_some());
    let shared: Vec<_> = issuer_seen
        .intersection(&server_seen)
        .filter(|w| !public.contains(*w))
        .collect();
    assert!(shared.is_empty(), "shared runs: {}", shared.len());

    // Stricter: the per-issuance values alone (blinded elements, evaluated elements, proof,
    // i.e. each message past its 38-byte header) share not even a public run.
    let per_issuance: HashSet<[u8; 16]> =
        transcript.iter().flat_map(|b| windows(&b[38..])).collect();
    assert!(per_issuance.is_disjoint(&server_seen));
    // And the client's secrets (nonces and outputs, in the stored tokens) never reached the
    // issuer.
    let secrets: HashSet<[u8; 16]> = tokens
        .iter()
        .flat_map(|t| windows(&t.to_bytes()[36..]))
        .collect();
    assert!(secrets.is_disjoint(&issuer_seen));
}

#[test]
fn batch_sizes_are_bounded() {
    let (key7, _, set) = setup();
    let entry = set.get(TokenEpoch(7), TokenScope(0)).unwrap();
    for count in [0, MAX_BATCH + 1, 1000] {
        assert!(matches!(
            TokenRequest::new(entry, count, &mut rng(23)),
            Err(TokenError::Count { count: c, max: MAX_BATCH, .. }) if c == count
        ));
    }
    // The largest batch works end to end.
    let (tokens, _) = issue(&key7, &set, MAX_BATCH, 24);
    assert_eq!(tokens.len(), MAX_BATCH);

    // An oversized request, well formed otherwise, is refused before its elements are read.
    let one = TokenRequest::new(entry, 1, &mut rng(25)).unwrap();
    let element = one.request().encode()[38..].to_vec();
    for count in [0usize, MAX_BATCH + 1] {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&7u32.to_be_bytes());
        bytes.extend_from_slice(&key7.key_id().0);
        bytes.extend_from_slice(&(count as u16).to_be_bytes());
        for _ in 0..count {
            bytes.extend_from_slice(&element);
        }
        assert!(matches!(
            BlindedRequest::decode(&bytes, &set),
            Err(TokenError::Count { .. })
        ));
        bytes.extend_from_slice(&[0u8; 64]);
        assert!(matches!(
            IssueResponse::decode(&bytes, &set),
            Err(TokenError::Count { .. })
        ));
    }
}

/// 32-byte strings that are not valid ristretto255 elements for the decoders: the identity
/// (refused by RFC 9497), a non-canonical field element (>= p), a "negative" one (odd), and
/// all ones.
fn invalid_elements() -> Vec<[u8; 32]> {
    let mut above_p = [0xffu8; 32];
    above_p[0] = 0xed;
    above_p[31] = 0x7f; // p = 2^255 - 19 itself
    let mut odd = [0u8; 32];
    odd[0] = 1;
    vec![[0u8; 32], above_p, odd, [0xff; 32]]
}

#[test]
fn decoders_refuse_wrong_lengths() {
    let (key7, _, set) = setup();
    let pending = TokenRequest::new(
        set.get(TokenEpoch(7), TokenScope(0)).unwrap(),
        3,
        &mut rng(26),
    )
    .unwrap();
    let request = pending.request().encode();
    let response = key7
        .issue(pending.request(), &mut rng(27))
        .unwrap()
        .encode();
    let tokens = pending
        .finalize(&IssueResponse::decode(&response, &set).unwrap())
        .unwrap();
    let redemption = tokens[0].redeem(b"x").encode().to_vec();
    let key_set = set.encode();
    let token = tokens[0].to_bytes().to_vec();
    let secret = key7.to_secret_bytes().to_vec();

    type Accepts<'a> = &'a dyn Fn(&[u8]) -> bool;
    let cases: [(&str, &Vec<u8>, Accepts); 6] = [
        ("request", &request, &|b| {
            BlindedRequest::decode(b, &set).is_ok()
        }),
        ("response", &response, &|b| {
            IssueResponse::decode(b, &set).is_ok()
        }),
        ("redemption", &redemption, &|b| {
            Redemption::decode(b, &set).is_ok()
        }),
        ("key set", &key_set, &|b| KeySet::decode(b).is_ok()),
        ("token", &token, &|b| Token::from_bytes(b).is_ok()),
        ("issuer key", &secret, &|b| {
            IssuerKey::from_secret_bytes(b).is_ok()
        }),
    ];
    for (what, valid, accepts) in cases {
        assert!(accepts(valid), "{what}: the valid encoding decodes");
        for cut in 0..valid.len() {
            assert!(
                !accepts(&valid[..cut]),
                "{what}: truncated to {cut} accepted"
            );
        }
        for extra in [1usize, 32, 64] {
            let mut longer = valid.clone();
            longer.resize(valid.len() + extra, 0);
            assert!(!accepts(&longer), "{what}: {extra} trailing bytes accepted");
        }
    }
    assert_eq!(ISSUER_KEY_BYTES, secret.len());
}

#[test]
fn decoders_refuse_invalid_elements() {
    let (key7, _, set) = setup();
    let pending = TokenRequest::new(
        set.get(TokenEpoch(7), TokenScope(0)).unwrap(),
        3,
        &mut rng(28),
    )
    .unwrap();
    let request = pending.request().encode();
    let response = key7
        .issue(pending.request(), &mut rng(29))
        .unwrap()
        .encode();
    for bad in invalid_elements() {
        for index in 0..3 {
            let at = 38 + 32 * index;
            let mut r = request.clone();
            r[at..at + 32].copy_from_slice(&bad);
            assert_eq!(
                BlindedRequest::decode(&r, &set),
                Err(TokenError::InvalidElement {
                    what: "blinded element",
                    index
                })
            );
            let mut r = response.clone();
            r[at..at + 32].copy_from_slice(&bad);
            assert_eq!(
                IssueResponse::decode(&r, &set),
                Err(TokenError::InvalidElement {
                    what: "evaluated element",
                    index
                })
            );
        }
        // A key set with an invalid public key.
        let mut bytes = set.encode();
        bytes[9..41].copy_from_slice(&bad);
        assert!(matches!(
            KeySet::decode(&bytes),
            Err(TokenError::InvalidElement {
                what: "public key",
                index: 0
            })
        ));
        assert!(KeyEntry::new(TokenEpoch(1), TokenScope(0), bad).is_err());
    }
    // A proof scalar that is zero or not reduced mod the group order.
    for bad in [[0u8; 32], [0xff; 32]] {
        for half in [0, 32] {
            let mut r = response.clone();
            let at = r.len() - 64 + half;
            r[at..at + 32].copy_from_slice(&bad);
            assert_eq!(
                IssueResponse::decode(&r, &set),
                Err(TokenError::InvalidProof)
            );
        }
    }
}

#[test]
fn decoders_refuse_unknown_epochs_and_key_ids() {
    let (key7, key8, set) = setup();
    let pending = TokenRequest::new(
        set.get(TokenEpoch(7), TokenScope(0)).unwrap(),
        2,
        &mut rng(30),
    )
    .unwrap();
    let request = pending.request().encode();
    let response = key7
        .issue(pending.request(), &mut rng(31))
        .unwrap()
        .encode();
    let tokens = pending
        .finalize(&IssueResponse::decode(&response, &set).unwrap())
        .unwrap();
    let redemption = tokens[0].redeem(b"x").encode().to_vec();
    let relabel = |bytes: &[u8], epoch: u32, key_id: TokenKeyId| {
        let mut b = bytes.to_vec();
        b[..4].copy_from_slice(&epoch.to_be_bytes());
        b[4..36].copy_from_slice(&key_id.0);
        b
    };
    // An epoch the set does not hold; a known epoch with another epoch's key id; a key id
    // nobody published.
    let unknown = [
        (9, key7.key_id()),
        (7, key8.key_id()),
        (7, TokenKeyId([0x5a; 32])),
    ];
    for (epoch, key_id) in unknown {
        let expected = Err(TokenError::UnknownKey {
            epoch: TokenEpoch(epoch),
            key_id,
        });
        assert_eq!(
            BlindedRequest::decode(&relabel(&request, epoch, key_id), &set).map(|_| ()),
            expected
        );
        assert_eq!(
            IssueResponse::decode(&relabel(&response, epoch, key_id), &set).map(|_| ()),
            expected
        );
        assert_eq!(
            Redemption::decode(&relabel(&redemption, epoch, key_id), &set).map(|_| ()),
            expected
        );
    }
}

#[test]
fn key_sets_are_canonical() {
    let (key7, key8, set) = setup();
    // Built in any order, encoded by epoch; the encoding round-trips.
    let reversed = KeySet::of_keys([&key8, &key7]).unwrap();
    assert_eq!(reversed.encode(), set.encode());
    assert_eq!(KeySet::decode(&set.encode()).unwrap(), set);
    assert_eq!(
        set.find(TokenEpoch(8), key8.key_id()).unwrap(),
        key8.entry()
    );

    // Out of order on the wire: refused, not repaired.
    let bytes = set.encode();
    let mut swapped = bytes[..3].to_vec();
    swapped.extend_from_slice(&bytes[41..79]);
    swapped.extend_from_slice(&bytes[3..41]);
    assert!(matches!(
        KeySet::decode(&swapped),
        Err(TokenError::KeySet(_))
    ));
    // Two keys for one epoch; one key for two epochs.
    let other7 = IssuerKey::generate(TokenEpoch(7), TokenScope(0), &mut rng(32));
    assert!(KeySet::of_keys([&key7, &other7]).is_err());
    let reused = KeyEntry::new(TokenEpoch(9), TokenScope(0), *key7.entry().public_key()).unwrap();
    assert!(matches!(
        KeySet::new([key7.entry().clone(), reused]),
        Err(TokenError::KeySet(_))
    ));
    // Another version; an empty set.
    let mut versioned = bytes.clone();
    versioned[0] = 1;
    assert!(KeySet::decode(&versioned).is_err());
    assert!(KeySet::decode(&[2, 0, 0]).is_err());
    assert!(KeySet::new([]).is_err());
}

#[test]
fn scopes_have_keys_of_their_own_and_a_token_admits_only_its_scope() {
    let seed = [5; 32];
    let a = IssuerKey::derive(TokenEpoch(7), TokenScope(0), &seed).unwrap();
    let b = IssuerKey::derive(TokenEpoch(7), TokenScope(1), &seed).unwrap();
    let c = IssuerKey::derive(TokenEpoch(8), TokenScope(0), &seed).unwrap();
    let set = KeySet::of_keys([&c, &b, &a]).unwrap();
    // Ordered by (epoch, scope); one epoch's keys are found by key id whatever the scope.
    let names: Vec<_> = set.entries().iter().map(|e| e.name()).collect();
    assert_eq!(
        names,
        [
            (TokenEpoch(7), TokenScope(0)),
            (TokenEpoch(7), TokenScope(1)),
            (TokenEpoch(8), TokenScope(0))
        ]
    );
    assert_eq!(set.epoch(TokenEpoch(7)).len(), 2);
    assert_eq!(
        set.epochs().collect::<Vec<_>>(),
        [TokenEpoch(7), TokenEpoch(8)]
    );
    assert_eq!(
        set.find(TokenEpoch(7), b.key_id()).unwrap().scope(),
        TokenScope(1)
    );
    assert!(set.find(TokenEpoch(8), b.key_id()).is_err());
    assert_eq!(KeySet::decode(&set.encode()).unwrap(), set);
    // Two keys of one (epoch, scope) are refused.
    let again = IssuerKey::derive(TokenEpoch(7), TokenScope(1), &[6; 32]).unwrap();
    assert!(KeySet::of_keys([&a, &b, &again]).is_err());
    // A token of scope 1 does not verify under scope 0's key.
    let (tokens, _) = issue(&b, &set, 1, 40);
    let redemption = tokens[0].redeem(b"body");
    assert!(b.verify(&redemption, b"body").is_ok());
    assert!(a.verify(&redemption, b"body").is_err());
    // The secret encoding keeps the scope.
    let back = IssuerKey::from_secret_bytes(&b.to_secret_bytes()).unwrap();
    assert_eq!(back.entry(), b.entry());
}

#[test]
fn issuer_keys_round_trip_and_never_print_their_secret() {
    let (key7, _, _) = setup();
    let stored = key7.to_secret_bytes();
    let again = IssuerKey::from_secret_bytes(&stored).unwrap();
    assert_eq!(again.epoch(), key7.epoch());
    assert_eq!(again.key_id(), key7.key_id());
    assert_eq!(again.entry(), key7.entry());
    // Derivation is deterministic per (epoch, seed) and differs across epochs.
    let a = IssuerKey::derive(TokenEpoch(1), TokenScope(0), &[3; 32]).unwrap();
    let b = IssuerKey::derive(TokenEpoch(1), TokenScope(0), &[3; 32]).unwrap();
    let c = IssuerKey::derive(TokenEpoch(2), TokenScope(0), &[3; 32]).unwrap();
    let d = IssuerKey::derive(TokenEpoch(1), TokenScope(1), &[3; 32]).unwrap();
    assert_eq!(a.key_id(), b.key_id());
    assert_ne!(a.key_id(), c.key_id());
    assert_ne!(a.key_id(), d.key_id());
    // A zero or unreduced scalar is refused.
    for bad in [[0u8; 32], [0xff; 32]] {
        let mut bytes = stored;
        bytes[6..].copy_from_slice(&bad);
        assert_eq!(
            IssuerKey::from_secret_bytes(&bytes).map(|_| ()),
            Err(TokenError::InvalidSecretKey)
        );
    }
    // Debug output names the key, never the secret or a token's output.
    let secret_hex: String = stored[6..].iter().map(|b| format!("{b:02x}")).collect();
    let printed = format!("{key7:?}");
    assert!(!printed.contains(&secret_hex[..16]));
    assert!(printed.contains("IssuerKey"));
    let (_, _, set) = setup();
    let (tokens, _) = issue(&key7, &set, 1, 33);
    let output_hex: String = tokens[0].to_bytes()[68..]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let printed = format!("{:?}", tokens[0]);
    assert!(!printed.contains(&output_hex[..16]));
}

#[test]
fn key_rings_round_trip_and_refuse_damage() {
    let keys: Vec<IssuerKey> = (0..3)
        .flat_map(|scope| {
            [7, 8].map(|epoch| {
                IssuerKey::derive(TokenEpoch(epoch), TokenScope(scope), &[9; 32]).unwrap()
            })
        })
        .collect();
    let ring = KeyRing::new(keys.clone()).unwrap();
    let bytes = ring.encode();
    let back = KeyRing::decode(&bytes).unwrap();
    assert_eq!(back.key_set(), ring.key_set());
    assert_eq!(back.key_set(), KeySet::of_keys(&keys).unwrap());
    let key = back.get(TokenEpoch(8), TokenScope(2)).unwrap();
    assert_eq!(key.entry(), keys[5].entry());
    assert_eq!(
        back.find(TokenEpoch(8), key.key_id()).unwrap().scope(),
        TokenScope(2)
    );
    assert!(back.find(TokenEpoch(7), key.key_id()).is_err());
    // Cut short, extended, another file, another version, keys swapped, a key twice.
    assert!(KeyRing::decode(&bytes[..bytes.len() - 1]).is_err());
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(KeyRing::decode(&longer).is_err());
    assert!(KeyRing::decode(&ring.key_set().encode()).is_err());
    let mut versioned = bytes.clone();
    versioned[18] = 2;
    assert!(KeyRing::decode(&versioned).is_err());
    let header = 21;
    let mut swapped = bytes[..header].to_vec();
    swapped.extend_from_slice(&bytes[header + ISSUER_KEY_BYTES..header + 2 * ISSUER_KEY_BYTES]);
    swapped.extend_from_slice(&bytes[header..header + ISSUER_KEY_BYTES]);
    swapped.extend_from_slice(&bytes[header + 2 * ISSUER_KEY_BYTES..]);
    assert!(KeyRing::decode(&swapped).is_err());
    assert!(KeyRing::new([keys[0].clone(), keys[0].clone()]).is_err());
    assert!(KeyRing::new([]).is_err());
}
