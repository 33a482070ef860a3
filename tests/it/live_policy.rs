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
