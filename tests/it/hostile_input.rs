//! Bounded hostile input and slow servers: long Locations, a wrong size in
//! one gem, the allowlist on a redirect hop, a slow but steady transfer,
//! and the disk space other processes' downloads still need.

use std::path::PathBuf;
use std::time::Duration;

use gem_resources::{download, Fetcher, Resource, ResourceState, Store};
use serde_json::json;
use url::Url;

use crate::support::*;
fn resource(url: &Url, mirrors: Vec<Url>, body: &[u8]) -> Resource {
    Resource {
        id: "r".to_string(),
        url: url.clone(),
        mirrors,
        sha256: sha256_hex(body),
        size: body.len() as u64,
        required: true,
        description: None,
    }
}

async fn fetch(env: &Env, r: &Resource) -> gem_resources::Result<PathBuf> {
    let config = env.config();
    let fetcher = Fetcher::new(&config).unwrap();
    let store = Store::open(&config.store_dir()).unwrap();
    download(&fetcher, &store, r, no_retry(), &mut |_| {}).await
}

#[tokio::test]
async fn long_invalid_locations_behind_a_url_and_mirrors_give_a_short_error_and_record() {
    let env = Env::new().await;
    let body = bytes(1000, 90);
    // A Location of 200 KB that does not parse (a bad port).
    let location = format!("https://evil.test:99999/{}", "a".repeat(200_000));
    let mut addresses = Vec::new();
    for i in 0..11 {
        let path = format!("/r{i}.bin");
        env.origin.route(
            &path,
            Behaviour::Redirect {
                status: 302,
                location: location.clone(),
            },
        );
        addresses.push(env.url("origin.test", &path));
    }
    let service = env.resources();
    let mut entry = required_entry("r", &addresses[0], &body);
    entry["mirrors"] = json!(addresses[1..]
        .iter()
        .map(|u| u.as_str())
        .collect::<Vec<_>>());
    service
        .install("g", &manifest(json!([entry])))
        .await
        .unwrap();
    let err = service.path("g", "r").await.unwrap_err();
    let message = err.to_string();
    assert_eq!(err.code(), "E_RESOURCE_UNAVAILABLE", "{message}");
    assert!(message.len() < 16 * 1024, "{} bytes", message.len());
    assert!(
        message.contains("(200024 characters)"),
        "{}",
        &message[..1000]
    );
    within("idle", service.wait_idle()).await;
    let record = store_root(&env).join("failures").join("g.jsonl");
    let size = std::fs::metadata(&record).unwrap().len();
    assert!(size < 64 * 1024, "failure record is {size} bytes");
    let shared = files_under(&store_root(&env).join("locks"))
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".failed.json"))
        .map(|p| std::fs::metadata(p).unwrap().len())
        .collect::<Vec<_>>();
    assert!(shared.iter().all(|&n| n < 64 * 1024), "{shared:?}");
}

#[tokio::test]
async fn a_wrong_size_in_one_gem_does_not_fail_another_gem_declaring_the_right_one() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(20_000, 91);
    let (url, gate) = env.serve_gated("/same.bin", &body);
    let service = env.resources();
    let mut wrong = required_entry("w", &url, &body);
    wrong["size"] = json!(body.len() + 1);
    service
        .install("a", &manifest(json!([wrong])))
        .await
        .unwrap();
    wait_until("A's request", || env.origin.hits("/same.bin") == 1).await;
    service
        .install("b", &manifest(json!([required_entry("r", &url, &body)])))
        .await
        .unwrap();
    gate.open();
    within("idle", service.wait_idle()).await;
    // A failed on its own size; B downloaded the bytes with its own request.
    let failures = store_root(&env).join("failures");
    let a_failure = std::fs::read_to_string(failures.join("a.jsonl")).unwrap();
    assert!(a_failure.contains("E_RESOURCE_SIZE"), "{a_failure}");
    assert!(!failures.join("b.jsonl").exists());
    let b = &service.status(Some("b")).unwrap()[0].resources[0];
    assert!(matches!(b.state, ResourceState::Present { .. }), "{b:?}");
    assert_eq!(stored_files(&env, &body).len(), 1);
    assert_eq!(env.origin.hits("/same.bin"), 2);
}

#[tokio::test]
async fn the_allowlist_applies_to_a_redirect_hop() {
    let env = Env::new().await;
    let body = bytes(3000, 92);
    let target = env.serve("/target.bin", &body);
    let other = env.url("other.test", "/target.bin");
    env.origin.route(
        "/hop.bin",
        Behaviour::Redirect {
            status: 302,
            location: other.to_string(),
        },
    );
    let start = env.url("origin.test", "/hop.bin");
    env.write_config("mode = \"allowlist\"\nhosts = [\"origin.test\"]");
    let err = fetch(&env, &resource(&start, vec![], &body))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert_eq!(err.primary_cause(), "E_RESOURCE_POLICY", "{text}");
    assert!(text.contains("other.test"), "{text}");
    assert_eq!(env.origin.hits("/hop.bin"), 1);
    assert_eq!(env.origin.hits("/target.bin"), 0);
    // Control: with the hop's host listed, the same redirect is followed.
    env.write_config("mode = \"allowlist\"\nhosts = [\"origin.test\", \"other.test\"]");
    let path = fetch(&env, &resource(&start, vec![], &body)).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(env.origin.hits("/target.bin"), 1);
    drop(target);
}

