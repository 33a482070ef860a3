//! Gems that share bytes, and installs or uninstalls that race downloads.

use gem_resources::{Error, ResourceState, Resources};
use serde_json::json;

use crate::support::*;

fn open(env: &Env) -> Resources {
    env.resources()
}

/// Takes the registry's lock as another process's install, uninstall or
/// import would; released when the file is dropped.
fn hold_registry(env: &Env) -> std::fs::File {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(store_root(env).join("locks").join("registry.lock"))
        .unwrap();
    file.lock().unwrap();
    file
}

fn state(service: &Resources, gem: &str, id: &str) -> ResourceState {
    service.status(Some(gem)).unwrap()[0]
        .resources
        .iter()
        .find(|r| r.id == id)
        .unwrap()
        .state
        .clone()
}

#[tokio::test]
async fn a_gem_whose_addresses_fail_does_not_stop_another_gem_declaring_the_same_bytes() {
    let env = Env::new().await;
    let body = bytes(4000, 70);
    env.origin.route("/broken.bin", Behaviour::Status(404));
    let broken = env.url("origin.test", "/broken.bin");
    let good = env.serve("/good.bin", &body);
    let service = open(&env);
    service
        .install(
            "a",
            &manifest(json!([required_entry("ra", &broken, &body)])),
        )
        .await
        .unwrap();
    service
        .install("b", &manifest(json!([required_entry("rb", &good, &body)])))
        .await
        .unwrap();
    within("both downloads", service.wait_idle()).await;
    assert_eq!(env.origin.hits("/good.bin"), 1);
    assert!(matches!(
        state(&service, "b", "rb"),
        ResourceState::Present { .. }
    ));
    // Gem a's file is the same bytes: present for it too.
    assert!(matches!(
        state(&service, "a", "ra"),
        ResourceState::Present { .. }
    ));
}

#[tokio::test]
async fn a_download_that_outlives_the_uninstall_of_its_gem_is_not_kept() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(3000, 71);
    let (url, gate) = env.serve_gated("/gated.bin", &body);
    let m = manifest(json!([entry("lazy", &url, &body)]));
    // Two services on one store stand for two processes.
    let downloader = open(&env);
    let other = open(&env);
    downloader.install("g", &m).await.unwrap();
    let lookup = {
        let downloader = downloader.clone();
        tokio::spawn(async move { downloader.path("g", "lazy").await })
    };
    wait_until("the request is in flight", || {
        env.origin.hits("/gated.bin") == 1
    })
    .await;
    let report = other.uninstall("g").await.unwrap();
    assert!(report.deleted.is_empty(), "nothing was stored yet");
    gate.open();
    let result = within("the lookup", lookup).await.unwrap();
    match result {
        Err(e) => assert!(matches!(e, Error::Cancelled { .. }), "{e}"),
        Ok(p) => panic!(
            "the lookup of an uninstalled gem succeeded: {}",
            p.display()
        ),
    }
    assert!(stored_files(&env, &body).is_empty());
}

#[tokio::test]
async fn a_download_that_fails_after_the_uninstall_of_its_gem_keeps_no_bytes() {
    let env = Env::new().await;
    env.write_config("stall_timeout_secs = 3");
    let body = bytes(200_000, 73);
    // Resumable bytes that stop coming: kept for resume, unless nothing
    // declares them any more.
    let url = env.serve_held("/held.bin", &body, 120_000);
    // Two services on one store stand for two processes.
    let downloader = open(&env);
    let other = open(&env);
    let lookup = env
        .downloading(
            &downloader,
            "g",
            json!([entry("lazy", &url, &body)]),
            "lazy",
            "/held.bin",
        )
        .await;
    wait_until("the bytes up to the stall are written", || {
        !partial_files(&env).is_empty() && env.origin.served("/held.bin") >= 120_000
    })
    .await;
    // The other process cannot remove bytes this download holds.
    other.uninstall("g").await.unwrap();
    assert!(!partial_files(&env).is_empty());
    let result = within("the lookup", lookup).await.unwrap();
    assert!(result.is_err(), "the held download failed at its stall");
    assert_eq!(
        partial_files(&env),
        Vec::<std::path::PathBuf>::new(),
        "bytes no installed gem declares are not kept for resume"
    );
}

