//! The settings page's controls: cancel, retry, download now; what status
//! shows of each file; failure records an upgrade makes stale.

use std::time::Duration;

use gem_resources::{ErrorCode, Event, ResourceState, Resources};
use serde_json::json;
use tokio::sync::broadcast::{error::RecvError, Receiver};

use crate::support::*;

async fn next(events: &mut Receiver<Event>, pred: impl Fn(&Event) -> bool) -> Event {
    within("the event", async {
        loop {
            match events.recv().await {
                Ok(e) if pred(&e) => return e,
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await
}

fn state(service: &Resources, gem: &str) -> ResourceState {
    service.status(Some(gem)).unwrap()[0].resources[0]
        .state
        .clone()
}

#[tokio::test]
async fn cancel_stops_a_download_keeps_its_bytes_and_the_next_one_resumes() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(400_000, 91);
    env.origin.route(
        "/slow.bin",
        Behaviour::Ranged {
            body: body.clone(),
            etag: "\"v1\"".into(),
            ignore_range: false,
            cut_at: None,
            hold: false,
            pace: Some((16_384, Duration::from_millis(20))),
        },
    );
    let url = env.url("origin.test", "/slow.bin");
    let service = Resources::open(&env.config()).unwrap();
    let mut events = service.subscribe();
    service
        .install("g", &manifest(json!([entry("m", &url, &body)])))
        .await
        .unwrap();
    assert!(
        service.download_now("g", "m").unwrap(),
        "a lazy file queued"
    );
    next(
        &mut events,
        |e| matches!(e, Event::Progress { bytes, .. } if *bytes >= 50_000),
    )
    .await;
    assert!(service.cancel("g", "m").await.unwrap());
    next(
        &mut events,
        |e| matches!(e, Event::Cancelled { reason, .. } if reason.contains("cancelled on request")),
    )
    .await;
    // Not a failure, and the bytes are kept.
    assert!(matches!(state(&service, "g"), ResourceState::Missing));
    let kept = service.status(Some("g")).unwrap()[0].resources[0].partial_bytes;
    assert!(kept.is_some_and(|k| k >= 50_000), "{kept:?}");
    assert!(!service.cancel("g", "m").await.unwrap(), "nothing runs now");

    let path = service.path("g", "m").await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    let resumed = std::iter::from_fn(|| events.try_recv().ok())
        .any(|e| matches!(e, Event::Resumed { offset, .. } if offset >= 50_000));
    assert!(resumed, "the second download continued the kept bytes");
    assert!(!service.download_now("g", "m").unwrap(), "present already");
}

#[tokio::test]
async fn retry_forgets_the_failure_and_downloads_now() {
    let env = Env::new().await;
    let body = bytes(20_000, 92);
    env.origin.route(
        "/flaky.bin",
        Behaviour::Sequence(vec![Behaviour::Status(503), Behaviour::Body(body.clone())]),
    );
    let url = env.url("origin.test", "/flaky.bin");
    let service = Resources::open(&env.config()).unwrap();
    service
        .install("g", &manifest(json!([required_entry("f", &url, &body)])))
        .await
        .unwrap();
    service.wait_idle().await;
    assert!(matches!(state(&service, "g"), ResourceState::Failed { .. }));
    let mut events = service.subscribe();
    assert!(service.retry("g", "f").await.unwrap());
    assert!(
        !matches!(state(&service, "g"), ResourceState::Failed { .. }),
        "the failure is forgotten at once"
    );
    next(&mut events, |e| matches!(e, Event::Verified { .. })).await;
    assert!(matches!(
        state(&service, "g"),
        ResourceState::Present { .. }
    ));
    assert!(!service.retry("g", "f").await.unwrap(), "present already");
}

#[tokio::test]
async fn status_lists_every_address_host_and_whether_a_description_was_given() {
    let env = Env::new().await;
    let body = bytes(1_000, 93);
    let url = env.url("origin.test", "/a.bin");
    let mut described = entry("a", &url, &body);
    described["description"] = json!("OCR model");
    described["mirrors"] = json!([
        env.url("mirror.test", "/a.bin").as_str(),
        env.url("origin.test", "/again/a.bin").as_str(),
    ]);
    let plain = entry("b", &url, &bytes(1_000, 94));
    let service = Resources::open(&env.config()).unwrap();
    service
        .install("g", &manifest(json!([described, plain])))
        .await
        .unwrap();
    let status = service.status(Some("g")).unwrap();
    let (a, b) = (&status[0].resources[0], &status[0].resources[1]);
    assert_eq!(a.description.as_deref(), Some("OCR model"));
    assert_eq!(a.label, "OCR model");
    assert_eq!(a.addresses.len(), 3);
    assert!(a.addresses[1].contains("mirror.test"));
    assert_eq!(a.hosts, ["origin.test", "mirror.test"]);
    assert_eq!(b.description, None);
    assert_eq!(b.label, "b");
    let value = serde_json::to_value(b).unwrap();
    assert!(value.get("description").is_none(), "{value}");
}

#[tokio::test]
async fn an_upgrade_that_changes_the_addresses_drops_the_old_failure() {
    let env = Env::new().await;
    let body = bytes(5_000, 95);
    env.origin.route("/v1.bin", Behaviour::Status(404));
    let v1 = env.url("origin.test", "/v1.bin");
    let v2 = env.url("origin.test", "/v2.bin");
    env.origin.route("/v2.bin", Behaviour::Status(404));
    let service = Resources::open(&env.config()).unwrap();
    service
        .install("g", &manifest(json!([required_entry("m", &v1, &body)])))
        .await
        .unwrap();
    service.wait_idle().await;
    let ResourceState::Failed { failure, .. } = state(&service, "g") else {
        panic!("v1 did not fail");
    };
    assert_eq!(failure.primary_cause, ErrorCode::Http);
    // v2 moves the file (and declares it lazy, so nothing runs again).
    service
        .install("g", &manifest(json!([entry("m", &v2, &body)])))
        .await
        .unwrap();
    assert!(
        matches!(state(&service, "g"), ResourceState::Missing),
        "{:?}",
        state(&service, "g")
    );
    let failures = env.dir.path().join("store/store-v1/failures/g.jsonl");
    let on_disk = std::fs::read_to_string(&failures).unwrap_or_default();
    assert!(!on_disk.contains("v1.bin"), "{on_disk}");
}
