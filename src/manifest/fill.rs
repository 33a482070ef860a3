//! Auto-filling a manifest: reading one whose resources may lack `size`
//! and `sha256` (every other rule still applies), and writing the values
//! found back into its text with the smallest edit, so that the key order,
//! the formatting and every other part of the file stay as they were.

use serde_json::Value;

use super::encoding::parse_json;
use super::report::ManifestError;
use super::structure::Resource;
use super::validation::validate_unfilled;

/// A placeholder digest, valid by the rules, for a missing `sha256`.
const PLACEHOLDER_SHA256: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// One resource entry of a manifest read by [`parse_unfilled`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfilled {
    /// The entry's index in `resources`.
    pub index: usize,
    /// The entry, with `size` 0 and an all-zero `sha256` where they lack.
    pub resource: Resource,
    /// The entry has no `size`.
    pub lacks_size: bool,
    /// The entry has no `sha256`.
    pub lacks_sha256: bool,
}

impl Unfilled {
    /// Whether the entry lacks `size` or `sha256`.
    pub fn lacks_any(&self) -> bool {
        self.lacks_size || self.lacks_sha256
    }
}

/// Validates a manifest by every rule except that `size` and `sha256` may
/// be missing; returns each entry, saying which of the two it lacks.
pub fn parse_unfilled(bytes: &[u8]) -> Result<Vec<Unfilled>, ManifestError> {
    let mut value = parse_json(bytes)?;
    let mut lacks = Vec::new();
    if let Some(Value::Array(entries)) = value.get_mut("resources") {
        for entry in entries.iter_mut() {
            let Some(object) = entry.as_object_mut() else {
                lacks.push((false, false));
                continue;
            };
            let (size, sha256) = (!object.contains_key("size"), !object.contains_key("sha256"));
            if size {
                object.insert("size".into(), Value::from(0u64));
            }
            if sha256 {
                object.insert("sha256".into(), Value::from(PLACEHOLDER_SHA256));
            }
            lacks.push((size, sha256));
        }
    }
    let manifest = validate_unfilled(&value)?;
    Ok(manifest
        .resources
        .into_iter()
        .zip(lacks)
        .enumerate()
        .map(|(index, (resource, (lacks_size, lacks_sha256)))| Unfilled {
            index,
            resource,
            lacks_size,
            lacks_sha256,
        })
        .collect())
}

/// The values found for one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fill {
    /// The entry's index in `resources`.
    pub index: usize,
    /// The file's size in bytes.
    pub size: u64,
    /// The file's SHA-256, 64 lowercase hex digits.
    pub sha256: String,
}

/// `text` (a manifest that [`parse_unfilled`] accepted) with each fill's
/// `size` and `sha256` set: an existing value is replaced in place, a
/// missing key is added after the entry's last key in the entry's own
/// layout (on a line of its own, indented like its other keys, when they
/// are on lines of their own). Nothing else changes, a leading byte-order
/// mark included. `None` when the text does not have the shape it was
/// read with.
pub fn fill_text(text: &str, fills: &[Fill]) -> Option<String> {
    if let Some(rest) = text.strip_prefix('\u{feff}') {
        return fill_text(rest, fills).map(|filled| format!("\u{feff}{filled}"));
    }
    let entries = scan::resource_entries(text)?;
    // Edits as (start, end, replacement), applied from the end.
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    for fill in fills {
        let entry = entries.get(fill.index)?;
        let sha256 = format!("\"{}\"", fill.sha256);
        let size = fill.size.to_string();
        let mut added = Vec::new();
        for (key, value) in [("sha256", sha256), ("size", size)] {
            match entry.last_value_of(key) {
                Some((start, end)) => edits.push((start, end, value)),
                None => added.push(format!("\"{key}\": {value}")),
            }
        }
        if !added.is_empty() {
            let at = entry.members.last()?.value.1;
            let separator = entry.separator(text);
            let insert: String = added
                .iter()
                .map(|member| format!(",{separator}{member}"))
                .collect();
            edits.push((at, at, insert));
        }
    }
    edits.sort_by_key(|(start, _, _)| std::cmp::Reverse(*start));
    let mut out = text.to_string();
    for (start, end, replacement) in edits {
        out.replace_range(start..end, &replacement);
    }
    Some(out)
}

