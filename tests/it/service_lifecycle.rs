//! The service's lifecycle through the library: install, lazy lookups,
//! upgrades, uninstall, app start, status, events and shutdown.

use gem_resources::{Event, ResourceState, ResourceStatus, Resources};
use serde_json::json;

use crate::support::*;

/// The status of one resource of one gem.
fn status_of(service: &Resources, gem: &str, id: &str) -> ResourceStatus {
    let gems = service.status(Some(gem)).unwrap();
    gems[0]
        .resources
        .iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("no resource {id} in {gems:?}"))
        .clone()
}

fn state_of(service: &Resources, gem: &str, id: &str) -> ResourceState {
    status_of(service, gem, id).state
}

fn open(env: &Env) -> Resources {
    env.resources()
}

#[tokio::test]
async fn install_returns_before_a_required_download_finishes() {
    let env = Env::new().await;
    let body = bytes(20_000, 1);
    let (url, gate) = env.serve_gated("/big.bin", &body);
    let service = open(&env);
    let report = within(
        "install must not wait for the download",
        service.install("g", &manifest(json!([required_entry("big", &url, &body)]))),
    )
    .await
    .unwrap();
    assert_eq!(report.queued, 1);
    wait_until("the download has started", || {
        env.origin.hits("/big.bin") == 1
    })
    .await;
    assert!(!gate.is_open());
    assert!(stored_files(&env, &body).is_empty());
    assert!(matches!(
        state_of(&service, "g", "big"),
        ResourceState::Downloading { .. }
    ));

    gate.open();
    within("the download", service.wait_idle()).await;
    let files = stored_files(&env, &body);
    assert_eq!(files.len(), 1);
    assert_eq!(std::fs::read(&files[0]).unwrap(), body);
    assert!(matches!(
        state_of(&service, "g", "big"),
        ResourceState::Present { .. }
    ));
    assert_eq!(env.origin.hits("/big.bin"), 1);
}

#[tokio::test]
async fn install_succeeds_when_every_address_fails_and_status_shows_each_reason() {
    let env = Env::new().await;
    let body = bytes(1000, 2);
    env.origin.route("/gone.bin", Behaviour::Status(404));
    env.origin.route("/broken.bin", Behaviour::Status(500));
    let mut e = required_entry("model", &env.url("origin.test", "/gone.bin"), &body);
    e["mirrors"] = json!([env.url("mirror.test", "/broken.bin").as_str()]);
    let service = open(&env);

    let report = service.install("g", &manifest(json!([e]))).await.unwrap();
    assert_eq!(report.queued, 1);
    within("the failed download", service.wait_idle()).await;

    assert_eq!(env.origin.hits("/gone.bin"), 1);
    assert_eq!(env.origin.hits("/broken.bin"), 1);
    let ResourceState::Failed { failure, .. } = state_of(&service, "g", "model") else {
        panic!("expected failed: {:?}", service.status(None));
    };
    assert_eq!(failure.code, "E_RESOURCE_UNAVAILABLE");
    assert!(failure.at > std::time::UNIX_EPOCH);
    assert_eq!(failure.attempts.len(), 2, "{failure:?}");
    assert!(failure.attempts[0].address.contains("origin.test"));
    assert_eq!(failure.attempts[0].code, "E_RESOURCE_HTTP");
    assert!(failure.attempts[0].reason.contains("404"), "{failure:?}");
    assert!(failure.attempts[1].address.contains("mirror.test"));
    assert_eq!(failure.attempts[1].code, "E_RESOURCE_HTTP");
    assert!(failure.attempts[1].reason.contains("500"), "{failure:?}");
    assert_eq!(service.installed().unwrap(), vec!["g".to_string()]);
}

#[tokio::test]
async fn a_failure_record_survives_reopening_the_service() {
    let env = Env::new().await;
    let body = bytes(1000, 3);
    env.origin.route("/gone.bin", Behaviour::Status(404));
    let url = env.url("origin.test", "/gone.bin");
    let first = {
        let service = open(&env);
        service
            .install(
                "g",
                &manifest(json!([required_entry("model", &url, &body)])),
            )
            .await
            .unwrap();
        within("the failed download", service.wait_idle()).await;
        let ResourceState::Failed { failure, .. } = state_of(&service, "g", "model") else {
            panic!("expected failed");
        };
        failure
    };
    let reopened = open(&env);
    let ResourceState::Failed { failure, .. } = state_of(&reopened, "g", "model") else {
        panic!("the failure was forgotten: {:?}", reopened.status(None));
    };
    assert_eq!(failure, first);
    assert_eq!(failure.attempts.len(), 1);
    assert_eq!(env.origin.hits("/gone.bin"), 1);
}

