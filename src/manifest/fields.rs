//! The rules of an entry's fields, checked in a fixed key order: unknown
//! keys, `id`, `url` and `mirrors` (by the address rules), `sha256`,
//! `size`, `required`, `description`.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::addresses::{check_mirrors, check_required_url};
use super::report::{cut, quote, required_string, type_name, Report};
use super::structure::Resource;

/// The most characters an `id` may have.
const MAX_ID_CHARS: usize = 128;

/// The keys an entry may carry, in the order they are checked.
const KNOWN_KEYS: [&str; 7] = [
    "id",
    "url",
    "mirrors",
    "sha256",
    "size",
    "required",
    "description",
];

/// Checks every entry of the `resources` array; returns the valid resources
/// (meaningful only when no problem was reported).
pub(super) fn check_entries(entries: &[Value], report: &mut Report) -> Vec<Resource> {
    let mut resources = Vec::with_capacity(entries.len());
    let mut first_use: HashMap<String, usize> = HashMap::new();
    for (index, entry) in entries.iter().enumerate() {
        let path = format!("manifest.resources[{index}]");
        let Some(object) = entry.as_object() else {
            report.add(
                &path,
                format!("must be an object, got {}", type_name(entry)),
            );
            continue;
        };
        if let Some(resource) = check_entry(object, &path, index, &mut first_use, report) {
            resources.push(resource);
        }
    }
    resources
}

/// Checks one entry in the fixed key order; returns it when it is valid.
fn check_entry(
    object: &Map<String, Value>,
    path: &str,
    index: usize,
    first_use: &mut HashMap<String, usize>,
    report: &mut Report,
) -> Option<Resource> {
    let before = report.problems.len();
    // Sorted, so the order does not depend on how the JSON map keeps keys.
    let mut unknown: Vec<&String> = object
        .keys()
        .filter(|key| !KNOWN_KEYS.contains(&key.as_str()))
        .collect();
    unknown.sort();
    for key in unknown {
        let hint = match closest_key(key) {
            Some(known) => format!(" (did you mean `{known}`?)"),
            None => String::new(),
        };
        report.add(path, format!("unknown key {}{hint}", quote(key)));
    }

    let id = check_id(object.get("id"), path, index, first_use, report);
    let url = check_required_url(object.get("url"), &format!("{path}.url"), report);
    let mirrors = check_mirrors(
        object.get("mirrors"),
        url.as_ref(),
        &format!("{path}.mirrors"),
        report,
    );
    let sha256 = check_sha256(object.get("sha256"), &format!("{path}.sha256"), report);
    let size = check_size(object.get("size"), &format!("{path}.size"), report);
    if let (Some(0), Some(sha256), false) = (size, sha256.as_deref(), report.to_be_filled) {
        check_empty_file(sha256, &format!("{path}.size"), report);
    }
    let required = check_required(object.get("required"), &format!("{path}.required"), report);
    let description = check_description(
        object.get("description"),
        &format!("{path}.description"),
        report,
    );

    if report.problems.len() != before {
        return None;
    }
    Some(Resource {
        id: id?,
        url: url?,
        mirrors: mirrors?,
        sha256: sha256?,
        size: size?,
        required: required?,
        description: description?,
    })
}

/// Checks `id`, including uniqueness against the entries before it.
fn check_id(
    value: Option<&Value>,
    entry_path: &str,
    index: usize,
    first_use: &mut HashMap<String, usize>,
    report: &mut Report,
) -> Option<String> {
    let path = format!("{entry_path}.id");
    let text = required_string(value, &path, report)?;
    let length = text.chars().count();
    if text.is_empty() {
        report.add(&path, "must not be empty".to_string());
        return None;
    }
    if length > MAX_ID_CHARS {
        report.add(
            &path,
            format!("must be at most {MAX_ID_CHARS} characters, got {length}"),
        );
        return None;
    }
    if text.chars().any(char::is_control) {
        report.add(
            &path,
            format!("must not contain control characters, got {}", quote(text)),
        );
        return None;
    }
    if let Some(first) = first_use.get(text) {
        report.add(
            &path,
            format!(
                "duplicate id {} (first used by manifest.resources[{first}])",
                quote(text)
            ),
        );
        return None;
    }
    first_use.insert(text.to_string(), index);
    Some(text.to_string())
}

