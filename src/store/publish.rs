//! Publication of verified files, made durable in groups.
//!
//! A verified partial file is first *staged* ([`Store::stage`]): opened
//! through the handle of `tmp/`, checked to be the very file that was
//! written and hashed (one name, the store's user's), made read-only and
//! given its folder `blobs/<sha256>/`. It then joins a group
//! ([`Store::publish_grouped`]); a group closes once it holds
//! [`GROUP_FILES`] files or [`GROUP_BYTES`] bytes, or when no file joined
//! for [`GROUP_IDLE`]. A group is published in steps, each over every file
//! of the group before the next begins:
//!
//! 1. every file is flushed (`fsync`), from several threads at once, so a
//!    journaled file system commits them together;
//! 2. `blobs/` is flushed once, if the group made folders in it;
//! 3. each file's stamp is recorded and the file renamed to its name in
//!    `blobs/<sha256>/` (a file found replaced under the name is taken out
//!    again);
//! 4. each folder a file was renamed into is flushed once, and the file's
//!    path handed out.
//!
//! The crash rule: a name in `blobs/` is given only to bytes flushed
//! before (step 1 before step 3), so a crash at any moment leaves each
//! file either whole and verified under its name or under its partial
//! name in `tmp/`, never a name for partial or unverified bytes. A path
//! is handed out only once its name is durable too (step 4).

use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};

use super::folder::Folder;
use super::partial::PartialPaths;
use super::{check_sha256, stamps, trust, Store};
use crate::error::{Error, Result};

/// Most files in one group.
pub const GROUP_FILES: usize = 64;

/// Most bytes in one group: past this many, the group's flushes would
/// wait on the disk long enough that starting them earlier pays.
pub const GROUP_BYTES: u64 = 64 << 20;

/// A group closes when no file joined it for this long.
pub const GROUP_IDLE: Duration = Duration::from_millis(2);

/// Threads that flush, rename and name the files of one group at once.
/// A disk takes many flushes at once (a journaled file system commits them
/// together, a disk without a journal queues them): each thread flushes a
/// share of the group's files one after another.
const GROUP_THREADS: usize = 32;

/// Groups published at once: the next group's files are flushed while the
/// folders of the one before are.
const GROUPS_IN_FLIGHT: usize = 2;

/// What runs on a group's thread once a file's publication ended, with
/// its result (the caller's bookkeeping, the release of its lock).
pub(crate) type Then = Box<dyn FnOnce(&Result<PathBuf>) + Send>;

/// A verified file ready to be published: checked, read-only, its folder
/// made.
pub(crate) struct Staged {
    /// The partial file, open (written through it: flushed at step 1).
    file: std::fs::File,
    /// Its facts when it was checked (which file it is).
    checked: std::fs::Metadata,
    /// `tmp/` and its name there.
    paths: PartialPaths,
    sha256: String,
    /// Its name in `blobs/<sha256>/`.
    name: String,
    /// The address that served it.
    served_by: String,
    /// Whether its folder was made for it (`blobs/` is flushed then).
    created: bool,
    /// Its size.
    len: u64,
    /// Run once its publication ended.
    then: Option<Then>,
}

impl Staged {
    /// Runs `then` once the publication ended, on the group's thread.
    pub(crate) fn then(mut self, then: Then) -> Staged {
        self.then = Some(then);
        self
    }
}

/// The steps of a group's publication, as a fault injected in tests sees
/// them.
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// A file was flushed (its inode).
    FileSynced(u64),
    /// Every file of the group was flushed.
    FilesSynced,
    /// `blobs/` was flushed.
    FoldersSynced,
    /// A file is about to take its name (its inode).
    Renaming(u64),
    /// A file took its name.
    Renamed(u64),
    /// A file's folder was flushed and its path handed out.
    HandedOut(u64),
}

/// A test's look at each step: `false` stops the group there, as a crash
/// would.
#[cfg(test)]
pub(crate) type Hook = Arc<dyn Fn(&Step) -> bool + Send + Sync>;

/// The files waiting for a group, and whether a group is being formed or
/// published now.
#[derive(Default)]
pub(crate) struct Groups {
    queue: Mutex<Queue>,
    /// Wakes the runner when a group is full.
    full: Notify,
    #[cfg(test)]
    pub(crate) hook: Mutex<Option<Hook>>,
}

