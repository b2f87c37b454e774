//! The snippet table (SST) and the class table (EST): which application class every snippet
//! hash belongs to.
//!
//! A snippet hash seen before is looked up in the SST. A new one is compared with the
//! representatives of the classes that share a band key of its locator
//! (`penrose_core::fingerprint::locator`): a fixed number of look-ups (50) however many classes
//! there are, and candidates that are almost only related classes, so that placement costs
//! about the same with 1,000 classes as with 100,000 (`cargo xtask bench-fleet`,
//! docs/benchmarks.md). It joins the class with the highest estimated similarity (from the
//! snippet hashes) at or above tau, or founds a new class with itself as representative. A class keeps up to [`MAX_REPRESENTATIVES`]
//! representatives: a joining snippet that is not already close to one
//! ([`NOVELTY`] below) becomes another, so that a class covers an application whose windows
//! vary.
//!
//! **Healing splits.** Windows of one application at different offsets can found separate
//! classes before a window that overlaps both arrives. A snippet that matches two or more
//! classes at >= tau joins them ([`MERGE_CLASSES`]): the oldest survives, the others point to
//! it ([`ClassMerge`]), and from then on everything of theirs counts in the survivor. Sums already
//! accumulated under a merged class stay where they are; export adds them homomorphically
//! into the survivor's (`crate::export`), and each bundle lists the merges it applies so the
//! design server can report earlier releases together. The evaluation
//! (`cargo xtask eval-fingerprints`, docs/evaluation.md) measures the gain.
//!
//! **New classes are rationed.** Every snippet hash that matches no class founds one, and a
//! client can make up any number of those. [`NewClassBudget`] lets the server found at most
//! so many classes an hour (a token bucket); a report whose snippet would found one beyond it
//! is refused ([`Tables::record_if_founding_allowed`] changes nothing then) and may be sent
//! again later. Snippets of existing classes are never rationed.
//!
//! **Buckets cannot be filled against an application.** A client can found junk classes under
//! a known application's band keys. A full bucket therefore gives a newcomer at least as
//! strong its weakest class's place ([`MAX_BUCKET_CLASSES`]), a shared key takes a few
//! foundings a day ([`MAX_KEY_FOUNDINGS_PER_DAY`]), and a class offers its representatives to
//! their keys again each time its reports double ([`IndexStats`] counts what happened).
//!
//! **Memory.** The class table (EST) and its index live in memory, bounded by the number of
//! classes (at most [`MAX_REPRESENTATIVES`] representatives of 232 bytes each). The SST grows
//! with every distinct snippet hash, which at fleet scale is nearly every report, so it is
//! kept in the store and only its recently used rows in memory ([`SnippetCache`]): a row the
//! cache lacks is read from the store by the caller ([`Tables::knows`],
//! [`Tables::load_snippet`]) before the report is placed. A row changed is kept in memory until
//! at least one whole rotation of the cache after it was handed out for writing, so a row is
//! never both missing from memory and not yet in the store.
//!
//! Both tables are recorded in the store (records below), from which [`Tables::load`] rebuilds
//! the class table on start (the SST is read on demand). Merges are recorded in the meta table
//! ([`MERGE_PREFIX`]), stamped with the write batch's cursor, so that an export can apply
//! exactly the merges made before it.

use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::time::Instant;

pub use penrose_core::bundle::{ClassMap, ClassMerge};
use penrose_core::bundle::{Cursor, MergeRefused};
use penrose_core::fingerprint::{
    Fingerprint, FingerprintParams, LOCATOR_BYTES, Locator, SnippetHash,
};
use penrose_core::wire::Day;
use thiserror::Error;

pub use penrose_core::bundle::ClassId;

/// Most representatives a class keeps.
pub const MAX_REPRESENTATIVES: usize = 8;

/// Most classes one locator key indexes. A key is shared by classes whose representatives have
/// the same two minima in a band, so a full bucket means many classes alike in that band; the
/// cap bounds what one report can make the server compare (50 buckets x 64 classes), also for a
/// client that sends a made-up locator naming the fullest buckets. A full bucket is not a closed
/// one: a class at least as strong (reports) as its weakest takes that one's place, so junk
/// classes founded on an application's keys cannot keep the application out (a class left out
/// of a bucket is still found through its other 49 bands, and tries again each time its
/// reports double).
pub const MAX_BUCKET_CLASSES: usize = 64;

/// Most new classes that enter one shared locator key per day (besides the key's first two).
/// Junk founded on a target's keys fills a bucket in 8 days at the earliest, and cannot cycle a
/// founding that arrived after it out of a full bucket within a day: the weakest-and-earliest
/// goes first, and 64 of them stand before the newcomer. A founding refused by the ration is
/// still founded and indexed under its other keys, and enters when its reports double.
pub const MAX_KEY_FOUNDINGS_PER_DAY: u32 = 8;

/// SST rows kept in memory by default ([`SnippetCache`]): about 60 MB.
pub const DEFAULT_SNIPPET_CACHE: usize = 1 << 20;

/// Bytes of one representative in an EST record: its hash and its locator.
const REPRESENTATIVE_BYTES: usize = 32 + LOCATOR_BYTES;

/// A joining snippet whose best similarity to the class's representatives is below
/// `tau + NOVELTY * (1 - tau)` becomes a representative (while there is room).
pub const NOVELTY: f64 = 0.5;

/// Whether a snippet that matches two or more classes at >= tau joins them into one (the
/// oldest survives), healing an application that founded several classes from windows at
/// different offsets.
pub const MERGE_CLASSES: bool = true;

/// Classes the server founds per hour by default ([`NewClassBudget`]): a fleet meets new
/// applications at a far lower rate once it has run a day, and a day's budget is 24,000
/// classes, a few MB of tables and sums.
pub const DEFAULT_NEW_CLASSES_PER_HOUR: NonZeroU32 = NonZeroU32::MIN.saturating_add(999);

/// A token bucket of new classes: at most `per_hour` founded at once (when it is full), and
/// `per_hour` more each hour. Kept in memory: a restart fills it again.
#[derive(Clone, Debug)]
pub struct NewClassBudget {
    per_hour: NonZeroU32,
    tokens: f64,
    last: Instant,
}

impl NewClassBudget {
    /// A full bucket of `per_hour` classes at `now`.
    pub fn new(per_hour: NonZeroU32, now: Instant) -> Self {
        Self {
            per_hour,
            tokens: f64::from(per_hour.get()),
            last: now,
        }
    }

    /// The rate.
    pub fn per_hour(&self) -> NonZeroU32 {
        self.per_hour
    }

    fn refill(&mut self, now: Instant) {
        let rate = f64::from(self.per_hour.get());
        let hours = now.saturating_duration_since(self.last).as_secs_f64() / 3600.0;
        self.tokens = (self.tokens + hours * rate).min(rate);
        self.last = now;
    }

    /// Takes one class from the budget at `now`, or says there is none left.
    pub fn try_take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }

    /// Whole classes that could be founded at `now`.
    pub fn available(&mut self, now: Instant) -> u64 {
        self.refill(now);
        // Between 0 and per_hour (a u32), so the conversion is exact.
        self.tokens.floor() as u64
    }
}

