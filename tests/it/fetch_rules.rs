//! The download rules for one resource, through the library API
//! (`download`, `Fetcher`, `Store`).

use std::io::ErrorKind;
use std::path::PathBuf;
use std::time::Duration;

use gem_resources::{Attempt, Error, Resource, RetryPolicy, Store};
use url::Url;

use crate::support::*;
async fn fetch(env: &Env, r: &Resource) -> gem_resources::Result<PathBuf> {
    fetch_with(env, r, no_retry()).await
}

/// The attempts of an `E_RESOURCE_UNAVAILABLE` error.
fn attempts(e: &Error) -> &[Attempt] {
    match e {
        Error::Unavailable { attempts, .. } => attempts,
        other => panic!("expected E_RESOURCE_UNAVAILABLE, got {other}"),
    }
}

fn codes(e: &Error) -> Vec<&'static str> {
    attempts(e).iter().map(|a| a.code().as_str()).collect()
}

/// The one attempt of a resource with a single address.
fn only_attempt(e: &Error) -> &Attempt {
    let list = attempts(e);
    assert_eq!(list.len(), 1, "{e}");
    &list[0]
}

fn store_root(env: &Env) -> PathBuf {
    env.store_dir().join("store-v1")
}

/// A redirect route.
fn redirect(env: &Env, path: &str, status: u16, location: &str) {
    env.origin.route(
        path,
        Behaviour::Redirect {
            status,
            location: location.to_string(),
        },
    );
}

#[tokio::test]
async fn the_url_then_each_mirror_is_tried_in_order_until_one_succeeds() {
    let env = Env::new().await;
    let body = bytes(5000, 1);
    env.origin.route("/first.bin", Behaviour::Status(404));
    env.origin.route("/second.bin", Behaviour::Status(500));
    env.origin
        .route("/third.bin", Behaviour::Body(body.clone()));
    env.origin
        .route("/fourth.bin", Behaviour::Body(body.clone()));
    let r = resource(
        "m",
        &env.url("origin.test", "/first.bin"),
        &[
            env.url("mirror.test", "/second.bin"),
            env.url("cdn.test", "/third.bin"),
            env.url("other.test", "/fourth.bin"),
        ],
        &body,
    );
    let path = fetch(&env, &r).await.unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), body);
    assert_eq!(env.origin.hits("/first.bin"), 1);
    assert_eq!(env.origin.hits("/second.bin"), 1);
    assert_eq!(env.origin.hits("/third.bin"), 1);
    assert_eq!(env.origin.hits("/fourth.bin"), 0, "tried past a success");
}

#[tokio::test]
async fn wrong_bytes_fail_the_digest_check_and_the_mirror_is_used() {
    let env = Env::new().await;
    let body = bytes(4000, 2);
    let wrong = bytes(4000, 3);
    let url = env.serve("/bad.bin", &wrong);
    let mirror = env.serve("/good.bin", &body);

    let alone = resource("d", &url, &[], &body);
    let err = fetch(&env, &alone).await.unwrap_err();
    let a = only_attempt(&err);
    assert_eq!(a.code(), "E_RESOURCE_SHA256", "{err}");
    assert!(a.to_string().contains(&sha256_hex(&wrong)), "{a}");

    let with_mirror = resource("d", &url, &[mirror], &body);
    let path = fetch(&env, &with_mirror).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(env.origin.hits("/bad.bin"), 2);
    assert_eq!(env.origin.hits("/good.bin"), 1);
}

#[tokio::test]
async fn a_content_length_other_than_the_declared_size_fails_before_the_body_is_read() {
    // The origin announces the length and then sends nothing: reading the
    // body would stall, so only a check on the head can fail with SIZE.
    let env = Env::new().await;
    let body = bytes(1000, 4);
    for (path, announced) in [("/longer.bin", 2000), ("/shorter.bin", 500)] {
        env.origin.route(
            path,
            Behaviour::Stall {
                body: bytes(announced, 4),
                sent: 0,
            },
        );
        let r = resource("cl", &env.url("origin.test", path), &[], &body);
        let err = fetch(&env, &r).await.unwrap_err();
        let a = only_attempt(&err);
        assert_eq!(a.code(), "E_RESOURCE_SIZE", "{err}");
        assert!(
            a.to_string()
                .contains(&format!("announced {announced} bytes")),
            "{a}"
        );
        assert_eq!(env.origin.hits(path), 1);
    }
}

