//! Downloads through an HTTP `CONNECT` proxy: the address rule stays on
//! this side (the proxy is asked for vetted addresses, never names, unless
//! `proxy_resolves`), `NO_PROXY`, credentials kept out of every output, and
//! the reasons for the proxy's refusals.

use std::collections::BTreeMap;
use std::time::Duration;

use gem_resources::proxy::{ProxyConfig, ProxySettings};
use gem_resources::{Attempt, Error, Fetcher, RetryPolicy, Route};
use url::Url;

use crate::support::fetch_with as fetch;
use crate::support::proxy::{Answer, Proxy};
use crate::support::*;

/// A name whose (fixed) DNS answer is an internal-network address.
const PRIVATE_NAME: &str = "private.test";

/// Writes the test configuration with `network` lines (which must not
/// repeat the defaults set here) and `private.test` resolving to 10.0.0.5.
fn write_config(env: &Env, network: &str) {
    let dev = Env::dev_section().replace(
        "resolve = { ",
        &format!("resolve = {{ \"{PRIVATE_NAME}\" = [\"10.0.0.5\"], "),
    );
    let text = format!(
        "store = \"store\"\n[network]\nconnect_timeout_secs = 5\nstall_timeout_secs = 2\n{network}\n{dev}\n"
    );
    std::fs::write(env.dir.path().join("config.toml"), text).unwrap();
}

/// An origin, a proxy, and a configuration sending everything through it.
async fn setup(extra: &str) -> (Env, Proxy) {
    let env = Env::new().await;
    let proxy = Proxy::start().await;
    write_config(&env, &format!("proxy = \"{}\"\n{extra}", proxy.url()));
    (env, proxy)
}
fn retries(n: u32) -> RetryPolicy {
    RetryPolicy {
        retries: n,
        backoff: Duration::ZERO,
        ..RetryPolicy::default()
    }
}
fn attempts(e: &Error) -> &[Attempt] {
    match e {
        Error::Unavailable { attempts, .. } => attempts,
        other => panic!("expected E_RESOURCE_UNAVAILABLE, got {other}"),
    }
}

/// The origin's address as a `CONNECT` target.
fn vetted(env: &Env) -> String {
    format!("127.0.0.1:{}", env.origin.port())
}

#[tokio::test]
async fn downloads_through_the_proxy_connecting_only_to_vetted_addresses() {
    let (env, proxy) = setup("").await;
    let body = bytes(300_000, 1);
    let url = env.serve("/m.bin", &body);
    let path = fetch(&env, &resource("m", &url, &[], &body), retries(0))
        .await
        .unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(proxy.targets(), vec![vetted(&env)]);
    let headers = env.origin.last_headers("/m.bin").unwrap();
    let host = format!("origin.test:{}", env.origin.port());
    assert!(headers.contains(&("host".into(), host)), "{headers:?}");
    assert!(headers.contains(&("accept-encoding".into(), "identity".into())));
    assert!(headers
        .iter()
        .any(|(k, v)| k == "user-agent" && v.starts_with("gem-resources/")));
}

#[tokio::test]
async fn redirects_and_mirrors_go_through_the_proxy() {
    let (env, proxy) = setup("").await;
    let body = bytes(50_000, 2);
    env.origin.route("/gone.bin", Behaviour::Status(404));
    let moved = env.url("mirror.test", "/moved.bin");
    env.origin.route(
        "/redirect.bin",
        Behaviour::Redirect {
            status: 302,
            location: moved.to_string(),
        },
    );
    env.origin
        .route("/moved.bin", Behaviour::Body(body.clone()));
    let first = env.url("origin.test", "/gone.bin");
    let mirror = env.url("cdn.test", "/redirect.bin");
    let r = resource("r", &first, &[mirror], &body);
    let path = fetch(&env, &r, retries(0)).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(env.origin.hits("/gone.bin"), 1);
    assert_eq!(env.origin.hits("/moved.bin"), 1);
    // The 404, the mirror's redirect and the hop it pointed to: each its
    // own tunnel, each to the vetted address, never a name.
    assert_eq!(proxy.targets(), vec![vetted(&env); 3]);
}

