//! Events of a download that changes course: a retry of the same address,
//! a wait for another download of the same file, a fallback to the next
//! address; and which address served the file, in `status`.

use gem_resources::{ErrorCode, Event, ResourceState, Resources};
use serde_json::json;

use crate::support::*;

/// The test configuration with `retries` retries and no backoff, and
/// `network` lines added to `[network]`.
fn retrying_config(env: &Env, retries: u32, network: &str) {
    let path = env.write_config(&format!("retry_backoff_secs = 0\n{network}"));
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace("retries = 0", &format!("retries = {retries}")),
    )
    .unwrap();
}

/// What `status` says served gem `gem`'s first resource.
fn served_by(service: &Resources, gem: &str) -> Option<String> {
    let status = service.status(Some(gem)).unwrap();
    match &status[0].resources[0].state {
        ResourceState::Present { served_by, .. } => served_by.clone(),
        other => panic!("not present: {other:?}"),
    }
}

#[tokio::test]
async fn a_retry_is_an_event_naming_the_address_then_the_file_is_verified() {
    let env = Env::new().await;
    retrying_config(&env, 2, "");
    let body = bytes(20_000, 91);
    env.origin.route(
        "/flaky.bin",
        Behaviour::Sequence(vec![Behaviour::Status(503), Behaviour::Body(body.clone())]),
    );
    let url = env.url("origin.test", "/flaky.bin");
    let service = Resources::open(&env.config()).unwrap();
    let mut events = service.subscribe();
    service
        .install(
            "g",
            &manifest(json!([required_entry("model", &url, &body)])),
        )
        .await
        .unwrap();
    let seen = events_until(&mut events, |e| {
        matches!(e, Event::Verified { .. } | Event::Failed { .. })
    })
    .await;
    let retry = seen
        .iter()
        .position(|e| {
            matches!(e, Event::Retrying { gem, resource, sha256, address, attempt: 2, of: 3, reason, .. }
                if gem == "g" && resource == "model" && *sha256 == sha256_hex(&body)
                    && address == url.as_str() && reason.contains("503"))
        })
        .unwrap_or_else(|| panic!("no Retrying event: {seen:?}"));
    assert!(
        matches!(seen.last(), Some(Event::Verified { .. })),
        "{seen:?}"
    );
    assert!(retry < seen.len() - 1, "{seen:?}");
    // As JSON, with its name and every field.
    let line = serde_json::to_value(&seen[retry]).unwrap();
    assert_eq!(line["event"], "retrying", "{line}");
    assert_eq!(line["wait_ms"], 0, "{line}");
    assert_eq!(env.origin.hits("/flaky.bin"), 2);
    assert_eq!(served_by(&service, "g").as_deref(), Some(url.as_str()));
    service.shutdown().await;
}

#[tokio::test]
async fn wrong_bytes_from_the_url_fall_back_to_the_mirror_with_an_event_naming_the_url() {
    let env = Env::new().await;
    let body = bytes(20_000, 92);
    let url = env.serve("/wrong.bin", &bytes(20_000, 93));
    let mirror = env.serve("/right.bin", &body);
    let mut entry = required_entry("model", &url, &body);
    entry["mirrors"] = json!([mirror.as_str()]);
    let service = Resources::open(&env.config()).unwrap();
    let mut events = service.subscribe();
    service
        .install("g", &manifest(json!([entry])))
        .await
        .unwrap();
    let seen = events_until(&mut events, |e| {
        matches!(e, Event::Verified { .. } | Event::Failed { .. })
    })
    .await;
    let fell_back = seen.iter().find_map(|e| match e {
        Event::FellBack {
            gem,
            resource,
            from,
            to,
            code,
            reason,
            ..
        } => Some((gem, resource, from, to, *code, reason)),
        _ => None,
    });
    let Some((gem, resource, from, to, code, reason)) = fell_back else {
        panic!("no FellBack event: {seen:?}")
    };
    assert_eq!((gem.as_str(), resource.as_str()), ("g", "model"));
    assert_eq!(from, url.as_str());
    assert_eq!(to, mirror.as_str());
    assert_eq!(code, ErrorCode::Sha256);
    assert!(reason.contains("SHA-256"), "{reason}");
    assert!(
        matches!(seen.last(), Some(Event::Verified { .. })),
        "{seen:?}"
    );
    assert_eq!(served_by(&service, "g").as_deref(), Some(mirror.as_str()));
    // A last address that fails has no next one: no fallback is announced.
    let only = required_entry("solo", &url, &bytes(20_000, 94));
    service
        .install("h", &manifest(json!([only])))
        .await
        .unwrap();
    let seen = events_until(&mut events, |e| matches!(e, Event::Failed { .. })).await;
    assert!(
        !seen.iter().any(|e| matches!(e, Event::FellBack { .. })),
        "{seen:?}"
    );
    service.shutdown().await;
}