/// Meta-table prefix of merge records: `merge/` + absorbed class (u32be) -> survivor (u32be),
/// cursor of the batch that merged them (u64be).
pub const MERGE_PREFIX: &[u8] = b"merge/";

/// The meta record of `merge`, made in the batch of `cursor`.
pub fn merge_record(merge: &ClassMerge, cursor: Cursor) -> Record {
    let mut key = MERGE_PREFIX.to_vec();
    key.extend_from_slice(&merge.absorbed.0.to_be_bytes());
    let mut value = Vec::with_capacity(12);
    value.extend_from_slice(&merge.into.0.to_be_bytes());
    value.extend_from_slice(&cursor.0.to_be_bytes());
    (key, value)
}

/// Reads a meta record under [`MERGE_PREFIX`].
pub fn decode_merge(key: &[u8], value: &[u8]) -> Result<(ClassMerge, Cursor), RecordError> {
    let absorbed = key
        .strip_prefix(MERGE_PREFIX)
        .and_then(|k| <[u8; 4]>::try_from(k).ok())
        .ok_or_else(|| damaged("merge", "key is not merge/ and 4 bytes"))?;
    let value: &[u8; 12] = value
        .try_into()
        .map_err(|_| damaged("merge", "value is not 12 bytes"))?;
    let (into, cursor) = value.split_at(4);
    let merge = ClassMerge {
        absorbed: ClassId(u32::from_be_bytes(absorbed)),
        into: ClassId(u32::from_be_bytes(into.try_into().unwrap_or_default())),
    };
    if merge.into >= merge.absorbed {
        return Err(damaged(
            "merge",
            "a class merged into a younger one or itself",
        ));
    }
    Ok((
        merge,
        Cursor(u64::from_be_bytes(cursor.try_into().unwrap_or_default())),
    ))
}

/// A store record: key and value bytes.
pub type Record = (Vec<u8>, Vec<u8>);

/// One SST row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnippetEntry {
    /// The class the snippet was assigned to (never changes; after a merge the snippet counts
    /// in the class this one went to, [`Tables::class_of`]).
    pub class: ClassId,
    /// The server's day when the snippet first arrived.
    pub first_seen: Day,
    /// Reports counted with this snippet.
    pub reports: u64,
}

/// One EST row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassEntry {
    /// Fingerprints new snippets are compared with (by hash) and found by (by locator); the
    /// first founded the class. A merge adds the absorbed classes' while there is room.
    pub representatives: Vec<Fingerprint>,
    /// The server's day when the class was founded.
    pub first_seen: Day,
    /// Reports counted in this class (a survivor's include those of the classes it absorbed,
    /// counted before the merge).
    pub reports: u64,
    /// Distinct snippet hashes assigned to this class (likewise).
    pub snippets: u64,
}

/// Where a report's snippet went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Its class.
    pub class: ClassId,
    /// Whether this report founded the class.
    pub new_class: bool,
}

/// A stored record could not be read back.
#[derive(Debug, Error)]
pub enum RecordError {
    /// Wrong length or layout.
    #[error("damaged {table} record: {why}")]
    Damaged {
        /// Which table.
        table: &'static str,
        /// What is wrong.
        why: &'static str,
    },
    /// A merge record contradicts the others.
    #[error("damaged merge record: {0}")]
    Merge(#[from] MergeRefused),
}

fn damaged(table: &'static str, why: &'static str) -> RecordError {
    RecordError::Damaged { table, why }
}

/// The recently used SST rows, in two generations: rows are looked up in both and inserted into
/// the young one; when the young one holds half the capacity, the old one is dropped and the
/// young one becomes old. A row therefore stays at least half a capacity of insertions after
/// its last use, and memory stays within the capacity.
#[derive(Debug)]
pub struct SnippetCache {
    young: HashMap<SnippetHash, SnippetEntry>,
    old: HashMap<SnippetHash, SnippetEntry>,
    capacity: usize,
    /// Rows dropped from memory so far (they are in the store).
    dropped: u64,
}

impl SnippetCache {
    fn new(capacity: usize) -> Self {
        Self {
            young: HashMap::new(),
            old: HashMap::new(),
            capacity: capacity.max(2),
            dropped: 0,
        }
    }

    fn get(&self, hash: &SnippetHash) -> Option<&SnippetEntry> {
        self.young.get(hash).or_else(|| self.old.get(hash))
    }

    /// The row, moved into the young generation (it is being used).
    fn get_mut(&mut self, hash: &SnippetHash) -> Option<&mut SnippetEntry> {
        if !self.young.contains_key(hash) {
            let entry = self.old.remove(hash)?;
            self.insert(*hash, entry);
        }
        self.young.get_mut(hash)
    }

    fn insert(&mut self, hash: SnippetHash, entry: SnippetEntry) {
        if self.young.len() >= self.capacity / 2 {
            self.dropped += self.old.len() as u64;
            self.old = std::mem::take(&mut self.young);
        }
        self.young.insert(hash, entry);
    }

    fn len(&self) -> usize {
        self.young.len() + self.old.len()
    }

    fn heap_bytes(&self) -> usize {
        let entry = std::mem::size_of::<(SnippetHash, SnippetEntry)>() + 1;
        (self.young.capacity() + self.old.capacity()) * entry
    }
}

/// The candidate index: per band, locator key -> the classes with a representative of that key.
/// Nearly every key names one class, so a key holds that class itself and only a key of two or
/// more classes points into a shared [`Bucket`] (ids with [`LocatorIndex::LIST`] set): about 10
/// bytes per representative and band, where a list per key cost about 70 (measured with
/// `cargo xtask bench-fleet`, "tables MiB").
struct LocatorIndex {
    bands: Vec<HashMap<u32, ClassId>>,
    lists: Vec<Bucket>,
    stats: IndexStats,
}

/// The classes under one shared locator key, in the order they entered, and how many foundings
/// entered it on its last day ([`MAX_KEY_FOUNDINGS_PER_DAY`]).
#[derive(Debug)]
struct Bucket {
    classes: Vec<ClassId>,
    day: Day,
    foundings: u32,
}

/// Why a class is being indexed under a key: a founding is rationed per key, a class that has
/// earned reports is not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entering {
    /// Its founding report, the only one it has.
    Founding,
    /// A class with reports (a new representative, a merge, a growth step or a rebuild).
    Earned,
}

/// How strong each class indexed under a key is: the reports of the class that holds it now,
/// and nothing for a merged class whose survivor is indexed under the same key (it only takes
/// a slot).
struct Strength<'a> {
    classes: &'a [ClassEntry],
    merged: &'a ClassMap,
}

impl Strength<'_> {
    fn of(&self, class: ClassId, bucket: &[ClassId]) -> u64 {
        let root = self.merged.root(class);
        if root != class && bucket.contains(&root) {
            return 0;
        }
        self.classes.get(root.0 as usize).map_or(0, |c| c.reports)
    }
}

/// What the index did with the entries it was offered since the tables were made: the counts
/// behind the bucket rules ([`MAX_BUCKET_CLASSES`], [`MAX_KEY_FOUNDINGS_PER_DAY`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Weaker classes a stronger (or equally strong, newer) one displaced from a full bucket.
    pub displaced: u64,
    /// Entries left out because the bucket was full of stronger classes.
    pub left_out_full: u64,
    /// Foundings left out because their key had taken its day's foundings.
    pub left_out_rationed: u64,
}

