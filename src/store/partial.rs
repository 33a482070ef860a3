//! Resumable partial files.
//!
//! ```text
//! tmp/<sha256>.<size>.partial        the bytes received so far
//! tmp/<sha256>.<size>.partial.json   where they came from and which are durable
//! tmp/<sha256>.<size>.<n>.partial    the same for lane n (see `store::lanes`)
//! ```
//!
//! The names carry no random part, so the next process (after a crash, a
//! `kill -9`, Ctrl-C or a reset) finds the file by the SHA-256 it wants. The
//! record says which address sent the bytes, the validator that address
//! gave (a strong `ETag`, else `Last-Modified`), and which bytes were
//! flushed to disk (`fdatasync`) before the record was written: a prefix
//! (`durable`) and, for a file fetched in ranged parts, the ranges beyond it
//! (`ranges`, `[start, end)` pairs). Only those are trusted, whatever the
//! file's length says, and only when the record is exact: ranges sorted,
//! apart from each other and from the prefix, inside the data file; a
//! record that claims anything else is discarded whole. A record written
//! before ranges existed (a prefix only) reads as a prefix with no ranges.
//! Kept ranges are not trusted for what they hold either: the SHA-256 of
//! the whole file is computed in order, reading them back when the prefix
//! reaches them. Whoever touches these files holds the lock of their lane
//! (the file's SHA-256, size and lane: [`crate::store::Store::try_lock_lane`]).
//!
//! A partial file is never visible at a final path: only a file whose size
//! and digest were verified leaves `tmp/` (`Store::publish`).
//!
//! Both files are opened without following symbolic links and must be
//! regular files of the store's user (see `store::trust`): a link planted
//! at either name is never written through, and a record or data file of
//! another user is never trusted.

use std::fs::{self, File};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::store::folder::Folder;

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
    /// Bytes flushed to disk before this record was written, from the
    /// start: the prefix.
    pub durable: u64,
    /// Ranges beyond the prefix flushed to disk before this record was
    /// written, `[start, end)`, sorted, apart from each other and from the
    /// prefix (absent from records of one stream).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranges: Vec<[u64; 2]>,
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
        let ranges_ok = ranges_exact(meta.durable, &meta.ranges);
        (address.scheme() == "https" && validator_ok && ranges_ok).then_some(meta)
    }

    /// The durable bytes the record claims: the prefix and every range.
    pub fn durable_bytes(&self) -> u64 {
        self.ranges
            .iter()
            .fold(self.durable, |n, [s, e]| n.saturating_add(e - s))
    }

    /// Where the durable bytes end: the last range's end, else the prefix.
    pub fn end(&self) -> u64 {
        self.ranges.last().map_or(self.durable, |r| r[1])
    }
}

/// Whether `ranges` are non-empty, sorted and apart: each starts after the
/// end of the one before (and the first after the prefix `durable`).
fn ranges_exact(durable: u64, ranges: &[[u64; 2]]) -> bool {
    let mut end = durable;
    ranges.iter().all(|&[s, e]| {
        let ok = s > end && e > s;
        end = e;
        ok
    })
}

/// A partial file of one SHA-256 and size, found or created, in the
/// store's `tmp/` folder held open (see `store::folder`): every open,
/// rename and removal of its files goes through that handle.
#[derive(Debug, Clone)]
pub(crate) struct PartialPaths {
    /// `tmp/<sha256>.<size>.partial` (for messages: the file is reached
    /// through the folder's handle).
    pub data: PathBuf,
    /// `tmp/<sha256>.<size>.partial.json` (likewise; tests write it).
    #[cfg(test)]
    pub meta: PathBuf,
    /// `tmp/`, held open.
    folder: Arc<Folder>,
    /// `<sha256>.<size>[.<n>]`.
    key: String,
    /// The file a writer opened through [`PartialPaths::open_data`] (shared
    /// by every clone): publication moves that very file, or nothing.
    written: Arc<std::sync::Mutex<Option<Written>>>,
    /// Whether its record may exist (shared by every clone): not when the
    /// download began with no data file and wrote no record since, so
    /// that removing it is no trip to the disk.
    recorded: Arc<std::sync::atomic::AtomicBool>,
}

