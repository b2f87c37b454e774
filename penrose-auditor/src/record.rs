//! What the auditor remembers between answers: the aggregation server chain it follows, the
//! last bundle it took of it, and every epoch it ever answered, with the bundle it answered it
//! in, across every chain it followed. It is the only state a request can change, and the
//! rule that decides whether a bundle may be taken ([`Record::admit`]) is a pure function of
//! it, so that the auditor can check a bundle before the slow partial decryptions and again,
//! under its lock, before it records it.
//!
//! Why each rule: partials of one epoch's sums in two different bundles (a fork, a restored
//! copy of the aggregation server's store, a replay under another chain) would let whoever
//! holds both sets difference them down to a few reports. So an epoch is answered in one
//! bundle only, whatever chain it comes in; the chain order (each bundle names the hash of the
//! one before) makes the auditor see the same history as the design server.
//!
//! The file (`record.json`, replaced durably on every change) is JSON: ids and hashes in the
//! project's hex (`penrose_core::hex`), every byte.

use std::path::Path;

use penrose_core::audit::{AuditRefusal, AuditStatus};
use penrose_core::bundle::{Bundle, BundleHash, EpochId, InstanceId};
use serde::{Deserialize, Serialize};

use crate::error::AuditorError;
use penrose_host::durable::{self, Access};

/// The record file format this build reads and writes.
const FORMAT: u32 = 1;

/// A bundle taken: its place in its chain and its hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    /// Its sequence number.
    pub seq: u64,
    /// The SHA-256 of its bytes.
    pub hash: BundleHash,
}

/// A chain the auditor follows, or followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chain {
    /// The aggregation server store's instance id.
    #[serde(with = "hex_instance")]
    pub instance: InstanceId,
    /// The last bundle taken of it (none yet: the next is its first).
    pub last: Option<Link>,
}

/// Where an epoch was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answered {
    /// The epoch.
    #[serde(with = "epoch_number")]
    pub epoch: EpochId,
    /// The chain of the bundle it was answered in.
    #[serde(with = "hex_instance")]
    pub instance: InstanceId,
    /// That bundle's sequence number.
    pub seq: u64,
    /// That bundle's hash.
    pub bundle: BundleHash,
}

/// How a bundle the record admits is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// The last bundle taken, again (a retry, or its next page): nothing to record.
    Again,
    /// The next bundle of the chain: recorded before anything is answered.
    Next,
}

/// The chain position and the answered epochs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    format: u32,
    chain: Option<Chain>,
    answered: Vec<Answered>,
    earlier: Vec<Chain>,
}

impl Record {
    /// A new auditor's record: pinned to `instance`, or taking the chain of its first bundle.
    pub fn new(instance: Option<InstanceId>) -> Self {
        Record {
            format: FORMAT,
            chain: instance.map(|instance| Chain {
                instance,
                last: None,
            }),
            answered: Vec::new(),
            earlier: Vec::new(),
        }
    }

    /// The chain followed (none before the first bundle of an auditor not pinned at init).
    pub fn chain(&self) -> Option<&Chain> {
        self.chain.as_ref()
    }

    /// Every epoch answered, by epoch id.
    pub fn answered(&self) -> &[Answered] {
        &self.answered
    }

    /// The chains followed before a re-pin, oldest first.
    pub fn earlier(&self) -> &[Chain] {
        &self.earlier
    }

    /// The chain position, as the protocol's status answer carries it.
    pub fn status(&self) -> AuditStatus {
        let last = self.chain.and_then(|c| c.last);
        AuditStatus {
            instance: self.chain.map(|c| c.instance),
            seq: last.map_or(0, |l| l.seq),
            hash: last.map_or(BundleHash::default(), |l| l.hash),
        }
    }

    /// Whether the bundle with `hash` may be taken: of the chain followed (or, with none yet,
    /// of a chain that is not a restored copy), the next of it or the last again, and none of
    /// its epochs answered in another bundle.
    pub fn admit(&self, bundle: &Bundle, hash: BundleHash) -> Result<Take, AuditRefusal> {
        let link = &bundle.link;
        let last = match self.chain {
            Some(chain) if chain.instance != link.instance => {
                return Err(AuditRefusal::OtherChain);
            }
            Some(chain) => chain.last,
            // A restored copy's chain (it names its parent) is taken only when the operator
            // pins it (`follow`): its epochs may already have been answered elsewhere.
            None if link.parent.is_some() => return Err(AuditRefusal::OtherChain),
            None => None,
        };
        let take = match last {
            Some(last) if link.seq == last.seq && hash == last.hash => Take::Again,
            Some(last) if link.seq == last.seq => {
                return Err(AuditRefusal::Forked { seq: last.seq });
            }
            // The next seq, but after another bundle than the one taken: a fork at `last`.
            Some(last) if link.seq == last.seq + 1 && link.prev != last.hash => {
                return Err(AuditRefusal::Forked { seq: last.seq });
            }
            Some(last) if link.seq == last.seq + 1 => Take::Next,
            // Bundle::verify refuses a first bundle that names a predecessor.
            None if link.seq == 1 => Take::Next,
            _ => {
                return Err(AuditRefusal::OutOfOrder {
                    expected: last.map_or(1, |l| l.seq + 1),
                    got: link.seq,
                });
            }
        };
        for epoch in &bundle.epochs {
            if let Some(before) = self.find(epoch.id)
                && before.bundle != hash
            {
                return Err(AuditRefusal::EpochAnsweredBefore { epoch: epoch.id });
            }
        }
        Ok(take)
    }

