//! Epochs: which released sum each report goes into, and when a sum is final.
//!
//! Every accepted report is added to the sums of exactly one epoch. An epoch is *open* while
//! reports may still join it and *closed* once they may not; only closed epochs are exported,
//! and a closed epoch's sums never change. So the design server never sees two versions of a
//! sum that differ by a few reports (`penrose_core::release`).
//!
//! - [`EpochPolicy::Day`] (the default): a report joins the epoch of its own day, so that the
//!   agents' cap of T reports per (counter, day) bounds what one agent can put into it. Day d
//!   closes once the server's day passes d + [`DAY_TOLERANCE`], after which no report of day d
//!   is accepted anyway. A report of a day whose epoch an operator closed early joins the first
//!   open epoch instead, which then spans more than one day (the contributor bound divides by
//!   the span, so it stays sound).
//! - [`EpochPolicy::Count`]: epochs of at least N reports, numbered from 1; the open one closes
//!   with the batch that fills it (so it may hold the rest of that batch too). Its span of
//!   report days is recorded the same way.
//!
//! Either way an operator may close the open epochs at once (`penrose-aggregator close-epoch`).
//! Closing happens on the writer thread, in order with the batches, and is written in the same
//! synced batch as the reports before it, so a closed epoch in the store holds every report
//! acked into it.

use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroU64;
use std::str::FromStr;

use penrose_core::bundle::{EpochId, EpochKind};
use penrose_core::release::DAY_TOLERANCE;
use penrose_core::wire::Day;

use crate::store::{Table, WriteSet};

/// How the server cuts epochs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EpochPolicy {
    /// One epoch per report day (the default).
    #[default]
    Day,
    /// Epochs of this many reports.
    Count(NonZeroU64),
}

impl EpochPolicy {
    /// The kind bundles and the store record.
    pub fn kind(self) -> EpochKind {
        match self {
            EpochPolicy::Day => EpochKind::Day,
            EpochPolicy::Count(_) => EpochKind::Count,
        }
    }
}

impl fmt::Display for EpochPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EpochPolicy::Day => f.write_str("day"),
            EpochPolicy::Count(n) => write!(f, "reports:{n}"),
        }
    }
}

impl FromStr for EpochPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "day" => Ok(EpochPolicy::Day),
            other => other
                .strip_prefix("reports:")
                .and_then(|n| n.parse::<NonZeroU64>().ok())
                .map(EpochPolicy::Count)
                .ok_or_else(|| {
                    format!("epoch policy {other:?}: expected `day` or `reports:N` with N >= 1")
                }),
        }
    }
}

/// Records `policy` in the store (kind and, for the count policy, N).
pub fn write_policy(set: &mut WriteSet, policy: EpochPolicy) {
    set.put(Table::Meta, keys::KIND, vec![policy.kind().code()]);
    if let EpochPolicy::Count(n) = policy {
        set.put(Table::Meta, keys::COUNT, n.get().to_be_bytes().to_vec());
    }
}

/// Meta-table keys of the epoch state.
pub mod keys {
    /// The epoch kind (u8, `EpochKind::code`).
    pub const KIND: &[u8] = b"epoch/kind";
    /// Reports per epoch under the count policy (u64).
    pub const COUNT: &[u8] = b"epoch/count";
    /// The highest closed epoch id (u32; absent: none).
    pub const CLOSED_THROUGH: &[u8] = b"epoch/closed_through";
    /// The open epoch under the count policy (u32).
    pub const CURRENT: &[u8] = b"epoch/current";
    /// Prefix of one record per epoch: `epoch/r/` + id (u32be).
    pub const RECORD: &[u8] = b"epoch/r/";
}

/// Bytes of a stored epoch record.
const RECORD_BYTES: usize = 4 + 4 + 8 + 8 + 1;

/// What the server knows of one epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpochRecord {
    /// Which epoch.
    pub id: EpochId,
    /// Earliest report day in it.
    pub first_day: Day,
    /// Latest report day in it.
    pub last_day: Day,
    /// Reports accepted into it.
    pub reports: u64,
    /// Those of them admitted by a verified admission token (`crate::admission`).
    pub reports_with_tokens: u64,
    /// Whether it is closed (final).
    pub closed: bool,
}

impl EpochRecord {
    /// The meta key.
    pub fn store_key(id: EpochId) -> Vec<u8> {
        let mut k = keys::RECORD.to_vec();
        k.extend_from_slice(&id.0.to_be_bytes());
        k
    }