impl std::fmt::Debug for Groups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Groups").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Entry>,
    bytes: u64,
    /// Arrivals so far (the runner sees whether any came while it waited).
    arrived: u64,
    /// Whether a runner forms and publishes groups now.
    running: bool,
}

/// A staged file and where its result goes.
struct Entry {
    staged: Staged,
    reply: Option<oneshot::Sender<Result<PathBuf>>>,
    /// Its result, once known (a failed step skips the later ones).
    result: Option<Result<PathBuf>>,
    /// Its folder, once renamed into it.
    dir: Option<Folder>,
}

impl Entry {
    fn fail(&mut self, e: Error) {
        if self.result.is_none() {
            self.result = Some(Err(e));
        }
    }

    fn pending(&self) -> bool {
        self.result.is_none()
    }

    /// Ends the publication: `then`, and the answer to the waiter (or
    /// the result, when nobody waits on a channel).
    fn end(mut self, crashed: bool) -> Option<Result<PathBuf>> {
        let result = self.result.take().unwrap_or_else(|| {
            Err(Error::io(
                "cannot publish",
                &self.staged.paths.data,
                io::Error::other(if crashed {
                    "the publication was stopped"
                } else {
                    "the publication did not end"
                }),
            ))
        });
        if let Some(then) = self.staged.then.take() {
            then(&result);
        }
        match self.reply.take() {
            Some(reply) => {
                let _ = reply.send(result);
                None
            }
            None => Some(result),
        }
    }
}

impl Store {
    /// Stages a verified partial file for publication (see the module):
    /// read-only (`0400`), its folder `blobs/<sha256>` made. Nothing is
    /// flushed or named yet.
    ///
    /// Only a regular file of the store's user with no other name is
    /// staged, and only the very file that was checked: a symbolic link
    /// or another user's file at the partial file's name is refused.
    pub(crate) fn stage(
        &self,
        paths: &PartialPaths,
        sha256: &str,
        name: &str,
        served_by: &str,
    ) -> Result<Staged> {
        check_sha256(sha256)?;
        let tmp = &paths.data;
        let map = |e| Error::io("cannot publish", tmp, e);
        // Through the handle of `tmp/` opened with the store: never a file
        // at this path in a folder put in the store's place since.
        // Writable: it is flushed (on Windows only a handle that may
        // write can flush).
        let file = paths
            .folder()
            .open_own(
                &paths.data_name(),
                cap_std::fs::OpenOptions::new().read(true).write(true),
            )
            .map_err(map)?;
        let checked = file.metadata().map_err(map)?;
        // The file under the name must be the one the writer wrote (and
        // hashed as it wrote): one swapped in since is never published.
        if !paths.is_written(&file).map_err(map)? {
            return Err(map(io::Error::new(
                io::ErrorKind::InvalidData,
                "the partial file is not the one that was written and hashed: the store does not trust it",
            )));
        }
        if crate::platform::link_count(&checked) != 1 {
            return Err(map(io::Error::new(
                io::ErrorKind::InvalidData,
                "the partial file has other names: the store does not trust it",
            )));
        }
        trust::make_blob(&file).map_err(map)?;
        // Its folder is made now, so that the group's flush of `blobs/`
        // (step 2) covers it. An empty folder is no stored file (`has`),
        // after a crash too.
        let created = self.blob_folder(sha256)?;
        Ok(Staged {
            len: checked.len(),
            file,
            checked,
            paths: paths.clone(),
            sha256: sha256.to_string(),
            name: name.to_string(),
            served_by: served_by.to_string(),
            created,
            then: None,
        })
    }

    /// Publishes a verified partial file at once, in a group of its own
    /// (see the module): its stamp and the address that served it
    /// (`served_by`) are recorded before it takes its name; the path
    /// returned is durable.
    pub(crate) fn publish(
        &self,
        paths: &PartialPaths,
        sha256: &str,
        name: &str,
        served_by: &str,
    ) -> Result<PathBuf> {
        let staged = self.stage(paths, sha256, name, served_by)?;
        let mut group = [Entry::new(staged, None)];
        let crashed = self.publish_group_serially(&mut group);
        let [entry] = group;
        entry.end(crashed).unwrap_or_else(|| {
            Err(Error::io(
                "cannot publish",
                &paths.data,
                io::Error::other("the publication stopped"),
            ))
        })
    }