#[tokio::test]
async fn a_body_longer_than_declared_is_cut_off_and_the_mirror_is_used() {
    let env = Env::new().await;
    let body = bytes(1000, 5);
    let mut longer = body.clone();
    longer.extend_from_slice(&bytes(3000, 6));
    env.origin
        .route("/long.bin", Behaviour::BodyNoLength(longer));
    let url = env.url("origin.test", "/long.bin");
    let mirror = env.serve("/right.bin", &body);

    let err = fetch(&env, &resource("l", &url, &[], &body))
        .await
        .unwrap_err();
    let a = only_attempt(&err);
    assert_eq!(a.code(), "E_RESOURCE_SIZE", "{err}");
    // Stopped while streaming, not after reading everything.
    assert!(
        a.to_string().contains("received more than 1000 bytes"),
        "{a}"
    );

    let path = fetch(&env, &resource("l", &url, &[mirror], &body))
        .await
        .unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(env.origin.hits("/right.bin"), 1);
}

#[tokio::test]
async fn a_body_shorter_than_declared_fails_with_and_without_a_content_length() {
    let env = Env::new().await;
    let body = bytes(1000, 7);
    env.origin.route(
        "/short-cl.bin",
        Behaviour::WrongLength {
            body: body[..400].to_vec(),
            content_length: 1000,
        },
    );
    env.origin
        .route("/short.bin", Behaviour::BodyNoLength(body[..400].to_vec()));
    for path in ["/short-cl.bin", "/short.bin"] {
        let r = resource("s", &env.url("origin.test", path), &[], &body);
        let err = fetch(&env, &r).await.unwrap_err();
        let a = only_attempt(&err);
        assert_eq!(a.code(), "E_RESOURCE_SIZE", "{path}: {err}");
        assert!(a.to_string().contains("400 bytes"), "{a}");
    }
}

#[tokio::test]
async fn a_stalled_transfer_fails_with_a_network_error() {
    let env = Env::new().await;
    env.write_config("stall_timeout_secs = 1");
    let body = bytes(2000, 8);
    env.origin.route(
        "/stall.bin",
        Behaviour::Stall {
            body: body.clone(),
            sent: 100,
        },
    );
    let r = resource("st", &env.url("origin.test", "/stall.bin"), &[], &body);
    let err = fetch(&env, &r).await.unwrap_err();
    let a = only_attempt(&err);
    assert_eq!(a.code(), "E_RESOURCE_NETWORK", "{err}");
    assert!(a.to_string().contains("stalled"), "{a}");
}

#[tokio::test]
async fn a_reset_connection_fails_with_a_network_error() {
    let env = Env::new().await;
    let body = bytes(200_000, 9);
    env.origin.route(
        "/reset.bin",
        Behaviour::Reset {
            body: body.clone(),
            sent: 50_000,
        },
    );
    let r = resource("rs", &env.url("origin.test", "/reset.bin"), &[], &body);
    let err = fetch(&env, &r).await.unwrap_err();
    assert_eq!(only_attempt(&err).code(), "E_RESOURCE_NETWORK", "{err}");
}

#[tokio::test]
async fn only_a_200_response_counts() {
    // Each route's declared bytes are exactly what the origin sends with that
    // status, so accepting the status would make the download succeed.
    let env = Env::new().await;
    let table: &[(u16, &str)] = &[
        (404, "404 Not Found\n"),
        (403, "403 Forbidden\n"),
        (500, "500 Internal Server Error\n"),
        (503, "503 Service Unavailable\n"),
        (204, ""),
        (206, "206 Partial Content\n"),
        (304, ""),
        // A redirect without a Location.
        (302, "302 Found\n"),
    ];
    for &(status, text) in table {
        let path = format!("/status/{status}");
        env.origin.route(&path, Behaviour::Status(status));
        let r = resource("st", &env.url("origin.test", &path), &[], text.as_bytes());
        let err = fetch(&env, &r).await.unwrap_err();
        let a = only_attempt(&err);
        assert_eq!(a.code(), "E_RESOURCE_HTTP", "{status}: {err}");
        assert!(
            a.to_string().contains(&format!("HTTP status {status}")),
            "{a}"
        );
        assert_eq!(env.origin.hits(&path), 1, "{status}");
    }
}

