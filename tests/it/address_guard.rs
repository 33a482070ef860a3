//! The address rules (scheme, policy, local addresses) through
//! `gem-resources check-url` and `Fetcher::check_url`, with the local-address
//! exemption off unless a test says otherwise.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use gem_resources::{download, Config, Fetcher, Resource, RetryPolicy, Store};
use url::Url;

use crate::support::*;

/// Writes `config.toml` with `network` lines and a `[dev]` section holding
/// only `resolve` (as TOML inline-table entries): no address is exempt.
fn write_config_without_exemption(env: &Env, network: &str, resolve: &str) -> PathBuf {
    let path = env.dir.path().join("config.toml");
    let text = format!(
        "store = \"store\"\n[network]\nconnect_timeout_secs = 5\nstall_timeout_secs = 30\nretries = 0\n{network}\n[dev]\nextra_root_certs = [\"ca.pem\"]\nresolve = {{ {resolve} }}\n"
    );
    std::fs::write(&path, text).unwrap();
    assert!(env.config().dev.allow_addresses.is_empty());
    path
}

/// Writes the usual test configuration (127.0.0.1/32 exempt) with `extra`
/// entries added to `[dev] resolve`.
fn write_config_with_resolve(env: &Env, network: &str, extra: &str) -> PathBuf {
    let dev = Env::dev_section().replace("resolve = { ", &format!("resolve = {{ {extra}, "));
    let path = env.dir.path().join("config.toml");
    let text = format!(
        "store = \"store\"\n[network]\nconnect_timeout_secs = 5\nstall_timeout_secs = 30\nretries = 0\n{network}\n{dev}\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn fetcher(config: &Config) -> Fetcher {
    Fetcher::new(config).unwrap()
}

/// Asserts that both the binary and the library refuse `url` with `code`.
async fn assert_refused(env: &Env, fetcher: &Fetcher, url: &str, code: &str) {
    let parsed = Url::parse(url).unwrap();
    match fetcher.check_url(&parsed).await {
        Ok(ips) => panic!("{url}: allowed by check_url ({ips:?}), expected {code}"),
        Err(e) => assert_eq!(e.code(), code, "{url}: {e}"),
    }
    let out = env.run(&["check-url", url]).await;
    assert_eq!(out.status.code(), Some(1), "{url}: {}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("refused: {code}: ")),
        "{url}: expected {code}, got {err}"
    );
}

/// Asserts that both the binary and the library allow `url`, returning the
/// addresses a transfer would use.
async fn assert_allowed(env: &Env, fetcher: &Fetcher, url: &str) -> Vec<IpAddr> {
    let parsed = Url::parse(url).unwrap();
    let ips = match fetcher.check_url(&parsed).await {
        Ok(ips) => ips,
        Err(e) => panic!("{url}: refused by check_url: {e}"),
    };
    let out = env.run(&["check-url", url]).await;
    assert_eq!(out.status.code(), Some(0), "{url}: {}", stderr(&out));
    assert!(stdout(&out).starts_with("allowed: "), "{}", stdout(&out));
    ips
}

#[tokio::test]
async fn local_and_internal_addresses_are_refused_in_every_spelling() {
    let env = Env::new().await;
    write_config_without_exemption(
        &env,
        "",
        "\"lan.test\" = [\"192.168.1.1\"], \"loop.test\" = [\"127.0.0.1\", \"::1\"]",
    );
    let f = fetcher(&env.config());
    let refused = [
        "https://localhost/",
        "https://LocalHost./",
        "https://api.localhost/",
        "https://127.0.0.1/",
        "https://127.1/",
        "https://0x7f000001/",
        "https://2130706433/",
        "https://0177.0.0.1/",
        "https://[::1]/",
        "https://[::ffff:127.0.0.1]/",
        "https://[::ffff:7f00:1]/",
        "https://[::127.0.0.1]/",
        "https://[64:ff9b::7f00:1]/",
        "https://[2002:7f00:1::]/",
        "https://10.0.0.1/",
        "https://172.16.5.4/",
        "https://192.168.0.1/",
        "https://169.254.169.254/latest/meta-data/",
        "https://[fe80::1]/",
        "https://[fd00::1]/",
        "https://0.0.0.0/",
        "https://[::]/",
        "https://100.64.0.1/",
        "https://255.255.255.255/",
        "https://224.0.0.1/",
        "https://192.0.2.1/",
        "https://[2001:db8::1]/",
        // Names mapped by `[dev] resolve` skip the by-name rule only; their
        // answers still go through the guard.
        "https://lan.test/",
        "https://loop.test/",
    ];
    for url in refused {
        assert_refused(&env, &f, url, "E_RESOURCE_ADDRESS").await;
    }
}

#[tokio::test]
async fn global_addresses_are_allowed_with_the_exemption_off() {
    // The counterpart of the table above: the guard is not refusing all.
    let env = Env::new().await;
    write_config_without_exemption(&env, "", "\"public.test\" = [\"93.184.215.14\"]");
    let f = fetcher(&env.config());
    assert_eq!(
        assert_allowed(&env, &f, "https://1.1.1.1/").await,
        ["1.1.1.1".parse::<IpAddr>().unwrap()]
    );
    assert_allowed(&env, &f, "https://[2606:4700:4700::1111]/").await;
    assert_allowed(&env, &f, "https://172.32.0.1/").await;
    assert_eq!(
        assert_allowed(&env, &f, "https://public.test/a.bin").await,
        ["93.184.215.14".parse::<IpAddr>().unwrap()]
    );
}

#[tokio::test]
async fn only_https_addresses_are_allowed() {
    let env = Env::new().await;
    write_config_without_exemption(&env, "", "\"public.test\" = [\"93.184.215.14\"]");
    let f = fetcher(&env.config());
    for url in [
        "http://example.com/",
        "http://public.test/",
        "ftp://public.test/a",
    ] {
        assert_refused(&env, &f, url, "E_RESOURCE_SCHEME").await;
    }
}

#[tokio::test]
async fn blocklisted_hosts_are_refused_by_policy() {
    let env = Env::new().await;
    write_config_without_exemption(
        &env,
        "mode = \"blocklist\"\nhosts = [\"blocked.test\", \"*.example.org\", \"203.0.113.7\"]",
        "\"blocked.test\" = [\"93.184.215.14\"], \"ok.example.org\" = [\"93.184.215.14\"], \"example.org\" = [\"93.184.215.14\"]",
    );
    let f = fetcher(&env.config());
    for url in [
        "https://blocked.test/",
        "https://BLOCKED.test./a",
        "https://ok.example.org/",
        "https://deep.ok.example.org/",
    ] {
        assert_refused(&env, &f, url, "E_RESOURCE_POLICY").await;
    }
    // `*.example.org` covers subdomains only.
    assert_allowed(&env, &f, "https://example.org/").await;
}

#[tokio::test]
async fn allowlist_mode_refuses_every_unlisted_host() {
    let env = Env::new().await;
    write_config_without_exemption(
        &env,
        "mode = \"allowlist\"\nhosts = [\"cdn.test\"]",
        "\"cdn.test\" = [\"93.184.215.14\"], \"other.test\" = [\"93.184.215.14\"]",
    );
    let f = fetcher(&env.config());
    assert_allowed(&env, &f, "https://cdn.test/a.bin").await;
    assert_allowed(&env, &f, "https://CDN.test./a.bin").await;
    for url in [
        "https://other.test/a.bin",
        "https://a.cdn.test/",
        "https://1.1.1.1/",
    ] {
        assert_refused(&env, &f, url, "E_RESOURCE_POLICY").await;
    }
}

#[tokio::test]
async fn a_name_with_private_and_exempt_answers_keeps_only_the_exempt_one() {
    let env = Env::new().await;
    write_config_with_resolve(&env, "", "\"mixed.test\" = [\"10.0.0.1\", \"127.0.0.1\"]");
    let f = fetcher(&env.config());
    let ips = assert_allowed(&env, &f, "https://mixed.test/").await;
    assert_eq!(ips, ["127.0.0.1".parse::<IpAddr>().unwrap()]);
    let out = env
        .run(&["--json", "check-url", "https://mixed.test/"])
        .await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["allowed"], true, "{v}");
    assert_eq!(v["addresses"], serde_json::json!(["127.0.0.1"]), "{v}");
}