/// The file a writer opened: its identity where the platform tells it
/// (device and inode, volume and file index), else its metadata then.
#[derive(Debug)]
enum Written {
    Id((u64, u64)),
    Meta(fs::Metadata),
}

impl PartialPaths {
    /// Lane 0's partial file of `sha256` declared with `size` in the
    /// folder `tmp` (opened for the test).
    #[cfg(test)]
    pub(crate) fn new(tmp: &std::path::Path, sha256: &str, size: u64) -> PartialPaths {
        let folder = Arc::new(Folder::open_path(tmp).expect("the folder opens"));
        PartialPaths::lane(&folder, sha256, size, 0)
    }

    /// The partial file of `lane` of `sha256` declared with `size`.
    pub(crate) fn lane(tmp: &Arc<Folder>, sha256: &str, size: u64, lane: u32) -> PartialPaths {
        let key = crate::store::lanes::lane_key(sha256, size, lane);
        PartialPaths {
            data: tmp.join(&format!("{key}.partial")),
            #[cfg(test)]
            meta: tmp.join(&format!("{key}.partial.json")),
            folder: tmp.clone(),
            key,
            written: Default::default(),
            recorded: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        }
    }

    /// The folder it is in, held open.
    pub(crate) fn folder(&self) -> &Arc<Folder> {
        &self.folder
    }

    /// The data file's name in its folder.
    pub(crate) fn data_name(&self) -> String {
        format!("{}.partial", self.key)
    }

    /// The record's name in its folder.
    pub(crate) fn meta_name(&self) -> String {
        format!("{}.partial.json", self.key)
    }

    /// Whether its record may exist.
    pub(crate) fn may_have_record(&self) -> bool {
        self.recorded.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Says whether its record may exist: not, for a new download (no data
    /// file was found), until a record is written. A record left without
    /// its data file is then left to the cleanup of `tmp/`, and at worst
    /// names bytes that are hashed again before anything is published.
    pub(crate) fn set_recorded(&self, recorded: bool) {
        self.recorded
            .store(recorded, std::sync::atomic::Ordering::SeqCst);
    }

    /// Removes its record, if it may exist.
    pub(crate) fn remove_record(&self) -> io::Result<()> {
        if !self.may_have_record() {
            return Ok(());
        }
        self.folder.remove_file(&self.meta_name())
    }

    /// The data file's metadata, when it is a regular file of the store's
    /// user.
    fn data_meta(&self) -> Option<fs::Metadata> {
        self.folder.own_file_meta(&self.data_name()).ok()
    }

    /// The kept record, if there is a usable one. None is read where none
    /// may exist (a new download that has written none yet).
    pub(crate) fn read_meta(&self) -> Option<PartialMeta> {
        if !self.may_have_record() {
            return None;
        }
        let bytes = self
            .folder
            .read_own(&self.meta_name(), MAX_META_BYTES)
            .ok()?;
        PartialMeta::parse(&bytes)
    }

    /// How many trusted bytes are kept (the prefix and the ranges), when
    /// the data file (a regular file of the store's user) really holds
    /// every byte the record claims.
    pub(crate) fn kept(&self) -> Option<(PartialMeta, u64)> {
        let meta = self.read_meta()?;
        let data = self.data_meta()?;
        let kept = meta.durable_bytes();
        (kept > 0 && meta.end() <= data.len()).then_some((meta, kept))
    }

    /// The bytes of the download the data file holds: the durable bytes its
    /// record claims (the prefix and every range), when the record is
    /// usable; else what the file occupies ([`crate::platform::held_bytes`]).
    /// Never its length alone: a file written in ranged parts, each at its
    /// offset, is as long as its furthest write.
    pub(crate) fn held(&self) -> u64 {
        if let Some((_, kept)) = self.kept() {
            return kept;
        }
        self.data_meta()
            .map_or(0, |data| crate::platform::held_bytes(&data))
    }

    /// Bytes the data file holds beyond its first `kept`, which a download
    /// cuts before it writes (at most what the file takes on disk).
    pub(crate) fn untrusted_tail(&self, kept: u64) -> u64 {
        let Some(data) = self.data_meta() else {
            return 0;
        };
        let tail = data.len().saturating_sub(kept);
        tail.min(crate::platform::allocated_bytes(&data).unwrap_or(tail))
    }

    /// What is at the data file's name, from one look at the entry (a
    /// symbolic link is not followed): whether something the store does
    /// not trust (a symbolic link, another user's file, a folder) is there.
    pub(crate) fn data_entry(&self) -> DataEntry {
        match self.folder.entry(&self.data_name()) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => DataEntry::Missing,
            Ok(m) if !(m.is_file() && crate::platform::entry_owned_by_me(&m)) => {
                DataEntry::Untrusted
            }
            // An entry that cannot be looked at is treated as a file: the
            // open that follows checks it again, and says why it fails.
            _ => DataEntry::Own,
        }
    }

    /// Opens (creating, `0600`) the data file for writing; a symbolic link
    /// or a file that is not the store user's is an error, never followed.
    pub(crate) fn open_data(&self) -> io::Result<File> {
        let file = self.folder.open_own(
            &self.data_name(),
            cap_std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false),
        )?;
        self.claim(&file)?;
        Ok(file)
    }