/// Where things are in a JSON text already known to be valid.
mod scan {
    /// One member of an object: its key and the byte spans of the key's
    /// string and of its value.
    pub struct Member {
        pub key: String,
        pub key_start: usize,
        pub value: (usize, usize),
    }

    /// One entry of `resources`.
    pub struct Entry {
        /// Byte offset of its `{`.
        pub open: usize,
        pub members: Vec<Member>,
    }

    impl Entry {
        /// The span of the value of the last `key` (the one a JSON reader
        /// keeps).
        pub fn last_value_of(&self, key: &str) -> Option<(usize, usize)> {
            self.members
                .iter()
                .rev()
                .find(|m| m.key == key)
                .map(|m| m.value)
        }

        /// What goes between a `,` and a new member: the line break and
        /// indentation of the entry's first member when it starts a line,
        /// else a space.
        pub fn separator(&self, text: &str) -> String {
            let Some(first) = self.members.first() else {
                return " ".into();
            };
            let before = &text[self.open + 1..first.key_start];
            match before.rfind('\n') {
                Some(newline) => {
                    let line_start = self.open + 1 + newline;
                    let indent = &text[line_start + 1..first.key_start];
                    let eol = if text[..line_start].ends_with('\r') {
                        "\r\n"
                    } else {
                        "\n"
                    };
                    format!("{eol}{indent}")
                }
                None => " ".into(),
            }
        }
    }