#[tokio::test]
async fn the_exemption_covers_exactly_its_range() {
    // The test configuration exempts 127.0.0.1/32 only.
    let env = Env::new().await;
    let f = fetcher(&env.config());
    assert_allowed(&env, &f, "https://127.0.0.1/").await;
    for url in [
        "https://127.0.0.2/",
        "https://127.0.1.1/",
        "https://[::1]/",
        "https://10.0.0.1/",
        "https://localhost/",
    ] {
        assert_refused(&env, &f, url, "E_RESOURCE_ADDRESS").await;
    }
}

#[tokio::test]
async fn check_url_reports_a_refusal_as_json() {
    let env = Env::new().await;
    write_config_without_exemption(&env, "", "");
    let out = env
        .run(&["--json", "check-url", "https://169.254.169.254/"])
        .await;
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["allowed"], false, "{v}");
    assert_eq!(v["code"], "E_RESOURCE_ADDRESS", "{v}");
    assert_eq!(v["address"], "https://169.254.169.254/", "{v}");
    // The same shape as every other error: `message`, `primary_cause`.
    assert!(v["message"].as_str().unwrap().contains("link-local"), "{v}");
    assert_eq!(v["primary_cause"], "E_RESOURCE_ADDRESS", "{v}");
    assert!(v.get("reason").is_none(), "{v}");
}

