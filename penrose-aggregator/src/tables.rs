//! The snippet table (SST) and the class table (EST): which application class every snippet
//! hash belongs to.
//!
//! A snippet hash seen before is looked up in the SST. A new one is compared with the
//! representatives of the classes an LSH index over their band keys names as candidates; it
//! joins the class with the highest estimated similarity at or above tau, or founds a new
//! class with itself as representative. A class keeps up to [`MAX_REPRESENTATIVES`]
//! representatives: a joining snippet that is not already close to one
//! ([`NOVELTY`] below) becomes another, so that a class covers an application whose windows
//! vary.
//!
//! Both tables live in memory and are recorded in the store (records below), from which
//! [`Tables::load`] rebuilds them on start.

use std::collections::{HashMap, HashSet};

use penrose_core::fingerprint::{BandKey, FingerprintParams, LshBands, SnippetHash};
use penrose_core::wire::Day;
use thiserror::Error;

pub use penrose_core::bundle::ClassId;

/// Most representatives a class keeps.
pub const MAX_REPRESENTATIVES: usize = 8;

/// A joining snippet whose best similarity to the class's representatives is below
/// `tau + NOVELTY * (1 - tau)` becomes a representative (while there is room).
pub const NOVELTY: f64 = 0.5;

/// Whether a snippet that matches two or more classes at >= tau joins them into one (the
/// oldest survives), healing an application that founded several classes from windows at
/// different offsets.
pub const MERGE_CLASSES: bool = true;

/// A store record: key and value bytes.
pub type Record = (Vec<u8>, Vec<u8>);

/// One SST row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnippetEntry {
    /// The class the snippet was assigned to (never changes).
    pub class: ClassId,
    /// The server's day when the snippet first arrived.
    pub first_seen: Day,
    /// Reports counted with this snippet.
    pub reports: u64,
}

/// One EST row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassEntry {
    /// Snippet hashes new snippets are compared with; the first founded the class.
    pub representatives: Vec<SnippetHash>,
    /// The server's day when the class was founded.
    pub first_seen: Day,
    /// Reports counted in this class.
    pub reports: u64,
    /// Distinct snippet hashes assigned to this class.
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
}

fn damaged(table: &'static str, why: &'static str) -> RecordError {
    RecordError::Damaged { table, why }
}

/// The SST and EST with the LSH index over the EST's representatives.
pub struct Tables {
    params: FingerprintParams,
    bands: LshBands,
    sst: HashMap<SnippetHash, SnippetEntry>,
    classes: Vec<ClassEntry>,
    index: HashMap<BandKey, Vec<ClassId>>,
    /// Rows changed since the last [`Tables::take_dirty`].
    dirty_snippets: HashSet<SnippetHash>,
    dirty_classes: HashSet<ClassId>,
    /// Per class, the candidate round it was last marked in (avoids clearing a set per query).
    marks: Vec<u32>,
    round: u32,
}

impl Tables {
    /// Empty tables for `params` (agents and server must agree on them).
    pub fn new(params: FingerprintParams) -> Self {
        Self {
            params,
            bands: LshBands::for_params(&params),
            sst: HashMap::new(),
            classes: Vec::new(),
            index: HashMap::new(),
            dirty_snippets: HashSet::new(),
            dirty_classes: HashSet::new(),
            marks: Vec::new(),
            round: 0,
        }
    }

    /// Assigns one report's snippet to a class and counts the report there.
    pub fn record(&mut self, snippet: SnippetHash, today: Day) -> Placement {
        let placement = match self.sst.get_mut(&snippet) {
            Some(entry) => {
                entry.reports += 1;
                Placement {
                    class: entry.class,
                    new_class: false,
                }
            }
            None => {
                let placement = self.place(snippet, today);
                self.sst.insert(
                    snippet,
                    SnippetEntry {
                        class: placement.class,
                        first_seen: today,
                        reports: 1,
                    },
                );
                if let Some(class) = self.classes.get_mut(placement.class.0 as usize) {
                    class.snippets += 1;
                }
                placement
            }
        };
        if let Some(class) = self.classes.get_mut(placement.class.0 as usize) {
            class.reports += 1;
        }
        self.dirty_snippets.insert(snippet);
        self.dirty_classes.insert(placement.class);
        placement
    }

