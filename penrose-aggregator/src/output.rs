//! What the CLI's offline commands print (`verify`, `check-report`): one type per output, which
//! the binary prints either as JSON (`--json`) or as text from its fields, and which scripts and
//! tests can read back. The admin commands' replies are in [`crate::control::reply`].

use std::collections::BTreeSet;
use std::path::PathBuf;

use penrose_core::bundle::Bundle;
use serde::{Deserialize, Serialize};

/// `verify`: whether a bundle verifies, and what it holds. On the wire `valid` (a bool) says
/// which, with the bundle's fields or the `error` beside it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "VerifyWire", try_from = "VerifyWire")]
pub enum VerifyOutput {
    /// The signature and the contents verify.
    Valid(BundleSummary),
    /// They do not (exit code 3, refused).
    Invalid {
        /// Why, in words.
        error: String,
    },
}

/// What a verified bundle holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleSummary {
    /// The signing key, hex.
    pub signer: String,
    /// The first Paillier key its sums are under (the only one before key rollover).
    pub key_id: String,
    /// Every Paillier key its sums are under.
    pub keys: Vec<String>,
    /// Its chain.
    pub instance: String,
    /// Its number in the chain.
    pub seq: u64,
    /// The chain this one was restored from, for the first bundle of a restored backup.
    pub parent: Option<String>,
    /// The epochs it releases.
    pub epochs: Vec<u32>,
    /// The day it was made.
    pub day: u32,
    /// k contributors.
    pub threshold: u64,
    /// T reports per contributor per (counter, day).
    pub cap: u32,
    /// Sums released.
    pub entries: usize,
    /// Distinct classes of the released sums.
    pub classes: usize,
    /// Reports behind the released sums.
    pub reports: u64,
    /// Whether every epoch's reports all came with admission tokens (the contributor bound
    /// holds for every sender).
    pub bound_enforced_by_tokens: bool,
    /// Whether the signer was checked against a pinned key (`--signer`).
    pub pinned: bool,
}

impl BundleSummary {
    /// The summary of a verified bundle; `pinned` when its signer was checked against a
    /// pinned key.
    pub fn new(b: &Bundle, pinned: bool) -> Self {
        let classes: BTreeSet<u32> = b.entries.iter().map(|e| e.class.0).collect();
        Self {
            signer: crate::export::hex(&b.signer),
            key_id: b.keys.first().map(ToString::to_string).unwrap_or_default(),
            keys: b.keys.iter().map(ToString::to_string).collect(),
            instance: b.link.instance.to_string(),
            seq: b.link.seq,
            parent: b.link.parent.map(|p| p.to_string()),
            epochs: b.epochs.iter().map(|e| e.id.0).collect(),
            day: b.day.0,
            threshold: b.rule.threshold,
            cap: b.rule.cap,
            entries: b.entries.len(),
            classes: classes.len(),
            reports: b.entries.iter().map(|e| e.reports).sum(),
            bound_enforced_by_tokens: b.epochs.iter().all(|e| e.bound_enforced_by_tokens()),
            pinned,
        }
    }
}

/// [`VerifyOutput`] on the wire.
#[derive(Serialize, Deserialize)]
struct VerifyWire {
    valid: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(flatten)]
    bundle: Option<BundleSummary>,
}

impl From<VerifyOutput> for VerifyWire {
    fn from(v: VerifyOutput) -> Self {
        match v {
            VerifyOutput::Valid(bundle) => Self {
                valid: true,
                error: None,
                bundle: Some(bundle),
            },
            VerifyOutput::Invalid { error } => Self {
                valid: false,
                error: Some(error),
                bundle: None,
            },
        }
    }
}

impl TryFrom<VerifyWire> for VerifyOutput {
    type Error = String;
    fn try_from(w: VerifyWire) -> Result<Self, String> {
        match (w.valid, w.bundle, w.error) {
            (true, Some(bundle), None) => Ok(Self::Valid(bundle)),
            (false, _, Some(error)) => Ok(Self::Invalid { error }),
            (true, ..) => Err("a valid verdict without the bundle's fields".into()),
            (false, ..) => Err("an invalid verdict without its error".into()),
        }
    }
}

/// `check-report`: the verdict on one frame of a file (one JSON line each).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "FrameWire", try_from = "FrameWire")]
pub struct FrameCheck {
    /// The file.
    pub file: PathBuf,
    /// The frame's index in it, from 0.
    pub frame: usize,
    /// Its first byte's offset.
    pub offset: usize,
    /// What validation said.
    pub verdict: FrameVerdict,
}

/// What validation said of a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameVerdict {
    /// A report the server would accept.
    Valid {
        /// Its counter.
        counter: u16,
        /// Samples in its histogram.
        samples: u32,
    },
    /// Refused.
    Rejected {
        /// The reject reason (as the ack names it).
        reason: String,
        /// Why, in words.
        detail: String,
    },
}