    /// The meta value: first day, last day, reports, reports with tokens, closed.
    pub fn store_value(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(RECORD_BYTES);
        v.extend_from_slice(&self.first_day.0.to_be_bytes());
        v.extend_from_slice(&self.last_day.0.to_be_bytes());
        v.extend_from_slice(&self.reports.to_be_bytes());
        v.extend_from_slice(&self.reports_with_tokens.to_be_bytes());
        v.push(u8::from(self.closed));
        v
    }

    /// Reads a stored record (`None`: damaged).
    pub fn decode(key: &[u8], value: &[u8]) -> Option<Self> {
        let id = u32::from_be_bytes(key.strip_prefix(keys::RECORD)?.try_into().ok()?);
        if value.len() != RECORD_BYTES {
            return None;
        }
        let u32_at = |i: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&value[i..i + 4]);
            u32::from_be_bytes(b)
        };
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&value[i..i + 8]);
            u64::from_be_bytes(b)
        };
        Some(Self {
            id: EpochId(id),
            first_day: Day(u32_at(0)),
            last_day: Day(u32_at(4)),
            reports: u64_at(8),
            reports_with_tokens: u64_at(16),
            closed: match value[24] {
                0 => false,
                1 => true,
                _ => return None,
            },
        })
    }

    /// Days its reports span (at least 1).
    pub fn days(&self) -> u32 {
        self.last_day.0.saturating_sub(self.first_day.0) + 1
    }
}

/// The open epochs and the closing rules, rebuilt from the meta table on start.
#[derive(Debug)]
pub struct Epochs {
    policy: EpochPolicy,
    closed_through: Option<EpochId>,
    current: EpochId,
    open: BTreeMap<EpochId, EpochRecord>,
    dirty: Vec<EpochId>,
    meta_dirty: bool,
    closed_now: Vec<EpochRecord>,
}

impl Epochs {
    /// A new store's epochs.
    pub fn new(policy: EpochPolicy) -> Self {
        Self {
            policy,
            closed_through: None,
            current: EpochId(1),
            open: BTreeMap::new(),
            dirty: Vec::new(),
            meta_dirty: true,
            closed_now: Vec::new(),
        }
    }

    /// Rebuilds from the stored closed-through mark, current epoch and the records of open
    /// epochs (closed ones are ignored).
    pub fn load(
        policy: EpochPolicy,
        closed_through: Option<EpochId>,
        current: Option<EpochId>,
        records: impl IntoIterator<Item = EpochRecord>,
    ) -> Self {
        let mut epochs = Self::new(policy);
        epochs.meta_dirty = false;
        epochs.closed_through = closed_through;
        if let Some(current) = current {
            epochs.current = current;
        }
        epochs.open = records
            .into_iter()
            .filter(|r| !r.closed)
            .map(|r| (r.id, r))
            .collect();
        epochs
    }

    /// The policy.
    pub fn policy(&self) -> EpochPolicy {
        self.policy
    }

    /// Whether reports may still join `id`.
    pub fn is_open(&self, id: EpochId) -> bool {
        self.closed_through.is_none_or(|c| id > c)
    }

    /// The epoch a report stamped `day` joins, counted in it (and among those admitted by a
    /// token, with `tokened`).
    pub fn admit(&mut self, day: Day, tokened: bool) -> EpochId {
        let id = match self.policy {
            EpochPolicy::Day => {
                let first_open = self.closed_through.map_or(0, |c| c.0.saturating_add(1));
                EpochId(day.0.max(first_open))
            }
            EpochPolicy::Count(_) => self.current,
        };
        let record = self.open.entry(id).or_insert(EpochRecord {
            id,
            first_day: day,
            last_day: day,
            reports: 0,
            reports_with_tokens: 0,
            closed: false,
        });
        record.first_day = record.first_day.min(day);
        record.last_day = record.last_day.max(day);
        record.reports += 1;
        record.reports_with_tokens += u64::from(tokened);
        if !self.dirty.contains(&id) {
            self.dirty.push(id);
        }
        id
    }

    /// The open epochs the rules close now: under the day policy those no report can join
    /// any more (`today` past their day + tolerance), under the count policy the open one once
    /// it holds N reports.
    pub fn due(&self, today: Day) -> Vec<EpochId> {
        match self.policy {
            EpochPolicy::Day => self
                .open
                .keys()
                .copied()
                .filter(|id| u64::from(id.0) + u64::from(DAY_TOLERANCE) < u64::from(today.0))
                .collect(),
            EpochPolicy::Count(n) => self
                .open
                .get(&self.current)
                .filter(|r| r.reports >= n.get())
                .map(|r| vec![r.id])
                .unwrap_or_default(),
        }
    }

