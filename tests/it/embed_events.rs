//! Events an app's gem page can be built from: named with the sha256, one
//! copy for each waiting gem, an end for every download, in causal order.

use gem_resources::{Event, ResourceState, Resources};
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;

use crate::support::*;

/// The gem an event is about, when it names one resource.
fn about(e: &Event) -> Option<(&str, &str, &str)> {
    match e {
        Event::Queued {
            gem,
            resource,
            sha256,
            ..
        }
        | Event::Started {
            gem,
            resource,
            sha256,
            ..
        }
        | Event::Resumed {
            gem,
            resource,
            sha256,
            ..
        }
        | Event::Progress {
            gem,
            resource,
            sha256,
            ..
        }
        | Event::Verified {
            gem,
            resource,
            sha256,
            ..
        }
        | Event::Failed {
            gem,
            resource,
            sha256,
            ..
        }
        | Event::Cancelled {
            gem,
            resource,
            sha256,
            ..
        } => Some((gem, resource, sha256)),
        _ => None,
    }
}

#[tokio::test]
async fn a_gem_waiting_on_another_gems_download_gets_its_own_events() {
    let env = Env::new().await;
    let body = bytes(50_000, 81);
    let (url, gate) = env.serve_gated("/shared.bin", &body);
    let sha = sha256_hex(&body);
    let service = Resources::open(&env.config()).unwrap();
    let mut events = service.subscribe();
    service
        .install(
            "a",
            &manifest(json!([required_entry("model", &url, &body)])),
        )
        .await
        .unwrap();
    wait_until("a's request reached the origin", || {
        env.origin.hits("/shared.bin") == 1
    })
    .await;
    service
        .install(
            "b",
            &manifest(json!([required_entry("weights", &url, &body)])),
        )
        .await
        .unwrap();
    let joined = events_until(
        &mut events,
        |e| matches!(e, Event::Started { gem, .. } if gem == "b"),
    )
    .await;
    assert!(
        joined.iter().any(|e| matches!(e, Event::Queued { gem, resource, .. } if gem == "b" && resource == "weights")),
        "{joined:?}"
    );
    gate.open();
    let end =
        |g: &'static str| move |e: &Event| matches!(e, Event::Verified { gem, .. } if gem == g);
    let rest = events_until(&mut events, end("b")).await;
    let all: Vec<&Event> = joined.iter().chain(&rest).collect();
    let Some(Event::Verified {
        path,
        sha256,
        resource,
        ..
    }) = rest.last()
    else {
        panic!("{rest:?}");
    };
    assert_eq!(
        (resource.as_str(), sha256.as_str()),
        ("weights", sha.as_str())
    );
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert!(path.ends_with("shared.bin"), "{path:?}");
    for e in all.iter().filter_map(|e| about(e)) {
        assert_eq!(e.2, sha, "{e:?}");
    }
    assert_eq!(env.origin.hits("/shared.bin"), 1, "one download");
}

#[tokio::test]
async fn gems_sharing_a_download_under_different_names_each_get_their_own_file() {
    // An address without a file name: each resource's file is named after
    // its id, so one download serves two names.
    let env = Env::new().await;
    let body = bytes(40_000, 85);
    let (url, gate) = env.serve_gated("/", &body);
    let service = Resources::open(&env.config()).unwrap();
    let mut events = service.subscribe();
    for (gem, id) in [("a", "alpha"), ("b", "beta")] {
        service
            .install(gem, &manifest(json!([required_entry(id, &url, &body)])))
            .await
            .unwrap();
        if gem == "a" {
            wait_until("a's request reached the origin", || {
                env.origin.hits("/") == 1
            })
            .await;
        }
    }
    events_until(
        &mut events,
        |e| matches!(e, Event::Queued { gem, .. } if gem == "b"),
    )
    .await;
    gate.open();
    let mut paths = std::collections::BTreeMap::new();
    while paths.len() < 2 {
        let seen = events_until(&mut events, |e| matches!(e, Event::Verified { .. })).await;
        if let Some(Event::Verified { gem, path, .. }) = seen.last() {
            paths.insert(gem.clone(), path.clone());
        }
    }
    assert!(paths["a"].ends_with("alpha"), "{paths:?}");
    assert!(paths["b"].ends_with("beta"), "{paths:?}");
    for path in paths.values() {
        assert_eq!(std::fs::read(path).unwrap(), body);
    }
    assert_eq!(env.origin.hits("/"), 1, "one download");
}