/// Checks the required `sha256`.
fn check_sha256(value: Option<&Value>, path: &str, report: &mut Report) -> Option<String> {
    let text = required_string(value, path, report)?;
    let length = text.chars().count();
    let all_hex = text
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b.to_ascii_lowercase()));
    let upper = text.bytes().any(|b| b.is_ascii_uppercase());
    let message = if length != 64 {
        let unit = if length == 1 {
            "character"
        } else {
            "characters"
        };
        format!(
            "must be 64 lowercase hex digits, got {length} {unit}: {}",
            quote(text)
        )
    } else if all_hex && !upper {
        return Some(text.to_string());
    } else if all_hex {
        format!(
            "must be 64 lowercase hex digits (write it in lower-case), got {}",
            quote(text)
        )
    } else {
        format!("must be 64 lowercase hex digits, got {}", quote(text))
    };
    // `sha256:…` (as some tools print it): the digits alone are wanted.
    let message = match text.split_once(':') {
        Some((prefix, rest)) if prefix.eq_ignore_ascii_case("sha256") && rest.len() == 64 => {
            format!("{message} (drop the \"{prefix}:\" prefix)")
        }
        _ => message,
    };
    report.add(path, message);
    None
}

/// The known key an unknown one was most likely meant to be: the same
/// key in another case, or one at most two edits away (one for short
/// keys).
fn closest_key(key: &str) -> Option<&'static str> {
    if key.chars().count() > 64 {
        return None;
    }
    let lower = key.to_lowercase();
    KNOWN_KEYS
        .iter()
        .map(|known| (strsim::damerau_levenshtein(&lower, known), *known))
        .filter(|(distance, known)| *distance <= if known.len() <= 4 { 1 } else { 2 })
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, known)| known)
}

/// Checks the required `size`: a JSON integer that fits `u64`.
fn check_size(value: Option<&Value>, path: &str, report: &mut Report) -> Option<u64> {
    let Some(value) = value else {
        report.add(path, "is required".to_string());
        return None;
    };
    let shown = match value {
        Value::Number(number) => match number.as_u64() {
            Some(size) => return Some(size),
            None => cut(&number.to_string()),
        },
        Value::String(text) if text.trim().parse::<u64>().is_ok() => {
            format!("the string {} (remove the quotes)", quote(text))
        }
        other => type_name(other).to_string(),
    };
    report.add(path, format!("must be a non-negative integer, got {shown}"));
    None
}

/// The SHA-256 of no bytes at all.
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// A `size` of 0 promises the empty file, whose SHA-256 is known: any other
/// hash can never be met, and every download of it would fail.
fn check_empty_file(sha256: &str, path: &str, report: &mut Report) {
    if sha256 != EMPTY_SHA256 {
        report.add(
            path,
            format!(
                "is 0, but sha256 is not the empty file's ({EMPTY_SHA256}): no download can ever match both"
            ),
        );
    }
}

/// Checks the optional `required` flag (default false).
fn check_required(value: Option<&Value>, path: &str, report: &mut Report) -> Option<bool> {
    match value {
        None => Some(false),
        Some(Value::Bool(flag)) => Some(*flag),
        Some(other) => {
            report.add(path, format!("must be a boolean, got {}", type_name(other)));
            None
        }
    }
}

/// Checks the optional `description`.
fn check_description(
    value: Option<&Value>,
    path: &str,
    report: &mut Report,
) -> Option<Option<String>> {
    match value {
        None => Some(None),
        Some(Value::String(text)) => match text.chars().find_map(unsafe_class) {
            None => Some(Some(text.clone())),
            Some(class) => {
                report.add(
                    path,
                    format!("must not contain {class}, got {}", quote(text)),
                );
                None
            }
        },
        Some(other) => {
            report.add(path, format!("must be a string, got {}", type_name(other)));
            None
        }
    }
}