/// [`FrameCheck`] on the wire: `valid`, with `counter` and `samples` or `reason` and
/// `detail`.
#[derive(Serialize, Deserialize)]
struct FrameWire {
    file: PathBuf,
    frame: usize,
    offset: usize,
    valid: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    counter: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    samples: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
}

impl From<FrameCheck> for FrameWire {
    fn from(c: FrameCheck) -> Self {
        let (valid, counter, samples, reason, detail) = match c.verdict {
            FrameVerdict::Valid { counter, samples } => {
                (true, Some(counter), Some(samples), None, None)
            }
            FrameVerdict::Rejected { reason, detail } => {
                (false, None, None, Some(reason), Some(detail))
            }
        };
        Self {
            file: c.file,
            frame: c.frame,
            offset: c.offset,
            valid,
            counter,
            samples,
            reason,
            detail,
        }
    }
}

impl TryFrom<FrameWire> for FrameCheck {
    type Error = String;
    fn try_from(w: FrameWire) -> Result<Self, String> {
        let verdict = match (w.valid, w.counter, w.samples, w.reason, w.detail) {
            (true, Some(counter), Some(samples), None, None) => {
                FrameVerdict::Valid { counter, samples }
            }
            (false, None, None, Some(reason), Some(detail)) => {
                FrameVerdict::Rejected { reason, detail }
            }
            (true, ..) => return Err("a valid frame needs counter and samples only".into()),
            (false, ..) => return Err("a rejected frame needs reason and detail only".into()),
        };
        Ok(Self {
            file: w.file,
            frame: w.frame,
            offset: w.offset,
            verdict,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn round_trip<T>(value: &T, wire: &str)
    where
        T: Serialize + for<'de> Deserialize<'de> + PartialEq + std::fmt::Debug,
    {
        let written = serde_json::to_string(value).unwrap();
        let expected: serde_json::Value = serde_json::from_str(wire).unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&written).unwrap(),
            expected,
            "{written}"
        );
        assert_eq!(&serde_json::from_str::<T>(&written).unwrap(), value);
    }

    #[test]
    fn verify_outputs_round_trip_in_their_wire_form() {
        let summary = BundleSummary {
            signer: "ab".repeat(32),
            key_id: "0123456789abcdef".into(),
            keys: vec!["0123456789abcdef".into()],
            instance: "00112233445566778899aabbccddeeff".into(),
            seq: 2,
            parent: None,
            epochs: vec![20000, 20001],
            day: 20002,
            threshold: 10,
            cap: 24,
            entries: 3,
            classes: 2,
            reports: 40,
            bound_enforced_by_tokens: true,
            pinned: false,
        };
        round_trip(
            &VerifyOutput::Valid(summary.clone()),
            &format!(
                r#"{{"valid":true,"signer":"{}","key_id":"0123456789abcdef",
                "keys":["0123456789abcdef"],
                "instance":"00112233445566778899aabbccddeeff","seq":2,"parent":null,
                "epochs":[20000,20001],"day":20002,"threshold":10,"cap":24,"entries":3,
                "classes":2,"reports":40,"bound_enforced_by_tokens":true,"pinned":false}}"#,
                summary.signer
            ),
        );
        round_trip(
            &VerifyOutput::Invalid {
                error: "bad signature".into(),
            },
            r#"{"valid":false,"error":"bad signature"}"#,
        );
        // A valid verdict that lost a field is refused, not read as something else.
        assert!(serde_json::from_str::<VerifyOutput>(r#"{"valid":true,"seq":2}"#).is_err());
    }

    #[test]
    fn frame_checks_round_trip_in_their_wire_form() {
        round_trip(
            &FrameCheck {
                file: "a.frames".into(),
                frame: 0,
                offset: 0,
                verdict: FrameVerdict::Valid {
                    counter: 4,
                    samples: 100,
                },
            },
            r#"{"file":"a.frames","frame":0,"offset":0,"valid":true,"counter":4,"samples":100}"#,
        );
        round_trip(
            &FrameCheck {
                file: "a.frames".into(),
                frame: 1,
                offset: 812,
                verdict: FrameVerdict::Rejected {
                    reason: "TokenRequired".into(),
                    detail: "no admission token".into(),
                },
            },
            r#"{"file":"a.frames","frame":1,"offset":812,"valid":false,
                "reason":"TokenRequired","detail":"no admission token"}"#,
        );
        let mixed = r#"{"file":"a","frame":0,"offset":0,"valid":true,"reason":"x","detail":"y"}"#;
        assert!(serde_json::from_str::<FrameCheck>(mixed).is_err());
    }
}
