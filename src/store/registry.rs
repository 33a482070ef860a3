//! What each installed gem declares, and the last failure of each resource.
//!
//! Both live in the store (`gems/<gem id>.json`, `failures/<gem id>.jsonl`)
//! and are changed only under a cross-process lock (`locks/registry.lock`),
//! so several processes can share one store. A registration is written
//! atomically (temporary file, fsync, rename, fsync folder), so a crash never
//! leaves a half-written one.
//!
//! Failure records are a log: one JSON line per change (a resource's new
//! record, or `null` when it downloaded), appended (not fsynced: they only
//! explain why a file is missing), the last line of a resource winning. Recording the failure of one resource of thousands
//! therefore costs one short append, not a rewrite of every record. The log
//! is rewritten compacted (atomically) once it holds more than twice the
//! live records, and kept parsed in memory while its file is unchanged. A
//! line cut short by a crash is skipped.
//!
//! Parsed registrations are kept in memory and reused while their file is
//! unchanged, so checking a downloaded file against every registration costs
//! a `stat` per gem, not a parse of every declared resource. A cached copy is
//! used only when both the file's identity (device, inode, size, modification
//! and change times) and the registry's generation (`gems/.generation`, a
//! counter every change made under the lock increases) are what they were
//! when it was read; a change by any process therefore invalidates it, even
//! one that reuses an inode within the file system's timestamp granularity.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::error::{shorten_to, Error, ErrorCode, Result};
use crate::manifest::Resource;
use crate::store::atomic::Durability;
use crate::store::folder::{Folder, LazySub};
use crate::store::{Store, MAX_FAILURE_MESSAGE_CHARS};

/// A gem's registration: its validated resources, and who installed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    /// The gem's id.
    pub gem: String,
    /// The gem's `name` from its manifest, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its resources, as validated at install.
    pub resources: Vec<Resource>,
    /// Who keeps it: who installed it first, until someone took it over
    /// (see `Resources::install_by`). `None` in records written before
    /// this was kept: such a gem is the next installer's, and is never
    /// uninstalled by a scan of `serve` until a scan has seen its manifest
    /// in its folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installed_by: Option<InstalledBy>,
}

/// Who installed a gem and keeps it, in its registration. `serve --gems
/// DIR` uninstalls only gems that it installed from `DIR` itself, and
/// leaves alone a folder whose gem someone else keeps.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum InstalledBy {
    /// A scan of `serve`'s gems folder found its manifest.
    Folder {
        /// The gems folder, as an absolute path with symbolic links resolved.
        path: String,
    },
    /// A client of the local API (`install`).
    Api,
    /// The command line (`gem-resources install`).
    Cli,
    /// A program using the library directly ([`crate::Resources::install`]).
    Library,
}

impl InstalledBy {
    /// The gems folder `path` as a scan of it records it: absolute, with
    /// symbolic links resolved where the folder exists, so two spellings
    /// of one folder are one owner.
    pub fn folder(path: &std::path::Path) -> InstalledBy {
        let path = std::fs::canonicalize(path)
            .or_else(|_| std::path::absolute(path))
            .unwrap_or_else(|_| path.to_path_buf());
        InstalledBy::Folder {
            path: path.to_string_lossy().into_owned(),
        }
    }

    /// Says who, for people: `serve's gems folder /srv/gems`, `the local
    /// API`, `the command line`, `a program using the library`.
    pub fn describe(&self) -> String {
        match self {
            InstalledBy::Folder { path } => format!("serve's gems folder {path}"),
            InstalledBy::Api => "the local API".to_string(),
            InstalledBy::Cli => "the command line".to_string(),
            InstalledBy::Library => "a program using the library".to_string(),
        }
    }
}

impl std::fmt::Display for InstalledBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InstalledBy::Folder { path } => write!(f, "folder {path}"),
            InstalledBy::Api => f.write_str("api"),
            InstalledBy::Cli => f.write_str("cli"),
            InstalledBy::Library => f.write_str("library"),
        }
    }
}

/// The last failure of one resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureRecord {
    /// When it failed; RFC 3339 in JSON (records written by earlier
    /// versions hold seconds since the Unix epoch, and still read).
    #[serde(with = "crate::time::rfc3339")]
    pub at: std::time::SystemTime,
    /// The error code.
    pub code: ErrorCode,
    /// The most specific code among the attempts
    /// ([`crate::Error::primary_cause`]): `E_RESOURCE_POLICY` when the
    /// network policy blocked an address, for example.
    #[serde(default = "unavailable")]
    pub primary_cause: ErrorCode,
    /// The full message.
    pub message: String,
    /// Each address with its own code and reason.
    pub attempts: Vec<AttemptRecord>,
    /// The SHA-256 the failed download was for. A record whose SHA-256 or
    /// addresses are not the resource's any more (an upgrade changed them)
    /// is stale and never shown. Empty in records of earlier versions.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sha256: String,
    /// The addresses it tried (url, then mirrors, as declared).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
}

fn unavailable() -> ErrorCode {
    ErrorCode::Unavailable
}

/// Which address served a stored file, as earlier versions recorded it
/// (`served/<sha256>.json`); now in the file's stamps record
/// (`stamps/<sha256>.json`, `served`).
type ServedRecord = crate::store::stamps::Served;

/// What [`Registry::served_by`] says of a file imported from this machine.
pub const SERVED_BY_IMPORT: &str = "import";

/// What [`Registry::served_by`] says of a file that came from the
/// `[cache]` registry.
pub const SERVED_BY_CACHE: &str = "cache";

/// The longest `served/<sha256>.json` read back.
const MAX_SERVED_BYTES: u64 = 16 << 10;

pub use crate::error::data::AttemptRecord;

/// The most attempts a failure record keeps: the url and its 16 mirrors.
const MAX_RECORDED_ATTEMPTS: usize = 17;
/// The most characters a recorded address or reason keeps.
const MAX_RECORDED_TEXT_CHARS: usize = 2048;

impl FailureRecord {
    /// Records `error` of a download of `resource` as of now. The record
    /// is bounded: at most 17 attempts, each address and reason cut to 2048
    /// characters, and the message to 16 KiB.
    pub fn new(resource: &Resource, error: &Error) -> FailureRecord {
        FailureRecord {
            sha256: resource.sha256.clone(),
            addresses: resource.addresses().map(|a| a.to_string()).collect(),
            ..FailureRecord::from_error(error)
        }
    }

    /// This record as it reads back from the store.
    fn into_stored(self) -> FailureRecord {
        serde_json::to_vec(&self)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or(self)
    }

