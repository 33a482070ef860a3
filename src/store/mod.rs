//! The content-addressed store of verified files.
//!
//! ```text
//! <store>/
//!   store-v1/                      layout version; a new layout gets a new folder
//!     blobs/<sha256>/<file name>   verified files, read-only; more names for the
//!                                  same bytes are hard links in the same folder
//!     tmp/<sha256>.<size>.partial  a download in progress or interrupted; never
//!                                  visible as a blob
//!     tmp/<sha256>.<size>.partial.json
//!                                  its address, validator and flushed length
//!                                  (resume; see `partial`)
//!     tmp/<sha256>.<size>.<n>.partial[.json]
//!                                  the same for lane n of the file (see `lanes`)
//!     locks/<sha256>.<size>[.<n>].lock
//!                                  one lock per lane of a file (its whole
//!                                  SHA-256, size and lane), held while it is
//!                                  downloaded, kept for the next download of
//!                                  the file; removed by the cleanup once the
//!                                  file is not stored (see `lockfile`)
//!     locks/<sha256>.<size>[.<n>].lock.json
//!                                  who holds it: gem, addresses, start
//!     locks/<sha256>.failed.json   the last failed download of <sha256>, for
//!                                  callers in other processes that waited on it
//!     gems/<gem id>.json           what each installed gem declares (service)
//!     failures/<gem id>.jsonl      last failure per resource, a log (service)
//!     stamps/<sha256>.json         each verified file's stamp and the address
//!                                  that served it, written once as it is
//!                                  published (see `stamps`): a changed file is
//!                                  hashed again; `status` shows the address
//!     served/<sha256>.json         the address, as earlier versions kept it
//! ```
//!
//! Files are named by the SHA-256 of their contents, so two gems that
//! declare the same bytes share one copy, and a tool that loads
//! `ocr-v3.onnx` gets a path ending in `ocr-v3.onnx`.
//!
//! Bytes are written to `tmp/` and only a file whose size and digest were
//! verified is made read-only, fsynced and renamed into `blobs/`, in groups
//! of files made durable together (see `publish`). A crash at any moment
//! leaves at worst a `.partial` file, which the next download of
//! the same SHA-256 and size continues (see [`crate::store::partial`]); [`Store::clean_tmp`]
//! removes leftovers nobody can resume and partial files older than
//! `network.partial_max_age_days`. The declared size is part of a partial
//! file's name, so every process can tell how much the downloads in
//! progress will still write when it checks free space; how much of that
//! counts is decided by what each download has shown it can deliver
//! (`lanes::counted`).
//!
//! The store is anchored on its folders (see `folder`): [`Store::open`]
//! checks them, then holds each one open as a directory handle (`cap-std`),
//! and every open, rename and removal in them is made relative to those
//! handles with one-component names; a path is handed out only while it
//! leads to the file the handle reaches.
//!
//! The store trusts only what its own user made (see `store/trust.rs`): its
//! folders are `0700` and refused at open when another user owns them or
//! can write them; partial files, records and logs are opened without
//! following symbolic links and checked to be regular files of the user;
//! a verified file is one of the user's regular files, `0400`.

pub(crate) mod atomic;
pub(crate) mod folder;
mod publish;
mod shared_failure;
mod space;
mod stamps;
pub(crate) mod trust;

pub use publish::{GROUP_BYTES, GROUP_FILES, GROUP_IDLE};
pub use shared_failure::{parse_shared_failure, SharedFailure};
use space::available_space_at;
pub(crate) use space::{partial_write_failed, write_failed};

pub mod gc;
pub mod lanes;
pub(crate) mod lockfile;
pub mod partial;
pub mod policy_record;
pub mod registry;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::store::folder::{Folder, LazySub};
use crate::store::lanes::{lane_key, Holder, LaneLock, LANES};
use crate::store::lockfile::KeyLock;
use crate::store::partial::DataEntry;
use crate::store::partial::PartialPaths;

/// The most characters a failure's full message keeps, on disk and when it
/// is shared with another process: a hostile server must not be able to
/// make records grow without bound.
pub(crate) const MAX_FAILURE_MESSAGE_CHARS: usize = 16 * 1024;

/// How long a look that found a store's download folders writable stands
/// for the downloads that start after it (see [`Store::known_writable`]).
const WRITABLE_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// The current layout version's folder name.
pub const LAYOUT: &str = "store-v1";

/// A store folder.
#[derive(Debug, Clone)]
pub struct Store {
    /// `<store>/store-v1`.
    root: PathBuf,
    /// Its folders, opened and checked once: what the store writes,
    /// renames and removes goes through them (see `folder`).
    folders: Arc<Folders>,
    /// Serialises "check free space, then create the partial file" within
    /// this process, so two downloads cannot both count the same free bytes.
    space: Arc<Mutex<()>>,
    /// Verified files waiting to be published in a group (see `publish`).
    groups: Arc<publish::Groups>,
}

/// The folders of a store, held open.
#[derive(Debug)]
struct Folders {
    /// `store-v1/`.
    root: Arc<Folder>,
    /// `store-v1/blobs/`.
    blobs: Folder,
    /// `store-v1/tmp/`.
    tmp: Arc<Folder>,
    /// `store-v1/locks/`.
    locks: Arc<Folder>,
    /// `store-v1/stamps/`, opened on first use.
    stamps: Arc<LazySub>,
    /// The registry's folders.
    registry: RegistryFolders,
    /// When [`Store::check_writable`] last found the download folders
    /// writable.
    writable_at: Mutex<Option<std::time::Instant>>,
}

/// The folders of a store's registry (see `registry`), held open.
#[derive(Debug)]
pub(crate) struct RegistryFolders {
    /// `store-v1/gems/`.
    pub(crate) gems: Arc<Folder>,
    /// `store-v1/failures/`.
    pub(crate) failures: Arc<Folder>,
    /// `store-v1/served/`, opened on first use (what served a file, as
    /// earlier versions recorded it).
    pub(crate) served: Arc<LazySub>,
    /// `store-v1/stamps/`, opened on first use (what served a file).
    pub(crate) stamps: Arc<LazySub>,
    /// `store-v1/locks/`.
    pub(crate) locks: Arc<Folder>,
    /// Turns at the registry lock within this process (see
    /// `Registry::lock`), shared by every registry of this store.
    pub(crate) registry_turns: Arc<tokio::sync::Mutex<()>>,
}

/// An exclusive, cross-process lock on every download of one SHA-256 (each
/// lane of each declared size found in the store); released on drop.
#[derive(Debug)]
pub struct ShaLock {
    _locks: Vec<KeyLock>,
}

/// A download of a file in progress, seen through its lane's lock.
#[derive(Debug, Clone)]
pub(crate) struct LaneInUse {
    /// What its holder said about itself, when it did.
    pub holder: Option<Holder>,
    /// The bytes its partial file holds (see [`PartialPaths::held`]).
    pub held: u64,
}

/// One listing of the folders that say which downloads run and what is
/// kept (`locks/` and `tmp/`), taken by [`Store::listing`] to look at many
/// files at once: a status of thousands of files lists each folder once,
/// not once per file.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// The lanes whose lock file exists, by SHA-256 and declared size;
    /// `None` where released lock files stay (every lane may be held).
    locked: Option<std::collections::BTreeMap<(String, u64), Vec<u32>>>,
    /// The partial data files, by SHA-256.
    partials: std::collections::BTreeMap<String, Vec<PartialEntry>>,
}

/// A partial data file found in `tmp/`.
#[derive(Debug, Clone)]
struct PartialEntry {
    sha256: String,
    size: u64,
    lane: u32,
}

impl PartialEntry {
    fn key(&self) -> String {
        lane_key(&self.sha256, self.size, self.lane)
    }

    fn paths(&self, tmp: &Arc<Folder>) -> PartialPaths {
        PartialPaths::lane(tmp, &self.sha256, self.size, self.lane)
    }
}

