//! The checks a report passes before it may touch a sum. Everything a client controls is
//! checked here, cheapest first, so that a bad report costs little and changes nothing. Under
//! admission by tokens ([`crate::admission`]) that includes the report's token: whether it has
//! one of the right key comes before the ciphertexts are parsed, and its MAC, the most
//! expensive check, comes last.
//!
//! All but one: whether each ciphertext is a unit (gcd(c, n) = 1) is checked by the writer
//! for a whole batch with one gcd ([`penrose_core::paillier::units`]), because a gcd per
//! ciphertext was the largest single cost of the server. A report that fails it is answered
//! `InvalidCiphertext` like any other invalid one and changes nothing.

use penrose_core::counters::Catalogue;
use penrose_core::fingerprint::{FingerprintParams, MalformedSnippet};
use penrose_core::gpu::GpuArch;
use penrose_core::paillier::{MAX_REPORT_SAMPLES, PaillierError, UnitPending};
use penrose_core::release::{DAY_TOLERANCE, day_acceptable};
use penrose_core::wire::{Day, Message, RejectReason, Report, WireError};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::admission::{Admission, SpentToken, TokenRefusal};
use crate::design_keys::{DesignKeys, KeySlot};

/// Why a report was refused: the code the ack carries and the reason in words for the log.
#[derive(Debug, Error)]
pub enum Rejection {
    /// The bytes are not one well-formed report frame.
    #[error("malformed frame: {0}")]
    Wire(#[from] WireError),
    /// The frame is a well-formed message, but not a report.
    #[error("expected a report, got another message")]
    NotAReport,
    /// Encrypted under a key the design server's key list does not give the report's day
    /// (unknown, retired, or not yet in use).
    #[error("report of day {day} is under key {actual}; the key list gives that day {expected:?}")]
    UnknownKey {
        /// The key of the report's day (`None`: the list starts later).
        expected: Option<penrose_core::paillier::KeyId>,
        /// The report's key.
        actual: penrose_core::paillier::KeyId,
        /// The report's day.
        day: u32,
    },
    /// Binned against a catalogue this build does not know.
    #[error("unknown counter catalogue version {0}")]
    UnknownCatalogue(u16),
    /// The counter id is not in the report's catalogue.
    #[error("counter {counter} is not in catalogue version {catalogue}")]
    UnknownCounter {
        /// The counter id.
        counter: u16,
        /// The catalogue version.
        catalogue: u16,
    },
    /// The report names a GPU architecture no report may name: not one of the shipping
    /// generations with the minor version zeroed (`penrose_core::gpu::GENERATIONS`), so unknown,
    /// too fine, or a generation this build does not know.
    #[error(
        "GPU architecture {0} is not a generation reports may name (one of sm_70, sm_80, sm_90, \
         sm_100, sm_110, sm_120)"
    )]
    Arch(GpuArch),
    /// The report's day is too far from the server's: a report may not choose its epoch.
    #[error("report day {day} is more than {DAY_TOLERANCE} day(s) from the server's day {today}")]
    Day {
        /// The report's day.
        day: u32,
        /// The server's.
        today: u32,
    },
    /// The snippet hash cannot come from the fingerprinter (bits past the k b-bit values, or
    /// all values equal): a hand-made hash, refused before it can found a class.
    #[error("malformed snippet hash: {0}")]
    Snippet(#[from] MalformedSnippet),
    /// Zero samples, or more than one report may hold.
    #[error("sample count {0} outside 1..={MAX_REPORT_SAMPLES}")]
    SampleCount(u32),
    /// A ciphertext is malformed, out of range or not a unit.
    #[error("invalid ciphertext: {0}")]
    Ciphertext(#[from] PaillierError),
    /// The server admits reports by token only, and this one carries none.
    #[error("no admission token (this server admits reports by token only)")]
    TokenRequired,
    /// The report's admission token is not a valid token for it.
    #[error("invalid admission token: {0}")]
    InvalidToken(#[from] TokenRefusal),
    /// The token is of the report's day, and the key ring holds no key of that day at all
    /// (not loaded yet): the token may well be good, so the agent keeps it and retries.
    #[error("no key of day {0} is loaded; the token cannot be checked yet")]
    TokenKeyMissing(u32),
}

impl Rejection {
    /// The code the ack carries.
    pub fn reason(&self) -> RejectReason {
        match self {
            Rejection::Wire(e) => e.reject_reason(),
            Rejection::NotAReport => RejectReason::Malformed,
            Rejection::UnknownKey { .. } => RejectReason::UnknownKey,
            Rejection::UnknownCatalogue(_) | Rejection::UnknownCounter { .. } => {
                RejectReason::UnknownCounter
            }
            Rejection::SampleCount(_) => RejectReason::SampleCountOutOfRange,
            Rejection::Arch(_) => RejectReason::InvalidArch,
            Rejection::Day { .. } => RejectReason::DayOutOfRange,
            Rejection::Snippet(_) => RejectReason::InvalidSnippet,
            Rejection::Ciphertext(_) => RejectReason::InvalidCiphertext,
            Rejection::TokenRequired => RejectReason::TokenRequired,
            Rejection::InvalidToken(_) => RejectReason::InvalidToken,
            Rejection::TokenKeyMissing(_) => RejectReason::TokenKeyMissing,
        }
    }
}

/// A report that passed every check, with its ciphertexts parsed.
#[derive(Clone, Debug)]
pub struct ValidReport {
    /// The decoded report.
    pub report: Report,
    /// The slot of the design key it is under.
    pub key: KeySlot,
    /// Its ciphertexts, checked against the key (length, non-zero, below n^2, not a multiple
    /// of n); the unit check is the writer's, per batch
    /// ([`PublicKey::check_units`](penrose_core::paillier::PublicKey::check_units)).
    pub ciphertexts: UnitPending,
    /// SHA-256 of the ciphertext bytes: an exact copy of a counted report under a fresh report
    /// id is folded by it, so resending the same histogram does not count twice.
    pub digest: CiphertextDigest,
    /// The verified admission token it spends (admission by tokens); `None` under open
    /// admission.
    pub token: Option<SpentToken>,
}

/// The SHA-256 of a report's ciphertexts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CiphertextDigest(pub [u8; 32]);

/// Decodes one whole frame and checks it against the server's design keys, the catalogues
/// this build knows, the server's day and its admission.
pub fn validate_frame(
    frame: &[u8],
    keys: &DesignKeys,
    today: Day,
    admission: &Admission,
) -> Result<ValidReport, Rejection> {
    let (message, used) = Message::decode(frame)?;
    if used != frame.len() {
        return Err(WireError::TrailingBytes(frame.len() - used).into());
    }
    match message {
        Message::Report(report) => validate_report(report, keys, today, admission),
        Message::Ack(_) | Message::KeyListRequest | Message::KeyList(_) => {
            Err(Rejection::NotAReport)
        }
    }
}

/// Decodes one frame body (the bytes after the length prefix, as a transport that already
/// checked the prefix hands them over) and checks it like [`validate_frame`].
pub fn validate_body(
    body: &[u8],
    keys: &DesignKeys,
    today: Day,
    admission: &Admission,
) -> Result<ValidReport, Rejection> {
    match Message::decode_body(body)? {
        Message::Report(report) => validate_report(report, keys, today, admission),
        Message::Ack(_) | Message::KeyListRequest | Message::KeyList(_) => {
            Err(Rejection::NotAReport)
        }
    }
}

/// Checks a decoded report: catalogue, counter, GPU architecture, sample count, day, whether
/// the key list lets that day use the report's key, snippet hash (against
/// the shipped fingerprint parameters, which agents and server share), under admission by
/// tokens that it carries a token of its day's and counter's key, then the ciphertexts (their
/// gcd is deferred to the batch, module docs), and last the token's MAC.
pub fn validate_report(
    report: Report,
    keys: &DesignKeys,
    today: Day,
    admission: &Admission,
) -> Result<ValidReport, Rejection> {
    let catalogue = Catalogue::by_version(report.catalogue)
        .ok_or(Rejection::UnknownCatalogue(report.catalogue.0))?;
    if catalogue.view(report.counter).is_none() {
        return Err(Rejection::UnknownCounter {
            counter: report.counter.0,
            catalogue: report.catalogue.0,
        });
    }
    if !report.arch.is_reportable() {
        return Err(Rejection::Arch(report.arch));
    }
    let samples = report.samples.0;
    if samples == 0 || u64::from(samples) > MAX_REPORT_SAMPLES {
        return Err(Rejection::SampleCount(samples));
    }
    if !day_acceptable(report.day, today) {
        return Err(Rejection::Day {
            day: report.day.0,
            today: today.0,
        });
    }
    let Some((slot, key)) = keys.accepts(report.key_id, report.day) else {
        return Err(Rejection::UnknownKey {
            expected: keys.current(report.day).map(|k| k.key_id()),
            actual: report.key_id,
            day: report.day.0,
        });
    };
    report.snippet.check(&FingerprintParams::default())?;
    let claimed = admission.claim(&report)?;
    let bytes = report.ciphertexts.as_bytes();
    let ciphertexts = key.validate_packed_deferring_units(bytes)?;
    let digest = CiphertextDigest(Sha256::digest(bytes).into());
    let token = claimed.map(|claim| claim.verify(&report)).transpose()?;
    Ok(ValidReport {
        report,
        key: slot,
        ciphertexts,
        digest,
        token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use penrose_core::counters::{BIN_COUNT, CatalogueVersion, CounterId};
    use penrose_core::fingerprint::{Fingerprinter, SnippetHash};
    use penrose_core::histogram::SampleCount;
    use penrose_core::paillier::{KeyId, KeySize, Keypair};
    use penrose_core::wire::{Day, PackedBytes, ReportId};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    const TODAY: Day = Day(20_000);

    fn setup() -> (Keypair, Report) {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let keys = Keypair::generate_with_size(KeySize::Bits1024, &mut rng);
        let mut bins = [0u32; BIN_COUNT];
        bins[5] = 7;
        bins[100] = 3;
        let packed = keys.public_key().encrypt_packed(&bins, &mut rng).unwrap();
        let report = Report {
            key_id: keys.public_key().key_id(),
            report_id: ReportId([1; 16]),
            snippet: Fingerprinter::new(FingerprintParams::default())
                .unwrap()
                .snippet_hash(&["a", "b", "c", "d", "e"]),
            locator: penrose_core::fingerprint::Locator(
                [0; penrose_core::fingerprint::LOCATOR_BANDS],
            ),
            arch: GpuArch::new(9, 0),
            counter: CounterId(4),
            catalogue: CatalogueVersion(1),
            day: TODAY,
            samples: SampleCount(10),
            ciphertexts: PackedBytes::new(packed.to_bytes(), packed.ciphertexts().len()).unwrap(),
            token: None,
            evidence: None,
        };
        (keys, report)
    }

    fn reason(report: Report, keys: &Keypair) -> RejectReason {
        let frame = Message::Report(report).to_frame().unwrap();
        validate_frame(
            &frame,
            &DesignKeys::single(keys.public_key().clone()),
            TODAY,
            &Admission::Open,
        )
        .unwrap_err()
        .reason()
    }

    fn with_ciphertexts(mut report: Report, bytes: Vec<u8>) -> Report {
        let count = report.ciphertexts.count();
        report.ciphertexts = PackedBytes::new(bytes, count).unwrap();
        report
    }

    #[test]
    fn a_valid_report_passes_and_decrypts() {
        let (keys, report) = setup();
        let frame = Message::Report(report.clone()).to_frame().unwrap();
        let valid = validate_frame(
            &frame,
            &DesignKeys::single(keys.public_key().clone()),
            TODAY,
            &Admission::Open,
        )
        .unwrap();
        assert_eq!(valid.report, report);
        let checked = keys.public_key().check_units([&valid.ciphertexts]);
        let bins = keys
            .private_key()
            .decrypt_packed(checked[0].as_ref().unwrap())
            .unwrap();
        assert_eq!((bins[5], bins[100], bins.iter().sum::<u64>()), (7, 3, 10));
    }

    #[test]
    fn each_rule_rejects_with_its_code() {
        let (keys, report) = setup();
        let mut r = report.clone();
        r.key_id = KeyId([9; 32]);
        assert_eq!(reason(r, &keys), RejectReason::UnknownKey);

        let mut r = report.clone();
        r.catalogue = CatalogueVersion(999);
        assert_eq!(reason(r, &keys), RejectReason::UnknownCounter);

        let mut r = report.clone();
        r.counter = CounterId(60_000);
        assert_eq!(reason(r, &keys), RejectReason::UnknownCounter);

        // A joint view's id is a report's counter in the catalogue that defines it (version
        // 2), and unknown in one that does not (version 1).
        let mut r = report.clone();
        r.counter = CounterId(9);
        assert_eq!(reason(r.clone(), &keys), RejectReason::UnknownCounter);
        r.catalogue = CatalogueVersion(2);
        let frame = Message::Report(r).to_frame().unwrap();
        let single = DesignKeys::single(keys.public_key().clone());
        assert!(validate_frame(&frame, &single, TODAY, &Admission::Open).is_ok());

        // Only shipping generations, minor version zeroed: not unknown, not a model (8.6), not
        // a generation this build does not know (a prototype would single out its owners).
        for arch in [
            GpuArch::UNKNOWN,
            GpuArch::new(8, 6),
            GpuArch::new(9, 1),
            GpuArch::new(13, 0),
            GpuArch::new(255, 255),
        ] {
            let mut r = report.clone();
            r.arch = arch;
            assert_eq!(reason(r, &keys), RejectReason::InvalidArch, "{arch}");
        }
        for arch in penrose_core::gpu::GENERATIONS {
            let mut r = report.clone();
            r.arch = arch;
            let frame = Message::Report(r).to_frame().unwrap();
            assert!(
                validate_frame(
                    &frame,
                    &DesignKeys::single(keys.public_key().clone()),
                    TODAY,
                    &Admission::Open
                )
                .is_ok()
            );
        }

        for samples in [0, MAX_REPORT_SAMPLES as u32 + 1] {
            let mut r = report.clone();
            r.samples = SampleCount(samples);
            assert_eq!(reason(r, &keys), RejectReason::SampleCountOutOfRange);
        }

        for day in [Day(TODAY.0 - 2), Day(TODAY.0 + 2), Day(0), Day(u32::MAX)] {
            let mut r = report.clone();
            r.day = day;
            assert_eq!(reason(r, &keys), RejectReason::DayOutOfRange);
        }
        // Hand-made snippet hashes: all zeros, the empty window's, a bit past k * b = 200.
        let mut high = report.snippet;
        high.0[31] |= 0x80;
        for snippet in [SnippetHash([0; 32]), SnippetHash([0xff; 32]), high] {
            let mut r = report.clone();
            r.snippet = snippet;
            assert_eq!(reason(r, &keys), RejectReason::InvalidSnippet);
        }
        let mut empty = [0u8; 32];
        empty[..25].fill(0xff);
        let mut r = report.clone();
        r.snippet = SnippetHash(empty);
        assert_eq!(reason(r, &keys), RejectReason::InvalidSnippet);

        for day in [Day(TODAY.0 - 1), Day(TODAY.0 + 1)] {
            let mut r = report.clone();
            r.day = day;
            let frame = Message::Report(r).to_frame().unwrap();
            assert!(
                validate_frame(
                    &frame,
                    &DesignKeys::single(keys.public_key().clone()),
                    TODAY,
                    &Admission::Open
                )
                .is_ok()
            );
        }

        let len = report.ciphertexts.as_bytes().len();
        let ct_len = report.ciphertexts.ciphertext_len();
        // Zero, all ones (>= n^2), and n itself (not a unit) in the first ciphertext.
        let mut zero = report.ciphertexts.as_bytes().to_vec();
        zero[..ct_len].fill(0);
        let mut big = report.ciphertexts.as_bytes().to_vec();
        big[..ct_len].fill(0xff);
        let mut not_unit = report.ciphertexts.as_bytes().to_vec();
        let n = &keys.public_key().to_bytes();
        // The public key encoding holds n right after its header; place n, right-aligned.
        let n_bytes = KeySize::Bits1024.modulus_bytes();
        let header = n.len() - n_bytes - KeySize::Bits1024.ciphertext_bytes();
        not_unit[..ct_len].fill(0);
        not_unit[ct_len - n_bytes..ct_len].copy_from_slice(&n[header..header + n_bytes]);
        for bytes in [zero, big, not_unit] {
            assert_eq!(
                reason(with_ciphertexts(report.clone(), bytes), &keys),
                RejectReason::InvalidCiphertext
            );
        }
        // Wrong length for this key.
        let short = PackedBytes::new(vec![1; len / 2], 1).unwrap();
        let mut r = report.clone();
        r.ciphertexts = short;
        assert_eq!(reason(r, &keys), RejectReason::InvalidCiphertext);
    }

    #[test]
    fn malformed_frames_reject_as_malformed_or_too_large() {
        let (keys, report) = setup();
        let frame = Message::Report(report).to_frame().unwrap();
        let key = &DesignKeys::single(keys.public_key().clone());
        let truncated =
            validate_frame(&frame[..frame.len() - 1], key, TODAY, &Admission::Open).unwrap_err();
        assert_eq!(truncated.reason(), RejectReason::Malformed);
        let mut trailing = frame.clone();
        trailing.push(0);
        assert_eq!(
            validate_frame(&trailing, key, TODAY, &Admission::Open)
                .unwrap_err()
                .reason(),
            RejectReason::Malformed
        );
        let huge = u32::MAX.to_be_bytes();
        assert_eq!(
            validate_frame(&huge, key, TODAY, &Admission::Open)
                .unwrap_err()
                .reason(),
            RejectReason::TooLarge
        );
        let mut version = frame.clone();
        version[6] = 1;
        assert_eq!(
            validate_frame(&version, key, TODAY, &Admission::Open)
                .unwrap_err()
                .reason(),
            RejectReason::UnsupportedVersion
        );
        // Garbage announcing a huge frame is refused on its length, other garbage as malformed.
        assert_eq!(
            validate_frame(b"garbage bytes!", key, TODAY, &Admission::Open)
                .unwrap_err()
                .reason(),
            RejectReason::TooLarge
        );
        assert_eq!(
            validate_frame(
                &[
                    [0, 0, 0, 3, 9].as_slice(),
                    &penrose_core::wire::FORMAT_VERSION.to_be_bytes()
                ]
                .concat(),
                key,
                TODAY,
                &Admission::Open
            )
            .unwrap_err()
            .reason(),
            RejectReason::Malformed
        );
    }
}