    /// Records `error` as of now, for no resource in particular (see
    /// [`FailureRecord::new`]).
    pub fn from_error(error: &Error) -> FailureRecord {
        let attempts = match error {
            Error::Unavailable { attempts, .. } => attempts
                .iter()
                .take(MAX_RECORDED_ATTEMPTS)
                .map(|a| AttemptRecord {
                    address: shorten_to(a.address.as_str(), MAX_RECORDED_TEXT_CHARS),
                    code: a.code(),
                    reason: shorten_to(&a.error.to_string(), MAX_RECORDED_TEXT_CHARS),
                })
                .collect(),
            // Another process's download: its attempts as it recorded them.
            Error::FailedElsewhere { attempts, .. } => attempts
                .iter()
                .take(MAX_RECORDED_ATTEMPTS)
                .map(|a| AttemptRecord {
                    address: shorten_to(&a.address, MAX_RECORDED_TEXT_CHARS),
                    code: a.code,
                    reason: shorten_to(&a.reason, MAX_RECORDED_TEXT_CHARS),
                })
                .collect(),
            _ => Vec::new(),
        };
        FailureRecord {
            at: std::time::SystemTime::now(),
            code: error.code(),
            primary_cause: error.primary_cause(),
            message: shorten_to(&error.to_string(), MAX_FAILURE_MESSAGE_CHARS),
            attempts,
            sha256: String::new(),
            addresses: Vec::new(),
        }
    }

    /// Whether this record is about `resource` as declared now: the same
    /// SHA-256 and the same addresses. A record of an earlier version that
    /// named neither is taken as current.
    pub fn is_for(&self, resource: &Resource) -> bool {
        if self.sha256.is_empty() {
            return true;
        }
        self.sha256 == resource.sha256
            && self
                .addresses
                .iter()
                .map(String::as_str)
                .eq(resource.addresses().map(|a| a.as_str()))
    }
}

/// The registrations and failure records of a store.
#[derive(Debug, Clone)]
pub struct Registry {
    /// `store-v1/gems`, held open (see `store::folder`).
    gems: Arc<Folder>,
    /// `store-v1/failures`, held open.
    failures: Arc<Folder>,
    /// `store-v1/served`, opened on first use: what served a file, as
    /// earlier versions recorded it.
    served: Arc<LazySub>,
    /// `store-v1/stamps`, opened on first use: what served a file is
    /// recorded with its stamps (see `store::stamps`).
    stamps: Arc<LazySub>,
    /// `store-v1/locks`, held open: the registry lock is `registry.lock`.
    locks: Arc<Folder>,
    /// Takers of the registry lock in this process, in turn (see
    /// [`Registry::lock`]).
    in_process: Arc<tokio::sync::Mutex<()>>,
    /// Parsed registrations, shared by every clone.
    cache: Arc<Cache>,
}

/// Parsed registrations by gem id, and how many files were parsed.
#[derive(Debug, Default)]
struct Cache {
    entries: Mutex<HashMap<String, Cached>>,
    parses: AtomicU64,
    /// Parsed failure logs by gem id.
    failures: Mutex<HashMap<String, FailureLog>>,
    /// Changes of failure records that could not be written (a full
    /// disk), by gem id then resource id (`None`: cleared): this process
    /// still reports them, until a later change of the record is written.
    unsaved: Mutex<HashMap<String, BTreeMap<String, Option<FailureRecord>>>>,
    /// Makes every failure-log write fail as on a full disk (tests).
    #[cfg(test)]
    full_disk: std::sync::atomic::AtomicBool,
    /// The thread the last failure-record change ran on (tests).
    #[cfg(test)]
    worked_on: Mutex<Option<std::thread::ThreadId>>,
}

/// A gem's failure log as last read or written, and what it was read from.
#[derive(Debug, Default)]
struct FailureLog {
    /// `None` when there was no file.
    stamp: Option<crate::platform::FileStamp>,
    /// Lines in the file (live or not).
    lines: usize,
    /// Whether the file ends in the middle of a line (a crash cut it).
    torn: bool,
    /// Whether a write failed since the file was read: read it again.
    stale: bool,
    /// The live records by resource id.
    records: BTreeMap<String, FailureRecord>,
}

/// One line of a failure log.
#[derive(Debug, Serialize, Deserialize)]
struct FailureLine {
    resource: String,
    record: Option<FailureRecord>,
}

/// Compaction happens when the log holds more lines than this plus twice
/// the live records.
const LOG_SLACK: usize = 64;

/// Longest registration record read back (a manifest is at most 1 MiB;
/// its record, pretty-printed, somewhat more).
const MAX_RECORD_BYTES: u64 = 16 << 20;

/// Longest failure log read back.
const MAX_LOG_BYTES: u64 = 256 << 20;

/// One parsed registration and what it was read from.
#[derive(Debug, Clone)]
struct Cached {
    stamp: Stamp,
    reg: Arc<Registration>,
    shas: Arc<HashSet<String>>,
}

/// What identifies one version of a registration file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    generation: u64,
    file: crate::platform::FileStamp,
}

/// Held while the registry is being changed; released on drop.
#[derive(Debug)]
pub struct RegistryLock {
    /// Released first, then the turn of the next taker in this process.
    _held: crate::store::lockfile::Held,
    _turn: tokio::sync::OwnedMutexGuard<()>,
}

impl Registry {
    /// The registry of `store`.
    pub fn new(store: &Store) -> Registry {
        let folders = store.registry_folders();
        Registry {
            gems: folders.gems.clone(),
            failures: folders.failures.clone(),
            served: folders.served.clone(),
            stamps: folders.stamps.clone(),
            locks: folders.locks.clone(),
            in_process: folders.registry_turns.clone(),
            cache: Arc::default(),
        }
    }

    /// Records that `served_by` (an address from the manifest, or
    /// [`SERVED_BY_IMPORT`]) served the stored file of `sha256`, in the
    /// file's stamps record (a download records it as it publishes the
    /// file). Not fsynced and not locked: it only explains where a file
    /// came from, and the last writer wins. A record that cannot be written
    /// is logged and nothing more.
    pub fn record_served_by(&self, sha256: &str, served_by: &str) {
        if !crate::store::is_sha256(sha256) {
            return;
        }
        let served = ServedRecord::now(served_by);
        crate::store::stamps::record_served(&self.stamps, sha256, served);
    }

    /// Which address served the stored file of `sha256` (see
    /// [`Registry::record_served_by`]); `None` when nothing was recorded
    /// (a file kept by an earlier version that recorded nothing).
    pub fn served_by(&self, sha256: &str) -> Option<String> {
        if !crate::store::is_sha256(sha256) {
            return None;
        }
        if let Some(served) = crate::store::stamps::served(&self.stamps, sha256) {
            return Some(served.served_by);
        }
        // As an earlier version recorded it.
        let bytes = self
            .served
            .get()
            .ok()?
            .read_own(&format!("{sha256}.json"), MAX_SERVED_BYTES)
            .ok()?;
        serde_json::from_slice::<ServedRecord>(&bytes)
            .ok()
            .map(|r| r.served_by)
    }

