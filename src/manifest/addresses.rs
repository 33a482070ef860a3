//! The address rules: what a `url` or a mirror must be (`https://`, a
//! host, no credentials, no whitespace, at most 2048 characters), the
//! `mirrors` list, and how an address is written and read back in a stored
//! [`Resource`](super::Resource).

use serde_json::Value;
use url::Url;

use super::report::{quote, required_string, type_name, Report};

/// The most characters a `url` or mirror may have.
const MAX_URL_CHARS: usize = 2048;

/// The most mirrors a resource may list: enough for any real distribution,
/// few enough that one manifest cannot queue thousands of attempts.
pub const MAX_MIRRORS: usize = 16;

/// Validates one address string by the `url` rules (used by other parts of
/// the crate for command-line URLs); Err is the message text.
pub fn parse_https_url(text: &str) -> Result<Url, String> {
    let length = text.chars().count();
    if length > MAX_URL_CHARS {
        return Err(format!(
            "must be at most {MAX_URL_CHARS} characters, got {length}"
        ));
    }
    // The URL parser silently drops tabs and newlines and trims surrounding
    // spaces, so the text shown to a user could differ from the address used.
    // Every echo of a rejected address hides what looks like userinfo.
    let shown = || quote(&mask_credentials_in_text(text));
    if text.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!(
            "must not contain whitespace or control characters, got {}",
            shown()
        ));
    }
    if !text.starts_with("https://") {
        let hint = if !text.is_empty() && !text.contains("://") && text.contains('.') {
            " (add https:// in front)"
        } else {
            ""
        };
        return Err(format!("must start with https://{hint}, got {}", shown()));
    }
    let url = match Url::parse(text) {
        Ok(url) => url,
        Err(error) => return Err(format!("is not a valid URL ({error}), got {}", shown())),
    };
    if url.scheme() != "https" {
        return Err(format!("must start with https://, got {}", shown()));
    }
    if url.host().is_none() {
        return Err(format!("must have a host, got {}", shown()));
    }
    // The parser percent-encodes non-ASCII text, so the address we store and
    // read back can be longer than the one written; it must fit the limit
    // too, or a stored registration would no longer read back.
    let normalised = url.as_str().chars().count();
    if normalised > MAX_URL_CHARS {
        return Err(format!(
            "must be at most {MAX_URL_CHARS} characters once percent-encoded, got {normalised}"
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        let mut masked = url.clone();
        // Clearing the userinfo of an https URL with a host cannot fail; the
        // fallback only keeps the secret out of the message regardless.
        let cleared = masked.set_username("").is_ok() && masked.set_password(None).is_ok();
        let shown = if cleared {
            masked.as_str().replacen("https://", "https://***@", 1)
        } else {
            "https://***@…".to_string()
        };
        return Err(format!(
            "must not contain credentials, got {}",
            quote(&shown)
        ));
    }
    Ok(url)
}

/// Checks the required `url`.
pub(super) fn check_required_url(
    value: Option<&Value>,
    path: &str,
    report: &mut Report,
) -> Option<Url> {
    let text = required_string(value, path, report)?;
    check_url_text(text, path, report)
}

/// Checks one address string, reporting its problem at `path`.
fn check_url_text(text: &str, path: &str, report: &mut Report) -> Option<Url> {
    match parse_https_url(text) {
        Ok(url) => Some(url),
        Err(message) => {
            report.add(path, message);
            None
        }
    }
}

/// Checks the optional `mirrors` array; every element is reported on its
/// own. At most [`MAX_MIRRORS`]; a mirror equal to `url` or to an earlier
/// mirror (compared as parsed addresses) is refused.
pub(super) fn check_mirrors(
    value: Option<&Value>,
    url: Option<&Url>,
    path: &str,
    report: &mut Report,
) -> Option<Vec<Url>> {
    let items = match value {
        None => return Some(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(other) => {
            report.add(path, format!("must be an array, got {}", type_name(other)));
            return None;
        }
    };
    let mut all_valid = true;
    if items.len() > MAX_MIRRORS {
        report.add(
            &format!("{path}[{MAX_MIRRORS}]"),
            format!(
                "at most {MAX_MIRRORS} mirrors are allowed, got {}",
                items.len()
            ),
        );
        all_valid = false;
    }
    let mut mirrors: Vec<Url> = Vec::with_capacity(items.len().min(MAX_MIRRORS));
    // Only the allowed ones are checked, so an oversized list costs no more
    // than a full one.
    for (index, item) in items.iter().enumerate().take(MAX_MIRRORS) {
        let item_path = format!("{path}[{index}]");
        let parsed = match item {
            Value::String(text) => check_url_text(text, &item_path, report),
            other => {
                report.add(
                    &item_path,
                    format!("must be a string, got {}", type_name(other)),
                );
                None
            }
        };
        let Some(mirror) = parsed else {
            all_valid = false;
            continue;
        };
        let entry_path = path.strip_suffix(".mirrors").unwrap_or(path);
        if url == Some(&mirror) {
            report.add(
                &item_path,
                format!(
                    "must differ from {entry_path}.url, got {}",
                    quote(mirror.as_str())
                ),
            );
            all_valid = false;
        } else if let Some(first) = mirrors.iter().position(|m| *m == mirror) {
            report.add(
                &item_path,
                format!(
                    "duplicate mirror {} (first listed at {path}[{first}])",
                    quote(mirror.as_str())
                ),
            );
            all_valid = false;
        }
        mirrors.push(mirror);
    }
    all_valid.then_some(mirrors)
}

/// Replaces what looks like userinfo in a rejected address text with `***`,
/// so a password is never echoed back.
fn mask_credentials_in_text(text: &str) -> String {
    let start = text.find("://").map_or(0, |scheme_end| scheme_end + 3);
    let rest = &text[start..];
    let authority_end = rest.find(['/', '?', '#', '\\']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{}***{}", &text[..start], &rest[at..]),
        None => text.to_string(),
    }
}

/// Serde helpers that write a URL as its text and read it back by the `url`
/// rules.
pub(super) mod url_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use url::Url;

    /// Writes the URL as its text.
    pub fn serialize<S: Serializer>(url: &Url, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(url.as_str())
    }

    /// Reads a URL text, checked by [`super::parse_https_url`].
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Url, D::Error> {
        let text = String::deserialize(deserializer)?;
        super::parse_https_url(&text).map_err(serde::de::Error::custom)
    }
}

/// Serde helpers for a list of URLs, each as in [`url_text`].
pub(super) mod url_text_list {
    use serde::ser::SerializeSeq;
    use serde::{Deserialize, Deserializer, Serializer};
    use url::Url;

    /// Writes the URLs as a list of texts.
    pub fn serialize<S: Serializer>(urls: &[Url], serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(urls.len()))?;
        for url in urls {
            seq.serialize_element(url.as_str())?;
        }
        seq.end()
    }

    /// Reads a list of URL texts, each checked by [`super::parse_https_url`].
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Url>, D::Error> {
        let texts = Vec::<String>::deserialize(deserializer)?;
        texts
            .iter()
            .map(|text| super::parse_https_url(text).map_err(serde::de::Error::custom))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::test_entries::*;

    #[test]
    fn url_must_be_https() {
        let cases = [
            (
                "http://cdn.example.com/a.bin",
                "must start with https://, got \"http://cdn.example.com/a.bin\"",
            ),
            (
                "HTTPS://cdn.example.com/a",
                "must start with https://, got \"HTTPS://cdn.example.com/a\"",
            ),
            (
                "cdn.example.com/a",
                "must start with https:// (add https:// in front), got \"cdn.example.com/a\"",
            ),
            ("", "must start with https://, got \"\""),
            (
                "file:///etc/passwd",
                "must start with https://, got \"file:///etc/passwd\"",
            ),
        ];
        for (url, message) in cases {
            assert_eq!(
                entry_line(entry_with("url", json!(url))),
                format!("E_PERM_INVALID: manifest.resources[1].url: {message}")
                    .replace("[1]", "[0]")
            );
        }
        let found = lines(&json!({ "resources": [
            entry_with("id", json!("a")),
            entry_with("url", json!("http://cdn.example.com/a.bin")),
        ] }));
        assert_eq!(
            found,
            ["E_PERM_INVALID: manifest.resources[1].url: must start with https://, got \"http://cdn.example.com/a.bin\""]
        );
    }

    #[test]
    fn url_must_parse_and_have_a_host() {
        assert_eq!(
            parse_https_url("https://"),
            Err("is not a valid URL (empty host), got \"https://\"".to_string())
        );
        assert_eq!(
            parse_https_url("https://exa mple.com/"),
            Err(
                "must not contain whitespace or control characters, got \"https://exa mple.com/\""
                    .to_string()
            )
        );
        assert_eq!(
            parse_https_url("https://host:99999/a"),
            Err(
                "is not a valid URL (invalid port number), got \"https://host:99999/a\""
                    .to_string()
            )
        );
        assert_eq!(
            entry_line(entry_with("url", json!("https://[::1/a"))),
            "E_PERM_INVALID: manifest.resources[0].url: is not a valid URL (invalid IPv6 address), got \"https://[::1/a\""
        );
    }

    #[test]
    fn url_whitespace_and_control_characters_are_rejected() {
        assert_eq!(
            parse_https_url("https://cdn.exa\tmple.com/a"),
            Err("must not contain whitespace or control characters, got \"https://cdn.exa\\tmple.com/a\"".to_string())
        );
        assert_eq!(
            parse_https_url(" https://cdn.example.com/a"),
            Err("must not contain whitespace or control characters, got \" https://cdn.example.com/a\"".to_string())
        );
    }

    #[test]
    fn url_length_limit() {
        let prefix = "https://cdn.example.com/";
        let fits = format!("{prefix}{}", "a".repeat(2048 - prefix.len()));
        assert!(parse_https_url(&fits).is_ok());
        let long = format!("{fits}a");
        assert_eq!(
            entry_line(entry_with("url", json!(long))),
            "E_PERM_INVALID: manifest.resources[0].url: must be at most 2048 characters, got 2049"
        );
    }

    #[test]
    fn credentials_are_masked() {
        assert_eq!(
            entry_line(entry_with("url", json!("https://user:s3cret@cdn.example.com/a"))),
            "E_PERM_INVALID: manifest.resources[0].url: must not contain credentials, got \"https://***@cdn.example.com/a\""
        );
        assert_eq!(
            parse_https_url("https://user@cdn.example.com/a"),
            Err("must not contain credentials, got \"https://***@cdn.example.com/a\"".to_string())
        );
        assert_eq!(
            parse_https_url("https://:s3cret@cdn.example.com/a"),
            Err("must not contain credentials, got \"https://***@cdn.example.com/a\"".to_string())
        );
        // Rejected for another reason: the password is still not echoed.
        for text in [
            "http://user:s3cret@cdn.example.com/a",
            "https://user:s3cret@cdn.example.com:99999/a",
            "https://user:s3cret@cdn.example.com/a b",
        ] {
            let message = parse_https_url(text).unwrap_err();
            assert!(!message.contains("s3cret"), "{message}");
            assert!(message.contains("***@cdn.example.com"), "{message}");
        }
    }

    #[test]
    fn mirrors_report_their_index() {
        let entry = entry_with(
            "mirrors",
            json!([
                "https://ok.example.com/a",
                "ftp://x/y",
                true,
                "https://u:p@h/a"
            ]),
        );
        assert_eq!(
            lines(&json!({ "resources": [entry] })),
            [
                "E_PERM_INVALID: manifest.resources[0].mirrors[1]: must start with https://, got \"ftp://x/y\"",
                "E_PERM_INVALID: manifest.resources[0].mirrors[2]: must be a string, got boolean",
                "E_PERM_INVALID: manifest.resources[0].mirrors[3]: must not contain credentials, got \"https://***@h/a\"",
            ]
        );
        assert_eq!(
            entry_line(entry_with("mirrors", json!(["ftp://x/y"]))),
            "E_PERM_INVALID: manifest.resources[0].mirrors[0]: must start with https://, got \"ftp://x/y\""
        );
        assert!(one_resource(entry_with("mirrors", json!([])))
            .mirrors
            .is_empty());
    }

    #[test]
    fn at_most_sixteen_mirrors() {
        let list = |n: usize| -> Vec<String> {
            (0..n)
                .map(|i| format!("https://m{i}.example.com/a"))
                .collect()
        };
        assert_eq!(
            one_resource(entry_with("mirrors", json!(list(16))))
                .mirrors
                .len(),
            16
        );
        assert_eq!(
            lines(&json!({ "resources": [entry_with("mirrors", json!(list(60_000)))] })),
            ["E_PERM_INVALID: manifest.resources[0].mirrors[16]: at most 16 mirrors are allowed, got 60000"]
        );
    }

    #[test]
    fn a_mirror_may_not_repeat_the_url_or_an_earlier_mirror() {
        let url = base_entry()["url"].as_str().unwrap().to_string();
        let entry = entry_with(
            "mirrors",
            json!([
                "https://m.example.com/a",
                url,
                "https://M.Example.COM:443/a",
                "https://other.example.com/a"
            ]),
        );
        assert_eq!(
            lines(&json!({ "resources": [entry] })),
            [
                format!("E_PERM_INVALID: manifest.resources[0].mirrors[1]: must differ from manifest.resources[0].url, got \"{url}\""),
                "E_PERM_INVALID: manifest.resources[0].mirrors[2]: duplicate mirror \"https://m.example.com/a\" (first listed at manifest.resources[0].mirrors[0])".to_string(),
            ]
        );
    }

    #[test]
    fn parse_https_url_accepts_good_addresses() {
        let url = parse_https_url("https://cdn.example.com:8443/a/b.bin?x=1#f").unwrap();
        assert_eq!(url.host_str(), Some("cdn.example.com"));
        assert_eq!(url.port(), Some(8443));
        assert!(parse_https_url("https://[::1]/a").is_ok());
        assert!(parse_https_url("https://127.0.0.1/a").is_ok());
    }
}
