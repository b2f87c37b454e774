//! The design server's keys on the agent: which Paillier key encrypts the reports of which
//! day.
//!
//! The configured public key (`design.public_key`) encrypts every day until the agent holds
//! the design server's signed key list (`penrose_core::key_list`). With
//! `design.key_list_signer` set, the agent asks the aggregation server for the list at start
//! and then about every [`REFRESH`] ([`run_fetcher`], each wait drawn afresh), verifies it under that pinned key, refuses one
//! older than the list it holds, and keeps the last good one in its state directory
//! (`key-list`), so that a restart does not fall back to the configured key. A histogram is
//! encrypted when it is sealed, under the key of the day it is stamped with, so an agent
//! switches keys on the day the list says.
//!
//! What the aggregation server can do with this: withhold the list (the agent keeps the keys
//! it has, and reports under a retired key are refused and counted), or hand out an older list
//! (refused). It cannot make the agent encrypt under a key of its own: the list would not
//! verify. What it could do with a design server that signed a different list per agent is
//! written as a limit in docs/threat-model.md, "Key rollover".

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ed25519_dalek::VerifyingKey;
use penrose_core::key_list::{KeyList, KeyListError, MAX_LIST_BYTES};
use penrose_core::paillier::PublicKey;
use penrose_core::release::check_key_bits;
use penrose_core::wire::Day;
use thiserror::Error;

/// The held list's file in the state directory.
pub const KEY_LIST_FILE: &str = "key-list";
/// How often the agent asks for the list once it has one, on average: each wait is drawn
/// afresh ([`refresh_wait`]), so the time of day an agent asks says nothing that stays the
/// same from one request to the next.
pub const REFRESH: Duration = Duration::from_secs(6 * 3600);

/// One wait before the next request: uniform between half and one and a half [`REFRESH`]. A
/// fixed period would give each agent a phase of its own, seen by the aggregation server at
/// every request and linkable to the reports the same host sends.
pub fn refresh_wait(rng: &mut impl rand::Rng) -> Duration {
    REFRESH / 2 + REFRESH.mul_f64(rng.random::<f64>())
}
/// How long it waits before asking again after a failed request.
pub const RETRY: Duration = Duration::from_secs(300);