    /// Forgets which address served the file of `sha256`: called when the
    /// stored file is deleted, so that a later download of the same bytes
    /// records its own address and nothing outlives its file.
    pub fn forget_served_by(&self, sha256: &str) {
        if !crate::store::is_sha256(sha256) {
            return;
        }
        crate::store::stamps::forget_served(&self.stamps, sha256);
        let Ok(served) = self.served.get() else {
            return;
        };
        match served.remove_file(&format!("{sha256}.json")) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(sha256, "a record of what served a deleted file stays: {e}"),
        }
    }

    /// Removes every `served/<sha256>.json` whose file `stored` says is not
    /// in the store (left by a deletion that did not remove it), and
    /// returns how many.
    pub fn prune_served(&self, stored: impl Fn(&str) -> bool) -> usize {
        let mut removed = 0;
        let Ok(served) = self.served.get() else {
            return 0;
        };
        for name in served.names().unwrap_or_default() {
            let Some(sha) = name.strip_suffix(".json") else {
                continue;
            };
            if crate::store::is_sha256(sha) && !stored(sha) && served.remove_file(&name).is_ok() {
                removed += 1;
            }
        }
        removed
    }

    /// Takes the cross-process registry lock.
    pub async fn lock(&self) -> Result<RegistryLock> {
        // Takers in this process wait their turn here, woken as soon as the
        // lock is released, rather than each trying the file lock and
        // sleeping between tries (thousands of failures recorded at once
        // would spend their time in those pauses); the file lock then
        // only waits for other processes.
        let turn = Arc::clone(&self.in_process).lock_owned().await;
        let file = crate::store::lockfile::lock_in(&self.locks, "registry.lock").await?;
        Ok(RegistryLock {
            _held: file,
            _turn: turn,
        })
    }

    /// The registration of `gem`, if installed.
    pub fn get(&self, gem: &str) -> Result<Option<Registration>> {
        Ok(self.get_shared(gem)?.map(|reg| (*reg).clone()))
    }

    /// [`Registry::get`], shared rather than copied (a lookup of one
    /// resource in a gem of thousands copies none of them).
    pub(crate) fn get_shared(&self, gem: &str) -> Result<Option<Arc<Registration>>> {
        Ok(self.cached(gem)?.map(|c| c.reg))
    }

    /// Whether any installed gem declares `sha256`. Parses only the
    /// registrations that changed since they were last read.
    pub fn declares(&self, sha256: &str) -> Result<bool> {
        self.declares_looking_first_at(sha256, std::iter::empty())
    }

    /// [`Registry::declares`], looking first at the registrations of
    /// `likely` (the gems that asked for the file): when one of them
    /// declares it, the other registrations are not looked at, nor
    /// `gems/` listed.
    pub(crate) fn declares_looking_first_at<'a>(
        &self,
        sha256: &str,
        likely: impl IntoIterator<Item = &'a str>,
    ) -> Result<bool> {
        for gem in likely {
            if self.cached(gem)?.is_some_and(|c| c.shas.contains(sha256)) {
                return Ok(true);
            }
        }
        for gem in json_stems(&self.gems)? {
            if self.cached(&gem)?.is_some_and(|c| c.shas.contains(sha256)) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// How many registration files this registry (and its clones) parsed.
    #[doc(hidden)]
    pub fn parses(&self) -> u64 {
        self.cache.parses.load(Ordering::Relaxed)
    }

    /// The registration of `gem` from the cache when its file is unchanged,
    /// else read, checked and cached.
    fn cached(&self, gem: &str) -> Result<Option<Cached>> {
        let name = format!("{}.json", file_stem(gem));
        let path = self.gems.join(&name);
        // The generation is read before the file: a change between the two
        // leaves a stamp that no later read matches, never a stale hit.
        let generation = self.generation();
        // A regular file of the store's user only: never a link followed.
        let meta = match self.gems.own_file_meta(&name) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.entries().remove(gem);
                return Ok(None);
            }
            Err(e) => return Err(Error::io("cannot read", &path, e)),
        };
        let stamp = Stamp {
            generation,
            file: crate::platform::FileStamp::of(&path, &meta),
        };
        if let Some(hit) = self.entries().get(gem).filter(|c| c.stamp == stamp) {
            return Ok(Some(hit.clone()));
        }
        self.cache.parses.fetch_add(1, Ordering::Relaxed);
        // A regular file of the store's user only: never a link followed.
        let bytes = match self.gems.read_own(&name, MAX_RECORD_BYTES) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.entries().remove(gem);
                return Ok(None);
            }
            Err(e) => return Err(Error::io("cannot read", &path, e)),
        };
        // Checked like a manifest, and it must name its own file.
        let reg = read_registration(gem, &bytes, &path)?;
        let cached = Cached {
            stamp,
            shas: Arc::new(reg.resources.iter().map(|r| r.sha256.clone()).collect()),
            reg: Arc::new(reg),
        };
        self.entries().insert(gem.to_string(), cached.clone());
        Ok(Some(cached))
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Cached>> {
        self.cache.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The registry's generation (0 before the first change).
    fn generation(&self) -> u64 {
        self.gems
            .read_own(GENERATION, 64)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Increases the generation after a change. Call with the lock held.
    /// Not fsynced: it only tells running processes that their cached
    /// records are out of date, and a system crash ends those processes.
    fn bump_generation(&self) -> Result<()> {
        let next = self.generation().wrapping_add(1).to_string();
        self.gems
            .replace(GENERATION, ".", next.as_bytes(), Durability::Hint)
            .map_err(|e| registry_error(e, next.len()))?;
        Ok(())
    }

    /// Every registration, ordered by gem id.
    pub fn list(&self) -> Result<Vec<Registration>> {
        Ok(self
            .list_shared()?
            .into_iter()
            .map(|reg| (*reg).clone())
            .collect())
    }

    /// [`Registry::list`], shared rather than copied: for callers that look
    /// through every registration for a few resources (a copy of thousands
    /// of resources per look is what made a failed download cost in
    /// proportion to every file installed).
    pub(crate) fn list_shared(&self) -> Result<Vec<Arc<Registration>>> {
        let mut out = Vec::new();
        for gem in json_stems(&self.gems)? {
            if let Some(reg) = self.get_shared(&gem)? {
                out.push(reg);
            }
        }
        Ok(out)
    }

    /// Writes a registration atomically, then drops the failure records
    /// it makes stale: those of resources it no longer declares, or whose
    /// SHA-256 or addresses it changes (an upgrade). Call with the lock held.
    pub fn put(&self, reg: &Registration) -> Result<()> {
        let old = self.get(&reg.gem)?;
        write_json(&self.gems, &format!("{}.json", file_stem(&reg.gem)), reg)?;
        self.bump_generation()?;
        self.with_failure_log(&reg.gem, |log, path| {
            let before = log.records.len();
            log.records.retain(|id, record| {
                let declared =
                    |resources: &[Resource]| resources.iter().find(|r| &r.id == id).cloned();
                match (
                    declared(&reg.resources),
                    old.as_ref().and_then(|o| declared(&o.resources)),
                ) {
                    (None, _) => false,
                    (Some(new), Some(was)) if !same_download(&new, &was) => false,
                    (Some(new), _) => record.is_for(&new),
                }
            });
            if log.records.len() != before {
                log.compact(path)?;
            }
            Ok(())
        })
    }

    /// Removes a registration and its failure records. Call with the lock held.
    pub fn remove(&self, gem: &str) -> Result<bool> {
        let _ = self.failures.remove_file(&failure_log_name(gem));
        self.failure_logs().remove(gem);
        self.unsaved().remove(gem);
        let name = format!("{}.json", file_stem(gem));
        let path = self.gems.join(&name);
        let removed = match self.gems.remove_file(&name) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(Error::io("cannot remove", &path, e)),
        };
        self.entries().remove(gem);
        self.bump_generation()?;
        Ok(removed)
    }

    /// Removes temporary files left by a write that a crash interrupted
    /// (the records themselves are always whole) and returns how many.
    pub fn clean(&self) -> usize {
        let mut removed = 0;
        let served = self.served.get().ok();
        let dirs = [
            Some((&*self.gems, false)),
            Some((&*self.failures, true)),
            served.map(|s| (s, false)),
        ];
        for (dir, failures) in dirs.into_iter().flatten() {
            for name in dir.names().unwrap_or_default() {
                // Failure records of earlier versions (one JSON map per gem)
                // were superseded by the logs.
                let legacy = failures && name.ends_with(".json");
                if (legacy || (name.starts_with('.') && name.ends_with(".tmp")))
                    && dir.remove_file(&name).is_ok()
                {
                    removed += 1;
                }
            }
        }
        removed
    }

    /// The failure records of `gem`, by resource id. Records of resources
    /// whose SHA-256 or addresses changed since are left out.
    /// A change that could not be written (a full disk) is reported by
    /// this process all the same.
    pub fn failures(&self, gem: &str) -> Result<BTreeMap<String, FailureRecord>> {
        let mut all = self.with_failure_log(gem, |log, _| Ok(log.records.clone()))?;
        for (resource, record) in self.unsaved().get(gem).into_iter().flatten() {
            match record {
                Some(r) => all.insert(resource.clone(), r.clone()),
                None => all.remove(resource),
            };
        }
        if !all.is_empty() {
            let resources = self.get(gem)?.map(|r| r.resources).unwrap_or_default();
            all.retain(|id, record| {
                resources
                    .iter()
                    .find(|r| &r.id == id)
                    .is_some_and(|r| record.is_for(r))
            });
        }
        Ok(all)
    }

    /// Sets (or, with `None`, clears) the failure record of one resource.
    /// The file work runs on the runtime's blocking threads, under the
    /// registry lock; a clear with surely nothing to clear only opens the
    /// gem's failure log (or finds none) on the calling thread. When the
    /// record cannot be written (a full disk), this process keeps it in
    /// memory and reports it ([`Registry::failures`]) all the same, and
    /// the write's error is returned.
    pub async fn set_failure(
        &self,
        gem: &str,
        resource: &str,
        record: Option<FailureRecord>,
    ) -> Result<()> {
        if record.is_none() && self.nothing_to_clear(gem, resource) {
            return Ok(());
        }
        let lock = self.lock().await?;
        let (this, gem, resource) = (self.clone(), gem.to_string(), resource.to_string());
        crate::store::off_runtime(self.failures.path(), move || {
            let _lock = lock;
            this.set_failure_locked(&gem, &resource, record)
        })
        .await
    }

    /// Whether `gem` surely has no failure record of `resource` to clear:
    /// none kept in memory, and no failure log, or one unchanged since it
    /// was read without that record. One look at the log's name, without
    /// the registry lock: a record another process writes after that look
    /// is one written after this clear, as it would be after the lock.
    fn nothing_to_clear(&self, gem: &str, resource: &str) -> bool {
        if self
            .unsaved()
            .get(gem)
            .is_some_and(|u| u.contains_key(resource))
        {
            return false;
        }
        let name = failure_log_name(gem);
        match self.failures.own_file_meta(&name) {
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
            Ok(meta) => {
                let stamp = crate::platform::FileStamp::of(&self.failures.join(&name), &meta);
                self.failure_logs().get(gem).is_some_and(|log| {
                    !log.stale && log.stamp == Some(stamp) && !log.records.contains_key(resource)
                })
            }
        }
    }

    fn unsaved(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, BTreeMap<String, Option<FailureRecord>>>> {
        self.cache.unsaved.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`Registry::set_failure`] with the lock held.
    fn set_failure_locked(
        &self,
        gem: &str,
        resource: &str,
        record: Option<FailureRecord>,
    ) -> Result<()> {
        #[cfg(test)]
        {
            *self.cache.worked_on.lock().unwrap() = Some(std::thread::current().id());
        }
        let Some(cached) = self.cached(gem)? else {
            return Ok(());
        };
        // A download that ended after an upgrade changed the resource is
        // not news about the resource as declared now.
        let current = cached.reg.resources.iter().find(|r| r.id == resource);
        if let Some(r) = &record {
            if !current.is_some_and(|c| r.is_for(c)) {
                return Ok(());
            }
        }
        // Kept as any reader gets it back (times in whole seconds).
        let record = record.map(|r| r.into_stored());
        let unsaved = self
            .unsaved()
            .get(gem)
            .is_some_and(|u| u.contains_key(resource));
        let written = self.with_failure_log(gem, |log, at| {
            if record.is_none() && !log.records.contains_key(resource) && !unsaved {
                return Ok(());
            }
            let line = FailureLine {
                resource: resource.to_string(),
                record: record.clone(),
            };
            match &line.record {
                Some(r) => log.records.insert(resource.to_string(), r.clone()),
                None => log.records.remove(resource),
            };
            #[cfg(test)]
            if self.cache.full_disk.load(Ordering::Relaxed) {
                log.stale = true;
                let full = std::io::Error::from_raw_os_error(crate::platform::DISK_FULL_CODES[0]);
                return Err(crate::store::write_failed(
                    "cannot write",
                    &at.path,
                    full,
                    1,
                ));
            }
            let written = if log.lines >= 2 * log.records.len() + LOG_SLACK {
                log.compact(at)
            } else {
                log.append(at, &line)
            };
            // The file no longer says what this log holds: read it again.
            log.stale = written.is_err();
            written
        });
        let mut unsaved = self.unsaved();
        match &written {
            Ok(()) => {
                if let Some(u) = unsaved.get_mut(gem) {
                    u.remove(resource);
                }
            }
            Err(_) => {
                unsaved
                    .entry(gem.to_string())
                    .or_default()
                    .insert(resource.to_string(), record);
            }
        }
        written
    }

    fn failure_logs(&self) -> std::sync::MutexGuard<'_, HashMap<String, FailureLog>> {
        self.cache
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `work` on the failure log of `gem`, read again only when its
    /// file changed since this registry last read or wrote it.
    fn with_failure_log<T>(
        &self,
        gem: &str,
        work: impl FnOnce(&mut FailureLog, &LogFile) -> Result<T>,
    ) -> Result<T> {
        let name = failure_log_name(gem);
        let path = self.failures.join(&name);
        let at = LogFile {
            dir: &self.failures,
            name,
            path,
        };
        let (name, path) = (&at.name, &at.path);
        let stamp = if self.failures.is_untrusted(name) {
            // Not the store's own file (a symbolic link planted there):
            // its name is freed, its target never read or written.
            tracing::warn!("removing {}: the store does not trust it", path.display());
            self.failures
                .remove_file(name)
                .map_err(|e| Error::io("cannot remove", path, e))?;
            None
        } else {
            match self.failures.own_file_meta(name) {
                Ok(meta) => Some(crate::platform::FileStamp::of(path, &meta)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(Error::io("cannot read", path, e)),
            }
        };
        let mut logs = self.failure_logs();
        let log = logs.entry(gem.to_string()).or_default();
        if log.stale || log.stamp != stamp || (stamp.is_none() && log.lines > 0) {
            *log = match stamp {
                None => FailureLog::default(),
                Some(_) => {
                    let bytes = match self.failures.read_own(name, MAX_LOG_BYTES) {
                        Ok(bytes) => bytes,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                        Err(e) => return Err(Error::io("cannot read", path, e)),
                    };
                    let (records, lines) = fold_failure_log(&bytes);
                    FailureLog {
                        stamp,
                        lines,
                        torn: bytes.last().is_some_and(|b| *b != b'\n'),
                        stale: false,
                        records,
                    }
                }
            };
        }
        work(log, &at)
    }
}

/// `<gem>.jsonl`, the failure log's name in `failures/`.
fn failure_log_name(gem: &str) -> String {
    format!("{}.jsonl", file_stem(gem))
}

/// The registry's generation's name in `gems/`.
const GENERATION: &str = ".generation";

/// A gem's failure log: its folder (held open), its name there and its
/// path (for messages).
struct LogFile<'a> {
    dir: &'a Folder,
    name: String,
    path: PathBuf,
}

impl FailureLog {
    /// Appends one line.
    fn append(&mut self, at: &LogFile, line: &FailureLine) -> Result<()> {
        let path = &at.path;
        let mut bytes = Vec::with_capacity(512);
        if self.torn {
            // Ends the line a crash cut short, so this one stays whole.
            bytes.push(b'\n');
        }
        serde_json::to_writer(&mut bytes, line)
            .map_err(|e| Error::io("cannot encode", path, std::io::Error::other(e)))?;
        bytes.push(b'\n');
        // Readable by the owner only, as the atomically written records;
        // a symbolic link planted at the log's name is never appended to.
        let mut file = at
            .dir
            .open_own(
                &at.name,
                cap_std::fs::OpenOptions::new().create(true).append(true),
            )
            .map_err(|e| Error::io("cannot open", path, e))?;
        // Not fsynced: a failure record only explains why a file is
        // missing, and the file is fetched again either way. What a power
        // cut can lose is the last few explanations, never a line's shape
        // (a cut line is skipped) nor anything about the files themselves.
        file.write_all(&bytes)
            .map_err(|e| crate::store::write_failed("cannot write", path, e, bytes.len() as u64))?;
        let meta = file
            .metadata()
            .map_err(|e| Error::io("cannot read", path, e))?;
        self.stamp = Some(crate::platform::FileStamp::of(path, &meta));
        self.lines += 1;
        self.torn = false;
        Ok(())
    }

    /// Rewrites the log with only its live records, atomically; removes it
    /// when none is left.
    fn compact(&mut self, at: &LogFile) -> Result<()> {
        let path = &at.path;
        if self.records.is_empty() {
            match at.dir.remove_file(&at.name) {
                Ok(()) => at.dir.sync(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("cannot remove", path, e)),
            }
            *self = FailureLog::default();
            return Ok(());
        }
        write_atomic(at.dir, &at.name, &encode_failures(&self.records))?;
        let meta = at
            .dir
            .own_file_meta(&at.name)
            .map_err(|e| Error::io("cannot read", path, e))?;
        self.stamp = Some(crate::platform::FileStamp::of(path, &meta));
        self.lines = self.records.len();
        self.torn = false;
        Ok(())
    }
}

/// The live records of a failure log, and how many lines it has. Lines that
/// do not parse (one cut short by a crash) are skipped.
fn fold_failure_log(bytes: &[u8]) -> (BTreeMap<String, FailureRecord>, usize) {
    let mut records = BTreeMap::new();
    let mut lines = 0;
    for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        lines += 1;
        let Ok(line) = serde_json::from_slice::<FailureLine>(line) else {
            continue;
        };
        match line.record {
            Some(record) => records.insert(line.resource, record),
            None => records.remove(&line.resource),
        };
    }
    (records, lines)
}