#[tokio::test]
async fn five_redirects_relative_and_absolute_are_followed() {
    let env = Env::new().await;
    let body = bytes(3000, 10);
    let port = env.origin.port();
    redirect(&env, "/r/1", 301, "/r/2");
    redirect(&env, "/r/2", 302, "3");
    redirect(
        &env,
        "/r/3",
        303,
        &format!("https://mirror.test:{port}/r/4"),
    );
    redirect(&env, "/r/4", 307, &format!("//cdn.test:{port}/r/5"));
    redirect(&env, "/r/5", 308, "../final.bin?x=1");
    env.origin
        .route("/final.bin", Behaviour::Body(body.clone()));
    let r = resource("r", &env.url("origin.test", "/r/1"), &[], &body);
    let path = fetch(&env, &r).await.unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), body);
    // The file is named after the declared url, not the last hop.
    assert!(path.ends_with("1"), "{}", path.display());
    for hop in ["/r/1", "/r/2", "/r/3", "/r/4", "/r/5", "/final.bin"] {
        assert_eq!(env.origin.hits(hop), 1, "{hop}");
    }
}

#[tokio::test]
async fn the_sixth_redirect_is_refused() {
    let env = Env::new().await;
    let body = bytes(3000, 11);
    for n in 1..=6 {
        redirect(&env, &format!("/s/{n}"), 302, &format!("/s/{}", n + 1));
    }
    env.origin.route("/s/7", Behaviour::Body(body.clone()));
    let r = resource("s", &env.url("origin.test", "/s/1"), &[], &body);
    let err = fetch(&env, &r).await.unwrap_err();
    let a = only_attempt(&err);
    assert_eq!(a.code(), "E_RESOURCE_REDIRECTS", "{err}");
    assert_eq!(a.hop.as_ref(), Some(&env.url("origin.test", "/s/6")));
    for n in 1..=6 {
        assert_eq!(env.origin.hits(&format!("/s/{n}")), 1, "/s/{n}");
    }
    assert_eq!(env.origin.hits("/s/7"), 0);
}

#[tokio::test]
async fn a_redirect_to_plain_http_is_refused_before_any_request_to_it() {
    let env = Env::new().await;
    let body = bytes(100, 12);
    // A plain listener where the http:// address points: nothing may connect.
    let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    plain.set_nonblocking(true).unwrap();
    let target = format!(
        "http://origin.test:{}/plain.bin",
        plain.local_addr().unwrap().port()
    );
    redirect(&env, "/to-http", 302, &target);
    let r = resource("h", &env.url("origin.test", "/to-http"), &[], &body);
    let err = fetch(&env, &r).await.unwrap_err();
    let a = only_attempt(&err);
    assert_eq!(a.code(), "E_RESOURCE_SCHEME", "{err}");
    assert_eq!(a.hop.as_ref().map(Url::as_str), Some(target.as_str()));
    match plain.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the http:// address was contacted: {other:?}"),
    }
}

#[tokio::test]
async fn a_redirect_to_a_host_blocked_by_policy_is_refused() {
    let env = Env::new().await;
    env.write_config("mode = \"blocklist\"\nhosts = [\"blocked.test\"]");
    let body = bytes(100, 13);
    env.origin
        .route("/target.bin", Behaviour::Body(body.clone()));
    redirect(
        &env,
        "/to-blocked",
        302,
        env.url("blocked.test", "/target.bin").as_str(),
    );
    let r = resource("p", &env.url("origin.test", "/to-blocked"), &[], &body);
    let err = fetch(&env, &r).await.unwrap_err();
    let a = only_attempt(&err);
    assert_eq!(a.code(), "E_RESOURCE_POLICY", "{err}");
    assert!(a.to_string().contains("blocked.test"), "{a}");
    assert_eq!(env.origin.hits("/to-blocked"), 1);
    assert_eq!(env.origin.hits("/target.bin"), 0);
}

