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

use crate::error::{shorten_to, Error, ErrorCode, Result};
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

/// One address of a failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// The address tried.
    pub address: String,
    /// The error code.
    pub code: ErrorCode,
    /// Why it failed.
    pub reason: String,
}

/// The most attempts a failure record keeps: the url and its 16 mirrors.
const MAX_RECORDED_ATTEMPTS: usize = 17;
/// The most characters a recorded address or reason keeps.
const MAX_RECORDED_TEXT_CHARS: usize = 2048;
/// The most characters a failure's full message keeps, on disk and when it
/// is shared with another process: a hostile server must not be able to
/// make records grow without bound.
pub(crate) const MAX_FAILURE_MESSAGE_CHARS: usize = 16 * 1024;

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
        let reg: Option<Registration> = read_json(&path)?;
        // Records are ours, but a SHA-256 names folders in the store: one
        // that is not a SHA-256 is treated as corruption, never as a path.
        if let Some(bad) = reg
            .iter()
            .flat_map(|r| &r.resources)
            .find(|r| !crate::store::is_sha256(&r.sha256))
        {
            return Err(Error::io(
                "corrupted record",
                &path,
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("resource {:?} has sha256 {:?}", bad.id, bad.sha256),
                ),
            ));
        }
        Ok(reg)
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

    /// Writes a registration atomically, then drops the failure records
    /// it makes stale: those of resources it no longer declares, or whose
    /// SHA-256 or addresses it changes (an upgrade). Call with the lock held.
    pub fn put(&self, reg: &Registration) -> Result<()> {
        let old = self.get(&reg.gem)?;
        write_json(&self.gems.join(format!("{}.json", reg.gem)), reg)?;
        let path = self.failures.join(format!("{}.json", reg.gem));
        let mut all: BTreeMap<String, FailureRecord> = read_json(&path)?.unwrap_or_default();
        let before = all.len();
        all.retain(|id, record| {
            let declared = |resources: &[Resource]| resources.iter().find(|r| &r.id == id).cloned();
            match (
                declared(&reg.resources),
                old.as_ref().and_then(|o| declared(&o.resources)),
            ) {
                (None, _) => false,
                (Some(new), Some(was)) if !same_download(&new, &was) => false,
                (Some(new), _) => record.is_for(&new),
            }
        });
        if all.len() != before {
            write_json(&path, &all)?;
        }
        Ok(())
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

    /// The failure records of `gem`, by resource id. Records of resources
    /// whose SHA-256 or addresses changed since are left out.
    pub fn failures(&self, gem: &str) -> Result<BTreeMap<String, FailureRecord>> {
        let mut all: BTreeMap<String, FailureRecord> =
            read_json(&self.failures.join(format!("{gem}.json")))?.unwrap_or_default();
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
    pub async fn set_failure(
        &self,
        gem: &str,
        resource: &str,
        record: Option<FailureRecord>,
    ) -> Result<()> {
        let _lock = self.lock().await?;
        let Some(reg) = self.get(gem)? else {
            return Ok(());
        };
        // A download that ended after an upgrade changed the resource is
        // not news about the resource as declared now.
        let current = reg.resources.iter().find(|r| r.id == resource);
        if let Some(r) = &record {
            if !current.is_some_and(|c| r.is_for(c)) {
                return Ok(());
            }
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

/// Whether two declarations of a resource download the same bytes from the
/// same addresses (so that a failure of one is a failure of the other).
fn same_download(a: &Resource, b: &Resource) -> bool {
    a.sha256 == b.sha256 && a.addresses().eq(b.addresses())
}

/// Checks a gem id, which names files in the store. The rules:
/// - 1 to 128 characters;
/// - ASCII letters, digits, `.`, `_` and `-` only (no `/`, no spaces, no
///   control characters, nothing a file system treats specially);
/// - the first character is a letter or a digit (so no `.`, `..` or
///   hidden names).
///
/// An id that breaks them is refused with `E_RESOURCE_GEM_ID`, naming the
/// rule.
pub fn check_gem_id(gem: &str) -> Result<()> {
    let reason = if gem.is_empty() {
        "it is empty"
    } else if gem.len() > 128 {
        "it is longer than 128 characters"
    } else if !gem.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        "it must start with a letter or a digit"
    } else if !valid_gem_id(gem) {
        "only letters, digits, '.', '_' and '-' are allowed"
    } else {
        return Ok(());
    };
    Err(Error::GemId {
        id: crate::error::shorten_to(gem, 200),
        reason,
    })
}

/// Whether `gem` can be used as a gem id (the rules of [`check_gem_id`]).
pub fn valid_gem_id(gem: &str) -> bool {
    let mut chars = gem.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && gem.len() <= 128
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
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
