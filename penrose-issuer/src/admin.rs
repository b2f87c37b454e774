//! Administration: `init`, and `enrol`, `revoke` and `status`, which run against a running
//! issuer through its control socket (`STATE/control.sock`) or, when none runs, against the
//! store opened directly. Both paths run the same [`execute`], so a command behaves the same
//! either way.
//!
//! The socket is created 0600 inside the 0700 state directory: whoever may read the state
//! directory may administer the issuer, and nobody else. Protocol: one JSON [`Request`] line,
//! one JSON [`Reply`] line. Credentials never cross it: `enrol` makes the secret and writes the
//! host's file in the CLI, and sends only the credential's id.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use penrose_core::tokens::TokenScope;
use penrose_core::wire::Day;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tracing::warn;

use crate::credential::{CredentialId, IdPrefix};
use crate::error::IssuerError;
use crate::issuer::{Issuer, IssuerStats};
use crate::seed::MasterSeed;
use crate::state::StateDir;
use crate::store::{CredentialRecord, STORE_FORMAT, Store, Table, WriteSet, parse_issued_key};
use penrose_core::calendar::date_of;

/// The longest request or reply line on the control socket.
const MAX_LINE: u64 = 4 << 20;

/// Ids per enrol request on the control socket (larger fleets are sent in several).
pub const ENROL_CHUNK: usize = 1000;

/// One admin request.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// Enrols credentials by id (hex), all under one label.
    Enrol {
        /// The credentials' ids, full hex.
        ids: Vec<String>,
        /// The operator's label.
        label: Option<String>,
    },
    /// Revokes the one credential whose id starts with `id` (16 to 64 hex digits).
    Revoke {
        /// The id or its prefix.
        id: String,
    },
    /// Enrolled and revoked credentials, tokens issued per epoch.
    Status,
}

/// One admin reply.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// Credentials enrolled.
    Enrolled {
        /// How many.
        count: usize,
    },
    /// A credential revoked.
    Revoked {
        /// Its full id.
        id: String,
        /// Its short id.
        short_id: String,
        /// Whether it was revoked already (nothing changed then).
        already: bool,
        /// Its label, if it has one.
        label: Option<String>,
    },
    /// The issuer's status.
    Status(Status),
    /// The request failed.
    Error {
        /// Why.
        message: String,
        /// Whether the request itself was refused (an unknown or ambiguous id, a bad label),
        /// rather than the issuer failing.
        refused: bool,
    },
}

/// Tokens issued under one epoch.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct EpochIssued {
    /// The epoch (day number).
    pub epoch: u32,
    /// Its date.
    pub date: String,
    /// Tokens issued.
    pub tokens: u64,
    /// Credentials that got tokens.
    pub credentials: u64,
    /// Tokens per scope (counter id), by scope.
    pub per_scope: Vec<ScopeIssued>,
}

/// Tokens issued under one (epoch, scope).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ScopeIssued {
    /// The scope: a counter id.
    pub scope: u16,
    /// Tokens issued.
    pub tokens: u64,
}

/// What `status` shows.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Status {
    /// The state directory.
    pub state: PathBuf,
    /// Today (day number) and its date.
    pub today: u32,
    /// Today's date.
    pub date: String,
    /// The store format.
    pub store_format: u32,
    /// Credentials enrolled and not revoked.
    pub enrolled: u64,
    /// Credentials revoked.
    pub revoked: u64,
    /// The oldest epoch whose counts are kept.
    pub prune_floor: u32,
    /// Tokens issued per epoch still kept.
    pub epochs: Vec<EpochIssued>,
    /// Whether a running issuer answered (else the store was opened directly).
    pub serving: bool,
    /// The running issuer's counters since it started.
    pub since_start: Option<IssuerStats>,
}

/// What `init` made.
#[derive(Clone, Debug, Serialize)]
pub struct Initialised {
    /// The state directory.
    pub state: PathBuf,
    /// The seed file.
    pub seed: PathBuf,
    /// The store.
    pub store: PathBuf,
}

/// Creates a state directory: the directory (0700), a new master seed (0600) and an empty
/// store. Refuses a directory that already has either.
pub fn init(state: &StateDir) -> Result<Initialised, IssuerError> {
    state.create()?;
    let (seed_path, db) = (state.seed(), state.db());
    if std::fs::symlink_metadata(&seed_path).is_ok() || db.join("CURRENT").exists() {
        return Err(IssuerError::AlreadyInitialised(state.path().to_owned()));
    }
    let seed = MasterSeed::generate();
    seed.create(&seed_path)?;
    if let Err(e) = Store::create(&db, seed.id()) {
        // Nothing was issued with this seed: take it back so that `init` can be run again.
        let _ = std::fs::remove_file(&seed_path);
        return Err(e);
    }
    Ok(Initialised {
        state: state.path().to_owned(),
        seed: seed_path,
        store: db,
    })
}

