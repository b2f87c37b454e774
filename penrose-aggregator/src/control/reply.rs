//! The admin replies: what [`super::execute`] answers each [`super::Request`] with. The server
//! writes them on the control socket, the CLI reads them back into the same types and prints
//! them (`--json` as they are, text from their fields), so a field renamed or retyped on one
//! side is a compile error on the other rather than a `"?"` or `null` in the output.
//!
//! On the wire every reply is one JSON object inside the response line's envelope
//! (`{"ok":true,"result":{...}}`, or `{"ok":false,"error":"..."}`). The field names are the
//! ones the admin commands' `--json` output has always had: scripts and tests read them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use penrose_core::release::ReleaseRule;
use serde::{Deserialize, Serialize};

pub use crate::admission::AdmissionDescription;
use crate::store::TableSize;

use super::ControlError;

/// `status`: what the server is doing, its tables and its store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReply {
    /// Whether a server answered (false when the CLI opened the data directory itself).
    pub serving: bool,
    /// Whether the writer still commits (a failed durable write stops the server).
    pub healthy: bool,
    /// How the running server admits reports; `null` offline, where nothing is admitted.
    pub admission: Option<AdmissionStatus>,
    /// Spent tokens recorded, as the store estimates its keys (`null` when the store has no
    /// such table).
    pub spent_tokens: Option<u64>,
    /// The design server's key today's reports are under (`null` when the key list starts
    /// later).
    pub key_id: Option<String>,
    /// The design keys applied: the list and every key the store sums under.
    pub design_keys: DesignKeysStatus,
    /// Committed write batches.
    pub cursor: u64,
    /// Reports counted since the store was created.
    pub reports_accepted_total: u64,
    /// Classes (merged ones not counted).
    pub classes: usize,
    /// Classes merged into older ones.
    pub merged_classes: usize,
    /// Distinct snippets assigned to classes.
    pub snippets: u64,
    /// Accumulators held in memory.
    pub open_accumulators: usize,
    /// The most accumulators held in memory at once.
    pub held_accumulators_max: usize,
    /// Accumulators read back from the store since start.
    pub accumulator_loads: u64,
    /// Accumulators written out to make room since start.
    pub accumulator_evictions: u64,
    /// The store's bundle chain.
    pub instance: String,
    /// How epochs are cut.
    pub epoch_policy: String,
    /// Epochs still open, oldest first.
    pub open_epochs: Vec<EpochReports>,
    /// The last closed epoch, if any.
    pub closed_through: Option<u32>,
    /// The release rule exports apply.
    pub release: ReleaseRule,
    /// The budget of new classes (founding a class is rate limited).
    pub new_classes: NewClasses,
    /// The oldest day whose report ids are still kept for deduplication.
    pub seen_floor_day: u32,
    /// Estimated heap bytes of the class tables.
    pub table_heap_bytes: usize,
    /// The rate every ack asks agents for, in thousandths of the normal one.
    pub throttle_permille: u16,
    /// Counters since the process started.
    pub since_start: SinceStart,
    /// The store's tables.
    pub store: Vec<StoreTable>,
}

/// How a running server admits reports, with the tokens it verified since start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmissionStatus {
    /// The mode and, by tokens, the key ring (its fields sit next to `tokens_verified` on the
    /// wire, not in an object of their own).
    #[serde(flatten)]
    pub admission: AdmissionDescription,
    /// Admission tokens whose MAC verified since start.
    pub tokens_verified: u64,
}

/// An epoch and the reports it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochReports {
    /// The epoch.
    pub epoch: u32,
    /// Reports counted in it.
    pub reports: u64,
    /// Days its reports span.
    pub days: u32,
}

/// The budget of new classes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewClasses {
    /// Classes that may be founded an hour.
    pub per_hour: u32,
    /// Classes that may be founded now.
    pub available: u64,
}