impl LocatorIndex {
    /// Marks an entry that is an index into `lists`; class ids stay below it (2^31 classes of
    /// at least 232 bytes each would take 500 GB).
    const LIST: u32 = 1 << 31;

    fn new(bands: usize) -> Self {
        Self {
            bands: (0..bands).map(|_| HashMap::new()).collect(),
            lists: Vec::new(),
            stats: IndexStats::default(),
        }
    }

    /// The classes under `key` of `band`.
    fn get(&self, band: usize, key: u32) -> &[ClassId] {
        match self.bands.get(band).and_then(|b| b.get(&key)) {
            None => &[],
            Some(entry) if entry.0 & Self::LIST != 0 => self
                .lists
                .get((entry.0 & !Self::LIST) as usize)
                .map_or(&[], |b| b.classes.as_slice()),
            Some(entry) => std::slice::from_ref(entry),
        }
    }

    /// Adds `class` under `key` of `band` unless it is there; a key of two or more classes
    /// takes it by [`Bucket::admit`]'s rules.
    fn insert(&mut self, band: usize, key: u32, class: ClassId, how: Entering, ctx: &Context) {
        if class.0 & Self::LIST != 0 {
            return;
        }
        let Some(map) = self.bands.get_mut(band) else {
            return;
        };
        match map.entry(key) {
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(class);
            }
            std::collections::hash_map::Entry::Occupied(mut slot) => {
                let entry = *slot.get();
                if entry == class {
                    return;
                }
                if entry.0 & Self::LIST == 0 {
                    // A second class: the key gets a list (list ids stay below LIST too). Its
                    // first two classes are not counted against the key's foundings.
                    let list = self.lists.len() as u32;
                    self.lists.push(Bucket {
                        classes: vec![entry, class],
                        day: ctx.today,
                        foundings: 0,
                    });
                    slot.insert(ClassId(list | Self::LIST));
                } else if let Some(bucket) = self.lists.get_mut((entry.0 & !Self::LIST) as usize) {
                    bucket.admit(class, how, ctx, &mut self.stats);
                }
            }
        }
    }

    fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        self.bands
            .iter()
            .map(|b| b.capacity() * (size_of::<(u32, ClassId)>() + 1))
            .sum::<usize>()
            + self.lists.capacity() * size_of::<Bucket>()
            + self
                .lists
                .iter()
                .map(|l| l.classes.capacity() * size_of::<ClassId>())
                .sum::<usize>()
    }
}

/// What an insertion needs to know beyond the key: the day (for the founding ration) and how
/// strong the classes are.
struct Context<'a> {
    today: Day,
    strength: Strength<'a>,
}

impl Bucket {
    /// Takes `class` unless it is here already. A founding is rationed to
    /// [`MAX_KEY_FOUNDINGS_PER_DAY`] per day. A full bucket gives the newcomer the slot of its
    /// weakest class (fewest reports; of equals, the one that entered first) when the newcomer
    /// is at least as strong: a founding counts its founding report.
    fn admit(&mut self, class: ClassId, how: Entering, ctx: &Context, stats: &mut IndexStats) {
        if self.classes.contains(&class) {
            return;
        }
        if how == Entering::Founding {
            if self.day != ctx.today {
                self.day = ctx.today;
                self.foundings = 0;
            }
            if self.foundings >= MAX_KEY_FOUNDINGS_PER_DAY {
                stats.left_out_rationed += 1;
                return;
            }
            self.foundings += 1;
        }
        if self.classes.len() < MAX_BUCKET_CLASSES {
            self.classes.push(class);
            return;
        }
        let newcomer = match how {
            Entering::Founding => 1,
            Entering::Earned => ctx.strength.of(class, &self.classes),
        };
        let weakest = self
            .classes
            .iter()
            .enumerate()
            .map(|(at, &c)| (ctx.strength.of(c, &self.classes), at))
            .min();
        match weakest {
            Some((strength, at)) if strength <= newcomer => {
                self.classes.remove(at);
                self.classes.push(class);
                stats.displaced += 1;
            }
            _ => stats.left_out_full += 1,
        }
    }
}

/// Counts of the class search, for benchmarks and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SearchStats {
    /// Snippets searched for (new to the SST).
    pub searches: u64,
    /// Classes compared with (representatives' estimates taken), over all searches.
    pub candidates: u64,
    /// Estimates computed (one per representative of each candidate).
    pub estimates: u64,
}

/// The SST and EST with the locator index over the EST's representatives.
pub struct Tables {
    params: FingerprintParams,
    sst: SnippetCache,
    classes: Vec<ClassEntry>,
    index: LocatorIndex,
    /// Distinct snippet hashes ever placed (the SST's rows, counted without holding them).
    snippets: u64,
    /// Whether a search stops at the first band with a confident match ([`Tables::matches`]).
    stop_when_confident: bool,
    stats: SearchStats,
    /// Merged classes and where they went.
    merged: ClassMap,
    /// Rows changed since the last [`Tables::take_dirty`].
    dirty_snippets: HashSet<SnippetHash>,
    dirty_classes: HashSet<ClassId>,
    dirty_merges: Vec<ClassMerge>,
    /// Per class, the candidate round it was last marked in (avoids clearing a set per query).
    marks: Vec<u32>,
    round: u32,
}

impl Tables {
    /// Empty tables for `params` (agents and server must agree on them).
    pub fn new(params: FingerprintParams) -> Self {
        Self::with_snippet_cache(params, DEFAULT_SNIPPET_CACHE)
    }

    /// Empty tables that keep at most `capacity` SST rows in memory.
    pub fn with_snippet_cache(params: FingerprintParams, capacity: usize) -> Self {
        Self {
            params,
            sst: SnippetCache::new(capacity),
            classes: Vec::new(),
            index: LocatorIndex::new(Locator::bands(&params)),
            snippets: 0,
            stop_when_confident: true,
            stats: SearchStats::default(),
            merged: ClassMap::default(),
            dirty_snippets: HashSet::new(),
            dirty_classes: HashSet::new(),
            dirty_merges: Vec::new(),
            marks: Vec::new(),
            round: 0,
        }
    }

    /// Assigns one report's snippet to a class and counts the report there. A snippet whose
    /// SST row is in the store but not in memory must be loaded first
    /// ([`Tables::load_snippet`]), or it is placed anew.
    pub fn record(&mut self, snippet: Fingerprint, today: Day) -> Placement {
        if let Some(placement) = self.count_known(&snippet.hash, today) {
            return placement;
        }
        let matches = self.matches(&snippet);
        self.add_new(snippet, today, &matches)
    }

    /// Whether the snippet's SST row is in memory (if not, the caller looks in the store).
    pub fn knows(&self, snippet: &SnippetHash) -> bool {
        self.sst.get(snippet).is_some()
    }

