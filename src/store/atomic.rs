//! How the store replaces a small file (a registration, a partial file's
//! record, a shared failure, the registry's generation): written in full to
//! a temporary file beside it, then renamed over it, so a reader sees the
//! old bytes or the new ones, never a mix (`Folder::replace`, through the
//! folder's handle). How durable the new bytes must be is the caller's
//! choice ([`Durability`]).

use std::io;
use std::path::PathBuf;

/// How durable a replacement must be before it returns.
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

/// Which step of a replacement failed, on which path.
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
