//! The address guard: refuses local and internal-network destinations.
//!
//! Plugin manifests are untrusted, so a URL in one must never make us connect
//! to this machine, to the local network, or to any other address that is not
//! globally reachable (cloud metadata endpoints, routers, services bound to
//! loopback, ...). The guard is applied twice: to the host written in the URL
//! ([`AddressGuard::check_host`]) and to every address that host resolves to
//! ([`AddressGuard::check_ip`]), so a public name pointing at a private
//! address is refused as well.
//!
//! The IPv4 rules follow the IANA IPv4 Special-Purpose Address Registry; the
//! IPv6 rules allow only global unicast (`2000::/3`) minus its special-purpose
//! blocks, plus the transition formats that embed an IPv4 address, which is
//! then judged by the IPv4 rules.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use url::Host;

pub use crate::error::Blocked;
use crate::error::NAME_RULE_REASONS;

/// The ways an IPv6 address can carry an IPv4 address; used to index
/// [`V4Block::embedded`].
#[derive(Clone, Copy)]
enum Embedding {
    /// `::ffff:0:0/96`
    Mapped = 0,
    /// `::/96` (deprecated IPv4-compatible form)
    Compatible = 1,
    /// `64:ff9b::/96`, the well-known NAT64 prefix
    Nat64 = 2,
    /// `2002::/16`
    SixToFour = 3,
    /// `2001::/32`, the Teredo server address
    TeredoServer = 4,
    /// `2001::/32`, the (obfuscated) Teredo client address
    TeredoClient = 5,
}

/// One row of the IPv4 special-purpose table.
struct V4Block {
    net: [u8; 4],
    prefix_len: u32,
    reason: &'static str,
    /// The reason when this block is reached through an IPv6 embedding,
    /// indexed by [`Embedding`].
    embedded: [&'static str; 6],
}

impl V4Block {
    fn contains(&self, ip: Ipv4Addr) -> bool {
        prefix_match(
            u128::from(u32::from(ip)) << 96,
            u128::from(u32::from_be_bytes(self.net)) << 96,
            self.prefix_len,
        )
    }
}

/// Builds a [`V4Block`], spelling out the reason once per embedding.
macro_rules! v4 {
    ($net:expr, $len:expr, $reason:literal) => {
        V4Block {
            net: $net,
            prefix_len: $len,
            reason: $reason,
            embedded: [
                concat!("IPv4-mapped ", $reason),
                concat!("IPv4-compatible ", $reason),
                concat!("NAT64 ", $reason),
                concat!("6to4 ", $reason),
                concat!("Teredo server ", $reason),
                concat!("Teredo client ", $reason),
            ],
        }
    };
}

/// Every IPv4 block of the IANA special-purpose registry that is not globally
/// reachable, plus multicast and the reserved class E space. The first match
/// wins, so more specific rows come first.
const V4_SPECIAL: &[V4Block] = &[
    v4!([0, 0, 0, 0], 8, "this network"),
    v4!([10, 0, 0, 0], 8, "private network (10.0.0.0/8)"),
    v4!([100, 64, 0, 0], 10, "carrier-grade NAT"),
    v4!([127, 0, 0, 0], 8, "loopback"),
    v4!([169, 254, 0, 0], 16, "link-local"),
    v4!([172, 16, 0, 0], 12, "private network (172.16.0.0/12)"),
    v4!([192, 0, 0, 0], 24, "IETF protocol assignments"),
    v4!([192, 0, 2, 0], 24, "documentation (192.0.2.0/24)"),
    v4!([192, 88, 99, 0], 24, "6to4 relay anycast"),
    v4!([192, 168, 0, 0], 16, "private network (192.168.0.0/16)"),
    v4!([198, 18, 0, 0], 15, "benchmarking"),
    v4!([198, 51, 100, 0], 24, "documentation (198.51.100.0/24)"),
    v4!([203, 0, 113, 0], 24, "documentation (203.0.113.0/24)"),
    v4!([224, 0, 0, 0], 4, "multicast"),
    v4!([255, 255, 255, 255], 32, "limited broadcast"),
    v4!([240, 0, 0, 0], 4, "reserved (240.0.0.0/4)"),
];

/// IPv6 blocks refused outright, with their reasons. The first match wins.
/// Embeddings of IPv4 addresses (`::ffff:0:0/96`, `::/96`, `64:ff9b::/96`,
/// `2002::/16`, `2001::/32`) are handled before this table is consulted.
const V6_SPECIAL: &[(u128, u32, &str)] = &[
    // Outside global unicast.
    (0x0064_ff9b_0001 << 80, 48, "local-use NAT64"),
    (0x0100 << 112, 64, "discard-only"),
    (0xfe80 << 112, 10, "link-local"),
    (0xfec0 << 112, 10, "site-local"),
    (0xfc00 << 112, 7, "unique local"),
    (0xff00 << 112, 8, "multicast"),
    (0x5f00 << 112, 16, "SRv6 segment identifiers"),
    // Inside 2000::/3 but not globally reachable.
    (0x2001_0db8 << 96, 32, "documentation (2001:db8::/32)"),
    (0x3fff << 112, 20, "documentation (3fff::/20)"),
    (0x2001_0002 << 96, 48, "benchmarking"),
    (0x2001_0010 << 96, 28, "ORCHID"),
    (0x2001_0020 << 96, 28, "ORCHIDv2"),
    (0x2001 << 112, 23, "IETF protocol assignments"),
];

/// True when the top `len` bits of `addr` and `net` agree.
fn prefix_match(addr: u128, net: u128, len: u32) -> bool {
    match len {
        0 => true,
        1..=128 => (addr ^ net) >> (128 - len) == 0,
        _ => false,
    }
}

/// The special-purpose block holding `ip`, if any.
fn v4_block(ip: Ipv4Addr) -> Option<&'static V4Block> {
    V4_SPECIAL.iter().find(|block| block.contains(ip))
}

