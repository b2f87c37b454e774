//! Test equipment for admission tokens: an issuer made of `penrose_core::tokens` and
//! `serve_exchange` (key set, issuance with a quota per (credential, epoch, scope), and two
//! ways of cheating), and an aggregation stand-in that verifies each report's token against
//! the issuer's keys and records spent tokens. Both listen on loopback only.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use penrose_core::tokens::protocol::{
    ALPN, BatchOutcome, Credential, IssuerAnswer, IssuerRequest, MAX_ISSUER_MESSAGE, Refusal,
};
use penrose_core::tokens::{
    BlindedRequest, IssuerKey, KeySet, Redemption, SpentId, TokenEpoch, TokenError, TokenScope,
};
use penrose_core::wire::{Ack, AckStatus, Message, RejectReason, Report, ReportId, ThrottleHint};
use penrose_transport::exchange::{ExchangeHandler, Protocol, serve_exchange};
use penrose_transport::{Identity, Limits, ReportHandler, Server, ServerConfig};

pub const ISSUER_NAME: &str = "issuer.test";

/// How the issuer cheats, if it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rogue {
    /// Honest.
    No,
    /// Answers with a key of its own, under that key's id (not in the published set).
    OwnKey,
    /// Answers with a key of its own, labelled with the published key's id: only the proof
    /// shows it.
    PublishedKeyId,
}

/// The issuer's keys, quota and records.
pub struct IssuerState {
    pub keys: Vec<IssuerKey>,
    pub set: Mutex<KeySet>,
    pub enrolled: Credential,
    pub quota: u16,
    pub issued: Mutex<HashMap<(u32, u16), u16>>,
    /// Every request body received, in order.
    pub requests: Mutex<Vec<Vec<u8>>>,
    pub rogue: Mutex<Rogue>,
}

impl IssuerState {
    /// Keys for `days` x `scopes`, a quota per (epoch, scope) for the one enrolled credential.
    pub fn new(days: &[u32], scopes: &[u16], quota: u16, enrolled: Credential) -> Arc<Self> {
        let mut keys = Vec::new();
        for &day in days {
            for &scope in scopes {
                keys.push(IssuerKey::generate(
                    TokenEpoch(day),
                    TokenScope(scope),
                    &mut rand::rng(),
                ));
            }
        }
        let set = KeySet::of_keys(&keys).unwrap();
        Arc::new(Self {
            keys,
            set: Mutex::new(set),
            enrolled,
            quota,
            issued: Mutex::new(HashMap::new()),
            requests: Mutex::new(Vec::new()),
            rogue: Mutex::new(Rogue::No),
        })
    }

    /// The published set (the verifier holds the same keys).
    pub fn key_set(&self) -> KeySet {
        self.set.lock().unwrap().clone()
    }

    pub fn key(
        &self,
        epoch: TokenEpoch,
        key_id: penrose_core::tokens::TokenKeyId,
    ) -> Option<&IssuerKey> {
        self.keys
            .iter()
            .find(|k| k.epoch() == epoch && k.key_id() == key_id)
    }

    fn answer(&self, body: &[u8]) -> IssuerAnswer {
        let request = match IssuerRequest::decode(body) {
            Ok(r) => r,
            Err(_) => return IssuerAnswer::Refused(Refusal::Malformed),
        };
        let (credential, batches) = match request {
            IssuerRequest::KeySet => return IssuerAnswer::KeySet(self.key_set().encode()),
            IssuerRequest::Issue {
                credential,
                batches,
            } => (credential, batches),
        };
        if credential != self.enrolled {
            return IssuerAnswer::Refused(Refusal::UnknownCredential);
        }
        let set = self.key_set();
        let rogue = *self.rogue.lock().unwrap();
        let mut outcomes = Vec::new();
        for batch in batches {
            let request = match BlindedRequest::decode(&batch, &set) {
                Ok(r) => r,
                Err(TokenError::UnknownKey { .. }) => {
                    outcomes.push(BatchOutcome::UnknownKey);
                    continue;
                }
                Err(_) => {
                    outcomes.push(BatchOutcome::Invalid);
                    continue;
                }
            };
            let Some(key) = self.key(request.epoch(), request.key_id()) else {
                outcomes.push(BatchOutcome::UnknownKey);
                continue;
            };
            let name = (key.epoch().0, key.scope().0);
            let mut issued = self.issued.lock().unwrap();
            let used = issued.entry(name).or_insert(0);
            let count = request.count() as u16;
            if *used + count > self.quota {
                outcomes.push(BatchOutcome::Quota {
                    remaining: self.quota - *used,
                });
                continue;
            }
            *used += count;
            let response = match rogue {
                Rogue::No => key.issue(&request, &mut rand::rng()).unwrap().encode(),
                Rogue::OwnKey | Rogue::PublishedKeyId => {
                    // A key made for this client alone: re-address the request to it.
                    let own = IssuerKey::generate(key.epoch(), key.scope(), &mut rand::rng());
                    let mut bytes = batch.clone();
                    bytes[4..36].copy_from_slice(&own.key_id().0);
                    let own_set = KeySet::of_keys([&own]).unwrap();
                    let request = BlindedRequest::decode(&bytes, &own_set).unwrap();
                    let mut response = own.issue(&request, &mut rand::rng()).unwrap().encode();
                    if rogue == Rogue::PublishedKeyId {
                        response[4..36].copy_from_slice(&key.key_id().0);
                    }
                    response
                }
            };
            outcomes.push(BatchOutcome::Issued(response));
        }
        IssuerAnswer::Issued(outcomes)
    }
}

