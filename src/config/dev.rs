//! `[dev]`: the development and test exemptions, and the rule that keeps
//! `allow_addresses` to local ranges unless confirmed.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use ipnet::IpNet;
use serde::Deserialize;

use crate::error::ConfigError;

/// `[dev]`: settings that let development setups and tests reach a local
/// origin. Production configurations leave this empty.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct DevConfig {
    /// PEM files whose certificates are trusted in addition to the system roots.
    #[serde(default)]
    pub extra_root_certs: Vec<PathBuf>,
    /// PEM text (`-----BEGIN CERTIFICATE-----…`) trusted like the files of
    /// `extra_root_certs`: for a configuration built in code, with no file
    /// on disk. Each entry holds one certificate or more.
    #[serde(default)]
    pub extra_root_pems: Vec<String>,
    /// Fixed DNS answers, like `curl --resolve`. The answers still pass the
    /// address guard (so they need `allow_addresses` to be local).
    #[serde(default)]
    pub resolve: BTreeMap<String, Vec<IpAddr>>,
    /// Address ranges exempt from the local/internal-address rule. A bare
    /// address is a range of one (`/32` or `/128`).
    #[serde(default, with = "nets_serde")]
    pub allow_addresses: Vec<IpNet>,
    /// Lets `allow_addresses` hold ranges that reach beyond the local ones
    /// (loopback, private, link-local, unique-local, carrier-grade NAT,
    /// documentation and benchmarking ranges). Without it such a range,
    /// `0.0.0.0/0` say, is refused: it would switch the address rule off.
    #[serde(default)]
    pub allow_public_addresses: bool,
}

impl DevConfig {
    /// The `[dev]` keys this configuration sets, by their names in the
    /// file (`extra_root_certs`, `extra_root_pems`, `resolve`,
    /// `allow_addresses`, `allow_public_addresses`), in that order; empty
    /// for a production configuration.
    pub fn active_keys(&self) -> Vec<&'static str> {
        [
            ("extra_root_certs", !self.extra_root_certs.is_empty()),
            ("extra_root_pems", !self.extra_root_pems.is_empty()),
            ("resolve", !self.resolve.is_empty()),
            ("allow_addresses", !self.allow_addresses.is_empty()),
            ("allow_public_addresses", self.allow_public_addresses),
        ]
        .into_iter()
        .filter_map(|(key, set)| set.then_some(key))
        .collect()
    }

    /// Adds an address (`127.0.0.1`, `::1`) or a range (`127.0.0.0/8`) to
    /// `allow_addresses`, read as the file's entries are; for
    /// configurations built in code. A range beyond the local ones is
    /// still refused when the service opens, unless
    /// `allow_public_addresses` is set. `allow_addresses` itself takes
    /// [`IpNet`] values (`IpNet::from(ip)` for one address).
    pub fn allow_address(&mut self, text: &str) -> Result<&mut Self, ConfigError> {
        let net = parse_net(text).map_err(|e| ConfigError(format!("dev.allow_addresses: {e}")))?;
        self.allow_addresses.push(net);
        Ok(self)
    }

    /// Trusts the certificates of `pem` (PEM text) besides the system
    /// roots: `extra_root_pems`, for configurations built in code.
    pub fn trust_pem(&mut self, pem: impl Into<String>) -> &mut Self {
        self.extra_root_pems.push(pem.into());
        self
    }

    /// Refuses an `allow_addresses` range that covers addresses outside
    /// [`LOCAL_RANGES`], unless `allow_public_addresses` confirms it.
    pub(super) fn check(&self) -> std::result::Result<(), String> {
        if self.allow_public_addresses {
            return Ok(());
        }
        match self.allow_addresses.iter().find(|net| !is_local_range(net)) {
            None => Ok(()),
            Some(net) => Err(format!(
                "dev.allow_addresses: {net} covers public addresses; list only local ranges \
                 (this host, loopback, private, link-local, unique-local, carrier-grade NAT, \
                 documentation), \
                 such as 127.0.0.1, or add allow_public_addresses = true to [dev] to exempt \
                 public addresses from the address rule on purpose"
            )),
        }
    }
}

/// The ranges `[dev] allow_addresses` may exempt without
/// `allow_public_addresses`: "this host" (`0.0.0.0/8`, `::`), loopback,
/// private networks, link-local, carrier-grade NAT, the documentation and
/// benchmarking ranges, and their IPv6 counterparts (unique-local
/// `fc00::/7`, documentation `2001:db8::/32` and `3fff::/20`).
const LOCAL_RANGES: &[&str] = &[
    "0.0.0.0/8",
    "127.0.0.0/8",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "169.254.0.0/16",
    "100.64.0.0/10",
    "192.0.2.0/24",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "198.18.0.0/15",
    "::/128",
    "::1/128",
    "fe80::/10",
    "fc00::/7",
    "2001:db8::/32",
    "3fff::/20",
];