/// The reason an IPv4 address carried inside an IPv6 address is refused.
fn classify_embedded(ip: Ipv4Addr, how: Embedding) -> Option<&'static str> {
    v4_block(ip).map(|block| block.embedded[how as usize])
}

/// The IPv4 address in the low 32 bits of `bits`.
fn low_v4(bits: u128) -> Ipv4Addr {
    // Truncation keeps exactly the low 32 bits.
    Ipv4Addr::from(bits as u32)
}

/// An IPv4 address carried inside an IPv6 address.
enum Embedded {
    /// One address, carried the way `Embedding` says.
    One(Embedding, Ipv4Addr),
    /// A Teredo address: its server, and its (de-obfuscated) client.
    Teredo { server: Ipv4Addr, client: Ipv4Addr },
}

/// The IPv4 address(es) `bits` carries, if it is one of the transition
/// formats. `::` and `::1` are not IPv4-compatible addresses.
fn embedding(bits: u128) -> Option<Embedded> {
    // ::ffff:a.b.c.d
    if prefix_match(bits, 0xffff << 32, 96) {
        return Some(Embedded::One(Embedding::Mapped, low_v4(bits)));
    }
    // ::a.b.c.d
    if prefix_match(bits, 0, 96) && bits > 1 {
        return Some(Embedded::One(Embedding::Compatible, low_v4(bits)));
    }
    // 64:ff9b::a.b.c.d
    if prefix_match(bits, 0x0064_ff9b << 96, 96) {
        return Some(Embedded::One(Embedding::Nat64, low_v4(bits)));
    }
    // 2002:AABB:CCDD::/48 carries a.b.c.d in bits 16..48.
    if prefix_match(bits, 0x2002 << 112, 16) {
        return Some(Embedded::One(Embedding::SixToFour, low_v4(bits >> 80)));
    }
    // Teredo, 2001:0:SSSS:SSSS:flags:port:CCCC:CCCC.
    if prefix_match(bits, 0x2001 << 112, 32) {
        return Some(Embedded::Teredo {
            server: low_v4(bits >> 64),
            client: low_v4(!bits),
        });
    }
    None
}

/// The IPv4 address an IPv6 address reaches through a transition format:
/// IPv4-mapped, IPv4-compatible, NAT64 (the well-known `64:ff9b::/96` and
/// the local-use `64:ff9b:1::/48`, whose usual `/96` prefixes carry the
/// address in the low 32 bits), 6to4, and Teredo (its client, the host the
/// traffic is relayed to; the Teredo server only helps set up the tunnel).
///
/// The policy uses this so that an IPv4 pattern matches every IPv6
/// spelling of that address.
pub fn embedded_ipv4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = u128::from(ip);
    match embedding(bits) {
        Some(Embedded::One(_, v4)) => Some(v4),
        Some(Embedded::Teredo { client, .. }) => Some(client),
        None if prefix_match(bits, 0x0064_ff9b_0001 << 80, 48) => Some(low_v4(bits)),
        None => None,
    }
}