/// Runs one request against a store. `serving` carries the running issuer's counters.
pub fn execute(
    store: &Store,
    state: &Path,
    today: Day,
    serving: Option<IssuerStats>,
    request: &Request,
) -> Result<Reply, IssuerError> {
    match request {
        Request::Enrol { ids, label } => {
            let ids = ids
                .iter()
                .map(|id| id.parse::<CredentialId>())
                .collect::<Result<Vec<_>, _>>()?;
            enrol(store, &ids, label.as_deref(), today)?;
            Ok(Reply::Enrolled { count: ids.len() })
        }
        Request::Revoke { id } => revoke(store, &id.parse()?, today),
        Request::Status => Ok(Reply::Status(status(store, state, today, serving)?)),
    }
}

/// Enrols `ids` on `today` under `label`, in one synced write. An id enrolled already keeps its
/// record (a revoked credential stays revoked).
pub fn enrol(
    store: &Store,
    ids: &[CredentialId],
    label: Option<&str>,
    today: Day,
) -> Result<(), IssuerError> {
    if let Some(label) = label {
        CredentialRecord::check_label(label)?;
    }
    let record = CredentialRecord {
        enrolled: today,
        revoked: None,
        label: label.map(str::to_owned),
    };
    let mut set = WriteSet::new();
    for id in ids {
        if store.credential(id)?.is_none() {
            set.put(Table::Credentials, id.0, record.encode());
        }
    }
    if !set.is_empty() {
        store.write(set)?;
    }
    Ok(())
}

/// Revokes the one credential whose id starts with `prefix`: from the next request on, it is
/// answered `UnknownCredential`.
pub fn revoke(store: &Store, prefix: &IdPrefix, today: Day) -> Result<Reply, IssuerError> {
    let mut found: Vec<(CredentialId, CredentialRecord)> = Vec::new();
    store.scan(&[Table::Credentials], &mut |_, key, value| {
        if key.starts_with(prefix.bytes()) {
            let id = <[u8; 32]>::try_from(key).map_err(|_| IssuerError::Corrupt {
                table: "credentials",
                what: "a key is not 32 bytes",
            })?;
            found.push((CredentialId(id), CredentialRecord::decode(value)?));
        }
        Ok(())
    })?;
    let (id, mut record) = match found.len() {
        0 => return Err(IssuerError::UnknownId(prefix.to_string())),
        1 => found.remove(0),
        _ => return Err(IssuerError::AmbiguousId(prefix.to_string())),
    };
    let already = record.revoked.is_some();
    if !already {
        record.revoked = Some(today);
        let mut set = WriteSet::new();
        set.put(Table::Credentials, id.0, record.encode());
        store.write(set)?;
    }
    Ok(Reply::Revoked {
        id: id.to_string(),
        short_id: id.short(),
        already,
        label: record.label,
    })
}

/// Counts the store's credentials and issued tokens.
pub fn status(
    store: &Store,
    state: &Path,
    today: Day,
    serving: Option<IssuerStats>,
) -> Result<Status, IssuerError> {
    let (mut enrolled, mut revoked) = (0u64, 0u64);
    let mut epochs: BTreeMap<u32, (u64, u64, BTreeMap<u16, u64>)> = BTreeMap::new();
    let mut credentials_per_epoch: BTreeMap<u32, std::collections::BTreeSet<[u8; 32]>> =
        BTreeMap::new();
    store.scan(
        &[Table::Credentials, Table::Issued],
        &mut |table, key, value| {
            match table {
                Table::Credentials => {
                    if CredentialRecord::decode(value)?.revoked.is_some() {
                        revoked += 1;
                    } else {
                        enrolled += 1;
                    }
                }
                Table::Issued => {
                    let (epoch, TokenScope(scope), id) =
                        parse_issued_key(key).ok_or(IssuerError::Corrupt {
                            table: "issued",
                            what: "a key is not 38 bytes",
                        })?;
                    let tokens =
                        <[u8; 2]>::try_from(value)
                            .map(u16::from_be_bytes)
                            .map_err(|_| IssuerError::Corrupt {
                                table: "issued",
                                what: "a count is not 2 bytes",
                            })?;
                    let entry = epochs.entry(epoch.0).or_default();
                    entry.0 += u64::from(tokens);
                    *entry.2.entry(scope).or_default() += u64::from(tokens);
                    credentials_per_epoch
                        .entry(epoch.0)
                        .or_default()
                        .insert(id.0);
                }
                Table::Rate | Table::Meta => {}
            }
            Ok(())
        },
    )?;
    let epochs = epochs
        .into_iter()
        .map(|(epoch, (tokens, _, per_scope))| EpochIssued {
            epoch,
            date: date_of(Day(epoch)),
            tokens,
            credentials: credentials_per_epoch
                .get(&epoch)
                .map_or(0, |ids| ids.len() as u64),
            per_scope: per_scope
                .into_iter()
                .map(|(scope, tokens)| ScopeIssued { scope, tokens })
                .collect(),
        })
        .collect();
    Ok(Status {
        state: state.to_owned(),
        today: today.0,
        date: date_of(today),
        store_format: STORE_FORMAT,
        enrolled,
        revoked,
        prune_floor: store.prune_floor()?.0,
        epochs,
        serving: serving.is_some(),
        since_start: serving,
    })
}