#[tokio::test]
async fn allowlist_mode_refuses_a_mirror_on_an_unlisted_host() {
    let env = Env::new().await;
    env.write_config("mode = \"allowlist\"\nhosts = [\"origin.test\"]");
    let body = bytes(100, 14);
    let mirror = env.url("mirror.test", "/good.bin");
    env.origin.route("/good.bin", Behaviour::Body(body.clone()));
    let r = resource(
        "a",
        &env.url("origin.test", "/missing.bin"),
        &[mirror],
        &body,
    );
    let err = fetch(&env, &r).await.unwrap_err();
    assert_eq!(
        codes(&err),
        ["E_RESOURCE_HTTP", "E_RESOURCE_POLICY"],
        "{err}"
    );
    assert!(attempts(&err)[1].to_string().contains("allowlist"), "{err}");
    assert_eq!(env.origin.hits("/missing.bin"), 1);
    assert_eq!(env.origin.hits("/good.bin"), 0);
}

#[tokio::test]
async fn a_redirect_to_a_local_address_is_refused() {
    let env = Env::new().await;
    let body = bytes(100, 15);
    // Only 127.0.0.1/32 is exempt in the test configuration.
    let target = format!("https://127.0.0.2:{}/x.bin", env.origin.port());
    redirect(&env, "/to-local", 302, &target);
    let r = resource("l", &env.url("origin.test", "/to-local"), &[], &body);
    let err = fetch(&env, &r).await.unwrap_err();
    let a = only_attempt(&err);
    assert_eq!(a.code(), "E_RESOURCE_ADDRESS", "{err}");
    assert!(a.to_string().contains("127.0.0.2"), "{a}");
}

#[tokio::test]
async fn when_every_address_fails_each_is_listed_with_its_own_code() {
    let env = Env::new().await;
    let body = bytes(500, 16);
    let port = env.origin.port();
    env.origin.route("/gone.bin", Behaviour::Status(404));
    let wrong = env.serve("/wrong.bin", &bytes(500, 17));
    let local = Url::parse(&format!("https://127.0.0.2:{port}/x.bin")).unwrap();
    let plain = Url::parse(&format!("http://origin.test:{port}/y.bin")).unwrap();
    let url = env.url("origin.test", "/gone.bin");
    let mirrors = [wrong, local, plain];
    let r = resource("all", &url, &mirrors, &body);
    let err = fetch(&env, &r).await.unwrap_err();
    assert_eq!(err.code(), "E_RESOURCE_UNAVAILABLE");
    assert_eq!(
        codes(&err),
        [
            "E_RESOURCE_HTTP",
            "E_RESOURCE_SHA256",
            "E_RESOURCE_ADDRESS",
            "E_RESOURCE_SCHEME"
        ]
    );
    let addresses: Vec<&Url> = attempts(&err).iter().map(|a| &a.address).collect();
    assert_eq!(addresses, [&url, &mirrors[0], &mirrors[1], &mirrors[2]]);
    let text = err.to_string();
    assert!(
        text.starts_with("resource \"all\": every address failed\n  - E_RESOURCE_HTTP: "),
        "{text}"
    );
    for a in attempts(&err) {
        assert!(text.contains(&format!("\n  - {a}")), "{text}");
    }
}

#[tokio::test]
async fn a_failed_download_leaves_nothing_in_the_store() {
    let env = Env::new().await;
    let body = bytes(200_000, 18);
    let wrong = env.serve("/wrong.bin", &bytes(200_000, 19));
    env.origin.route(
        "/short.bin",
        Behaviour::WrongLength {
            body: body[..100_000].to_vec(),
            content_length: 200_000,
        },
    );
    let r = resource("f", &wrong, &[env.url("mirror.test", "/short.bin")], &body);
    let err = fetch(&env, &r).await.unwrap_err();
    assert_eq!(
        codes(&err),
        ["E_RESOURCE_SHA256", "E_RESOURCE_SIZE"],
        "{err}"
    );
    let root = store_root(&env);
    assert!(root.join("tmp").is_dir());
    assert_eq!(files_under(&root.join("tmp")), Vec::<PathBuf>::new());
    assert_eq!(files_under(&root.join("blobs")), Vec::<PathBuf>::new());
}

