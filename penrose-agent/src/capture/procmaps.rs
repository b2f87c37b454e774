//! `/proc/<pid>/maps` lines, parsed once for every reader of them (name-resolution of mapped
//! objects, identities of call sites).

use std::path::PathBuf;

/// One mapping of a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileMapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Whether the mapping is executable.
    pub executable: bool,
    /// Offset in the file of `start`.
    pub file_offset: u64,
    /// The file: device (major:minor, as the line gives it) and inode.
    pub file: (String, u64),
    /// The path in the process's mount namespace.
    pub path: PathBuf,
}

/// The file mappings of a maps text, in order; anonymous mappings, special ones (`[stack]`)
/// and deleted files are skipped, and so is any line that does not parse.
pub fn file_mappings(maps: &str) -> impl Iterator<Item = FileMapping> + '_ {
    maps.lines().filter_map(|line| {
        let mut fields = line.split_whitespace();
        let (start, end) = fields.next()?.split_once('-')?;
        let perms = fields.next()?;
        let file_offset = u64::from_str_radix(fields.next()?, 16).ok()?;
        let dev = fields.next()?.to_string();
        let inode: u64 = fields.next()?.parse().ok()?;
        // The path is the rest of the line (it may hold spaces).
        let path: String = fields.collect::<Vec<_>>().join(" ");
        if !path.starts_with('/') || path.ends_with("(deleted)") {
            return None;
        }
        Some(FileMapping {
            start: u64::from_str_radix(start, 16).ok()?,
            end: u64::from_str_radix(end, 16).ok()?,
            executable: perms.contains('x'),
            file_offset,
            file: (dev, inode),
            path: PathBuf::from(path),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_mappings_keep_paths_with_spaces_and_skip_the_rest() {
        let maps = "55d0-55e0 r--p 00000000 08:01 42 /usr/bin/python3.11\n\
            55e0-55f0 r-xp 00010000 08:01 42 /usr/bin/python3.11\n\
            7f00-7f10 r-xp 00002000 08:01 77 /opt/lib/libtorch cuda.so\n\
            7f20-7f30 rw-p 00000000 00:00 0 \n\
            7f40-7f50 r-xp 00000000 08:01 44 /tmp/x.so (deleted)\n\
            7ffd-7ffe rw-p 00000000 00:00 0                          [stack]\n\
            garbage\n";
        let all: Vec<_> = file_mappings(maps).collect();
        assert_eq!(all.len(), 3);
        assert!(!all[0].executable && all[1].executable);
        assert_eq!((all[1].start, all[1].file_offset), (0x55e0, 0x10000));
        assert_eq!(all[2].path, PathBuf::from("/opt/lib/libtorch cuda.so"));
        assert_eq!(all[2].file, ("08:01".to_string(), 77));
    }
}