/// Ingest counters since the process started. The fields are in alphabetical order: text
/// `status` prints this object as one JSON line, and has always printed it with sorted keys.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinceStart {
    /// Reports counted.
    pub accepted: u64,
    /// Durable write batches.
    pub batches: u64,
    /// Reports answered as duplicates.
    pub duplicates: u64,
    /// Reports refused, per reason (the metrics' reason labels).
    pub rejected: BTreeMap<String, u64>,
}

/// One table of the store, as the store estimates it ([`TableSize`], with a name the reader
/// owns).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreTable {
    /// The table's name.
    pub table: String,
    /// Estimated number of keys.
    pub keys: u64,
    /// Bytes in SST files.
    pub disk_bytes: u64,
    /// Bytes in memtables not yet flushed.
    pub memtable_bytes: u64,
}

impl From<&TableSize> for StoreTable {
    fn from(t: &TableSize) -> Self {
        Self {
            table: t.table.to_string(),
            keys: t.keys,
            disk_bytes: t.disk_bytes,
            memtable_bytes: t.memtable_bytes,
        }
    }
}

/// `top`: the classes with the most reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopReply {
    /// Classes in all (merged ones not counted).
    pub classes: usize,
    /// The classes asked for, most reports first.
    pub top: Vec<TopClass>,
}

/// One class of [`TopReply`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopClass {
    /// The class.
    pub class: u32,
    /// Reports counted in it.
    pub reports: u64,
    /// Distinct snippets assigned to it.
    pub snippets: u64,
    /// Fingerprints new snippets are compared with.
    pub representatives: usize,
    /// The server's day when it was founded.
    pub first_seen_day: u32,
}

/// `throttle`: the rate now asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThrottleReply {
    /// Thousandths of the normal rate.
    pub throttle_permille: u16,
}

/// `compact`: the store after compaction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactReply {
    /// Always true (a failed compaction is an error reply).
    pub compacted: bool,
    /// The store's tables after it.
    pub store: Vec<StoreTable>,
}

/// `backup`: where the copy is and the chain it starts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupReply {
    /// The copy's store directory.
    pub backup: PathBuf,
    /// The copy's new bundle chain (a restore from it exports there).
    pub instance: String,
    /// The chain it was copied from.
    pub parent: String,
    /// The epochs the copy holds and will never release (`crate::copies`): a restore from
    /// it loses the reports of those still open when it was taken.
    pub released_elsewhere: Vec<u32>,
}

/// `export-evidence`: the evidence file of one bundle, written by the server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvidenceReply {
    /// Where it was written.
    pub evidence: PathBuf,
    /// The bundle it is of.
    pub seq: u64,
    /// Its entries (one evidence list each).
    pub entries: u64,
    /// Reports listed over all entries.
    pub reports: u64,
    /// Of them, reports that carried an evidence token.
    pub with_tokens: u64,
    /// The file's length.
    pub bytes: u64,
}

/// `forget-evidence`: what was deleted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForgetEvidenceReply {
    /// The last bundle the auditor answered.
    pub through: u64,
    /// The epochs whose evidence was deleted.
    pub epochs: Vec<u32>,
    /// Evidence rows deleted.
    pub rows: u64,
}

/// `reload-keys`: the key ring now in use.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadKeysReply {
    /// How the server admits reports now.
    pub admission: AdmissionDescription,
    /// The design keys applied now.
    pub design_keys: DesignKeysStatus,
}

/// The design keys a server applies (`crate::design_keys`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesignKeysStatus {
    /// The signed list's sequence (`null`: one configured key).
    pub list_sequence: Option<u64>,
    /// The list file reloads read (`null`: not from a file).
    pub list_file: Option<String>,
    /// Days a replaced key is still accepted for.
    pub grace_days: u8,
    /// Which key encrypts reports from which day.
    pub schedule: Vec<ScheduledKeyStatus>,
    /// Every key the store has summed under, by slot.
    pub slots: Vec<String>,
}

