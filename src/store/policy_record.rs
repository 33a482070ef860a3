//! The last network policy set for a store, for every process that uses it.
//!
//! [`crate::Resources::set_policy`] (from the app, the local API or a
//! reload of `serve`'s configuration) writes `<store>/store-v1/policy.json`
//! atomically, under the lock `locks/policy.lock`; every service open on
//! the store reads it when it opens and watches it while it runs, so no
//! process downloads under a policy older than the one last set for its
//! store, whether or not a service listens.
//!
//! **Which record is newer** is its `generation`: each write takes the
//! one before plus one, under the lock, so two changes never look alike,
//! however fast they follow each other or whatever the clock says.
//! Watchers compare generations, not modification times.
//!
//! **Which wins, the configuration file or the record**, is decided by the
//! file's content, not by clocks. The record names the configuration file
//! of the process that wrote it and the SHA-256 of that file's bytes then:
//!
//! - a process using that same file applies the record while the file is
//!   unchanged, and its file once the file differs (the user edited it
//!   after the record: it holds until the next `set_policy`);
//! - a configuration built in code has no file: the record holds;
//! - a process using another file (or a record written by a process
//!   without one) compares the two files' modification times, as the
//!   file system stamped them: the newer holds. The record's own
//!   `set_at` is for people and is never compared.
//!
//! A record longer than [`MAX_BYTES`] is never written: it would not be
//! read back, and every process on the store would fail to open.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::net::policy::{Mode, Policy};
use crate::store::atomic::Durability;
use crate::store::{trust, Store};

/// The record's file name in `<store>/store-v1`.
pub const FILE: &str = "policy.json";

/// The lock a writer holds in `<store>/store-v1/locks` while it reads the
/// last generation and writes the next.
const LOCK: &str = "policy.lock";

/// Longest record read, and so written (a policy lists host patterns,
/// not data).
pub const MAX_BYTES: u64 = 1 << 20;

/// The policy last set for a store, and by whom.
#[derive(Debug, Clone)]
pub struct PolicyRecord {
    /// The policy.
    pub policy: Policy,
    /// Grows by one with every record written for the store; `0` for a
    /// record written before generations were kept.
    pub generation: u64,
    /// The process that set it.
    pub pid: u32,
    /// The configuration file of the process that set it, and its
    /// content then.
    pub config: Option<ConfigSeen>,
    /// When the file system last stamped the record (for comparison with
    /// a configuration file the record does not name).
    pub modified: Option<SystemTime>,
}

/// A configuration file as the writer of a record saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigSeen {
    /// Its absolute path.
    pub file: String,
    /// The SHA-256 of its bytes, hex.
    pub sha256: String,
}

impl ConfigSeen {
    /// `file` as it is now; `None` when it cannot be read.
    pub fn of(file: &Path) -> Option<ConfigSeen> {
        let bytes = std::fs::read(file).ok()?;
        Some(ConfigSeen {
            file: absolute(file),
            sha256: hex::encode(Sha256::digest(&bytes)),
        })
    }
}

fn absolute(file: &Path) -> String {
    std::fs::canonicalize(file)
        .or_else(|_| std::path::absolute(file))
        .unwrap_or_else(|_| file.to_path_buf())
        .to_string_lossy()
        .into_owned()
}

#[derive(Serialize, Deserialize)]
struct Stored {
    #[serde(default)]
    generation: u64,
    mode: Mode,
    hosts: Vec<String>,
    /// When it was set, for people (RFC 3339); never compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    set_at: Option<String>,
    pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    config: Option<ConfigSeen>,
}

/// Only the generation of a record (what a watcher reads every tick).
#[derive(Deserialize)]
struct GenerationOnly {
    #[serde(default)]
    generation: u64,
}

impl Store {
    /// `<store>/store-v1/policy.json`.
    pub fn policy_record_path(&self) -> PathBuf {
        self.root().join(FILE)
    }