/// Why a key list or the signer could not be used.
#[derive(Debug, Error)]
pub enum AgentKeyError {
    /// The list does not verify, is malformed, or is older than the one held.
    #[error("key list: {0}")]
    List(#[from] KeyListError),
    /// A listed key is smaller than every tier accepts.
    #[error("key list: key {key}: {why}")]
    WeakKey {
        /// The key's id.
        key: String,
        /// The policy it fails.
        why: String,
    },
    /// The list file was not written.
    #[error(transparent)]
    File(#[from] penrose_host::FileError),
}

/// What [`DesignKeys::offer`] did with a list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offered {
    /// A newer list: held and stored from now on.
    Newer {
        /// Its sequence.
        sequence: u64,
    },
    /// The list already held.
    Same,
}

struct Inner {
    list: KeyList,
    /// Whether `list` is a verified signed list (not the configured key alone).
    signed: bool,
    /// The list's keys by first day, shared: a key's fixed-base encryption table (several
    /// MiB, built on its first encryption) is built once per key, not once per clone.
    keys: Vec<(Day, Arc<PublicKey>)>,
}

impl Inner {
    fn new(list: KeyList, signed: bool) -> Self {
        let keys = list
            .keys()
            .iter()
            .map(|k| (k.from, Arc::new(k.key.clone())))
            .collect();
        Self { list, signed, keys }
    }
}

/// The keys the pipeline encrypts with, shared with the fetcher that replaces them.
#[derive(Clone)]
pub struct DesignKeys {
    inner: Arc<RwLock<Inner>>,
    signer: Option<VerifyingKey>,
    file: Option<PathBuf>,
}

impl From<PublicKey> for DesignKeys {
    /// One key for every day, never replaced.
    fn from(key: PublicKey) -> Self {
        Self {
            inner: Arc::new(RwLock::new(Inner::new(KeyList::single(key), false))),
            signer: None,
            file: None,
        }
    }
}

impl DesignKeys {
    /// The configured key `bootstrap`; with `signer`, also the list held in `state_dir` when
    /// there is one that verifies (a damaged or unverifiable file is ignored with a warning:
    /// the next fetch replaces it).
    pub fn open(
        bootstrap: PublicKey,
        signer: Option<VerifyingKey>,
        state_dir: &Path,
    ) -> Result<Self, AgentKeyError> {
        let mut keys = Self::from(bootstrap);
        let Some(signer) = signer else {
            return Ok(keys);
        };
        keys.signer = Some(signer);
        let file = state_dir.join(KEY_LIST_FILE);
        keys.file = Some(file.clone());
        match std::fs::read(&file) {
            Ok(bytes) => match keys.check(&bytes) {
                Ok(list) => {
                    tracing::info!(sequence = list.sequence(), "using the key list held");
                    keys.set(list);
                }
                Err(e) => tracing::warn!(
                    "{}: {e}; the configured key is used until a list is fetched",
                    file.display()
                ),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(AgentKeyError::File(penrose_host::FileError::Io {
                    path: file,
                    source,
                }));
            }
        }
        Ok(keys)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set(&self, list: KeyList) {
        *self
            .inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Inner::new(list, true);
    }

    /// Whether the agent fetches lists (a signer is configured).
    pub fn fetches_lists(&self) -> bool {
        self.signer.is_some()
    }

    /// The key that encrypts reports of `day` (`None`: the list starts later), shared with
    /// every other caller (its encryption table is built once).
    pub fn key_for(&self, day: Day) -> Option<Arc<PublicKey>> {
        self.read()
            .keys
            .iter()
            .rev()
            .find(|(from, _)| *from <= day)
            .map(|(_, key)| Arc::clone(key))
    }

    /// The held list's sequence (`None`: the configured key alone).
    pub fn sequence(&self) -> Option<u64> {
        let inner = self.read();
        inner.signed.then(|| inner.list.sequence())
    }

    /// Verifies `bytes` under the pinned signer, refuses a list older than the one held and
    /// keys under the size floor.
    fn check(&self, bytes: &[u8]) -> Result<KeyList, AgentKeyError> {
        let signer = self
            .signer
            .as_ref()
            .ok_or(AgentKeyError::List(KeyListError::BadSignature))?;
        let list = KeyList::verify(bytes, signer)?;
        for k in list.keys() {
            check_key_bits(k.key.size().modulus_bits()).map_err(|e| AgentKeyError::WeakKey {
                key: k.key.key_id().to_string(),
                why: e.to_string(),
            })?;
        }
        let inner = self.read();
        if inner.signed {
            list.check_not_older_than(&inner.list)?;
        }
        Ok(list)
    }

    /// Takes a list the aggregation server handed over: verified, not older than the one
    /// held, stored (0600, replaced atomically) before it is used. A refused list changes
    /// nothing.
    pub fn offer(&self, bytes: &[u8]) -> Result<Offered, AgentKeyError> {
        if bytes.len() > MAX_LIST_BYTES {
            return Err(KeyListError::Length(bytes.len()).into());
        }
        let list = self.check(bytes)?;
        {
            let inner = self.read();
            if inner.signed && inner.list == list {
                return Ok(Offered::Same);
            }
        }
        if let Some(file) = &self.file {
            write_private(file, bytes)?;
        }
        let sequence = list.sequence();
        self.set(list);
        Ok(Offered::Newer { sequence })
    }
}

/// Writes `bytes` to `path` durably, readable by the agent's user only.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), AgentKeyError> {
    Ok(penrose_host::durable::replace(
        path,
        bytes,
        penrose_host::durable::Access::Owner,
    )?)
}

/// Asks the aggregation server for the key list at start and about every [`REFRESH`] after
/// ([`refresh_wait`]; every
/// [`RETRY`] while requests fail), for ever: the daemon aborts the task when it stops (it
/// holds nothing between its await points that an abort could leave half done). Each request
/// goes on a connection of its own, like a report.
pub async fn run_fetcher(keys: DesignKeys, client: penrose_transport::Client) {
    loop {
        let wait = match client.fetch_key_list().await {
            Ok(bytes) => match keys.offer(&bytes) {
                Ok(Offered::Newer { sequence }) => {
                    tracing::info!(sequence, "new design key list from the aggregation server");
                    refresh_wait(&mut rand::rng())
                }
                Ok(Offered::Same) => refresh_wait(&mut rand::rng()),
                Err(e) => {
                    tracing::warn!("the aggregation server's key list was refused: {e}");
                    RETRY
                }
            },
            Err(e) => {
                tracing::warn!("asking the aggregation server for the key list: {e}");
                RETRY
            }
        };
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use ed25519_dalek::SigningKey;
    use penrose_core::key_list::ScheduledKey;
    use penrose_core::paillier::{KeySize, Keypair};

    use super::*;

    #[test]
    fn refresh_waits_are_drawn_afresh_not_a_fixed_phase() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(26);
        let waits: Vec<Duration> = (0..1000).map(|_| refresh_wait(&mut rng)).collect();
        assert!(
            waits
                .iter()
                .all(|w| *w >= REFRESH / 2 && *w <= REFRESH * 3 / 2)
        );
        let (min, max) = (waits.iter().min().unwrap(), waits.iter().max().unwrap());
        assert!(*max - *min > REFRESH * 9 / 10, "spread {min:?}..{max:?}");
        let mean = waits.iter().sum::<Duration>() / 1000;
        assert!(
            mean > REFRESH * 9 / 10 && mean < REFRESH * 11 / 10,
            "{mean:?}"
        );
    }

    fn key() -> PublicKey {
        Keypair::generate_with_size(KeySize::Bits2048, &mut rand::rng())
            .public_key()
            .clone()
    }

    #[test]
    fn lists_replace_the_configured_key_survive_a_restart_and_never_go_back() {
        let dir = tempfile::tempdir().unwrap();
        let signing = SigningKey::from_bytes(&[4; 32]);
        let (boot, new) = (key(), key());
        let keys =
            DesignKeys::open(boot.clone(), Some(signing.verifying_key()), dir.path()).unwrap();
        assert_eq!(
            keys.key_for(Day(5)).map(|k| k.key_id()),
            Some(boot.key_id())
        );
        // One shared key per list entry: its encryption table (several MiB) is built once, not
        // once per sealed report.
        assert!(Arc::ptr_eq(
            &keys.key_for(Day(5)).unwrap(),
            &keys.key_for(Day(6)).unwrap()
        ));
        assert_eq!(keys.sequence(), None);
        let list = KeyList::new(
            3,
            2,
            vec![
                ScheduledKey {
                    from: Day(0),
                    key: boot.clone(),
                },
                ScheduledKey {
                    from: Day(100),
                    key: new.clone(),
                },
            ],
        )
        .unwrap();
        let bytes = list.sign(&signing);
        assert_eq!(keys.offer(&bytes).unwrap(), Offered::Newer { sequence: 3 });
        assert_eq!(keys.offer(&bytes).unwrap(), Offered::Same);
        assert_eq!(
            keys.key_for(Day(99)).map(|k| k.key_id()),
            Some(boot.key_id())
        );
        assert_eq!(
            keys.key_for(Day(100)).map(|k| k.key_id()),
            Some(new.key_id())
        );
        let mode = std::os::unix::fs::MetadataExt::mode(
            &std::fs::metadata(dir.path().join(KEY_LIST_FILE)).unwrap(),
        );
        assert_eq!(mode & 0o777, 0o600);
        // A restart keeps the list.
        let again =
            DesignKeys::open(boot.clone(), Some(signing.verifying_key()), dir.path()).unwrap();
        assert_eq!(
            again.key_for(Day(100)).map(|k| k.key_id()),
            Some(new.key_id())
        );
        assert_eq!(again.sequence(), Some(3));
        // An older list, one signed by another key, and garbage change nothing.
        let older = KeyList::new(
            2,
            2,
            vec![ScheduledKey {
                from: Day(0),
                key: boot.clone(),
            }],
        )
        .unwrap();
        assert!(matches!(
            again.offer(&older.sign(&signing)),
            Err(AgentKeyError::List(KeyListError::Rollback {
                offered: 2,
                held: 3
            }))
        ));
        // The held sequence with other contents: a fork of the signed history, refused.
        let fork = KeyList::new(
            3,
            2,
            vec![ScheduledKey {
                from: Day(0),
                key: boot.clone(),
            }],
        )
        .unwrap();
        assert!(matches!(
            again.offer(&fork.sign(&signing)),
            Err(AgentKeyError::List(KeyListError::Fork { sequence: 3 }))
        ));
        let forged = KeyList::new(
            9,
            2,
            vec![ScheduledKey {
                from: Day(0),
                key: key(),
            }],
        )
        .unwrap();
        let mallory = SigningKey::from_bytes(&[5; 32]);
        assert!(matches!(
            again.offer(&forged.sign(&mallory)),
            Err(AgentKeyError::List(KeyListError::BadSignature))
        ));
        assert!(again.offer(b"garbage").is_err());
        assert_eq!(
            again.key_for(Day(100)).map(|k| k.key_id()),
            Some(new.key_id())
        );
        assert_eq!(again.sequence(), Some(3));
        // A small key in a signed list is refused too.
        let weak = Keypair::generate_with_size(KeySize::Bits1024, &mut rand::rng());
        let weak = KeyList::new(
            10,
            2,
            vec![ScheduledKey {
                from: Day(0),
                key: weak.public_key().clone(),
            }],
        )
        .unwrap();
        assert!(matches!(
            again.offer(&weak.sign(&signing)),
            Err(AgentKeyError::WeakKey { .. })
        ));
    }

    #[test]
    fn without_a_signer_the_configured_key_is_used_and_lists_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let boot = key();
        let keys = DesignKeys::open(boot.clone(), None, dir.path()).unwrap();
        assert!(!keys.fetches_lists());
        let signing = SigningKey::from_bytes(&[4; 32]);
        let list = KeyList::new(
            1,
            2,
            vec![ScheduledKey {
                from: Day(0),
                key: key(),
            }],
        )
        .unwrap();
        assert!(keys.offer(&list.sign(&signing)).is_err());
        assert_eq!(
            keys.key_for(Day(1)).map(|k| k.key_id()),
            Some(boot.key_id())
        );
    }
}
