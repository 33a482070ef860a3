//! `NO_PROXY` as the fetcher applies it to a hop: with an explicit proxy
//! URL too, and `host:port` entries on the url's own port.

use std::collections::BTreeMap;

use gem_resources::proxy::{ProxyConfig, ProxySettings, ProxyUrl};
use gem_resources::{Config, Fetcher, Route};

use crate::support::*;

/// The route a hop to `url` takes with `proxy = <config>` and this
/// `NO_PROXY`; connects to nothing.
async fn route(config: &Config, proxy: &ProxyConfig, no_proxy: &str, url: &url::Url) -> Route {
    let vars: BTreeMap<String, String> = [
        ("HTTPS_PROXY".to_string(), "http://127.0.0.1:9".to_string()),
        ("NO_PROXY".to_string(), no_proxy.to_string()),
    ]
    .into();
    let settings = ProxySettings::from_vars(proxy, false, &vars).unwrap();
    Fetcher::with_proxy(config, settings)
        .unwrap()
        .route(url)
        .await
        .unwrap()
}

#[tokio::test]
async fn no_proxy_entries_with_a_port_match_the_hops_port_with_either_proxy_setting() {
    let env = Env::new().await;
    let config = env.config();
    let url = env.url("a.origin.test", "/x.bin");
    let port = url.port().unwrap();
    let explicit = ProxyConfig::Url(ProxyUrl::parse("http://127.0.0.1:9").unwrap());
    for proxy in [ProxyConfig::Env, explicit] {
        for (no_proxy, direct) in [
            (format!("a.origin.test:{port}"), true),
            (format!("*.origin.test:{port}"), true),
            (format!("ORIGIN.test.:{port}"), true),
            (format!("a.origin.test:{}", port.wrapping_add(1)), false),
            ("a.origin.test:443".to_string(), false),
            ("other.test".to_string(), false),
        ] {
            let route = route(&config, &proxy, &no_proxy, &url).await;
            assert_eq!(
                route == Route::Direct,
                direct,
                "proxy={proxy:?} NO_PROXY={no_proxy}: {route:?}"
            );
        }
    }
}

#[tokio::test]
async fn a_download_skips_an_explicit_proxy_for_a_no_proxy_host_and_port() {
    let env = Env::new().await;
    let proxy = crate::support::proxy::Proxy::start().await;
    let config = env.config();
    let body = bytes(1000, 5);
    let direct = env.serve("/d.bin", &body);
    let port = direct.port().unwrap();
    let explicit = ProxyConfig::Url(ProxyUrl::parse(&proxy.url()).unwrap());
    let vars: BTreeMap<String, String> =
        [("NO_PROXY".to_string(), format!("origin.test:{port}"))].into();
    let settings = ProxySettings::from_vars(&explicit, false, &vars).unwrap();
    let fetcher = Fetcher::with_proxy(&config, settings).unwrap();
    let t = fetcher.autofill(&direct, 1 << 20).await.unwrap();
    assert_eq!(t.sha256, sha256_hex(&body));
    assert!(proxy.targets().is_empty(), "{:?}", proxy.targets());
    // Another host goes through the proxy.
    let via = env.url("mirror.test", "/d.bin");
    fetcher.autofill(&via, 1 << 20).await.unwrap();
    assert_eq!(proxy.targets(), vec![format!("127.0.0.1:{port}")]);
}
