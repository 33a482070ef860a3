//! A gem that declares another gem's file (its public SHA-256) with a
//! source of its own never decides that gem's download: not by holding it,
//! not by a hash that shares its prefix, not by another size, not by the
//! disk space it claims.

use std::time::{Duration, Instant};

use gem_resources::{ResourceState, Resources};
use serde_json::json;

use crate::support::*;

/// A configuration where a download waits `secs` for another gem's
/// download of the same file.
pub(crate) fn config_waiting(env: &Env, secs: f64) {
    env.write_config(&format!(
        "stall_timeout_secs = 60\nwait_for_others_secs = {secs}"
    ));
}

/// Gem `hog` declaring `body` at a dripping address of its own, its
/// download under way on `service`.
pub(crate) async fn hog_dripping(
    env: &Env,
    service: &Resources,
    body: &[u8],
) -> tokio::task::JoinHandle<gem_resources::Result<std::path::PathBuf>> {
    let hostile = env.serve_drip("/drip.bin", body);
    env.downloading(
        service,
        "hog",
        json!([entry("m", &hostile, body)]),
        "m",
        "/drip.bin",
    )
    .await
}

/// The state of resource `id` of `gem` in `service`'s status.
fn state_of(service: &Resources, gem: &str) -> ResourceState {
    service.status(Some(gem)).unwrap()[0].resources[0]
        .state
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_gem_dripping_the_same_hash_does_not_hold_the_victims_download() {
    let env = Env::new().await;
    config_waiting(&env, 1.0);
    let body = bytes(1 << 20, 140);
    let own = env.serve("/model.bin", &body);
    let service = env.resources();
    let hog = hog_dripping(&env, &service, &body).await;
    service
        .install("victim", &manifest(json!([entry("m", &own, &body)])))
        .await
        .unwrap();
    let started = Instant::now();
    let path = within("the victim's file", service.path("victim", "m"))
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(std::fs::read(&path).unwrap(), body);
    assert_eq!(env.origin.hits("/model.bin"), 1, "its own origin served it");
    // The hostile download stops once the file is in place, and gets it.
    let hog = within("the hostile download stops", hog).await.unwrap();
    assert_eq!(std::fs::read(hog.unwrap()).unwrap(), body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_holding_a_hostile_download_does_not_hold_path() {
    let env = Env::new().await;
    config_waiting(&env, 1.0);
    let body = bytes(1 << 20, 141);
    let hostile = env.serve_drip("/drip.bin", &body);
    let own = env.serve("/model.bin", &body);
    let service = env.resources();
    let _hog = env
        .downloading(
            &service,
            "hog",
            json!([entry("m", &hostile, &body)]),
            "m",
            "/drip.bin",
        )
        .await;
    service
        .install("victim", &manifest(json!([entry("m", &own, &body)])))
        .await
        .unwrap();
    let started = Instant::now();
    let out = within("path in another process", env.run(&["path", "victim", "m"])).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(std::fs::read(stdout(&out).trim()).unwrap(), body);
    assert_eq!(env.origin.hits("/model.bin"), 1, "its own origin served it");
}

// Logs are captured on the test's own thread.
#[tokio::test]
async fn a_download_from_the_same_addresses_waits_for_the_one_racing_whatever_lane_is_free() {
    let logs = Logs::capture();
    let env = Env::new().await;
    config_waiting(&env, 1.0);
    let body = bytes(200_000, 150);
    // Drips for about two seconds, then fails: lane 0 comes free while the
    // victim's own download is still on its way.
    env.origin.route(
        "/drip.bin",
        Behaviour::Ranged {
            body: body.clone(),
            etag: "\"h\"".into(),
            ignore_range: false,
            cut_at: Some(4000),
            hold: false,
            pace: Some((1000, Duration::from_millis(500))),
        },
    );
    let hostile = env.url("evil.test", "/drip.bin");
    let (own, gate) = env.serve_gated("/model.bin", &body);
    // Two services on one store stand for two processes.
    let first = env.resources();
    let second = env.resources();
    let hog = env
        .downloading(
            &first,
            "hog",
            json!([entry("m", &hostile, &body)]),
            "m",
            "/drip.bin",
        )
        .await;
    first
        .install("victim", &manifest(json!([entry("m", &own, &body)])))
        .await
        .unwrap();
    let a = {
        let s = first.clone();
        tokio::spawn(async move { s.path("victim", "m").await })
    };
    wait_until("the victim's own request", || {
        env.origin.hits("/model.bin") == 1
    })
    .await;
    assert!(within("the hostile download fails", hog)
        .await
        .unwrap()
        .is_err());
    let b = {
        let s = second.clone();
        tokio::spawn(async move { s.path("victim", "m").await })
    };
    wait_until("the other process waits", || {
        logs.count(WAITING_FOR_LOCK) == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        env.origin.hits("/model.bin"),
        1,
        "one download from those addresses"
    );
    gate.open();
    for caller in [a, b] {
        let path = within("the victim's file", caller).await.unwrap().unwrap();
        assert_eq!(std::fs::read(path).unwrap(), body);
    }
    assert_eq!(env.origin.hits("/model.bin"), 1);
}

// Logs are captured on the test's own thread.
#[tokio::test]
async fn a_hash_sharing_the_victims_prefix_does_not_make_it_wait() {
    let logs = Logs::capture();
    let env = Env::new().await;
    // Long enough that any wait for the hostile download would show.
    config_waiting(&env, 30.0);
    let body = bytes(200_000, 142);
    let sha = sha256_hex(&body);
    // The same first 60 bits (and more), another hash.
    let flip = if sha.ends_with('0') { "1" } else { "0" };
    let fake = format!("{}{flip}", &sha[..63]);
    let hostile = env.serve_drip("/drip.bin", &body);
    let mut squat = entry("m", &hostile, &body);
    squat["sha256"] = json!(fake);
    let own = env.serve("/model.bin", &body);
    let service = env.resources();
    let _hog = env
        .downloading(&service, "hog", json!([squat]), "m", "/drip.bin")
        .await;
    service
        .install("victim", &manifest(json!([entry("m", &own, &body)])))
        .await
        .unwrap();
    let path = within("the victim's file", service.path("victim", "m"))
        .await
        .unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(logs.count(WAITING_FOR_LOCK), 0, "{}", logs.text());
}

#[tokio::test]
async fn another_declared_size_never_deletes_a_kept_partial_file() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(300_000, 143);
    let sha = sha256_hex(&body);
    let ranged = |cut_at| Behaviour::Ranged {
        body: body.clone(),
        etag: "\"v1\"".into(),
        ignore_range: false,
        cut_at,
        hold: false,
        pace: None,
    };
    env.origin.route(
        "/model.bin",
        Behaviour::Sequence(vec![ranged(Some(120_000)), ranged(None)]),
    );
    let own = env.url("origin.test", "/model.bin");
    env.origin.route("/refused.bin", Behaviour::Status(404));
    let refused = env.url("evil.test", "/refused.bin");
    let service = env.resources();
    service
        .install("victim", &manifest(json!([entry("m", &own, &body)])))
        .await
        .unwrap();
    // Cut off: a resumable partial file stays.
    assert!(service.path("victim", "m").await.is_err());
    let tmp = store_root(&env).join("tmp");
    let data = tmp.join(format!("{sha}.{}.partial", body.len()));
    let record = tmp.join(format!("{sha}.{}.partial.json", body.len()));
    let kept = (
        std::fs::read(&data).unwrap(),
        std::fs::read(&record).unwrap(),
    );
    assert!(!kept.1.is_empty());
    // The same hash declared with another size, from an address that fails.
    let mut other = entry("m", &refused, &body);
    other["size"] = json!(body.len() - 1);
    service
        .install("hog", &manifest(json!([other])))
        .await
        .unwrap();
    assert!(service.path("hog", "m").await.is_err());
    assert_eq!(std::fs::read(&data).unwrap(), kept.0);
    assert_eq!(std::fs::read(&record).unwrap(), kept.1);
    // And the victim's next try continues it.
    let path = service.path("victim", "m").await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(env.origin.hits("/refused.bin"), 1);
}

#[tokio::test]
async fn another_gems_download_of_the_same_file_never_starts_over_the_victims_kept_bytes() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(300_000, 148);
    env.origin.route(
        "/model.bin",
        Behaviour::Sequence(vec![
            Behaviour::ranged_cut(&body, "\"v1\"", 120_000),
            Behaviour::ranged(&body, "\"v1\""),
        ]),
    );
    let own = env.url("origin.test", "/model.bin");
    // The right size, wrong bytes: a 200 that would start the file afresh.
    let wrong = bytes(body.len(), 149);
    let hostile = env.serve("/wrong.bin", &wrong);
    let hostile = env.url("evil.test", hostile.path());
    let service = env.resources();
    service
        .install("victim", &manifest(json!([entry("m", &own, &body)])))
        .await
        .unwrap();
    assert!(service.path("victim", "m").await.is_err());
    service
        .install("hog", &manifest(json!([entry("m", &hostile, &body)])))
        .await
        .unwrap();
    let failed = service.path("hog", "m").await.unwrap_err();
    assert_eq!(failed.primary_cause(), "E_RESOURCE_SHA256", "{failed}");
    assert_eq!(env.origin.hits("/wrong.bin"), 1);
    // The victim continues where its own download stopped.
    let path = service.path("victim", "m").await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(env.origin.ranges("/model.bin"), ["bytes=120000-"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_the_gem_a_waiting_file_depends_on() {
    let env = Env::new().await;
    config_waiting(&env, 30.0);
    let body = bytes(1 << 20, 144);
    let hostile = env.serve_drip("/drip.bin", &body);
    let own = env.serve("/model.bin", &body);
    let service = env.resources();
    let other = env.resources();
    let _hog = env
        .downloading(
            &service,
            "hog",
            json!([entry("m", &hostile, &body)]),
            "m",
            "/drip.bin",
        )
        .await;
    service
        .install("victim", &manifest(json!([entry("m", &own, &body)])))
        .await
        .unwrap();
    // Another process sees whose download the victim's file depends on.
    wait_until("the other process names the gem", || {
        matches!(
            state_of(&other, "victim"),
            ResourceState::Waiting { on: Some(gem), .. } if gem == "hog"
        )
    })
    .await;
    let _victim = {
        let s = service.clone();
        tokio::spawn(async move { s.path("victim", "m").await })
    };
    // Here, the victim's own job waits, and says for whom.
    wait_until("the victim's job names the gem", || {
        let waiting = service.status(Some("victim")).unwrap()[0].resources[0].clone();
        matches!(&waiting.state, ResourceState::Waiting { on: Some(gem), .. } if gem == "hog")
            && waiting.host == "origin.test"
    })
    .await;
    assert_eq!(env.origin.hits("/model.bin"), 0);
    // The hostile gem's own status is its download.
    assert!(
        matches!(state_of(&service, "hog"), ResourceState::Downloading { .. }),
        "{:?}",
        state_of(&service, "hog")
    );
}

/// Free bytes on the file system of the store.
#[cfg(unix)]
fn free_space(env: &Env) -> u64 {
    std::fs::create_dir_all(env.store_dir()).unwrap();
    let stat = rustix::fs::statvfs(env.store_dir()).unwrap();
    stat.f_bavail * stat.f_frsize
}

#[cfg(unix)]
/// The entry `huge` declaring `size` bytes at `/huge.bin` of `evil.test`,
/// whose body waits behind the returned gate (a body seeded by `seed`).
fn gated_huge(env: &Env, seed: u8, size: u64) -> (Gate, serde_json::Value) {
    let gate = Gate::new();
    let body = bytes(10, seed);
    env.origin.route(
        "/huge.bin",
        Behaviour::Gated {
            body: body.clone(),
            gate: gate.clone(),
        },
    );
    let mut huge = entry("huge", &env.url("evil.test", "/huge.bin"), &body);
    huge["size"] = json!(size);
    (gate, huge)
}

#[cfg(unix)]
/// Holds a download of `size` declared bytes for gem `hog` in `service`,
/// before any byte of it arrives.
async fn hold_huge(env: &Env, service: &Resources, size: u64) -> Gate {
    let (gate, huge) = gated_huge(env, 145, size);
    service
        .install("hog", &manifest(json!([huge])))
        .await
        .unwrap();
    let s = service.clone();
    tokio::spawn(async move { s.path("hog", "huge").await });
    wait_until("the huge download is in flight", || {
        env.origin.hits("/huge.bin") == 1
    })
    .await;
    gate
}

// Free space is read with statvfs here.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_declaration_that_delivers_nothing_stops_reserving_disk_space() {
    let env = Env::new().await;
    config_waiting(&env, 1.0);
    let body = bytes(16 << 20, 146);
    let free = free_space(&env);
    assert!(free > 1 << 30, "too little free space for this test");
    // The victim's file fits beside what is really written, not beside the
    // whole declared size of the huge one.
    let service = env.resources();
    let _gate = hold_huge(&env, &service, free - (48 << 20)).await;
    let own = env.serve("/model.bin", &body);
    service
        .install("victim", &manifest(json!([entry("m", &own, &body)])))
        .await
        .unwrap();
    // Past the grace of a new download, its rate decides what it reserves.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let out = within("path in another process", env.run(&["path", "victim", "m"])).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(stdout(&out).trim()).unwrap(), body);
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_that_stands_in_the_way_is_named_by_its_gem() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let free = free_space(&env);
    let margin = 100 << 20;
    assert!(free > 4 * margin, "too little free space for this test");
    let service = env.resources();
    // A new download reserves its whole size: the small file alone fits,
    // not beside it.
    let _gate = hold_huge(&env, &service, free - margin).await;
    let small = bytes(10, 147);
    let mut entry = entry("small", &env.url("origin.test", "/small.bin"), &small);
    entry["size"] = json!(2 * margin);
    service
        .install("victim", &manifest(json!([entry])))
        .await
        .unwrap();
    let out = env.run(&["path", "victim", "small"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(text.contains("E_RESOURCE_DISK_SPACE"), "{text}");
    assert!(
        text.contains("most of it reserved by gem \"hog\""),
        "{text}"
    );
    // Scripts read the same in the error's fields.
    let out = env.run(&["--json", "path", "victim", "small"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["code"], "E_RESOURCE_DISK_SPACE", "{doc}");
    assert_eq!(doc["reserved_by"], "hog", "{doc}");
    assert_eq!(doc["reserved_by_kind"], "gem", "{doc}");
    // The gem's download runs in this process.
    assert_eq!(doc["reserved_by_pid"], std::process::id(), "{doc}");
    assert!(doc["reserved_bytes"].as_u64().unwrap() > 0, "{doc}");
    assert_eq!(env.origin.hits("/small.bin"), 0);
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_held_by_another_process_s_fetch_is_named_as_a_fetch_and_its_process() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let free = free_space(&env);
    let margin = 100 << 20;
    assert!(free > 4 * margin, "too little free space for this test");
    // Another process's `fetch` (no gem) holds a huge declared download
    // before any byte of it arrives.
    let (gate, huge) = gated_huge(&env, 148, free - margin);
    let huge = env.write_manifest("huge.json", json!([huge]));
    let log = env.dir.path().join("fetch.log");
    let holder = spawn_quiet(&env, &["fetch", huge.to_str().unwrap()], &log);
    wait_until("the huge download is in flight", || {
        env.origin.hits("/huge.bin") == 1
    })
    .await;
    let pid = holder.0.id();
    // The small file alone fits, not beside it.
    let small = bytes(10, 149);
    let mut entry = entry("small", &env.url("origin.test", "/small.bin"), &small);
    entry["size"] = json!(2 * margin);
    let small = env.write_manifest("small.json", json!([entry]));
    let small = small.to_str().unwrap();
    let out = env.run(&["--json", "fetch", small]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let doc = &doc["resources"][0];
    assert_eq!(doc["code"], "E_RESOURCE_DISK_SPACE", "{doc}");
    // Never a gem's id: `<` is in none.
    assert_eq!(doc["reserved_by"], "<fetch>", "{doc}");
    assert_eq!(doc["reserved_by_kind"], "fetch", "{doc}");
    assert_eq!(doc["reserved_by_pid"], pid, "{doc}");
    assert!(doc["reserved_bytes"].as_u64().unwrap() > 0, "{doc}");
    // People read the same in words.
    let out = env.run(&["fetch", small]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(text.contains("E_RESOURCE_DISK_SPACE"), "{text}");
    assert!(
        text.contains(&format!("most of it reserved by a fetch in process {pid})")),
        "{text}"
    );
    assert_eq!(env.origin.hits("/small.bin"), 0);
    drop(holder);
    gate.open();
}