impl Store {
    /// Opens (creating when needed) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Store> {
        // Paths handed to tools must not depend on the caller's working
        // folder.
        let dir = std::path::absolute(dir)
            .map_err(|e| Error::io("cannot resolve store folder", dir, e))?;
        // Every folder on the way must be out of other users' reach: one
        // who can rename the store away and put a tree of theirs in its
        // place could have their bytes published as verified.
        let above = dir.parent().unwrap_or(&dir);
        if let Some((at, why)) = crate::platform::path_problem(above) {
            return Err(Error::Config(format!(
                "store folder {}: {} {why}; use a store in a folder of your own (`store` in config.toml, or --store)",
                dir.display(),
                at.display()
            )));
        }
        if let Ok(meta) = fs::symlink_metadata(&dir) {
            if meta.file_type().is_symlink() && !trust::is_own_link(&meta) {
                return Err(Error::Config(format!(
                    "store folder {} is a symbolic link of another user, who could point it elsewhere; use a store of your own",
                    dir.display()
                )));
            }
        }
        // Each folder is opened once as a handle and checked through it;
        // from then on the store reaches its files through the handles
        // only, so a folder renamed away and another put at its path
        // changes nothing the store writes or publishes.
        trust::create_folder(&dir).map_err(|e| Error::io("cannot create store folder", &dir, e))?;
        let top =
            Folder::open_path(&dir).map_err(|e| Error::io("cannot open store folder", &dir, e))?;
        check_held(&top)?;
        let root = Arc::new(open_sub(&top, LAYOUT)?);
        let blobs = open_sub(&root, "blobs")?;
        let tmp = Arc::new(open_sub(&root, "tmp")?);
        let locks = Arc::new(open_sub(&root, "locks")?);
        // Opened on first use: a read-only store made by an earlier
        // version may lack them.
        let stamps = Arc::new(LazySub::new(root.clone(), "stamps"));
        let registry = RegistryFolders {
            gems: Arc::new(open_sub(&root, "gems")?),
            failures: Arc::new(open_sub(&root, "failures")?),
            served: Arc::new(LazySub::new(root.clone(), "served")),
            stamps: stamps.clone(),
            locks: locks.clone(),
            registry_turns: Arc::default(),
        };
        Ok(Store {
            root: root.path().to_path_buf(),
            folders: Arc::new(Folders {
                root,
                blobs,
                tmp,
                locks,
                stamps,
                registry,
                writable_at: Mutex::new(None),
            }),
            space: Arc::new(Mutex::new(())),
            groups: Arc::default(),
        })
    }

    /// `store-v1/`, held open.
    pub(crate) fn root_folder(&self) -> &Folder {
        &self.folders.root
    }

    /// The registry's folders, held open.
    pub(crate) fn registry_folders(&self) -> &RegistryFolders {
        &self.folders.registry
    }

    /// `tmp/`, held open.
    pub(crate) fn tmp_folder(&self) -> &Arc<Folder> {
        &self.folders.tmp
    }

    /// The partial file of `lane` of `sha256` declared with `size`.
    pub(crate) fn partial(&self, sha256: &str, size: u64, lane: u32) -> PartialPaths {
        PartialPaths::lane(&self.folders.tmp, sha256, size, lane)
    }

    /// Fails, naming the store's folder, when its path no longer leads to
    /// the folder the store opened (renamed away, another put in its
    /// place): a path handed out now would lead into the other tree.
    pub(crate) fn check_in_place(&self, what: &Path) -> Result<()> {
        if self.folders.root.still_at_path() {
            return Ok(());
        }
        Err(Error::io(
            "cannot hand out",
            what,
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the store folder {} was moved or replaced after the store was opened: its path leads to another folder, which the store does not trust",
                    self.folder().display()
                ),
            ),
        ))
    }

    /// `<store>/store-v1`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<store>`: the folder the configuration or `--store` names, made
    /// absolute.
    pub fn folder(&self) -> &Path {
        self.root.parent().unwrap_or(&self.root)
    }

    /// Fails when this process cannot write the folders a download needs
    /// (`tmp/`, `locks/`, `blobs/`): a store on a read-only mount, or one
    /// whose folders this user may only read. The error names the store
    /// and `what` could not be downloaded (`the store is read-only; cannot
    /// download g/model (model.onnx) into /path: …`), where the lock
    /// file's error would say neither. Other failures of the probe are
    /// left for the download to report.
    pub fn check_writable(&self, what: &str) -> Result<()> {
        let folders = &self.folders;
        let dirs = [&*folders.tmp, &*folders.locks, &folders.blobs];
        let checked =
            Self::check_folders_writable(&dirs, &format!("download {what}"), self.folder());
        *self.writable_at() = checked.is_ok().then(std::time::Instant::now);
        checked
    }

    /// Whether [`Store::check_writable`] found the download folders
    /// writable within the last [`WRITABLE_FOR`]: thousands of downloads
    /// starting together look once, and a store made read-only since is
    /// still said so within that time.
    pub(crate) fn known_writable(&self) -> bool {
        self.writable_at()
            .is_some_and(|at| at.elapsed() < WRITABLE_FOR)
    }

    fn writable_at(&self) -> std::sync::MutexGuard<'_, Option<std::time::Instant>> {
        self.folders
            .writable_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// [`Store::check_writable`] for an install or upgrade of `gem`: the
    /// folders its registration and lock live in (`the store is read-only;
    /// cannot install g into /path: …`).
    pub fn check_installable(&self, gem: &str) -> Result<()> {
        let folders = &self.folders;
        let dirs = [&*folders.registry.gems, &*folders.locks];
        Self::check_folders_writable(&dirs, &format!("install {gem}"), self.folder())
    }

    fn check_folders_writable(dirs: &[&Folder], doing: &str, store: &Path) -> Result<()> {
        for dir in dirs {
            match dir.can_write() {
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::PermissionDenied
                            | std::io::ErrorKind::ReadOnlyFilesystem
                    ) =>
                {
                    return Err(Error::io(
                        format!("the store is read-only; cannot {doing} into"),
                        store,
                        e,
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Where the verified file for `sha256` is kept under `name`.
    pub fn blob_path(&self, sha256: &str, name: &str) -> PathBuf {
        self.root.join("blobs").join(sha256).join(name)
    }

    /// Returns the verified file for `sha256` named `name`, when the store
    /// has these bytes (under this or another name: another name gets a hard
    /// link, so the tool still sees its own file name). No hashing while a
    /// file's stamp (length, modification time, permissions, identity) is
    /// the one recorded when it was verified; a changed file is hashed
    /// again first, and removed (`None`) when its bytes no longer match.
    ///
    /// Only regular files of the store's user count: a symbolic link or
    /// another user's file planted in `blobs/` is never returned (the bytes
    /// are then missing, and a download replaces the entry).
    ///
    /// When the file system has no hard links, the other name is a copy;
    /// from async code use [`Store::find_off_runtime`], which makes that
    /// copy on a blocking thread.
    pub fn find(&self, sha256: &str, name: &str) -> Result<Option<PathBuf>> {
        // A second look after a changed file was settled: hashed again and
        // stamped, or removed.
        for _ in 0..2 {
            match self.find_present(sha256, name)? {
                Found::Here(dir, name) => return self.hand_out(&dir, &name).map(Some),
                Found::Nothing => return Ok(None),
                Found::Elsewhere(dir, existing) => {
                    return self.link_or_copy(sha256, &dir, name, &existing).map(Some)
                }
                Found::Changed(dir, its_name) => {
                    if !self.settle(sha256, &dir, &its_name)? {
                        // Let go of the folder first: Windows removes no
                        // folder a handle holds.
                        drop(dir);
                        self.remove(sha256)?;
                        return Ok(None);
                    }
                }
            }
        }
        Ok(None)
    }

    /// [`Store::find`] for async code: a copy (no hard links on this file
    /// system) and the hashing of a changed file are done on the runtime's
    /// blocking threads.
    pub async fn find_off_runtime(&self, sha256: &str, name: &str) -> Result<Option<PathBuf>> {
        if let Some(path) = self.find_unchanged(sha256, name)? {
            return Ok(Some(path));
        }
        let (store, sha256, name) = (self.clone(), sha256.to_string(), name.to_string());
        off_runtime(&self.root, move || store.find(&sha256, &name)).await
    }

    /// The verified file of `sha256` named `name` when it is there under
    /// that name with its stamp unchanged: [`Store::find`] without linking,
    /// copying or hashing anything.
    pub(crate) fn find_unchanged(&self, sha256: &str, name: &str) -> Result<Option<PathBuf>> {
        Ok(match self.find_present(sha256, name)? {
            Found::Here(dir, name) => Some(self.hand_out(&dir, &name)?),
            _ => None,
        })
    }

    /// [`Store::find_unchanged`] that also says when the store has nothing
    /// of `sha256` (`Ok(Err(true))`): then [`Store::find`] has nothing to
    /// link, copy or hash, and need not look again.
    pub(crate) fn find_unchanged_or_nothing(
        &self,
        sha256: &str,
        name: &str,
    ) -> Result<std::result::Result<PathBuf, bool>> {
        Ok(match self.find_present(sha256, name)? {
            Found::Here(dir, name) => Ok(self.hand_out(&dir, &name)?),
            Found::Nothing => Err(true),
            _ => Err(false),
        })
    }

    /// `blobs/<sha256>`, held open, when it is a folder of the store's
    /// user.
    fn blob_dir(&self, sha256: &str) -> Option<Folder> {
        self.folders.blobs.open_own_sub(sha256)
    }

    /// The path of the verified file `name` of `dir` (`blobs/<sha256>`), to
    /// hand to a tool: only when the path leads to the very file the
    /// store's handle reaches, never into a folder put in its place.
    fn hand_out(&self, dir: &Folder, name: &str) -> Result<PathBuf> {
        let path = dir.join(name);
        let held = dir
            .own_file_meta(name)
            .map_err(|e| Error::io("cannot read", &path, e))?;
        let named = fs::symlink_metadata(&path);
        if named.is_ok_and(|m| crate::platform::same_file(&m, &held)) {
            return Ok(path);
        }
        self.check_in_place(&path)?;
        Err(Error::io(
            "cannot hand out",
            &path,
            io::Error::new(
                io::ErrorKind::InvalidData,
                "its path leads to another file than the verified one",
            ),
        ))
    }

    /// `stamps/`, opened on first use.
    fn stamps(&self) -> &LazySub {
        &self.folders.stamps
    }

    /// Where the verified bytes of `sha256` are: under `name`, under
    /// another name only, in a file changed since it was stamped, or
    /// nowhere.
    fn find_present(&self, sha256: &str, name: &str) -> Result<Found> {
        check_sha256(sha256)?;
        let Some(dir) = self.blob_dir(sha256) else {
            return Ok(Found::Nothing);
        };
        let (its_name, here) = if dir.is_own_file(name) {
            (name.to_string(), true)
        } else {
            match own_files(&dir).into_iter().next() {
                Some(existing) => (existing, false),
                None => return Ok(Found::Nothing),
            }
        };
        let holds = match stamps::check(self.stamps(), sha256, &dir, &its_name) {
            stamps::Verdict::Holds => true,
            stamps::Verdict::Unrecorded => {
                // Kept by a version that recorded no stamps: trusted as it
                // was then, and stamped from now on.
                stamps::record(self.stamps(), sha256, &dir, &its_name);
                true
            }
            stamps::Verdict::Changed => false,
        };
        Ok(match (holds, here) {
            (true, true) => Found::Here(dir, its_name),
            (true, false) => Found::Elsewhere(dir, its_name),
            (false, _) => Found::Changed(dir, its_name),
        })
    }

    /// Hashes the stored file `name` of `dir`, whose stamp changed: when it
    /// still holds the bytes of `sha256` it is made read-only again and
    /// stamped (`true`); otherwise (`false`) the caller removes every file
    /// of `sha256`, so the next download fetches them anew.
    fn settle(&self, sha256: &str, dir: &Folder, name: &str) -> Result<bool> {
        use sha2::Digest;
        let path = dir.join(name);
        let map = |e| Error::io("cannot check", &path, e);
        let mut file = dir
            .open_own(name, cap_std::fs::OpenOptions::new().read(true))
            .map_err(map)?;
        let mut hasher = sha2::Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match io::Read::read(&mut file, &mut buf) {
                Ok(0) => break,
                Ok(n) => hasher.update(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(map(e)),
            }
        }
        let actual = hex::encode(hasher.finalize());
        if actual == sha256 {
            trust::make_blob(&file).map_err(map)?;
            stamps::record(self.stamps(), sha256, dir, name);
            return Ok(true);
        }
        tracing::warn!(
            sha256,
            actual = %actual,
            "{} changed since it was verified: removed, to be downloaded again",
            path.display()
        );
        Ok(false)
    }

    /// Gives the verified file `existing` of `sha256` (in `dir`) the name
    /// `name` too: a hard link, else a copy.
    fn link_or_copy(
        &self,
        sha256: &str,
        dir: &Folder,
        name: &str,
        existing: &str,
    ) -> Result<PathBuf> {
        let wanted = dir.join(name);
        // What the name holds afterwards is checked, not assumed: a link
        // planted there (or in place of `existing`) is never handed out.
        match dir.hard_link(existing, dir, name) {
            Ok(()) if dir.is_own_file(name) => {
                stamps::record(self.stamps(), sha256, dir, name);
                return self.hand_out(dir, name);
            }
            Ok(()) => {
                let _ = dir.remove_file(name);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_own_file(name) => {
                return self.hand_out(dir, name)
            }
            Err(_) => {}
        }
        // No hard links on this file system (or an entry the store does not
        // trust in the way): copy, but publish the copy like a download
        // (whole, read-only, renamed into place), so nobody sees a
        // half-copied file.
        let tmp = &self.folders.tmp;
        let (mut copy, temp) = tmp
            .create_temp(&format!("{sha256}.copy."))
            .map_err(|e| Error::io("cannot create temporary file in", tmp.path(), e))?;
        let needed = dir.own_file_meta(existing).map_or(0, |m| m.len());
        let copied = (|| {
            let mut from = dir.open_own(existing, cap_std::fs::OpenOptions::new().read(true))?;
            io::copy(&mut from, &mut copy)?;
            copy.sync_all()?;
            trust::make_blob(&copy)?;
            drop(copy);
            tmp.rename_to(&temp, dir, name)
        })();
        if let Err(e) = copied {
            let _ = tmp.remove_file(&temp);
            return Err(write_failed(
                "cannot copy stored file to",
                &wanted,
                e,
                needed,
            ));
        }
        dir.sync();
        stamps::record(self.stamps(), sha256, dir, name);
        self.hand_out(dir, name)
    }

    /// Whether the store holds the bytes of `sha256` under any name.
    pub fn has(&self, sha256: &str) -> bool {
        self.blob_dir(sha256)
            .is_some_and(|dir| !own_files(&dir).is_empty())
    }

    /// Every SHA-256 the store holds.
    pub fn blobs(&self) -> Result<Vec<String>> {
        let blobs = &self.folders.blobs;
        let names = blobs
            .names()
            .map_err(|e| Error::io("cannot list", blobs.path(), e))?;
        let mut out: Vec<String> = names.into_iter().filter(|n| is_sha256(n)).collect();
        out.sort();
        Ok(out)
    }

    /// The verified files of `sha256` (one per name).
    /// Only regular files of the store's user are listed (see
    /// [`Store::find`]).
    pub fn blob_files(&self, sha256: &str) -> Vec<PathBuf> {
        let Some(dir) = self.blob_dir(sha256) else {
            return Vec::new();
        };
        own_files(&dir).iter().map(|name| dir.join(name)).collect()
    }

    /// Deletes the bytes of `sha256` (every name).
    pub fn remove(&self, sha256: &str) -> Result<()> {
        if !is_sha256(sha256) {
            return Ok(());
        }
        let dir = self.root.join("blobs").join(sha256);
        stamps::forget(self.stamps(), sha256);
        match self.folders.blobs.remove_folder(sha256) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("cannot delete", &dir, e)),
        }
    }

    /// Takes the lock of every download of `sha256` (every lane of every
    /// declared size), waiting for the downloads in progress, in any
    /// process, to end.
    pub async fn lock(&self, sha256: &str) -> Result<ShaLock> {
        check_sha256(sha256)?;
        lockfile::wait(|| self.try_lock_keys(sha256, None)).await
    }

    /// [`Store::lock`], with lane 0 of the file `sha256` declared with
    /// `size` among the locks, whether or not a download of it ever ran:
    /// for writing its partial file.
    pub async fn lock_with_size(&self, sha256: &str, size: u64) -> Result<ShaLock> {
        check_sha256(sha256)?;
        lockfile::wait(|| self.try_lock_keys(sha256, Some(size))).await
    }

    /// Takes the lock of every download of `sha256` (every lane of every
    /// declared size that has a partial file or a lock file) only if no
    /// download of it is in progress.
    pub fn try_lock(&self, sha256: &str) -> Result<Option<ShaLock>> {
        check_sha256(sha256)?;
        self.try_lock_keys(sha256, None)
    }

    fn try_lock_keys(&self, sha256: &str, size: Option<u64>) -> Result<Option<ShaLock>> {
        let mut keys: Vec<String> = partial_files(&self.folders.tmp)
            .filter(|e| e.sha256 == sha256)
            .map(|e| e.key())
            .collect();
        let prefix = format!("{sha256}.");
        for name in self.locks().names().unwrap_or_default() {
            let key = name
                .strip_suffix(".lock")
                .filter(|k| k.starts_with(&prefix) && partial::parse_key(k).is_some());
            keys.extend(key.map(str::to_string));
        }
        keys.extend(size.map(|size| lane_key(sha256, size, 0)));
        keys.sort();
        keys.dedup();
        let mut locks = Vec::new();
        for key in keys {
            match lockfile::try_lock_key(self.locks(), &key)? {
                Some(lock) => locks.push(lock),
                None => return Ok(None),
            }
        }
        Ok(Some(ShaLock { _locks: locks }))
    }

    /// Takes `lane` of the file `sha256` declared with `size` only if
    /// nobody holds it.
    pub fn try_lock_lane(&self, sha256: &str, size: u64, lane: u32) -> Result<Option<LaneLock>> {
        check_sha256(sha256)?;
        if lane != 0 {
            // Lane 0's lock file is there whenever another lane's is: a
            // look for downloads in progress starts (and with nothing
            // there, ends) at it.
            lockfile::make(self.locks(), &lane_key(sha256, size, 0))?;
        }
        let key = lane_key(sha256, size, lane);
        let taken = lockfile::try_lock_key(self.locks(), &key)?;
        if lane != 0 && taken.is_some() {
            // Made again when a cleanup removed it meanwhile (see
            // `prune_locks`): one open of a name that is there.
            lockfile::make(self.locks(), &lane_key(sha256, size, 0))?;
        }
        Ok(taken.map(|lock| LaneLock { lock, lane }))
    }

    /// The first free lane other than 0 of the file `sha256`, `size`,
    /// preferring one whose kept bytes came from one of `addresses` (they
    /// resume), then one with nothing kept.
    pub(crate) fn try_lock_other_lane(
        &self,
        sha256: &str,
        size: u64,
        addresses: &[String],
    ) -> Result<Option<LaneLock>> {
        let mut lanes: Vec<(u8, u32)> = (1..LANES)
            .map(|lane| {
                let kept = self.partial(sha256, size, lane).kept();
                let rank = match kept {
                    Some((meta, _)) if addresses.contains(&meta.address) => 0,
                    None => 1,
                    Some(_) => 2,
                };
                (rank, lane)
            })
            .collect();
        lanes.sort();
        for (_, lane) in lanes {
            if let Some(lock) = self.try_lock_lane(sha256, size, lane)? {
                return Ok(Some(lock));
            }
        }
        Ok(None)
    }

    /// Sorts the kept bytes ([`Store::sort_kept_listed`]), then prepares the held
    /// lane's partial file ([`Store::prepare`]), from one listing of
    /// `tmp/`: what a new download does before it fetches.
    pub(crate) fn sort_and_prepare(
        &self,
        held: &LaneLock,
        resource: &str,
        sha256: &str,
        size: u64,
        addresses: &[String],
        grace: std::time::Duration,
    ) -> Result<PartialPaths> {
        let listed: Vec<PartialEntry> = partial_files(&self.folders.tmp).collect();
        self.sort_kept_listed(&listed, held, sha256, size, addresses);
        // A partial file the sorting moved is counted under both names
        // below: never less than the truth, and only a store near full
        // reads the exact reservations.
        self.prepare_listed(&listed, resource, sha256, size, held.lane, grace)
    }

    /// Sorts the kept bytes of the file `sha256`, `size` before a download
    /// from `addresses` continues in the lane it holds (`held`): bytes there
    /// that came from none of `addresses` (another declaration's download)
    /// move to a free lane with nothing kept, so this download never starts
    /// over them; then, when its lane keeps nothing, bytes of its own kept
    /// in a free lane move into it, so it resumes them. Where no lane is
    /// free, everything stays. `listed`: the partial files in `tmp/`.
    fn sort_kept_listed(
        &self,
        listed: &[PartialEntry],
        held: &LaneLock,
        sha256: &str,
        size: u64,
        addresses: &[String],
    ) {
        let mine = self.partial(sha256, size, held.lane);
        // Lanes with a partial file of this file, from one listing of
        // `tmp/`: only they keep anything (the held lane's own included:
        // without a data file it keeps nothing, and no record is read).
        let mut kept_in: Vec<u32> = listed
            .iter()
            .filter(|e| e.sha256 == sha256 && e.size == size)
            .map(|e| e.lane)
            .collect();
        let mine_listed = kept_in.contains(&held.lane);
        kept_in.retain(|&lane| lane != held.lane);
        kept_in.sort_unstable();
        let others = (0..LANES).filter(|&lane| lane != held.lane);
        let from_here = |paths: &PartialPaths| {
            paths
                .kept()
                .map(|(meta, _)| addresses.contains(&meta.address))
        };
        if mine_listed && from_here(&mine) == Some(false) {
            for lane in others.clone() {
                let free = self.partial(sha256, size, lane);
                if free.kept().is_some() {
                    continue;
                }
                if let Ok(Some(_lock)) = self.try_lock_lane(sha256, size, lane) {
                    mine.move_to(&free);
                    break;
                }
            }
        }
        if mine_listed && mine.kept().is_some() {
            return;
        }
        for lane in kept_in {
            let theirs = self.partial(sha256, size, lane);
            if from_here(&theirs) != Some(true) {
                continue;
            }
            if let Ok(Some(_lock)) = self.try_lock_lane(sha256, size, lane) {
                theirs.move_to(&mine);
                return;
            }
        }
    }

    /// The downloads of the file `sha256`, `size` in progress now, in this
    /// process or another, lane 0 first.
    pub(crate) fn lanes_in_use(&self, sha256: &str, size: u64) -> Vec<LaneInUse> {
        // Another lane is only taken where lane 0's lock file is (see
        // `try_lock_lane`): without it, one look says no lane is in use.
        if !lockfile::exists(self.locks(), &lane_key(sha256, size, 0)) {
            return Vec::new();
        }
        (0..LANES)
            .filter_map(|lane| self.lane_in_use(sha256, size, lane))
            .collect()
    }

    /// [`Store::lanes_in_use`], from `listing` (see [`Store::listing`]).
    pub(crate) fn lanes_in_use_listed(
        &self,
        listing: &Listing,
        sha256: &str,
        size: u64,
    ) -> Vec<LaneInUse> {
        let lanes = match &listing.locked {
            Some(locked) => locked
                .get(&(sha256.to_string(), size))
                .cloned()
                .unwrap_or_default(),
            None => (0..LANES).collect(),
        };
        lanes
            .into_iter()
            .filter_map(|lane| self.lane_in_use(sha256, size, lane))
            .collect()
    }

    /// One listing of `locks/` and `tmp/`, for
    /// [`Store::lanes_in_use_listed`] and [`Store::kept_bytes_listed`] on
    /// many files. What changes after it is seen by the next one.
    pub(crate) fn listing(&self) -> Listing {
        let mut listing = self.lock_listing();
        self.list_partials(&mut listing);
        listing
    }

    /// Adds the partial files of `tmp/` to `listing`.
    fn list_partials(&self, listing: &mut Listing) {
        for entry in partial_files(&self.folders.tmp) {
            listing
                .partials
                .entry(entry.sha256.clone())
                .or_default()
                .push(entry);
        }
    }

    /// The lanes that may be held, by file, in order: those whose lock
    /// file exists, read from one listing of `locks/` rather than a lookup
    /// per lane.
    fn lock_listing(&self) -> Listing {
        let names = self.locks().names().ok();
        let locked = names.map(|names| {
            let mut locked = std::collections::BTreeMap::<(String, u64), Vec<u32>>::new();
            for (sha, size, lane) in names
                .iter()
                .filter_map(|name| partial::parse_key(name.strip_suffix(".lock")?))
            {
                locked
                    .entry((sha.to_string(), size))
                    .or_default()
                    .push(lane);
            }
            for lanes in locked.values_mut() {
                lanes.sort_unstable();
            }
            locked
        });
        Listing {
            locked,
            ..Listing::default()
        }
    }

    fn lane_in_use(&self, sha256: &str, size: u64, lane: u32) -> Option<LaneInUse> {
        let key = lane_key(sha256, size, lane);
        if !is_sha256(sha256) {
            return None;
        }
        let holder = lockfile::holder_of(self.locks(), &key, lanes::MAX_HOLDER_BYTES)?
            .and_then(|bytes| Holder::parse(&bytes));
        let held = self.partial(sha256, size, lane).held();
        Some(LaneInUse { holder, held })
    }

    /// `locks/`, held open.
    fn locks(&self) -> &Arc<Folder> {
        &self.folders.locks
    }

    /// Prepares the partial file of `lane` of a download of `size` bytes
    /// for `sha256`: checks that the file system has room for what is still
    /// missing on top of what other downloads in progress count (see
    /// [`lanes::counted`]; `grace` is how long a new download counts its
    /// whole size). Partial files of other sizes and other lanes are left
    /// alone: they belong to other declarations and downloads. Touches no
    /// network.
    ///
    /// The caller holds the lane ([`Store::try_lock_lane`]).
    pub(crate) fn prepare(
        &self,
        resource: &str,
        sha256: &str,
        size: u64,
        lane: u32,
        grace: std::time::Duration,
    ) -> Result<PartialPaths> {
        let listed: Vec<PartialEntry> = partial_files(&self.folders.tmp).collect();
        self.prepare_listed(&listed, resource, sha256, size, lane, grace)
    }

    /// [`Store::prepare`], with the partial files `listed` in `tmp/`.
    fn prepare_listed(
        &self,
        listed: &[PartialEntry],
        resource: &str,
        sha256: &str,
        size: u64,
        lane: u32,
        grace: std::time::Duration,
    ) -> Result<PartialPaths> {
        check_sha256(sha256)?;
        let _serial = self.space.lock().unwrap_or_else(|p| p.into_inner());
        let paths = self.partial(sha256, size, lane);
        // A partial file the store did not make (a symbolic link, another
        // user's file) is dropped, never written through or published.
        // With no data file (a new download), nothing is kept and nothing
        // is reclaimed: known from this one look, without opening records
        // that do not exist.
        let (kept, reclaimed) = match paths.data_entry() {
            DataEntry::Missing => {
                // A new download: no record of it until one is written.
                paths.set_recorded(false);
                (0, 0)
            }
            DataEntry::Untrusted => {
                paths.remove();
                (0, 0)
            }
            DataEntry::Own => {
                let kept = paths.kept().map_or(0, |(_, n)| n);
                // What the file holds beyond its trusted prefix is cut
                // before the download writes: that space comes back.
                (kept, paths.untrusted_tail(kept))
            }
        };
        let needed = size - kept.min(size);
        let available = available_space_at(&self.folders.tmp)?.saturating_add(reclaimed);
        let own = lane_key(sha256, size, lane);
        // Each download in progress counts at most its declared size, which
        // its partial file's name tells: when even that much fits, whose
        // lanes are held and how fast they go need not be read.
        let at_most = listed
            .iter()
            .filter(|e| e.key() != own)
            .fold(0u64, |sum, e| sum.saturating_add(e.size));
        let reservations = if available >= needed.saturating_add(at_most) {
            Reservations::default()
        } else {
            self.reservations(&own, grace)
        };
        let reserved = reservations.total;
        if available < needed.saturating_add(reserved) {
            // A reservation stands in the way only when the file alone fits.
            let held_by = (needed <= available)
                .then_some(reservations.largest)
                .flatten();
            return Err(Error::DiskSpace {
                resource: resource.to_string(),
                needed,
                available,
                reserved,
                held_by,
                store: self.root.clone(),
            });
        }
        // The data file exists from now on, so other processes count the
        // bytes this download will still write against their free space.
        paths
            .open_data()
            .map_err(|e| write_failed("cannot create temporary file", &paths.data, e, needed))?;
        Ok(paths)
    }

    /// Bytes kept for a resumable download of `sha256` (flushed, with a
    /// validator), if any: the durable bytes its record claims, the prefix
    /// and every range summed, never the partial file's length.
    pub fn partial_len(&self, sha256: &str) -> Option<u64> {
        self.kept_bytes(sha256, None)
    }

    /// [`Store::partial_len`] of the partial files of `sha256` declared
    /// with `size` (every size when `None`), the most any lane keeps.
    pub(crate) fn kept_bytes(&self, sha256: &str, size: Option<u64>) -> Option<u64> {
        let mut listing = Listing::default();
        self.list_partials(&mut listing);
        self.kept_bytes_listed(&listing, sha256, size)
    }

    /// [`Store::kept_bytes`], from the partial files `listing` saw.
    pub(crate) fn kept_bytes_listed(
        &self,
        listing: &Listing,
        sha256: &str,
        size: Option<u64>,
    ) -> Option<u64> {
        let tmp = &self.folders.tmp;
        listing
            .partials
            .get(sha256)?
            .iter()
            .filter(|e| size.is_none_or(|s| s == e.size))
            .filter_map(|e| e.paths(tmp).kept())
            .map(|(_, n)| n)
            .max()
    }

    /// Removes the partial files of `sha256` that no process is
    /// downloading now; returns how many. A lane another process holds is
    /// left to it: that download ends by removing its bytes itself when no
    /// installed gem declares them any more.
    pub fn remove_partials(&self, sha256: &str) -> usize {
        self.remove_partials_of(&std::collections::BTreeSet::from([sha256.to_string()]))
    }

    /// [`Store::remove_partials`] for every SHA-256 of `doomed`, with one
    /// listing of the partial files' folder.
    pub(crate) fn remove_partials_of(&self, doomed: &std::collections::BTreeSet<String>) -> usize {
        let tmp = &self.folders.tmp;
        let mut removed = 0;
        for entry in partial_files(tmp) {
            if !doomed.contains(&entry.sha256) {
                continue;
            }
            if let Ok(Some(_held)) = lockfile::try_lock_key(self.locks(), &entry.key()) {
                entry.paths(tmp).remove();
                removed += 1;
            }
        }
        removed
    }

    /// Removes partial files whose SHA-256 is not in `keep` and that no
    /// process is downloading; returns how many.
    pub fn prune_partials(&self, keep: &std::collections::BTreeSet<String>) -> usize {
        let tmp = &self.folders.tmp;
        let mut removed = 0;
        for entry in partial_files(tmp) {
            if keep.contains(&entry.sha256) {
                continue;
            }
            if let Ok(Some(_held)) = lockfile::try_lock_key(self.locks(), &entry.key()) {
                entry.paths(tmp).remove();
                removed += 1;
            }
        }
        removed
    }

    /// Bytes that downloads in progress (in any process) count against
    /// the free space of a new one: for every partial file whose lane is
    /// held, what it still has to write, or, once its download is older
    /// than [`lanes::DEFAULT_WAIT_FOR_OTHERS`], what its rate would write
    /// within [`lanes::RESERVATION_HORIZON`] (see `lanes::counted`).
    /// Leftovers of a crashed download hold no lock and do not count.
    pub fn reserved_bytes(&self) -> u64 {
        self.reservations("", lanes::DEFAULT_WAIT_FOR_OTHERS).total
    }

    fn reservations(&self, own: &str, grace: std::time::Duration) -> Reservations {
        let mut out = Reservations::default();
        let mut largest = 0;
        for entry in partial_files(&self.folders.tmp) {
            if entry.key() == own {
                continue;
            }
            let Some(used) = self.lane_in_use(&entry.sha256, entry.size, entry.lane) else {
                continue;
            };
            let remaining = entry.size.saturating_sub(used.held);
            let counted = lanes::counted(remaining, used.held, used.holder.as_ref(), grace);
            out.total = out.total.saturating_add(counted);
            if counted > largest {
                largest = counted;
                out.largest = used.holder.and_then(|h| h.gem);
            }
        }
        out
    }

    /// The bytes another process downloading `sha256` holds so far, when
    /// one holds its lock: the durable bytes of its partial file's record
    /// (the prefix and every range the parts wrote), or, before it has one
    /// (or from a server whose bytes cannot be resumed), what the file
    /// occupies on disk; never the file's length, which a download in
    /// parts sets by its furthest write.
    pub fn downloading_elsewhere(&self, sha256: &str) -> Option<u64> {
        let mut sizes: Vec<u64> = partial_files(&self.folders.tmp)
            .filter(|e| e.sha256 == sha256)
            .map(|e| e.size)
            .collect();
        sizes.dedup();
        sizes
            .into_iter()
            .flat_map(|size| self.lanes_in_use(sha256, size))
            .map(|lane| lane.held)
            .max()
    }

    /// Removes what no download can use any more, among the files of
    /// `tmp/` no process holds the lock of: leftovers that cannot be resumed
    /// (no record, nothing flushed, a temporary copy) and partial files
    /// untouched for longer than `max_age`; and the lock files earlier
    /// versions left in `locks/` (one per SHA-256, or the shared
    /// `downloads.lock`: the locks are now one per file and lane). Returns
    /// how many were removed.
    pub fn clean_tmp(&self, max_age: std::time::Duration) -> Result<usize> {
        let mut removed = 0;
        let tmp = &self.folders.tmp;
        let names = tmp
            .names()
            .map_err(|e| Error::io("cannot list", tmp.path(), e))?;
        for name in names {
            if self.in_use(&name) {
                continue;
            }
            let resumable = match partial::parse_lane_name(&name) {
                Some((sha, size, lane)) => self.partial(sha, size, lane).kept().is_some(),
                None => name
                    .strip_suffix(".json")
                    .and_then(partial::parse_lane_name)
                    .is_some_and(|_| tmp.is_own_file(name.trim_end_matches(".json"))),
            };
            let keep = resumable && !partial::older_than(tmp, &name, max_age);
            if !keep && tmp.remove_file(&name).is_ok() {
                removed += 1;
            }
        }
        Ok(removed + self.prune_locks())
    }

    /// Removes from `locks/` what nothing takes any more, and returns how
    /// many: the lock files of earlier versions, descriptions a download
    /// that was killed left, and the lane lock files (kept for the next
    /// download of their file) of files the store does not hold, when
    /// nobody holds them. One listing of `blobs/` and one of `locks/`.
    pub(crate) fn prune_locks(&self) -> usize {
        let mut removed = 0;
        let stored: std::collections::BTreeSet<String> =
            self.blobs().unwrap_or_default().into_iter().collect();
        let locks = self.locks();
        let mut lane_zero = Vec::new();
        for name in locks.names().unwrap_or_default() {
            // The lock file per SHA-256 and the shared lock file of earlier
            // versions: nothing takes them any more.
            let legacy =
                name == "downloads.lock" || name.strip_suffix(".lock").is_some_and(is_sha256);
            if legacy && locks.remove_file(&name).is_ok() {
                removed += 1;
                continue;
            }
            if let Some(key) = name.strip_suffix(".lock.json") {
                // What a download that ended without letting go (killed)
                // said about itself.
                let key = partial::parse_key(key).map(|_| key);
                if key.is_some_and(|k| !lockfile::is_held(locks, k))
                    && locks.remove_file(&name).is_ok()
                {
                    removed += 1;
                }
                continue;
            }
            let lane = name
                .strip_suffix(".lock")
                .and_then(|key| Some((key, partial::parse_key(key)?)));
            if let Some((key, (sha, size, lane))) = lane {
                if stored.contains(sha) {
                    continue;
                }
                if lane == 0 {
                    lane_zero.push((key.to_string(), sha.to_string(), size));
                } else if lockfile::remove_key(locks, key) {
                    removed += 1;
                }
            }
        }
        // Lane 0's lock file goes last, and only with no other lane's left:
        // a look for downloads in progress starts at it (see
        // `try_lock_lane`, which makes it again after a removal here).
        for (key, sha, size) in lane_zero {
            let others = || (1..LANES).any(|l| lockfile::exists(locks, &lane_key(&sha, size, l)));
            if others() || !lockfile::remove_key(locks, &key) {
                continue;
            }
            // Another lane taken while it went: made again.
            if others() {
                let _ = lockfile::make(locks, &key);
            } else {
                removed += 1;
            }
        }
        removed
    }

    /// Whether the file `name` of `tmp/` belongs to a download in progress:
    /// a lane's partial file, record or record being written while its lane
    /// is held, or anything else named after a SHA-256 (a copy being made)
    /// while a download of that SHA-256 is in progress.
    fn in_use(&self, name: &str) -> bool {
        let lane = name
            .find(".partial")
            .and_then(|at| partial::parse_key(&name[..at]));
        if let Some((sha, size, lane)) = lane {
            return lockfile::is_held(self.locks(), &lane_key(sha, size, lane));
        }
        let sha = name.split('.').next().unwrap_or_default();
        is_sha256(sha) && matches!(self.try_lock(sha), Ok(None))
    }
}

/// What the downloads in progress count against free space.
#[derive(Debug, Default)]
struct Reservations {
    /// Their sum.
    total: u64,
    /// The gem whose download counts the most (`None`: that one is a
    /// download by hand, or nothing counts).
    largest: Option<String>,
}

/// What [`Store::find_present`] found, in `blobs/<sha256>` (held open).
enum Found {
    /// The file under the name asked for.
    Here(Folder, String),
    /// Only under another name.
    Elsewhere(Folder, String),
    /// In this file (under the name asked for or another), whose stamp
    /// changed since it was verified.
    Changed(Folder, String),
    Nothing,
}

/// The names of the regular files of the store's user in `dir`, sorted;
/// symbolic links and anything else are left out.
fn own_files(dir: &Folder) -> Vec<String> {
    let mut files: Vec<String> = dir
        .names()
        .unwrap_or_default()
        .into_iter()
        // The entry's own type and owner: a symbolic link is not followed.
        .filter(|name| dir.is_own_file(name))
        .collect();
    files.sort();
    files
}

/// Every partial data file in `tmp` (of every lane).
fn partial_files(tmp: &Folder) -> impl Iterator<Item = PartialEntry> {
    tmp.names()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|name| {
            let (sha, size, lane) = partial::parse_lane_name(&name)?;
            is_sha256(sha).then(|| PartialEntry {
                sha256: sha.to_string(),
                size,
                lane,
            })
        })
}

/// Creates (when missing) the folder `name` in `parent`, opens it as a
/// handle without following a symbolic link, and checks it through the
/// handle ([`check_held`]).
fn open_sub(parent: &Folder, name: &str) -> Result<Folder> {
    let path = parent.join(name);
    if parent.entry(name).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(Error::Config(format!(
            "store folder {} is a symbolic link: the store opens its folders without following links; make it a folder, or point `store` in config.toml (or --store) at the real location",
            path.display()
        )));
    }
    parent
        .create_sub(name)
        .map_err(|e| Error::io("cannot create store folder", &path, e))?;
    let folder = parent
        .open_sub(name)
        .map_err(|e| Error::io("cannot open store folder", &path, e))?;
    check_held(&folder)?;
    Ok(folder)
}

/// Refuses a store folder, read through its handle, that another user
/// owns or can write (see [`trust::check_folder_meta`]).
fn check_held(folder: &Folder) -> Result<()> {
    let meta = folder
        .metadata()
        .map_err(|e| Error::io("cannot read store folder", folder.path(), e))?;
    trust::check_folder_meta(folder.path(), &meta)
}

/// The SHA-256 and declared size a partial file's name carries
/// (`<sha256>.<size>.…partial`); `None` for any other name. An entry point for
/// the fuzz targets and property tests.
#[doc(hidden)]
pub fn parse_partial_name(name: &str) -> Option<(String, u64)> {
    let (sha, size) = partial::parse_name(name)?;
    is_sha256(sha).then(|| (sha.to_string(), size))
}

/// Runs blocking file work on `path` (creating files, fsyncs, renames) on
/// the runtime's blocking threads, so that a slow file system never holds
/// up the transfers running on its workers.
pub(crate) async fn off_runtime<T: Send + 'static>(
    path: &Path,
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::io("the file work stopped:", path, io::Error::other(e)))?
}

