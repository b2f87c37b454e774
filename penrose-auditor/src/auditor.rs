//! The auditor's policy: what it answers to each request (`penrose_core::audit`).
//!
//! A release request is checked in this order, and the first check that fails is the answer,
//! with nothing changed:
//!
//! 1. the request decodes (`Malformed`), and so does its bundle;
//! 2. the bundle is signed by the pinned aggregation server (`WrongSigner`);
//! 3. the record admits it ([`Record::admit`]: `OtherChain`, `OutOfOrder`, `Forked`,
//!    `EpochAnsweredBefore`);
//! 4. the page is within the bundle (`BadPage`), its entries under keys held (`UnknownKey`),
//!    their ciphertexts valid (`Malformed`);
//! 5. each entry the auditor's own threshold releases is decrypted; the others are withheld;
//! 6. the record admits the bundle again, under the lock (another request may have moved it
//!    meanwhile), and a new bundle is recorded durably before the answer is returned; a
//!    record that cannot be written is `Unavailable`, and the partials are dropped.
//!
//! Partials are computed before the bundle is recorded, so that a failure anywhere before
//! the record leaves everything as it was; and they leave only after it is recorded.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};

use ed25519_dalek::VerifyingKey;
use penrose_core::audit::{AuditAnswer, AuditRefusal, AuditRequest, AuditStatus};
use penrose_core::bundle::{Bundle, BundleError, BundleHash};
use penrose_core::paillier::KeyId;
use penrose_core::tokens::SpentId;
use tracing::{error, info, warn};

use crate::data_dir::DataDir;
use crate::error::AuditorError;
use crate::evidence::{EvidenceKeys, Owner, SpentStore};
use crate::keys::{self, Shares};
use crate::page::{Counting, Page};
use crate::policy::Policy;
use crate::record::{Record, Take};

/// The auditor: its shares, the key it pins, its rule and its record.
pub struct Auditor {
    shares: Shares,
    signer: VerifyingKey,
    policy: Policy,
    record: Mutex<Record>,
    record_path: PathBuf,
    evidence: Option<EvidenceKeys>,
    spent: Mutex<SpentStore>,
    workers: usize,
}

impl Auditor {
    /// Opens the auditor of a data directory (`init` made it). The caller holds the data
    /// directory's lock while the auditor answers (`serve` does), or nothing else changes it.
    pub fn open(data: &DataDir) -> Result<Self, AuditorError> {
        data.check_initialised()?;
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
        let policy = Policy::load(&data.policy())?;
        Ok(Auditor {
            shares: Shares::load(data)?,
            signer: keys::read_aggregator_key(&data.aggregator_key())?,
            evidence: EvidenceKeys::load(data, &policy)?,
            spent: Mutex::new(SpentStore::load(&data.spent())?),
            policy,
            record: Mutex::new(Record::load(&data.record())?),
            record_path: data.record(),
            workers,
        })
    }

