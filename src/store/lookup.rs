//! Where verified files are kept (`blobs/<sha256>/<name>`) and how a
//! lookup finds them: the path handed out, a file found under another
//! name linked or copied here, a changed file hashed again.

use super::*;

impl Store {
    /// Where the verified file for `sha256` is kept under `name`.
    pub fn blob_path(&self, sha256: &str, name: &str) -> PathBuf {
        self.root.join("blobs").join(sha256).join(name)
    }

    /// Returns the verified file for `sha256` named `name`, when the store
    /// has these bytes (under this or another name: another name gets a hard
    /// link, so the tool still sees its own file name). No hashing while a
    /// file's stamp (length, modification time, permissions, identity) is
    /// the one recorded when it was verified; a changed file is hashed
    /// again first, and removed (`None`) when its bytes no longer match.
    ///
    /// Only regular files of the store's user count: a symbolic link or
    /// another user's file planted in `blobs/` is never returned (the bytes
    /// are then missing, and a download replaces the entry).
    ///
    /// When the file system has no hard links, the other name is a copy;
    /// from async code use [`Store::find_off_runtime`], which makes that
    /// copy on a blocking thread.
    pub fn find(&self, sha256: &str, name: &str) -> Result<Option<PathBuf>> {
        // A second look after a changed file was settled: hashed again and
        // stamped, or removed.
        for _ in 0..2 {
            match self.find_present(sha256, name)? {
                Found::Here(dir, name) => return self.hand_out(&dir, &name).map(Some),
                Found::Nothing => return Ok(None),
                Found::Elsewhere(dir, existing) => {
                    return self.link_or_copy(sha256, &dir, name, &existing).map(Some)
                }
                Found::Changed(dir, its_name) => {
                    if !self.settle(sha256, &dir, &its_name)? {
                        // Let go of the folder first: Windows removes no
                        // folder a handle holds.
                        drop(dir);
                        self.remove(sha256)?;
                        return Ok(None);
                    }
                }
            }
        }
        Ok(None)
    }

    /// [`Store::find`] for async code: a copy (no hard links on this file
    /// system) and the hashing of a changed file are done on the runtime's
    /// blocking threads.
    pub async fn find_off_runtime(&self, sha256: &str, name: &str) -> Result<Option<PathBuf>> {
        if let Some(path) = self.find_unchanged(sha256, name)? {
            return Ok(Some(path));
        }
        let (store, sha256, name) = (self.clone(), sha256.to_string(), name.to_string());
        off_runtime(&self.root, move || store.find(&sha256, &name)).await
    }

    /// The verified file of `sha256` named `name` when it is there under
    /// that name with its stamp unchanged: [`Store::find`] without linking,
    /// copying or hashing anything.
    pub(crate) fn find_unchanged(&self, sha256: &str, name: &str) -> Result<Option<PathBuf>> {
        Ok(match self.find_present(sha256, name)? {
            Found::Here(dir, name) => Some(self.hand_out(&dir, &name)?),
            _ => None,
        })
    }

    /// [`Store::find_unchanged`] that also says when the store has nothing
    /// of `sha256` (`Ok(Err(true))`): then [`Store::find`] has nothing to
    /// link, copy or hash, and need not look again.
    pub(crate) fn find_unchanged_or_nothing(
        &self,
        sha256: &str,
        name: &str,
    ) -> Result<std::result::Result<PathBuf, bool>> {
        Ok(match self.find_present(sha256, name)? {
            Found::Here(dir, name) => Ok(self.hand_out(&dir, &name)?),
            Found::Nothing => Err(true),
            _ => Err(false),
        })
    }

    /// `blobs/<sha256>`, held open, when it is a folder of the store's
    /// user.
    fn blob_dir(&self, sha256: &str) -> Option<Folder> {
        self.folders.blobs.open_own_sub(sha256)
    }

    /// The path of the verified file `name` of `dir` (`blobs/<sha256>`), to
    /// hand to a tool: only when the path leads to the very file the
    /// store's handle reaches, never into a folder put in its place.
    pub(super) fn hand_out(&self, dir: &Folder, name: &str) -> Result<PathBuf> {
        let path = dir.join(name);
        let held = dir
            .own_file_meta(name)
            .map_err(|e| Error::io("cannot read", &path, e))?;
        let named = fs::symlink_metadata(&path);
        if named.is_ok_and(|m| crate::platform::same_file(&m, &held)) {
            return Ok(path);
        }
        self.check_in_place(&path)?;
        Err(Error::io(
            "cannot hand out",
            &path,
            io::Error::new(
                io::ErrorKind::InvalidData,
                "its path leads to another file than the verified one",
            ),
        ))
    }

    /// `stamps/`, opened on first use.
    pub(super) fn stamps(&self) -> &LazySub {
        &self.folders.stamps
    }

    /// Where the verified bytes of `sha256` are: under `name`, under
    /// another name only, in a file changed since it was stamped, or
    /// nowhere.
    fn find_present(&self, sha256: &str, name: &str) -> Result<Found> {
        check_sha256(sha256)?;
        let Some(dir) = self.blob_dir(sha256) else {
            return Ok(Found::Nothing);
        };
        let (its_name, here) = if dir.is_own_file(name) {
            (name.to_string(), true)
        } else {
            match own_files(&dir).into_iter().next() {
                Some(existing) => (existing, false),
                None => return Ok(Found::Nothing),
            }
        };
        let holds = match stamps::check(self.stamps(), sha256, &dir, &its_name) {
            stamps::Verdict::Holds => true,
            stamps::Verdict::Unrecorded => {
                // Kept by a version that recorded no stamps: trusted as it
                // was then, and stamped from now on.
                stamps::record(self.stamps(), sha256, &dir, &its_name);
                true
            }
            stamps::Verdict::Changed => false,
        };
        Ok(match (holds, here) {
            (true, true) => Found::Here(dir, its_name),
            (true, false) => Found::Elsewhere(dir, its_name),
            (false, _) => Found::Changed(dir, its_name),
        })
    }