#[tokio::test]
async fn a_verified_file_is_read_only() {
    let env = Env::new().await;
    let body = bytes(1000, 20);
    let url = env.serve("/ro.bin", &body);
    let path = fetch(&env, &resource("ro", &url, &[], &body))
        .await
        .unwrap();
    assert!(path.starts_with(store_root(&env).join("blobs")));
    let perms = std::fs::metadata(&path).unwrap().permissions();
    assert!(perms.readonly(), "{perms:?}");
    assert_eq!(
        files_under(&store_root(&env).join("tmp")),
        Vec::<PathBuf>::new()
    );
}

#[tokio::test]
async fn not_enough_disk_space_fails_without_touching_the_network() {
    let env = Env::new().await;
    let url = env.serve("/huge.bin", b"tiny");
    let mut r = resource("huge", &url, &[], b"tiny");
    r.size = 1 << 60;
    let err = fetch(&env, &r).await.unwrap_err();
    assert_eq!(err.code(), "E_RESOURCE_DISK_SPACE", "{err}");
    assert!(err.to_string().contains("\"huge\""), "{err}");
    assert_eq!(env.origin.total_hits(), 0);
    assert_eq!(
        files_under(&store_root(&env).join("tmp")),
        Vec::<PathBuf>::new()
    );
}

#[tokio::test]
async fn two_resources_with_the_same_digest_share_one_blob() {
    let env = Env::new().await;
    let body = bytes(3000, 21);
    let first = env.serve("/one/model.bin", &body);
    env.origin
        .route("/two/renamed.onnx", Behaviour::Body(body.clone()));
    let second = env.url("mirror.test", "/two/renamed.onnx");

    let p1 = fetch(&env, &resource("a", &first, &[], &body))
        .await
        .unwrap();
    let p2 = fetch(&env, &resource("b", &second, &[], &body))
        .await
        .unwrap();
    assert!(p1.ends_with("model.bin"), "{}", p1.display());
    assert!(p2.ends_with("renamed.onnx"), "{}", p2.display());
    assert_eq!(std::fs::read(&p2).unwrap(), body);
    assert_eq!(env.origin.hits("/one/model.bin"), 1);
    assert_eq!(env.origin.hits("/two/renamed.onnx"), 0);
    assert_eq!(p1.parent(), p2.parent());
    let store = Store::open(&env.store_dir()).unwrap();
    assert_eq!(store.blobs().unwrap(), [sha256_hex(&body)]);
    let id = |p: &PathBuf| files::file_id(&std::fs::metadata(p).unwrap());
    assert_eq!(id(&p1), id(&p2), "the second name is not the same file");
}

#[tokio::test]
async fn the_body_is_requested_without_content_encoding() {
    let env = Env::new().await;
    let body = bytes(100, 22);
    let url = env.serve("/ae.bin", &body);
    fetch(&env, &resource("ae", &url, &[], &body))
        .await
        .unwrap();
    let headers = env.origin.last_headers("/ae.bin").unwrap();
    let values: Vec<&str> = headers
        .iter()
        .filter(|(k, _)| k == "accept-encoding")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(values, ["identity"], "{headers:?}");
}

#[tokio::test]
async fn a_transient_failure_is_retried_on_the_same_address() {
    let env = Env::new().await;
    let body = bytes(100, 23);
    env.origin.route("/busy.bin", Behaviour::Status(503));
    let r = resource("t", &env.url("origin.test", "/busy.bin"), &[], &body);
    let retry = RetryPolicy {
        retries: 1,
        backoff: Duration::ZERO,
        ..RetryPolicy::default()
    };
    let err = fetch_with(&env, &r, retry).await.unwrap_err();
    assert_eq!(only_attempt(&err).code(), "E_RESOURCE_HTTP");
    assert_eq!(env.origin.hits("/busy.bin"), 2);
}

