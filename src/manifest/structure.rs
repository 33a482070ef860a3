//! The structure of a validated manifest: [`Manifest`] and its
//! [`Resource`] entries, the safe file name of a resource, and the manifest
//! JSON that declares a list of resources.

use serde_json::Value;
use url::Url;

use super::addresses::{url_text, url_text_list};
use super::format_chars;

/// The most bytes [`Resource::file_name`] returns.
const MAX_FILE_NAME_BYTES: usize = 200;

/// The longest extension (dot included) kept when a file name is cut.
const MAX_KEPT_EXTENSION_BYTES: usize = 16;

/// A validated resources list.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    /// The declared resources, in manifest order.
    pub resources: Vec<Resource>,
    /// The gem's `name` (`"Sample OCR"`), for the pages that show the gem:
    /// a string with something other than spaces, trimmed, at most
    /// [`MAX_NAME_CHARS`] characters; anything else is no name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// The longest gem `name` kept, in characters (a longer one is cut).
pub const MAX_NAME_CHARS: usize = 200;

/// The gem's `name` from a manifest's top level, if it has a usable one.
pub(super) fn name_of(object: &serde_json::Map<String, Value>) -> Option<String> {
    let name = object.get("name")?.as_str()?.trim();
    (!name.is_empty()).then(|| name.chars().take(MAX_NAME_CHARS).collect())
}

/// One validated resource entry of a manifest.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Resource {
    /// Identifier, unique within the manifest.
    pub id: String,
    /// The primary `https://` address.
    #[serde(with = "url_text")]
    pub url: Url,
    /// Further `https://` addresses, tried in order after `url` fails.
    #[serde(with = "url_text_list")]
    pub mirrors: Vec<Url>,
    /// Expected SHA-256 of the file: 64 lowercase hex digits.
    pub sha256: String,
    /// Expected size of the file in bytes.
    pub size: u64,
    /// Whether the gem cannot work without this resource.
    pub required: bool,
    /// Text shown on the gem's page; the id is shown when there is none.
    pub description: Option<String>,
}

impl Resource {
    /// url then mirrors, in the order they are tried.
    pub fn addresses(&self) -> impl Iterator<Item = &Url> {
        std::iter::once(&self.url).chain(self.mirrors.iter())
    }

    /// description, or the id when there is none.
    pub fn label(&self) -> &str {
        self.description.as_deref().unwrap_or(&self.id)
    }

    /// The file name a tool sees: the last non-empty path segment of `url`,
    /// percent-decoded (lossy UTF-8), made safe: `/`, `\`, NUL, control
    /// characters, format characters (bidirectional overrides, zero-width
    /// characters: Unicode's Cf) and line or paragraph separators become
    /// `_`, a leading `.` gets a `_` prefix, `.` and `..` are not names, and
    /// the result is at most 200 bytes (cut at a char boundary, keeping a
    /// short extension). Falls back to the id made safe
    /// the same way, then to `"resource"`.
    pub fn file_name(&self) -> String {
        let from_url = self
            .url
            .path_segments()
            .and_then(|mut segments| segments.rfind(|segment| !segment.is_empty()))
            .map(|segment| String::from_utf8_lossy(&percent_decode(segment)).into_owned())
            .and_then(|name| safe_file_name(&name));
        from_url
            .or_else(|| safe_file_name(&self.id))
            .unwrap_or_else(|| "resource".to_string())
    }
}

/// Decodes `%XX` escapes; a `%` not followed by two hex digits stays as is.
fn percent_decode(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let byte = bytes[index];
        if byte == b'%' {
            let high = bytes.get(index + 1).and_then(|b| hex_value(*b));
            let low = bytes.get(index + 2).and_then(|b| hex_value(*b));
            if let (Some(high), Some(low)) = (high, low) {
                out.push(high << 4 | low);
                index += 3;
                continue;
            }
        }
        out.push(byte);
        index += 1;
    }
    out
}

/// The value of one hex digit.
fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

/// Makes a file name safe, or `None` when nothing usable is left. The name
/// is the same on every platform and legal on each: no path separator,
/// control character or character Windows refuses (`<>:"|?*`), no leading
/// dot, no Windows device name (`CON`, `aux.txt`, `COM1.bin`, …; a `_` is
/// put in front) and no trailing dot or space (each becomes `_`).
fn safe_file_name(raw: &str) -> Option<String> {
    let replaced: String = raw
        .chars()
        .map(|c| if unsafe_in_file_name(c) { '_' } else { c })
        .collect();
    if replaced.is_empty() || replaced == "." || replaced == ".." {
        return None;
    }
    let name = if replaced.starts_with('.') || is_windows_device_name(&replaced) {
        format!("_{replaced}")
    } else {
        replaced
    };
    Some(no_trailing_dot_or_space(cut_file_name(name)))
}

