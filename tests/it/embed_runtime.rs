//! The service as an app embeds it, seen from outside Tokio: any executor,
//! a plain thread, no executor at all.

use gem_resources::{ErrorCode, Resources};
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
            blocking.shutdown();
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
