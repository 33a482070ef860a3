//! The platform calls on Unix: Linux first, and macOS and the BSDs where
//! the same calls exist (the Linux-only ones fall back as elsewhere).

use std::fs::{self, DirBuilder, File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::FolderProblem;

/// Mode of the store's folders.
const FOLDER_MODE: u32 = 0o700;
/// Mode of the files the store writes.
const FILE_MODE: u32 = 0o600;
/// Mode of a verified file.
const READ_ONLY_MODE: u32 = 0o400;

/// Raises the process's soft limit of open files to its hard limit (at
/// most 65,536; macOS also caps it at `OPEN_MAX`, 10,240) and returns the
/// soft limit in force; `None` when it cannot be read.
// `rlim_t` is not `u64` on every Unix.
#[allow(clippy::unnecessary_cast)]
pub(crate) fn raise_open_files_limit() -> Option<u64> {
    // At most 65,536; macOS refuses more than OPEN_MAX.
    #[cfg(target_os = "macos")]
    const CEILING: u64 = 10_240;
    #[cfg(not(target_os = "macos"))]
    const CEILING: u64 = 1 << 16;
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    let hard = limit.rlim_max as u64;
    let want = hard.min(CEILING);
    if (limit.rlim_cur as u64) < want {
        let raised = libc::rlimit {
            rlim_cur: want as libc::rlim_t,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Some(want);
        }
    }
    Some(limit.rlim_cur as u64)
}

/// A folder builder whose folders are `0700` (before the umask).
pub(crate) fn private_dir_builder() -> DirBuilder {
    let mut builder = DirBuilder::new();
    builder.mode(FOLDER_MODE);
    builder
}

/// Sets `0700` on a folder just created (the umask may have taken bits
/// from the owner).
pub(crate) fn set_private_folder(path: &Path) -> io::Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(FOLDER_MODE))
}

/// The effective user id of this process, read once: every check of a
/// store entry asks for it, and a process of the store does not change
/// its user.
fn current_uid() -> u32 {
    static UID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    // SAFETY: geteuid has no preconditions and cannot fail.
    *UID.get_or_init(|| unsafe { libc::geteuid() })
}

/// Why the folder `meta` describes is not safe to trust, if it is not.
pub(crate) fn folder_problem(meta: &Metadata) -> Option<FolderProblem> {
    let me = current_uid();
    if meta.uid() != me {
        return Some(FolderProblem::Owner {
            owner: meta.uid(),
            me,
        });
    }
    let mode = meta.mode() & 0o7777;
    (mode & 0o022 != 0).then_some(FolderProblem::Writable { mode })
}

/// Whether the current user owns what `meta` describes.
pub(crate) fn owned_by_me(meta: &Metadata) -> bool {
    meta.uid() == current_uid()
}

/// Whether root owns the entry `meta` describes.
pub(crate) fn owned_by_root(meta: &Metadata) -> bool {
    meta.uid() == 0
}

/// Opens `path` with `options` without following a symbolic link and
/// without waiting on a FIFO; a file it creates is `0600`.
pub(crate) fn open_no_follow(path: &Path, options: &mut OpenOptions) -> io::Result<File> {
    options
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .mode(FILE_MODE);
    options.open(path).map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => super::link_refused(),
        _ => e,
    })
}

/// Makes opening with `options` never wait (for a FIFO's writer).
pub(crate) fn never_wait(options: &mut OpenOptions) {
    options.custom_flags(libc::O_NONBLOCK);
}

/// Makes `file` read-only for its owner only (`0400`).
pub(crate) fn make_read_only(file: &File) -> io::Result<()> {
    file.set_permissions(fs::Permissions::from_mode(READ_ONLY_MODE))
}

/// What tells the open `file` from every other file on the machine: its
/// device and inode.
pub(crate) fn file_id(file: &File) -> io::Result<(u64, u64)> {
    let meta = file.metadata()?;
    Ok((meta.dev(), meta.ino()))
}

/// Whether two metadata describe the same file.
pub(crate) fn same_file(a: &Metadata, b: &Metadata) -> bool {
    a.dev() == b.dev() && a.ino() == b.ino()
}

/// How many names the file has.
pub(crate) fn link_count(meta: &Metadata) -> u64 {
    meta.nlink()
}

