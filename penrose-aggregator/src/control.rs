//! The admin channel: requests from the CLI (`status`, `top`, `throttle`, `compact`,
//! `backup`, `export`, `reload-keys`) executed against a running server over a Unix socket in
//! its data directory, or, when no server runs, against the data directory opened directly
//! (`reload-keys` needs a running server).
//!
//! Both paths run the same [`execute`] on the same [`Admin`] context, so an admin command
//! behaves the same whether the server is up or not. The socket is created 0600 inside the
//! 0700 data directory: whoever may read the data directory may administer the server, and
//! nobody else. Protocol: one JSON request line; one JSON response line; for `export`, the
//! response line is followed by the bundle's bytes (its length is in the line).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ed25519_dalek::SigningKey;
use penrose_core::wire::ThrottleHint;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use thiserror::Error;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tracing::warn;

use crate::admission::{Admission, TokenRing};
use crate::export::{self, ReleaseConfig};
use crate::ingest::{Ingest, today};
use crate::metrics::reason_label;
use crate::store::Store;

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
    /// Reads the admission key ring file again (a running server admitting by tokens).
    ReloadKeys,
}

/// Why an admin request failed.
#[derive(Debug, Error)]
pub enum ControlError {
    /// The request's own failure, in words.
    #[error("{0}")]
    Failed(String),
    /// The socket failed.
    #[error("control socket {path}: {source}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
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
    pub release: ReleaseConfig,
    /// Whether a server is serving (false when the CLI opened the data directory itself).
    pub serving: bool,
}

/// A response: the JSON line, and for `export` the bundle.
pub struct Response {
    /// The JSON answer.
    pub json: Value,
    /// The bundle bytes (export only).
    pub payload: Option<Vec<u8>>,
}

