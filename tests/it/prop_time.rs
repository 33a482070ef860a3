//! The RFC 3339 reader takes text from records on disk: no input makes it
//! panic, and what it writes reads back to the same instant.

use std::time::{Duration, UNIX_EPOCH};

use gem_resources::time::{from_rfc3339, to_rfc3339};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A valid instant's text with the characters from `at` on replaced by
/// `tail`: the shapes closest to valid, where a byte slice would land
/// inside a multi-byte character.
fn damaged(secs: u64, at: usize, tail: &str) -> String {
    let text = to_rfc3339(UNIX_EPOCH + Duration::from_secs(secs));
    let text = text.replace('Z', "+00:00");
    let at = at.min(text.len());
    format!("{}{tail}", &text[..at])
}

/// Found by hand: the offset was sliced by byte (`&rest[3..4]`), inside
/// the two-byte `é`.
#[test]
fn a_multi_byte_offset_is_refused_not_a_panic() {
    assert_eq!(from_rfc3339("2024-01-01T00:00:00+0éé"), None);
    assert_eq!(from_rfc3339("2024-01-01T00:00:00éé:00"), None);
    assert!(from_rfc3339("2024-01-01T00:00:00+01:00").is_some());
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_text_reads_without_panicking(text in "\\PC{0,40}") {
        let _ = from_rfc3339(&text);
    }

    #[test]
    fn near_valid_text_reads_without_panicking(
        secs in 0u64..10_000_000_000,
        at in 0usize..26,
        tail in "[0-9:+\\-Zz.é€😀]{0,8}",
    ) {
        let _ = from_rfc3339(&damaged(secs, at, &tail));
    }

    #[test]
    fn written_instants_read_back(secs in 0u64..100_000_000_000) {
        let time = UNIX_EPOCH + Duration::from_secs(secs);
        prop_assert_eq!(from_rfc3339(&to_rfc3339(time)), Some(time));
    }
}
