//! The service as an app embeds it, seen from outside Tokio: any executor,
//! a plain thread, no executor at all.

use gem_resources::{Error, ErrorCode, ImportOutcome, Resources};
use serde_json::json;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_downloads_a_missing_file_when_awaited_from_another_executor_on_a_plain_thread() {
    let env = Env::new().await;
    let body = bytes(40_000, 61);
    let url = env.serve("/lazy.bin", &body);
    let service = Resources::open(&env.config()).unwrap();
    service
        .install("g", &manifest(json!([entry("lazy", &url, &body)])))
        .await
        .unwrap();
    let on_thread = service.clone();
    let looked_up = tokio::task::spawn_blocking(move || {
        std::thread::spawn(move || futures_executor::block_on(on_thread.path("g", "lazy")))
            .join()
            .expect("the lookup thread panicked")
    });
    let path = within("the lookup from another executor", looked_up)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), body);
    assert_eq!(env.origin.hits("/lazy.bin"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_async_call_works_from_another_executor() {
    let env = Env::new().await;
    let body = bytes(30_000, 62);
    let url = env.serve("/r.bin", &body);
    let service = Resources::open(&env.config()).unwrap();
    let m = manifest(json!([required_entry("r", &url, &body)]));
    let on_thread = service.clone();
    let outcome = tokio::task::spawn_blocking(move || {
        futures_executor::block_on(async {
            let report = on_thread.install("g", &m).await?;
            on_thread.wait_idle().await;
            let queued = on_thread.start().await?;
            let verified = on_thread.verify().await?;
            let uninstalled = on_thread.uninstall("g").await?;
            on_thread.shutdown().await;
            gem_resources::Result::<_>::Ok((report, queued, verified, uninstalled))
        })
    });
    let (report, queued, verified, uninstalled) =
        within("the calls", outcome).await.unwrap().unwrap();
    assert_eq!(report.queued, 1);
    assert_eq!(queued, 0, "the install's download had finished");
    assert_eq!(verified.ok, 1);
    assert_eq!(uninstalled.deleted, vec![sha256_hex(&body)]);
    assert!(service.is_shut_down());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outside_a_runtime_open_fails_with_its_own_code_and_a_handle_makes_it_work() {
    let env = Env::new().await;
    let body = bytes(25_000, 63);
    let url = env.serve("/b.bin", &body);
    let config = env.config();
    let handle = tokio::runtime::Handle::current();
    let thread = tokio::task::spawn_blocking(move || {
        std::thread::spawn(move || {
            let err = Resources::open(&config).unwrap_err();
            assert_eq!(err.code(), ErrorCode::Runtime, "{err}");
            assert!(err.to_string().contains("open_with_handle"), "{err}");
            let service = Resources::open_with_handle(&config, handle).unwrap();
            let blocking = service.blocking();
            let m = manifest(json!([entry("b", &url, &body)]));
            let report = blocking.install("g", &m).unwrap();
            let path = blocking.path("g", "b").unwrap();
            let status = blocking.status(Some("g")).unwrap();
            blocking.shutdown().unwrap();
            (report, std::fs::read(path).unwrap(), status, body)
        })
        .join()
        .expect("the plain thread panicked")
    });
    let (report, read, status, body) = within("the plain thread", thread).await.unwrap();
    assert_eq!(report.resources, 1);
    assert_eq!(read, body);
    assert!(matches!(
        status[0].resources[0].state,
        gem_resources::ResourceState::Present { .. }
    ));
}

/// Runs `work` on a thread of its own, outside every runtime (a blocking
/// task of the test's runtime would still see that runtime).
pub(crate) async fn on_plain_thread<T: Send + 'static>(
    what: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> T {
    let thread = tokio::task::spawn_blocking(move || {
        std::thread::spawn(work)
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
    });
    within(what, thread).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_public_call_works_when_awaited_from_a_plain_thread_outside_tokio() {
    let env = Env::new().await;
    let (kept, lazy, held) = (bytes(30_000, 64), bytes(20_000, 65), bytes(10_000, 66));
    let kept_url = env.serve("/kept.bin", &kept);
    let lazy_url = env.serve("/lazy.bin", &lazy);
    let gate = Gate::new();
    env.origin.route(
        "/held.bin",
        Behaviour::Gated {
            body: held.clone(),
            gate: gate.clone(),
        },
    );
    let user_file = env.dir.path().join("user-copy.bin");
    std::fs::write(&user_file, &kept).unwrap();
    let service = Resources::open(&env.config()).unwrap();
    let m = manifest(json!([
        entry("kept", &kept_url, &kept),
        entry("lazy", &lazy_url, &lazy),
        entry("held", &env.url("origin.test", "/held.bin"), &held),
    ]));
    let s = service.clone();
    let outcome = on_plain_thread("the calls", move || {
        futures_executor::block_on(async {
            assert!(tokio::runtime::Handle::try_current().is_err());
            let mut events = s.subscribe();
            s.install("g", &m).await?;
            let imported = s.import(&user_file).await?;
            let lazy_path = s.path("g", "lazy").await?;
            let read =
                std::fs::read(&lazy_path).map_err(|e| Error::io("cannot read", &lazy_path, e))?;
            let queued = s.download_now("g", "held")?;
            let cancelled = s.cancel("g", "held").await?;
            let retried = s.retry("g", "held").await?;
            s.cancel("g", "held").await?;
            let requeued = s.set_policy(gem_resources::Policy::default())?;
            let _ = s.policy();
            let (_extra, status) = s.subscribe_with_status(Some("g"))?;
            let installed = s.installed()?;
            let started = s.start().await?;
            s.wait_idle().await;
            let verified = s.verify().await?;
            let uninstalled = s.uninstall("g").await?;
            s.shutdown().await;
            // Shutdown ended the subscription: after its buffer, `Closed`
            // (not `Empty`, which would leave a waiting task waiting).
            let mut seen = 0;
            let end = loop {
                match events.try_recv() {
                    Ok(_) => seen += 1,
                    Err(e) => break e,
                }
            };
            assert_eq!(end, tokio::sync::broadcast::error::TryRecvError::Closed);
            Result::<_, Error>::Ok((
                imported,
                read,
                [queued, cancelled, retried],
                requeued,
                status,
                installed,
                started,
                verified.checked,
                uninstalled.gem,
                seen,
            ))
        })
    })
    .await;
    let (imported, read, controls, requeued, status, installed, started, checked, gone, seen) =
        outcome.unwrap();
    assert!(
        matches!(imported, ImportOutcome::Imported { ref resources, .. } if resources == &["g/kept"]),
        "{imported:?}"
    );
    assert_eq!(read, lazy);
    assert_eq!(controls, [true, true, true]);
    assert_eq!(requeued, 0);
    assert_eq!(status[0].resources.len(), 3);
    assert_eq!(installed, ["g"]);
    assert_eq!(
        (started, checked),
        (0, 2),
        "nothing required; two files stored"
    );
    assert_eq!(gone, "g");
    assert!(seen > 0, "the subscription saw the events before it ended");
    assert_eq!(
        env.origin.hits("/kept.bin"),
        0,
        "imported, never downloaded"
    );
    assert!(service.is_shut_down());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_call_inside_an_async_task_is_refused_with_the_runtime_code() {
    let env = Env::new().await;
    let body = bytes(20_000, 67);
    let url = env.serve("/r.bin", &body);
    let user_file = env.dir.path().join("user-copy.bin");
    std::fs::write(&user_file, &body).unwrap();
    let service = Resources::open(&env.config()).unwrap();
    let m = manifest(json!([entry("r", &url, &body)]));
    service.install("g", &m).await.unwrap();
    let blocking = service.blocking();
    let refused = |what: &str, r: Result<(), Error>| {
        let err = r.expect_err(what);
        assert_eq!(err.code(), ErrorCode::Runtime, "{what}: {err}");
        assert!(
            err.to_string()
                .contains(&format!("await Resources::{what} there instead")),
            "{err}"
        );
    };
    // In the test's own task, and in a task spawned on the runtime.
    refused("path", blocking.path("g", "r").map(drop));
    refused("install", blocking.install("g", &m).map(drop));
    refused("import", blocking.import(&user_file).map(drop));
    refused("wait_idle", blocking.wait_idle());
    refused("shutdown", blocking.shutdown());
    let in_task = {
        let blocking = blocking.clone();
        tokio::spawn(async move {
            (
                blocking.uninstall("g").map(drop),
                blocking.start().map(drop),
                blocking.verify().map(drop),
                blocking.cancel("g", "r").map(drop),
                blocking.retry("g", "r").map(drop),
            )
        })
    };
    let (uninstall, start, verify, cancel, retry) = within("the task", in_task).await.unwrap();
    refused("uninstall", uninstall);
    refused("start", start);
    refused("verify", verify);
    refused("cancel", cancel);
    refused("retry", retry);
    // What never waits works anywhere.
    assert_eq!(blocking.status(Some("g")).unwrap().len(), 1);
    // Nothing was done; the service still serves, and from a thread of its
    // own the same calls work.
    assert_eq!(env.origin.hits("/r.bin"), 0);
    let path = on_plain_thread("the blocking path", move || blocking.path("g", "r"))
        .await
        .unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert!(!service.is_shut_down());
    service.shutdown().await;
}
