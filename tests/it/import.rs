//! Offline import: files the user already has, matched by size and SHA-256
//! against installed gems and copied into the store; and `status` showing
//! the bytes an interrupted download kept.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use gem_resources::{download, Fetcher, RetryPolicy, Store};
use serde_json::json;

use crate::support::*;

fn assert_exit(out: &std::process::Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        stdout(out),
        stderr(out)
    );
}

/// Installs gem `gem` declaring `resources` through the binary.
async fn install(env: &Env, gem: &str, resources: serde_json::Value) {
    let m = env.write_manifest(&format!("{gem}.json"), resources);
    assert_exit(&env.run(&["install", gem, m.to_str().unwrap()]).await, 0);
}

/// Writes `body` to `<scratch>/<name>`, read-only for others and dated a day
/// back, so a change by the import would show.
fn user_file(env: &Env, name: &str, body: &[u8]) -> PathBuf {
    let path = env.dir.path().join(name);
    std::fs::write(&path, body).unwrap();
    files::set_mode(&path, 0o640);
    let day_ago = SystemTime::now() - Duration::from_secs(86_400);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(day_ago)
        .unwrap();
    path
}

async fn status_json(env: &Env) -> serde_json::Value {
    let out = env.run(&["--json", "status"]).await;
    assert_exit(&out, 0);
    serde_json::from_slice(&out.stdout).unwrap()
}

fn arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[tokio::test]
async fn an_imported_file_is_stored_and_path_answers_without_a_request() {
    let env = Env::new().await;
    let body = bytes(300_000, 120);
    let url = env.serve("/models/ocr-v3.onnx", &body);
    install(&env, "g", json!([entry("ocr", &url, &body)])).await;
    let file = user_file(&env, "downloaded.onnx", &body);
    let before = std::fs::metadata(&file).unwrap();

    let out = env.run(&["import", arg(&file)]).await;
    assert_exit(&out, 0);
    assert_eq!(
        stdout(&out),
        format!("{}: imported g/ocr\n", file.display())
    );

    let path = env.run(&["path", "g", "ocr"]).await;
    assert_exit(&path, 0);
    let stored = PathBuf::from(stdout(&path).trim());
    assert!(stored.ends_with("ocr-v3.onnx"), "{}", stored.display());
    assert_eq!(std::fs::read(&stored).unwrap(), body);
    assert_eq!(env.origin.hits("/models/ocr-v3.onnx"), 0);

    // A copy, read-only, never a link to the user's file.
    let meta = std::fs::metadata(&stored).unwrap();
    assert!(meta.permissions().readonly());
    if let (Some(stored), Some(user)) = (files::file_id(&meta), files::file_id(&before)) {
        assert_ne!(stored, user);
    }
    // The user's file is exactly as it was.
    let after = std::fs::metadata(&file).unwrap();
    assert_eq!(after.modified().unwrap(), before.modified().unwrap());
    assert_eq!(files::mode(&after), files::mode(&before));
    assert_eq!(files::link_count(&after).unwrap_or(1), 1);
    assert_eq!(std::fs::read(&file).unwrap(), body);
    assert!(tmp_files(&env).is_empty(), "{:?}", tmp_files(&env));
}

#[tokio::test]
async fn importing_bytes_the_store_has_says_already_present() {
    let env = Env::new().await;
    let body = bytes(50_000, 121);
    let url = env.serve("/a.bin", &body);
    install(&env, "g", json!([required_entry("a", &url, &body)])).await;
    assert_eq!(env.origin.hits("/a.bin"), 1);
    let file = user_file(&env, "a-copy.bin", &body);
    let out = env.run(&["import", arg(&file)]).await;
    assert_exit(&out, 0);
    assert_eq!(
        stdout(&out),
        format!("{}: already present (g/a)\n", file.display())
    );
    assert_eq!(stored_files(&env, &body).len(), 1);
}

#[tokio::test]
async fn a_file_matching_nothing_exits_1_and_the_others_are_still_imported() {
    let env = Env::new().await;
    let body = bytes(40_000, 122);
    let url = env.serve("/a.bin", &body);
    install(&env, "g", json!([entry("a", &url, &body)])).await;
    // Same size, other bytes: the size alone does not match.
    let mut other = body.clone();
    other[20_000] ^= 1;
    let wrong = user_file(&env, "wrong.bin", &other);
    let unrelated = user_file(&env, "unrelated.bin", b"hello");
    let good = user_file(&env, "good.bin", &body);
    let out = env
        .run(&["import", arg(&wrong), arg(&unrelated), arg(&good)])
        .await;
    assert_exit(&out, 1);
    assert_eq!(
        stdout(&out),
        format!(
            "{}: matches no declared resource: same size as g/a but a different SHA-256\n{}: matches no declared resource: no installed gem declares a file of this size (5 B)\n{}: imported g/a\n",
            wrong.display(),
            unrelated.display(),
            good.display()
        )
    );
    assert_eq!(stored_files(&env, &body).len(), 1);
    assert!(stored_files(&env, &other).is_empty());
}

