//! The `[cache]` registry: tried first, its bytes verified, its failures
//! bounded, its credentials kept to itself (docs/cache.md).

use crate::support::registry::{Access, Faults, Registry};
use crate::support::{bytes, entry, sha256_hex, stderr, stdout, wait_until, Env};

/// An environment whose `[cache]` is `registry` (on registry.test), with
/// `extra` lines added to the section.
async fn cached_env(registry: &Registry, extra: &str) -> Env {
    let env = Env::new().await;
    let timeout = if extra.contains("timeout_secs") {
        ""
    } else {
        "timeout_secs = 1\n"
    };
    let section = format!(
        "oci = \"{}\"\nallow_internal = true\n{timeout}{extra}",
        registry.oci("registry.test", "gems/cache")
    );
    env.write_cache_config(registry.ca_pem(), &section);
    env
}

/// Runs `fetch` on a manifest of `files` (path, body), all on origin.test.
async fn fetch(env: &Env, files: &[(&str, &[u8])], json: bool) -> std::process::Output {
    let entries: Vec<serde_json::Value> = files
        .iter()
        .enumerate()
        .map(|(i, (path, body))| entry(&format!("f{i}"), &env.url("origin.test", path), body))
        .collect();
    let manifest = env.write_manifest("m.json", serde_json::Value::Array(entries));
    let manifest = manifest.to_str().unwrap().to_string();
    let mut args = vec![];
    if json {
        args.push("--json");
    }
    args.extend(["fetch", manifest.as_str()]);
    env.run(&args).await
}

fn blob_gets(registry: &Registry) -> usize {
    registry
        .requests()
        .iter()
        .filter(|r| r.starts_with("GET /v2/gems/cache/blobs/"))
        .count()
}

#[tokio::test]
async fn a_file_the_cache_has_comes_from_it_and_the_origin_is_not_asked() {
    let registry = Registry::start("127.0.0.2", Access::Anonymous).await;
    let env = cached_env(&registry, "").await;
    let body = bytes(300_000, 1);
    registry.put_blob(&body);
    env.serve("/a.bin", &body);
    let out = fetch(&env, &[("/a.bin", &body)], false).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(env.origin.hits("/a.bin"), 0);
    assert_eq!(blob_gets(&registry), 1);
    let status = env.run(&["--json", "status"]).await;
    let _ = status;
    let served = gem_resources::registry::Registry::new(
        &gem_resources::Store::open(&env.store_dir()).unwrap(),
    )
    .served_by(&sha256_hex(&body));
    assert_eq!(served.as_deref(), Some("cache"));
}

#[tokio::test]
async fn a_miss_goes_to_the_origin() {
    let registry = Registry::start("127.0.0.2", Access::Anonymous).await;
    let env = cached_env(&registry, "").await;
    let body = bytes(10_000, 2);
    env.serve("/b.bin", &body);
    let out = fetch(&env, &[("/b.bin", &body)], false).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(env.origin.hits("/b.bin"), 1);
    assert_eq!(blob_gets(&registry), 0, "{:?}", registry.requests());
    assert!(registry.requests()[0].starts_with("HEAD /v2/gems/cache/blobs/sha256:"));
}

#[tokio::test]
async fn other_bytes_from_the_cache_are_discarded_and_the_origin_serves() {
    let registry = Registry::start("127.0.0.2", Access::Anonymous).await;
    let env = cached_env(&registry, "").await;
    let body = bytes(50_000, 3);
    registry.put_blob(&body);
    registry.set_faults(Faults {
        wrong_bytes: true,
        ..Faults::default()
    });
    env.serve("/c.bin", &body);
    let out = fetch(&env, &[("/c.bin", &body)], false).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(blob_gets(&registry), 1);
    assert_eq!(env.origin.hits("/c.bin"), 1);
    let stored = crate::support::stored_files(&env, &body);
    assert_eq!(std::fs::read(&stored[0]).unwrap(), body);
    assert!(stderr(&out).contains("cache"), "{}", stderr(&out));
}

