//! The platform calls where Unix's are missing (Windows): what the
//! standard library offers, and safe answers where it offers nothing.

use std::fs::{self, DirBuilder, File, Metadata, OpenOptions};
use std::io;
use std::path::Path;

use super::FolderProblem;

/// No limit of open files to raise here (Windows has none that a
/// service reaches): `None`.
pub(crate) fn raise_open_files_limit() -> Option<u64> {
    None
}

/// A folder builder (access as the OS gives by default).
pub(crate) fn private_dir_builder() -> DirBuilder {
    DirBuilder::new()
}

/// Nothing to do: access is the OS's default.
pub(crate) fn set_private_folder(_path: &Path) -> io::Result<()> {
    Ok(())
}

/// Nothing is refused: ownership and access are left to the OS.
pub(crate) fn folder_problem(_meta: &Metadata) -> Option<FolderProblem> {
    None
}

/// Every file counts as the current user's.
pub(crate) fn owned_by_me(_meta: &Metadata) -> bool {
    true
}

/// No owners to tell apart here.
pub(crate) fn owned_by_root(_meta: &Metadata) -> bool {
    false
}

/// Opens `path` with `options`, refusing a symbolic link found there.
pub(crate) fn open_no_follow(path: &Path, options: &mut OpenOptions) -> io::Result<File> {
    if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(super::link_refused());
    }
    options.open(path)
}

/// Nothing to do: opening does not wait here.
pub(crate) fn never_wait(_options: &mut OpenOptions) {}

/// Sets the read-only attribute of `file`.
pub(crate) fn make_read_only(file: &File) -> io::Result<()> {
    let mut perms = file.metadata()?.permissions();
    perms.set_readonly(true);
    file.set_permissions(perms)
}