    /// Creates the data file anew (`0600`; an error when there is one) for
    /// a writer of its own, as `import` is, and makes it the one
    /// publication will move.
    pub(crate) fn create_data(&self) -> io::Result<File> {
        let file = self.folder.open_own(
            &self.data_name(),
            cap_std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true),
        )?;
        self.claim(&file)?;
        Ok(file)
    }

    /// Makes `file` (the data file, opened by a writer) the one
    /// publication will move.
    fn claim(&self, file: &File) -> io::Result<()> {
        let written = match crate::platform::file_id(file) {
            Ok(id) => Written::Id(id),
            Err(_) => Written::Meta(file.metadata()?),
        };
        *self.written.lock().unwrap_or_else(|p| p.into_inner()) = Some(written);
        Ok(())
    }

    /// Whether `file` is the one a writer opened through
    /// [`PartialPaths::open_data`]; `true` when none did.
    pub(crate) fn is_written(&self, file: &File) -> io::Result<bool> {
        let written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        Ok(match &*written {
            None => true,
            Some(Written::Id(id)) => crate::platform::file_id(file)? == *id,
            Some(Written::Meta(meta)) => crate::platform::same_file(&file.metadata()?, meta),
        })
    }

    /// Removes both files.
    pub(crate) fn remove(&self) {
        let _ = self.folder.remove_file(&self.meta_name());
        let _ = self.folder.remove_file(&self.data_name());
    }

    /// Moves both files to `to` (another lane of the same folder); what was
    /// at `to` goes.
    pub(crate) fn move_to(&self, to: &PartialPaths) {
        to.remove();
        let (folder, target) = (&self.folder, &to.folder);
        if folder
            .rename_to(&self.data_name(), target, &to.data_name())
            .is_ok()
        {
            let _ = folder.rename_to(&self.meta_name(), target, &to.meta_name());
        }
    }
}

/// Writes the record of one partial file each time its writer has flushed.
#[derive(Debug)]
pub(crate) struct Checkpointer {
    paths: PartialPaths,
    meta: PartialMeta,
}

