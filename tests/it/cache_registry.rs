//! The `[cache]` against the real CNCF distribution registry (Debian's
//! `docker-registry`), on loopback with TLS from a throwaway CA: a miss,
//! the upload after it, and a second store served by the registry; HTTP
//! basic auth from an htpasswd file (wrong and right credentials); a
//! partial download from the registry continued with a range; its token
//! flow with a token service of the tests' own; credentials from a Docker
//! config.json; a cross-repository mount. Each test
//! runs a registry of its own on a free port. Skipped, saying so, when the
//! program is not installed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gem_resources::partial::PartialMeta;

use crate::support::registry::certificate_files;
use crate::support::token::TokenService;
use crate::support::{bytes, entry, sha256_hex, stderr, stdout, store_root, Env, Spawned};

const PROGRAM: &str = "/usr/bin/docker-registry";

/// The user of the htpasswd tests and its bcrypt hash (cost 4) of
/// `right-S3CRET`: the registry accepts bcrypt only.
const HTPASSWD: &str = "reader:$2b$04$O.z8qzjeQJzNRrTJW8BY/uJrRDHJGyvKFA216.1PmOWc1L9tjUeXy";
const RIGHT: &str = "right-S3CRET";

/// How a registry lets clients in.
#[derive(Default)]
struct Options {
    /// HTTP basic, from this htpasswd file's text.
    htpasswd: Option<&'static str>,
    /// Tokens from this realm, signed by a key whose certificate is in
    /// this bundle (PEM), for the service `test-registry` and the issuer
    /// `test-issuer`.
    token: Option<(String, String)>,
    /// The CA (PEM), certificate and key to serve with, when the test
    /// made them (a token service shares them); else new ones.
    tls: Option<(String, String, String)>,
}

/// A registry started by [`start`]; dropping it stops it.
struct Running {
    _child: Spawned,
    port: u16,
    /// The CA its certificate is from, PEM.
    ca: String,
    /// Its access log (one line per request, with status and bytes).
    access: PathBuf,
}

impl Running {
    /// `[cache]` lines for repository `gem-resources/cache`, plus `extra`.
    fn section(&self, extra: &str) -> String {
        format!(
            "oci = \"https://registry.test:{}/gem-resources/cache\"\nallow_internal = true\n{extra}",
            self.port
        )
    }

    /// The access log's lines for a `GET` of a blob: (status, bytes).
    fn blob_gets(&self) -> Vec<(u16, u64)> {
        let log = std::fs::read_to_string(&self.access).unwrap_or_default();
        log.lines()
            .filter(|l| l.contains("\"GET /v2/gem-resources/cache/blobs/sha256:"))
            .filter_map(|l| {
                let after = l.split("HTTP/1.1\" ").nth(1)?;
                let mut fields = after.split_whitespace();
                Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
            })
            .collect()
    }
}

/// Starts the registry on 127.0.0.2 and a free port; `None` when the
/// program is missing.
async fn start(dir: &Path, options: Options) -> Option<Running> {
    if !Path::new(PROGRAM).exists() {
        eprintln!(
            "SKIPPED cache_registry: {PROGRAM} is not installed (apt-get install docker-registry)"
        );
        return None;
    }
    let (ca, cert, key) = options.tls.clone().unwrap_or_else(certificate_files);
    std::fs::write(dir.join("cert.pem"), cert).unwrap();
    std::fs::write(dir.join("key.pem"), key).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.2:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut auth = String::new();
    if let Some(text) = options.htpasswd {
        std::fs::write(dir.join("htpasswd"), format!("{text}\n")).unwrap();
        auth = format!(
            "auth:\n  htpasswd:\n    realm: test-registry\n    path: {}\n",
            dir.join("htpasswd").display()
        );
    }
    if let Some((realm, bundle)) = &options.token {
        std::fs::write(dir.join("bundle.pem"), bundle).unwrap();
        auth = format!(
            "auth:\n  token:\n    realm: {realm}\n    service: test-registry\n    issuer: test-issuer\n    rootcertbundle: {}\n",
            dir.join("bundle.pem").display()
        );
    }
    let config = format!(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.2:{port}\n  tls:\n    certificate: {}\n    key: {}\n{auth}",
        dir.join("data").display(),
        dir.join("cert.pem").display(),
        dir.join("key.pem").display()
    );
    std::fs::write(dir.join("config.yml"), config).unwrap();
    let access = dir.join("access.log");
    let child = std::process::Command::new(PROGRAM)
        .arg("serve")
        .arg(dir.join("config.yml"))
        .stdout(std::fs::File::create(&access).unwrap())
        .stderr(std::fs::File::create(dir.join("registry.log")).unwrap())
        .spawn()
        .unwrap();
    let child = Spawned(child);
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.2", port)).is_ok() {
            return Some(Running {
                _child: child,
                port,
                ca,
                access,
            });
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "the registry did not start: {}",
        std::fs::read_to_string(dir.join("registry.log")).unwrap_or_default()
    );
}

