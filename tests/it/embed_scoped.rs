//! The service scoped to one gem (`ctx.resources`): `Resources::gem` and
//! `Blocking::gem`, seen from outside the crate.

use std::time::Duration;

use gem_resources::{Error, ErrorCode, Event, GemResources, ResourceState, Resources};
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

fn state(gem: &GemResources) -> ResourceState {
    gem.status().unwrap().resources[0].state.clone()
}

#[tokio::test]
async fn a_gem_handle_reaches_its_own_resources_and_no_other_gems() {
    let env = Env::new().await;
    let (mine, theirs) = (bytes(8_000, 31), bytes(9_000, 32));
    let mine_url = env.serve("/mine.bin", &mine);
    let theirs_url = env.serve("/theirs.bin", &theirs);
    let service = Resources::open(&env.config()).unwrap();
    service
        .install("a", &manifest(json!([entry("m", &mine_url, &mine)])))
        .await
        .unwrap();
    service
        .install(
            "b",
            &manifest(json!([
                entry("m", &theirs_url, &theirs),
                entry("only-b", &theirs_url, &theirs)
            ])),
        )
        .await
        .unwrap();
    let a = service.gem("a");
    assert_eq!(a.id(), "a");
    // A clone is the same handle, usable from another task.
    let path = tokio::spawn({
        let a = a.clone();
        async move { a.path("m").await }
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), mine);
    let status = a.status().unwrap();
    assert_eq!(status.gem, "a");
    let ids: Vec<&str> = status.resources.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["m"]);
    assert!(matches!(state(&a), ResourceState::Present { .. }));
    // Another gem's resource id is not this gem's.
    let err = a.download_now("only-b").unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    assert!(err.to_string().contains("\"a\""), "{err}");
    assert_eq!(
        env.origin.hits("/theirs.bin"),
        0,
        "nothing of gem b was fetched"
    );
    assert!(!a.download_now("m").unwrap(), "present already");
    assert_eq!(a.service().installed().unwrap(), ["a", "b"]);
}

#[tokio::test]
async fn a_gem_handle_cancels_and_retries() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let slow = bytes(400_000, 33);
    env.origin.route(
        "/slow.bin",
        Behaviour::Ranged {
            body: slow.clone(),
            etag: "\"v1\"".into(),
            ignore_range: false,
            cut_at: None,
            hold: false,
            pace: Some((16_384, Duration::from_millis(20))),
        },
    );
    let flaky = bytes(20_000, 34);
    env.origin.route(
        "/flaky.bin",
        Behaviour::Sequence(vec![Behaviour::Status(503), Behaviour::Body(flaky.clone())]),
    );
    let (slow_url, flaky_url) = (
        env.url("origin.test", "/slow.bin"),
        env.url("origin.test", "/flaky.bin"),
    );
    let service = Resources::open(&env.config()).unwrap();
    let mut events = service.subscribe();
    service
        .install("g", &manifest(json!([entry("slow", &slow_url, &slow)])))
        .await
        .unwrap();
    let g = service.gem("g");
    assert!(g.download_now("slow").unwrap());
    next(&mut events, |e| matches!(e, Event::Progress { .. })).await;
    assert!(g.cancel("slow").await.unwrap(), "a download was running");
    next(
        &mut events,
        |e| matches!(e, Event::Cancelled { gem, .. } if gem == "g"),
    )
    .await;
    assert!(matches!(state(&g), ResourceState::Missing));

    service
        .install(
            "g",
            &manifest(json!([required_entry("flaky", &flaky_url, &flaky)])),
        )
        .await
        .unwrap();
    service.wait_idle().await;
    assert!(matches!(state(&g), ResourceState::Failed { .. }));
    assert!(g.retry("flaky").await.unwrap());
    next(
        &mut events,
        |e| matches!(e, Event::Verified { gem, .. } if gem == "g"),
    )
    .await;
    assert!(matches!(state(&g), ResourceState::Present { .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_blocking_gem_handle_works_from_a_plain_thread_and_refuses_on_the_runtime() {
    let env = Env::new().await;
    let body = bytes(30_000, 35);
    let url = env.serve("/b.bin", &body);
    let service = Resources::open(&env.config()).unwrap();
    service
        .install("g", &manifest(json!([entry("b", &url, &body)])))
        .await
        .unwrap();
    let handle = service.blocking().gem("g");
    let on_thread = handle.clone();
    let done = tokio::task::spawn_blocking(move || {
        std::thread::spawn(move || {
            let missing = matches!(
                on_thread.status()?.resources[0].state,
                ResourceState::Missing
            );
            let path = on_thread.path("b")?;
            let again = on_thread.download_now("b")?;
            let cancelled = on_thread.cancel("b")?;
            let retried = on_thread.retry("b")?;
            gem_resources::Result::<_>::Ok((missing, path, again, cancelled, retried))
        })
        .join()
        .expect("the thread panicked")
    });
    let (missing, path, again, cancelled, retried) =
        within("the blocking calls", done).await.unwrap().unwrap();
    assert!(missing, "missing before the first path");
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert!(!again && !cancelled && !retried, "present: nothing to do");
    assert_eq!(handle.id(), "g");
    assert_eq!(handle.scoped().id(), "g");
    // On a runtime thread the waiting calls refuse; status never waits.
    let err = handle.path("b").unwrap_err();
    assert!(
        matches!(err, Error::BlockingInRuntime { call: "path" }),
        "{err}"
    );
    assert!(handle.status().is_ok());
}

#[tokio::test]
async fn a_gem_handle_outlives_an_uninstall_and_serves_the_next_install() {
    let env = Env::new().await;
    let body = bytes(5_000, 36);
    let url = env.serve("/u.bin", &body);
    let service = Resources::open(&env.config()).unwrap();
    let g = service.gem("g");
    assert_eq!(g.status().unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(g.path("u").await.unwrap_err().code(), ErrorCode::NotFound);
    let bad = service.gem("Not A Gem");
    assert_eq!(bad.status().unwrap_err().code(), ErrorCode::GemId);
    service
        .install("g", &manifest(json!([entry("u", &url, &body)])))
        .await
        .unwrap();
    assert_eq!(std::fs::read(g.path("u").await.unwrap()).unwrap(), body);
    service.uninstall("g").await.unwrap();
    assert_eq!(g.download_now("u").unwrap_err().code(), ErrorCode::NotFound);
}