#[tokio::test]
async fn a_lazy_resource_downloads_at_first_path_and_never_again() {
    let env = Env::new().await;
    let body = bytes(30_000, 4);
    let url = env.serve("/lazy/tokenizer.json", &body);
    let service = open(&env);
    let report = service
        .install("g", &manifest(json!([entry("tok", &url, &body)])))
        .await
        .unwrap();
    assert_eq!(report.queued, 0);
    within("idle", service.wait_idle()).await;
    assert_eq!(env.origin.hits("/lazy/tokenizer.json"), 0);
    assert_eq!(state_of(&service, "g", "tok"), ResourceState::Missing);

    let path = service.path("g", "tok").await.unwrap();
    assert!(path.ends_with("tokenizer.json"), "{}", path.display());
    assert_eq!(std::fs::read(&path).unwrap(), body);
    assert_eq!(env.origin.hits("/lazy/tokenizer.json"), 1);

    let again = service.path("g", "tok").await.unwrap();
    assert_eq!(again, path);
    assert_eq!(env.origin.hits("/lazy/tokenizer.json"), 1);
}

#[tokio::test]
async fn a_failed_path_errors_that_call_only_and_the_next_call_tries_again() {
    let env = Env::new().await;
    let body = bytes(5000, 5);
    env.origin.route("/flaky.bin", Behaviour::Status(503));
    let url = env.url("origin.test", "/flaky.bin");
    let service = open(&env);
    service
        .install("g", &manifest(json!([entry("flaky", &url, &body)])))
        .await
        .unwrap();

    let err = service.path("g", "flaky").await.unwrap_err();
    assert_eq!(err.code(), "E_RESOURCE_UNAVAILABLE");
    let text = err.to_string();
    assert!(text.contains("flaky.bin") && text.contains("503"), "{text}");
    assert_eq!(env.origin.hits("/flaky.bin"), 1);
    assert!(matches!(
        state_of(&service, "g", "flaky"),
        ResourceState::Failed { .. }
    ));

    env.origin
        .route("/flaky.bin", Behaviour::Body(body.clone()));
    let path = service.path("g", "flaky").await.unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), body);
    assert_eq!(env.origin.hits("/flaky.bin"), 2);
    // Success clears the failure record.
    assert!(matches!(
        state_of(&service, "g", "flaky"),
        ResourceState::Present { .. }
    ));
    assert!(matches!(
        open(&env).status(Some("g")).unwrap()[0].resources[0].state,
        ResourceState::Present { .. }
    ));
}

#[tokio::test]
async fn an_upgrade_reuses_unchanged_files_and_deletes_dropped_ones_when_it_returns() {
    let env = Env::new().await;
    let (a, b, c) = (bytes(10_000, 6), bytes(11_000, 7), bytes(12_000, 8));
    let a_v1 = env.serve("/v1/a.bin", &a);
    let b_v1 = env.serve("/v1/b.bin", &b);
    let a_v2 = env.serve("/v2/a-renamed.bin", &a);
    let (c_v2, c_gate) = env.serve_gated("/v2/c.bin", &c);
    let service = open(&env);
    service
        .install(
            "g",
            &manifest(json!([
                required_entry("a", &a_v1, &a),
                entry("b", &b_v1, &b)
            ])),
        )
        .await
        .unwrap();
    within("v1 downloads", service.wait_idle()).await;
    service.path("g", "b").await.unwrap();
    assert_eq!(stored_files(&env, &a).len(), 1);
    assert_eq!(stored_files(&env, &b).len(), 1);

    let mut events = service.subscribe();
    let v2 = manifest(json!([
        required_entry("a2", &a_v2, &a),
        required_entry("c", &c_v2, &c)
    ]));
    // That B goes only once the new version is registered is shown by
    // service_cli's upgrade whose registration cannot be written.
    let report = within("upgrade", service.install("g", &v2)).await.unwrap();
    assert!(report.upgrade);
    assert_eq!(report.present, 1);
    assert_eq!(report.queued, 1);
    assert_eq!(report.deleted, vec![sha256_hex(&b)]);
    assert!(
        stored_files(&env, &b).is_empty(),
        "the dropped file is still stored"
    );
    let mut deleted = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let Event::Deleted { sha256, .. } = event {
            deleted.push(sha256);
        }
    }
    assert_eq!(deleted, vec![sha256_hex(&b)]);

    // A is reused under its new id and name, with no request.
    assert!(matches!(
        state_of(&service, "g", "a2"),
        ResourceState::Present { .. }
    ));
    let a_path = service.path("g", "a2").await.unwrap();
    assert!(a_path.ends_with("a-renamed.bin"), "{}", a_path.display());
    assert_eq!(std::fs::read(&a_path).unwrap(), a);
    assert_eq!(env.origin.hits("/v1/a.bin"), 1);
    assert_eq!(env.origin.hits("/v2/a-renamed.bin"), 0);

    // C, new and required, is queued in the background.
    wait_until("C is requested", || env.origin.hits("/v2/c.bin") == 1).await;
    assert!(matches!(
        state_of(&service, "g", "c"),
        ResourceState::Downloading { .. } | ResourceState::Queued
    ));
    c_gate.open();
    within("C", service.wait_idle()).await;
    assert_eq!(stored_files(&env, &c).len(), 1);
    assert_eq!(env.origin.hits("/v2/c.bin"), 1);
    assert_eq!(env.origin.hits("/v1/a.bin"), 1);
    assert_eq!(env.origin.hits("/v2/a-renamed.bin"), 0);
}