#[tokio::test]
async fn a_cache_that_hangs_costs_one_bounded_wait_then_is_left_alone() {
    let registry = Registry::start("127.0.0.2", Access::Anonymous).await;
    registry.set_faults(Faults {
        hang: true,
        ..Faults::default()
    });
    let env = cached_env(&registry, "timeout_secs = 0.5\n").await;
    let bodies: Vec<Vec<u8>> = (0..4).map(|i| bytes(5_000, 10 + i)).collect();
    let paths: Vec<String> = (0..4).map(|i| format!("/h{i}.bin")).collect();
    for (p, b) in paths.iter().zip(&bodies) {
        env.serve(p, b);
    }
    let files: Vec<(&str, &[u8])> = paths
        .iter()
        .zip(&bodies)
        .map(|(p, b)| (p.as_str(), b.as_slice()))
        .collect();
    let out = fetch(&env, &files, false).await;
    assert!(out.status.success(), "{}", stderr(&out));
    for p in &paths {
        assert_eq!(env.origin.hits(p), 1);
    }
    // The downloads run at once: each may meet the registry before the
    // first failure; fewer than every file's, and none after.
    let first = registry.connections();
    assert!(first >= 1, "the cache was asked");
    let more = bytes(5_000, 99);
    env.serve("/later.bin", &more);
    let out = fetch(&env, &[("/later.bin", &more)], false).await;
    assert!(out.status.success(), "{}", stderr(&out));
    // A new process: asked once more, then left alone for the file after.
    assert_eq!(registry.connections(), first + 1);
}

#[tokio::test]
async fn the_breaker_keeps_later_files_of_one_process_away_from_a_hanging_cache() {
    let registry = Registry::start("127.0.0.2", Access::Anonymous).await;
    registry.set_faults(Faults {
        hang: true,
        ..Faults::default()
    });
    let env = cached_env(&registry, "timeout_secs = 0.3\n").await;
    let service = env.resources();
    let mut entries = Vec::new();
    let mut bodies = Vec::new();
    for i in 0..5u8 {
        let body = bytes(4_000, 40 + i);
        let url = env.serve(&format!("/s{i}.bin"), &body);
        entries.push(entry(&format!("s{i}"), &url, &body));
        bodies.push(body);
    }
    service
        .install(
            "g",
            &crate::support::manifest(serde_json::Value::Array(entries)),
        )
        .await
        .unwrap();
    for i in 0..5 {
        service.gem("g").path(&format!("s{i}")).await.unwrap();
    }
    assert_eq!(
        registry.connections(),
        1,
        "one bounded wait, then the breaker"
    );
    service.shutdown().await;
}

