//! The key-value layer both servers with a store stand on (the aggregation server's reports
//! and sums, the issuer's enrolments and counts): RocksDB with one column family per table,
//! every write one `WriteBatch` synced to the WAL before it returns, scans read at one
//! snapshot, and a format record in a meta table. Each server names its own tables (a type
//! implementing [`Table`]) and tunes its own column families; what they share is here, once.
//!
//! The agent keeps no database: it never links this crate (`cargo tree -p penrose-agent`
//! shows no `rocksdb`).

use std::fmt::Debug;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use rocksdb::{ColumnFamilyDescriptor, DB, IteratorMode, Options, ReadOptions, WriteBatch};
use thiserror::Error;

/// A store's tables: each one a RocksDB column family of this name.
pub trait Table: Copy + Eq + Debug + Send + Sync + 'static {
    /// The column family's name.
    fn name(self) -> &'static str;
}

/// Why the store failed. A failed write means nothing of it may be acknowledged.
#[derive(Debug, Error)]
pub enum KvError {
    /// RocksDB refused.
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
    /// A column family is missing from an opened database.
    #[error("column family {0} missing")]
    MissingTable(&'static str),
    /// Another process has the database open.
    #[error(
        "{0} is in use by another process (a running server?); stop it first: a store is \
         opened by one process at a time"
    )]
    Busy(PathBuf),
}

/// One change of a [`WriteSet`].
#[derive(Debug)]
enum Op<T> {
    Put(T, Vec<u8>, Vec<u8>),
    /// Every key from `.1` (inclusive) to `.2` (exclusive).
    DeleteRange(T, Vec<u8>, Vec<u8>),
}

/// Writes that must become durable together or not at all, applied in the order they were
/// added.
#[derive(Debug)]
pub struct WriteSet<T> {
    ops: Vec<Op<T>>,
}

impl<T> Default for WriteSet<T> {
    fn default() -> Self {
        Self { ops: Vec::new() }
    }
}

impl<T: Table> WriteSet<T> {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a put; a later put of the same key in the same set wins.
    pub fn put(&mut self, table: T, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        self.ops.push(Op::Put(table, key.into(), value.into()));
    }

    /// Deletes every key of `table` from `from` (inclusive) to `to` (exclusive), those
    /// written before in the same set included.
    pub fn delete_range(&mut self, table: T, from: impl Into<Vec<u8>>, to: impl Into<Vec<u8>>) {
        self.ops
            .push(Op::DeleteRange(table, from.into(), to.into()));
    }

    /// Number of changes.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the set holds nothing.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Bytes of keys and values, for metrics.
    pub fn bytes(&self) -> usize {
        self.ops
            .iter()
            .map(|op| match op {
                Op::Put(_, k, v) | Op::DeleteRange(_, k, v) => k.len() + v.len(),
            })
            .sum()
    }
}

/// A visitor over (table, key, value) rows; returning an error stops the scan.
pub type Visitor<'a, T, E> = dyn FnMut(T, &[u8], &[u8]) -> Result<(), E> + 'a;

/// A RocksDB database whose column families are the tables `T`.
pub struct Kv<T> {
    db: DB,
    path: PathBuf,
    tables: PhantomData<T>,
}

impl<T> Debug for Kv<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kv").field("path", &self.path).finish()
    }
}

impl<T: Table> Kv<T> {
    /// Opens the database at `path` with `families` (each table's tuned options), refusing
    /// one another process holds ([`KvError::Busy`]).
    pub fn open(
        path: &Path,
        options: &Options,
        families: Vec<ColumnFamilyDescriptor>,
    ) -> Result<Self, KvError> {
        let db = DB::open_cf_descriptors(options, path, families).map_err(|e| {
            // RocksDB says so only in words: "IO error: While lock file: .../LOCK: ...".
            if e.to_string().contains("LOCK") {
                KvError::Busy(path.to_owned())
            } else {
                KvError::Rocks(e)
            }
        })?;
        Ok(Self {
            db,
            path: path.to_owned(),
            tables: PhantomData,
        })
    }

    /// The column families of the database at `path` (an error where there is none, or it
    /// does not open).
    pub fn existing_tables(path: &Path) -> Result<Vec<String>, KvError> {
        Ok(DB::list_cf(&Options::default(), path)?)
    }

    /// Where the database lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The database itself, for what one server alone does with it (batched lookups,
    /// checkpoints, compaction, size properties).
    pub fn db(&self) -> &DB {
        &self.db
    }

    /// The column family of `table`.
    pub fn cf(&self, table: T) -> Result<&rocksdb::ColumnFamily, KvError> {
        self.db
            .cf_handle(table.name())
            .ok_or(KvError::MissingTable(table.name()))
    }

