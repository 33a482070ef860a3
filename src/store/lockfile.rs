//! Cross-process file locks that an async caller can stop waiting for.
//!
//! A blocking `File::lock` on a helper thread cannot be cancelled: a
//! download cancelled at shutdown would leave that thread waiting on another
//! process (and the runtime waiting on the thread) until the other process
//! finished. So waiting is a `try_lock` poll with an async sleep in between;
//! dropping the future ends the wait at once.
//!
//! Keyed locks ([`try_lock_key`]) are a lock file per key, named by the
//! whole key: two keys never share a lock, however much of them they
//! share. A released lock file stays for the next taker of its key: a
//! download makes no file it removes again (on a file system that passes
//! over recently freed inodes, each removal slows every later creation).
//! Lock files go with what they lock ([`remove_key`]): where the platform
//! allows it ([`crate::platform::REMOVE_HELD_LOCKS`]), the remover holds
//! the lock as it removes the file, and a taker checks, once it holds the
//! lock, that the name still leads to the very file it locked (else it
//! tries again on the new file).
//!
//! A holder may describe itself ([`KeyLock::describe`]) so that others
//! waiting on it can say whose it is: where held lock files may be
//! removed (and read), in the lock file itself (taking a lock clears what
//! an earlier holder left there); elsewhere in a file beside it
//! (`<key>.lock.json`), removed before the lock is released. Describing a
//! download then costs no file of its own.
//!
//! A lock that many tasks of one process take one after another (the
//! registry's, [`Turns`]) is taken in turn within the process, and handed
//! from one holder to the next without being released in between: a
//! thousand failures recorded at once lock the file once, not a thousand
//! times. Every [`HANDED_AT_MOST`] holders it is released all the same, so
//! another process waiting on it gets in.

use std::fs::{File, TryLockError};
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::store::folder::Folder;

use crate::error::{Error, Result};

/// First pause between two tries; doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(2);
/// Longest pause between two tries.
const MAX_PAUSE: Duration = Duration::from_millis(100);

/// A lock file held open with its lock taken.
///
/// Dropping it releases the lock explicitly before closing the file:
/// closing alone would leave the lock held while a child process forked
/// from any thread of this process still has the descriptor (between its
/// fork and its exec), and another taker a moment later would find it
/// busy.
#[derive(Debug)]
pub(crate) struct Held(File);

impl Held {
    /// The open lock file.
    pub(crate) fn file(&self) -> &File {
        &self.0
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

/// Takes the exclusive lock of `file` (the lock file `path`) only if nobody
/// holds it.
fn try_lock_file(file: File, path: &Path) -> Result<Option<Held>> {
    match file.try_lock() {
        Ok(()) => Ok(Some(Held(file))),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(e)) => Err(Error::io("cannot lock", path, e)),
    }
}

/// Takes the exclusive lock on the file `name` (created when missing) of
/// the folder `dir`, held open, only if nobody holds it.
pub(crate) fn try_lock_in(dir: &Folder, name: &str) -> Result<Option<Held>> {
    try_lock_file(open_at(dir, name, true)?, &dir.join(name))
}

/// Waits for the exclusive lock on the file `name` (created when missing)
/// of the folder `dir`, held open.
pub(crate) async fn lock_in(dir: &Folder, name: &str) -> Result<Held> {
    wait(|| try_lock_in(dir, name)).await
}

/// Takes the exclusive lock on the file `name` (created when missing) of
/// the folder `dir`, held open, blocking the thread until it is free: for
/// locks held only for a short read and write, by synchronous callers.
pub(crate) fn lock_blocking_in(dir: &Folder, name: &str) -> Result<Held> {
    let file = open_at(dir, name, true)?;
    file.lock()
        .map_err(|e| Error::io("cannot lock", dir.join(name), e))?;
    Ok(Held(file))
}

/// How many holders in a row a lock taken in turn ([`Turns`]) is handed
/// to before it is released once, for other processes.
pub(crate) const HANDED_AT_MOST: u32 = 16;

/// The takers of one lock file within this process, in turn: each gets the
/// lock from the one before it, still held when another was waiting
/// (see the module's notes).
#[derive(Debug, Default)]
pub(crate) struct Turns {
    state: std::sync::Mutex<TurnState>,
}

#[derive(Debug, Default)]
struct TurnState {
    /// Whether a turn is out (held, or being handed over).
    busy: bool,
    /// The takers waiting, first come first served.
    queue: std::collections::VecDeque<tokio::sync::oneshot::Sender<Turn>>,
    /// Holders the file lock went to in a row without a release.
    handed: u32,
}

/// One taker's turn at a lock of [`Turns`], with the file lock once taken;
/// handed to the next taker when dropped.
#[derive(Debug)]
pub(crate) struct Turn {
    held: Option<Held>,
    turns: Option<Arc<Turns>>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(turns) = self.turns.take() {
            turns.pass(self.held.take());
        }
    }
}