#[tokio::test]
async fn a_permanent_failure_is_not_retried() {
    let env = Env::new().await;
    let body = bytes(100, 24);
    env.origin.route("/busy.bin", Behaviour::Status(503));
    let retry = RetryPolicy {
        retries: 1,
        backoff: Duration::ZERO,
        ..RetryPolicy::default()
    };
    let r = resource("n", &env.url("origin.test", "/missing.bin"), &[], &body);
    let err = fetch_with(&env, &r, retry).await.unwrap_err();
    assert_eq!(only_attempt(&err).code(), "E_RESOURCE_HTTP");
    assert_eq!(env.origin.hits("/missing.bin"), 1);
    // The transient url is retried on itself, then the permanent mirror
    // is tried once.
    let mixed = resource(
        "n",
        &env.url("origin.test", "/busy.bin"),
        &[env.url("mirror.test", "/missing.bin")],
        &body,
    );
    let err = fetch_with(&env, &mixed, retry).await.unwrap_err();
    assert_eq!(codes(&err), ["E_RESOURCE_HTTP", "E_RESOURCE_HTTP"]);
    assert_eq!(env.origin.hits("/busy.bin"), 2);
    assert_eq!(env.origin.hits("/missing.bin"), 2);
}

#[tokio::test]
async fn a_redirect_to_an_address_with_credentials_is_refused() {
    let env = Env::new().await;
    let body = bytes(100, 30);
    env.origin
        .route("/secret.bin", Behaviour::Body(body.clone()));
    let target = env
        .url("origin.test", "/secret.bin")
        .as_str()
        .replace("https://", "https://user:pw@");
    redirect(&env, "/to-creds", 302, &target);
    let r = resource("c", &env.url("origin.test", "/to-creds"), &[], &body);
    let err = fetch(&env, &r).await.unwrap_err();
    let a = only_attempt(&err);
    assert_eq!(a.code(), "E_RESOURCE_SCHEME", "{err}");
    assert!(err.to_string().contains("user name or password"), "{err}");
    assert_eq!(env.origin.hits("/secret.bin"), 0);
}

#[tokio::test]
async fn a_host_with_an_empty_label_cannot_slip_past_the_blocklist() {
    let env = Env::new().await;
    env.write_config("mode = \"blocklist\"\nhosts = [\"blocked.test\"]");
    let body = bytes(100, 31);
    env.origin
        .route("/target.bin", Behaviour::Body(body.clone()));
    let port = env.origin.port();
    for (location, code) in [
        // Two trailing dots are a malformed name, refused before the policy.
        (
            format!("https://blocked.test..:{port}/target.bin"),
            "E_RESOURCE_ADDRESS",
        ),
        (
            format!("https://blocked.test.:{port}/target.bin"),
            "E_RESOURCE_POLICY",
        ),
        (
            format!("https://BLOCKED.test:{port}/target.bin"),
            "E_RESOURCE_POLICY",
        ),
    ] {
        redirect(&env, "/to-blocked", 302, &location);
        let r = resource("b", &env.url("origin.test", "/to-blocked"), &[], &body);
        let err = fetch(&env, &r).await.unwrap_err();
        assert_eq!(only_attempt(&err).code(), code, "{location}: {err}");
    }
    assert_eq!(env.origin.hits("/target.bin"), 0);
}

#[tokio::test]
async fn an_empty_or_unparsable_location_is_one_failure_with_a_short_reason() {
    let env = Env::new().await;
    let body = bytes(100, 32);
    let long = format!("https://[{}", "a".repeat(5000));
    for (path, location, says) in [
        ("/empty", String::new(), "Location is empty"),
        ("/blank", "   ".to_string(), "Location is empty"),
        ("/long", long, "invalid Location"),
    ] {
        redirect(&env, path, 302, &location);
        let r = resource("l", &env.url("origin.test", path), &[], &body);
        let err = fetch(&env, &r).await.unwrap_err();
        let a = only_attempt(&err);
        let reason = a.error.to_string();
        assert!(reason.contains(says), "{path}: {reason}");
        assert!(
            reason.chars().count() < 400,
            "{path}: {} chars",
            reason.len()
        );
        // Not a redirect to itself: one request.
        assert_eq!(env.origin.hits(path), 1, "{path}: {err}");
    }
}

/// Counts the retries of a download.
#[derive(Default)]
struct Retries(Vec<String>);

