//! The admin channel: requests from the CLI (`status`, `top`, `throttle`, `compact`,
//! `backup`, `export`, `export-evidence`, `forget-evidence`, `reload-keys`) executed against a
//! running server
//! over a Unix socket in its data directory, or, when no server runs, against the data
//! directory opened directly (`reload-keys` needs a running server).
//!
//! Both paths run the same [`execute`] on the same [`Admin`] context, so an admin command
//! behaves the same whether the server is up or not. The socket is created 0600 inside the
//! 0700 data directory: whoever may read the data directory may administer the server, and
//! nobody else. Protocol: one JSON request line; one JSON response line ([`reply`]: the same
//! types on both ends); for `export`, the response line is followed by the bundle's bytes (its
//! length is in the line).

use penrose_kv::Table as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ed25519_dalek::SigningKey;
use penrose_core::wire::ThrottleHint;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tracing::warn;

use crate::admission::{Admission, TokenRing};
use crate::export;
use crate::ingest::Ingest;
use crate::metrics::reason_label;
use crate::store::Store;
use penrose_core::release::ReleaseRule;
use penrose_host::clock::today;

pub mod reply;

use reply::{
    AdmissionStatus, BackupReply, CloseEpochsReply, CompactReply, DesignKeysStatus, EpochReports,
    EvidenceReply, ExportReply, ExportedBundle, ForgetEvidenceReply, NewClasses, ReloadKeysReply,
    Reply, ScheduledKeyStatus, SinceStart, StatusReply, StoreTable, ThrottleReply, TopClass,
    TopReply,
};

/// One admin request.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// Counters, tables, store sizes.
    Status,
    /// The classes with the most reports.
    Top {
        /// How many.
        limit: usize,
    },
    /// Sets the rate every ack asks agents for.
    Throttle {
        /// Thousandths of the normal rate.
        permille: u16,
    },
    /// Compacts the store.
    Compact,
    /// A consistent copy of the store into `dir`, made a new instance (a restore from it is
    /// a new bundle chain).
    Backup {
        /// Target directory (must not exist).
        dir: PathBuf,
    },
    /// Closes every open epoch that holds reports now.
    CloseEpochs,
    /// The next bundle of the chain (epochs closed since the last export), or with `seq`
    /// that bundle again.
    Export {
        /// Write bundle `seq` again instead of the next one.
        seq: Option<u64>,
    },
    /// Writes the contributor evidence of bundle `seq` to the file `out` (replaced whole:
    /// written beside it, synced, renamed), for the release auditor.
    Evidence {
        /// The bundle.
        seq: u64,
        /// The file (an absolute path: the server's working directory is not the CLI's).
        out: PathBuf,
    },
    /// Deletes the evidence of the epochs released in bundles 1 to `through`: the auditor has
    /// answered them.
    ForgetEvidence {
        /// The last bundle the auditor answered.
        through: u64,
    },
    /// Reads the admission key ring file again (a running server admitting by tokens).
    ReloadKeys,
}

