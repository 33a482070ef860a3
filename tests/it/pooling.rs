//! Connections kept open between the files of one fetcher, TLS sessions
//! resumed, and neither trusted past a policy change: the origin counts its
//! TCP connections and TLS handshakes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::future::Future;
use std::pin::Pin;

use gem_resources::policy::{Mode, Policy};
use gem_resources::resolve::{LookupResult, SystemLookup};
use gem_resources::{download, Event, Fetcher, Resources, Store};
use serde_json::json;

use crate::support::*;

fn policy(mode: Mode, hosts: &[&str]) -> Policy {
    let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
    Policy::new(mode, &hosts).unwrap()
}

/// One fetcher and store for the env, as one run of `fetch` or the service
/// has.
fn fetcher_and_store(env: &Env) -> (Fetcher, Store) {
    let config = env.config();
    let fetcher = Fetcher::new(&config).unwrap();
    let store = Store::open(&config.store_dir()).unwrap();
    (fetcher, store)
}

/// Serves `count` small files on origin.test and returns their resources.
fn small_files(env: &Env, count: usize, seed: u8) -> Vec<(gem_resources::Resource, Vec<u8>)> {
    (0..count)
        .map(|i| {
            let body = bytes(20_000 + i * 1000, seed.wrapping_add(i as u8));
            let url = env.serve(&format!("/small-{seed}-{i}.bin"), &body);
            (resource(&format!("f{i}"), &url, &[], &body), body)
        })
        .collect()
}

#[tokio::test]
async fn the_files_of_one_fetcher_from_one_host_share_one_tls_connection() {
    let env = Env::new().await;
    env.origin.keep_alive();
    let files = small_files(&env, 4, 140);
    let (fetcher, store) = fetcher_and_store(&env);
    for (r, body) in &files {
        let path = within(
            "a download",
            download(&fetcher, &store, r, no_retry(), &mut |_| {}),
        )
        .await
        .unwrap();
        assert_eq!(std::fs::read(path).unwrap(), *body);
    }
    assert_eq!(env.origin.total_hits(), 4);
    assert_eq!(
        env.origin.connections(),
        1,
        "one TCP connection for 4 files"
    );
    assert_eq!(env.origin.handshakes(), 1, "one TLS handshake for 4 files");
}

#[tokio::test]
async fn the_service_reuses_a_connection_across_gems_and_a_request_on_it_is_a_start() {
    let env = Env::new().await;
    env.origin.keep_alive();
    let (a, b) = (bytes(30_000, 145), bytes(40_000, 146));
    let ua = env.serve("/a.bin", &a);
    // The second file is not there: its download fails once connected.
    env.origin.route("/b.bin", Behaviour::Status(404));
    let ub = env.url("origin.test", "/b.bin");
    let service = Resources::open(&env.config()).unwrap();
    let mut events = service.subscribe();
    for (gem, id, url, body) in [("g1", "a", &ua, &a), ("g2", "b", &ub, &b)] {
        let entries = json!([required_entry(id, url, body)]);
        service.install(gem, &manifest(entries)).await.unwrap();
        within("the download", service.wait_idle()).await;
    }
    assert_eq!(stored_files(&env, &a).len(), 1);
    assert_eq!(env.origin.hits("/b.bin"), 1);
    assert_eq!(
        env.origin.connections(),
        1,
        "the second gem's file reused it"
    );
    let mut started = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let Event::Started { resource, .. } = event {
            started.push(resource);
        }
    }
    assert_eq!(
        started,
        ["a", "b"],
        "a request on a kept connection is a start"
    );
    service.shutdown().await;
}

#[tokio::test]
async fn a_new_connection_to_a_host_seen_before_resumes_its_tls_session() {
    // The origin closes every connection: each file needs a new one.
    let env = Env::new().await;
    let files = small_files(&env, 3, 150);
    let (fetcher, store) = fetcher_and_store(&env);
    let (first, _) = &files[0];
    download(&fetcher, &store, first, no_retry(), &mut |_| {})
        .await
        .unwrap();
    assert_eq!(env.origin.resumed_handshakes(), 0);
    let (second, _) = &files[1];
    download(&fetcher, &store, second, no_retry(), &mut |_| {})
        .await
        .unwrap();
    assert_eq!(env.origin.handshakes(), 2);
    assert_eq!(env.origin.resumed_handshakes(), 1, "the second one resumed");
    // A policy change drops the kept connections, not the TLS sessions.
    fetcher.set_policy(policy(Mode::Blocklist, &["other.test"]));
    let (third, _) = &files[2];
    download(&fetcher, &store, third, no_retry(), &mut |_| {})
        .await
        .unwrap();
    assert_eq!(env.origin.handshakes(), 3);
    assert_eq!(
        env.origin.resumed_handshakes(),
        2,
        "resumed after the change"
    );
}

