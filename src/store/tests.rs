use super::*;
use std::time::Duration;

#[test]
fn a_look_that_found_the_store_writable_stands_for_a_moment_and_a_refusal_never() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert!(!store.known_writable(), "nothing was looked at yet");
    store.check_writable("r (r.bin)").unwrap();
    assert!(store.known_writable());
    // Another handle on the same store shares the look.
    assert!(store.clone().known_writable());
    // Once the moment has passed, the next download looks again.
    *store.writable_at() = Some(std::time::Instant::now() - WRITABLE_FOR);
    assert!(!store.known_writable());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let tmp = store.root().join("tmp");
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o500)).unwrap();
        // Root may write anyway: then the look finds the store writable.
        let refused = store.check_writable("r (r.bin)");
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o700)).unwrap();
        if let Err(e) = refused {
            assert!(e.to_string().contains("the store is read-only"), "{e}");
            assert!(
                !store.known_writable(),
                "a refusal is not remembered as writable"
            );
        }
    }
}

#[test]
fn the_untrusted_tail_of_a_kept_partial_file_counts_as_free_space() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let sha = "d".repeat(64);
    let size = 4u64 << 20;
    let paths = store.partial(&sha, size, 0);
    // 3 MiB on disk, of which only the first 1 MiB was flushed and
    // recorded: 3 MiB are still to be written, 2 MiB of them in the
    // space the tail takes now.
    fs::write(&paths.data, vec![7u8; 3 << 20]).unwrap();
    let record = serde_json::json!({
        "address": "https://cdn.test/a",
        "validator": "\"v1\"",
        "durable": 1 << 20,
    });
    fs::write(&paths.meta, record.to_string()).unwrap();
    space::FREE.set(Some((1 << 20) + 4096));
    let prepared = store.prepare("r", &sha, size, 0, Duration::ZERO);
    space::FREE.set(None);
    assert!(prepared.is_ok(), "{:?}", prepared.err());
    // Without the tail, 1 MiB free is short of the 3 MiB needed.
    space::FREE.set(Some(1 << 20));
    fs::write(&paths.data, vec![7u8; 1 << 20]).unwrap();
    let refused = store
        .prepare("r", &sha, size, 0, Duration::ZERO)
        .unwrap_err();
    space::FREE.set(None);
    assert_eq!(refused.code(), "E_RESOURCE_DISK_SPACE");
    assert!(
        refused
            .to_string()
            .contains("needs 3.0 MiB but only 1.0 MiB are free"),
        "{refused}"
    );
}

#[test]
fn only_the_file_that_was_written_is_published() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let sha = "d".repeat(64);
    let body = vec![7u8; 4096];
    let paths = store
        .prepare("r", &sha, body.len() as u64, 0, Duration::ZERO)
        .unwrap();
    {
        use std::io::Write;
        let mut file = paths.open_data().unwrap();
        file.write_all(&body).unwrap();
    }
    // Another file of the store's user put over the partial file's name
    // after the writer had written (and hashed) its own.
    let planted = dir.path().join("planted");
    fs::write(&planted, b"another file's bytes").unwrap();
    fs::rename(&planted, &paths.data).unwrap();
    let refused = store
        .publish(&paths, &sha, "model.bin", "https://origin.test/model.bin")
        .unwrap_err();
    assert!(
        refused.to_string().contains("not the one that was written"),
        "{refused}"
    );
    assert!(!store.blob_path(&sha, "model.bin").exists());
}

/// Every entry under `dir` (not following links): its path, and its
/// bytes, or what else it is.
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap().map(|e| e.unwrap()) {
        let (path, kind) = (entry.path(), entry.file_type().unwrap());
        if kind.is_dir() {
            out.push((path.clone(), b"folder".to_vec()));
            out.extend(tree(&path));
        } else if kind.is_file() {
            out.push((path.clone(), fs::read(&path).unwrap()));
        } else {
            out.push((path, b"other".to_vec()));
        }
    }
    out.sort();
    out
}

