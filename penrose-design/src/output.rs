//! What the CLI prints with `--json` besides the report (`keygen`, `key-info`, `labels`,
//! `import`): one type per output, which the binary prints either as JSON or as text from its
//! fields, and which scripts and tests can read back. The report's is [`crate::report::Report`].

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::archive::{Aggregates, Imported};
use crate::labels::{Label, Labels};

/// `keygen`: the key pair written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Keygen {
    /// The new key's id (what bundles and reports name it by).
    pub key_id: String,
    /// The private key file (mode 0600); none when the key was split.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub private: Option<PathBuf>,
    /// The public key file, for agents and the aggregation server.
    pub public: PathBuf,
    /// A split key's files: both shares and the verification key.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub split: Option<SplitFiles>,
}

/// The files a split key generation wrote besides the public key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitFiles {
    /// The design server's share (mode 0600, stays here).
    pub design_share: PathBuf,
    /// The auditor's share (mode 0600): for the auditor's operator, then deleted here.
    pub auditor_share: PathBuf,
    /// Both holders' verification keys (public).
    pub verification_key: PathBuf,
}

/// What `penrose-design audit` did.
pub type AuditSummary = crate::audit::AuditSummary;

/// Which kind of key file `key-info` read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyKind {
    /// A public key file.
    Public,
    /// A private key file (read through the permission check).
    Private,
}

impl std::fmt::Display for KeyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeyKind::Public => "public",
            KeyKind::Private => "private",
        })
    }
}

/// `key-info`: what a key file holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyInfo {
    /// Public or private.
    pub kind: KeyKind,
    /// The key's id.
    pub key_id: String,
    /// The modulus size.
    pub modulus_bits: u32,
}

/// One row of `labels`, which prints a JSON array of them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelRow {
    /// The class.
    pub class: u32,
    /// Its label.
    pub label: Label,
}

impl LabelRow {
    /// The rows of every label, by class.
    pub fn all(labels: &Labels) -> Vec<LabelRow> {
        labels
            .iter()
            .map(|(class, label)| LabelRow {
                class,
                label: label.clone(),
            })
            .collect()
    }
}

/// `import`: what each bundle did and what the archive holds after.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportSummary {
    /// Each bundle given, in order.
    pub imports: Vec<BundleImport>,
    /// Bundles merged in the archive.
    pub bundles: usize,
    /// Epochs released.
    pub epochs: usize,
    /// Released sums.
    pub sums: usize,
    /// The chains followed, oldest first.
    pub chains: Vec<ChainSummary>,
    /// Epochs a later chain released again (refused, never merged).
    pub skipped_epochs: usize,
}

impl ImportSummary {
    /// The summary of `imports` into an archive that now holds `merged`.
    pub fn new(imports: Vec<BundleImport>, merged: &Aggregates) -> Self {
        Self {
            imports,
            bundles: merged.bundles,
            epochs: merged.epochs.len(),
            sums: merged.entries.len(),
            chains: merged
                .chains
                .iter()
                .map(|(instance, bundles)| ChainSummary {
                    instance: instance.to_string(),
                    bundles: *bundles,
                })
                .collect(),
            skipped_epochs: merged.skipped.len(),
        }
    }
}

/// One bundle of [`ImportSummary`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleImport {
    /// The bundle file.
    pub bundle: PathBuf,
    /// What importing it did.
    pub outcome: Imported,
}

/// One chain of [`ImportSummary`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainSummary {
    /// The chain (store instance).
    pub instance: String,
    /// Its last bundle's number.
    pub bundles: u64,
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
    fn every_output_has_its_wire_form_and_reads_back_equal() {
        round_trip(
            &Keygen {
                key_id: "0123456789abcdef".into(),
                private: Some("keys/private.key".into()),
                public: "keys/public.key".into(),
                split: None,
            },
            r#"{"key_id":"0123456789abcdef","private":"keys/private.key",
                "public":"keys/public.key"}"#,
        );
        round_trip(
            &Keygen {
                key_id: "0123456789abcdef".into(),
                private: None,
                public: "keys/public.key".into(),
                split: Some(SplitFiles {
                    design_share: "keys/design.share".into(),
                    auditor_share: "keys/auditor.share".into(),
                    verification_key: "keys/verification.key".into(),
                }),
            },
            r#"{"key_id":"0123456789abcdef","public":"keys/public.key",
                "design_share":"keys/design.share","auditor_share":"keys/auditor.share",
                "verification_key":"keys/verification.key"}"#,
        );
        for (kind, name) in [(KeyKind::Public, "public"), (KeyKind::Private, "private")] {
            round_trip(
                &KeyInfo {
                    kind,
                    key_id: "0123456789abcdef".into(),
                    modulus_bits: 2048,
                },
                &format!(r#"{{"kind":"{name}","key_id":"0123456789abcdef","modulus_bits":2048}}"#),
            );
            assert_eq!(kind.to_string(), name);
        }
        round_trip(
            &vec![LabelRow {
                class: 3,
                label: Label::new("llama decode").unwrap(),
            }],
            r#"[{"class":3,"label":"llama decode"}]"#,
        );
        round_trip(
            &ImportSummary {
                imports: vec![
                    BundleImport {
                        bundle: "0001.bundle".into(),
                        outcome: Imported::New {
                            instance: "aa".repeat(16),
                            seq: 1,
                            epochs: 1,
                            entries: 4,
                            skipped_epochs: vec![],
                        },
                    },
                    BundleImport {
                        bundle: "0001.bundle".into(),
                        outcome: Imported::AlreadyImported {
                            instance: "aa".repeat(16),
                            seq: 1,
                        },
                    },
                ],
                bundles: 1,
                epochs: 1,
                sums: 4,
                chains: vec![ChainSummary {
                    instance: "aa".repeat(16),
                    bundles: 1,
                }],
                skipped_epochs: 0,
            },
            &r#"{"imports":[
                {"bundle":"0001.bundle","outcome":{"new":{"instance":"I","seq":1,"epochs":1,
                    "entries":4,"skipped_epochs":[]}}},
                {"bundle":"0001.bundle","outcome":{"already_imported":{"instance":"I","seq":1}}}],
                "bundles":1,"epochs":1,"sums":4,"chains":[{"instance":"I","bundles":1}],
                "skipped_epochs":0}"#
                .replace('I', &"aa".repeat(16)),
        );
    }

    #[test]
    fn a_label_read_back_is_checked_like_one_typed() {
        assert!(serde_json::from_str::<LabelRow>(r#"{"class":1,"label":""}"#).is_err());
        assert!(serde_json::from_str::<LabelRow>(r#"{"class":1,"label":"a\u202eb"}"#).is_err());
    }
}
