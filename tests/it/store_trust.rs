//! The store trusts only what its own user made: shared or foreign store
//! folders are refused at open, and a symbolic link or another user's file
//! planted where the store keeps partial files, verified files or failure
//! logs is never written through, returned or published.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use gem_resources::{ErrorCode, Resources, Store};
use serde_json::json;

use crate::support::fetch_with as fetch;
use crate::support::*;

/// A user id that is not this process's.
const OTHER_UID: u32 = 65534;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

/// A file outside the store that a planted link points to.
fn victim(env: &Env) -> PathBuf {
    let path = env.dir.path().join("victim.txt");
    std::fs::write(&path, b"precious").unwrap();
    set_mode(&path, 0o644);
    path
}

fn assert_untouched(victim: &Path) {
    assert_eq!(std::fs::read(victim).unwrap(), b"precious");
    assert_eq!(mode(victim), 0o644, "the link's target was chmod-ed");
}

#[tokio::test]
async fn a_store_folder_others_can_write_is_refused_naming_the_folder_and_the_fix() {
    let env = Env::new().await;
    Store::open(&env.store_dir()).unwrap();
    for folder in [env.store_dir(), store_root(&env).join("tmp")] {
        set_mode(&folder, 0o777);
        let err = Store::open(&env.store_dir()).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Config, "{err}");
        let text = err.to_string();
        assert!(text.contains(&folder.display().to_string()), "{text}");
        assert!(text.contains("chmod 700"), "{text}");
        // The service refuses it the same way.
        let err = Resources::open(&env.config()).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Config, "{err}");
        set_mode(&folder, 0o700);
    }
    // Group-writable is shared too.
    set_mode(&store_root(&env).join("blobs"), 0o770);
    assert!(Store::open(&env.store_dir()).is_err());
    set_mode(&store_root(&env).join("blobs"), 0o755);
    Store::open(&env.store_dir()).unwrap();
}

#[tokio::test]
async fn a_store_folder_of_another_user_is_refused() {
    if !is_root() {
        eprintln!("skipped: changing a folder's owner needs root");
        return;
    }
    let env = Env::new().await;
    Store::open(&env.store_dir()).unwrap();
    let gems = store_root(&env).join("gems");
    std::os::unix::fs::chown(&gems, Some(OTHER_UID), None).unwrap();
    let err = Store::open(&env.store_dir()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Config, "{err}");
    assert!(
        err.to_string().contains(&gems.display().to_string()),
        "{err}"
    );
    assert!(
        err.to_string().contains("belongs to user id 65534"),
        "{err}"
    );
}

#[tokio::test]
async fn folders_and_files_get_private_modes_whatever_the_umask() {
    let env = Env::new().await;
    let body = bytes(3000, 1);
    let url = env.serve("/m.bin", &body);
    let m = env.write_manifest("m.json", json!([entry("m", &url, &body)]));
    let config = env.dir.path().join("config.toml");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("sh")
            .arg("-c")
            .arg("umask 000 && exec \"$0\" \"$@\"")
            .arg(env!("CARGO_BIN_EXE_gem-resources"))
            .args(["--config", config.to_str().unwrap(), "fetch"])
            .arg(&m)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(mode(&env.store_dir()), 0o700);
    let root = store_root(&env);
    assert_eq!(mode(&root), 0o700);
    for sub in ["blobs", "tmp", "locks", "gems", "failures"] {
        assert_eq!(mode(&root.join(sub)), 0o700, "{sub}");
    }
    let blob = &stored_files(&env, &body)[0];
    assert_eq!(mode(blob.parent().unwrap()), 0o700);
    assert_eq!(
        mode(blob),
        0o400,
        "a verified file is read-only for its owner"
    );
    // The download's lock file stays for the next download of its file,
    // private like the rest; one held now is the user's own too.
    let sha = sha256_hex(&body);
    let kept: Vec<_> = files_under(&root.join("locks"))
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".lock"))
        .collect();
    assert_eq!(kept, vec![root.join(format!("locks/{sha}.3000.lock"))]);
    assert_eq!(mode(&kept[0]), 0o600);
    let held = Store::open(&env.store_dir())
        .unwrap()
        .try_lock_lane(&sha, 3000, 0)
        .unwrap()
        .expect("the lane is free");
    assert_eq!(mode(&root.join(format!("locks/{sha}.3000.lock"))), 0o600);
    drop(held);
}

