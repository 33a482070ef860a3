//! Record bytes → the readers of what a crash can leave on disk: gem
//! registrations, failure records, shared failure records and partial-file
//! names. A reader returns a value that passes validation, or an error.
#![no_main]

use gem_resources::parse_manifest;
use gem_resources::registry::{encode_failures, parse_failures, parse_registration, valid_gem_id};
use gem_resources::store::{is_sha256, parse_partial_name, parse_shared_failure};
use gem_resources_fuzz::{assert_usable_url, manifest_json, metered};
use libfuzzer_sys::fuzz_target;

/// The gem whose record file the bytes stand for.
const GEM: &str = "sample-gem";

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    let n = bytes.len();
    match which % 4 {
        0 => {
            if let Ok(reg) = metered("registration", n, || parse_registration(GEM, bytes)) {
                assert!(valid_gem_id(&reg.gem), "gem id {:?}", reg.gem);
                assert_eq!(reg.gem, GEM, "a record names its own file");
                for resource in &reg.resources {
                    assert!(is_sha256(&resource.sha256));
                    resource.addresses().for_each(assert_usable_url);
                }
                // The resources are ones a manifest could have declared.
                let text = serde_json::to_vec(&manifest_json(&reg.resources)).unwrap();
                match parse_manifest(&text) {
                    Ok(manifest) => assert_eq!(manifest.resources, reg.resources),
                    Err(e) => panic!("registration holds resources no manifest may:\n{e}"),
                }
            }
        }
        1 => {
            let failures = metered("failures", n, || parse_failures(bytes));
            let again = encode_failures(&failures);
            assert_eq!(parse_failures(&again), failures);
        }
        2 => {
            if let Some(record) = metered("shared failure", n, || parse_shared_failure(bytes)) {
                assert!(
                    gem_resources::error::CODES.contains(&record.code),
                    "{record:?}"
                );
            }
        }
        _ => {
            let Ok(name) = std::str::from_utf8(bytes) else {
                return;
            };
            if let Some((sha, size)) = metered("partial name", n, || parse_partial_name(name)) {
                assert!(is_sha256(&sha));
                assert!(name.starts_with(&format!("{sha}.{size}.")), "{name:?}");
                assert!(name.ends_with(".partial"), "{name:?}");
            }
        }
    }
});