/// One key of the schedule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduledKeyStatus {
    /// Its first day (days since 1970-01-01).
    pub from_day: u32,
    /// The key's id.
    pub key_id: String,
}

/// `close-epoch`: the epochs it closed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloseEpochsReply {
    /// The epochs closed, oldest first (empty when none held reports).
    pub closed: Vec<EpochReports>,
}

/// `export`: the bundle that follows the reply line, if any. On the wire `exported` (a bool)
/// says which, with the bundle's fields beside it, and `bytes` is 0 when nothing was exported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "ExportWire", try_from = "ExportWire")]
pub struct ExportReply {
    /// The bundle's length: the bytes that follow the reply line.
    pub bytes: usize,
    /// The bundle, or `None` when no epoch closed since the last export.
    pub bundle: Option<ExportedBundle>,
}

/// What an exported bundle holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportedBundle {
    /// Its number in the chain.
    pub seq: u64,
    /// The chain.
    pub instance: String,
    /// The epochs it releases.
    pub epochs: Vec<u32>,
    /// Sums released.
    pub entries: usize,
    /// Reports behind the released sums.
    pub reports: u64,
    /// Sums withheld under the contributor threshold.
    pub withheld_sums: u64,
    /// Reports behind the withheld sums.
    pub withheld_reports: u64,
    /// Reports of its epochs admitted with a token.
    pub reports_with_tokens: u64,
    /// Reports of its epochs.
    pub epoch_reports: u64,
    /// k contributors.
    pub threshold: u64,
    /// T reports per contributor per (counter, day).
    pub cap: u32,
    /// The signing key, hex.
    pub signer: String,
}

/// [`ExportReply`] on the wire.
#[derive(Serialize, Deserialize)]
struct ExportWire {
    exported: bool,
    bytes: usize,
    #[serde(flatten)]
    bundle: Option<ExportedBundle>,
}

impl From<ExportReply> for ExportWire {
    fn from(r: ExportReply) -> Self {
        Self {
            exported: r.bundle.is_some(),
            bytes: r.bytes,
            bundle: r.bundle,
        }
    }
}

impl TryFrom<ExportWire> for ExportReply {
    type Error = String;
    fn try_from(w: ExportWire) -> Result<Self, String> {
        match (w.exported, w.bundle) {
            (true, None) => Err("an export reply says exported without the bundle's fields".into()),
            (false, Some(_)) => Err("an export reply says not exported with a bundle".into()),
            (_, bundle) => Ok(Self {
                bytes: w.bytes,
                bundle,
            }),
        }
    }
}

/// Any reply: what [`super::execute`] returns. It is written as the reply alone (no tag);
/// the reader knows which to expect from its request ([`Reply::decode`]).
// One value per admin request, moved once: boxing the large status would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Reply {
    /// To [`super::Request::Status`].
    Status(StatusReply),
    /// To [`super::Request::Top`].
    Top(TopReply),
    /// To [`super::Request::Throttle`].
    Throttle(ThrottleReply),
    /// To [`super::Request::Compact`].
    Compact(CompactReply),
    /// To [`super::Request::Backup`].
    Backup(BackupReply),
    /// To [`super::Request::CloseEpochs`].
    CloseEpochs(CloseEpochsReply),
    /// To [`super::Request::Export`].
    Export(ExportReply),
    /// To [`super::Request::Evidence`].
    Evidence(EvidenceReply),
    /// To [`super::Request::ForgetEvidence`].
    ForgetEvidence(ForgetEvidenceReply),
    /// To [`super::Request::ReloadKeys`].
    ReloadKeys(ReloadKeysReply),
}

