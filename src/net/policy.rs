//! The user's network policy: which hosts downloads may reach.
//!
//! The policy is a list of host patterns read in one of two modes. In
//! allowlist mode only the listed hosts may be reached; in blocklist mode the
//! listed hosts may not. The policy only ever narrows what the address guard
//! allows: a host the policy permits is still subject to the guard.
//!
//! A pattern is either an exact host (`cdn.example.com`, `203.0.113.7`,
//! `[2001:db8::1]`) or `*.example.com`, which matches every subdomain of
//! `example.com` at any depth but not `example.com` itself. Names compare
//! case-insensitively with a trailing dot ignored; IP addresses compare as
//! addresses, so `[::1]` and `::1` are the same pattern, and an IPv4 pattern
//! matches every IPv6 spelling that carries that address: IPv4-mapped,
//! IPv4-compatible, NAT64 (`64:ff9b::/96` and `64:ff9b:1::/48`), 6to4 and
//! Teredo, as the address guard reads them ([`crate::net::guard::embedded_ipv4`]).
//!
//! An IP entry of a blocklist also applies to every address a name resolves
//! to: each connection dials only addresses the policy permits
//! ([`Policy::permits_address`], checked by the resolver on the vetted
//! answers), so a name cannot lead to a blocked address.

use std::net::IpAddr;

use url::Host;

/// Allowlist: only listed hosts may be reached. Blocklist: listed hosts may
/// not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Only hosts matching a pattern may be reached.
    Allowlist,
    /// Hosts matching a pattern may not be reached; all others may.
    #[default]
    Blocklist,
}

impl Mode {
    /// The mode's name as written in configuration: `"allowlist"` or
    /// `"blocklist"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Allowlist => "allowlist",
            Mode::Blocklist => "blocklist",
        }
    }
}

pub use crate::error::PolicyError;

/// One parsed host pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    /// Exactly this DNS name (normalized).
    Exact(String),
    /// Any strict subdomain of this DNS name (normalized).
    Subdomains(String),
    /// Exactly this address (canonical form).
    Ip(IpAddr),
}

/// A host as the policy compares it.
enum HostKey {
    Name(String),
    Ip(IpAddr),
}

impl Pattern {
    fn matches(&self, host: &HostKey) -> bool {
        match (self, host) {
            (Pattern::Exact(pattern), HostKey::Name(name)) => pattern == name,
            (Pattern::Subdomains(parent), HostKey::Name(name)) => name
                .strip_suffix(parent.as_str())
                .and_then(|rest| rest.strip_suffix('.'))
                .is_some_and(|label| !label.is_empty()),
            (Pattern::Ip(pattern), HostKey::Ip(ip)) => {
                pattern == ip
                    || matches!((pattern, ip), (IpAddr::V4(v4), IpAddr::V6(v6))
                        if crate::net::guard::embedded_ipv4(*v6) == Some(*v4))
            }
            _ => false,
        }
    }
}

