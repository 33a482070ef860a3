//! What only the running process shows: a server resetting a connection
//! never kills the binary (SIGPIPE stays ignored), and a closed stdout ends a
//! command quietly with its normal exit status.

use std::process::{Command, Stdio};
#[cfg(unix)]
use std::time::Duration;

use serde_json::json;

use crate::support::*;

/// A route that announces `body` whole, sends 60% of it, then resets the
/// TCP connection.
fn reset_route(env: &Env, path: &str, body: &[u8]) -> url::Url {
    env.origin.route(
        path,
        Behaviour::Reset {
            body: body.to_vec(),
            sent: body.len() * 6 / 10,
        },
    );
    env.url("origin.test", path)
}

#[tokio::test]
async fn fetch_survives_a_reset_mid_body_and_falls_back_to_the_mirror() {
    let env = Env::new().await;
    // Large enough that the reset lands while the client is still reading
    // and writing on the connection.
    let body = bytes(4_000_000, 81);
    let url = reset_route(&env, "/reset.bin", &body);
    let mirror = env.serve("/good.bin", &body);
    let mut entry = entry("model", &url, &body);
    entry["mirrors"] = json!([mirror.as_str()]);
    let manifest = env.write_manifest("m.json", json!([entry]));
    for _ in 0..3 {
        let _ = std::fs::remove_dir_all(env.store_dir());
        let out = env.run(&["fetch", manifest.to_str().unwrap()]).await;
        assert_eq!(
            out.status.code(),
            Some(0),
            "the process must not die on a reset: {out:?}"
        );
        assert!(stdout(&out).starts_with("model\t"), "{}", stdout(&out));
    }
    assert!(env.origin.hits("/reset.bin") >= 3);
    assert_eq!(env.origin.hits("/good.bin"), 3);
}

#[tokio::test]
async fn serve_keeps_running_after_a_server_resets_mid_body() {
    let env = Env::new().await;
    let bad = bytes(4_000_000, 82);
    let url = reset_route(&env, "/reset.bin", &bad);
    let gems = env.dir.path().join("gems");
    write_gem_folder(&env, "resetting", json!([required_entry("r", &url, &bad)]));
    let mut serve = spawn_serve(&env, &gems, "0.05", &env.dir.path().join("serve.log"));
    wait_until("the resetting route was tried", || {
        env.origin.hits("/reset.bin") >= 1
    })
    .await;
    // The reset was seen (the download failed on it): by then the program
    // has read from, and written to, the dead connection.
    let log = env.dir.path().join("serve.log");
    wait_until("the failure on the reset is logged, or serve died", || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("E_RESOURCE_"))
            || !matches!(serve.0.try_wait(), Ok(None))
    })
    .await;
    assert!(
        serve.0.try_wait().unwrap().is_none(),
        "serve died after a reset"
    );
    // And it still does its job for another gem.
    let good = bytes(10_000, 83);
    let good_url = env.serve("/after.bin", &good);
    write_gem_folder(
        &env,
        "later",
        json!([required_entry("g", &good_url, &good)]),
    );
    wait_until("the later gem's file is stored", || {
        !stored_files(&env, &good).is_empty()
    })
    .await;
    assert!(serve.0.try_wait().unwrap().is_none(), "serve died");
}

