//! Manifest bytes → `parse_manifest`. An accepted manifest holds only usable
//! addresses, SHA-256s and unique ids, and written back out and parsed again
//! it gives the same resources; a refused one names at least one problem.
#![no_main]

use gem_resources::parse_manifest;
use gem_resources_fuzz::{assert_usable_url, manifest_json, metered};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let parsed = metered("parse_manifest", data.len(), || {
        let parsed = parse_manifest(data);
        // Rendering the error is part of handling a refused manifest.
        let shown = parsed.as_ref().err().map(ToString::to_string);
        (parsed, shown)
    });
    match parsed {
        (Ok(manifest), _) => {
            let mut ids = std::collections::HashSet::new();
            for resource in &manifest.resources {
                assert!(ids.insert(resource.id.clone()), "duplicate id accepted");
                assert!(gem_resources::store::is_sha256(&resource.sha256));
                resource.addresses().for_each(assert_usable_url);
                let name = resource.file_name();
                assert!(!name.is_empty() && name.len() <= 200, "{name:?}");
                assert!(!name.contains(['/', '\\', '\0']) && name != "." && name != "..");
            }
            let again = serde_json::to_vec(&manifest_json(&manifest.resources))
                .expect("a manifest value always serialises");
            match parse_manifest(&again) {
                Ok(reparsed) => assert_eq!(reparsed, manifest, "round trip changed it"),
                Err(e) => panic!("written-back manifest refused:\n{e}"),
            }
        }
        (Err(error), Some(shown)) => {
            assert!(!error.problems.is_empty());
            assert!(shown
                .lines()
                .all(|l| l.starts_with("E_PERM_INVALID: manifest")));
            assert!(
                !shown.chars().any(|c| c.is_control() && c != '\n'),
                "{shown:?}"
            );
        }
        (Err(_), None) => unreachable!(),
    }
});
