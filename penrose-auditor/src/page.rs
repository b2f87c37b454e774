//! One page of a bundle: the entries the design server asks the auditor's partial decryptions
//! of, checked whole before any is computed (bounds, keys, ciphertexts), sorted by the
//! auditor's own rule into those it decrypts and those it withholds, and decrypted on a few
//! threads (a partial decryption costs about 165 ms at 2048 bits; `docs/crypto.md`).

use std::ops::Range;

use std::collections::HashMap;

use penrose_core::audit::{AuditRefusal, EntryPartial, MAX_PARTIALS_PER_PAGE};
use penrose_core::bundle::{Bundle, BundleEntry, BundleHash, EpochSummary};
use penrose_core::paillier::threshold::KeyShare;
use penrose_core::paillier::{PackedCiphertexts, PaillierError, PublicKey};
use penrose_core::tokens::SpentId;

use crate::evidence::{EvidenceKeys, Owner, SpentStore, count_entry};
use crate::keys::Shares;
use crate::policy::Policy;

/// How the auditor counts a page's contributors from its evidence: its keys, the tokens
/// counted before, the bundle's hash (a token's owner is a bundle entry) and the page's
/// encoded evidence, one list per entry.
#[derive(Clone, Copy)]
pub struct Counting<'a> {
    /// The auditor party's key ring and cap.
    pub keys: &'a EvidenceKeys,
    /// Tokens counted before, and for which sums.
    pub store: &'a SpentStore,
    /// The bundle's hash.
    pub bundle: BundleHash,
    /// The page's evidence, by position in the page.
    pub lists: &'a [Vec<u8>],
}

/// A released entry of the page: its index in the bundle, its validated sums and the share
/// that decrypts them.
struct Work<'a> {
    entry: u32,
    share: &'a KeyShare,
    sums: PackedCiphertexts,
}

/// A page checked and sorted, ready to decrypt.
pub struct Page<'a> {
    work: Vec<Work<'a>>,
    withheld: Vec<u32>,
    spent: Vec<(SpentId, Owner)>,
}

/// What a page's answer carries: one partial per entry the auditor releases, and the
/// entries it withholds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decrypted {
    /// Partials, by entry.
    pub partials: Vec<EntryPartial>,
    /// Entries under the auditor's threshold.
    pub withheld: Vec<u32>,
}

impl<'a> Page<'a> {
    /// Checks page `first..first + count` of `bundle`: within its entries and 1 to
    /// `MAX_PARTIALS_PER_PAGE` long (`BadPage`; a bundle with no entries has one page, the
    /// empty one at 0, so that it can still be taken as the next link of the chain), every
    /// entry under a key a share is held of (`UnknownKey`), every ciphertext valid for its key
    /// (`Malformed`). Then sorts the entries by the auditor's own rule: a sum decrypts only if
    /// its reports over its epoch's days are enough contributors.
    pub fn plan(
        bundle: &Bundle,
        first: u32,
        count: u32,
        shares: &'a Shares,
        policy: &Policy,
        counting: Option<Counting<'_>>,
    ) -> Result<Self, AuditRefusal> {
        let range = bounds(bundle.entries.len(), first, count)?;
        let mut keyed = Vec::with_capacity(range.len());
        for index in range.clone() {
            let entry = &bundle.entries[index];
            let share = bundle
                .keys
                .get(usize::from(entry.key))
                .and_then(|id| shares.get(id))
                .ok_or(AuditRefusal::UnknownKey)?;
            keyed.push((index, entry, share));
        }
        let mut page = Page {
            work: Vec::new(),
            withheld: Vec::new(),
            spent: Vec::new(),
        };
        let mut claimed = HashMap::new();
        for (position, (index, entry, share)) in keyed.into_iter().enumerate() {
            let public = share.verification_key().public_key();
            let sums = public
                .validate_packed(entry.sums.as_bytes())
                .map_err(|_| AuditRefusal::Malformed)?;
            // Below MAX_PARTIALS_PER_PAGE past a u32 `first`: fits.
            let entry_index = index as u32;
            let at = Place {
                bundle,
                entry,
                index: entry_index,
                position,
            };
            let released = match counting {
                None => at.releases_by_count(policy),
                Some(c) => at.releases_by_evidence(c, policy, public, &mut claimed, &mut page)?,
            };
            if released {
                page.work.push(Work {
                    entry: entry_index,
                    share,
                    sums,
                });
            } else {
                page.withheld.push(entry_index);
            }
        }
        Ok(page)
    }

    /// The tokens the page's released entries were counted from, to record before answering.
    pub fn spent(&self) -> &[(SpentId, Owner)] {
        &self.spent
    }