    /// Writes `policy` as the store's last policy, atomically and durably,
    /// with the next generation; `config_file` is the configuration file
    /// of the process setting it, if it has one. Returns the generation
    /// written. A record that would be longer than [`MAX_BYTES`] is refused
    /// before anything is written.
    pub fn write_policy_record(&self, policy: &Policy, config_file: Option<&Path>) -> Result<u64> {
        let mut stored = Stored {
            generation: 0,
            mode: policy.mode(),
            hosts: policy.hosts().to_vec(),
            set_at: Some(crate::time::to_rfc3339(SystemTime::now())),
            pid: std::process::id(),
            config: config_file.and_then(ConfigSeen::of),
        };
        let too_long = |len: usize| {
            Error::Invalid(format!(
                "policy: {} hosts make a record of {len} bytes, over the {MAX_BYTES} bytes every process on the store reads back: list fewer hosts (a pattern such as *.example.com covers a domain)",
                policy.hosts().len()
            ))
        };
        let encode = |stored: &Stored| {
            serde_json::to_vec_pretty(stored)
                .map_err(|e| Error::Invalid(format!("cannot write the policy record: {e}")))
        };
        // Refused before the lock: nothing else is read or written.
        let len = encode(&stored)?.len() + 20;
        if len as u64 > MAX_BYTES {
            return Err(too_long(len));
        }
        let lock = self.lock_policy()?;
        stored.generation = self.policy_generation().unwrap_or(0) + 1;
        let bytes = encode(&stored)?;
        if bytes.len() as u64 > MAX_BYTES {
            return Err(too_long(bytes.len()));
        }
        // Through the handle of `store-v1/` the store opened.
        self.root_folder()
            .replace(FILE, ".policy.", &bytes, Durability::Full)
            .map_err(|e| Error::io(e.step, &e.path, e.error))?;
        drop(lock);
        Ok(stored.generation)
    }

    /// Waits for the writers' lock (held for a read and a write).
    fn lock_policy(&self) -> Result<crate::store::lockfile::Held> {
        crate::store::lockfile::lock_blocking_in(self.locks(), LOCK)
    }

    /// The store's last policy; `None` when none was ever set. A record
    /// that cannot be read or parsed is an error naming the file: a
    /// process must not fall back to an older policy.
    pub fn policy_record(&self) -> Result<Option<PolicyRecord>> {
        let read = self.root_folder().read_own(FILE, MAX_BYTES);
        let modified = self
            .root_folder()
            .entry(FILE)
            .ok()
            .and_then(|m| m.modified().ok())
            .map(|t| t.into_std());
        parse(read, &self.policy_record_path(), modified)
    }

    /// The generation of the store's record, read without parsing its
    /// hosts: `None` when there is none (or it cannot be read).
    pub fn policy_generation(&self) -> Option<u64> {
        generation_of(self.root_folder().read_own(FILE, MAX_BYTES))
    }
}

fn generation_of(read: std::io::Result<Vec<u8>>) -> Option<u64> {
    let bytes = read.ok()?;
    let only: GenerationOnly = serde_json::from_slice(&bytes).ok()?;
    Some(only.generation)
}

/// The last policy set for the store in `store_dir` (the folder the
/// configuration names), read without creating anything.
pub fn read_in(store_dir: &Path) -> Result<Option<PolicyRecord>> {
    let path = record_in(store_dir);
    let modified = std::fs::symlink_metadata(&path)
        .ok()
        .and_then(|m| m.modified().ok());
    parse(trust::read_own(&path, MAX_BYTES), &path, modified)
}

/// The generation of the record of the store in `store_dir`, as
/// [`Store::policy_generation`], without opening the store.
pub fn generation_in(store_dir: &Path) -> Option<u64> {
    generation_of(trust::read_own(&record_in(store_dir), MAX_BYTES))
}

fn record_in(store_dir: &Path) -> PathBuf {
    store_dir.join(crate::store::LAYOUT).join(FILE)
}

/// The record in `read` (the bytes of `path`, or why they were not read).
fn parse(
    read: std::io::Result<Vec<u8>>,
    path: &Path,
    modified: Option<SystemTime>,
) -> Result<Option<PolicyRecord>> {
    let bytes = match read {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("cannot read the policy record", path, e)),
    };
    let bad = |why: String| {
        Error::Config(format!(
            "{}: not a policy record ({why}); remove it or set the policy again",
            path.display()
        ))
    };
    let stored: Stored = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
    let policy = Policy::new(stored.mode, &stored.hosts).map_err(|e| bad(e.to_string()))?;
    Ok(Some(PolicyRecord {
        policy,
        generation: stored.generation,
        pid: stored.pid,
        config: stored.config,
        modified,
    }))
}

/// The policy a process must use, given its configured policy, its
/// configuration file and the store's record (see the module's
/// documentation for the rule).
pub fn effective(
    configured: Policy,
    config_file: Option<&Path>,
    record: Option<PolicyRecord>,
) -> Policy {
    let Some(record) = record else {
        return configured;
    };
    let Some(file) = config_file else {
        return record.policy;
    };
    match &record.config {
        Some(seen) if seen.file == absolute(file) => match ConfigSeen::of(file) {
            Some(now) if now.sha256 == seen.sha256 => record.policy,
            // Edited since the record (or gone): the file holds.
            _ => configured,
        },
        _ => {
            let file_time = std::fs::metadata(file).and_then(|m| m.modified()).ok();
            match (file_time, record.modified) {
                (Some(file), Some(record_time)) if file > record_time => configured,
                _ => record.policy,
            }
        }
    }
}

