//! What each installed gem declares, and the last failure of each resource.
//!
//! Both live in the store (`gems/<gem id>.json`, `failures/<gem id>.json`),
//! are written atomically (temporary file, fsync, rename, fsync folder) and
//! are changed only under a cross-process lock (`locks/registry.lock`), so
//! several processes can share one store and a crash never leaves a
//! half-written record.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::manifest::Resource;
use crate::store::Store;

/// A gem's registration: its validated resources.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    /// The gem's id.
    pub gem: String,
    /// Its resources, as validated at install.
    pub resources: Vec<Resource>,
}

/// The last failure of one resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureRecord {
    /// When it failed, seconds since the Unix epoch.
    pub at: u64,
    /// The error code.
    pub code: String,
    /// The full message.
    pub message: String,
    /// Each address with its own code and reason.
    pub attempts: Vec<AttemptRecord>,
}

/// One address of a failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// The address tried.
    pub address: String,
    /// The error code.
    pub code: String,
    /// Why it failed.
    pub reason: String,
}

impl FailureRecord {
    /// Records `error` as of now.
    pub fn from_error(error: &Error) -> FailureRecord {
        let attempts = match error {
            Error::Unavailable { attempts, .. } => attempts
                .iter()
                .map(|a| AttemptRecord {
                    address: a.address.to_string(),
                    code: a.code().to_string(),
                    reason: a.error.to_string(),
                })
                .collect(),
            _ => Vec::new(),
        };
        FailureRecord {
            at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            code: error.code().to_string(),
            message: error.to_string(),
            attempts,
        }
    }
}

/// The registrations and failure records of a store.
#[derive(Debug, Clone)]
pub struct Registry {
    /// `store-v1/gems`.
    gems: PathBuf,
    /// `store-v1/failures`.
    failures: PathBuf,
    /// `store-v1/locks/registry.lock`.
    lock: PathBuf,
}

/// Held while the registry is being changed; released on drop.
#[derive(Debug)]
pub struct RegistryLock {
    _file: File,
}

impl Registry {
    /// The registry of `store`.
    pub fn new(store: &Store) -> Registry {
        let root = store.root();
        Registry {
            gems: root.join("gems"),
            failures: root.join("failures"),
            lock: root.join("locks").join("registry.lock"),
        }
    }

    /// Takes the cross-process registry lock.
    pub async fn lock(&self) -> Result<RegistryLock> {
        let file = crate::lockfile::lock(&self.lock).await?;
        Ok(RegistryLock { _file: file })
    }

    /// The registration of `gem`, if installed.
    pub fn get(&self, gem: &str) -> Result<Option<Registration>> {
        let path = self.gems.join(format!("{gem}.json"));
        match fs::read(&path) {
            Ok(bytes) => read_registration(gem, &bytes, &path).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("cannot read", &path, e)),
        }
    }

    /// Every registration, ordered by gem id.
    pub fn list(&self) -> Result<Vec<Registration>> {
        let mut out = Vec::new();
        for gem in json_stems(&self.gems)? {
            if let Some(reg) = self.get(&gem)? {
                out.push(reg);
            }
        }
        Ok(out)
    }

    /// Writes a registration atomically. Call with the lock held.
    pub fn put(&self, reg: &Registration) -> Result<()> {
        write_json(&self.gems.join(format!("{}.json", reg.gem)), reg)
    }

    /// Removes a registration and its failure records. Call with the lock held.
    pub fn remove(&self, gem: &str) -> Result<bool> {
        let _ = fs::remove_file(self.failures.join(format!("{gem}.json")));
        let path = self.gems.join(format!("{gem}.json"));
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::io("cannot remove", &path, e)),
        }
    }

    /// Removes temporary files left by a write that a crash interrupted
    /// (the records themselves are always whole) and returns how many.
    pub fn clean(&self) -> usize {
        let mut removed = 0;
        for dir in [&self.gems, &self.failures] {
            for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name.starts_with('.')
                    && name.ends_with(".tmp")
                    && fs::remove_file(entry.path()).is_ok()
                {
                    removed += 1;
                }
            }
        }
        removed
    }

    /// The failure records of `gem`, by resource id.
    pub fn failures(&self, gem: &str) -> Result<BTreeMap<String, FailureRecord>> {
        Ok(read_json(&self.failures.join(format!("{gem}.json")))?.unwrap_or_default())
    }

    /// Sets (or, with `None`, clears) the failure record of one resource.
    pub async fn set_failure(
        &self,
        gem: &str,
        resource: &str,
        record: Option<FailureRecord>,
    ) -> Result<()> {
        let _lock = self.lock().await?;
        if self.get(gem)?.is_none() {
            return Ok(());
        }
        let path = self.failures.join(format!("{gem}.json"));
        let mut all: BTreeMap<String, FailureRecord> = read_json(&path)?.unwrap_or_default();
        let changed = match record {
            Some(r) => {
                all.insert(resource.to_string(), r);
                true
            }
            None => all.remove(resource).is_some(),
        };
        if changed {
            write_json(&path, &all)?;
        }
        Ok(())
    }
}