#[test]
fn a_store_folder_replaced_while_open_is_never_written_nor_published_from() {
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("store");
    let store = Store::open(&at).unwrap();
    let sha = "9".repeat(64);
    let body = vec![3u8; 4096];
    let size = body.len() as u64;
    let lane = store.try_lock_lane(&sha, size, 0).unwrap().unwrap();
    lane.describe(&Holder::new(Some("g"), &[], 0));
    let paths = written(&store, &sha, &body);
    // The store's folder renamed away while it is open, and another
    // tree at its path, with files at the names the store uses.
    let moved = dir.path().join("moved");
    let renamed = fs::rename(&at, &moved);
    if renamed.is_err() && crate::platform::HELD_FOLDERS_STAY {
        // The folders the store holds cannot be moved at all here.
        return;
    }
    renamed.unwrap();
    Store::open(&at).unwrap();
    let key = lane_key(&sha, size, 0);
    let other = at.join(LAYOUT);
    fs::write(other.join(format!("tmp/{key}.partial")), b"not the bytes").unwrap();
    fs::write(other.join(format!("tmp/{key}.partial.json")), b"{}").unwrap();
    fs::write(other.join(format!("locks/{key}.lock")), b"").unwrap();
    fs::write(other.join(format!("locks/{key}.lock.json")), b"{}").unwrap();
    let before = tree(&at);

    let mut checkpoints =
        partial::Checkpointer::new(&paths, "https://cdn.test/a", Some("\"v\"".into()));
    checkpoints.record(size).unwrap();
    assert!(paths.kept().is_some(), "the record is beside the data file");
    let published = store.publish(&paths, &sha, "model.bin", "https://origin.test/model.bin");
    lane.describe(&Holder::new(Some("g"), &[], size));
    drop(lane);

    // Published in the folder the store opened, from the very file
    // that was written; the record went from there too, and the lock
    // file stays there for the next taker.
    let kept = moved.join(LAYOUT);
    assert_eq!(
        fs::read(kept.join("blobs").join(&sha).join("model.bin")).unwrap(),
        body
    );
    assert!(!kept.join(format!("tmp/{key}.partial")).exists());
    assert!(!kept.join(format!("tmp/{key}.partial.json")).exists());
    assert!(kept.join(format!("locks/{key}.lock")).exists());
    // Its path now leads into the other tree: never handed out.
    let refused = published.unwrap_err();
    assert!(
        refused.to_string().contains("was moved or replaced"),
        "{refused}"
    );
    // The other tree is as it was: nothing written, renamed or removed.
    assert_eq!(tree(&at), before);
}

/// The partial file of lane 0 of `sha`, prepared and holding `body`.
fn written(store: &Store, sha: &str, body: &[u8]) -> PartialPaths {
    use std::io::Write;
    let size = body.len() as u64;
    let paths = store.prepare("r", sha, size, 0, Duration::ZERO).unwrap();
    paths.open_data().unwrap().write_all(body).unwrap();
    paths
}

#[test]
fn a_verified_file_is_never_handed_out_at_a_path_into_a_tree_put_in_the_stores_place() {
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("store");
    let store = Store::open(&at).unwrap();
    let sha = "8".repeat(64);
    let body = vec![4u8; 4096];
    let paths = written(&store, &sha, &body);
    let path = store
        .publish(&paths, &sha, "model.bin", "https://origin.test/model.bin")
        .unwrap();
    assert_eq!(store.find(&sha, "model.bin").unwrap(), Some(path.clone()));
    // The store's folder renamed away, and another tree at its path
    // holding other bytes at the verified file's path.
    let renamed = fs::rename(&at, dir.path().join("moved"));
    if renamed.is_err() && crate::platform::HELD_FOLDERS_STAY {
        // The folders the store holds cannot be moved at all here.
        return;
    }
    renamed.unwrap();
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, b"other bytes").unwrap();
    for name in ["model.bin", "other-name.bin"] {
        let refused = store.find(&sha, name).unwrap_err();
        assert!(
            refused.to_string().contains("was moved or replaced"),
            "{refused}"
        );
    }
    assert_eq!(fs::read(&path).unwrap(), b"other bytes");
    assert!(!path.with_file_name("other-name.bin").exists());
    assert!(store.has(&sha), "the verified file is kept where it was");
}