#[tokio::test]
async fn check_url_connects_to_nothing() {
    let env = Env::new().await;
    env.origin.route("/a.bin", Behaviour::Body(b"x".to_vec()));
    let out = env
        .run(&["check-url", env.url("origin.test", "/a.bin").as_str()])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(env.origin.total_hits(), 0);
}

#[tokio::test]
async fn the_resolver_used_for_connecting_filters_answers() {
    // `0.0.0.0` reaches the origin's 127.0.0.1 listener on this system, and
    // the certificate covers `*.origin.test`: were the answer not filtered
    // where connections are made, the request would arrive.
    let env = Env::new().await;
    write_config_with_resolve(&env, "", "\"rebind.origin.test\" = [\"0.0.0.0\"]");
    let body = bytes(100, 1);
    env.origin.route("/r.bin", Behaviour::Body(body.clone()));
    let url = env.url("rebind.origin.test", "/r.bin");
    let config = env.config();
    let f = fetcher(&config);
    // The name itself passes the by-name rule: only its answer is refused.
    f.check_hop(&url).unwrap();
    let resource = Resource {
        id: "rebind".into(),
        url: url.clone(),
        mirrors: vec![],
        sha256: sha256_hex(&body),
        size: body.len() as u64,
        required: false,
        description: None,
    };
    let store = Store::open(&config.store_dir()).unwrap();
    let retry = RetryPolicy {
        retries: 0,
        backoff: Duration::ZERO,
        ..RetryPolicy::default()
    };
    let err = download(&f, &store, &resource, retry, &mut |_| {})
        .await
        .unwrap_err();
    assert_eq!(err.primary_cause(), "E_RESOURCE_ADDRESS", "{err}");
    assert!(err.to_string().contains("0.0.0.0"), "{err}");
    assert_eq!(env.origin.total_hits(), 0);

    // Control: once 0.0.0.0 is exempt, the same download reaches the origin.
    let dev = Env::dev_section()
        .replace(
            "resolve = { ",
            "resolve = { \"rebind.origin.test\" = [\"0.0.0.0\"], ",
        )
        .replace("[\"127.0.0.1/32\"]", "[\"127.0.0.1/32\", \"0.0.0.0/32\"]");
    std::fs::write(
        env.dir.path().join("config.toml"),
        format!("store = \"store\"\n[network]\nstall_timeout_secs = 30\n{dev}"),
    )
    .unwrap();
    let f = fetcher(&env.config());
    let path = download(&f, &store, &resource, retry, &mut |_| {})
        .await
        .unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(env.origin.hits("/r.bin"), 1);
}

