//! Resumable partial files.
//!
//! ```text
//! tmp/<sha256>.<size>.partial        the bytes received so far
//! tmp/<sha256>.<size>.partial.json   where they came from and how many are durable
//! ```
//!
//! The names carry no random part, so the next process (after a crash, a
//! `kill -9`, Ctrl-C or a reset) finds the file by the SHA-256 it wants. The
//! record says which address sent the bytes, the validator that address
//! gave (a strong `ETag`, else `Last-Modified`), and how many bytes were
//! flushed to disk (`fdatasync`) before the record was written: only that
//! prefix is trusted, whatever the file's length says. Whoever touches these
//! files holds the SHA-256's lock ([`crate::store::Store::lock`]).
//!
//! A partial file is never visible at a final path: only a file whose size
//! and digest were verified leaves `tmp/` (`Store::publish`).
//!
//! Both files are opened without following symbolic links and must be
//! regular files of the store's user (see `store::trust`): a link planted
//! at either name is never written through, and a record or data file of
//! another user is never trusted.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

/// The record kept next to a partial file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartialMeta {
    /// The address (url or mirror, as declared) the bytes came from.
    pub address: String,
    /// `ETag` (strong) or `Last-Modified` of that response, sent back as
    /// `If-Range`; without one the bytes are not resumed.
    pub validator: Option<String>,
    /// Bytes flushed to disk before this record was written.
    pub durable: u64,
}

/// Longest validator kept; a longer one is not used.
const MAX_VALIDATOR: usize = 256;
/// Longest record read back.
const MAX_META_BYTES: u64 = 4096;

impl PartialMeta {
    /// Reads a record back from its bytes: `None` for anything malformed,
    /// oversized or with an unusable validator (the partial file is then
    /// started afresh).
    pub fn parse(bytes: &[u8]) -> Option<PartialMeta> {
        if bytes.len() as u64 > MAX_META_BYTES {
            return None;
        }
        let meta: PartialMeta = serde_json::from_slice(bytes).ok()?;
        let address = url::Url::parse(&meta.address).ok()?;
        let validator_ok = meta.validator.as_deref().is_none_or(|v| {
            !v.is_empty()
                && v.len() <= MAX_VALIDATOR
                && v.bytes().all(|b| (0x20..0x7f).contains(&b) || b == b'\t')
        });
        (address.scheme() == "https" && validator_ok).then_some(meta)
    }
}

/// A partial file of one SHA-256 and size, found or created.
#[derive(Debug, Clone)]
pub(crate) struct PartialPaths {
    /// `tmp/<sha256>.<size>.partial`.
    pub data: PathBuf,
    /// `tmp/<sha256>.<size>.partial.json`.
    pub meta: PathBuf,
}

impl PartialPaths {
    pub(crate) fn new(tmp: &Path, sha256: &str, size: u64) -> PartialPaths {
        let data = tmp.join(format!("{sha256}.{size}.partial"));
        let meta = tmp.join(format!("{sha256}.{size}.partial.json"));
        PartialPaths { data, meta }
    }

    /// The kept record, if there is a usable one.
    pub(crate) fn read_meta(&self) -> Option<PartialMeta> {
        let bytes = crate::store::trust::read_own(&self.meta, MAX_META_BYTES).ok()?;
        PartialMeta::parse(&bytes)
    }

    /// How many trusted bytes are kept: the durable length, when the data
    /// file (a regular file of the store's user) really has that many.
    pub(crate) fn kept(&self) -> Option<(PartialMeta, u64)> {
        let meta = self.read_meta()?;
        let data = fs::symlink_metadata(&self.data).ok()?;
        if !crate::store::trust::is_own_file(&data) {
            return None;
        }
        let len = data.len();
        (meta.durable > 0 && meta.durable <= len).then(|| {
            let durable = meta.durable;
            (meta, durable)
        })
    }

    /// Bytes the data file holds beyond its first `kept`, which a download
    /// cuts before it writes (at most what the file takes on disk).
    pub(crate) fn untrusted_tail(&self, kept: u64) -> u64 {
        let Ok(data) = fs::symlink_metadata(&self.data) else {
            return 0;
        };
        if !crate::store::trust::is_own_file(&data) {
            return 0;
        }
        let tail = data.len().saturating_sub(kept);
        tail.min(crate::platform::allocated_bytes(&data).unwrap_or(tail))
    }

