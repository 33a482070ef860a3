//! Resume of a file fetched in ranged parts: the record says which ranges
//! are durable, the next run asks only for the missing ones (each with
//! `If-Range`), and a record that claims anything inexact is discarded.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use gem_resources::partial::PartialMeta;

use crate::support::*;

/// Above the parts threshold (8 MiB).
const SIZE: usize = 12 << 20;

fn config(env: &Env) {
    env.write_config_full("", "[service]\nmax_per_host = 8\n");
}

/// 64 KiB every 4 ms per connection: below the rate that splits a file.
fn quick(body: &[u8]) -> Behaviour {
    Behaviour::parts(body, "\"p1\"", 64 << 10, Duration::from_millis(4))
}

/// The record beside the partial file of `body`.
fn record_path(env: &Env, body: &[u8]) -> PathBuf {
    let name = format!("{}.{}.partial.json", sha256_hex(body), body.len());
    store_root(env).join("tmp").join(name)
}

fn read_record(env: &Env, body: &[u8]) -> Option<PartialMeta> {
    PartialMeta::parse(&std::fs::read(record_path(env, body)).ok()?)
}

/// `bytes=s-e` → `(s, e + 1)`; `bytes=s-` → `(s, size)`.
fn asked(ranges: &[String], size: u64) -> Vec<(u64, u64)> {
    ranges
        .iter()
        .filter_map(|r| {
            let (s, e) = r.strip_prefix("bytes=")?.split_once('-')?;
            let end = if e.is_empty() {
                size
            } else {
                e.parse::<u64>().ok()? + 1
            };
            Some((s.parse().ok()?, end))
        })
        .collect()
}

