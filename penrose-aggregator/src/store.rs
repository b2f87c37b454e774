//! Durable storage behind a small trait, so that a larger fleet can run the same server on a
//! distributed store (docs/design.md section 6); [`RocksStore`] is the one implementation.
//!
//! The contract the rest of the server relies on: [`Store::write`] applies a [`WriteSet`]
//! atomically and returns only once it is durable (RocksDB: one `WriteBatch`, WAL synced),
//! so that an ack sent after it can never be lost; and [`Store::scan`] reads several tables at
//! one consistent point in time, which is what lets export run while ingest keeps writing.

use std::path::Path;

use penrose_kv::{Kv, KvError, Table as _};
use rocksdb::checkpoint::Checkpoint;
use rocksdb::{
    BlockBasedOptions, ColumnFamilyDescriptor, DB, IteratorMode, MemtableFactory, Options,
    ReadOptions, SliceTransform,
};
use thiserror::Error;

/// The tables (RocksDB column families) the server keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Table {
    /// Report ids and ciphertext digests already counted, under the report's day: the
    /// deduplication record (keys in `crate::state::seen`).
    Seen,
    /// The snippet table (the paper's SST): snippet hash -> class, first seen day, reports.
    /// Its column family is named `sst`; RocksDB's own sorted-string files are called "files
    /// on disk" everywhere (`TableSize::disk_bytes`, metric kind `disk`) so the two never share
    /// a name.
    Sst,
    /// Class -> representative snippet hashes, first seen day, reports.
    Est,
    /// (class, catalogue, counter, generation) -> encrypted sums and counts.
    Ash,
    /// Counters and settings of the server itself (cursor, throttle, key ids).
    Meta,
    /// Admission tokens spent: the token's epoch (the report's day) and spent id -> the
    /// report it admitted (keys in `crate::state::spent`).
    Spent,
    /// Contributor evidence: per report of a sum, its binding and evidence token, under the
    /// sum's ASH key and the report id (`crate::evidence`), for the release auditor.
    Evidence,
}

impl Table {
    /// Every table, in a fixed order.
    pub const ALL: [Table; 7] = [
        Table::Seen,
        Table::Sst,
        Table::Est,
        Table::Ash,
        Table::Meta,
        Table::Spent,
        Table::Evidence,
    ];

    /// Tables a store of the current format may lack because it was written before they
    /// existed; opening it adds them, empty ([`RocksStore::open`]). Evidence rows are only
    /// ever additions: a store without them is read the same.
    pub const ADDED_LATER: [Table; 1] = [Table::Evidence];
}

impl penrose_kv::Table for Table {
    fn name(self) -> &'static str {
        match self {
            Table::Seen => "seen",
            Table::Sst => "sst",
            Table::Est => "est",
            Table::Ash => "ash",
            Table::Meta => "meta",
            Table::Spent => "spent",
            Table::Evidence => "evidence",
        }
    }
}

/// Writes that must become durable together or not at all, applied in the order they were
/// added.
pub type WriteSet = penrose_kv::WriteSet<Table>;

/// The size of one table on disk, as the store estimates it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TableSize {
    /// The table's name.
    pub table: &'static str,
    /// Estimated number of keys.
    pub keys: u64,
    /// Bytes of its files on disk (RocksDB's sorted-string files, not to be confused with
    /// the snippet table, `Table::Sst`).
    pub disk_bytes: u64,
    /// Bytes in memtables not yet flushed.
    pub memtable_bytes: u64,
}

/// The identity of a store's directory: what a copy of it cannot keep and a rename on one
/// file system does (`crate::copies`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreHome {
    /// The directory's inode number.
    pub inode: u64,
    /// Its birth time in nanoseconds since the Unix epoch; 0 where the file system does not
    /// keep one.
    pub born_ns: u64,
}

