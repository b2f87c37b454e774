//! Exactly what will leave this machine (`penrose-agent inspect`): for every report still in
//! the spool, the plaintext it encrypts, from the agent's own record of what it sealed. Read
//! without taking the daemon's spool or token store, so it works while the daemon runs.

use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;

use penrose_core::counters::{Bin, Catalogue, CatalogueVersion, CounterId, View};
use penrose_core::wire::ReportId;
use serde::Serialize;

use crate::config::AgentConfig;
use crate::record::{RecordError, RecordLog, SealedRecord, read_records};
use crate::spool::SpoolError;
use crate::status::HeldTokens;
use crate::tokens::{TokenCount, TokenStoreError};

/// Why the spool could not be inspected.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The spool directory did not read.
    #[error(transparent)]
    Spool(#[from] SpoolError),
    /// The sealed record did not read.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// The token store did not read.
    #[error(transparent)]
    Tokens(#[from] TokenStoreError),
}

/// The reports waiting to be sent, and what the text form says about them.
///
/// Its JSON form (`inspect --json`) is the array of [`SealedRecord`]s alone, each with the day
/// its spooled report carries.
#[derive(Clone, Debug, PartialEq)]
pub struct Inspection {
    /// The record of every spooled report, in the record's order, with the day the spooled
    /// report carries now (a report re-stamped for want of an admission token carries a later
    /// day than it was sealed on). Reports the record does not know are left out.
    pub reports: Vec<SealedRecord>,
    /// The reports among them that were re-stamped to another day.
    pub restamped: BTreeSet<ReportId>,
    /// Whether an issuer is configured (each report then also carries a token).
    pub admission_configured: bool,
    /// Whether the release auditor's party's issuer is configured (each report then also
    /// carries an evidence token, when one of its day and counter is held).
    pub evidence_configured: bool,
    /// Tokens held per (day, counter), counts only; empty when not read.
    pub tokens_held: Vec<TokenCount>,
}

impl Inspection {
    /// Reads the spool, the sealed record and, with `with_tokens`, the token store's counts
    /// of the state directory `config` names. The text form shows the counts; the JSON form
    /// (the reports alone) does without, and so does not read the store.
    pub fn read(config: &AgentConfig, with_tokens: bool) -> Result<Self, InspectError> {
        let mut inspection = Self::read_state_dir(
            &config.state_dir,
            config.admission.is_configured(),
            with_tokens,
        )?;
        inspection.evidence_configured = config.evidence.is_configured();
        Ok(inspection)
    }

    fn read_state_dir(
        state_dir: &Path,
        admission_configured: bool,
        with_tokens: bool,
    ) -> Result<Self, InspectError> {
        let spool = crate::daemon::spool_dir(state_dir);
        let spooled: BTreeSet<ReportId> = crate::spool::list_ids(&spool)?.into_iter().collect();
        // The day each spooled report carries now (a report re-stamped to another day for want
        // of an admission token carries that day, not the one it was sealed on).
        let days = crate::spool::spooled_days(&spool)?;
        let mut restamped = BTreeSet::new();
        let reports = read_records(RecordLog::in_state_dir(state_dir).path())?
            .into_iter()
            .filter(|r| spooled.contains(&r.report_id))
            .map(|mut r| {
                if let Some(day) = days.get(&r.report_id)
                    && day.0 != r.day
                {
                    restamped.insert(r.report_id);
                    r.day = day.0;
                }
                r
            })
            .collect();
        let tokens_held = if with_tokens {
            crate::tokens::read_counts(&crate::tokens::token_dir(state_dir))?
        } else {
            Vec::new()
        };
        Ok(Self {
            reports,
            restamped,
            admission_configured,
            evidence_configured: false,
            tokens_held,
        })
    }
}

/// The JSON form is the reports alone (an array), as `inspect --json` has always printed.
impl Serialize for Inspection {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.reports.serialize(serializer)
    }
}

