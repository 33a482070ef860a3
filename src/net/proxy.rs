//! Which proxy, if any, a hop goes through: `[network] proxy`, the
//! `HTTPS_PROXY`/`ALL_PROXY`/`NO_PROXY` variables, and the proxy URL with its
//! credentials kept out of every message.
//!
//! The choice is pure: [`ProxySettings::from_vars`] takes the variables as a
//! map, so it can be tested without touching the process environment. The
//! connection itself is opened in `tunnel`.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use base64::Engine;
use ipnet::IpNet;
use url::{Host, Url};

use crate::error::{Error, Result};

/// The `[network] proxy` setting.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum ProxyConfig {
    /// `"env"`: `HTTPS_PROXY`, then `ALL_PROXY`, with `NO_PROXY` honoured.
    #[default]
    Env,
    /// `"none"`: always connect directly.
    None,
    /// An explicit `http://host:port` or `https://host:port`.
    Url(ProxyUrl),
}

impl fmt::Debug for ProxyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProxyConfig::Env => f.write_str("env"),
            ProxyConfig::None => f.write_str("none"),
            ProxyConfig::Url(url) => write!(f, "{url}"),
        }
    }
}

impl<'de> serde::Deserialize<'de> for ProxyConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.as_str() {
            "env" => Ok(ProxyConfig::Env),
            "none" => Ok(ProxyConfig::None),
            // The value is not echoed: it may hold a password.
            other => ProxyUrl::parse(other)
                .map(ProxyConfig::Url)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// A proxy's address and, when the URL carried them, its credentials.
///
/// `Display` and `Debug` show `scheme://host:port` only: the credentials
/// never reach a log, an error, a record or `status`.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyUrl {
    /// `true` for `https://`: TLS to the proxy before `CONNECT`.
    pub(crate) tls: bool,
    /// Host name or IP literal (IPv6 without brackets).
    pub(crate) host: String,
    /// Port (default 1080 for `http`, as curl; 443 for `https`).
    pub(crate) port: u16,
    /// `Basic …` for `Proxy-Authorization`, from the URL's user and password.
    pub(crate) authorization: Option<String>,
}

impl ProxyUrl {
    /// Parses `http://[user:pass@]host[:port]` or `https://…`. A value with
    /// no scheme is taken as `http://`, as curl does.
    pub fn parse(text: &str) -> std::result::Result<ProxyUrl, String> {
        let text = text.trim();
        let with_scheme = if text.contains("://") {
            text.to_string()
        } else {
            format!("http://{text}")
        };
        let url = Url::parse(&with_scheme).map_err(|e| {
            format!("the proxy must be \"env\", \"none\" or an http:// or https:// URL ({e})")
        })?;
        let tls = match url.scheme() {
            "http" => false,
            "https" => true,
            other => {
                return Err(format!(
                    "unsupported proxy scheme {other}:// (only http:// and https:// proxies are supported)"
                ))
            }
        };
        let host = match url.host() {
            Some(Host::Domain(d)) => d.to_string(),
            Some(Host::Ipv4(ip)) => ip.to_string(),
            Some(Host::Ipv6(ip)) => ip.to_string(),
            None => return Err("the proxy URL has no host".into()),
        };
        if !matches!(url.path(), "" | "/") || url.query().is_some() {
            return Err("the proxy URL must be scheme://host:port, without a path".into());
        }
        let authorization = (!url.username().is_empty() || url.password().is_some()).then(|| {
            let decode = |s: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8_lossy()
                    .into_owned()
            };
            let pair = format!(
                "{}:{}",
                decode(url.username()),
                decode(url.password().unwrap_or(""))
            );
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            )
        });
        Ok(ProxyUrl {
            tls,
            port: url.port().unwrap_or(if tls { 443 } else { 1080 }),
            host,
            authorization,
        })
    }

    /// Whether the URL carried credentials.
    pub fn has_credentials(&self) -> bool {
        self.authorization.is_some()
    }
}

impl fmt::Display for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(ip)) => write!(f, "{scheme}://[{ip}]:{}", self.port),
            _ => write!(f, "{scheme}://{}:{}", self.host, self.port),
        }
    }
}

impl fmt::Debug for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// One `NO_PROXY` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Bypass {
    /// `*`: no proxy for any host.
    All,
    /// A name and every name under it (`example.com`, `.example.com`).
    Name(String),
    /// An address or a range of them.
    Net(IpNet),
}

/// The proxy decision for every hop of this process.
#[derive(Debug, Clone, Default)]
pub struct ProxySettings {
    /// The proxy, if any is configured.
    proxy: Option<ProxyUrl>,
    /// Hosts reached directly although a proxy is configured.
    bypass: Vec<Bypass>,
    /// `[network] proxy_resolves`: `CONNECT <name>:<port>` instead of a
    /// vetted address.
    resolves: bool,
}

impl ProxySettings {
    /// The settings for `config` and the process environment.
    pub fn from_env(config: &ProxyConfig, resolves: bool) -> Result<ProxySettings> {
        let names = [
            "https_proxy",
            "HTTPS_PROXY",
            "all_proxy",
            "ALL_PROXY",
            "no_proxy",
            "NO_PROXY",
        ];
        let vars = names
            .iter()
            .filter_map(|n| std::env::var(n).ok().map(|v| (n.to_string(), v)))
            .collect();
        ProxySettings::from_vars(config, resolves, &vars)
    }