impl StoreHome {
    /// Reads the identity of `dir`.
    pub fn of(dir: &Path) -> Result<Self, StoreError> {
        let meta = std::fs::metadata(dir).map_err(|source| {
            StoreError::File(penrose_host::FileError::Io {
                path: dir.to_path_buf(),
                source,
            })
        })?;
        let born_ns = meta
            .created()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        Ok(Self {
            inode: std::os::unix::fs::MetadataExt::ino(&meta),
            born_ns,
        })
    }

    /// Whether `other` is the same directory: the same inode, and the same birth time where
    /// both are known.
    pub fn same_directory(&self, other: &StoreHome) -> bool {
        self.inode == other.inode
            && (self.born_ns == 0 || other.born_ns == 0 || self.born_ns == other.born_ns)
    }

    /// The stored form: inode, birth time, both u64be.
    pub fn to_bytes(self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.inode.to_be_bytes());
        out[8..].copy_from_slice(&self.born_ns.to_be_bytes());
        out
    }

    /// Reads the stored form (`None`: damaged).
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let bytes: [u8; 16] = bytes.try_into().ok()?;
        let (inode, born) = bytes.split_at(8);
        Some(Self {
            inode: u64::from_be_bytes(inode.try_into().ok()?),
            born_ns: u64::from_be_bytes(born.try_into().ok()?),
        })
    }
}

impl std::fmt::Display for StoreHome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "inode {} born {} ns", self.inode, self.born_ns)
    }
}