/// Parses an IP address written alone or, for IPv6, inside brackets.
fn parse_ip(text: &str) -> Option<IpAddr> {
    let bare = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    bare.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// Normalizes a host (or the part of a pattern after `*.`) the way a URL host
/// is parsed: lowercase, internationalized names in their ASCII form, numeric
/// IPv4 shorthands as addresses, and one trailing dot dropped.
fn host_key(text: &str) -> Option<HostKey> {
    if let Some(ip) = parse_ip(text) {
        return Some(HostKey::Ip(ip));
    }
    let text = crate::net::guard::normalise_host(text);
    match Host::parse(&text).ok()? {
        Host::Domain(domain) => Some(HostKey::Name(domain)),
        Host::Ipv4(v4) => Some(HostKey::Ip(IpAddr::V4(v4))),
        Host::Ipv6(v6) => Some(HostKey::Ip(IpAddr::V6(v6).to_canonical())),
    }
}

fn parse_pattern(raw: &str) -> Result<Pattern, &'static str> {
    if raw.is_empty() {
        return Err("empty pattern");
    }
    if raw.chars().any(char::is_whitespace) {
        return Err("contains whitespace");
    }
    if raw.contains('/') {
        return Err("contains '/' (a pattern is a host, not a URL or a range)");
    }
    if raw.contains('@') {
        return Err("contains '@' (a pattern is a host, not a URL)");
    }
    if let Some(ip) = parse_ip(raw) {
        return Ok(Pattern::Ip(ip));
    }
    if raw.contains(':') {
        return Err("contains ':' (ports are not allowed; IPv6 addresses must be valid)");
    }
    if raw == "*" {
        return Err("'*' alone is not allowed (use the mode to allow or block everything)");
    }
    let (wildcard, rest) = match raw.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, raw),
    };
    if rest.contains('*') {
        return Err("'*' is allowed only as a leading '*.'");
    }
    let trimmed = rest.strip_suffix('.').unwrap_or(rest);
    if trimmed.is_empty() {
        return Err("no domain after '*.'");
    }
    if trimmed.split('.').any(str::is_empty) {
        return Err("empty label");
    }
    match host_key(trimmed) {
        Some(HostKey::Name(name)) if wildcard => Ok(Pattern::Subdomains(name)),
        Some(HostKey::Name(name)) => Ok(Pattern::Exact(name)),
        Some(HostKey::Ip(_)) if wildcard => Err("'*.' cannot be combined with an IP address"),
        Some(HostKey::Ip(ip)) => Ok(Pattern::Ip(ip)),
        None => Err("not a valid host name"),
    }
}

/// The user's network policy: a mode and a list of host patterns.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    mode: Mode,
    patterns: Vec<Pattern>,
    /// The patterns as given, in order.
    hosts: Vec<String>,
}

impl Policy {
    /// Blocklist mode with nothing listed: every host allowed (subject to the
    /// guard).
    pub fn allow_all() -> Self {
        Self::default()
    }

