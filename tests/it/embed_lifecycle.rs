//! The lifecycle rules as an app sees them: uninstalling a gem that is not
//! installed, the order of an uninstall's events, what shutdown keeps and
//! what a waiting call gets.

use gem_resources::{Error, ErrorCode, Event, Resources};
use serde_json::json;
use tokio::sync::broadcast::{error::RecvError, error::TryRecvError, Receiver};

use crate::support::*;

/// Events until (and with) the first that `last` accepts.
async fn until(events: &mut Receiver<Event>, last: impl Fn(&Event) -> bool) -> Vec<Event> {
    within("the events", async {
        let mut seen = Vec::new();
        loop {
            match events.recv().await {
                Ok(e) => {
                    let done = last(&e);
                    seen.push(e);
                    if done {
                        return seen;
                    }
                }
                Err(RecvError::Lagged(n)) => panic!("lagged by {n}"),
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await
}

#[tokio::test]
async fn uninstalling_a_gem_not_installed_is_not_found_or_none_and_publishes_nothing() {
    let env = Env::new().await;
    let body = bytes(3_000, 51);
    let url = env.serve("/u.bin", &body);
    let service = Resources::open(&env.config()).unwrap();
    let mut events = service.subscribe();
    let err = service.uninstall("ghost").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    assert!(err.to_string().contains("\"ghost\""), "{err}");
    assert_eq!(service.uninstall_if_installed("ghost").await.unwrap(), None);
    assert_eq!(events.try_recv(), Err(TryRecvError::Empty));
    // An invalid id is still an error.
    let err = service
        .uninstall_if_installed("Not A Gem")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::GemId);
    service
        .install("g", &manifest(json!([entry("u", &url, &body)])))
        .await
        .unwrap();
    let report = service.uninstall_if_installed("g").await.unwrap();
    assert_eq!(report.map(|r| r.gem), Some("g".to_string()));
    assert!(service.installed().unwrap().is_empty());
}

#[tokio::test]
async fn an_uninstall_publishes_cancelled_then_deleted_then_uninstalled_last() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let present = bytes(4_000, 52);
    let present_url = env.serve("/present.bin", &present);
    let (stalled, stalled_url) = stalled_route(&env, "/stalled.bin", 200_000, 50_000, 53);
    let service = Resources::open(&env.config()).unwrap();
    let m = manifest(json!([
        entry("p", &present_url, &present),
        entry("s", &stalled_url, &stalled)
    ]));
    let mut events = service.subscribe();
    let installed = service.install("g", &m).await.unwrap();
    assert_eq!(installed.gem, "g");
    service.path("g", "p").await.unwrap();
    assert!(service.download_now("g", "s").unwrap());
    until(
        &mut events,
        |e| matches!(e, Event::Started { resource, .. } if resource == "s"),
    )
    .await;
    service.uninstall("g").await.unwrap();
    let seen = until(&mut events, |e| matches!(e, Event::Uninstalled { .. })).await;
    let position = |pred: &dyn Fn(&Event) -> bool| {
        seen.iter()
            .position(pred)
            .unwrap_or_else(|| panic!("missing in {seen:?}"))
    };
    let cancelled =
        position(&|e| matches!(e, Event::Cancelled { resource, .. } if resource == "s"));
    let deleted = position(
        &|e| matches!(e, Event::Deleted { sha256, .. } if *sha256 == sha256_hex(&present)),
    );
    let uninstalled = position(&|e| matches!(e, Event::Uninstalled { gem, .. } if gem == "g"));
    assert!(cancelled < deleted && deleted < uninstalled, "{seen:?}");
    assert_eq!(uninstalled, seen.len() - 1);
    assert_eq!(
        events.try_recv(),
        Err(TryRecvError::Empty),
        "Uninstalled is last"
    );
}

#[tokio::test]
async fn shutdown_gives_a_waiting_path_the_shutdown_code_and_keeps_resumable_bytes() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(300_000, 54);
    env.origin.route(
        "/held.bin",
        Behaviour::Sequence(vec![
            Behaviour::ranged_held(&body, "\"v1\"", 120_000),
            Behaviour::ranged(&body, "\"v1\""),
        ]),
    );
    let url = env.url("origin.test", "/held.bin");
    let service = Resources::open(&env.config()).unwrap();
    service
        .install("g", &manifest(json!([entry("h", &url, &body)])))
        .await
        .unwrap();
    let mut events = service.subscribe();
    let waiting = tokio::spawn({
        let service = service.clone();
        async move { service.path("g", "h").await }
    });
    until(&mut events, |e| matches!(e, Event::Started { .. })).await;
    wait_until("the bytes before the hold arrived", || {
        partial_files(&env)
            .iter()
            .any(|p| std::fs::metadata(p).is_ok_and(|m| m.len() >= 120_000))
    })
    .await;
    service.shutdown().await;
    let err = within("the waiting path", waiting)
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, Error::Shutdown), "{err:?}");
    assert_eq!(err.code(), ErrorCode::Shutdown);
    assert!(!partial_files(&env).is_empty(), "the bytes are kept");

    let reopened = Resources::open(&env.config()).unwrap();
    let kept = reopened.status(Some("g")).unwrap()[0].resources[0].partial_bytes;
    assert!(kept.is_some_and(|k| k > 0), "{kept:?}");
    let mut events = reopened.subscribe();
    let path = reopened.path("g", "h").await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    let resumed = std::iter::from_fn(|| events.try_recv().ok())
        .any(|e| matches!(e, Event::Resumed { offset, .. } if offset > 0));
    assert!(resumed, "the next run continued the kept bytes");
}
