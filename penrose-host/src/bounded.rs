//! Public files read with a bound: keys, signer files, lists, bundles. Anyone may read them,
//! but the path comes from configuration or a command line, so the reader must not hang on a
//! FIFO put there, nor read a file of many GiB into memory because it was named.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::error::FileError;

/// Reads the whole regular file at `path`, at most `limit` bytes: a larger file is refused,
/// whether it was larger when opened or grew while being read; a FIFO, a directory or a
/// device is refused without blocking.
pub fn read(path: &Path, limit: u64) -> Result<Vec<u8>, FileError> {
    let file = open_regular(path)?;
    read_open(file, path, limit)
}

/// As [`read`], as UTF-8 text (anything else is an `InvalidData` error naming the file).
pub fn read_to_string(path: &Path, limit: u64) -> Result<String, FileError> {
    String::from_utf8(read(path, limit)?).map_err(|_| {
        FileError::at(path)(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not UTF-8 text",
        ))
    })
}

/// Reads at most `limit` bytes from `file`, an opened and checked `path`.
pub(crate) fn read_open(file: File, path: &Path, limit: u64) -> Result<Vec<u8>, FileError> {
    let too_large = || FileError::TooLarge {
        path: path.to_owned(),
        limit,
    };
    let len = file.metadata().map_err(FileError::at(path))?.len();
    if len > limit {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(FileError::at(path))?;
    if bytes.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(bytes)
}

fn open_regular(path: &Path) -> Result<File, FileError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(FileError::at(path))?;
    let meta = file.metadata().map_err(FileError::at(path))?;
    if !meta.file_type().is_file() {
        return Err(FileError::NotAFile(path.to_owned()));
    }
    Ok(file)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_file_within_the_bound_is_read_and_a_larger_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key.pub");
        std::fs::write(&path, [1; 65]).unwrap();
        assert_eq!(read(&path, 65).unwrap().len(), 65);
        assert!(matches!(
            read(&path, 64),
            Err(FileError::TooLarge { limit: 64, .. })
        ));
    }

    #[test]
    fn a_fifo_or_a_directory_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(read(dir.path(), 64), Err(FileError::NotAFile(_))));
        let fifo = dir.path().join("fifo");
        crate::test_support::mkfifo(&fifo);
        assert!(matches!(read(&fifo, 64), Err(FileError::NotAFile(_))));
        let missing = read(&dir.path().join("missing"), 64).unwrap_err();
        assert!(missing.is_missing(), "{missing}");
    }

    #[test]
    fn text_must_be_utf8() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("signer");
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        assert!(read_to_string(&path, 64).is_err());
        std::fs::write(&path, "ab\n").unwrap();
        assert_eq!(read_to_string(&path, 64).unwrap(), "ab\n");
    }
}
