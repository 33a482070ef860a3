//! An independent classifier of IP addresses, written from the IANA IPv4 and
//! IPv6 Special-Purpose Address Registries (their "Globally Reachable"
//! column) and the IPv6 address space registry, to check the address guard
//! against. It shares no table or code with `src/guard.rs` on purpose; the
//! fuzz crate includes this file too.
//!
//! Besides "global" and "not global", a third verdict names the addresses the
//! guard refuses by design although IANA marks them globally reachable (or
//! has no such column for them): multicast, the whole `192.0.0.0/24` and
//! `2001::/23` blocks, the deprecated 6to4 relay anycast, Teredo and the
//! embeddings of a refused IPv4 address.

use std::net::{Ipv4Addr, Ipv6Addr};

/// What IANA (plus the guard's documented extra refusals) says of an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Globally reachable unicast: the guard must allow it.
    Global,
    /// Marked not globally reachable by IANA: the guard must refuse it.
    NotGlobal,
    /// Globally reachable by IANA but refused by the guard's design.
    RefusedByDesign,
}

impl Verdict {
    /// Whether the guard must refuse the address.
    pub fn refused(self) -> bool {
        self != Verdict::Global
    }
}

/// IPv4 Special-Purpose Address Registry rows whose "Globally Reachable" is
/// False: `(first address, prefix length)`.
const V4_NOT_GLOBAL: &[(u32, u32)] = &[
    (0x0000_0000, 8),  // "This network", RFC 791
    (0x0a00_0000, 8),  // Private-Use, RFC 1918
    (0x6440_0000, 10), // Shared Address Space, RFC 6598
    (0x7f00_0000, 8),  // Loopback, RFC 1122
    (0xa9fe_0000, 16), // Link Local, RFC 3927
    (0xac10_0000, 12), // Private-Use, RFC 1918
    (0xc000_0000, 24), // IETF Protocol Assignments, RFC 6890
    (0xc000_0200, 24), // Documentation (TEST-NET-1), RFC 5737
    (0xc0a8_0000, 16), // Private-Use, RFC 1918
    (0xc612_0000, 15), // Benchmarking, RFC 2544
    (0xc633_6400, 24), // Documentation (TEST-NET-2), RFC 5737
    (0xcb00_7100, 24), // Documentation (TEST-NET-3), RFC 5737
    (0xf000_0000, 4),  // Reserved, RFC 1112
    (0xffff_ffff, 32), // Limited Broadcast, RFC 919
];

/// IPv4 rows marked globally reachable inside a block that is not.
const V4_GLOBAL_EXCEPTIONS: &[(u32, u32)] = &[
    (0xc000_0009, 32), // Port Control Protocol Anycast, RFC 7723
    (0xc000_000a, 32), // TURN Anycast, RFC 8155
];

/// IPv4 addresses the guard refuses although IANA does not mark them.
const V4_REFUSED_BY_DESIGN: &[(u32, u32)] = &[
    (0xc000_0000, 24), // the whole IETF protocol assignments block
    (0xc058_6300, 24), // Deprecated 6to4 Relay Anycast, RFC 7526
    (0xe000_0000, 4),  // Multicast, RFC 5771 (not unicast at all)
];

fn in_v4(ip: u32, table: &[(u32, u32)]) -> bool {
    table.iter().any(|&(net, len)| {
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        ip & mask == net & mask
    })
}

/// The verdict for an IPv4 address.
pub fn classify_v4(ip: Ipv4Addr) -> Verdict {
    let bits = u32::from(ip);
    if in_v4(bits, V4_NOT_GLOBAL) && !in_v4(bits, V4_GLOBAL_EXCEPTIONS) {
        Verdict::NotGlobal
    } else if in_v4(bits, V4_REFUSED_BY_DESIGN) {
        Verdict::RefusedByDesign
    } else {
        Verdict::Global
    }
}

/// IPv6 Special-Purpose Address Registry rows whose "Globally Reachable" is
/// False, plus the architecture's non-global space (multicast, deprecated
/// site-local): `(first address, prefix length)`.
const V6_NOT_GLOBAL: &[(u128, u32)] = &[
    (0, 128),                          // Unspecified, RFC 4291
    (1, 128),                          // Loopback, RFC 4291
    (0xffff_0000_0000, 96),            // IPv4-mapped, RFC 4291
    (0x0064_ff9b_0001 << 80, 48),      // IPv4-IPv6 Translat. (local use), RFC 8215
    (0x0100 << 112, 64),               // Discard-Only, RFC 6666
    (0x0100_0000_0000_0001 << 64, 64), // Dummy IPv6 Prefix, RFC 9780
    (0x2001 << 112, 23),               // IETF Protocol Assignments, RFC 2928
    (0x2001_0db8 << 96, 32),           // Documentation, RFC 3849
    (0x3fff << 112, 20),               // Documentation, RFC 9637
    (0x5f00 << 112, 16),               // Segment Routing (SRv6) SIDs, RFC 9602
    (0xfc00 << 112, 7),                // Unique-Local, RFC 4193
    (0xfe80 << 112, 10),               // Link-Local Unicast, RFC 4291
    (0xfec0 << 112, 10),               // Site-local (deprecated), RFC 3879
    (0xff00 << 112, 8),                // Multicast, RFC 4291
];

/// IPv6 rows inside `2001::/23` that IANA marks globally reachable; the
/// guard refuses the whole block by design.
const V6_GLOBAL_IN_2001_23: &[(u128, u32)] = &[
    ((0x2001_0001 << 96) | 1, 128), // PCP Anycast, RFC 7723
    ((0x2001_0001 << 96) | 2, 128), // TURN Anycast, RFC 8155
    ((0x2001_0001 << 96) | 3, 128), // DNS-SD Service Registration Protocol Anycast, RFC 9665
    (0x2001_0003 << 96, 32),        // AMT, RFC 7450
    (0x2001_0004_0112 << 80, 48),   // AS112-v6, RFC 7535
    (0x2001_0020 << 96, 28),        // ORCHIDv2, RFC 7343
];