/// Why the store failed. A failed write means nothing of it may be acknowledged.
#[derive(Debug, Error)]
pub enum StoreError {
    /// RocksDB refused, a table is missing, or another process has the store open.
    #[error(transparent)]
    Kv(#[from] KvError),
    /// A caller's visitor failed while scanning.
    #[error("{0}")]
    Visit(String),
    /// A file was not read or written.
    #[error("{0}")]
    File(#[from] penrose_host::FileError),
}

impl StoreError {
    /// Whether another process holds the store (the command exits "unavailable", not
    /// "failed": it can succeed once that process stops).
    pub fn is_busy(&self) -> bool {
        matches!(self, StoreError::Kv(KvError::Busy(_)))
    }
}

/// RocksDB's own errors, from the calls only this server makes (batched lookups, checkpoints).
impl From<rocksdb::Error> for StoreError {
    fn from(e: rocksdb::Error) -> Self {
        StoreError::Kv(KvError::Rocks(e))
    }
}

/// A visitor over (table, key, value) rows; returning an error stops the scan.
pub type Visitor<'a> = penrose_kv::Visitor<'a, Table, StoreError>;

/// What the server needs from durable storage.
pub trait Store: Send + Sync + 'static {
    /// One value.
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Which of `keys` exist in `table`, in order (one round trip for a whole batch).
    fn contains_many(&self, table: Table, keys: &[&[u8]]) -> Result<Vec<bool>, StoreError>;
    /// The values of `keys` in `table`, in order (one round trip for a whole batch).
    fn get_many(&self, table: Table, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>, StoreError>;
    /// Applies every put atomically and returns once they are durable.
    fn write(&self, set: WriteSet) -> Result<(), StoreError>;
    /// Visits every row of `tables`, all read at one consistent point in time.
    fn scan(&self, tables: &[Table], visit: &mut Visitor<'_>) -> Result<(), StoreError>;
    /// Visits the rows of `table` whose keys begin with `prefix`, in key order.
    fn scan_prefix(
        &self,
        table: Table,
        prefix: &[u8],
        visit: &mut Visitor<'_>,
    ) -> Result<(), StoreError>;
    /// Compacts every table.
    fn compact(&self) -> Result<(), StoreError>;
    /// Writes a consistent copy of the whole store into `dir` (which must not exist).
    fn backup(&self, dir: &Path) -> Result<(), StoreError>;
    /// The identity of the directory the store is in now (`crate::copies`).
    fn home(&self) -> Result<StoreHome, StoreError>;
    /// Size estimates per table.
    fn sizes(&self) -> Vec<TableSize>;
}

/// Bytes of a Seen key that choose its memtable bucket: the day (4) and kind (1) every key
/// of a day shares, and 4 bytes of the random report id or digest after them.
const SEEN_BUCKET_PREFIX: usize = 9;

/// Bytes of a Spent key that choose its memtable bucket: the epoch (4) and 4 bytes of the
/// random spent id.
const SPENT_BUCKET_PREFIX: usize = 8;

/// The first 4 bytes of a key, or all of a shorter one: an SST key's (a snippet hash,
/// uniformly random) and an EST key's (the class id, the whole key).
fn capped_prefix_4(key: &[u8]) -> &[u8] {
    &key[..key.len().min(4)]
}

/// The first 10 bytes of a key, or all of a shorter one: an ASH key's class, GPU
/// architecture, catalogue and counter, which every epoch, design key and generation of one
/// sum's series share.
fn capped_prefix_10(key: &[u8]) -> &[u8] {
    &key[..key.len().min(10)]
}

/// How a table's keys choose their memtable bucket.
enum BucketPrefix {
    /// The first so many bytes; every key of the table is at least that long.
    Fixed(usize),
    /// [`capped_prefix_4`] or [`capped_prefix_10`], under the name recorded with the table's
    /// files.
    Capped(&'static str, fn(&[u8]) -> &[u8]),
}

/// A table kept in a hash memtable: buckets by a key prefix, each a short skip list.
///
/// Seen and Spent hold random 128-bit ids and digests behind a day or epoch: point lookups,
/// and range deletions of whole days. One skip list over every id of the memtable cost a
/// fifth of the writer's time; in buckets a batch's ids go in at about one cache miss each.
/// At fleet scale nearly every report also writes a row of its own to SST, EST and ASH (a
/// new snippet, its class's row, a sum alone in its batch), read back by point lookups and
/// rarely by whole-table scans (start, export, admin); in one skip list their inserts and
/// lookups took a sixth of the server's CPU (docs/benchmarks.md). Their prefixes are capped
/// rather than fixed, so that a key shorter than the prefix is still bucketed by what it has
/// (a fixed prefix longer than a key is undefined in RocksDB). Range tombstones live in a
/// skip list of their own, and scans use a total-order iterator.
struct HashedMemtable {
    prefix: BucketPrefix,
    buckets: usize,
    /// Tuned for point lookups of mostly absent keys (dedupe).
    point_lookups: bool,
}

impl HashedMemtable {
    /// How `table` is bucketed, if it is.
    fn of(table: Table) -> Option<Self> {
        let capped_4 = BucketPrefix::Capped("penrose.capped4", capped_prefix_4);
        let (prefix, buckets, point_lookups) = match table {
            Table::Seen => (BucketPrefix::Fixed(SEEN_BUCKET_PREFIX), 1 << 20, true),
            Table::Spent => (BucketPrefix::Fixed(SPENT_BUCKET_PREFIX), 1 << 20, true),
            Table::Sst => (capped_4, 1 << 20, false),
            Table::Est => (capped_4, 1 << 16, false),
            Table::Ash => (
                BucketPrefix::Capped("penrose.capped10", capped_prefix_10),
                1 << 18,
                false,
            ),
            // Read by ranges (one sum's reports), written once: the default skip list.
            Table::Meta | Table::Evidence => return None,
        };
        Some(Self {
            prefix,
            buckets,
            point_lookups,
        })
    }

    fn apply(self, cf: &mut Options) {
        if self.point_lookups {
            cf.optimize_for_point_lookup(64);
        }
        cf.set_prefix_extractor(match self.prefix {
            BucketPrefix::Fixed(len) => SliceTransform::create_fixed_prefix(len),
            BucketPrefix::Capped(name, prefix) => SliceTransform::create(name, prefix, None),
        });
        cf.set_memtable_factory(MemtableFactory::HashSkipList {
            bucket_count: self.buckets,
            height: 4,
            branching_factor: 4,
        });
    }
}

/// The meta record that says which layout the store has (`crate::state::STORE_FORMAT`).
pub const FORMAT_KEY: &[u8] = b"format";

/// The first store format that knows the tables of [`Table::ADDED_LATER`]: opening a store
/// of it that lacks them adds them.
pub const ADDED_SINCE_FORMAT: u32 = 8;

/// The RocksDB store: one column family per [`Table`].
pub struct RocksStore {
    kv: Kv<Table>,
}

impl RocksStore {
    /// Opens (creating if needed) the database at `path`. A database that exists is opened
    /// with the tables it has: a store of an older format (without a table of this build's)
    /// is left exactly as it was, for `crate::state` to refuse by its format and for the build
    /// that wrote it to open again. Only a store of format [`ADDED_SINCE_FORMAT`] or later
    /// gains the tables added since without a format change ([`Table::ADDED_LATER`]), empty.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        // No database there yet (or none that opens): created with every table.
        let existing = Kv::<Table>::existing_tables(path).ok();
        let has = |table: Table| {
            existing
                .as_ref()
                .is_none_or(|names| names.iter().any(|n| n == table.name()))
        };
        let present: Vec<Table> = Table::ALL.into_iter().filter(|&t| has(t)).collect();
        let store = Self::open_tables(path, &present, existing.is_none())?;
        let lacks_added = Table::ADDED_LATER.iter().any(|&t| !has(t));
        if !lacks_added || !store.format_at_least(ADDED_SINCE_FORMAT)? {
            return Ok(store);
        }
        drop(store);
        Self::open_tables(path, &Table::ALL, true)
    }

    fn open_tables(path: &Path, tables: &[Table], create: bool) -> Result<Self, StoreError> {
        let mut options = Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(create);
        // Every write is synced anyway; a larger WAL only delays flushes.
        options.set_max_total_wal_size(256 << 20);
        options.set_keep_log_file_num(4);
        // One writer thread; the hash memtables (below) require it.
        options.set_allow_concurrent_memtable_write(false);
        let families = tables.iter().map(|&table| {
            let mut cf = Options::default();
            let mut block = BlockBasedOptions::default();
            // Dedupe looks up mostly absent report ids: a bloom filter answers those without
            // reading a block.
            block.set_bloom_filter(10.0, false);
            cf.set_block_based_table_factory(&block);
            if let Some(hashed) = HashedMemtable::of(table) {
                hashed.apply(&mut cf);
            }
            ColumnFamilyDescriptor::new(table.name(), cf)
        });
        Ok(Self {
            kv: Kv::open(path, &options, families.collect())?,
        })
    }

    /// Whether the store's format record says `format` or later.
    fn format_at_least(&self, format: u32) -> Result<bool, StoreError> {
        if self.kv.cf(Table::Meta).is_err() {
            return Ok(false);
        }
        Ok(self
            .kv
            .format(Table::Meta, FORMAT_KEY)?
            .is_some_and(|stored| stored >= format))
    }

    /// Where the database lives.
    pub fn path(&self) -> &Path {
        self.kv.path()
    }

    fn cf(&self, table: Table) -> Result<&rocksdb::ColumnFamily, StoreError> {
        Ok(self.kv.cf(table)?)
    }

    fn db(&self) -> &DB {
        self.kv.db()
    }
}

impl Store for RocksStore {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.kv.get(table, key)?)
    }

    fn contains_many(&self, table: Table, keys: &[&[u8]]) -> Result<Vec<bool>, StoreError> {
        let cf = self.cf(table)?;
        self.db()
            .batched_multi_get_cf(cf, keys, false)
            .into_iter()
            .map(|r| Ok(r?.is_some()))
            .collect()
    }

    fn get_many(&self, table: Table, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let cf = self.cf(table)?;
        self.db()
            .batched_multi_get_cf(cf, keys, false)
            .into_iter()
            .map(|r| Ok(r?.map(|v| v.to_vec())))
            .collect()
    }

    fn write(&self, set: WriteSet) -> Result<(), StoreError> {
        Ok(self.kv.write(set)?)
    }

    fn scan(&self, tables: &[Table], visit: &mut Visitor<'_>) -> Result<(), StoreError> {
        self.kv.scan(tables, visit)
    }

    fn scan_prefix(
        &self,
        table: Table,
        prefix: &[u8],
        visit: &mut Visitor<'_>,
    ) -> Result<(), StoreError> {
        let mut read = ReadOptions::default();
        read.fill_cache(false);
        read.set_total_order_seek(true);
        let rows = self.db().iterator_cf_opt(
            self.cf(table)?,
            read,
            IteratorMode::From(prefix, rocksdb::Direction::Forward),
        );
        for row in rows {
            let (key, value) = row?;
            if !key.starts_with(prefix) {
                break;
            }
            visit(table, &key, &value)?;
        }
        Ok(())
    }

    fn compact(&self) -> Result<(), StoreError> {
        for table in Table::ALL {
            self.db()
                .compact_range_cf(self.cf(table)?, None::<&[u8]>, None::<&[u8]>);
        }
        Ok(())
    }

    fn backup(&self, dir: &Path) -> Result<(), StoreError> {
        // A checkpoint is a consistent copy made of hard links where it can be (same file
        // system) and copies elsewhere, taken while writes continue.
        self.db().flush_wal(true)?;
        Checkpoint::new(self.db())?.create_checkpoint(dir)?;
        Ok(())
    }

    fn home(&self) -> Result<StoreHome, StoreError> {
        StoreHome::of(self.path())
    }

    fn sizes(&self) -> Vec<TableSize> {
        Table::ALL
            .iter()
            .filter_map(|&table| {
                let cf = self.cf(table).ok()?;
                let int = |name: &str| {
                    self.db()
                        .property_int_value_cf(cf, name)
                        .ok()
                        .flatten()
                        .unwrap_or(0)
                };
                Some(TableSize {
                    table: table.name(),
                    keys: int("rocksdb.estimate-num-keys"),
                    disk_bytes: int("rocksdb.total-sst-files-size"),
                    memtable_bytes: int("rocksdb.cur-size-all-mem-tables"),
                })
            })
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A database with these column families, as an earlier build left it.
    fn database_with(path: &Path, families: &[&str]) {
        let mut options = Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        DB::open_cf(&options, path, families).unwrap();
    }

    #[test]
    fn a_store_of_the_current_format_gains_the_evidence_table_and_an_older_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let current = dir.path().join("current");
        database_with(&current, &["seen", "sst", "est", "ash", "meta", "spent"]);
        {
            let store = RocksStore::open(&current).unwrap();
            let mut set = WriteSet::new();
            set.put(
                Table::Meta,
                FORMAT_KEY.to_vec(),
                8u32.to_be_bytes().to_vec(),
            );
            store.write(set).unwrap();
        }
        {
            let store = RocksStore::open(&current).unwrap();
            let mut set = WriteSet::new();
            set.put(Table::Evidence, b"k".to_vec(), b"v".to_vec());
            store.write(set).unwrap();
        }
        let store = RocksStore::open(&current).unwrap();
        assert_eq!(
            store.get(Table::Evidence, b"k").unwrap().as_deref(),
            Some(&b"v"[..])
        );
        drop(store);
        // Older: format 6 or 7 (every other table, an older format record), or no Spent
        // table at all. Left as they were, so the build that wrote them opens them again.
        for (name, families, format) in [
            (
                "format7",
                &["seen", "sst", "est", "ash", "meta", "spent"][..],
                Some(7u32),
            ),
            (
                "unmarked",
                &["seen", "sst", "est", "ash", "meta", "spent"][..],
                None,
            ),
            (
                "no-spent",
                &["seen", "sst", "est", "ash", "meta"][..],
                Some(5),
            ),
        ] {
            let older = dir.path().join(name);
            database_with(&older, families);
            if let Some(format) = format {
                let store = RocksStore::open(&older).unwrap();
                let mut set = WriteSet::new();
                set.put(
                    Table::Meta,
                    FORMAT_KEY.to_vec(),
                    format.to_be_bytes().to_vec(),
                );
                store.write(set).unwrap();
            }
            let store = RocksStore::open(&older).unwrap();
            let mut set = WriteSet::new();
            set.put(Table::Evidence, b"k".to_vec(), b"v".to_vec());
            assert!(
                matches!(
                    store.write(set),
                    Err(StoreError::Kv(KvError::MissingTable("evidence")))
                ),
                "{name}"
            );
            drop(store);
            let names = DB::list_cf(&Options::default(), &older).unwrap();
            assert_eq!(names.len(), families.len() + 1, "{name}: {names:?}");
        }
    }

    #[test]
    fn scan_prefix_visits_only_its_range_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path()).unwrap();
        let mut set = WriteSet::new();
        for key in [&b"ab2"[..], b"ab1", b"a", b"ac", b"abc", b"b"] {
            set.put(Table::Evidence, key.to_vec(), key.to_vec());
        }
        store.write(set).unwrap();
        let mut seen = Vec::new();
        store
            .scan_prefix(Table::Evidence, b"ab", &mut |_, k, _| {
                seen.push(k.to_vec());
                Ok(())
            })
            .unwrap();
        assert_eq!(seen, [&b"ab1"[..], b"ab2", b"abc"]);
    }

    #[test]
    fn writes_are_atomic_visible_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        {
            let store = RocksStore::open(&path).unwrap();
            let mut set = WriteSet::new();
            set.put(Table::Seen, b"day1-id-0000001".to_vec(), b"".to_vec());
            set.put(Table::Ash, b"a".to_vec(), b"1".to_vec());
            set.put(Table::Ash, b"a".to_vec(), b"2".to_vec());
            store.write(set).unwrap();
            assert_eq!(
                store
                    .contains_many(Table::Seen, &[b"day1-id-0000001", b"day1-id-0000002"])
                    .unwrap(),
                [true, false]
            );
        }
        let store = RocksStore::open(&path).unwrap();
        assert_eq!(
            store.get(Table::Ash, b"a").unwrap().as_deref(),
            Some(&b"2"[..])
        );
        let mut rows = Vec::new();
        store
            .scan(&[Table::Ash, Table::Seen], &mut |t, k, v| {
                rows.push((t, k.to_vec(), v.to_vec()));
                Ok(())
            })
            .unwrap();
        assert_eq!(
            rows,
            [
                (Table::Ash, b"a".to_vec(), b"2".to_vec()),
                (Table::Seen, b"day1-id-0000001".to_vec(), vec![])
            ]
        );
        let backup = dir.path().join("backup");
        store.backup(&backup).unwrap();
        drop(store);
        let copy = RocksStore::open(&backup).unwrap();
        assert_eq!(
            copy.get(Table::Ash, b"a").unwrap().as_deref(),
            Some(&b"2"[..])
        );
        assert_eq!(copy.sizes().len(), Table::ALL.len());
    }

    /// The hash memtables of SST, EST and ASH bucket by a key prefix: keys shorter than it,
    /// keys sharing it, rewritten keys and range deletions must all behave as in one sorted
    /// table, in the memtable, after a flush and after a reopen.
    #[test]
    fn hashed_tables_answer_like_sorted_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        // Short keys, keys sharing a 4- and a 10-byte prefix, and longer random-looking ones.
        let mut keys: Vec<Vec<u8>> = vec![b"".to_vec(), b"a".to_vec(), b"abc".to_vec()];
        for i in 0u8..40 {
            keys.push([b"abcd".as_slice(), &[i; 3]].concat());
            keys.push([b"0123456789".as_slice(), &[i; 9]].concat());
            keys.push(
                (0..32u8)
                    .map(|j| i.wrapping_mul(37).wrapping_add(j.wrapping_mul(11)))
                    .collect(),
            );
        }
        keys.sort();
        keys.dedup();
        let tables = [Table::Sst, Table::Est, Table::Ash];
        let check = |store: &RocksStore, version: u8| {
            let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            let absent: Vec<&[u8]> = vec![b"ab", b"abcd\xff", b"0123456789\xff"];
            for table in tables {
                let values = store.get_many(table, &refs).unwrap();
                assert!(
                    values.iter().all(|v| v.as_deref() == Some(&[version][..])),
                    "{table:?}"
                );
                assert_eq!(store.get(table, b"a").unwrap(), Some(vec![version]));
                assert_eq!(
                    store.contains_many(table, &absent).unwrap(),
                    [false, false, false]
                );
                let mut scanned = Vec::new();
                store
                    .scan(&[table], &mut |_, k, v| {
                        assert_eq!(v, [version]);
                        scanned.push(k.to_vec());
                        Ok(())
                    })
                    .unwrap();
                assert_eq!(scanned, keys, "{table:?} scans in key order");
            }
        };
        {
            let store = RocksStore::open(&path).unwrap();
            for version in [1u8, 2] {
                let mut set = WriteSet::new();
                for table in tables {
                    // Unsorted, as a batch's rows come.
                    for key in keys.iter().rev() {
                        set.put(table, key.clone(), vec![version]);
                    }
                }
                store.write(set).unwrap();
            }
            check(&store, 2);
            store.compact().unwrap();
            check(&store, 2);
            let mut set = WriteSet::new();
            for table in tables {
                set.delete_range(table, b"abcd".to_vec(), b"abce".to_vec());
            }
            store.write(set).unwrap();
            for table in tables {
                assert_eq!(
                    store.get(table, &keys[keys.len() / 2]).unwrap().is_some(),
                    !keys[keys.len() / 2].starts_with(b"abcd")
                );
                assert!(store.get(table, b"abcd\x05\x05\x05").unwrap().is_none());
            }
            let mut set = WriteSet::new();
            for table in tables {
                for key in keys.iter().filter(|k| k.starts_with(b"abcd")) {
                    set.put(table, key.clone(), vec![2]);
                }
            }
            store.write(set).unwrap();
        }
        let store = RocksStore::open(&path).unwrap();
        check(&store, 2);
    }

    #[test]
    fn range_deletes_drop_whole_days_of_seen_and_stay_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let key = |day: u32, i: u8| {
            let mut k = day.to_be_bytes().to_vec();
            k.push(0);
            k.extend_from_slice(&[i; 16]);
            k
        };
        let seen = |store: &RocksStore| {
            let mut rows = Vec::new();
            store
                .scan(&[Table::Seen], &mut |_, k, _| {
                    rows.push(k.to_vec());
                    Ok(())
                })
                .unwrap();
            rows
        };
        {
            let store = RocksStore::open(&path).unwrap();
            let mut set = WriteSet::new();
            for day in [1, 2, 3] {
                for i in 0..50 {
                    set.put(Table::Seen, key(day, i), b"".to_vec());
                }
            }
            store.write(set).unwrap();
            let mut set = WriteSet::new();
            set.delete_range(
                Table::Seen,
                0u32.to_be_bytes().to_vec(),
                3u32.to_be_bytes().to_vec(),
            );
            set.put(Table::Seen, key(3, 99), b"".to_vec());
            store.write(set).unwrap();
            let keys = [key(1, 7), key(2, 7), key(3, 7), key(3, 99)];
            let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            assert_eq!(
                store.contains_many(Table::Seen, &keys).unwrap(),
                [false, false, true, true]
            );
            assert_eq!(seen(&store).len(), 51);
            store.compact().unwrap();
            assert_eq!(seen(&store).len(), 51);
        }
        let store = RocksStore::open(&path).unwrap();
        let rows = seen(&store);
        assert_eq!(rows.len(), 51);
        assert!(rows.iter().all(|k| k[..4] == 3u32.to_be_bytes()));
    }
}
