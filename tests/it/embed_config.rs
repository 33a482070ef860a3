//! A configuration built in code, with no file: CA roots as PEM text,
//! allowed ranges as text or `IpNet`, the same checks as a file's; the
//! policy a settings page shows.

use std::net::{IpAddr, Ipv4Addr};

use gem_resources::{Config, ErrorCode, Event, IpNet, Mode, Policy, Resources};
use serde_json::json;

use crate::support::*;

/// A configuration reaching the test origin, built without any file; the
/// origin's CA as PEM text when `trusted`.
fn code_config(env: &Env, trusted: bool) -> Config {
    let mut config = Config::default();
    config.store = Some(env.dir.path().join("code-store"));
    config.network.retries = 0;
    config.network.connect_timeout_secs = 5.0;
    let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
    for host in TEST_HOSTS {
        config.dev.resolve.insert(host.to_string(), vec![loopback]);
    }
    config.dev.allow_address("127.0.0.1").unwrap();
    if trusted {
        config.dev.trust_pem(env.origin.ca_pem());
    }
    config
}

#[tokio::test]
async fn a_configuration_built_in_code_trusts_a_pem_given_as_text() {
    let env = Env::new().await;
    let body = bytes(12_000, 41);
    let url = env.serve("/code.bin", &body);
    // No config.toml is read: remove the one the fixture wrote, and the CA
    // file, to be sure.
    std::fs::remove_file(env.dir.path().join("config.toml")).unwrap();
    std::fs::remove_file(env.dir.path().join("ca.pem")).unwrap();
    let config = code_config(&env, true);
    config.validate().unwrap();
    assert_eq!(
        config.active_dev_keys(),
        ["extra_root_pems", "resolve", "allow_addresses"]
    );
    let service = Resources::open(&config).unwrap();
    let gem = service.gem("g");
    service
        .install("g", &manifest(json!([entry("c", &url, &body)])))
        .await
        .unwrap();
    assert_eq!(std::fs::read(gem.path("c").await.unwrap()).unwrap(), body);
}

#[tokio::test]
async fn without_the_pem_the_origin_is_not_trusted() {
    let env = Env::new().await;
    let body = bytes(12_000, 42);
    let url = env.serve("/untrusted.bin", &body);
    let service = Resources::open(&code_config(&env, false)).unwrap();
    service
        .install("g", &manifest(json!([entry("u", &url, &body)])))
        .await
        .unwrap();
    let err = service.path("g", "u").await.unwrap_err();
    assert_eq!(err.primary_cause(), ErrorCode::Network, "{err}");
}

#[tokio::test]
async fn code_built_configurations_get_the_checks_of_a_file() {
    let env = Env::new().await;
    // A range beyond the local ones is refused at open, as in a file.
    let mut config = code_config(&env, true);
    config
        .dev
        .allow_addresses
        .push("0.0.0.0/0".parse::<IpNet>().unwrap());
    let err = Resources::open(&config).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Config);
    assert!(err.to_string().contains("covers public addresses"), "{err}");
    assert_eq!(config.validate().unwrap_err().code(), ErrorCode::Config);
    config.dev.allow_public_addresses = true;
    config.validate().unwrap();
    // Text that is neither an address nor a range.
    let mut config = code_config(&env, true);
    let err = config.dev.allow_address("localhost").unwrap_err();
    assert!(err.to_string().contains("dev.allow_addresses"), "{err}");
    config
        .dev
        .allow_addresses
        .push(IpNet::from(IpAddr::from([127, 0, 0, 2])));
    // Not PEM text.
    config.dev.trust_pem("not a certificate");
    let err = Resources::open(&config).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Config);
    assert!(err.to_string().contains("dev.extra_root_pems[1]"), "{err}");
    // A zero timeout, refused in a file, is refused in code.
    let mut config = code_config(&env, true);
    config.network.stall_timeout_secs = 0.0;
    assert_eq!(
        Resources::open(&config).unwrap_err().code(),
        ErrorCode::Config
    );
}

#[tokio::test]
async fn the_policy_shows_its_hosts_and_the_change_event_its_modes() {
    let env = Env::new().await;
    let service = Resources::open(&env.config()).unwrap();
    assert_eq!(service.policy().mode(), Mode::Blocklist);
    assert!(service.policy().hosts().is_empty());
    let mut events = service.subscribe();
    let hosts = vec!["cdn.test".to_string(), "*.origin.test".to_string()];
    service
        .set_policy(Policy::new(Mode::Allowlist, &hosts).unwrap())
        .unwrap();
    assert_eq!(service.policy().hosts(), hosts);
    let event = events.recv().await.unwrap();
    let Event::PolicyChanged {
        old_mode,
        new_mode,
        new_hosts,
        ..
    } = &event
    else {
        panic!("{event:?}");
    };
    assert_eq!((*old_mode, *new_mode), (Mode::Blocklist, Mode::Allowlist));
    assert_eq!(*new_hosts, 2);
    // The JSON form keeps the names.
    let value = serde_json::to_value(&event).unwrap();
    assert_eq!(value["old_mode"], "blocklist");
    assert_eq!(value["new_mode"], "allowlist");
}
