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
    /// An explicit `http://host:port` or `https://host:port`; the hosts
    /// in `NO_PROXY` are still reached directly.
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

/// What one `NO_PROXY` entry names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// `*`: no proxy for any host.
    All,
    /// A name and every name under it (`example.com`, `.example.com`,
    /// `*.example.com`), normalised.
    Name(String),
    /// An address or a range of them.
    Net(IpNet),
}

/// One `NO_PROXY` entry: what it names and, for `host:port`, the only port
/// it applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Bypass {
    target: Target,
    port: Option<u16>,
}

impl Bypass {
    /// Whether a hop to `host` on `port` (`None`: the scheme's default,
    /// unknown) goes direct because of this entry.
    fn matches(&self, host: &Host<&str>, port: Option<u16>) -> bool {
        if self.port.is_some() && self.port != port {
            return false;
        }
        match (&self.target, host) {
            (Target::All, _) => true,
            (Target::Name(entry), Host::Domain(name)) => {
                let name = crate::net::guard::normalise_host(name);
                name.strip_suffix(entry.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.ends_with('.'))
            }
            (Target::Net(net), Host::Ipv4(ip)) => net.contains(&IpAddr::V4(*ip)),
            (Target::Net(net), Host::Ipv6(ip)) => {
                let ip = IpAddr::V6(*ip);
                net.contains(&ip) || net.contains(&ip.to_canonical())
            }
            _ => false,
        }
    }
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
    /// the first one set and not empty wins (lowercase first, as in curl).
    /// With `"env"` or a URL, `no_proxy`, then `NO_PROXY`, lists hosts
    /// reached directly; `"none"` reads no variable.
    pub fn from_vars(
        config: &ProxyConfig,
        resolves: bool,
        vars: &BTreeMap<String, String>,
    ) -> Result<ProxySettings> {
        let set = |name: &str| vars.get(name).map(|v| v.trim()).filter(|v| !v.is_empty());
        let bypass = || {
            let no_proxy = set("no_proxy").or_else(|| set("NO_PROXY"));
            no_proxy.map(parse_no_proxy).unwrap_or_default()
        };
        let (proxy, bypass) = match config {
            ProxyConfig::None => (None, Vec::new()),
            ProxyConfig::Url(url) => (Some(url.clone()), bypass()),
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
                (proxy, bypass())
            }
        };
        Ok(ProxySettings {
            proxy,
            bypass,
            resolves,
        })
    }

    /// The proxy a hop to `host` goes through, or `None` for a direct
    /// connection. Without a port, a `NO_PROXY` entry that names one
    /// (`host:443`) does not apply; [`ProxySettings::proxy_for_url`] knows
    /// the port.
    pub fn proxy_for(&self, host: &Host<&str>) -> Option<&ProxyUrl> {
        self.proxy_for_port(host, None)
    }

    /// The proxy a hop to `url` goes through, or `None` for a direct
    /// connection, with `NO_PROXY` entries matched on the url's host and
    /// port (the scheme's default when the url has none).
    pub fn proxy_for_url(&self, url: &Url) -> Option<&ProxyUrl> {
        let host = url.host()?;
        self.proxy_for_port(&host, url.port_or_known_default())
    }

    fn proxy_for_port(&self, host: &Host<&str>, port: Option<u16>) -> Option<&ProxyUrl> {
        let proxy = self.proxy.as_ref()?;
        let bypassed = self.bypass.iter().any(|b| b.matches(host, port));
        (!bypassed).then_some(proxy)
    }

    /// Whether the proxy resolves names (`[network] proxy_resolves`).
    pub fn proxy_resolves(&self) -> bool {
        self.resolves
    }
}

/// Parses a `NO_PROXY` value as curl does: entries separated by commas or
/// white space; `*` alone matches everything; a leading `.` or `*.` is
/// optional (`example.com` covers the domain and every name under it);
/// names compare case-insensitively with a trailing dot dropped; an
/// address (`192.168.1.7`, `::1`, `[::1]`) or a CIDR range matches
/// IP-literal hosts; `host:port` (`[::1]:8443`) applies to that port only.
/// An entry that is none of these (an empty name, a bad port) is skipped.
fn parse_no_proxy(value: &str) -> Vec<Bypass> {
    value
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|e| !e.is_empty())
        .filter_map(parse_bypass)
        .collect()
}

/// One `NO_PROXY` entry, or `None` when it names nothing.
fn parse_bypass(entry: &str) -> Option<Bypass> {
    if entry == "*" {
        return Some(Bypass {
            target: Target::All,
            port: None,
        });
    }
    let (host, port) = split_port(entry)?;
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let target = if let Ok(net) = bare.parse::<IpNet>() {
        Target::Net(net.trunc())
    } else if let Ok(ip) = bare.parse::<IpAddr>() {
        Target::Net(IpNet::from(ip))
    } else {
        let name = host
            .strip_prefix("*.")
            .or_else(|| host.strip_prefix('.'))
            .unwrap_or(host);
        let name = crate::net::guard::normalise_host(name);
        if name.is_empty() || name.contains(['*', '/', '[', ']', ':']) {
            return None;
        }
        Target::Name(name)
    };
    Some(Bypass { target, port })
}