    /// How many partial decryptions the page needs.
    pub fn partials(&self) -> usize {
        self.work.len()
    }

    /// The page's partial decryptions, computed on up to `workers` threads.
    pub fn decrypt(self, workers: usize) -> Result<Decrypted, PaillierError> {
        let per_thread = self.work.len().div_ceil(workers.max(1)).max(1);
        let partials = if self.work.len() <= per_thread {
            decrypt_part(&self.work)?
        } else {
            std::thread::scope(|scope| {
                let threads: Vec<_> = self
                    .work
                    .chunks(per_thread)
                    .map(|part| scope.spawn(move || decrypt_part(part)))
                    .collect();
                let mut partials = Vec::with_capacity(self.work.len());
                for thread in threads {
                    let part = thread
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
                    partials.extend(part);
                }
                Ok::<_, PaillierError>(partials)
            })?
        };
        Ok(Decrypted {
            partials,
            withheld: self.withheld,
        })
    }
}

fn decrypt_part(work: &[Work<'_>]) -> Result<Vec<EntryPartial>, PaillierError> {
    let mut rng = rand::rng();
    work.iter()
        .map(|w| {
            let partial = w.share.partial_decrypt(&w.sums, &mut rng)?;
            Ok(EntryPartial {
                entry: w.entry,
                partial: partial.to_bytes(),
            })
        })
        .collect()
}

/// One entry of a page, where it stands.
struct Place<'b> {
    bundle: &'b Bundle,
    entry: &'b BundleEntry,
    index: u32,
    position: usize,
}

impl Place<'_> {
    /// The rule without evidence: the reports the bundle states, over its epoch's days.
    fn releases_by_count(&self, policy: &Policy) -> bool {
        // Bundle::verify refuses an entry of an epoch it does not list; withhold if not.
        self.bundle
            .epoch(self.entry.epoch)
            .map(EpochSummary::days)
            .is_some_and(|days| policy.releases(self.entry.reports, days))
    }

    /// The rule with evidence: the contributors its tokens prove reach k. The tokens of a
    /// released entry are claimed for it (in `page` and `claimed`); a withheld entry's stay
    /// free. Evidence that is missing or lists other reports refuses the page.
    fn releases_by_evidence(
        &self,
        counting: Counting<'_>,
        policy: &Policy,
        public: &PublicKey,
        claimed: &mut HashMap<SpentId, Owner>,
        page: &mut Page<'_>,
    ) -> Result<bool, AuditRefusal> {
        let bad = AuditRefusal::BadEvidence { entry: self.index };
        if self.bundle.epoch(self.entry.epoch).is_none() {
            return Ok(false);
        }
        let list = counting.lists.get(self.position).ok_or(bad)?;
        let owner = Owner {
            bundle: counting.bundle,
            entry: self.index,
        };
        let counted = count_entry(
            counting.keys,
            counting.store,
            claimed,
            owner,
            list,
            self.entry,
            public,
        )
        .ok_or(bad)?;
        if counted.contributors < policy.threshold().get() {
            return Ok(false);
        }
        claimed.extend(counted.claims.iter().copied());
        page.spent.extend(counted.claims);
        Ok(true)
    }
}

/// The entries of page `first..first + count` of a bundle with `entries` entries.
pub fn bounds(entries: usize, first: u32, count: u32) -> Result<Range<usize>, AuditRefusal> {
    if entries == 0 && first == 0 && count == 0 {
        return Ok(0..0);
    }
    let start = first as usize;
    let end = start + count as usize;
    if count == 0 || count > MAX_PARTIALS_PER_PAGE || end > entries {
        return Err(AuditRefusal::BadPage);
    }
    Ok(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_within_the_entries_and_one_to_a_page_long() {
        assert_eq!(bounds(10, 0, 10), Ok(0..10));
        assert_eq!(bounds(10, 9, 1), Ok(9..10));
        assert_eq!(bounds(0, 0, 0), Ok(0..0));
        for (entries, first, count) in [
            (10, 0, 0),
            (10, 10, 1),
            (10, 5, 6),
            (10, u32::MAX, 1),
            (0, 0, 1),
            (0, 1, 0),
            (20_000, 0, MAX_PARTIALS_PER_PAGE + 1),
        ] {
            assert_eq!(
                bounds(entries, first, count),
                Err(AuditRefusal::BadPage),
                "{entries} {first} {count}"
            );
        }
        assert_eq!(
            bounds(20_000, 1, MAX_PARTIALS_PER_PAGE).map(|r| r.len()),
            Ok(MAX_PARTIALS_PER_PAGE as usize)
        );
    }
}
