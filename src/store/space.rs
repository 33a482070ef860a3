//! Free space: what a write that failed on a full disk says, and what the
//! file system has free.

use std::fs;
use std::io;
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::store::partial;

/// The error of a write of `path` that failed with `e` while `needed`
/// bytes were still to be written: `E_RESOURCE_DISK_SPACE` with what was
/// needed and what is free when the file system is full (or the quota used
/// up), [`Error::Io`] otherwise.
pub(crate) fn write_failed(context: &str, path: &Path, e: io::Error, needed: u64) -> Error {
    if !crate::error::is_disk_full(&e) {
        return Error::io(context, path, e);
    }
    let dir = path.parent().unwrap_or(path);
    Error::DiskFull {
        context: context.to_string(),
        path: path.to_path_buf(),
        needed,
        available: available_space(dir).unwrap_or(0),
        source: Arc::new(e),
    }
}

/// [`write_failed`] for a write of a partial file: what is still needed is
/// the size its name declares less what it holds.
pub(crate) fn partial_write_failed(context: &str, path: &Path, e: io::Error) -> Error {
    let declared = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(partial::parse_name)
        .map_or(0, |(_, size)| size);
    let written = fs::symlink_metadata(path).map_or(0, |m| m.len());
    write_failed(context, path, e, declared.saturating_sub(written))
}

/// Free bytes on the file system of the folder `dir`, held open (for this
/// process's user).
pub(super) fn available_space_at(dir: &crate::store::folder::Folder) -> Result<u64> {
    #[cfg(test)]
    if let Some(free) = FREE.get() {
        return Ok(free);
    }
    dir.free_space()
        .map_err(|e| Error::io("cannot read free space of", dir.path(), e))
}

/// Free bytes on the file system of `dir` (for this process's user).
pub(super) fn available_space(dir: &Path) -> Result<u64> {
    #[cfg(test)]
    if let Some(free) = FREE.get() {
        return Ok(free);
    }
    crate::platform::free_space(dir).map_err(|e| Error::io("cannot read free space of", dir, e))
}

#[cfg(test)]
thread_local! {
    /// Free bytes this thread's store calls see, instead of the file
    /// system's.
    pub(super) static FREE: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_disk_space_with_what_was_needed_and_free() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir
            .path()
            .join(format!("{}.{}.partial", "a".repeat(64), 3u64 << 30));
        fs::write(&path, vec![0u8; 1000]).unwrap();
        FREE.set(Some(1536 << 10));
        for raw in crate::platform::DISK_FULL_CODES {
            let e = io::Error::from_raw_os_error(raw);
            let err = partial_write_failed("cannot write download", &path, e);
            assert_eq!(err.code(), "E_RESOURCE_DISK_SPACE", "{err}");
            let text = err.to_string();
            assert!(text.contains(&path.display().to_string()), "{text}");
            // The declared 3 GiB less the 1000 bytes written.
            assert!(text.contains("needs 3.0 GiB more, 1.5 MiB free"), "{text}");
        }
        let other = partial_write_failed("cannot write download", &path, io::Error::other("x"));
        assert_eq!(other.code(), "E_RESOURCE_IO", "{other}");
        FREE.set(None);
    }
}