/// Why an admin request failed.
#[derive(Debug, Error)]
pub enum ControlError {
    /// The request's own failure, in words.
    #[error("{0}")]
    Failed(String),
    /// A file was not read or written.
    #[error("control socket {0}")]
    File(#[from] penrose_host::FileError),
    /// The peer sent something that is not a response.
    #[error("control protocol: {0}")]
    Protocol(String),
}

/// What admin requests run against.
#[derive(Clone)]
pub struct Admin {
    /// The ingest pipeline (and through it the state and metrics).
    pub ingest: Ingest,
    /// The store.
    pub store: Arc<dyn Store>,
    /// The export signing key.
    pub signing: SigningKey,
    /// The release rule exports apply.
    pub release: ReleaseRule,
    /// Whether a server is serving (false when the CLI opened the data directory itself).
    pub serving: bool,
}

/// A request's outcome: its reply, and for `export` the bundle.
#[derive(Debug)]
pub struct Response {
    /// The reply (the response line's `result`).
    pub reply: Reply,
    /// The bundle bytes (export only).
    pub payload: Option<Vec<u8>>,
}

impl Response {
    /// A reply without a payload.
    fn of(reply: impl Into<Reply>) -> Self {
        Self {
            reply: reply.into(),
            payload: None,
        }
    }
}

/// Runs one request. Blocking (store scans, compaction): call it off the async threads.
pub fn execute(admin: &Admin, request: &Request) -> Result<Response, ControlError> {
    Ok(match request {
        Request::Status => Response::of(status(admin)),
        Request::Top { limit } => Response::of(top(admin, *limit)),
        Request::Throttle { permille } => Response::of(throttle(admin, *permille)?),
        Request::Compact => {
            admin.store.compact().map_err(failed)?;
            Response::of(CompactReply {
                compacted: true,
                store: store_tables(admin),
            })
        }
        Request::Backup { dir } => Response::of(backup(admin, dir)?),
        Request::Evidence { seq, out } => Response::of(write_evidence_file(admin, *seq, out)?),
        Request::ForgetEvidence { through } => Response::of(forget_evidence(admin, *through)?),
        Request::ReloadKeys => Response::of(reload(admin)?),
        Request::CloseEpochs => {
            let closed = admin.ingest.close_epochs(true).map_err(failed)?;
            Response::of(CloseEpochsReply {
                closed: closed.iter().map(epoch_reports).collect(),
            })
        }
        Request::Export { seq } => export_bundle(admin, *seq)?,
    })
}

/// A failure of the store, the ingest or the export, as the admin channel reports it.
fn failed(e: impl std::fmt::Display) -> ControlError {
    ControlError::Failed(e.to_string())
}

/// `top`: the `limit` classes with the most reports, and how many classes there are.
fn top(admin: &Admin, limit: usize) -> TopReply {
    let state = admin.ingest.state();
    let top = state
        .tables()
        .top(limit)
        .into_iter()
        .map(|(class, entry)| TopClass {
            class: class.0,
            reports: entry.reports,
            snippets: entry.snippets,
            representatives: entry.representatives.len(),
            first_seen_day: entry.first_seen.0,
        })
        .collect();
    TopReply {
        classes: state.tables().class_count(),
        top,
    }
}

/// `throttle`: the hint acks carry from now on (at most 1000 permille).
fn throttle(admin: &Admin, permille: u16) -> Result<ThrottleReply, ControlError> {
    let hint = ThrottleHint::from_permille(permille)
        .ok_or_else(|| ControlError::Failed(format!("{permille} permille is above 1000")))?;
    admin.ingest.set_throttle(hint).map_err(failed)?;
    Ok(ThrottleReply {
        throttle_permille: hint.permille(),
    })
}

/// `backup`: a copy of the store in `dir`, made a new instance of its own
/// ([`crate::copies::make_new_instance`]).
fn backup(admin: &Admin, dir: &Path) -> Result<BackupReply, ControlError> {
    admin.store.backup(dir).map_err(failed)?;
    let copy = crate::store::RocksStore::open(dir).map_err(failed)?;
    let new = crate::copies::make_new_instance(&copy).map_err(failed)?;
    Ok(BackupReply {
        backup: dir.to_path_buf(),
        instance: new.instance.to_string(),
        parent: new.parent.to_string(),
        released_elsewhere: new.released_elsewhere.iter().map(|e| e.0).collect(),
    })
}

/// `reload-keys`: the running server reads its key ring and design keys again.
fn reload(admin: &Admin) -> Result<ReloadKeysReply, ControlError> {
    if !admin.serving {
        return Err(ControlError::Failed(
            "no server is running here; `serve` reads the key ring when it starts".into(),
        ));
    }
    reload_keys(&admin.ingest)?;
    Ok(ReloadKeysReply {
        admission: admin.ingest.admission().describe(today()),
        design_keys: describe_design_keys(&admin.ingest.design_keys()),
    })
}

/// `export`: the next bundle (none when nothing is due), or bundle `seq` again; the bundle's
/// bytes follow the reply.
fn export_bundle(admin: &Admin, seq: Option<u64>) -> Result<Response, ControlError> {
    let made = match seq {
        Some(seq) => Some(export::reexport(admin.store.as_ref(), seq, &admin.signing)).transpose(),
        None => export::export(admin.store.as_ref(), admin.release, &admin.signing),
    }
    .map_err(failed)?;
    Ok(match made {
        None => Response::of(ExportReply {
            bytes: 0,
            bundle: None,
        }),
        Some((bundle, bytes)) => Response {
            reply: Reply::Export(ExportReply {
                bytes: bytes.len(),
                bundle: Some(exported(&bundle)),
            }),
            payload: Some(bytes),
        },
    })
}

/// `export-evidence`: the file written beside `out`, synced, then renamed over it, so that a
/// reader never sees half of one.
fn write_evidence_file(admin: &Admin, seq: u64, out: &Path) -> Result<EvidenceReply, ControlError> {
    if !out.is_absolute() {
        return Err(ControlError::Failed(format!(
            "{} is not an absolute path",
            out.display()
        )));
    }
    let fail = |e: &dyn std::fmt::Display| ControlError::Failed(format!("{}: {e}", out.display()));
    let partial = out.with_extension("partial");
    let file = std::fs::File::create(&partial).map_err(|e| fail(&e))?;
    let mut writer = std::io::BufWriter::new(file);
    let written =
        export::write_evidence(admin.store.as_ref(), seq, &admin.signing, &mut writer, out)
            .and_then(|w| {
                let file = writer.into_inner().map_err(|e| {
                    export::ExportError::File(penrose_host::FileError::Io {
                        path: partial.clone(),
                        source: e.into_error(),
                    })
                })?;
                file.sync_all().map_err(|source| {
                    export::ExportError::File(penrose_host::FileError::Io {
                        path: partial.clone(),
                        source,
                    })
                })?;
                Ok(w)
            });
    let written = match written {
        Ok(w) => w,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(fail(&e));
        }
    };
    std::fs::rename(&partial, out).map_err(|e| fail(&e))?;
    penrose_host::durable::sync_dir(penrose_host::durable::parent(out)).map_err(|e| fail(&e))?;
    Ok(EvidenceReply {
        evidence: out.to_path_buf(),
        seq,
        entries: written.entries,
        reports: written.reports,
        with_tokens: written.with_tokens,
        bytes: written.bytes,
    })
}