    /// The settings for `config`, reading the proxy variables from `vars`.
    ///
    /// With `"env"`: `https_proxy`, `HTTPS_PROXY`, `all_proxy`, `ALL_PROXY`,
    /// the first one set and not empty wins (lowercase first, as in curl);
    /// `no_proxy`, then `NO_PROXY`, lists hosts reached directly.
    pub fn from_vars(
        config: &ProxyConfig,
        resolves: bool,
        vars: &BTreeMap<String, String>,
    ) -> Result<ProxySettings> {
        let set = |name: &str| vars.get(name).map(|v| v.trim()).filter(|v| !v.is_empty());
        let (proxy, bypass) = match config {
            ProxyConfig::None => (None, Vec::new()),
            ProxyConfig::Url(url) => (Some(url.clone()), Vec::new()),
            ProxyConfig::Env => {
                let found = ["https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"]
                    .into_iter()
                    .find_map(|name| set(name).map(|value| (name, value)));
                let proxy = match found {
                    None => None,
                    Some((name, value)) => Some(
                        ProxyUrl::parse(value)
                            .map_err(|e| Error::Config(format!("{name}: {e}")))?,
                    ),
                };
                let no_proxy = set("no_proxy").or_else(|| set("NO_PROXY"));
                (proxy, no_proxy.map(parse_no_proxy).unwrap_or_default())
            }
        };
        Ok(ProxySettings {
            proxy,
            bypass,
            resolves,
        })
    }

    /// The proxy a hop to `host` goes through, or `None` for a direct
    /// connection.
    pub fn proxy_for(&self, host: &Host<&str>) -> Option<&ProxyUrl> {
        let proxy = self.proxy.as_ref()?;
        let bypassed = self.bypass.iter().any(|b| match (b, host) {
            (Bypass::All, _) => true,
            (Bypass::Name(entry), Host::Domain(name)) => {
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                name == *entry || name.ends_with(&format!(".{entry}"))
            }
            (Bypass::Net(net), Host::Ipv4(ip)) => net.contains(&IpAddr::V4(*ip)),
            (Bypass::Net(net), Host::Ipv6(ip)) => net.contains(&IpAddr::V6(*ip)),
            _ => false,
        });
        (!bypassed).then_some(proxy)
    }

    /// Whether the proxy resolves names (`[network] proxy_resolves`).
    pub fn proxy_resolves(&self) -> bool {
        self.resolves
    }
}