#[tokio::test]
async fn a_bearer_token_is_fetched_once_and_sent_to_the_registry() {
    let registry = Registry::start(
        "127.0.0.2",
        Access::Bearer {
            user: "reader".into(),
            password: "pw-S3CRET-bearer".into(),
            token: "TOKEN-S3CRET-xyz".into(),
        },
    )
    .await;
    let env = cached_env(
        &registry,
        "username = \"reader\"\npassword_env = \"GR_TEST_CACHE_PW_BEARER\"\n",
    )
    .await;
    let (one, two) = (bytes(20_000, 5), bytes(20_000, 6));
    registry.put_blob(&one);
    registry.put_blob(&two);
    let config = env.dir.path().join("config.toml");
    let manifest = env.write_manifest(
        "m.json",
        serde_json::json!([
            entry("one", &env.url("origin.test", "/one"), &one),
            entry("two", &env.url("origin.test", "/two"), &two)
        ]),
    );
    let out = crate::support::run_bin_env(
        vec![
            "--config".into(),
            config.display().to_string(),
            "fetch".into(),
            manifest.display().to_string(),
        ],
        &[("GR_TEST_CACHE_PW_BEARER", "pw-S3CRET-bearer")],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(registry.tokens_issued(), 1, "{:?}", registry.requests());
    assert_eq!(env.origin.total_hits(), 0);
    let gets: Vec<_> = registry
        .seen()
        .into_iter()
        .filter(|s| s.method == "GET" && s.target.contains("/blobs/"))
        .collect();
    assert_eq!(gets.len(), 2);
    for get in gets {
        assert_eq!(
            get.authorization.as_deref(),
            Some("Bearer TOKEN-S3CRET-xyz")
        );
    }
    for text in [stdout(&out), stderr(&out)] {
        assert!(!text.contains("S3CRET"), "{text}");
    }
}

#[tokio::test]
async fn a_docker_identity_token_gets_the_bearer_token() {
    let registry = Registry::start(
        "127.0.0.2",
        Access::Bearer {
            user: "reader".into(),
            password: "id-S3CRET-refresh".into(),
            token: "TOKEN-S3CRET-id".into(),
        },
    )
    .await;
    let env = cached_env(&registry, "docker_config = \"docker/config.json\"\n").await;
    std::fs::create_dir_all(env.dir.path().join("docker")).unwrap();
    std::fs::write(
        env.dir.path().join("docker/config.json"),
        format!(
            r#"{{"auths":{{"registry.test:{}":{{"auth":"","identitytoken":"id-S3CRET-refresh"}}}}}}"#,
            registry.port()
        ),
    )
    .unwrap();
    let body = bytes(20_000, 7);
    registry.put_blob(&body);
    let out = fetch(&env, &[("/i.bin", &body)], false).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(registry.tokens_issued(), 1, "{:?}", registry.requests());
    assert_eq!(env.origin.total_hits(), 0);
    for text in [stdout(&out), stderr(&out)] {
        assert!(!text.contains("S3CRET"), "{text}");
    }
}

#[tokio::test]
async fn basic_credentials_reach_the_registry_but_never_a_redirect_target() {
    let registry = Registry::start(
        "127.0.0.2",
        Access::Basic("reader".into(), "pw-S3CRET-basic".into()),
    )
    .await;
    let storage = Registry::start("127.0.0.3", Access::Anonymous).await;
    let env = Env::new().await;
    std::fs::write(env.dir.path().join("pw"), "pw-S3CRET-basic\n").unwrap();
    let section = format!(
        "oci = \"{}\"\nallow_internal = [\"registry.test\", \"blobs.test\"]\nusername = \"reader\"\npassword_file = \"pw\"\n",
        registry.oci("registry.test", "gems/cache")
    );
    let both = format!("{}{}", registry.ca_pem(), storage.ca_pem());
    env.write_cache_config(&both, &section);
    let body = bytes(30_000, 7);
    registry.put_blob(&body);
    storage.put_blob(&body);
    registry.set_faults(Faults {
        redirect_to: Some(format!("https://blobs.test:{}/storage/", storage.port())),
        ..Faults::default()
    });
    let out = fetch(&env, &[("/r.bin", &body)], false).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(env.origin.total_hits(), 0, "served by the cache's storage");
    let seen = registry.seen();
    assert!(seen
        .iter()
        .filter(|s| s.method == "GET" && s.target.contains("/blobs/"))
        .all(|s| s
            .authorization
            .as_deref()
            .is_some_and(|a| a.starts_with("Basic "))));
    let stored = storage.seen();
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(
        stored[0].authorization, None,
        "credentials sent to the redirect target"
    );
}

#[tokio::test]
async fn a_redirect_to_an_internal_host_the_section_does_not_name_is_refused() {
    let registry = Registry::start("127.0.0.2", Access::Anonymous).await;
    let storage = Registry::start("127.0.0.3", Access::Anonymous).await;
    let env = Env::new().await;
    let section = format!(
        "oci = \"{}\"\nallow_internal = true\n",
        registry.oci("registry.test", "gems/cache")
    );
    let both = format!("{}{}", registry.ca_pem(), storage.ca_pem());
    env.write_cache_config(&both, &section);
    let body = bytes(30_000, 8);
    registry.put_blob(&body);
    storage.put_blob(&body);
    registry.set_faults(Faults {
        redirect_to: Some(format!("https://blobs.test:{}/storage/", storage.port())),
        ..Faults::default()
    });
    env.serve("/r.bin", &body);
    let out = fetch(&env, &[("/r.bin", &body)], false).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        storage.connections(),
        0,
        "the unlisted internal host was reached"
    );
    assert_eq!(env.origin.hits("/r.bin"), 1);
}

#[tokio::test]
async fn a_manifest_cannot_point_a_download_at_the_cache() {
    let registry = Registry::start("127.0.0.2", Access::Anonymous).await;
    let env = cached_env(&registry, "").await;
    let body = bytes(1_000, 9);
    let at_cache = url::Url::parse(&format!(
        "https://registry.test:{}/storage/{}",
        registry.port(),
        sha256_hex(&body)
    ))
    .unwrap();
    let manifest = env.write_manifest("m.json", serde_json::json!([entry("x", &at_cache, &body)]));
    let out = env
        .run(&["--json", "fetch", manifest.to_str().unwrap()])
        .await;
    assert!(!out.status.success());
    assert!(
        stdout(&out).contains("E_RESOURCE_ADDRESS"),
        "{}",
        stdout(&out)
    );
    assert!(
        registry.requests().iter().all(|r| !r.contains("/storage/")),
        "{:?}",
        registry.requests()
    );
}

