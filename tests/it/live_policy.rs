//! The user's network policy is live: a change applies at once, to new
//! connections, redirect hops and downloads in flight.

use std::time::{Duration, Instant};

use gem_resources::policy::{Mode, Policy};
use gem_resources::{download, Event, Fetcher, Resource, Resources, RetryPolicy, Store};
use serde_json::json;

use crate::support::*;

fn policy(mode: Mode, hosts: &[&str]) -> Policy {
    let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
    Policy::new(mode, &hosts).unwrap()
}

/// A resumable route that sends `body` slowly (10 KiB every 50 ms).
fn slow_route(env: &Env, path: &str, body: &[u8]) {
    env.origin.route(
        path,
        Behaviour::Ranged {
            body: body.to_vec(),
            etag: "\"v1\"".into(),
            ignore_range: false,
            cut_at: None,
            hold: false,
            pace: Some((10_240, Duration::from_millis(50))),
        },
    );
}

/// Waits for the first event matching `pred`, at most 10 s.
async fn next_event(
    events: &mut tokio::sync::broadcast::Receiver<Event>,
    pred: impl Fn(&Event) -> bool,
) -> Event {
    within("the event", async {
        loop {
            match events.recv().await {
                Ok(e) if pred(&e) => return e,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await
}

#[tokio::test]
async fn a_download_from_a_host_that_becomes_blocked_stops_within_a_second() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(2_000_000, 120);
    slow_route(&env, "/slow.bin", &body);
    let url = env.url("origin.test", "/slow.bin");
    let service = Resources::open(&env.config()).unwrap();
    let mut events = service.subscribe();
    service
        .install("g", &manifest(json!([required_entry("slow", &url, &body)])))
        .await
        .unwrap();
    next_event(
        &mut events,
        |e| matches!(e, Event::Progress { bytes, .. } if *bytes > 50_000),
    )
    .await;
    let changed = Instant::now();
    service
        .set_policy(policy(Mode::Blocklist, &["origin.test"]))
        .unwrap();
    next_event(&mut events, |e| {
        matches!(e, Event::PolicyChanged { new_hosts: 1, .. })
    })
    .await;
    let failed = next_event(&mut events, |e| matches!(e, Event::Failed { .. })).await;
    assert!(
        changed.elapsed() < Duration::from_secs(1),
        "{:?}",
        changed.elapsed()
    );
    let Event::Failed {
        primary_cause,
        message,
        ..
    } = failed
    else {
        unreachable!()
    };
    assert_eq!(primary_cause, "E_RESOURCE_POLICY", "{message}");
    // The attempt's line inside the message keeps its code (a detail).
    assert!(message.contains("E_RESOURCE_POLICY"), "{message}");
    let status = service.status(Some("g")).unwrap();
    let record = serde_json::to_string(&status).unwrap();
    assert!(record.contains("E_RESOURCE_POLICY"), "{record}");
    // The bytes received are kept for resume.
    let kept = service.store().partial_len(&sha256_hex(&body));
    assert!(kept.is_some_and(|n| n > 0), "{kept:?}");
    service.shutdown().await;
}

#[tokio::test]
async fn a_required_file_that_failed_on_policy_downloads_once_its_host_is_allowed() {
    let env = Env::new().await;
    env.write_config("mode = \"allowlist\"\nhosts = [\"other.test\"]");
    let body = bytes(50_000, 121);
    let url = env.serve("/r.bin", &body);
    let service = Resources::open(&env.config()).unwrap();
    service
        .install("g", &manifest(json!([required_entry("r", &url, &body)])))
        .await
        .unwrap();
    within("the refused try", service.wait_idle()).await;
    assert_eq!(env.origin.hits("/r.bin"), 0, "refused before connecting");
    assert!(stored_files(&env, &body).is_empty());
    let queued = service
        .set_policy(policy(Mode::Allowlist, &["origin.test"]))
        .unwrap();
    assert_eq!(queued, 1);
    within("the download", service.wait_idle()).await;
    assert_eq!(stored_files(&env, &body).len(), 1);
    assert_eq!(service.policy().host_count(), 1);
    service.shutdown().await;
}

#[tokio::test]
async fn an_allowlist_change_leaves_downloads_from_hosts_still_allowed_alone() {
    let env = Env::new().await;
    env.write_config("mode = \"allowlist\"\nhosts = [\"a.origin.test\", \"b.origin.test\"]");
    let (a, b) = (bytes(600_000, 122), bytes(600_000, 123));
    slow_route(&env, "/a.bin", &a);
    slow_route(&env, "/b.bin", &b);
    let (ua, ub) = (
        env.url("a.origin.test", "/a.bin"),
        env.url("b.origin.test", "/b.bin"),
    );
    let service = Resources::open(&env.config()).unwrap();
    let mut events = service.subscribe();
    service
        .install(
            "g",
            &manifest(json!([
                required_entry("a", &ua, &a),
                required_entry("b", &ub, &b)
            ])),
        )
        .await
        .unwrap();
    next_event(&mut events, |e| {
        matches!(e, Event::Progress { resource, bytes, .. } if resource == "a" && *bytes > 20_000)
    })
    .await;
    service
        .set_policy(policy(Mode::Allowlist, &["a.origin.test"]))
        .unwrap();
    within("both ends", service.wait_idle()).await;
    assert_eq!(stored_files(&env, &a).len(), 1, "a finished");
    assert_eq!(env.origin.hits("/a.bin"), 1, "a was never interrupted");
    assert!(stored_files(&env, &b).is_empty(), "b was stopped");
    service.shutdown().await;
}

#[tokio::test]
async fn a_redirect_hop_to_a_host_blocked_after_start_is_refused() {
    let env = Env::new().await;
    let body = bytes(10_000, 124);
    let target = env.serve("/target.bin", &body);
    let target = target.as_str().replace("origin.test", "mirror.test");
    env.origin.route(
        "/hop.bin",
        Behaviour::Redirect {
            status: 302,
            location: target,
        },
    );
    let config = env.config();
    let fetcher = Fetcher::new(&config).unwrap();
    let store = Store::open(&config.store_dir()).unwrap();
    let r = Resource {
        id: "h".into(),
        url: env.url("origin.test", "/hop.bin"),
        mirrors: Vec::new(),
        sha256: sha256_hex(&body),
        size: body.len() as u64,
        required: false,
        description: None,
    };
    let retry = RetryPolicy {
        retries: 0,
        ..RetryPolicy::default()
    };
    fetcher.set_policy(policy(Mode::Blocklist, &["mirror.test"]));
    let err = download(&fetcher, &store, &r, retry, &mut |_| {})
        .await
        .unwrap_err();
    assert_eq!(err.primary_cause(), "E_RESOURCE_POLICY", "{err}");
    assert!(err.to_string().contains("mirror.test"), "{err}");
    assert_eq!(env.origin.hits("/target.bin"), 0);
    // And allowed again, it goes through.
    fetcher.set_policy(Policy::allow_all());
    download(&fetcher, &store, &r, retry, &mut |_| {})
        .await
        .unwrap();
}

/// A fetcher and store for the env, and a task downloading `r` with them
/// (no retries).
fn spawn_download(
    env: &Env,
    r: Resource,
) -> (
    Fetcher,
    tokio::task::JoinHandle<gem_resources::Result<std::path::PathBuf>>,
) {
    let config = env.config();
    let fetcher = Fetcher::new(&config).unwrap();
    let store = Store::open(&config.store_dir()).unwrap();
    let f = fetcher.clone();
    let task = tokio::spawn(async move { download(&f, &store, &r, no_retry(), &mut |_| {}).await });
    (fetcher, task)
}

#[tokio::test]
async fn a_host_blocked_during_the_tls_handshake_gets_no_request() {
    let env = Env::new().await;
    let body = bytes(50_000, 125);
    let url = env.serve("/tls.bin", &body);
    let gate = Gate::new();
    env.origin.hold_handshakes(&gate);
    let (fetcher, task) = spawn_download(&env, resource("t", &url, &[], &body));
    wait_until("the TCP connection", || env.origin.connections() == 1).await;
    fetcher.set_policy(policy(Mode::Blocklist, &["origin.test"]));
    gate.open();
    let err = within("the stop", task).await.unwrap().unwrap_err();
    assert_eq!(err.primary_cause(), "E_RESOURCE_POLICY", "{err}");
    assert_eq!(
        env.origin.hits("/tls.bin"),
        0,
        "no request after the change"
    );
    assert!(stored_files(&env, &body).is_empty());
}

#[tokio::test]
async fn a_host_blocked_while_its_response_head_is_held_stops_the_transfer() {
    let env = Env::new().await;
    let body = bytes(50_000, 126);
    let (url, gate) = env.serve_gated("/held.bin", &body);
    let (fetcher, task) = spawn_download(&env, resource("h", &url, &[], &body));
    wait_until("the request", || env.origin.hits("/held.bin") == 1).await;
    let changed = Instant::now();
    fetcher.set_policy(policy(Mode::Blocklist, &["origin.test"]));
    // The head never comes: the change alone stops the wait for it.
    let err = within("the stop", task).await.unwrap().unwrap_err();
    assert!(
        changed.elapsed() < Duration::from_secs(1),
        "{:?}",
        changed.elapsed()
    );
    assert_eq!(err.primary_cause(), "E_RESOURCE_POLICY", "{err}");
    gate.open();
    assert!(stored_files(&env, &body).is_empty());
}

#[tokio::test]
async fn the_live_check_applies_to_the_redirect_target_being_read() {
    let env = Env::new().await;
    let body = bytes(1_000_000, 127);
    slow_route(&env, "/slow.bin", &body);
    env.origin.route(
        "/start.bin",
        Behaviour::Redirect {
            status: 302,
            location: env.url("cdn.test", "/slow.bin").to_string(),
        },
    );
    let config = env.config();
    let fetcher = Fetcher::new(&config).unwrap();
    let store = Store::open(&config.store_dir()).unwrap();
    let r = resource("s", &env.url("origin.test", "/start.bin"), &[], &body);
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let task = {
        let (f, seen) = (fetcher.clone(), seen.clone());
        tokio::spawn(async move {
            let mut progress = |n: u64| seen.store(n, std::sync::atomic::Ordering::Relaxed);
            download(&f, &store, &r, no_retry(), &mut progress).await
        })
    };
    wait_until("bytes from the redirect target", || {
        seen.load(std::sync::atomic::Ordering::Relaxed) > 20_000
    })
    .await;
    // The declared url's host stays permitted; the host being read is not.
    fetcher.set_policy(policy(Mode::Blocklist, &["cdn.test"]));
    let err = within("the stop", task).await.unwrap().unwrap_err();
    assert_eq!(err.primary_cause(), "E_RESOURCE_POLICY", "{err}");
    assert!(err.to_string().contains("cdn.test"), "{err}");
    assert!(stored_files(&env, &body).is_empty());
}

#[tokio::test]
async fn a_download_refused_before_connecting_announces_no_start() {
    let env = Env::new().await;
    let dev = Env::dev_section().replace(
        "resolve = { ",
        "resolve = { \"private.test\" = [\"10.0.0.5\"], ",
    );
    let text = format!(
        "store = \"store\"\n[network]\nconnect_timeout_secs = 5\nretries = 0\nmode = \"blocklist\"\nhosts = [\"blocked.test\"]\n{dev}\n"
    );
    std::fs::write(env.dir.path().join("config.toml"), text).unwrap();
    let (a, b, c) = (bytes(1000, 128), bytes(1000, 129), bytes(1000, 130));
    env.serve("/a.bin", &a);
    env.serve("/c.bin", &c);
    let service = Resources::open(&env.config()).unwrap();
    let mut events = service.subscribe();
    let entries = json!([
        required_entry("policy", &env.url("blocked.test", "/a.bin"), &a),
        required_entry("address", &env.url("private.test", "/b.bin"), &b),
        required_entry("fine", &env.url("origin.test", "/c.bin"), &c),
    ]);
    service.install("g", &manifest(entries)).await.unwrap();
    within("the downloads", service.wait_idle()).await;
    let mut started = Vec::new();
    let mut failed = Vec::new();
    while let Ok(event) = events.try_recv() {
        match event {
            Event::Started { resource, .. } => started.push(resource),
            Event::Failed { resource, .. } => failed.push(resource),
            _ => {}
        }
    }
    failed.sort();
    assert_eq!(failed, ["address", "policy"]);
    assert_eq!(
        started,
        ["fine"],
        "only the download that connected started"
    );
    service.shutdown().await;
}

/// The state of `gem`'s resource `id` in `service`'s status.
fn row_state(service: &Resources, gem: &str, id: &str) -> gem_resources::ResourceState {
    let gems = service.status(Some(gem)).unwrap();
    let row = gems[0].resources.iter().find(|r| r.id == id).unwrap();
    row.state.clone()
}

#[tokio::test]
async fn a_second_service_on_the_store_keeps_a_policy_stop_as_the_policy_and_an_unblock_requeues_it(
) {
    let env = Env::new().await;
    let body = bytes(600_000, 131);
    slow_route(&env, "/r.bin", &body);
    let url = env.url("origin.test", "/r.bin");
    let first = Resources::open(&env.config()).unwrap();
    let mut events = first.subscribe();
    first
        .install("g", &manifest(json!([required_entry("r", &url, &body)])))
        .await
        .unwrap();
    next_event(
        &mut events,
        |e| matches!(e, Event::Progress { bytes, .. } if *bytes > 20_000),
    )
    .await;
    // A second instance on the same store (as an app started twice): its
    // start queues the required file, which waits for the first's download.
    let second = Resources::open(&env.config()).unwrap();
    let mut second_events = second.subscribe();
    assert_eq!(second.start().await.unwrap(), 1);
    next_event(&mut second_events, |e| matches!(e, Event::Waiting { .. })).await;

    // Blocked in the first: its download stops; the second, which waited
    // for it, takes that failure as its own and records it.
    first
        .set_policy(policy(Mode::Blocklist, &["origin.test"]))
        .unwrap();
    within("the first stops", first.wait_idle()).await;
    within("the second gives up", second.wait_idle()).await;
    for service in [&first, &second] {
        match row_state(service, "g", "r") {
            gem_resources::ResourceState::Failed { failure, .. } => {
                assert_eq!(
                    failure.primary_cause,
                    gem_resources::ErrorCode::Policy,
                    "{failure:?}"
                );
                assert!(
                    failure
                        .attempts
                        .iter()
                        .any(|a| a.code == gem_resources::ErrorCode::Policy),
                    "{failure:?}"
                );
            }
            other => panic!("expected a failed row, got {other:?}"),
        }
    }
    // Unblocked (in either): queued again at once, and downloaded.
    let queued = first.set_policy(Policy::allow_all()).unwrap();
    assert_eq!(
        queued, 1,
        "the file that failed on the policy is queued again"
    );
    within("the download", async {
        while stored_files(&env, &body).is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    first.shutdown().await;
    second.shutdown().await;
}