fn classify_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let bits = u128::from(ip);
    if bits == 0 {
        return Some("unspecified");
    }
    if bits == 1 {
        return Some("loopback");
    }
    match embedding(bits) {
        Some(Embedded::One(how, v4)) => return classify_embedded(v4, how),
        // The whole Teredo prefix lies in the IETF protocol assignment block
        // 2001::/23, which is not globally reachable, and a Teredo relay
        // forwards to whatever client address the IPv6 address names, so
        // every Teredo address is refused; the embedded addresses only make
        // the reason more precise.
        Some(Embedded::Teredo { server, client }) => {
            return classify_embedded(server, Embedding::TeredoServer)
                .or_else(|| classify_embedded(client, Embedding::TeredoClient))
                .or(Some("Teredo tunnel (2001::/32)"));
        }
        None => {}
    }
    if let Some(&(_, _, reason)) = V6_SPECIAL
        .iter()
        .find(|&&(net, len, _)| prefix_match(bits, net, len))
    {
        return Some(reason);
    }
    if prefix_match(bits, 0x2000 << 112, 3) {
        None
    } else {
        Some("not global unicast (outside 2000::/3)")
    }
}

/// Returns `Some(reason)` when `ip` is not a globally reachable unicast
/// address, `None` when it may be contacted.
pub fn classify_ip(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_block(v4).map(|block| block.reason),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

/// Domain suffixes that only ever name local or private hosts, with the
/// reason given when a name is refused for ending in one. A name equal to the
/// suffix itself is refused too.
///
/// - `localhost` (RFC 6761): always this machine.
/// - `local` (RFC 6762): multicast DNS, answered only on the local link.
/// - `internal`: reserved by ICANN for private use, never delegated publicly.
/// - `home.arpa` (RFC 8375): home networks.
/// - `localdomain`: the conventional domain of `localhost.localdomain` and of
///   hosts without a real domain; never delegated publicly.
const LOCAL_SUFFIXES: &[(&str, &str)] = &[
    ("localhost", NAME_RULE_REASONS[0]),
    ("local", NAME_RULE_REASONS[1]),
    ("internal", NAME_RULE_REASONS[2]),
    ("home.arpa", NAME_RULE_REASONS[3]),
    ("localdomain", NAME_RULE_REASONS[4]),
];

/// A host name as every rule of the crate compares it (the address guard,
/// the policy, fixed DNS answers, `NO_PROXY`, per-host slots): ASCII lower
/// case, and one trailing dot (the DNS root, `cdn.example.com.`) dropped.
/// A second trailing dot is kept: `a.test..` is not `a.test`.
pub(crate) fn normalise_host(name: &str) -> String {
    let name = name.strip_suffix('.').unwrap_or(name);
    name.to_ascii_lowercase()
}

/// A host as [`AddressGuard::with_internal_hosts`] compares it: an IP
/// literal in its canonical text, a name normalised.
fn host_key(host: &str) -> String {
    match parse_name(host) {
        NameKind::Ip(ip) => ip.to_canonical().to_string(),
        NameKind::Domain(name) => name,
        NameKind::Malformed => normalise_host(host),
    }
}

/// The by-name rule on a name already normalised by [`normalise_host`].
fn classify_domain(name: &str) -> Option<&'static str> {
    LOCAL_SUFFIXES.iter().find_map(|&(suffix, reason)| {
        let hit = name == suffix
            || name
                .strip_suffix(suffix)
                .is_some_and(|rest| rest.ends_with('.'));
        hit.then_some(reason)
    })
}

/// What a host name turns out to be once parsed.
enum NameKind {
    /// The name is an IP address written as text (any form the URL standard
    /// accepts, such as `127.1` or `0x7f000001`).
    Ip(IpAddr),
    /// A DNS name, normalized (lowercase ASCII, no trailing dot).
    Domain(String),
    /// Not a valid host at all.
    Malformed,
}