/// The text form: what a report carries, the tokens held, then each report and its non-empty
/// bins with their value ranges.
impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} reports waiting to be sent; each carries only what is shown here, encrypted \
             (the bins), plus the snippet hash, counter, GPU generation (the compute capability's \
             major version), sample count and day in clear{}{}.",
            self.reports.len(),
            if self.admission_configured {
                ", and an anonymous admission token of that day and counter (a key id every agent \
                 shares for them, a random nonce and a tag binding it to the report)"
            } else {
                ""
            },
            if self.evidence_configured {
                ", and an evidence token of the same form from the release auditor's party, \
                 which only the auditor can check"
            } else {
                ""
            }
        )?;
        if !self.tokens_held.is_empty() {
            writeln!(
                f,
                "admission tokens held (counts only; the tokens are secrets):"
            )?;
            write!(f, "{}", HeldTokens(&self.tokens_held))?;
        }
        for r in &self.reports {
            writeln!(
                f,
                "\nreport {}  snippet {}  {} on {} ({} samples, day {}{}, sealed by {:?})",
                r.report_id,
                r.snippet,
                r.counter_name,
                if r.arch.is_empty() {
                    "unknown"
                } else {
                    &r.arch
                },
                r.samples,
                r.day,
                if self.restamped.contains(&r.report_id) {
                    ", re-stamped for want of a token of the day it was sealed on"
                } else {
                    ""
                },
                r.reason
            )?;
            // The record's own catalogue: a bin means what the binning it was sealed under says.
            let view = Catalogue::by_version(CatalogueVersion(r.catalogue))
                .and_then(|c| c.view(CounterId(r.counter)));
            for (i, &count) in r.bins.iter().enumerate() {
                if count == 0 {
                    continue;
                }
                let range = match (Bin::new(i), view) {
                    (Some(bin), Some(View::Counter(c))) => {
                        let (lo, hi) = c.binning.edges(bin);
                        format!("[{lo:.3}, {hi:.3}) {}", c.unit.suffix())
                    }
                    (Some(bin), Some(View::Joint(j))) => {
                        let (cx, cy) = j.cell_of(bin);
                        let ((xl, xh), (yl, yh)) = (j.x.edges(cx), j.y.edges(cy));
                        format!(
                            "{} [{xl:.3}, {xh:.3}) {} x {} [{yl:.3}, {yh:.3}) {}",
                            j.x.counter.name,
                            j.x.counter.unit.suffix(),
                            j.y.counter.name,
                            j.y.counter.unit.suffix()
                        )
                    }
                    _ => String::new(),
                };
                writeln!(f, "  bin {i:>3} {range:<32} {count}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::SealReason;
    use crate::spool::Spool;
    use penrose_core::fingerprint::{LOCATOR_BANDS, Locator, SnippetHash};
    use penrose_core::gpu::GpuArch;
    use penrose_core::histogram::SampleCount;
    use penrose_core::paillier::KeyId;
    use penrose_core::wire::{Day, Message, PackedBytes, Report};

    fn record(n: u8, day: u32) -> SealedRecord {
        let mut bins = vec![0; 128];
        bins[3] = 7;
        bins[127] = 1;
        SealedRecord {
            report_id: ReportId([n; 16]),
            snippet: SnippetHash([n; 32]),
            local_app: 1,
            counter: 0,
            counter_name: "sm_active".into(),
            catalogue: 1,
            day,
            arch: if n == 1 {
                String::new()
            } else {
                "sm_90".into()
            },
            samples: 8,
            bins,
            reason: SealReason::Size,
            joint_values: Vec::new(),
        }
    }

    /// A report frame of `record`'s id carrying `day`.
    fn frame(record: &SealedRecord, day: u32) -> Vec<u8> {
        Message::Report(Report {
            key_id: KeyId([1; 32]),
            report_id: record.report_id,
            snippet: record.snippet,
            locator: Locator([0; LOCATOR_BANDS]),
            arch: GpuArch::UNKNOWN,
            counter: CounterId(record.counter),
            catalogue: CatalogueVersion(record.catalogue),
            day: Day(day),
            samples: SampleCount(record.samples),
            ciphertexts: PackedBytes::new(vec![9; 64], 1).unwrap(),
            token: None,
            evidence: None,
        })
        .to_frame()
        .unwrap()
    }

    /// Two reports spooled (one re-stamped to a later day), a third sealed but no longer
    /// spooled (delivered), and a last line cut short by a crash: the inspection shows the two
    /// spooled ones with the day they carry, and the torn line costs nothing but itself.
    #[test]
    fn shows_the_spooled_reports_with_their_day_and_tolerates_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path();
        let (one, two, sent) = (record(1, 20_000), record(2, 20_000), record(3, 20_000));
        let mut spool = Spool::open(&crate::daemon::spool_dir(state), 1 << 20).unwrap();
        spool.push(one.report_id, &frame(&one, 20_000)).unwrap();
        spool.push(two.report_id, &frame(&two, 20_001)).unwrap();
        drop(spool);
        let mut text = String::new();
        for r in [&one, &sent, &two] {
            text.push_str(&serde_json::to_string(r).unwrap());
            text.push('\n');
        }
        text.push_str(r#"{"report_id":"0101"#);
        std::fs::write(RecordLog::in_state_dir(state).path(), text).unwrap();

        let inspection = Inspection::read_state_dir(state, false, true).unwrap();
        let mut restamped = two.clone();
        restamped.day = 20_001;
        assert_eq!(inspection.reports, [one.clone(), restamped]);
        assert_eq!(
            inspection.restamped,
            BTreeSet::from([two.report_id]),
            "only the report whose day changed"
        );
        assert!(inspection.tokens_held.is_empty(), "no token store");

        // JSON: the records alone, the re-stamped one with its new day.
        let json: Vec<SealedRecord> =
            serde_json::from_str(&serde_json::to_string_pretty(&inspection).unwrap()).unwrap();
        assert_eq!(json, inspection.reports);

        let shown = inspection.to_string();
        assert!(
            shown.starts_with("2 reports waiting to be sent; "),
            "{shown}"
        );
        assert!(
            shown
                .lines()
                .next()
                .unwrap()
                .ends_with("sample count and day in clear."),
            "{shown}"
        );
        assert!(!shown.contains("admission token of that day"), "{shown}");
        assert!(
            shown.contains(&format!(
                "\nreport {}  snippet {}  sm_active on unknown (8 samples, day 20000, sealed by Size)\n",
                one.report_id, one.snippet
            )),
            "{shown}"
        );
        assert!(
            shown.contains(&format!(
                "\nreport {}  snippet {}  sm_active on sm_90 (8 samples, day 20001, \
                 re-stamped for want of a token of the day it was sealed on, sealed by Size)\n",
                two.report_id, two.snippet
            )),
            "{shown}"
        );
        let bins: Vec<&str> = shown.lines().filter(|l| l.starts_with("  bin")).collect();
        assert_eq!(bins.len(), 4, "two non-empty bins per report: {shown}");
        assert!(bins[0].starts_with("  bin   3 ["), "{}", bins[0]);
        assert!(bins[0].ends_with(" 7"), "{}", bins[0]);
        assert!(bins[1].starts_with("  bin 127 ["), "{}", bins[1]);
    }

    #[test]
    fn an_empty_state_directory_has_nothing_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let inspection = Inspection::read_state_dir(dir.path(), true, true).unwrap();
        assert!(inspection.reports.is_empty());
        assert_eq!(serde_json::to_string(&inspection).unwrap(), "[]");
        let shown = inspection.to_string();
        assert_eq!(shown.lines().count(), 1, "{shown}");
        assert!(shown.starts_with("0 reports waiting to be sent; "));
        assert!(
            shown.ends_with(
                ", and an anonymous admission token of that day and counter (a key id every \
                 agent shares for them, a random nonce and a tag binding it to the report).\n"
            ),
            "{shown}"
        );
    }
}
