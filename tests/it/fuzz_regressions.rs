//! Regression tests for what fuzzing found, each through the public API that
//! reads the input in production.

use gem_resources::registry::Registry;
use gem_resources::{parse_manifest, Store};

const HASH: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// A store in a scratch folder with `gems/<file_gem>.json` holding `record`.
fn store_with_registration(
    file_gem: &str,
    record: &serde_json::Value,
) -> (tempfile::TempDir, Registry) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let path = store.root().join("gems").join(format!("{file_gem}.json"));
    std::fs::write(path, serde_json::to_vec(record).unwrap()).unwrap();
    (dir, Registry::new(&store))
}

fn resource(id: &str) -> serde_json::Value {
    serde_json::json!({
        "id": id, "url": "https://cdn.example.com/a.bin", "mirrors": [],
        "sha256": HASH, "size": 1, "required": false, "description": null
    })
}

/// Found by the `records` target: a registration whose `gem` differs from
/// its file name was returned as valid, and its `gem` then named the
/// failure-record file to read (`failures/<gem>.json`), so a damaged record
/// could steer a path out of the store.
#[test]
fn registration_naming_another_gem_is_a_corrupted_record() {
    for gem in ["other-gem", "../../outside", "sa}ple-gem", ""] {
        let record = serde_json::json!({ "gem": gem, "resources": [resource("a")] });
        let (_dir, registry) = store_with_registration("sample-gem", &record);
        let error = registry.get("sample-gem").unwrap_err();
        assert!(
            error.to_string().contains("corrupted record"),
            "{gem:?}: {error}"
        );
    }
    let record = serde_json::json!({ "gem": "sample-gem", "resources": [resource("a")] });
    let (_dir, registry) = store_with_registration("sample-gem", &record);
    assert_eq!(
        registry.get("sample-gem").unwrap().unwrap().gem,
        "sample-gem"
    );
}

/// Found by reading the `records` target's invariant against the reader: a
/// registration is returned only when its resources pass the manifest rules
/// again, so a damaged record cannot bring back an empty, duplicate or
/// control-character id that validation refused at install.
#[test]
fn registration_with_resources_no_manifest_may_declare_is_a_corrupted_record() {
    let bad = [
        vec![resource("a"), resource("a")],
        vec![resource("")],
        vec![resource("a\u{1b}[2Jb")],
        vec![resource(&"x".repeat(129))],
    ];
    for resources in bad {
        let record = serde_json::json!({ "gem": "sample-gem", "resources": resources });
        let (_dir, registry) = store_with_registration("sample-gem", &record);
        let error = registry.get("sample-gem").unwrap_err();
        assert!(error.to_string().contains("corrupted record"), "{error}");
    }
    let record =
        serde_json::json!({ "gem": "sample-gem", "resources": [resource("a"), resource("b")] });
    let (_dir, registry) = store_with_registration("sample-gem", &record);
    assert_eq!(
        registry.get("sample-gem").unwrap().unwrap().resources.len(),
        2
    );
}

/// Found by the `manifest` target: a `url` within the 2048-character limit as
/// written could be longer once the URL parser percent-encoded it (each `é`
/// becomes `%C3%A9`). The manifest was accepted, but the stored registration
/// then failed to read back as a corrupted record.
#[test]
fn url_longer_than_the_limit_once_percent_encoded_is_refused() {
    let url = format!("https://cdn.example.com/{}", "é".repeat(400));
    assert!(url.chars().count() <= 2048);
    let manifest = serde_json::json!({ "resources": [
        { "id": "a", "url": url, "sha256": HASH, "size": 1 }
    ]});
    let error = parse_manifest(&serde_json::to_vec(&manifest).unwrap()).unwrap_err();
    assert_eq!(error.problems.len(), 1, "{error}");
    assert_eq!(error.problems[0].path, "manifest.resources[0].url");
    assert!(
        error.problems[0]
            .message
            .contains("once percent-encoded, got 2424"),
        "{error}"
    );

    // Just within the limit once encoded: accepted, stored and read back.
    let fits = format!("https://cdn.example.com/{}", "é".repeat(337));
    let manifest = serde_json::json!({ "resources": [
        { "id": "a", "url": fits, "sha256": HASH, "size": 1 }
    ]});
    let parsed = parse_manifest(&serde_json::to_vec(&manifest).unwrap()).unwrap();
    assert_eq!(parsed.resources[0].url.as_str().len(), 2046);
    let record = serde_json::json!({ "gem": "sample-gem", "resources": parsed.resources });
    let (_dir, registry) = store_with_registration("sample-gem", &record);
    assert_eq!(
        registry.get("sample-gem").unwrap().unwrap().resources,
        parsed.resources
    );
}

/// Found by the `headers` target: the reason for an unparsable `Location`
/// cut the server's text to 256 characters before escaping it, so a value
/// of backslashes or quotes came out twice as long as promised.
#[test]
fn unparsable_location_reason_stays_short_after_escaping() {
    let base = url::Url::parse("https://cdn.example.com/models/a.bin").unwrap();
    for filler in ["\\", "\"", "\\\""] {
        let value = format!("https://[{}Monday, \\>>>>0-", filler.repeat(2000));
        let reason = gem_resources::headers::join_location(&base, value.as_bytes()).unwrap_err();
        assert!(
            reason.starts_with("invalid Location \"https://["),
            "{reason}"
        );
        assert!(
            reason.chars().count() <= 350,
            "{} chars: {reason}",
            reason.len()
        );
    }
}
