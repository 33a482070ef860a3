//! Property tests of the address guard against the independent IANA
//! classifier in `prop_iana`: random addresses, IPv4 addresses carried in
//! IPv6 forms, and every spelling of an IPv4 address the URL parser accepts.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

use gem_resources::guard::AddressGuard;
use gem_resources::{Config, Fetcher};
use proptest::prelude::*;
use url::{Host, Url};

use crate::prop_iana::{classify, classify_v4, special_v4_blocks, special_v6_blocks};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn refused(ip: IpAddr) -> bool {
    AddressGuard::new().check_ip(ip).is_err()
}

/// Any IPv4 address, half of them inside a special-purpose block.
fn any_v4() -> impl Strategy<Value = Ipv4Addr> {
    let blocks = special_v4_blocks();
    prop_oneof![
        any::<u32>(),
        (0..blocks.len(), any::<u32>()).prop_map(move |(i, host)| {
            let (net, len) = blocks[i];
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            (net & mask) | (host & !mask)
        }),
    ]
    .prop_map(Ipv4Addr::from)
}

/// Any IPv6 address, most of them inside a special-purpose block or 2000::/3.
fn any_v6() -> impl Strategy<Value = Ipv6Addr> {
    let blocks = special_v6_blocks();
    prop_oneof![
        any::<u128>(),
        any::<u128>().prop_map(|host| (0b001 << 125) | (host >> 3)),
        (0..blocks.len(), any::<u128>()).prop_map(move |(i, host)| {
            let (net, len) = blocks[i];
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            (net & mask) | (host & !mask)
        }),
    ]
    .prop_map(Ipv6Addr::from)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn guard_agrees_with_iana_on_ipv4(v4 in any_v4()) {
        let ip = IpAddr::V4(v4);
        prop_assert_eq!(refused(ip), classify(ip).refused(), "{} is {:?}", ip, classify(ip));
    }

    #[test]
    fn guard_agrees_with_iana_on_ipv6(v6 in any_v6()) {
        let ip = IpAddr::V6(v6);
        prop_assert_eq!(refused(ip), classify(ip).refused(), "{} is {:?}", ip, classify(ip));
    }

    #[test]
    fn embedded_ipv4_gets_the_ipv4_decision(v4 in any_v4(), low in any::<u128>()) {
        let bits = u128::from(u32::from(v4));
        let own = refused(IpAddr::V4(v4));
        prop_assert_eq!(own, classify_v4(v4).refused());
        let carried = [
            ("IPv4-mapped", (0xffff_u128 << 32) | bits),
            ("NAT64 64:ff9b::/96", (0x0064_ff9b_u128 << 96) | bits),
            // 6to4: 2002:AABB:CCDD:subnet:interface.
            ("6to4", (0x2002_u128 << 112) | (bits << 80) | (low & ((1 << 80) - 1))),
        ];
        for (form, v6) in carried {
            let ip = IpAddr::V6(Ipv6Addr::from(v6));
            prop_assert_eq!(refused(ip), own, "{} form {} of {}", form, ip, v4);
        }
        // ::a.b.c.d (IPv4-compatible); `::` and `::1` are addresses of their own.
        if bits > 1 {
            let ip = IpAddr::V6(Ipv6Addr::from(bits));
            prop_assert_eq!(refused(ip), own, "IPv4-compatible {} of {}", ip, v4);
        }
        // The guard refuses these forms whatever they carry: local-use NAT64
        // and Teredo are not globally reachable themselves.
        let local_nat64 = (0x0064_ff9b_0001_u128 << 80) | (low & ((1 << 80) - 1) & !0xffff_ffff) | bits;
        let teredo = (0x2001_0000_u128 << 96) | (bits << 64) | (low & u128::from(u64::MAX));
        for (form, v6) in [("local-use NAT64", local_nat64), ("Teredo", teredo)] {
            let ip = IpAddr::V6(Ipv6Addr::from(v6));
            prop_assert!(refused(ip), "{} form {} must be refused", form, ip);
        }
    }

    #[test]
    fn every_ipv4_spelling_gets_the_same_decision(
        v4 in any_v4(),
        parts in 1usize..=4,
        radixes in proptest::collection::vec(0u8..3, 4),
        upper_x in any::<bool>(),
        trailing_dot in any::<bool>(),
    ) {
        let text = spell(v4, parts, &radixes, upper_x, trailing_dot);
        let url = Url::parse(&format!("https://{text}/"))
            .map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        prop_assert_eq!(url.host(), Some(Host::Ipv4(v4)), "{}", text);
        let dotted = Url::parse(&format!("https://{v4}/")).unwrap();
        let spelled = fetcher().check_hop(&url).is_err();
        prop_assert_eq!(spelled, fetcher().check_hop(&dotted).is_err(), "{}", text);
        prop_assert_eq!(spelled, classify_v4(v4).refused(), "{}", text);
    }
}

fn fetcher() -> &'static Fetcher {
    static FETCHER: OnceLock<Fetcher> = OnceLock::new();
    FETCHER.get_or_init(|| Fetcher::new(&Config::default()).unwrap())
}

/// Spells `v4` the way a WHATWG URL parser reads an IPv4 host: `parts`
/// numbers (the last one takes all remaining bytes), each in decimal,
/// hexadecimal or octal.
fn spell(v4: Ipv4Addr, parts: usize, radixes: &[u8], upper_x: bool, dot: bool) -> String {
    let bytes = v4.octets();
    let mut numbers: Vec<u64> = bytes[..parts - 1].iter().map(|&b| u64::from(b)).collect();
    let last = bytes[parts - 1..]
        .iter()
        .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
    numbers.push(last);
    let texts: Vec<String> = numbers
        .iter()
        .zip(radixes)
        .map(|(&n, radix)| match radix {
            0 => n.to_string(),
            1 if upper_x => format!("0X{n:X}"),
            1 => format!("0x{n:x}"),
            _ => format!("0{n:o}"),
        })
        .collect();
    let mut text = texts.join(".");
    if dot {
        text.push('.');
    }
    text
}

#[test]
fn spellings_cover_the_known_loopback_forms() {
    let v4 = Ipv4Addr::new(127, 0, 0, 1);
    assert_eq!(spell(v4, 4, &[0, 0, 0, 0], false, false), "127.0.0.1");
    assert_eq!(spell(v4, 1, &[0], false, false), "2130706433");
    assert_eq!(spell(v4, 1, &[2], false, false), "017700000001");
    assert_eq!(spell(v4, 2, &[1, 0], false, true), "0x7f.1.");
    assert_eq!(spell(v4, 3, &[0, 2, 1], true, false), "127.00.0X1");
}