#[tokio::test]
async fn a_name_with_a_private_dns_answer_is_refused_before_any_connect() {
    let (env, proxy) = setup("").await;
    let body = b"never sent";
    let url = env.url(PRIVATE_NAME, "/x.bin");
    let e = fetch(&env, &resource("p", &url, &[], body), retries(0))
        .await
        .unwrap_err();
    let a = &attempts(&e)[0];
    assert_eq!(a.code(), "E_RESOURCE_ADDRESS", "{e}");
    assert!(a.error.to_string().contains("10.0.0.5"), "{e}");
    // A redirect to it is refused the same way.
    env.origin.route(
        "/to-private",
        Behaviour::Redirect {
            status: 301,
            location: url.to_string(),
        },
    );
    let start = env.url("origin.test", "/to-private");
    let e = fetch(&env, &resource("q", &start, &[], body), retries(0))
        .await
        .unwrap_err();
    assert_eq!(attempts(&e)[0].code(), "E_RESOURCE_ADDRESS", "{e}");
    assert_eq!(proxy.targets(), vec![vetted(&env)], "only the first hop");
    let fetcher = Fetcher::new(&env.config()).unwrap();
    let refused = fetcher.route(&url).await.unwrap_err();
    assert_eq!(refused.code(), "E_RESOURCE_ADDRESS");
}

#[tokio::test]
async fn no_proxy_from_the_environment_bypasses_the_proxy() {
    let env = Env::new().await;
    let proxy = Proxy::start().await;
    write_config(&env, "proxy = \"env\"");
    let config = env.config();
    let vars: BTreeMap<String, String> = [
        ("HTTPS_PROXY".to_string(), proxy.url()),
        (
            "NO_PROXY".to_string(),
            "localhost, .origin.test".to_string(),
        ),
    ]
    .into();
    let settings = ProxySettings::from_vars(&config.network.proxy, false, &vars).unwrap();
    let fetcher = Fetcher::with_proxy(&config, settings).unwrap();
    let body = bytes(1000, 3);
    env.origin.route("/n.bin", Behaviour::Body(body.clone()));
    let direct = env.url("origin.test", "/n.bin");
    let t = fetcher.autofill(&direct, 1 << 20).await.unwrap();
    assert_eq!(t.sha256, sha256_hex(&body));
    assert!(proxy.targets().is_empty(), "{:?}", proxy.targets());
    assert_eq!(fetcher.route(&direct).await.unwrap(), Route::Direct);
    let via = env.url("mirror.test", "/n.bin");
    fetcher.autofill(&via, 1 << 20).await.unwrap();
    assert_eq!(proxy.targets(), vec![vetted(&env)]);
    // Without the variables, `env` connects directly.
    let none = ProxySettings::from_vars(&ProxyConfig::Env, false, &BTreeMap::new()).unwrap();
    let fetcher = Fetcher::with_proxy(&config, none).unwrap();
    fetcher.autofill(&via, 1 << 20).await.unwrap();
    assert_eq!(proxy.targets().len(), 1);
}