#[tokio::test]
async fn one_file_satisfies_every_gem_that_declares_its_bytes() {
    let env = Env::new().await;
    let body = bytes(60_000, 123);
    let first = env.serve("/first/model.bin", &body);
    let second = env.serve("/second/weights.bin", &body);
    install(&env, "one", json!([entry("m", &first, &body)])).await;
    install(&env, "two", json!([entry("w", &second, &body)])).await;
    let file = user_file(&env, "model.bin", &body);
    let out = env.run(&["import", arg(&file)]).await;
    assert_exit(&out, 0);
    assert_eq!(
        stdout(&out),
        format!("{}: imported one/m, two/w\n", file.display())
    );
    for (gem, id, name) in [("one", "m", "model.bin"), ("two", "w", "weights.bin")] {
        let out = env.run(&["path", gem, id]).await;
        assert_exit(&out, 0);
        assert!(stdout(&out).trim().ends_with(name), "{}", stdout(&out));
    }
    assert_eq!(env.origin.total_hits(), 0);
}

#[tokio::test]
async fn import_clears_the_failure_of_the_resource() {
    let env = Env::new().await;
    let body = bytes(10_000, 124);
    env.origin.route("/gone.bin", Behaviour::Status(404));
    let url = env.url("origin.test", "/gone.bin");
    install(&env, "g", json!([required_entry("gone", &url, &body)])).await;
    let status = status_json(&env).await;
    assert_eq!(status["gems"][0]["resources"][0]["state"], "failed");

    let file = user_file(&env, "gone.bin", &body);
    assert_exit(&env.run(&["import", arg(&file)]).await, 0);
    let status = status_json(&env).await;
    let r = &status["gems"][0]["resources"][0];
    assert_eq!(r["state"], "present", "{r}");
    assert!(r.get("code").is_none(), "{r}");
    // The record itself is gone, not only hidden by the present file.
    let store = Store::open(&env.store_dir()).unwrap();
    let failures = gem_resources::registry::Registry::new(&store)
        .failures("g")
        .unwrap();
    assert!(failures.is_empty(), "{failures:?}");
    // `sync` has nothing left to do, and asks nothing.
    assert_exit(&env.run(&["sync"]).await, 0);
    assert_eq!(env.origin.hits("/gone.bin"), 1);
}

#[tokio::test]
async fn json_output_is_one_document() {
    let env = Env::new().await;
    let body = bytes(20_000, 125);
    let url = env.serve("/a.bin", &body);
    install(&env, "g", json!([entry("a", &url, &body)])).await;
    let good = user_file(&env, "a.bin", &body);
    let other = user_file(&env, "b.bin", b"other");
    let out = env
        .run(&["--json", "import", arg(&good), arg(&other)])
        .await;
    assert_exit(&out, 1);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["ok"], false);
    let files = doc["files"].as_array().unwrap();
    assert_eq!(files.len(), 2);
    assert_eq!(files[0]["outcome"], "imported");
    assert_eq!(files[0]["file"], arg(&good));
    assert_eq!(files[0]["sha256"], sha256_hex(&body));
    assert_eq!(files[0]["resources"], json!(["g/a"]));
    assert_eq!(files[1]["outcome"], "no_match");
    assert_eq!(files[1]["size"], 5);
}

#[tokio::test]
async fn a_missing_file_or_no_file_is_a_usage_error() {
    let env = Env::new().await;
    let body = bytes(20_000, 126);
    let url = env.serve("/a.bin", &body);
    install(&env, "g", json!([entry("a", &url, &body)])).await;
    let good = user_file(&env, "a.bin", &body);
    let missing = env.dir.path().join("nope.bin");
    let out = env.run(&["import", arg(&good), arg(&missing)]).await;
    assert_exit(&out, 2);
    assert!(stderr(&out).contains("nope.bin"), "{}", stderr(&out));
    // Nothing was imported before the arguments were checked.
    assert!(stored_files(&env, &body).is_empty());
    assert_exit(&env.run(&["import"]).await, 2);
    assert_exit(&env.run(&["import", arg(env.dir.path())]).await, 2);
}

