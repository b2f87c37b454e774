//! What the issuer's tests share: an issuer on loopback over a temporary state directory with a
//! clock the test moves, and a client built the way an agent's will be, from
//! `penrose_transport::exchange::ExchangeClient` and `penrose_core::tokens::protocol`.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::sync::Arc;
use std::time::Duration;

use penrose_core::tokens::protocol::{
    BatchOutcome, Credential, IssuerAnswer, IssuerRequest, Refusal,
};
use penrose_core::tokens::{
    IssueResponse, KeyEntry, KeySet, Token, TokenEpoch, TokenRequest, TokenScope,
};
use penrose_core::wire::Day;
use penrose_host::clock::{Clock, ManualClock};
use penrose_issuer::admin::{self, Reply, Request};
use penrose_issuer::credential::{self, CredentialId};
use penrose_issuer::service::{self, Running, ServeOptions};
use penrose_issuer::store::{Store, Table};
use penrose_issuer::{IssuerConfig, StateDir};
use penrose_transport::exchange::ExchangeClient;
use penrose_transport::{ClientConfig, Trust};

/// The day the tests start on (2025-11-06).
pub const START_DAY: Day = Day(20_398);

/// An issuer state directory, its clock and, while it serves, the running issuer.
pub struct Harness {
    pub dir: tempfile::TempDir,
    pub state: StateDir,
    pub clock: Arc<ManualClock>,
    pub running: Option<Running>,
    pub config: IssuerConfig,
}

impl Harness {
    /// A fresh, initialised state directory; the clock at noon of [`START_DAY`].
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path().join("state"));
        admin::init(&state).unwrap();
        Harness {
            dir,
            state,
            clock: Arc::new(ManualClock::at_day(START_DAY)),
            running: None,
            config: IssuerConfig::default(),
        }
    }

    /// Starts the issuer on loopback (port chosen by the system).
    pub async fn start(&mut self) {
        assert!(self.running.is_none());
        let mut options = ServeOptions::new(self.state.clone(), "127.0.0.1:0".parse().unwrap());
        options.config = self.config;
        let clock: Arc<dyn Clock> = self.clock.clone();
        self.running = Some(service::start(options, clock).await.unwrap());
    }

    /// Stops the issuer (its store is closed when this returns).
    pub async fn stop(&mut self) {
        if let Some(running) = self.running.take() {
            running.shutdown().await;
        }
    }

    /// Stops and starts again on the same state directory.
    pub async fn restart(&mut self) {
        self.stop().await;
        self.start().await;
    }

    pub fn today(&self) -> Day {
        self.clock.today()
    }

    /// Enrols a new credential (through the control socket while serving, the store
    /// otherwise) and returns it.
    pub async fn enrol(&self, label: Option<&str>) -> Credential {
        let secret = credential::generate();
        let request = Request::Enrol {
            ids: vec![CredentialId::of(&secret).to_string()],
            label: label.map(str::to_owned),
        };
        let reply = admin::run(&self.state, self.today(), &request)
            .await
            .unwrap();
        assert_eq!(reply, Reply::Enrolled { count: 1 });
        secret
    }

    pub async fn revoke(&self, credential: &Credential) {
        let request = Request::Revoke {
            id: CredentialId::of(credential).short(),
        };
        let reply = admin::run(&self.state, self.today(), &request)
            .await
            .unwrap();
        assert!(
            matches!(reply, Reply::Revoked { already: false, .. }),
            "{reply:?}"
        );
    }

    /// A client of the running issuer, pinning its certificate.
    pub fn client(&self) -> IssuerClient {
        let running = self.running.as_ref().expect("the issuer is not running");
        let trust = Trust::load_pinned(running.certificate()).unwrap();
        let mut config = ClientConfig::new(running.local_addr(), "localhost", trust);
        config.ack_timeout = Duration::from_secs(20);
        IssuerClient {
            client: ExchangeClient::new(config, service::PROTOCOL).unwrap(),
        }
    }

    /// Every key and value of every column family, at one point in time (from the running
    /// issuer's store, or the store opened directly).
    pub fn dump(&self) -> Vec<(Table, Vec<u8>, Vec<u8>)> {
        let mut rows = Vec::new();
        let mut visit = |table: Table, key: &[u8], value: &[u8]| {
            rows.push((table, key.to_vec(), value.to_vec()));
            Ok(())
        };
        match &self.running {
            Some(running) => running
                .issuer()
                .store()
                .scan(&Table::ALL, &mut visit)
                .unwrap(),
            None => Store::open(&self.state.db(), None)
                .unwrap()
                .scan(&Table::ALL, &mut visit)
                .unwrap(),
        }
        rows
    }
}