/// `forget-evidence`: the evidence rows of the epochs released in bundles 1 to `through`.
fn forget_evidence(admin: &Admin, through: u64) -> Result<ForgetEvidenceReply, ControlError> {
    let fail = |e: &dyn std::fmt::Display| ControlError::Failed(e.to_string());
    let store = admin.store.as_ref();
    let epochs = export::epochs_exported_through(store, through).map_err(|e| fail(&e))?;
    let rows = crate::evidence::forget(store, &epochs).map_err(|e| fail(&e))?;
    Ok(ForgetEvidenceReply {
        through,
        epochs: epochs.iter().map(|e| e.0).collect(),
        rows,
    })
}

/// What `export` tells of the bundle it wrote.
fn exported(bundle: &penrose_core::bundle::Bundle) -> ExportedBundle {
    let epochs = &bundle.epochs;
    ExportedBundle {
        seq: bundle.link.seq,
        instance: bundle.link.instance.to_string(),
        epochs: epochs.iter().map(|e| e.id.0).collect(),
        entries: bundle.entries.len(),
        reports: bundle.entries.iter().map(|e| e.reports).sum(),
        withheld_sums: epochs.iter().map(|e| u64::from(e.withheld_sums)).sum(),
        withheld_reports: epochs.iter().map(|e| e.withheld_reports).sum(),
        reports_with_tokens: epochs.iter().map(|e| e.reports_with_tokens).sum(),
        epoch_reports: epochs.iter().map(|e| e.reports).sum(),
        threshold: bundle.rule.threshold,
        cap: bundle.rule.cap,
        signer: export::hex(&bundle.signer),
    }
}

fn epoch_reports(e: &crate::epochs::EpochRecord) -> EpochReports {
    EpochReports {
        epoch: e.id.0,
        reports: e.reports,
        days: e.days(),
    }
}

fn store_tables(admin: &Admin) -> Vec<StoreTable> {
    admin.store.sizes().iter().map(StoreTable::from).collect()
}

/// Reads the key ring file of a server admitting by tokens again and puts it in use (SIGHUP,
/// `reload-keys`); on any failure the ring in use stays. Blocking (reads a file).
pub fn reload_key_ring(ingest: &Ingest) -> Result<(), ControlError> {
    let admission = ingest.admission();
    let Admission::Tokens(ring) = admission.as_ref() else {
        return Err(ControlError::Failed(
            crate::state::StateError::OpenAdmission.to_string(),
        ));
    };
    let path = ring
        .path()
        .ok_or_else(|| ControlError::Failed("the key ring was not read from a file".into()))?
        .to_path_buf();
    let fresh = TokenRing::load(&path).map_err(|e| ControlError::Failed(e.to_string()))?;
    ingest
        .replace_key_ring(fresh)
        .map_err(|e| ControlError::Failed(e.to_string()))
}