#[tokio::test]
async fn a_file_shared_by_two_gems_survives_the_first_uninstall_and_goes_with_the_last() {
    let env = Env::new().await;
    let (shared, own) = (bytes(8000, 9), bytes(9000, 10));
    let shared_url = env.serve("/shared.bin", &shared);
    let own_url = env.serve("/own.bin", &own);
    let other_url = env.serve("/elsewhere/shared-copy.bin", &shared);
    let service = open(&env);
    service
        .install(
            "one",
            &manifest(json!([
                required_entry("shared", &shared_url, &shared),
                required_entry("own", &own_url, &own)
            ])),
        )
        .await
        .unwrap();
    within("gem one", service.wait_idle()).await;
    let report = service
        .install(
            "two",
            &manifest(json!([required_entry("copy", &other_url, &shared)])),
        )
        .await
        .unwrap();
    assert_eq!((report.present, report.queued), (1, 0));
    within("gem two", service.wait_idle()).await;

    let report = service.uninstall("one").await.unwrap();
    assert_eq!(report.deleted, vec![sha256_hex(&own)]);
    assert_eq!(report.kept, vec![sha256_hex(&shared)]);
    assert!(stored_files(&env, &own).is_empty());
    assert!(!stored_files(&env, &shared).is_empty());
    assert_eq!(service.installed().unwrap(), vec!["two".to_string()]);
    let path = service.path("two", "copy").await.unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), shared);
    assert_eq!(env.origin.hits("/shared.bin"), 1);
    assert_eq!(env.origin.hits("/elsewhere/shared-copy.bin"), 0);

    let report = service.uninstall("two").await.unwrap();
    assert_eq!(report.deleted, vec![sha256_hex(&shared)]);
    assert!(stored_files(&env, &shared).is_empty());
    assert!(service.installed().unwrap().is_empty());
    assert!(files_under(&store_root(&env).join("blobs")).is_empty());
}

#[tokio::test]
async fn uninstall_cancels_an_in_flight_download_and_leaves_no_partial_file() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let (body, url) = stalled_route(&env, "/stall.bin", 100_000, 40_000, 11);
    let service = open(&env);
    service
        .install("g", &manifest(json!([required_entry("s", &url, &body)])))
        .await
        .unwrap();
    wait_until("the download is in flight", || {
        matches!(
            state_of(&service, "g", "s"),
            ResourceState::Downloading { bytes: 40_000, .. }
        )
    })
    .await;
    assert_eq!(partial_files(&env).len(), 1);

    let report = within("uninstall", service.uninstall("g")).await.unwrap();
    assert!(report.deleted.is_empty());
    assert!(tmp_files(&env).is_empty(), "{:?}", tmp_files(&env));
    assert!(stored_files(&env, &body).is_empty());
    assert!(service.installed().unwrap().is_empty());
    within("idle", service.wait_idle()).await;
    assert_eq!(env.origin.hits("/stall.bin"), 1);
}

