//! URL text → the per-hop decision (`Fetcher::check_hop`) and the address
//! guard. Every accepted URL is `https`, has no credentials and has a host;
//! an accepted IP host is one the independent IANA classifier calls global;
//! the guard's decision on any IP agrees with that classifier.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

use gem_resources::guard::AddressGuard;
use gem_resources::manifest::parse_https_url;
use gem_resources::{Config, Fetcher};
use gem_resources_fuzz::{assert_usable_url, iana, metered};
use libfuzzer_sys::fuzz_target;
use url::{Host, Url};

fn fetcher() -> &'static Fetcher {
    static FETCHER: OnceLock<Fetcher> = OnceLock::new();
    FETCHER.get_or_init(|| Fetcher::new(&Config::default()).expect("default fetcher"))
}

/// The guard's decision on an IP must be the independent classifier's.
fn check_ip_agrees(ip: IpAddr) {
    let refused = AddressGuard::new().check_ip(ip).is_err();
    let verdict = iana::classify(ip);
    assert_eq!(
        refused,
        verdict.refused(),
        "{ip}: guard refused={refused}, IANA {verdict:?}"
    );
}

fuzz_target!(|data: &[u8]| {
    if let Ok(bytes) = <[u8; 4]>::try_from(data.get(..4).unwrap_or_default()) {
        check_ip_agrees(IpAddr::V4(Ipv4Addr::from(bytes)));
    }
    if let Ok(bytes) = <[u8; 16]>::try_from(data.get(..16).unwrap_or_default()) {
        check_ip_agrees(IpAddr::V6(Ipv6Addr::from(bytes)));
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(url) = metered("parse_https_url", text.len(), || parse_https_url(text)) {
        assert_usable_url(&url);
    }
    for candidate in [text.to_string(), format!("https://{text}/")] {
        let Ok(url) = metered("Url::parse", candidate.len(), || Url::parse(&candidate)) else {
            continue;
        };
        if let Some(host) = url.host() {
            if let Host::Ipv4(v4) = host {
                check_ip_agrees(IpAddr::V4(v4));
            }
            if let Host::Ipv6(v6) = host {
                check_ip_agrees(IpAddr::V6(v6));
            }
        }
        if fetcher().check_hop(&url).is_err() {
            continue;
        }
        assert_usable_url(&url);
        match url.host() {
            Some(Host::Ipv4(v4)) => assert_eq!(iana::classify_v4(v4), iana::Verdict::Global),
            Some(Host::Ipv6(v6)) => assert_eq!(iana::classify_v6(v6), iana::Verdict::Global),
            Some(Host::Domain(name)) => {
                let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
                assert!(
                    !name.is_empty() && !name.split('.').any(str::is_empty),
                    "{name:?}"
                );
                // RFC 6761: localhost names always mean this machine.
                assert!(
                    name != "localhost" && !name.ends_with(".localhost"),
                    "{name:?}"
                );
                assert!(name.parse::<IpAddr>().is_err(), "{name:?} is an address");
                assert!(AddressGuard::new()
                    .check_host(&Host::Domain(name.as_str()))
                    .is_ok());
            }
            None => panic!("accepted a URL without a host: {url}"),
        }
    }
});