    /// Publishes a staged file in the next group (see the module); the
    /// path returned is durable. The publication goes on when the caller
    /// stops waiting. Call on a Tokio runtime.
    pub(crate) async fn publish_grouped(&self, staged: Staged) -> Result<PathBuf> {
        let data = staged.paths.data.clone();
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut queue = self.groups.queue.lock().unwrap_or_else(|p| p.into_inner());
            queue.bytes += staged.len;
            queue.arrived += 1;
            queue.waiting.push(Entry::new(staged, Some(tx)));
            if queue.waiting.len() >= GROUP_FILES || queue.bytes >= GROUP_BYTES {
                self.groups.full.notify_one();
            }
            !std::mem::replace(&mut queue.running, true)
        };
        if start {
            tokio::spawn(self.clone().run_groups());
        }
        rx.await.unwrap_or_else(|_| {
            Err(Error::io(
                "cannot publish",
                &data,
                io::Error::other("the publication stopped"),
            ))
        })
    }

    /// Forms groups and publishes them, one after another, until no file
    /// waits.
    async fn run_groups(self) {
        let in_flight = Arc::new(tokio::sync::Semaphore::new(GROUPS_IN_FLIGHT));
        let mut running = tokio::task::JoinSet::new();
        loop {
            let Some(group) = self.next_group().await else {
                break;
            };
            let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
                break;
            };
            let store = self.clone();
            running.spawn(async move {
                store.publish_group(group).await;
                drop(permit);
            });
            while running.try_join_next().is_some() {}
        }
        while running.join_next().await.is_some() {}
    }

    /// The next group, once it is full or no file joined it for
    /// [`GROUP_IDLE`]; `None` (and the runner ends) when no file waits.
    async fn next_group(&self) -> Option<Vec<Entry>> {
        let groups = &self.groups;
        let lock = || groups.queue.lock().unwrap_or_else(|p| p.into_inner());
        let mut seen = lock().arrived;
        loop {
            let full = tokio::select! {
                () = groups.full.notified() => true,
                () = tokio::time::sleep(GROUP_IDLE) => false,
            };
            let mut queue = lock();
            let idle = queue.arrived == seen;
            seen = queue.arrived;
            if queue.waiting.is_empty() {
                if idle {
                    queue.running = false;
                    return None;
                }
                continue;
            }
            if full || idle || queue.waiting.len() >= GROUP_FILES || queue.bytes >= GROUP_BYTES {
                let take = queue.waiting.len().min(GROUP_FILES);
                let group: Vec<Entry> = queue.waiting.drain(..take).collect();
                queue.bytes = queue.waiting.iter().map(|e| e.staged.len).sum();
                return Some(group);
            }
        }
    }

    /// Publishes one group, each step over every file (several threads of
    /// the blocking pool at once) before the next.
    async fn publish_group(&self, group: Vec<Entry>) {
        tracing::debug!(files = group.len(), "publishing a group of verified files");
        // Spread evenly over the threads; entries sharing a folder go to
        // the same thread, which flushes it once.
        let chunks = spread(group, GROUP_THREADS);
        // Step 1: every file flushed.
        let (chunks, crashed) = self.on_threads(chunks, Store::sync_files).await;
        // Step 2: `blobs/` once, for the folders the group made.
        let created = chunks
            .iter()
            .flatten()
            .any(|e| e.staged.created && e.pending());
        let crashed = crashed || !self.step_all_synced(created);
        if crashed {
            end_all(chunks, true);
            return;
        }
        // Step 3: stamps and names.
        let (chunks, crashed) = self.on_threads(chunks, Store::name_files).await;
        if crashed {
            end_all(chunks, true);
            return;
        }
        // Step 4: each folder once, and the paths handed out.
        let (chunks, crashed) = self.on_threads(chunks, Store::hand_out_files).await;
        end_all(chunks, crashed);
    }

    /// Runs `step` over each chunk on a thread of the blocking pool, all
    /// at once; whether any stopped (a fault injected in tests).
    async fn on_threads(
        &self,
        chunks: Vec<Vec<Entry>>,
        step: fn(&Store, &mut [Entry]) -> bool,
    ) -> (Vec<Vec<Entry>>, bool) {
        let tasks: Vec<_> = chunks
            .into_iter()
            .map(|mut chunk| {
                let store = self.clone();
                tokio::task::spawn_blocking(move || {
                    let ok = step(&store, &mut chunk);
                    (chunk, ok)
                })
            })
            .collect();
        let mut out = Vec::with_capacity(tasks.len());
        let mut crashed = false;
        for task in tasks {
            match task.await {
                Ok((chunk, ok)) => {
                    crashed |= !ok;
                    out.push(chunk);
                }
                // A panic: its files are lost to this group (their waiters
                // hear that the publication stopped).
                Err(_) => crashed = true,
            }
        }
        (out, crashed)
    }

    /// Every step of a group on this thread (a group of one); whether it
    /// was stopped.
    fn publish_group_serially(&self, group: &mut [Entry]) -> bool {
        if !self.sync_files(group) {
            return true;
        }
        let created = group.iter().any(|e| e.staged.created && e.pending());
        if !self.step_all_synced(created) {
            return true;
        }
        !(self.name_files(group) && self.hand_out_files(group))
    }

    /// Step 1: flushes each file (its bytes and mode).
    fn sync_files(&self, chunk: &mut [Entry]) -> bool {
        for entry in chunk.iter_mut() {
            if let Err(e) = entry.staged.file.sync_all() {
                let data = entry.staged.paths.data.clone();
                entry.fail(Error::io("cannot publish", &data, e));
                continue;
            }
            #[cfg(test)]
            if !self.step(&Step::FileSynced(ino(&entry.staged.checked))) {
                return false;
            }
        }
        true
    }

    /// Steps 1 and 2 end: `blobs/` flushed when the group made folders.
    fn step_all_synced(&self, created: bool) -> bool {
        #[cfg(test)]
        if !self.step(&Step::FilesSynced) {
            return false;
        }
        if created {
            self.folders.blobs.sync();
            #[cfg(test)]
            if !self.step(&Step::FoldersSynced) {
                return false;
            }
        }
        true
    }

    /// Step 3: records each flushed file's stamp, then renames it into its
    /// folder; a file found replaced under its name is taken out again.
    fn name_files(&self, chunk: &mut [Entry]) -> bool {
        for entry in chunk.iter_mut().filter(|e| e.pending()) {
            #[cfg(test)]
            if !self.step(&Step::Renaming(ino(&entry.staged.checked))) {
                return false;
            }
            if let Err(e) = self.name_file(entry) {
                entry.fail(e);
                continue;
            }
            #[cfg(test)]
            if !self.step(&Step::Renamed(ino(&entry.staged.checked))) {
                return false;
            }
        }
        true
    }

    fn name_file(&self, entry: &mut Entry) -> Result<()> {
        let s = &entry.staged;
        let map = |e| Error::io("cannot publish", &s.paths.data, e);
        // The stamp of the file as it will be under its name: a rename
        // changes none of its facts.
        let stamp = s
            .file
            .metadata()
            .map(|meta| crate::platform::ContentStamp::of(&s.paths.data, &meta))
            .map_err(map)?;
        let dir_path = self.folders.blobs.join(&s.sha256);
        let dir = self
            .folders
            .blobs
            .open_sub(&s.sha256)
            .map_err(|e| Error::io("cannot open", &dir_path, e))?;
        let dest = dir.join(&s.name);
        let served = stamps::Served::now(&s.served_by);
        // A folder made for this file holds no other names to keep in the
        // record: nothing to read first.
        let fresh = s.created;
        stamps::record_new_stamp(
            self.stamps(),
            &s.sha256,
            &dir,
            &s.name,
            stamp,
            Some(served),
            fresh,
        );
        s.paths
            .folder()
            .rename_to(&s.paths.data_name(), &dir, &s.name)
            .map_err(|e| Error::io("cannot move verified file to", &dest, e))?;
        if !dir.names_file(&s.name, &s.checked) {
            let _ = dir.remove_file(&s.name);
            return Err(map(io::Error::new(
                io::ErrorKind::InvalidData,
                "the partial file was replaced before it was published",
            )));
        }
        entry.dir = Some(dir);
        Ok(())
    }

    /// Step 4: flushes each folder a file was renamed into (once), then
    /// hands out each file's path.
    fn hand_out_files(&self, chunk: &mut [Entry]) -> bool {
        let mut synced: Vec<String> = Vec::new();
        for entry in chunk.iter_mut().filter(|e| e.pending()) {
            let Some(dir) = entry.dir.take() else {
                continue;
            };
            let s = &entry.staged;
            if !synced.contains(&s.sha256) {
                dir.sync();
                synced.push(s.sha256.clone());
            }
            let _ = s.paths.remove_record();
            // The path handed out must lead to the file just published,
            // not into a folder put in the store's place.
            entry.result = Some(self.hand_out(&dir, &s.name));
            #[cfg(test)]
            if !self.step(&Step::HandedOut(ino(&entry.staged.checked))) {
                return false;
            }
        }
        true
    }

    /// Makes `blobs/<sha256>` a folder of the store's user, replacing
    /// anything else found there; whether it was created.
    pub(super) fn blob_folder(&self, sha256: &str) -> Result<bool> {
        let blobs = &self.folders.blobs;
        let path = blobs.join(sha256);
        // Most often there is none: made, without a look first.
        if blobs
            .create_new_sub(sha256)
            .map_err(|e| Error::io("cannot create", &path, e))?
        {
            return Ok(true);
        }
        // One look at the name: a folder of the store's user stays.
        match blobs.entry(sha256) {
            Ok(m) if m.is_dir() && crate::platform::entry_owned_by_me(&m) => return Ok(false),
            Ok(m) if m.is_dir() => blobs.remove_folder(sha256),
            Ok(_) => blobs.remove_file(sha256),
            Err(_) => Ok(()),
        }
        .map_err(|e| Error::io("cannot remove untrusted entry", &path, e))?;
        blobs
            .create_sub(sha256)
            .map_err(|e| Error::io("cannot create", &path, e))?;
        Ok(true)
    }

    /// Tells the test's hook about `step`: `false` to stop there.
    #[cfg(test)]
    fn step(&self, step: &Step) -> bool {
        let hook = self.groups.hook.lock().unwrap().clone();
        hook.is_none_or(|h| h(step))
    }
}