pub struct IssuerHandler(pub Arc<IssuerState>);

impl ExchangeHandler for IssuerHandler {
    async fn handle(&self, request: Vec<u8>) -> Vec<u8> {
        self.0.requests.lock().unwrap().push(request.clone());
        self.0.answer(&request).encode()
    }
}

pub async fn start_issuer(identity: &Identity, state: Arc<IssuerState>) -> Server {
    start_issuer_with_streams(identity, state, None).await
}

/// The in-test issuer, also taking QUIC carried on TCP streams at `stream_listen` (Tor exits).
pub async fn start_issuer_with_streams(
    identity: &Identity,
    state: Arc<IssuerState>,
    stream_listen: Option<SocketAddr>,
) -> Server {
    serve_exchange(
        ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            identity: identity.clone(),
            limits: Limits::default(),
            stream_listen,
        },
        Protocol {
            alpn: ALPN,
            max_body: MAX_ISSUER_MESSAGE,
        },
        IssuerHandler(state),
    )
    .await
    .unwrap()
}

/// What the verifying aggregation stand-in saw and did.
#[derive(Default)]
pub struct Verified {
    /// Reports accepted, by id, as they arrived (with their tokens).
    pub accepted: HashMap<ReportId, Report>,
    /// Every report received, in order, with the answer it got.
    pub received: Vec<(Report, AckStatus, usize)>,
    pub spent: HashSet<SpentId>,
}

/// Verifies each report's token with the issuer's keys; answers `force` first, in order.
pub struct TokenServer {
    pub issuer: Arc<IssuerState>,
    pub seen: Mutex<Verified>,
    pub force: Mutex<VecDeque<RejectReason>>,
}

impl TokenServer {
    pub fn new(issuer: Arc<IssuerState>) -> Arc<Self> {
        Arc::new(Self {
            issuer,
            seen: Mutex::new(Verified::default()),
            force: Mutex::new(VecDeque::new()),
        })
    }

    fn verdict(&self, report: &Report) -> AckStatus {
        let mut seen = self.seen.lock().unwrap();
        if seen.accepted.contains_key(&report.report_id) {
            return AckStatus::Duplicate;
        }
        if let Some(reason) = self.force.lock().unwrap().pop_front() {
            return AckStatus::Rejected(reason);
        }
        let Some(token) = &report.token else {
            return AckStatus::Rejected(RejectReason::TokenRequired);
        };
        let set = self.issuer.key_set();
        let Ok(redemption) = Redemption::decode(&token.0, &set) else {
            return AckStatus::Rejected(RejectReason::InvalidToken);
        };
        let Some(key) = self.issuer.key(redemption.epoch(), redemption.key_id()) else {
            return AckStatus::Rejected(RejectReason::InvalidToken);
        };
        // The token's epoch must be the report's day and its scope the report's counter.
        if key.epoch() != TokenEpoch(report.day.0) || key.scope() != TokenScope(report.counter.0) {
            return AckStatus::Rejected(RejectReason::InvalidToken);
        }
        let Ok(spent) = key.verify(&redemption, &report.token_binding()) else {
            return AckStatus::Rejected(RejectReason::InvalidToken);
        };
        if !seen.spent.insert(spent) {
            return AckStatus::Rejected(RejectReason::TokenSpent);
        }
        seen.accepted.insert(report.report_id, report.clone());
        AckStatus::Accepted
    }
}

impl ReportHandler for TokenServer {
    async fn handle(&self, body: Vec<u8>) -> Ack {
        let Ok(Message::Report(report)) = Message::decode_body(&body) else {
            return Ack {
                report_id: ReportId([0; 16]),
                status: AckStatus::Rejected(RejectReason::Malformed),
                throttle: ThrottleHint::FULL_RATE,
            };
        };
        let status = self.verdict(&report);
        self.seen
            .lock()
            .unwrap()
            .received
            .push((report.clone(), status, body.len()));
        Ack {
            report_id: report.report_id,
            status,
            throttle: ThrottleHint::FULL_RATE,
        }
    }
}

pub async fn start_token_server(
    identity: &Identity,
    addr: SocketAddr,
    handler: Arc<TokenServer>,
) -> Server {
    start_token_server_with_streams(identity, addr, handler, None).await
}

/// The verifying aggregation stand-in, also taking QUIC carried on TCP streams.
pub async fn start_token_server_with_streams(
    identity: &Identity,
    addr: SocketAddr,
    handler: Arc<TokenServer>,
    stream_listen: Option<SocketAddr>,
) -> Server {
    penrose_transport::serve(
        ServerConfig {
            listen: addr,
            identity: identity.clone(),
            limits: Limits::default(),
            stream_listen,
        },
        handler,
    )
    .await
    .unwrap()
}
