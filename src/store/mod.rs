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
mod downloads;
pub(crate) mod folder;
mod lookup;
mod publish;
mod shared_failure;
mod space;
mod stamps;
mod steps;
pub(crate) mod trust;

pub use publish::{GROUP_BYTES, GROUP_FILES, GROUP_IDLE};
pub use shared_failure::{parse_shared_failure, SharedFailure};
use space::available_space_at;
pub(crate) use space::{partial_write_failed, write_failed};
pub(crate) use steps::quick_step;

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
    pub(crate) registry_turns: Arc<lockfile::Turns>,
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
/// up the transfers running on its workers. A short step without a flush
/// takes [`quick_step`] instead.
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
mod tests;
