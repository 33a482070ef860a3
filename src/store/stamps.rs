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
//! The same record says which address served the file (`served`; see
//! [`crate::registry::Registry::served_by`]). A download writes it once,
//! with the stamp of the verified file, before the file takes its name:
//! whoever finds the file published finds its stamp and its source, and a
//! publish costs one record, not two. (Stores of earlier versions kept the
//! source in `served/<sha256>.json`, still read when the record has none.)
//!
//! ```text
//! { "files": { … }, "served": { "served_by": "https://…", "at": "2026-12-03T16:00:00Z" } }
//! ```
//!
//! Not locked: the last writer wins, and a name whose stamp was lost is
//! only hashed once more.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::platform::ContentStamp;
use crate::store::atomic::Durability;
use crate::store::folder::{Folder, LazySub};

/// The longest record read back (a name is at most 200 bytes).
const MAX_RECORD_BYTES: u64 = 256 * 1024;

/// The stamps of one SHA-256's files, by file name, and what served them.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Record {
    files: BTreeMap<String, ContentStamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    served: Option<Served>,
}

/// Which address served a stored file: the address from the manifest (the
/// url or a mirror, as declared, before any redirect) whose bytes were
/// verified and kept, or [`crate::registry::SERVED_BY_IMPORT`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Served {
    /// The address, or `import`.
    pub(crate) served_by: String,
    /// When the file was kept; RFC 3339.
    #[serde(with = "crate::time::rfc3339")]
    pub(crate) at: std::time::SystemTime,
}

/// The longest address recorded, in characters.
const MAX_SERVED_CHARS: usize = 2048;

impl Served {
    /// `served_by` (shortened to [`MAX_SERVED_CHARS`]), now.
    pub(crate) fn now(served_by: &str) -> Served {
        Served {
            served_by: crate::error::shorten_to(served_by, MAX_SERVED_CHARS),
            at: std::time::SystemTime::now(),
        }
    }
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

/// `<sha256>.json`, in `store-v1/stamps/`.
fn record_name(sha256: &str) -> String {
    format!("{sha256}.json")
}

fn read(stamps: &LazySub, sha256: &str) -> Option<Record> {
    let bytes = stamps
        .get()
        .ok()?
        .read_own(&record_name(sha256), MAX_RECORD_BYTES)
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The stamp of the file `name` of `dir` now (a regular file of the
/// store's user, opened through the folder's handle, never followed).
fn stamp_of(dir: &Folder, name: &str) -> Option<ContentStamp> {
    let meta = dir.own_file_meta(name).ok()?;
    Some(ContentStamp::of(&dir.join(name), &meta))
}

/// Whether the file `name` of `sha256`, in `dir` (`blobs/<sha256>`), still
/// has its stamp; the records are in `stamps`.
pub(crate) fn check(stamps: &LazySub, sha256: &str, dir: &Folder, name: &str) -> Verdict {
    let Some(record) = read(stamps, sha256) else {
        return Verdict::Unrecorded;
    };
    match (record.files.get(name), stamp_of(dir, name)) {
        (Some(recorded), Some(now)) if *recorded == now => Verdict::Holds,
        _ => Verdict::Changed,
    }
}

/// Records the stamp of the file `name` of `sha256`, in `dir`, as it is
/// now. A record that cannot be written is logged: the file is then only
/// hashed once more before its next use.
pub(crate) fn record(stamps: &LazySub, sha256: &str, dir: &Folder, name: &str) {
    let Some(stamp) = stamp_of(dir, name) else {
        return;
    };
    record_stamp(stamps, sha256, dir, name, stamp, None);
}

/// Records `stamp` for the file `name` of `sha256`, in `dir`, and what
/// served it when given (else what was recorded stays): written by a
/// publish before the file takes `name`, with the stamp of the verified
/// file (a rename changes none of its facts). A record that cannot be
/// written is logged: the file is then only hashed once more before its
/// next use.
pub(crate) fn record_stamp(
    stamps: &LazySub,
    sha256: &str,
    dir: &Folder,
    name: &str,
    stamp: ContentStamp,
    served: Option<Served>,
) {
    record_new_stamp(stamps, sha256, dir, name, stamp, served, false);
}

/// [`record_stamp`]; `fresh` when `dir` was just made for this file, so
/// no other name of it can be in a record: none is read first.
pub(crate) fn record_new_stamp(
    stamps: &LazySub,
    sha256: &str,
    dir: &Folder,
    name: &str,
    stamp: ContentStamp,
    served: Option<Served>,
    fresh: bool,
) {
    let mut record = if fresh {
        Record::default()
    } else {
        read(stamps, sha256).unwrap_or_default()
    };
    record.files.insert(name.to_string(), stamp);
    // Names whose file is gone say nothing any more.
    record
        .files
        .retain(|n, _| n == name || dir.entry(n).is_ok());
    if served.is_some() {
        record.served = served;
    }
    if fresh {
        // Nobody reads it before the file takes its name, and a torn one
        // only has the file hashed again: written in place.
        write_in_place(stamps, sha256, &record);
    } else {
        write(stamps, sha256, &record);
    }
}

/// [`write`] without a temporary file (see [`Folder::write_in_place`]).
fn write_in_place(stamps: &LazySub, sha256: &str, record: &Record) {
    let bytes = serde_json::to_vec(record).unwrap_or_default();
    let written = stamps
        .get()
        .and_then(|folder| folder.write_in_place(&record_name(sha256), &bytes));
    if let Err(e) = written {
        tracing::warn!(sha256, "the stamp of the stored file is not recorded: {e}");
    }
}

fn write(stamps: &LazySub, sha256: &str, record: &Record) {
    let bytes = serde_json::to_vec(record).unwrap_or_default();
    let written = stamps.get().and_then(|folder| {
        folder
            .replace(&record_name(sha256), ".", &bytes, Durability::Hint)
            .map_err(|e| e.error)
    });
    if let Err(e) = written {
        tracing::warn!(sha256, "the stamp of the stored file is not recorded: {e}");
    }
}

/// What served the stored file of `sha256`, as its record says.
pub(crate) fn served(stamps: &LazySub, sha256: &str) -> Option<Served> {
    read(stamps, sha256)?.served
}

/// Records that `served` served the stored file of `sha256`, keeping its
/// stamps.
pub(crate) fn record_served(stamps: &LazySub, sha256: &str, served: Served) {
    let mut record = read(stamps, sha256).unwrap_or_default();
    record.served = Some(served);
    write(stamps, sha256, &record);
}

/// Forgets what served the file of `sha256`, keeping its stamps (a stamp
/// lost would trust the file as found).
pub(crate) fn forget_served(stamps: &LazySub, sha256: &str) {
    if let Some(mut record) = read(stamps, sha256) {
        if record.served.take().is_some() {
            write(stamps, sha256, &record);
        }
    }
}

/// Removes the record of `sha256` (its files were removed).
pub(crate) fn forget(stamps: &LazySub, sha256: &str) {
    if let Ok(folder) = stamps.get() {
        let _ = folder.remove_file(&record_name(sha256));
    }
}