#[tokio::test]
async fn start_requeues_a_required_download_that_failed() {
    let env = Env::new().await;
    let body = bytes(7000, 12);
    env.origin.route("/later.bin", Behaviour::Status(500));
    let url = env.url("origin.test", "/later.bin");
    {
        let service = open(&env);
        service
            .install(
                "g",
                &manifest(json!([required_entry("later", &url, &body)])),
            )
            .await
            .unwrap();
        within("the failed download", service.wait_idle()).await;
        assert!(matches!(
            state_of(&service, "g", "later"),
            ResourceState::Failed { .. }
        ));
    }
    assert_eq!(env.origin.hits("/later.bin"), 1);

    env.origin
        .route("/later.bin", Behaviour::Body(body.clone()));
    let service = open(&env);
    assert_eq!(service.start().await.unwrap(), 1);
    within("the download at start", service.wait_idle()).await;
    assert_eq!(env.origin.hits("/later.bin"), 2);
    assert!(matches!(
        state_of(&service, "g", "later"),
        ResourceState::Present { .. }
    ));
    assert_eq!(std::fs::read(&stored_files(&env, &body)[0]).unwrap(), body);

    // Nothing is missing any more: another start requests nothing.
    assert_eq!(open(&env).start().await.unwrap(), 0);
    assert_eq!(env.origin.hits("/later.bin"), 2);
}

#[tokio::test]
async fn status_reports_label_size_host_and_eager_or_lazy() {
    let env = Env::new().await;
    let (a, b) = (bytes(1234, 13), bytes(4321, 14));
    let a_url = env.serve("/a.onnx", &a);
    env.origin.route("/b.bin", Behaviour::Body(b.clone()));
    let b_url = env.url("cdn.test", "/b.bin");
    let mut a_entry = required_entry("ocr", &a_url, &a);
    a_entry["description"] = json!("OCR model");
    let service = open(&env);
    service
        .install("g", &manifest(json!([a_entry, entry("vocab", &b_url, &b)])))
        .await
        .unwrap();
    within("downloads", service.wait_idle()).await;

    let gems = service.status(None).unwrap();
    assert_eq!(gems.len(), 1);
    assert_eq!(gems[0].gem, "g");
    let [ocr, vocab] = &gems[0].resources[..] else {
        panic!("{gems:?}");
    };
    assert_eq!(ocr.id, "ocr");
    assert_eq!(ocr.label, "OCR model");
    assert_eq!(ocr.size, 1234);
    assert_eq!(ocr.host, "origin.test");
    assert!(ocr.required);
    assert_eq!(ocr.sha256, sha256_hex(&a));
    let ResourceState::Present { path, .. } = &ocr.state else {
        panic!("{ocr:?}");
    };
    assert_eq!(std::fs::read(path).unwrap(), a);

    assert_eq!(vocab.label, "vocab", "the label falls back to the id");
    assert_eq!(vocab.size, 4321);
    assert_eq!(vocab.host, "cdn.test");
    assert!(!vocab.required);
    assert_eq!(vocab.state, ResourceState::Missing);
    assert!(service.status(Some("nope")).is_err());
}

#[tokio::test]
async fn status_shows_queued_and_downloading_with_the_bytes_so_far() {
    let env = Env::new().await;
    write_patient_config(&env, "[service]\nmax_concurrent_downloads = 1");
    let (a, b) = (bytes(200_000, 15), bytes(3000, 16));
    env.origin.route(
        "/a.bin",
        Behaviour::Stall {
            body: a.clone(),
            sent: 50_000,
        },
    );
    let b_url = env.serve("/b.bin", &b);
    let a_url = env.url("origin.test", "/a.bin");
    let service = open(&env);
    service
        .install("first", &manifest(json!([required_entry("a", &a_url, &a)])))
        .await
        .unwrap();
    wait_until("50000 bytes are reported", || {
        matches!(
            state_of(&service, "first", "a"),
            ResourceState::Downloading { bytes: 50_000, .. }
        )
    })
    .await;
    service
        .install(
            "second",
            &manifest(json!([required_entry("b", &b_url, &b)])),
        )
        .await
        .unwrap();
    assert_eq!(state_of(&service, "second", "b"), ResourceState::Queued);
    assert_eq!(env.origin.hits("/b.bin"), 0);

    within("shutdown", service.shutdown()).await;
    assert!(tmp_files(&env).is_empty());
    assert_eq!(env.origin.hits("/b.bin"), 0);
}

