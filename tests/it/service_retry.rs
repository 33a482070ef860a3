//! A running service tries a failed required file again on its own
//! (`service.retry_failed_after`), and only such files; the record of what
//! served a file goes with the file.

use std::time::{Duration, Instant};

use gem_resources::{ResourceState, Resources};
use serde_json::json;

use crate::support::*;

/// The service with the periodic retry set to `after`.
fn open_retrying(env: &Env, after: Duration) -> Resources {
    let mut config = env.config();
    config.service.retry_failed_after = after;
    Resources::open_at(&config, &env.store_dir()).unwrap()
}

/// Routes `path` to fail once with `first`, then serve `body`.
fn fails_once(env: &Env, path: &str, first: Behaviour, body: &[u8]) -> url::Url {
    env.origin.route(
        path,
        Behaviour::Sequence(vec![first, Behaviour::Body(body.to_vec())]),
    );
    env.url("origin.test", path)
}

fn state(service: &Resources, gem: &str) -> ResourceState {
    service.status(Some(gem)).unwrap()[0].resources[0]
        .state
        .clone()
}

/// Installs a gem whose required file fails once at `path` (with `first`)
/// on a service retrying after `interval`, waits until the file is present
/// without any call, and says how long that took; the origin saw two tries.
async fn present_after_one_failure(
    path: &str,
    first: Behaviour,
    seed: u8,
    interval: Duration,
) -> Duration {
    let env = Env::new().await;
    let body = bytes(10_000, seed);
    let url = fails_once(&env, path, first, &body);
    let service = open_retrying(&env, interval);
    let began = Instant::now();
    let m = manifest(json!([required_entry("model", &url, &body)]));
    service.install("g", &m).await.unwrap();
    wait_until("the file is present", || {
        matches!(state(&service, "g"), ResourceState::Present { .. })
    })
    .await;
    let took = began.elapsed();
    assert_eq!(env.origin.hits(path), 2);
    service.shutdown().await;
    took
}

#[tokio::test]
async fn a_failed_required_file_is_present_after_the_retry_interval_without_any_call() {
    let interval = Duration::from_millis(300);
    let took = present_after_one_failure("/flaky.bin", Behaviour::Status(500), 91, interval).await;
    assert!(
        took >= interval,
        "tried again before the interval: {took:?}"
    );
}

#[tokio::test]
async fn a_servers_retry_after_is_waited_for_before_the_periodic_retry() {
    let busy = Behaviour::RetryAfter {
        status: 503,
        value: "2".into(),
    };
    let took = present_after_one_failure("/busy.bin", busy, 92, Duration::from_millis(100)).await;
    assert!(
        took >= Duration::from_secs(2),
        "tried again before the server's Retry-After: {took:?}"
    );
}

#[tokio::test]
async fn a_lazy_file_that_failed_waits_for_its_next_call() {
    let env = Env::new().await;
    let body = bytes(10_000, 93);
    let url = fails_once(&env, "/lazy.bin", Behaviour::Status(500), &body);
    let service = open_retrying(&env, Duration::from_millis(100));
    let m = manifest(json!([entry("model", &url, &body)]));
    service.install("g", &m).await.unwrap();
    assert!(service.path("g", "model").await.is_err());
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(env.origin.hits("/lazy.bin"), 1, "a lazy file was retried");
    assert!(matches!(state(&service, "g"), ResourceState::Failed { .. }));
    // Its next call fetches it.
    within("the next call", service.path("g", "model"))
        .await
        .unwrap();
    service.shutdown().await;
}

#[tokio::test]
async fn a_file_of_a_gem_uninstalled_after_its_failure_is_not_retried() {
    let env = Env::new().await;
    let body = bytes(10_000, 94);
    let url = fails_once(&env, "/gone.bin", Behaviour::Status(500), &body);
    let service = open_retrying(&env, Duration::from_millis(300));
    let m = manifest(json!([required_entry("model", &url, &body)]));
    service.install("g", &m).await.unwrap();
    wait_until("the download has failed", || {
        matches!(state(&service, "g"), ResourceState::Failed { .. })
    })
    .await;
    service.uninstall("g").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        env.origin.hits("/gone.bin"),
        1,
        "an uninstalled gem's file was retried"
    );
    assert!(stored_files(&env, &body).is_empty());
    service.shutdown().await;
}