#[tokio::test]
async fn a_download_that_fails_while_another_process_holds_the_registry_can_be_cancelled() {
    let env = Env::new().await;
    env.origin.route("/missing.bin", Behaviour::Status(404));
    let url = env.url("origin.test", "/missing.bin");
    let body = bytes(1000, 74);
    let service = open(&env);
    service
        .install("g", &manifest(json!([entry("lazy", &url, &body)])))
        .await
        .unwrap();
    // Another process's install or uninstall holds the registry while
    // this download fails (and looks whether its file is still declared).
    let registry = hold_registry(&env);
    let lookup = {
        let service = service.clone();
        tokio::spawn(async move { service.path("g", "lazy").await })
    };
    wait_until("the request", || env.origin.hits("/missing.bin") == 1).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // An uninstall here cancels the job the same way, holding the
    // registry of this process while it waits for the job to stop.
    within("the cancel", service.cancel("g", "lazy"))
        .await
        .unwrap();
    let result = within("the lookup", lookup).await.unwrap();
    assert!(result.is_err(), "the download failed");
    drop(registry);
}

#[tokio::test]
async fn a_failed_download_waiting_for_the_registry_holds_no_download_slot() {
    let env = Env::new().await;
    env.origin.route("/missing.bin", Behaviour::Status(404));
    let missing = env.url("origin.test", "/missing.bin");
    let body = bytes(1000, 75);
    let next = env.serve("/next.bin", &body);
    let mut config = env.config();
    config.service.max_concurrent_downloads = 1;
    let service = Resources::open_at(&config, &env.store_dir()).unwrap();
    let m = manifest(json!([
        entry("first", &missing, &bytes(1000, 76)),
        entry("second", &next, &body)
    ]));
    service.install("g", &m).await.unwrap();
    // Another process holds the registry: the failed download waits for
    // it before it ends (to see whether its file is still declared).
    let registry = hold_registry(&env);
    let first = {
        let service = service.clone();
        tokio::spawn(async move { service.path("g", "first").await })
    };
    wait_until("the first request", || env.origin.hits("/missing.bin") == 1).await;
    let second = {
        let service = service.clone();
        tokio::spawn(async move { service.path("g", "second").await })
    };
    // The one download slot is free once the first transfer is over.
    wait_until("the second request", || env.origin.hits("/next.bin") == 1).await;
    drop(registry);
    assert!(within("the first", first).await.unwrap().is_err());
    within("the second", second).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_record_whose_sha256_is_not_a_digest_is_refused_not_used_as_a_path() {
    let env = Env::new().await;
    let body = bytes(100, 72);
    let url = env.serve("/r.bin", &body);
    let service = open(&env);
    service
        .install("x", &manifest(json!([entry("r", &url, &body)])))
        .await
        .unwrap();
    let record = store_root(&env).join("gems").join("x.json");
    let text = std::fs::read_to_string(&record)
        .unwrap()
        .replace(&sha256_hex(&body), "../../../outside");
    std::fs::write(&record, text).unwrap();
    let err = service.path("x", "r").await.unwrap_err();
    assert_eq!(err.code(), "E_RESOURCE_IO", "{err}");
    assert!(err.to_string().contains("corrupted record"), "{err}");
    assert_eq!(env.origin.hits("/r.bin"), 0);
    assert!(!env.dir.path().join("outside").exists());
}

#[tokio::test]
async fn a_failure_while_another_process_waited_is_that_process_result_too() {
    // A stalled transfer is given up after 1 s.
    let env = Env::new().await;
    env.write_config("stall_timeout_secs = 1");
    let body = bytes(300_000, 73);
    env.origin.route(
        "/stalls.bin",
        Behaviour::Stall {
            body: body.clone(),
            sent: 1000,
        },
    );
    let url = env.url("origin.test", "/stalls.bin");
    let m = manifest(json!([entry("r", &url, &body)]));
    // Two services on one store stand for two processes.
    let first = open(&env);
    let second = open(&env);
    first.install("g", &m).await.unwrap();
    let a = {
        let first = first.clone();
        tokio::spawn(async move { first.path("g", "r").await })
    };
    wait_until("the first request is in flight", || {
        env.origin.hits("/stalls.bin") == 1
    })
    .await;
    let b = {
        let second = second.clone();
        tokio::spawn(async move { second.path("g", "r").await })
    };
    let a = within("the first lookup", a).await.unwrap().unwrap_err();
    let b = within("the second lookup", b).await.unwrap().unwrap_err();
    assert_eq!(
        env.origin.hits("/stalls.bin"),
        1,
        "the waiting process fetched again"
    );
    assert_eq!(a.code(), "E_RESOURCE_UNAVAILABLE");
    assert_eq!(b.code(), a.code());
    assert_eq!(b.to_string(), a.to_string());
    // A later call tries again.
    env.origin
        .route("/stalls.bin", Behaviour::Body(body.clone()));
    second.path("g", "r").await.unwrap();
    assert_eq!(env.origin.hits("/stalls.bin"), 2);
}
