//! The report of a manifest's problems: [`Problem`] (a path and a
//! message), [`ManifestError`] (all of them, rendered one line each under
//! `E_PERM_INVALID`), the report the rules add to while they check, and how
//! a hostile value is quoted in a message (escaped, at most 100 characters).

use std::fmt;

use serde_json::Value;

/// The error code every manifest problem is reported under.
const CODE: &str = "E_PERM_INVALID";

/// The most characters a quoted value may take in a message.
const QUOTE_LIMIT: usize = 100;

/// One validation problem: `path` like `manifest.resources[1].url`, `message`
/// like "must start with https://, got \"http://…\"".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Where the problem is, e.g. `manifest.resources[1].url`.
    pub path: String,
    /// What is wrong, e.g. `must start with https://, got "http://x/a"`.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{CODE}: {}: {}", self.path, self.message)
    }
}

impl Problem {
    /// Where the problem is, said with the file that holds the manifest
    /// when it came from one: `notochord.json: manifest.resources[0].url`,
    /// and `notochord.json` alone for the manifest as a whole.
    pub fn place(&self, file: Option<&str>) -> String {
        match (file, self.path.as_str()) {
            (None, path) => path.to_string(),
            (Some(file), "manifest") => file.to_string(),
            (Some(file), path) => format!("{file}: {path}"),
        }
    }
}

/// All problems of a rejected manifest. Display = one line per problem, each
/// "E_PERM_INVALID: {file}: {path}: {message}" (without the file when the
/// manifest came from none), joined by '\n'.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", render_problems(self))]
pub struct ManifestError {
    /// Every problem found, in report order.
    pub problems: Vec<Problem>,
    /// The file the manifest was read from, as its reader names it, when
    /// it came from one: messages name it before each problem's place, and
    /// the JSON documents give it apart from the place (`file`, `path`).
    pub file: Option<String>,
}

impl ManifestError {
    /// The error code of every manifest problem: `E_PERM_INVALID`.
    pub fn code(&self) -> &'static str {
        CODE
    }

    /// An error holding `problems`, of no file yet.
    pub fn new(problems: Vec<Problem>) -> Self {
        ManifestError {
            problems,
            file: None,
        }
    }

    /// The same problems, of the manifest read from `file`.
    pub fn in_file(mut self, file: impl Into<String>) -> Self {
        self.file = Some(file.into());
        self
    }

    /// An error holding the single problem `message` at `path`.
    pub(super) fn single(path: &str, message: String) -> Self {
        ManifestError::new(vec![Problem {
            path: path.to_string(),
            message,
        }])
    }
}

/// One line per problem.
fn render_problems(error: &ManifestError) -> String {
    error
        .problems
        .iter()
        .map(|p| format!("{CODE}: {}: {}", p.place(error.file.as_deref()), p.message))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Collects problems with their paths.
#[derive(Default)]
pub(super) struct Report {
    /// The problems found so far, in report order.
    pub(super) problems: Vec<Problem>,
    /// Whether sizes and hashes are about to be filled in (auto-fill).
    pub(super) to_be_filled: bool,
}

impl Report {
    /// Records `message` at `path`.
    pub(super) fn add(&mut self, path: &str, message: String) {
        self.problems.push(Problem {
            path: path.to_string(),
            message,
        });
    }
}

/// Returns the string at a required key, reporting a missing key or a wrong
/// type.
pub(super) fn required_string<'a>(
    value: Option<&'a Value>,
    path: &str,
    report: &mut Report,
) -> Option<&'a str> {
    match value {
        None => {
            report.add(path, "is required".to_string());
            None
        }
        Some(Value::String(text)) => Some(text),
        Some(other) => {
            report.add(path, format!("must be a string, got {}", type_name(other)));
            None
        }
    }
}

/// The JSON type name of a value, as used in "got …".
pub(super) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The escaped form of one character inside a quoted value.
fn escape_char(c: char) -> String {
    match c {
        '"' => "\\\"".to_string(),
        '\\' => "\\\\".to_string(),
        '\'' => "'".to_string(),
        other => other.escape_debug().to_string(),
    }
}

