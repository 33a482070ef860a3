//! What a status row tells a page that a user can act on: when a failed
//! required file is tried again, the bytes a stopped download kept, and
//! the gem's name from its manifest.

use std::time::{Duration, SystemTime};

use gem_resources::policy::{Mode, Policy};
use gem_resources::{Event, ResourceState, Resources};
use serde_json::json;

use crate::support::*;

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
async fn a_failed_required_file_says_when_it_is_tried_again_and_a_lazy_one_does_not() {
    let env = Env::new().await;
    let (a, b) = (bytes(1_000, 31), bytes(1_000, 32));
    env.origin.route("/a.bin", Behaviour::Status(500));
    env.origin.route("/b.bin", Behaviour::Status(500));
    let mut config = env.config();
    config.service.retry_failed_after = Duration::from_secs(600);
    let service = Resources::open_at(&config, &env.store_dir()).unwrap();
    let mut events = service.subscribe();
    let before = SystemTime::now();
    service
        .install(
            "g",
            &manifest(json!([
                required_entry("a", &env.url("origin.test", "/a.bin"), &a),
                entry("b", &env.url("origin.test", "/b.bin"), &b),
            ])),
        )
        .await
        .unwrap();
    let failed = next_event(&mut events, |e| matches!(e, Event::Failed { .. })).await;
    let Event::Failed { next_try, .. } = failed else {
        unreachable!()
    };
    let due = next_try.expect("the failed event says when the file is tried again");
    let wait = due.duration_since(before).unwrap();
    assert!(
        wait >= Duration::from_secs(600) && wait < Duration::from_secs(660),
        "{wait:?}"
    );
    // The status row says the same, in RFC 3339.
    let row = &service.status(Some("g")).unwrap()[0].resources[0];
    assert!(matches!(row.state, ResourceState::Failed { .. }), "{row:?}");
    assert_eq!(
        row.next_try.map(gem_resources::time::to_rfc3339),
        Some(gem_resources::time::to_rfc3339(due))
    );
    let json = serde_json::to_value(row).unwrap();
    assert_eq!(
        json["next_try"],
        json!(gem_resources::time::to_rfc3339(due)),
        "{json}"
    );
    // A file downloaded on first use waits for its next use: no next try.
    let _ = service.path("g", "b").await.unwrap_err();
    let row = &service.status(Some("g")).unwrap()[0].resources[1];
    assert!(matches!(row.state, ResourceState::Failed { .. }), "{row:?}");
    assert_eq!(row.next_try, None);
    assert!(serde_json::to_value(row).unwrap().get("next_try").is_none());
    service.shutdown().await;
}

#[tokio::test]
async fn with_the_retry_turned_off_a_failed_row_has_no_next_try() {
    let env = Env::new().await;
    let a = bytes(1_000, 33);
    env.origin.route("/a.bin", Behaviour::Status(500));
    let mut config = env.config();
    config.service.retry_failed_after = Duration::ZERO;
    let service = Resources::open_at(&config, &env.store_dir()).unwrap();
    let mut events = service.subscribe();
    service
        .install(
            "g",
            &manifest(json!([required_entry(
                "a",
                &env.url("origin.test", "/a.bin"),
                &a
            )])),
        )
        .await
        .unwrap();
    let failed = next_event(&mut events, |e| matches!(e, Event::Failed { .. })).await;
    assert!(
        matches!(failed, Event::Failed { next_try: None, .. }),
        "{failed:?}"
    );
    let row = &service.status(Some("g")).unwrap()[0].resources[0];
    assert_eq!(row.next_try, None, "{row:?}");
    service.shutdown().await;
}

#[tokio::test]
async fn a_download_stopped_by_the_policy_shows_the_bytes_it_kept() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(2_000_000, 34);
    env.origin.route(
        "/slow.bin",
        Behaviour::Ranged {
            body: body.clone(),
            etag: "\"v1\"".into(),
            ignore_range: false,
            cut_at: None,
            hold: false,
            pace: Some((10_240, Duration::from_millis(50))),
        },
    );
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
    let hosts = vec!["origin.test".to_string()];
    service
        .set_policy(Policy::new(Mode::Blocklist, &hosts).unwrap())
        .unwrap();
    next_event(&mut events, |e| matches!(e, Event::Failed { .. })).await;
    let row = &service.status(Some("g")).unwrap()[0].resources[0];
    assert!(matches!(row.state, ResourceState::Failed { .. }), "{row:?}");
    let kept = row.partial_bytes.expect("the kept bytes on the failed row");
    assert!(kept > 50_000 && kept < body.len() as u64, "{kept}");
    let json = serde_json::to_value(row).unwrap();
    assert_eq!(json["partial_bytes"], json!(kept), "{json}");
    service.shutdown().await;
}

#[tokio::test]
async fn the_status_carries_the_gems_name_from_its_manifest() {
    let env = Env::new().await;
    let a = bytes(100, 35);
    let url = env.url("origin.test", "/a.bin");
    let doc = |name: serde_json::Value| {
        let doc = json!({ "id": "page-demo", "name": name, "resources": [entry("a", &url, &a)] });
        gem_resources::parse_manifest(&serde_json::to_vec(&doc).unwrap()).unwrap()
    };
    let service = Resources::open(&env.config()).unwrap();
    service
        .install("page-demo", &doc(json!("  Page demo  ")))
        .await
        .unwrap();
    let gem = &service.status(Some("page-demo")).unwrap()[0];
    assert_eq!(gem.name.as_deref(), Some("Page demo"));
    let json = serde_json::to_value(gem).unwrap();
    assert_eq!(json["name"], "Page demo", "{json}");
    // A name of spaces, or no string, is none: the page shows the id.
    service
        .install("page-demo", &doc(json!("   ")))
        .await
        .unwrap();
    let gem = &service.status(Some("page-demo")).unwrap()[0];
    assert_eq!(gem.name, None);
    assert!(serde_json::to_value(gem).unwrap().get("name").is_none());
    service.install("page-demo", &doc(json!(7))).await.unwrap();
    assert_eq!(service.status(Some("page-demo")).unwrap()[0].name, None);
    service.shutdown().await;
}