/// Whether `gem` can be used as a gem id (it names files in the store).
pub fn valid_gem_id(gem: &str) -> bool {
    let mut chars = gem.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && gem.len() <= 128
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
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
    if let Err(error) = crate::manifest::validate(&manifest_form(&reg.resources)) {
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

/// The manifest JSON that declares exactly `resources`.
fn manifest_form(resources: &[Resource]) -> serde_json::Value {
    let entries: Vec<serde_json::Value> = resources
        .iter()
        .map(|r| {
            let mut entry = serde_json::json!({
                "id": r.id,
                "url": r.url.as_str(),
                "mirrors": r.mirrors.iter().map(url::Url::as_str).collect::<Vec<_>>(),
                "sha256": r.sha256,
                "size": r.size,
                "required": r.required,
            });
            if let Some(text) = &r.description {
                entry["description"] = serde_json::json!(text);
            }
            entry
        })
        .collect();
    serde_json::json!({ "resources": entries })
}

/// Parses the bytes of a registration record of `gem` as [`Registry::get`]
/// does; an entry point for the fuzz targets and property tests.
#[doc(hidden)]
pub fn parse_registration(gem: &str, bytes: &[u8]) -> Result<Registration> {
    read_registration(gem, bytes, Path::new("<record>"))
}

/// Parses the bytes of a failure-records file as [`Registry::failures`]
/// does; an entry point for the fuzz targets and property tests.
#[doc(hidden)]
pub fn parse_failures(bytes: &[u8]) -> Result<BTreeMap<String, FailureRecord>> {
    serde_json::from_slice(bytes).map_err(|e| {
        Error::io(
            "corrupted record",
            Path::new("<record>"),
            std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        )
    })
}

fn json_stems(dir: &Path) -> Result<Vec<String>> {
    let entries = fs::read_dir(dir).map_err(|e| Error::io("cannot list", dir, e))?;
    let mut out: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter_map(|n| n.strip_suffix(".json").map(str::to_string))
        .filter(|n| valid_gem_id(n))
        .collect();
    out.sort();
    Ok(out)
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            Error::io(
                "corrupted record",
                path,
                std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("cannot read", path, e)),
    }
}

/// Writes `value` as JSON to `path` atomically and durably.
fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let bytes = serde_json::to_vec_pretty(value)
        .map_err(|e| Error::io("cannot encode", path, std::io::Error::other(e)))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| Error::io("cannot create temporary file in", dir, e))?;
    tmp.write_all(&bytes)
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| Error::io("cannot write", tmp.path(), e))?;
    tmp.persist(path)
        .map_err(|e| Error::io("cannot replace", path, e.error))?;
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}
