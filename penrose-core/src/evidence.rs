//! Contributor evidence: how the release auditor counts a released sum's contributors itself,
//! from tokens the aggregation server can neither make nor move (issue 26 item 2;
//! `docs/crypto.md`, "Contributor evidence").
//!
//! The admission token (`crate::tokens`) is privately verifiable: whoever verifies it can mint
//! it, and the aggregation server verifies it. So a sum's contributor bound, counted from
//! admission tokens, is only as good as the vendor's conduct: it can mint tokens, add known
//! reports to a victim's rare class and subtract. Evidence closes that with a *second* token
//! of the same scheme, issued by the auditor's party (its own issuer, its own enrolment, its
//! own key ring, which the aggregation server never holds):
//!
//! - **The agent** spends one evidence token on each report, bound by its MAC to the same
//!   bytes as the admission token ([`Report::token_binding`]: every field, ciphertexts
//!   included). The token's scope is the report's counter and its epoch the report's day (or
//!   an hour of it, [`TokenPeriod::Hour`]); the auditor's issuer gives each credential at most
//!   T of them per (counter, epoch).
//! - **The aggregation server** cannot check the token (no key) and cannot make one. It keeps
//!   each report's binding and token beside the sum it enters, and exports them with the
//!   released sum as its [`SumEvidence`].
//! - **The auditor** ([`count`]) decodes every listed report, checks that each belongs to the
//!   released sum (counter, catalogue, architecture, Paillier key) and that the product of
//!   their ciphertexts *is* the released sum, with the reports and samples it claims. Then it
//!   verifies each evidence tag with its own key ring and counts the valid, never-spent tokens
//!   per token epoch: a sum with `r_e` of them in epoch `e` has at least
//!   `max_e ceil(r_e / T)` distinct credentials behind it ([`Counted::contributors`]).
//!
//! What each adversary can do with it:
//!
//! - *The aggregation server's operator*, minting admission tokens or enrolling fake hosts at
//!   its own issuer, adds reports without evidence: they enter the product but not the count.
//!   Moving a token from another report does not verify (the tag covers that report's bytes),
//!   and listing another report whole changes the product, which must equal the sum.
//!   Dropping reports only lowers the count. Listing one report twice is refused.
//! - *A client* with every token one credential can get adds at most T per epoch: one
//!   contributor. A junk or replayed evidence token counts nothing and refuses nothing, so one
//!   client cannot erase an honest sum by sending bad evidence.
//! - What it does not stop: Sybil enrolment *at the auditor's party*, and a vendor that runs
//!   the auditor's issuer too (then this is the admission token again). `docs/threat-model.md`.
//!
//! Encoding of [`SumEvidence`]: `version:u8 count:u32be` then per report
//! `len:u16be binding:[len] marker:u8 (token:[100] if marker = 1)`, bounded by
//! [`MAX_SUM_EVIDENCE_BYTES`] before anything is allocated.

use std::collections::{BTreeMap, HashSet};

use thiserror::Error;

use crate::bundle::BundleEntry;
use crate::paillier::{Accumulator, PaillierError, PublicKey};
use crate::release::ReportsPerContributor;
use crate::tokens::{
    KeyRing, KeySet, REDEMPTION_BYTES, Redemption, SpentId, TokenEpoch, TokenScope,
};
use crate::wire::{ADMISSION_TOKEN_BYTES, EvidenceToken, MAX_FRAME_BODY, Report, WireError};

/// The encoding version this build writes and reads.
pub const EVIDENCE_VERSION: u8 = 1;

pub use crate::evidence_file::MAX_SUM_EVIDENCE_BYTES;

/// How long one evidence token epoch lasts: the auditor's issuer and the auditor agree on it.
/// A token's epoch must fall within its report's day.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenPeriod {
    /// Epoch = the report's day (days since the Unix epoch), as admission tokens today.
    Day,
    /// Epoch = hours since the Unix epoch, one of the report's day's 24 (issue 25's rule).
    Hour,
}

impl TokenPeriod {
    fn contains(self, epoch: TokenEpoch, day: u32) -> bool {
        match self {
            TokenPeriod::Day => epoch.0 == day,
            TokenPeriod::Hour => epoch.0 / 24 == day,
        }
    }
}

/// T: the most evidence tokens the auditor's issuer gives one credential per (counter,
/// epoch). It may only be at least what the issuer gives (a smaller T would overstate
/// contributors), so it has a floor per period: 24 a day, as the admission cap, or 1 an hour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokensPerEpoch {
    period: TokenPeriod,
    tokens: u32,
}