/// The CLI takes the reply its request calls for: `StatusReply::try_from(reply)`. Another
/// kind is a [`ControlError::Protocol`] (the server answered another request).
macro_rules! reply_kinds {
    ($($variant:ident($ty:ty)),* $(,)?) => {
        $(
            impl From<$ty> for Reply {
                fn from(r: $ty) -> Self {
                    Reply::$variant(r)
                }
            }

            impl TryFrom<Reply> for $ty {
                type Error = ControlError;
                fn try_from(reply: Reply) -> Result<Self, ControlError> {
                    match reply {
                        Reply::$variant(r) => Ok(r),
                        other => Err(ControlError::Protocol(format!(
                            "expected a {} reply, got {}",
                            stringify!($variant),
                            other.kind()
                        ))),
                    }
                }
            }
        )*

        impl Reply {
            /// The reply's kind, for messages.
            pub fn kind(&self) -> &'static str {
                match self {
                    $(Reply::$variant(_) => stringify!($variant),)*
                }
            }
        }
    };
}

reply_kinds! {
    Status(StatusReply),
    Top(TopReply),
    Throttle(ThrottleReply),
    Compact(CompactReply),
    Backup(BackupReply),
    CloseEpochs(CloseEpochsReply),
    Export(ExportReply),
    Evidence(EvidenceReply),
    ForgetEvidence(ForgetEvidenceReply),
    ReloadKeys(ReloadKeysReply),
}

/// The response line: `{"ok":true,"result":REPLY}` or `{"ok":false,"error":"..."}`.
#[derive(Serialize, Deserialize)]
struct Envelope<T> {
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<T>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// The most of an unreadable response line an error message quotes.
const QUOTED: usize = 200;

impl Reply {
    /// The response line (without its newline) that carries this reply. Fails only for a
    /// reply that JSON cannot hold (a path that is not UTF-8); the server sends
    /// [`Reply::error_line`] instead.
    pub fn to_line(&self) -> Result<String, ControlError> {
        serde_json::to_string(&Envelope {
            ok: true,
            result: Some(self),
            error: None,
        })
        .map_err(|e| ControlError::Failed(format!("the reply cannot be written: {e}")))
    }

