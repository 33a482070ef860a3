//! The `[cache]` against the real CNCF distribution registry (Debian's
//! `docker-registry`), on loopback with TLS from a throwaway CA: a miss,
//! the upload after it, and a second store served by the registry.
//! Skipped, saying so, when the program is not installed.

use std::time::Duration;

use crate::support::registry::certificate_files;
use crate::support::{bytes, entry, sha256_hex, stderr, Env, Spawned};

const PROGRAM: &str = "/usr/bin/docker-registry";

/// Starts the registry on 127.0.0.2 and a free port; `None` when the
/// program is missing.
async fn start(dir: &std::path::Path) -> Option<(Spawned, u16, String)> {
    if !std::path::Path::new(PROGRAM).exists() {
        eprintln!(
            "SKIPPED cache_registry: {PROGRAM} is not installed (apt-get install docker-registry)"
        );
        return None;
    }
    let (ca, cert, key) = certificate_files();
    std::fs::write(dir.join("cert.pem"), cert).unwrap();
    std::fs::write(dir.join("key.pem"), key).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.2:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = format!(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.2:{port}\n  tls:\n    certificate: {}\n    key: {}\n",
        dir.join("data").display(),
        dir.join("cert.pem").display(),
        dir.join("key.pem").display()
    );
    std::fs::write(dir.join("config.yml"), config).unwrap();
    let child = std::process::Command::new(PROGRAM)
        .arg("serve")
        .arg(dir.join("config.yml"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("registry.log")).unwrap())
        .spawn()
        .unwrap();
    let spawned = Spawned(child);
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.2", port)).is_ok() {
            return Some((spawned, port, ca));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "the registry did not start: {}",
        std::fs::read_to_string(dir.join("registry.log")).unwrap_or_default()
    );
}

#[tokio::test]
async fn a_miss_is_pushed_to_the_distribution_registry_and_serves_the_next_store() {
    let scratch = tempfile::tempdir().unwrap();
    let Some((_registry, port, ca)) = start(scratch.path()).await else {
        return;
    };
    let section = format!(
        "oci = \"https://registry.test:{port}/gem-resources/cache\"\nallow_internal = true\npush = true\n"
    );
    let first = Env::new().await;
    first.write_cache_config(&ca, &section);
    let body = bytes(3 << 20, 21);
    let url = first.serve("/model.bin", &body);
    let service = first.resources();
    service
        .install(
            "g",
            &crate::support::manifest(serde_json::json!([entry("m", &url, &body)])),
        )
        .await
        .unwrap();
    service.gem("g").path("m").await.unwrap();
    assert_eq!(first.origin.hits("/model.bin"), 1);
    // The upload ran in the background: the registry now has the blob.
    let config = first.config();
    let fetcher = gem_resources::Fetcher::new(&config)
        .unwrap()
        .with_cache(config.cache_settings().unwrap())
        .unwrap();
    let cache = fetcher.cache().unwrap().clone();
    let sha = sha256_hex(&body);
    let mut held = false;
    for _ in 0..400 {
        if matches!(cache.probe(&sha).await, gem_resources::cache::Probe::Hit) {
            held = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(held, "the registry never got the blob");
    service.shutdown().await;
    // A second store: served by the registry, its origin never asked.
    let second = Env::new().await;
    second.write_cache_config(&ca, &section);
    second.serve("/model.bin", &body);
    let manifest = second.write_manifest(
        "m.json",
        serde_json::json!([entry("m", &second.url("origin.test", "/model.bin"), &body)]),
    );
    let out = second.run(&["fetch", manifest.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(second.origin.hits("/model.bin"), 0);
    let check = second.run(&["cache", "check"]).await;
    assert_eq!(
        check.status.code(),
        Some(0),
        "{}",
        crate::support::stdout(&check)
    );
}
