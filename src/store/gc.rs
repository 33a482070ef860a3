//! Files no installed gem declares: finding them, and removing them
//! (`gem-resources gc`).
//!
//! A file is declared when an installed gem's registration names its
//! SHA-256: the same definition an uninstall or an upgrade uses before it
//! deletes a file (the union of every registration's SHA-256s, read with
//! the registry lock held). A `fetch` by hand, an uninstalled gem's file
//! that another process was still downloading, or a partial file of a
//! download that was stopped leave such files behind.
//!
//! [`collect`] holds the registry lock from the moment it reads the
//! registrations until the last file is gone, so an install or upgrade in
//! any process happens wholly before or wholly after it: a file of the old
//! or the new version of a gem being upgraded is declared either way. The
//! locks of every download of a SHA-256 ([`Store::try_lock`]: each lane of
//! each declared size) are taken without waiting before its files are
//! touched: a download in progress (in this or another process) holds one,
//! and its files are kept and reported in use.

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::store::registry::Registry;
use crate::store::{is_sha256, Store};

/// What kind of file an [`Undeclared`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A verified file in `blobs/` (every name of it).
    Stored,
    /// A kept partial file in `tmp/` with its record.
    Partial,
}

/// A stored file or a kept partial file that no installed gem declares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Undeclared {
    /// Its path: the verified file (its first name), or the partial data
    /// file (`tmp/<sha256>.<size>.partial`).
    pub path: PathBuf,
    /// The SHA-256 it holds (or will hold, for a partial file).
    pub sha256: String,
    /// Bytes it takes: one copy of a verified file however many names it
    /// has (hard links); for a partial file, what it holds (the durable
    /// bytes its record claims, else the blocks it occupies, at most its
    /// length; never the length of a file written in parts far apart) with
    /// its record and any other file of its SHA-256 in `tmp/`.
    pub bytes: u64,
    /// Stored or partial.
    pub kind: Kind,
    /// What names it: the stored file's names, or the address a partial
    /// file's bytes came from.
    pub name: String,
    /// Every file it consists of (removed together).
    #[serde(skip)]
    files: Vec<PathBuf>,
}

/// What [`collect`] removed, or would remove.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct GcReport {
    /// Whether nothing was removed (`--dry-run`): `removed` then lists what
    /// would be.
    pub dry_run: bool,
    /// The files removed (or, in a dry run, that would be).
    pub removed: Vec<Undeclared>,
    /// Undeclared files a download holds (in this or another process):
    /// kept.
    pub in_use: Vec<Undeclared>,
}

impl GcReport {
    /// A report of nothing found (a store that does not exist yet).
    pub fn empty(dry_run: bool) -> GcReport {
        GcReport {
            dry_run,
            ..GcReport::default()
        }
    }

    /// Bytes of [`GcReport::removed`].
    pub fn removed_bytes(&self) -> u64 {
        self.removed.iter().map(|u| u.bytes).sum()
    }

    /// Bytes of [`GcReport::in_use`].
    pub fn in_use_bytes(&self) -> u64 {
        self.in_use.iter().map(|u| u.bytes).sum()
    }

    /// How many of [`GcReport::removed`] are of `kind`.
    pub fn removed_of(&self, kind: Kind) -> usize {
        self.removed.iter().filter(|u| u.kind == kind).count()
    }
}

/// The SHA-256s every installed gem declares (the registry as it is now).
pub fn declared(registry: &Registry) -> Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    for reg in registry.list()? {
        out.extend(reg.resources.into_iter().map(|r| r.sha256));
    }
    Ok(out)
}

/// Every stored file and kept partial file of `store` that no installed
/// gem declares, stored files first, each ordered by SHA-256. Takes no
/// lock: a view for `status`, which [`collect`] checks again.
pub fn undeclared(store: &Store, registry: &Registry) -> Result<Vec<Undeclared>> {
    let declared = declared(registry)?;
    let mut out = stored(store, &declared)?;
    out.extend(partials(store, &declared)?);
    Ok(out)
}

