//! Shared downloads and bounded concurrency: many callers, one request; a
//! global limit; on-demand lookups ahead of background work.

use gem_resources::{ResourceState, Resources};
use serde_json::json;

use crate::support::*;

fn gated(env: &Env, path: &str, body: &[u8]) -> Gate {
    let gate = Gate::new();
    env.origin.route(
        path,
        Behaviour::Gated {
            body: body.to_vec(),
            gate: gate.clone(),
        },
    );
    gate
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_path_calls_for_one_lazy_resource_make_one_request() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(40_000, 21);
    let gate = gated(&env, "/lazy.bin", &body);
    let url = env.url("origin.test", "/lazy.bin");
    let service = env.resources();
    service
        .install("g", &manifest(json!([entry("lazy", &url, &body)])))
        .await
        .unwrap();
    let callers: Vec<_> = (0..50)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(async move { service.path("g", "lazy").await })
        })
        .collect();
    wait_until("the one request arrives", || {
        env.origin.hits("/lazy.bin") == 1
    })
    .await;
    gate.open();
    let mut paths = Vec::new();
    for caller in callers {
        paths.push(within("a path call", caller).await.unwrap().unwrap());
    }
    assert!(paths.iter().all(|p| *p == paths[0]), "{paths:?}");
    assert_eq!(std::fs::read(&paths[0]).unwrap(), body);
    assert_eq!(env.origin.hits("/lazy.bin"), 1);
}

#[tokio::test]
async fn path_for_a_required_file_already_downloading_joins_that_download() {
    let logs = Logs::capture();
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(20_000, 22);
    let gate = gated(&env, "/req.bin", &body);
    let url = env.url("origin.test", "/req.bin");
    let service = env.resources();
    service
        .install("g", &manifest(json!([required_entry("req", &url, &body)])))
        .await
        .unwrap();
    wait_until("the background request", || {
        env.origin.hits("/req.bin") == 1
    })
    .await;
    let caller = {
        let service = service.clone();
        tokio::spawn(async move { service.path("g", "req").await })
    };
    // The gate opens only once the lookup has joined the running job.
    wait_until("the lookup joins the download", || logs.count(JOINING) == 1).await;
    gate.open();
    let path = within("path", caller).await.unwrap().unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    within("idle", service.wait_idle()).await;
    assert_eq!(env.origin.hits("/req.bin"), 1);
}

#[tokio::test]
async fn two_services_sharing_a_store_share_one_download() {
    let logs = Logs::capture();
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(20_000, 23);
    let gate = gated(&env, "/shared.bin", &body);
    let url = env.url("origin.test", "/shared.bin");
    let first = env.resources();
    let second = env.resources();
    first
        .install("g", &manifest(json!([entry("s", &url, &body)])))
        .await
        .unwrap();
    let a = {
        let s = first.clone();
        tokio::spawn(async move { s.path("g", "s").await })
    };
    wait_until("the first request", || env.origin.hits("/shared.bin") == 1).await;
    // The other service sees the download in progress through the store.
    wait_until("the second service sees the download", || {
        matches!(
            second.status(Some("g")).unwrap()[0].resources[0].state,
            ResourceState::Downloading { .. }
        )
    })
    .await;
    let b = {
        let s = second.clone();
        tokio::spawn(async move { s.path("g", "s").await })
    };
    // The gate opens only once the second service waits for the first one's
    // download (not before, when it could simply find the file).
    wait_until("the second service waits", || {
        logs.count(WAITING_FOR_LOCK) == 1
    })
    .await;
    gate.open();
    let pa = within("first path", a).await.unwrap().unwrap();
    let pb = within("second path", b).await.unwrap().unwrap();
    assert_eq!(pa, pb);
    assert_eq!(std::fs::read(pa).unwrap(), body);
    assert_eq!(env.origin.hits("/shared.bin"), 1);
}

