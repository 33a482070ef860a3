//! Offline import: a file the user already has, stored as if downloaded.
//!
//! For machines with no network, and for users who already hold the file.
//! The file is hashed (streaming, constant memory) and matched by size and
//! SHA-256 against the resources installed gems declare. A match is copied
//! into the store through the same path as a download: the partial file in
//! `tmp/` (created by `Store::prepare`, which checks free space) in a lane
//! of the file no download holds (an import never waits for a download of
//! the same bytes, which may drip from a hostile gem's address), fsynced,
//! hashed again, then made read-only and renamed into `blobs/`
//! (`Store::publish`).
//!
//! The copy is a reflink (`FICLONE`) where the file system supports it, and
//! a plain copy otherwise; never a hard link, so a later edit of the user's
//! file cannot change the stored bytes. The user's file is only read.
//!
//! The user's file is opened once, without following a symbolic link and
//! without waiting on a FIFO, and must be a regular file; the size, the
//! hash and the copy all come from that one handle, and no more than its
//! size and one byte are ever read from it, so a file renamed over the path
//! (or a link to `/dev/zero`) after the check reaches nothing. A stop (the
//! service's shutdown) ends the copy and removes the partial file before
//! [`Resources::shutdown`] returns.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::manifest::Resource;
use crate::service::Resources;
use crate::store::registry::{Registry, SERVED_BY_IMPORT};
use crate::store::Store;

/// Read buffer for hashing; memory stays constant whatever the file size.
const HASH_BUFFER: usize = 1 << 20;

/// What importing one file did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ImportOutcome {
    /// The bytes were copied into the store.
    Imported {
        /// Their SHA-256.
        sha256: String,
        /// Their size.
        size: u64,
        /// `gem/resource` of every installed resource they satisfy.
        resources: Vec<String>,
        /// Where they are stored now.
        path: PathBuf,
    },
    /// The store already had these bytes; nothing was copied.
    AlreadyPresent {
        /// Their SHA-256.
        sha256: String,
        /// Their size.
        size: u64,
        /// `gem/resource` of every installed resource they satisfy.
        resources: Vec<String>,
    },
    /// No installed gem declares a file of this size and SHA-256.
    NoMatch {
        /// The file's size.
        size: u64,
        /// Its SHA-256; not computed when no declared file has its size.
        sha256: Option<String>,
    },
}

impl Resources {
    /// Imports the file at `path`: when an installed gem declares its size
    /// and SHA-256, copies it into the store (the user's file is left as
    /// it was) and clears the failure records of the resources it
    /// satisfies. Afterwards [`Resources::path`] answers without a request.
    /// Like every call, it can be awaited from any executor, and returns
    /// `E_RESOURCE_SHUTDOWN` after [`Resources::shutdown`].
    pub async fn import(&self, path: &Path) -> Result<ImportOutcome> {
        let (this, path) = (self.clone(), path.to_path_buf());
        self.on_runtime_to_end(async move { this.import_here(&path).await })
            .await
    }

    async fn import_here(&self, path: &Path) -> Result<ImportOutcome> {
        let store = self.store().clone();
        let registry = Registry::new(&store);
        // Shutdown waits for the copy to stop and remove its partial file.
        let _held = self.inner.scheduler.hold_shutdown();
        let stop = self.inner.scheduler.stopping();
        let source = Arc::new(Source::open(path, stop.clone())?);
        let size = source.size;
        if matching(&registry, size, None)?.is_empty() {
            return Ok(ImportOutcome::NoMatch { size, sha256: None });
        }
        let sha256 = crate::store::off_runtime(path, {
            let source = source.clone();
            move || source.hash()
        })
        .await?;
        if matching(&registry, size, Some(&sha256))?.is_empty() {
            return Ok(ImportOutcome::NoMatch {
                size,
                sha256: Some(sha256),
            });
        }
        // A lane of the file's own first, never waiting for a download of
        // it in progress (it may drip from a hostile gem's address: the
        // user's bytes are here now), then the registry lock, so an
        // uninstall cannot drop the declaration between the match and the
        // publication. A download in another lane stops once it finds the
        // published file.
        let lane = import_lane(&store, &sha256, size, &stop).await?;
        let registry_lock = registry.lock().await?;
        let matches = matching(&registry, size, Some(&sha256))?;
        let Some((_, first)) = matches.first() else {
            return Ok(ImportOutcome::NoMatch {
                size,
                sha256: Some(sha256),
            });
        };
        let resources: Vec<String> = matches
            .iter()
            .map(|(gem, r)| format!("{gem}/{}", r.id))
            .collect();
        let outcome = if store.has(&sha256) {
            ImportOutcome::AlreadyPresent {
                sha256: sha256.clone(),
                size,
                resources,
            }
        } else {
            let first = first.clone();
            let stored = crate::store::off_runtime(path, {
                let store = store.clone();
                move || copy_in(&store, &source, &first, lane.lane)
            })
            .await?;
            // Every declared name of these bytes exists from now on.
            for (_, r) in &matches {
                store.find_off_runtime(&sha256, &r.file_name()).await?;
            }
            ImportOutcome::Imported {
                sha256: sha256.clone(),
                size,
                resources,
                path: stored,
            }
        };
        drop(registry_lock);
        drop(lane);
        store.clear_failure(&sha256);
        for (gem, r) in &matches {
            registry.set_failure(gem, &r.id, None).await?;
        }
        Ok(outcome)
    }
}