/// What tells the open `file` from every other file on the machine: on
/// Windows its volume's serial number and its file index
/// (`GetFileInformationByHandle`), as Unix's device and inode; elsewhere
/// refused (`Unsupported`), and the caller compares what metadata tell.
pub(crate) fn file_id(file: &File) -> io::Result<(u64, u64)> {
    #[cfg(windows)]
    {
        use std::os::windows::io::AsRawHandle;
        use windows_sys::Win32::Storage::FileSystem::{
            GetFileInformationByHandle, BY_HANDLE_FILE_INFORMATION,
        };
        // SAFETY: a plain C struct for which all-zero is a valid value.
        let mut info: BY_HANDLE_FILE_INFORMATION = unsafe { std::mem::zeroed() };
        // SAFETY: the handle is open while `file` is borrowed, and `info` is
        // a valid, writable struct.
        if unsafe { GetFileInformationByHandle(file.as_raw_handle(), &mut info) } == 0 {
            return Err(io::Error::last_os_error());
        }
        let index = (u64::from(info.nFileIndexHigh) << 32) | u64::from(info.nFileIndexLow);
        Ok((u64::from(info.dwVolumeSerialNumber), index))
    }
    #[cfg(not(windows))]
    {
        let _ = file;
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

/// Whether two metadata describe the same file, as far as they tell.
pub(crate) fn same_file(a: &Metadata, b: &Metadata) -> bool {
    a.len() == b.len() && a.modified().ok() == b.modified().ok()
}

/// One name per file, as far as is known.
pub(crate) fn link_count(_meta: &Metadata) -> u64 {
    1
}

/// Unknown: the length counts.
pub(crate) fn allocated_bytes(_meta: &Metadata) -> Option<u64> {
    None
}

/// What identifies one version of a file: a change of content, a
/// replacement or a rename over it changes the stamp. On Windows, the
/// volume's serial number and the file's index (as Unix's device and
/// inode), its length and its creation, write and change times; elsewhere
/// (or when the file cannot be opened to ask) its length and times only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileStamp(Version);

/// The facts a [`FileStamp`] compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    /// From the open file (Windows' `GetFileInformationByHandle`).
    // Only Windows reads these.
    #[cfg_attr(not(windows), allow(dead_code))]
    Handle {
        volume: u32,
        index: u64,
        len: u64,
        /// Creation, last write and change times (100 ns units).
        times: [i64; 3],
    },
    /// From the metadata alone.
    Metadata {
        len: u64,
        modified: Option<std::time::SystemTime>,
        created: Option<std::time::SystemTime>,
    },
}

impl FileStamp {
    /// The stamp of the file at `path`, which `meta` (read just before,
    /// not following a link) describes.
    pub(crate) fn of(path: &Path, meta: &Metadata) -> FileStamp {
        #[cfg(windows)]
        if let Ok(version) = windows_version(path) {
            return FileStamp(version);
        }
        #[cfg(not(windows))]
        let _ = path;
        FileStamp(Version::Metadata {
            len: meta.len(),
            modified: meta.modified().ok(),
            created: meta.created().ok(),
        })
    }

    /// What tells this file from any other on the machine, when known:
    /// the volume and the file index.
    pub(crate) fn identity(&self) -> Option<(u64, u64)> {
        match self.0 {
            Version::Handle { volume, index, .. } => Some((u64::from(volume), index)),
            Version::Metadata { .. } => None,
        }
    }
}

/// See [`super::ContentStamp`]: length, modification time, the read-only
/// attribute, and the volume and file index where Windows tells them.
pub(crate) fn content_stamp(path: &Path, meta: &Metadata) -> super::ContentStamp {
    super::ContentStamp {
        len: meta.len(),
        modified: super::epoch_parts(meta.modified().ok()),
        mode: if meta.permissions().readonly() {
            0o400
        } else {
            0o600
        },
        identity: FileStamp::of(path, meta).identity(),
    }
}

/// The stamp's facts of the file at `path`, from a handle opened without
/// access to its content (so no share mode of another program refuses
/// it), sharing everything, not following a link.
#[cfg(windows)]
fn windows_version(path: &Path) -> io::Result<Version> {
    use std::os::windows::fs::OpenOptionsExt;
    use std::os::windows::io::AsRawHandle;
    use windows_sys::Win32::Storage::FileSystem::{
        FileBasicInfo, GetFileInformationByHandle, GetFileInformationByHandleEx,
        BY_HANDLE_FILE_INFORMATION, FILE_BASIC_INFO, FILE_FLAG_BACKUP_SEMANTICS,
        FILE_FLAG_OPEN_REPARSE_POINT, FILE_SHARE_DELETE, FILE_SHARE_READ, FILE_SHARE_WRITE,
    };
    let file = OpenOptions::new()
        .access_mode(0)
        .share_mode(FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE)
        .custom_flags(FILE_FLAG_BACKUP_SEMANTICS | FILE_FLAG_OPEN_REPARSE_POINT)
        .open(path)?;
    let handle = file.as_raw_handle();
    // SAFETY: both are plain C structs for which all-zero is a valid value.
    let (mut info, mut basic): (BY_HANDLE_FILE_INFORMATION, FILE_BASIC_INFO) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    // SAFETY: `handle` is open for both calls (`file` lives to the end), and
    // each buffer is a valid, writable struct of the size given.
    let ok = unsafe {
        GetFileInformationByHandle(handle, &mut info) != 0
            && GetFileInformationByHandleEx(
                handle,
                FileBasicInfo,
                (&mut basic as *mut FILE_BASIC_INFO).cast(),
                std::mem::size_of::<FILE_BASIC_INFO>() as u32,
            ) != 0
    };
    if !ok {
        return Err(io::Error::last_os_error());
    }
    let wide = |high: u32, low: u32| (u64::from(high) << 32) | u64::from(low);
    Ok(Version::Handle {
        volume: info.dwVolumeSerialNumber,
        index: wide(info.nFileIndexHigh, info.nFileIndexLow),
        len: wide(info.nFileSizeHigh, info.nFileSizeLow),
        times: [basic.CreationTime, basic.LastWriteTime, basic.ChangeTime],
    })
}

/// Bytes the current user may still write on the volume of `dir`
/// (`GetDiskFreeSpaceExW`, which counts the user's quota).
#[cfg(windows)]
pub(crate) fn free_space(dir: &Path) -> io::Result<u64> {
    use windows_sys::Win32::Storage::FileSystem::GetDiskFreeSpaceExW;
    let wide = wide_path(dir);
    let mut free: u64 = 0;
    // SAFETY: `wide` is a NUL-terminated UTF-16 path that outlives the call,
    // `free` is a valid place for one u64, and the two totals not asked for
    // may be null.
    let ok = unsafe {
        GetDiskFreeSpaceExW(
            wide.as_ptr(),
            &mut free,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(free)
}

/// `path` as a NUL-terminated UTF-16 path for a Windows call: absolute,
/// and in the verbatim form (`\\?\C:\…`, `\\?\UNC\server\…`) when it is
/// long, as std does for its own calls, so a store deeper than `MAX_PATH`
/// (260 characters) works without the system's long-path setting.
#[cfg(windows)]
fn wide_path(path: &Path) -> Vec<u16> {
    use std::os::windows::ffi::OsStrExt;
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let plain: Vec<u16> = absolute.as_os_str().encode_wide().collect();
    let text = |s: &str| s.encode_utf16().collect::<Vec<u16>>();
    let mut wide = if plain.len() < 248 || plain.starts_with(&text("\\\\?\\")) {
        plain
    } else if let Some(unc) = plain.strip_prefix(text("\\\\").as_slice()) {
        [text("\\\\?\\UNC\\").as_slice(), unc].concat()
    } else {
        [text("\\\\?\\").as_slice(), plain.as_slice()].concat()
    };
    wide.push(0);
    wide
}

/// Unknown here: as much as any file needs.
#[cfg(not(windows))]
pub(crate) fn free_space(_dir: &Path) -> io::Result<u64> {
    Ok(u64::MAX)
}

/// How many times [`replace_file_at`] tries a rename that Windows refuses
/// for a while (the destination open elsewhere, a virus scanner or indexer
/// holding the new file).
const RENAME_ATTEMPTS: u32 = 10;

/// Nothing to do (an optimisation only).
pub(crate) fn start_write_back(_file: &File, _from: u64, _len: u64) {}

/// Whether [`start_write_back`] does anything here: no.
pub(crate) const WRITES_BACK: bool = false;

/// Never: a plain copy.
pub(crate) fn reflink(_from: &File, _to: &File) -> bool {
    false
}

/// A folder's name is looked at (not followed) before it is opened: what
/// the open alone refuses here (junctions and other reparse points) is not
/// relied on.
pub(crate) const OPEN_DIR_REFUSES_LINKS: bool = false;

/// A held lock file is never removed: removing a file another process has
/// open is not reliable here (and a locked file cannot be read), so lock
/// files stay, and a holder's description is kept beside its lock file.
pub(crate) const REMOVE_HELD_LOCKS: bool = false;

/// The raw OS errors of a full file system and of a used-up quota (tests
/// make their own): Windows' `ERROR_DISK_FULL` and
/// `ERROR_DISK_QUOTA_EXCEEDED`.
#[cfg(test)]
pub(crate) const DISK_FULL_CODES: [i32; 2] = [112, 1295];

/// Nothing to refuse where the platform has no Unix modes (the folders'
/// own access lists decide).
pub(crate) fn path_problem(_path: &Path) -> Option<(std::path::PathBuf, String)> {
    None
}

/// Whether this process may create files in the folder `dir` (a handle):
/// a probe file created and removed through it (no access call here tells
/// of ACLs and read-only volumes alike).
pub(crate) fn can_write_at(dir: &cap_std::fs::Dir) -> io::Result<()> {
    let probe = format!(".write-probe-{}", std::process::id());
    let mut options = cap_std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    match dir.open_with(&probe, &options) {
        Ok(file) => {
            drop(file);
            let _ = dir.remove_file(&probe);
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Opens the entry `name` of the folder `dir` with `options`, refusing a
/// symbolic link found there.
pub(crate) fn open_at(
    dir: &cap_std::fs::Dir,
    name: &Path,
    options: &mut cap_std::fs::OpenOptions,
) -> io::Result<File> {
    use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
    if dir
        .symlink_metadata(name)
        .is_ok_and(|m| m.file_type().is_symlink())
    {
        return Err(super::link_refused());
    }
    options.follow(FollowSymlinks::No);
    dir.open_with(name, options)
        .map(cap_std::fs::File::into_std)
}

/// Every entry counts as the current user's.
pub(crate) fn entry_owned_by_me(_meta: &cap_std::fs::Metadata) -> bool {
    true
}

/// Creates the folder `name` in `dir` (the OS's default access).
pub(crate) fn create_private_dir_at(dir: &cap_std::fs::Dir, name: &Path) -> io::Result<()> {
    dir.create_dir(name)
}

/// Clears the read-only attribute of the regular file `name` of `dir`, if
/// any.
fn clear_read_only_at(dir: &cap_std::fs::Dir, name: &Path) {
    let Ok(meta) = dir.symlink_metadata(name) else {
        return;
    };
    if meta.is_file() && meta.permissions().readonly() {
        let mut perms = meta.permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        perms.set_readonly(false);
        let _ = dir.set_permissions(name, perms);
    }
}

/// Removes the folder `name` of `dir` and everything in it. Windows
/// deletes a read-only file only where the file system takes POSIX
/// deletion (NTFS on Windows 10 and later; not FAT or exFAT, many network
/// shares, nor Wine): refused there, the read-only attribute of the files
/// in it (not followed links) is cleared and the removal tried again.
pub(crate) fn remove_folder_at(dir: &cap_std::fs::Dir, name: &Path) -> io::Result<()> {
    match dir.remove_dir_all(name) {
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            let inner = dir.open_dir(name)?;
            for entry in inner.entries()?.flatten() {
                clear_read_only_at(&inner, Path::new(&entry.file_name()));
            }
            drop(inner);
            dir.remove_dir_all(name)
        }
        result => result,
    }
}

/// Renames the entry `from` of `from_dir` to `to` in `to_dir`, replacing
/// `to`. Windows cannot replace a file that another program holds open
/// without sharing its deletion, nor a read-only one: the read-only
/// attribute of the file found at `to` is cleared, and a rename refused
/// with `ERROR_ACCESS_DENIED` or `ERROR_SHARING_VIOLATION` is tried again,
/// waiting 10 ms, then twice as long each time (up to 1 s, about 5 s in
/// all). Called on a blocking thread.
pub(crate) fn replace_file_at(
    from_dir: &cap_std::fs::Dir,
    from: &Path,
    to_dir: &cap_std::fs::Dir,
    to: &Path,
) -> io::Result<()> {
    /// `ERROR_ACCESS_DENIED` and `ERROR_SHARING_VIOLATION`.
    const BUSY: [i32; 2] = [5, 32];
    let mut wait = std::time::Duration::from_millis(10);
    let mut attempt = 1;
    loop {
        let result = from_dir.rename(from, to_dir, to);
        let busy = matches!(&result, Err(e) if e.raw_os_error().is_some_and(|c| BUSY.contains(&c)));
        if !busy || attempt == RENAME_ATTEMPTS {
            return result;
        }
        if attempt == 1 {
            clear_read_only_at(to_dir, to);
        } else {
            std::thread::sleep(wait);
            wait = (wait * 2).min(std::time::Duration::from_secs(1));
        }
        attempt += 1;
    }
}

/// Nothing to do.
pub(crate) fn sync_dir_at(_dir: &cap_std::fs::Dir) -> io::Result<()> {
    Ok(())
}

/// Whether `open` (of an open file) and `entry` (of an entry read through
/// a folder handle) describe the same file, as far as they tell.
pub(crate) fn same_entry(open: &Metadata, entry: &cap_std::fs::Metadata) -> bool {
    open.len() == entry.len()
        && open.modified().ok()
            == entry
                .modified()
                .ok()
                .map(cap_std::time::SystemTime::into_std)
}

/// [`free_space`] of the folder `dir`, which `path` names (no call here
/// asks a handle).
pub(crate) fn free_space_at(_dir: &cap_std::fs::Dir, path: &Path) -> io::Result<u64> {
    free_space(path)
}

/// Whether renaming or removing a folder held open as a handle may be
/// refused (tests): Windows may refuse while the handle, opened without
/// delete sharing as `cap-std` opens folders, is open.
#[cfg(test)]
pub(crate) const HELD_FOLDERS_STAY: bool = cfg!(windows);