#[test]
fn a_publish_records_the_stamp_and_the_source_in_one_record_before_the_name() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let registry = crate::registry::Registry::new(&store);
    let sha = "9".repeat(64);
    let body = vec![5u8; 1000];
    let paths = written(&store, &sha, &body);
    let url = "https://origin.test/model.bin";
    store.publish(&paths, &sha, "model.bin", url).unwrap();
    // The stamp taken before the rename is the published file's.
    let blob = store.folders.blobs.open_sub(&sha).unwrap();
    let verdict = stamps::check(store.stamps(), &sha, &blob, "model.bin");
    assert_eq!(verdict, stamps::Verdict::Holds);
    assert_eq!(registry.served_by(&sha).as_deref(), Some(url));
    // One record: nothing in `served/`.
    let served = dir
        .path()
        .join("store-v1/served")
        .join(format!("{sha}.json"));
    assert!(!served.exists());
    // Forgetting the source keeps the stamp (a lost stamp would trust
    // the file as found).
    registry.forget_served_by(&sha);
    assert_eq!(registry.served_by(&sha), None);
    let verdict = stamps::check(store.stamps(), &sha, &blob, "model.bin");
    assert_eq!(verdict, stamps::Verdict::Holds);
    // What an earlier version recorded in `served/` is still read.
    let old = "a".repeat(64);
    fs::create_dir_all(served.parent().unwrap()).unwrap();
    fs::write(
        served.with_file_name(format!("{old}.json")),
        br#"{"served_by":"https://old.test/x","at":"2026-11-01T00:00:00Z"}"#,
    )
    .unwrap();
    assert_eq!(
        registry.served_by(&old).as_deref(),
        Some("https://old.test/x")
    );
}

#[test]
fn a_store_deeper_than_max_path_downloads_publishes_and_removes() {
    // Windows limits plain paths to 260 characters (MAX_PATH): every
    // call of the store, its own Windows calls included, must work
    // deeper than that without the system's long-path setting.
    let dir = tempfile::tempdir().unwrap();
    let mut deep = dir.path().to_path_buf();
    for i in 0..10 {
        deep.push(format!("{i}-{}", "long-folder-name".repeat(2)));
    }
    assert!(deep.as_os_str().len() > 300);
    let store = Store::open(&deep).unwrap();
    let sha = "e".repeat(64);
    let body = vec![5u8; 4096];
    let paths = store
        .prepare("r", &sha, body.len() as u64, 0, Duration::ZERO)
        .unwrap();
    fs::write(&paths.data, &body).unwrap();
    let path = store
        .publish(&paths, &sha, "model.bin", "https://origin.test/model.bin")
        .unwrap();
    assert!(path.as_os_str().len() > 400);
    assert_eq!(fs::read(&path).unwrap(), body);
    assert_eq!(store.find(&sha, "model.bin").unwrap(), Some(path.clone()));
    assert!(store.has(&sha));
    store.remove(&sha).unwrap();
    assert!(!path.exists());
    assert!(!store.has(&sha));
}

#[test]
fn lock_files_of_earlier_versions_are_removed_and_held_locks_kept() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let locks = store.root().join("locks");
    let legacy = locks.join(format!("{}.lock", "b".repeat(64)));
    fs::write(&legacy, b"").unwrap();
    fs::write(locks.join("downloads.lock"), b"").unwrap();
    let sha = "c".repeat(64);
    let held = store.try_lock_lane(&sha, 10, 0).unwrap();
    let Some(lane) = &held else {
        panic!("the lane is free")
    };
    lane.describe(&Holder::new(Some("g"), &[], 0));
    // A killed download's description, its lock long released.
    let stale = locks.join(format!("{sha}.11.lock.json"));
    fs::write(&stale, b"{}").unwrap();
    fs::write(locks.join("registry.lock"), b"").unwrap();
    let removed = store.clean_tmp(std::time::Duration::from_secs(60)).unwrap();
    assert_eq!(removed, 3);
    assert!(!legacy.exists());
    assert!(!stale.exists());
    assert!(locks.join(format!("{sha}.10.lock")).exists());
    let description = lockfile::holder_of(store.locks(), &lane_key(&sha, 10, 0), 1000);
    assert!(matches!(description, Some(Some(_))), "{description:?}");
    assert!(locks.join("registry.lock").exists());
    // The download lock still holds after the cleanup, and keeps every
    // download of its SHA-256 from being touched.
    assert!(store.try_lock_lane(&sha, 10, 0).unwrap().is_none());
    assert!(store.try_lock(&sha).unwrap().is_none());
    drop(held);
    assert!(store.try_lock(&sha).unwrap().is_some());
    // Released, a lane's lock file stays for the next download of its
    // file. A cleanup removes it once its file is not stored and
    // nobody holds it (where held lock files may be removed), and
    // keeps the lock file of a stored file.
    let lock = locks.join(format!("{sha}.10.lock"));
    assert!(lock.exists());
    let kept = "e".repeat(64);
    drop(store.try_lock_lane(&kept, 3, 0).unwrap());
    fs::create_dir(store.root().join("blobs").join(&kept)).unwrap();
    fs::write(store.root().join("blobs").join(&kept).join("x.bin"), b"abc").unwrap();
    assert!(store.has(&kept));
    store.clean_tmp(std::time::Duration::from_secs(60)).unwrap();
    assert_eq!(lock.exists(), !crate::platform::REMOVE_HELD_LOCKS);
    assert!(locks.join(format!("{kept}.3.lock")).exists());
    // Lane 0's lock file, nobody holding it, stays while another lane
    // of its file is held: a look for downloads in progress starts at
    // it, and finds that lane.
    let busy = "d".repeat(64);
    let other = store.try_lock_lane(&busy, 7, 2).unwrap().unwrap();
    store.clean_tmp(std::time::Duration::from_secs(60)).unwrap();
    assert!(locks.join(format!("{busy}.7.lock")).exists());
    assert_eq!(store.lanes_in_use(&busy, 7).len(), 1);
    drop(other);
    store.clean_tmp(std::time::Duration::from_secs(60)).unwrap();
    assert_eq!(
        locks.join(format!("{busy}.7.lock")).exists(),
        !crate::platform::REMOVE_HELD_LOCKS
    );
}