    /// Builds a policy from a mode and host patterns, refusing the first
    /// invalid pattern.
    pub fn new(mode: Mode, hosts: &[String]) -> Result<Self, PolicyError> {
        let patterns = hosts
            .iter()
            .map(|raw| {
                parse_pattern(raw).map_err(|reason| PolicyError::InvalidPattern {
                    pattern: raw.clone(),
                    reason,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let hosts = hosts.to_vec();
        Ok(Self {
            mode,
            patterns,
            hosts,
        })
    }

    /// The policy's mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// How many host patterns it lists.
    pub fn host_count(&self) -> usize {
        self.patterns.len()
    }

    /// The host patterns it lists, as given, in order: what a settings page shows next to [`Policy::mode`].
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// True when the policy lets us reach `host` (a URL host as text: a name,
    /// an IPv4, or an IPv6 with or without brackets).
    ///
    /// A host that cannot be parsed matches no pattern: it is refused in
    /// allowlist mode and left to the guard in blocklist mode.
    pub fn permits(&self, host: &str) -> bool {
        let listed = host_key(host)
            .is_some_and(|key| self.patterns.iter().any(|pattern| pattern.matches(&key)));
        match self.mode {
            Mode::Allowlist => listed,
            Mode::Blocklist => !listed,
        }
    }
}

impl Policy {
    /// True when the policy lets a connection dial `ip`, an address a
    /// permitted name resolved to (after the guard vetted it).
    ///
    /// In blocklist mode a listed IP address is refused whatever name led to
    /// it, so a name cannot reach an address the list blocks. In allowlist
    /// mode the name was what the list permitted: its addresses need no
    /// entry of their own (IP entries there permit IP-literal URLs).
    pub fn permits_address(&self, ip: IpAddr) -> bool {
        match self.mode {
            Mode::Allowlist => true,
            Mode::Blocklist => {
                let key = HostKey::Ip(ip.to_canonical());
                !self.patterns.iter().any(|pattern| pattern.matches(&key))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(mode: Mode, hosts: &[&str]) -> Policy {
        let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
        Policy::new(mode, &hosts).unwrap()
    }

    fn allow(hosts: &[&str]) -> Policy {
        policy(Mode::Allowlist, hosts)
    }

    #[test]
    fn mode_names_and_default() {
        assert_eq!(Mode::Allowlist.as_str(), "allowlist");
        assert_eq!(Mode::Blocklist.as_str(), "blocklist");
        assert_eq!(Mode::default(), Mode::Blocklist);
        let all = Policy::allow_all();
        assert_eq!(all.mode(), Mode::Blocklist);
        assert!(all.permits("example.com"));
        assert!(all.permits("127.0.0.1"));
    }

    #[test]
    fn exact() {
        let p = allow(&["cdn.example.com"]);
        assert!(p.permits("cdn.example.com"));
        assert!(!p.permits("example.com"));
        assert!(!p.permits("a.cdn.example.com"));
        assert!(!p.permits("xcdn.example.com"));
        assert!(!p.permits("cdn.example.com.evil.test"));
    }

    #[test]
    fn wildcard_any_depth_not_apex() {
        let p = allow(&["*.example.com"]);
        assert!(p.permits("a.example.com"));
        assert!(p.permits("a.b.c.example.com"));
        assert!(!p.permits("example.com"));
        assert!(!p.permits("badexample.com"));
        assert!(!p.permits("example.com.evil.test"));
        assert!(!p.permits(".example.com"));
        let both = allow(&["example.com", "*.example.com"]);
        assert!(both.permits("example.com"));
        assert!(both.permits("x.example.com"));
    }

    #[test]
    fn case_and_trailing_dot() {
        let p = allow(&["CDN.Example.COM.", "*.Files.Test"]);
        assert!(p.permits("cdn.example.com"));
        assert!(p.permits("CDN.EXAMPLE.COM"));
        assert!(p.permits("cdn.example.com."));
        assert!(p.permits("a.FILES.test."));
        assert!(!p.permits("files.test"));
    }

    #[test]
    fn internationalized_names() {
        let p = allow(&["bücher.example"]);
        assert!(p.permits("xn--bcher-kva.example"));
        assert!(p.permits("BÜCHER.example"));
    }

    #[test]
    fn ip_patterns() {
        let p = allow(&["203.0.113.7", "[2001:db8::1]", "2001:db8::2"]);
        assert!(p.permits("203.0.113.7"));
        assert!(p.permits("203.0.113.7."));
        assert!(p.permits("[::ffff:203.0.113.7]"));
        assert!(p.permits("2001:db8::1"));
        assert!(p.permits("[2001:db8::1]"));
        assert!(p.permits("[2001:DB8:0:0::1]"));
        assert!(p.permits("[2001:db8::2]"));
        assert!(!p.permits("203.0.113.8"));
        assert!(!p.permits("2001:db8::3"));
        // An IP pattern does not match names, nor the reverse.
        assert!(!allow(&["203.0.113.7"]).permits("203.0.113.7.example"));
        assert!(!allow(&["example.com"]).permits("93.184.215.14"));
        // Loopback in both spellings.
        let p = allow(&["::1"]);
        assert!(p.permits("[::1]"));
        assert!(p.permits("::1"));
        // Numeric shorthands are the same address.
        assert!(allow(&["127.1"]).permits("127.0.0.1"));
    }

    #[test]
    fn an_ipv4_pattern_matches_every_ipv6_embedding_of_it() {
        let block = policy(Mode::Blocklist, &["8.8.8.8"]);
        let allow = allow(&["8.8.8.8"]);
        for host in [
            "8.8.8.8",
            "[::ffff:8.8.8.8]",
            "[::8.8.8.8]",
            "[64:ff9b::8.8.8.8]",
            "[64:ff9b:1::808:808]",
            "[2002:808:808::1]",
            // Teredo: server 65.54.227.120, client 8.8.8.8 (bits inverted).
            "[2001:0:4136:e378:8000:63bf:f7f7:f7f7]",
        ] {
            assert!(!block.permits(host), "blocklist {host}");
            assert!(allow.permits(host), "allowlist {host}");
        }
        for host in [
            "[::ffff:8.8.4.4]",
            "[64:ff9b::8.8.4.4]",
            "[2002:808:404::1]",
            "[2001:db8::808:808]",
            // Teredo whose server, not client, is 8.8.8.8.
            "[2001:0:808:808:8000:63bf:f7f7:f7f6]",
        ] {
            assert!(block.permits(host), "blocklist {host}");
            assert!(!allow.permits(host), "allowlist {host}");
        }
        // An IPv6 pattern is not widened the other way.
        assert!(policy(Mode::Blocklist, &["2002:808:808::1"]).permits("8.8.8.8"));
    }

    #[test]
    fn allowlist_vs_blocklist() {
        let hosts = ["cdn.example.com", "*.mirror.test"];
        let allow = policy(Mode::Allowlist, &hosts);
        let block = policy(Mode::Blocklist, &hosts);
        assert_eq!(allow.mode(), Mode::Allowlist);
        assert_eq!(block.mode(), Mode::Blocklist);
        for (host, listed) in [
            ("cdn.example.com", true),
            ("eu.mirror.test", true),
            ("mirror.test", false),
            ("other.example", false),
        ] {
            assert_eq!(allow.permits(host), listed, "allowlist {host}");
            assert_eq!(block.permits(host), !listed, "blocklist {host}");
        }
        // An empty allowlist permits nothing.
        assert!(!policy(Mode::Allowlist, &[]).permits("example.com"));
        // An unparsable host is never listed.
        assert!(!allow.permits("bad host"));
        assert!(block.permits("bad host"));
    }

    #[test]
    fn invalid_patterns() {
        for (pattern, reason) in [
            ("", "empty pattern"),
            (
                "*",
                "'*' alone is not allowed (use the mode to allow or block everything)",
            ),
            ("*.", "no domain after '*.'"),
            ("a.*.example.com", "'*' is allowed only as a leading '*.'"),
            ("*example.com", "'*' is allowed only as a leading '*.'"),
            ("example.*", "'*' is allowed only as a leading '*.'"),
            ("*.*.example.com", "'*' is allowed only as a leading '*.'"),
            (
                "https://example.com",
                "contains '/' (a pattern is a host, not a URL or a range)",
            ),
            (
                "10.0.0.0/8",
                "contains '/' (a pattern is a host, not a URL or a range)",
            ),
            (
                "example.com:443",
                "contains ':' (ports are not allowed; IPv6 addresses must be valid)",
            ),
            (
                "[::1]:443",
                "contains ':' (ports are not allowed; IPv6 addresses must be valid)",
            ),
            (
                "2001:db8::zz",
                "contains ':' (ports are not allowed; IPv6 addresses must be valid)",
            ),
            ("exa mple.com", "contains whitespace"),
            (" example.com", "contains whitespace"),
            ("example.com\t", "contains whitespace"),
            (
                "user@example.com",
                "contains '@' (a pattern is a host, not a URL)",
            ),
            ("a..example.com", "empty label"),
            (".example.com", "empty label"),
            ("*.1.2.3.4", "'*.' cannot be combined with an IP address"),
            ("999.1.1.1", "not a valid host name"),
            ("exa#mple.com", "not a valid host name"),
        ] {
            let err = Policy::new(Mode::Blocklist, &[pattern.to_owned()]).unwrap_err();
            assert_eq!(
                err,
                PolicyError::InvalidPattern {
                    pattern: pattern.to_owned(),
                    reason
                },
                "{pattern:?}"
            );
        }
        let err =
            Policy::new(Mode::Allowlist, &["ok.example".to_owned(), "*".to_owned()]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid host pattern \"*\": '*' alone is not allowed (use the mode to allow or block everything)"
        );
    }

    #[test]
    fn a_blocklisted_address_is_refused_whatever_name_led_to_it() {
        let block = policy(Mode::Blocklist, &["203.0.113.7", "blocked.test"]);
        assert!(!block.permits_address("203.0.113.7".parse().unwrap()));
        assert!(!block.permits_address("::ffff:203.0.113.7".parse().unwrap()));
        assert!(block.permits_address("203.0.113.8".parse().unwrap()));
        // The names listed say nothing of addresses.
        let allow = allow(&["cdn.test"]);
        assert!(allow.permits_address("203.0.113.7".parse().unwrap()));
    }
}