    /// Takes in an SST row read from the store.
    pub fn load_snippet(&mut self, hash: SnippetHash, value: &[u8]) -> Result<(), RecordError> {
        let entry = decode_snippet(value)?;
        if entry.class.0 as usize >= self.classes.len() {
            return Err(damaged("sst", "snippet of an unknown class"));
        }
        self.sst.insert(hash, entry);
        Ok(())
    }

    /// [`record`](Self::record), except that a snippet that would found a new class does so
    /// only if `may_found()` says yes (asked only then, so a budget it draws on is spent only
    /// on classes actually founded); otherwise nothing changes and `None` is returned.
    pub fn record_if_founding_allowed(
        &mut self,
        snippet: Fingerprint,
        today: Day,
        may_found: impl FnOnce() -> bool,
    ) -> Option<Placement> {
        if let Some(placement) = self.count_known(&snippet.hash, today) {
            return Some(placement);
        }
        let matches = self.matches(&snippet);
        if matches.is_empty() && !may_found() {
            return None;
        }
        Some(self.add_new(snippet, today, &matches))
    }

    /// Counts a report of a snippet already in the SST; `None` for a new snippet.
    fn count_known(&mut self, snippet: &SnippetHash, today: Day) -> Option<Placement> {
        let entry = self.sst.get_mut(snippet)?;
        entry.reports += 1;
        let class = self.merged.root(entry.class);
        self.count(*snippet, class, today);
        Some(Placement {
            class,
            new_class: false,
        })
    }

    /// Places a new snippet given its `matches` (joining, merging or founding) and counts
    /// the report there.
    fn add_new(
        &mut self,
        snippet: Fingerprint,
        today: Day,
        matches: &[(ClassId, f64)],
    ) -> Placement {
        let placement = self.place(snippet, today, matches);
        self.snippets += 1;
        self.sst.insert(
            snippet.hash,
            SnippetEntry {
                class: placement.class,
                first_seen: today,
                reports: 1,
            },
        );
        if let Some(class) = self.classes.get_mut(placement.class.0 as usize) {
            class.snippets += 1;
        }
        self.count(snippet.hash, placement.class, today);
        placement
    }

    fn count(&mut self, snippet: SnippetHash, class: ClassId, today: Day) {
        let Some(entry) = self.classes.get_mut(class.0 as usize) else {
            return;
        };
        entry.reports += 1;
        if entry.reports >= 2 && entry.reports.is_power_of_two() {
            self.index_again(class, today);
        }
        self.dirty_snippets.insert(snippet);
        self.dirty_classes.insert(class);
    }

    /// Offers every representative of `class` to its keys again, now that its reports have
    /// doubled: a class left out of full buckets (or out of a key's day of foundings) takes
    /// the place of weaker ones. At most 8 x 50 look-ups, log2(reports) times in a class's life.
    fn index_again(&mut self, class: ClassId, today: Day) {
        let Some(entry) = self.classes.get(class.0 as usize) else {
            return;
        };
        let locators: Vec<Locator> = entry.representatives.iter().map(|r| r.locator).collect();
        for locator in &locators {
            self.index_representative(class, locator, Entering::Earned, today);
        }
    }

    /// The class a snippet would join, without changing anything (for tests and tools).
    pub fn best_class(&mut self, snippet: &Fingerprint) -> Option<ClassId> {
        if let Some(class) = self.class_of(&snippet.hash) {
            return Some(class);
        }
        self.matches(snippet).first().map(|&(class, _)| class)
    }

    /// The class a known snippet counts in now (its own, or the one that absorbed it), if its
    /// row is in memory.
    pub fn class_of(&self, snippet: &SnippetHash) -> Option<ClassId> {
        self.sst.get(snippet).map(|e| self.merged.root(e.class))
    }

    /// The class that holds `class` now.
    pub fn root(&self, class: ClassId) -> ClassId {
        self.merged.root(class)
    }

    /// Every merge so far.
    pub fn merges(&self) -> &ClassMap {
        &self.merged
    }

    fn place(&mut self, snippet: Fingerprint, today: Day, matches: &[(ClassId, f64)]) -> Placement {
        match matches.first() {
            Some(&(best, similarity)) => {
                let class = if MERGE_CLASSES && matches.len() > 1 {
                    self.merge(matches.iter().map(|&(c, _)| c), best, today)
                } else {
                    best
                };
                let novel = similarity < self.params.tau + NOVELTY * (1.0 - self.params.tau);
                let entry = &mut self.classes[class.0 as usize];
                if novel && entry.representatives.len() < MAX_REPRESENTATIVES {
                    entry.representatives.push(snippet);
                    self.index_representative(class, &snippet.locator, Entering::Earned, today);
                }
                Placement {
                    class,
                    new_class: false,
                }
            }
            None => {
                // Class ids are dense indices; more than u32::MAX classes cannot be reached
                // (each needs a distinct snippet and ~100 bytes of memory).
                let class = ClassId(self.classes.len() as u32);
                self.classes.push(ClassEntry {
                    representatives: vec![snippet],
                    first_seen: today,
                    reports: 0,
                    snippets: 0,
                });
                self.marks.push(0);
                self.index_representative(class, &snippet.locator, Entering::Founding, today);
                Placement {
                    class,
                    new_class: true,
                }
            }
        }
    }

    /// Every candidate class (merged classes resolved to the class that holds them) whose
    /// representatives the snippet matches at >= tau, best first (ties: older class first).
    /// Candidates are the classes indexed under the snippet's locator keys, band by band; the
    /// search stops after the first band that yields a *confident* match (at or above the
    /// novelty threshold, `tau + NOVELTY (1 - tau)`, 0.73 at the defaults: a snippet the class
    /// would not even take as a representative). Most reports of a known application are that
    /// close to their class and share its first band (probability J^2), so they cost one look-up
    /// instead of 50: each look-up in an index of 100,000 classes is a cache miss or two. A
    /// snippet with only weaker matches probes every band, so every class it matches at >= tau
    /// is found and joined (merges); one that matches a class confidently and another only
    /// weakly is placed in the first without joining them, which the next bridging window
    /// (weakly similar to both) does.
    fn matches(&mut self, snippet: &Fingerprint) -> Vec<(ClassId, f64)> {
        self.round = self.round.wrapping_add(1);
        if self.round == 0 {
            self.marks.iter_mut().for_each(|m| *m = 0);
            self.round = 1;
        }
        self.stats.searches += 1;
        let mut found: Vec<(ClassId, f64)> = Vec::new();
        let confident = self.params.tau + NOVELTY * (1.0 - self.params.tau);
        for band in 0..Locator::bands(&self.params) {
            if self.stop_when_confident && found.iter().any(|&(_, s)| s >= confident) {
                break;
            }
            for &indexed in self.index.get(band, snippet.locator.0[band]) {
                let class = self.merged.root(indexed);
                let mark = &mut self.marks[class.0 as usize];
                if *mark == self.round {
                    continue;
                }
                *mark = self.round;
                let representatives = &self.classes[class.0 as usize].representatives;
                self.stats.candidates += 1;
                self.stats.estimates += representatives.len() as u64;
                let similarity = representatives
                    .iter()
                    .map(|r| r.hash.estimate_jaccard(&snippet.hash, &self.params))
                    .fold(0.0, f64::max);
                if similarity >= self.params.tau {
                    found.push((class, similarity));
                }
            }
        }
        found.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        found
    }

