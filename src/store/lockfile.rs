//! Cross-process file locks that an async caller can stop waiting for.
//!
//! A blocking `File::lock` on a helper thread cannot be cancelled: a
//! download cancelled at shutdown would leave that thread waiting on another
//! process (and the runtime waiting on the thread) until the other process
//! finished. So waiting is a `try_lock` poll with an async sleep in between;
//! dropping the future ends the wait at once.
//!
//! Keyed locks ([`try_lock_key`]) are many locks in one file: on Linux, a
//! lock on one byte of a shared file (an open-file-description lock, so two
//! tasks of one process exclude each other as two processes do), at an
//! offset taken from the key. No file is created per key, so locking
//! thousands of keys creates no inodes and leaves nothing behind. Elsewhere,
//! a lock file per key next to the shared one.

use std::fs::{self, File, TryLockError};
use std::path::Path;
use std::time::Duration;

use crate::error::{Error, Result};

/// First pause between two tries; doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(2);
/// Longest pause between two tries.
const MAX_PAUSE: Duration = Duration::from_millis(100);

/// Opens (creating, `0600`) the lock file `path`: a regular file of the
/// store's user, never a symbolic link followed.
fn open(path: &Path) -> Result<File> {
    crate::store::trust::open_own(
        path,
        fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true),
    )
    .map_err(|e| Error::io("cannot open lock file", path, e))
}

/// Takes the exclusive lock on `path` (created when missing) only if nobody
/// holds it. The lock is held as long as the returned file is open.
pub(crate) fn try_lock(path: &Path) -> Result<Option<File>> {
    let file = open(path)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(e)) => Err(Error::io("cannot lock", path, e)),
    }
}

/// Waits for the exclusive lock on `path`.
pub(crate) async fn lock(path: &Path) -> Result<File> {
    wait(|| try_lock(path)).await
}

/// Takes the exclusive lock of `key` (a hexadecimal digest) in the shared
/// lock file `path` only if nobody holds it; held as long as the returned
/// file is open. Two keys that share their first 60 bits share a lock,
/// which only makes one wait for the other.
pub(crate) fn try_lock_key(path: &Path, key: &str) -> Result<Option<File>> {
    if !crate::platform::BYTE_LOCKS {
        let own = path.with_file_name(format!("{key}.lock"));
        return try_lock(&own);
    }
    let file = open(path)?;
    let offset = key
        .get(..15)
        .and_then(|h| i64::from_str_radix(h, 16).ok())
        .unwrap_or(0);
    match crate::platform::try_lock_byte(&file, offset) {
        Ok(true) => Ok(Some(file)),
        Ok(false) => Ok(None),
        Err(e) => Err(Error::io("cannot lock", path, e)),
    }
}

/// Waits for the exclusive lock of `key` in `path` (see [`try_lock_key`]).
pub(crate) async fn lock_key(path: &Path, key: &str) -> Result<File> {
    wait(|| try_lock_key(path, key)).await
}

async fn wait(mut try_once: impl FnMut() -> Result<Option<File>>) -> Result<File> {
    let mut pause = FIRST_PAUSE;
    loop {
        if let Some(file) = try_once()? {
            return Ok(file);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_held_lock_is_waited_for_and_the_wait_can_be_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let held = lock(&path).await.unwrap();
        assert!(try_lock(&path).unwrap().is_none());
        // Waiting gives up when dropped.
        let waited = tokio::time::timeout(Duration::from_millis(50), lock(&path)).await;
        assert!(waited.is_err());
        drop(held);
        let again = tokio::time::timeout(Duration::from_secs(5), lock(&path)).await;
        assert!(again.is_ok());
    }

    #[tokio::test]
    async fn keyed_locks_exclude_the_same_key_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.lock");
        let a = "a".repeat(64);
        let b = "b".repeat(64);
        let held = lock_key(&path, &a).await.unwrap();
        // Another holder of the same key, in this process too, must wait.
        assert!(try_lock_key(&path, &a).unwrap().is_none());
        let other = try_lock_key(&path, &b).unwrap();
        assert!(other.is_some(), "another key is free");
        let waited = tokio::time::timeout(Duration::from_millis(50), lock_key(&path, &a)).await;
        assert!(waited.is_err());
        drop(held);
        assert!(try_lock_key(&path, &a).unwrap().is_some());
        // One shared file, nothing per key.
        let files = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(files, if cfg!(target_os = "linux") { 1 } else { 2 });
    }
}
