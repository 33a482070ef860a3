//! The platform calls where Unix's are missing (Windows): what the
//! standard library offers, and safe answers where it offers nothing.

use std::fs::{self, DirBuilder, File, Metadata, OpenOptions};
use std::io;
use std::path::Path;

use super::FolderProblem;

/// A folder builder (access as the OS gives by default).
pub(crate) fn private_dir_builder() -> DirBuilder {
    DirBuilder::new()
}

/// Nothing to do: access is the OS's default.
pub(crate) fn set_private_folder(_path: &Path) -> io::Result<()> {
    Ok(())
}

/// Nothing is refused: ownership and access are left to the OS.
pub(crate) fn folder_problem(_meta: &Metadata) -> Option<FolderProblem> {
    None
}

/// Every file counts as the current user's.
pub(crate) fn owned_by_me(_meta: &Metadata) -> bool {
    true
}

/// Opens `path` with `options`, refusing a symbolic link found there.
pub(crate) fn open_no_follow(path: &Path, options: &mut OpenOptions) -> io::Result<File> {
    if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(super::link_refused());
    }
    options.open(path)
}

/// Nothing to do: opening does not wait here.
pub(crate) fn never_wait(_options: &mut OpenOptions) {}

/// Sets the read-only attribute of `file`.
pub(crate) fn make_read_only(file: &File) -> io::Result<()> {
    let mut perms = file.metadata()?.permissions();
    perms.set_readonly(true);
    file.set_permissions(perms)
}

/// Whether two metadata describe the same file, as far as they tell.
pub(crate) fn same_file(a: &Metadata, b: &Metadata) -> bool {
    a.len() == b.len() && a.modified().ok() == b.modified().ok()
}

/// One name per file, as far as is known.
pub(crate) fn link_count(_meta: &Metadata) -> u64 {
    1
}

/// Unknown: the length counts.
pub(crate) fn allocated_bytes(_meta: &Metadata) -> Option<u64> {
    None
}

/// What identifies one version of a file: its length and times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileStamp {
    len: u64,
    modified: Option<std::time::SystemTime>,
    created: Option<std::time::SystemTime>,
}

impl FileStamp {
    /// The stamp of the file `meta` describes.
    pub(crate) fn of(meta: &Metadata) -> FileStamp {
        FileStamp {
            len: meta.len(),
            modified: meta.modified().ok(),
            created: meta.created().ok(),
        }
    }
}

/// Unknown here: as much as any file needs.
pub(crate) fn free_space(_dir: &Path) -> io::Result<u64> {
    Ok(u64::MAX)
}

/// Nothing to do.
pub(crate) fn sync_dir(_dir: &Path) {}

/// Nothing to do (an optimisation only).
pub(crate) fn start_write_back(_file: &File, _from: u64, _len: u64) {}

/// Never: a plain copy.
pub(crate) fn reflink(_from: &File, _to: &File) -> bool {
    false
}

/// Byte locks are not used here: a lock file per key.
pub(crate) const BYTE_LOCKS: bool = false;

/// Not available here ([`BYTE_LOCKS`] is `false`).
pub(crate) fn try_lock_byte(_file: &File, _offset: i64) -> io::Result<bool> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}
