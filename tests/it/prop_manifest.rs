//! Property tests of manifest validation: random valid manifests are accepted
//! and survive being written back out; one field made invalid gives exactly
//! one problem, at that field's path.

use gem_resources::{parse_manifest, Resource};
use proptest::prelude::*;
use serde_json::{json, Map, Value};
use url::Url;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn https_url() -> impl Strategy<Value = String> {
    (
        "[a-z][a-z0-9-]{0,8}(\\.[a-z][a-z0-9]{0,6}){0,2}\\.(com|org|net|example)",
        "(/[A-Za-z0-9._~éü€-]{1,12}){0,3}",
        proptest::option::of("[a-z]{1,5}=[A-Za-z0-9]{0,5}"),
    )
        // `xn--` starts a punycode label, which these random letters never
        // spell correctly.
        .prop_filter("not a punycode label", |(host, _, _)| {
            !host.split('.').any(|label| label.starts_with("xn--"))
        })
        .prop_map(|(host, path, query)| match query {
            Some(q) => format!("https://{host}{path}?{q}"),
            None => format!("https://{host}{path}"),
        })
}

/// One valid entry as JSON; optional keys are sometimes left out.
fn entry() -> impl Strategy<Value = Map<String, Value>> {
    (
        "[A-Za-z0-9][A-Za-z0-9 ._:/-]{0,40}",
        https_url(),
        proptest::option::of(proptest::collection::vec(https_url(), 0..3)),
        "[0-9a-f]{64}",
        any::<u64>(),
        proptest::option::of(any::<bool>()),
        proptest::option::of("\\PC{0,40}"),
    )
        .prop_map(|(id, url, mirrors, sha256, size, required, description)| {
            let mut entry = Map::new();
            entry.insert("id".into(), json!(id));
            entry.insert("url".into(), json!(url));
            if let Some(mirrors) = mirrors {
                entry.insert("mirrors".into(), json!(mirrors));
            }
            entry.insert("sha256".into(), json!(sha256));
            entry.insert("size".into(), json!(size));
            if let Some(required) = required {
                entry.insert("required".into(), json!(required));
            }
            if let Some(description) = description {
                entry.insert("description".into(), json!(description));
            }
            entry
        })
}

/// 1 to 4 valid entries with distinct ids.
fn entries() -> impl Strategy<Value = Vec<Map<String, Value>>> {
    proptest::collection::vec(entry(), 1..5).prop_map(|mut entries| {
        for (index, entry) in entries.iter_mut().enumerate() {
            let id = format!("{}#{index}", entry["id"].as_str().unwrap_or_default());
            entry.insert("id".into(), json!(id));
        }
        entries
    })
}

/// The manifest JSON declaring exactly `resources`.
fn written_back(resources: &[Resource]) -> Vec<u8> {
    let entries: Vec<Value> = resources
        .iter()
        .map(|r| {
            let mut entry = json!({
                "id": r.id, "url": r.url.as_str(), "sha256": r.sha256, "size": r.size,
                "required": r.required,
                "mirrors": r.mirrors.iter().map(Url::as_str).collect::<Vec<_>>(),
            });
            if let Some(text) = &r.description {
                entry["description"] = json!(text);
            }
            entry
        })
        .collect();
    serde_json::to_vec(&json!({ "resources": entries })).unwrap()
}