impl Turns {
    /// Waits for this process's turn, then for the lock on the file `name`
    /// (created when missing) of `dir`, unless the turn came with it.
    pub(crate) async fn lock_in(self: &Arc<Self>, dir: &Folder, name: &str) -> Result<Turn> {
        let mut turn = self.take().await;
        if turn.held.is_none() {
            turn.held = Some(lock_in(dir, name).await?);
        }
        Ok(turn)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, TurnState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn take(self: &Arc<Self>) -> Turn {
        loop {
            let waiting = {
                let mut state = self.state();
                if !state.busy {
                    state.busy = true;
                    return Turn {
                        held: None,
                        turns: Some(self.clone()),
                    };
                }
                let (tx, rx) = tokio::sync::oneshot::channel();
                state.queue.push_back(tx);
                rx
            };
            // A turn dropped unreceived (this wait given up after it was
            // sent) goes on to the next taker as it drops.
            if let Ok(turn) = waiting.await {
                return turn;
            }
        }
    }

    /// Hands the turn, and `held` with it, to the first taker still
    /// waiting; with nobody waiting (or after [`HANDED_AT_MOST`] holders),
    /// releases the file lock.
    fn pass(self: &Arc<Self>, mut held: Option<Held>) {
        let mut released = None;
        let mut state = self.state();
        if state.handed >= HANDED_AT_MOST {
            released = held.take();
        }
        loop {
            let Some(next) = state.queue.pop_front() else {
                state.busy = false;
                state.handed = 0;
                released = released.or(held.take());
                break;
            };
            let with_lock = held.is_some();
            let turn = Turn {
                held: held.take(),
                turns: Some(self.clone()),
            };
            match next.send(turn) {
                Ok(()) => {
                    state.handed = if with_lock { state.handed + 1 } else { 0 };
                    break;
                }
                // That taker stopped waiting: the next one, with the lock.
                Err(mut unsent) => {
                    held = unsent.held.take();
                    unsent.turns = None;
                }
            }
        }
        drop(state);
        drop(released);
    }
}

/// A held keyed lock: released when dropped; its lock file stays for the
/// next taker.
#[derive(Debug)]
pub(crate) struct KeyLock {
    /// The open lock file, its lock released when dropped.
    file: Held,
    /// The folder of lock files, held open: the lock file and its
    /// description are reached through it.
    dir: Arc<Folder>,
    /// `<key>.lock`.
    name: String,
}

impl KeyLock {
    /// Writes what the holder says about itself next to the lock (see
    /// [`read_description`]); a failure only leaves others knowing less.
    pub(crate) fn describe(&self, bytes: &[u8]) {
        if crate::platform::REMOVE_HELD_LOCKS {
            // Only the holder writes its lock file, from its start; a
            // reader that catches it half-written reads nothing it can
            // parse. The length is cut after the write, never to 0 first:
            // ext4 flushes a file truncated to 0 when it is closed, which
            // would cost every download a trip to the disk for a few
            // bytes nobody needs durable.
            let write = |mut file: &File| {
                io::Seek::seek(&mut file, io::SeekFrom::Start(0))?;
                io::Write::write_all(&mut file, bytes)?;
                file.set_len(bytes.len() as u64)
            };
            if let Err(e) = write(self.file.file()) {
                tracing::debug!(lock = %self.name, "cannot describe the lock holder: {e}");
            }
            return;
        }
        let name = description_name(&self.name);
        let prefix = format!("{name}.tmp.");
        let durability = crate::store::atomic::Durability::Hint;
        if let Err(e) = self.dir.replace(&name, &prefix, bytes, durability) {
            tracing::debug!(path = %e.path.display(), "cannot describe the lock holder: {}", e.error);
        }
    }
}

impl Drop for KeyLock {
    fn drop(&mut self) {
        if !crate::platform::REMOVE_HELD_LOCKS {
            let _ = self.dir.remove_file(&description_name(&self.name));
        }
        // Dropping `file` releases the lock; the file stays for the next
        // taker (see the module's documentation).
        let _ = &self.file;
    }
}

/// The lock file's name of `key`.
pub(crate) fn key_name(key: &str) -> String {
    format!("{key}.lock")
}

fn description_name(lock: &str) -> String {
    format!("{lock}.json")
}

/// Whether the lock of `key` in `dir` is held now (by this process or
/// another), and then the description its holder wrote, at most `max`
/// bytes, if there is one: `None` when nobody holds it. One open of the
/// lock file where the description is in it. Creates and removes nothing.
pub(crate) fn holder_of(dir: &Folder, key: &str, max: u64) -> Option<Option<Vec<u8>>> {
    let name = key_name(key);
    let file = open_at(dir, &name, false).ok()?;
    if !held_by_another(&file) {
        return None;
    }
    let description = if crate::platform::REMOVE_HELD_LOCKS {
        let mut bytes = Vec::new();
        io::Read::read_to_end(&mut io::Read::take(&file, max + 1), &mut bytes).ok();
        (!bytes.is_empty() && bytes.len() as u64 <= max).then_some(bytes)
    } else {
        dir.read_own(&description_name(&name), max).ok()
    };
    Some(description)
}

/// Opens (creating, `0600`) the lock file `name` of `dir`, for reading and
/// writing (its holder's description is read from it where it is kept in
/// it).
fn open_at(dir: &Folder, name: &str, create: bool) -> Result<File> {
    let mut options = cap_std::fs::OpenOptions::new();
    options
        .create(create)
        .truncate(false)
        .read(true)
        .write(true);
    dir.open_own(name, &mut options)
        .map_err(|e| Error::io("cannot open lock file", dir.join(name), e))
}

/// Takes the exclusive lock of `key` (a name of letters, digits and dots)
/// in the folder `dir` only if nobody holds it; held as long as the
/// returned lock lives.
pub(crate) fn try_lock_key(dir: &Arc<Folder>, key: &str) -> Result<Option<KeyLock>> {
    let name = key_name(key);
    loop {
        let Some(file) = try_lock_file(open_at(dir, &name, true)?, &dir.join(&name))? else {
            return Ok(None);
        };
        if !crate::platform::REMOVE_HELD_LOCKS {
            return Ok(Some(KeyLock {
                file,
                dir: dir.clone(),
                name,
            }));
        }
        let Ok(meta) = file.file().metadata() else {
            continue;
        };
        if dir.names_file(&name, &meta) {
            // What an earlier holder said about itself is not this one's.
            if meta.len() > 0 {
                file.file()
                    .set_len(0)
                    .map_err(|e| Error::io("cannot clear lock file", dir.join(&name), e))?;
            }
            return Ok(Some(KeyLock {
                file,
                dir: dir.clone(),
                name,
            }));
        }
        // The holder we waited for removed this file as it let go: lock
        // the new one.
    }
}

/// Whether the lock of `key` in `dir` is held now, by this process or
/// another. Creates and removes nothing.
pub(crate) fn is_held(dir: &Folder, key: &str) -> bool {
    let name = key_name(key);
    open_at(dir, &name, false).is_ok_and(|file| held_by_another(&file))
}

/// Whether the lock file of `key` is in `dir` (held or not).
pub(crate) fn exists(dir: &Folder, key: &str) -> bool {
    dir.entry(&key_name(key)).is_ok()
}

/// Makes the lock file of `key` in `dir` when it is missing, without
/// taking the lock.
pub(crate) fn make(dir: &Folder, key: &str) -> Result<()> {
    open_at(dir, &key_name(key), true).map(drop)
}

/// Removes the lock file of `key` in `dir` when nobody holds it, holding
/// it as it goes (a taker that opened it before then tries again on a new
/// file): whether it was removed. Where a held lock file cannot be removed
/// ([`crate::platform::REMOVE_HELD_LOCKS`]), it stays.
pub(crate) fn remove_key(dir: &Folder, key: &str) -> bool {
    if !crate::platform::REMOVE_HELD_LOCKS {
        return false;
    }
    let name = key_name(key);
    let Ok(file) = open_at(dir, &name, false) else {
        return false;
    };
    if file.try_lock().is_err() {
        return false;
    }
    let file = Held(file);
    if !still_named(file.file(), dir, &name) {
        return false;
    }
    dir.remove_file(&name).is_ok()
}

/// Whether someone holds the lock of the open lock `file`.
fn held_by_another(file: &File) -> bool {
    match file.try_lock() {
        Ok(()) => {
            let _ = file.unlock();
            false
        }
        Err(TryLockError::WouldBlock) => true,
        Err(TryLockError::Error(_)) => false,
    }
}

/// Whether the entry `name` of `dir` is still the open `file`.
fn still_named(file: &File, dir: &Folder, name: &str) -> bool {
    file.metadata()
        .is_ok_and(|open| dir.names_file(name, &open))
}

/// Waits for the exclusive lock of `key` in `dir` (see [`try_lock_key`]).
#[cfg(test)]
pub(crate) async fn lock_key(dir: &Arc<Folder>, key: &str) -> Result<KeyLock> {
    wait(|| try_lock_key(dir, key)).await
}

pub(crate) async fn wait<T>(mut try_once: impl FnMut() -> Result<Option<T>>) -> Result<T> {
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

    /// Whether another open of `name` in `dir` could take its lock now.
    fn free(dir: &Folder, name: &str) -> bool {
        try_lock_in(dir, name).unwrap().is_some()
    }

    #[tokio::test]
    async fn a_lock_taken_in_turn_is_handed_on_held_and_released_when_nobody_waits() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Folder::open_path(tmp.path()).unwrap();
        let turns = Arc::new(Turns::default());
        let first = turns.lock_in(&dir, "r.lock").await.unwrap();
        assert!(!free(&dir, "r.lock"));
        let next = tokio::spawn({
            let turns = turns.clone();
            async move { turns.take().await }
        });
        while turns.state().queue.is_empty() {
            tokio::task::yield_now().await;
        }
        drop(first);
        // The next taker in this process gets the file lock as it was,
        // never released in between.
        let second = next.await.unwrap();
        assert!(second.held.is_some());
        assert!(!free(&dir, "r.lock"));
        drop(second);
        assert!(free(&dir, "r.lock"));
        assert!(!turns.state().busy);
    }

