//! Validating a whole manifest: its top level, then every entry, every
//! problem gathered in one report; strict, or before auto-fill.

use serde_json::Value;

use super::encoding::parse_json;
use super::fields::check_entries;
use super::report::{type_name, ManifestError, Report};
use super::structure::{name_of, Manifest};
use super::top_level;

/// Validates raw bytes (checks the size cap first, then JSON, then object,
/// then resources).
pub fn parse_manifest(bytes: &[u8]) -> Result<Manifest, ManifestError> {
    validate(&parse_json(bytes)?)
}

/// Validates an already-parsed JSON value.
pub fn validate(value: &Value) -> Result<Manifest, ManifestError> {
    validate_with(value, Report::default())
}

/// Validates a manifest whose `size` and `sha256` are about to be
/// replaced by auto-fill: a declared size of 0 beside another file's hash
/// is what auto-fill repairs, so it is no problem here.
pub(crate) fn validate_unfilled(value: &Value) -> Result<Manifest, ManifestError> {
    let report = Report {
        to_be_filled: true,
        ..Report::default()
    };
    validate_with(value, report)
}

fn validate_with(value: &Value, mut report: Report) -> Result<Manifest, ManifestError> {
    let Some(object) = value.as_object() else {
        return Err(ManifestError::single(
            "manifest",
            format!("must be a JSON object, got {}", type_name(value)),
        ));
    };
    let resources = match object.get("resources") {
        None => {
            top_level::check_missing_resources(object, &mut report);
            Vec::new()
        }
        Some(Value::Array(entries)) => check_entries(entries, &mut report),
        Some(other) => {
            report.add(
                "manifest.resources",
                format!("must be an array, got {}", type_name(other)),
            );
            Vec::new()
        }
    };
    if report.problems.is_empty() {
        Ok(Manifest {
            resources,
            name: name_of(object),
        })
    } else {
        Err(ManifestError::new(report.problems))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::test_entries::*;

    #[test]
    fn valid_manifest_with_all_fields() {
        let text = format!(
            r#"{{
                "name": "ocr",
                "version": 3,
                "resources": [{{
                    "id": "ocr-model",
                    "url": "https://cdn.example.com/models/ocr-v3.onnx",
                    "mirrors": ["https://m1.example.org/ocr-v3.onnx", "https://m2.example.net/x"],
                    "sha256": "{HASH}",
                    "size": 18446744073709551615,
                    "required": true,
                    "description": "OCR model"
                }}]
            }}"#
        );
        let manifest = parse_manifest(text.as_bytes()).unwrap();
        let resource = &manifest.resources[0];
        assert_eq!(resource.id, "ocr-model");
        assert_eq!(
            resource.url.as_str(),
            "https://cdn.example.com/models/ocr-v3.onnx"
        );
        assert_eq!(resource.sha256, HASH);
        assert_eq!(resource.size, u64::MAX);
        assert!(resource.required);
        assert_eq!(resource.description.as_deref(), Some("OCR model"));
        assert_eq!(resource.label(), "OCR model");
        let addresses: Vec<&str> = resource.addresses().map(Url::as_str).collect();
        assert_eq!(
            addresses,
            [
                "https://cdn.example.com/models/ocr-v3.onnx",
                "https://m1.example.org/ocr-v3.onnx",
                "https://m2.example.net/x"
            ]
        );
    }

    #[test]
    fn minimal_entry_gets_defaults() {
        let resource = one_resource(base_entry());
        assert!(resource.mirrors.is_empty());
        assert!(!resource.required);
        assert_eq!(resource.description, None);
        assert_eq!(resource.label(), "ocr-model");
        assert_eq!(resource.addresses().count(), 1);
    }

    #[test]
    fn missing_or_empty_resources_means_none() {
        assert_eq!(validate(&json!({})).unwrap().resources, Vec::new());
        assert_eq!(
            parse_manifest(b"{\"resources\": []}").unwrap().resources,
            Vec::new()
        );
    }

    #[test]
    fn other_top_level_keys_are_ignored() {
        let manifest = validate(&json!({
            "name": 5,
            "permissions": null,
            "resources": [base_entry()],
            "extra": {"resources": "not this one"}
        }))
        .unwrap();
        assert_eq!(manifest.resources.len(), 1);
    }

    #[test]
    fn resources_must_be_an_array() {
        assert_eq!(
            lines(&json!({ "resources": {} })),
            ["E_PERM_INVALID: manifest.resources: must be an array, got object"]
        );
        assert_eq!(
            lines(&json!({ "resources": null })),
            ["E_PERM_INVALID: manifest.resources: must be an array, got null"]
        );
    }

    #[test]
    fn top_level_must_be_an_object() {
        assert_eq!(
            bytes_lines(b"[1, 2]"),
            ["E_PERM_INVALID: manifest: must be a JSON object, got array"]
        );
        assert_eq!(
            lines(&json!("x")),
            ["E_PERM_INVALID: manifest: must be a JSON object, got string"]
        );
        assert_eq!(
            bytes_lines(b"null"),
            ["E_PERM_INVALID: manifest: must be a JSON object, got null"]
        );
    }
}