#[tokio::test]
async fn a_download_of_bytes_another_download_holds_waits_and_says_so() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(50_000, 95);
    let (held, gate) = env.serve_gated("/held.bin", &body);
    // The same bytes from another address: another job, the same file.
    let other = env.serve("/other.bin", &body);
    let service = Resources::open(&env.config()).unwrap();
    let mut events = service.subscribe();
    service
        .install("a", &manifest(json!([required_entry("m", &held, &body)])))
        .await
        .unwrap();
    wait_until("a's request reached the origin", || {
        env.origin.hits("/held.bin") == 1
    })
    .await;
    service
        .install("b", &manifest(json!([required_entry("w", &other, &body)])))
        .await
        .unwrap();
    let seen = events_until(
        &mut events,
        |e| matches!(e, Event::Waiting { gem, resource, sha256, .. } if gem == "b" && resource == "w" && *sha256 == sha256_hex(&body)),
    )
    .await;
    assert!(
        !seen
            .iter()
            .any(|e| matches!(e, Event::Waiting { gem, .. } if gem == "a")),
        "{seen:?}"
    );
    gate.open();
    events_until(
        &mut events,
        |e| matches!(e, Event::Verified { gem, .. } if gem == "b"),
    )
    .await;
    assert_eq!(env.origin.hits("/other.bin"), 0, "b used a's file");
    // b reuses what a's download kept: what served it is what is true.
    assert_eq!(served_by(&service, "b").as_deref(), Some(held.as_str()));
    service.shutdown().await;
}

#[tokio::test]
async fn an_imported_file_was_served_by_the_import_and_an_upgrade_keeps_what_served_a_file() {
    let env = Env::new().await;
    let body = bytes(30_000, 96);
    let url = env.url("origin.test", "/never.bin");
    let service = Resources::open(&env.config()).unwrap();
    service
        .install("g", &manifest(json!([entry("model", &url, &body)])))
        .await
        .unwrap();
    let file = env.dir.path().join("model.bin");
    std::fs::write(&file, &body).unwrap();
    service.import(&file).await.unwrap();
    assert_eq!(served_by(&service, "g").as_deref(), Some("import"));
    // A new version declaring the same bytes elsewhere reuses the file,
    // and what served it stays what is true.
    let moved = env.url("origin.test", "/moved.bin");
    service
        .install("g", &manifest(json!([entry("model", &moved, &body)])))
        .await
        .unwrap();
    assert_eq!(served_by(&service, "g").as_deref(), Some("import"));
    assert_eq!(env.origin.total_hits(), 0);
    service.shutdown().await;
}

/// The events about gem `gem`'s resource `id`, in order.
fn of<'a>(seen: &'a [Event], gem: &str, id: &str) -> Vec<&'a Event> {
    seen.iter()
        .filter(|e| match e {
            Event::Queued {
                gem: g, resource, ..
            }
            | Event::Started {
                gem: g, resource, ..
            }
            | Event::Retrying {
                gem: g, resource, ..
            }
            | Event::FellBack {
                gem: g, resource, ..
            }
            | Event::Resumed {
                gem: g, resource, ..
            }
            | Event::Progress {
                gem: g, resource, ..
            }
            | Event::Verified {
                gem: g, resource, ..
            }
            | Event::Failed {
                gem: g, resource, ..
            } => g == gem && resource == id,
            _ => false,
        })
        .collect()
}

/// The address of a `Started` or `Progress`.
fn address(e: &Event) -> Option<&str> {
    match e {
        Event::Started { address, .. } | Event::Progress { address, .. } => Some(address),
        _ => None,
    }
}

