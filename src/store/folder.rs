//! The store's folders as handles, opened and checked once.
//!
//! [`crate::store::Store::open`] checks the store's folders and then holds
//! each one open as a directory handle (`cap-std`'s `Dir`). Every open,
//! rename and removal of a partial file, a lock file, a record beside them
//! or a verified file is made relative to those handles with a name of one
//! component (no separator, no `..`; `cap-std` refuses any way out of the
//! folder as well): a folder renamed away while the store is open, and
//! another tree put at its path, changes nothing the store writes or
//! publishes, which stays in the folders that were checked.
//!
//! A path is still what the store hands to tools (a verified file's
//! path): publication checks that it leads to the very file published, and
//! fails otherwise (see `Store::publish`).

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use cap_std::fs::{Dir, OpenOptions};

use crate::store::atomic::{Durability, ReplaceError};

/// A folder of the store, held open.
#[derive(Debug)]
pub(crate) struct Folder {
    /// Its path when it was opened (for messages, and the paths handed
    /// out).
    path: PathBuf,
    dir: Dir,
}

/// Refuses anything but one plain name of an entry in a folder. A `:`
/// is refused too (on Windows it names a file's alternate stream), on
/// every platform alike: the store names no file with one.
fn one_name(name: &str) -> io::Result<&Path> {
    // Bytes, not chars: every refused character is ASCII, and this runs
    // for every name the store touches.
    let plain = !name.is_empty()
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| matches!(b, b'/' | b'\\' | b'\0' | b':'));
    if plain {
        Ok(Path::new(name))
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a single name in a store folder"),
        ))
    }
}

impl Folder {
    /// Opens the folder at `path` (a symbolic link to it is followed, as
    /// the checks before did).
    pub(crate) fn open_path(path: &Path) -> io::Result<Folder> {
        let dir = Dir::open_ambient_dir(path, cap_std::ambient_authority())?;
        Ok(Folder {
            path: path.to_path_buf(),
            dir,
        })
    }

    /// Opens the folder `name` in this one, not following a symbolic link.
    pub(crate) fn open_sub(&self, name: &str) -> io::Result<Folder> {
        use cap_fs_ext::DirExt as _;
        let dir = self.dir.open_dir_nofollow(one_name(name)?)?;
        Ok(Folder {
            path: self.path.join(name),
            dir,
        })
    }