fn in_v6(ip: u128, table: &[(u128, u32)]) -> bool {
    table.iter().any(|&(net, len)| {
        let mask = if len == 0 {
            0
        } else {
            u128::MAX << (128 - len)
        };
        ip & mask == net & mask
    })
}

/// How an IPv6 address carries an IPv4 address, when it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Embedded {
    /// `::ffff:a.b.c.d`
    Mapped(Ipv4Addr),
    /// `::a.b.c.d` (deprecated IPv4-compatible form; not `::` or `::1`)
    Compatible(Ipv4Addr),
    /// `64:ff9b::a.b.c.d`, the well-known NAT64 prefix
    Nat64(Ipv4Addr),
    /// `2002:aabb:ccdd::/48`
    SixToFour(Ipv4Addr),
}

/// The IPv4 address an IPv6 address carries in a form the guard judges by
/// the carried address.
pub fn embedded_v4(ip: Ipv6Addr) -> Option<Embedded> {
    let bits = u128::from(ip);
    let low = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
    if bits >> 32 == 0xffff {
        Some(Embedded::Mapped(low))
    } else if bits >> 32 == 0 && bits > 1 {
        Some(Embedded::Compatible(low))
    } else if bits >> 32 == 0x0064_ff9b_0000_0000_0000_0000 {
        Some(Embedded::Nat64(low))
    } else if bits >> 112 == 0x2002 {
        Some(Embedded::SixToFour(Ipv4Addr::from(
            ((bits >> 80) & 0xffff_ffff) as u32,
        )))
    } else {
        None
    }
}

/// The verdict for an IPv6 address. Embedded IPv4 addresses get the IPv4
/// verdict; Teredo (`2001::/32`) lies in `2001::/23` and is not global.
pub fn classify_v6(ip: Ipv6Addr) -> Verdict {
    let bits = u128::from(ip);
    if let Some(embedded) = embedded_v4(ip) {
        let (Embedded::Mapped(v4)
        | Embedded::Compatible(v4)
        | Embedded::Nat64(v4)
        | Embedded::SixToFour(v4)) = embedded;
        return classify_v4(v4);
    }
    if in_v6(bits, V6_GLOBAL_IN_2001_23) {
        Verdict::RefusedByDesign
    } else if in_v6(bits, V6_NOT_GLOBAL) {
        Verdict::NotGlobal
    } else if bits >> 125 == 0b001 {
        // 2000::/3, the only space IANA allocates as global unicast.
        Verdict::Global
    } else {
        Verdict::NotGlobal
    }
}

/// The verdict for any IP address.
pub fn classify(ip: std::net::IpAddr) -> Verdict {
    match ip {
        std::net::IpAddr::V4(v4) => classify_v4(v4),
        std::net::IpAddr::V6(v6) => classify_v6(v6),
    }
}

/// Every IPv4 block the tables above name, for strategies that aim at them.
pub fn special_v4_blocks() -> Vec<(u32, u32)> {
    [V4_NOT_GLOBAL, V4_GLOBAL_EXCEPTIONS, V4_REFUSED_BY_DESIGN].concat()
}

/// Every IPv6 block the tables above name, plus the embedding prefixes.
pub fn special_v6_blocks() -> Vec<(u128, u32)> {
    let embeddings: &[(u128, u32)] = &[
        (0, 96),                      // IPv4-compatible
        (0x0064_ff9b << 96, 96),      // NAT64
        (0x2002 << 112, 16),          // 6to4
        (0x2001_0000 << 96, 32),      // Teredo
        (0x2620_004f_8000 << 80, 48), // AS112, globally reachable
    ];
    [V6_NOT_GLOBAL, V6_GLOBAL_IN_2001_23, embeddings].concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table itself is checked against addresses the registries name.
    #[test]
    fn the_independent_table_matches_the_registry_examples() {
        let v4 = |text: &str| classify_v4(text.parse().unwrap());
        assert_eq!(v4("8.8.8.8"), Verdict::Global);
        assert_eq!(v4("192.0.0.9"), Verdict::RefusedByDesign);
        assert_eq!(v4("192.0.0.8"), Verdict::NotGlobal);
        assert_eq!(v4("192.88.99.1"), Verdict::RefusedByDesign);
        assert_eq!(v4("224.0.0.1"), Verdict::RefusedByDesign);
        assert_eq!(v4("100.127.255.255"), Verdict::NotGlobal);
        assert_eq!(v4("100.128.0.0"), Verdict::Global);
        assert_eq!(v4("255.255.255.254"), Verdict::NotGlobal);
        let v6 = |text: &str| classify_v6(text.parse().unwrap());
        assert_eq!(v6("2606:4700::1111"), Verdict::Global);
        assert_eq!(v6("2001:4:112::1"), Verdict::RefusedByDesign);
        assert_eq!(v6("2001::1"), Verdict::NotGlobal);
        assert_eq!(v6("::ffff:10.0.0.1"), Verdict::NotGlobal);
        assert_eq!(v6("64:ff9b::8.8.8.8"), Verdict::Global);
        assert_eq!(v6("64:ff9b:1::8.8.8.8"), Verdict::NotGlobal);
        assert_eq!(v6("2002:808:808::1"), Verdict::Global);
        assert_eq!(v6("2002:a00:1::1"), Verdict::NotGlobal);
        assert_eq!(v6("::"), Verdict::NotGlobal);
        assert_eq!(v6("4000::1"), Verdict::NotGlobal);
    }
}
