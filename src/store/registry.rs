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

use std::collections::{BTreeMap, HashMap};
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

mod failures;

pub use failures::{encode_failures, parse_failures, FailureRecord};
use failures::{FailureLog, Pending};

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
    in_process: Arc<crate::store::lockfile::Turns>,
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
    /// Changes of failure records waiting to be written together.
    pending: Mutex<Pending>,
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
    /// How many writes of failure records ran under the lock (tests).
    #[cfg(test)]
    failure_writes: AtomicU64,
}

/// Longest registration record read back (a manifest is at most 1 MiB;
/// its record, pretty-printed, somewhat more).
const MAX_RECORD_BYTES: u64 = 16 << 20;

/// One parsed registration and what it was read from.
#[derive(Debug, Clone)]
struct Cached {
    stamp: Stamp,
    reg: Arc<Registration>,
    /// Where in `reg.resources` each SHA-256 is declared.
    by_sha: Arc<HashMap<String, Vec<usize>>>,
    /// Where in `reg.resources` each id is.
    by_id: Arc<HashMap<String, usize>>,
}

impl Cached {
    /// The resource `id` as registered.
    fn resource(&self, id: &str) -> Option<&Resource> {
        self.by_id
            .get(id)
            .and_then(|&at| self.reg.resources.get(at))
    }
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
    /// Handed to the next taker in this process, or released.
    _turn: crate::store::lockfile::Turn,
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

    /// Takes the cross-process registry lock. Takers in this process wait
    /// their turn, woken as soon as the one before them is done, which
    /// hands them the file lock still held when they were waiting (see
    /// `lockfile::Turns`): the file lock only waits for other processes.
    pub async fn lock(&self) -> Result<RegistryLock> {
        let turn = self
            .in_process
            .lock_in(&self.locks, "registry.lock")
            .await?;
        Ok(RegistryLock { _turn: turn })
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
            if self
                .cached(gem)?
                .is_some_and(|c| c.by_sha.contains_key(sha256))
            {
                return Ok(true);
            }
        }
        for gem in json_stems(&self.gems)? {
            if self
                .cached(&gem)?
                .is_some_and(|c| c.by_sha.contains_key(sha256))
            {
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
        let mut by_sha: HashMap<String, Vec<usize>> = HashMap::new();
        let mut by_id = HashMap::new();
        for (at, r) in reg.resources.iter().enumerate() {
            by_sha.entry(r.sha256.clone()).or_default().push(at);
            by_id.insert(r.id.clone(), at);
        }
        let cached = Cached {
            stamp,
            by_sha: Arc::new(by_sha),
            by_id: Arc::new(by_id),
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

    /// The resources installed gems declare with `sha256`, each with its
    /// gem, ordered by gem id: one look per registration, however many
    /// resources it declares.
    pub(crate) fn declaring(&self, sha256: &str) -> Result<Vec<(String, Resource)>> {
        let mut out = Vec::new();
        for gem in json_stems(&self.gems)? {
            let Some(cached) = self.cached(&gem)? else {
                continue;
            };
            for &at in cached.by_sha.get(sha256).into_iter().flatten() {
                if let Some(r) = cached.reg.resources.get(at) {
                    out.push((cached.reg.gem.clone(), r.clone()));
                }
            }
        }
        Ok(out)
    }

    /// Every registration, ordered by gem id.
    pub fn list(&self) -> Result<Vec<Registration>> {
        let mut out = Vec::new();
        for gem in json_stems(&self.gems)? {
            if let Some(reg) = self.get_shared(&gem)? {
                out.push((*reg).clone());
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
        self.drop_stale_failures(reg, old.as_ref())
    }

    /// Removes a registration and its failure records. Call with the lock held.
    pub fn remove(&self, gem: &str) -> Result<bool> {
        self.forget_failures(gem);
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
}

/// The registry's generation's name in `gems/`.
const GENERATION: &str = ".generation";

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
mod tests;