#[tokio::test]
async fn a_dev_answer_to_a_private_address_is_refused_for_downloads() {
    let env = Env::new().await;
    write_config_with_resolve(&env, "", "\"private.test\" = [\"10.0.0.1\"]");
    let body = bytes(100, 2);
    env.origin.route("/p.bin", Behaviour::Body(body.clone()));
    let url = env.url("private.test", "/p.bin");
    let manifest = env.write_manifest("m.json", serde_json::json!([entry("p", &url, &body)]));
    let out = env.run(&["fetch", manifest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("E_RESOURCE_ADDRESS"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("10.0.0.1"), "{}", stderr(&out));
    assert_eq!(env.origin.total_hits(), 0);
}

#[tokio::test]
async fn an_exemption_covering_public_addresses_needs_its_own_key() {
    let env = Env::new().await;
    let url = env.serve("/a.bin", b"x");
    let path = env.dir.path().join("config.toml");
    let usual = std::fs::read_to_string(&path).unwrap();
    let wide = usual.replace("\"127.0.0.1/32\"", "\"0.0.0.0/0\", \"::/0\"");
    std::fs::write(&path, &wide).unwrap();
    let out = env.run(&["check-url", url.as_str()]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.starts_with("E_RESOURCE_CONFIG: "), "{err}");
    for part in [
        "config.toml",
        "dev.allow_addresses: 0.0.0.0/0 covers public addresses",
        "allow_public_addresses = true",
    ] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
    assert_eq!(env.origin.hits("/a.bin"), 0);
    // Confirmed, the same ranges are taken.
    let confirmed = wide.replace("[dev]\n", "[dev]\nallow_public_addresses = true\n");
    std::fs::write(&path, confirmed).unwrap();
    let out = env.run(&["check-url", url.as_str()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        env.config().active_dev_keys(),
        vec![
            "extra_root_certs",
            "resolve",
            "allow_addresses",
            "allow_public_addresses"
        ]
    );
}

#[tokio::test]
async fn a_blocklisted_address_is_refused_when_a_name_resolves_to_it() {
    let env = Env::new().await;
    write_config_without_exemption(
        &env,
        "mode = \"blocklist\"\nhosts = [\"8.8.8.8\"]",
        "\"named.test\" = [\"8.8.8.8\"], \"mapped.test\" = [\"::ffff:8.8.8.8\"], \"two.test\" = [\"8.8.8.8\", \"93.184.215.14\"], \"elsewhere.test\" = [\"93.184.215.14\"]",
    );
    let f = fetcher(&env.config());
    assert_refused(&env, &f, "https://8.8.8.8/a.bin", "E_RESOURCE_POLICY").await;
    assert_refused(&env, &f, "https://named.test/a.bin", "E_RESOURCE_POLICY").await;
    assert_refused(&env, &f, "https://mapped.test/a.bin", "E_RESOURCE_POLICY").await;
    let e = f
        .check_url(&Url::parse("https://named.test/").unwrap())
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("named.test (resolves to 8.8.8.8)"),
        "{e}"
    );
    // Only the addresses the policy permits are dialled.
    let ips = assert_allowed(&env, &f, "https://two.test/a.bin").await;
    assert_eq!(ips, ["93.184.215.14".parse::<IpAddr>().unwrap()]);
    assert_allowed(&env, &f, "https://elsewhere.test/a.bin").await;
}

#[tokio::test]
async fn a_download_never_dials_an_address_the_blocklist_names() {
    let env = Env::new().await;
    env.write_config("mode = \"blocklist\"\nhosts = [\"127.0.0.1\"]");
    let body = bytes(2_000, 3);
    let url = env.serve("/a.bin", &body);
    let out = env.run(&["autofill", url.as_str()]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("E_RESOURCE_POLICY"), "{err}");
    assert!(err.contains("origin.test (resolves to 127.0.0.1)"), "{err}");
    assert_eq!(env.origin.hits("/a.bin"), 0);
}
