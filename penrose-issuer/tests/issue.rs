//! The issuer over real QUIC on loopback: enrolment and issuance end to end (tokens that verify
//! with the exported key ring), the quota per (credential, epoch, scope) across restarts and
//! days, unknown and revoked credentials, the rate limit, an issuer that evaluates with a key
//! it did not publish, and malformed requests that change nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::{Harness, START_DAY};
use penrose_core::counters::Catalogue;
use penrose_core::tokens::protocol::{
    BatchOutcome, Credential, IssuerAnswer, IssuerRequest, PROTOCOL_VERSION, Refusal,
};
use penrose_core::tokens::{
    BlindedRequest, IssueResponse, IssuerKey, TokenEpoch, TokenError, TokenKeyId, TokenRequest,
    TokenScope,
};
use penrose_core::wire::Day;
use penrose_host::clock::SECONDS_PER_DAY;
use penrose_issuer::keys::{self, PublishWindow, Published};
use penrose_issuer::service::PROTOCOL;
use penrose_issuer::{IssuerConfig, IssuerError, MasterSeed};
use penrose_transport::exchange::{ExchangeHandler, serve_exchange};
use penrose_transport::{ClientConfig, Identity, Limits, ServerConfig, Trust};

fn day(offset: i64) -> Day {
    Day((i64::from(START_DAY.0) + offset) as u32)
}

/// A configuration whose rate limit stays out of the way of tests about something else.
fn roomy() -> IssuerConfig {
    IssuerConfig::new(24, 10_000).unwrap()
}

#[tokio::test]
async fn enrolled_agents_get_tokens_over_quic_that_verify_with_the_exported_ring() {
    let mut h = Harness::new();
    h.config = roomy();
    h.start().await;
    let credential = h.enrol(Some("gpu-host-1")).await;
    let client = h.client();
    let set = client.key_set().await;

    // The published set: today-2 ..= today+2, every counter of the catalogue, and exactly
    // what `penrose-issuer key-set` writes for today.
    let seed = MasterSeed::load(&h.state.seed()).unwrap();
    let published = Published::of(&seed, PublishWindow::default(), START_DAY).unwrap();
    assert_eq!(set.digest(), published.set.digest());
    let epochs: Vec<u32> = set.epochs().map(|e| e.0).collect();
    assert_eq!(epochs, (day(-2).0..=day(2).0).collect::<Vec<_>>());
    assert_eq!(
        set.epoch(TokenEpoch(START_DAY.0)).len(),
        Catalogue::current().report_ids().count()
    );

    // Two scopes of today and one of tomorrow in one request.
    let issued = client
        .tokens(
            &credential,
            &set,
            &[(day(0), 0, 24), (day(0), 5, 3), (day(1), 8, 7)],
        )
        .await;
    assert!(issued.refused.is_none());
    assert_eq!(issued.outcomes, vec![None, None, None]);
    assert_eq!(issued.count(), 24 + 3 + 7);

    // The aggregation server's ring (`export-keys`' default range) verifies every token, each
    // under its own (epoch, scope), once.
    let ring = keys::key_ring(&seed, day(-2), day(7)).unwrap();
    let mut spent = HashSet::new();
    for (i, token) in issued.tokens.iter().flatten().enumerate() {
        let body = format!("report body {i}").into_bytes();
        let redemption = token.redeem(&body);
        let key = ring.find(token.epoch(), token.key_id()).unwrap();
        assert!(spent.insert(key.verify(&redemption, &body).unwrap()));
        // Bound to its body.
        assert_eq!(
            key.verify(&redemption, b"another body"),
            Err(TokenError::InvalidToken)
        );
    }
    assert_eq!(spent.len(), 34);
    let stats = h.running.as_ref().unwrap().issuer().stats();
    assert_eq!((stats.tokens_issued, stats.batches_issued), (34, 3));
    h.stop().await;
}

