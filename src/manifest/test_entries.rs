//! What the unit tests of the manifest's files share: a valid entry, the
//! same with one key changed or removed, and the problem lines of a
//! manifest that holds it.

pub(super) use serde_json::{json, Value};
pub(super) use url::Url;

pub(super) use super::{parse_manifest, validate, Resource};

pub(super) const HASH: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

pub(super) fn base_entry() -> Value {
    json!({
        "id": "ocr-model",
        "url": "https://cdn.example.com/models/ocr-v3.onnx",
        "sha256": HASH,
        "size": 123
    })
}

pub(super) fn entry_with(key: &str, value: Value) -> Value {
    let mut entry = base_entry();
    entry[key] = value;
    entry
}

pub(super) fn entry_without(key: &str) -> Value {
    let mut entry = base_entry();
    if let Some(object) = entry.as_object_mut() {
        object.remove(key);
    }
    entry
}

pub(super) fn lines(value: &Value) -> Vec<String> {
    match validate(value) {
        Ok(manifest) => panic!("expected problems, got {manifest:?}"),
        Err(error) => error.to_string().lines().map(str::to_string).collect(),
    }
}

pub(super) fn bytes_lines(bytes: &[u8]) -> Vec<String> {
    match parse_manifest(bytes) {
        Ok(manifest) => panic!("expected problems, got {manifest:?}"),
        Err(error) => error.to_string().lines().map(str::to_string).collect(),
    }
}

/// The single problem line of a manifest holding just `entry`.
pub(super) fn entry_line(entry: Value) -> String {
    let found = lines(&json!({ "resources": [entry] }));
    assert_eq!(found.len(), 1, "{found:#?}");
    found[0].clone()
}

pub(super) fn one_resource(entry: Value) -> Resource {
    let manifest = validate(&json!({ "resources": [entry] })).unwrap();
    assert_eq!(manifest.resources.len(), 1);
    manifest.resources[0].clone()
}

pub(super) fn resource_at(url: &str) -> Resource {
    one_resource(entry_with("url", json!(url)))
}