/// A [`TokensPerEpoch`] under its period's floor.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
#[error("{tokens} evidence tokens per {period:?} is under the floor of {floor}")]
pub struct CapBelowFloor {
    /// The period.
    pub period: TokenPeriod,
    /// Tokens asked for.
    pub tokens: u32,
    /// The least allowed.
    pub floor: u32,
}

impl TokensPerEpoch {
    /// `tokens` per epoch of `period`; refused under the floor.
    pub fn new(period: TokenPeriod, tokens: u32) -> Result<Self, CapBelowFloor> {
        let floor = match period {
            TokenPeriod::Day => ReportsPerContributor::DEFAULT.get(),
            TokenPeriod::Hour => 1,
        };
        if tokens < floor {
            return Err(CapBelowFloor {
                period,
                tokens,
                floor,
            });
        }
        Ok(TokensPerEpoch { period, tokens })
    }

    /// The period.
    pub fn period(self) -> TokenPeriod {
        self.period
    }

    /// T.
    pub fn get(self) -> u32 {
        self.tokens
    }
}

/// What the auditor needs to count: its issuer's key ring and T per epoch.
#[derive(Clone, Copy, Debug)]
pub struct EvidenceRule<'a> {
    /// The auditor party's issuer keys (secret: the auditor alone verifies with them).
    pub keys: &'a KeyRing,
    /// T, and how long an epoch lasts.
    pub cap: TokensPerEpoch,
}

/// One report of a sum as the aggregation server kept it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvidencedReport {
    /// [`Report::token_binding`]: what the evidence tag covers.
    pub binding: Vec<u8>,
    /// The report's evidence token, if it carried one.
    pub token: Option<EvidenceToken>,
}

impl EvidencedReport {
    /// What the aggregation server keeps of an admitted report.
    pub fn of(report: &Report) -> Self {
        EvidencedReport {
            binding: report.token_binding(),
            token: report.evidence,
        }
    }

    /// Bytes this report adds to an encoded [`SumEvidence`].
    pub fn encoded_len(&self) -> usize {
        2 + self.binding.len() + 1 + self.token.map_or(0, |_| ADMISSION_TOKEN_BYTES)
    }

    /// One report's part of a [`SumEvidence`] encoding: `len:u16be binding marker:u8
    /// token?`, also how the aggregation server stores it.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.encode_into(&mut out);
        out
    }

    /// Decodes [`EvidencedReport::to_bytes`]'s bytes exactly.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, EvidenceError> {
        let mut reader = Reader(bytes);
        let report = reader.report()?;
        if !reader.0.is_empty() {
            return Err(EvidenceError::Malformed("bytes after the report"));
        }
        Ok(report)
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        // A binding is at most MAX_FRAME_BODY (8 KiB) long: it fits u16.
        out.extend_from_slice(&(self.binding.len() as u16).to_be_bytes());
        out.extend_from_slice(&self.binding);
        match &self.token {
            None => out.push(0),
            Some(token) => {
                out.push(1);
                out.extend_from_slice(&token.0);
            }
        }
    }
}

/// Every report multiplied into one released sum, with its evidence token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SumEvidence {
    reports: Vec<EvidencedReport>,
}

/// What [`count`] found in a sum's evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counted {
    /// Reports listed (equal to the sum's).
    pub reports: u64,
    /// Of them, reports whose evidence token verified and was never spent before.
    pub evidenced: u64,
    /// Distinct credentials behind the sum, at least: `max_e ceil(r_e / T)`.
    pub contributors: u64,
    /// The spent ids of the counted tokens, for the caller to record with its answer.
    pub spent: Vec<SpentId>,
}