    /// Joins `classes` (each its own root) into the oldest of them and returns it (`fallback`
    /// when there is none). The survivor takes the others' representatives while it has room,
    /// and their counts.
    fn merge(
        &mut self,
        classes: impl Iterator<Item = ClassId>,
        fallback: ClassId,
        today: Day,
    ) -> ClassId {
        let mut classes: Vec<ClassId> = classes.collect();
        classes.sort_unstable();
        classes.dedup();
        let Some((&into, absorbed)) = classes.split_first() else {
            return fallback;
        };
        for &class in absorbed {
            let merge = ClassMerge {
                absorbed: class,
                into,
            };
            if self.merged.insert(merge).is_err() {
                // Not a root or not younger: callers pass distinct roots, so this cannot
                // happen; skipping keeps the map a forest.
                continue;
            }
            let gone = &self.classes[class.0 as usize];
            let (reps, reports, snippets) =
                (gone.representatives.clone(), gone.reports, gone.snippets);
            let survivor = &mut self.classes[into.0 as usize];
            survivor.reports += reports;
            survivor.snippets += snippets;
            let room = MAX_REPRESENTATIVES.saturating_sub(survivor.representatives.len());
            let moved: Vec<Fingerprint> = reps.into_iter().take(room).collect();
            survivor.representatives.extend(moved.iter().copied());
            for rep in &moved {
                self.index_representative(into, &rep.locator, Entering::Earned, today);
            }
            self.dirty_merges.push(merge);
        }
        self.dirty_classes.insert(into);
        into
    }

    fn index_representative(
        &mut self,
        class: ClassId,
        locator: &Locator,
        how: Entering,
        today: Day,
    ) {
        let ctx = Context {
            today,
            strength: Strength {
                classes: &self.classes,
                merged: &self.merged,
            },
        };
        for band in 0..Locator::bands(&self.params) {
            self.index.insert(band, locator.0[band], class, how, &ctx);
        }
    }

    /// What the index did with full buckets and rationed keys so far.
    pub fn index_stats(&self) -> IndexStats {
        self.index.stats
    }

    /// Makes every search probe all 50 bands, also after a confident match (what the search
    /// costs without the early stop, and how many merges it finds: `cargo xtask bench-fleet`).
    pub fn probe_every_band(&mut self) {
        self.stop_when_confident = false;
    }

    /// The search counts so far.
    pub fn search_stats(&self) -> SearchStats {
        self.stats
    }

    /// SST rows in memory, and rows dropped from memory so far (they are in the store).
    pub fn snippet_cache(&self) -> (usize, u64) {
        (self.sst.len(), self.sst.dropped)
    }

    /// The merges made since the last call; the caller records them with its batch's cursor
    /// ([`merge_record`]).
    pub fn take_merges(&mut self) -> Vec<ClassMerge> {
        std::mem::take(&mut self.dirty_merges)
    }

    /// The rows changed since the last call, as store records: (SST rows, EST rows).
    pub fn take_dirty(&mut self) -> (Vec<Record>, Vec<Record>) {
        let snippets = std::mem::take(&mut self.dirty_snippets)
            .into_iter()
            .filter_map(|hash| {
                let entry = self.sst.get(&hash)?;
                Some((hash.0.to_vec(), encode_snippet(entry)))
            })
            .collect();
        let classes = std::mem::take(&mut self.dirty_classes)
            .into_iter()
            .filter_map(|class| {
                let entry = self.classes.get(class.0 as usize)?;
                Some((class.0.to_be_bytes().to_vec(), encode_class(entry)))
            })
            .collect();
        (snippets, classes)
    }

    /// Rebuilds the class table and its index from their records (any order) and merges; SST
    /// rows are read on demand ([`Tables::load_snippet`]).
    pub fn load(
        params: FingerprintParams,
        snippet_cache: usize,
        classes: impl IntoIterator<Item = Record>,
        merges: impl IntoIterator<Item = ClassMerge>,
    ) -> Result<Self, RecordError> {
        let mut tables = Self::with_snippet_cache(params, snippet_cache);
        let mut loaded: Vec<(ClassId, ClassEntry)> = classes
            .into_iter()
            .map(|(k, v)| {
                let key: [u8; 4] = k
                    .as_slice()
                    .try_into()
                    .map_err(|_| damaged("est", "key is not 4 bytes"))?;
                Ok((ClassId(u32::from_be_bytes(key)), decode_class(&v)?))
            })
            .collect::<Result<_, RecordError>>()?;
        loaded.sort_by_key(|(class, _)| *class);
        for (expected, (class, entry)) in loaded.into_iter().enumerate() {
            if class.0 as usize != expected {
                return Err(damaged("est", "class ids are not contiguous"));
            }
            tables.classes.push(entry);
            tables.marks.push(0);
        }
        for merge in merges {
            if merge.absorbed.0 as usize >= tables.classes.len() {
                return Err(damaged("merge", "merge of an unknown class"));
            }
            tables.merged.insert(merge)?;
        }
        // Indexed once every class and merge is known, so that full buckets keep the strongest.
        for i in 0..tables.classes.len() {
            tables.index_again(ClassId(i as u32), Day(0));
        }
        // A survivor's count includes those of the classes it absorbed.
        tables.snippets = (0..tables.classes.len())
            .filter(|&i| tables.merged.root(ClassId(i as u32)) == ClassId(i as u32))
            .map(|i| tables.classes[i].snippets)
            .sum();
        Ok(tables)
    }

    /// Number of classes that take snippets (founded and not merged into another).
    pub fn class_count(&self) -> usize {
        self.classes.len() - self.merged.len()
    }

    /// Number of classes ever founded, merged ones included.
    pub fn founded_count(&self) -> usize {
        self.classes.len()
    }

    /// Number of distinct snippet hashes placed (rows of the SST, most of them in the store
    /// only).
    pub fn snippet_count(&self) -> u64 {
        self.snippets
    }

    /// One class.
    pub fn class(&self, class: ClassId) -> Option<&ClassEntry> {
        self.classes.get(class.0 as usize)
    }

    /// One snippet's row, if it is in memory.
    pub fn snippet(&self, hash: &SnippetHash) -> Option<&SnippetEntry> {
        self.sst.get(hash)
    }

    /// The `limit` classes with the most reports, most first (ties: older class first);
    /// merged classes are counted in the class that absorbed them.
    pub fn top(&self, limit: usize) -> Vec<(ClassId, &ClassEntry)> {
        let mut all: Vec<(ClassId, &ClassEntry)> = self
            .classes
            .iter()
            .enumerate()
            .map(|(i, c)| (ClassId(i as u32), c))
            .filter(|(id, _)| self.merged.root(*id) == *id)
            .collect();
        all.sort_by(|a, b| b.1.reports.cmp(&a.1.reports).then(a.0.cmp(&b.0)));
        all.truncate(limit);
        all
    }

    /// Heap bytes the tables hold, counted from their capacities (an estimate of what the
    /// allocator holds; `cargo xtask bench` measures the allocator itself).
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        self.sst.heap_bytes()
            + self.classes.capacity() * size_of::<ClassEntry>()
            + self
                .classes
                .iter()
                .map(|c| c.representatives.capacity() * size_of::<Fingerprint>())
                .sum::<usize>()
            + self.index.heap_bytes()
            + self.marks.capacity() * size_of::<u32>()
            + self.merged.len() * 3 * size_of::<(ClassId, ClassId)>()
    }
}