/// Reads again what a running server reads from files and may replace: the admission key ring
/// (admission by tokens) and the design key list (keys from a list file). Either is refused,
/// leaving the one in use, when its file is refused; an error when there is neither.
pub fn reload_keys(ingest: &Ingest) -> Result<(), ControlError> {
    let by_tokens = ingest.admission().by_tokens();
    let from_list = ingest.design_keys().source().is_some();
    if !by_tokens && !from_list {
        return Err(ControlError::Failed(format!(
            "{}; and the design keys were not read from a key list file",
            crate::state::StateError::OpenAdmission
        )));
    }
    if from_list {
        ingest
            .reload_design_keys()
            .map_err(|e| ControlError::Failed(format!("design key list: {e}")))?;
    }
    if by_tokens {
        reload_key_ring(ingest)?;
    }
    Ok(())
}

/// The design keys a server applies, for `status` and `reload-keys`.
pub fn describe_design_keys(keys: &crate::design_keys::DesignKeys) -> DesignKeysStatus {
    let list = keys.list();
    DesignKeysStatus {
        list_sequence: keys.signed().map(|_| list.sequence()),
        list_file: keys.source().map(|s| s.list.display().to_string()),
        grace_days: list.grace_days(),
        schedule: list
            .keys()
            .iter()
            .map(|k| ScheduledKeyStatus {
                from_day: k.from.0,
                key_id: k.key.key_id().to_string(),
            })
            .collect(),
        slots: keys
            .by_slot()
            .iter()
            .map(|k| k.key_id().to_string())
            .collect(),
    }
}

fn status(admin: &Admin) -> StatusReply {
    use std::sync::atomic::Ordering::Relaxed;
    let mut state = admin.ingest.state();
    let budget = state.new_class_budget();
    let new_classes = NewClasses {
        per_hour: budget.per_hour().get(),
        available: budget.available(std::time::Instant::now()),
    };
    let metrics = admin.ingest.metrics();
    let rejected = crate::metrics::REASONS
        .into_iter()
        .map(|r| (reason_label(r).to_string(), metrics.rejected_count(r)))
        .collect();
    let store = store_tables(admin);
    let spent_tokens = store
        .iter()
        .find(|t| t.table == crate::store::Table::Spent.name())
        .map(|t| t.keys);
    // Offline (no server) nothing is admitted, whatever the server would do.
    let admission = admin.serving.then(|| AdmissionStatus {
        admission: admin.ingest.admission().describe(today()),
        tokens_verified: metrics.tokens_verified.load(Relaxed),
    });
    StatusReply {
        serving: admin.serving,
        healthy: admin.ingest.is_healthy(),
        admission,
        spent_tokens,
        key_id: state
            .keys()
            .current(today())
            .map(|k| k.key_id().to_string()),
        design_keys: describe_design_keys(state.keys()),
        cursor: state.cursor().0,
        reports_accepted_total: state.accepted(),
        classes: state.tables().class_count(),
        merged_classes: state.tables().merges().len(),
        snippets: state.tables().snippet_count(),
        open_accumulators: state.sums().open_count(),
        held_accumulators_max: state.sums().capacity(),
        accumulator_loads: state.sums().loads(),
        accumulator_evictions: state.sums().evictions(),
        instance: state.instance().to_string(),
        epoch_policy: state.epochs().policy().to_string(),
        open_epochs: state.epochs().open().map(epoch_reports).collect(),
        closed_through: state.epochs().closed_through().map(|e| e.0),
        release: admin.release,
        new_classes,
        seen_floor_day: state.seen_floor().0,
        table_heap_bytes: state.tables().heap_bytes(),
        throttle_permille: admin.ingest.throttle().permille(),
        since_start: SinceStart {
            accepted: metrics.accepted.load(Relaxed),
            batches: metrics.batches.load(Relaxed),
            duplicates: metrics.duplicates.load(Relaxed),
            rejected,
        },
        store,
    }
}

/// Serves admin requests on `path` until the task is dropped.
pub async fn serve_socket(path: &Path, admin: Admin) -> Result<(), ControlError> {
    let io = |source| {
        ControlError::File(penrose_host::FileError::Io {
            path: path.to_path_buf(),
            source,
        })
    };
    // A socket left by a server that was killed.
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).map_err(io)?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(io)?;
    loop {
        let (stream, _) = listener.accept().await.map_err(io)?;
        let admin = admin.clone();
        tokio::spawn(async move {
            if let Err(e) = answer(stream, admin).await {
                warn!(error = %e, "admin request failed");
            }
        });
    }
}

