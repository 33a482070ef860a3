//! Staying power: interrupted transfers continue with `Range`, the server's
//! `Retry-After` is honoured, and a bandwidth cap holds.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gem_resources::{download, Error, Fetcher, Resource, RetryPolicy, Store};
use serde_json::json;

use crate::support::fetch_with as fetch;
use crate::support::*;
/// Retries at once: the tests are about what is asked, not when.
fn quick() -> RetryPolicy {
    RetryPolicy {
        retries: 3,
        backoff: Duration::ZERO,
        ..RetryPolicy::default()
    }
}
/// The `Range` header of the last request for `path`.
fn last_range(env: &Env, path: &str) -> Option<String> {
    env.origin
        .last_headers(path)?
        .into_iter()
        .find(|(n, _)| n == "range")
        .map(|(_, v)| v)
}

fn header(env: &Env, path: &str, name: &str) -> Option<String> {
    env.origin
        .last_headers(path)?
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v)
}

#[tokio::test]
async fn a_reset_at_60_percent_continues_with_one_range_request() {
    let env = Env::new().await;
    let body = bytes(2_000_000, 90);
    let cut = body.len() * 6 / 10;
    env.origin.route(
        "/m.bin",
        Behaviour::Sequence(vec![
            Behaviour::ranged_cut(&body, "\"v1\"", cut),
            Behaviour::ranged(&body, "\"v1\""),
        ]),
    );
    let r = resource("m", &env.url("origin.test", "/m.bin"), &[], &body);
    let path = fetch(&env, &r, quick()).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(env.origin.hits("/m.bin"), 2);
    let range = last_range(&env, "/m.bin").expect("the second request asks for a range");
    let from: usize = range
        .strip_prefix("bytes=")
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(from > 0 && from <= cut, "{range}");
    assert_eq!(
        header(&env, "/m.bin", "if-range").as_deref(),
        Some("\"v1\"")
    );
    // Only the rest was served the second time.
    assert_eq!(
        env.origin.served("/m.bin"),
        (cut + body.len() - from) as u64
    );
    assert!(partial_files(&env).is_empty());
}

#[tokio::test]
async fn an_origin_that_ignores_range_still_ends_verified() {
    let env = Env::new().await;
    let body = bytes(1_000_000, 91);
    let cut = body.len() / 2;
    let ignoring = |cut_at| Behaviour::Ranged {
        body: body.clone(),
        etag: "\"v1\"".into(),
        ignore_range: true,
        cut_at,
        hold: false,
        pace: None,
    };
    env.origin.route(
        "/i.bin",
        Behaviour::Sequence(vec![ignoring(Some(cut)), ignoring(None)]),
    );
    let r = resource("i", &env.url("origin.test", "/i.bin"), &[], &body);
    let path = fetch(&env, &r, quick()).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert!(
        last_range(&env, "/i.bin").is_some(),
        "a range was asked for"
    );
    assert_eq!(env.origin.served("/i.bin"), (cut + body.len()) as u64);
}

#[tokio::test]
async fn a_changed_etag_starts_over() {
    let env = Env::new().await;
    let body = bytes(1_000_000, 92);
    let cut = body.len() / 2;
    env.origin.route(
        "/e.bin",
        Behaviour::Sequence(vec![
            Behaviour::ranged_cut(&body, "\"v1\"", cut),
            Behaviour::ranged(&body, "\"v2\""),
        ]),
    );
    let r = resource("e", &env.url("origin.test", "/e.bin"), &[], &body);
    let path = fetch(&env, &r, quick()).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(
        header(&env, "/e.bin", "if-range").as_deref(),
        Some("\"v1\"")
    );
    // The server answered 200 whole: the kept half was thrown away.
    assert_eq!(env.origin.served("/e.bin"), (cut + body.len()) as u64);
}