/// The ranges of `[0, size)` a record does not hold.
fn missing(meta: &PartialMeta, size: u64) -> Vec<(u64, u64)> {
    let mut gaps = Vec::new();
    let mut at = meta.durable;
    for [s, e] in &meta.ranges {
        gaps.push((at, *s));
        at = *e;
    }
    if at < size {
        gaps.push((at, size));
    }
    gaps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_the_next_run_asks_only_for_the_missing_ranges() {
    let env = Env::new().await;
    config(&env);
    let body = bytes(SIZE, 51);
    // 16 KiB every 50 ms per connection: about 5 s with eight.
    env.origin.route(
        "/k.bin",
        Behaviour::parts(&body, "\"p1\"", 16 << 10, Duration::from_millis(50)),
    );
    let url = env.url("origin.test", "/k.bin");
    let manifest = env.write_manifest("m.json", serde_json::json!([entry("k", &url, &body)]));
    let mut child = fetch_until_ranges_are_kept(&env, &manifest, &body).await;
    child.kill().unwrap();
    child.wait().unwrap();
    let meta = read_record(&env, &body).unwrap();
    let gaps = missing(&meta, SIZE as u64);
    assert!(meta.durable_bytes() < SIZE as u64, "killed before the end");
    let before = env.origin.ranges("/k.bin").len();
    env.origin.route("/k.bin", quick(&body));
    let out = env.run(&["fetch", manifest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let again = asked(&env.origin.ranges("/k.bin")[before..], SIZE as u64);
    // Every range asked for lies inside one missing range...
    for (s, e) in &again {
        assert!(
            gaps.iter().any(|(gs, ge)| gs <= s && e <= ge),
            "asked {s}-{e} outside the missing {gaps:?} (record {meta:?})"
        );
    }
    // ...and each missing range is asked for from its start.
    for (gs, _) in &gaps {
        assert!(
            again.iter().any(|(s, _)| s == gs),
            "{gs} not asked: {again:?}, missing {gaps:?}"
        );
    }
    let headers = env.origin.last_headers("/k.bin").unwrap();
    assert!(headers.contains(&("if-range".into(), "\"p1\"".into())));
    assert!(partial_files(&env).is_empty());
    assert_eq!(std::fs::read(&stored_files(&env, &body)[0]).unwrap(), body);
}

#[tokio::test]
async fn a_record_of_ranges_that_is_not_exact_restarts_from_zero() {
    let body = bytes(SIZE, 52);
    let mib = 1u64 << 20;
    // Overlapping ranges; unsorted ones; one past the data file's end
    // (which holds 6 MiB); one touching the prefix.
    let bad: [Vec<[u64; 2]>; 4] = [
        vec![[2 * mib, 3 * mib], [2 * mib + 5, 4 * mib]],
        vec![[4 * mib, 5 * mib], [2 * mib, 3 * mib]],
        vec![[2 * mib, 7 * mib]],
        vec![[mib, 2 * mib]],
    ];
    for ranges in bad {
        let env = Env::new().await;
        config(&env);
        env.origin.route("/c.bin", quick(&body));
        let url = env.url("origin.test", "/c.bin");
        // What a run in parts would leave, but with the record altered.
        let tmp = store_root(&env).join("tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        let data = record_path(&env, &body).with_extension("");
        let mut kept = body[..6 << 20].to_vec();
        kept[(2 * mib + 10) as usize] ^= 0xff;
        std::fs::write(&data, &kept).unwrap();
        let record = serde_json::json!({
            "address": url.as_str(), "validator": "\"p1\"", "durable": mib, "ranges": ranges,
        });
        std::fs::write(record_path(&env, &body), record.to_string()).unwrap();
        let r = resource("c", &url, &[], &body);
        let path = fetch_with(&env, &r, no_retry()).await.unwrap();
        assert_eq!(std::fs::read(path).unwrap(), body);
        let asked = env.origin.ranges("/c.bin");
        assert!(
            asked.first().is_some_and(|r| r.starts_with("bytes=0-")),
            "{ranges:?}: a fresh start, {asked:?}"
        );
    }
}

#[tokio::test]
async fn kept_ranges_are_hashed_in_order_with_the_rest() {
    let env = Env::new().await;
    config(&env);
    let body = bytes(SIZE, 53);
    env.origin.route("/h.bin", quick(&body));
    let url = env.url("origin.test", "/h.bin");
    let mib = 1u64 << 20;
    // An exact record of a range alone (no prefix: the first part was the
    // slowest) whose bytes hold a wrong one: it is hashed when the prefix
    // reaches it, the file fails its SHA-256, and since bytes were kept the
    // address is tried once more from zero.
    let tmp = store_root(&env).join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let data = record_path(&env, &body).with_extension("");
    let mut kept = body[..(4 * mib) as usize].to_vec();
    kept[(3 * mib) as usize] ^= 0xff;
    std::fs::write(&data, &kept).unwrap();
    let record = serde_json::json!({
        "address": url.as_str(), "validator": "\"p1\"", "durable": 0,
        "ranges": [[2 * mib, 4 * mib]],
    });
    std::fs::write(record_path(&env, &body), record.to_string()).unwrap();
    let r = resource("h", &url, &[], &body);
    let logs = Logs::capture();
    let path = fetch_with(&env, &r, no_retry()).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    let asked = env.origin.ranges("/h.bin");
    assert_eq!(
        asked.first().map(String::as_str),
        Some(format!("bytes=0-{}", 2 * mib - 1).as_str()),
        "the first try asks for the gap only: {asked:?}"
    );
    // Then from zero again.
    assert!(
        asked.iter().skip(1).any(|r| r.starts_with("bytes=0-")),
        "{asked:?}"
    );
    assert!(logs.text().contains("E_RESOURCE_SHA256"), "{}", logs.text());
}

/// The steps of [`a_disk_that_fills_during_parts_is_disk_space_and_keeps_its_ranges`],
/// run in a user and mount namespace of their own over a small tmpfs
/// (`$1` the tmpfs, `$2` the folder of marks, `$3` the binary, `$4` the
/// configuration, `$5` the manifest).
#[cfg(target_os = "linux")]
const FILL_DURING_PARTS: &str = r#"
set -u
# Every wait gives up after a minute: nothing outlives the test.
wait_for() { n=0; until eval "$1"; do n=$((n + 1)); [ $n -lt 1200 ] || exit 91; sleep 0.05; done; }
mount -t tmpfs -o size=24m,mode=0700 tmpfs "$1" || exit 90
"$3" --config "$4" fetch "$5" >"$2/out1" 2>"$2/err1" &
pid=$!
# A part has written beyond the middle, before the first checkpoint
# (every 2 s): only the writer's last record can hold its range.
wait_for "[ \$(stat -c %s \"$1\"/store/store-v1/tmp/*.partial 2>/dev/null || echo 0) -gt 6291456 ]"
cat /dev/zero >"$1/filler" 2>/dev/null
wait $pid
echo $? >"$2/rc1.tmp"
cp "$1"/store/store-v1/tmp/*.partial.json "$2/record.json"
mv "$2/rc1.tmp" "$2/rc1"
wait_for "[ -e \"$2/go\" ]"
rm "$1/filler"
"$3" --config "$4" fetch "$5" >"$2/out2" 2>"$2/err2"
echo $? >"$2/rc2"
find "$1/store/store-v1/blobs" -type f -exec sha256sum {} + >"$2/sums"
"#;

// A tmpfs of its own through `unshare`: Linux only.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_that_fills_during_parts_is_disk_space_and_keeps_its_ranges() {
    let env = Env::new().await;
    let config = env.write_config_full("", "[service]\nmax_per_host = 8\n");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replacen("store = \"store\"", "store = \"disk/store\"", 1),
    )
    .unwrap();
    let body = bytes(SIZE, 54);
    // 16 KiB every 50 ms per connection: about 5 s with eight.
    env.origin.route(
        "/full.bin",
        Behaviour::parts(&body, "\"p1\"", 16 << 10, Duration::from_millis(50)),
    );
    let url = env.url("origin.test", "/full.bin");
    let manifest = env.write_manifest("m.json", serde_json::json!([entry("f", &url, &body)]));
    let (disk, marks) = (env.dir.path().join("disk"), env.dir.path().join("marks"));
    std::fs::create_dir_all(&disk).unwrap();
    std::fs::create_dir_all(&marks).unwrap();
    let mut child = std::process::Command::new("unshare")
        .args([
            "--user",
            "--map-root-user",
            "--mount",
            "sh",
            "-c",
            FILL_DURING_PARTS,
            "sh",
        ])
        .args([&disk, &marks])
        .arg(env!("CARGO_BIN_EXE_gem-resources"))
        .args([&config, &manifest])
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let rc1 = loop {
        if let Ok(rc) = std::fs::read_to_string(marks.join("rc1")) {
            break rc;
        }
        if let Ok(Some(status)) = child.try_wait() {
            // No user namespaces here (a locked-down kernel or container).
            eprintln!("SKIPPED: cannot mount a small file system ({status})");
            return;
        }
        assert!(Instant::now() < deadline, "the first run did not end");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let err1 = std::fs::read_to_string(marks.join("err1")).unwrap();
    assert_eq!(rc1.trim(), "1", "{err1}");
    assert!(err1.contains("E_RESOURCE_DISK_SPACE"), "{err1}");
    assert!(err1.contains("no space left"), "{err1}");
    let record = std::fs::read(marks.join("record.json"));
    let meta = record.ok().and_then(|r| PartialMeta::parse(&r));
    let meta = meta.unwrap_or_else(|| panic!("no record kept: {err1}"));
    assert!(!meta.ranges.is_empty(), "ranges kept: {meta:?}");
    let gaps = missing(&meta, SIZE as u64);
    let before = env.origin.ranges("/full.bin").len();
    env.origin.route("/full.bin", quick(&body));
    std::fs::write(marks.join("go"), "").unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let err2 = std::fs::read_to_string(marks.join("err2")).unwrap_or_default();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(marks.join("rc2")).unwrap().trim(),
        "0",
        "{err2}"
    );
    let again = asked(&env.origin.ranges("/full.bin")[before..], SIZE as u64);
    assert!(!again.is_empty());
    for (s, e) in &again {
        assert!(
            gaps.iter().any(|(gs, ge)| gs <= s && e <= ge),
            "asked {s}-{e} outside the missing {gaps:?} (record {meta:?})"
        );
    }
    let sums = std::fs::read_to_string(marks.join("sums")).unwrap();
    assert!(sums.contains(&sha256_hex(&body)), "{sums}");
}

/// Starts `fetch` of `manifest` and returns once the record of `body`
/// holds ranges written ahead of the prefix by several parts (checkpoints
/// come every couple of seconds).
async fn fetch_until_ranges_are_kept(
    env: &Env,
    manifest: &std::path::Path,
    body: &[u8],
) -> std::process::Child {
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_gem-resources"))
        .arg("--config")
        .arg(env.dir.path().join("config.toml"))
        .args(["fetch", manifest.to_str().unwrap()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while read_record(env, body).is_none_or(|m| m.ranges.len() < 2) {
        assert!(Instant::now() < deadline, "no durable ranges recorded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child
}

/// [`fetch_until_ranges_are_kept`], then `signal` to it; the record then.
#[cfg(unix)]
async fn interrupted_fetch(
    env: &Env,
    manifest: &std::path::Path,
    body: &[u8],
    signal: libc::c_int,
) -> PartialMeta {
    let mut child = fetch_until_ranges_are_kept(env, manifest, body).await;
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, signal) };
    child.wait().unwrap();
    read_record(env, body).unwrap()
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_split_at_once_keeps_every_kept_range_and_fetches_each_byte_once() {
    let env = Env::new().await;
    config(&env);
    let body = bytes(SIZE, 52);
    env.origin.route(
        "/far.bin",
        Behaviour::parts(&body, "\"f1\"", 16 << 10, Duration::from_millis(50)),
    );
    let url = env.url("origin.test", "/far.bin");
    let manifest = env.write_manifest("m.json", serde_json::json!([entry("f", &url, &body)]));
    let meta = interrupted_fetch(&env, &manifest, &body, libc::SIGINT).await;
    let kept = meta.durable_bytes();
    let sent_before = env.origin.served("/far.bin");
    // The next run finds a far server: every answer comes 150 ms late, so
    // the file is split at once over the missing ranges.
    env.origin.route(
        "/far.bin",
        Behaviour::Parts {
            body: std::sync::Arc::new(body.clone()),
            etag: "\"f1\"".into(),
            pace: (64 << 10, Duration::from_millis(4)),
            fault: PartsFault::LateHeads(Duration::from_millis(150)),
        },
    );
    let out = env.run(&["fetch", manifest.to_str().unwrap()]).await;
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(!text.contains("trying again from zero"), "{text}");
    assert_eq!(std::fs::read(&stored_files(&env, &body)[0]).unwrap(), body);
    let sent_after = env.origin.served("/far.bin") - sent_before;
    let missing = SIZE as u64 - kept;
    eprintln!(
        "kept {kept} of {SIZE}; sent before the stop {sent_before}, after {sent_after} for {missing} missing"
    );
    // Every kept byte stays kept: the run fetched what was missing (and
    // at most one piece more per connection cut short).
    assert!(
        sent_after <= missing + 8 * (64 << 10),
        "the resumed run fetched {sent_after} bytes where {missing} were missing (kept {kept}, record {meta:?})"
    );
    // And what arrived before the stop was kept: at most the pieces on
    // the way were lost.
    assert!(
        sent_before <= kept + 8 * (64 << 10),
        "{sent_before} bytes were sent before the stop and {kept} kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_then_unblock_and_a_restart_under_a_download_in_parts_fetch_each_byte_once() {
    use gem_resources::policy::{Mode, Policy};
    let env = Env::new().await;
    config(&env);
    let body = bytes(SIZE, 53);
    // A far server (every answer 150 ms late): each start splits at once.
    env.origin.route(
        "/stop.bin",
        Behaviour::Parts {
            body: std::sync::Arc::new(body.clone()),
            etag: "\"s1\"".into(),
            pace: (16 << 10, Duration::from_millis(50)),
            fault: PartsFault::LateHeads(Duration::from_millis(150)),
        },
    );
    let url = env.url("origin.test", "/stop.bin");
    let ranges_kept = |more_than: u64| {
        let env = &env;
        let body = &body;
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            while read_record(env, body)
                .is_none_or(|m| m.ranges.len() < 2 || m.durable_bytes() <= more_than)
            {
                assert!(Instant::now() < deadline, "no durable ranges recorded");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            read_record(env, body).unwrap().durable_bytes()
        }
    };
    let service = gem_resources::Resources::open(&env.config()).unwrap();
    service
        .install(
            "g",
            &manifest(serde_json::json!([required_entry("s", &url, &body)])),
        )
        .await
        .unwrap();
    let kept = ranges_kept(0).await;
    // Blocked, then allowed again: the download stops and resumes.
    let blocked = Policy::new(Mode::Blocklist, &["origin.test".into()]).unwrap();
    service.set_policy(blocked).unwrap();
    service.wait_idle().await;
    assert_eq!(service.set_policy(Policy::allow_all()).unwrap(), 1);
    let kept = ranges_kept(kept).await;
    // The service stops under the download and starts again.
    service.shutdown().await;
    let kept_at_restart = read_record(&env, &body).map_or(kept, |m| m.durable_bytes());
    let service = gem_resources::Resources::open(&env.config()).unwrap();
    assert_eq!(service.start().await.unwrap(), 1);
    tokio::time::timeout(Duration::from_secs(60), service.wait_idle())
        .await
        .expect("the download ends");
    assert_eq!(std::fs::read(&stored_files(&env, &body)[0]).unwrap(), body);
    let sent = env.origin.served("/stop.bin");
    eprintln!(
        "block, unblock and restart: the origin sent {sent} bytes for {SIZE} (kept {kept_at_restart} at the restart)"
    );
    // Two stops: at most the pieces on the way at each (one per
    // connection), and the end game's last pieces.
    assert!(
        sent <= SIZE as u64 + 2 * 8 * (16 << 10) + 8 * (64 << 10),
        "the origin sent {sent} bytes for a file of {SIZE}"
    );
    service.shutdown().await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_answers_closed_ranges_with_200_keeps_the_prefix_kept() {
    let env = Env::new().await;
    config(&env);
    let body = bytes(SIZE, 54);
    env.origin.route(
        "/open.bin",
        Behaviour::parts(&body, "\"o1\"", 16 << 10, Duration::from_millis(50)),
    );
    let url = env.url("origin.test", "/open.bin");
    let manifest = env.write_manifest("m.json", serde_json::json!([entry("f", &url, &body)]));
    let meta = interrupted_fetch(&env, &manifest, &body, libc::SIGINT).await;
    let prefix = meta.durable;
    assert!(prefix > 0, "{meta:?}");
    let sent_before = env.origin.served("/open.bin");
    // Now the server answers `bytes=S-` with 206 but a closed range
    // `bytes=S-E` with the whole file (200), as some servers do.
    env.origin.route(
        "/open.bin",
        Behaviour::Ranged {
            body: body.clone(),
            etag: "\"o1\"".into(),
            ignore_range: false,
            cut_at: None,
            hold: false,
            // Paced, so that the whole file answered to a closed range is
            // seen refused before much of it was sent.
            pace: Some((64 << 10, Duration::from_millis(10))),
        },
    );
    let out = env.run(&["fetch", manifest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(std::fs::read(&stored_files(&env, &body)[0]).unwrap(), body);
    let ranges = env.origin.ranges("/open.bin");
    let sent_after = env.origin.served("/open.bin") - sent_before;
    eprintln!(
        "prefix {prefix}, record {meta:?}; asked {ranges:?}; sent {sent_after} after the stop"
    );
    // The prefix is never fetched again: at most one whole answer that
    // was refused at its head, then the rest from the prefix.
    assert!(
        ranges.iter().any(|r| r == &format!("bytes={prefix}-")),
        "the prefix was not continued: {ranges:?}"
    );
    // Starting over would send the prefix again too.
    assert!(
        sent_after <= (SIZE as u64 - prefix) + (512 << 10),
        "{sent_after} bytes sent after the stop for {} missing after the prefix",
        SIZE as u64 - prefix
    );
}
