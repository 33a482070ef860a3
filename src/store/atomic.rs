//! The store's one way to replace a small file (a registration, a partial
//! file's record, a shared failure, the registry's generation): written in
//! full to a temporary file beside it, then renamed over it, so a reader
//! sees the old bytes or the new ones, never a mix. How durable the new
//! bytes must be is the caller's choice ([`Durability`]).

use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// How durable a replacement must be before [`replace`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// Not flushed: a hint for running processes, which a system crash
    /// ends anyway (the registry's generation, a shared failure).
    Hint,
    /// The bytes are on disk before the rename (a partial file's record:
    /// after a crash it may be the old record, never a torn one).
    Data,
    /// The bytes before the rename, and the rename itself (the folder is
    /// fsynced): a registration survives a crash once this returns.
    Full,
}

/// Which step of [`replace`] failed, on which path.
#[derive(Debug)]
pub(crate) struct ReplaceError {
    /// `"cannot create temporary file in"`, `"cannot write"` or
    /// `"cannot replace"`.
    pub(crate) step: &'static str,
    /// The folder, the temporary file or the file replaced.
    pub(crate) path: PathBuf,
    /// What the system said.
    pub(crate) error: io::Error,
}

impl From<ReplaceError> for io::Error {
    fn from(e: ReplaceError) -> io::Error {
        e.error
    }
}

/// Replaces `path` with `bytes` through a temporary file named
/// `<prefix>…` in the same folder (so a cleanup that knows the prefix
/// leaves it alone).
pub(crate) fn replace(
    path: &Path,
    prefix: &str,
    bytes: &[u8],
    durability: Durability,
) -> Result<(), ReplaceError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let fail = |step, path: &Path| {
        let path = path.to_path_buf();
        move |error| ReplaceError { step, path, error }
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(prefix)
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(fail("cannot create temporary file in", dir))?;
    let written = tmp.write_all(bytes).and_then(|()| match durability {
        Durability::Hint => Ok(()),
        Durability::Data => tmp.as_file().sync_data(),
        Durability::Full => tmp.as_file().sync_all(),
    });
    written.map_err(fail("cannot write", tmp.path()))?;
    tmp.persist(path)
        .map_err(|e| fail("cannot replace", path)(e.error))?;
    if durability == Durability::Full {
        crate::platform::sync_dir(dir);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replacement_leaves_the_new_bytes_and_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("record.json");
        for (bytes, durability) in [
            (&b"old"[..], Durability::Full),
            (b"new", Durability::Data),
            (b"newer", Durability::Hint),
        ] {
            replace(&path, ".", bytes, durability).unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), bytes);
        }
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["record.json"]);
    }

    #[test]
    fn a_failed_replacement_says_which_step_and_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-folder").join("record.json");
        let e = replace(&missing, ".", b"x", Durability::Full).unwrap_err();
        assert_eq!(e.step, "cannot create temporary file in");
        // A folder where the file should be: the rename fails, nothing is lost.
        let path = dir.path().join("taken");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("kept"), b"kept").unwrap();
        let e = replace(&path, ".", b"x", Durability::Full).unwrap_err();
        assert_eq!(e.step, "cannot replace");
        assert_eq!(std::fs::read(path.join("kept")).unwrap(), b"kept");
    }
}
