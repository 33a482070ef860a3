//! What the store trusts in its own folders: only what its user made.
//!
//! A store folder another local user can write would let that user plant a
//! symbolic link where a partial file, a record or a verified file is
//! expected (and so make a download write, or `path` return, a file
//! elsewhere), or swap in a file of their own. So:
//! - the store's folders are created `0700` whatever the umask, and at
//!   open a folder owned by someone else or writable by group or others is
//!   refused ([`check_folder_meta`], on the folder's handle: see
//!   `store::folder`);
//! - files the store writes are created `0600`, verified files end `0400`;
//! - every file the store opens is opened through its folder's handle, by
//!   one name, without following a symbolic link (`O_NOFOLLOW`, and
//!   `O_NONBLOCK` so that a FIFO cannot block the open) and then checked on
//!   the open descriptor (`fstat`): a regular file owned by the current
//!   user ([`check_own`]; [`open_own`] by path only reads the policy record
//!   of a store that is not opened, `policy_record::read_in`). Nobody else
//!   can reach it through the checked folders, so its own mode is not
//!   checked.
//!
//! The calls behind this differ by operating system ([`crate::platform`]):
//! elsewhere than on Unix, ownership and modes are left to the operating
//! system, and only symbolic links and other non-regular files are refused.

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::path::Path;

use crate::error::{Error, Result};
use crate::platform::{self, FolderProblem};

/// Creates the folder `path` (and missing parents) for the store: `0700`
/// whatever the umask. A folder that exists is left as it is (and checked
/// by [`check_folder_meta`]).
pub(crate) fn create_folder(path: &Path) -> io::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.exists() {
            platform::private_dir_builder()
                .recursive(true)
                .create(parent)?;
        }
    }
    match platform::private_dir_builder().create(path) {
        Ok(()) => platform::set_private_folder(path),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Refuses a store folder that is not a folder, is owned by another user,
/// or can be written by group or others, with `E_RESOURCE_CONFIG` naming
/// the folder and the fix.
pub(crate) fn check_folder_meta(path: &Path, meta: &Metadata) -> Result<()> {
    if !meta.is_dir() {
        return Err(Error::Config(format!(
            "store folder {} is not a folder: remove it, or choose another store (`store` in config.toml, or --store)",
            path.display()
        )));
    }
    match platform::folder_problem(meta) {
        None => Ok(()),
        Some(FolderProblem::Owner { owner, me }) => Err(Error::Config(format!(
            "store folder {} belongs to user id {owner}, not to the current user (id {me}): another user could change what the store trusts; use a store of your own (`store` in config.toml, or --store), or `chown -R {me} {}`",
            path.display(),
            path.display()
        ))),
        Some(FolderProblem::Writable { mode }) => Err(Error::Config(format!(
            "store folder {} can be written by other users (mode {mode:04o}): another user could plant files the store would trust; run `chmod 700 {}`, or use a store of your own",
            path.display(),
            path.display()
        ))),
    }
}

/// Whether `meta` (of a symbolic link, not followed) is a link of the
/// current user (or root's).
pub(crate) fn is_own_link(meta: &Metadata) -> bool {
    platform::owned_by_me(meta) || platform::owned_by_root(meta)
}

/// Whether `meta` (of an entry, not followed) is a regular file the store
/// can trust: not a symbolic link, and owned by the current user. (Its mode
/// matters less: nobody else can reach it through the store's `0700`
/// folders.)
pub(crate) fn is_own_file(meta: &Metadata) -> bool {
    meta.file_type().is_file() && platform::owned_by_me(meta)
}

/// Opens `path` with `options` without following a symbolic link, and
/// checks on the open file that it is a regular file of the current user
/// ([`is_own_file`]); anything else is an error (`InvalidData`) that names
/// what was found. A file created by this call is `0600`.
pub(crate) fn open_own(path: &Path, options: &mut OpenOptions) -> io::Result<File> {
    let file = platform::open_no_follow(path, options)?;
    check_own(&file)?;
    Ok(file)
}

/// Checks on the open `file` that it is a regular file of the current
/// user ([`is_own_file`]); anything else is an error (`InvalidData`) that
/// names what was found.
pub(crate) fn check_own(file: &File) -> io::Result<std::fs::Metadata> {
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(untrusted("is not a regular file"));
    }
    if !is_own_file(&meta) {
        return Err(untrusted("belongs to another user"));
    }
    Ok(meta)
}

fn untrusted(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{what}: the store does not trust it"),
    )
}

/// Reads at most `max` bytes of the file at `path`, opened as
/// [`open_own`] does; `None` when it is missing, untrusted or longer.
pub(crate) fn read_own(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let file = open_own(path, OpenOptions::new().read(true))?;
    let mut bytes = Vec::new();
    io::Read::read_to_end(&mut io::Read::take(file, max + 1), &mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("longer than {max} bytes"),
        ));
    }
    Ok(bytes)
}

/// Makes `file` a verified file: read-only for its owner only (`0400`).
pub(crate) fn make_blob(file: &File) -> io::Result<()> {
    platform::make_read_only(file)
}