    /// The class a snippet would join, without changing anything (for tests and tools).
    pub fn best_class(&mut self, snippet: &SnippetHash) -> Option<ClassId> {
        if let Some(entry) = self.sst.get(snippet) {
            return Some(entry.class);
        }
        self.best_candidate(snippet).map(|(class, _)| class)
    }

    fn place(&mut self, snippet: SnippetHash, today: Day) -> Placement {
        match self.best_candidate(&snippet) {
            Some((class, similarity)) => {
                let novel = similarity < self.params.tau + NOVELTY * (1.0 - self.params.tau);
                let entry = &mut self.classes[class.0 as usize];
                if novel && entry.representatives.len() < MAX_REPRESENTATIVES {
                    entry.representatives.push(snippet);
                    self.index_representative(class, &snippet);
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
                self.index_representative(class, &snippet);
                Placement {
                    class,
                    new_class: true,
                }
            }
        }
    }

    /// The candidate class with the highest estimated similarity, if it reaches tau.
    fn best_candidate(&mut self, snippet: &SnippetHash) -> Option<(ClassId, f64)> {
        self.round = self.round.wrapping_add(1);
        if self.round == 0 {
            self.marks.iter_mut().for_each(|m| *m = 0);
            self.round = 1;
        }
        let mut best: Option<(ClassId, f64)> = None;
        for key in self.bands.band_keys(snippet, &self.params) {
            let Some(bucket) = self.index.get(&key) else {
                continue;
            };
            for &class in bucket {
                let mark = &mut self.marks[class.0 as usize];
                if *mark == self.round {
                    continue;
                }
                *mark = self.round;
                let similarity = self.classes[class.0 as usize]
                    .representatives
                    .iter()
                    .map(|r| r.estimate_jaccard(snippet, &self.params))
                    .fold(0.0, f64::max);
                if similarity >= self.params.tau
                    && best.is_none_or(|(b, s)| similarity > s || (similarity == s && class < b))
                {
                    best = Some((class, similarity));
                }
            }
        }
        best
    }

    fn index_representative(&mut self, class: ClassId, snippet: &SnippetHash) {
        for key in self.bands.band_keys(snippet, &self.params) {
            let bucket = self.index.entry(key).or_default();
            if bucket.last() != Some(&class) {
                bucket.push(class);
            }
        }
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

    /// Rebuilds the tables from their records (any order).
    pub fn load(
        params: FingerprintParams,
        snippets: impl IntoIterator<Item = Record>,
        classes: impl IntoIterator<Item = Record>,
    ) -> Result<Self, RecordError> {
        let mut tables = Self::new(params);
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
            for rep in &entry.representatives {
                tables.index_representative(class, rep);
            }
            tables.classes.push(entry);
            tables.marks.push(0);
        }
        for (k, v) in snippets {
            let hash: [u8; 32] = k
                .as_slice()
                .try_into()
                .map_err(|_| damaged("sst", "key is not 32 bytes"))?;
            let entry = decode_snippet(&v)?;
            if entry.class.0 as usize >= tables.classes.len() {
                return Err(damaged("sst", "snippet of an unknown class"));
            }
            tables.sst.insert(SnippetHash(hash), entry);
        }
        Ok(tables)
    }

    /// Number of classes.
    pub fn class_count(&self) -> usize {
        self.classes.len()
    }

    /// Number of distinct snippet hashes.
    pub fn snippet_count(&self) -> usize {
        self.sst.len()
    }

    /// One class.
    pub fn class(&self, class: ClassId) -> Option<&ClassEntry> {
        self.classes.get(class.0 as usize)
    }

    /// One snippet's row.
    pub fn snippet(&self, hash: &SnippetHash) -> Option<&SnippetEntry> {
        self.sst.get(hash)
    }

    /// The `limit` classes with the most reports, most first (ties: older class first).
    pub fn top(&self, limit: usize) -> Vec<(ClassId, &ClassEntry)> {
        let mut all: Vec<(ClassId, &ClassEntry)> = self
            .classes
            .iter()
            .enumerate()
            .map(|(i, c)| (ClassId(i as u32), c))
            .collect();
        all.sort_by(|a, b| b.1.reports.cmp(&a.1.reports).then(a.0.cmp(&b.0)));
        all.truncate(limit);
        all
    }

    /// Heap bytes the tables hold, counted from their capacities (an estimate of what the
    /// allocator holds; `cargo xtask bench` measures the allocator itself).
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        // hashbrown: one control byte per bucket plus the bucket itself.
        let map = |capacity: usize, entry: usize| capacity * (entry + 1);
        map(
            self.sst.capacity(),
            size_of::<(SnippetHash, SnippetEntry)>(),
        ) + self.classes.capacity() * size_of::<ClassEntry>()
            + self
                .classes
                .iter()
                .map(|c| c.representatives.capacity() * size_of::<SnippetHash>())
                .sum::<usize>()
            + map(self.index.capacity(), size_of::<(BandKey, Vec<ClassId>)>())
            + self
                .index
                .values()
                .map(|b| b.capacity() * size_of::<ClassId>())
                .sum::<usize>()
            + self.marks.capacity() * size_of::<u32>()
    }
}