#[tokio::test]
async fn proxy_resolves_sends_the_name_but_keeps_the_name_checks() {
    let (env, proxy) = setup("proxy_resolves = true").await;
    let body = bytes(2000, 4);
    let url = env.serve("/r.bin", &body);
    let fetcher = Fetcher::new(&env.config()).unwrap();
    let t = fetcher.autofill(&url, 1 << 20).await.unwrap();
    assert_eq!(t.sha256, sha256_hex(&body));
    let named = format!("origin.test:{}", env.origin.port());
    assert_eq!(proxy.targets(), vec![named.clone()]);
    match fetcher.route(&url).await.unwrap() {
        Route::Proxy { connect, .. } => assert_eq!(connect, named),
        other => panic!("{other:?}"),
    }
    for refused in [
        "https://localhost/a",
        "https://db.localhost/a",
        "https://10.0.0.1/a",
        "https://192.168.1.1/a",
        "https://[::1]/a",
        "https://169.254.169.254/a",
    ] {
        let url = Url::parse(refused).unwrap();
        let e = fetcher.autofill(&url, 1 << 20).await.unwrap_err();
        assert_eq!(e.code(), "E_RESOURCE_ADDRESS", "{refused}: {e}");
    }
    assert_eq!(
        proxy.targets(),
        vec![named],
        "no CONNECT for a refused host"
    );
}

#[tokio::test]
async fn proxy_refusals_have_reasons_and_only_5xx_is_retried() {
    let (env, proxy) = setup("").await;
    let body = bytes(100, 5);
    let url = env.serve("/a.bin", &body);
    let r = resource("a", &url, &[], &body);
    let target = vetted(&env);
    for (status, words, tries) in [
        (407, "requires authentication", 1),
        (403, "refused to connect to", 1),
        (502, "did not open a tunnel", 2),
    ] {
        proxy.answer(Answer::Refuse(status));
        let before = proxy.targets().len();
        let e = fetch(&env, &r, retries(1)).await.unwrap_err();
        let a = &attempts(&e)[0];
        let reason = a.error.to_string();
        assert_eq!(a.code(), "E_RESOURCE_NETWORK", "{e}");
        assert!(reason.contains(words), "{status}: {reason}");
        assert!(
            reason.contains(&proxy.url()),
            "{status}: names the proxy: {reason}"
        );
        if status == 403 {
            assert!(reason.contains(&target), "{reason}");
        }
        assert_eq!(proxy.targets().len() - before, tries, "{status}");
    }
    assert_eq!(env.origin.hits("/a.bin"), 0);
}

#[tokio::test]
async fn an_unreachable_proxy_is_named_and_retried() {
    let env = Env::new().await;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    write_config(
        &env,
        &format!("proxy = \"http://bob:pa55w0rd@127.0.0.1:{port}\""),
    );
    let body = bytes(10, 6);
    let url = env.serve("/u.bin", &body);
    let e = fetch(&env, &resource("u", &url, &[], &body), retries(0))
        .await
        .unwrap_err();
    let a = &attempts(&e)[0];
    assert_eq!(a.code(), "E_RESOURCE_NETWORK");
    assert!(a.error.is_transient());
    let text = e.to_string();
    assert!(
        text.contains(&format!("cannot reach the proxy http://127.0.0.1:{port}")),
        "{text}"
    );
    assert!(
        !text.contains("pa55w0rd") && !text.contains("bob"),
        "{text}"
    );
}

/// Fails when `secret` shows up in the output or in any file of the store.
fn assert_hidden(env: &Env, secret: &str, outputs: &[&std::process::Output]) {
    for o in outputs {
        let all = format!("{}{}", stdout(o), stderr(o));
        assert!(!all.contains(secret), "{secret:?} in output:\n{all}");
    }
    for file in files_under(&env.store_dir()) {
        let text = String::from_utf8_lossy(&std::fs::read(&file).unwrap()).into_owned();
        assert!(!text.contains(secret), "{secret:?} in {}", file.display());
    }
}

