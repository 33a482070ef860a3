//! The manifest's top level. Only `resources` is read here; the other keys
//! of a `notochord.json` (or of Gem Studio's `manifest.json`) belong to the
//! rest of Notochord, so a key this crate does not know is never a problem
//! on its own. Two cases are, or may be, a mistake:
//!
//! - no `resources`, but a key close to it (`resource`, `Resources`,
//!   `resouces`): the files the author meant to declare would silently be
//!   none, so it is a problem, with a suggestion;
//! - no `resources` at all: valid (most gems declare no files), but
//!   [`remarks`] says so, and names each key no manifest has along with
//!   the keys one has, for `check` to print as notes.

use serde_json::{Map, Value};

use super::report::{quote, Problem, Report};

/// The keys a manifest's top level has: those of a `notochord.json` and of
/// Gem Studio's `manifest.json` (a gem with one tool may write the tool's
/// keys at the top level), and `resources`.
pub const TOP_LEVEL_KEYS: [&str; 17] = [
    "id",
    "name",
    "version",
    "description",
    "entry",
    "inputSchema",
    "outputSchema",
    "sideEffect",
    "expose",
    "tools",
    "workflows",
    "agents",
    "exports",
    "permissions",
    "knowledge",
    "data",
    "resources",
];

/// The most unknown keys [`remarks`] names one by one.
const MAX_NAMED_KEYS: usize = 10;

/// Reports each top-level key that was most likely meant to be `resources`
/// when there is none: the same word in another case, at most two edits
/// away, or starting with it (`resource_list`).
pub(super) fn check_missing_resources(object: &Map<String, Value>, report: &mut Report) {
    if object.contains_key("resources") {
        return;
    }
    let mut near: Vec<&String> = object.keys().filter(|key| near_resources(key)).collect();
    // Sorted, so the order does not depend on how the JSON map keeps keys.
    near.sort();
    for key in near {
        report.add(
            "manifest",
            format!("unknown key {} (did you mean `resources`?)", quote(key)),
        );
    }
}

/// Whether `key` (not a known key) reads as a misspelt `resources`.
fn near_resources(key: &str) -> bool {
    if TOP_LEVEL_KEYS.contains(&key) || key.chars().count() > 64 {
        return false;
    }
    let lower = key.to_lowercase();
    lower.starts_with("resource") || strsim::damerau_levenshtein(&lower, "resources") <= 2
}

/// What a valid manifest may not mean as written, one remark per line for
/// `check` to print as a note (`path: message`, as a [`Problem`] is
/// said). A manifest with `resources` gets none; one without is told so,
/// after each key no manifest has (at most ten named), with the keys one
/// has.
pub fn remarks(value: &Value) -> Vec<Problem> {
    let Some(object) = value.as_object() else {
        return Vec::new();
    };
    if object.contains_key("resources") {
        return Vec::new();
    }
    let mut unknown: Vec<&String> = object
        .keys()
        .filter(|key| !TOP_LEVEL_KEYS.contains(&key.as_str()))
        .collect();
    unknown.sort();
    let known = TOP_LEVEL_KEYS.join(", ");
    let mut remarks: Vec<Problem> = unknown
        .iter()
        .take(MAX_NAMED_KEYS)
        .map(|key| Problem {
            path: "manifest".into(),
            message: format!(
                "unknown key {} (the keys a manifest has: {known})",
                quote(key)
            ),
        })
        .collect();
    if unknown.len() > MAX_NAMED_KEYS {
        remarks.push(Problem {
            path: "manifest".into(),
            message: format!("{} more unknown keys", unknown.len() - MAX_NAMED_KEYS),
        });
    }
    remarks.push(Problem {
        path: "manifest".into(),
        message: "has no `resources`: it declares no files".into(),
    });
    remarks
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn problems(value: Value) -> Vec<String> {
        match super::super::validate(&value) {
            Ok(_) => Vec::new(),
            Err(error) => error.to_string().lines().map(str::to_string).collect(),
        }
    }

    #[test]
    fn a_near_miss_of_resources_is_a_problem_only_without_resources() {
        for key in [
            "resource",
            "Resources",
            "resouces",
            "ressources",
            "resource_list",
        ] {
            assert_eq!(
                problems(json!({ "id": "g", key: [] })),
                [format!(
                    "E_PERM_INVALID: manifest: unknown key \"{key}\" (did you mean `resources`?)"
                )],
                "{key}"
            );
            assert!(
                problems(json!({ key: 1, "resources": [] })).is_empty(),
                "{key}"
            );
        }
        for key in ["name", "tools", "files", "source_files"] {
            assert!(problems(json!({ key: [] })).is_empty(), "{key}");
        }
    }

    #[test]
    fn remarks_name_unknown_keys_only_when_there_are_no_resources() {
        assert!(remarks(&json!({ "files": 1, "resources": [] })).is_empty());
        let said: Vec<String> = remarks(&json!({ "id": "g", "files": 1 }))
            .iter()
            .map(|r| format!("{}: {}", r.path, r.message))
            .collect();
        assert_eq!(said.len(), 2, "{said:?}");
        assert!(
            said[0].starts_with(
                "manifest: unknown key \"files\" (the keys a manifest has: id, name, version,"
            ),
            "{said:?}"
        );
        assert_eq!(
            said[1],
            "manifest: has no `resources`: it declares no files"
        );
        let many: Map<String, Value> = (0..25).map(|i| (format!("k{i:02}"), json!(i))).collect();
        let said = remarks(&Value::Object(many));
        assert_eq!(said.len(), MAX_NAMED_KEYS + 2);
        assert_eq!(said[MAX_NAMED_KEYS].message, "15 more unknown keys");
    }
}