#[tokio::test]
async fn events_report_queued_started_progress_and_verified_in_order() {
    let env = Env::new().await;
    let body = bytes(150_000, 17);
    let url = env.serve("/evented.bin", &body);
    let service = open(&env);
    let mut events = service.subscribe();
    service
        .install("g", &manifest(json!([required_entry("e", &url, &body)])))
        .await
        .unwrap();
    within("download", service.wait_idle()).await;

    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(event);
    }
    let position = |what: &str, f: &dyn Fn(&Event) -> bool| {
        seen.iter()
            .position(f)
            .unwrap_or_else(|| panic!("no {what} event in {seen:?}"))
    };
    let installed = position(
        "installed",
        &|e| matches!(e, Event::Installed { gem, resources, .. } if gem == "g" && resources.len() == 1),
    );
    let queued = position(
        "queued",
        &|e| matches!(e, Event::Queued { gem, resource, size: 150_000, .. } if gem == "g" && resource == "e"),
    );
    let started = position(
        "started",
        &|e| matches!(e, Event::Started { resource, size: 150_000, .. } if resource == "e"),
    );
    let progress = position("progress", &|e| matches!(e, Event::Progress { .. }));
    let verified = position(
        "verified",
        &|e| matches!(e, Event::Verified { resource, .. } if resource == "e"),
    );
    assert!(installed < started, "{seen:?}");
    assert!(
        queued < started && started < progress && progress < verified,
        "{seen:?}"
    );
    let last_progress = seen[..verified]
        .iter()
        .rev()
        .find_map(|e| match e {
            Event::Progress { bytes, size, .. } => Some((*bytes, *size)),
            _ => None,
        })
        .unwrap();
    assert_eq!(last_progress, (150_000, 150_000));
    let Event::Verified { path, gem, .. } = &seen[verified] else {
        unreachable!()
    };
    assert_eq!(gem, "g");
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert!(!seen.iter().any(|e| matches!(e, Event::Failed { .. })));
}

#[tokio::test]
async fn a_failed_download_emits_failed_with_its_code() {
    let env = Env::new().await;
    let body = bytes(100, 18);
    env.origin.route("/missing.bin", Behaviour::Status(404));
    let url = env.url("origin.test", "/missing.bin");
    let service = open(&env);
    let mut events = service.subscribe();
    service
        .install("g", &manifest(json!([required_entry("m", &url, &body)])))
        .await
        .unwrap();
    within("download", service.wait_idle()).await;
    let mut failed = Vec::new();
    while let Ok(event) = events.try_recv() {
        assert!(!matches!(event, Event::Verified { .. }));
        if let Event::Failed {
            gem,
            resource,
            code,
            message,
            ..
        } = event
        {
            failed.push((gem, resource, code, message));
        }
    }
    assert_eq!(failed.len(), 1, "{failed:?}");
    let (gem, resource, code, message) = &failed[0];
    assert_eq!((gem.as_str(), resource.as_str()), ("g", "m"));
    assert_eq!(code, "E_RESOURCE_UNAVAILABLE");
    assert!(
        message.contains("E_RESOURCE_HTTP") && message.contains("404"),
        "{message}"
    );
}

#[tokio::test]
async fn shutdown_stops_an_in_flight_download_and_removes_its_partial_file() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let (body, url) = stalled_route(&env, "/stall.bin", 600_000, 400_000, 19);
    let service = open(&env);
    service
        .install("g", &manifest(json!([required_entry("s", &url, &body)])))
        .await
        .unwrap();
    let waiter = {
        let service = service.clone();
        tokio::spawn(async move { service.path("g", "s").await })
    };
    wait_until("the stalled bytes are on disk", || {
        partial_files(&env)
            .iter()
            .any(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0))
    })
    .await;

    within("shutdown", service.shutdown()).await;
    assert!(tmp_files(&env).is_empty(), "{:?}", tmp_files(&env));
    assert!(stored_files(&env, &body).is_empty());
    let err = within("the waiting path call", waiter)
        .await
        .unwrap()
        .unwrap_err();
    // A call that was waiting when the service shut down says so.
    assert_eq!(err.code(), "E_RESOURCE_SHUTDOWN");
    // Stopping is not a failure of the resource.
    assert!(!matches!(
        open(&env).status(Some("g")).unwrap()[0].resources[0].state,
        ResourceState::Failed { .. }
    ));
}

#[tokio::test]
async fn start_removes_records_half_written_by_a_crash_and_keeps_whole_ones() {
    let env = Env::new().await;
    let body = bytes(100, 60);
    let url = env.serve("/kept.bin", &body);
    let service = open(&env);
    service
        .install("g", &manifest(json!([entry("kept", &url, &body)])))
        .await
        .unwrap();
    let leftover = store_root(&env).join("gems").join(".g.json.x1y2.tmp");
    std::fs::write(&leftover, b"{\"gem\": \"g\", \"reso").unwrap();
    let service = open(&env);
    service.start().await.unwrap();
    assert!(!leftover.exists());
    assert_eq!(service.installed().unwrap(), vec!["g".to_string()]);
}