#[tokio::test]
async fn credentials_are_sent_to_the_proxy_and_never_shown() {
    let env = Env::new().await;
    let proxy = Proxy::start().await;
    let (user, password) = ("alice-user", "s3cr3t-pw");
    proxy.require_basic(user, password);
    write_config(
        &env,
        &format!("proxy = \"{}\"", proxy.url_with(user, password)),
    );
    let body = bytes(4096, 7);
    let url = env.serve("/c.bin", &body);
    let manifest = env.write_manifest("ok.json", serde_json::json!([entry("c", &url, &body)]));
    let manifest = manifest.display().to_string();
    let fetched = env.run(&["fetch", &manifest]).await;
    assert!(fetched.status.success(), "{}", stderr(&fetched));
    let log = proxy.log();
    assert_eq!(log.len(), 1);
    assert_eq!(
        log[0].authorization.as_deref(),
        Some("Basic YWxpY2UtdXNlcjpzM2NyM3QtcHc=")
    );
    let checked = env.run(&["check-url", url.as_str()]).await;
    let checked_json = env.run(&["--json", "check-url", url.as_str()]).await;
    // Wrong credentials: a failure that is recorded and shown everywhere.
    proxy.require_basic(user, "another-password");
    let other = env.serve("/d.bin", &body[..100]);
    let entries = serde_json::json!([entry("d", &other, &body[..100])]);
    let manifest = env.write_manifest("bad.json", entries.clone());
    let manifest = manifest.display().to_string();
    let failed = env.run(&["fetch", &manifest]).await;
    let failed_json = env.run(&["--json", "fetch", &manifest]).await;
    assert!(!failed.status.success());
    assert!(
        stderr(&failed).contains("refused the credentials"),
        "{}",
        stderr(&failed)
    );
    let install = env.run(&["install", "g", &manifest]).await;
    let status = env.run(&["status"]).await;
    let status_json = env.run(&["--json", "status"]).await;
    let all = [
        &fetched,
        &checked,
        &checked_json,
        &failed,
        &failed_json,
        &install,
        &status,
        &status_json,
    ];
    // The password, the user, and both as the header sends them.
    for secret in [password, user, "YWxpY2UtdXNlcjpzM2NyM3QtcHc"] {
        assert_hidden(&env, secret, &all);
    }
    // The proxy is named, without its credentials.
    assert!(
        stdout(&checked).contains(&proxy.url()),
        "{}",
        stdout(&checked)
    );
}

#[tokio::test]
async fn check_url_says_whether_and_where_the_proxy_connects() {
    let (env, proxy) = setup("").await;
    let url = env.url("origin.test", "/x");
    let text = env.run(&["check-url", url.as_str()]).await;
    assert!(text.status.success(), "{}", stderr(&text));
    let expected = format!(
        "through the proxy {}: CONNECT {}",
        proxy.url(),
        vetted(&env)
    );
    assert!(stdout(&text).contains(&expected), "{}", stdout(&text));
    let json = env.run(&["--json", "check-url", url.as_str()]).await;
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(value["proxy"]["url"], proxy.url());
    assert_eq!(value["proxy"]["connect"], vetted(&env));
    assert_eq!(value["addresses"][0], "127.0.0.1");
    assert!(proxy.targets().is_empty(), "check-url connects to nothing");
    write_config(&env, "proxy = \"none\"");
    let direct = env.run(&["--json", "check-url", url.as_str()]).await;
    let value: serde_json::Value = serde_json::from_slice(&direct.stdout).unwrap();
    assert!(value["proxy"].is_null(), "{value}");
}

#[tokio::test]
async fn a_resume_through_the_proxy_asks_for_the_rest_with_if_range() {
    let (env, proxy) = setup("").await;
    let body = bytes(1_000_000, 7);
    let cut = body.len() / 2;
    env.origin.route(
        "/r.bin",
        Behaviour::Sequence(vec![
            // Silent after `cut` (the stall timeout here is 2 s): through
            // the proxy a reset would look like an early end.
            Behaviour::ranged_held(&body, "\"v1\"", cut),
            Behaviour::ranged(&body, "\"v1\""),
        ]),
    );
    let url = env.url("origin.test", "/r.bin");
    let path = fetch(&env, &resource("r", &url, &[], &body), retries(1))
        .await
        .unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(proxy.targets().len(), 2, "both requests through the proxy");
    let headers = env.origin.last_headers("/r.bin").unwrap();
    let get = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(get("if-range"), Some("\"v1\""), "{headers:?}");
    let from: usize = get("range")
        .and_then(|r| r.strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok())
        .expect("a Range");
    // All that arrived before the reset (a reset discards what a busy
    // client had not read yet).
    assert!(from > 0 && from <= cut, "resumed at {from} of {cut}");
    // Only the rest was sent the second time.
    assert_eq!(
        env.origin.served("/r.bin"),
        (cut + body.len() - from) as u64
    );
}