/// Why a sum's evidence is refused: the aggregation server listed reports that are not the
/// released sum. (A report with no, a forged or a spent token is not refused: it only does
/// not count.)
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum EvidenceError {
    /// The encoding is cut short, too large or of another version.
    #[error("malformed evidence: {0}")]
    Malformed(&'static str),
    /// A listed binding is not a report.
    #[error("evidence report {index} does not decode: {source}")]
    Report {
        /// Its position in the list.
        index: usize,
        /// The decoder's reason.
        source: WireError,
    },
    /// A listed report belongs to another sum.
    #[error("evidence report {index} is of another {field} than the released sum")]
    OtherSum {
        /// Its position in the list.
        index: usize,
        /// The field that differs.
        field: &'static str,
    },
    /// A report is listed twice.
    #[error("evidence report {index} is listed twice")]
    Repeated {
        /// The second position.
        index: usize,
    },
    /// A listed report's ciphertexts are not valid under the sum's key.
    #[error("evidence report {index} has invalid ciphertexts: {source}")]
    Ciphertexts {
        /// Its position in the list.
        index: usize,
        /// Why.
        source: PaillierError,
    },
    /// The list holds another number of reports or samples than the sum claims.
    #[error("evidence lists {listed} {what}; the released sum claims {claimed}")]
    Counts {
        /// Reports or samples.
        what: &'static str,
        /// Counted in the list.
        listed: u64,
        /// Claimed by the sum.
        claimed: u64,
    },
    /// The product of the listed ciphertexts is not the released sum.
    #[error("the listed reports do not multiply to the released sum")]
    NotTheSum,
}

impl SumEvidence {
    /// Evidence of these reports, in the order they were multiplied in (any order verifies).
    pub fn new(reports: Vec<EvidencedReport>) -> Self {
        SumEvidence { reports }
    }

    /// The listed reports.
    pub fn reports(&self) -> &[EvidencedReport] {
        &self.reports
    }

    /// Adds one report.
    pub fn push(&mut self, report: EvidencedReport) {
        self.reports.push(report);
    }

    /// The canonical encoding (module docs).
    pub fn encode(&self) -> Vec<u8> {
        let len = self
            .reports
            .iter()
            .map(EvidencedReport::encoded_len)
            .sum::<usize>();
        let mut out = Vec::with_capacity(5 + len);
        out.push(EVIDENCE_VERSION);
        out.extend_from_slice(&(self.reports.len() as u32).to_be_bytes());
        for report in &self.reports {
            report.encode_into(&mut out);
        }
        out
    }

    /// Decodes [`SumEvidence::encode`]'s bytes, refusing anything over
    /// [`MAX_SUM_EVIDENCE_BYTES`], cut short, or with bytes left over. Bindings are decoded as
    /// reports only by [`count`].
    pub fn decode(bytes: &[u8]) -> Result<Self, EvidenceError> {
        if bytes.len() > MAX_SUM_EVIDENCE_BYTES {
            return Err(EvidenceError::Malformed("larger than the limit"));
        }
        let mut reader = Reader(bytes);
        if reader.take(1)? != [EVIDENCE_VERSION] {
            return Err(EvidenceError::Malformed("unknown version"));
        }
        let count = u32::from_be_bytes(reader.array()?) as usize;
        // Each report takes at least 3 bytes: a count beyond that is a lie, refused before
        // anything is reserved.
        if count > reader.0.len() / 3 {
            return Err(EvidenceError::Malformed("more reports than bytes"));
        }
        let mut reports = Vec::with_capacity(count);
        for _ in 0..count {
            reports.push(reader.report()?);
        }
        if !reader.0.is_empty() {
            return Err(EvidenceError::Malformed("bytes after the last report"));
        }
        Ok(SumEvidence { reports })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], EvidenceError> {
        if self.0.len() < n {
            return Err(EvidenceError::Malformed("cut short"));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], EvidenceError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn report(&mut self) -> Result<EvidencedReport, EvidenceError> {
        let len = usize::from(u16::from_be_bytes(self.array()?));
        if len > MAX_FRAME_BODY {
            return Err(EvidenceError::Malformed("a binding longer than a frame"));
        }
        let binding = self.take(len)?.to_vec();
        let token = match self.take(1)?[0] {
            0 => None,
            1 => Some(EvidenceToken(self.array()?)),
            _ => return Err(EvidenceError::Malformed("unknown token marker")),
        };
        Ok(EvidencedReport { binding, token })
    }
}

/// Checks that `evidence` lists exactly the reports of the released sum `entry` (under `key`)
/// and counts the contributors its valid tokens prove; `spent_before` answers whether the
/// auditor already counted a token (in another sum, under any chain). Module docs.
pub fn count(
    evidence: &SumEvidence,
    entry: &BundleEntry,
    key: &PublicKey,
    rule: &EvidenceRule<'_>,
    spent_before: impl Fn(&SpentId) -> bool,
) -> Result<Counted, EvidenceError> {
    let reports = decode_reports(evidence, entry, key)?;
    check_product(&reports, entry, key)?;
    Ok(count_tokens(&reports, entry, rule, spent_before))
}

/// One listed report, decoded, with the bytes its tag covers.
struct Listed<'a> {
    report: Report,
    binding: &'a [u8],
    token: Option<EvidenceToken>,
}

fn decode_reports<'a>(
    evidence: &'a SumEvidence,
    entry: &BundleEntry,
    key: &PublicKey,
) -> Result<Vec<Listed<'a>>, EvidenceError> {
    let mut ids = HashSet::with_capacity(evidence.reports.len());
    let mut listed = Vec::with_capacity(evidence.reports.len());
    for (index, item) in evidence.reports.iter().enumerate() {
        let report = Report::from_binding(&item.binding)
            .map_err(|source| EvidenceError::Report { index, source })?;
        let field = if report.counter != entry.counter {
            Some("counter")
        } else if report.catalogue != entry.catalogue {
            Some("catalogue")
        } else if report.arch != entry.arch {
            Some("GPU architecture")
        } else if report.key_id != key.key_id() {
            Some("Paillier key")
        } else {
            None
        };
        if let Some(field) = field {
            return Err(EvidenceError::OtherSum { index, field });
        }
        if !ids.insert(report.report_id) {
            return Err(EvidenceError::Repeated { index });
        }
        listed.push(Listed {
            report,
            binding: &item.binding,
            token: item.token,
        });
    }
    Ok(listed)
}

