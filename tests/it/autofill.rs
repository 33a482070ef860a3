//! `gem-resources autofill URL`: size and SHA-256 of a URL, by the download
//! rules, keeping nothing.

use std::io::ErrorKind;
use std::path::PathBuf;

use serde_json::Value;

use crate::support::*;

/// The files in the scratch folder other than the configuration and the CA.
fn left_behind(env: &Env) -> Vec<PathBuf> {
    let keep = [
        env.dir.path().join("ca.pem"),
        env.dir.path().join("config.toml"),
    ];
    files_under(env.dir.path())
        .into_iter()
        .filter(|p| !keep.contains(p))
        .collect()
}

fn redirect(env: &Env, path: &str, location: &str) {
    env.origin.route(
        path,
        Behaviour::Redirect {
            status: 302,
            location: location.to_string(),
        },
    );
}

/// Runs `autofill url` expecting a refusal with `code`.
async fn assert_refused(env: &Env, url: &str, code: &str) -> String {
    let out = env.run(&["autofill", url]).await;
    assert_eq!(out.status.code(), Some(1), "{url}: {}", stderr(&out));
    assert_eq!(stdout(&out), "", "{url}");
    let err = stderr(&out);
    assert!(
        err.starts_with(&format!("{code}: ")),
        "{url}: expected {code}, got {err}"
    );
    err
}

