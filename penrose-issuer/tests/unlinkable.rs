//! Unlinkability by construction, checked on the stored bytes: after issuing tokens to an agent
//! and redeeming them the way the aggregation server will (a redemption per report body, the
//! spent id from `IssuerKey::verify`), nothing the redemption side sees or records (nonces,
//! outputs, tags, spent ids) occurs anywhere in the issuer's store or state directory (every
//! key and value of every column family, and the raw bytes of every file but the master seed),
//! nor does the raw credential, nor any blinded element, evaluated element or proof of the
//! issuance transcript: the issuer keeps none of them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::path::Path;

use common::{Harness, START_DAY};
use penrose_core::tokens::SpentId;
use penrose_core::wire::Day;
use penrose_issuer::credential::CredentialId;
use penrose_issuer::keys;
use penrose_issuer::{IssuerConfig, MasterSeed};
use penrose_kv::Table as _;
use rand::RngCore;

/// Every run of this many bytes of a secret is looked for, not just the whole value.
const WINDOW: usize = 12;

fn windows(bytes: &[u8]) -> impl Iterator<Item = [u8; WINDOW]> + '_ {
    bytes.windows(WINDOW).map(|w| {
        let mut out = [0u8; WINDOW];
        out.copy_from_slice(w);
        out
    })
}

fn files(dir: &Path, skip: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let kind = std::fs::symlink_metadata(&path).unwrap().file_type();
        if kind.is_dir() {
            files(&path, skip, out);
        } else if kind.is_file() && path != skip {
            out.push((path.display().to_string(), std::fs::read(&path).unwrap()));
        }
    }
}

#[tokio::test]
async fn the_issuers_stored_bytes_share_nothing_with_redemptions_or_the_transcript() {
    let mut h = Harness::new();
    h.config = IssuerConfig::new(24, 100).unwrap();
    h.start().await;
    let agent = h.enrol(Some("host under test")).await;
    let client = h.client();
    let set = client.key_set().await;
    let today = START_DAY;
    let tomorrow = Day(today.0 + 1);
    let mut issued = Vec::new();
    for asks in [
        vec![(today, 0, 24), (today, 3, 10)],
        vec![(tomorrow, 8, 24), (today, 3, 14)],
    ] {
        let batch = client.tokens(&agent, &set, &asks).await;
        assert!(batch.outcomes.iter().all(Option::is_none));
        issued.push(batch);
    }
    let tokens: Vec<_> = issued
        .iter()
        .flat_map(|i| i.tokens.iter().flatten())
        .collect();
    assert_eq!(tokens.len(), 72);

    // Redeem every token on a report body of its own, as the aggregation server will verify
    // it, with the ring `export-keys` writes.
    let seed = MasterSeed::load(&h.state.seed()).unwrap();
    let ring = keys::key_ring(&seed, Day(today.0 - 2), Day(today.0 + 7)).unwrap();
    let mut rng = rand::rng();
    let mut redeemed: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut spent = HashSet::new();
    for token in &tokens {
        let mut body = vec![0u8; 1126];
        rng.fill_bytes(&mut body);
        let redemption = token.redeem(&body);
        let id: SpentId = ring
            .find(token.epoch(), token.key_id())
            .unwrap()
            .verify(&redemption, &body)
            .unwrap();
        assert!(spent.insert(id));
        let stored = token.to_bytes();
        redeemed.push(("nonce", redemption.nonce().to_vec()));
        redeemed.push(("output", stored[68..].to_vec()));
        redeemed.push(("tag", redemption.tag().to_vec()));
        redeemed.push(("spent id", id.0.to_vec()));
    }
    // The issuance transcript past each message's public header (epoch, key id, count):
    // blinded elements; evaluated elements and the proof.
    let mut transcript: Vec<(&str, Vec<u8>)> = Vec::new();
    for batch in &issued {
        for sent in &batch.sent {
            transcript.push(("blinded elements", sent[38..].to_vec()));
        }
        for response in &batch.responses {
            let proof_at = response.len() - 64;
            transcript.push(("evaluated elements", response[38..proof_at].to_vec()));
            transcript.push(("proof", response[proof_at..].to_vec()));
        }
    }
    let mut secrets = redeemed;
    secrets.extend(transcript);
    secrets.push(("the raw credential", agent.0.to_vec()));
    let needles: std::collections::HashMap<[u8; WINDOW], &str> = secrets
        .iter()
        .flat_map(|(what, bytes)| windows(bytes).map(move |w| (w, *what)))
        .collect();

    // Every key and value of every column family, read through RocksDB while serving...
    let rows = h.dump();
    assert!(rows.len() >= 4, "the store holds no rows: {rows:?}");
    h.stop().await;
    // ... and every byte of every file of the state directory but the seed, after a stop.
    let mut haystacks: Vec<(String, Vec<u8>)> = rows
        .into_iter()
        .flat_map(|(table, key, value)| {
            [
                (format!("{} key", table.name()), key),
                (format!("{} value", table.name()), value),
            ]
        })
        .collect();
    let before = haystacks.len();
    files(h.state.path(), &h.state.seed(), &mut haystacks);
    assert!(haystacks.len() > before + 3, "no files read");

    for (place, bytes) in &haystacks {
        for window in windows(bytes) {
            if let Some(what) = needles.get(&window) {
                panic!("{place} holds bytes of a {what}");
            }
        }
    }

    // Not vacuous: the same search finds what the issuer does keep (the credential's id, in
    // its rows and, raw, in the database files).
    let id = CredentialId::of(&agent);
    let found: Vec<&String> = haystacks
        .iter()
        .filter(|(_, bytes)| bytes.windows(32).any(|w| w == id.0))
        .map(|(place, _)| place)
        .collect();
    assert!(
        found.iter().any(|p| p.starts_with("credentials key")),
        "{found:?}"
    );
    assert!(found.iter().any(|p| p.contains("/db/")), "{found:?}");
    // And the seed, which derives the keys, is the one file left out: it matches no secret
    // either, but holding it means holding every key (docs/threat-model.md).
    let seed_bytes = std::fs::read(h.state.seed()).unwrap();
    assert!(windows(&seed_bytes).all(|w| !needles.contains_key(&w)));
}