#[tokio::test]
async fn a_global_limit_of_one_runs_one_download_at_a_time() {
    let env = Env::new().await;
    write_patient_config(&env, "[service]\nmax_concurrent_downloads = 1");
    let (a, b) = (bytes(10_000, 24), bytes(10_000, 25));
    let gate_a = gated(&env, "/a.bin", &a);
    let gate_b = gated(&env, "/b.bin", &b);
    let service = env.resources();
    let mut events = service.subscribe();
    service
        .install(
            "g",
            &manifest(json!([
                required_entry("a", &env.url("origin.test", "/a.bin"), &a),
                required_entry("b", &env.url("origin.test", "/b.bin"), &b)
            ])),
        )
        .await
        .unwrap();
    wait_until("one request", || {
        env.origin.hits("/a.bin") + env.origin.hits("/b.bin") == 1
    })
    .await;
    // Whichever went first holds the only slot; the other is not requested
    // while it is in flight.
    let (first, second) = if env.origin.hits("/a.bin") == 1 {
        (gate_a, (gate_b, "/b.bin"))
    } else {
        (gate_b, (gate_a, "/a.bin"))
    };
    assert_not_started_after_queued(&mut events, &["a", "b"], 1).await;
    assert_eq!(env.origin.hits(second.1), 0);
    first.open();
    wait_until("the second request", || env.origin.hits(second.1) == 1).await;
    second.0.open();
    within("idle", service.wait_idle()).await;
    assert_eq!(stored_files(&env, &a).len(), 1);
    assert_eq!(stored_files(&env, &b).len(), 1);
    assert_eq!(env.origin.total_hits(), 2);
}

/// Waits until every job in `ids` was queued and `started` of them
/// announced `Started` (which comes with a job's first connection), then
/// checks that no other had by then. The jobs' servers hold every response,
/// so a job with a slot has connected by the time the others are queued
/// and waiting for one.
async fn assert_not_started_after_queued(
    events: &mut tokio::sync::broadcast::Receiver<gem_resources::Event>,
    ids: &[&str],
    started: usize,
) {
    use gem_resources::Event;
    let (mut queued, mut running) = (Vec::new(), Vec::new());
    within("every job is queued and the expected ones started", async {
        while queued.len() < ids.len() || running.len() < started {
            match events.recv().await.unwrap() {
                Event::Queued { resource, .. } if ids.contains(&resource.as_str()) => {
                    queued.push(resource)
                }
                Event::Started { resource, .. } if ids.contains(&resource.as_str()) => {
                    running.push(resource)
                }
                _ => {}
            }
        }
    })
    .await;
    while let Ok(event) = events.try_recv() {
        if let Event::Started { resource, .. } = event {
            running.push(resource);
        }
    }
    running.retain(|r| ids.contains(&r.as_str()));
    assert_eq!(running.len(), started, "started: {running:?}");
}

/// Starts A (in flight, gated) and queues B in the background with a global
/// limit of one, then asks for C on demand; returns which of B and C was
/// requested first once A finished.
async fn first_after_a(env: &Env, c_host: &str) -> &'static str {
    write_patient_config(env, "[service]\nmax_concurrent_downloads = 1");
    let (a, b, c) = (bytes(5000, 26), bytes(5000, 27), bytes(5000, 28));
    let gate_a = gated(env, "/a.bin", &a);
    let gate_b = gated(env, "/b.bin", &b);
    let gate_c = gated(env, "/c.bin", &c);
    let service = env.resources();
    let mut events = service.subscribe();
    service
        .install(
            "bg-a",
            &manifest(json!([required_entry(
                "a",
                &env.url("origin.test", "/a.bin"),
                &a
            )])),
        )
        .await
        .unwrap();
    wait_until("A is in flight", || env.origin.hits("/a.bin") == 1).await;
    service
        .install(
            "bg-b",
            &manifest(json!([required_entry(
                "b",
                &env.url("origin.test", "/b.bin"),
                &b
            )])),
        )
        .await
        .unwrap();
    service
        .install(
            "tool",
            &manifest(json!([entry("c", &env.url(c_host, "/c.bin"), &c)])),
        )
        .await
        .unwrap();
    let caller = {
        let service = service.clone();
        tokio::spawn(async move { service.path("tool", "c").await })
    };
    // Both B and C are waiting for the slot.
    assert_not_started_after_queued(&mut events, &["b", "c"], 0).await;
    assert_eq!(env.origin.hits("/b.bin") + env.origin.hits("/c.bin"), 0);
    gate_a.open();
    wait_until("the next request", || {
        env.origin.hits("/b.bin") + env.origin.hits("/c.bin") == 1
    })
    .await;
    let first = if env.origin.hits("/c.bin") == 1 {
        "C"
    } else {
        "B"
    };
    gate_b.open();
    gate_c.open();
    let path = within("C's path", caller).await.unwrap().unwrap();
    assert_eq!(std::fs::read(path).unwrap(), c);
    within("idle", service.wait_idle()).await;
    assert_eq!(env.origin.total_hits(), 3);
    first
}