/// Whether `net` lies inside one of [`LOCAL_RANGES`]; an IPv4-mapped IPv6
/// range (`::ffff:127.0.0.0/104`) is judged as the IPv4 range it maps.
fn is_local_range(net: &IpNet) -> bool {
    let net = match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.network().to_ipv4_mapped() {
            Some(v4) => ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96)
                .map(IpNet::V4)
                .unwrap_or(*net),
            None => *net,
        },
        other => *other,
    };
    LOCAL_RANGES
        .iter()
        .filter_map(|range| range.parse::<IpNet>().ok())
        .any(|range| range.contains(&net))
}

mod nets_serde {
    use ipnet::IpNet;
    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
        Vec::<String>::deserialize(d)?
            .iter()
            .map(|text| super::parse_net(text).map_err(serde::de::Error::custom))
            .collect()
    }
}

/// An address range (`127.0.0.0/8`) or a single address (`127.0.0.1`,
/// taken as `/32`, or `::1` as `/128`).
fn parse_net(text: &str) -> std::result::Result<IpNet, String> {
    if let Ok(net) = text.parse::<IpNet>() {
        return Ok(net);
    }
    text.parse::<IpAddr>().map(IpNet::from).map_err(|_| {
        format!("{text:?} is neither an address (127.0.0.1, ::1) nor a range (127.0.0.0/8)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    #[test]
    fn allow_addresses_must_stay_local_unless_confirmed() {
        for local in [
            "127.0.0.1",
            "127.0.0.0/8",
            "10.1.0.0/16",
            "172.16.0.0/12",
            "192.168.7.0/24",
            "169.254.0.0/16",
            "100.64.0.0/10",
            "192.0.2.0/24",
            "198.51.100.7",
            "203.0.113.0/24",
            "198.18.0.0/15",
            "::1",
            "fe80::/10",
            "fd00::/8",
            "fc00::/7",
            "2001:db8::/32",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.0/104",
            "0.0.0.0",
            "::",
        ] {
            let text = format!("[dev]\nallow_addresses = [\"{local}\"]");
            let c = Config::parse(&text).unwrap_or_else(|e| panic!("{local}: {e}"));
            assert_eq!(c.active_dev_keys(), vec!["allow_addresses"]);
        }
        for public in [
            "0.0.0.0/0",
            "::/0",
            "8.8.8.8",
            "126.0.0.0/7",
            "10.0.0.0/7",
            "172.16.0.0/11",
            "192.168.0.0/15",
            "fc00::/6",
            "2001:db8::/31",
            "::ffff:0.0.0.0/96",
            "::ffff:8.8.8.8",
            "0.0.0.0/7",
            "::/127",
        ] {
            let text = format!("[dev]\nallow_addresses = [\"127.0.0.1\", \"{public}\"]");
            let e = Config::parse(&text).unwrap_err().to_string();
            let net = parse_net(public).unwrap();
            for part in [
                "dev.allow_addresses: ",
                &format!(" {net} covers public addresses"),
                "allow_public_addresses = true",
            ] {
                assert!(e.contains(part), "{public}: {part:?} not in {e}");
            }
            let text = format!("{text}\nallow_public_addresses = true");
            let c = Config::parse(&text).unwrap_or_else(|e| panic!("{public}: {e}"));
            assert_eq!(c.dev.allow_addresses.len(), 2);
        }
    }

    #[test]
    fn pem_text_and_addresses_can_be_given_in_code_or_in_the_file() {
        let c =
            Config::parse("[dev]\nextra_root_pems = [\"-----BEGIN CERTIFICATE-----\"]").unwrap();
        assert_eq!(c.active_dev_keys(), vec!["extra_root_pems"]);
        let mut dev = DevConfig::default();
        dev.allow_address("127.0.0.1")
            .unwrap()
            .allow_address("fd00::/8")
            .unwrap();
        assert_eq!(
            dev.allow_addresses,
            vec![
                parse_net("127.0.0.1/32").unwrap(),
                parse_net("fd00::/8").unwrap()
            ]
        );
        let e = dev.allow_address("cdn.test").unwrap_err().to_string();
        assert!(
            e.starts_with("dev.allow_addresses: \"cdn.test\" is neither"),
            "{e}"
        );
        assert_eq!(dev.allow_addresses.len(), 2, "nothing added");
        dev.trust_pem("pem");
        assert_eq!(
            dev.active_keys(),
            vec!["extra_root_pems", "allow_addresses"]
        );
    }

    #[test]
    fn active_dev_keys_name_what_is_set() {
        assert!(Config::parse("").unwrap().active_dev_keys().is_empty());
        let c = Config::parse("[dev]\nallow_public_addresses = false").unwrap();
        assert!(c.active_dev_keys().is_empty());
        let c = Config::parse("[dev]\nresolve = { \"a.test\" = [\"127.0.0.1\"] }").unwrap();
        assert_eq!(c.active_dev_keys(), vec!["resolve"]);
        let c = Config::parse(
            r#"
[dev]
allow_public_addresses = true
allow_addresses = ["8.8.8.8"]
resolve = { "a.test" = ["8.8.8.8"] }
extra_root_certs = ["ca.pem"]
"#,
        )
        .unwrap();
        assert_eq!(
            c.active_dev_keys(),
            vec![
                "extra_root_certs",
                "resolve",
                "allow_addresses",
                "allow_public_addresses"
            ]
        );
    }
}
