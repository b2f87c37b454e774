//! The auditor's policy on real keys, real bundles and real files: its partials combine with
//! the design server's to the exact sums; every refusal leaves the data directory byte for
//! byte as it was; an epoch is answered in one bundle only, across chains and re-pins; the
//! same page asked again is answered without changing anything; a restart keeps the record;
//! the auditor's own threshold withholds what the bundle releases; sums under a key it holds
//! no share of are refused.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{ChainMaker, DAY, Dealing, ENOUGH, Setup, partials, release};
use penrose_auditor::{Auditor, Policy, admin};
use penrose_core::audit::{AuditAnswer, AuditRefusal, AuditRequest, MAX_PARTIALS_PER_PAGE};
use penrose_core::bundle::BundleEntry;
use penrose_core::bundle::{BundleHash, EpochId, InstanceId};
use penrose_core::counters::BIN_COUNT;
use penrose_core::paillier::KeySize;
use penrose_core::wire::PackedBytes;

/// Asks for a page and checks it is refused with `expected` and that nothing changed: not a
/// byte of the data directory, not the record in memory.
fn refused(
    setup: &Setup,
    auditor: &Auditor,
    bundle: &[u8],
    page: (u32, u32),
    expected: AuditRefusal,
) {
    let files = setup.files();
    let record = auditor.record();
    let answer = release(auditor, bundle, page.0, page.1);
    assert_eq!(answer, AuditAnswer::Refused(expected));
    assert_eq!(
        setup.files(),
        files,
        "{expected:?} changed the data directory"
    );
    assert_eq!(auditor.record(), record, "{expected:?} changed the record");
}