/// Binds the control socket (0600), replacing a stale one left by an issuer that died.
pub fn bind_socket(path: &Path) -> Result<UnixListener, IssuerError> {
    if std::fs::symlink_metadata(path).is_ok() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(IssuerError::Control(format!(
                "{} answers: another issuer serves this state directory",
                path.display()
            )));
        }
        std::fs::remove_file(path).map_err(IssuerError::io(path))?;
    }
    let listener = UnixListener::bind(path).map_err(IssuerError::io(path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(IssuerError::io(path))?;
    Ok(listener)
}

/// Answers admin requests on the control socket until the task is aborted.
pub async fn serve_socket(listener: UnixListener, issuer: Arc<Issuer>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                warn!(error = %e, "control socket accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let issuer = Arc::clone(&issuer);
        tokio::spawn(async move {
            if let Err(e) = answer_one(stream, issuer).await {
                warn!(error = %e, "control request failed");
            }
        });
    }
}

async fn answer_one(stream: UnixStream, issuer: Arc<Issuer>) -> Result<(), IssuerError> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    BufReader::new(read.take(MAX_LINE))
        .read_line(&mut line)
        .await
        .map_err(|e| IssuerError::Control(e.to_string()))?;
    let reply = match serde_json::from_str::<Request>(&line) {
        Ok(request) => {
            let issuer = Arc::clone(&issuer);
            tokio::task::spawn_blocking(move || {
                let today = issuer.clock().today();
                let state = issuer.store().path().parent().unwrap_or(Path::new("."));
                execute(issuer.store(), state, today, Some(issuer.stats()), &request)
            })
            .await
            .map_err(|e| IssuerError::Control(e.to_string()))?
            .unwrap_or_else(|e| Reply::Error {
                message: e.to_string(),
                refused: e.is_refusal(),
            })
        }
        Err(e) => Reply::Error {
            message: format!("not a request: {e}"),
            refused: true,
        },
    };
    let mut text =
        serde_json::to_string(&reply).map_err(|e| IssuerError::Control(e.to_string()))?;
    text.push('\n');
    write
        .write_all(text.as_bytes())
        .await
        .map_err(|e| IssuerError::Control(e.to_string()))?;
    Ok(())
}

/// Sends a request to the issuer serving `state`; `None` when none answers on its socket.
pub async fn call(state: &StateDir, request: &Request) -> Result<Option<Reply>, IssuerError> {
    let path = state.control_socket();
    let Ok(stream) = UnixStream::connect(&path).await else {
        return Ok(None);
    };
    let (read, mut write) = stream.into_split();
    let mut text =
        serde_json::to_string(request).map_err(|e| IssuerError::Control(e.to_string()))?;
    text.push('\n');
    write
        .write_all(text.as_bytes())
        .await
        .map_err(|e| IssuerError::Control(e.to_string()))?;
    let mut line = String::new();
    BufReader::new(read.take(MAX_LINE))
        .read_line(&mut line)
        .await
        .map_err(|e| IssuerError::Control(e.to_string()))?;
    serde_json::from_str(&line)
        .map(Some)
        .map_err(|e| IssuerError::Control(format!("not a reply: {e}")))
}

/// Runs `request` on the issuer serving `state`, or on its store opened directly when none
/// runs. A reply of [`Reply::Error`] becomes an error.
pub async fn run(state: &StateDir, today: Day, request: &Request) -> Result<Reply, IssuerError> {
    let reply = match call(state, request).await? {
        Some(reply) => reply,
        None => {
            let store = Store::open(&state.db(), None).map_err(|e| match e {
                IssuerError::NotInitialised(_) => {
                    IssuerError::NotInitialised(state.path().to_owned())
                }
                other => other,
            })?;
            execute(&store, state.path(), today, None, request)?
        }
    };
    match reply {
        Reply::Error {
            message,
            refused: true,
        } => Err(IssuerError::Refused(message)),
        Reply::Error { message, .. } => Err(IssuerError::Control(message)),
        reply => Ok(reply),
    }
}