/// An agent's side of issuance, over QUIC.
pub struct IssuerClient {
    pub client: ExchangeClient,
}

/// Batches asked for and, after the answer, what became of each.
pub struct Pending {
    pub requests: Vec<TokenRequest>,
    /// The encoded blinded requests, as sent.
    pub sent: Vec<Vec<u8>>,
}

impl IssuerClient {
    /// Sends raw bytes, returns the decoded answer.
    pub async fn raw(&self, request: &[u8]) -> IssuerAnswer {
        let answer = self.client.exchange(request).await.unwrap();
        IssuerAnswer::decode(&answer).unwrap()
    }

    /// The published key set.
    pub async fn key_set(&self) -> KeySet {
        match self.raw(&IssuerRequest::KeySet.encode()).await {
            IssuerAnswer::KeySet(bytes) => KeySet::decode(&bytes).unwrap(),
            other => panic!("asked for the key set, got {other:?}"),
        }
    }

    /// Asks for `count` tokens of each (epoch, scope) in `asks`, one batch each.
    pub async fn ask(
        &self,
        credential: &Credential,
        set: &KeySet,
        asks: &[(Day, u16, usize)],
    ) -> (IssuerAnswer, Pending) {
        let mut requests = Vec::new();
        let mut sent = Vec::new();
        for &(day, scope, count) in asks {
            // Not held across the await below: the thread's generator is not Send.
            let mut rng = rand::rng();
            let entry: &KeyEntry = set
                .get(TokenEpoch(day.0), TokenScope(scope))
                .expect("no published key for that day and scope");
            let request = TokenRequest::new(entry, count, &mut rng).unwrap();
            sent.push(request.request().encode());
            requests.push(request);
        }
        let message = IssuerRequest::Issue {
            credential: credential.clone(),
            batches: sent.clone(),
        };
        let answer = self.raw(&message.encode()).await;
        (answer, Pending { requests, sent })
    }

    /// Asks for tokens and finalizes every batch that was issued; returns, per batch, its
    /// tokens or its outcome, and the issuer's evaluated elements and proofs (the transcript).
    pub async fn tokens(
        &self,
        credential: &Credential,
        set: &KeySet,
        asks: &[(Day, u16, usize)],
    ) -> Issued {
        let (answer, pending) = self.ask(credential, set, asks).await;
        let outcomes = match answer {
            IssuerAnswer::Issued(outcomes) => outcomes,
            IssuerAnswer::Refused(refusal) => {
                return Issued {
                    refused: Some(refusal),
                    ..Issued::default()
                };
            }
            other => panic!("asked for tokens, got {other:?}"),
        };
        assert_eq!(outcomes.len(), pending.requests.len());
        let mut issued = Issued {
            sent: pending.sent,
            ..Issued::default()
        };
        for (request, outcome) in pending.requests.into_iter().zip(outcomes) {
            match outcome {
                BatchOutcome::Issued(bytes) => {
                    let response = IssueResponse::decode(&bytes, set).unwrap();
                    issued.tokens.push(request.finalize(&response).unwrap());
                    issued.responses.push(bytes);
                    issued.outcomes.push(None);
                }
                other => {
                    issued.tokens.push(Vec::new());
                    issued.outcomes.push(Some(other));
                }
            }
        }
        issued
    }
}

/// What one issue request brought.
#[derive(Default)]
pub struct Issued {
    /// Set when the whole request was refused.
    pub refused: Option<Refusal>,
    /// Per batch, its tokens (empty when not issued).
    pub tokens: Vec<Vec<Token>>,
    /// Per batch, `None` when issued, else the outcome.
    pub outcomes: Vec<Option<BatchOutcome>>,
    /// The blinded requests sent.
    pub sent: Vec<Vec<u8>>,
    /// The issue responses received.
    pub responses: Vec<Vec<u8>>,
}

impl Issued {
    pub fn count(&self) -> usize {
        self.tokens.iter().map(Vec::len).sum()
    }
}
