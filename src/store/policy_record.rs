//! The last network policy set for a store, for every process that uses it.
//!
//! [`crate::Resources::set_policy`] (from the app, the local API or a
//! reload of `serve`'s configuration) writes `<store>/store-v1/policy.json`
//! atomically; every service open on the store reads it when it opens and
//! watches it while it runs, so no process downloads under a policy older
//! than the one last set for its store, whether or not a service listens.
//!
//! Which wins when the configuration file and the record disagree: the
//! newer of the two. A record written after the configuration file was
//! last changed holds; a configuration file changed after the record (the
//! user edited it) holds until the next `set_policy`. A configuration
//! built in code has no file: the record, when there is one, holds.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::net::policy::{Mode, Policy};
use crate::store::atomic::Durability;
use crate::store::{trust, Store};

/// The record's file name in `<store>/store-v1`.
pub const FILE: &str = "policy.json";

/// Longest record read (a policy lists host patterns, not data).
const MAX_BYTES: u64 = 1 << 20;

/// The policy last set for a store, and when.
#[derive(Debug, Clone)]
pub struct PolicyRecord {
    /// The policy.
    pub policy: Policy,
    /// When it was set.
    pub set_at: SystemTime,
    /// The process that set it.
    pub pid: u32,
}

#[derive(Serialize, Deserialize)]
struct Stored {
    mode: Mode,
    hosts: Vec<String>,
    /// Milliseconds since the Unix epoch.
    set_at_ms: u64,
    /// The same instant, for people.
    set_at: String,
    pid: u32,
}

/// What [`Store::policy_stamp`] compares: the record's modification time
/// and length, `None` when there is no record.
pub type Stamp = Option<(SystemTime, u64)>;

impl Store {
    /// `<store>/store-v1/policy.json`.
    pub fn policy_record_path(&self) -> PathBuf {
        self.root().join(FILE)
    }

    /// Writes `policy` as the store's last policy, atomically and durably.
    pub fn write_policy_record(&self, policy: &Policy) -> Result<()> {
        let now = SystemTime::now();
        let ms = now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let stored = Stored {
            mode: policy.mode(),
            hosts: policy.hosts().to_vec(),
            set_at_ms: ms,
            set_at: crate::time::to_rfc3339(now),
            pid: std::process::id(),
        };
        let bytes = serde_json::to_vec_pretty(&stored)
            .map_err(|e| Error::Invalid(format!("cannot write the policy record: {e}")))?;
        // Through the handle of `store-v1/` the store opened.
        self.root_folder()
            .replace(FILE, ".policy.", &bytes, Durability::Full)
            .map_err(|e| Error::io(e.step, &e.path, e.error))
    }

    /// The store's last policy; `None` when none was ever set. A record
    /// that cannot be read or parsed is an error naming the file: a
    /// process must not fall back to an older policy.
    pub fn policy_record(&self) -> Result<Option<PolicyRecord>> {
        let read = self.root_folder().read_own(FILE, MAX_BYTES);
        parse(read, &self.policy_record_path())
    }

    /// A cheap look at the record (no read): changes whenever it is
    /// replaced.
    pub fn policy_stamp(&self) -> Stamp {
        let meta = self.root_folder().entry(FILE).ok()?;
        Some((meta.modified().ok()?.into_std(), meta.len()))
    }
}

/// The last policy set for the store in `store_dir` (the folder the
/// configuration names), read without creating anything.
pub fn read_in(store_dir: &Path) -> Result<Option<PolicyRecord>> {
    read_at(&store_dir.join(crate::store::LAYOUT).join(FILE))
}

fn read_at(path: &Path) -> Result<Option<PolicyRecord>> {
    parse(trust::read_own(path, MAX_BYTES), path)
}

/// The record in `read` (the bytes of `path`, or why they were not read).
fn parse(read: std::io::Result<Vec<u8>>, path: &Path) -> Result<Option<PolicyRecord>> {
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
        set_at: UNIX_EPOCH + Duration::from_millis(stored.set_at_ms),
        pid: stored.pid,
    }))
}

/// The policy a process must use: the record's when it is newer than the
/// configuration file (or the configuration has no file), else the
/// configuration's.
pub fn effective(
    configured: Policy,
    config_file: Option<&Path>,
    record: Option<PolicyRecord>,
) -> Policy {
    let Some(record) = record else {
        return configured;
    };
    let file_time = config_file
        .and_then(|f| std::fs::metadata(f).ok())
        .and_then(|m| m.modified().ok());
    match file_time {
        Some(changed) if changed > record.set_at => configured,
        _ => record.policy,
    }
}

/// Whether two policies say the same.
pub fn same(a: &Policy, b: &Policy) -> bool {
    a.mode() == b.mode() && a.hosts() == b.hosts()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_round_trips_and_the_newer_side_wins() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert!(store.policy_record().unwrap().is_none());
        assert!(store.policy_stamp().is_none());
        let blocked = Policy::new(Mode::Blocklist, &["cdn.test".into()]).unwrap();
        store.write_policy_record(&blocked).unwrap();
        let record = store.policy_record().unwrap().unwrap();
        assert!(same(&record.policy, &blocked));
        assert!(store.policy_stamp().is_some());
        // A configuration in code: the record holds.
        let configured = Policy::allow_all();
        assert!(same(
            &effective(configured.clone(), None, Some(record.clone())),
            &blocked
        ));
        // A configuration file changed after the record holds.
        let file = dir.path().join("config.toml");
        std::fs::write(&file, "").unwrap();
        let later = SystemTime::now() + Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(later)
            .unwrap();
        assert!(same(
            &effective(configured.clone(), Some(&file), Some(record.clone())),
            &configured
        ));
        // One changed before it does not.
        let earlier = record.set_at - Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(earlier)
            .unwrap();
        assert!(same(
            &effective(configured, Some(&file), Some(record)),
            &blocked
        ));
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