/// A failure log holding exactly `records`, one line each.
#[doc(hidden)]
pub fn encode_failures(records: &BTreeMap<String, FailureRecord>) -> Vec<u8> {
    let mut out = Vec::new();
    for (resource, record) in records {
        let line = FailureLine {
            resource: resource.clone(),
            record: Some(record.clone()),
        };
        if serde_json::to_writer(&mut out, &line).is_ok() {
            out.push(b'\n');
        }
    }
    out
}

/// Whether two declarations of a resource download the same bytes from the
/// same addresses (so that a failure of one is a failure of the other).
fn same_download(a: &Resource, b: &Resource) -> bool {
    a.sha256 == b.sha256 && a.addresses().eq(b.addresses())
}

/// Checks a gem id, which names files in the store. An id is either a
/// plain name or a scoped one, `@scope/name`, whose scope and name each
/// follow the plain rules:
/// - 1 to 128 characters in all;
/// - ASCII letters, digits, `.`, `_` and `-` only (no spaces, no control
///   characters, nothing a file system treats specially), plus the `@` and
///   the one `/` of a scoped id;
/// - each part starts with a letter or a digit (so no `.`, `..` or hidden
///   names);
/// - a scoped id is lower case, as npm requires: `@Acme/ocr` and
///   `@acme/ocr` would be one file on a file system that ignores case (the
///   default on macOS and Windows).
///
/// A scoped id is stored under a file name with `+` in place of its `/`
/// (`@acme+ocr.json`); `+` is not allowed in ids, so the mapping is one to
/// one. An id that breaks the rules is refused with `E_RESOURCE_GEM_ID`,
/// naming the rule.
pub fn check_gem_id(gem: &str) -> Result<()> {
    let parts: Vec<&str> = match gem.strip_prefix('@') {
        Some(scoped) => scoped.splitn(2, '/').collect(),
        None => vec![gem],
    };
    let reason = if gem.is_empty() {
        "it is empty"
    } else if gem.len() > 128 {
        "it is longer than 128 characters"
    } else if gem.starts_with('@') && (parts.len() != 2 || parts.iter().any(|p| p.is_empty())) {
        "a scoped id is @scope/name"
    } else if !parts
        .iter()
        .all(|p| p.starts_with(|c: char| c.is_ascii_alphanumeric()))
    {
        "it must start with a letter or a digit (each part of @scope/name too)"
    } else if !valid_gem_id(gem) {
        "only letters, digits, '.', '_' and '-' are allowed (and '@scope/' in front)"
    } else if gem.starts_with('@') && gem.bytes().any(|b| b.is_ascii_uppercase()) {
        "a scoped id is lower case (@scope/name): upper case would name the same file as the lower-case id where file names ignore case"
    } else {
        return Ok(());
    };
    Err(Error::GemId {
        id: crate::error::shorten_to(gem, 200),
        reason,
    })
}