    /// The record once `bundle` (admitted as [`Take::Next`]) is taken.
    pub fn taken(&self, bundle: &Bundle, hash: BundleHash) -> Record {
        let link = &bundle.link;
        let mut next = self.clone();
        next.chain = Some(Chain {
            instance: link.instance,
            last: Some(Link {
                seq: link.seq,
                hash,
            }),
        });
        for epoch in &bundle.epochs {
            if self.find(epoch.id).is_none() {
                next.answered.push(Answered {
                    epoch: epoch.id,
                    instance: link.instance,
                    seq: link.seq,
                    bundle: hash,
                });
            }
        }
        next.answered.sort_by_key(|a| a.epoch);
        next
    }

    /// The record once the operator re-pins the auditor to `instance`: the chain followed so
    /// far is kept among the earlier ones, the answered epochs all stay, and the position is
    /// where the auditor left that chain if it followed it before (else before its first
    /// bundle). `None` when it already follows `instance`.
    pub fn follow(&self, instance: InstanceId) -> Option<Record> {
        if self.chain.is_some_and(|c| c.instance == instance) {
            return None;
        }
        let mut next = self.clone();
        let resumed = next.earlier.iter().position(|c| c.instance == instance);
        let chain = match resumed {
            Some(i) => next.earlier.remove(i),
            None => Chain {
                instance,
                last: None,
            },
        };
        next.earlier.extend(self.chain);
        next.chain = Some(chain);
        Some(next)
    }

    fn find(&self, epoch: EpochId) -> Option<&Answered> {
        self.answered
            .binary_search_by_key(&epoch, |a| a.epoch)
            .ok()
            .map(|i| &self.answered[i])
    }

    /// Reads the record file.
    pub fn load(path: &Path) -> Result<Self, AuditorError> {
        let text = std::fs::read(path).map_err(AuditorError::io(path))?;
        let record: Record =
            serde_json::from_slice(&text).map_err(|e| AuditorError::corrupt(path, e))?;
        if record.format != FORMAT {
            return Err(AuditorError::corrupt(
                path,
                format!(
                    "record format {} (this build reads {FORMAT})",
                    record.format
                ),
            ));
        }
        if !record.answered.is_sorted_by(|a, b| a.epoch < b.epoch) {
            return Err(AuditorError::corrupt(path, "answered epochs out of order"));
        }
        Ok(record)
    }

    /// Replaces the record file durably: when this returns, a crash keeps the new record.
    pub fn save(&self, path: &Path) -> Result<(), AuditorError> {
        let mut text =
            serde_json::to_vec_pretty(self).map_err(|e| AuditorError::corrupt(path, e))?;
        text.push(b'\n');
        Ok(durable::replace(path, &text, Access::Public)?)
    }
}

/// An instance id as its 32 hex digits.
pub(crate) mod hex_instance {
    use penrose_core::bundle::InstanceId;
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    /// Serialises.
    pub fn serialize<S: Serializer>(id: &InstanceId, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(id)
    }

    /// Deserialises.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<InstanceId, D::Error> {
        String::deserialize(d)?.parse().map_err(D::Error::custom)
    }
}

/// An epoch id as its number.
pub(crate) mod epoch_number {
    use penrose_core::bundle::EpochId;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serialises.
    pub fn serialize<S: Serializer>(epoch: &EpochId, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(epoch.0)
    }

    /// Deserialises.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<EpochId, D::Error> {
        u32::deserialize(d).map(EpochId)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn chain(byte: u8, seq: Option<u64>) -> Chain {
        Chain {
            instance: InstanceId([byte; 16]),
            last: seq.map(|seq| Link {
                seq,
                hash: BundleHash([byte; 32]),
            }),
        }
    }

    #[test]
    fn a_repin_keeps_the_epochs_and_resumes_a_chain_followed_before() {
        let mut record = Record::new(None);
        record.chain = Some(chain(1, Some(3)));
        record.answered.push(Answered {
            epoch: EpochId(7),
            instance: InstanceId([1; 16]),
            seq: 3,
            bundle: BundleHash([1; 32]),
        });
        assert!(record.follow(InstanceId([1; 16])).is_none());
        let on_b = record.follow(InstanceId([2; 16])).unwrap();
        assert_eq!(on_b.chain, Some(chain(2, None)));
        assert_eq!(on_b.earlier, [chain(1, Some(3))]);
        assert_eq!(on_b.answered, record.answered);
        let back = on_b.follow(InstanceId([1; 16])).unwrap();
        assert_eq!(back.chain, Some(chain(1, Some(3))));
        assert_eq!(back.earlier, [chain(2, None)]);
        // The file form reads back as written.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("record.json");
        back.save(&path).unwrap();
        assert_eq!(Record::load(&path).unwrap(), back);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(&"01".repeat(32)), "{text}");
    }
}