impl Entry {
    fn new(staged: Staged, reply: Option<oneshot::Sender<Result<PathBuf>>>) -> Entry {
        Entry {
            staged,
            reply,
            result: None,
            dir: None,
        }
    }
}

/// `group` in at most `threads` chunks of about the same size, the files
/// of one SHA-256 in the same chunk.
fn spread(mut group: Vec<Entry>, threads: usize) -> Vec<Vec<Entry>> {
    group.sort_by(|a, b| a.staged.sha256.cmp(&b.staged.sha256));
    let size = group.len().div_ceil(threads.max(1)).max(1);
    let mut chunks: Vec<Vec<Entry>> = Vec::new();
    for entry in group {
        match chunks.last_mut() {
            Some(last)
                if last.len() < size
                    || last
                        .last()
                        .is_some_and(|l| l.staged.sha256 == entry.staged.sha256) =>
            {
                last.push(entry)
            }
            _ => chunks.push(vec![entry]),
        }
    }
    chunks
}

fn end_all(chunks: Vec<Vec<Entry>>, crashed: bool) {
    for entry in chunks.into_iter().flatten() {
        let _ = entry.end(crashed);
    }
}

#[cfg(test)]
fn ino(meta: &std::fs::Metadata) -> u64 {
    #[cfg(unix)]
    {
        std::os::unix::fs::MetadataExt::ino(meta)
    }
    #[cfg(not(unix))]
    {
        meta.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};
    use std::collections::HashSet;
    use std::io::Write;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A partial file holding `body`, written (and so hashed) by its
    /// writer: what a download leaves once its bytes are verified.
    fn verified(store: &Store, body: &[u8]) -> (String, PartialPaths) {
        let sha = hex::encode(Sha256::digest(body));
        let paths = store
            .prepare("r", &sha, body.len() as u64, 0, Duration::ZERO)
            .unwrap();
        paths.open_data().unwrap().write_all(body).unwrap();
        (sha, paths)
    }

    /// Every file under a name in `blobs/`: its folder's name, its name,
    /// its inode and its bytes.
    fn visible(root: &std::path::Path) -> Vec<(String, String, u64, Vec<u8>)> {
        let mut out = Vec::new();
        let blobs = root.join(super::super::LAYOUT).join("blobs");
        for dir in std::fs::read_dir(blobs).unwrap().map(|e| e.unwrap()) {
            let sha = dir.file_name().into_string().unwrap();
            for file in std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap()) {
                let meta = std::fs::symlink_metadata(file.path()).unwrap();
                out.push((
                    sha.clone(),
                    file.file_name().into_string().unwrap(),
                    ino(&meta),
                    std::fs::read(file.path()).unwrap(),
                ));
            }
        }
        out
    }

    /// Publishes a group of verified files with a crash injected before
    /// the step numbered `crash_at` (every step after it stops too);
    /// returns the files flushed before the crash, and how many steps the
    /// hook saw.
    async fn crash_a_group(root: &std::path::Path, crash_at: usize) -> (HashSet<u64>, usize) {
        let store = Store::open(root).unwrap();
        let synced = Arc::new(Mutex::new(HashSet::new()));
        let steps = Arc::new(AtomicUsize::new(0));
        let hook: Hook = {
            let (synced, steps) = (synced.clone(), steps.clone());
            Arc::new(move |step: &Step| {
                if let Step::FileSynced(ino) = step {
                    // Flushed: its bytes survive a crash from now on.
                    synced.lock().unwrap().insert(*ino);
                }
                steps.fetch_add(1, Ordering::SeqCst) < crash_at
            })
        };
        *store.groups.hook.lock().unwrap() = Some(hook);
        // Five verified files, and bytes that failed their check (a
        // download that ended in error leaves them in `tmp/`: they are
        // never staged).
        let mut staged = Vec::new();
        for i in 0..5u8 {
            let body = vec![i; 1000 + usize::from(i)];
            let (sha, paths) = verified(&store, &body);
            staged.push(
                store
                    .stage(&paths, &sha, &format!("f{i}.bin"), "https://o.test/f")
                    .unwrap(),
            );
        }
        let expected = hex::encode(Sha256::digest(b"the declared bytes"));
        let failed = store
            .prepare("r", &expected, 18, 0, Duration::ZERO)
            .unwrap();
        failed
            .open_data()
            .unwrap()
            .write_all(b"other bytes!")
            .unwrap();
        let waits = staged.into_iter().map(|s| {
            let store = store.clone();
            async move { store.publish_grouped(s).await }
        });
        let results = futures_util::future::join_all(waits).await;
        let seen = steps.load(Ordering::SeqCst);
        // Without a crash every file is published.
        if crash_at >= seen {
            assert!(results.iter().all(Result::is_ok), "{results:?}");
        }
        let synced = synced.lock().unwrap().clone();
        (synced, seen)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crash_at_any_step_of_a_group_leaves_names_only_for_whole_flushed_verified_bytes() {
        let mut crash_at = 0;
        loop {
            let dir = tempfile::tempdir().unwrap();
            let (synced, seen) = crash_a_group(dir.path(), crash_at).await;
            // What a crash at that moment leaves under a name: bytes
            // flushed before the name was given, whole and verified.
            for (sha, name, ino, bytes) in visible(dir.path()) {
                assert!(
                    synced.contains(&ino),
                    "crash before step {crash_at}: {sha}/{name} is named but its bytes were never flushed"
                );
                assert_eq!(
                    hex::encode(Sha256::digest(&bytes)),
                    sha,
                    "crash before step {crash_at}: {name} is not the verified file"
                );
            }
            if crash_at >= seen {
                // The last round crashed nowhere: every file is there.
                assert_eq!(visible(dir.path()).len(), 5);
                break;
            }
            crash_at += 1;
        }
        // Five files: flushed, then `blobs/`, then named, then handed out.
        assert!(crash_at >= 4 * 5 + 2, "{crash_at} steps");
    }
}