#[tokio::test]
async fn after_a_fallback_the_next_events_name_the_mirror() {
    let env = Env::new().await;
    let body = bytes(60_000, 97);
    env.origin.route("/down.bin", Behaviour::Status(500));
    let url = env.url("origin.test", "/down.bin");
    let gate = Gate::new();
    env.origin.route(
        "/up.bin",
        Behaviour::Gated {
            body: body.clone(),
            gate: gate.clone(),
        },
    );
    let mirror = env.url("mirror.test", "/up.bin");
    let declared = |id: &str| {
        let mut e = required_entry(id, &url, &body);
        e["mirrors"] = json!([mirror.as_str()]);
        e
    };
    let service = Resources::open(&env.config()).unwrap();
    let mut events = service.subscribe();
    service
        .install("a", &manifest(json!([declared("m")])))
        .await
        .unwrap();
    let mut seen = events_until(&mut events, |e| matches!(e, Event::FellBack { .. })).await;
    wait_until("the mirror was asked", || env.origin.hits("/up.bin") == 1).await;
    // A gem joining now is told the download runs from the mirror.
    service
        .install("b", &manifest(json!([declared("w")])))
        .await
        .unwrap();
    seen.extend(
        events_until(
            &mut events,
            |e| matches!(e, Event::Started { gem, .. } if gem == "b"),
        )
        .await,
    );
    gate.open();
    seen.extend(
        events_until(
            &mut events,
            |e| matches!(e, Event::Verified { gem, .. } if gem == "b"),
        )
        .await,
    );
    let a = of(&seen, "a", "m");
    let fell = a
        .iter()
        .position(|e| matches!(e, Event::FellBack { from, to, .. } if from == url.as_str() && to == mirror.as_str()))
        .unwrap_or_else(|| panic!("{a:?}"));
    assert!(matches!(a[0], Event::Queued { .. }), "{a:?}");
    assert_eq!(
        address(a[1]),
        Some(url.as_str()),
        "started from the url: {a:?}"
    );
    assert!(
        a[fell + 1..]
            .iter()
            .filter_map(|e| address(e))
            .all(|x| x == mirror.as_str()),
        "{a:?}"
    );
    assert!(
        a[fell + 1..]
            .iter()
            .any(|e| matches!(e, Event::Progress { .. })),
        "{a:?}"
    );
    let b = of(&seen, "b", "w");
    assert!(matches!(b[0], Event::Queued { .. }), "{b:?}");
    assert_eq!(address(b[1]), Some(mirror.as_str()), "{b:?}");
    for v in [a.last().unwrap(), b.last().unwrap()] {
        assert!(
            matches!(v, Event::Verified { served_by: Some(s), .. } if s == mirror.as_str()),
            "{v:?}"
        );
    }
    service.shutdown().await;
}

#[tokio::test]
async fn an_address_that_fails_before_connecting_is_announced_by_started_before_its_retry_or_fallback(
) {
    let env = Env::new().await;
    // The url of "policy" is refused by the policy, that of "refused" by
    // its host (nothing listens on port 1): neither connects, and a
    // refused connection is tried again.
    retrying_config(&env, 1, "mode = \"blocklist\"\nhosts = [\"blocked.test\"]");
    let (p, r) = (bytes(40_000, 98), bytes(40_000, 99));
    let p_url = env.url("blocked.test", "/p.bin");
    let r_url = url::Url::parse("https://origin.test:1/r.bin").unwrap();
    let p_mirror = env.serve("/p.bin", &p);
    let r_mirror = env.serve("/r.bin", &r);
    let mut entries = json!([
        required_entry("policy", &p_url, &p),
        required_entry("refused", &r_url, &r)
    ]);
    entries[0]["mirrors"] = json!([p_mirror.as_str()]);
    entries[1]["mirrors"] = json!([r_mirror.as_str()]);
    let service = Resources::open(&env.config()).unwrap();
    let mut events = service.subscribe();
    service.install("g", &manifest(entries)).await.unwrap();
    within("the downloads", service.wait_idle()).await;
    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        seen.push(e);
    }
    for (id, url, mirror) in [
        ("policy", &p_url, &p_mirror),
        ("refused", &r_url, &r_mirror),
    ] {
        let mine = of(&seen, "g", id);
        assert!(matches!(mine[0], Event::Queued { .. }), "{id}: {mine:?}");
        assert!(
            matches!(mine[1], Event::Started { address, .. } if address == url.as_str()),
            "{id}: the first event after Queued is Started, from the url: {mine:?}"
        );
        let fell = mine
            .iter()
            .position(|e| matches!(e, Event::FellBack { .. }))
            .unwrap_or_else(|| panic!("{id}: {mine:?}"));
        assert_eq!(
            address(mine[fell + 1]),
            Some(mirror.as_str()),
            "{id}: {mine:?}"
        );
        assert!(
            matches!(mine.last(), Some(Event::Verified { served_by: Some(s), .. }) if s == mirror.as_str()),
            "{id}: {mine:?}"
        );
    }
    assert!(
        of(&seen, "g", "refused")
            .iter()
            .any(|e| matches!(e, Event::Retrying { .. })),
        "the refused connection was tried again: {seen:?}"
    );
    service.shutdown().await;
}
