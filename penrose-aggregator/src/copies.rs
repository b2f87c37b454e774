//! Copies of a store: a backup, a restored directory, a `cp -a` or `rsync` of the data
//! directory. A copy holds every report its parent held when it was made. If it released its
//! own version of an epoch the parent also releases, the two versions would differ by the
//! reports that reached only one of them after the copy: sums that subtract, down to one
//! report of a busy class (`docs/threat-model.md`, "Copies of a store").
//!
//! So a copy is a new instance (its own bundle chain, `parent` naming the one it came from) in
//! which every epoch that existed when it was made is closed and marked *released elsewhere*:
//! its export never puts those epochs in a bundle, whichever of them the parent had already
//! exported, and the reports the copy accepts after that join epochs of their own. A restore
//! from a backup therefore loses the reports of the epochs that were open at backup time;
//! that is the price of never releasing two versions of one sum.
//!
//! A copy made with the product (`penrose-aggregator backup`) is made a new instance at once.
//! A copy made around it is recognised by its directory: a store records the identity of the
//! directory it was created in (inode and birth time, which a copy cannot keep and a rename
//! on one file system does), and serve and export refuse a store found in another directory
//! until an operator adopts it (`penrose-aggregator adopt-copy`), which does the same as a
//! backup does. What this does not stop (an operator who edits the records, or rolls a file
//! system snapshot back in place) is written in the threat model as a limit.

use std::collections::BTreeSet;

use penrose_core::bundle::{EpochId, EpochKind, InstanceId};
use rand::RngCore;

use crate::epochs::{self, EpochRecord};
use crate::state::{StateError, meta};
use crate::store::{Store, StoreError, StoreHome, Table, WriteSet};

/// Keys of the meta table this module owns.
pub mod keys {
    /// The identity of the directory the store was created in (16 bytes: inode, birth time
    /// in nanoseconds, both u64be).
    pub const HOME: &[u8] = b"copy/home";
    /// Prefix of one record per epoch released elsewhere: `copy/elsewhere/` + id (u32be) ->
    /// the instance that holds it ([u8; 16]).
    pub const ELSEWHERE: &[u8] = b"copy/elsewhere/";
}

/// What making a copy a new instance did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewInstance {
    /// The copy's new instance.
    pub instance: InstanceId,
    /// The chain it descends from: the instance it was copied from, or that one's parent where
    /// the copied instance never exported (a backup restored from elsewhere), so that the
    /// design server sees the new chain descend from the one it follows.
    pub parent: InstanceId,
    /// The epochs it will never release (every epoch that existed in it), in order.
    pub released_elsewhere: Vec<EpochId>,
}

/// Refuses a store that is not in the directory it was created in, and records the directory
/// of a store that has none recorded yet (one created before the record existed).
pub fn check_home(store: &dyn Store) -> Result<(), StateError> {
    let found = store.home()?;
    match store.get(Table::Meta, keys::HOME)? {
        None => {
            let mut set = WriteSet::new();
            set.put(Table::Meta, keys::HOME, found.to_bytes().to_vec());
            store.write(set)?;
            Ok(())
        }
        Some(bytes) => {
            let recorded = StoreHome::from_bytes(&bytes).ok_or(StateError::Meta("copy/home"))?;
            match recorded.same_directory(&found) {
                true => Ok(()),
                false => Err(StateError::Copied { recorded, found }),
            }
        }
    }
}

/// Makes `copy` (a backup, or a copied directory being adopted) a new instance: a fresh
/// instance id, its parent recorded, an empty chain, this directory as its home, and every
/// epoch it holds closed and released elsewhere.
pub fn make_new_instance(copy: &dyn Store) -> Result<NewInstance, StateError> {
    let held = Held::read(copy)?;
    let mut id = [0u8; 16];
    rand::rng().fill_bytes(&mut id);
    let instance = InstanceId(id);
    let mut set = WriteSet::new();
    set.put(Table::Meta, meta::INSTANCE, id.to_vec());
    set.put(Table::Meta, meta::PARENT, held.lineage().0.to_vec());
    set.put(
        Table::Meta,
        crate::export::chain_keys::SEQ,
        0u64.to_be_bytes().to_vec(),
    );
    set.put(Table::Meta, keys::HOME, copy.home()?.to_bytes().to_vec());
    let released_elsewhere = held.close_all(&mut set);
    copy.write(set)?;
    Ok(NewInstance {
        instance,
        parent: held.lineage(),
        released_elsewhere,
    })
}

/// The epochs marked released elsewhere in `store`.
pub fn released_elsewhere(store: &dyn Store) -> Result<BTreeSet<EpochId>, StoreError> {
    let mut out = BTreeSet::new();
    store.scan(&[Table::Meta], &mut |_, k, _| {
        if let Some(id) = decode_elsewhere_key(k) {
            out.insert(id);
        }
        Ok(())
    })?;
    Ok(out)
}

