//! Cross-process file locks that an async caller can stop waiting for.
//!
//! A blocking `File::lock` on a helper thread cannot be cancelled: a
//! download cancelled at shutdown would leave that thread waiting on another
//! process (and the runtime waiting on the thread) until the other process
//! finished. So waiting is a `try_lock` poll with an async sleep in between;
//! dropping the future ends the wait at once.

use std::fs::{self, File, TryLockError};
use std::path::Path;
use std::time::Duration;

use crate::error::{Error, Result};

/// First pause between two tries; doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(2);
/// Longest pause between two tries.
const MAX_PAUSE: Duration = Duration::from_millis(100);

fn open(path: &Path) -> Result<File> {
    fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
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
    let mut pause = FIRST_PAUSE;
    loop {
        if let Some(file) = try_lock(path)? {
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
}
