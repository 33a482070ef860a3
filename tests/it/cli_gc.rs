//! `gc` on the built binary: what it removes (stored and partial files no
//! installed gem declares), what it never touches (files of installed
//! gems, files a download holds), and what `status` says about them.

use serde_json::{json, Value};

use crate::support::*;

/// Installs gem `kept` declaring `body` (required), waiting for it.
async fn install_kept(env: &Env, path: &str, body: &[u8]) {
    let url = env.serve(path, body);
    let manifest = env.write_manifest("kept.json", json!([required_entry("k", &url, body)]));
    let out = env
        .run(&["install", "kept", manifest.to_str().unwrap()])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stored_files(env, body).len(), 1);
}

/// `fetch`es `body` by hand (no gem declares it) and returns its manifest.
async fn fetch_by_hand(env: &Env, name: &str, path: &str, body: &[u8]) -> std::path::PathBuf {
    let url = env.serve(path, body);
    let manifest = env.write_manifest(name, json!([entry("loose", &url, body)]));
    let out = env.run(&["fetch", manifest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    manifest
}

/// Leaves a kept partial file of `body` behind: a `fetch` cut at half.
async fn leave_partial(env: &Env, name: &str, path: &str, body: &[u8]) {
    env.origin
        .route(path, Behaviour::ranged_cut(body, "\"v1\"", body.len() / 2));
    let url = env.url("origin.test", path);
    let manifest = env.write_manifest(name, json!([entry("cut", &url, body)]));
    let out = env.run(&["fetch", manifest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let sha = sha256_hex(body);
    assert!(
        partial_files(env)
            .iter()
            .any(|p| p.to_string_lossy().contains(&sha)),
        "a partial file of {sha} is kept"
    );
}

fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(out), stderr(out)))
}

fn has_partial_of(env: &Env, body: &[u8]) -> bool {
    let sha = sha256_hex(body);
    tmp_files(env)
        .iter()
        .any(|p| p.to_string_lossy().contains(&sha))
}

#[tokio::test]
async fn a_fetched_file_shows_in_status_and_gc_removes_it_after_a_dry_run() {
    let env = Env::new().await;
    let kept = bytes(30_000, 201);
    install_kept(&env, "/kept.bin", &kept).await;
    let before = std::fs::read(&stored_files(&env, &kept)[0]).unwrap();
    let loose = bytes(50_000, 202);
    fetch_by_hand(&env, "loose.json", "/loose.bin", &loose).await;
    let sha = sha256_hex(&loose);

    let status = env.run(&["status"]).await;
    assert!(
        stdout(&status)
            .contains("not declared by any gem: 1 file, 48.8 KiB (run `gem-resources gc`)"),
        "{}",
        stdout(&status)
    );
    let status = json_of(&env.run(&["--json", "status"]).await);
    assert_eq!(status["undeclared_files"], 1, "{status}");
    assert_eq!(status["undeclared_bytes"], 50_000, "{status}");

    let dry = env.run(&["gc", "--dry-run"]).await;
    assert_eq!(dry.status.code(), Some(0), "{}", stderr(&dry));
    let text = stdout(&dry);
    assert!(
        text.contains(&format!(
            "would remove: stored   {}  loose.bin  48.8 KiB  (not declared by any installed gem)",
            &sha[..12]
        )),
        "{text}"
    );
    assert!(
        text.contains("would remove 1 file, 48.8 KiB (1 stored, 0 partial)"),
        "{text}"
    );
    assert_eq!(
        stored_files(&env, &loose).len(),
        1,
        "a dry run removes nothing"
    );

    let out = env.run(&["gc"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("removed 1 file, 48.8 KiB (1 stored, 0 partial)"),
        "{}",
        stdout(&out)
    );
    assert!(stored_files(&env, &loose).is_empty());
    assert!(!store_root(&env).join("blobs").join(&sha).exists());
    // The installed gem's file is untouched, byte for byte.
    let after = stored_files(&env, &kept);
    assert_eq!(after.len(), 1);
    assert_eq!(std::fs::read(&after[0]).unwrap(), before);

    let status = env.run(&["status"]).await;
    assert!(
        !stdout(&status).contains("not declared"),
        "{}",
        stdout(&status)
    );
    let again = env.run(&["gc"]).await;
    assert!(
        stdout(&again).contains("removed nothing: every file in the store is declared"),
        "{}",
        stdout(&again)
    );
}

#[tokio::test]
async fn gc_of_a_store_with_no_file_says_so() {
    let env = Env::new().await;
    // A store made by an install of a gem whose files are all lazy.
    let body = bytes(1_000, 211);
    let url = env.serve("/lazy.bin", &body);
    let manifest = env.write_manifest("m.json", json!([entry("lazy", &url, &body)]));
    assert_eq!(
        env.run(&["install", "g", manifest.to_str().unwrap()])
            .await
            .status
            .code(),
        Some(0)
    );
    let out = env.run(&["gc"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("removed nothing: the store holds no file"),
        "{}",
        stdout(&out)
    );
}

#[tokio::test]
async fn a_kept_partial_file_goes_only_when_no_installed_gem_declares_it() {
    let env = Env::new().await;
    // A gem declares a file on first use; its interrupted download keeps
    // half of it.
    let lazy = bytes(400_000, 203);
    leave_partial(&env, "lazy.json", "/lazy.bin", &lazy).await;
    let lazy_url = env.url("origin.test", "/lazy.bin");
    let gem = env.write_manifest("gem.json", json!([entry("later", &lazy_url, &lazy)]));
    let out = env
        .run(&["install", "lazy-gem", gem.to_str().unwrap()])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Another interrupted download no gem declares.
    let loose = bytes(300_000, 204);
    leave_partial(&env, "loose.json", "/loose.bin", &loose).await;
    let lazy_files: Vec<_> = tmp_files(&env)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(&sha256_hex(&lazy)))
        .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
        .collect();

    let status = json_of(&env.run(&["--json", "status"]).await);
    assert_eq!(status["undeclared_files"], 1, "{status}");

    let out = env.run(&["gc"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("(0 stored, 1 partial)"), "{text}");
    assert!(
        text.contains(&format!("removed: partial  {}", &sha256_hex(&loose)[..12])),
        "{text}"
    );
    assert!(!has_partial_of(&env, &loose), "{:?}", tmp_files(&env));
    // The declared partial file and its record stay as they were.
    for (path, bytes) in &lazy_files {
        assert_eq!(&std::fs::read(path).unwrap(), bytes, "{}", path.display());
    }
}

#[tokio::test]
async fn a_file_whose_lock_another_process_holds_is_kept_as_in_use() {
    let env = Env::new().await;
    let loose = bytes(20_000, 205);
    fetch_by_hand(&env, "loose.json", "/loose.bin", &loose).await;
    let sha = sha256_hex(&loose);
    // This test process holds the lock of a download of the file, as a
    // download in progress would.
    let store = gem_resources::Store::open(&env.store_dir()).unwrap();
    let held = store
        .try_lock_lane(&sha, loose.len() as u64, 0)
        .unwrap()
        .expect("the lock is free");

    let out = env.run(&["gc"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "in use, kept: stored   {}  loose.bin  19.5 KiB  (a download holds it)",
            &sha[..12]
        )),
        "{text}"
    );
    assert!(
        text.contains("removed 0 files, 0 B (0 stored, 0 partial); 1 in use, kept"),
        "{text}"
    );
    assert_eq!(stored_files(&env, &loose).len(), 1);

    drop(held);
    let out = env.run(&["gc"]).await;
    assert!(stdout(&out).contains("removed 1 file"), "{}", stdout(&out));
    assert!(stored_files(&env, &loose).is_empty());
}

#[tokio::test]
async fn a_download_in_flight_keeps_its_partial_file_beside_a_running_serve() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    // `serve` keeps an installed gem's file while gc runs beside it.
    let kept = bytes(10_000, 206);
    let kept_url = env.serve("/kept.bin", &kept);
    let gems = write_gem_folder(
        &env,
        "served",
        json!([required_entry("k", &kept_url, &kept)]),
    );
    let log = env.dir.path().join("serve.log");
    let mut serve = spawn_serve(&env, &gems, "0.05", &log);
    wait_until("serve stored its gem's file", || {
        stored_files(&env, &kept).len() == 1
    })
    .await;
    // A `fetch` by hand that stalls half way: its download is in flight.
    let (stalled, url) = stalled_route(&env, "/stall.bin", 200_000, 100_000, 207);
    let manifest = env.write_manifest("stall.json", json!([entry("s", &url, &stalled)]));
    let fetch_log = env.dir.path().join("fetch.log");
    let _fetch = spawn_quiet(&env, &["fetch", manifest.to_str().unwrap()], &fetch_log);
    wait_until("the stalled download wrote bytes", || {
        partial_files(&env).iter().any(|p| {
            p.to_string_lossy().contains(&sha256_hex(&stalled))
                && std::fs::metadata(p).is_ok_and(|m| m.len() > 0)
        })
    })
    .await;
    // And a finished `fetch` by hand.
    let loose = bytes(5_000, 208);
    fetch_by_hand(&env, "loose.json", "/loose.bin", &loose).await;

    let out = env.run(&["--json", "gc"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report = json_of(&out);
    let removed = report["removed"].as_array().unwrap();
    assert_eq!(removed.len(), 1, "{report}");
    assert_eq!(removed[0]["sha256"], sha256_hex(&loose), "{report}");
    let in_use = report["in_use"].as_array().unwrap();
    assert_eq!(in_use.len(), 1, "{report}");
    assert_eq!(in_use[0]["sha256"], sha256_hex(&stalled), "{report}");
    assert_eq!(in_use[0]["kind"], "partial", "{report}");
    assert!(has_partial_of(&env, &stalled));
    assert!(stored_files(&env, &loose).is_empty());
    assert_eq!(std::fs::read(&stored_files(&env, &kept)[0]).unwrap(), kept);
    assert!(serve.0.try_wait().unwrap().is_none(), "serve still runs");
}

#[tokio::test]
async fn json_reports_entries_and_totals_in_bytes() {
    let env = Env::new().await;
    let loose = bytes(40_000, 209);
    fetch_by_hand(&env, "loose.json", "/loose.bin", &loose).await;
    let cut = bytes(300_000, 210);
    leave_partial(&env, "cut.json", "/cut.bin", &cut).await;

    let dry = json_of(&env.run(&["--json", "gc", "--dry-run"]).await);
    assert_eq!(dry["ok"], true, "{dry}");
    assert_eq!(dry["dry_run"], true, "{dry}");
    assert!(dry.get("removed").is_none(), "{dry}");
    let listed = dry["would_remove"].as_array().unwrap();
    assert_eq!(listed.len(), 2, "{dry}");
    let stored = &listed[0];
    assert_eq!(stored["kind"], "stored", "{dry}");
    assert_eq!(stored["sha256"], sha256_hex(&loose));
    assert_eq!(stored["bytes"], 40_000);
    assert!(stored["path"].as_str().unwrap().ends_with("loose.bin"));
    let partial = &listed[1];
    assert_eq!(partial["kind"], "partial", "{dry}");
    assert_eq!(partial["sha256"], sha256_hex(&cut));
    assert!(partial["path"].as_str().unwrap().ends_with(".partial"));
    let partial_bytes = partial["bytes"].as_u64().unwrap();
    assert!(partial_bytes > 0 && partial_bytes < 300_000 + 4096, "{dry}");
    assert_eq!(dry["files"], 2);
    assert_eq!(dry["stored"], 1);
    assert_eq!(dry["partial"], 1);
    assert_eq!(dry["bytes"], 40_000 + partial_bytes);
    assert_eq!(dry["in_use"], json!([]));
    assert_eq!(dry["in_use_files"], 0);
    assert_eq!(dry["in_use_bytes"], 0);
    assert_eq!(
        stored_files(&env, &loose).len(),
        1,
        "a dry run removes nothing"
    );
    assert!(has_partial_of(&env, &cut));

    let done = json_of(&env.run(&["--json", "gc"]).await);
    assert_eq!(done["ok"], true, "{done}");
    assert_eq!(done["dry_run"], false, "{done}");
    assert!(done.get("would_remove").is_none(), "{done}");
    assert_eq!(done["removed"], dry["would_remove"], "{done}");
    assert_eq!(done["bytes"], dry["bytes"]);
    assert!(tmp_files(&env).is_empty(), "{:?}", tmp_files(&env));
    let status = json_of(&env.run(&["--json", "status"]).await);
    assert_eq!(status["undeclared_files"], 0, "{status}");
    assert_eq!(status["undeclared_bytes"], 0, "{status}");
}