/// The cache of `env`'s configuration, as the library sets it up.
fn cache_of(env: &Env) -> std::sync::Arc<gem_resources::cache::Cache> {
    let config = env.config();
    let fetcher = gem_resources::Fetcher::new(&config)
        .unwrap()
        .with_cache(config.cache_settings().unwrap())
        .unwrap();
    fetcher.cache().unwrap().clone()
}

/// Runs `fetch` of one file at `path` on `env`'s origin.
async fn fetch(env: &Env, path: &str, body: &[u8]) -> std::process::Output {
    let manifest = env.write_manifest(
        "m.json",
        serde_json::json!([entry("m", &env.url("origin.test", path), body)]),
    );
    env.run(&["fetch", manifest.to_str().unwrap()]).await
}

#[tokio::test]
async fn a_miss_is_pushed_to_the_distribution_registry_and_serves_the_next_store() {
    let scratch = tempfile::tempdir().unwrap();
    let Some(registry) = start(scratch.path(), Options::default()).await else {
        return;
    };
    let section = registry.section("push = true\n");
    let first = Env::new().await;
    first.write_cache_config(&registry.ca, &section);
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
    let cache = cache_of(&first);
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
    second.write_cache_config(&registry.ca, &section);
    second.serve("/model.bin", &body);
    let out = fetch(&second, "/model.bin", &body).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(second.origin.hits("/model.bin"), 0);
    let check = second.run(&["cache", "check"]).await;
    assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));
}

#[tokio::test]
async fn htpasswd_credentials_wrong_then_right() {
    let scratch = tempfile::tempdir().unwrap();
    let options = Options {
        htpasswd: Some(HTPASSWD),
        ..Options::default()
    };
    let Some(registry) = start(scratch.path(), options).await else {
        return;
    };
    let env = Env::new().await;
    std::fs::write(env.dir.path().join("bad"), "wrong-S3CRET\n").unwrap();
    std::fs::write(env.dir.path().join("good"), format!("{RIGHT}\n")).unwrap();
    let section = |file: &str| {
        registry.section(&format!(
            "push = true\nusername = \"reader\"\npassword_file = \"{file}\"\n"
        ))
    };
    env.write_cache_config(&registry.ca, &section("bad"));
    // Wrong: `cache check` names the registry and the reason, exit 1.
    let out = env.run(&["cache", "check"]).await;
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("read: the registry registry.test refused the user name \"reader\" and its password (HTTP 401)"),
        "{text}"
    );
    assert!(
        text.contains("write: the registry registry.test refused"),
        "{text}"
    );
    assert!(!text.contains("S3CRET"), "{text}");
    // A download is unaffected: it comes from the origin, verified.
    let body = bytes(1 << 20, 31);
    env.serve("/a.bin", &body);
    let out = fetch(&env, "/a.bin", &body).await;
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("S3CRET"), "{text}");
    assert_eq!(env.origin.hits("/a.bin"), 1);
    assert!(registry.blob_gets().is_empty());
    // Right: everything works, and `cache push` uploads the stored file.
    env.write_cache_config(&registry.ca, &section("good"));
    let out = env.run(&["cache", "check"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    for line in ["reach: ok", "read: ok", "write: ok"] {
        assert!(text.contains(line), "{text}");
    }
    let out = env.run(&["cache", "push"]).await;
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("1 uploaded"), "{}", stdout(&out));
    // A second store with the right credentials is served by the registry.
    let second = Env::new().await;
    std::fs::write(second.dir.path().join("good"), format!("{RIGHT}\n")).unwrap();
    second.write_cache_config(&registry.ca, &section("good"));
    second.serve("/a.bin", &body);
    let out = fetch(&second, "/a.bin", &body).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(second.origin.hits("/a.bin"), 0);
    assert_eq!(registry.blob_gets(), vec![(200, body.len() as u64)]);
}