/// Whether two policies say the same.
pub fn same(a: &Policy, b: &Policy) -> bool {
    a.mode() == b.mode() && a.hosts() == b.hosts()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocked(host: &str) -> Policy {
        Policy::new(Mode::Blocklist, &[host.to_string()]).unwrap()
    }

    #[test]
    fn every_write_has_the_next_generation_whatever_its_length_and_time() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert!(store.policy_record().unwrap().is_none());
        assert_eq!(store.policy_generation(), None);
        // Same length, same tick: still two generations.
        assert_eq!(
            store.write_policy_record(&blocked("a.test"), None).unwrap(),
            1
        );
        assert_eq!(
            store.write_policy_record(&blocked("b.test"), None).unwrap(),
            2
        );
        assert_eq!(store.policy_generation(), Some(2));
        let record = store.policy_record().unwrap().unwrap();
        assert_eq!(record.generation, 2);
        assert!(same(&record.policy, &blocked("b.test")));
        assert_eq!(generation_in(dir.path()), Some(2));
    }

    #[test]
    fn a_record_that_would_not_be_read_back_is_never_written() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store
            .write_policy_record(&blocked("kept.test"), None)
            .unwrap();
        let hosts: Vec<String> = (0..85_000).map(|i| format!("h{i}.example.com")).collect();
        let huge = Policy::new(Mode::Blocklist, &hosts).unwrap();
        let e = store.write_policy_record(&huge, None).unwrap_err();
        assert!(e.to_string().contains("85000 hosts"), "{e}");
        let record = store.policy_record().unwrap().unwrap();
        assert!(same(&record.policy, &blocked("kept.test")));
        assert_eq!(record.generation, 1);
    }

    #[test]
    fn the_named_configuration_file_holds_once_its_content_changes_whatever_the_clocks() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let file = dir.path().join("config.toml");
        std::fs::write(&file, "# one\n").unwrap();
        store
            .write_policy_record(&blocked("cdn.test"), Some(&file))
            .unwrap();
        let configured = Policy::allow_all();
        let record = || store.policy_record().unwrap();
        // Unchanged, even stamped later: the record holds.
        let later = SystemTime::now() + std::time::Duration::from_secs(3600);
        set_modified(&file, later);
        assert!(same(
            &effective(configured.clone(), Some(&file), record()),
            &blocked("cdn.test")
        ));
        // Edited, even stamped long before the record: the file holds.
        std::fs::write(&file, "# two\n").unwrap();
        set_modified(&file, SystemTime::UNIX_EPOCH);
        assert!(same(
            &effective(configured.clone(), Some(&file), record()),
            &configured
        ));
        // A configuration in code: the record holds.
        assert!(same(
            &effective(configured, None, record()),
            &blocked("cdn.test")
        ));
    }

    #[test]
    fn another_file_compares_the_file_systems_stamps_not_the_records_word() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store
            .write_policy_record(&blocked("cdn.test"), None)
            .unwrap();
        // A record claiming to be from the far future changes nothing.
        let path = store.policy_record_path();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"set_at\""), "{text}");
        let file = dir.path().join("other.toml");
        std::fs::write(&file, "").unwrap();
        let configured = Policy::allow_all();
        let record_time = store.policy_record().unwrap().unwrap().modified.unwrap();
        set_modified(&file, record_time + std::time::Duration::from_secs(5));
        let record = store.policy_record().unwrap();
        assert!(same(
            &effective(configured.clone(), Some(&file), record.clone()),
            &configured
        ));
        set_modified(&file, record_time - std::time::Duration::from_secs(5));
        assert!(same(
            &effective(configured, Some(&file), record),
            &blocked("cdn.test")
        ));
    }

    #[test]
    fn a_record_from_before_generations_reads_as_generation_zero() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        std::fs::write(
            store.policy_record_path(),
            br#"{"mode":"blocklist","hosts":["old.test"],"set_at_ms":99999999999999,"set_at":"x","pid":1}"#,
        )
        .unwrap();
        let record = store.policy_record().unwrap().unwrap();
        assert_eq!(record.generation, 0);
        assert!(same(&record.policy, &blocked("old.test")));
        assert_eq!(
            store
                .write_policy_record(&blocked("new.test"), None)
                .unwrap(),
            1
        );
    }

    fn set_modified(file: &Path, at: SystemTime) {
        std::fs::File::options()
            .write(true)
            .open(file)
            .unwrap()
            .set_modified(at)
            .unwrap();
    }

    #[test]
    fn a_broken_record_is_an_error_not_an_older_policy() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        std::fs::write(store.policy_record_path(), b"{ nope").unwrap();
        let e = store.policy_record().unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::Config, "{e}");
        assert!(e.to_string().contains("policy.json"), "{e}");
    }
}