#[tokio::test]
async fn a_closed_stdout_ends_the_command_quietly_with_its_exit_status() {
    let env = Env::new().await;
    let body = bytes(100, 84);
    let url = env.serve("/x.bin", &body);
    // A manifest with its gem id, so `check` has nothing to note on stderr.
    let manifest = env.write_manifest("m.json", json!([entry("x", &url, &body)]));
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    doc["id"] = json!("quiet-gem");
    std::fs::write(&manifest, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    // Nobody will ever read: every write to stdout fails with EPIPE.
    drop(reader);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_gem-resources"))
            .args(["check", manifest.to_str().unwrap()])
            .env("NO_COLOR", "1")
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[cfg(unix)] // SIGINT by `kill`, bytes read from /proc
#[tokio::test]
async fn ctrl_c_during_fetch_exits_130_and_says_what_was_kept() {
    let env = Env::new().await;
    let body = bytes(2_000_000, 85);
    let cut = body.len() / 2;
    let url = env.serve_held("/held.bin", &body, cut);
    // A small file finishes before the stop: its path is said too.
    let small = bytes(1000, 87);
    let small_url = env.serve("/small.bin", &small);
    let manifest = env.write_manifest(
        "m.json",
        json!([
            entry("held", &url, &body),
            entry("small", &small_url, &small)
        ]),
    );
    let log = env.dir.path().join("fetch.log");
    let mut child = spawn_logged(&env, &["fetch", manifest.to_str().unwrap()], &log);
    wait_until("the small file stored", || {
        !stored_files(&env, &small).is_empty()
    })
    .await;
    let exit = interrupt_once_bytes_are_kept(&env, &mut child, cut).await;
    let out = child_stdout(&mut child);
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert_eq!(exit.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("of held.bin kept; the next run continues"),
        "{stderr}"
    );
    let stored = stored_files(&env, &small)[0].display().to_string();
    assert_eq!(out.trim_end(), format!("small\t{stored}"), "{stderr}");
    // What had arrived when the signal came is kept and recorded.
    let store = gem_resources::Store::open(&env.store_dir()).unwrap();
    let kept = store.partial_len(&sha256_hex(&body));
    assert!(kept.is_some_and(|n| n > 0 && n <= cut as u64), "{kept:?}");
}

#[cfg(unix)] // SIGINT by `kill`, bytes read from /proc
/// Waits until the origin sent `cut` bytes and the program wrote some of
/// them to its partial file, sends SIGINT, and returns how the program
/// ended.
async fn interrupt_once_bytes_are_kept(
    env: &Env,
    child: &mut Spawned,
    cut: usize,
) -> std::process::ExitStatus {
    wait_until("the first half arrived", || {
        env.origin.served("/held.bin") >= cut as u64
    })
    .await;
    // Sent is not received: wait until the program has written some of it.
    wait_until("bytes in the partial file", || {
        partial_files(env)
            .iter()
            .any(|p| p.metadata().is_ok_and(|m| m.len() > 0))
    })
    .await;
    let status = Command::new("kill")
        .args(["-INT", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(exit) = child.0.try_wait().unwrap() {
            return exit;
        }
        assert!(std::time::Instant::now() < deadline, "it did not stop");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(unix)] // SIGINT by `kill`, bytes read from /proc
#[tokio::test]
async fn ctrl_c_during_path_keeps_the_download_and_the_next_path_resumes() {
    let env = Env::new().await;
    let body = bytes(2_000_000, 86);
    let cut = body.len() / 2;
    let url = env.serve_held("/held.bin", &body, cut);
    let manifest = env.write_manifest("m.json", json!([entry("held", &url, &body)]));
    // A lazy file: installed, not downloaded until its first `path`.
    let out = env
        .run(&["install", "g", manifest.to_str().unwrap(), "--no-wait"])
        .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let log = env.dir.path().join("path.log");
    let mut child = spawn_quiet(&env, &["path", "g", "held"], &log);
    let exit = interrupt_once_bytes_are_kept(&env, &mut child, cut).await;
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert_eq!(exit.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("interrupted: ")
            && stderr.contains("of held.bin kept; the next run continues"),
        "{stderr}"
    );
    // The bytes and their record are kept.
    let store = gem_resources::Store::open(&env.store_dir()).unwrap();
    let kept = store
        .partial_len(&sha256_hex(&body))
        .expect("the partial file and its record are kept");
    assert!(kept > 0 && kept <= cut as u64, "{kept}");
    // The next `path` asks only for the rest.
    env.origin
        .route("/held.bin", Behaviour::ranged(&body, "\"v1\""));
    let out = env.run(&["path", "g", "held"]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let range = env
        .origin
        .last_headers("/held.bin")
        .unwrap()
        .into_iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("range"))
        .map(|(_, v)| v);
    assert_eq!(range, Some(format!("bytes={kept}-")));
    let path = stdout(&out);
    assert_eq!(std::fs::read(path.trim()).unwrap(), body);
}

#[cfg(unix)] // SIGINT by `kill`, bytes read from /proc
/// Bytes `pid` has read so far (`rchar` of `/proc/<pid>/io`).
fn bytes_read(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("rchar:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

#[cfg(unix)] // SIGINT by `kill`, bytes read from /proc
/// A 4 GiB sparse file (no disk used; hashing it takes seconds).
fn sparse_file(env: &Env, name: &str) -> std::path::PathBuf {
    let path = env.dir.path().join(name);
    std::fs::File::create(&path)
        .unwrap()
        .set_len(4 << 30)
        .unwrap();
    path
}

#[cfg(unix)] // SIGINT by `kill`, bytes read from /proc
/// Sends SIGINT to `child` once it has read 64 MiB (it is hashing), and
/// returns its exit status and stderr.
async fn interrupt_while_reading(
    child: &mut Spawned,
    log: &std::path::Path,
) -> (Option<i32>, String) {
    let pid = child.0.id();
    wait_until("the program reads the big file", || {
        bytes_read(pid) > 64 << 20 || !matches!(child.0.try_wait(), Ok(None))
    })
    .await;
    let status = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = wait_output(child).await;
    (exit.code(), std::fs::read_to_string(log).unwrap())
}

#[cfg(unix)] // SIGINT by `kill`, bytes read from /proc
#[tokio::test]
async fn ctrl_c_during_import_exits_130_and_says_what_was_done() {
    let env = Env::new().await;
    let big = sparse_file(&env, "big.bin");
    // Declared with this size, so import hashes the whole file.
    let url = env.url("origin.test", "/big.bin");
    let declared =
        json!({ "id": "big", "url": url.as_str(), "sha256": "a".repeat(64), "size": 4u64 << 30 });
    let manifest = env.write_manifest("m.json", json!([declared]));
    let out = env
        .run(&["install", "g", manifest.to_str().unwrap(), "--no-wait"])
        .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let log = env.dir.path().join("import.log");
    let mut child = spawn_quiet(&env, &["import", big.to_str().unwrap()], &log);
    let (code, stderr) = interrupt_while_reading(&mut child, &log).await;
    assert_eq!(code, Some(130), "{stderr}");
    assert!(
        stderr.contains("interrupted while importing") && stderr.contains("0 of 1 file(s) done"),
        "{stderr}"
    );
}

#[cfg(unix)] // SIGINT by `kill`, bytes read from /proc
#[tokio::test]
async fn ctrl_c_during_verify_exits_130_and_removes_nothing_it_did_not_finish() {
    let env = Env::new().await;
    let body = bytes(100, 87);
    let url = env.serve("/small.bin", &body);
    let manifest = env.write_manifest("m.json", json!([required_entry("small", &url, &body)]));
    let out = env.run(&["install", "g", manifest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // A stored file whose bytes are not its SHA-256's: verify would remove
    // it, after reading it whole.
    let sha = "b".repeat(64);
    let blob = store_root(&env).join("blobs").join(&sha);
    std::fs::create_dir_all(&blob).unwrap();
    let big = blob.join("big.bin");
    std::fs::rename(sparse_file(&env, "big.bin"), &big).unwrap();
    let log = env.dir.path().join("verify.log");
    let mut child = spawn_quiet(&env, &["verify"], &log);
    let (code, stderr) = interrupt_while_reading(&mut child, &log).await;
    assert_eq!(code, Some(130), "{stderr}");
    assert!(stderr.contains("interrupted: verify stopped"), "{stderr}");
    assert!(big.exists(), "a file verify did not finish was removed");
}

#[cfg(unix)] // SIGINT by `kill`, bytes read from /proc
#[tokio::test]
async fn ctrl_c_during_autofill_exits_130_and_says_nothing_was_kept() {
    let env = Env::new().await;
    let body = bytes(1_000_000, 88);
    env.origin.route(
        "/held.bin",
        Behaviour::ranged_held(&body, "\"v1\"", 100_000),
    );
    let url = env.url("origin.test", "/held.bin");
    let log = env.dir.path().join("autofill.log");
    let mut child = spawn_quiet(&env, &["autofill", url.as_str()], &log);
    wait_until("the first bytes were sent", || {
        env.origin.served("/held.bin") >= 100_000
    })
    .await;
    let status = Command::new("kill")
        .args(["-INT", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = wait_output(&mut child).await;
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert_eq!(exit.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted: nothing was kept"), "{stderr}");
}

#[cfg(unix)] // SIGINT by `kill`, bytes read from /proc
#[tokio::test]
async fn ctrl_c_during_serve_says_what_each_download_in_flight_kept() {
    let env = Env::new().await;
    let body = bytes(2_000_000, 87);
    let cut = body.len() / 2;
    let url = env.serve_held("/held.bin", &body, cut);
    let gems = write_gem_folder(&env, "g", json!([required_entry("held", &url, &body)]));
    let log = env.dir.path().join("serve.log");
    let mut serve = spawn_serve(&env, &gems, "0.05", &log);
    let exit = interrupt_once_bytes_are_kept(&env, &mut serve, cut).await;
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert_eq!(exit.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("interrupted: ")
            && stderr.contains("of held.bin kept; the next run continues"),
        "{stderr}"
    );
    let store = gem_resources::Store::open(&env.store_dir()).unwrap();
    let kept = store.partial_len(&sha256_hex(&body));
    assert!(kept.is_some_and(|n| n > 0 && n <= cut as u64), "{kept:?}");
}

#[tokio::test]
#[cfg(unix)] // SIGINT by `kill`
async fn ctrl_c_with_json_ends_stdout_with_a_document_and_keeps_stderr_json() {
    let env = Env::new().await;
    let body = bytes(2_000_000, 86);
    let cut = body.len() / 2;
    let url = env.serve_held("/held.bin", &body, cut);
    let small = bytes(1000, 88);
    let small_url = env.serve("/small.bin", &small);
    let manifest = env.write_manifest(
        "m.json",
        json!([
            entry("held", &url, &body),
            entry("small", &small_url, &small)
        ]),
    );
    let log = env.dir.path().join("fetch.log");
    let mut child = spawn_logged(&env, &["--json", "fetch", manifest.to_str().unwrap()], &log);
    wait_until("the small file stored", || {
        !stored_files(&env, &small).is_empty()
    })
    .await;
    let exit = interrupt_once_bytes_are_kept(&env, &mut child, cut).await;
    let out = child_stdout(&mut child);
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert_eq!(exit.code(), Some(130), "{stderr}");
    let last = out.lines().last().unwrap_or_default();
    let doc: serde_json::Value =
        serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(doc["ok"], false, "{doc}");
    assert_eq!(doc["interrupted"], true, "{doc}");
    assert!(
        doc["files"][0]["kept_bytes"]
            .as_u64()
            .is_some_and(|n| n > 0),
        "{doc}"
    );
    // The file finished before the stop, with its path.
    assert_eq!(doc["resources"][0]["id"], "small", "{doc}");
    let stored = stored_files(&env, &small)[0].display().to_string();
    assert_eq!(doc["resources"][0]["path"], stored.as_str(), "{doc}");
    // stderr holds JSON lines only (debug logs aside, which this run asked
    // for with RUST_LOG: they are tracing's lines, never an `interrupted`).
    assert!(!stderr.contains("interrupted:"), "{stderr}");
    for line in stderr.lines().filter(|l| l.starts_with('{')) {
        serde_json::from_str::<serde_json::Value>(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    }
}

#[cfg(unix)] // SIGINT by `kill`
#[tokio::test]
async fn ctrl_c_while_import_copies_removes_the_partial_file_and_stores_nothing() {
    let env = Env::new().await;
    // 1 GiB of zeros (sparse): the copy runs long enough to be interrupted.
    let big = env.dir.path().join("zeros.bin");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    const ZEROS_1GIB: &str = "49bc20df15e412a64472421e13fe86ff1c5165e18b2afccf160d4dc19fe68a14";
    let url = env.url("origin.test", "/zeros.bin");
    let declared =
        json!({ "id": "z", "url": url.as_str(), "sha256": ZEROS_1GIB, "size": 1u64 << 30 });
    let manifest = env.write_manifest("m.json", json!([declared]));
    let out = env
        .run(&["install", "g", manifest.to_str().unwrap(), "--no-wait"])
        .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let log = env.dir.path().join("import.log");
    let mut child = spawn_quiet(&env, &["import", big.to_str().unwrap()], &log);
    let pid = child.0.id();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !tmp_files(&env)
        .iter()
        .any(|p| p.metadata().is_ok_and(|m| m.len() > 0))
    {
        assert!(std::time::Instant::now() < deadline, "the copy never began");
        assert!(matches!(child.0.try_wait(), Ok(None)), "it ended first");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let status = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = wait_output(&mut child).await;
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert_eq!(exit.code(), Some(130), "{stderr}");
    assert_eq!(
        tmp_files(&env),
        Vec::<std::path::PathBuf>::new(),
        "{stderr}"
    );
    let blobs = files_under(&store_root(&env).join("blobs"));
    assert!(blobs.is_empty(), "{blobs:?}");
}