/// Parses a `NO_PROXY` value as curl does: entries separated by commas (or
/// spaces); `*` alone matches everything; a leading dot is optional; an
/// address or a CIDR range matches IP-literal hosts.
fn parse_no_proxy(value: &str) -> Vec<Bypass> {
    value
        .split(|c: char| c == ',' || c.is_whitespace())
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|entry| {
            if entry == "*" {
                return Bypass::All;
            }
            let bare = entry.trim_start_matches('[').trim_end_matches(']');
            if let Ok(net) = bare.parse::<IpNet>() {
                return Bypass::Net(net);
            }
            if let Ok(ip) = bare.parse::<IpAddr>() {
                return Bypass::Net(IpNet::from(ip));
            }
            let name = entry.trim_start_matches('.').trim_end_matches('.');
            Bypass::Name(name.to_ascii_lowercase())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn host(text: &str) -> Host<String> {
        Host::parse(text).unwrap()
    }

    fn proxied(settings: &ProxySettings, text: &str) -> Option<String> {
        let h = host(text);
        let h = match &h {
            Host::Domain(d) => Host::Domain(d.as_str()),
            Host::Ipv4(ip) => Host::Ipv4(*ip),
            Host::Ipv6(ip) => Host::Ipv6(*ip),
        };
        settings.proxy_for(&h).map(|p| p.to_string())
    }

    #[test]
    fn env_picks_https_proxy_then_all_proxy() {
        let env = ProxyConfig::Env;
        let s = ProxySettings::from_vars(&env, false, &vars(&[])).unwrap();
        assert_eq!(proxied(&s, "cdn.example.com"), None);
        let v = vars(&[
            ("ALL_PROXY", "http://all:1"),
            ("HTTPS_PROXY", "http://https:2"),
        ]);
        let s = ProxySettings::from_vars(&env, false, &v).unwrap();
        assert_eq!(proxied(&s, "cdn.example.com").unwrap(), "http://https:2");
        let v = vars(&[("all_proxy", "proxy.corp:3128"), ("HTTPS_PROXY", " ")]);
        let s = ProxySettings::from_vars(&env, false, &v).unwrap();
        assert_eq!(
            proxied(&s, "cdn.example.com").unwrap(),
            "http://proxy.corp:3128"
        );
        let v = vars(&[
            ("https_proxy", "http://lower:1"),
            ("HTTPS_PROXY", "http://upper:2"),
        ]);
        let s = ProxySettings::from_vars(&env, false, &v).unwrap();
        assert_eq!(proxied(&s, "a.b").unwrap(), "http://lower:1");
    }

    #[test]
    fn none_and_explicit_ignore_the_environment() {
        let v = vars(&[("HTTPS_PROXY", "http://env:1"), ("NO_PROXY", "*")]);
        let s = ProxySettings::from_vars(&ProxyConfig::None, false, &v).unwrap();
        assert_eq!(proxied(&s, "a.b"), None);
        let url = ProxyUrl::parse("https://p.corp:8443").unwrap();
        let s = ProxySettings::from_vars(&ProxyConfig::Url(url), false, &v).unwrap();
        assert_eq!(proxied(&s, "a.b").unwrap(), "https://p.corp:8443");
    }

    #[test]
    fn no_proxy_matches_as_curl_does() {
        let v = vars(&[
            ("HTTPS_PROXY", "http://p:3128"),
            (
                "NO_PROXY",
                "example.com, .corp.internal,10.0.0.0/8 192.168.1.7,[::1]",
            ),
        ]);
        let s = ProxySettings::from_vars(&ProxyConfig::Env, false, &v).unwrap();
        for direct in [
            "example.com",
            "EXAMPLE.com.",
            "cdn.example.com",
            "corp.internal",
            "a.corp.internal",
            "10.1.2.3",
            "192.168.1.7",
            "[::1]",
        ] {
            assert_eq!(proxied(&s, direct), None, "{direct}");
        }
        for via in [
            "badexample.com",
            "example.org",
            "11.0.0.1",
            "192.168.1.8",
            "internal",
        ] {
            assert!(proxied(&s, via).is_some(), "{via}");
        }
        let v = vars(&[("https_proxy", "http://p:3128"), ("no_proxy", "*")]);
        let s = ProxySettings::from_vars(&ProxyConfig::Env, false, &v).unwrap();
        assert_eq!(proxied(&s, "anything.example"), None);
        let v = vars(&[
            ("https_proxy", "http://p:3128"),
            ("no_proxy", "a.test"),
            ("NO_PROXY", "b.test"),
        ]);
        let s = ProxySettings::from_vars(&ProxyConfig::Env, false, &v).unwrap();
        assert_eq!(proxied(&s, "a.test"), None);
        assert!(proxied(&s, "b.test").is_some());
    }

    #[test]
    fn credentials_become_basic_authorization_and_are_never_shown() {
        let url = ProxyUrl::parse("http://al%40ice:s3cr%3At@proxy.corp:3128").unwrap();
        // base64("al@ice:s3cr:t")
        assert_eq!(
            url.authorization.as_deref(),
            Some("Basic YWxAaWNlOnMzY3I6dA==")
        );
        for shown in [
            url.to_string(),
            format!("{url:?}"),
            format!("{:?}", ProxyConfig::Url(url.clone())),
        ] {
            assert_eq!(shown, "http://proxy.corp:3128");
        }
        let s = ProxySettings {
            proxy: Some(url),
            ..ProxySettings::default()
        };
        assert!(!format!("{s:?}").contains("s3cr"));
    }

    #[test]
    fn bad_proxy_values_are_refused_without_echoing_them() {
        for bad in [
            "socks5://u:secret@p:1080",
            "http://u:secret@p:3128/path",
            "http://",
        ] {
            let e = ProxyUrl::parse(bad).unwrap_err();
            assert!(!e.contains("secret"), "{e}");
        }
        let v = vars(&[("HTTPS_PROXY", "socks5://u:secret@p:1080")]);
        let e = ProxySettings::from_vars(&ProxyConfig::Env, false, &v).unwrap_err();
        assert!(e.to_string().contains("HTTPS_PROXY"), "{e}");
        assert!(!e.to_string().contains("secret"), "{e}");
        assert_eq!(
            ProxyUrl::parse("https://[::1]").unwrap().to_string(),
            "https://[::1]:443"
        );
    }
}

#[cfg(test)]
mod config_tests {
    use crate::net::proxy::{ProxyConfig, ProxyUrl};
    use crate::Config;

    #[test]
    fn the_network_keys_parse_and_a_bad_value_is_not_echoed() {
        assert_eq!(Config::default().network.proxy, ProxyConfig::Env);
        assert!(!Config::default().network.proxy_resolves);
        let c = Config::parse("[network]\nproxy = \"none\"\nproxy_resolves = true").unwrap();
        assert_eq!(c.network.proxy, ProxyConfig::None);
        assert!(c.network.proxy_resolves);
        let c = Config::parse("[network]\nproxy = \"https://u:pw@p.corp:8443\"").unwrap();
        let url = ProxyUrl::parse("https://u:pw@p.corp:8443").unwrap();
        assert_eq!(c.network.proxy, ProxyConfig::Url(url));
        assert!(!format!("{c:?}").contains("pw@"), "{c:?}");
        let e = Config::parse("[network]\nproxy = \"ftp://u:secret@p\"").unwrap_err();
        assert!(e.to_string().contains("unsupported proxy scheme"), "{e}");
        assert!(!e.to_string().contains("secret"), "{e}");
    }
}
