//! Contributor evidence on its way to the release auditor (issue 26 item 2): the aggregation
//! server writes one evidence file per exported bundle (`penrose-aggregator export-evidence`),
//! the design server keeps it beside the bundle it is of (`penrose-design import-evidence`)
//! and forwards each page's entries with the page (`crate::audit`). The design server never
//! reads an entry: the auditor counts contributors from it with keys only it holds. It checks
//! only the framing (`penrose_core::evidence_file`): which bundle, how many entries, each
//! within the limit, nothing after the last.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use penrose_core::bundle::{BundleHash, InstanceId};
use penrose_core::evidence_file::{
    EVIDENCE_FILE_HEADER_BYTES, EvidenceFileError, EvidenceFileHeader, entry_len,
};
use serde::Serialize;
use thiserror::Error;

use crate::archive::{Archive, ArchiveError};

/// Why an evidence file cannot be used.
#[derive(Debug, Error)]
pub enum EvidenceError {
    /// A file was not read or written.
    #[error("{0}")]
    File(#[from] penrose_host::FileError),
    /// Its framing is refused.
    #[error("{path}: {source}")]
    Framing {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: EvidenceFileError,
    },
    /// It ends before its last entry, or goes on after it.
    #[error("{path}: {why}")]
    Length {
        /// The file.
        path: PathBuf,
        /// In words.
        why: &'static str,
    },
    /// No archived bundle has the hash it names (import the bundle first).
    #[error("{path}: refused, no imported bundle has hash {bundle} (import the bundle first)")]
    NoSuchBundle {
        /// The file.
        path: PathBuf,
        /// The hash it names.
        bundle: String,
    },
    /// Another number of entries than its bundle.
    #[error("{path}: refused, {entries} entries for a bundle of {bundle_entries}")]
    EntryCount {
        /// The file.
        path: PathBuf,
        /// Its entries.
        entries: u32,
        /// The bundle's.
        bundle_entries: usize,
    },
    /// Other evidence of that bundle is kept already.
    #[error("{path}: refused, other evidence of bundle {seq} of chain {instance} is kept")]
    Conflict {
        /// The file.
        path: PathBuf,
        /// The chain.
        instance: InstanceId,
        /// The bundle.
        seq: u64,
    },
    /// The archive could not be read.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
}

impl EvidenceError {
    /// Whether the file itself was refused (exit code 3), not an I/O failure.
    pub fn is_refusal(&self) -> bool {
        !matches!(
            self,
            EvidenceError::File(penrose_host::FileError::Io { .. }) | EvidenceError::Archive(_)
        )
    }
}

/// What `import-evidence` did with one file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ImportedEvidence {
    /// The chain of its bundle.
    pub instance: String,
    /// Its bundle.
    pub seq: u64,
    /// Its entries.
    pub entries: u32,
    /// False when the same evidence was kept already (nothing changed).
    pub new: bool,
}

/// Keeps the evidence file at `path` beside the archived bundle it names, after checking its
/// framing and that its entries are the bundle's: copied, synced, renamed into place. The same
/// file again changes nothing; other evidence of a bundle whose evidence is kept is refused.
pub fn import(archive: &Archive, path: &Path) -> Result<ImportedEvidence, EvidenceError> {
    let file = EvidenceFile::open(path)?;
    let header = file.header();
    let bundle = archive
        .bundles()?
        .into_iter()
        .find(|b| BundleHash::of(&b.bytes) == header.bundle)
        .ok_or_else(|| EvidenceError::NoSuchBundle {
            path: path.to_path_buf(),
            bundle: penrose_core::hex::encode(&header.bundle.0),
        })?;
    if header.entries as usize != bundle.bundle.entries.len() {
        return Err(EvidenceError::EntryCount {
            path: path.to_path_buf(),
            entries: header.entries,
            bundle_entries: bundle.bundle.entries.len(),
        });
    }
    let kept = archive.evidence_path(bundle.instance, bundle.seq);
    let imported = |new| ImportedEvidence {
        instance: bundle.instance.to_string(),
        seq: bundle.seq,
        entries: header.entries,
        new,
    };
    if kept.exists() {
        let io = |source| {
            EvidenceError::File(penrose_host::FileError::Io {
                path: kept.clone(),
                source,
            })
        };
        if same_contents(&kept, path).map_err(io)? {
            return Ok(imported(false));
        }
        return Err(EvidenceError::Conflict {
            path: path.to_path_buf(),
            instance: bundle.instance,
            seq: bundle.seq,
        });
    }
    copy_durably(path, &kept)?;
    Ok(imported(true))
}

/// Whether two files hold the same bytes, read a chunk at a time (evidence files can be
/// larger than memory).
fn same_contents(a: &Path, b: &Path) -> std::io::Result<bool> {
    let (mut a, mut b) = (File::open(a)?, File::open(b)?);
    if a.metadata()?.len() != b.metadata()?.len() {
        return Ok(false);
    }
    let (mut x, mut y) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = a.read(&mut x)?;
        if n == 0 {
            return Ok(true);
        }
        b.read_exact(&mut y[..n])?;
        if x[..n] != y[..n] {
            return Ok(false);
        }
    }
}