/// Whether `c` has no place in a file name on some platform, or would make
/// the name read as another: control characters, format characters
/// (Unicode's Cf: bidirectional overrides, isolates and marks, zero-width
/// spaces and joiners) and the line and paragraph separators.
fn unsafe_in_file_name(c: char) -> bool {
    matches!(c, '/' | '\\' | '<' | '>' | ':' | '"' | '|' | '?' | '*')
        || c.is_control()
        || format_chars::is_format(c)
        || matches!(c, '\u{2028}' | '\u{2029}')
}

/// Whether Windows takes `name` for a device: its part before the first dot
/// (trailing spaces ignored) is a reserved name, whatever its case.
fn is_windows_device_name(name: &str) -> bool {
    const DEVICES: [&str; 6] = ["CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"];
    let stem = name.split('.').next().unwrap_or(name).trim_end_matches(' ');
    if DEVICES.iter().any(|d| stem.eq_ignore_ascii_case(d)) {
        return true;
    }
    let mut chars = stem.chars();
    let prefix: String = chars.by_ref().take(3).collect();
    let digit: Vec<char> = chars.collect();
    (prefix.eq_ignore_ascii_case("COM") || prefix.eq_ignore_ascii_case("LPT"))
        && matches!(digit[..], ['0'..='9' | '\u{b9}' | '\u{b2}' | '\u{b3}'])
}

/// Replaces each dot or space at the end of `name` with `_` (Windows drops
/// them, so `a.` and `a` would be one file).
fn no_trailing_dot_or_space(name: String) -> String {
    let kept = name.trim_end_matches(['.', ' ']);
    let dropped = name.len() - kept.len();
    if dropped == 0 {
        return name;
    }
    format!("{kept}{}", "_".repeat(dropped))
}

/// Cuts a name to [`MAX_FILE_NAME_BYTES`] at a char boundary, keeping a short
/// extension.
fn cut_file_name(name: String) -> String {
    if name.len() <= MAX_FILE_NAME_BYTES {
        return name;
    }
    let extension = match name.rfind('.') {
        Some(dot) if dot > 0 && name.len() - dot <= MAX_KEPT_EXTENSION_BYTES => &name[dot..],
        _ => "",
    };
    let stem_budget = MAX_FILE_NAME_BYTES - extension.len();
    let mut end = stem_budget;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{extension}", &name[..end])
}