    /// Every open epoch that holds reports: what an operator's close-now closes.
    pub fn all_open(&self) -> Vec<EpochId> {
        self.open
            .values()
            .filter(|r| r.reports > 0)
            .map(|r| r.id)
            .collect()
    }

    /// Closes `ids` (open epochs; others are ignored): no report joins them again. Returns the
    /// records closed.
    pub fn close(&mut self, ids: &[EpochId]) -> Vec<EpochRecord> {
        let mut closed = Vec::new();
        for id in ids {
            let Some(mut record) = self.open.remove(id) else {
                continue;
            };
            record.closed = true;
            self.closed_through = Some(self.closed_through.map_or(*id, |c| c.max(*id)));
            if let EpochPolicy::Count(_) = self.policy
                && *id >= self.current
            {
                self.current = EpochId(id.0.saturating_add(1));
            }
            self.meta_dirty = true;
            self.closed_now.push(record);
            closed.push(record);
        }
        closed
    }

    /// Adds every changed record and mark to `set`, and forgets the changes.
    pub fn write_dirty(&mut self, set: &mut WriteSet) {
        for id in self.dirty.drain(..) {
            if let Some(record) = self.open.get(&id) {
                set.put(
                    Table::Meta,
                    EpochRecord::store_key(id),
                    record.store_value(),
                );
            }
        }
        for record in self.closed_now.drain(..) {
            set.put(
                Table::Meta,
                EpochRecord::store_key(record.id),
                record.store_value(),
            );
        }
        if self.meta_dirty {
            if let Some(c) = self.closed_through {
                set.put(
                    Table::Meta,
                    keys::CLOSED_THROUGH,
                    c.0.to_be_bytes().to_vec(),
                );
            }
            set.put(
                Table::Meta,
                keys::CURRENT,
                self.current.0.to_be_bytes().to_vec(),
            );
            self.meta_dirty = false;
        }
    }

    /// The open epochs.
    pub fn open(&self) -> impl Iterator<Item = &EpochRecord> {
        self.open.values()
    }

    /// The highest closed epoch.
    pub fn closed_through(&self) -> Option<EpochId> {
        self.closed_through
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_and_print() {
        assert_eq!("day".parse::<EpochPolicy>(), Ok(EpochPolicy::Day));
        let count = "reports:500".parse::<EpochPolicy>();
        assert_eq!(count.map(|p| p.to_string()), Ok("reports:500".into()));
        assert!("reports:0".parse::<EpochPolicy>().is_err());
        assert!("weekly".parse::<EpochPolicy>().is_err());
    }

    #[test]
    fn day_epochs_close_after_the_tolerance_and_late_reports_move_on() {
        let mut e = Epochs::new(EpochPolicy::Day);
        assert_eq!(e.admit(Day(100), true), EpochId(100));
        assert_eq!(e.admit(Day(101), false), EpochId(101));
        assert!(e.due(Day(101)).is_empty());
        assert_eq!(e.due(Day(102)), vec![EpochId(100)]);
        let closed = e.close(&[EpochId(100)]);
        assert_eq!(closed.len(), 1);
        assert!(!e.is_open(EpochId(100)) && e.is_open(EpochId(101)));
        // A late report of day 100 joins the first open epoch, which now spans two days.
        assert_eq!(e.admit(Day(100), true), EpochId(101));
        let r = e.open().find(|r| r.id == EpochId(101)).copied();
        assert_eq!(
            r.map(|r| (r.reports, r.reports_with_tokens, r.days())),
            Some((2, 1, 2))
        );
    }

    #[test]
    fn count_epochs_close_when_full() {
        let n = NonZeroU64::new(3).map(EpochPolicy::Count);
        let mut e = Epochs::new(n.unwrap_or_default());
        for _ in 0..3 {
            assert_eq!(e.admit(Day(7), true), EpochId(1));
        }
        assert_eq!(e.due(Day(7)), vec![EpochId(1)]);
        e.close(&[EpochId(1)]);
        assert_eq!(e.admit(Day(8), true), EpochId(2));
        assert_eq!(e.all_open(), vec![EpochId(2)]);
    }

    #[test]
    fn records_round_trip() {
        let r = EpochRecord {
            id: EpochId(20_000),
            first_day: Day(19_999),
            last_day: Day(20_000),
            reports: 12,
            reports_with_tokens: 11,
            closed: true,
        };
        let k = EpochRecord::store_key(r.id);
        assert_eq!(EpochRecord::decode(&k, &r.store_value()), Some(r));
        assert_eq!(EpochRecord::decode(&k, &[0; 17]), None, "a format 5 record");
        let mut value = r.store_value();
        value[24] = 2;
        assert_eq!(EpochRecord::decode(&k, &value), None);
    }
}