/// The bytes the file really occupies on disk (a sparse file less than
/// its length), when known.
pub(crate) fn allocated_bytes(meta: &Metadata) -> Option<u64> {
    Some(meta.blocks().saturating_mul(512))
}

/// What identifies one version of a file: a change of content, a
/// replacement or a rename over it changes the stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileStamp {
    /// The stamp of the file at `path`, which `meta` (read just before,
    /// not following a link) describes: `meta` tells it all.
    pub(crate) fn of(_path: &Path, meta: &Metadata) -> FileStamp {
        FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// What tells this file from any other on the machine: the device and
    /// the inode.
    #[cfg(test)]
    pub(crate) fn identity(&self) -> Option<(u64, u64)> {
        Some((self.dev, self.ino))
    }
}

/// See [`super::ContentStamp`]: length, modification time, mode, device
/// and inode.
pub(crate) fn content_stamp(_path: &Path, meta: &Metadata) -> super::ContentStamp {
    super::ContentStamp {
        len: meta.len(),
        modified: super::epoch_parts(meta.modified().ok()),
        mode: meta.mode() & 0o7777,
        identity: Some((meta.dev(), meta.ino())),
    }
}

/// Bytes an unprivileged user may still write on the file system of `dir`.
pub(crate) fn free_space(dir: &Path) -> io::Result<u64> {
    let stat = rustix::fs::statvfs(dir).map_err(io::Error::from)?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// Whether [`start_write_back`] does anything here.
pub(crate) const WRITES_BACK: bool = cfg!(target_os = "linux");

/// Asks the kernel to start writing `[from, from + len)` back to disk now,
/// without waiting. Only an optimisation: errors are ignored (the final
/// flush reports real ones).
pub(crate) fn start_write_back(file: &File, from: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(from), Ok(len)) = (i64::try_from(from), i64::try_from(len)) else {
            return;
        };
        // SAFETY: the descriptor is open for the whole call; the call only
        // schedules write-back of the file's own pages.
        unsafe {
            libc::sync_file_range(file.as_raw_fd(), from, len, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, from, len);
}

/// Whether this process may create files in the folder `dir` (a handle),
/// asked of the kernel for the effective user (`faccessat` of `.` with
/// `AT_EACCESS`): a read-only mount says `EROFS`, a folder this user may
/// only read `EACCES`. Nothing is created.
pub(crate) fn can_write_at(dir: &cap_std::fs::Dir) -> io::Result<()> {
    use rustix::fs::{accessat, Access, AtFlags};
    accessat(
        dir,
        ".",
        Access::WRITE_OK | Access::EXEC_OK,
        AtFlags::EACCESS,
    )
    .map_err(io::Error::from)
}

/// Shares `from`'s blocks with the empty `to` (copy-on-write), where the
/// file system can; `false` when a plain copy is needed.
pub(crate) fn reflink(from: &File, to: &File) -> bool {
    #[cfg(target_os = "linux")]
    {
        rustix::fs::ioctl_ficlone(to, from).is_ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (from, to);
        false
    }
}

/// Opening a folder without following links (`O_NOFOLLOW | O_DIRECTORY`)
/// refuses a link and anything that is not a folder by itself: no look at
/// the name is needed first.
pub(crate) const OPEN_DIR_REFUSES_LINKS: bool = true;

/// A lock file may be removed by its holder, and read while another holds
/// it: the next taker checks that the name still leads to the file it
/// locked, and a holder's description is kept in its lock file.
pub(crate) const REMOVE_HELD_LOCKS: bool = true;

/// The raw OS errors of a full file system and of a used-up quota (tests
/// make their own).
#[cfg(test)]
pub(crate) const DISK_FULL_CODES: [i32; 2] = [libc::ENOSPC, libc::EDQUOT];

/// The first place on the way to `path` (an absolute path; itself and each
/// folder above it) that another user could change: a symbolic link owned
/// by someone other than root or the current user, or a folder that group
/// or others may write without the sticky bit (`/tmp`'s `1777` is fine).
/// Root's own and the user's own links (`/var` → `/private/var`) pass.
pub(crate) fn path_problem(path: &Path) -> Option<(std::path::PathBuf, String)> {
    let me = current_uid();
    let mut here = Some(path);
    while let Some(at) = here {
        if let Ok(meta) = fs::symlink_metadata(at) {
            let owner = meta.uid();
            if meta.file_type().is_symlink() {
                if owner != 0 && owner != me {
                    return Some((
                        at.to_path_buf(),
                        format!(
                            "is a symbolic link of user id {owner}, who could point it elsewhere"
                        ),
                    ));
                }
            } else if meta.is_dir() {
                let mode = meta.permissions().mode();
                let sticky = mode & 0o1000 != 0;
                if mode & 0o022 != 0 && !sticky {
                    return Some((
                        at.to_path_buf(),
                        format!("can be written by other users (mode {:04o}) and has no sticky bit: another user could rename what is in it", mode & 0o7777),
                    ));
                }
                if owner != 0 && owner != me {
                    return Some((
                        at.to_path_buf(),
                        format!("belongs to user id {owner}, who could rename what is in it"),
                    ));
                }
            }
        }
        here = at.parent();
    }
    None
}

/// Opens the entry `name` of the folder `dir` with `options`, without
/// following a symbolic link and without waiting on a FIFO; a file it
/// creates is `0600`.
pub(crate) fn open_at(
    dir: &cap_std::fs::Dir,
    name: &Path,
    options: &mut cap_std::fs::OpenOptions,
) -> io::Result<File> {
    use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
    use cap_std::fs::OpenOptionsExt as _;
    options
        .follow(FollowSymlinks::No)
        .custom_flags(libc::O_NONBLOCK)
        .mode(FILE_MODE);
    match dir.open_with(name, options) {
        Ok(file) => Ok(file.into_std()),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Err(super::link_refused()),
        Err(e) => Err(e),
    }
}

/// Whether the current user owns the entry `meta` (read through a folder
/// handle, not following a link) describes.
pub(crate) fn entry_owned_by_me(meta: &cap_std::fs::Metadata) -> bool {
    cap_std::fs::MetadataExt::uid(meta) == current_uid()
}

/// Creates the folder `name` in `dir`, `0700` whatever the umask.
pub(crate) fn create_private_dir_at(dir: &cap_std::fs::Dir, name: &Path) -> io::Result<()> {
    use cap_std::fs::DirBuilderExt as _;
    let mut builder = cap_std::fs::DirBuilder::new();
    builder.mode(FOLDER_MODE);
    dir.create_dir_with(name, &builder)?;
    dir.set_permissions(
        name,
        cap_std::fs::Permissions::from_std(fs::Permissions::from_mode(FOLDER_MODE)),
    )
}

/// Removes the folder `name` of `dir` and everything in it (read-only
/// files too).
pub(crate) fn remove_folder_at(dir: &cap_std::fs::Dir, name: &Path) -> io::Result<()> {
    dir.remove_dir_all(name)
}

/// Renames the entry `from` of `from_dir` to `to` in `to_dir`, replacing
/// `to` (atomic, even when `to` is open).
pub(crate) fn replace_file_at(
    from_dir: &cap_std::fs::Dir,
    from: &Path,
    to_dir: &cap_std::fs::Dir,
    to: &Path,
) -> io::Result<()> {
    from_dir.rename(from, to_dir, to)
}

/// Makes the entries of the folder `dir` (a new or renamed file) durable.
/// The handle is a path handle (`O_PATH`), which `fsync` refuses
/// (`EBADF`): the folder is opened for reading through it (`.`, the very
/// folder, whatever its name leads to now), and that is synced.
pub(crate) fn sync_dir_at(dir: &cap_std::fs::Dir) -> io::Result<()> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let folder = rustix::fs::openat(dir, ".", flags, Mode::empty())?;
    rustix::fs::fsync(&folder)?;
    Ok(())
}

/// Whether `open` (of an open file) and `entry` (of an entry read through
/// a folder handle, not following a link) describe the same file.
pub(crate) fn same_entry(open: &Metadata, entry: &cap_std::fs::Metadata) -> bool {
    use cap_std::fs::MetadataExt as _;
    open.dev() == entry.dev() && open.ino() == entry.ino()
}

/// Bytes an unprivileged user may still write on the file system of the
/// folder `dir` (`fstatvfs` of its handle; `path` names it in messages).
pub(crate) fn free_space_at(dir: &cap_std::fs::Dir, _path: &Path) -> io::Result<u64> {
    let stat = rustix::fs::fstatvfs(dir).map_err(io::Error::from)?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// Whether renaming or removing a folder held open as a handle may be
/// refused (tests): not here, and the handle follows the folder.
#[cfg(test)]
pub(crate) const HELD_FOLDERS_STAY: bool = false;