fn encode_snippet(entry: &SnippetEntry) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    out.extend_from_slice(&entry.class.0.to_be_bytes());
    out.extend_from_slice(&entry.first_seen.0.to_be_bytes());
    out.extend_from_slice(&entry.reports.to_be_bytes());
    out
}

fn decode_snippet(bytes: &[u8]) -> Result<SnippetEntry, RecordError> {
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
    let mut out = Vec::with_capacity(21 + 32 * entry.representatives.len());
    out.extend_from_slice(&entry.first_seen.0.to_be_bytes());
    out.extend_from_slice(&entry.reports.to_be_bytes());
    out.extend_from_slice(&entry.snippets.to_be_bytes());
    // At most MAX_REPRESENTATIVES (8), which fits a byte.
    out.push(entry.representatives.len() as u8);
    for rep in &entry.representatives {
        out.extend_from_slice(&rep.0);
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
    if count == 0 || count > MAX_REPRESENTATIVES || reps.len() != count * 32 {
        return Err(damaged("est", "representatives do not match their count"));
    }
    let representatives = reps
        .chunks_exact(32)
        .map(|c| {
            let mut hash = [0u8; 32];
            hash.copy_from_slice(c);
            SnippetHash(hash)
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
                let snippet = f.snippet_hash(&names(app, window * 37, 2_000));
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
                tables.record(f.snippet_hash(&names(app, window * 11, 1_000)), Day(7));
                let (s, e) = tables.take_dirty();
                sst.extend(s);
                est.extend(e);
            }
        }
        let rebuilt = Tables::load(FingerprintParams::default(), sst.clone(), est.clone()).unwrap();
        assert_eq!(rebuilt.class_count(), tables.class_count());
        assert_eq!(rebuilt.snippet_count(), tables.snippet_count());
        for class in 0..tables.class_count() as u32 {
            assert_eq!(rebuilt.class(ClassId(class)), tables.class(ClassId(class)));
        }
        // A new window of a known application finds its class in the rebuilt index.
        let mut rebuilt = rebuilt;
        let fresh = f.snippet_hash(&names(2, 101, 1_000));
        assert_eq!(rebuilt.best_class(&fresh), tables.best_class(&fresh));
        assert!(rebuilt.best_class(&fresh).is_some());

        // Damaged records are refused, not guessed at.
        let mut bad = est.clone();
        bad.insert(
            9u32.to_be_bytes().to_vec(),
            bad[&0u32.to_be_bytes().to_vec()].clone(),
        );
        assert!(Tables::load(FingerprintParams::default(), sst.clone(), bad).is_err());
        let mut bad = sst.clone();
        bad.insert(vec![1; 32], vec![0; 3]);
        assert!(Tables::load(FingerprintParams::default(), bad, est).is_err());
    }
}