    #[tokio::test]
    async fn a_taker_that_stops_waiting_leaves_the_lock_to_the_others_or_released() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Folder::open_path(tmp.path()).unwrap();
        let turns = Arc::new(Turns::default());
        let first = turns.lock_in(&dir, "r.lock").await.unwrap();
        let mut gone = Box::pin(turns.take());
        assert!(futures_poll_once(gone.as_mut()).is_none());
        drop(gone);
        drop(first);
        assert!(free(&dir, "r.lock"));
        // And after many holders in a row, the lock is released once for
        // other processes: the next holder takes it again.
        let mut turn = turns.lock_in(&dir, "r.lock").await.unwrap();
        let mut released = 0;
        for _ in 0..3 * (HANDED_AT_MOST + 1) {
            let next = tokio::spawn({
                let turns = turns.clone();
                async move { turns.take().await }
            });
            while turns.state().queue.is_empty() {
                tokio::task::yield_now().await;
            }
            drop(turn);
            turn = next.await.unwrap();
            if turn.held.is_none() {
                released += 1;
                turn.held = Some(lock_in(&dir, "r.lock").await.unwrap());
            }
        }
        assert_eq!(released, 3);
    }

    /// Polls `future` once.
    fn futures_poll_once<F: std::future::Future>(
        future: std::pin::Pin<&mut F>,
    ) -> Option<F::Output> {
        let waker = std::task::Waker::noop();
        match future.poll(&mut std::task::Context::from_waker(waker)) {
            std::task::Poll::Ready(out) => Some(out),
            std::task::Poll::Pending => None,
        }
    }

    #[tokio::test]
    async fn a_held_lock_is_waited_for_and_the_wait_can_be_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Folder::open_path(tmp.path()).unwrap();
        let held = lock_in(&dir, "x.lock").await.unwrap();
        assert!(try_lock_in(&dir, "x.lock").unwrap().is_none());
        // Waiting gives up when dropped.
        let waited = tokio::time::timeout(Duration::from_millis(50), lock_in(&dir, "x.lock")).await;
        assert!(waited.is_err());
        drop(held);
        let again = tokio::time::timeout(Duration::from_secs(5), lock_in(&dir, "x.lock")).await;
        assert!(again.is_ok());
    }

    /// A child process forked at the wrong moment holds a copy of every
    /// descriptor until its exec; a copy of the lock file's descriptor
    /// stands for it here. Dropping a lock must free it all the same.
    #[test]
    fn a_dropped_lock_is_free_while_a_copy_of_its_descriptor_lives() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Arc::new(Folder::open_path(tmp.path()).unwrap());
        let held = try_lock_in(&dir, "x.lock").unwrap().unwrap();
        let copy = held.file().try_clone().unwrap();
        drop(held);
        assert!(try_lock_in(&dir, "x.lock").unwrap().is_some());
        drop(copy);

        let key = format!("{}.10", "a".repeat(64));
        let held = try_lock_key(&dir, &key).unwrap().unwrap();
        let copy = held.file.file().try_clone().unwrap();
        drop(held);
        assert!(try_lock_key(&dir, &key).unwrap().is_some());
        assert!(!is_held(&dir, &key));
        drop(copy);
    }

    #[tokio::test]
    async fn keyed_locks_exclude_the_same_key_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Arc::new(Folder::open_path(tmp.path()).unwrap());
        let a = format!("{}.10", "a".repeat(64));
        // The same first 60 bits, and the same hash with another size.
        let b = format!("{}b.10", "a".repeat(63));
        let c = format!("{}.11", "a".repeat(64));
        let held = lock_key(&dir, &a).await.unwrap();
        // Another holder of the same key, in this process too, must wait.
        assert!(try_lock_key(&dir, &a).unwrap().is_none());
        assert!(is_held(&dir, &a));
        for other in [&b, &c] {
            assert!(!is_held(&dir, other));
            let got = try_lock_key(&dir, other).unwrap();
            assert!(got.is_some(), "{other} is free");
        }
        let waited = tokio::time::timeout(Duration::from_millis(50), lock_key(&dir, &a)).await;
        assert!(waited.is_err());
        assert_eq!(
            holder_of(&dir, &a, 10),
            Some(None),
            "held, not described yet"
        );
        held.describe(b"{}");
        assert_eq!(holder_of(&dir, &a, 10), Some(Some(b"{}".to_vec())));
        assert_eq!(holder_of(&dir, &a, 1), Some(None), "longer than asked");
        drop(held);
        assert_eq!(holder_of(&dir, &a, 10), None);
        assert!(!is_held(&dir, &a));
        assert!(try_lock_key(&dir, &a).unwrap().is_some());
        // Released lock files stay for the next taker; one nobody holds
        // goes where held lock files may be removed.
        let files = || std::fs::read_dir(tmp.path()).unwrap().count();
        assert_eq!(files(), 3);
        assert!(exists(&dir, &a));
        assert_eq!(remove_key(&dir, &a), crate::platform::REMOVE_HELD_LOCKS);
        assert_eq!(exists(&dir, &a), !crate::platform::REMOVE_HELD_LOCKS);
        let held = try_lock_key(&dir, &b).unwrap().unwrap();
        assert!(!remove_key(&dir, &b), "a held lock file stays");
        assert!(exists(&dir, &b));
        drop(held);
    }

    #[tokio::test]
    async fn what_a_killed_holder_said_is_not_the_next_holders() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Arc::new(Folder::open_path(tmp.path()).unwrap());
        let key = format!("{}.1", "d".repeat(64));
        // A holder killed after it described itself: its lock went with
        // it, its file stays (as every released lock file does).
        std::fs::write(tmp.path().join(key_name(&key)), br#"{"gem":"old"}"#).unwrap();
        let next = lock_key(&dir, &key).await.unwrap();
        assert_eq!(holder_of(&dir, &key, 100), Some(None));
        next.describe(b"{}");
        assert_eq!(holder_of(&dir, &key, 100), Some(Some(b"{}".to_vec())));
        // A holder that says less the second time leaves nothing of its
        // longer first description behind.
        next.describe(br#"{"gem":"a longer description"}"#);
        next.describe(br#"{"gem":"b"}"#);
        assert_eq!(
            holder_of(&dir, &key, 100),
            Some(Some(br#"{"gem":"b"}"#.to_vec()))
        );
    }

    #[tokio::test]
    async fn a_taker_of_a_removed_lock_file_locks_the_new_one() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Arc::new(Folder::open_path(tmp.path()).unwrap());
        let key = format!("{}.1", "e".repeat(64));
        let first = lock_key(&dir, &key).await.unwrap();
        let waiter = {
            let dir = dir.clone();
            let key = key.clone();
            tokio::spawn(async move { lock_key(&dir, &key).await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        // Whoever holds it, nobody else can take it.
        assert!(try_lock_key(&dir, &key).unwrap().is_none());
        assert!(std::fs::symlink_metadata(tmp.path().join(key_name(&key))).is_ok());
        drop(second);
    }
}