    /// One value.
    pub fn get(&self, table: T, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        Ok(self.db.get_cf(self.cf(table)?, key)?)
    }

    /// Applies every change atomically and returns once it is durable (WAL synced).
    pub fn write(&self, set: WriteSet<T>) -> Result<(), KvError> {
        let mut batch = WriteBatch::default();
        for op in &set.ops {
            match op {
                Op::Put(table, key, value) => batch.put_cf(self.cf(*table)?, key, value),
                Op::DeleteRange(table, from, to) => {
                    batch.delete_range_cf(self.cf(*table)?, from, to);
                }
            }
        }
        let mut options = rocksdb::WriteOptions::default();
        options.set_sync(true);
        self.db.write_opt(batch, &options)?;
        Ok(())
    }

    /// Visits every row of `tables`, all read at one point in time (writes may go on); a
    /// visitor error stops the scan and is returned.
    pub fn scan<E: From<KvError>>(
        &self,
        tables: &[T],
        visit: &mut Visitor<'_, T, E>,
    ) -> Result<(), E> {
        let snapshot = self.db.snapshot();
        for &table in tables {
            let mut read = ReadOptions::default();
            read.set_snapshot(&snapshot);
            // A scan reads everything once; keep it out of the block cache.
            read.fill_cache(false);
            // Every row, whatever the table's prefix extractor.
            read.set_total_order_seek(true);
            let cf = self.cf(table)?;
            for row in self.db.iterator_cf_opt(cf, read, IteratorMode::Start) {
                let (key, value) = row.map_err(KvError::from)?;
                visit(table, &key, &value)?;
            }
        }
        Ok(())
    }

    /// The format record `key` of table `meta` (a u32, big-endian); `None` where there is
    /// none or it is damaged, which a caller refuses as a store it did not write.
    pub fn format(&self, meta: T, key: &[u8]) -> Result<Option<u32>, KvError> {
        Ok(self
            .get(meta, key)?
            .and_then(|v| <[u8; 4]>::try_from(v.as_slice()).ok())
            .map(u32::from_be_bytes))
    }
}

/// The column family descriptors of `tables`, each with default options: for a store that
/// tunes none.
pub fn plain_families<T: Table>(tables: &[T]) -> Vec<ColumnFamilyDescriptor> {
    tables
        .iter()
        .map(|table| ColumnFamilyDescriptor::new(table.name(), Options::default()))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum T {
        Rows,
        Meta,
    }

    impl Table for T {
        fn name(self) -> &'static str {
            match self {
                T::Rows => "rows",
                T::Meta => "meta",
            }
        }
    }

    fn open(path: &Path) -> Result<Kv<T>, KvError> {
        let mut options = Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        Kv::open(path, &options, plain_families(&[T::Rows, T::Meta]))
    }

    #[test]
    fn writes_are_atomic_ranges_delete_and_scans_see_every_table() {
        let dir = tempfile::tempdir().unwrap();
        let kv = open(dir.path()).unwrap();
        let mut set = WriteSet::new();
        for k in [b"a", b"b", b"c"] {
            set.put(T::Rows, k.to_vec(), b"v".to_vec());
        }
        set.put(T::Meta, b"format".to_vec(), 7u32.to_be_bytes().to_vec());
        set.delete_range(T::Rows, b"b".to_vec(), b"c".to_vec());
        assert_eq!((set.len(), set.bytes()), (5, 3 * 2 + (6 + 4) + 2));
        kv.write(set).unwrap();
        let mut rows = Vec::new();
        kv.scan::<KvError>(&[T::Rows, T::Meta], &mut |t, k, _| {
            rows.push((t, k.to_vec()));
            Ok(())
        })
        .unwrap();
        assert_eq!(
            rows,
            [
                (T::Rows, b"a".to_vec()),
                (T::Rows, b"c".to_vec()),
                (T::Meta, b"format".to_vec())
            ]
        );
        assert_eq!(kv.format(T::Meta, b"format").unwrap(), Some(7));
        assert_eq!(kv.format(T::Meta, b"other").unwrap(), None);
    }

    #[test]
    fn a_database_held_by_another_opener_is_busy_and_a_missing_table_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let kv = open(dir.path()).unwrap();
        assert!(matches!(open(dir.path()), Err(KvError::Busy(_))));
        drop(kv);
        assert!(open(dir.path()).is_ok());
        let other = tempfile::tempdir().unwrap();
        let mut options = Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        let kv: Kv<T> = Kv::open(other.path(), &options, plain_families(&[T::Rows])).unwrap();
        let mut set = WriteSet::new();
        set.put(T::Meta, b"k".to_vec(), b"v".to_vec());
        assert!(matches!(kv.write(set), Err(KvError::MissingTable("meta"))));
    }
}