fn encode_snippet(entry: &SnippetEntry) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    out.extend_from_slice(&entry.class.0.to_be_bytes());
    out.extend_from_slice(&entry.first_seen.0.to_be_bytes());
    out.extend_from_slice(&entry.reports.to_be_bytes());
    out
}

/// Reads an SST row as stored.
pub fn decode_snippet(bytes: &[u8]) -> Result<SnippetEntry, RecordError> {
    let bytes: &[u8; 16] = bytes
        .try_into()
        .map_err(|_| damaged("sst", "value is not 16 bytes"))?;
    let (class, rest) = bytes.split_at(4);
    let (day, reports) = rest.split_at(4);
    Ok(SnippetEntry {
        class: ClassId(u32::from_be_bytes(class.try_into().unwrap_or_default())),
        first_seen: Day(u32::from_be_bytes(day.try_into().unwrap_or_default())),
        reports: u64::from_be_bytes(reports.try_into().unwrap_or_default()),
    })
}

fn encode_class(entry: &ClassEntry) -> Vec<u8> {
    let mut out = Vec::with_capacity(21 + REPRESENTATIVE_BYTES * entry.representatives.len());
    out.extend_from_slice(&entry.first_seen.0.to_be_bytes());
    out.extend_from_slice(&entry.reports.to_be_bytes());
    out.extend_from_slice(&entry.snippets.to_be_bytes());
    // At most MAX_REPRESENTATIVES (8), which fits a byte.
    out.push(entry.representatives.len() as u8);
    for rep in &entry.representatives {
        out.extend_from_slice(&rep.hash.0);
        out.extend_from_slice(&rep.locator.to_bytes());
    }
    out
}

