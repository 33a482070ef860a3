//! Property tests of host policy patterns: `*.example.com` matches exactly
//! the proper subdomains of `example.com`, whatever the letter case and with
//! or without one trailing dot, on both sides.

use gem_resources::policy::{Mode, Policy};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Flips the case of the letters `mask` selects.
fn recase(text: &str, mask: u64) -> String {
    text.chars()
        .enumerate()
        .map(|(i, c)| {
            if mask >> (i % 64) & 1 == 1 {
                c.to_ascii_uppercase()
            } else {
                c
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn wildcard_matches_exactly_the_proper_subdomains(
        labels in proptest::collection::vec("[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?", 0..4),
        suffix in proptest::sample::select(vec![
            "example.com", "example.org", "xample.com", "badexample.com",
            "example.com.evil.net", "com", "example.co", "sub.example.com",
        ]),
        pattern in proptest::sample::select(vec!["*.example.com", "*.EXAMPLE.com", "*.example.com.", "*.Example.Com."]),
        host_case in any::<u64>(),
        host_dot in any::<bool>(),
    ) {
        let mut host = labels.iter().map(|l| format!("{l}.")).collect::<String>();
        host.push_str(suffix);
        // Proper subdomain: at least one label in front of example.com.
        let expected = (suffix == "example.com" && !labels.is_empty()) || suffix == "sub.example.com";
        let mut shown = recase(&host, host_case);
        if host_dot {
            shown.push('.');
        }
        let allow = Policy::new(Mode::Allowlist, &[pattern.to_string()]).unwrap();
        let block = Policy::new(Mode::Blocklist, &[pattern.to_string()]).unwrap();
        prop_assert_eq!(allow.permits(&shown), expected, "{} against {}", shown, pattern);
        prop_assert_eq!(block.permits(&shown), !expected, "{} against {}", shown, pattern);
    }
}