/// Whether `gem` can be used as a gem id (the rules of [`check_gem_id`],
/// except that a scoped id may hold upper case, so that records written
/// before that rule are still read).
pub fn valid_gem_id(gem: &str) -> bool {
    fn plain(part: &str) -> bool {
        let mut chars = part.chars();
        matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
            && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    }
    if gem.len() > 128 {
        return false;
    }
    match gem.strip_prefix('@') {
        Some(scoped) => scoped
            .split_once('/')
            .is_some_and(|(scope, name)| plain(scope) && plain(name)),
        None => plain(gem),
    }
}

/// The file name (without `.json`) a gem's records are kept under.
fn file_stem(gem: &str) -> String {
    gem.replace('/', "+")
}

/// The gem id a record file's stem names, if it names one.
fn gem_of_stem(stem: &str) -> Option<String> {
    let gem = if stem.starts_with('@') {
        stem.replacen('+', "/", 1)
    } else {
        stem.to_string()
    };
    valid_gem_id(&gem).then_some(gem)
}

/// Reads the bytes of `gems/<gem>.json` the way [`Registry::get`] does: a
/// record that does not parse, or whose contents could steer a path, is a
/// "corrupted record" error naming `path`.
fn read_registration(gem: &str, bytes: &[u8], path: &Path) -> Result<Registration> {
    let corrupted = |reason: String| {
        Error::io(
            "corrupted record",
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidData, reason),
        )
    };
    let reg: Registration = serde_json::from_slice(bytes).map_err(|e| corrupted(e.to_string()))?;
    // The gem id names this record's file and, through `failures`, another
    // one: a record must name its own file, never a path elsewhere.
    if reg.gem != gem {
        return Err(corrupted(format!(
            "record of gem {:?} is stored as {gem:?}",
            reg.gem
        )));
    }
    // A damaged record must not bring back what manifest validation refuses
    // (an empty, duplicate or control-character id, ...).
    if let Err(error) = crate::manifest::validate(&crate::manifest::manifest_json(&reg.resources)) {
        let first = error.problems.first().map(ToString::to_string);
        return Err(corrupted(first.unwrap_or_default()));
    }
    // Records are ours, but a SHA-256 names folders in the store: one
    // that is not a SHA-256 is treated as corruption, never as a path.
    if let Some(bad) = reg
        .resources
        .iter()
        .find(|r| !crate::store::is_sha256(&r.sha256))
    {
        return Err(corrupted(format!(
            "resource {:?} has sha256 {:?}",
            bad.id, bad.sha256
        )));
    }
    Ok(reg)
}