/// The user's file, opened once: every later step (hash, copy) reads this
/// handle, so renaming another file (or a link to a device) over the path
/// after the check reaches nothing.
struct Source {
    file: File,
    /// Where it was opened, for messages.
    path: PathBuf,
    /// Its length when it was opened; more bytes than this are a change.
    size: u64,
    /// Fires at shutdown (or an interrupt): the reading stops.
    stop: CancellationToken,
}

impl Source {
    /// Opens `path` without following a symbolic link and without waiting
    /// (a FIFO cannot block it), and accepts only a regular file.
    fn open(path: &Path, stop: CancellationToken) -> Result<Source> {
        let mut options = File::options();
        options.read(true);
        crate::platform::never_wait(&mut options);
        let file = crate::platform::open_no_follow(path, &mut options).map_err(|e| {
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
                Error::Invalid(format!(
                    "{} is a symbolic link; import the file it points to",
                    path.display()
                ))
            } else {
                Error::io("cannot open", path, e)
            }
        })?;
        let meta = file
            .metadata()
            .map_err(|e| Error::io("cannot read", path, e))?;
        if !meta.file_type().is_file() {
            return Err(Error::Invalid(format!(
                "{} is not a regular file; import takes the files to store",
                path.display()
            )));
        }
        Ok(Source {
            file,
            path: path.to_path_buf(),
            size: meta.len(),
            stop,
        })
    }

    /// The lowercase hex SHA-256 of the file's first `size` bytes; an
    /// error when it has more or fewer now.
    fn hash(&self) -> Result<String> {
        let (digest, len) = hash_reader(self.read_from_start()?, &self.path, &self.stop)?;
        if len != self.size {
            return Err(changed(&self.path, self.size, len));
        }
        Ok(hex::encode(digest))
    }

    /// The handle read from its start, at most one byte more than `size`
    /// (enough to see that it grew, never more).
    fn read_from_start(&self) -> Result<io::Take<&File>> {
        let mut file = &self.file;
        file.seek(SeekFrom::Start(0))
            .map_err(|e| Error::io("cannot read", &self.path, e))?;
        Ok(file.take(self.size.saturating_add(1)))
    }
}

/// The file at `path` no longer holds what was opened.
fn changed(path: &Path, expected: u64, read: u64) -> Error {
    Error::io(
        "cannot import",
        path,
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("changed while it was imported: {expected} bytes when opened, {read} now"),
        ),
    )
}

/// `(gem, resource)` of every installed resource of `size` bytes (and, when
/// given, that SHA-256).
fn matching(
    registry: &Registry,
    size: u64,
    sha256: Option<&str>,
) -> Result<Vec<(String, Resource)>> {
    Ok(registry
        .list()?
        .into_iter()
        .flat_map(|reg| {
            let gem = reg.gem;
            reg.resources
                .into_iter()
                .filter(|r| r.size == size && sha256.is_none_or(|s| r.sha256 == s))
                .map(move |r| (gem.clone(), r))
        })
        .collect())
}

/// SHA-256 and length of everything `reader` yields; [`Error::Shutdown`]
/// once `stop` fires.
fn hash_reader(
    mut reader: impl Read,
    path: &Path,
    stop: &CancellationToken,
) -> Result<(Vec<u8>, u64)> {
    let mut hasher = Sha256::new();
    let mut len = 0u64;
    each_chunk(&mut reader, path, stop, |chunk| {
        hasher.update(chunk);
        len += chunk.len() as u64;
        Ok(())
    })?;
    Ok((hasher.finalize().to_vec(), len))
}

/// Calls `f` with each chunk `reader` yields, until its end or `stop`.
fn each_chunk(
    reader: &mut impl Read,
    path: &Path,
    stop: &CancellationToken,
    mut f: impl FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let mut buf = vec![0u8; HASH_BUFFER];
    loop {
        if stop.is_cancelled() {
            return Err(Error::Shutdown);
        }
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io("cannot read", path, e)),
        };
        f(&buf[..n])?;
    }
}