/// Downloads two small files from `env`'s origin (which closes every
/// connection) with one fetcher, and says whether the second handshake
/// resumed the first one's session.
async fn second_handshake_resumes(env: &Env) -> bool {
    let files = small_files(env, 2, 155);
    let (fetcher, store) = fetcher_and_store(env);
    for (r, _) in &files {
        download(&fetcher, &store, r, no_retry(), &mut |_| {})
            .await
            .unwrap();
    }
    assert_eq!(env.origin.handshakes(), 2);
    env.origin.resumed_handshakes() == 1
}

#[tokio::test]
async fn a_pinned_dev_certificate_and_a_proxy_tunnel_resume_sessions_too() {
    // A self-signed certificate listed in `[dev] extra_root_certs`: the
    // pinned path of the verifier.
    let origin = Origin::start_self_signed().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.pem"), origin.ca_pem()).unwrap();
    let pinned = Env { origin, dir };
    pinned.write_config("");
    assert!(second_handshake_resumes(&pinned).await, "pinned");
    // Through a proxy, each request has its own tunnel; its TLS session
    // is resumed.
    let env = Env::new().await;
    let proxy = crate::support::proxy::Proxy::start().await;
    env.write_config(&format!("proxy = \"{}\"", proxy.url()));
    assert!(second_handshake_resumes(&env).await, "tunnelled");
    assert_eq!(proxy.targets().len(), 2);
}

#[tokio::test]
async fn a_kept_connection_carries_no_request_after_a_policy_change() {
    let env = Env::new().await;
    env.origin.keep_alive();
    let files = small_files(&env, 3, 160);
    let (fetcher, store) = fetcher_and_store(&env);
    let (a, _) = &files[0];
    download(&fetcher, &store, a, no_retry(), &mut |_| {})
        .await
        .unwrap();
    assert_eq!(env.origin.connections(), 1);
    // A change that still permits the host: the next file goes on a new
    // connection, vetted under the new policy.
    fetcher.set_policy(policy(Mode::Blocklist, &["other.test"]));
    let (b, _) = &files[1];
    download(&fetcher, &store, b, no_retry(), &mut |_| {})
        .await
        .unwrap();
    assert_eq!(
        env.origin.connections(),
        2,
        "not the connection kept before"
    );
    // A change that blocks it: the policy is checked for every request.
    fetcher.set_policy(policy(Mode::Blocklist, &["127.0.0.1"]));
    let (c, _) = &files[2];
    let err = download(&fetcher, &store, c, no_retry(), &mut |_| {})
        .await
        .unwrap_err();
    assert_eq!(err.primary_cause(), "E_RESOURCE_POLICY", "{err}");
    assert_eq!(env.origin.total_hits(), 2, "no request after the change");
    assert_eq!(env.origin.connections(), 2);
}

/// Answers every name with what it holds now.
struct Moving(std::sync::Mutex<Vec<std::net::IpAddr>>);

impl Moving {
    fn answer(&self, ip: &str) {
        *self.0.lock().unwrap() = vec![ip.parse().unwrap()];
    }
}

impl SystemLookup for Moving {
    fn lookup<'a>(
        &'a self,
        _name: &'a str,
    ) -> Pin<Box<dyn Future<Output = LookupResult> + Send + 'a>> {
        let answers = self.0.lock().unwrap().clone();
        Box::pin(async move { Ok(answers) })
    }
}