    /// Hashes the stored file `name` of `dir`, whose stamp changed: when it
    /// still holds the bytes of `sha256` it is made read-only again and
    /// stamped (`true`); otherwise (`false`) the caller removes every file
    /// of `sha256`, so the next download fetches them anew.
    fn settle(&self, sha256: &str, dir: &Folder, name: &str) -> Result<bool> {
        use sha2::Digest;
        let path = dir.join(name);
        let map = |e| Error::io("cannot check", &path, e);
        let mut file = dir
            .open_own(name, cap_std::fs::OpenOptions::new().read(true))
            .map_err(map)?;
        let mut hasher = sha2::Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match io::Read::read(&mut file, &mut buf) {
                Ok(0) => break,
                Ok(n) => hasher.update(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(map(e)),
            }
        }
        let actual = hex::encode(hasher.finalize());
        if actual == sha256 {
            trust::make_blob(&file).map_err(map)?;
            stamps::record(self.stamps(), sha256, dir, name);
            return Ok(true);
        }
        tracing::warn!(
            sha256,
            actual = %actual,
            "{} changed since it was verified: removed, to be downloaded again",
            path.display()
        );
        Ok(false)
    }

    /// Gives the verified file `existing` of `sha256` (in `dir`) the name
    /// `name` too: a hard link, else a copy.
    fn link_or_copy(
        &self,
        sha256: &str,
        dir: &Folder,
        name: &str,
        existing: &str,
    ) -> Result<PathBuf> {
        let wanted = dir.join(name);
        // What the name holds afterwards is checked, not assumed: a link
        // planted there (or in place of `existing`) is never handed out.
        match dir.hard_link(existing, dir, name) {
            Ok(()) if dir.is_own_file(name) => {
                stamps::record(self.stamps(), sha256, dir, name);
                return self.hand_out(dir, name);
            }
            Ok(()) => {
                let _ = dir.remove_file(name);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_own_file(name) => {
                return self.hand_out(dir, name)
            }
            Err(_) => {}
        }
        // No hard links on this file system (or an entry the store does not
        // trust in the way): copy, but publish the copy like a download
        // (whole, read-only, renamed into place), so nobody sees a
        // half-copied file.
        let tmp = &self.folders.tmp;
        let (mut copy, temp) = tmp
            .create_temp(&format!("{sha256}.copy."))
            .map_err(|e| Error::io("cannot create temporary file in", tmp.path(), e))?;
        let needed = dir.own_file_meta(existing).map_or(0, |m| m.len());
        let copied = (|| {
            let mut from = dir.open_own(existing, cap_std::fs::OpenOptions::new().read(true))?;
            io::copy(&mut from, &mut copy)?;
            copy.sync_all()?;
            trust::make_blob(&copy)?;
            drop(copy);
            tmp.rename_to(&temp, dir, name)
        })();
        if let Err(e) = copied {
            let _ = tmp.remove_file(&temp);
            return Err(write_failed(
                "cannot copy stored file to",
                &wanted,
                e,
                needed,
            ));
        }
        dir.sync();
        stamps::record(self.stamps(), sha256, dir, name);
        self.hand_out(dir, name)
    }

    /// Whether the store holds the bytes of `sha256` under any name.
    pub fn has(&self, sha256: &str) -> bool {
        self.blob_dir(sha256)
            .is_some_and(|dir| !own_files(&dir).is_empty())
    }

    /// Every SHA-256 the store holds.
    pub fn blobs(&self) -> Result<Vec<String>> {
        let blobs = &self.folders.blobs;
        let names = blobs
            .names()
            .map_err(|e| Error::io("cannot list", blobs.path(), e))?;
        let mut out: Vec<String> = names.into_iter().filter(|n| is_sha256(n)).collect();
        out.sort();
        Ok(out)
    }

    /// The verified files of `sha256` (one per name).
    /// Only regular files of the store's user are listed (see
    /// [`Store::find`]).
    pub fn blob_files(&self, sha256: &str) -> Vec<PathBuf> {
        let Some(dir) = self.blob_dir(sha256) else {
            return Vec::new();
        };
        own_files(&dir).iter().map(|name| dir.join(name)).collect()
    }

    /// Deletes the bytes of `sha256` (every name).
    pub fn remove(&self, sha256: &str) -> Result<()> {
        if !is_sha256(sha256) {
            return Ok(());
        }
        let dir = self.root.join("blobs").join(sha256);
        stamps::forget(self.stamps(), sha256);
        match self.folders.blobs.remove_folder(sha256) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("cannot delete", &dir, e)),
        }
    }
}

/// What [`Store::find_present`] found, in `blobs/<sha256>` (held open).
enum Found {
    /// The file under the name asked for.
    Here(Folder, String),
    /// Only under another name.
    Elsewhere(Folder, String),
    /// In this file (under the name asked for or another), whose stamp
    /// changed since it was verified.
    Changed(Folder, String),
    Nothing,
}

/// The names of the regular files of the store's user in `dir`, sorted;
/// symbolic links and anything else are left out.
fn own_files(dir: &Folder) -> Vec<String> {
    let mut files: Vec<String> = dir
        .names()
        .unwrap_or_default()
        .into_iter()
        // The entry's own type and owner: a symbolic link is not followed.
        .filter(|name| dir.is_own_file(name))
        .collect();
    files.sort();
    files
}