#[tokio::test]
async fn a_slow_but_steady_transfer_outlasts_the_stall_timeout() {
    let env = Env::new().await;
    env.write_config("stall_timeout_secs = 1");
    let body = bytes(8_000, 93);
    env.origin.route(
        "/slow.bin",
        Behaviour::Slow {
            body: body.clone(),
            chunk: 1_000,
            delay: Duration::from_millis(400),
        },
    );
    let url = env.url("origin.test", "/slow.bin");
    let started = std::time::Instant::now();
    let path = fetch(&env, &resource(&url, vec![], &body)).await.unwrap();
    // Longer in total than the stall timeout, never silent for that long.
    assert!(started.elapsed() > Duration::from_secs(2));
    assert_eq!(std::fs::read(path).unwrap(), body);
}

// Free space is read with statvfs here.
#[cfg(unix)]
#[tokio::test]
async fn a_download_in_another_process_reserves_the_disk_space_it_still_needs() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    std::fs::create_dir_all(env.store_dir()).unwrap();
    let stat = rustix::fs::statvfs(env.store_dir()).unwrap();
    let free = stat.f_bavail * stat.f_frsize;
    let margin = 100 * 1024 * 1024;
    assert!(free > 4 * margin, "too little free space for this test");
    // Declared sizes: the big one fits alone, the small one fits alone, not
    // both. The big one is held before its response, so it never needs
    // its bytes.
    let (big, small) = (free - margin, 2 * margin);
    let big_body = bytes(10, 94);
    let gate = Gate::new();
    env.origin.route(
        "/big.bin",
        Behaviour::Gated {
            body: big_body.clone(),
            gate: gate.clone(),
        },
    );
    env.origin
        .route("/small.bin", Behaviour::Body(bytes(10, 95)));
    let mut big_entry = entry("big", &env.url("origin.test", "/big.bin"), &big_body);
    big_entry["size"] = json!(big);
    let mut small_entry = entry(
        "small",
        &env.url("origin.test", "/small.bin"),
        &bytes(10, 95),
    );
    small_entry["size"] = json!(small);
    let m = env.write_manifest("m.json", json!([big_entry, small_entry]));
    let out = env.run(&["install", "g", m.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));

    let log = env.dir.path().join("big.log");
    let _holder = spawn_logged(&env, &["path", "g", "big"], &log);
    wait_until("the big download is in flight", || {
        env.origin.hits("/big.bin") == 1
    })
    .await;
    let out = env.run(&["path", "g", "small"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("E_RESOURCE_DISK_SPACE"),
        "{}",
        stderr(&out)
    );
    assert_eq!(env.origin.hits("/small.bin"), 0);
}

#[tokio::test]
async fn a_wrong_size_failing_in_another_process_is_not_shared_with_the_right_size() {
    let logs = Logs::capture();
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(20_000, 96);
    let (url, gate) = env.serve_gated("/same.bin", &body);
    // Two services on one store stand for two processes.
    let first = env.resources();
    let second = env.resources();
    let mut wrong = entry("w", &url, &body);
    wrong["size"] = json!(body.len() + 1);
    first.install("a", &manifest(json!([wrong]))).await.unwrap();
    first
        .install("b", &manifest(json!([entry("r", &url, &body)])))
        .await
        .unwrap();
    let a = {
        let s = first.clone();
        tokio::spawn(async move { s.path("a", "w").await })
    };
    wait_until("A's request", || env.origin.hits("/same.bin") == 1).await;
    let b = {
        let s = second.clone();
        tokio::spawn(async move { s.path("b", "r").await })
    };
    // Another declared size is another file: B neither waits for A's
    // download nor shares its failure.
    wait_until("B's own request", || env.origin.hits("/same.bin") == 2).await;
    assert_eq!(logs.count(WAITING_FOR_LOCK), 0);
    gate.open();
    let a = within("A", a).await.unwrap().unwrap_err();
    assert_eq!(a.code(), "E_RESOURCE_UNAVAILABLE", "{a}");
    let b = within("B", b).await.unwrap().unwrap();
    assert_eq!(std::fs::read(b).unwrap(), body);
    assert_eq!(env.origin.hits("/same.bin"), 2);
}

#[tokio::test]
async fn file_names_from_urls_carry_no_bidirectional_or_invisible_characters() {
    let env = Env::new().await;
    for (i, (segment, stored)) in [
        // Right-to-left override: shows as `invoiceexe.pdf`.
        ("invoice%E2%80%AEfdp.exe", "invoice_fdp.exe"),
        // Zero-width space and joiner, a byte-order mark, an isolate.
        (
            "a%E2%80%8Bb%E2%80%8Dc%EF%BB%BFd%E2%81%A6e.bin",
            "a_b_c_d_e.bin",
        ),
        // A line separator, a soft hyphen, a tag character.
        ("x%E2%80%A8y%C2%ADz%F3%A0%81%81.bin", "x_y_z_.bin"),
        ("caf%C3%A9.bin", "café.bin"),
    ]
    .into_iter()
    .enumerate()
    {
        let body = bytes(1_000 + i, 70 + i as u8);
        let path = format!("/{i}/{segment}");
        let url = env.serve(&path, &body);
        let r = resource(&url, vec![], &body);
        assert_eq!(r.file_name(), stored, "{segment}");
        let got = fetch(&env, &r).await.unwrap();
        assert_eq!(got.file_name().unwrap().to_str().unwrap(), stored);
        assert_eq!(std::fs::read(&got).unwrap(), body);
    }
}