/// The invalid values a field can be given, and the key they go under
/// (`mirrors[k]` puts a bad address inside the list).
fn mutation() -> impl Strategy<Value = (&'static str, Option<Value>)> {
    let bad = |key: &'static str, values: Vec<Option<Value>>| {
        proptest::sample::select(values).prop_map(move |v| (key, v))
    };
    prop_oneof![
        bad(
            "id",
            vec![
                None,
                Some(json!("")),
                Some(json!(7)),
                Some(json!("a\u{1b}b")),
                Some(json!("x".repeat(129)))
            ]
        ),
        bad(
            "url",
            vec![
                None,
                Some(json!("http://a.example/x")),
                Some(json!("https://u:p@a.example/")),
                Some(json!("https://")),
                Some(json!(null)),
                Some(json!("https://a.example/ x"))
            ]
        ),
        bad(
            "mirrors",
            vec![Some(json!("https://a.example/")), Some(json!({}))]
        ),
        bad(
            "mirrors[k]",
            vec![
                Some(json!("ftp://a.example/")),
                Some(json!(1)),
                Some(json!("https://[::1/"))
            ]
        ),
        bad(
            "sha256",
            vec![
                None,
                Some(json!("A".repeat(64))),
                Some(json!("0".repeat(63))),
                Some(json!(0))
            ]
        ),
        bad(
            "size",
            vec![
                None,
                Some(json!(-1)),
                Some(json!(1.5)),
                Some(json!("12")),
                Some(json!(null))
            ]
        ),
        bad(
            "required",
            vec![Some(json!("yes")), Some(json!(1)), Some(json!(null))]
        ),
        bad(
            "description",
            vec![Some(json!(5)), Some(json!(null)), Some(json!(["a"]))]
        ),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn valid_manifests_are_accepted_and_round_trip(entries in entries()) {
        let text = serde_json::to_vec(&json!({ "resources": entries })).unwrap();
        let manifest = parse_manifest(&text)
            .map_err(|e| TestCaseError::fail(format!("refused:\n{e}")))?;
        prop_assert_eq!(manifest.resources.len(), entries.len());
        for (resource, entry) in manifest.resources.iter().zip(&entries) {
            prop_assert_eq!(Some(resource.id.as_str()), entry["id"].as_str());
            prop_assert_eq!(Some(resource.sha256.as_str()), entry["sha256"].as_str());
            prop_assert_eq!(Some(resource.size), entry["size"].as_u64());
            prop_assert_eq!(resource.required, entry.get("required") == Some(&json!(true)));
            prop_assert_eq!(resource.description.as_deref(), entry.get("description").and_then(Value::as_str));
            let url = Url::parse(entry["url"].as_str().unwrap()).unwrap();
            prop_assert_eq!(&resource.url, &url);
            let mirrors = entry.get("mirrors").and_then(Value::as_array).map_or(0, Vec::len);
            prop_assert_eq!(resource.mirrors.len(), mirrors);
        }
        let again = parse_manifest(&written_back(&manifest.resources))
            .map_err(|e| TestCaseError::fail(format!("written back, refused:\n{e}")))?;
        prop_assert_eq!(again, manifest);
    }

    #[test]
    fn one_invalid_field_gives_one_problem_at_its_path(
        mut entries in entries(),
        pick in any::<proptest::sample::Index>(),
        (key, value) in mutation(),
        mirror_pick in any::<proptest::sample::Index>(),
    ) {
        let index = pick.index(entries.len());
        let entry = &mut entries[index];
        let path = if key == "mirrors[k]" {
            let mut mirrors = entry.get("mirrors").and_then(Value::as_array).cloned().unwrap_or_default();
            mirrors.push(json!("https://extra.example/"));
            let k = mirror_pick.index(mirrors.len());
            mirrors[k] = value.clone().unwrap_or(Value::Null);
            entry.insert("mirrors".into(), Value::Array(mirrors));
            format!("manifest.resources[{index}].mirrors[{k}]")
        } else {
            match value {
                Some(value) => entry.insert(key.into(), value),
                None => entry.remove(key),
            };
            format!("manifest.resources[{index}].{key}")
        };
        let text = serde_json::to_vec(&json!({ "resources": entries })).unwrap();
        let error = match parse_manifest(&text) {
            Ok(manifest) => return Err(TestCaseError::fail(format!("{path}: accepted {manifest:?}"))),
            Err(error) => error,
        };
        prop_assert_eq!(error.problems.len(), 1, "{}", error);
        prop_assert_eq!(&error.problems[0].path, &path, "{}", error);
    }

    #[test]
    fn long_addresses_are_refused_or_round_trip(
        ascii in 0usize..2100,
        wide in 0usize..700,
        wide_char in proptest::sample::select(vec!['é', '€', '𝄞', ' ', '%']),
    ) {
        let path = format!("{}{}", "a".repeat(ascii), wide_char.to_string().repeat(wide));
        let url = format!("https://cdn.example.com/{path}");
        let text = serde_json::to_vec(&json!({ "resources": [
            { "id": "a", "url": url, "sha256": "0".repeat(64), "size": 1 }
        ]})).unwrap();
        if let Ok(manifest) = parse_manifest(&text) {
            prop_assert!(manifest.resources[0].url.as_str().chars().count() <= 2048);
            let again = parse_manifest(&written_back(&manifest.resources))
                .map_err(|e| TestCaseError::fail(format!("written back, refused:\n{e}")))?;
            prop_assert_eq!(again, manifest);
        }
    }
}