/// Parses `name` the way a URL host is parsed, so that names reaching us
/// outside a URL are judged exactly as the same text inside one would be.
fn parse_name(name: &str) -> NameKind {
    let bare = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(name);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return NameKind::Ip(ip);
    }
    match Host::parse(name) {
        Ok(Host::Domain(domain)) => {
            let name = normalise_host(&domain);
            // An empty label (`a..b`, `a.localhost..`) names nothing in
            // DNS, and would slip past the by-name rule.
            if name.split('.').any(str::is_empty) {
                NameKind::Malformed
            } else {
                NameKind::Domain(name)
            }
        }
        Ok(Host::Ipv4(v4)) => NameKind::Ip(IpAddr::V4(v4)),
        Ok(Host::Ipv6(v6)) => NameKind::Ip(IpAddr::V6(v6)),
        Err(_) => NameKind::Malformed,
    }
}

/// Returns `Some(reason)` when a DNS name is local by name.
///
/// The name is case-insensitive and a trailing dot is ignored. A name that is
/// really an IP address in text form (including the numeric shorthands URLs
/// accept, such as `127.1`) is classified as that address. A name that is not
/// a valid host at all is refused.
pub fn classify_name(name: &str) -> Option<&'static str> {
    match parse_name(name) {
        NameKind::Ip(ip) => classify_ip(ip),
        NameKind::Domain(domain) => classify_domain(&domain),
        NameKind::Malformed => Some("malformed host name"),
    }
}

/// Checks hosts and addresses against the local-address rules, with optional
/// exemptions for development and tests.
#[derive(Debug, Clone, Default)]
pub struct AddressGuard {
    exempt: Vec<IpNet>,
    exempt_names: Vec<String>,
    /// Hosts (names or IP literals, normalised) that may be on a local or
    /// internal-network address, by name and by every address they
    /// resolve to: only the `[cache]` section names them, and only for
    /// the cache's own requests.
    internal_hosts: Vec<String>,
}

impl AddressGuard {
    /// Production guard: nothing exempt.
    pub fn new() -> Self {
        Self::default()
    }

    /// Development/test guard: IPs inside `ranges` are allowed even when
    /// local; names in `names` (compared lowercase, trailing dot stripped)
    /// skip the by-name rule (their resolved addresses are still checked).
    pub fn with_exemptions(ranges: Vec<IpNet>, names: Vec<String>) -> Self {
        Self {
            exempt: ranges,
            exempt_names: names.iter().map(|n| normalise_host(n)).collect(),
            internal_hosts: Vec::new(),
        }
    }

    /// The same guard letting `hosts` (names or IP literals) be on a local
    /// or internal-network address: the host itself and every address its
    /// name resolves to pass. Any other host, a redirect target included,
    /// is judged as before.
    pub fn with_internal_hosts(mut self, hosts: &[String]) -> Self {
        self.internal_hosts = hosts.iter().map(|h| host_key(h)).collect();
        self
    }

    /// Whether `host` (a name, or an IP literal in any spelling a URL
    /// takes) is one of the hosts [`AddressGuard::with_internal_hosts`]
    /// names.
    pub fn is_internal_host(&self, host: &str) -> bool {
        !self.internal_hosts.is_empty() && self.internal_hosts.contains(&host_key(host))
    }

    fn is_exempt(&self, ip: IpAddr) -> bool {
        let canonical = ip.to_canonical();
        self.exempt
            .iter()
            .any(|net| net.contains(&ip) || net.contains(&canonical))
    }