#[tokio::test]
async fn a_partial_download_from_the_registry_continues_with_a_range() {
    let scratch = tempfile::tempdir().unwrap();
    let Some(registry) = start(scratch.path(), Options::default()).await else {
        return;
    };
    let env = Env::new().await;
    env.write_cache_config(&registry.ca, &registry.section(""));
    let body = bytes(3 << 20, 41);
    env.serve("/r.bin", &body);
    let sha = sha256_hex(&body);
    // The registry holds the blob.
    let file = scratch.path().join("r.bin");
    std::fs::write(&file, &body).unwrap();
    let cache = cache_of(&env);
    cache
        .push_file(&sha, body.len() as u64, &file)
        .await
        .unwrap();
    // The first 1 MiB came from the registry before the last run stopped.
    let kept = 1 << 20;
    env.resources().shutdown().await;
    let tmp = store_root(&env).join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let name = format!("{sha}.{}.partial", body.len());
    std::fs::write(tmp.join(&name), &body[..kept]).unwrap();
    let meta = PartialMeta {
        address: cache.blob_url(&sha).to_string(),
        validator: Some(format!("\"sha256:{sha}\"")),
        durable: kept as u64,
        ranges: Vec::new(),
    };
    std::fs::write(
        tmp.join(format!("{name}.json")),
        serde_json::to_vec(&meta).unwrap(),
    )
    .unwrap();
    let out = fetch(&env, "/r.bin", &body).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(env.origin.hits("/r.bin"), 0);
    // One GET, answered 206 with the rest only.
    assert_eq!(
        registry.blob_gets(),
        vec![(206, (body.len() - kept) as u64)],
        "{}",
        std::fs::read_to_string(&registry.access).unwrap_or_default()
    );
    assert_eq!(crate::support::stored_files(&env, &body).len(), 1);
}

#[tokio::test]
async fn credentials_come_from_a_docker_config_json() {
    let scratch = tempfile::tempdir().unwrap();
    let options = Options {
        htpasswd: Some(HTPASSWD),
        ..Options::default()
    };
    let Some(registry) = start(scratch.path(), options).await else {
        return;
    };
    let env = Env::new().await;
    // A file named in the section, `auth` holding base64 of user:password.
    let auth = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        format!("reader:{RIGHT}"),
    );
    let file = serde_json::json!({
        "auths": { format!("registry.test:{}", registry.port): { "auth": auth } }
    });
    std::fs::write(env.dir.path().join("docker.json"), file.to_string()).unwrap();
    env.write_cache_config(
        &registry.ca,
        &registry.section("docker_config = \"docker.json\"\n"),
    );
    let out = env.run(&["cache", "check"]).await;
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("read: ok") && text.contains("write: ok"),
        "{text}"
    );
    assert!(!text.contains("S3CRET"), "{text}");
    // `true`: $DOCKER_CONFIG/config.json, here `username` and `password`
    // (wrong ones: the refusal names the user, never the password).
    let docker = env.dir.path().join("docker");
    std::fs::create_dir_all(&docker).unwrap();
    let file = serde_json::json!({
        "auths": { format!("https://registry.test:{}/v1/", registry.port):
            { "username": "reader", "password": "wrong-S3CRET" } }
    });
    std::fs::write(docker.join("config.json"), file.to_string()).unwrap();
    env.write_cache_config(&registry.ca, &registry.section("docker_config = true\n"));
    let config = env.dir.path().join("config.toml").display().to_string();
    let run = |vars: Vec<(&'static str, String)>| {
        let args = vec![
            "--config".to_string(),
            config.clone(),
            "cache".into(),
            "check".into(),
        ];
        async move {
            let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
            crate::support::run_bin_env(args, &vars).await
        }
    };
    let out = run(vec![("DOCKER_CONFIG", docker.display().to_string())]).await;
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("refused the user name \"reader\""), "{text}");
    assert!(!text.contains("S3CRET"), "{text}");
    // No entry for the registry: said, with the file and the host.
    std::fs::write(docker.join("config.json"), r#"{"auths":{}}"#).unwrap();
    let out = run(vec![("DOCKER_CONFIG", docker.display().to_string())]).await;
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert_ne!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!(
            "has no credentials for registry.test:{}",
            registry.port
        )),
        "{text}"
    );
}

