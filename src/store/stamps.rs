//! The stamp of each verified file (`stamps/<sha256>.json`), recorded when
//! it is published or given another name, and checked before its path is
//! handed out.
//!
//! A stored file changed by hand (made writable, a byte changed, a new
//! modification time) would otherwise be handed out as verified until
//! `verify` read it. A stamp is the file's length, modification time,
//! permissions and the platform's file identity
//! ([`crate::platform::ContentStamp`]); when it no longer matches, the
//! file is hashed again before its path is handed out: the same bytes are
//! stamped again (and made read-only again), other bytes are removed and
//! fetched anew. A file stored before stamps were kept has no record: it
//! is stamped as it is found, as that version trusted it.
//!
//! ```text
//! { "files": { "<file name>": { "len": …, "modified": [s, ns], "mode": …, "identity": [dev, ino] } } }
//! ```
//!
//! Not locked: the last writer wins, and a name whose stamp was lost is
//! only hashed once more.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::platform::ContentStamp;
use crate::store::atomic::{replace, Durability};

/// The longest record read back (a name is at most 200 bytes).
const MAX_RECORD_BYTES: u64 = 256 * 1024;

/// The stamps of one SHA-256's files, by file name.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Record {
    files: BTreeMap<String, ContentStamp>,
}

/// What the record says of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Its stamp is the recorded one.
    Holds,
    /// Its stamp differs, or its name has none while others do.
    Changed,
    /// Nothing is recorded for its SHA-256.
    Unrecorded,
}

/// `store-v1/stamps/<sha256>.json`.
fn record_path(root: &Path, sha256: &str) -> PathBuf {
    root.join("stamps").join(format!("{sha256}.json"))
}

fn read(root: &Path, sha256: &str) -> Option<Record> {
    let bytes = crate::store::trust::read_own(&record_path(root, sha256), MAX_RECORD_BYTES).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The stamp of the file at `path` now, not following a link.
fn stamp_of(path: &Path) -> Option<ContentStamp> {
    let meta = fs::symlink_metadata(path).ok()?;
    Some(ContentStamp::of(path, &meta))
}

/// Whether the file `name` of `sha256`, at `path`, still has its stamp.
pub(crate) fn check(root: &Path, sha256: &str, name: &str, path: &Path) -> Verdict {
    let Some(record) = read(root, sha256) else {
        return Verdict::Unrecorded;
    };
    match (record.files.get(name), stamp_of(path)) {
        (Some(recorded), Some(now)) if *recorded == now => Verdict::Holds,
        _ => Verdict::Changed,
    }
}

/// Records the stamp of the file `name` of `sha256`, at `path`, as it is
/// now. A record that cannot be written is logged: the file is then only
/// hashed once more before its next use.
pub(crate) fn record(root: &Path, sha256: &str, name: &str, path: &Path) {
    let Some(stamp) = stamp_of(path) else {
        return;
    };
    let mut record = read(root, sha256).unwrap_or_default();
    record.files.insert(name.to_string(), stamp);
    // Names whose file is gone say nothing any more.
    let dir = path.parent().unwrap_or(root);
    record
        .files
        .retain(|n, _| n == name || dir.join(n).exists());
    let dir = root.join("stamps");
    let written = crate::store::trust::create_folder(&dir).and_then(|()| {
        let bytes = serde_json::to_vec(&record).unwrap_or_default();
        replace(&record_path(root, sha256), ".", &bytes, Durability::Hint).map_err(Into::into)
    });
    if let Err(e) = written {
        tracing::warn!(sha256, "the stamp of the stored file is not recorded: {e}");
    }
}

/// Removes the record of `sha256` (its files were removed).
pub(crate) fn forget(root: &Path, sha256: &str) {
    let _ = fs::remove_file(record_path(root, sha256));
}
