//! Thousands of resources: the work per resource stays constant (counted,
//! not timed), and the cached registrations never hide a change made by
//! another process.

use gem_resources::{Error, Resources};
use serde_json::json;

use crate::support::*;

fn open(env: &Env) -> Resources {
    env.resources()
}

#[tokio::test]
async fn installing_many_resources_parses_the_registration_a_bounded_number_of_times() {
    let env = Env::new().await;
    let n = 120;
    let entries: Vec<_> = (0..n)
        .map(|i| {
            let body = bytes(64 + i, i as u8);
            let url = env.serve(&format!("/r{i}.bin"), &body);
            required_entry(&format!("r{i}"), &url, &body)
        })
        .collect();
    let service = open(&env);
    let report = service
        .install("many", &manifest(json!(entries)))
        .await
        .unwrap();
    assert_eq!(report.queued, n);
    // A bound against a hang, not a speed check: 120 downloads take 10 to
    // 26 s under Wine on two cores.
    tokio::time::timeout(std::time::Duration::from_secs(90), service.wait_idle())
        .await
        .expect("the downloads end");
    let status = service.status(Some("many")).unwrap();
    let present = status[0]
        .resources
        .iter()
        .filter(|r| matches!(r.state, gem_resources::ResourceState::Present { .. }))
        .count();
    assert_eq!(present, n);
    // Each finished download checks that a gem still declares its file and
    // clears its failure record: with one parse of every registration per
    // download this would be 2 × n or more.
    let parses = service.registry_parses();
    assert!(
        parses <= 4,
        "{parses} parses of the registration for {n} resources"
    );
    let report = service.uninstall("many").await.unwrap();
    assert_eq!(report.deleted.len(), n);
    assert!(files_under(&store_root(&env).join("blobs")).is_empty());
}

#[tokio::test]
async fn a_download_that_outlives_an_upgrade_in_another_process_dropping_it_is_not_kept() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(3000, 81);
    let kept = bytes(3000, 82);
    let (url, gate) = env.serve_gated("/gated.bin", &body);
    let other_url = env.serve("/kept.bin", &kept);
    // Two services on one store stand for two processes. The new version
    // has as many resources, with the same ids, as the old one: the
    // registration file keeps its size.
    let downloader = open(&env);
    let other = open(&env);
    let v1 = manifest(json!([entry("model", &url, &body)]));
    let v2 = manifest(json!([entry("model", &other_url, &kept)]));
    downloader.install("g", &v1).await.unwrap();
    // The downloader has read (and cached) version 1.
    assert_eq!(downloader.status(Some("g")).unwrap().len(), 1);
    let lookup = {
        let downloader = downloader.clone();
        tokio::spawn(async move { downloader.path("g", "model").await })
    };
    wait_until("the request is in flight", || {
        env.origin.hits("/gated.bin") == 1
    })
    .await;
    other.install("g", &v2).await.unwrap();
    gate.open();
    let result = within("the lookup", lookup).await.unwrap();
    match result {
        Err(e) => assert!(matches!(e, Error::Cancelled { .. }), "{e}"),
        Ok(p) => panic!("a file the new version dropped was kept: {}", p.display()),
    }
    assert!(stored_files(&env, &body).is_empty());
    assert_eq!(
        downloader.status(Some("g")).unwrap()[0].resources[0].sha256,
        sha256_hex(&kept)
    );
}