#[tokio::test]
async fn a_blob_in_another_repository_is_mounted_not_uploaded() {
    let scratch = tempfile::tempdir().unwrap();
    let Some(registry) = start(scratch.path(), Options::default()).await else {
        return;
    };
    let body = bytes(1 << 20, 61);
    let sha = sha256_hex(&body);
    let file = scratch.path().join("m.bin");
    std::fs::write(&file, &body).unwrap();
    // Another team's repository of the same registry holds the blob.
    let other = Env::new().await;
    other.write_cache_config(
        &registry.ca,
        &format!(
            "oci = \"https://registry.test:{}/team/models\"\nallow_internal = true\n",
            registry.port
        ),
    );
    let pushed = cache_of(&other)
        .push_file(&sha, body.len() as u64, &file)
        .await
        .unwrap();
    assert_eq!(pushed, gem_resources::cache::Pushed::Uploaded);
    // The cache mounts it from there: no bytes sent.
    let env = Env::new().await;
    env.write_cache_config(
        &registry.ca,
        &registry.section("mount_from = [\"team/other\", \"team/models\"]\n"),
    );
    let cache = cache_of(&env);
    let pushed = cache
        .push_file(&sha, body.len() as u64, &file)
        .await
        .unwrap();
    assert_eq!(pushed, gem_resources::cache::Pushed::Mounted);
    let log = std::fs::read_to_string(&registry.access).unwrap();
    let ours: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("\"POST /v2/gem-resources/cache/blobs/uploads/"))
        .collect();
    assert_eq!(ours.len(), 2, "{log}");
    assert!(
        ours[0].contains("from=team%2Fother") && ours[0].contains("\" 202 "),
        "{log}"
    );
    assert!(
        ours[1].contains("from=team%2Fmodels") && ours[1].contains("\" 201 "),
        "{log}"
    );
    assert!(!log.contains("\"PUT /v2/gem-resources/cache/"), "{log}");
    assert!(
        log.contains("\"DELETE /v2/gem-resources/cache/blobs/uploads/"),
        "{log}"
    );
    assert!(matches!(
        cache.probe(&sha).await,
        gem_resources::cache::Probe::Hit
    ));
}

/// A registry whose tokens come from a token service of the tests' own
/// (`reader` with [`RIGHT`]); `None` when the program is missing.
async fn start_with_tokens(dir: &Path) -> Option<(TokenService, Running)> {
    if !Path::new(PROGRAM).exists() {
        eprintln!("SKIPPED cache_registry: {PROGRAM} is not installed");
        return None;
    }
    let (ca, cert, key) = certificate_files();
    let tokens = TokenService::start(&cert, &key, "reader", RIGHT).await;
    let options = Options {
        token: Some((tokens.realm(), tokens.bundle.clone())),
        tls: Some((ca, cert, key)),
        ..Options::default()
    };
    let registry = start(dir, options).await?;
    Some((tokens, registry))
}