/// Parses the bytes of a registration record of `gem` as [`Registry::get`]
/// does; an entry point for the fuzz targets and property tests.
#[doc(hidden)]
pub fn parse_registration(gem: &str, bytes: &[u8]) -> Result<Registration> {
    read_registration(gem, bytes, Path::new("<record>"))
}

/// Reads the bytes of a failure log as [`Registry::failures`] does (the
/// last line of each resource wins; lines that do not parse are skipped);
/// an entry point for the fuzz targets and property tests.
#[doc(hidden)]
pub fn parse_failures(bytes: &[u8]) -> BTreeMap<String, FailureRecord> {
    fold_failure_log(bytes).0
}

fn json_stems(dir: &Folder) -> Result<Vec<String>> {
    let names = dir
        .names()
        .map_err(|e| Error::io("cannot list", dir.path(), e))?;
    let mut out: Vec<String> = names
        .into_iter()
        .filter_map(|n| n.strip_suffix(".json").and_then(gem_of_stem))
        .collect();
    out.sort();
    Ok(out)
}

/// Writes `value` as JSON to the file `name` of `dir` atomically and
/// durably.
fn write_json<T: Serialize>(dir: &Folder, name: &str, value: &T) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(value)
        .map_err(|e| Error::io("cannot encode", dir.join(name), std::io::Error::other(e)))?;
    write_atomic(dir, name, &bytes)
}

/// Writes `bytes` to the file `name` of `dir` atomically and durably.
fn write_atomic(dir: &Folder, name: &str, bytes: &[u8]) -> Result<()> {
    dir.replace(name, ".", bytes, Durability::Full)
        .map_err(|e| registry_error(e, bytes.len()))
}