    /// Opens (creating, `0600`) the data file for writing; a symbolic link
    /// or a file that is not the store user's is an error, never followed.
    pub(crate) fn open_data(&self) -> io::Result<File> {
        crate::store::trust::open_own(
            &self.data,
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false),
        )
    }

    /// Removes both files.
    pub(crate) fn remove(&self) {
        let _ = fs::remove_file(&self.meta);
        let _ = fs::remove_file(&self.data);
    }
}

/// Writes the record of one partial file each time its writer has flushed.
#[derive(Debug)]
pub(crate) struct Checkpointer {
    path: PathBuf,
    meta: PartialMeta,
}

impl Checkpointer {
    pub(crate) fn new(paths: &PartialPaths, address: &str, validator: Option<String>) -> Self {
        Checkpointer {
            path: paths.meta.clone(),
            meta: PartialMeta {
                address: address.to_string(),
                validator,
                durable: 0,
            },
        }
    }

    /// Whether the bytes could ever be resumed (the server gave a
    /// validator).
    pub(crate) fn resumable(&self) -> bool {
        self.meta.validator.is_some()
    }

    /// Removes the data file: nothing in it can be resumed.
    pub(crate) fn discard(&self) {
        if let Some(data) = self.path.to_str().and_then(|p| p.strip_suffix(".json")) {
            let _ = fs::remove_file(data);
        }
        let _ = fs::remove_file(&self.path);
    }

    /// Records `durable` flushed bytes (atomically: a crash leaves the old
    /// record or the new one).
    pub(crate) fn record(&mut self, durable: u64) -> io::Result<()> {
        self.meta.durable = durable;
        if durable == 0 || self.meta.validator.is_none() {
            // Nothing that could be resumed.
            return match fs::remove_file(&self.path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            };
        }
        let bytes = serde_json::to_vec(&self.meta).map_err(io::Error::other)?;
        // Named after the SHA-256 like the rest, so a cleanup in another
        // process leaves it alone while the lock is held.
        let prefix = match self.path.file_name() {
            Some(name) => format!("{}.tmp.", name.to_string_lossy()),
            None => ".tmp.".into(),
        };
        crate::store::atomic::replace(
            &self.path,
            &prefix,
            &bytes,
            crate::store::atomic::Durability::Data,
        )?;
        Ok(())
    }
}

/// `(sha256, size)` of a partial data file's name.
pub(crate) fn parse_name(name: &str) -> Option<(&str, u64)> {
    let stem = name.strip_suffix(".partial")?;
    let (sha, size) = stem.split_once('.')?;
    // Digits only: `+5` would parse, and name the same file two ways.
    if size.is_empty() || !size.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((sha, size.parse().ok()?))
}

/// Whether a partial file last changed longer than `max_age` ago.
pub(crate) fn older_than(path: &Path, max_age: Duration) -> bool {
    fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_some_and(|age| age > max_age)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_bad_ones_are_refused() {
        let meta = PartialMeta {
            address: "https://cdn.test/a.bin".into(),
            validator: Some("\"abc\"".into()),
            durable: 42,
        };
        let bytes = serde_json::to_vec(&meta).unwrap();
        assert_eq!(PartialMeta::parse(&bytes), Some(meta));
        for bad in [
            &br#"{"address":"http://cdn.test/a","validator":null,"durable":1}"#[..],
            br#"{"address":"https://cdn.test/a","validator":"a\nb","durable":1}"#,
            br#"{"address":"https://cdn.test/a","validator":"","durable":1}"#,
            br#"{"address":"https://cdn.test/a","validator":null,"durable":1,"x":1}"#,
            br#"{"address":"https://cdn.test/a","durable":-1}"#,
            b"not json",
        ] {
            assert_eq!(
                PartialMeta::parse(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn names_parse() {
        let sha = "a".repeat(64);
        assert_eq!(
            parse_name(&format!("{sha}.12.partial")),
            Some((sha.as_str(), 12))
        );
        assert_eq!(parse_name(&format!("{sha}.12.partial.json")), None);
        assert_eq!(parse_name(&format!("{sha}.x.partial")), None);
        assert_eq!(parse_name(&format!("{sha}.+5.partial")), None);
    }
}