/// `[cache]` lines for `repository` on a registry with tokens, as `reader`
/// with the password in `file`.
fn token_section(registry: &Running, repository: &str, file: &str) -> String {
    format!(
        "oci = \"https://registry.test:{}/{repository}\"\nallow_internal = [\"registry.test\", \"auth.test\"]\nusername = \"reader\"\npassword_file = \"{file}\"\n",
        registry.port
    )
}

#[tokio::test]
async fn the_registrys_token_service_gives_the_tokens_that_read_and_write() {
    let scratch = tempfile::tempdir().unwrap();
    let Some((tokens, registry)) = start_with_tokens(scratch.path()).await else {
        return;
    };
    let env = Env::new().await;
    std::fs::write(env.dir.path().join("bad"), "wrong-S3CRET\n").unwrap();
    std::fs::write(env.dir.path().join("good"), format!("{RIGHT}\n")).unwrap();
    let section = |file: &str| token_section(&registry, "gem-resources/cache", file);
    // Wrong credentials: the token service refuses them, said as such.
    env.write_cache_config(&registry.ca, &section("bad"));
    let out = env.run(&["cache", "check"]).await;
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("read: the token service auth.test refused the credentials (401)"),
        "{text}"
    );
    assert!(!text.contains("S3CRET"), "{text}");
    assert_eq!(tokens.issued(), 0);
    // Right: the registry takes the service's tokens to read and write.
    env.write_cache_config(&registry.ca, &section("good"));
    let out = env.run(&["cache", "check"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert!(
        text.contains("read: ok") && text.contains("write: ok"),
        "{text}"
    );
    let body = bytes(1 << 20, 71);
    env.serve("/t.bin", &body);
    let out = fetch(&env, "/t.bin", &body).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let out = env.run(&["cache", "push"]).await;
    assert!(
        stdout(&out).contains("1 uploaded"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    // A second store reads it with a token of its own.
    let second = Env::new().await;
    std::fs::write(second.dir.path().join("good"), format!("{RIGHT}\n")).unwrap();
    second.write_cache_config(&registry.ca, &section("good"));
    second.serve("/t.bin", &body);
    let before = tokens.issued();
    let out = fetch(&second, "/t.bin", &body).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(second.origin.hits("/t.bin"), 0);
    assert_eq!(registry.blob_gets(), vec![(200, body.len() as u64)]);
    assert_eq!(tokens.issued(), before + 1);
}

#[tokio::test]
async fn a_mount_with_tokens_asks_for_both_repositories() {
    let scratch = tempfile::tempdir().unwrap();
    let Some((tokens, registry)) = start_with_tokens(scratch.path()).await else {
        return;
    };
    let body = bytes(1 << 20, 81);
    let sha = sha256_hex(&body);
    let file = scratch.path().join("m.bin");
    std::fs::write(&file, &body).unwrap();
    let env = Env::new().await;
    std::fs::write(env.dir.path().join("good"), format!("{RIGHT}\n")).unwrap();
    env.write_cache_config(
        &registry.ca,
        &token_section(&registry, "team/models", "good"),
    );
    let pushed = cache_of(&env)
        .push_file(&sha, body.len() as u64, &file)
        .await
        .unwrap();
    assert_eq!(pushed, gem_resources::cache::Pushed::Uploaded);
    let section = format!(
        "{}mount_from = [\"team/models\"]\n",
        token_section(&registry, "gem-resources/cache", "good")
    );
    env.write_cache_config(&registry.ca, &section);
    let before = tokens.issued();
    let pushed = cache_of(&env)
        .push_file(&sha, body.len() as u64, &file)
        .await
        .unwrap();
    assert_eq!(pushed, gem_resources::cache::Pushed::Mounted);
    // A token to read and write the cache's repository, one to mount.
    assert_eq!(tokens.issued(), before + 2);
}