/// Copies `from` to `to` through a temporary file beside it, synced before the rename, and
/// the directory synced after it.
fn copy_durably(from: &Path, to: &Path) -> Result<(), EvidenceError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| EvidenceError::File(penrose_host::FileError::Io { path, source })
    };
    let temp = to.with_extension("tmp");
    let copied = std::fs::copy(from, &temp)
        .and_then(|_| File::open(&temp)?.sync_all())
        .map_err(io(&temp))
        .and_then(|()| std::fs::rename(&temp, to).map_err(io(to)));
    if copied.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    copied?;
    let dir = to.parent().unwrap_or(Path::new("."));
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// An evidence file, its entries located (not read).
#[derive(Debug)]
pub struct EvidenceFile {
    path: PathBuf,
    header: EvidenceFileHeader,
    /// Per entry: where its bytes start and how many.
    entries: Vec<(u64, usize)>,
}

impl EvidenceFile {
    /// Opens and checks the framing: the header, every entry's length within the limit, the
    /// file ending right after the last entry.
    pub fn open(path: &Path) -> Result<Self, EvidenceError> {
        let io = |source| {
            EvidenceError::File(penrose_host::FileError::Io {
                path: path.to_path_buf(),
                source,
            })
        };
        let length = |why| EvidenceError::Length {
            path: path.to_path_buf(),
            why,
        };
        let framing = |source| EvidenceError::Framing {
            path: path.to_path_buf(),
            source,
        };
        let mut file = File::open(path).map_err(io)?;
        let size = file.metadata().map_err(io)?.len();
        let mut head = [0u8; EVIDENCE_FILE_HEADER_BYTES];
        file.read_exact(&mut head)
            .map_err(|_| length("shorter than an evidence file's header"))?;
        let header = EvidenceFileHeader::decode(&head).map_err(framing)?;
        let mut at = EVIDENCE_FILE_HEADER_BYTES as u64;
        let mut entries = Vec::new();
        for _ in 0..header.entries {
            let mut prefix = [0u8; 4];
            file.read_exact(&mut prefix)
                .map_err(|_| length("ends before its last entry"))?;
            let len = entry_len(prefix).map_err(framing)?;
            at += 4;
            if at + len as u64 > size {
                return Err(length("ends before its last entry"));
            }
            entries.push((at, len));
            at += len as u64;
            file.seek(SeekFrom::Start(at)).map_err(io)?;
        }
        if at != size {
            return Err(length("has bytes after its last entry"));
        }
        Ok(EvidenceFile {
            path: path.to_path_buf(),
            header,
            entries,
        })
    }

    /// Which bundle, and how many entries.
    pub fn header(&self) -> EvidenceFileHeader {
        self.header
    }

    /// Entry `index`'s length, if there is one.
    pub fn len_of(&self, index: u32) -> Option<usize> {
        self.entries.get(index as usize).map(|&(_, len)| len)
    }

    /// The encoded evidence of entries `first..first + count`, in order.
    pub fn read(&self, first: u32, count: u32) -> Result<Vec<Vec<u8>>, EvidenceError> {
        let io = |source| {
            EvidenceError::File(penrose_host::FileError::Io {
                path: self.path.clone(),
                source,
            })
        };
        let start = first as usize;
        let slots =
            self.entries
                .get(start..start + count as usize)
                .ok_or(EvidenceError::Length {
                    path: self.path.clone(),
                    why: "has fewer entries than asked for",
                })?;
        let mut file = File::open(&self.path).map_err(io)?;
        let mut out = Vec::with_capacity(slots.len());
        for &(offset, len) in slots {
            file.seek(SeekFrom::Start(offset)).map_err(io)?;
            let mut bytes = vec![0u8; len];
            file.read_exact(&mut bytes).map_err(io)?;
            out.push(bytes);
        }
        Ok(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use penrose_core::bundle::BundleHash;
    use penrose_core::evidence_file::entry_prefix;

    use super::*;

    fn file(entries: &[&[u8]], claimed: u32, tail: &[u8]) -> Vec<u8> {
        let mut out = EvidenceFileHeader {
            bundle: BundleHash([3; 32]),
            entries: claimed,
        }
        .encode();
        for e in entries {
            out.extend_from_slice(&entry_prefix(e));
            out.extend_from_slice(e);
        }
        out.extend_from_slice(tail);
        out
    }

    #[test]
    fn entries_are_located_and_read_back_and_bad_framing_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("1.evidence");
        std::fs::write(&path, file(&[b"abc", b"", b"defgh"], 3, b"")).unwrap();
        let evidence = EvidenceFile::open(&path).unwrap();
        assert_eq!(evidence.header().entries, 3);
        assert_eq!(evidence.len_of(2), Some(5));
        assert_eq!(
            evidence.read(1, 2).unwrap(),
            vec![Vec::new(), b"defgh".to_vec()]
        );
        assert!(evidence.read(2, 2).is_err());
        for (bytes, what) in [
            (file(&[b"abc"], 2, b""), "ends before its last entry"),
            (file(&[b"abc"], 1, b"x"), "has bytes after its last entry"),
            (file(&[b"abc"], 1, b"")[..20].to_vec(), "shorter than"),
        ] {
            std::fs::write(&path, bytes).unwrap();
            let e = EvidenceFile::open(&path).unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        }
        let mut cut = file(&[b"abc"], 1, b"");
        cut.truncate(cut.len() - 1);
        std::fs::write(&path, cut).unwrap();
        assert!(EvidenceFile::open(&path).is_err());
    }
}