#[tokio::test]
async fn an_on_demand_path_goes_ahead_of_queued_background_downloads() {
    let env = Env::new().await;
    assert_eq!(first_after_a(&env, "cdn.test").await, "C");
}

#[tokio::test]
async fn an_on_demand_path_goes_ahead_of_queued_background_downloads_from_the_same_host() {
    let env = Env::new().await;
    assert_eq!(first_after_a(&env, "origin.test").await, "C");
}

#[tokio::test]
async fn the_per_host_limit_counts_the_host_actually_connected_to() {
    // Two files declared on two hosts both redirect to one mirror host: with
    // one connection per host, the mirror serves them one after the other.
    let logs = Logs::capture();
    let env = Env::new().await;
    write_patient_config(&env, "[service]\nmax_per_host = 1");
    let (one, two) = (bytes(1000, 140), bytes(1000, 141));
    let gates = [gated(&env, "/one.bin", &one), gated(&env, "/two.bin", &two)];
    for (from, to) in [("/r1", "/one.bin"), ("/r2", "/two.bin")] {
        env.origin.route(
            from,
            Behaviour::Redirect {
                status: 302,
                location: env.url("mirror.test", to).to_string(),
            },
        );
    }
    let service = Resources::open(&env.config()).unwrap();
    let entries = json!([
        required_entry("one", &env.url("a.origin.test", "/r1"), &one),
        required_entry("two", &env.url("b.origin.test", "/r2"), &two),
    ]);
    service.install("g", &manifest(entries)).await.unwrap();
    let mirror_hits = || env.origin.hits("/one.bin") + env.origin.hits("/two.bin");
    wait_until("a mirror request", || mirror_hits() >= 1).await;
    // Both redirects were followed; the second transfer waits for the
    // mirror host's only slot (it says so before it waits), while the
    // first holds it.
    wait_until("both redirects", || {
        env.origin.hits("/r1") == 1 && env.origin.hits("/r2") == 1
    })
    .await;
    wait_until(
        "a transfer waits for the mirror host, or connects to it",
        || logs.count(WAITING_FOR_HOST) == 1 || mirror_hits() == 2,
    )
    .await;
    assert_eq!(mirror_hits(), 1, "a second connection to the mirror host");
    for gate in &gates {
        gate.open();
    }
    within("both downloads", service.wait_idle()).await;
    assert_eq!(stored_files(&env, &one).len(), 1);
    assert_eq!(stored_files(&env, &two).len(), 1);
    service.shutdown().await;
}

#[tokio::test]
async fn a_gem_with_many_required_files_leaves_a_slot_for_a_gem_with_one() {
    // Three slots, a gem declaring four files (each on a host of its own,
    // so the per-host bound plays no part) whose servers hold every
    // response: it may take two slots, never the third, so the gem that
    // declares one file starts while all four are still in flight.
    let env = Env::new().await;
    write_patient_config(&env, "[service]\nmax_concurrent_downloads = 3");
    let service = Resources::open(&env.config()).unwrap();
    let mut gates = Vec::new();
    let mut many = Vec::new();
    let hosts = ["origin.test", "mirror.test", "cdn.test", "other.test"];
    for (i, host) in (0..4u8).zip(hosts) {
        let (path, body) = (format!("/many-{i}.bin"), bytes(4000, 150 + i));
        gates.push(gated(&env, &path, &body));
        let url = env.url(host, &path);
        many.push(required_entry(&format!("m{i}"), &url, &body));
    }
    service
        .install("many", &manifest(serde_json::Value::Array(many)))
        .await
        .unwrap();
    let many_hits = || {
        (0..4)
            .map(|i| env.origin.hits(&format!("/many-{i}.bin")))
            .sum::<usize>()
    };
    wait_until("two of the four files are requested", || many_hits() == 2).await;
    let one = bytes(4000, 160);
    let one_gate = gated(&env, "/one.bin", &one);
    let one_url = env.url("a.origin.test", "/one.bin");
    service
        .install(
            "one",
            &manifest(json!([required_entry("o", &one_url, &one)])),
        )
        .await
        .unwrap();
    wait_until("the gem with one file is requested", || {
        env.origin.hits("/one.bin") == 1
    })
    .await;
    // Three slots in use (two of the first gem's, the second gem's one):
    // the first gem never had a third.
    assert_eq!(many_hits(), 2);
    one_gate.open();
    for gate in &gates {
        gate.open();
    }
    within("every download", service.wait_idle()).await;
    assert_eq!(stored_files(&env, &one).len(), 1);
    service.shutdown().await;
}