#[tokio::test]
async fn a_verified_file_is_pushed_after_and_a_failed_push_fails_nothing() {
    let registry = Registry::start(
        "127.0.0.2",
        Access::Bearer {
            user: "writer".into(),
            password: "pw-S3CRET-push".into(),
            token: "TOKEN-push".into(),
        },
    )
    .await;
    let env = Env::new().await;
    std::fs::write(env.dir.path().join("pw"), "pw-S3CRET-push\n").unwrap();
    let section = format!(
        "oci = \"{}\"\nallow_internal = true\npush = true\nusername = \"writer\"\npassword_file = \"pw\"\n",
        registry.oci("registry.test", "gems/cache")
    );
    env.write_cache_config(registry.ca_pem(), &section);
    let body = bytes(100_000, 11);
    let url = env.serve("/p.bin", &body);
    let service = env.resources();
    service
        .install(
            "g",
            &crate::support::manifest(serde_json::json!([entry("p", &url, &body)])),
        )
        .await
        .unwrap();
    service.gem("g").path("p").await.unwrap();
    let sha = sha256_hex(&body);
    wait_until("the registry holds the file", || registry.has_blob(&sha)).await;
    let order: Vec<String> = registry
        .requests()
        .into_iter()
        .filter(|r| !r.starts_with("GET /token"))
        .map(|r| r.split('?').next().unwrap().to_string())
        .collect();
    let pushes: Vec<&String> = order
        .iter()
        .skip_while(|r| !r.starts_with("POST"))
        .collect();
    assert!(
        pushes[0].starts_with("POST /v2/gems/cache/blobs/uploads/"),
        "{order:?}"
    );
    assert!(
        pushes
            .iter()
            .any(|r| r.starts_with("PUT /v2/gems/cache/blobs/uploads/")),
        "{order:?}"
    );
    assert!(
        registry
            .requests()
            .iter()
            .any(|r| r.starts_with("PUT") && r.contains(&format!("digest=sha256%3A{sha}"))),
        "{:?}",
        registry.requests()
    );
    // Uploads refused: the next file still installs.
    registry.set_faults(Faults {
        refuse_uploads: true,
        ..Faults::default()
    });
    let other = bytes(10_000, 12);
    let url = env.serve("/q.bin", &other);
    service
        .install(
            "h",
            &crate::support::manifest(serde_json::json!([entry("q", &url, &other)])),
        )
        .await
        .unwrap();
    service.gem("h").path("q").await.unwrap();
    service.shutdown().await;
}

#[tokio::test]
async fn cache_check_says_what_works_and_never_shows_the_password() {
    let registry = Registry::start(
        "127.0.0.2",
        Access::Basic("reader".into(), "pw-S3CRET-check".into()),
    )
    .await;
    let env = Env::new().await;
    std::fs::write(env.dir.path().join("pw"), "pw-S3CRET-check\n").unwrap();
    let section = |pw: &str| {
        format!(
            "oci = \"{}\"\nallow_internal = true\nusername = \"reader\"\npassword_file = \"{pw}\"\n",
            registry.oci("registry.test", "gems/cache")
        )
    };
    env.write_cache_config(registry.ca_pem(), &section("pw"));
    let out = env.run(&["cache", "check"]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stdout(&out).contains("reach: ok"), "{}", stdout(&out));
    assert!(stdout(&out).contains("read: ok"), "{}", stdout(&out));
    // Wrong credentials: a clear refusal, exit 1, no secret anywhere.
    std::fs::write(env.dir.path().join("bad"), "wrong-S3CRET\n").unwrap();
    env.write_cache_config(registry.ca_pem(), &section("bad"));
    for json in [false, true] {
        let mut args = vec!["cache", "check"];
        if json {
            args.insert(0, "--json");
        }
        let out = env.run(&args).await;
        assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
        let text = format!("{}{}", stdout(&out), stderr(&out));
        assert!(text.contains("401"), "{text}");
        assert!(!text.contains("S3CRET"), "{text}");
        if json {
            let doc: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
            assert_eq!(doc["ok"], false);
            assert_eq!(doc["read"]["ok"], false);
        }
    }
    // Downloads are unaffected by the refusal.
    let body = bytes(2_000, 13);
    env.serve("/w.bin", &body);
    let out = fetch(&env, &[("/w.bin", &body)], true).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let status = env.run(&["--json", "status"]).await;
    for text in [stdout(&out), stderr(&out), stdout(&status), stderr(&status)] {
        assert!(!text.contains("S3CRET"), "{text}");
    }
    for file in crate::support::files_under(env.store_dir().as_path()) {
        let data = std::fs::read(&file).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&data).contains("S3CRET"),
            "{}",
            file.display()
        );
    }
}

