//! What each event says, for a page that draws from events alone: when the
//! service saw it, the address a download is served from, what delivered
//! the file, the status rows of an installed gem, and whose removal
//! deleted a file.

use std::time::SystemTime;

use gem_resources::{Event, ResourceState, Resources};
use serde_json::{json, Value};

use crate::support::*;

/// The event's name in JSON (`progress`, `verified`, …).
fn kind(e: &Event) -> String {
    serde_json::to_value(e).unwrap()["event"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The keys of the event's JSON object, sorted.
fn keys(e: &Event) -> Vec<String> {
    let Value::Object(map) = serde_json::to_value(e).unwrap() else {
        panic!("not an object: {e:?}")
    };
    let mut keys: Vec<String> = map.keys().cloned().collect();
    keys.sort();
    keys
}

#[tokio::test]
async fn a_download_says_when_each_step_was_seen_where_it_comes_from_and_what_served_it() {
    let env = Env::new().await;
    let body = bytes(300_000, 141);
    let url = env.serve("/told.bin", &body);
    let service = Resources::open(&env.config()).unwrap();
    let mut events = service.subscribe();
    let before = SystemTime::now();
    service
        .install("g", &manifest(json!([required_entry("m", &url, &body)])))
        .await
        .unwrap();
    let seen = events_until(&mut events, |e| {
        matches!(e, Event::Verified { .. } | Event::Failed { .. })
    })
    .await;
    let after = SystemTime::now();
    let mut kinds: Vec<String> = seen.iter().map(kind).collect();
    kinds.dedup();
    assert_eq!(
        kinds,
        ["installed", "queued", "started", "progress", "verified"],
        "{seen:?}"
    );
    // Each is stamped when it was seen, in order, as RFC 3339 with
    // milliseconds.
    let mut last = before;
    for e in &seen {
        assert!(e.at() >= last && e.at() <= after, "{e:?}");
        last = e.at();
        let line = serde_json::to_value(e).unwrap();
        let at = line["at"].as_str().unwrap();
        assert_eq!(at, gem_resources::time::to_rfc3339_millis(e.at()));
        assert!(
            at.len() == 24 && &at[19..20] == "." && at.ends_with('Z'),
            "{at}"
        );
    }
    for e in &seen {
        match e {
            Event::Started { address, .. } | Event::Progress { address, .. } => {
                assert_eq!(address, url.as_str(), "{e:?}")
            }
            Event::Verified { served_by, .. } => {
                assert_eq!(served_by.as_deref(), Some(url.as_str()))
            }
            _ => {}
        }
    }
    let started = seen.iter().find(|e| kind(e) == "started").unwrap();
    assert_eq!(
        keys(started),
        ["address", "at", "event", "gem", "resource", "sha256", "size"]
    );
    let progress = seen.iter().find(|e| kind(e) == "progress").unwrap();
    assert_eq!(
        keys(progress),
        [
            "address",
            "at",
            "bytes",
            "bytes_per_sec",
            "eta_secs",
            "event",
            "gem",
            "resource",
            "sha256",
            "size"
        ]
    );
    assert_eq!(
        keys(seen.last().unwrap()),
        [
            "at",
            "event",
            "gem",
            "path",
            "resource",
            "served_by",
            "sha256"
        ]
    );
    service.shutdown().await;
}

#[tokio::test]
async fn installed_carries_the_gems_status_rows() {
    let env = Env::new().await;
    let (kept, added) = (bytes(20_000, 142), bytes(30_000, 143));
    let kept_url = env.url("origin.test", "/kept.bin");
    let added_url = env.url("origin.test", "/added.bin");
    let service = Resources::open(&env.config()).unwrap();
    service
        .install("g", &manifest(json!([entry("kept", &kept_url, &kept)])))
        .await
        .unwrap();
    let file = env.dir.path().join("kept.bin");
    std::fs::write(&file, &kept).unwrap();
    service.import(&file).await.unwrap();
    let mut events = service.subscribe();
    let upgrade = json!([
        entry("kept", &kept_url, &kept),
        entry("added", &added_url, &added)
    ]);
    service.install("g", &manifest(upgrade)).await.unwrap();
    let seen = events_until(&mut events, |e| matches!(e, Event::Installed { .. })).await;
    let Some(Event::Installed { gem, resources, .. }) = seen.last() else {
        unreachable!()
    };
    assert_eq!(gem, "g");
    // Lazy files: nothing changed since, so the rows are the status now.
    assert_eq!(resources, &service.status(Some("g")).unwrap()[0].resources);
    assert_eq!(resources.len(), 2);
    assert!(
        matches!(&resources[0].state, ResourceState::Present { served_by: Some(s), .. } if s == "import"),
        "{resources:?}"
    );
    assert_eq!(resources[1].state, ResourceState::Missing);
    let line = serde_json::to_value(seen.last().unwrap()).unwrap();
    assert_eq!(line["resources"][1]["id"], "added", "{line}");
    assert_eq!(line["resources"][0]["state"], "present", "{line}");
    service.shutdown().await;
}

#[tokio::test]
async fn deleted_names_the_gem_and_resource_whose_removal_deleted_the_file() {
    let env = Env::new().await;
    let (dropped, kept, checked, loose) = (
        bytes(10_000, 144),
        bytes(11_000, 145),
        bytes(12_000, 146),
        bytes(13_000, 147),
    );
    let at = |p: &str| env.url("origin.test", p);
    let loose_url = env.serve("/loose.bin", &loose);
    let service = Resources::open(&env.config()).unwrap();
    let first = json!([
        entry("dropped", &at("/d.bin"), &dropped),
        entry("kept", &at("/k.bin"), &kept)
    ]);
    service.install("g", &manifest(first)).await.unwrap();
    service
        .install(
            "h",
            &manifest(json!([entry("checked", &at("/c.bin"), &checked)])),
        )
        .await
        .unwrap();
    for (name, body) in [("d", &dropped), ("k", &kept), ("c", &checked)] {
        let file = env.dir.path().join(name);
        std::fs::write(&file, body).unwrap();
        service.import(&file).await.unwrap();
    }
    // Bytes in the store that no gem declares.
    fetch_with(
        &env,
        &resource("loose", &loose_url, &[], &loose),
        no_retry(),
    )
    .await
    .unwrap();
    let mut events = service.subscribe();
    let deleted = |seen: &[Event]| -> Vec<(String, Option<String>, Option<String>)> {
        seen.iter()
            .filter_map(|e| match e {
                Event::Deleted {
                    sha256,
                    gem,
                    resource,
                    ..
                } => Some((sha256.clone(), gem.clone(), resource.clone())),
                _ => None,
            })
            .collect()
    };
    let some = |s: &str| Some(s.to_string());

    // An upgrade that drops a file names the gem and the dropped id.
    service
        .install("g", &manifest(json!([entry("kept", &at("/k.bin"), &kept)])))
        .await
        .unwrap();
    let seen = events_until(&mut events, |e| matches!(e, Event::Deleted { .. })).await;
    assert_eq!(
        deleted(&seen),
        [(sha256_hex(&dropped), some("g"), some("dropped"))]
    );
    let line = serde_json::to_value(seen.last().unwrap()).unwrap();
    assert_eq!(
        (&line["gem"], &line["resource"]),
        (&json!("g"), &json!("dropped"))
    );

    // Verification names the gem that declares the file, and nobody for
    // a file no gem declares.
    corrupt(&stored_files(&env, &checked)[0]);
    corrupt(&stored_files(&env, &loose)[0]);
    let report = service.verify().await.unwrap();
    assert_eq!(report.corrupted.len(), 2, "{report:?}");
    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        seen.push(e);
    }
    let mut named = deleted(&seen);
    named.sort();
    let mut expected = vec![
        (sha256_hex(&checked), some("h"), some("checked")),
        (sha256_hex(&loose), None, None),
    ];
    expected.sort();
    assert_eq!(named, expected, "{seen:?}");

    // An uninstall names the gem and its id for the file.
    service.uninstall("g").await.unwrap();
    let seen = events_until(&mut events, |e| matches!(e, Event::Uninstalled { .. })).await;
    assert_eq!(
        deleted(&seen),
        [(sha256_hex(&kept), some("g"), some("kept"))]
    );
    service.shutdown().await;
}