/// Quotes a hostile value for a message: escaped like a Rust/JSON string
/// literal, with at most [`QUOTE_LIMIT`] characters between the quotes
/// (cut values end in `…`).
pub(super) fn quote(text: &str) -> String {
    format!("\"{}\"", limit_pieces(text.chars().map(escape_char)))
}

/// Cuts an unquoted value (such as a number's text) to [`QUOTE_LIMIT`]
/// characters, ending in `…` when cut.
pub(super) fn cut(text: &str) -> String {
    limit_pieces(text.chars().map(escape_char))
}

/// Joins escaped pieces, keeping whole pieces only, so that the result has at
/// most [`QUOTE_LIMIT`] characters; when something had to be left out the
/// result ends in `…`.
fn limit_pieces(pieces: impl Iterator<Item = String>) -> String {
    let mut kept = String::new();
    let mut kept_chars = 0;
    // The position and length of `kept` at the last point where one more
    // character (the `…`) still fits.
    let mut cut_at = 0;
    let mut total = 0;
    for piece in pieces {
        let piece_chars = piece.chars().count();
        total += piece_chars;
        if total > QUOTE_LIMIT {
            kept.truncate(cut_at);
            kept.push('…');
            return kept;
        }
        kept.push_str(&piece);
        kept_chars += piece_chars;
        if kept_chars < QUOTE_LIMIT {
            cut_at = kept.len();
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::parse_https_url;
    use crate::manifest::test_entries::*;

    #[test]
    fn problems_carry_path_and_message() {
        let error = validate(&json!({ "resources": [entry_with("size", json!(-1))] })).unwrap_err();
        assert_eq!(
            error.problems,
            [Problem {
                path: "manifest.resources[0].size".to_string(),
                message: "must be a non-negative integer, got -1".to_string(),
            }]
        );
        assert_eq!(error.code(), "E_PERM_INVALID");
    }

    #[test]
    fn long_values_are_cut() {
        let long = format!("http://{}", "a".repeat(500));
        let message = parse_https_url(&long).unwrap_err();
        let expected = format!(
            "must start with https://, got \"http://{}…\"",
            "a".repeat(92)
        );
        assert_eq!(message, expected);
        // Exactly 100 characters are shown whole.
        let exact = format!("http://{}", "a".repeat(93));
        assert_eq!(
            parse_https_url(&exact).unwrap_err(),
            format!("must start with https://, got \"{exact}\"")
        );
        let line = entry_line(entry_with("sha256", json!("Z".repeat(10_000))));
        assert_eq!(
            line,
            format!(
                "E_PERM_INVALID: manifest.resources[0].sha256: must be 64 lowercase hex digits, got 10000 characters: \"{}…\"",
                "Z".repeat(99)
            )
        );
    }

    #[test]
    fn cut_never_splits_an_escape() {
        let value = format!("{}{}", "a".repeat(97), "\u{1b}".repeat(10));
        let quoted = quote(&value);
        assert_eq!(quoted, format!("\"{}…\"", "a".repeat(97)));
        let inner = quoted.trim_matches('"');
        assert!(inner.chars().count() <= 100);
    }

    #[test]
    fn control_characters_in_values_are_escaped() {
        let line = entry_line(entry_with("sha256", json!("\u{1b}[2J\r\n\"\\\u{202e}'")));
        assert_eq!(
            line,
            "E_PERM_INVALID: manifest.resources[0].sha256: must be 64 lowercase hex digits, got 10 characters: \"\\u{1b}[2J\\r\\n\\\"\\\\\\u{202e}'\""
        );
        assert!(!line.chars().any(char::is_control));
    }

    #[test]
    fn display_joins_lines() {
        let error = ManifestError::new(vec![
            Problem {
                path: "manifest.a".to_string(),
                message: "x".to_string(),
            },
            Problem {
                path: "manifest.b".to_string(),
                message: "y".to_string(),
            },
        ]);
        assert_eq!(
            error.to_string(),
            "E_PERM_INVALID: manifest.a: x\nE_PERM_INVALID: manifest.b: y"
        );
    }
}