    /// The response line (without its newline) that says a request failed.
    pub fn error_line(error: &ControlError) -> String {
        let envelope = Envelope::<()> {
            ok: false,
            result: None,
            error: Some(error.to_string()),
        };
        // A struct of a bool and a string: JSON always holds it.
        serde_json::to_string(&envelope)
            .unwrap_or_else(|_| r#"{"ok":false,"error":"unwritable error"}"#.to_string())
    }

    /// Reads the response line to `request`: its reply, or the server's error as
    /// [`ControlError::Failed`]. A line that is not such a response (garbled, cut short,
    /// another reply than the request calls for) is a [`ControlError::Protocol`].
    pub fn decode(request: &super::Request, line: &str) -> Result<Reply, ControlError> {
        use super::Request as R;
        Ok(match request {
            R::Status => Reply::Status(open(line)?),
            R::Top { .. } => Reply::Top(open(line)?),
            R::Throttle { .. } => Reply::Throttle(open(line)?),
            R::Compact => Reply::Compact(open(line)?),
            R::Backup { .. } => Reply::Backup(open(line)?),
            R::CloseEpochs => Reply::CloseEpochs(open(line)?),
            R::Export { .. } => Reply::Export(open(line)?),
            R::Evidence { .. } => Reply::Evidence(open(line)?),
            R::ForgetEvidence { .. } => Reply::ForgetEvidence(open(line)?),
            R::ReloadKeys => Reply::ReloadKeys(open(line)?),
        })
    }
}

/// The reply of type `T` in a response line.
fn open<T: serde::de::DeserializeOwned>(line: &str) -> Result<T, ControlError> {
    if line.trim().is_empty() {
        return Err(ControlError::Protocol(
            "the server closed the connection without a response".into(),
        ));
    }
    let envelope: Envelope<T> = serde_json::from_str(line).map_err(|e| {
        let quoted: String = line.trim_end().chars().take(QUOTED).collect();
        ControlError::Protocol(format!("unreadable response ({e}): {quoted:?}"))
    })?;
    match envelope {
        Envelope {
            ok: true,
            result: Some(reply),
            ..
        } => Ok(reply),
        Envelope { ok: true, .. } => Err(ControlError::Protocol(
            "a response says ok without a result".into(),
        )),
        Envelope { error, .. } => Err(ControlError::Failed(
            error.unwrap_or_else(|| "unknown error".into()),
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::super::Request;
    use super::*;

    /// Every kind of reply, with the wire form the admin commands' `--json` output has.
    fn samples() -> Vec<(Request, Reply, &'static str)> {
        let store = vec![StoreTable {
            table: "spent".into(),
            keys: 3,
            disk_bytes: 4096,
            memtable_bytes: 512,
        }];
        let status = StatusReply {
            serving: true,
            healthy: true,
            admission: Some(AdmissionStatus {
                admission: AdmissionDescription::Tokens {
                    key_ring: Some("/etc/penrose/token-keys".into()),
                    keys: 4,
                    epochs: vec![20000, 20001],
                    covers_today: true,
                    covers_tomorrow: false,
                },
                tokens_verified: 7,
            }),
            spent_tokens: Some(3),
            key_id: Some("0123456789abcdef".into()),
            design_keys: DesignKeysStatus {
                list_sequence: Some(2),
                list_file: Some("/etc/penrose/keys.list".into()),
                grace_days: 2,
                schedule: vec![ScheduledKeyStatus {
                    from_day: 20000,
                    key_id: "0123456789abcdef".into(),
                }],
                slots: vec!["0123456789abcdef".into()],
            },
            cursor: 12,
            reports_accepted_total: 13,
            classes: 2,
            merged_classes: 0,
            snippets: 5,
            open_accumulators: 3,
            held_accumulators_max: 4096,
            accumulator_loads: 1,
            accumulator_evictions: 0,
            instance: "00112233445566778899aabbccddeeff".into(),
            epoch_policy: "day".into(),
            open_epochs: vec![EpochReports {
                epoch: 20000,
                reports: 13,
                days: 1,
            }],
            closed_through: None,
            release: ReleaseRule::default(),
            new_classes: NewClasses {
                per_hour: 60,
                available: 58,
            },
            seen_floor_day: 19990,
            table_heap_bytes: 65536,
            throttle_permille: 800,
            since_start: SinceStart {
                accepted: 13,
                batches: 2,
                duplicates: 1,
                rejected: [("malformed".to_string(), 1), ("stale".to_string(), 0)].into(),
            },
            store: store.clone(),
        };
        let exported = ExportedBundle {
            seq: 1,
            instance: "00112233445566778899aabbccddeeff".into(),
            epochs: vec![20000],
            entries: 0,
            reports: 0,
            withheld_sums: 3,
            withheld_reports: 13,
            reports_with_tokens: 13,
            epoch_reports: 13,
            threshold: 10,
            cap: 24,
            signer: "ab".repeat(32),
        };
        vec![
            (
                Request::Status,
                Reply::Status(status.clone()),
                r#"{"serving":true,"healthy":true,
                "admission":{"mode":"tokens","key_ring":"/etc/penrose/token-keys","keys":4,
                    "epochs":[20000,20001],"covers_today":true,"covers_tomorrow":false,
                    "tokens_verified":7},
                "spent_tokens":3,"key_id":"0123456789abcdef",
                "design_keys":{"list_sequence":2,"list_file":"/etc/penrose/keys.list","grace_days":2,
                    "schedule":[{"from_day":20000,"key_id":"0123456789abcdef"}],
                    "slots":["0123456789abcdef"]},"cursor":12,
                "reports_accepted_total":13,"classes":2,"merged_classes":0,"snippets":5,
                "open_accumulators":3,"held_accumulators_max":4096,"accumulator_loads":1,
                "accumulator_evictions":0,"instance":"00112233445566778899aabbccddeeff",
                "epoch_policy":"day","open_epochs":[{"epoch":20000,"reports":13,"days":1}],
                "closed_through":null,"release":{"threshold":10,"reports_per_contributor":24},
                "new_classes":{"per_hour":60,"available":58},"seen_floor_day":19990,
                "table_heap_bytes":65536,"throttle_permille":800,
                "since_start":{"accepted":13,"batches":2,"duplicates":1,
                    "rejected":{"malformed":1,"stale":0}},
                "store":[{"table":"spent","keys":3,"disk_bytes":4096,"memtable_bytes":512}]}"#,
            ),
            (
                Request::Status,
                Reply::Status(StatusReply {
                    serving: true,
                    admission: Some(AdmissionStatus {
                        admission: AdmissionDescription::Open,
                        tokens_verified: 0,
                    }),
                    ..status.clone()
                }),
                "",
            ),
            (
                Request::Status,
                Reply::Status(StatusReply {
                    serving: false,
                    admission: None,
                    spent_tokens: None,
                    closed_through: Some(19999),
                    ..status
                }),
                "",
            ),
            (
                Request::Top { limit: 1 },
                Reply::Top(TopReply {
                    classes: 2,
                    top: vec![TopClass {
                        class: 0,
                        reports: 6,
                        snippets: 1,
                        representatives: 1,
                        first_seen_day: 20000,
                    }],
                }),
                r#"{"classes":2,"top":[{"class":0,"reports":6,"snippets":1,
                    "representatives":1,"first_seen_day":20000}]}"#,
            ),
            (
                Request::Throttle { permille: 800 },
                Reply::Throttle(ThrottleReply {
                    throttle_permille: 800,
                }),
                r#"{"throttle_permille":800}"#,
            ),
            (
                Request::Compact,
                Reply::Compact(CompactReply {
                    compacted: true,
                    store,
                }),
                r#"{"compacted":true,
                    "store":[{"table":"spent","keys":3,"disk_bytes":4096,"memtable_bytes":512}]}"#,
            ),
            (
                Request::Backup {
                    dir: "/backup/db".into(),
                },
                Reply::Backup(BackupReply {
                    backup: "/backup/db".into(),
                    instance: "ffeeddccbbaa99887766554433221100".into(),
                    parent: "00112233445566778899aabbccddeeff".into(),
                    released_elsewhere: vec![20000, 20001],
                }),
                r#"{"backup":"/backup/db","instance":"ffeeddccbbaa99887766554433221100",
                    "parent":"00112233445566778899aabbccddeeff",
                    "released_elsewhere":[20000,20001]}"#,
            ),
            (
                Request::Evidence {
                    seq: 3,
                    out: "/srv/0003.evidence".into(),
                },
                Reply::Evidence(EvidenceReply {
                    evidence: "/srv/0003.evidence".into(),
                    seq: 3,
                    entries: 2,
                    reports: 720,
                    with_tokens: 715,
                    bytes: 1_028_000,
                }),
                r#"{"evidence":"/srv/0003.evidence","seq":3,"entries":2,"reports":720,
                    "with_tokens":715,"bytes":1028000}"#,
            ),
            (
                Request::ForgetEvidence { through: 4 },
                Reply::ForgetEvidence(ForgetEvidenceReply {
                    through: 4,
                    epochs: vec![20000, 20001],
                    rows: 1440,
                }),
                r#"{"through":4,"epochs":[20000,20001],"rows":1440}"#,
            ),
            (
                Request::CloseEpochs,
                Reply::CloseEpochs(CloseEpochsReply {
                    closed: vec![EpochReports {
                        epoch: 20000,
                        reports: 13,
                        days: 1,
                    }],
                }),
                r#"{"closed":[{"epoch":20000,"reports":13,"days":1}]}"#,
            ),
            (
                Request::CloseEpochs,
                Reply::CloseEpochs(CloseEpochsReply { closed: vec![] }),
                r#"{"closed":[]}"#,
            ),
            (
                Request::Export { seq: None },
                Reply::Export(ExportReply {
                    bytes: 0,
                    bundle: None,
                }),
                r#"{"exported":false,"bytes":0}"#,
            ),
            (
                Request::Export { seq: Some(1) },
                Reply::Export(ExportReply {
                    bytes: 1234,
                    bundle: Some(exported),
                }),
                r#"{"exported":true,"bytes":1234,"seq":1,
                    "instance":"00112233445566778899aabbccddeeff","epochs":[20000],"entries":0,
                    "reports":0,"withheld_sums":3,"withheld_reports":13,
                    "reports_with_tokens":13,"epoch_reports":13,"threshold":10,"cap":24,
                    "signer":"abababababababababababababababababababababababababababababababab"}"#,
            ),
            (
                Request::ReloadKeys,
                Reply::ReloadKeys(ReloadKeysReply {
                    admission: AdmissionDescription::Tokens {
                        key_ring: None,
                        keys: 1,
                        epochs: vec![20000],
                        covers_today: true,
                        covers_tomorrow: true,
                    },
                    design_keys: DesignKeysStatus {
                        list_sequence: Some(2),
                        list_file: Some("/etc/penrose/keys.list".into()),
                        grace_days: 2,
                        schedule: vec![ScheduledKeyStatus {
                            from_day: 20000,
                            key_id: "0123456789abcdef".into(),
                        }],
                        slots: vec!["0123456789abcdef".into()],
                    },
                }),
                r#"{"admission":{"mode":"tokens","key_ring":null,"keys":1,"epochs":[20000],
                    "covers_today":true,"covers_tomorrow":true},
                    "design_keys":{"list_sequence":2,"list_file":"/etc/penrose/keys.list","grace_days":2,
                    "schedule":[{"from_day":20000,"key_id":"0123456789abcdef"}],
                    "slots":["0123456789abcdef"]}}"#,
            ),
            (
                Request::ReloadKeys,
                Reply::ReloadKeys(ReloadKeysReply {
                    admission: AdmissionDescription::Open,
                    design_keys: DesignKeysStatus {
                        list_sequence: Some(2),
                        list_file: Some("/etc/penrose/keys.list".into()),
                        grace_days: 2,
                        schedule: vec![ScheduledKeyStatus {
                            from_day: 20000,
                            key_id: "0123456789abcdef".into(),
                        }],
                        slots: vec!["0123456789abcdef".into()],
                    },
                }),
                r#"{"admission":{"mode":"open"},"design_keys":{"list_sequence":2,"list_file":"/etc/penrose/keys.list","grace_days":2,
                    "schedule":[{"from_day":20000,"key_id":"0123456789abcdef"}],
                    "slots":["0123456789abcdef"]}}"#,
            ),
        ]
    }

    #[test]
    fn every_reply_has_its_wire_form_and_reads_back_equal() {
        for (request, reply, wire) in samples() {
            let written = serde_json::to_value(&reply).unwrap();
            if !wire.is_empty() {
                let expected: serde_json::Value = serde_json::from_str(wire).unwrap();
                assert_eq!(written, expected, "{request:?}");
            }
            // Through the response line, as the CLI reads it.
            let line = reply.to_line().unwrap();
            assert!(line.starts_with(r#"{"ok":true,"result":{"#), "{line}");
            assert_eq!(Reply::decode(&request, &line).unwrap(), reply, "{line}");
            // And each type on its own, as readers of `--json` output do.
            let text = serde_json::to_string(&reply).unwrap();
            let back = match &reply {
                Reply::Status(_) => serde_json::from_str::<StatusReply>(&text).map(Reply::from),
                Reply::Top(_) => serde_json::from_str::<TopReply>(&text).map(Reply::from),
                Reply::Throttle(_) => serde_json::from_str::<ThrottleReply>(&text).map(Reply::from),
                Reply::Compact(_) => serde_json::from_str::<CompactReply>(&text).map(Reply::from),
                Reply::Backup(_) => serde_json::from_str::<BackupReply>(&text).map(Reply::from),
                Reply::CloseEpochs(_) => {
                    serde_json::from_str::<CloseEpochsReply>(&text).map(Reply::from)
                }
                Reply::Export(_) => serde_json::from_str::<ExportReply>(&text).map(Reply::from),
                Reply::Evidence(_) => serde_json::from_str::<EvidenceReply>(&text).map(Reply::from),
                Reply::ForgetEvidence(_) => {
                    serde_json::from_str::<ForgetEvidenceReply>(&text).map(Reply::from)
                }
                Reply::ReloadKeys(_) => {
                    serde_json::from_str::<ReloadKeysReply>(&text).map(Reply::from)
                }
            };
            assert_eq!(back.unwrap(), reply, "{text}");
        }
    }

    #[test]
    fn the_since_start_line_of_text_status_keeps_its_sorted_keys() {
        let since = SinceStart {
            accepted: 1,
            batches: 2,
            duplicates: 3,
            rejected: [("stale".to_string(), 5), ("malformed".to_string(), 4)].into(),
        };
        assert_eq!(
            serde_json::to_string(&since).unwrap(),
            r#"{"accepted":1,"batches":2,"duplicates":3,"rejected":{"malformed":4,"stale":5}}"#
        );
    }

    #[test]
    fn a_failed_request_reads_back_as_its_error() {
        let line = Reply::error_line(&ControlError::Failed("1200 permille is above 1000".into()));
        let e = Reply::decode(&Request::Throttle { permille: 1200 }, &line).unwrap_err();
        assert!(
            matches!(&e, ControlError::Failed(m) if m == "1200 permille is above 1000"),
            "{e:?}"
        );
        // An error without words still fails, in words.
        let e = Reply::decode(&Request::Status, r#"{"ok":false}"#).unwrap_err();
        assert!(
            matches!(&e, ControlError::Failed(m) if m == "unknown error"),
            "{e:?}"
        );
    }

    #[test]
    fn a_garbled_or_unexpected_response_is_a_protocol_error() {
        let throttle = ThrottleReply {
            throttle_permille: 800,
        };
        let throttle_line = Reply::from(throttle).to_line().unwrap();
        let cases: [(&Request, &str, &str); 7] = [
            (&Request::Status, "", "without a response"),
            (&Request::Status, "\n", "without a response"),
            (
                &Request::Status,
                "HTTP/1.1 400 Bad Request\r\n",
                "unreadable response",
            ),
            (
                &Request::Status,
                r#"{"ok":true,"result":{"serv"#,
                "unreadable response",
            ),
            (&Request::Compact, r#"{"ok":true}"#, "ok without a result"),
            // The reply to another request.
            (&Request::Status, &throttle_line, "unreadable response"),
            (
                &Request::Export { seq: None },
                r#"{"ok":true,"result":{"exported":true,"bytes":10}}"#,
                "without the bundle's fields",
            ),
        ];
        for (request, line, says) in cases {
            match Reply::decode(request, line) {
                Err(e @ ControlError::Protocol(_)) => {
                    assert!(e.to_string().contains(says), "{line:?}: {e}")
                }
                other => panic!("{line:?}: {other:?}"),
            }
        }
        // A long garbled line is quoted, not copied whole into the message.
        let long = "x".repeat(10_000);
        let e = Reply::decode(&Request::Status, &long).unwrap_err();
        assert!(e.to_string().len() < 400, "{e}");
    }

    #[test]
    fn the_cli_takes_only_the_reply_its_request_calls_for() {
        let reply = Reply::from(ThrottleReply {
            throttle_permille: 5,
        });
        assert_eq!(
            ThrottleReply::try_from(reply.clone()).unwrap(),
            ThrottleReply {
                throttle_permille: 5
            }
        );
        let e = StatusReply::try_from(reply).unwrap_err();
        assert!(
            matches!(&e, ControlError::Protocol(m) if m == "expected a Status reply, got Throttle"),
            "{e:?}"
        );
    }
}