#[tokio::test]
async fn a_bad_resumed_file_is_fetched_again_from_zero_once() {
    let env = Env::new().await;
    let body = bytes(1_000_000, 93);
    // The first response sends wrong bytes before it breaks off; the
    // continuation is right, so the whole is wrong.
    let mut bad = body.clone();
    bad[10] ^= 0xff;
    let cut = body.len() / 2;
    env.origin.route(
        "/b.bin",
        Behaviour::Sequence(vec![
            Behaviour::ranged_cut(&bad, "\"v1\"", cut),
            Behaviour::ranged(&body, "\"v1\""),
        ]),
    );
    let r = resource("b", &env.url("origin.test", "/b.bin"), &[], &body);
    let path = fetch(&env, &r, quick()).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(env.origin.hits("/b.bin"), 3);
    assert_eq!(
        last_range(&env, "/b.bin"),
        None,
        "the last try starts at zero"
    );
}

#[tokio::test]
async fn a_resumed_file_that_fails_twice_moves_on_to_the_mirror() {
    let env = Env::new().await;
    let body = bytes(500_000, 94);
    let mut bad = body.clone();
    bad[10] ^= 0xff;
    let cut = body.len() / 2;
    env.origin.route(
        "/bad.bin",
        Behaviour::Sequence(vec![
            Behaviour::ranged_cut(&bad, "\"v1\"", cut),
            Behaviour::ranged(&bad, "\"v1\""),
        ]),
    );
    let mirror = env.serve("/good.bin", &body);
    let r = resource("b", &env.url("origin.test", "/bad.bin"), &[mirror], &body);
    let path = fetch(&env, &r, quick()).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(env.origin.hits("/bad.bin"), 3);
    assert_eq!(env.origin.hits("/good.bin"), 1);
}

#[tokio::test]
async fn an_inconsistent_range_answer_discards_the_kept_bytes() {
    let env = Env::new().await;
    let body = bytes(400_000, 95);
    let cut = body.len() / 2;
    // The second answer is a 416; the third, asked without a range, is whole.
    env.origin.route(
        "/r.bin",
        Behaviour::Sequence(vec![
            Behaviour::ranged_cut(&body, "\"v1\"", cut),
            Behaviour::Status(416),
            Behaviour::ranged(&body, "\"v1\""),
        ]),
    );
    let r = resource("r", &env.url("origin.test", "/r.bin"), &[], &body);
    let path = fetch(&env, &r, quick()).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(env.origin.hits("/r.bin"), 3);
    assert_eq!(last_range(&env, "/r.bin"), None);
}

#[tokio::test]
async fn without_a_validator_nothing_is_kept_and_the_retry_starts_at_zero() {
    let env = Env::new().await;
    let body = bytes(400_000, 96);
    env.origin.route(
        "/n.bin",
        Behaviour::Sequence(vec![
            Behaviour::Reset {
                body: body.clone(),
                sent: body.len() / 2,
            },
            Behaviour::Body(body.clone()),
        ]),
    );
    let r = resource("n", &env.url("origin.test", "/n.bin"), &[], &body);
    fetch(&env, &r, quick()).await.unwrap();
    assert_eq!(env.origin.hits("/n.bin"), 2);
    assert_eq!(last_range(&env, "/n.bin"), None);
}

#[tokio::test]
async fn a_failed_download_keeps_its_bytes_for_the_next_call() {
    let env = Env::new().await;
    let body = bytes(1_000_000, 97);
    let cut = body.len() * 6 / 10;
    env.origin
        .route("/k.bin", Behaviour::ranged_cut(&body, "\"v1\"", cut));
    let r = resource("k", &env.url("origin.test", "/k.bin"), &[], &body);
    let no_retry = RetryPolicy {
        retries: 0,
        ..quick()
    };
    let err = fetch(&env, &r, no_retry).await.unwrap_err();
    assert_eq!(err.code(), "E_RESOURCE_UNAVAILABLE");
    let store = Store::open(&env.store_dir()).unwrap();
    let kept = store.partial_len(&r.sha256).expect("bytes kept");
    assert!(kept > 0 && kept <= cut as u64, "{kept}");
    // Nothing is visible at a final path.
    assert!(stored_files(&env, &body).is_empty());
    env.origin
        .route("/k.bin", Behaviour::ranged(&body, "\"v1\""));
    fetch(&env, &r, no_retry).await.unwrap();
    assert_eq!(last_range(&env, "/k.bin"), Some(format!("bytes={kept}-")));
}

