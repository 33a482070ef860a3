//! The record beside a partial file → `PartialMeta::parse`, which decides
//! whether kept bytes may be resumed. No panic; an accepted record names an
//! `https` address, carries a usable validator (or none), holds only kept
//! ranges that are non-empty, sorted and apart from each other and from the
//! prefix, fits the size cap, and reads back to itself once written again.
#![no_main]

use gem_resources::partial::PartialMeta;
use gem_resources_fuzz::metered;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(meta) = metered("partial record", data.len(), || PartialMeta::parse(data)) else {
        return;
    };
    assert!(data.len() <= 4096, "{} bytes accepted", data.len());
    let url = url::Url::parse(&meta.address).expect("an accepted address parses");
    assert_eq!(url.scheme(), "https", "{url}");
    if let Some(v) = &meta.validator {
        assert!(!v.is_empty() && v.len() <= 256, "{v:?}");
        assert!(v.bytes().all(|b| (0x20..0x7f).contains(&b) || b == b'\t'), "{v:?}");
    }
    let mut end = meta.durable;
    for [s, e] in &meta.ranges {
        assert!(*s > end && e > s, "{:?} after {}", meta.ranges, meta.durable);
        end = *e;
    }
    assert_eq!(meta.end(), end);
    assert!(meta.durable_bytes() <= end, "{meta:?}");
    let again = serde_json::to_vec(&meta).unwrap();
    if again.len() <= 4096 {
        assert_eq!(PartialMeta::parse(&again), Some(meta));
    }
});