    struct Scanner<'a> {
        text: &'a str,
        at: usize,
    }

    /// The entries of the top-level `resources` array (the last such key,
    /// as a JSON reader keeps).
    pub fn resource_entries(text: &str) -> Option<Vec<Entry>> {
        let mut s = Scanner { text, at: 0 };
        let members = s.object()?;
        let resources = members.iter().rev().find(|m| m.key == "resources")?;
        let mut s = Scanner {
            text,
            at: resources.value.0,
        };
        s.array_of_objects()
    }

    impl Scanner<'_> {
        fn peek(&self) -> Option<u8> {
            self.text.as_bytes().get(self.at).copied()
        }

        fn space(&mut self) {
            while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
                self.at += 1;
            }
        }

        fn expect(&mut self, byte: u8) -> Option<()> {
            self.space();
            (self.peek()? == byte).then(|| self.at += 1)
        }

        /// A string starting at the cursor, decoded.
        fn string(&mut self) -> Option<String> {
            let start = self.at;
            (self.peek()? == b'"').then_some(())?;
            self.at += 1;
            loop {
                match self.peek()? {
                    b'\\' => self.at += 2,
                    b'"' => {
                        self.at += 1;
                        return serde_json::from_str(&self.text[start..self.at]).ok();
                    }
                    _ => self.at += 1,
                }
            }
        }

        /// Skips one value; returns its span.
        fn value(&mut self) -> Option<(usize, usize)> {
            self.space();
            let start = self.at;
            match self.peek()? {
                b'"' => {
                    self.string()?;
                }
                b'{' => {
                    self.object()?;
                }
                b'[' => {
                    self.at += 1;
                    self.space();
                    if self.peek()? == b']' {
                        self.at += 1;
                    } else {
                        loop {
                            self.value()?;
                            self.space();
                            match self.peek()? {
                                b',' => self.at += 1,
                                b']' => {
                                    self.at += 1;
                                    break;
                                }
                                _ => return None,
                            }
                        }
                    }
                }
                _ => {
                    while matches!(self.peek(), Some(b) if !matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                    {
                        self.at += 1;
                    }
                }
            }
            Some((start, self.at))
        }

        /// An object at the cursor: its members.
        fn object(&mut self) -> Option<Vec<Member>> {
            self.expect(b'{')?;
            let mut members = Vec::new();
            self.space();
            if self.peek()? == b'}' {
                self.at += 1;
                return Some(members);
            }
            loop {
                self.space();
                let key_start = self.at;
                let key = self.string()?;
                self.expect(b':')?;
                let value = self.value()?;
                members.push(Member {
                    key,
                    key_start,
                    value,
                });
                self.space();
                match self.peek()? {
                    b',' => self.at += 1,
                    b'}' => {
                        self.at += 1;
                        return Some(members);
                    }
                    _ => return None,
                }
            }
        }

        /// An array of objects at the cursor (`resources` once validated).
        fn array_of_objects(&mut self) -> Option<Vec<Entry>> {
            self.expect(b'[')?;
            let mut entries = Vec::new();
            self.space();
            if self.peek()? == b']' {
                return Some(entries);
            }
            loop {
                self.space();
                let open = self.at;
                let members = self.object()?;
                entries.push(Entry { open, members });
                self.space();
                match self.peek()? {
                    b',' => self.at += 1,
                    b']' => return Some(entries),
                    _ => return None,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "9f2c000000000000000000000000000000000000000000000000000000000001";

    fn fill(index: usize, size: u64) -> Fill {
        Fill {
            index,
            size,
            sha256: HASH.into(),
        }
    }

    #[test]
    fn missing_keys_are_added_in_the_entry_layout_and_nothing_else_changes() {
        let text = "{\n  \"id\": \"g\",\n  \"resources\": [\n    {\n      \"id\": \"a\",\n      \"url\": \"https://h/a\"\n    },\n    { \"id\": \"b\", \"url\": \"https://h/b\", \"size\": 1 }\n  ],\n  \"z\": [1, {\"x\": \"}\"}]\n}\n";
        let out = fill_text(text, &[fill(0, 10), fill(1, 20)]).unwrap();
        let expected = format!("{{\n  \"id\": \"g\",\n  \"resources\": [\n    {{\n      \"id\": \"a\",\n      \"url\": \"https://h/a\",\n      \"sha256\": \"{HASH}\",\n      \"size\": 10\n    }},\n    {{ \"id\": \"b\", \"url\": \"https://h/b\", \"size\": 20, \"sha256\": \"{HASH}\" }}\n  ],\n  \"z\": [1, {{\"x\": \"}}\"}}]\n}}\n");
        assert_eq!(out, expected);
        let parsed = super::super::parse_manifest(out.as_bytes()).unwrap();
        assert_eq!(parsed.resources[1].size, 20);
    }

    #[test]
    fn a_byte_order_mark_is_read_past_and_kept() {
        let text = "\u{feff}{\"resources\": [{\"id\": \"a\", \"url\": \"https://h/a\"}]}";
        let all = parse_unfilled(text.as_bytes()).unwrap();
        assert!(all[0].lacks_size && all[0].lacks_sha256);
        let out = fill_text(text, &[fill(0, 10)]).unwrap();
        assert_eq!(
            out,
            format!("\u{feff}{{\"resources\": [{{\"id\": \"a\", \"url\": \"https://h/a\", \"sha256\": \"{HASH}\", \"size\": 10}}]}}")
        );
    }

    #[test]
    fn unfilled_entries_say_what_they_lack_and_other_rules_still_apply() {
        let text = br#"{"resources": [{"id": "a", "url": "https://h/a"}, {"id": "b", "url": "https://h/b", "size": 3}]}"#;
        let all = parse_unfilled(text).unwrap();
        assert!(all[0].lacks_size && all[0].lacks_sha256);
        assert!(!all[1].lacks_size && all[1].lacks_sha256);
        assert_eq!(all[1].resource.size, 3);
        let bad = br#"{"resources": [{"id": "a", "url": "http://h/a"}]}"#;
        let error = parse_unfilled(bad).unwrap_err();
        assert_eq!(error.problems.len(), 1, "{error}");
        assert_eq!(error.problems[0].path, "manifest.resources[0].url");
    }
}