/// Plants a link at the partial file's name of `body` (declared `size`).
fn plant_partial_link(env: &Env, sha256: &str, size: usize, target: &Path) -> PathBuf {
    Store::open(&env.store_dir()).unwrap();
    let link = store_root(env)
        .join("tmp")
        .join(format!("{sha256}.{size}.partial"));
    std::os::unix::fs::symlink(target, &link).unwrap();
    link
}

#[tokio::test]
async fn a_link_at_a_partial_file_name_never_touches_its_target() {
    let env = Env::new().await;
    let target = victim(&env);
    let body = bytes(5000, 2);
    let url = env.serve("/p.bin", &body);
    // A download that fails its SHA-256 ...
    let mut wrong = resource("p", &url, &[], &body);
    wrong.sha256 = sha256_hex(b"something else");
    plant_partial_link(&env, &wrong.sha256, body.len(), &target);
    let err = fetch(&env, &wrong, no_retry()).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert_untouched(&target);
    // ... and one that succeeds.
    let right = resource("p", &url, &[], &body);
    let link = plant_partial_link(&env, &right.sha256, body.len(), &target);
    let path = fetch(&env, &right, no_retry()).await.unwrap();
    assert_untouched(&target);
    assert!(std::fs::symlink_metadata(&path).unwrap().is_file());
    assert_eq!(std::fs::read(&path).unwrap(), body);
    assert!(
        std::fs::symlink_metadata(&link).is_err(),
        "the link is gone"
    );
}

#[tokio::test]
async fn a_link_planted_among_the_verified_files_is_never_returned() {
    let env = Env::new().await;
    let body = bytes(4000, 3);
    let url = env.serve("/v.bin", &body);
    let r = resource("v", &url, &[], &body);
    // The link points to a file with the right bytes: a download or `path`
    // would hand out a file its owner can change at will.
    let elsewhere = env.dir.path().join("elsewhere.bin");
    std::fs::write(&elsewhere, &body).unwrap();
    Store::open(&env.store_dir()).unwrap();
    let dir = store_root(&env).join("blobs").join(&r.sha256);
    std::fs::create_dir(&dir).unwrap();
    set_mode(&dir, 0o700);
    std::os::unix::fs::symlink(&elsewhere, dir.join(r.file_name())).unwrap();
    let store = Store::open(&env.store_dir()).unwrap();
    assert!(!store.has(&r.sha256));
    assert_eq!(store.find(&r.sha256, &r.file_name()).unwrap(), None);
    assert!(store.blob_files(&r.sha256).is_empty());
    let path = fetch(&env, &r, no_retry()).await.unwrap();
    assert_eq!(env.origin.hits("/v.bin"), 1, "downloaded, not taken");
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.is_file(), "{path:?} is a regular file");
    assert_eq!(std::fs::read(&path).unwrap(), body);
}

#[tokio::test]
async fn a_link_at_the_failure_log_is_not_appended_to_and_the_failure_is_still_reported() {
    let env = Env::new().await;
    env.origin.route("/gone.bin", Behaviour::Status(404));
    let body = bytes(100, 4);
    let url = env.url("origin.test", "/gone.bin");
    let service = Resources::open(&env.config()).unwrap();
    service
        .install("g", &manifest(json!([entry("gone", &url, &body)])))
        .await
        .unwrap();
    let target = victim(&env);
    let log = store_root(&env).join("failures/g.jsonl");
    std::os::unix::fs::symlink(&target, &log).unwrap();
    let err = service.path("g", "gone").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert_untouched(&target);
    let status = service.status(Some("g")).unwrap();
    let state = serde_json::to_value(&status[0].resources[0].state).unwrap();
    assert_eq!(state["state"], "failed", "{state}");
    // The log that holds the record is the store's own file.
    let meta = std::fs::symlink_metadata(&log).unwrap();
    assert!(meta.is_file());
    assert_eq!(meta.mode() & 0o777, 0o600);
}

/// Writes a partial record for `sha256`/`size` from `url`.
fn write_record(env: &Env, sha256: &str, size: usize, url: &url::Url, durable: usize) {
    let record = json!({"address": url.as_str(), "validator": "\"v1\"", "durable": durable});
    let path = store_root(env)
        .join("tmp")
        .join(format!("{sha256}.{size}.partial.json"));
    std::fs::write(&path, serde_json::to_vec(&record).unwrap()).unwrap();
    set_mode(&path, 0o600);
}