/// Removes every stored file and kept partial file that no installed gem
/// declares and no download holds (with `dry_run`, only says which). A
/// file a download holds is kept and reported in
/// [`GcReport::in_use`]. Holds the registry lock throughout (see the
/// module's notes); the file work runs on the runtime's blocking threads.
pub async fn collect(store: &Store, registry: &Registry, dry_run: bool) -> Result<GcReport> {
    let lock = registry.lock().await?;
    let (store, registry) = (store.clone(), registry.clone());
    let root = store.root().to_path_buf();
    crate::store::off_runtime(&root, move || {
        let _lock = lock;
        let mut report = GcReport::empty(dry_run);
        for item in undeclared(&store, &registry)? {
            // Held while the files go: a download that starts now waits.
            let Some(_held) = store.try_lock(&item.sha256)? else {
                report.in_use.push(item);
                continue;
            };
            if !dry_run {
                remove(&store, &item)?;
                if item.kind == Kind::Stored {
                    registry.forget_served_by(&item.sha256);
                }
            }
            report.removed.push(item);
        }
        if !dry_run {
            // Records of files deleted without them (by earlier versions),
            // and the lock files of files no longer stored.
            registry.prune_served(|sha| store.has(sha));
            store.prune_locks();
        }
        Ok(report)
    })
    .await
}

/// Removes the files of `item`; the caller holds the locks of its SHA-256.
fn remove(store: &Store, item: &Undeclared) -> Result<()> {
    match item.kind {
        Kind::Stored => store.remove(&item.sha256),
        Kind::Partial => {
            // Through the handle of `tmp/` the store opened.
            let tmp = store.tmp_folder();
            for file in &item.files {
                let name = file
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default();
                match tmp.remove_file(name) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(Error::io("cannot delete", file, e)),
                }
            }
            Ok(())
        }
    }
}

/// The verified files whose SHA-256 is not in `declared`.
fn stored(store: &Store, declared: &BTreeSet<String>) -> Result<Vec<Undeclared>> {
    let mut out = Vec::new();
    for sha in store.blobs()? {
        if declared.contains(&sha) {
            continue;
        }
        let files = store.blob_files(&sha);
        let Some(first) = files.first().cloned() else {
            continue;
        };
        // Names that are hard links of one file take its bytes once.
        let mut seen: Vec<fs::Metadata> = Vec::new();
        for file in &files {
            if let Ok(meta) = fs::symlink_metadata(file) {
                if !seen.iter().any(|m| crate::platform::same_file(m, &meta)) {
                    seen.push(meta);
                }
            }
        }
        let names: Vec<String> = files
            .iter()
            .filter_map(|f| f.file_name()?.to_str().map(str::to_string))
            .collect();
        out.push(Undeclared {
            path: first,
            sha256: sha,
            bytes: seen.iter().map(fs::Metadata::len).sum(),
            kind: Kind::Stored,
            name: names.join(", "),
            files,
        });
    }
    Ok(out)
}

/// The files of `tmp/` (partial files, their records, temporary copies)
/// whose SHA-256 is not in `declared`, one entry per SHA-256.
fn partials(store: &Store, declared: &BTreeSet<String>) -> Result<Vec<Undeclared>> {
    let folder = store.tmp_folder();
    let tmp = folder.path().to_path_buf();
    let names = folder
        .names()
        .map_err(|e| Error::io("cannot list", &tmp, e))?;
    let mut by_sha: std::collections::BTreeMap<String, Vec<(PathBuf, u64)>> = Default::default();
    for name in names {
        let sha = name.split('.').next().unwrap_or_default();
        if !is_sha256(sha) || declared.contains(sha) {
            continue;
        }
        // The entry itself, never a link followed. A partial data file
        // counts what it holds of the download.
        let held = match super::partial::parse_name(&name) {
            Some((sha, size)) => store.partial(sha, size, 0).held(),
            None => folder
                .own_file_meta(&name)
                .map_or(0, |m| crate::platform::held_bytes(&m)),
        };
        by_sha
            .entry(sha.to_string())
            .or_default()
            .push((folder.join(&name), held));
    }
    let mut out = Vec::new();
    for (sha, mut files) in by_sha {
        files.sort();
        let data = files
            .iter()
            .map(|(p, _)| p)
            .find(|p| p.to_str().is_some_and(|p| p.ends_with(".partial")))
            .or_else(|| files.first().map(|(p, _)| p))
            .cloned()
            .unwrap_or_else(|| tmp.clone());
        let address = data
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(super::partial::parse_name)
            .and_then(|(sha, size)| store.partial(sha, size, 0).read_meta())
            .map(|meta| meta.address)
            .unwrap_or_default();
        out.push(Undeclared {
            path: data,
            sha256: sha,
            bytes: files.iter().map(|(_, n)| n).sum(),
            kind: Kind::Partial,
            name: address,
            files: files.into_iter().map(|(p, _)| p).collect(),
        });
    }
    Ok(out)
}