/// The epoch an `ELSEWHERE` key names, if `key` is one.
pub fn decode_elsewhere_key(key: &[u8]) -> Option<EpochId> {
    let id = key.strip_prefix(keys::ELSEWHERE)?;
    Some(EpochId(u32::from_be_bytes(id.try_into().ok()?)))
}

fn elsewhere_key(id: EpochId) -> Vec<u8> {
    let mut k = keys::ELSEWHERE.to_vec();
    k.extend_from_slice(&id.0.to_be_bytes());
    k
}

/// What a copy holds of its parent's epochs.
struct Held {
    instance: InstanceId,
    parent: Option<InstanceId>,
    chain_seq: u64,
    kind: Option<EpochKind>,
    closed_through: Option<EpochId>,
    current: Option<EpochId>,
    records: Vec<EpochRecord>,
}

impl Held {
    fn read(store: &dyn Store) -> Result<Self, StateError> {
        let mut held = Held {
            instance: InstanceId::default(),
            parent: None,
            chain_seq: 0,
            kind: None,
            closed_through: None,
            current: None,
            records: Vec::new(),
        };
        let mut instance = None;
        let mut damaged: Option<&'static str> = None;
        store.scan(&[Table::Meta], &mut |_, k, v| {
            let u32_of = |v: &[u8]| <[u8; 4]>::try_from(v).ok().map(u32::from_be_bytes);
            match k {
                k if k == meta::INSTANCE => instance = <[u8; 16]>::try_from(v).ok(),
                k if k == meta::PARENT => match <[u8; 16]>::try_from(v) {
                    Ok(id) => held.parent = Some(InstanceId(id)),
                    Err(_) => damaged = Some("chain/parent"),
                },
                k if k == crate::export::chain_keys::SEQ => match <[u8; 8]>::try_from(v) {
                    Ok(seq) => held.chain_seq = u64::from_be_bytes(seq),
                    Err(_) => damaged = Some("chain/seq"),
                },
                k if k == epochs::keys::KIND => {
                    held.kind = v.first().copied().and_then(EpochKind::from_code);
                }
                k if k == epochs::keys::CLOSED_THROUGH => match u32_of(v) {
                    Some(id) => held.closed_through = Some(EpochId(id)),
                    None => damaged = Some("epoch/closed_through"),
                },
                k if k == epochs::keys::CURRENT => match u32_of(v) {
                    Some(id) => held.current = Some(EpochId(id)),
                    None => damaged = Some("epoch/current"),
                },
                k if k.starts_with(epochs::keys::RECORD) => match EpochRecord::decode(k, v) {
                    Some(r) => held.records.push(r),
                    None => damaged = Some("epoch record"),
                },
                _ => {}
            }
            Ok(())
        })?;
        if let Some(what) = damaged {
            return Err(StateError::Meta(what));
        }
        held.instance = InstanceId(instance.ok_or(StateError::Meta("chain/instance"))?);
        Ok(held)
    }

    /// The chain a copy of this store descends from: this one, unless it never exported and
    /// is itself a copy.
    fn lineage(&self) -> InstanceId {
        match (self.chain_seq, self.parent) {
            (0, Some(parent)) => parent,
            _ => self.instance,
        }
    }

    /// Closes every held epoch, marks each released elsewhere, and moves the epoch marks past
    /// them so that new reports open epochs of their own. Returns the epochs marked.
    fn close_all(&self, set: &mut WriteSet) -> Vec<EpochId> {
        let mut marked = Vec::with_capacity(self.records.len());
        for record in &self.records {
            let closed = EpochRecord {
                closed: true,
                ..*record
            };
            set.put(
                Table::Meta,
                EpochRecord::store_key(record.id),
                closed.store_value(),
            );
            set.put(
                Table::Meta,
                elsewhere_key(record.id),
                self.instance.0.to_vec(),
            );
            marked.push(record.id);
        }
        let last = marked.iter().copied().max().max(self.closed_through);
        if let Some(last) = last {
            set.put(
                Table::Meta,
                epochs::keys::CLOSED_THROUGH,
                last.0.to_be_bytes().to_vec(),
            );
            if self.kind == Some(EpochKind::Count) {
                let next =
                    EpochId(last.0.saturating_add(1)).max(self.current.unwrap_or(EpochId(1)));
                set.put(
                    Table::Meta,
                    epochs::keys::CURRENT,
                    next.0.to_be_bytes().to_vec(),
                );
            }
        }
        marked.sort();
        marked
    }
}