#[tokio::test]
async fn a_partial_file_of_another_user_is_never_published() {
    if !is_root() {
        eprintln!("skipped: changing a file's owner needs root");
        return;
    }
    let env = Env::new().await;
    let body = bytes(50_000, 5);
    env.origin
        .route("/o.bin", Behaviour::ranged(&body, "\"v1\""));
    let url = env.url("origin.test", "/o.bin");
    let r = resource("o", &url, &[], &body);
    Store::open(&env.store_dir()).unwrap();
    // The first half, as another user left it (and could still rewrite).
    let data = store_root(&env)
        .join("tmp")
        .join(format!("{}.{}.partial", r.sha256, body.len()));
    std::fs::write(&data, &body[..25_000]).unwrap();
    set_mode(&data, 0o644);
    std::os::unix::fs::chown(&data, Some(OTHER_UID), None).unwrap();
    write_record(&env, &r.sha256, body.len(), &url, 25_000);
    let path = fetch(&env, &r, no_retry()).await.unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.uid(), 0, "the verified file is the store user's");
    assert_eq!(meta.mode() & 0o777, 0o400);
    assert_eq!(std::fs::read(&path).unwrap(), body);
    assert_eq!(
        env.origin.served("/o.bin"),
        body.len() as u64,
        "nothing of the other user's file was used"
    );
}

#[tokio::test]
async fn a_partial_record_claiming_more_than_its_file_holds_is_not_resumed() {
    let env = Env::new().await;
    let body = bytes(50_000, 6);
    env.origin
        .route("/s.bin", Behaviour::ranged(&body, "\"v1\""));
    let url = env.url("origin.test", "/s.bin");
    let r = resource("s", &url, &[], &body);
    Store::open(&env.store_dir()).unwrap();
    let data = store_root(&env)
        .join("tmp")
        .join(format!("{}.{}.partial", r.sha256, body.len()));
    std::fs::write(&data, &body[..1000]).unwrap();
    // The record says 30,000 bytes were flushed; the file has 1,000.
    write_record(&env, &r.sha256, body.len(), &url, 30_000);
    let path = fetch(&env, &r, no_retry()).await.unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), body);
    assert_eq!(env.origin.hits("/s.bin"), 1, "one request, from zero");
    let range = env
        .origin
        .last_headers("/s.bin")
        .unwrap()
        .into_iter()
        .find(|(n, _)| n == "range");
    assert_eq!(range, None);
}

#[tokio::test]
async fn verify_checks_the_verified_files_only_never_a_planted_link() {
    let env = Env::new().await;
    let body = bytes(3000, 7);
    let url = env.serve("/k.bin", &body);
    let service = Resources::open(&env.config()).unwrap();
    service
        .install("g", &manifest(json!([entry("k", &url, &body)])))
        .await
        .unwrap();
    let path = service.path("g", "k").await.unwrap();
    // A link next to the verified file, to bytes that do not match.
    let elsewhere = env.dir.path().join("other.bin");
    std::fs::write(&elsewhere, b"other bytes").unwrap();
    std::os::unix::fs::symlink(&elsewhere, path.with_file_name("planted.bin")).unwrap();
    let report = within("verify", service.verify()).await.unwrap();
    assert_eq!(report.checked, 1, "{report:?}");
    assert_eq!(report.ok, 1, "{report:?}");
    assert!(report.corrupted.is_empty(), "{report:?}");
    assert_eq!(std::fs::read(&path).unwrap(), body);
}

#[tokio::test]
async fn another_name_for_stored_bytes_replaces_a_link_planted_at_that_name() {
    let env = Env::new().await;
    let body = bytes(2000, 8);
    let url = env.serve("/n.bin", &body);
    let r = resource("n", &url, &[], &body);
    let stored = fetch(&env, &r, no_retry()).await.unwrap();
    let target = victim(&env);
    let other = stored.with_file_name("other-name.bin");
    std::os::unix::fs::symlink(&target, &other).unwrap();
    let store = Store::open(&env.store_dir()).unwrap();
    let found = store
        .find_off_runtime(&r.sha256, "other-name.bin")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found, other);
    assert!(std::fs::symlink_metadata(&found).unwrap().is_file());
    assert_eq!(std::fs::read(&found).unwrap(), body);
    assert_untouched(&target);
    assert_eq!(env.origin.hits("/n.bin"), 1);
}