    /// Creates the folder `name` in this one (`0700` on Unix), unless there
    /// is one.
    pub(crate) fn create_sub(&self, name: &str) -> io::Result<()> {
        match crate::platform::create_private_dir_at(&self.dir, one_name(name)?) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            result => result,
        }
    }

    /// Creates the folder `name` in this one (`0700` on Unix): whether it
    /// did (`false`: there is an entry of that name).
    pub(crate) fn create_new_sub(&self, name: &str) -> io::Result<bool> {
        match crate::platform::create_private_dir_at(&self.dir, one_name(name)?) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The path the folder had when it was opened.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The path of the entry `name` (for messages and paths handed out).
    pub(crate) fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The folder's own metadata, read through the handle.
    pub(crate) fn metadata(&self) -> io::Result<fs::Metadata> {
        self.dir.try_clone()?.into_std_file().metadata()
    }

    /// Whether the folder's path still leads to this folder (it was not
    /// renamed away, nor another put in its place).
    pub(crate) fn still_at_path(&self) -> bool {
        match (self.metadata(), fs::metadata(&self.path)) {
            (Ok(held), Ok(named)) => crate::platform::same_file(&held, &named),
            _ => false,
        }
    }

    /// Opens the entry `name` with `options`, not following a symbolic
    /// link, and checks on the open file that it is a regular file of the
    /// current user (see `trust::open_own`). A file it creates is `0600`.
    pub(crate) fn open_own(&self, name: &str, options: &mut OpenOptions) -> io::Result<File> {
        Ok(self.open_own_meta(name, options)?.0)
    }

    /// [`Folder::open_own`], with the metadata its check read.
    fn open_own_meta(
        &self,
        name: &str,
        options: &mut OpenOptions,
    ) -> io::Result<(File, fs::Metadata)> {
        let file = crate::platform::open_at(&self.dir, one_name(name)?, options)?;
        let meta = crate::store::trust::check_own(&file)?;
        Ok((file, meta))
    }

    /// The metadata of the entry `name`, when it is a regular file of the
    /// current user (opened, never followed).
    pub(crate) fn own_file_meta(&self, name: &str) -> io::Result<fs::Metadata> {
        Ok(self.open_own_meta(name, OpenOptions::new().read(true))?.1)
    }

    /// Reads at most `max` bytes of the entry `name`, opened as
    /// [`Folder::open_own`] does.
    pub(crate) fn read_own(&self, name: &str, max: u64) -> io::Result<Vec<u8>> {
        let (file, meta) = self.open_own_meta(name, OpenOptions::new().read(true))?;
        // Sized from the open file: one read for a small record, not a
        // growing buffer's many.
        let len = meta.len().min(max);
        let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0) + 1);
        file.take(max + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("longer than {max} bytes"),
            ));
        }
        Ok(bytes)
    }

    /// The entry `name` itself (a symbolic link is not followed).
    pub(crate) fn entry(&self, name: &str) -> io::Result<cap_std::fs::Metadata> {
        self.dir.symlink_metadata(one_name(name)?)
    }

    /// Whether the entry `name` is a regular file of the current user.
    pub(crate) fn is_own_file(&self, name: &str) -> bool {
        self.entry(name)
            .is_ok_and(|m| m.is_file() && crate::platform::entry_owned_by_me(&m))
    }

    /// Whether there is an entry `name` that is not a regular file of the
    /// current user (a symbolic link, another user's file, a folder).
    pub(crate) fn is_untrusted(&self, name: &str) -> bool {
        self.entry(name)
            .is_ok_and(|m| !(m.is_file() && crate::platform::entry_owned_by_me(&m)))
    }

    /// Whether the entry `name` is a folder (not a link to one) of the
    /// current user.
    pub(crate) fn is_own_folder(&self, name: &str) -> bool {
        self.entry(name)
            .is_ok_and(|m| m.is_dir() && crate::platform::entry_owned_by_me(&m))
    }

    /// Opens the folder `name` in this one when it is a folder of the
    /// current user (not a link to one).
    pub(crate) fn open_own_sub(&self, name: &str) -> Option<Folder> {
        // Opened without following a link, then checked through the handle:
        // what was opened is what is checked. Where the open alone does not
        // refuse every kind of link, the name is looked at first too.
        if !crate::platform::OPEN_DIR_REFUSES_LINKS && !self.is_own_folder(name) {
            return None;
        }
        let folder = self.open_sub(name).ok()?;
        let meta = folder.metadata().ok()?;
        (meta.is_dir() && crate::platform::owned_by_me(&meta)).then_some(folder)
    }

    /// Whether the entry `name` is the open file `meta` describes.
    pub(crate) fn names_file(&self, name: &str, meta: &fs::Metadata) -> bool {
        self.entry(name)
            .is_ok_and(|m| crate::platform::same_entry(meta, &m))
    }

    /// The names of the entries in the folder (names that are not UTF-8
    /// are left out: the store names nothing so).
    pub(crate) fn names(&self) -> io::Result<Vec<String>> {
        Ok(self
            .dir
            .entries()?
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect())
    }

    /// Removes the file (or link) `name`.
    pub(crate) fn remove_file(&self, name: &str) -> io::Result<()> {
        self.dir.remove_file(one_name(name)?)
    }

    /// Removes the folder `name` and everything in it.
    pub(crate) fn remove_folder(&self, name: &str) -> io::Result<()> {
        crate::platform::remove_folder_at(&self.dir, one_name(name)?)
    }

    /// Renames the entry `name` to `to_name` in the folder `to`, replacing
    /// what is there.
    pub(crate) fn rename_to(&self, name: &str, to: &Folder, to_name: &str) -> io::Result<()> {
        crate::platform::replace_file_at(&self.dir, one_name(name)?, &to.dir, one_name(to_name)?)
    }

    /// Whether this process may create files in the folder.
    pub(crate) fn can_write(&self) -> io::Result<()> {
        crate::platform::can_write_at(&self.dir)
    }

    /// Bytes this user may still write on the folder's file system.
    pub(crate) fn free_space(&self) -> io::Result<u64> {
        crate::platform::free_space_at(&self.dir, &self.path)
    }

    /// Makes the folder's entries durable. A failure is logged, not
    /// returned: some file systems refuse to sync a folder, and what was
    /// verified is published either way.
    pub(crate) fn sync(&self) {
        if let Err(e) = crate::platform::sync_dir_at(&self.dir) {
            tracing::debug!("cannot sync the folder {}: {e}", self.path.display());
        }
    }

    /// Hard-links the file `name` as `to_name` in the folder `to`.
    pub(crate) fn hard_link(&self, name: &str, to: &Folder, to_name: &str) -> io::Result<()> {
        self.dir
            .hard_link(one_name(name)?, &to.dir, one_name(to_name)?)
    }

    /// Creates a new file (`0600`) named `<prefix>…` in the folder, for
    /// reading and writing; returns it and its name.
    pub(crate) fn create_temp(&self, prefix: &str) -> io::Result<(File, String)> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        loop {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let name = format!("{prefix}{:x}{n:x}{nanos:x}.tmp", std::process::id());
            let created = self.open_own(
                &name,
                OpenOptions::new().read(true).write(true).create_new(true),
            );
            match created {
                Ok(file) => return Ok((file, name)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes `bytes` as the whole of the file `name` (created `0600`, or
    /// truncated; a symbolic link is never followed), in place: no
    /// temporary file, no rename. Only for a record that a reader may find
    /// torn without harm (it does not parse and counts as missing) and
    /// that no reader looks at while it is written.
    pub(crate) fn write_in_place(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let mut file = self.open_own(
            name,
            OpenOptions::new().write(true).create(true).truncate(true),
        )?;
        file.write_all(bytes)
    }

    /// Replaces the entry `name` with `bytes` (see `store::atomic`):
    /// written in full to a temporary file `<prefix>…` in this folder, then
    /// renamed over it.
    pub(crate) fn replace(
        &self,
        name: &str,
        prefix: &str,
        bytes: &[u8],
        durability: Durability,
    ) -> Result<(), ReplaceError> {
        let fail = |step, path: PathBuf| move |error| ReplaceError { step, path, error };
        one_name(name).map_err(fail("cannot replace", self.join(name)))?;
        let (mut file, temp) = self
            .create_temp(prefix)
            .map_err(fail("cannot create temporary file in", self.path.clone()))?;
        let written = file.write_all(bytes).and_then(|()| match durability {
            Durability::Hint => Ok(()),
            Durability::Data => file.sync_data(),
            Durability::Full => file.sync_all(),
        });
        drop(file);
        let renamed = written
            .map_err(fail("cannot write", self.join(&temp)))
            .and_then(|()| {
                self.rename_to(&temp, self, name)
                    .map_err(fail("cannot replace", self.join(name)))
            });
        if renamed.is_err() {
            let _ = self.remove_file(&temp);
        }
        renamed?;
        if durability == Durability::Full {
            self.sync();
        }
        Ok(())
    }
}

/// A folder in a held folder, created and opened on first use (a store on
/// a read-only mount, made by an earlier version, may lack it), then held.
#[derive(Debug)]
pub(crate) struct LazySub {
    parent: Arc<Folder>,
    name: &'static str,
    held: OnceLock<Folder>,
}

impl LazySub {
    /// The folder `name` of `parent`, not opened yet.
    pub(crate) fn new(parent: Arc<Folder>, name: &'static str) -> LazySub {
        LazySub {
            parent,
            name,
            held: OnceLock::new(),
        }
    }

    /// The folder, held open: created (`0700`) when missing, opened without
    /// following a symbolic link, and refused (`InvalidData`) when another
    /// user owns it or others can write it.
    pub(crate) fn get(&self) -> io::Result<&Folder> {
        if let Some(folder) = self.held.get() {
            return Ok(folder);
        }
        let folder = match self.parent.open_sub(self.name) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.parent.create_sub(self.name)?;
                self.parent.open_sub(self.name)?
            }
            opened => opened?,
        };
        let meta = folder.metadata()?;
        if !meta.is_dir() || crate::platform::folder_problem(&meta).is_some() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "another user owns it or can write it: the store does not trust it",
            ));
        }
        Ok(self.held.get_or_init(|| folder))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_single_names_are_taken() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("in")).unwrap();
        let folder = Folder::open_path(&dir.path().join("in")).unwrap();
        for bad in [
            "", ".", "..", "../x", "a/b", "a\\b", "a:b", "a\0b", "é/", "ü:x",
        ] {
            assert!(folder.remove_file(bad).is_err(), "{bad:?}");
            assert!(folder.open_sub(bad).is_err(), "{bad:?}");
            let refused = one_name(bad).unwrap_err();
            assert_eq!(refused.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
        for good in ["t00001.bin", "...", ".hidden", "modèle.bin", "データ.bin"] {
            assert_eq!(one_name(good).unwrap(), Path::new(good));
        }
        std::fs::write(dir.path().join("outside"), b"x").unwrap();
        assert!(folder.entry("../outside").is_err());
        assert!(dir.path().join("outside").exists());
    }

    #[test]
    fn a_replacement_leaves_the_new_bytes_and_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let folder = Folder::open_path(dir.path()).unwrap();
        for (bytes, durability) in [
            (&b"old"[..], Durability::Full),
            (b"new", Durability::Data),
            (b"newer", Durability::Hint),
        ] {
            folder
                .replace("record.json", ".", bytes, durability)
                .unwrap();
            assert_eq!(
                std::fs::read(dir.path().join("record.json")).unwrap(),
                bytes
            );
        }
        assert_eq!(folder.names().unwrap(), ["record.json"]);
    }

    #[test]
    fn a_failed_replacement_says_which_step_and_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let folder = Folder::open_path(dir.path()).unwrap();
        let e = folder
            .replace("no-such-folder/record.json", ".", b"x", Durability::Full)
            .unwrap_err();
        assert_eq!(e.step, "cannot replace");
        // A folder where the file should be: the rename fails, nothing is
        // lost, and no temporary file stays.
        let path = dir.path().join("taken");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("kept"), b"kept").unwrap();
        let e = folder
            .replace("taken", ".", b"x", Durability::Full)
            .unwrap_err();
        assert_eq!(e.step, "cannot replace");
        assert_eq!(std::fs::read(path.join("kept")).unwrap(), b"kept");
        assert_eq!(folder.names().unwrap(), ["taken"]);
    }

    #[test]
    fn a_replacement_goes_to_the_folder_opened_even_once_moved() {
        let dir = tempfile::tempdir().unwrap();
        let (first, moved) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir(&first).unwrap();
        let folder = Folder::open_path(&first).unwrap();
        assert!(folder.still_at_path());
        let renamed = std::fs::rename(&first, &moved);
        if renamed.is_err() && crate::platform::HELD_FOLDERS_STAY {
            // A held folder cannot be moved at all here.
            return;
        }
        renamed.unwrap();
        std::fs::create_dir(&first).unwrap();
        assert!(!folder.still_at_path());
        folder
            .replace("r.json", ".", b"new", Durability::Full)
            .unwrap();
        assert_eq!(std::fs::read(moved.join("r.json")).unwrap(), b"new");
        assert_eq!(std::fs::read_dir(&first).unwrap().count(), 0);
        assert_eq!(std::fs::read_dir(&moved).unwrap().count(), 1);
    }
}