    /// The auditor computing each page's partials on `workers` threads (default: one per
    /// CPU), for measurements.
    pub fn with_workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self
    }

    /// The answer to one request body: what the endpoint sends back.
    pub fn answer(&self, request: &[u8]) -> Vec<u8> {
        let answer = match AuditRequest::decode(request) {
            Ok(request) => self.respond(request),
            Err(e) => {
                warn!(error = %e, "refused a request that does not decode");
                AuditAnswer::Refused(AuditRefusal::Malformed)
            }
        };
        answer.encode()
    }

    /// The answer to one decoded request.
    pub fn respond(&self, request: AuditRequest) -> AuditAnswer {
        match request {
            AuditRequest::Status => AuditAnswer::Status(self.status()),
            AuditRequest::Release {
                bundle,
                first,
                count,
                evidence,
            } => match self.release(&bundle, first, count, &evidence) {
                Ok(answer) => answer,
                Err(refusal) => {
                    warn!(first, count, %refusal, "refused a release");
                    AuditAnswer::Refused(refusal)
                }
            },
        }
    }

    /// The chain position.
    pub fn status(&self) -> AuditStatus {
        self.lock_record().status()
    }

    /// A copy of the record as it stands.
    pub fn record(&self) -> Record {
        self.lock_record().clone()
    }

    /// The auditor's own rule.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The keys a share is held of.
    pub fn key_ids(&self) -> Vec<KeyId> {
        self.shares.ids()
    }

    /// Whether releases are counted from evidence (the data directory holds a key ring).
    pub fn counts_evidence(&self) -> bool {
        self.evidence.is_some()
    }

    /// Evidence tokens counted so far.
    pub fn tokens_counted(&self) -> usize {
        self.lock_spent().len()
    }

    fn release(
        &self,
        bytes: &[u8],
        first: u32,
        count: u32,
        evidence: &[Vec<u8>],
    ) -> Result<AuditAnswer, AuditRefusal> {
        let bundle = Bundle::verify(bytes, Some(&self.signer)).map_err(refusal_of)?;
        let hash = BundleHash::of(bytes);
        self.lock_record().admit(&bundle, hash)?;
        let (page, claims) = {
            let store = self.lock_spent();
            let counting = self.evidence.as_ref().map(|keys| Counting {
                keys,
                store: &store,
                bundle: hash,
                lists: evidence,
            });
            let page = Page::plan(&bundle, first, count, &self.shares, &self.policy, counting)?;
            let claims = page.spent().to_vec();
            (page, claims)
        };
        let decrypted = page.decrypt(self.workers).map_err(|e| {
            error!(error = %e, "a partial decryption failed after its checks");
            AuditRefusal::Unavailable
        })?;
        self.claim(&claims)?;
        self.commit(&bundle, hash)?;
        info!(
            instance = %bundle.link.instance,
            seq = bundle.link.seq,
            first,
            count,
            partials = decrypted.partials.len(),
            withheld = decrypted.withheld.len(),
            "answered a page"
        );
        Ok(AuditAnswer::Partials {
            hash,
            partials: decrypted.partials,
            withheld: decrypted.withheld,
        })
    }

    /// Records the tokens the page was counted from, durably, unless another page claimed one
    /// meanwhile (then `Unavailable`: asked again, the page is counted without it).
    fn claim(&self, claims: &[(SpentId, Owner)]) -> Result<(), AuditRefusal> {
        if claims.is_empty() {
            return Ok(());
        }
        let mut store = self.lock_spent();
        if !store.admits(claims) {
            warn!("another page counted some of this page's tokens meanwhile");
            return Err(AuditRefusal::Unavailable);
        }
        store.append(claims).map_err(|e| {
            error!(error = %e, "cannot record the counted tokens; answering Unavailable");
            AuditRefusal::Unavailable
        })
    }

    /// Admits the bundle again under the lock and records a new one durably; the record in
    /// memory changes only once the file has.
    fn commit(&self, bundle: &Bundle, hash: BundleHash) -> Result<(), AuditRefusal> {
        let mut record = self.lock_record();
        if record.admit(bundle, hash)? == Take::Again {
            return Ok(());
        }
        let next = record.taken(bundle, hash);
        if let Err(e) = next.save(&self.record_path) {
            error!(error = %e, "cannot write the record; answering Unavailable");
            return Err(AuditRefusal::Unavailable);
        }
        info!(
            instance = %bundle.link.instance,
            seq = bundle.link.seq,
            epochs = bundle.epochs.len(),
            "took the next bundle of the chain"
        );
        *record = next;
        Ok(())
    }

    /// The record, even if a thread panicked while holding it: it is replaced whole, never
    /// left half-changed.
    fn lock_record(&self) -> MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The spent store, likewise: it changes only by whole appends.
    fn lock_spent(&self) -> MutexGuard<'_, SpentStore> {
        self.spent.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The refusal a bundle that fails verification gets: a signature that is not the pinned
/// key's is `WrongSigner`, anything else that does not decode is `Malformed`.
fn refusal_of(e: BundleError) -> AuditRefusal {
    match e {
        BundleError::UntrustedSigner | BundleError::BadSignature | BundleError::BadSigner => {
            AuditRefusal::WrongSigner
        }
        _ => AuditRefusal::Malformed,
    }
}
