//! The operator's commands on a data directory: `init` (made whole in a temporary directory
//! and renamed into place, so that a failure leaves nothing), `add-share` (a further key, for
//! a key rollover), `follow` (a deliberate re-pin of the chain) and `status`. Those that
//! change the directory hold its lock, so none runs under a serving auditor.

use std::fmt;
use std::path::{Path, PathBuf};

use ed25519_dalek::VerifyingKey;
use penrose_core::bundle::{BundleHash, InstanceId};
use penrose_core::paillier::KeyId;
use penrose_core::paillier::threshold::KeyShare;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::data_dir::DataDir;
use crate::error::AuditorError;
use crate::keys;
use crate::policy::Policy;
use crate::record::{Answered, Chain, Record};
use penrose_host::durable::{self, Access};

/// What `init` makes a data directory from.
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// The auditor's share (read with [`keys::read_offered`]).
    pub share: KeyShare,
    /// The aggregation server's bundle-signing key.
    pub aggregator: VerifyingKey,
    /// The auditor's own threshold and cap.
    pub policy: Policy,
    /// The chain to follow; `None`: the chain of the first bundle that comes (unless it is a
    /// restored copy's).
    pub instance: Option<InstanceId>,
}

/// What `init` made.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Initialised {
    /// The data directory.
    pub data: PathBuf,
    /// The key a share is held of.
    pub key: KeyId,
    /// The chain pinned, if one was.
    #[serde(with = "optional_instance")]
    pub instance: Option<InstanceId>,
    /// k.
    pub threshold: u64,
    /// T.
    pub cap: u32,
}

impl fmt::Display for Initialised {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "initialised {}", self.data.display())?;
        writeln!(
            f,
            "  key share   {} (0600; back it up: the split is 2-of-2)",
            self.key
        )?;
        match &self.instance {
            Some(instance) => writeln!(f, "  chain       {instance} (pinned)")?,
            None => writeln!(
                f,
                "  chain       the first bundle's (not a restored copy's)"
            )?,
        }
        writeln!(
            f,
            "  release     at least {} contributors, counted at {} reports each per counter and day",
            self.threshold, self.cap
        )?;
        write!(
            f,
            "next: penrose-auditor serve --data {}",
            self.data.display()
        )
    }
}

/// Creates the data directory `data` (0700) with the share, the pinned key, the policy and a
/// new record. Refuses a path that exists and is not an empty directory. Made in a temporary
/// directory beside it and renamed into place: a failure leaves nothing behind.
pub fn init(data: &DataDir, options: InitOptions) -> Result<Initialised, AuditorError> {
    let target = data.path();
    if !is_absent_or_empty(target)? {
        return Err(AuditorError::Exists(target.to_owned()));
    }
    let parent = durable::parent(target);
    let name = target.file_name().unwrap_or_default().to_string_lossy();
    let temp = DataDir::new(parent.join(format!(".{name}.init-{}", std::process::id())));
    let made = populate(&temp, &options)
        .and_then(|()| std::fs::rename(temp.path(), target).map_err(AuditorError::io(target)))
        .and_then(|()| Ok(durable::sync_dir(parent)?));
    if made.is_err() {
        let _ = std::fs::remove_dir_all(temp.path());
    }
    made?;
    info!(data = %target.display(), key = %options.share.key_id(), "initialised");
    Ok(Initialised {
        data: target.to_owned(),
        key: options.share.key_id(),
        instance: options.instance,
        threshold: options.policy.threshold().get(),
        cap: options.policy.cap().get(),
    })
}

fn populate(data: &DataDir, options: &InitOptions) -> Result<(), AuditorError> {
    make_private_dir(data.path())?;
    make_private_dir(&data.shares())?;
    keys::store(data, &options.share)?;
    let key_text = penrose_host::key_file::signer_line(&options.aggregator);
    durable::replace(&data.aggregator_key(), key_text.as_bytes(), Access::Public)?;
    options.policy.save(&data.policy())?;
    Record::new(options.instance).save(&data.record())?;
    // Made here, so that taking the lock never changes the directory.
    durable::replace(&data.lock_file(), b"", Access::Owner)?;
    Ok(durable::sync_dir(data.path())?)
}

fn make_private_dir(path: &Path) -> Result<(), AuditorError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(path)
        .map_err(AuditorError::io(path))
}

fn is_absent_or_empty(path: &Path) -> Result<bool, AuditorError> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(AuditorError::io(path)(e)),
        Ok(meta) if meta.is_dir() => Ok(std::fs::read_dir(path)
            .map_err(AuditorError::io(path))?
            .next()
            .is_none()),
        Ok(_) => Ok(false),
    }
}

/// What `add-share` added.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Added {
    /// The key a share is now held of.
    pub key: KeyId,
}

impl fmt::Display for Added {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "added a share of key {}; start the auditor to answer under it",
            self.key
        )
    }
}

/// Adds a share of a further key (a key rollover: bundles list the keys their sums are
/// under). Refuses a key already held. The auditor must not be serving; it loads its shares
/// when it starts.
pub fn add_share(data: &DataDir, share: &KeyShare) -> Result<Added, AuditorError> {
    let _lock = data.lock()?;
    keys::store(data, share)?;
    info!(key = %share.key_id(), "added a key share");
    Ok(Added {
        key: share.key_id(),
    })
}

/// What `follow` did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Followed {
    /// The chain followed now.
    pub now: Chain,
    /// The chain followed before, if any.
    pub before: Option<Chain>,
    /// Whether it already followed that chain (nothing changed).
    pub already: bool,
}

