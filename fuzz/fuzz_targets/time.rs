//! Text → `time::from_rfc3339`, which reads the timestamps of failure
//! records and registrations on disk; and instants → `to_rfc3339` and back.
//! No panic on any text; an accepted instant writes out as text that reads
//! back to the same second.
#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use gem_resources::time::{from_rfc3339, to_rfc3339};
use gem_resources_fuzz::metered;
use libfuzzer_sys::fuzz_target;

/// The last second of year 9999, the largest the four-digit form holds.
const MAX_SECS: u64 = 253_402_300_799;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Some(time) = metered("RFC 3339", data.len(), || from_rfc3339(text)) {
            // Before 1970 is written as 1970 (documented); past 9999 the
            // year no longer has four digits.
            let secs = time.duration_since(UNIX_EPOCH).map(|d| d.as_secs());
            if secs.is_ok_and(|s| s <= MAX_SECS) {
                let written = to_rfc3339(time);
                assert_eq!(from_rfc3339(&written), Some(time), "{text:?} → {written}");
            }
        }
    }
    if let Some(bytes) = data.get(..8) {
        let secs = u64::from_le_bytes(bytes.try_into().unwrap()) % (MAX_SECS + 1);
        let time = UNIX_EPOCH + Duration::from_secs(secs);
        let written = to_rfc3339(time);
        assert_eq!(from_rfc3339(&written), Some(time), "{written}");
    }
});