impl Checkpointer {
    pub(crate) fn new(paths: &PartialPaths, address: &str, validator: Option<String>) -> Self {
        Checkpointer {
            paths: paths.clone(),
            meta: PartialMeta {
                address: address.to_string(),
                validator,
                durable: 0,
                ranges: Vec::new(),
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
        self.paths.remove();
    }

    /// Records `durable` flushed bytes from the start (atomically: a crash
    /// leaves the old record or the new one).
    pub(crate) fn record(&mut self, durable: u64) -> io::Result<()> {
        self.record_ranges(durable, Vec::new())
    }

    /// Records a flushed prefix of `durable` bytes and flushed `ranges`
    /// beyond it (sorted and apart, as [`PartialMeta::ranges`]).
    pub(crate) fn record_ranges(&mut self, durable: u64, ranges: Vec<[u64; 2]>) -> io::Result<()> {
        if !ranges_exact(durable, &ranges) {
            return Err(io::Error::other("ranges to record overlap or are unsorted"));
        }
        self.meta.durable = durable;
        self.meta.ranges = ranges;
        if self.meta.durable_bytes() == 0 || self.meta.validator.is_none() {
            // Nothing that could be resumed.
            return match self.paths.remove_record() {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            };
        }
        let bytes = serde_json::to_vec(&self.meta).map_err(io::Error::other)?;
        match self.replace(&bytes) {
            Ok(()) => Ok(()),
            Err(e) if crate::error::is_disk_full(&e.error) => {
                self.rewrite_in_place(&bytes, e.error)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Creates the record before any byte is kept (address and validator,
    /// nothing durable, which no reader takes for kept bytes), so that a
    /// disk that fills before the first checkpoint still has the record's
    /// blocks to write the kept bytes into ([`Checkpointer::record_ranges`]).
    pub(crate) fn reserve(&mut self) -> io::Result<()> {
        self.meta.durable = 0;
        self.meta.ranges = Vec::new();
        if self.meta.validator.is_none() {
            return self.record(0);
        }
        let bytes = serde_json::to_vec(&self.meta).map_err(io::Error::other)?;
        self.replace(&bytes)?;
        Ok(())
    }

    /// Replaces the record with `bytes`, flushed, through a temporary file
    /// named after the SHA-256 like the rest, so a cleanup in another
    /// process leaves it alone while the lock is held.
    fn replace(&self, bytes: &[u8]) -> Result<(), crate::store::atomic::ReplaceError> {
        let name = self.paths.meta_name();
        let prefix = format!("{name}.tmp.");
        let durability = crate::store::atomic::Durability::Data;
        self.paths.set_recorded(true);
        self.paths.folder.replace(&name, &prefix, bytes, durability)
    }

    /// A full disk has no room for a new record: the existing one is
    /// rewritten where it is. Safe even if a crash tears it: a torn record
    /// does not parse (the file starts afresh), and the kept bytes a record
    /// names are hashed again before anything is published.
    fn rewrite_in_place(&self, bytes: &[u8], full: io::Error) -> io::Result<()> {
        let name = self.paths.meta_name();
        let Ok(mut file) = self
            .paths
            .folder
            .open_own(&name, cap_std::fs::OpenOptions::new().write(true))
        else {
            return Err(full);
        };
        std::io::Write::write_all(&mut file, bytes)?;
        file.set_len(bytes.len() as u64)?;
        file.sync_data()
    }
}

/// What [`PartialPaths::data_entry`] found at the data file's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DataEntry {
    /// Nothing: a new download.
    Missing,
    /// A regular file of the store's user (or an entry that could not be
    /// looked at: the open checks it).
    Own,
    /// Something the store does not trust (a link, another user's file, a
    /// folder).
    Untrusted,
}

/// `(sha256, size)` of a partial data file's name.
pub(crate) fn parse_name(name: &str) -> Option<(&str, u64)> {
    parse_lane_name(name).map(|(sha, size, _)| (sha, size))
}

/// `(sha256, size, lane)` of a partial data file's name
/// (`<sha256>.<size>.partial`: lane 0; `<sha256>.<size>.<n>.partial`).
pub(crate) fn parse_lane_name(name: &str) -> Option<(&str, u64, u32)> {
    parse_key(name.strip_suffix(".partial")?)
}

/// `(sha256, size, lane)` of a lane key (see [`crate::store::lanes::lane_key`]).
pub(crate) fn parse_key(key: &str) -> Option<(&str, u64, u32)> {
    let (sha, rest) = key.split_once('.')?;
    let (size, lane) = match rest.split_once('.') {
        Some((size, lane)) => (size, Some(lane)),
        None => (rest, None),
    };
    let lane = match lane {
        None => 0,
        // Lane 0 has one name only.
        Some(lane) if digits(lane) && !lane.starts_with('0') => lane.parse().ok()?,
        Some(_) => return None,
    };
    if lane >= crate::store::lanes::LANES {
        return None;
    }
    // Digits only: `+5` would parse, and name the same file two ways.
    if !digits(size) || (size.len() > 1 && size.starts_with('0')) {
        return None;
    }
    Some((sha, size.parse().ok()?, lane))
}

fn digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// Whether the entry `name` of `folder` last changed longer than `max_age`
/// ago.
pub(crate) fn older_than(folder: &Folder, name: &str, max_age: Duration) -> bool {
    folder
        .entry(name)
        .and_then(|m| m.modified())
        .map(cap_std::time::SystemTime::into_std)
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
            ranges: vec![[100, 200], [300, 301]],
        };
        let bytes = serde_json::to_vec(&meta).unwrap();
        assert_eq!(PartialMeta::parse(&bytes), Some(meta.clone()));
        assert_eq!(meta.durable_bytes(), 42 + 100 + 1);
        // A record of a prefix only, as written before ranges existed.
        let old = br#"{"address":"https://cdn.test/a","validator":"\"v\"","durable":7}"#;
        let old = PartialMeta::parse(old).expect("an old record still reads");
        assert_eq!((old.durable, old.ranges.len()), (7, 0));
        for bad in [
            &br#"{"address":"http://cdn.test/a","validator":null,"durable":1}"#[..],
            br#"{"address":"https://cdn.test/a","validator":"a\nb","durable":1}"#,
            br#"{"address":"https://cdn.test/a","validator":"","durable":1}"#,
            br#"{"address":"https://cdn.test/a","validator":null,"durable":1,"x":1}"#,
            br#"{"address":"https://cdn.test/a","durable":-1}"#,
            // Ranges that touch the prefix, overlap, are unsorted, empty
            // or reversed.
            br#"{"address":"https://cdn.test/a","validator":null,"durable":10,"ranges":[[10,20]]}"#,
            br#"{"address":"https://cdn.test/a","validator":null,"durable":0,"ranges":[[5,20],[15,30]]}"#,
            br#"{"address":"https://cdn.test/a","validator":null,"durable":0,"ranges":[[50,60],[5,20]]}"#,
            br#"{"address":"https://cdn.test/a","validator":null,"durable":0,"ranges":[[5,5]]}"#,
            br#"{"address":"https://cdn.test/a","validator":null,"durable":0,"ranges":[[9,5]]}"#,
            br#"{"address":"https://cdn.test/a","validator":null,"durable":0,"ranges":[[5]]}"#,
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
    fn kept_ranges_must_lie_inside_the_data_file() {
        let dir = tempfile::tempdir().unwrap();
        let paths = PartialPaths::new(dir.path(), &"a".repeat(64), 1000);
        std::fs::write(&paths.data, vec![1u8; 500]).unwrap();
        let mut c = Checkpointer::new(&paths, "https://cdn.test/a", Some("\"v\"".into()));
        c.record_ranges(0, vec![[100, 200], [300, 500]]).unwrap();
        let (meta, kept) = paths.kept().expect("inside the file");
        assert_eq!((meta.durable, kept), (0, 300));
        c.record_ranges(10, vec![[100, 200], [300, 501]]).unwrap();
        assert!(paths.kept().is_none(), "one byte past the data file");
        assert!(c.record_ranges(10, vec![[300, 400], [100, 200]]).is_err());
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
        assert_eq!(
            parse_lane_name(&format!("{sha}.12.3.partial")),
            Some((sha.as_str(), 12, 3))
        );
        for bad in ["12.0", "12.03", "12.99", "012", "12.x", "12.3.4"] {
            assert_eq!(
                parse_lane_name(&format!("{sha}.{bad}.partial")),
                None,
                "{bad}"
            );
        }
    }
}