#[cfg(unix)]
#[tokio::test]
async fn a_store_below_a_folder_others_can_rename_in_is_refused_naming_it() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new().await;
    let open = env.dir.path().join("shared");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let manifest = env.write_manifest("m.json", serde_json::json!([]));
    let out = env
        .run(&[
            "--store",
            open.join("store").to_str().unwrap(),
            "install",
            "g",
            manifest.to_str().unwrap(),
        ])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("E_RESOURCE_CONFIG"), "{err}");
    assert!(
        err.contains(open.to_str().unwrap()) && err.contains("sticky"),
        "{err}"
    );
    // With the sticky bit (as /tmp has), nobody may rename another's
    // entries: accepted.
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let out = env
        .run(&[
            "--store",
            open.join("store").to_str().unwrap(),
            "install",
            "g",
            manifest.to_str().unwrap(),
        ])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[cfg(unix)]
#[tokio::test]
async fn a_store_path_that_is_another_users_link_is_refused() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED a_store_path_that_is_another_users_link_is_refused: needs root to give a link to another user");
        return;
    }
    let env = Env::new().await;
    let real = env.dir.path().join("real-store");
    std::fs::create_dir(&real).unwrap();
    let link = env.dir.path().join("store-link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    // Another user's link (uid 65534, nobody).
    let c = std::ffi::CString::new(link.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::lchown(c.as_ptr(), 65534, 65534) }, 0);
    let manifest = env.write_manifest("m.json", serde_json::json!([]));
    let out = env
        .run(&[
            "--store",
            link.to_str().unwrap(),
            "install",
            "g",
            manifest.to_str().unwrap(),
        ])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("symbolic link of another user"),
        "{}",
        stderr(&out)
    );
}

/// Changes one byte of the stored file at `path` as a person would by hand:
/// made writable, edited, its time moved.
fn edit_by_hand(path: &Path) {
    set_mode(path, 0o600);
    let mut bytes = std::fs::read(path).unwrap();
    bytes[10] ^= 0xff;
    std::fs::write(path, &bytes).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(later)
        .unwrap();
}