async fn answer(stream: UnixStream, admin: Admin) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    // One request line of at most 64 KiB.
    BufReader::new(read.take(64 * 1024))
        .read_line(&mut line)
        .await?;
    let response = match serde_json::from_str::<Request>(&line) {
        Err(e) => Err(ControlError::Failed(format!("bad request: {e}"))),
        Ok(request) => tokio::task::spawn_blocking(move || execute(&admin, &request))
            .await
            .unwrap_or_else(|e| Err(ControlError::Failed(e.to_string()))),
    };
    let (mut out, payload) = match &response {
        Ok(r) => match r.reply.to_line() {
            Ok(line) => (line, r.payload.as_deref()),
            // Said as an error, without the bundle.
            Err(e) => (Reply::error_line(&e), None),
        },
        Err(e) => (Reply::error_line(e), None),
    };
    out.push('\n');
    write.write_all(out.as_bytes()).await?;
    if let Some(bytes) = payload {
        write.write_all(bytes).await?;
    }
    write.shutdown().await
}

/// Sends one request to the server listening on `path`. `Ok(None)` when no server listens
/// there (no socket, or a stale one).
pub async fn request(path: &Path, request: &Request) -> Result<Option<Response>, ControlError> {
    let io = |source| {
        ControlError::File(penrose_host::FileError::Io {
            path: path.to_path_buf(),
            source,
        })
    };
    let mut stream = match UnixStream::connect(path).await {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(io(e)),
    };
    let mut line =
        serde_json::to_string(request).map_err(|e| ControlError::Protocol(e.to_string()))?;
    line.push('\n');
    stream.write_all(line.as_bytes()).await.map_err(io)?;
    let mut reader = BufReader::new(stream);
    let mut head = Vec::new();
    reader.read_until(b'\n', &mut head).await.map_err(io)?;
    let head = String::from_utf8(head)
        .map_err(|_| ControlError::Protocol("a response line that is not UTF-8".into()))?;
    let reply = Reply::decode(request, &head)?;
    let payload = match &reply {
        Reply::Export(ExportReply {
            bytes: len,
            bundle: Some(_),
        }) => {
            let mut bytes = Vec::new();
            reader.read_to_end(&mut bytes).await.map_err(io)?;
            if bytes.len() != *len {
                return Err(ControlError::Protocol(format!(
                    "bundle of {} bytes announced, {} received",
                    len,
                    bytes.len()
                )));
            }
            Some(bytes)
        }
        _ => None,
    };
    Ok(Some(Response { reply, payload }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A peer on the control socket that answers one request with `answer`.
    fn fake_server(path: &Path, answer: Vec<u8>) -> tokio::task::JoinHandle<()> {
        let listener = UnixListener::bind(path).unwrap();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            BufReader::new(read).read_line(&mut line).await.unwrap();
            write.write_all(&answer).await.unwrap();
            write.shutdown().await.unwrap();
        })
    }

    async fn ask(answer: &[u8], request: &Request) -> Result<Option<Response>, ControlError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control");
        let server = fake_server(&path, answer.to_vec());
        let outcome = super::request(&path, request).await;
        server.await.unwrap();
        outcome
    }

    #[tokio::test]
    async fn a_garbled_response_is_a_protocol_error_not_a_panic() {
        for answer in [
            &b"not json at all\n"[..],
            b"{\"ok\":true,\"result\":{\"throttle_permille\":\"fast\"}}\n",
            b"{\"ok\":true,\"result\":{\"throttle_permille\":800}",
            b"\xff\xfe\n",
            b"",
        ] {
            match ask(answer, &Request::Throttle { permille: 10 }).await {
                Err(e @ ControlError::Protocol(_)) => assert!(!e.to_string().is_empty()),
                other => panic!("{answer:?}: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn an_export_reply_brings_its_bundle_of_the_announced_length() {
        let reply = Reply::Export(ExportReply {
            bytes: 5,
            bundle: Some(ExportedBundle {
                seq: 1,
                instance: "00".repeat(16),
                epochs: vec![20000],
                entries: 1,
                reports: 12,
                withheld_sums: 0,
                withheld_reports: 0,
                reports_with_tokens: 12,
                epoch_reports: 12,
                threshold: 10,
                cap: 24,
                signer: "ab".repeat(32),
            }),
        });
        let mut answer = reply.to_line().unwrap().into_bytes();
        answer.push(b'\n');
        let export = Request::Export { seq: None };
        let mut whole = answer.clone();
        whole.extend_from_slice(b"12345");
        let r = ask(&whole, &export).await.unwrap().unwrap();
        assert_eq!((r.reply, r.payload), (reply, Some(b"12345".to_vec())));
        // Cut short.
        answer.extend_from_slice(b"123");
        match ask(&answer, &export).await {
            Err(ControlError::Protocol(m)) => assert!(m.contains("5 bytes announced, 3"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
