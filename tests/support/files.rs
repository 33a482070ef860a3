//! File facts the tests look at that only some platforms tell: a file's
//! identity, its mode and its link count (`None` where unknown, so an
//! assertion on them is skipped there).

use std::fs::Metadata;
use std::path::Path;

/// The device and inode of the file `meta` describes.
pub fn file_id(meta: &Metadata) -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some((meta.dev(), meta.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        None
    }
}

/// The permission bits of the file `meta` describes.
pub fn mode(meta: &Metadata) -> Option<u32> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some(meta.mode())
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        None
    }
}

/// How many names the file `meta` describes has.
pub fn link_count(meta: &Metadata) -> Option<u64> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some(meta.nlink())
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        None
    }
}

/// Sets the permission bits of `path` (Unix; nothing elsewhere).
pub fn set_mode(path: &Path, mode: u32) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    #[cfg(not(unix))]
    let _ = (path, mode);
}