/// Runs one request. Blocking (store scans, compaction): call it off the async threads.
pub fn execute(admin: &Admin, request: &Request) -> Result<Response, ControlError> {
    let fail = |e: &dyn std::fmt::Display| ControlError::Failed(e.to_string());
    let json = match request {
        Request::Status => status(admin),
        Request::Top { limit } => {
            let state = admin.ingest.state();
            let rows: Vec<Value> = state
                .tables()
                .top(*limit)
                .into_iter()
                .map(|(class, entry)| {
                    json!({
                        "class": class.0,
                        "reports": entry.reports,
                        "snippets": entry.snippets,
                        "representatives": entry.representatives.len(),
                        "first_seen_day": entry.first_seen.0,
                    })
                })
                .collect();
            json!({ "classes": state.tables().class_count(), "top": rows })
        }
        Request::Throttle { permille } => {
            let hint = ThrottleHint::from_permille(*permille).ok_or_else(|| {
                ControlError::Failed(format!("{permille} permille is above 1000"))
            })?;
            admin.ingest.set_throttle(hint).map_err(|e| fail(&e))?;
            json!({ "throttle_permille": hint.permille() })
        }
        Request::Compact => {
            admin.store.compact().map_err(|e| fail(&e))?;
            json!({ "compacted": true, "store": admin.store.sizes() })
        }
        Request::Backup { dir } => {
            admin.store.backup(dir).map_err(|e| fail(&e))?;
            let instance = admin.ingest.state().instance();
            let copy = crate::store::RocksStore::open(dir).map_err(|e| fail(&e))?;
            let new = export::make_new_instance(&copy, instance).map_err(|e| fail(&e))?;
            json!({ "backup": dir, "instance": new.to_string(), "parent": instance.to_string() })
        }
        Request::ReloadKeys => {
            if !admin.serving {
                return Err(ControlError::Failed(
                    "no server is running here; `serve` reads the key ring when it starts".into(),
                ));
            }
            reload_keys(&admin.ingest)?;
            json!({
                "admission": admin.ingest.admission().describe(today()),
                "design_keys": describe_design_keys(&admin.ingest.design_keys()),
            })
        }
        Request::CloseEpochs => {
            let closed = admin.ingest.close_epochs(true).map_err(|e| fail(&e))?;
            let epochs: Vec<Value> = closed
                .iter()
                .map(|e| json!({ "epoch": e.id.0, "reports": e.reports, "days": e.days() }))
                .collect();
            json!({ "closed": epochs })
        }
        Request::Export { seq } => {
            let made = match seq {
                Some(seq) => {
                    Some(export::reexport(admin.store.as_ref(), *seq, &admin.signing)).transpose()
                }
                None => export::export(admin.store.as_ref(), admin.release, &admin.signing),
            }
            .map_err(|e| fail(&e))?;
            let Some((bundle, bytes)) = made else {
                return Ok(Response {
                    json: json!({ "exported": false, "bytes": 0 }),
                    payload: None,
                });
            };
            return Ok(Response {
                json: json!({
                    "exported": true,
                    "bytes": bytes.len(),
                    "seq": bundle.link.seq,
                    "instance": bundle.link.instance.to_string(),
                    "epochs": bundle.epochs.iter().map(|e| e.id.0).collect::<Vec<_>>(),
                    "entries": bundle.entries.len(),
                    "reports": bundle.entries.iter().map(|e| e.reports).sum::<u64>(),
                    "withheld_sums": bundle.epochs.iter().map(|e| u64::from(e.withheld_sums)).sum::<u64>(),
                    "withheld_reports": bundle.epochs.iter().map(|e| e.withheld_reports).sum::<u64>(),
                    "reports_with_tokens": bundle.epochs.iter().map(|e| e.reports_with_tokens).sum::<u64>(),
                    "epoch_reports": bundle.epochs.iter().map(|e| e.reports).sum::<u64>(),
                    "threshold": bundle.rule.threshold,
                    "cap": bundle.rule.cap,
                    "signer": export::hex(&bundle.signer),
                }),
                payload: Some(bytes),
            });
        }
    };
    Ok(Response {
        json,
        payload: None,
    })
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
pub fn describe_design_keys(keys: &crate::design_keys::DesignKeys) -> Value {
    let list = keys.list();
    json!({
        "list_sequence": keys.signed().map(|_| list.sequence()),
        "list_file": keys.source().map(|s| s.list.display().to_string()),
        "grace_days": list.grace_days(),
        "schedule": list.keys().iter().map(|k| json!({
            "from_day": k.from.0, "key_id": k.key.key_id().to_string(),
        })).collect::<Vec<_>>(),
        "slots": keys.by_slot().iter().map(|k| k.key_id().to_string()).collect::<Vec<_>>(),
    })
}

fn status(admin: &Admin) -> Value {
    use std::sync::atomic::Ordering::Relaxed;
    let mut state = admin.ingest.state();
    let budget = state.new_class_budget();
    let new_classes = json!({
        "per_hour": budget.per_hour().get(),
        "available": budget.available(std::time::Instant::now()),
    });
    let metrics = admin.ingest.metrics();
    let rejected: serde_json::Map<String, Value> = crate::metrics::REASONS
        .into_iter()
        .map(|r| {
            (
                reason_label(r).to_string(),
                json!(metrics.rejected_count(r)),
            )
        })
        .collect();
    let spent_keys = admin
        .store
        .sizes()
        .iter()
        .find(|t| t.table == crate::store::Table::Spent.name())
        .map(|t| t.keys);
    // Offline (no server) nothing is admitted, whatever the server would do.
    let admission = if admin.serving {
        let mut described = admin.ingest.admission().describe(today());
        described["tokens_verified"] = json!(metrics.tokens_verified.load(Relaxed));
        described
    } else {
        Value::Null
    };
    json!({
        "serving": admin.serving,
        "healthy": admin.ingest.is_healthy(),
        "admission": admission,
        "spent_tokens": spent_keys,
        "key_id": state.keys().current(today()).map(|k| k.key_id().to_string()),
        "design_keys": describe_design_keys(state.keys()),
        "cursor": state.cursor().0,
        "reports_accepted_total": state.accepted(),
        "classes": state.tables().class_count(),
        "merged_classes": state.tables().merges().len(),
        "snippets": state.tables().snippet_count(),
        "open_accumulators": state.sums().open_count(),
        "held_accumulators_max": state.sums().capacity(),
        "accumulator_loads": state.sums().loads(),
        "accumulator_evictions": state.sums().evictions(),
        "instance": state.instance().to_string(),
        "epoch_policy": state.epochs().policy().to_string(),
        "open_epochs": state.epochs().open().map(|e| json!({
            "epoch": e.id.0, "reports": e.reports, "days": e.days(),
        })).collect::<Vec<_>>(),
        "closed_through": state.epochs().closed_through().map(|e| e.0),
        "release": {
            "threshold": admin.release.threshold.get(),
            "reports_per_contributor": admin.release.cap.get(),
        },
        "new_classes": new_classes,
        "seen_floor_day": state.seen_floor().0,
        "table_heap_bytes": state.tables().heap_bytes(),
        "throttle_permille": admin.ingest.throttle().permille(),
        "since_start": {
            "accepted": metrics.accepted.load(Relaxed),
            "duplicates": metrics.duplicates.load(Relaxed),
            "rejected": rejected,
            "batches": metrics.batches.load(Relaxed),
        },
        "store": admin.store.sizes(),
    })
}

/// Serves admin requests on `path` until the task is dropped.
pub async fn serve_socket(path: &Path, admin: Admin) -> Result<(), ControlError> {
    let io = |source| ControlError::Io {
        path: path.to_path_buf(),
        source,
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
    let (json, payload) = match response {
        Ok(r) => (json!({ "ok": true, "result": r.json }), r.payload),
        Err(e) => (json!({ "ok": false, "error": e.to_string() }), None),
    };
    let mut out = json.to_string();
    out.push('\n');
    write.write_all(out.as_bytes()).await?;
    if let Some(bytes) = payload {
        write.write_all(&bytes).await?;
    }
    write.shutdown().await
}

/// Sends one request to the server listening on `path`. `Ok(None)` when no server listens
/// there (no socket, or a stale one).
pub async fn request(path: &Path, request: &Request) -> Result<Option<Response>, ControlError> {
    let io = |source| ControlError::Io {
        path: path.to_path_buf(),
        source,
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
    let mut head = String::new();
    reader.read_line(&mut head).await.map_err(io)?;
    let value: Value =
        serde_json::from_str(&head).map_err(|e| ControlError::Protocol(e.to_string()))?;
    if value["ok"] != json!(true) {
        return Err(ControlError::Failed(
            value["error"]
                .as_str()
                .unwrap_or("unknown error")
                .to_string(),
        ));
    }
    let result = value["result"].clone();
    let payload = match request {
        Request::Export { .. } if result["exported"] == json!(true) => {
            let len = result["bytes"]
                .as_u64()
                .ok_or_else(|| ControlError::Protocol("export without a length".into()))?;
            let mut bytes = Vec::new();
            reader.read_to_end(&mut bytes).await.map_err(io)?;
            if bytes.len() as u64 != len {
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
    Ok(Some(Response {
        json: result,
        payload,
    }))
}