#[test]
fn a_download_leaves_its_lock_file_and_another_lane_implies_lane_0s() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let sha = "f".repeat(64);
    assert!(store.lanes_in_use(&sha, 5).is_empty());
    let other = store.try_lock_lane(&sha, 5, 3).unwrap().unwrap();
    // Lane 0's lock file was made with lane 3's: the look for the
    // downloads in progress, which starts at it, finds lane 3.
    let in_use = store.lanes_in_use(&sha, 5);
    assert_eq!(in_use.len(), 1);
    drop(other);
    assert!(store.lanes_in_use(&sha, 5).is_empty());
    let key = lane_key(&sha, 5, 0);
    assert!(lockfile::exists(store.locks(), &key));
    assert!(lockfile::exists(store.locks(), &lane_key(&sha, 5, 3)));
}

#[test]
fn another_size_or_lane_of_a_hash_keeps_its_partial_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let sha = "f".repeat(64);
    let theirs = store.partial(&sha, 5000, 0);
    fs::write(&theirs.data, vec![1u8; 3000]).unwrap();
    let record = serde_json::json!({
        "address": "https://cdn.test/a",
        "validator": "\"v1\"",
        "durable": 3000,
    });
    fs::write(&theirs.meta, record.to_string()).unwrap();
    let _other_size = store.prepare("r", &sha, 4000, 0, Duration::ZERO).unwrap();
    let _other_lane = store.prepare("r", &sha, 5000, 2, Duration::ZERO).unwrap();
    assert_eq!(theirs.kept().map(|(_, n)| n), Some(3000));
    assert_eq!(store.kept_bytes(&sha, Some(5000)), Some(3000));
    assert_eq!(store.kept_bytes(&sha, Some(4000)), None);
}

#[test]
fn a_dripping_download_stops_reserving_its_size_and_a_reservation_names_its_gem() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let hog = "a".repeat(64);
    let huge = 1u64 << 40;
    let lane = store.try_lock_lane(&hog, huge, 0).unwrap().unwrap();
    let mut holder = Holder::new(Some("hog"), &[], 0);
    lane.describe(&holder);
    space::FREE.set(Some(huge + (1 << 30)));
    store
        .prepare("huge", &hog, huge, 0, Duration::ZERO)
        .unwrap();
    space::FREE.set(Some(1 << 30));
    // Young: the whole declared size is reserved, and named.
    let refused = store
        .prepare(
            "small",
            &"b".repeat(64),
            1 << 20,
            0,
            Duration::from_secs(30),
        )
        .unwrap_err();
    assert_eq!(refused.code(), "E_RESOURCE_DISK_SPACE");
    assert!(
        refused.to_string().contains("reserved by gem \"hog\""),
        "{refused}"
    );
    // A minute old with nothing delivered: nothing reserved.
    holder.since_ms -= 60_000;
    lane.describe(&holder);
    let prepared = store.prepare(
        "small",
        &"b".repeat(64),
        1 << 20,
        0,
        Duration::from_secs(30),
    );
    // Too big on its own: no gem stands in the way.
    let alone = store.prepare("big", &"c".repeat(64), 2 << 30, 0, Duration::from_secs(30));
    space::FREE.set(None);
    assert!(prepared.is_ok(), "{:?}", prepared.err());
    let alone = alone.unwrap_err();
    assert!(!alone.to_string().contains("hog"), "{alone}");
}