#[tokio::test]
async fn a_failed_file_is_retried_for_its_gem_when_another_gem_that_failed_on_it_since_is_gone() {
    let env = Env::new().await;
    let body = bytes(10_000, 95);
    env.origin.route(
        "/shared.bin",
        Behaviour::Sequence(vec![
            Behaviour::Status(500),
            Behaviour::Status(500),
            Behaviour::Body(body.clone()),
        ]),
    );
    let url = env.url("origin.test", "/shared.bin");
    let service = open_retrying(&env, Duration::from_secs(1));
    let m = manifest(json!([required_entry("model", &url, &body)]));
    service.install("a", &m).await.unwrap();
    wait_until("a's download has failed", || {
        matches!(state(&service, "a"), ResourceState::Failed { .. })
    })
    .await;
    // Gem b's download of the same bytes fails too, within a's wait: its
    // retry replaces a's. Then b goes, before that retry.
    service.install("b", &m).await.unwrap();
    wait_until("b's download has failed", || {
        env.origin.hits("/shared.bin") == 2
            && matches!(state(&service, "b"), ResourceState::Failed { .. })
    })
    .await;
    service.uninstall("b").await.unwrap();
    wait_until("a's file is present, tried again on its own", || {
        matches!(state(&service, "a"), ResourceState::Present { .. })
    })
    .await;
    assert_eq!(env.origin.hits("/shared.bin"), 3);
    service.shutdown().await;
}

#[tokio::test]
async fn the_record_of_what_served_a_file_is_removed_with_the_file() {
    let env = Env::new().await;
    let body = bytes(10_000, 95);
    let url = env.serve("/kept.bin", &body);
    let service = open_retrying(&env, Duration::from_secs(600));
    let m = manifest(json!([required_entry("model", &url, &body)]));
    service.install("g", &m).await.unwrap();
    within("the download", service.wait_idle()).await;
    // Recorded with the file's stamps, in one record.
    let record = store_root(&env)
        .join("stamps")
        .join(format!("{}.json", sha256_hex(&body)));
    let text = std::fs::read_to_string(&record).unwrap();
    assert!(text.contains(&format!(r#""served_by":"{url}""#)), "{text}");
    assert!(!store_root(&env).join("served").exists());
    service.uninstall("g").await.unwrap();
    assert!(stored_files(&env, &body).is_empty());
    assert!(!record.exists(), "the record outlived its file");
    service.shutdown().await;
}

#[tokio::test]
async fn status_says_a_download_between_two_tries_is_retrying_and_why() {
    let env = Env::new().await;
    env.write_config("retries = 3");
    let body = bytes(40_000, 77);
    // "Come back in 2 s", then the file.
    let url = fails_once(
        &env,
        "/later.bin",
        Behaviour::RetryAfter {
            status: 503,
            value: "2".into(),
        },
        &body,
    );
    let service = Resources::open(&env.config()).unwrap();
    service
        .install("g", &manifest(json!([required_entry("r", &url, &body)])))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let retrying = loop {
        match state(&service, "g") {
            ResourceState::Retrying {
                attempt,
                of,
                reason,
                ..
            } => break (attempt, of, reason),
            other => {
                assert!(Instant::now() < deadline, "never retrying: {other:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_eq!((retrying.0, retrying.1), (2, 4), "{retrying:?}");
    assert!(retrying.2.contains("503"), "{retrying:?}");
    // Once the next try's bytes arrive, no longer.
    within("present", service.wait_idle()).await;
    assert!(matches!(
        state(&service, "g"),
        ResourceState::Present { .. }
    ));
    service.shutdown().await;
}