#[tokio::test]
async fn import_into_a_store_that_does_not_exist_matches_nothing_and_creates_nothing() {
    let env = Env::new().await;
    let file = user_file(&env, "a.bin", b"anything");
    let out = env.run(&["import", arg(&file)]).await;
    assert_exit(&out, 1);
    assert!(stdout(&out).contains("matches no declared resource"));
    assert!(!env.store_dir().exists());
}

/// Downloads `r` once with no retry, from a route that resets the
/// connection part-way, so its bytes are kept; returns how many.
async fn interrupted_download(env: &Env, body: &[u8], url: &url::Url) -> u64 {
    let config = env.config();
    let fetcher = Fetcher::new(&config).unwrap();
    let store = Store::open(&config.store_dir()).unwrap();
    let r = gem_resources::Resource {
        id: "big".into(),
        url: url.clone(),
        mirrors: vec![],
        sha256: sha256_hex(body),
        size: body.len() as u64,
        required: false,
        description: None,
    };
    let no_retry = RetryPolicy {
        retries: 0,
        backoff: Duration::ZERO,
        ..RetryPolicy::default()
    };
    download(&fetcher, &store, &r, no_retry, &mut |_| {})
        .await
        .unwrap_err();
    store.partial_len(&r.sha256).expect("bytes kept")
}

#[tokio::test]
async fn status_shows_the_bytes_a_download_kept_and_import_replaces_them() {
    let env = Env::new().await;
    let body = bytes(2 * 1024 * 1024, 127);
    let cut = body.len() * 6 / 10;
    env.origin
        .route("/big.bin", Behaviour::ranged_cut(&body, "\"v1\"", cut));
    let url = env.url("origin.test", "/big.bin");
    install(&env, "g", json!([entry("big", &url, &body)])).await;
    let kept = interrupted_download(&env, &body, &url).await;

    let status = status_json(&env).await;
    let r = &status["gems"][0]["resources"][0];
    assert_eq!(r["state"], "missing", "{r}");
    assert_eq!(r["partial_bytes"], kept, "{r}");
    let text = env.run(&["status"]).await;
    assert_exit(&text, 0);
    let expected = format!("partial {}/2.0 MiB", human(kept));
    assert!(stdout(&text).contains(&expected), "{}", stdout(&text));

    // The import takes the place of the kept bytes.
    let file = user_file(&env, "big.bin", &body);
    assert_exit(&env.run(&["import", arg(&file)]).await, 0);
    let status = status_json(&env).await;
    let r = &status["gems"][0]["resources"][0];
    assert_eq!(r["state"], "present", "{r}");
    assert!(r.get("partial_bytes").is_none(), "{r}");
    assert!(tmp_files(&env).is_empty(), "{:?}", tmp_files(&env));
}

#[tokio::test]
async fn a_failed_download_shows_its_kept_bytes_next_to_the_failure() {
    let env = Env::new().await;
    let body = bytes(1024 * 1024, 128);
    let cut = body.len() / 2;
    env.origin
        .route("/half.bin", Behaviour::ranged_cut(&body, "\"v1\"", cut));
    let url = env.url("origin.test", "/half.bin");
    install(&env, "g", json!([required_entry("half", &url, &body)])).await;
    let status = status_json(&env).await;
    let r = &status["gems"][0]["resources"][0];
    assert_eq!(r["state"], "failed", "{r}");
    let kept = r["partial_bytes"].as_u64().expect("kept bytes in --json");
    assert!(kept > 0 && kept <= cut as u64, "{r}");
    let text = stdout(&env.run(&["status"]).await);
    assert!(
        text.contains(&format!("; partial {}/1.0 MiB kept", human(kept))),
        "{text}"
    );
}

/// `render::bytes` of the binary, for the expected text.
fn human(n: u64) -> String {
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < 4 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", ["B", "KiB", "MiB", "GiB", "TiB"][unit])
}

#[cfg(unix)] // symbolic links by `std::os::unix`
#[tokio::test]
async fn a_symbolic_link_is_not_imported_through() {
    let env = Env::new().await;
    let body = bytes(20_000, 41);
    let url = env.serve("/a.bin", &body);
    install(&env, "g", json!([entry("a", &url, &body)])).await;
    let file = user_file(&env, "a.bin", &body);
    let link = env.dir.path().join("link.bin");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    let out = env.run(&["import", arg(&link)]).await;
    assert_exit(&out, 2);
    assert!(stderr(&out).contains("symbolic link"), "{}", stderr(&out));
    assert!(stored_files(&env, &body).is_empty());
}