impl gem_resources::Reporter for Retries {
    fn bytes(&mut self, _total: u64) {}
    fn retrying(&mut self, _wait: Duration, _attempt: u32, _of: u32, reason: &str) {
        self.0.push(reason.to_string());
    }
}

#[tokio::test]
async fn a_certificate_that_fails_verification_or_a_name_that_does_not_exist_moves_on_at_once() {
    let env = Env::new().await;
    // unlisted.test reaches the origin, whose certificate does not name it;
    // gone.test has no address at all.
    let text = std::fs::read_to_string(env.dir.path().join("config.toml"))
        .unwrap()
        .replace(
            "resolve = { ",
            "resolve = { \"unlisted.test\" = [\"127.0.0.1\"], \"gone.test\" = [], ",
        );
    std::fs::write(env.dir.path().join("config.toml"), text).unwrap();
    let body = bytes(3_000, 25);
    let good = env.serve("/a.bin", &body);
    let r = resource(
        "a",
        &env.url("unlisted.test", "/a.bin"),
        &[env.url("gone.test", "/a.bin"), good],
        &body,
    );
    let retry = RetryPolicy {
        retries: 3,
        backoff: Duration::ZERO,
        ..RetryPolicy::default()
    };
    let config = env.config();
    let fetcher = gem_resources::Fetcher::new(&config).unwrap();
    let store = Store::open(&config.store_dir()).unwrap();
    let mut retries = Retries::default();
    let path = gem_resources::download(&fetcher, &store, &r, retry, &mut retries)
        .await
        .unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(retries.0, Vec::<String>::new(), "no address was retried");
    // The failed handshake and the download: one connection each.
    assert_eq!(env.origin.connections(), 2);
    // What each said, when every address fails.
    let bad = resource(
        "b",
        &env.url("unlisted.test", "/b.bin"),
        &[env.url("gone.test", "/b.bin")],
        &bytes(3_000, 26),
    );
    let err = fetch_with(&env, &bad, retry).await.unwrap_err();
    let text = err.to_string();
    assert_eq!(
        codes(&err),
        ["E_RESOURCE_NETWORK", "E_RESOURCE_NETWORK"],
        "{text}"
    );
    assert!(text.contains("it is not valid for unlisted.test"), "{text}");
    assert!(text.contains("DNS: no address for gone.test"), "{text}");
}

/// What the store held when the transfer was said over.
struct Handover {
    store: Store,
    sha256: String,
    bytes: u64,
    /// The bytes reported then, and whether the file was published then.
    said: Option<(u64, bool)>,
}

impl gem_resources::Reporter for Handover {
    fn bytes(&mut self, total: u64) {
        self.bytes = total;
    }
    fn transferred(&mut self) {
        self.said = Some((self.bytes, self.store.has(&self.sha256)));
    }
}

#[tokio::test]
async fn the_transfer_is_said_over_once_its_bytes_are_verified_before_the_file_is_published() {
    // The download slot goes to the next file at that moment, while this
    // one is flushed and named: said too late, the network waits on the
    // disk; said before the check, a file that fails it would hold no slot.
    let env = Env::new().await;
    let config = env.config();
    let fetcher = gem_resources::Fetcher::new(&config).unwrap();
    let store = Store::open(&config.store_dir()).unwrap();
    let body = bytes(300_000, 41);
    let r = resource("h", &env.serve("/h.bin", &body), &[], &body);
    let mut handover = Handover {
        store: store.clone(),
        sha256: r.sha256.clone(),
        bytes: 0,
        said: None,
    };
    let path = gem_resources::download(&fetcher, &store, &r, no_retry(), &mut handover)
        .await
        .unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(
        handover.said,
        Some((300_000, false)),
        "said once every byte was in, before the file was published"
    );
    // Bytes that fail their check: never said over.
    let declared = bytes(300_000, 42);
    let served = env.serve("/bad.bin", &bytes(300_000, 43));
    let bad = resource("bad", &served, &[], &declared);
    let mut handover = Handover {
        store: store.clone(),
        sha256: bad.sha256.clone(),
        bytes: 0,
        said: None,
    };
    let err = gem_resources::download(&fetcher, &store, &bad, no_retry(), &mut handover)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("SHA-256"), "{err}");
    assert_eq!(handover.said, None);
}