fn check_product(
    reports: &[Listed<'_>],
    entry: &BundleEntry,
    key: &PublicKey,
) -> Result<(), EvidenceError> {
    let claimed = |what, listed: u64, claimed: u64| {
        (listed != claimed).then_some(EvidenceError::Counts {
            what,
            listed,
            claimed,
        })
    };
    if let Some(error) = claimed("reports", reports.len() as u64, entry.reports) {
        return Err(error);
    }
    let mut product = Accumulator::new(key);
    for (index, listed) in reports.iter().enumerate() {
        let samples = u64::from(listed.report.samples.0);
        product
            .absorb_bytes(listed.report.ciphertexts.as_bytes(), samples)
            .map_err(|source| EvidenceError::Ciphertexts { index, source })?;
    }
    if let Some(error) = claimed("samples", product.samples(), entry.samples) {
        return Err(error);
    }
    let sum = product.sum().map_err(|_| EvidenceError::NotTheSum)?;
    if sum.to_bytes() != entry.sums.as_bytes() {
        return Err(EvidenceError::NotTheSum);
    }
    Ok(())
}

fn count_tokens(
    reports: &[Listed<'_>],
    entry: &BundleEntry,
    rule: &EvidenceRule<'_>,
    spent_before: impl Fn(&SpentId) -> bool,
) -> Counted {
    let mut spent = Vec::new();
    let mut seen = HashSet::new();
    let mut per_epoch: BTreeMap<TokenEpoch, u64> = BTreeMap::new();
    let published = rule.keys.key_set();
    for listed in reports {
        let Some((epoch, id)) = verify_one(listed, entry, rule, &published) else {
            continue;
        };
        if spent_before(&id) || !seen.insert(id) {
            continue;
        }
        spent.push(id);
        *per_epoch.entry(epoch).or_default() += 1;
    }
    let cap = u64::from(rule.cap.get());
    let contributors = per_epoch
        .values()
        .map(|r| r.div_ceil(cap))
        .max()
        .unwrap_or(0);
    Counted {
        reports: reports.len() as u64,
        evidenced: spent.len() as u64,
        contributors,
        spent,
    }
}

/// The epoch and spent id of a listed report's token, if it verifies under the auditor's key
/// of the report's counter and an epoch within the report's day.
fn verify_one(
    listed: &Listed<'_>,
    entry: &BundleEntry,
    rule: &EvidenceRule<'_>,
    published: &KeySet,
) -> Option<(TokenEpoch, SpentId)> {
    let token = listed.token?;
    let redemption = Redemption::decode(&token.0[..REDEMPTION_BYTES], published).ok()?;
    let epoch = redemption.epoch();
    if !rule.cap.period().contains(epoch, listed.report.day.0) {
        return None;
    }
    let key = rule.keys.find(epoch, redemption.key_id()).ok()?;
    if key.scope() != TokenScope(entry.counter.0) {
        return None;
    }
    let id = key.verify(&redemption, listed.binding).ok()?;
    Some((epoch, id))
}
