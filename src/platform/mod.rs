//! Everything that differs between operating systems, behind one small
//! interface: the rest of the crate never writes `cfg(unix)`.
//!
//! | call | Unix (Linux first) | elsewhere |
//! | --- | --- | --- |
//! | [`private_dir_builder`], [`set_private_folder`] | mode `0700` whatever the umask | the OS's default access |
//! | [`folder_problem`], [`owned_by_me`] | owner and group/other write bits | nothing to refuse |
//! | [`path_problem`] | a link of another user, or a folder others may write without the sticky bit, on the way to the store | nothing to refuse |
//! | [`open_no_follow`] | `O_NOFOLLOW \| O_NONBLOCK \| O_CLOEXEC`, created `0600` | a symbolic link is refused before opening |
//! | [`open_at`], [`entry_owned_by_me`], [`create_private_dir_at`] | the same, relative to a folder handle (`cap-std`'s `Dir`: `openat`, `mkdirat`), the entry's owner | a symbolic link refused, relative to the handle; every entry the user's |
//! | [`never_wait`] | `O_NONBLOCK` (a FIFO cannot block the open) | nothing |
//! | [`make_read_only`] | mode `0400` | the read-only attribute |
//! | [`can_write_at`] | `faccessat(W_OK, AT_EACCESS)` of a folder handle (nothing created) | a probe file created and removed through the handle |
//! | [`same_file`], [`same_entry`], [`link_count`], [`allocated_bytes`], [`held_bytes`], [`FileStamp`] | device and inode, link count, blocks, times to the nanosecond | size and times only |
//! | [`ContentStamp::of`] | length, modification time, mode, device and inode | length, modification time, the read-only attribute, volume and file index (Windows) |
//! | [`free_space`], [`free_space_at`] | `statvfs` (`fstatvfs` of a folder handle) | `GetDiskFreeSpaceExW` on Windows (by path), else unknown (no check) |
//! | [`remove_folder_at`] | `remove_dir_all` relative to a folder handle | the same, clearing the read-only attribute of the files in it and trying again where Windows refuses |
//! | [`replace_file_at`] | `renameat` between folder handles | the rename relative to the handles, clearing the read-only attribute of the file replaced and trying again while Windows says it is in use |
//! | [`sync_dir_at`] | fsync of the folder, through its handle | nothing (renames are durable on NTFS) |
//! | [`start_write_back`] | `sync_file_range` (Linux) | nothing (an optimisation only) |
//! | [`reflink`] | `FICLONE` (Linux) | never: a plain copy |
//! | [`REMOVE_HELD_LOCKS`] | a lock file may be removed by its holder, and read while held (its holder's description is in it) | lock files are never removed; descriptions beside them |
//! | [`OPEN_DIR_REFUSES_LINKS`] | opening a folder without following refuses links by itself | the name is looked at first |
//! | [`raise_open_files_limit`] | the soft `RLIMIT_NOFILE` raised to the hard one (at most 65,536; `OPEN_MAX` on macOS) | no such limit: `None` |
//! | [`local_socket`] | a Unix domain socket, the peer's uid checked (`SO_PEERCRED`, `getpeereid`) | a named pipe for this user only, remote clients rejected (Windows) |
//! | [`process`] | whether a process still runs: a pidfd (Linux), `kill(pid, 0)`, `getppid()` for the parent | a process handle (Windows) |
//! | [`program`] | another program found on a search path (a file with an execute bit) and run for its answer within a deadline | `<name>.exe`, run without a console window (Windows) |
//!
//! What the crate decides with these (which folders and files it trusts,
//! what it says when it refuses one) stays with the caller.

pub(crate) mod local_socket;
pub(crate) mod process;
pub(crate) mod program;

#[cfg(unix)]
mod unix;
#[cfg(unix)]
use unix as imp;

#[cfg(not(unix))]
mod portable;
#[cfg(not(unix))]
use portable as imp;

pub(crate) use imp::{
    allocated_bytes, can_write_at, content_stamp, create_private_dir_at, entry_owned_by_me,
    file_id, folder_problem, free_space, free_space_at, link_count, make_read_only, never_wait,
    open_at, open_no_follow, owned_by_me, owned_by_root, path_problem, private_dir_builder,
    raise_open_files_limit, reflink, remove_folder_at, replace_file_at, same_entry, same_file,
    set_private_folder, start_write_back, sync_dir_at, FileStamp, OPEN_DIR_REFUSES_LINKS,
    REMOVE_HELD_LOCKS, WRITES_BACK,
};

#[cfg(test)]
pub(crate) use imp::{DISK_FULL_CODES, HELD_FOLDERS_STAY};

/// The bytes a file holds: the blocks it occupies on disk, at most its
/// length (a sparse file, written at offsets far apart, holds less than
/// its length says; a small file takes a whole block for fewer bytes);
/// its length where blocks are not known.
pub(crate) fn held_bytes(meta: &std::fs::Metadata) -> u64 {
    let len = meta.len();
    allocated_bytes(meta).map_or(len, |blocks| blocks.min(len))
}

/// What tells whether a verified file was changed since it was stamped:
/// its length, modification time, permissions and the platform's identity
/// of the file. Unlike [`FileStamp`] it leaves out the change time, which
/// a new hard link to the file moves too; it is kept on disk, so it is
/// plain data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct ContentStamp {
    /// Length in bytes.
    pub(crate) len: u64,
    /// Modification time: seconds and nanoseconds since the Unix epoch.
    pub(crate) modified: (i64, u32),
    /// Permission bits (Unix), or `0o400`/`0o600` for the read-only
    /// attribute.
    pub(crate) mode: u32,
    /// Device and inode (Unix), volume and file index (Windows), when known.
    pub(crate) identity: Option<(u64, u64)>,
}

impl ContentStamp {
    /// The stamp of the file at `path`, which `meta` (read just before,
    /// not following a link) describes.
    pub(crate) fn of(path: &std::path::Path, meta: &std::fs::Metadata) -> ContentStamp {
        content_stamp(path, meta)
    }
}

/// Seconds and nanoseconds of `time` since the Unix epoch (negative
/// seconds before it).
fn epoch_parts(time: Option<std::time::SystemTime>) -> (i64, u32) {
    let Some(time) = time else {
        return (0, 0);
    };
    match time.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => (
            i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            d.subsec_nanos(),
        ),
        Err(e) => {
            let d = e.duration();
            (
                -i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                d.subsec_nanos(),
            )
        }
    }
}

/// Why a store folder cannot be trusted ([`folder_problem`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
// Only Unix finds these.
#[cfg_attr(not(unix), allow(dead_code))]
pub(crate) enum FolderProblem {
    /// Another user owns it.
    Owner {
        /// Its owner's user id.
        owner: u32,
        /// The current user's id.
        me: u32,
    },
    /// Group or others may write in it.
    Writable {
        /// Its permission bits.
        mode: u32,
    },
}

/// The error [`open_no_follow`] gives for a symbolic link.
pub(crate) fn link_refused() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        "is a symbolic link: the store does not trust it",
    )
}

#[cfg(test)]
mod tests;