#[tokio::test]
async fn a_stored_file_changed_by_hand_is_fetched_again_before_path_hands_it_out() {
    let env = Env::new().await;
    let body = bytes(50_000, 17);
    let url = env.serve("/m.bin", &body);
    let m = env.write_manifest("m.json", json!([entry("m", &url, &body)]));
    let out = env.run(&["install", "g", m.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let path_of = || async {
        let out = env.run(&["path", "g", "m"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        PathBuf::from(stdout(&out).trim())
    };
    let stored = path_of().await;
    assert_eq!(env.origin.hits("/m.bin"), 1);
    edit_by_hand(&stored);
    let again = path_of().await;
    assert_eq!(std::fs::read(&again).unwrap(), body);
    assert_eq!(mode(&again), 0o400);
    assert_eq!(env.origin.hits("/m.bin"), 2, "fetched again");
    // Untouched since: handed out without a request.
    assert_eq!(path_of().await, again);
    assert_eq!(env.origin.hits("/m.bin"), 2);
}

#[tokio::test]
async fn a_stored_file_only_made_writable_is_hashed_and_made_read_only_again() {
    let env = Env::new().await;
    let body = bytes(40_000, 18);
    let url = env.serve("/m.bin", &body);
    let r = resource("m", &url, &[], &body);
    let stored = fetch(&env, &r, no_retry()).await.unwrap();
    set_mode(&stored, 0o600);
    // The library's own answer, through the same store.
    let store = Store::open(&env.store_dir()).unwrap();
    let found = store.find(&r.sha256, &r.file_name()).unwrap().unwrap();
    assert_eq!(found, stored);
    assert_eq!(mode(&found), 0o400);
    assert_eq!(std::fs::read(&found).unwrap(), body);
    assert_eq!(env.origin.hits("/m.bin"), 1);
    // Changed bytes under an unchanged mode and time are caught by the
    // file's identity: a new file renamed over it.
    let replacement = env.dir.path().join("replacement");
    let mut wrong = body.clone();
    wrong[0] ^= 1;
    std::fs::write(&replacement, &wrong).unwrap();
    set_mode(&replacement, 0o400);
    let meta = std::fs::metadata(&stored).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&replacement)
        .unwrap()
        .set_modified(meta.modified().unwrap())
        .unwrap();
    std::fs::rename(&replacement, &stored).unwrap();
    assert_eq!(store.find(&r.sha256, &r.file_name()).unwrap(), None);
    assert!(!store.has(&r.sha256));
}

/// Every file and folder under `dir` (links not followed), each file with
/// the SHA-256 of its bytes.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Option<String>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() {
            out.extend(snapshot(&path));
            out.push((path, None));
        } else {
            let digest = std::fs::read(&path).ok().map(|b| sha256_hex(&b));
            out.push((path, digest));
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn a_store_folder_replaced_during_a_download_is_never_written_nor_published_from() {
    let env = Env::new().await;
    let body = bytes(4 << 20, 61);
    // About 1.2 MiB/s, resumable: the download takes a few seconds and
    // records its flushed bytes every two.
    let paced = paced_route(&body);
    env.origin.route("/swap.bin", paced);
    let url = env.url("origin.test", "/swap.bin");
    let manifest = env.write_manifest("m.json", json!([entry("swap", &url, &body)]));
    let log = env.dir.path().join("fetch.log");
    let mut child = spawn_logged(&env, &["fetch", manifest.to_str().unwrap()], &log);
    let sha = sha256_hex(&body);
    let key = format!("{sha}.{}", body.len());
    let data = store_root(&env).join(format!("tmp/{key}.partial"));
    wait_until("the download has written 1 MiB", || {
        std::fs::metadata(&data).is_ok_and(|m| m.len() >= 1 << 20)
    })
    .await;

    // While the download runs, the store's folder is renamed away and
    // another tree put at its path, with files at the names the download
    // uses: a partial file of other bytes, its record, the lock.
    let moved = env.dir.path().join("moved-store");
    std::fs::rename(env.store_dir(), &moved).unwrap();
    Store::open(&env.store_dir()).unwrap();
    let other = store_root(&env);
    std::fs::write(other.join(format!("tmp/{key}.partial")), bytes(4 << 20, 7)).unwrap();
    let record = json!({ "address": url.as_str(), "validator": "\"s1\"", "durable": 4 << 20 });
    std::fs::write(
        other.join(format!("tmp/{key}.partial.json")),
        record.to_string(),
    )
    .unwrap();
    std::fs::write(other.join(format!("locks/{key}.lock")), b"").unwrap();
    let before = snapshot(&env.store_dir());

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "fetch did not end");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let out = child_stdout(&mut child);
    let err = std::fs::read_to_string(&log).unwrap();

    // The other tree is exactly as it was put there: nothing written,
    // renamed or removed in it, nothing published from it.
    assert_eq!(snapshot(&env.store_dir()), before, "{err}");
    // The verified bytes went where the store opened its folders.
    let kept = moved.join("store-v1/blobs").join(&sha).join("swap.bin");
    assert_eq!(
        std::fs::read(&kept).ok().as_deref(),
        Some(&body[..]),
        "{err}"
    );
    // And no path into the other tree is handed out as the file.
    assert!(!status.success(), "{out}\n{err}");
    assert!(err.contains("was moved or replaced"), "{err}");
}

/// A resumable route of `body` sent at about 1.2 MiB/s.
fn paced_route(body: &[u8]) -> Behaviour {
    Behaviour::Ranged {
        body: body.to_vec(),
        etag: "\"s1\"".into(),
        ignore_range: false,
        cut_at: None,
        hold: false,
        pace: Some((64 * 1024, std::time::Duration::from_millis(50))),
    }
}

#[tokio::test]
async fn a_link_in_place_of_a_store_folder_is_refused_naming_it() {
    let env = Env::new().await;
    Store::open(&env.store_dir()).unwrap();
    let blobs = store_root(&env).join("blobs");
    let elsewhere = env.dir.path().join("elsewhere");
    std::fs::rename(&blobs, &elsewhere).unwrap();
    // The user's own link: still refused, the store follows no link
    // inside its folder.
    std::os::unix::fs::symlink(&elsewhere, &blobs).unwrap();
    let refused = Store::open(&env.store_dir()).unwrap_err();
    assert_eq!(refused.code(), ErrorCode::Config, "{refused}");
    let text = refused.to_string();
    assert!(text.contains(&blobs.display().to_string()), "{text}");
    assert!(text.contains("is a symbolic link"), "{text}");
}