#[tokio::test]
async fn a_download_stopped_by_shutdown_or_uninstall_ends_with_cancelled() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let (body, url) = stalled_route(&env, "/stall.bin", 300_000, 100_000, 82);
    let service = Resources::open(&env.config()).unwrap();
    let mut events = service.subscribe();
    service
        .install("g", &manifest(json!([required_entry("s", &url, &body)])))
        .await
        .unwrap();
    events_until(&mut events, |e| matches!(e, Event::Started { .. })).await;
    wait_until("bytes arrived", || !partial_files(&env).is_empty()).await;
    service.uninstall("g").await.unwrap();
    let ended = events_until(&mut events, |e| matches!(e, Event::Uninstalled { .. })).await;
    let last = ended.iter().rev().find(|e| about(e).is_some()).unwrap();
    assert!(
        matches!(last, Event::Cancelled { gem, resource, reason, .. }
            if gem == "g" && resource == "s" && reason.contains("no installed gem declares it")),
        "{ended:?}"
    );

    service
        .install("h", &manifest(json!([required_entry("s", &url, &body)])))
        .await
        .unwrap();
    events_until(
        &mut events,
        |e| matches!(e, Event::Started { gem, .. } if gem == "h"),
    )
    .await;
    wait_until("bytes arrived", || !partial_files(&env).is_empty()).await;
    service.shutdown().await;
    let mut tail = Vec::new();
    while let Ok(e) = events.try_recv() {
        tail.push(e);
    }
    assert!(
        matches!(tail.last(), Some(Event::Cancelled { gem, reason, .. }) if gem == "h" && reason.contains("shut down")),
        "{tail:?}"
    );
}

#[tokio::test]
async fn installed_comes_before_the_deletions_and_downloads_it_causes() {
    let env = Env::new().await;
    let old = bytes(10_000, 83);
    let new = bytes(12_000, 84);
    let old_url = env.serve("/old.bin", &old);
    let new_url = env.serve("/new.bin", &new);
    let service = Resources::open(&env.config()).unwrap();
    service
        .install(
            "g",
            &manifest(json!([required_entry("old", &old_url, &old)])),
        )
        .await
        .unwrap();
    service.wait_idle().await;
    let mut events = service.subscribe();
    service
        .install(
            "g",
            &manifest(json!([required_entry("new", &new_url, &new)])),
        )
        .await
        .unwrap();
    let seen = events_until(&mut events, |e| matches!(e, Event::Verified { .. })).await;
    let kinds: Vec<&str> = seen
        .iter()
        .map(|e| match e {
            Event::Installed { .. } => "installed",
            Event::Deleted { .. } => "deleted",
            Event::Queued { .. } => "queued",
            _ => "other",
        })
        .filter(|k| *k != "other")
        .collect();
    assert_eq!(kinds, ["installed", "deleted", "queued"], "{seen:?}");
}

#[tokio::test]
async fn the_event_buffer_is_configurable_and_status_rebuilds_a_lagged_view() {
    let env = Env::new().await;
    let body = bytes(10_000, 85);
    let url = env.serve("/r.bin", &body);
    let service = Resources::builder(&env.config())
        .event_buffer(2)
        .open()
        .unwrap();
    let (mut events, status) = service.subscribe_with_status(None).unwrap();
    assert!(status.is_empty());
    for gem in ["a", "b", "c"] {
        service
            .install(gem, &manifest(json!([entry("r", &url, &body)])))
            .await
            .unwrap();
    }
    assert!(matches!(events.recv().await, Err(RecvError::Lagged(1))));
    // A lagged subscriber starts over from a status taken after its new
    // subscription.
    let (_events, status) = service.subscribe_with_status(None).unwrap();
    assert_eq!(status.len(), 3);
    assert!(matches!(
        status[0].resources[0].state,
        ResourceState::Missing
    ));
    assert!(format!("{service:?}").contains("Resources"));
}