#[test]
fn partials_combine_with_the_design_servers_to_the_exact_sums() {
    let mut setup = Setup::new(Policy::default(), None);
    let (a, a_bins) = setup.sum(DAY, 0, ENOUGH);
    let (b, b_bins) = setup.sum(DAY, 1, 5 * ENOUGH);
    // 216 reports could all come from 9 agents: the auditor withholds it.
    let (c, _) = setup.sum(DAY, 2, ENOUGH - 1);
    let entries = vec![a.clone(), b.clone(), c];
    let bundle = setup.chain(1).next(&[DAY], entries);
    let auditor = setup.auditor();
    let answer = release(&auditor, &bundle, 0, 3);
    let AuditAnswer::Partials { hash, .. } = &answer else {
        panic!("{answer:?}");
    };
    assert_eq!(*hash, BundleHash::of(&bundle));
    let (got, withheld) = partials(answer);
    assert_eq!(withheld, [2]);
    assert_eq!(got.iter().map(|p| p.entry).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(setup.dealing.combine(&a, &got[0].partial), a_bins);
    assert_eq!(setup.dealing.combine(&b, &got[1].partial), b_bins);
    // Recorded: the chain, the bundle, its epoch.
    let status = auditor.status();
    assert_eq!(status.instance, Some(InstanceId([1; 16])));
    assert_eq!((status.seq, status.hash), (1, BundleHash::of(&bundle)));
    let record = auditor.record();
    assert_eq!(record.answered().len(), 1);
    assert_eq!(record.answered()[0].epoch, EpochId(DAY));
    // A partial alone is no decryption: the design server's share with itself is refused.
    let sums = setup
        .dealing
        .keys
        .public_key()
        .validate_packed(a.sums.as_bytes())
        .unwrap();
    let ours = setup
        .dealing
        .design
        .partial_decrypt(&sums, &mut rand::rng())
        .unwrap();
    let verification = setup.dealing.design.verification_key();
    assert!(penrose_core::paillier::threshold::combine(verification, &sums, &ours, &ours).is_err());
}

/// An auditor that took bundle 1 (epoch DAY) of chain 1, and that chain's right bundle 2
/// (epoch DAY + 1), not asked yet. Each refusal test asks something else first, then checks
/// that the right bundle is still taken as if nothing had been asked.
struct Taken {
    setup: Setup,
    chain: ChainMaker,
    auditor: Auditor,
    one: Vec<u8>,
    two: Vec<u8>,
    next: BundleEntry,
    next_bins: [u64; BIN_COUNT],
}

impl Taken {
    fn new() -> Self {
        let mut setup = Setup::new(Policy::default(), None);
        let mut chain = setup.chain(1);
        let (first, _) = setup.sum(DAY, 0, ENOUGH);
        let one = chain.next(&[DAY], vec![first]);
        let auditor = setup.auditor();
        partials(release(&auditor, &one, 0, 1));
        let (next, next_bins) = setup.sum(DAY + 1, 0, ENOUGH);
        let two = chain.sign(2, BundleHash::of(&one), &[DAY + 1], vec![next.clone()]);
        Taken {
            setup,
            chain,
            auditor,
            one,
            two,
            next,
            next_bins,
        }
    }

    fn refused(&self, bundle: &[u8], page: (u32, u32), expected: AuditRefusal) {
        refused(&self.setup, &self.auditor, bundle, page, expected);
    }

    /// Bundle 2 of the chain, with other contents.
    fn other_two(&self, epochs: &[u32], entries: Vec<BundleEntry>) -> Vec<u8> {
        self.chain
            .sign(2, BundleHash::of(&self.one), epochs, entries)
    }

    /// The right bundle 2 is taken, and its partial combines to its sum.
    fn next_is_taken(self) {
        let (got, _) = partials(release(&self.auditor, &self.two, 0, 1));
        let bins = self.setup.dealing.combine(&self.next, &got[0].partial);
        assert_eq!(bins, self.next_bins);
        assert_eq!(self.auditor.status().seq, 2);
    }
}

#[test]
fn requests_bundles_and_ciphertexts_that_do_not_decode_are_malformed() {
    let t = Taken::new();
    let files = t.setup.files();
    let garbage = t.auditor.answer(&[1, 77, 0]);
    let malformed = AuditAnswer::Refused(AuditRefusal::Malformed);
    assert_eq!(AuditAnswer::decode(&garbage).unwrap(), malformed);
    assert_eq!(t.setup.files(), files);
    t.refused(&t.two[..10], (0, 1), AuditRefusal::Malformed);
    let mut poisoned = t.next.clone();
    let len = poisoned.sums.as_bytes().len();
    poisoned.sums = PackedBytes::new(vec![0; len], poisoned.sums.count()).unwrap();
    let bad = t.other_two(&[DAY + 1], vec![poisoned]);
    t.refused(&bad, (0, 1), AuditRefusal::Malformed);
    t.next_is_taken();
}

#[test]
fn a_bundle_not_signed_by_the_pinned_key_is_refused() {
    let t = Taken::new();
    let mut stranger = t.setup.chain(1);
    stranger.signing = ed25519_dalek::SigningKey::from_bytes(&[4; 32]);
    let forged = stranger.sign(2, BundleHash::of(&t.one), &[DAY + 1], vec![t.next.clone()]);
    t.refused(&forged, (0, 1), AuditRefusal::WrongSigner);
    // Altered after signing.
    let mut altered = t.two.clone();
    altered[200] ^= 1;
    t.refused(&altered, (0, 1), AuditRefusal::WrongSigner);
    t.next_is_taken();
}

#[test]
fn a_bundle_of_another_chain_is_refused() {
    let t = Taken::new();
    let other = t.setup.chain(2).next(&[DAY + 1], vec![t.next.clone()]);
    t.refused(&other, (0, 1), AuditRefusal::OtherChain);
    t.next_is_taken();
}

#[test]
fn a_gap_in_the_chain_is_refused() {
    let t = Taken::new();
    let three = t
        .chain
        .sign(3, BundleHash::of(&t.two), &[DAY + 1], vec![t.next.clone()]);
    let gap = AuditRefusal::OutOfOrder {
        expected: 2,
        got: 3,
    };
    t.refused(&three, (0, 1), gap);
    t.next_is_taken();
}

#[test]
fn a_fork_is_refused() {
    let mut t = Taken::new();
    // Other bytes at the seq taken, and a next bundle that follows them.
    let (other, _) = t.setup.sum(DAY, 3, ENOUGH);
    let fork = t.chain.sign(1, BundleHash::default(), &[DAY], vec![other]);
    t.refused(&fork, (0, 1), AuditRefusal::Forked { seq: 1 });
    let after = t
        .chain
        .sign(2, BundleHash::of(&fork), &[DAY + 1], vec![t.next.clone()]);
    t.refused(&after, (0, 1), AuditRefusal::Forked { seq: 1 });
    t.next_is_taken();
}

#[test]
fn an_epoch_released_again_is_refused() {
    let mut t = Taken::new();
    let (again, _) = t.setup.sum(DAY, 7, ENOUGH);
    let bundle = t.other_two(&[DAY], vec![again]);
    let twice = AuditRefusal::EpochAnsweredBefore {
        epoch: EpochId(DAY),
    };
    t.refused(&bundle, (0, 1), twice);
    t.next_is_taken();
}

#[test]
fn pages_outside_the_bundle_are_refused() {
    let t = Taken::new();
    for page in [
        (0, 0),
        (1, 1),
        (0, 2),
        (u32::MAX, 1),
        (0, MAX_PARTIALS_PER_PAGE + 1),
    ] {
        t.refused(&t.two, page, AuditRefusal::BadPage);
    }
    t.next_is_taken();
}

#[test]
fn a_record_that_cannot_be_written_answers_unavailable() {
    let t = Taken::new();
    // A directory where the record's temporary file goes stops the write, even as root; the
    // partials computed are dropped.
    let blocker = t.setup.data.path().join(".record.json.tmp");
    std::fs::create_dir(&blocker).unwrap();
    t.refused(&t.two, (0, 1), AuditRefusal::Unavailable);
    std::fs::remove_dir(&blocker).unwrap();
    t.next_is_taken();
}

#[test]
fn an_epoch_answered_in_one_chain_is_refused_in_its_copy_even_after_follow() {
    let mut setup = Setup::new(Policy::default(), None);
    let (sum, _) = setup.sum(DAY, 0, ENOUGH);
    let original = setup.chain(1).next(&[DAY], vec![sum.clone()]);
    let auditor = setup.auditor();
    partials(release(&auditor, &original, 0, 1));

    // A copy of the store: a new chain naming its parent, releasing the same epoch again.
    let mut copy = setup.chain(2);
    copy.parent = Some(InstanceId([1; 16]));
    let (copied_sum, _) = setup.sum(DAY, 0, ENOUGH + 1);
    let replayed = copy.sign(1, BundleHash::default(), &[DAY], vec![copied_sum]);
    refused(
        &setup,
        &auditor,
        &replayed,
        (0, 1),
        AuditRefusal::OtherChain,
    );
    drop(auditor);

    // The operator re-pins deliberately: the epoch stays answered.
    let followed = admin::follow(&setup.data, copy.instance).unwrap();
    assert!(!followed.already);
    assert_eq!(
        followed.before.map(|c| c.instance),
        Some(InstanceId([1; 16]))
    );
    let auditor = setup.auditor();
    let epoch = AuditRefusal::EpochAnsweredBefore {
        epoch: EpochId(DAY),
    };
    refused(&setup, &auditor, &replayed, (0, 1), epoch);
    // Its own new epochs are answered, and the record names both chains.
    let (fresh, fresh_bins) = setup.sum(DAY + 1, 0, ENOUGH);
    let new_epoch = copy.next(&[DAY + 1], vec![fresh.clone()]);
    let (got, _) = partials(release(&auditor, &new_epoch, 0, 1));
    assert_eq!(setup.dealing.combine(&fresh, &got[0].partial), fresh_bins);
    let record = auditor.record();
    assert_eq!(record.earlier()[0].instance, InstanceId([1; 16]));
    let chains: Vec<InstanceId> = record.answered().iter().map(|a| a.instance).collect();
    assert_eq!(chains, [InstanceId([1; 16]), InstanceId([2; 16])]);
    // The original chain's bundles are another chain's now.
    refused(
        &setup,
        &auditor,
        &original,
        (0, 1),
        AuditRefusal::OtherChain,
    );
    drop(auditor);
    // Following the chain it follows changes nothing.
    let files = setup.files();
    assert!(admin::follow(&setup.data, copy.instance).unwrap().already);
    assert_eq!(setup.files(), files);
}

#[test]
fn a_restored_chain_is_taken_only_when_pinned() {
    let mut setup = Setup::new(Policy::default(), None);
    let mut copy = setup.chain(2);
    copy.parent = Some(InstanceId([1; 16]));
    let (sum, bins) = setup.sum(DAY, 0, ENOUGH);
    let bundle = copy.next(&[DAY], vec![sum.clone()]);
    // The first bundle ever fixes the chain, but not a restored copy's.
    let auditor = setup.auditor();
    refused(&setup, &auditor, &bundle, (0, 1), AuditRefusal::OtherChain);
    assert_eq!(auditor.status().instance, None);
    // Pinned at init, it is taken.
    let pinned = Setup::new(Policy::default(), Some(copy.instance));
    let auditor = pinned.auditor();
    let (got, _) = partials(release(&auditor, &bundle, 0, 1));
    assert_eq!(pinned.dealing.combine(&sum, &got[0].partial), bins);
}

#[test]
fn the_same_page_asked_again_is_answered_and_changes_nothing() {
    let mut setup = Setup::new(Policy::default(), None);
    let (a, a_bins) = setup.sum(DAY, 0, ENOUGH);
    let (b, b_bins) = setup.sum(DAY, 1, ENOUGH);
    let bundle = setup.chain(1).next(&[DAY], vec![a.clone(), b.clone()]);
    let auditor = setup.auditor();
    let (first, _) = partials(release(&auditor, &bundle, 0, 1));
    let files = setup.files();
    let record = auditor.record();
    // A retry: fresh proofs of the same ciphertexts, the same plaintext, nothing recorded.
    let (again, _) = partials(release(&auditor, &bundle, 0, 1));
    assert_ne!(again[0].partial, first[0].partial);
    assert_eq!(setup.dealing.combine(&a, &again[0].partial), a_bins);
    // The next page of the same bundle.
    let (next, _) = partials(release(&auditor, &bundle, 1, 1));
    assert_eq!(next[0].entry, 1);
    assert_eq!(setup.dealing.combine(&b, &next[0].partial), b_bins);
    assert_eq!(setup.files(), files);
    assert_eq!(auditor.record(), record);
}

#[test]
fn a_restart_keeps_the_chain_and_the_answered_epochs() {
    let mut setup = Setup::new(Policy::default(), None);
    let mut chain = setup.chain(1);
    let (sum, _) = setup.sum(DAY, 0, ENOUGH);
    let one = chain.next(&[DAY], vec![sum]);
    let auditor = setup.auditor();
    partials(release(&auditor, &one, 0, 1));
    let status = auditor.status();
    drop(auditor);

    let auditor = setup.auditor();
    assert_eq!(auditor.status(), status);
    let (other, _) = setup.sum(DAY, 4, ENOUGH);
    let fork = chain.sign(1, BundleHash::default(), &[DAY], vec![other.clone()]);
    refused(
        &setup,
        &auditor,
        &fork,
        (0, 1),
        AuditRefusal::Forked { seq: 1 },
    );
    let replay = chain.sign(2, BundleHash::of(&one), &[DAY], vec![other]);
    let epoch = AuditRefusal::EpochAnsweredBefore {
        epoch: EpochId(DAY),
    };
    refused(&setup, &auditor, &replay, (0, 1), epoch);
    let (next, _) = setup.sum(DAY + 1, 0, ENOUGH);
    let two = chain.next(&[DAY + 1], vec![next]);
    partials(release(&auditor, &two, 0, 1));
    drop(auditor);
    let auditor = setup.auditor();
    assert_eq!(auditor.status().seq, 2);
    assert_eq!(auditor.record().answered().len(), 2);
}

#[test]
fn the_auditors_own_threshold_withholds_what_the_bundle_releases() {
    // k = 20: 480 reports over one day are 20 contributors, 217 only 10.
    let mut setup = Setup::new(Policy::new(20, 24).unwrap(), None);
    let (low, _) = setup.sum(DAY, 0, ENOUGH);
    let (high, high_bins) = setup.sum(DAY, 1, 480);
    // The same 480 reports over an epoch of two days are at least 10 contributors only.
    let (spread, _) = setup.sum(DAY + 1, 0, 480);
    let chain = setup.chain(1);
    let mut bundle = chain.bundle(
        1,
        BundleHash::default(),
        &[DAY, DAY + 1],
        vec![low, high.clone(), spread],
    );
    bundle.epochs[1].last_day.0 += 1;
    let bytes = bundle.sign(&chain.signing).unwrap();
    let auditor = setup.auditor();
    let (got, withheld) = partials(release(&auditor, &bytes, 0, 3));
    assert_eq!(withheld, [0, 2]);
    assert_eq!(got.len(), 1);
    assert_eq!(setup.dealing.combine(&high, &got[0].partial), high_bins);
}

#[test]
fn sums_under_a_key_without_a_share_are_refused_until_one_is_added() {
    let mut setup = Setup::new(Policy::default(), None);
    let next_key = Dealing::new(KeySize::Bits1024, 6);
    let (old, old_bins) = setup.sum(DAY, 0, ENOUGH);
    let (new, new_bins) = next_key.sum(1, DAY, 1, ENOUGH, &mut setup.rng);
    let mut chain = setup.chain(1);
    chain.keys = vec![setup.dealing.id(), next_key.id()];
    let bundle = chain.next(&[DAY], vec![old.clone(), new.clone()]);
    let auditor = setup.auditor();
    refused(&setup, &auditor, &bundle, (0, 2), AuditRefusal::UnknownKey);
    refused(&setup, &auditor, &bundle, (1, 1), AuditRefusal::UnknownKey);
    // A page of the held key's sums alone is answered.
    let (got, _) = partials(release(&auditor, &bundle, 0, 1));
    assert_eq!(setup.dealing.combine(&old, &got[0].partial), old_bins);
    drop(auditor);
    // Key rollover: the new key's share is added; the same bundle's other page is answered.
    admin::add_share(&setup.data, &next_key.auditor).unwrap();
    assert!(matches!(
        admin::add_share(&setup.data, &next_key.auditor),
        Err(penrose_auditor::AuditorError::KeyHeld(_))
    ));
    let auditor = setup.auditor();
    assert_eq!(auditor.key_ids().len(), 2);
    let (got, _) = partials(release(&auditor, &bundle, 1, 1));
    assert_eq!(next_key.combine(&new, &got[0].partial), new_bins);
}

#[test]
fn a_bundle_without_entries_is_taken_with_the_empty_page() {
    let mut setup = Setup::new(Policy::default(), None);
    let mut chain = setup.chain(1);
    let empty = chain.next(&[DAY], Vec::new());
    let auditor = setup.auditor();
    refused(&setup, &auditor, &empty, (0, 1), AuditRefusal::BadPage);
    let (got, withheld) = partials(release(&auditor, &empty, 0, 0));
    assert!(got.is_empty() && withheld.is_empty());
    assert_eq!(auditor.status().seq, 1);
    // Its epoch is answered: all its sums were withheld by the aggregation server, and none
    // may be released later.
    let (sum, _) = setup.sum(DAY, 0, ENOUGH);
    let later = chain.next(&[DAY], vec![sum]);
    let epoch = AuditRefusal::EpochAnsweredBefore {
        epoch: EpochId(DAY),
    };
    refused(&setup, &auditor, &later, (0, 1), epoch);
}

#[test]
fn two_forks_asked_at_once_get_one_answer() {
    let mut setup = Setup::new(Policy::default(), None);
    let chain = setup.chain(1);
    let (a, _) = setup.sum(DAY, 0, ENOUGH);
    let (b, _) = setup.sum(DAY, 1, ENOUGH);
    let left = chain.sign(1, BundleHash::default(), &[DAY], vec![a]);
    let right = chain.sign(1, BundleHash::default(), &[DAY], vec![b]);
    let auditor = setup.auditor();
    let answers = std::thread::scope(|scope| {
        let threads: Vec<_> = [&left, &right]
            .map(|bundle| {
                let auditor = &auditor;
                scope.spawn(move || release(auditor, bundle, 0, 1))
            })
            .into_iter()
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect::<Vec<_>>()
    });
    let answered = answers
        .iter()
        .filter(|a| matches!(a, AuditAnswer::Partials { .. }))
        .count();
    let forked = answers
        .iter()
        .filter(|a| **a == AuditAnswer::Refused(AuditRefusal::Forked { seq: 1 }))
        .count();
    assert_eq!((answered, forked), (1, 1), "{answers:?}");
    assert_eq!(auditor.record().answered().len(), 1);
}

#[test]
fn status_requests_answer_the_chain_position() {
    let mut setup = Setup::new(Policy::default(), None);
    let auditor = setup.auditor();
    let status = |auditor: &Auditor| {
        AuditAnswer::decode(&auditor.answer(&AuditRequest::Status.encode())).unwrap()
    };
    let AuditAnswer::Status(before) = status(&auditor) else {
        panic!()
    };
    assert_eq!((before.instance, before.seq), (None, 0));
    let (sum, _) = setup.sum(DAY, 0, ENOUGH);
    let bundle = setup.chain(3).next(&[DAY], vec![sum]);
    partials(release(&auditor, &bundle, 0, 1));
    let AuditAnswer::Status(after) = status(&auditor) else {
        panic!()
    };
    assert_eq!(after.instance, Some(InstanceId([3; 16])));
    assert_eq!((after.seq, after.hash), (1, BundleHash::of(&bundle)));
}