    /// Refuses `ip` unless it is globally reachable or lies (itself or in its
    /// canonical form) in an exempt range.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Blocked> {
        if self.is_exempt(ip) {
            return Ok(());
        }
        match classify_ip(ip) {
            Some(reason) => Err(Blocked::new(ip.to_string(), reason)),
            None => Ok(()),
        }
    }

    /// Checks a parsed URL host: a domain gets the by-name rule (unless its
    /// name is exempt), an IPv4 or IPv6 literal gets [`AddressGuard::check_ip`].
    pub fn check_host(&self, host: &Host<&str>) -> Result<(), Blocked> {
        if !self.internal_hosts.is_empty() && self.is_internal_host(&host.to_string()) {
            return Ok(());
        }
        match *host {
            Host::Domain(name) => self.check_name(name),
            Host::Ipv4(v4) => self.check_ip(IpAddr::V4(v4)),
            Host::Ipv6(v6) => self.check_ip(IpAddr::V6(v6)),
        }
    }

    fn check_name(&self, name: &str) -> Result<(), Blocked> {
        match parse_name(name) {
            NameKind::Ip(ip) => self.check_ip(ip),
            NameKind::Domain(domain) => {
                if self.exempt_names.contains(&domain) {
                    return Ok(());
                }
                match classify_domain(&domain) {
                    Some(reason) => Err(Blocked::new(name, reason)),
                    None => Ok(()),
                }
            }
            NameKind::Malformed => Err(Blocked::new(name, "malformed host name")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_normalise_to_ascii_lower_case_without_one_trailing_dot() {
        for (name, normal) in [
            ("cdn.example.com", "cdn.example.com"),
            ("CDN.Example.COM.", "cdn.example.com"),
            ("a.test..", "a.test."),
            ("É.TEST", "É.test"),
            (".", ""),
        ] {
            assert_eq!(normalise_host(name), normal, "{name}");
        }
    }

    #[test]
    fn a_name_with_an_empty_label_is_malformed() {
        for name in [
            "a.localhost..",
            "localhost..",
            "a..example.com",
            ".",
            "..",
            ".a.test",
        ] {
            assert_eq!(classify_name(name), Some("malformed host name"), "{name}");
        }
        assert_eq!(classify_name("a.localhost."), Some("local host name"));
        assert_eq!(classify_name("cdn.example.com."), None);
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn address_table() {
        // (address, expected reason or None when allowed)
        let rows: &[(&str, Option<&str>)] = &[
            ("127.0.0.1", Some("loopback")),
            ("127.255.255.254", Some("loopback")),
            ("10.1.2.3", Some("private network (10.0.0.0/8)")),
            ("172.16.0.1", Some("private network (172.16.0.0/12)")),
            ("172.31.255.255", Some("private network (172.16.0.0/12)")),
            ("172.32.0.1", None),
            ("192.168.1.1", Some("private network (192.168.0.0/16)")),
            ("169.254.169.254", Some("link-local")),
            ("100.64.0.1", Some("carrier-grade NAT")),
            ("100.127.255.255", Some("carrier-grade NAT")),
            ("100.128.0.1", None),
            ("0.0.0.0", Some("this network")),
            ("255.255.255.255", Some("limited broadcast")),
            ("224.0.0.1", Some("multicast")),
            ("239.255.255.250", Some("multicast")),
            ("240.0.0.1", Some("reserved (240.0.0.0/4)")),
            ("192.0.2.1", Some("documentation (192.0.2.0/24)")),
            ("198.51.100.7", Some("documentation (198.51.100.0/24)")),
            ("203.0.113.9", Some("documentation (203.0.113.0/24)")),
            ("198.18.0.1", Some("benchmarking")),
            ("198.19.255.255", Some("benchmarking")),
            ("198.20.0.1", None),
            ("192.0.0.8", Some("IETF protocol assignments")),
            ("192.88.99.1", Some("6to4 relay anycast")),
            ("8.8.8.8", None),
            ("1.1.1.1", None),
            ("::", Some("unspecified")),
            ("::1", Some("loopback")),
            ("fe80::1", Some("link-local")),
            ("fc00::1", Some("unique local")),
            ("fd12::1", Some("unique local")),
            ("ff02::1", Some("multicast")),
            ("fec0::1", Some("site-local")),
            ("::ffff:127.0.0.1", Some("IPv4-mapped loopback")),
            (
                "::ffff:10.0.0.1",
                Some("IPv4-mapped private network (10.0.0.0/8)"),
            ),
            ("::ffff:8.8.8.8", None),
            ("::127.0.0.1", Some("IPv4-compatible loopback")),
            ("::8.8.8.8", None),
            ("64:ff9b::7f00:1", Some("NAT64 loopback")),
            ("64:ff9b::808:808", None),
            ("64:ff9b:1::1", Some("local-use NAT64")),
            ("2002:7f00:1::1", Some("6to4 loopback")),
            ("2002:a00:1::", Some("6to4 private network (10.0.0.0/8)")),
            ("2002:808:808::1", None),
            // Teredo: server 65.54.227.120, client 0x80fffffe ^ 0xffffffff
            // = 127.0.0.1.
            (
                "2001:0:4136:e378:8000:63bf:80ff:fffe",
                Some("Teredo client loopback"),
            ),
            // Teredo: server 10.0.0.1.
            (
                "2001:0:a00:1:8000:63bf:f7f7:f7f7",
                Some("Teredo server private network (10.0.0.0/8)"),
            ),
            // Teredo: server 65.54.227.120, client 8.8.8.8; still refused.
            (
                "2001:0:4136:e378:8000:63bf:f7f7:f7f7",
                Some("Teredo tunnel (2001::/32)"),
            ),
            ("2001:db8::1", Some("documentation (2001:db8::/32)")),
            ("3fff::1", Some("documentation (3fff::/20)")),
            ("3fff:fff::1", Some("documentation (3fff::/20)")),
            ("3fff:1000::1", None),
            ("2001:2::1", Some("benchmarking")),
            ("2001:10::1", Some("ORCHID")),
            ("2001:20::1", Some("ORCHIDv2")),
            ("2001:1::1", Some("IETF protocol assignments")),
            ("2001:1ff::1", Some("IETF protocol assignments")),
            ("2001:200::1", None),
            ("2001:4860:4860::8888", None),
            ("2606:4700:4700::1111", None),
            ("100::1", Some("discard-only")),
            (
                "100:0:0:1::1",
                Some("not global unicast (outside 2000::/3)"),
            ),
            ("5f00::1", Some("SRv6 segment identifiers")),
            ("4000::1", Some("not global unicast (outside 2000::/3)")),
            (
                "::ffff:0:7f00:1",
                Some("not global unicast (outside 2000::/3)"),
            ),
        ];
        let guard = AddressGuard::new();
        for &(text, expected) in rows {
            let addr = ip(text);
            assert_eq!(classify_ip(addr), expected, "classify_ip({text})");
            let result = guard.check_ip(addr);
            match expected {
                None => assert_eq!(result, Ok(()), "check_ip({text})"),
                Some(reason) => assert_eq!(
                    result,
                    Err(Blocked::new(addr.to_string(), reason)),
                    "check_ip({text})"
                ),
            }
        }
    }

    fn check_url(guard: &AddressGuard, text: &str) -> Result<(), Blocked> {
        let url = url::Url::parse(text).unwrap();
        guard.check_host(&url.host().unwrap())
    }

    #[test]
    fn urls() {
        let refused: &[(&str, &str)] = &[
            ("https://localhost/", "local host name"),
            ("https://LOCALHOST./", "local host name"),
            ("https://foo.localhost/", "local host name"),
            ("https://a.b.LocalHost/", "local host name"),
            (
                "https://localhost.localdomain/",
                "local domain (.localdomain)",
            ),
            ("https://printer.local/", "multicast DNS name (.local)"),
            (
                "https://router.home.arpa/",
                "home network domain (.home.arpa)",
            ),
            (
                "https://metadata.internal/",
                "private-use domain (.internal)",
            ),
            (
                "https://metadata.google.internal./",
                "private-use domain (.internal)",
            ),
            ("https://%6cocalhost/", "local host name"),
            ("https://127.1/", "loopback"),
            ("https://0x7f.0.0.1/", "loopback"),
            ("https://017700000001/", "loopback"),
            ("https://2130706433/", "loopback"),
            ("https://127.0.0.1./", "loopback"),
            ("https://[::ffff:127.0.0.1]/", "IPv4-mapped loopback"),
            ("https://[::1]/", "loopback"),
            ("https://0/", "this network"),
            ("https://169.254.169.254/latest/meta-data/", "link-local"),
        ];
        let guard = AddressGuard::new();
        for &(text, reason) in refused {
            let err = check_url(&guard, text).unwrap_err();
            assert_eq!(err.reason, reason, "{text}");
        }
        for text in [
            "https://example.com/",
            "https://8.8.8.8/",
            "https://localhost.example.com/",
            "https://notlocalhost/",
            "https://local.example/",
            "https://[2606:4700:4700::1111]/",
        ] {
            assert_eq!(check_url(&guard, text), Ok(()), "{text}");
        }
    }

    #[test]
    fn blocked_message() {
        let err = check_url(&AddressGuard::new(), "https://localhost/").unwrap_err();
        assert_eq!(err.address, "localhost");
        assert_eq!(
            err.to_string(),
            "localhost is a local or internal-network address (local host name; for a local test origin, give the name a fixed answer under `[dev] resolve` and that address under `[dev] allow_addresses`, see docs/configuration.md)"
        );
        let err = AddressGuard::new().check_ip(ip("10.0.0.1")).unwrap_err();
        assert_eq!(err.address, "10.0.0.1");
    }

    #[test]
    fn names() {
        for name in [
            "localhost",
            "LOCALHOST.",
            "x.localhost",
            "localhost.localdomain",
            "box.localdomain",
            "nas.local",
            "local",
            "db.internal",
            "home.arpa",
            "tv.home.arpa",
        ] {
            assert!(classify_name(name).is_some(), "{name}");
        }
        for name in [
            "example.com",
            "localhost.example.com",
            "localhosts",
            "home.arpa.example",
        ] {
            assert_eq!(classify_name(name), None, "{name}");
        }
        // Numeric names reaching us outside a URL are judged as addresses.
        assert_eq!(classify_name("127.0.0.1"), Some("loopback"));
        assert_eq!(classify_name("127.1"), Some("loopback"));
        assert_eq!(classify_name("0x7f000001"), Some("loopback"));
        assert_eq!(
            classify_name("10.0.0.1."),
            Some("private network (10.0.0.0/8)")
        );
        assert_eq!(classify_name("::1"), Some("loopback"));
        assert_eq!(classify_name("[::1]"), Some("loopback"));
        assert_eq!(classify_name("8.8.8.8"), None);
        assert_eq!(classify_name("999.1.1.1"), Some("malformed host name"));
        assert_eq!(classify_name(""), Some("malformed host name"));
    }

    #[test]
    fn numeric_domain_from_url_api_is_judged_as_address() {
        let guard = AddressGuard::new();
        let err = guard.check_host(&Host::Domain("127.1")).unwrap_err();
        assert_eq!(err.reason, "loopback");
        assert_eq!(err.address, "127.0.0.1");
    }

    #[test]
    fn exempt_ranges() {
        let guard = AddressGuard::with_exemptions(vec!["127.0.0.1/32".parse().unwrap()], vec![]);
        assert_eq!(guard.check_ip(ip("127.0.0.1")), Ok(()));
        assert_eq!(guard.check_ip(ip("::ffff:127.0.0.1")), Ok(()));
        assert_eq!(check_url(&guard, "https://127.0.0.1:8443/"), Ok(()));
        assert_eq!(check_url(&guard, "https://[::ffff:127.0.0.1]/"), Ok(()));
        assert!(guard.check_ip(ip("127.0.0.2")).is_err());
        assert!(guard.check_ip(ip("10.0.0.1")).is_err());
        assert!(guard.check_ip(ip("::1")).is_err());
        // Ranges do not exempt names.
        assert!(check_url(&guard, "https://localhost/").is_err());
    }

    #[test]
    fn internal_hosts_pass_only_themselves() {
        let guard = AddressGuard::new()
            .with_internal_hosts(&["Registry.Corp.Internal.".into(), "10.0.0.5".into()]);
        assert_eq!(check_url(&guard, "https://registry.corp.internal/"), Ok(()));
        assert_eq!(check_url(&guard, "https://10.0.0.5/"), Ok(()));
        assert_eq!(check_url(&guard, "https://[::ffff:10.0.0.5]/"), Ok(()));
        assert!(check_url(&guard, "https://blobs.corp.internal/").is_err());
        assert!(check_url(&guard, "https://10.0.0.6/").is_err());
        assert!(guard.is_internal_host("REGISTRY.corp.internal"));
        assert!(!AddressGuard::new().is_internal_host("registry.corp.internal"));
    }

    #[test]
    fn exempt_names() {
        let guard = AddressGuard::with_exemptions(vec![], vec!["LocalHost.".to_owned()]);
        assert_eq!(check_url(&guard, "https://localhost/"), Ok(()));
        assert_eq!(check_url(&guard, "https://LOCALHOST./"), Ok(()));
        assert!(check_url(&guard, "https://foo.localhost/").is_err());
        // The resolved address is still checked.
        assert!(guard.check_ip(ip("127.0.0.1")).is_err());
    }
}