fn decode_class(bytes: &[u8]) -> Result<ClassEntry, RecordError> {
    let short = || damaged("est", "value too short");
    let (day, rest) = bytes.split_first_chunk::<4>().ok_or_else(short)?;
    let (reports, rest) = rest.split_first_chunk::<8>().ok_or_else(short)?;
    let (snippets, rest) = rest.split_first_chunk::<8>().ok_or_else(short)?;
    let (&[count], reps) = rest.split_first_chunk::<1>().ok_or_else(short)?;
    let count = usize::from(count);
    if count == 0 || count > MAX_REPRESENTATIVES || reps.len() != count * REPRESENTATIVE_BYTES {
        return Err(damaged("est", "representatives do not match their count"));
    }
    let representatives = reps
        .chunks_exact(REPRESENTATIVE_BYTES)
        .map(|c| {
            let (hash, locator) = c.split_at(32);
            let mut h = [0u8; 32];
            h.copy_from_slice(hash);
            let mut l = [0u8; LOCATOR_BYTES];
            l.copy_from_slice(locator);
            Fingerprint {
                hash: SnippetHash(h),
                locator: Locator::from_bytes(&l),
            }
        })
        .collect();
    Ok(ClassEntry {
        representatives,
        first_seen: Day(u32::from_be_bytes(*day)),
        reports: u64::from_be_bytes(*reports),
        snippets: u64::from_be_bytes(*snippets),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use penrose_core::fingerprint::Fingerprinter;

    fn names(app: usize, offset: usize, len: usize) -> Vec<String> {
        // An iteration of 300 launches over an alphabet of 40 kernels, repeated.
        (0..len)
            .map(|i| {
                let step = (offset + i) % 300;
                format!("app{app}_k{}", (step * 7 + step / 13) % 40)
            })
            .collect()
    }

    #[test]
    fn same_application_joins_one_class_others_found_their_own() {
        let f = Fingerprinter::new(FingerprintParams::default()).unwrap();
        let mut tables = Tables::new(FingerprintParams::default());
        let day = Day(20_000);
        let mut classes = Vec::new();
        for app in 0..5 {
            let mut of_app = HashSet::new();
            for window in 0..6 {
                let snippet = f.fingerprint_of_names(&names(app, window * 37, 2_000));
                of_app.insert(tables.record(snippet, day).class);
            }
            assert_eq!(of_app.len(), 1, "app {app} split over {of_app:?}");
            classes.extend(of_app);
        }
        let distinct: HashSet<_> = classes.iter().collect();
        assert_eq!(distinct.len(), 5, "{classes:?}");
        assert_eq!(tables.class_count(), 5);
        assert_eq!(tables.top(1)[0].1.reports, 6);
    }

    #[test]
    fn records_rebuild_the_same_tables() {
        let f = Fingerprinter::new(FingerprintParams::default()).unwrap();
        let mut tables = Tables::new(FingerprintParams::default());
        let (mut sst, mut est) = (HashMap::new(), HashMap::new());
        for app in 0..4 {
            for window in 0..3 {
                tables.record(
                    f.fingerprint_of_names(&names(app, window * 11, 1_000)),
                    Day(7),
                );
                let (s, e) = tables.take_dirty();
                sst.extend(s);
                est.extend(e);
            }
        }
        let rebuilt = Tables::load(FingerprintParams::default(), 64, est.clone(), []).unwrap();
        assert_eq!(rebuilt.class_count(), tables.class_count());
        assert_eq!(rebuilt.snippet_count(), tables.snippet_count());
        assert_eq!(rebuilt.snippet_count(), 12);
        for class in 0..tables.class_count() as u32 {
            assert_eq!(rebuilt.class(ClassId(class)), tables.class(ClassId(class)));
        }
        // A new window of a known application finds its class in the rebuilt index.
        let mut rebuilt = rebuilt;
        let fresh = f.fingerprint_of_names(&names(2, 101, 1_000));
        assert_eq!(rebuilt.best_class(&fresh), tables.best_class(&fresh));
        assert!(rebuilt.best_class(&fresh).is_some());
        // SST rows come back on demand, with their counts.
        let (key, value) = sst.iter().next().unwrap();
        let hash = SnippetHash(key.as_slice().try_into().unwrap());
        assert!(!rebuilt.knows(&hash));
        rebuilt.load_snippet(hash, value).unwrap();
        assert_eq!(rebuilt.snippet(&hash), tables.snippet(&hash));
        assert_eq!(rebuilt.class_of(&hash), tables.class_of(&hash));

        // Damaged records are refused, not guessed at.
        let mut bad = est.clone();
        bad.insert(
            9u32.to_be_bytes().to_vec(),
            bad[&0u32.to_be_bytes().to_vec()].clone(),
        );
        assert!(Tables::load(FingerprintParams::default(), 64, bad, []).is_err());
        assert!(rebuilt.load_snippet(hash, &[0; 3]).is_err());
        let mut of_unknown = value.clone();
        of_unknown[..4].copy_from_slice(&99u32.to_be_bytes());
        assert!(rebuilt.load_snippet(hash, &of_unknown).is_err());
        let mut cut = est.clone();
        let row = cut.get_mut(0u32.to_be_bytes().as_slice()).unwrap();
        row.pop();
        assert!(Tables::load(FingerprintParams::default(), 64, cut, []).is_err());
        let unknown = ClassMerge {
            absorbed: ClassId(99),
            into: ClassId(0),
        };
        assert!(Tables::load(FingerprintParams::default(), 64, est, [unknown]).is_err());
    }

    /// Two windows of one application far apart found two classes; a window that overlaps
    /// both joins them. Later windows of either part, and the snippets seen before the merge,
    /// count in the survivor, and the tables rebuilt from their records say the same.
    #[test]
    fn a_snippet_that_matches_two_classes_joins_them() {
        let f = Fingerprinter::new(FingerprintParams::default()).unwrap();
        let mut tables = Tables::new(FingerprintParams::default());
        let day = Day(20_000);
        // A long non-repeating application; windows a = [0, 1000) and b = [550, 1550) overlap
        // too little to share a class (true similarity 0.29), the window between them
        // overlaps each enough (0.58). The estimates are noisy (k = 100), so the sequence is
        // drawn until the estimates say so too: this tests merging, not the estimator.
        let params = FingerprintParams::default();
        let (a, b, bridge) = (1..100u64)
            .map(|seed| {
                let seq: Vec<String> = (0..2_000u64)
                    .map(|i| format!("k{}", (i * 7_919 + seed * 104_729) % 3_001))
                    .collect();
                let window = |at: usize| f.fingerprint_of_names(&seq[at..at + 1_000]);
                (window(0), window(550), window(275))
            })
            .find(|(a, b, bridge)| {
                a.hash.estimate_jaccard(&b.hash, &params) < params.tau
                    && bridge.hash.estimate_jaccard(&a.hash, &params) >= params.tau
                    && bridge.hash.estimate_jaccard(&b.hash, &params) >= params.tau
            })
            .unwrap();
        let other = f.fingerprint_of_names(&names(3, 0, 2_000));
        let ca = tables.record(a, day).class;
        let cb = tables.record(b, day).class;
        let co = tables.record(other, day).class;
        assert_ne!(ca, cb, "the two parts must found two classes for this test");
        assert_eq!(tables.class_count(), 3);
        let joined = tables.record(bridge, day).class;
        assert_eq!(joined, ca.min(cb));
        assert_eq!(tables.class_count(), 2);
        assert_eq!(tables.founded_count(), 3);
        assert_eq!(tables.class_of(&b.hash), Some(joined));
        assert_eq!(tables.class_of(&a.hash), Some(joined));
        assert_eq!(tables.record(b, day).class, joined);
        assert_eq!(tables.class_of(&other.hash), Some(co));
        let merges = tables.take_merges();
        assert_eq!(
            merges,
            vec![ClassMerge {
                absorbed: ca.max(cb),
                into: joined
            }]
        );
        assert_eq!(tables.class(joined).unwrap().reports, 4);
        assert_eq!(tables.top(10).len(), 2);

        // Rebuilt from records, including the merge record's round trip.
        let (sst, est) = tables.take_dirty();
        let (mk, mv) = merge_record(&merges[0], Cursor(5));
        let (back, cursor) = decode_merge(&mk, &mv).unwrap();
        assert_eq!((back, cursor), (merges[0], Cursor(5)));
        let mut rebuilt = Tables::load(FingerprintParams::default(), 64, est, [back]).unwrap();
        let row = sst.iter().find(|(k, _)| k.as_slice() == b.hash.0).unwrap();
        rebuilt.load_snippet(b.hash, &row.1).unwrap();
        assert_eq!(rebuilt.class_of(&b.hash), Some(joined));
        assert_eq!(rebuilt.class_count(), 2);

        // A merge record that points to a younger class is damaged.
        let (k, mut v) = merge_record(
            &ClassMerge {
                absorbed: ClassId(1),
                into: ClassId(0),
            },
            Cursor(1),
        );
        v[..4].copy_from_slice(&2u32.to_be_bytes());
        assert!(decode_merge(&k, &v).is_err());
        assert!(decode_merge(b"merge/x", &v).is_err());
    }

    #[test]
    fn rows_leave_memory_after_rotations_and_come_back_from_their_records() {
        let f = Fingerprinter::new(FingerprintParams::default()).unwrap();
        let mut tables = Tables::with_snippet_cache(FingerprintParams::default(), 4);
        let mut records = HashMap::new();
        let snippets: Vec<Fingerprint> = (0..10)
            .map(|app| f.fingerprint_of_names(&names(app, 0, 1_000)))
            .collect();
        for s in &snippets {
            tables.record(*s, Day(7));
            records.extend(tables.take_dirty().0);
        }
        let (held, dropped) = tables.snippet_cache();
        assert!(held <= 4, "{held} rows in memory");
        assert_eq!(held as u64 + dropped, 10);
        assert_eq!(tables.snippet_count(), 10);
        let first = snippets[0].hash;
        assert!(!tables.knows(&first));
        tables
            .load_snippet(first, &records[&first.0.to_vec()])
            .unwrap();
        let class = tables.class_of(&first).unwrap();
        // Loaded, a resent snippet is counted on its row, not placed anew.
        assert_eq!(tables.record(snippets[0], Day(7)).class, class);
        assert_eq!(tables.snippet(&first).unwrap().reports, 2);
        assert_eq!(tables.snippet_count(), 10);
    }

    #[test]
    fn a_made_up_locator_cannot_place_a_snippet_in_a_class_it_does_not_match() {
        let f = Fingerprinter::new(FingerprintParams::default()).unwrap();
        let mut tables = Tables::new(FingerprintParams::default());
        let real = f.fingerprint_of_names(&names(1, 0, 2_000));
        let class = tables.record(real, Day(7)).class;
        // Another application's hash with the class's locator: found as a candidate, refused
        // by the estimate, so it founds a class of its own.
        let forged = Fingerprint {
            hash: f.snippet_hash(&names(2, 0, 2_000)),
            locator: real.locator,
        };
        let placed = tables.record(forged, Day(7));
        assert!(placed.new_class);
        assert_ne!(placed.class, class);
        assert_eq!(tables.search_stats().candidates, 1);
        // The class's own hash with a locator of nothing: not found, so a class is founded
        // (a sender can always split its own reports off; it cannot join others').
        let hidden = Fingerprint {
            hash: f.snippet_hash(&names(1, 50, 2_000)),
            locator: Locator([7; penrose_core::fingerprint::LOCATOR_BANDS]),
        };
        assert!(tables.record(hidden, Day(7)).new_class);
    }

    /// Founds `count` junk classes on `day`, each a hash of its own under `locator` (an
    /// abusive client's made-up locator naming a target's keys).
    fn found_junk(
        tables: &mut Tables,
        f: &Fingerprinter,
        locator: Locator,
        day: Day,
        count: usize,
    ) {
        let start = tables.founded_count();
        for j in start..start + count {
            let junk = Fingerprint {
                hash: f.snippet_hash(&names(10_000 + j, 0, 500)),
                locator,
            };
            assert!(tables.record(junk, day).new_class);
        }
    }

    /// The classes indexed under every key of `locator`, band by band.
    fn buckets_of(tables: &Tables, locator: &Locator) -> Vec<Vec<ClassId>> {
        (0..Locator::bands(&FingerprintParams::default()))
            .map(|band| tables.index.get(band, locator.0[band]).to_vec())
            .collect()
    }

    #[test]
    fn a_bucket_indexes_at_most_its_cap_of_classes() {
        let f = Fingerprinter::new(FingerprintParams::default()).unwrap();
        let mut tables = Tables::new(FingerprintParams::default());
        let shared = f.fingerprint_of_names(&names(0, 0, 500)).locator;
        // A key takes 8 foundings a day after its first two: 84 foundings on one day fill
        // 10 slots, and 11 days fill the bucket.
        found_junk(&mut tables, &f, shared, Day(7), MAX_BUCKET_CLASSES + 20);
        let per_day = 2 + MAX_KEY_FOUNDINGS_PER_DAY as usize;
        assert!(
            buckets_of(&tables, &shared)
                .iter()
                .all(|b| b.len() == per_day)
        );
        for day in 8..20 {
            found_junk(&mut tables, &f, shared, Day(day), 10);
        }
        let buckets = buckets_of(&tables, &shared);
        assert!(buckets.iter().all(|b| b.len() == MAX_BUCKET_CLASSES));
        // One report naming those keys is compared with at most the cap's classes.
        let before = tables.search_stats().candidates;
        tables.record(
            Fingerprint {
                hash: f.snippet_hash(&names(999, 0, 500)),
                locator: shared,
            },
            Day(20),
        );
        assert_eq!(
            tables.search_stats().candidates - before,
            MAX_BUCKET_CLASSES as u64
        );
    }

    /// The review's attack: an abusive client founds junk classes on a target application's
    /// band keys until its buckets are full, before the application founds its class, and goes
    /// on founding after it. The application's class still takes a slot in each bucket, keeps
    /// it, and its later windows find it (with no displacement they found classes of their own).
    #[test]
    fn junk_founded_on_a_targets_keys_cannot_keep_its_windows_from_their_class() {
        let f = Fingerprinter::new(FingerprintParams::default()).unwrap();
        let mut tables = Tables::new(FingerprintParams::default());
        let first = f.fingerprint_of_names(&names(1, 0, 2_000));
        for day in 0..10 {
            found_junk(&mut tables, &f, first.locator, Day(day), 12);
        }
        assert!(
            buckets_of(&tables, &first.locator)
                .iter()
                .all(|b| b.len() == MAX_BUCKET_CLASSES)
        );
        let target = tables.record(first, Day(10));
        assert!(target.new_class);
        // More junk the same day: the ration and the 64 older junk classes keep the target in.
        found_junk(&mut tables, &f, first.locator, Day(10), 40);
        let stats = tables.index_stats();
        assert!(
            stats.displaced >= 50 && stats.left_out_rationed > 0,
            "{stats:?}"
        );
        assert!(
            buckets_of(&tables, &first.locator)
                .iter()
                .all(|b| b.contains(&target.class))
        );
        for window in 1..=12 {
            let later = f.fingerprint_of_names(&names(1, window * 37, 2_000));
            assert_eq!(
                tables.record(later, Day(10)).class,
                target.class,
                "window {window}"
            );
        }
        // Stronger now than any junk class: days of junk afterwards never displace it.
        for day in 11..20 {
            found_junk(&mut tables, &f, first.locator, Day(day), 12);
        }
        assert!(
            buckets_of(&tables, &first.locator)
                .iter()
                .all(|b| b.contains(&target.class))
        );
        let late = f.fingerprint_of_names(&names(1, 1_001, 2_000));
        assert_eq!(tables.record(late, Day(20)).class, target.class);
    }

    /// A client that spends a key's day of foundings before the application founds its class
    /// keeps the class out of those keys for as long as the class has one report; its second
    /// report (here the same window from another GPU) makes it enter, and its later windows
    /// find it.
    #[test]
    fn a_founding_left_out_by_its_keys_ration_enters_when_its_reports_double() {
        let f = Fingerprinter::new(FingerprintParams::default()).unwrap();
        let mut tables = Tables::new(FingerprintParams::default());
        let first = f.fingerprint_of_names(&names(1, 0, 2_000));
        found_junk(&mut tables, &f, first.locator, Day(3), 2 + 8);
        let target = tables.record(first, Day(3)).class;
        assert!(
            buckets_of(&tables, &first.locator)
                .iter()
                .all(|b| !b.contains(&target))
        );
        assert_eq!(tables.index_stats().left_out_rationed, 50);
        assert_eq!(tables.record(first, Day(3)).class, target);
        assert!(
            buckets_of(&tables, &first.locator)
                .iter()
                .all(|b| b.contains(&target))
        );
        let later = f.fingerprint_of_names(&names(1, 74, 2_000));
        assert_eq!(tables.record(later, Day(3)).class, target);
    }

    /// Rebuilt from its records, a full bucket keeps its strongest classes, whatever the order
    /// they were founded in.
    #[test]
    fn a_rebuilt_full_bucket_keeps_its_strongest_classes() {
        let f = Fingerprinter::new(FingerprintParams::default()).unwrap();
        let mut tables = Tables::new(FingerprintParams::default());
        let first = f.fingerprint_of_names(&names(1, 0, 2_000));
        for day in 0..10 {
            found_junk(&mut tables, &f, first.locator, Day(day), 12);
        }
        let target = tables.record(first, Day(10)).class;
        for window in 1..=4 {
            tables.record(
                f.fingerprint_of_names(&names(1, window * 37, 2_000)),
                Day(10),
            );
        }
        let (_, est) = tables.take_dirty();
        let mut all: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        all.extend(est);
        let rebuilt = Tables::load(FingerprintParams::default(), 64, all, []).unwrap();
        let buckets = buckets_of(&rebuilt, &first.locator);
        assert!(buckets.iter().all(|b| b.len() == MAX_BUCKET_CLASSES));
        assert!(buckets.iter().all(|b| b.contains(&target)));
    }

    #[test]
    fn counts_survive_a_rebuild_with_merges() {
        use crate::fleet::{SimilarityProfile, SyntheticFleet};
        use rand::SeedableRng;
        let profile = SimilarityProfile::new(vec![0.3, 0.45, 0.6, 0.9]).unwrap();
        let fleet = SyntheticFleet::new(40, 0.05, profile, 3).unwrap();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
        let mut tables = Tables::new(FingerprintParams::default());
        // Every band, so that confident matches also join the classes they bridge.
        tables.probe_every_band();
        let mut est = HashMap::new();
        let mut merges = Vec::new();
        for app in 0..40 {
            tables.record(fleet.founder(app, &mut rng).fingerprint, Day(7));
        }
        for _ in 0..600 {
            tables.record(fleet.draw(&mut rng).fingerprint, Day(7));
            est.extend(tables.take_dirty().1);
            merges.extend(tables.take_merges());
        }
        assert!(!merges.is_empty(), "the profile is meant to cause merges");
        assert_eq!(tables.snippet_count(), 640);
        let rebuilt = Tables::load(FingerprintParams::default(), 64, est, merges).unwrap();
        assert_eq!(rebuilt.snippet_count(), 640);
        assert_eq!(rebuilt.class_count(), tables.class_count());
    }
}