#[tokio::test]
async fn cache_commands_without_a_cache_say_so() {
    let env = Env::new().await;
    let out = env.run(&["cache", "check"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no cache is configured"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_cache_section_is_checked_as_the_file_is_read() {
    let ok = gem_resources::Config::parse("[cache]\noci = \"https://registry.example/gems\"\n");
    assert!(ok.is_ok());
    for bad in [
        "[cache]\noci = \"http://registry.example/gems\"\n",
        "[cache]\noci = \"https://registry.example/gems\"\nusername = \"u\"\n",
        "[cache]\noci = \"https://registry.example/gems\"\npasword_env = \"X\"\n",
        "[cache]\npush = true\n",
    ] {
        assert!(gem_resources::Config::parse(bad).is_err(), "{bad}");
    }
}

#[tokio::test]
async fn the_users_policy_applies_to_the_cache_host() {
    let registry = Registry::start("127.0.0.2", Access::Anonymous).await;
    let env = Env::new().await;
    let section = format!(
        "oci = \"{}\"\nallow_internal = true\n",
        registry.oci("registry.test", "gems/cache")
    );
    env.write_cache_config(registry.ca_pem(), &section);
    // Only origin.test is allowed: the registry is never contacted.
    let config = env.dir.path().join("config.toml");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "[network]\n",
        "[network]\nmode = \"allowlist\"\nhosts = [\"origin.test\"]\n",
    );
    std::fs::write(&config, text).unwrap();
    let body = bytes(4_000, 14);
    registry.put_blob(&body);
    env.serve("/pol.bin", &body);
    let out = fetch(&env, &[("/pol.bin", &body)], false).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(registry.connections(), 0, "{:?}", registry.requests());
    assert_eq!(env.origin.hits("/pol.bin"), 1);
}

#[tokio::test]
async fn status_says_a_file_came_from_the_cache() {
    let registry = Registry::start("127.0.0.2", Access::Anonymous).await;
    let env = cached_env(&registry, "").await;
    let body = bytes(8_000, 15);
    registry.put_blob(&body);
    let url = env.url("origin.test", "/st.bin");
    let mut e = entry("st", &url, &body);
    e["required"] = serde_json::Value::Bool(true);
    let manifest = env.write_manifest("notochord.json", serde_json::json!([e]));
    let out = env
        .run(&["--no-service", "install", "g", manifest.to_str().unwrap()])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let status = env.run(&["--json", "--no-service", "status"]).await;
    let doc: serde_json::Value = serde_json::from_str(stdout(&status).trim()).unwrap();
    let row = &doc["gems"][0]["resources"][0];
    assert_eq!(row["state"], "present", "{doc}");
    assert_eq!(row["served_by"], "cache", "{doc}");
    assert_eq!(env.origin.total_hits(), 0);
}

#[tokio::test]
async fn cache_push_seeds_the_registry_from_the_store() {
    let registry = Registry::start("127.0.0.2", Access::Anonymous).await;
    let env = cached_env(&registry, "").await;
    let body = bytes(40_000, 16);
    env.serve("/seed.bin", &body);
    let out = fetch(&env, &[("/seed.bin", &body)], false).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !registry.has_blob(&sha256_hex(&body)),
        "push = false uploads nothing"
    );
    let out = env.run(&["cache", "push"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("1 uploaded, 0 already in the cache, 0 failed"),
        "{}",
        stdout(&out)
    );
    assert!(registry.has_blob(&sha256_hex(&body)));
    let out = env.run(&["--json", "cache", "push"]).await;
    let doc: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(doc["present"], 1, "{doc}");
    assert_eq!(doc["ok"], true, "{doc}");
    // Uploads refused: said per file, exit 1.
    registry.set_faults(Faults {
        refuse_uploads: true,
        ..Faults::default()
    });
    let other = bytes(1_000, 17);
    env.serve("/seed2.bin", &other);
    let out = fetch(&env, &[("/seed2.bin", &other)], false).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let out = env.run(&["cache", "push"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stderr(&out).contains("failed:"), "{}", stderr(&out));
}

/// A credential helper `docker-credential-fake` in `<env>/bin`: it writes
/// what it was asked to `<env>/bin/asked`, and answers `user` and
/// `secret` for `server` unless `<env>/bin/deny` exists, when it says
/// what Docker's helpers say of credentials they do not have. Returns the
/// `PATH` of a process that finds it first.
#[cfg(unix)]
fn fake_helper(env: &Env, server: &str, user: &str, secret: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let bin = env.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let dir = bin.display();
    let script = format!(
        r#"#!/bin/sh
[ "$1" = get ] || exit 2
server=$(cat)
printf '%s %s' "$1" "$server" > '{dir}/asked'
echo "stderr {secret}" >&2
if [ -e '{dir}/deny' ] || [ "$server" != '{server}' ]; then
  echo "credentials not found in native keychain"; exit 1
fi
printf '{{"ServerURL":"%s","Username":"{user}","Secret":"{secret}"}}' "$server"
"#
    );
    let path = bin.join("docker-credential-fake");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!("{dir}:{}", std::env::var("PATH").unwrap_or_default())
}

#[cfg(unix)]
#[tokio::test]
async fn credentials_come_from_the_docker_credential_helper_before_auths() {
    let registry = Registry::start(
        "127.0.0.2",
        Access::Basic("reader".into(), "pw-S3CRET-helper".into()),
    )
    .await;
    let env = cached_env(&registry, "docker_config = \"docker/config.json\"\n").await;
    let server = format!("registry.test:{}", registry.port());
    // `auths` holds wrong credentials for the host: Docker asks the
    // helper `credsStore` names first, and so does the cache.
    let wrong = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        "reader:wrong-S3CRET",
    );
    std::fs::create_dir_all(env.dir.path().join("docker")).unwrap();
    let file = serde_json::json!({
        "auths": { &server: { "auth": wrong } },
        "credsStore": "fake",
    });
    std::fs::write(env.dir.path().join("docker/config.json"), file.to_string()).unwrap();
    let path = fake_helper(&env, &server, "reader", "pw-S3CRET-helper");
    let body = bytes(25_000, 9);
    registry.put_blob(&body);
    env.serve("/h.bin", &body);
    let manifest = env.write_manifest(
        "h.json",
        serde_json::json!([entry("h", &env.url("origin.test", "/h.bin"), &body)]),
    );
    let config = env.dir.path().join("config.toml").display().to_string();
    let vars = [("PATH", path.as_str())];
    let run = |args: &[&str]| {
        let mut all = vec!["--config".to_string(), config.clone()];
        all.extend(args.iter().map(|a| a.to_string()));
        crate::support::run_bin_env(all, &vars)
    };
    let out = run(&["fetch", manifest.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(env.origin.hits("/h.bin"), 0, "served by the cache");
    let asked = std::fs::read_to_string(env.dir.path().join("bin/asked")).unwrap();
    assert_eq!(asked, format!("get {server}"), "asked as Docker asks");
    let expected = format!(
        "Basic {}",
        base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            "reader:pw-S3CRET-helper"
        )
    );
    let blob_gets: Vec<_> = registry
        .seen()
        .into_iter()
        .filter(|s| s.method == "GET" && s.target.contains("/blobs/"))
        .collect();
    assert!(!blob_gets.is_empty());
    assert!(blob_gets
        .iter()
        .all(|s| s.authorization.as_deref() == Some(expected.as_str())));
    for text in [stdout(&out), stderr(&out)] {
        assert!(!text.contains("S3CRET"), "{text}");
    }
    // A helper without the credentials: `cache check` names it and says
    // what it said; downloads go on from their own addresses.
    std::fs::write(env.dir.path().join("bin/deny"), "").unwrap();
    let out = run(&["cache", "check"]).await;
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!(
            "the credential helper docker-credential-fake failed for {server} (exit status 1): credentials not found in native keychain"
        )),
        "{text}"
    );
    assert!(!text.contains("S3CRET"), "{text}");
    let other = bytes(5_000, 10);
    env.serve("/o.bin", &other);
    let manifest = env.write_manifest(
        "o.json",
        serde_json::json!([entry("o", &env.url("origin.test", "/o.bin"), &other)]),
    );
    let out = run(&["fetch", manifest.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(env.origin.hits("/o.bin"), 1);
    assert!(!stderr(&out).contains("S3CRET"), "{}", stderr(&out));
}