impl fmt::Display for Followed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.already {
            return write!(
                f,
                "already following chain {}; nothing changed",
                self.now.instance
            );
        }
        if let Some(before) = &self.before {
            writeln!(
                f,
                "left chain {} at bundle {}",
                before.instance,
                before.last.map_or(0, |l| l.seq)
            )?;
        }
        write!(
            f,
            "following chain {} from bundle {}; every epoch answered before stays answered",
            self.now.instance,
            self.now.last.map_or(1, |l| l.seq + 1)
        )
    }
}

/// Re-pins the auditor to chain `instance` (a restored copy of the aggregation server's
/// store, after the operator checked why it exists). Every answered epoch stays answered, in
/// whatever chain it comes again. Logged. The auditor must not be serving.
pub fn follow(data: &DataDir, instance: InstanceId) -> Result<Followed, AuditorError> {
    let _lock = data.lock()?;
    let record = Record::load(&data.record())?;
    let before = record.chain().copied();
    let Some(next) = record.follow(instance) else {
        let now = before.unwrap_or(Chain {
            instance,
            last: None,
        });
        return Ok(Followed {
            now,
            before,
            already: true,
        });
    };
    next.save(&data.record())?;
    let now = next.chain().copied().unwrap_or(Chain {
        instance,
        last: None,
    });
    warn!(
        from = ?before.map(|c| c.instance.to_string()),
        to = %instance,
        "re-pinned the chain followed, at the operator's request"
    );
    Ok(Followed {
        now,
        before,
        already: false,
    })
}

/// Where an auditor stands: `status`'s result.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AuditorStatus {
    /// The data directory.
    pub data: PathBuf,
    /// The chain followed (none before the first bundle of an auditor not pinned).
    #[serde(with = "optional_instance")]
    pub instance: Option<InstanceId>,
    /// The last bundle taken of it (0: none).
    pub seq: u64,
    /// Its hash (zeros: none).
    pub hash: BundleHash,
    /// Every epoch answered, by epoch.
    pub answered: Vec<Answered>,
    /// Chains followed before a re-pin.
    pub earlier: Vec<Chain>,
    /// The keys a share is held of.
    pub keys: Vec<KeyId>,
    /// k.
    pub threshold: u64,
    /// T.
    pub cap: u32,
    /// The pinned aggregation server key (hex).
    pub aggregator: String,
    /// Whether releases are counted from evidence (`DATA/evidence-keys` is there).
    #[serde(default)]
    pub counts_evidence: bool,
    /// Evidence tokens counted so far (`DATA/spent`), each for one released sum.
    #[serde(default)]
    pub tokens_counted: u64,
}

impl fmt::Display for AuditorStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "release auditor {}", self.data.display())?;
        match &self.instance {
            Some(instance) if self.seq == 0 => writeln!(f, "chain {instance}, no bundle yet")?,
            Some(instance) => writeln!(
                f,
                "chain {instance}, last bundle {} ({})",
                self.seq,
                penrose_core::hex::encode(&self.hash.0)
            )?,
            None => writeln!(f, "no chain yet: the first bundle's will be followed")?,
        }
        for chain in &self.earlier {
            let seq = chain.last.map_or(0, |l| l.seq);
            writeln!(
                f,
                "  followed before: {} up to bundle {seq}",
                chain.instance
            )?;
        }
        match (self.answered.first(), self.answered.last()) {
            (Some(first), Some(last)) => writeln!(
                f,
                "epochs answered: {} (ids {} to {})",
                self.answered.len(),
                first.epoch.0,
                last.epoch.0
            )?,
            _ => writeln!(f, "epochs answered: none")?,
        }
        for key in &self.keys {
            writeln!(f, "key share: {key}")?;
        }
        writeln!(f, "aggregation server key: {}", self.aggregator)?;
        if self.counts_evidence {
            writeln!(
                f,
                "contributors counted from evidence: {} tokens counted so far",
                self.tokens_counted
            )?;
        }
        write!(
            f,
            "release rule: at least {} contributors, counted at {} reports each per counter and day",
            self.threshold, self.cap
        )
    }
}

/// Reads where the auditor stands (whether or not it is serving: the record is replaced
/// whole, so it reads consistently).
pub fn status(data: &DataDir) -> Result<AuditorStatus, AuditorError> {
    data.check_initialised()?;
    let record = Record::load(&data.record())?;
    let policy = Policy::load(&data.policy())?;
    let aggregator = keys::read_aggregator_key(&data.aggregator_key())?;
    let position = record.status();
    Ok(AuditorStatus {
        data: data.path().to_owned(),
        instance: position.instance,
        seq: position.seq,
        hash: position.hash,
        answered: record.answered().to_vec(),
        earlier: record.earlier().to_vec(),
        keys: data.held_key_ids()?,
        threshold: policy.threshold().get(),
        cap: policy.cap().get(),
        aggregator: penrose_core::hex::encode(aggregator.as_bytes()),
        counts_evidence: data.evidence_keys().exists(),
        tokens_counted: crate::evidence::SpentStore::load(&data.spent())?.len() as u64,
    })
}

/// An optional instance id as its hex or null.
mod optional_instance {
    use penrose_core::bundle::InstanceId;
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    /// Serialises.
    pub fn serialize<S: Serializer>(id: &Option<InstanceId>, s: S) -> Result<S::Ok, S::Error> {
        match id {
            Some(id) => s.collect_str(id),
            None => s.serialize_none(),
        }
    }

    /// Deserialises.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<InstanceId>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| text.parse().map_err(D::Error::custom))
            .transpose()
    }
}