/// Refuses anything but a SHA-256 where one names a file: a record read back
/// from disk (or built in memory) must never steer a path out of the store.
fn check_sha256(sha256: &str) -> Result<()> {
    if is_sha256(sha256) {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{sha256:?} is not a SHA-256 (64 lowercase hex digits)"
        )))
    }
}

/// Whether `text` is 64 lowercase hex digits.
pub fn is_sha256(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_look_that_found_the_store_writable_stands_for_a_moment_and_a_refusal_never() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert!(!store.known_writable(), "nothing was looked at yet");
        store.check_writable("r (r.bin)").unwrap();
        assert!(store.known_writable());
        // Another handle on the same store shares the look.
        assert!(store.clone().known_writable());
        // Once the moment has passed, the next download looks again.
        *store.writable_at() = Some(std::time::Instant::now() - WRITABLE_FOR);
        assert!(!store.known_writable());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let tmp = store.root().join("tmp");
            fs::set_permissions(&tmp, fs::Permissions::from_mode(0o500)).unwrap();
            // Root may write anyway: then the look finds the store writable.
            let refused = store.check_writable("r (r.bin)");
            fs::set_permissions(&tmp, fs::Permissions::from_mode(0o700)).unwrap();
            if let Err(e) = refused {
                assert!(e.to_string().contains("the store is read-only"), "{e}");
                assert!(
                    !store.known_writable(),
                    "a refusal is not remembered as writable"
                );
            }
        }
    }

    #[test]
    fn the_untrusted_tail_of_a_kept_partial_file_counts_as_free_space() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let sha = "d".repeat(64);
        let size = 4u64 << 20;
        let paths = store.partial(&sha, size, 0);
        // 3 MiB on disk, of which only the first 1 MiB was flushed and
        // recorded: 3 MiB are still to be written, 2 MiB of them in the
        // space the tail takes now.
        fs::write(&paths.data, vec![7u8; 3 << 20]).unwrap();
        let record = serde_json::json!({
            "address": "https://cdn.test/a",
            "validator": "\"v1\"",
            "durable": 1 << 20,
        });
        fs::write(&paths.meta, record.to_string()).unwrap();
        space::FREE.set(Some((1 << 20) + 4096));
        let prepared = store.prepare("r", &sha, size, 0, Duration::ZERO);
        space::FREE.set(None);
        assert!(prepared.is_ok(), "{:?}", prepared.err());
        // Without the tail, 1 MiB free is short of the 3 MiB needed.
        space::FREE.set(Some(1 << 20));
        fs::write(&paths.data, vec![7u8; 1 << 20]).unwrap();
        let refused = store
            .prepare("r", &sha, size, 0, Duration::ZERO)
            .unwrap_err();
        space::FREE.set(None);
        assert_eq!(refused.code(), "E_RESOURCE_DISK_SPACE");
        assert!(
            refused
                .to_string()
                .contains("needs 3.0 MiB but only 1.0 MiB are free"),
            "{refused}"
        );
    }

    #[test]
    fn only_the_file_that_was_written_is_published() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let sha = "d".repeat(64);
        let body = vec![7u8; 4096];
        let paths = store
            .prepare("r", &sha, body.len() as u64, 0, Duration::ZERO)
            .unwrap();
        {
            use std::io::Write;
            let mut file = paths.open_data().unwrap();
            file.write_all(&body).unwrap();
        }
        // Another file of the store's user put over the partial file's name
        // after the writer had written (and hashed) its own.
        let planted = dir.path().join("planted");
        fs::write(&planted, b"another file's bytes").unwrap();
        fs::rename(&planted, &paths.data).unwrap();
        let refused = store
            .publish(&paths, &sha, "model.bin", "https://origin.test/model.bin")
            .unwrap_err();
        assert!(
            refused.to_string().contains("not the one that was written"),
            "{refused}"
        );
        assert!(!store.blob_path(&sha, "model.bin").exists());
    }

    /// Every entry under `dir` (not following links): its path, and its
    /// bytes, or what else it is.
    fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        let mut out = Vec::new();
        for entry in fs::read_dir(dir).unwrap().map(|e| e.unwrap()) {
            let (path, kind) = (entry.path(), entry.file_type().unwrap());
            if kind.is_dir() {
                out.push((path.clone(), b"folder".to_vec()));
                out.extend(tree(&path));
            } else if kind.is_file() {
                out.push((path.clone(), fs::read(&path).unwrap()));
            } else {
                out.push((path, b"other".to_vec()));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn a_store_folder_replaced_while_open_is_never_written_nor_published_from() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("store");
        let store = Store::open(&at).unwrap();
        let sha = "9".repeat(64);
        let body = vec![3u8; 4096];
        let size = body.len() as u64;
        let lane = store.try_lock_lane(&sha, size, 0).unwrap().unwrap();
        lane.describe(&Holder::new(Some("g"), &[], 0));
        let paths = written(&store, &sha, &body);
        // The store's folder renamed away while it is open, and another
        // tree at its path, with files at the names the store uses.
        let moved = dir.path().join("moved");
        let renamed = fs::rename(&at, &moved);
        if renamed.is_err() && crate::platform::HELD_FOLDERS_STAY {
            // The folders the store holds cannot be moved at all here.
            return;
        }
        renamed.unwrap();
        Store::open(&at).unwrap();
        let key = lane_key(&sha, size, 0);
        let other = at.join(LAYOUT);
        fs::write(other.join(format!("tmp/{key}.partial")), b"not the bytes").unwrap();
        fs::write(other.join(format!("tmp/{key}.partial.json")), b"{}").unwrap();
        fs::write(other.join(format!("locks/{key}.lock")), b"").unwrap();
        fs::write(other.join(format!("locks/{key}.lock.json")), b"{}").unwrap();
        let before = tree(&at);

        let mut checkpoints =
            partial::Checkpointer::new(&paths, "https://cdn.test/a", Some("\"v\"".into()));
        checkpoints.record(size).unwrap();
        assert!(paths.kept().is_some(), "the record is beside the data file");
        let published = store.publish(&paths, &sha, "model.bin", "https://origin.test/model.bin");
        lane.describe(&Holder::new(Some("g"), &[], size));
        drop(lane);

        // Published in the folder the store opened, from the very file
        // that was written; the record went from there too, and the lock
        // file stays there for the next taker.
        let kept = moved.join(LAYOUT);
        assert_eq!(
            fs::read(kept.join("blobs").join(&sha).join("model.bin")).unwrap(),
            body
        );
        assert!(!kept.join(format!("tmp/{key}.partial")).exists());
        assert!(!kept.join(format!("tmp/{key}.partial.json")).exists());
        assert!(kept.join(format!("locks/{key}.lock")).exists());
        // Its path now leads into the other tree: never handed out.
        let refused = published.unwrap_err();
        assert!(
            refused.to_string().contains("was moved or replaced"),
            "{refused}"
        );
        // The other tree is as it was: nothing written, renamed or removed.
        assert_eq!(tree(&at), before);
    }

    /// The partial file of lane 0 of `sha`, prepared and holding `body`.
    fn written(store: &Store, sha: &str, body: &[u8]) -> PartialPaths {
        use std::io::Write;
        let size = body.len() as u64;
        let paths = store.prepare("r", sha, size, 0, Duration::ZERO).unwrap();
        paths.open_data().unwrap().write_all(body).unwrap();
        paths
    }

    #[test]
    fn a_verified_file_is_never_handed_out_at_a_path_into_a_tree_put_in_the_stores_place() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("store");
        let store = Store::open(&at).unwrap();
        let sha = "8".repeat(64);
        let body = vec![4u8; 4096];
        let paths = written(&store, &sha, &body);
        let path = store
            .publish(&paths, &sha, "model.bin", "https://origin.test/model.bin")
            .unwrap();
        assert_eq!(store.find(&sha, "model.bin").unwrap(), Some(path.clone()));
        // The store's folder renamed away, and another tree at its path
        // holding other bytes at the verified file's path.
        let renamed = fs::rename(&at, dir.path().join("moved"));
        if renamed.is_err() && crate::platform::HELD_FOLDERS_STAY {
            // The folders the store holds cannot be moved at all here.
            return;
        }
        renamed.unwrap();
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, b"other bytes").unwrap();
        for name in ["model.bin", "other-name.bin"] {
            let refused = store.find(&sha, name).unwrap_err();
            assert!(
                refused.to_string().contains("was moved or replaced"),
                "{refused}"
            );
        }
        assert_eq!(fs::read(&path).unwrap(), b"other bytes");
        assert!(!path.with_file_name("other-name.bin").exists());
        assert!(store.has(&sha), "the verified file is kept where it was");
    }

    #[test]
    fn a_publish_records_the_stamp_and_the_source_in_one_record_before_the_name() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let registry = crate::registry::Registry::new(&store);
        let sha = "9".repeat(64);
        let body = vec![5u8; 1000];
        let paths = written(&store, &sha, &body);
        let url = "https://origin.test/model.bin";
        store.publish(&paths, &sha, "model.bin", url).unwrap();
        // The stamp taken before the rename is the published file's.
        let blob = store.folders.blobs.open_sub(&sha).unwrap();
        let verdict = stamps::check(store.stamps(), &sha, &blob, "model.bin");
        assert_eq!(verdict, stamps::Verdict::Holds);
        assert_eq!(registry.served_by(&sha).as_deref(), Some(url));
        // One record: nothing in `served/`.
        let served = dir
            .path()
            .join("store-v1/served")
            .join(format!("{sha}.json"));
        assert!(!served.exists());
        // Forgetting the source keeps the stamp (a lost stamp would trust
        // the file as found).
        registry.forget_served_by(&sha);
        assert_eq!(registry.served_by(&sha), None);
        let verdict = stamps::check(store.stamps(), &sha, &blob, "model.bin");
        assert_eq!(verdict, stamps::Verdict::Holds);
        // What an earlier version recorded in `served/` is still read.
        let old = "a".repeat(64);
        fs::create_dir_all(served.parent().unwrap()).unwrap();
        fs::write(
            served.with_file_name(format!("{old}.json")),
            br#"{"served_by":"https://old.test/x","at":"2026-11-01T00:00:00Z"}"#,
        )
        .unwrap();
        assert_eq!(
            registry.served_by(&old).as_deref(),
            Some("https://old.test/x")
        );
    }

    #[test]
    fn a_store_deeper_than_max_path_downloads_publishes_and_removes() {
        // Windows limits plain paths to 260 characters (MAX_PATH): every
        // call of the store, its own Windows calls included, must work
        // deeper than that without the system's long-path setting.
        let dir = tempfile::tempdir().unwrap();
        let mut deep = dir.path().to_path_buf();
        for i in 0..10 {
            deep.push(format!("{i}-{}", "long-folder-name".repeat(2)));
        }
        assert!(deep.as_os_str().len() > 300);
        let store = Store::open(&deep).unwrap();
        let sha = "e".repeat(64);
        let body = vec![5u8; 4096];
        let paths = store
            .prepare("r", &sha, body.len() as u64, 0, Duration::ZERO)
            .unwrap();
        fs::write(&paths.data, &body).unwrap();
        let path = store
            .publish(&paths, &sha, "model.bin", "https://origin.test/model.bin")
            .unwrap();
        assert!(path.as_os_str().len() > 400);
        assert_eq!(fs::read(&path).unwrap(), body);
        assert_eq!(store.find(&sha, "model.bin").unwrap(), Some(path.clone()));
        assert!(store.has(&sha));
        store.remove(&sha).unwrap();
        assert!(!path.exists());
        assert!(!store.has(&sha));
    }

    #[test]
    fn lock_files_of_earlier_versions_are_removed_and_held_locks_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let locks = store.root().join("locks");
        let legacy = locks.join(format!("{}.lock", "b".repeat(64)));
        fs::write(&legacy, b"").unwrap();
        fs::write(locks.join("downloads.lock"), b"").unwrap();
        let sha = "c".repeat(64);
        let held = store.try_lock_lane(&sha, 10, 0).unwrap();
        let Some(lane) = &held else {
            panic!("the lane is free")
        };
        lane.describe(&Holder::new(Some("g"), &[], 0));
        // A killed download's description, its lock long released.
        let stale = locks.join(format!("{sha}.11.lock.json"));
        fs::write(&stale, b"{}").unwrap();
        fs::write(locks.join("registry.lock"), b"").unwrap();
        let removed = store.clean_tmp(std::time::Duration::from_secs(60)).unwrap();
        assert_eq!(removed, 3);
        assert!(!legacy.exists());
        assert!(!stale.exists());
        assert!(locks.join(format!("{sha}.10.lock")).exists());
        let description = lockfile::holder_of(store.locks(), &lane_key(&sha, 10, 0), 1000);
        assert!(matches!(description, Some(Some(_))), "{description:?}");
        assert!(locks.join("registry.lock").exists());
        // The download lock still holds after the cleanup, and keeps every
        // download of its SHA-256 from being touched.
        assert!(store.try_lock_lane(&sha, 10, 0).unwrap().is_none());
        assert!(store.try_lock(&sha).unwrap().is_none());
        drop(held);
        assert!(store.try_lock(&sha).unwrap().is_some());
        // Released, a lane's lock file stays for the next download of its
        // file. A cleanup removes it once its file is not stored and
        // nobody holds it (where held lock files may be removed), and
        // keeps the lock file of a stored file.
        let lock = locks.join(format!("{sha}.10.lock"));
        assert!(lock.exists());
        let kept = "e".repeat(64);
        drop(store.try_lock_lane(&kept, 3, 0).unwrap());
        fs::create_dir(store.root().join("blobs").join(&kept)).unwrap();
        fs::write(store.root().join("blobs").join(&kept).join("x.bin"), b"abc").unwrap();
        assert!(store.has(&kept));
        store.clean_tmp(std::time::Duration::from_secs(60)).unwrap();
        assert_eq!(lock.exists(), !crate::platform::REMOVE_HELD_LOCKS);
        assert!(locks.join(format!("{kept}.3.lock")).exists());
        // Lane 0's lock file, nobody holding it, stays while another lane
        // of its file is held: a look for downloads in progress starts at
        // it, and finds that lane.
        let busy = "d".repeat(64);
        let other = store.try_lock_lane(&busy, 7, 2).unwrap().unwrap();
        store.clean_tmp(std::time::Duration::from_secs(60)).unwrap();
        assert!(locks.join(format!("{busy}.7.lock")).exists());
        assert_eq!(store.lanes_in_use(&busy, 7).len(), 1);
        drop(other);
        store.clean_tmp(std::time::Duration::from_secs(60)).unwrap();
        assert_eq!(
            locks.join(format!("{busy}.7.lock")).exists(),
            !crate::platform::REMOVE_HELD_LOCKS
        );
    }

    #[test]
    fn a_download_leaves_its_lock_file_and_another_lane_implies_lane_0s() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let sha = "f".repeat(64);
        assert!(store.lanes_in_use(&sha, 5).is_empty());
        let other = store.try_lock_lane(&sha, 5, 3).unwrap().unwrap();
        // Lane 0's lock file was made with lane 3's: the look for the
        // downloads in progress, which starts at it, finds lane 3.
        let in_use = store.lanes_in_use(&sha, 5);
        assert_eq!(in_use.len(), 1);
        drop(other);
        assert!(store.lanes_in_use(&sha, 5).is_empty());
        let key = lane_key(&sha, 5, 0);
        assert!(lockfile::exists(store.locks(), &key));
        assert!(lockfile::exists(store.locks(), &lane_key(&sha, 5, 3)));
    }

    #[test]
    fn another_size_or_lane_of_a_hash_keeps_its_partial_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let sha = "f".repeat(64);
        let theirs = store.partial(&sha, 5000, 0);
        fs::write(&theirs.data, vec![1u8; 3000]).unwrap();
        let record = serde_json::json!({
            "address": "https://cdn.test/a",
            "validator": "\"v1\"",
            "durable": 3000,
        });
        fs::write(&theirs.meta, record.to_string()).unwrap();
        let _other_size = store.prepare("r", &sha, 4000, 0, Duration::ZERO).unwrap();
        let _other_lane = store.prepare("r", &sha, 5000, 2, Duration::ZERO).unwrap();
        assert_eq!(theirs.kept().map(|(_, n)| n), Some(3000));
        assert_eq!(store.kept_bytes(&sha, Some(5000)), Some(3000));
        assert_eq!(store.kept_bytes(&sha, Some(4000)), None);
    }

    #[test]
    fn a_dripping_download_stops_reserving_its_size_and_a_reservation_names_its_gem() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let hog = "a".repeat(64);
        let huge = 1u64 << 40;
        let lane = store.try_lock_lane(&hog, huge, 0).unwrap().unwrap();
        let mut holder = Holder::new(Some("hog"), &[], 0);
        lane.describe(&holder);
        space::FREE.set(Some(huge + (1 << 30)));
        store
            .prepare("huge", &hog, huge, 0, Duration::ZERO)
            .unwrap();
        space::FREE.set(Some(1 << 30));
        // Young: the whole declared size is reserved, and named.
        let refused = store
            .prepare(
                "small",
                &"b".repeat(64),
                1 << 20,
                0,
                Duration::from_secs(30),
            )
            .unwrap_err();
        assert_eq!(refused.code(), "E_RESOURCE_DISK_SPACE");
        assert!(
            refused.to_string().contains("reserved by gem \"hog\""),
            "{refused}"
        );
        // A minute old with nothing delivered: nothing reserved.
        holder.since_ms -= 60_000;
        lane.describe(&holder);
        let prepared = store.prepare(
            "small",
            &"b".repeat(64),
            1 << 20,
            0,
            Duration::from_secs(30),
        );
        // Too big on its own: no gem stands in the way.
        let alone = store.prepare("big", &"c".repeat(64), 2 << 30, 0, Duration::from_secs(30));
        space::FREE.set(None);
        assert!(prepared.is_ok(), "{:?}", prepared.err());
        let alone = alone.unwrap_err();
        assert!(!alone.to_string().contains("hog"), "{alone}");
    }
}