#[tokio::test]
async fn a_credential_gets_exactly_t_tokens_per_epoch_and_scope_then_quota_for_the_rest_of_it() {
    let mut h = Harness::new();
    h.config = roomy();
    h.start().await;
    let agent = h.enrol(None).await;
    let client = h.client();
    let set = client.key_set().await;
    let ask = |asks: Vec<(Day, u16, usize)>| {
        let (client, set, agent) = (&client, &set, &agent);
        async move { client.tokens(agent, set, &asks).await }
    };

    assert_eq!(ask(vec![(day(0), 2, 20)]).await.count(), 20);
    // A batch beyond the quota gets nothing, only what remains.
    let over = ask(vec![(day(0), 2, 5)]).await;
    assert_eq!(over.count(), 0);
    assert_eq!(
        over.outcomes,
        vec![Some(BatchOutcome::Quota { remaining: 4 })]
    );
    // Batches of one request count together.
    let split = ask(vec![(day(0), 2, 3), (day(0), 2, 2)]).await;
    assert_eq!(split.tokens[0].len(), 3);
    assert_eq!(
        split.outcomes[1],
        Some(BatchOutcome::Quota { remaining: 1 })
    );
    assert_eq!(ask(vec![(day(0), 2, 1)]).await.count(), 1);
    // 24 now: nothing more of (today, counter 2), while other counters and tomorrow are
    // untouched.
    let full = ask(vec![(day(0), 2, 1), (day(0), 3, 24), (day(1), 2, 24)]).await;
    assert_eq!(
        full.outcomes,
        vec![Some(BatchOutcome::Quota { remaining: 0 }), None, None]
    );

    // The rest of the day, and across a restart: still nothing.
    h.clock.advance(11 * 3600);
    assert_eq!(h.today(), START_DAY);
    h.restart().await;
    let client = h.client();
    let after_restart = client.tokens(&agent, &set, &[(day(0), 2, 1)]).await;
    assert_eq!(
        after_restart.outcomes,
        vec![Some(BatchOutcome::Quota { remaining: 0 })]
    );
    // The stored count is exactly T.
    let seen: Vec<u16> = h
        .dump()
        .into_iter()
        .filter(|(table, ..)| *table == penrose_issuer::store::Table::Issued)
        .map(|(_, _, value)| u16::from_be_bytes([value[0], value[1]]))
        .collect();
    assert_eq!(seen, vec![24, 24, 24]);

    // The next day: today's epoch is no longer issued, tomorrow's (already full) stays full,
    // and the day after is fresh.
    h.clock.advance(SECONDS_PER_DAY);
    assert_eq!(h.today(), day(1));
    let set = client.key_set().await;
    let next = client
        .tokens(
            &agent,
            &set,
            &[(day(1), 2, 1), (day(2), 2, 24), (day(0), 3, 1)],
        )
        .await;
    assert_eq!(
        next.outcomes,
        vec![
            Some(BatchOutcome::Quota { remaining: 0 }),
            None,
            Some(BatchOutcome::UnknownKey)
        ]
    );
    assert_eq!(next.count(), 24);

    // Three days on, the counts of the first day are pruned and nothing is issued for it.
    h.clock.advance(3 * SECONDS_PER_DAY);
    let set = client.key_set().await;
    let later = client.tokens(&agent, &set, &[(day(4), 2, 24)]).await;
    assert_eq!(later.count(), 24);
    let epochs: HashSet<u32> = h
        .dump()
        .into_iter()
        .filter(|(table, ..)| *table == penrose_issuer::store::Table::Issued)
        .map(|(_, key, _)| u32::from_be_bytes([key[0], key[1], key[2], key[3]]))
        .collect();
    assert_eq!(epochs, HashSet::from([day(2).0, day(4).0]));
    h.stop().await;
}