/// A lane of the file `sha256`, `size` for an import: lane 0 when no
/// download holds it, else any other free one; only when every lane is
/// held does it wait (for the first to come free), until `stop`.
async fn import_lane(
    store: &Store,
    sha256: &str,
    size: u64,
    stop: &CancellationToken,
) -> Result<crate::store::lanes::LaneLock> {
    let mut pause = std::time::Duration::from_millis(5);
    loop {
        if let Some(lock) = store.try_lock_lane(sha256, size, 0)? {
            return Ok(lock);
        }
        if let Some(lock) = store.try_lock_other_lane(sha256, size, &[])? {
            return Ok(lock);
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = stop.cancelled() => return Err(Error::Shutdown),
        }
        pause = (pause * 2).min(std::time::Duration::from_millis(250));
    }
}

/// Copies `source` into the store as `resource`'s file, in `lane`, and
/// publishes it once the copy's own bytes are verified; the partial file
/// is removed on any failure or a stop. Call with that lane's lock held
/// ([`crate::store::Store::try_lock_lane`]).
fn copy_in(store: &Store, source: &Source, resource: &Resource, lane: u32) -> Result<PathBuf> {
    let grace = crate::store::lanes::DEFAULT_WAIT_FOR_OTHERS;
    let paths = store.prepare(&resource.id, &resource.sha256, resource.size, lane, grace)?;
    // A kept partial download in this lane is replaced by the copy.
    paths.remove();
    let result = copy_and_check(source, &paths, resource);
    match result {
        Ok(()) => store.publish(
            &paths,
            &resource.sha256,
            &resource.file_name(),
            SERVED_BY_IMPORT,
        ),
        Err(e) => {
            paths.remove();
            Err(e)
        }
    }
}

fn copy_and_check(
    source: &Source,
    paths: &crate::store::partial::PartialPaths,
    resource: &Resource,
) -> Result<()> {
    let dest = paths.data.as_path();
    // A new file of the store's user (`0600`), never one found there; this
    // file, and no other put at its name, is what gets published.
    let mut to = paths
        .create_data()
        .map_err(|e| crate::store::write_failed("cannot create", dest, e, resource.size))?;
    let fail = |e| crate::store::write_failed("cannot copy into", dest, e, resource.size);
    if !crate::platform::reflink(&source.file, &to) {
        // Any reflink error (another file system, no support, a partial
        // clone) leaves the copy to do: start from an empty file.
        to.set_len(0).map_err(fail)?;
        let mut from = source.read_from_start()?;
        each_chunk(&mut from, &source.path, &source.stop, |chunk| {
            to.write_all(chunk).map_err(fail)
        })?;
    }
    to.sync_all()
        .map_err(|e| crate::store::write_failed("cannot flush", dest, e, resource.size))?;
    // Verify what the store holds, not what the user's file held: the file
    // may have changed since it was hashed, and the copy may be wrong.
    (&to)
        .seek(SeekFrom::Start(0))
        .map_err(|e| Error::io("cannot read", dest, e))?;
    let copy = (&to).take(resource.size.saturating_add(1));
    let (digest, len) = hash_reader(copy, dest, &source.stop)?;
    let actual = hex::encode(digest);
    if len != resource.size || actual != resource.sha256 {
        return Err(Error::io(
            format!("resource {:?}: the copy of", resource.id),
            &source.path,
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "changed while it was imported: expected {} bytes with SHA-256 {}, copied {len} bytes with SHA-256 {actual}",
                    resource.size, resource.sha256
                ),
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opened(path: &Path) -> Source {
        Source::open(path, CancellationToken::new()).unwrap()
    }

    fn resource(body: &[u8], sha256: String) -> Resource {
        Resource {
            id: "m".into(),
            url: url::Url::parse("https://cdn.test/m.bin").unwrap(),
            mirrors: vec![],
            sha256,
            size: body.len() as u64,
            required: false,
            description: None,
        }
    }

    #[test]
    fn a_copy_whose_bytes_do_not_match_is_not_published() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let source = dir.path().join("m.bin");
        std::fs::write(&source, b"the bytes on disk now").unwrap();
        // What the file held when it was hashed (and what is declared).
        let declared = b"the bytes hashed once";
        let r = resource(declared, hex::encode(Sha256::digest(declared)));
        let err = copy_in(&store, &opened(&source), &r, 0).unwrap_err();
        assert_eq!(err.code(), "E_RESOURCE_IO");
        assert!(
            err.to_string().contains("changed while it was imported"),
            "{err}"
        );
        assert!(!store.has(&r.sha256));
        let left: Vec<_> = std::fs::read_dir(store.root().join("tmp"))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_matching_copy_is_published_read_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let body = b"model weights";
        let source = dir.path().join("m.bin");
        std::fs::write(&source, body).unwrap();
        let r = resource(body, opened(&source).hash().unwrap());
        let path = copy_in(&store, &opened(&source), &r, 0).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), body);
        assert!(std::fs::metadata(&path).unwrap().permissions().readonly());
        assert!(!std::fs::metadata(&source).unwrap().permissions().readonly());
    }
}