/// The manifest JSON that declares exactly `resources`: optional fields that
/// hold their default are written anyway, except a missing description. How
/// a registration's resources are checked against the manifest rules again,
/// and an entry point for the fuzz targets.
#[doc(hidden)]
pub fn manifest_json(resources: &[Resource]) -> serde_json::Value {
    let entries: Vec<serde_json::Value> = resources
        .iter()
        .map(|r| {
            let mut entry = serde_json::json!({
                "id": r.id,
                "url": r.url.as_str(),
                "mirrors": r.mirrors.iter().map(url::Url::as_str).collect::<Vec<_>>(),
                "sha256": r.sha256,
                "size": r.size,
                "required": r.required,
            });
            if let Some(text) = &r.description {
                entry["description"] = serde_json::json!(text);
            }
            entry
        })
        .collect();
    serde_json::json!({ "resources": entries })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::test_entries::*;

    #[test]
    fn file_name_cases() {
        let name = |url: &str| resource_at(url).file_name();
        assert_eq!(name("https://h/models/ocr-v3.onnx"), "ocr-v3.onnx");
        assert_eq!(
            name("https://h/models/ocr-v3.onnx?token=1&x=/y.bin#z"),
            "ocr-v3.onnx"
        );
        assert_eq!(name("https://h/models/"), "models");
        assert_eq!(name("https://h/models//"), "models");
        assert_eq!(name("https://h/a/%2F..%2Fetc"), "_.._etc");
        assert_eq!(
            name("https://h/a/..%2F..%2Fetc%2Fpasswd"),
            "_.._.._etc_passwd"
        );
        assert_eq!(name("https://h/a/%5C..%5Cx"), "_.._x");
        assert_eq!(name("https://h/a/.hidden"), "_.hidden");
        assert_eq!(name("https://h/a/%2Ehidden"), "_.hidden");
        assert_eq!(name("https://h/a/..."), "____");
        assert_eq!(name("https://h/a/b%00c%0Ad%1B"), "b_c_d_");
        assert_eq!(name("https://h/caf%C3%A9.bin"), "café.bin");
        assert_eq!(name("https://h/bad%FF.bin"), "bad\u{fffd}.bin");
        assert_eq!(name("https://h/100%25.bin"), "100%.bin");
        assert_eq!(name("https://h/a%zz"), "a%zz");
        // `..` cannot survive URL parsing as a segment; the parser resolves it.
        assert_eq!(name("https://h/models/%2e%2e"), "ocr-model");
        // Empty path: the id.
        assert_eq!(name("https://h"), "ocr-model");
        assert_eq!(name("https://h/?q=file.bin"), "ocr-model");
    }

    #[test]
    fn file_names_windows_refuses_are_mapped_everywhere() {
        let name = |url: &str| resource_at(url).file_name();
        // Device names, whatever the case or extension.
        assert_eq!(name("https://h/CON"), "_CON");
        assert_eq!(name("https://h/aux.txt"), "_aux.txt");
        assert_eq!(name("https://h/Nul.tar.gz"), "_Nul.tar.gz");
        assert_eq!(name("https://h/com1.bin"), "_com1.bin");
        assert_eq!(name("https://h/LPT9"), "_LPT9");
        assert_eq!(name("https://h/COM%C2%B9.bin"), "_COM\u{b9}.bin");
        assert_eq!(name("https://h/con%20.txt"), "_con .txt");
        assert_eq!(name("https://h/conin$"), "_conin$");
        // Characters Windows refuses.
        assert_eq!(name("https://h/a:b"), "a_b");
        assert_eq!(name("https://h/a%3Cb%3E%22c%7C%3F*"), "a_b__c___");
        assert_eq!(name("https://h/a%5Cb"), "a_b");
        // Trailing dots and spaces.
        assert_eq!(name("https://h/model.onnx."), "model.onnx_");
        assert_eq!(name("https://h/model%20.%20"), "model___");
        // Names that only look close stay as they are.
        for kept in [
            "console.bin",
            "com10.bin",
            "lpt.bin",
            "auxiliary",
            "nul_",
            "a.b.c",
        ] {
            assert_eq!(name(&format!("https://h/{kept}")), kept);
        }
        assert_eq!(name("https://h/model%20v2.onnx"), "model v2.onnx");
        // The id falls back through the same rules.
        let mut resource = resource_at("https://h/");
        resource.id = "prn".to_string();
        assert_eq!(resource.file_name(), "_prn");
    }

    #[test]
    fn a_cut_file_name_does_not_end_in_a_dot_or_space() {
        // No extension kept (too long): the cut falls just after the space
        // or the dot.
        for cut_at in ["%20", "."] {
            let url = format!("https://h/{}{cut_at}{}", "x".repeat(199), "y".repeat(50));
            let cut = resource_at(&url).file_name();
            assert_eq!(cut, format!("{}_", "x".repeat(199)));
        }
    }

    #[test]
    fn file_name_falls_back_to_a_safe_id() {
        let mut resource = resource_at("https://h/");
        resource.id = "..".to_string();
        assert_eq!(resource.file_name(), "resource");
        resource.id = ".".to_string();
        assert_eq!(resource.file_name(), "resource");
        resource.id = ".cache".to_string();
        assert_eq!(resource.file_name(), "_.cache");
        resource.id = "a/b\\c".to_string();
        assert_eq!(resource.file_name(), "a_b_c");
        resource.id = String::new();
        assert_eq!(resource.file_name(), "resource");
    }

    #[test]
    fn file_name_is_cut_to_200_bytes() {
        let long_stem = "é".repeat(150);
        let cut = resource_at(&format!("https://h/{long_stem}.onnx")).file_name();
        assert!(cut.len() <= 200);
        assert!(cut.ends_with(".onnx"));
        assert_eq!(cut, format!("{}.onnx", "é".repeat(97)));

        let no_extension = resource_at(&format!("https://h/{}", "b".repeat(300))).file_name();
        assert_eq!(no_extension, "b".repeat(200));

        let long_extension = format!("a.{}", "x".repeat(300));
        let cut = resource_at(&format!("https://h/{long_extension}")).file_name();
        assert_eq!(cut, long_extension[..200]);

        let odd = format!("a{}", "€".repeat(100));
        let cut = resource_at(&format!("https://h/{odd}")).file_name();
        assert_eq!(cut, format!("a{}", "€".repeat(66)));
        assert_eq!(cut.len(), 199);
    }

    #[test]
    fn serde_round_trip_rechecks_urls() {
        let manifest = validate(&json!({ "resources": [
            entry_with("mirrors", json!(["https://m.example.com/a"]))
        ] }))
        .unwrap();
        let text = serde_json::to_string(&manifest).unwrap();
        assert!(text.contains("\"url\":\"https://cdn.example.com/models/ocr-v3.onnx\""));
        assert!(text.contains("\"mirrors\":[\"https://m.example.com/a\"]"));
        let back: Manifest = serde_json::from_str(&text).unwrap();
        assert_eq!(back, manifest);

        let tampered = text.replace("https://m.example.com/a", "http://m.example.com/a");
        let error = serde_json::from_str::<Manifest>(&tampered).unwrap_err();
        assert!(
            error.to_string().contains("must start with https://"),
            "{error}"
        );
    }
}