#[tokio::test]
async fn a_kept_connection_carries_no_request_once_its_name_resolves_elsewhere() {
    let env = Env::new().await;
    env.origin.keep_alive();
    // 127.0.0.2 passes the guard too; nothing listens there.
    let dev = Env::dev_section().replace("127.0.0.1/32", "127.0.0.0/30");
    let text =
        format!("store = \"store\"\n[network]\nconnect_timeout_secs = 5\nretries = 0\n{dev}\n");
    std::fs::write(env.dir.path().join("config.toml"), text).unwrap();
    // Not a name of `[dev] resolve`: it goes to the lookup.
    let host = "moving.origin.test";
    let moving = Arc::new(Moving(std::sync::Mutex::new(Vec::new())));
    moving.answer("127.0.0.1");
    let config = env.config();
    let fetcher = Fetcher::new(&config)
        .unwrap()
        .with_system_lookup(moving.clone())
        .unwrap();
    let store = Store::open(&config.store_dir()).unwrap();
    let files: Vec<_> = (0..3)
        .map(|i| {
            let body = bytes(20_000, 180 + i);
            let path = format!("/moving-{i}.bin");
            env.origin.route(&path, Behaviour::Body(body.clone()));
            (resource("m", &env.url(host, &path), &[], &body), body)
        })
        .collect();
    download(&fetcher, &store, &files[0].0, no_retry(), &mut |_| {})
        .await
        .unwrap();
    assert_eq!(env.origin.connections(), 1);
    // The name moves: the connection kept to its old address is not used.
    moving.answer("127.0.0.2");
    let err = within(
        "the try elsewhere",
        download(&fetcher, &store, &files[1].0, no_retry(), &mut |_| {}),
    )
    .await
    .unwrap_err();
    assert_eq!(err.primary_cause(), "E_RESOURCE_NETWORK", "{err}");
    assert_eq!(
        env.origin.total_hits(),
        1,
        "nothing went to the old address"
    );
    // Back where the origin is: a new connection.
    moving.answer("127.0.0.1");
    download(&fetcher, &store, &files[2].0, no_retry(), &mut |_| {})
        .await
        .unwrap();
    assert_eq!(env.origin.connections(), 2);
    assert_eq!(env.origin.total_hits(), 2);
}

/// Downloads a slow file by name (origin.test, which resolves to 127.0.0.1
/// through `[dev] resolve`) with the env's configuration, blocks
/// 127.0.0.1 once bytes arrive, and checks that the transfer stops with
/// the policy failure and asks nothing more.
async fn blocking_the_dialled_address_stops(env: &Env) {
    // 2 MB at about 200 KB/s: ten seconds unless it is stopped.
    let body = bytes(2_000_000, 170);
    env.origin.route(
        "/slow.bin",
        Behaviour::Slow {
            body: body.clone(),
            chunk: 10_240,
            delay: Duration::from_millis(50),
        },
    );
    let url = env.url("origin.test", "/slow.bin");
    let (fetcher, store) = fetcher_and_store(env);
    let seen = Arc::new(AtomicU64::new(0));
    let task = {
        let (f, seen) = (fetcher.clone(), seen.clone());
        let r = resource("s", &url, &[], &body);
        tokio::spawn(async move {
            let mut progress = |n: u64| seen.store(n, Ordering::Relaxed);
            download(&f, &store, &r, no_retry(), &mut progress).await
        })
    };
    wait_until("bytes arriving", || seen.load(Ordering::Relaxed) > 50_000).await;
    fetcher.set_policy(policy(Mode::Blocklist, &["127.0.0.1"]));
    let err = within("the stop", task).await.unwrap().unwrap_err();
    assert_eq!(err.primary_cause(), "E_RESOURCE_POLICY", "{err}");
    let text = err.to_string();
    assert!(
        text.contains("origin.test (connected to 127.0.0.1)"),
        "{text}"
    );
    assert_eq!(env.origin.hits("/slow.bin"), 1, "no further request");
    assert!(stored_files(env, &body).is_empty());
}

#[tokio::test]
async fn a_transfer_from_an_address_blocked_while_it_runs_stops_though_its_url_names_a_host() {
    let env = Env::new().await;
    blocking_the_dialled_address_stops(&env).await;
}

#[tokio::test]
async fn through_a_proxy_too_a_transfer_from_an_address_blocked_while_it_runs_stops() {
    let env = Env::new().await;
    let proxy = crate::support::proxy::Proxy::start().await;
    env.write_config(&format!("proxy = \"{}\"", proxy.url()));
    blocking_the_dialled_address_stops(&env).await;
    let target = format!("127.0.0.1:{}", env.origin.port());
    assert_eq!(proxy.targets(), [target], "the tunnel went to the address");
}