#[tokio::test]
async fn concurrent_requests_of_one_credential_never_exceed_the_quota() {
    let mut h = Harness::new();
    h.config = roomy();
    h.start().await;
    let agent = h.enrol(None).await;
    let client = Arc::new(h.client());
    let set = Arc::new(client.key_set().await);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (client, set, agent) = (client.clone(), set.clone(), agent.clone());
        tasks.push(tokio::spawn(async move {
            client.tokens(&agent, &set, &[(day(0), 4, 5)]).await.count()
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    // 8 x 5 asked, 4 batches of 5 fit in 24.
    assert_eq!(total, 20);
    h.stop().await;
}

#[tokio::test]
async fn unknown_and_revoked_credentials_are_refused_and_change_nothing() {
    let mut h = Harness::new();
    h.config = roomy();
    h.start().await;
    let client = h.client();
    let set = client.key_set().await;
    let before = h.dump();
    let stranger = Credential([7; 32]);
    let refused = client.tokens(&stranger, &set, &[(day(0), 0, 1)]).await;
    assert_eq!(refused.refused, Some(Refusal::UnknownCredential));
    assert_eq!(h.dump(), before);

    let agent = h.enrol(Some("to be revoked")).await;
    assert_eq!(
        client.tokens(&agent, &set, &[(day(0), 0, 2)]).await.count(),
        2
    );
    // Revoked while serving, through the control socket: refused from the next request on.
    h.revoke(&agent).await;
    let refused = client.tokens(&agent, &set, &[(day(0), 0, 1)]).await;
    assert_eq!(refused.refused, Some(Refusal::UnknownCredential));
    h.restart().await;
    let client = h.client();
    let refused = client.tokens(&agent, &set, &[(day(1), 0, 1)]).await;
    assert_eq!(refused.refused, Some(Refusal::UnknownCredential));
    let stats = h.running.as_ref().unwrap().issuer().stats();
    assert_eq!(stats.refused_unknown_credential, 1);
    h.stop().await;
}

#[tokio::test]
async fn a_credential_over_its_request_rate_is_refused_until_its_bucket_refills() {
    let mut h = Harness::new();
    h.config = IssuerConfig::new(24, 3).unwrap();
    h.start().await;
    let client = h.client();
    let set = client.key_set().await;
    let (agent, other) = (h.enrol(None).await, h.enrol(None).await);
    for _ in 0..3 {
        assert_eq!(
            client.tokens(&agent, &set, &[(day(0), 1, 1)]).await.count(),
            1
        );
    }
    let limited = client.tokens(&agent, &set, &[(day(0), 1, 1)]).await;
    assert_eq!(limited.refused, Some(Refusal::RateLimited));
    // Another credential is not affected.
    assert_eq!(
        client.tokens(&other, &set, &[(day(0), 1, 1)]).await.count(),
        1
    );

    // Three an hour: one more every 20 minutes.
    h.clock.advance(1199);
    let limited = client.tokens(&agent, &set, &[(day(0), 1, 1)]).await;
    assert_eq!(limited.refused, Some(Refusal::RateLimited));
    h.clock.advance(1);
    assert_eq!(
        client.tokens(&agent, &set, &[(day(0), 1, 1)]).await.count(),
        1
    );
    let limited = client.tokens(&agent, &set, &[(day(0), 1, 1)]).await;
    assert_eq!(limited.refused, Some(Refusal::RateLimited));

    // The bucket was stored with the last issuance: a restart does not refill it.
    h.restart().await;
    let client = h.client();
    let limited = client.tokens(&agent, &set, &[(day(0), 1, 1)]).await;
    assert_eq!(limited.refused, Some(Refusal::RateLimited));
    h.clock.advance(3600);
    let issued = client
        .tokens(&agent, &set, &[(day(0), 1, 1), (day(0), 1, 1)])
        .await;
    assert_eq!(issued.count(), 2);
    h.stop().await;
}

/// An issuer that publishes the genuine key set but evaluates with a key of its own for this
/// client (a partition attempt), either naming its own key or pretending to use the published
/// one.
struct Rogue {
    genuine: Arc<Published>,
    rogue: Arc<Published>,
    pretend: bool,
}

impl ExchangeHandler for Rogue {
    async fn handle(&self, request: Vec<u8>) -> Vec<u8> {
        let answer = match IssuerRequest::decode(&request).unwrap() {
            IssuerRequest::KeySet => IssuerAnswer::KeySet(self.genuine.encoded.clone()),
            IssuerRequest::Issue { batches, .. } => IssuerAnswer::Issued(
                batches
                    .iter()
                    .map(|bytes| {
                        let genuine = BlindedRequest::decode(bytes, &self.genuine.set).unwrap();
                        let scope = self
                            .genuine
                            .set
                            .find(genuine.epoch(), genuine.key_id())
                            .unwrap()
                            .scope();
                        let key: &IssuerKey = self.rogue.key(genuine.epoch(), scope).unwrap();
                        // The same blinded elements, under the rogue key's name.
                        let mut renamed = bytes.clone();
                        renamed[4..36].copy_from_slice(&key.key_id().0);
                        let request = BlindedRequest::decode(&renamed, &self.rogue.set).unwrap();
                        let mut response = key.issue(&request, &mut rand::rng()).unwrap().encode();
                        if self.pretend {
                            response[4..36].copy_from_slice(&genuine.key_id().0);
                        }
                        BatchOutcome::Issued(response)
                    })
                    .collect(),
            ),
        };
        answer.encode()
    }
}

#[tokio::test]
async fn an_issuer_that_evaluates_with_a_key_it_did_not_publish_is_caught_by_the_client() {
    let today = START_DAY;
    let genuine = Arc::new(
        Published::of(
            &MasterSeed::from_bytes([1; 32]),
            PublishWindow::default(),
            today,
        )
        .unwrap(),
    );
    let rogue = Arc::new(
        Published::of(
            &MasterSeed::from_bytes([2; 32]),
            PublishWindow::default(),
            today,
        )
        .unwrap(),
    );
    for pretend in [false, true] {
        let identity = Identity::self_signed(["localhost"]).unwrap();
        let server = serve_exchange(
            ServerConfig {
                listen: "127.0.0.1:0".parse().unwrap(),
                identity: identity.clone(),
                limits: Limits::default(),
                stream_listen: None,
            },
            PROTOCOL,
            Rogue {
                genuine: genuine.clone(),
                rogue: rogue.clone(),
                pretend,
            },
        )
        .await
        .unwrap();
        let config = ClientConfig::new(server.local_addr(), "localhost", Trust::pin(&identity));
        let client = common::IssuerClient {
            client: penrose_transport::exchange::ExchangeClient::new(config, PROTOCOL).unwrap(),
        };
        // The client holds the set everybody else sees.
        let set = client.key_set().await;
        assert_eq!(set.digest(), genuine.set.digest());
        let (answer, pending) = client
            .ask(&Credential([3; 32]), &set, &[(today, 0, 24)])
            .await;
        let IssuerAnswer::Issued(outcomes) = answer else {
            panic!("the rogue issuer refused");
        };
        let BatchOutcome::Issued(bytes) = &outcomes[0] else {
            panic!("the rogue issuer did not issue");
        };
        let request: TokenRequest = pending.requests.into_iter().next().unwrap();
        match IssueResponse::decode(bytes, &set) {
            // Naming its own key: not in the published set.
            Err(TokenError::UnknownKey { .. }) => assert!(!pretend),
            // Pretending to use the published key: the proof says otherwise.
            Ok(response) => {
                assert!(pretend);
                assert_eq!(
                    request.finalize(&response).unwrap_err(),
                    TokenError::ProofFailed(TokenEpoch(today.0))
                );
            }
            Err(other) => panic!("unexpected {other}"),
        }
        server.shutdown().await;
    }
}

#[tokio::test]
async fn malformed_requests_are_refused_and_change_nothing_in_the_store() {
    let mut h = Harness::new();
    h.config = roomy();
    h.start().await;
    let agent = h.enrol(None).await;
    let client = h.client();
    let set = client.key_set().await;
    let before = h.dump();

    for (bytes, refusal) in [
        (vec![], Refusal::Malformed),
        (vec![0xff; 100], Refusal::UnsupportedVersion),
        (vec![PROTOCOL_VERSION, 9], Refusal::Malformed),
        (vec![PROTOCOL_VERSION, 2, 1, 2, 3], Refusal::Malformed),
        (
            [IssuerRequest::KeySet.encode(), vec![0]].concat(),
            Refusal::Malformed,
        ),
    ] {
        assert_eq!(
            client.raw(&bytes).await,
            IssuerAnswer::Refused(refusal),
            "{bytes:?}"
        );
    }

    // An enrolled credential's request whose batches are all bad.
    let entry = set.get(TokenEpoch(START_DAY.0), TokenScope(0)).unwrap();
    let good = TokenRequest::new(entry, 2, &mut rand::rng())
        .unwrap()
        .request()
        .encode();
    let mut bad_element = good.clone();
    bad_element[38..70].fill(0xff);
    let mut unknown_id = good.clone();
    unknown_id[4..36].copy_from_slice(&TokenKeyId([9; 32]).0);
    let for_day = |d: Day| {
        let entry = set.get(TokenEpoch(d.0), TokenScope(0)).unwrap();
        TokenRequest::new(entry, 1, &mut rand::rng())
            .unwrap()
            .request()
            .encode()
    };
    let mut too_many = good[..36].to_vec();
    too_many.extend_from_slice(&65u16.to_be_bytes());
    too_many.extend_from_slice(&good[38..70].repeat(65));
    let batches = vec![
        vec![1, 2, 3],
        bad_element,
        unknown_id,
        for_day(day(2)),
        for_day(day(-1)),
        too_many,
        good[..good.len() - 1].to_vec(),
    ];
    let request = IssuerRequest::Issue {
        credential: agent.clone(),
        batches,
    };
    assert_eq!(
        client.raw(&request.encode()).await,
        IssuerAnswer::Issued(vec![
            BatchOutcome::Invalid,
            BatchOutcome::Invalid,
            BatchOutcome::UnknownKey,
            BatchOutcome::UnknownKey,
            BatchOutcome::UnknownKey,
            BatchOutcome::Invalid,
            BatchOutcome::Invalid,
        ])
    );
    assert_eq!(
        h.dump(),
        before,
        "a request that issued nothing changed the store"
    );

    // The same credential still gets its full quota.
    assert_eq!(
        client
            .tokens(&agent, &set, &[(day(0), 0, 24)])
            .await
            .count(),
        24
    );
    assert_ne!(h.dump(), before);
    h.stop().await;
}

#[tokio::test]
async fn an_issuer_refuses_a_seed_others_can_read_and_a_quota_above_t() {
    use std::os::unix::fs::PermissionsExt;
    let mut h = Harness::new();
    let seed = h.state.seed();
    std::fs::set_permissions(&seed, std::fs::Permissions::from_mode(0o644)).unwrap();
    let options =
        penrose_issuer::service::ServeOptions::new(h.state.clone(), "127.0.0.1:0".parse().unwrap());
    let clock: Arc<dyn penrose_host::clock::Clock> = h.clock.clone();
    let err = penrose_issuer::service::start(options, clock)
        .await
        .err()
        .expect("a seed readable by others was accepted");
    assert!(
        matches!(
            err,
            IssuerError::Seed(penrose_host::FileError::TooOpen { mode: 0o644, .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("644"), "{err}");
    std::fs::set_permissions(&seed, std::fs::Permissions::from_mode(0o600)).unwrap();
    h.start().await;
    h.stop().await;

    for quota in [0, 25, 100] {
        assert!(matches!(
            IssuerConfig::new(quota, 12),
            Err(IssuerError::Config(_))
        ));
    }
    assert!(IssuerConfig::new(24, 0).is_err());
    assert_eq!(IssuerConfig::new(10, 12).unwrap().tokens_per_epoch(), 10);
    assert_eq!(IssuerConfig::default().tokens_per_epoch(), 24);
}