/// A failed replacement as the registry reports it: a full disk says how
/// much was needed.
fn registry_error(e: crate::store::atomic::ReplaceError, needed: usize) -> Error {
    match e.step {
        "cannot write" => crate::store::write_failed(e.step, &e.path, e.error, needed as u64),
        step => Error::io(step, &e.path, e.error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn registration(gem: &str, shas: &[String]) -> Registration {
        let resources: Vec<serde_json::Value> = shas
            .iter()
            .enumerate()
            .map(|(i, sha)| {
                serde_json::json!({
                    "id": format!("r{i}"),
                    "url": format!("https://cdn.example.com/{i}.bin"),
                    "sha256": sha,
                    "size": 1,
                })
            })
            .collect();
        let doc = serde_json::json!({ "resources": resources });
        let manifest = crate::manifest::parse_manifest(doc.to_string().as_bytes()).unwrap();
        Registration {
            gem: gem.to_string(),
            name: None,
            resources: manifest.resources,
            installed_by: Some(InstalledBy::Library),
        }
    }

    fn shas(n: usize, seed: u8) -> Vec<String> {
        (0..n)
            .map(|i| hex::encode(sha2::Sha256::digest([seed, i as u8, (i >> 8) as u8])))
            .collect()
    }

    fn open() -> (tempfile::TempDir, Registry) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        (dir, Registry::new(&store))
    }

    use sha2::Digest;

    #[test]
    fn a_record_of_what_served_a_file_goes_with_the_file() {
        let (dir, registry) = open();
        let sha = shas(3, 9);
        for s in &sha {
            registry.record_served_by(s, "https://cdn.example.com/x.bin");
        }
        registry.forget_served_by(&sha[0]);
        assert_eq!(registry.served_by(&sha[0]), None);
        assert!(registry.served_by(&sha[1]).is_some());
        // Forgetting twice, or a name that is not a SHA-256, does nothing.
        registry.forget_served_by(&sha[0]);
        registry.forget_served_by("../gems/x");
        // Records an earlier version left in `served/`: orphans go; the
        // record of a file still stored stays.
        let old = shas(2, 10);
        let served = dir.path().join("store-v1/served");
        std::fs::create_dir_all(&served).unwrap();
        let record = r#"{"served_by":"https://cdn.example.com/x.bin","at":"2026-01-01T00:00:00Z"}"#;
        for s in &old {
            std::fs::write(served.join(format!("{s}.json")), record).unwrap();
        }
        std::fs::write(served.join("notes.txt"), "keep").unwrap();
        assert_eq!(registry.prune_served(|s| s == old[0]), 1);
        assert!(registry.served_by(&old[0]).is_some());
        assert_eq!(registry.served_by(&old[1]), None);
        assert!(served.join("notes.txt").exists());
        assert_eq!(registry.prune_served(|s| s == old[0]), 0);
        // Forgetting removes an earlier version's record too.
        registry.forget_served_by(&old[0]);
        assert_eq!(registry.served_by(&old[0]), None);
    }

    #[test]
    fn what_served_a_file_reads_back_and_a_store_without_the_record_says_none() {
        let (dir, registry) = open();
        let sha = &shas(2, 9);
        // A store of an earlier version has no `served/` at all.
        assert_eq!(registry.served_by(&sha[0]), None);
        registry.record_served_by(&sha[0], "https://mirror.example.com/m.bin");
        assert_eq!(
            registry.served_by(&sha[0]).as_deref(),
            Some("https://mirror.example.com/m.bin")
        );
        registry.record_served_by(&sha[0], SERVED_BY_IMPORT);
        assert_eq!(registry.served_by(&sha[0]).as_deref(), Some("import"));
        assert_eq!(registry.served_by(&sha[1]), None);
        // Not a SHA-256: nothing written, nothing read outside the folder.
        registry.record_served_by("../gems/x", "https://a.example.com/");
        assert_eq!(registry.served_by("../gems/x"), None);
        // A record of a later version, with more fields, still reads; a
        // broken one is no answer.
        let served = dir.path().join("store-v1/served");
        std::fs::create_dir_all(&served).unwrap();
        let later =
            r#"{"served_by":"https://a.example.com/","at":"2026-01-01T00:00:00Z","more":1}"#;
        std::fs::write(served.join(format!("{}.json", sha[1])), later).unwrap();
        assert_eq!(
            registry.served_by(&sha[1]).as_deref(),
            Some("https://a.example.com/")
        );
        std::fs::write(served.join(format!("{}.json", sha[1])), "{").unwrap();
        assert_eq!(registry.served_by(&sha[1]), None);
    }

    #[test]
    fn asking_about_every_resource_parses_an_unchanged_registration_once() {
        let (_dir, registry) = open();
        let all = shas(300, 1);
        registry.put(&registration("g", &all)).unwrap();
        for sha in &all {
            assert!(registry.declares(sha).unwrap());
        }
        assert!(!registry.declares(&shas(1, 2)[0]).unwrap());
        assert_eq!(registry.get("g").unwrap().unwrap().resources.len(), 300);
        assert_eq!(registry.list().unwrap().len(), 1);
        assert_eq!(registry.parses(), 1, "one parse for 300 lookups");
    }

    #[test]
    fn clearing_failures_never_reparses_an_unchanged_registration() {
        let (_dir, registry) = open();
        let all = shas(50, 3);
        registry.put(&registration("g", &all)).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for i in 0..50 {
            rt.block_on(registry.set_failure("g", &format!("r{i}"), None))
                .unwrap();
        }
        assert!(registry.parses() <= 1, "{} parses", registry.parses());
    }

    #[test]
    fn the_gems_that_asked_are_looked_at_first_and_the_others_after() {
        let (dir, registry) = open();
        let (a, b) = (shas(3, 11), shas(3, 12));
        registry.put(&registration("a", &a)).unwrap();
        registry.put(&registration("b", &b)).unwrap();
        // Another process's registry: nothing read yet. A file of `b`,
        // asked for by `b`: only `b` is read (`a` comes first in `gems/`).
        let fresh = Registry::new(&Store::open(dir.path()).unwrap());
        assert!(fresh.declares_looking_first_at(&b[1], ["b"]).unwrap());
        assert_eq!(fresh.parses(), 1);
        // Asked for by a gem that does not declare it (an upgrade dropped
        // it), or one not installed: the others still count.
        assert!(fresh.declares_looking_first_at(&a[2], ["b"]).unwrap());
        assert!(fresh.declares_looking_first_at(&b[0], ["gone"]).unwrap());
        assert!(!fresh
            .declares_looking_first_at(&shas(1, 13)[0], ["a", "b"])
            .unwrap());
    }

    #[test]
    fn a_clear_with_nothing_to_clear_takes_no_lock_and_sees_other_processes_records() {
        let (dir, here) = open();
        let elsewhere = Registry::new(&Store::open(dir.path()).unwrap());
        let reg = registration("g", &shas(4, 14));
        here.put(&reg).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let clear = |registry: &Registry, i: usize| {
            let resource = format!("r{i}");
            let clear = registry.set_failure("g", &resource, None);
            rt.block_on(async { tokio::time::timeout(Duration::from_secs(5), clear).await })
        };
        // No failure log: nothing to clear, and no wait for the registry
        // lock another process holds.
        let held = rt.block_on(elsewhere.lock()).unwrap();
        let started = Instant::now();
        clear(&here, 0).expect("no wait for the lock").unwrap();
        assert!(started.elapsed() < Duration::from_secs(2));
        drop(held);
        // A record another process wrote since: cleared here, seen gone
        // there.
        rt.block_on(elsewhere.set_failure("g", "r1", Some(failure(&reg, 1, "one"))))
            .unwrap();
        clear(&here, 1).unwrap().unwrap();
        assert!(elsewhere.failures("g").unwrap().is_empty());
        // Known here without `r3`; another process then adds `r3`: the
        // changed log is read again, not trusted from memory.
        rt.block_on(here.set_failure("g", "r2", Some(failure(&reg, 2, "two"))))
            .unwrap();
        assert_eq!(here.failures("g").unwrap().len(), 1);
        rt.block_on(elsewhere.set_failure("g", "r3", Some(failure(&reg, 3, "three"))))
            .unwrap();
        clear(&here, 3).unwrap().unwrap();
        let left: Vec<String> = elsewhere.failures("g").unwrap().into_keys().collect();
        assert_eq!(left, ["r2"]);
    }

    #[test]
    fn a_change_by_another_process_is_seen_at_once() {
        // Two registries on one store stand for two processes.
        let (dir, here) = open();
        let elsewhere = Registry::new(&Store::open(dir.path()).unwrap());
        let (old, new) = (shas(20, 4), shas(20, 5));
        here.put(&registration("g", &old)).unwrap();
        assert!(here.declares(&old[7]).unwrap());
        // Same gem, same number of resources, same file size.
        elsewhere.put(&registration("g", &new)).unwrap();
        assert!(!here.declares(&old[7]).unwrap());
        assert!(here.declares(&new[7]).unwrap());
        assert_eq!(here.get("g").unwrap().unwrap().resources[7].sha256, new[7]);
        elsewhere.remove("g").unwrap();
        assert!(!here.declares(&new[7]).unwrap());
        assert!(here.get("g").unwrap().is_none());
    }

    fn failure(reg: &Registration, i: usize, message: &str) -> FailureRecord {
        let error = Error::failed_elsewhere(ErrorCode::Http, message.to_string());
        FailureRecord::new(&reg.resources[i], &error)
    }

    fn log_lines(dir: &tempfile::TempDir) -> usize {
        let path = dir.path().join("store-v1/failures/g.jsonl");
        std::fs::read(path).map_or(0, |b| b.iter().filter(|c| **c == b'\n').count())
    }

    #[test]
    fn each_failure_appends_one_line_and_the_log_stays_compact() {
        let (dir, registry) = open();
        let reg = registration("g", &shas(300, 7));
        registry.put(&reg).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for i in 0..300 {
            let record = failure(&reg, i, &format!("attempt {i}"));
            rt.block_on(registry.set_failure("g", &format!("r{i}"), Some(record)))
                .unwrap();
            assert_eq!(log_lines(&dir), i + 1, "one appended line per failure");
        }
        assert_eq!(registry.failures("g").unwrap().len(), 300);
        // Fail and clear the same resources over and over: the log is
        // compacted instead of growing without end.
        for round in 0..5 {
            for i in 0..300 {
                let record = (i % 2 == 0).then(|| failure(&reg, i, &format!("round {round}")));
                rt.block_on(registry.set_failure("g", &format!("r{i}"), record))
                    .unwrap();
                assert!(log_lines(&dir) <= 2 * 300 + LOG_SLACK + 1);
            }
        }
        let all = registry.failures("g").unwrap();
        assert_eq!(all.len(), 150);
        assert_eq!(all["r298"].message, "round 4");
        assert!(!all.contains_key("r299"));
        // Another process reads the same records from the file.
        let elsewhere = Registry::new(&Store::open(dir.path()).unwrap());
        assert_eq!(elsewhere.failures("g").unwrap(), all);
        // Clearing every record removes the log.
        for i in (0..300).step_by(2) {
            rt.block_on(registry.set_failure("g", &format!("r{i}"), None))
                .unwrap();
        }
        assert!(registry.failures("g").unwrap().is_empty());
        assert!(log_lines(&dir) <= LOG_SLACK + 150);
    }

    #[test]
    fn a_line_cut_short_by_a_crash_loses_only_itself() {
        let (dir, registry) = open();
        let reg = registration("g", &shas(3, 8));
        registry.put(&reg).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(registry.set_failure("g", "r0", Some(failure(&reg, 0, "first"))))
            .unwrap();
        // A crash in the middle of the next append.
        let path = dir.path().join("store-v1/failures/g.jsonl");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        file.write_all(br#"{"resource":"r1","record":{"at":"#)
            .unwrap();
        drop(file);
        // Another process (a fresh registry) reads what is whole, and its
        // next record stays whole too.
        let next = Registry::new(&Store::open(dir.path()).unwrap());
        assert_eq!(next.failures("g").unwrap().len(), 1);
        rt.block_on(next.set_failure("g", "r2", Some(failure(&reg, 2, "third"))))
            .unwrap();
        let all = Registry::new(&Store::open(dir.path()).unwrap())
            .failures("g")
            .unwrap();
        assert_eq!(all.keys().collect::<Vec<_>>(), ["r0", "r2"]);
        assert_eq!(all["r2"].message, "third");
        // A change by another process is seen by the first registry too.
        assert_eq!(registry.failures("g").unwrap(), all);
    }

    #[test]
    fn a_failure_that_cannot_be_written_is_still_reported_by_this_process() {
        let (dir, registry) = open();
        let reg = registration("g", &shas(2, 9));
        registry.put(&reg).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(registry.set_failure("g", "r0", Some(failure(&reg, 0, "first"))))
            .unwrap();
        registry.cache.full_disk.store(true, Ordering::Relaxed);
        let err = rt
            .block_on(registry.set_failure("g", "r1", Some(failure(&reg, 1, "disk full"))))
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::DiskSpace, "{err}");
        let err = rt
            .block_on(registry.set_failure("g", "r0", None))
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::DiskSpace, "{err}");
        // The file still holds only the first record; this process reports
        // what it could not write, even after another process changed the
        // file (which makes it read the file again).
        let elsewhere = Registry::new(&Store::open(dir.path()).unwrap());
        assert_eq!(
            elsewhere.failures("g").unwrap().keys().collect::<Vec<_>>(),
            ["r0"]
        );
        rt.block_on(elsewhere.set_failure("g", "r0", Some(failure(&reg, 0, "again"))))
            .unwrap();
        let here = registry.failures("g").unwrap();
        assert_eq!(here.keys().collect::<Vec<_>>(), ["r1"], "{here:?}");
        assert_eq!(here["r1"].message, "disk full");
        // Once the disk has room again, the next change of each record is
        // written, and every process reads the same.
        registry.cache.full_disk.store(false, Ordering::Relaxed);
        rt.block_on(registry.set_failure("g", "r1", Some(failure(&reg, 1, "later"))))
            .unwrap();
        rt.block_on(registry.set_failure("g", "r0", None)).unwrap();
        assert!(registry.unsaved().get("g").is_none_or(|u| u.is_empty()));
        let all = registry.failures("g").unwrap();
        assert_eq!(all.keys().collect::<Vec<_>>(), ["r1"]);
        assert_eq!(all["r1"].message, "later");
        assert_eq!(elsewhere.failures("g").unwrap(), all);
    }

    #[test]
    fn failure_records_are_written_off_the_runtime_thread() {
        let (_dir, registry) = open();
        let reg = registration("g", &shas(1, 10));
        registry.put(&reg).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        // On a current-thread runtime, the task runs on this thread: the
        // file work must not.
        rt.block_on(registry.set_failure("g", "r0", Some(failure(&reg, 0, "x"))))
            .unwrap();
        let worked_on = registry.cache.worked_on.lock().unwrap().unwrap();
        assert_ne!(worked_on, std::thread::current().id());
    }

    #[test]
    fn scoped_gem_ids_are_lower_case_and_plain_ids_keep_their_rules() {
        for good in ["@acme/ocr", "@acme-2/ocr.v3", "ocr", "Ocr-Tools", "a_b.c"] {
            assert!(check_gem_id(good).is_ok(), "{good}");
        }
        for bad in ["@ACME/ocr", "@acme/OCR", "@Acme/Ocr"] {
            let err = check_gem_id(bad).unwrap_err();
            assert_eq!(err.code(), ErrorCode::GemId, "{bad}");
            assert!(err.to_string().contains("lower case"), "{bad}: {err}");
        }
        // Records written before the rule are still read.
        assert_eq!(gem_of_stem("@Acme+ocr").as_deref(), Some("@Acme/ocr"));
    }

    #[test]
    fn every_change_increases_the_generation() {
        let (_dir, registry) = open();
        assert_eq!(registry.generation(), 0);
        registry.put(&registration("g", &shas(1, 6))).unwrap();
        assert_eq!(registry.generation(), 1);
        registry.remove("g").unwrap();
        assert_eq!(registry.generation(), 2);
        assert_eq!(registry.clean(), 0, "no temporary file is left behind");
    }
}