#[tokio::test]
async fn autofill_prints_size_and_digest() {
    let env = Env::new().await;
    let body = bytes(12_345, 1);
    let url = env.serve("/a.bin", &body);
    let out = env.run(&["autofill", url.as_str()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let sha = sha256_hex(&body);
    assert_eq!(
        stdout(&out),
        format!("size: 12345\nsha256: {sha}\n\"size\": 12345, \"sha256\": \"{sha}\"\n")
    );
    // Nothing to say of an address that answered itself.
    assert!(!stderr(&out).contains("note:"), "{}", stderr(&out));
}

#[tokio::test]
async fn autofill_json_has_size_and_sha256() {
    let env = Env::new().await;
    let body = bytes(777, 2);
    let url = env.serve("/b.bin", &body);
    let out = env.run(&["--json", "autofill", url.as_str()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["size"], serde_json::json!(777), "{v}");
    assert_eq!(v["sha256"], serde_json::json!(sha256_hex(&body)), "{v}");
    assert_eq!(v["final_url"], url.as_str(), "{v}");
    assert_eq!(stdout(&out).lines().count(), 1);
}

#[tokio::test]
async fn autofill_follows_redirects_and_names_the_final_url() {
    let env = Env::new().await;
    let body = bytes(500, 3);
    let port = env.origin.port();
    redirect(&env, "/start", "/next");
    redirect(
        &env,
        "/next",
        &format!("https://mirror.test:{port}/files/c.bin"),
    );
    env.origin
        .route("/files/c.bin", Behaviour::Body(body.clone()));
    let start = env.url("origin.test", "/start");
    let out = env.run(&["--json", "autofill", start.as_str()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["size"], 500);
    assert_eq!(v["sha256"], sha256_hex(&body));
    assert_eq!(
        v["final_url"],
        env.url("mirror.test", "/files/c.bin").as_str()
    );

    assert_eq!(v["manifest_url"], start.as_str(), "{v}");

    let out = env.run(&["autofill", start.as_str()]).await;
    let sha = sha256_hex(&body);
    assert!(
        stdout(&out).ends_with(&format!(
            "final url: {}\n\"size\": 500, \"sha256\": \"{sha}\"\n",
            env.url("mirror.test", "/files/c.bin")
        )),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains(&format!(
            "put the address you gave in the manifest (\"url\": \"{start}\")"
        )),
        "{}",
        stderr(&out)
    );
}

#[tokio::test]
async fn autofill_recommends_a_lasting_address_over_a_signed_one() {
    let env = Env::new().await;
    let body = bytes(400, 4);
    env.origin
        .route("/files/d.bin", Behaviour::Body(body.clone()));
    let signed = env.url(
        "cdn.test",
        "/files/d.bin?X-Amz-Expires=300&X-Amz-Signature=0123456789abcdef0123456789abcdef0123456789",
    );
    // A lasting address that redirects to a signed one: declare it.
    redirect(&env, "/d.bin", signed.as_str());
    let lasting = env.url("origin.test", "/d.bin");
    let out = env.run(&["autofill", lasting.as_str()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "put the address you gave in the manifest (\"url\": \"{lasting}\")"
        )) && err.contains("it is signed and will expire"),
        "{err}"
    );
    // The signed query is cut in the note, not in --json.
    assert!(err.contains("/files/d.bin?…"), "{err}");
    let v: Value = serde_json::from_slice(
        &env.run(&["--json", "autofill", lasting.as_str()])
            .await
            .stdout,
    )
    .unwrap();
    assert_eq!(v["final_url"], signed.as_str(), "{v}");
    assert_eq!(v["manifest_url"], lasting.as_str(), "{v}");

    // A signed address that redirects to a lasting one: declare that.
    let plain = env.url("mirror.test", "/files/d.bin");
    redirect(&env, "/dl", plain.as_str());
    let given = env.url("origin.test", "/dl?Expires=1&Signature=abc&Key-Pair-Id=K");
    let out = env.run(&["autofill", given.as_str()]).await;
    assert!(
        stderr(&out).contains(&format!(
            "the address you gave is signed or expiring (Expires); put the final one in the manifest (\"url\": \"{plain}\")"
        )),
        "{}",
        stderr(&out)
    );
    // A signed address that answers itself: declare another.
    let out = env.run(&["autofill", signed.as_str()]).await;
    assert!(
        stderr(&out).contains("warning: the address is signed or expiring (X-Amz-Expires)"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test]
async fn autofill_refuses_the_sixth_redirect() {
    let env = Env::new().await;
    for n in 1..=6 {
        redirect(&env, &format!("/s/{n}"), &format!("/s/{}", n + 1));
    }
    env.origin.route("/s/7", Behaviour::Body(b"x".to_vec()));
    let url = env.url("origin.test", "/s/1");
    assert_refused(&env, url.as_str(), "E_RESOURCE_REDIRECTS").await;
    assert_eq!(env.origin.hits("/s/7"), 0);
}

#[tokio::test]
async fn autofill_refuses_plain_http_directly_and_after_a_redirect() {
    let env = Env::new().await;
    let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    plain.set_nonblocking(true).unwrap();
    let target = format!(
        "http://origin.test:{}/plain.bin",
        plain.local_addr().unwrap().port()
    );
    assert_refused(&env, &target, "E_RESOURCE_SCHEME").await;
    redirect(&env, "/to-http", &target);
    let err = assert_refused(
        &env,
        env.url("origin.test", "/to-http").as_str(),
        "E_RESOURCE_SCHEME",
    )
    .await;
    assert!(err.contains(&format!("(redirected to {target})")), "{err}");
    match plain.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the http:// address was contacted: {other:?}"),
    }
}

#[tokio::test]
async fn autofill_refuses_local_addresses() {
    let env = Env::new().await;
    let port = env.origin.port();
    assert_refused(
        &env,
        &format!("https://127.0.0.2:{port}/a.bin"),
        "E_RESOURCE_ADDRESS",
    )
    .await;
    assert_refused(
        &env,
        &format!("https://localhost:{port}/a.bin"),
        "E_RESOURCE_ADDRESS",
    )
    .await;
    redirect(&env, "/to-local", &format!("https://[::1]:{port}/a.bin"));
    assert_refused(
        &env,
        env.url("origin.test", "/to-local").as_str(),
        "E_RESOURCE_ADDRESS",
    )
    .await;
    assert_eq!(env.origin.hits("/a.bin"), 0);
}

#[tokio::test]
async fn autofill_refuses_hosts_the_policy_blocks() {
    let env = Env::new().await;
    env.write_config("mode = \"blocklist\"\nhosts = [\"blocked.test\"]");
    env.origin.route("/a.bin", Behaviour::Body(b"abc".to_vec()));
    let blocked = env.url("blocked.test", "/a.bin");
    assert_refused(&env, blocked.as_str(), "E_RESOURCE_POLICY").await;
    redirect(&env, "/to-blocked", blocked.as_str());
    assert_refused(
        &env,
        env.url("origin.test", "/to-blocked").as_str(),
        "E_RESOURCE_POLICY",
    )
    .await;
    assert_eq!(env.origin.hits("/a.bin"), 0);
    assert_eq!(env.origin.hits("/to-blocked"), 1);
}

#[tokio::test]
async fn autofill_keeps_nothing_on_disk() {
    let env = Env::new().await;
    let body = bytes(300_000, 4);
    let url = env.serve("/big.bin", &body);
    let out = env.run(&["autofill", url.as_str()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(left_behind(&env), Vec::<PathBuf>::new());
    let blobs = env.store_dir().join("store-v1").join("blobs");
    assert!(files_under(&blobs).is_empty());
}

#[tokio::test]
async fn autofill_of_a_stalled_transfer_fails_with_a_network_error() {
    let env = Env::new().await;
    env.write_config("stall_timeout_secs = 1");
    env.origin.route(
        "/stall.bin",
        Behaviour::Stall {
            body: bytes(5000, 5),
            sent: 1000,
        },
    );
    let err = assert_refused(
        &env,
        env.url("origin.test", "/stall.bin").as_str(),
        "E_RESOURCE_NETWORK",
    )
    .await;
    assert!(err.contains("stalled"), "{err}");
    assert_eq!(left_behind(&env), Vec::<PathBuf>::new());
}

#[tokio::test]
async fn autofill_reports_http_errors_as_json() {
    let env = Env::new().await;
    env.origin.route("/gone.bin", Behaviour::Status(410));
    let url = env.url("origin.test", "/gone.bin");
    let out = env.run(&["--json", "autofill", url.as_str()]).await;
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["code"], "E_RESOURCE_HTTP", "{v}");
    assert_eq!(v["attempts"][0]["address"], url.as_str(), "{v}");
    assert!(v["message"].as_str().unwrap().contains("410"), "{v}");
}

#[tokio::test]
async fn autofill_stops_at_its_size_limit() {
    let env = Env::new().await;
    env.write_config("autofill_max_bytes = 1000");
    env.origin
        .route("/long.bin", Behaviour::BodyNoLength(bytes(5000, 6)));
    env.origin
        .route("/long-cl.bin", Behaviour::Body(bytes(5000, 6)));
    let fits = env.serve("/fits.bin", &bytes(1000, 6));
    for path in ["/long.bin", "/long-cl.bin"] {
        assert_refused(
            &env,
            env.url("origin.test", path).as_str(),
            "E_RESOURCE_SIZE",
        )
        .await;
    }
    let out = env.run(&["autofill", fits.as_str()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[tokio::test]
async fn autofill_reads_at_most_its_limit_not_one_byte_more() {
    let env = Env::new().await;
    let fetcher = gem_resources::Fetcher::new(&env.config()).unwrap();
    let max = 1000u64;
    env.origin
        .route("/over.bin", Behaviour::BodyNoLength(bytes(1001, 8)));
    env.origin
        .route("/over-cl.bin", Behaviour::Body(bytes(1001, 8)));
    for path in ["/over.bin", "/over-cl.bin"] {
        let url = env.url("origin.test", path);
        let err = fetcher.autofill(&url, max).await.unwrap_err();
        assert!(err.to_string().contains("size"), "{path}: {err}");
    }
    let exact = env.serve("/exact.bin", &bytes(1000, 8));
    let filled = fetcher.autofill(&exact, max).await.unwrap();
    assert_eq!(filled.size, 1000);
    assert_eq!(filled.sha256, sha256_hex(&bytes(1000, 8)));
}