/// The class of a character that text shown to a person must not carry,
/// or `None` for an ordinary one: control characters (C0, DEL, C1: a
/// terminal reads ESC and CSI as commands) and the bidirectional
/// formatting characters (embeddings, overrides, isolates and marks),
/// which make text display in another order than it reads.
fn unsafe_class(c: char) -> Option<&'static str> {
    match c {
        _ if c.is_control() => Some("control characters"),
        '\u{202A}'..='\u{202E}'
        | '\u{2066}'..='\u{2069}'
        | '\u{200E}'
        | '\u{200F}'
        | '\u{061C}' => Some("bidirectional formatting characters"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::test_entries::*;

    #[test]
    fn entry_must_be_an_object() {
        let found = lines(&json!({ "resources": [
            base_entry(), 1, "x", null, [], true
        ] }));
        assert_eq!(
            found,
            [
                "E_PERM_INVALID: manifest.resources[1]: must be an object, got number",
                "E_PERM_INVALID: manifest.resources[2]: must be an object, got string",
                "E_PERM_INVALID: manifest.resources[3]: must be an object, got null",
                "E_PERM_INVALID: manifest.resources[4]: must be an object, got array",
                "E_PERM_INVALID: manifest.resources[5]: must be an object, got boolean",
            ]
        );
    }

    #[test]
    fn unknown_keys_are_reported_first() {
        let mut entry = entry_with("colour", json!("red"));
        entry["id"] = json!(7);
        let found = lines(&json!({ "resources": [base_entry(), base_entry(), entry] }));
        // The duplicate ids of entries 0 and 1 come first, in index order.
        assert_eq!(
            found,
            [
                "E_PERM_INVALID: manifest.resources[1].id: duplicate id \"ocr-model\" (first used by manifest.resources[0])",
                "E_PERM_INVALID: manifest.resources[2]: unknown key \"colour\"",
                "E_PERM_INVALID: manifest.resources[2].id: must be a string, got number",
            ]
        );
    }

    #[test]
    fn unknown_key_names_are_escaped() {
        assert_eq!(
            entry_line(entry_with("a\u{1b}[31mb", json!(1))),
            "E_PERM_INVALID: manifest.resources[0]: unknown key \"a\\u{1b}[31mb\""
        );
    }

    #[test]
    fn required_fields_are_required() {
        for key in ["id", "url", "sha256", "size"] {
            assert_eq!(
                entry_line(entry_without(key)),
                format!("E_PERM_INVALID: manifest.resources[0].{key}: is required")
            );
        }
    }

    #[test]
    fn empty_entry_reports_every_required_field() {
        assert_eq!(
            lines(&json!({ "resources": [{}] })),
            [
                "E_PERM_INVALID: manifest.resources[0].id: is required",
                "E_PERM_INVALID: manifest.resources[0].url: is required",
                "E_PERM_INVALID: manifest.resources[0].sha256: is required",
                "E_PERM_INVALID: manifest.resources[0].size: is required",
            ]
        );
    }

    #[test]
    fn wrong_types_are_reported() {
        let cases = [
            ("id", json!(1), "id: must be a string, got number"),
            ("id", json!(null), "id: must be a string, got null"),
            (
                "url",
                json!(["https://x/y"]),
                "url: must be a string, got array",
            ),
            ("url", json!(null), "url: must be a string, got null"),
            (
                "mirrors",
                json!("https://x/y"),
                "mirrors: must be an array, got string",
            ),
            (
                "mirrors",
                json!(null),
                "mirrors: must be an array, got null",
            ),
            (
                "mirrors",
                json!([1]),
                "mirrors[0]: must be a string, got number",
            ),
            ("sha256", json!({}), "sha256: must be a string, got object"),
            (
                "size",
                json!("12"),
                "size: must be a non-negative integer, got the string \"12\" (remove the quotes)",
            ),
            (
                "size",
                json!(null),
                "size: must be a non-negative integer, got null",
            ),
            (
                "size",
                json!(true),
                "size: must be a non-negative integer, got boolean",
            ),
            (
                "required",
                json!("yes"),
                "required: must be a boolean, got string",
            ),
            (
                "required",
                json!(null),
                "required: must be a boolean, got null",
            ),
            (
                "required",
                json!(1),
                "required: must be a boolean, got number",
            ),
            (
                "description",
                json!(5),
                "description: must be a string, got number",
            ),
            (
                "description",
                json!(null),
                "description: must be a string, got null",
            ),
        ];
        for (key, value, message) in cases {
            assert_eq!(
                entry_line(entry_with(key, value)),
                format!("E_PERM_INVALID: manifest.resources[0].{message}")
            );
        }
    }

    #[test]
    fn id_rules() {
        assert_eq!(
            entry_line(entry_with("id", json!(""))),
            "E_PERM_INVALID: manifest.resources[0].id: must not be empty"
        );
        assert_eq!(
            entry_line(entry_with("id", json!("a\nb"))),
            "E_PERM_INVALID: manifest.resources[0].id: must not contain control characters, got \"a\\nb\""
        );
        assert_eq!(
            entry_line(entry_with("id", json!("é".repeat(129)))),
            "E_PERM_INVALID: manifest.resources[0].id: must be at most 128 characters, got 129"
        );
        assert_eq!(
            one_resource(entry_with("id", json!("é".repeat(128))))
                .id
                .chars()
                .count(),
            128
        );
    }

    #[test]
    fn description_refuses_control_characters_of_every_class() {
        for (text, shown) in [
            ("a\u{1b}]0;owned\u{7}b", "\"a\\u{1b}]0;owned\\u{7}b\""),
            ("line\nbreak", "\"line\\nbreak\""),
            ("tab\there", "\"tab\\there\""),
            ("del\u{7f}", "\"del\\u{7f}\""),
            ("csi\u{9b}31m", "\"csi\\u{9b}31m\""),
        ] {
            assert_eq!(
                entry_line(entry_with("description", json!(text))),
                format!("E_PERM_INVALID: manifest.resources[0].description: must not contain control characters, got {shown}"),
                "{text:?}"
            );
        }
    }

    #[test]
    fn description_refuses_bidirectional_formatting_characters() {
        for c in [
            '\u{202A}', '\u{202E}', '\u{2066}', '\u{2069}', '\u{200E}', '\u{200F}', '\u{061C}',
        ] {
            let text = format!("model{c}fdp.exe");
            let line = entry_line(entry_with("description", json!(text)));
            assert!(
                line.starts_with("E_PERM_INVALID: manifest.resources[0].description: must not contain bidirectional formatting characters, got \"model"),
                "{c:?}: {line}"
            );
        }
    }

    #[test]
    fn description_keeps_ordinary_text_of_any_script() {
        let text = "OCR 模型 — modèle, نموذج, 🙂";
        let resource = one_resource(entry_with("description", json!(text)));
        assert_eq!(resource.description.as_deref(), Some(text));
    }

    #[test]
    fn duplicate_ids_name_the_first_use() {
        let found = lines(&json!({ "resources": [
            entry_with("id", json!("a")),
            entry_with("id", json!("ocr-model")),
            entry_with("id", json!("b")),
            entry_with("id", json!("ocr-model")),
            entry_with("id", json!("ocr-model")),
        ] }));
        assert_eq!(
            found,
            [
                "E_PERM_INVALID: manifest.resources[3].id: duplicate id \"ocr-model\" (first used by manifest.resources[1])",
                "E_PERM_INVALID: manifest.resources[4].id: duplicate id \"ocr-model\" (first used by manifest.resources[1])",
            ]
        );
    }

    #[test]
    fn sha256_rules() {
        let upper = HASH.to_uppercase();
        let rule = "must be 64 lowercase hex digits";
        let cases = [
            (
                "ABC".to_string(),
                format!("{rule}, got 3 characters: \"ABC\""),
            ),
            (
                upper.clone(),
                format!("{rule} (write it in lower-case), got \"{upper}\""),
            ),
            (
                HASH[..63].to_string(),
                format!("{rule}, got 63 characters: \"{}\"", &HASH[..63]),
            ),
            (
                format!("{HASH}0"),
                format!("{rule}, got 65 characters: \"{HASH}0\""),
            ),
            (
                format!("{}g", &HASH[..63]),
                format!("{rule}, got \"{}g\"", &HASH[..63]),
            ),
            (String::new(), format!("{rule}, got 0 characters: \"\"")),
            ("a".to_string(), format!("{rule}, got 1 character: \"a\"")),
        ];
        for (value, message) in cases {
            assert_eq!(
                entry_line(entry_with("sha256", json!(value))),
                format!("E_PERM_INVALID: manifest.resources[0].sha256: {message}")
            );
        }
    }

    #[test]
    fn a_key_close_to_a_known_one_gets_a_suggestion() {
        for (key, known) in [
            ("descripton", "description"),
            ("Description", "description"),
            ("SHA256", "sha256"),
            ("sha-256", "sha256"),
            ("mirror", "mirrors"),
            ("urll", "url"),
            ("requierd", "required"),
        ] {
            assert_eq!(
                entry_line(entry_with(key, json!("x"))),
                format!("E_PERM_INVALID: manifest.resources[0]: unknown key \"{key}\" (did you mean `{known}`?)"),
                "{key}"
            );
        }
        for key in ["colour", "checksum", "name", "ab"] {
            assert_eq!(
                entry_line(entry_with(key, json!("x"))),
                format!("E_PERM_INVALID: manifest.resources[0]: unknown key \"{key}\""),
            );
        }
    }

    #[test]
    fn size_forms() {
        let empty = json!({ "id": "a", "url": "https://h/a", "sha256": EMPTY_SHA256, "size": 0 });
        assert_eq!(one_resource(empty).size, 0);
        // A size of 0 with another file's hash can never be met.
        assert!(entry_line(entry_with("size", json!(0))).starts_with(
            "E_PERM_INVALID: manifest.resources[0].size: is 0, but sha256 is not the empty file's"
        ));
        let max: Value = serde_json::from_str("18446744073709551615").unwrap();
        assert_eq!(one_resource(entry_with("size", max)).size, u64::MAX);
        let cases = [
            ("1.5", "1.5"),
            ("-1", "-1"),
            ("1e3", "1000.0"),
            ("\"12\"", "the string \"12\" (remove the quotes)"),
            ("\"twelve\"", "string"),
            ("18446744073709551616", "1.8446744073709552e+19"),
            ("0.0", "0.0"),
            ("-0", "-0.0"),
        ];
        for (text, shown) in cases {
            let value: Value = serde_json::from_str(text).unwrap();
            assert_eq!(
                entry_line(entry_with("size", value)),
                format!("E_PERM_INVALID: manifest.resources[0].size: must be a non-negative integer, got {shown}"),
                "{text}"
            );
        }
    }

    #[test]
    fn size_forms_from_raw_text() {
        let text = format!(
            r#"{{"resources": [{{"id": "a", "url": "https://h/a", "sha256": "{HASH}", "size": 18446744073709551616}}]}}"#
        );
        assert_eq!(
            bytes_lines(text.as_bytes()),
            ["E_PERM_INVALID: manifest.resources[0].size: must be a non-negative integer, got 1.8446744073709552e+19"]
        );
    }

    #[test]
    fn several_errors_in_key_order_and_entry_order() {
        let first = json!({
            "zeta": 1,
            "alpha": 2,
            "description": 3,
            "required": "no",
            "size": -1,
            "sha256": "ABC",
            "mirrors": ["ftp://x/y"],
            "url": "http://cdn.example.com/a.bin",
            "id": ""
        });
        let second = json!({"url": "https://h/a", "sha256": HASH, "size": 1});
        assert_eq!(
            lines(&json!({ "resources": [first, second, 4] })),
            [
                "E_PERM_INVALID: manifest.resources[0]: unknown key \"alpha\"",
                "E_PERM_INVALID: manifest.resources[0]: unknown key \"zeta\"",
                "E_PERM_INVALID: manifest.resources[0].id: must not be empty",
                "E_PERM_INVALID: manifest.resources[0].url: must start with https://, got \"http://cdn.example.com/a.bin\"",
                "E_PERM_INVALID: manifest.resources[0].mirrors[0]: must start with https://, got \"ftp://x/y\"",
                "E_PERM_INVALID: manifest.resources[0].sha256: must be 64 lowercase hex digits, got 3 characters: \"ABC\"",
                "E_PERM_INVALID: manifest.resources[0].size: must be a non-negative integer, got -1",
                "E_PERM_INVALID: manifest.resources[0].required: must be a boolean, got string",
                "E_PERM_INVALID: manifest.resources[0].description: must be a string, got number",
                "E_PERM_INVALID: manifest.resources[1].id: is required",
                "E_PERM_INVALID: manifest.resources[4]: must be an object, got number".replace("[4]", "[2]").as_str(),
            ]
        );
    }
}