#[tokio::test]
async fn shutdown_ends_every_subscription_and_a_later_one_is_closed_at_once() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let (body, url) = stalled_route(&env, "/stall.bin", 300_000, 100_000, 83);
    let service = Resources::open(&env.config()).unwrap();
    let mut events = service.subscribe();
    // A task that only waits on its subscription, as a gem page does.
    let waiter = {
        let mut events = service.subscribe();
        tokio::spawn(async move {
            let mut seen = Vec::new();
            loop {
                match events.recv().await {
                    Ok(e) => seen.push(e),
                    Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => return seen,
                }
            }
        })
    };
    service
        .install("g", &manifest(json!([required_entry("s", &url, &body)])))
        .await
        .unwrap();
    events_until(&mut events, |e| matches!(e, Event::Started { .. })).await;
    service.shutdown().await;
    // The waiting task ends, and what it saw ends with the download's end.
    let seen = within("the subscriber's end after shutdown", waiter)
        .await
        .unwrap();
    assert!(
        matches!(seen.last(), Some(Event::Cancelled { gem, .. }) if gem == "g"),
        "{seen:?}"
    );
    // The other receiver gets its buffer, then `Closed`.
    let rest = events_until(&mut events, |e| matches!(e, Event::Cancelled { .. })).await;
    assert!(!rest.is_empty());
    assert_eq!(
        within("Closed", events.recv()).await,
        Err(RecvError::Closed)
    );
    // A subscription taken after shutdown is closed from the start.
    let mut late = service.subscribe();
    assert_eq!(
        late.try_recv(),
        Err(tokio::sync::broadcast::error::TryRecvError::Closed)
    );
    assert_eq!(
        within("late Closed", late.recv()).await,
        Err(RecvError::Closed)
    );
    let err = service.subscribe_with_status(None).unwrap_err();
    assert_eq!(err.code(), gem_resources::ErrorCode::Shutdown, "{err}");
}

#[tokio::test]
async fn a_download_a_policy_change_stops_fails_as_unavailable_caused_by_the_policy() {
    // What the docs of `set_policy`, the events and the README say: `code`
    // E_RESOURCE_UNAVAILABLE, `primary_cause` E_RESOURCE_POLICY, for the
    // event, the caller and the failure record alike.
    use gem_resources::policy::{Mode, Policy};
    use gem_resources::ErrorCode;
    let env = Env::new().await;
    write_patient_config(&env, "");
    // Resumable and slow (10 KiB every 50 ms): in flight for seconds.
    let body = bytes(2_000_000, 84);
    env.origin.route(
        "/slow.bin",
        Behaviour::Ranged {
            body: body.clone(),
            etag: "\"v1\"".into(),
            ignore_range: false,
            cut_at: None,
            hold: false,
            pace: Some((10_240, std::time::Duration::from_millis(50))),
        },
    );
    let url = env.url("origin.test", "/slow.bin");
    let service = Resources::open(&env.config()).unwrap();
    let mut events = service.subscribe();
    service
        .install("g", &manifest(json!([entry("s", &url, &body)])))
        .await
        .unwrap();
    let caller = {
        let service = service.clone();
        tokio::spawn(async move { service.path("g", "s").await })
    };
    events_until(&mut events, |e| matches!(e, Event::Progress { .. })).await;
    let blocked = Policy::new(Mode::Blocklist, &["origin.test".to_string()]).unwrap();
    service.set_policy(blocked).unwrap();
    let seen = events_until(&mut events, |e| matches!(e, Event::Failed { .. })).await;
    let Some(Event::Failed {
        code,
        primary_cause,
        message,
        ..
    }) = seen.last()
    else {
        unreachable!()
    };
    assert_eq!(*code, ErrorCode::Unavailable, "{message}");
    assert_eq!(*primary_cause, ErrorCode::Policy, "{message}");
    assert!(message.contains("E_RESOURCE_POLICY"), "{message}");
    let err = within("the caller", caller).await.unwrap().unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert_eq!(err.primary_cause(), ErrorCode::Policy, "{err}");
    let state = service.status(Some("g")).unwrap()[0].resources[0]
        .state
        .clone();
    let ResourceState::Failed { failure, .. } = state else {
        panic!("{state:?}")
    };
    assert_eq!(failure.code, ErrorCode::Unavailable);
    assert_eq!(failure.primary_cause, ErrorCode::Policy);
    service.shutdown().await;
}
