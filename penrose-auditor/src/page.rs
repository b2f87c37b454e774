//! One page of a bundle: the entries the design server asks the auditor's partial decryptions
//! of, checked whole before any is computed (bounds, keys, ciphertexts), sorted by the
//! auditor's own rule into those it decrypts and those it withholds, and decrypted on a few
//! threads (a partial decryption costs about 165 ms at 2048 bits; `docs/crypto.md`).

use std::ops::Range;

use penrose_core::audit::{AuditRefusal, EntryPartial, MAX_PARTIALS_PER_PAGE};
use penrose_core::bundle::{Bundle, EpochSummary};
use penrose_core::paillier::threshold::KeyShare;
use penrose_core::paillier::{PackedCiphertexts, PaillierError};

use crate::keys::Shares;
use crate::policy::Policy;

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
        };
        for (index, entry, share) in keyed {
            let public = share.verification_key().public_key();
            let sums = public
                .validate_packed(entry.sums.as_bytes())
                .map_err(|_| AuditRefusal::Malformed)?;
            // Below MAX_PARTIALS_PER_PAGE past a u32 `first`: fits.
            let entry_index = index as u32;
            // Bundle::verify refuses an entry of an epoch it does not list; withhold if not.
            let days = bundle.epoch(entry.epoch).map(EpochSummary::days);
            match days {
                Some(days) if policy.releases(entry.reports, days) => page.work.push(Work {
                    entry: entry_index,
                    share,
                    sums,
                }),
                _ => page.withheld.push(entry_index),
            }
        }
        Ok(page)
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