/// Splits `host:port` (`[v6]:port` for IPv6); an entry with no port, or
/// an IPv6 address or range written bare (`::1`, `fd00::/8`), is all host.
/// `None` for a port that is not a number from 0 to 65535.
fn split_port(entry: &str) -> Option<(&str, Option<u16>)> {
    let port_at = if entry.starts_with('[') {
        entry.find("]:").map(|i| i + 1)
    } else if entry.matches(':').count() == 1 {
        entry.find(':')
    } else {
        None
    };
    match port_at {
        None => Some((entry, None)),
        Some(i) => Some((&entry[..i], Some(entry[i + 1..].parse().ok()?))),
    }
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
    fn none_ignores_the_environment_and_an_explicit_url_honours_no_proxy() {
        let v = vars(&[("HTTPS_PROXY", "http://env:1"), ("NO_PROXY", "*.b")]);
        let s = ProxySettings::from_vars(&ProxyConfig::None, false, &v).unwrap();
        assert_eq!(proxied(&s, "a.b"), None);
        assert_eq!(proxied(&s, "a.c"), None);
        let url = ProxyUrl::parse("https://p.corp:8443").unwrap();
        let s = ProxySettings::from_vars(&ProxyConfig::Url(url), false, &v).unwrap();
        assert_eq!(proxied(&s, "a.b"), None);
        assert_eq!(proxied(&s, "a.c").unwrap(), "https://p.corp:8443");
    }

    /// Whether a hop to `url` goes through the proxy with this `NO_PROXY`.
    fn via_proxy(no_proxy: &str, url: &str) -> bool {
        let v = vars(&[("https_proxy", "http://p:3128"), ("no_proxy", no_proxy)]);
        let s = ProxySettings::from_vars(&ProxyConfig::Env, false, &v).unwrap();
        s.proxy_for_url(&Url::parse(url).unwrap()).is_some()
    }

    #[test]
    fn no_proxy_table() {
        const DIRECT: bool = false;
        const PROXY: bool = true;
        for (no_proxy, url, expected) in [
            ("", "https://a.test/", PROXY),
            ("*", "https://a.test/", DIRECT),
            ("*", "https://[2001:db8::1]/", DIRECT),
            // A name covers itself and every name under it, with or
            // without a leading `.` or `*.`.
            ("example.com", "https://example.com/", DIRECT),
            ("example.com", "https://cdn.example.com/", DIRECT),
            ("example.com", "https://a.b.example.com/", DIRECT),
            ("example.com", "https://badexample.com/", PROXY),
            ("example.com", "https://example.com.evil.test/", PROXY),
            (".example.com", "https://example.com/", DIRECT),
            (".example.com", "https://cdn.example.com/", DIRECT),
            ("*.test", "https://a.test/", DIRECT),
            ("*.test", "https://x.y.test/", DIRECT),
            ("*.test", "https://test/", DIRECT),
            ("*.test", "https://atest/", PROXY),
            ("*.test", "https://a.test.org/", PROXY),
            // Case and one trailing dot, on either side.
            ("EXAMPLE.Com", "https://cdn.example.COM/", DIRECT),
            ("example.com.", "https://example.com/", DIRECT),
            ("example.com", "https://cdn.example.com./", DIRECT),
            // Separators: commas, spaces, tabs, any mix.
            ("x.test, y.test", "https://y.test/", DIRECT),
            ("x.test  y.test", "https://y.test/", DIRECT),
            ("x.test,\ty.test,,", "https://y.test/", DIRECT),
            ("x.test y.test", "https://z.test/", PROXY),
            // host:port applies to that port only (443 is https' default).
            ("a.test:8443", "https://a.test:8443/", DIRECT),
            ("a.test:8443", "https://a.test/", PROXY),
            ("a.test:443", "https://a.test/", DIRECT),
            ("a.test:443", "https://b.a.test/", DIRECT),
            ("a.test:443", "https://a.test:444/", PROXY),
            ("a.test:nope", "https://a.test/", PROXY),
            ("192.168.1.7:8443", "https://192.168.1.7:8443/", DIRECT),
            ("192.168.1.7:8443", "https://192.168.1.7/", PROXY),
            ("[::1]:8443", "https://[::1]:8443/", DIRECT),
            ("[::1]:8443", "https://[::1]/", PROXY),
            // Addresses and ranges match IP-literal hosts only.
            ("192.168.1.7", "https://192.168.1.7/", DIRECT),
            ("192.168.1.7", "https://192.168.1.8/", PROXY),
            ("10.0.0.0/8", "https://10.200.0.1/", DIRECT),
            ("10.0.0.0/8", "https://11.0.0.1/", PROXY),
            ("10.1.2.3/8", "https://10.200.0.1/", DIRECT),
            ("::1", "https://[::1]/", DIRECT),
            ("[::1]", "https://[::1]/", DIRECT),
            ("2001:db8::/32", "https://[2001:db8::5]/", DIRECT),
            ("2001:db8::/32", "https://[2001:db9::5]/", PROXY),
            ("192.168.1.7", "https://[::ffff:192.168.1.7]/", DIRECT),
            ("192.168.1.7", "https://host-192.168.1.7.test/", PROXY),
            // A `*` anywhere but alone names nothing.
            ("a*.test", "https://ab.test/", PROXY),
            (".", "https://a.test/", PROXY),
        ] {
            assert_eq!(
                via_proxy(no_proxy, url),
                expected,
                "NO_PROXY={no_proxy:?} {url}"
            );
        }
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