#[tokio::test]
async fn a_host_blocked_while_the_tunnel_is_set_up_gets_no_request() {
    let (env, _proxy) = setup("").await;
    let body = bytes(50_000, 9);
    let url = env.serve("/t.bin", &body);
    let gate = Gate::new();
    env.origin.hold_handshakes(&gate);
    let config = env.config();
    let fetcher = Fetcher::new(&config).unwrap();
    let store = gem_resources::Store::open(&config.store_dir()).unwrap();
    let task = {
        let (f, r) = (fetcher.clone(), resource("t", &url, &[], &body));
        tokio::spawn(async move {
            gem_resources::download(&f, &store, &r, retries(0), &mut |_| {}).await
        })
    };
    // The proxy opened the tunnel; the TLS handshake inside it waits.
    wait_until("the tunnel", || env.origin.connections() == 1).await;
    let blocked =
        gem_resources::Policy::new(gem_resources::Mode::Blocklist, &["origin.test".to_string()])
            .unwrap();
    fetcher.set_policy(blocked);
    gate.open();
    let err = within("the stop", task).await.unwrap().unwrap_err();
    assert_eq!(err.primary_cause(), "E_RESOURCE_POLICY", "{err}");
    assert_eq!(env.origin.hits("/t.bin"), 0, "no request after the change");
}

#[tokio::test]
async fn an_origin_reset_mid_body_through_the_proxy_keeps_the_bytes_and_resumes() {
    let (env, proxy) = setup("").await;
    let body = bytes(1_000_000, 10);
    let cut = 600_000;
    env.origin.route(
        "/x.bin",
        Behaviour::Sequence(vec![
            // The origin resets; the proxy can only close its side of the
            // tunnel, so the client sees the TLS stream end without
            // close_notify, not a reset.
            Behaviour::ranged_cut(&body, "\"v1\"", cut),
            Behaviour::ranged(&body, "\"v1\""),
        ]),
    );
    let url = env.url("origin.test", "/x.bin");
    let path = fetch(&env, &resource("x", &url, &[], &body), retries(1))
        .await
        .expect("the cut is a network failure, retried");
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(proxy.targets().len(), 2, "both requests through the proxy");
    let headers = env.origin.last_headers("/x.bin").unwrap();
    let range = headers.iter().find(|(k, _)| k == "range").map(|(_, v)| v);
    let from: usize = range
        .and_then(|r| r.strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok())
        .unwrap_or_else(|| panic!("the retry continues the kept bytes: {headers:?}"));
    assert!(from > 0 && from <= cut, "{from}");
    assert!(headers.contains(&("if-range".into(), "\"v1\"".into())));
}

#[tokio::test]
async fn an_untrusted_certificate_through_the_proxy_is_said_in_words() {
    let (env, _proxy) = setup("retries = 0").await;
    let url = env.serve("/a.bin", b"x");
    // Trust only a certificate of another name: the handshake through the
    // tunnel finds no issuer.
    let stranger = Origin::start_self_signed().await;
    std::fs::write(env.dir.path().join("ca.pem"), stranger.ca_pem()).unwrap();
    let out = env.run(&["autofill", url.as_str()]).await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("TLS: the server's certificate is not trusted: ")
            && err.contains("`[dev] extra_root_certs`"),
        "{err}"
    );
    assert!(!err.contains("UnknownIssuer"), "{err}");
    assert_eq!(env.origin.hits("/a.bin"), 0);
}
