//! The platform layer's own promises, on whatever OS the tests run.

use std::fs;
use std::path::Path;

use super::FileStamp;

/// The stamp of the file at `path` now.
fn stamp(path: &Path) -> FileStamp {
    let meta = fs::symlink_metadata(path).expect("the file is there");
    FileStamp::of(path, &meta)
}

/// Gives `path` the modification (and, on Windows, creation) time of
/// `like`, so that only identity can tell the two apart.
fn copy_times(path: &Path, like: &Path) {
    let meta = fs::metadata(like).expect("the file is there");
    let times = fs::FileTimes::new().set_modified(meta.modified().expect("a write time"));
    #[cfg(windows)]
    let times = {
        use std::os::windows::fs::FileTimesExt;
        times.set_created(meta.created().expect("a creation time"))
    };
    let file = fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("the file opens");
    file.set_times(times).expect("times are set");
}

#[test]
fn a_file_keeps_its_identity_under_another_name_and_a_new_one_has_its_own() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let (first, moved) = (dir.path().join("a.json"), dir.path().join("b.json"));
    fs::write(&first, b"one").expect("written");
    let id = stamp(&first).identity();
    fs::rename(&first, &moved).expect("renamed");
    assert_eq!(
        stamp(&moved).identity(),
        id,
        "a rename keeps the file's identity"
    );
    fs::write(&first, b"two").expect("written");
    if id.is_some() {
        assert_ne!(
            stamp(&first).identity(),
            id,
            "another file has another identity"
        );
    }
    #[cfg(any(unix, windows))]
    assert!(id.is_some(), "Unix and Windows know a file's identity");
}

#[test]
fn a_replacement_of_the_same_length_and_times_changes_the_stamp() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let (path, next) = (dir.path().join("gem.json"), dir.path().join("gem.json.tmp"));
    fs::write(&path, b"version 1").expect("written");
    let before = stamp(&path);
    assert_eq!(stamp(&path), before, "an unchanged file keeps its stamp");
    fs::write(&next, b"version 2").expect("written");
    copy_times(&next, &path);
    fs::rename(&next, &path).expect("renamed over");
    assert_ne!(
        stamp(&path),
        before,
        "a file renamed over it has another stamp"
    );
    let replaced = stamp(&path);
    fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"!"))
        .expect("appended");
    assert_ne!(stamp(&path), replaced, "a write changes the stamp");
}

#[test]
fn a_folder_of_read_only_files_is_removed() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let blob = dir.path().join("blob");
    fs::create_dir(&blob).expect("created");
    for name in ["model.onnx", "copy.onnx"] {
        let file = fs::File::create(blob.join(name)).expect("created");
        super::make_read_only(&file).expect("made read-only");
    }
    let folder = cap_std::fs::Dir::open_ambient_dir(dir.path(), cap_std::ambient_authority())
        .expect("the folder opens");
    super::remove_folder_at(&folder, Path::new("blob")).expect("removed");
    assert!(!blob.exists());
}

#[test]
fn a_folder_held_as_a_handle_is_synced_through_it() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let handle = cap_std::fs::Dir::open_ambient_dir(dir.path(), cap_std::ambient_authority())
        .expect("the folder opens");
    fs::write(dir.path().join("new"), b"entry").expect("written");
    // On Linux the handle is a path handle, which fsync refuses (EBADF).
    super::sync_dir_at(&handle).expect("the folder is synced");
}