#[cfg(unix)] // symbolic links, /dev/zero
#[tokio::test]
async fn a_path_swapped_for_a_link_to_dev_zero_never_copies_more_than_the_file() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let env = Env::new().await;
    let body = bytes(2 << 20, 42);
    let url = env.serve("/m.bin", &body);
    install(&env, "g", json!([entry("m", &url, &body)])).await;
    let original = user_file(&env, "original.bin", &body);
    let target = env.dir.path().join("m.bin");
    std::fs::hard_link(&original, &target).unwrap();
    // Flips the name between the real file and a link to /dev/zero, as
    // another user could in a folder they can write.
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = std::thread::spawn({
        let (stop, dir) = (stop.clone(), env.dir.path().to_path_buf());
        let (original, target) = (original.clone(), target.clone());
        move || {
            while !stop.load(Ordering::Relaxed) {
                let (file, link) = (dir.join("swap.file"), dir.join("swap.link"));
                let _ = std::fs::remove_file(&file);
                let _ = std::fs::remove_file(&link);
                std::fs::hard_link(&original, &file).unwrap();
                std::fs::rename(&file, &target).unwrap();
                std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
                std::fs::rename(&link, &target).unwrap();
            }
        }
    });
    let log = env.dir.path().join("import.log");
    for _ in 0..20 {
        let mut child = spawn_quiet(&env, &["import", arg(&target)], &log);
        // The old reading of /dev/zero never ended.
        let exit = wait_output(&mut child).await;
        let stderr = std::fs::read_to_string(&log).unwrap();
        assert!(matches!(exit.code(), Some(0..=2)), "{exit:?} {stderr}");
        assert_eq!(tmp_files(&env), Vec::<PathBuf>::new(), "{stderr}");
        for stored in stored_files(&env, &body) {
            assert_eq!(std::fs::metadata(&stored).unwrap().len(), body.len() as u64);
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
}

#[cfg(unix)] // a second user, symbolic links, /dev/zero
#[tokio::test]
async fn another_user_swapping_the_file_for_a_link_to_dev_zero_gets_nothing_stored() {
    use std::os::unix::fs::{chown, PermissionsExt};
    const TEST: &str = "another_user_swapping_the_file_for_a_link_to_dev_zero_gets_nothing_stored";
    let Some(user) = second_user(TEST) else {
        return;
    };
    let env = Env::new().await;
    let body = bytes(2 << 20, 43);
    let url = env.serve("/m.bin", &body);
    install(&env, "g", json!([entry("m", &url, &body)])).await;
    // Her folder, that anyone may write in, holding her file.
    let shared = shared_folder();
    let original = shared.path().join("orig");
    std::fs::write(&original, &body).unwrap();
    std::fs::set_permissions(&original, std::fs::Permissions::from_mode(0o644)).unwrap();
    chown(&original, Some(user.0), Some(user.1)).unwrap();
    let target = shared.path().join("m.bin");
    let swap = "cd \"$1\" && while :; do ln -f orig f.tmp && mv -fT f.tmp m.bin; ln -sf /dev/zero l.tmp && mv -fT l.tmp m.bin; done";
    let _swapper = Spawned(
        as_user(user, "/bin/sh")
            .args(["-c", swap, "sh", shared.path().to_str().unwrap()])
            .spawn()
            .unwrap(),
    );
    wait_until("the swapping began", || target.symlink_metadata().is_ok()).await;
    let log = env.dir.path().join("import.log");
    for _ in 0..20 {
        let mut child = spawn_quiet(&env, &["import", arg(&target)], &log);
        let exit = wait_output(&mut child).await;
        let stderr = std::fs::read_to_string(&log).unwrap();
        assert!(matches!(exit.code(), Some(0..=2)), "{exit:?} {stderr}");
        assert_eq!(tmp_files(&env), Vec::<PathBuf>::new(), "{stderr}");
        for stored in stored_files(&env, &body) {
            assert_eq!(std::fs::read(&stored).unwrap(), body);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_never_waits_for_a_hostile_download_of_the_same_bytes() {
    use crate::squatting::{config_waiting, hog_dripping};
    let env = Env::new().await;
    // Long enough that waiting for the drip would time the test out.
    config_waiting(&env, 600.0);
    let body = bytes(1 << 20, 160);
    let service = env.resources();
    let hog = hog_dripping(&env, &service, &body).await;
    let file = user_file(&env, "model.bin", &body);
    let out = within("import beside the drip", env.run(&["import", arg(&file)])).await;
    assert_exit(&out, 0);
    assert_eq!(
        stdout(&out),
        format!("{}: imported hog/m\n", file.display())
    );
    // The dripping download stops once the file is in place, and gets it.
    let hog = within("the hostile download stops", hog).await.unwrap();
    assert_eq!(std::fs::read(hog.unwrap()).unwrap(), body);
    assert_eq!(env.origin.hits("/drip.bin"), 1);
}