#[tokio::test]
async fn a_download_killed_with_sigkill_resumes_in_the_next_process() {
    let env = Env::new().await;
    let body = bytes(3_000_000, 98);
    let cut = body.len() / 2;
    let url = env.serve_held("/kill.bin", &body, cut);
    let manifest = env.write_manifest("m.json", json!([entry("kill", &url, &body)]));
    let mut child = Command::new(env!("CARGO_BIN_EXE_gem-resources"))
        .arg("--config")
        .arg(env.dir.path().join("config.toml"))
        .args(["fetch", manifest.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let store = Store::open(&env.store_dir()).unwrap();
    let sha = sha256_hex(&body);
    // The writer records flushed bytes every couple of seconds.
    let deadline = Instant::now() + Duration::from_secs(20);
    while store.partial_len(&sha).unwrap_or(0) < cut as u64 {
        assert!(Instant::now() < deadline, "no durable bytes recorded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    env.origin
        .route("/kill.bin", Behaviour::ranged(&body, "\"v1\""));
    let out = env.run(&["fetch", manifest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(last_range(&env, "/kill.bin"), Some(format!("bytes={cut}-")));
    assert_eq!(env.origin.served("/kill.bin"), body.len() as u64);
}

/// Serves `status` with `Retry-After: value` once, then `body`; downloads
/// it and returns how long that took (two requests, checked).
async fn busy_then_ready(env: &Env, path: &str, status: u16, value: &str, body: &[u8]) -> Duration {
    env.origin.route(
        path,
        Behaviour::Sequence(vec![
            Behaviour::RetryAfter {
                status,
                value: value.into(),
            },
            Behaviour::Body(body.to_vec()),
        ]),
    );
    let r = resource("busy", &env.url("origin.test", path), &[], body);
    let start = Instant::now();
    fetch(env, &r, quick()).await.unwrap();
    assert_eq!(env.origin.hits(path), 2);
    start.elapsed()
}

#[tokio::test]
async fn retry_after_in_seconds_is_honoured() {
    let env = Env::new().await;
    let body = bytes(10_000, 99);
    let waited = busy_then_ready(&env, "/busy.bin", 503, "1", &body).await;
    assert!(waited >= Duration::from_millis(950), "{waited:?}");
}

#[tokio::test]
async fn retry_after_as_an_http_date_is_honoured() {
    let env = Env::new().await;
    let body = bytes(10_000, 100);
    let when = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(2));
    let waited = busy_then_ready(&env, "/date.bin", 429, &when, &body).await;
    // HTTP dates have whole seconds: at least one second is left.
    assert!(waited >= Duration::from_millis(900), "{waited:?}");
}

#[tokio::test]
async fn a_retry_after_beyond_the_cap_moves_on_to_the_next_address_at_once() {
    let env = Env::new().await;
    let body = bytes(10_000, 101);
    env.origin.route(
        "/later.bin",
        Behaviour::RetryAfter {
            status: 503,
            value: "3600".into(),
        },
    );
    let mirror = env.serve("/now.bin", &body);
    let r = resource("l", &env.url("origin.test", "/later.bin"), &[mirror], &body);
    let start = Instant::now();
    fetch(&env, &r, quick()).await.unwrap();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(env.origin.hits("/later.bin"), 1);
    assert_eq!(env.origin.hits("/now.bin"), 1);
}

#[tokio::test]
async fn a_transient_failure_is_retried_on_the_same_address_before_the_mirror() {
    let env = Env::new().await;
    let body = bytes(10_000, 102);
    env.origin.route(
        "/flaky.bin",
        Behaviour::Sequence(vec![Behaviour::Status(502), Behaviour::Body(body.clone())]),
    );
    let mirror = env.serve("/mirror.bin", &body);
    let r = resource("f", &env.url("origin.test", "/flaky.bin"), &[mirror], &body);
    fetch(&env, &r, quick()).await.unwrap();
    assert_eq!(env.origin.hits("/flaky.bin"), 2);
    assert_eq!(env.origin.hits("/mirror.bin"), 0);
}

#[tokio::test]
async fn a_permanent_failure_moves_on_at_once() {
    let env = Env::new().await;
    let body = bytes(10_000, 103);
    env.origin.route("/gone.bin", Behaviour::Status(410));
    let mirror = env.serve("/mirror.bin", &body);
    let r = resource("g", &env.url("origin.test", "/gone.bin"), &[mirror], &body);
    fetch(&env, &r, quick()).await.unwrap();
    assert_eq!(env.origin.hits("/gone.bin"), 1);
    assert_eq!(env.origin.hits("/mirror.bin"), 1);
}

/// Downloads `files` bodies of `len` bytes at once under a cap of `rate`
/// bytes per second and returns the time taken.
async fn capped(env: &Env, rate: u64, files: usize, len: usize) -> Duration {
    env.write_config(&format!("max_bytes_per_sec = {rate}"));
    let config = env.config();
    let fetcher = Fetcher::new(&config).unwrap();
    let store = Store::open(&config.store_dir()).unwrap();
    let resources: Vec<Resource> = (0..files)
        .map(|i| {
            let body = bytes(len, 110 + i as u8);
            let url = env.serve(&format!("/cap{i}.bin"), &body);
            resource(&format!("c{i}"), &url, &[], &body)
        })
        .collect();
    let start = Instant::now();
    let downloads = resources.iter().map(|r| {
        let (fetcher, store) = (&fetcher, &store);
        async move { download(fetcher, store, r, quick(), &mut |_| {}).await }
    });
    for result in futures_util::future::join_all(downloads).await {
        result.unwrap();
    }
    start.elapsed()
}

#[tokio::test]
async fn the_bandwidth_cap_holds_for_one_download_and_for_two() {
    let rate = 1_000_000u64;
    for (files, len) in [(1usize, 3_000_000usize), (2, 2_000_000)] {
        let env = Env::new().await;
        let elapsed = capped(&env, rate, files, len).await.as_secs_f64();
        // At the cap from the start: the bucket starts empty.
        let expected = (files * len) as f64 / rate as f64;
        let error = (elapsed - expected).abs() / expected;
        assert!(
            error < 0.10,
            "{files} download(s): {elapsed:.2}s, expected {expected:.2}s"
        );
    }
}

#[tokio::test]
async fn a_cancelled_download_keeps_its_bytes_and_is_not_a_failure() {
    let env = Env::new().await;
    let body = bytes(2_000_000, 104);
    env.origin.route(
        "/c.bin",
        Behaviour::ranged_held(&body, "\"v1\"", body.len() / 4),
    );
    let r = resource("c", &env.url("origin.test", "/c.bin"), &[], &body);
    let config = env.config();
    let fetcher = Fetcher::new(&config).unwrap();
    let store = Store::open(&config.store_dir()).unwrap();
    let token = tokio_util::sync::CancellationToken::new();
    let cancel = token.clone();
    let mut seen = 0u64;
    let result = {
        let mut progress = |n: u64| {
            seen = n;
            if n >= (body.len() / 4) as u64 {
                cancel.cancel();
            }
        };
        gem_resources::download_with(&fetcher, &store, &r, quick(), &mut progress, Some(&token))
            .await
    };
    assert!(matches!(result, Err(Error::Cancelled { .. })), "{result:?}");
    assert_eq!(store.partial_len(&r.sha256), Some(seen));
    assert!(store
        .failure_since(
            &r.sha256,
            r.size,
            &[r.url.to_string()],
            std::time::UNIX_EPOCH
        )
        .is_none());
}

#[tokio::test]
async fn the_service_reports_a_resumed_download_with_its_offset() {
    let env = Env::new().await;
    let body = bytes(1_000_000, 105);
    let cut = body.len() / 2;
    env.origin.route(
        "/s.bin",
        Behaviour::Sequence(vec![
            Behaviour::ranged_cut(&body, "\"v1\"", cut),
            Behaviour::ranged(&body, "\"v1\""),
        ]),
    );
    let url = env.url("origin.test", "/s.bin");
    // The test configuration retries nothing: the first path() fails.
    let service = gem_resources::Resources::open(&env.config()).unwrap();
    service
        .install("g", &manifest(json!([entry("s", &url, &body)])))
        .await
        .unwrap();
    let mut events = service.subscribe();
    assert!(service.path("g", "s").await.is_err());
    let path = service.path("g", "s").await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    let mut resumed = None;
    while let Ok(event) = events.try_recv() {
        if let gem_resources::Event::Resumed { offset, .. } = event {
            resumed = Some(offset);
        }
    }
    let offset = resumed.expect("a Resumed event");
    assert!(offset > 0 && offset <= cut as u64, "{offset}");
    assert_eq!(last_range(&env, "/s.bin"), Some(format!("bytes={offset}-")));
    service.shutdown().await;
}

#[tokio::test]
async fn a_silent_resumable_transfer_still_stalls_out_while_its_bytes_are_recorded() {
    let env = Env::new().await;
    env.write_config("stall_timeout_secs = 3");
    let body = bytes(1_000_000, 106);
    let cut = body.len() / 2;
    env.origin
        .route("/quiet.bin", Behaviour::ranged_held(&body, "\"v1\"", cut));
    let r = resource("q", &env.url("origin.test", "/quiet.bin"), &[], &body);
    let no_retry = RetryPolicy {
        retries: 0,
        ..quick()
    };
    let start = Instant::now();
    let err = fetch(&env, &r, no_retry).await.unwrap_err();
    // The periodic records of the bytes received must not hold off the
    // stall timeout.
    assert!(err.to_string().contains("stalled"), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "{:?}",
        start.elapsed()
    );
    let store = Store::open(&env.store_dir()).unwrap();
    assert_eq!(store.partial_len(&r.sha256), Some(cut as u64));
}

/// Installs gem `g` declaring `body` (lazy) on a route that breaks off half
/// way, and leaves its kept bytes behind with one failed `path`.
async fn gem_with_kept_bytes(env: &Env, body: &[u8]) -> gem_resources::Resources {
    env.origin.route(
        "/kept.bin",
        Behaviour::ranged_cut(body, "\"v1\"", body.len() / 2),
    );
    let url = env.url("origin.test", "/kept.bin");
    let service = gem_resources::Resources::open(&env.config()).unwrap();
    service
        .install("g", &manifest(json!([entry("k", &url, body)])))
        .await
        .unwrap();
    assert!(service.path("g", "k").await.is_err());
    let kept = service.store().partial_len(&sha256_hex(body));
    assert!(kept.is_some_and(|n| n > 0), "{kept:?}");
    service
}

#[tokio::test]
async fn uninstall_removes_the_kept_bytes_of_its_files() {
    let env = Env::new().await;
    let body = bytes(400_000, 107);
    let service = gem_with_kept_bytes(&env, &body).await;
    service.uninstall("g").await.unwrap();
    assert_eq!(service.store().partial_len(&sha256_hex(&body)), None);
    assert!(tmp_files(&env).is_empty(), "{:?}", tmp_files(&env));
    service.shutdown().await;
}

#[tokio::test]
async fn start_keeps_declared_partial_files_and_removes_undeclared_ones() {
    let env = Env::new().await;
    let body = bytes(400_000, 108);
    let service = gem_with_kept_bytes(&env, &body).await;
    // Bytes of a file no gem declares (a `fetch` of another manifest).
    let other = bytes(300_000, 109);
    env.origin.route(
        "/other.bin",
        Behaviour::ranged_cut(&other, "\"v1\"", other.len() / 2),
    );
    let r = resource("o", &env.url("origin.test", "/other.bin"), &[], &other);
    assert!(fetch(
        &env,
        &r,
        RetryPolicy {
            retries: 0,
            ..quick()
        }
    )
    .await
    .is_err());
    assert!(service.store().partial_len(&r.sha256).is_some());
    service.start().await.unwrap();
    service.wait_idle().await;
    assert!(
        service.store().partial_len(&sha256_hex(&body)).is_some(),
        "declared: kept"
    );
    assert_eq!(
        service.store().partial_len(&r.sha256),
        None,
        "undeclared: removed"
    );
    service.shutdown().await;
}

#[tokio::test]
async fn start_removes_partial_files_older_than_the_configured_age() {
    let env = Env::new().await;
    let body = bytes(400_000, 110);
    drop(gem_with_kept_bytes(&env, &body).await);
    env.write_config("partial_max_age_days = 0");
    let service = gem_resources::Resources::open(&env.config()).unwrap();
    service.start().await.unwrap();
    service.shutdown().await;
    assert_eq!(service.store().partial_len(&sha256_hex(&body)), None);
    assert!(tmp_files(&env).is_empty(), "{:?}", tmp_files(&env));
}
