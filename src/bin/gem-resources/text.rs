//! Text for a person's terminal: what a manifest, a server or a record
//! says is shown, never obeyed. `--json` output keeps the exact text.

use std::borrow::Cow;

/// Whether `c` is kept off a terminal: C0 and C1 control characters, DEL,
/// bidirectional overrides, isolates and marks, and zero-width characters.
/// Any of them can recolour or retitle a terminal, hide or fake a line, or
/// make a text read differently from what it is.
fn unsafe_for_terminal(c: char) -> bool {
    matches!(
        c,
        '\u{0}'..='\u{1f}'
            | '\u{7f}'..='\u{9f}'
            | '\u{61c}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'
            | '\u{2066}'..='\u{2069}'
            | '\u{feff}'
    )
}

/// `text` with every character that is unsafe on a terminal, except those
/// in `keep`, written as `\u{…}`: the one escaping of every line printed
/// for a person.
pub fn escape_except<'a>(text: &'a str, keep: &[char]) -> Cow<'a, str> {
    let escaped = |c: char| unsafe_for_terminal(c) && !keep.contains(&c);
    if !text.chars().any(escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if escaped(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A line (or lines) for a person: everything unsafe on a terminal
/// escaped but line breaks and tabs.
pub fn for_terminal(text: &str) -> Cow<'_, str> {
    escape_except(text, &['\n', '\t'])
}

/// One value inside a line (an id, a description, a file name, a server's
/// text): line breaks and tabs escaped too, so it cannot fake a line or
/// shift a column.
pub fn field(text: &str) -> Cow<'_, str> {
    escape_except(text, &[])
}

/// An address for a person's line: a query of more than 40 characters
/// (a signed URL's, often hundreds) is cut to `?…`, so the line stays
/// readable. `--json` keeps the whole address.
pub fn elide_query(url: &str) -> Cow<'_, str> {
    match url.split_once('?') {
        Some((base, query)) if query.chars().count() > 40 => Cow::Owned(format!("{base}?…")),
        _ => Cow::Borrowed(url),
    }
}

/// Human-readable byte count.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_unsafe_on_a_terminal_is_escaped() {
        let hostile = "a\u{1b}]0;title\u{7}b\u{1b}[31mc\r\u{9b}d\u{7f}";
        assert_eq!(
            for_terminal(hostile),
            "a\\u{1b}]0;title\\u{7}b\\u{1b}[31mc\\u{d}\\u{9b}d\\u{7f}"
        );
        let bidi = "x\u{202e}y\u{2066}z\u{200b}w\u{feff}\u{61c}\u{200f}\u{2060}";
        assert_eq!(
            for_terminal(bidi),
            "x\\u{202e}y\\u{2066}z\\u{200b}w\\u{feff}\\u{61c}\\u{200f}\\u{2060}"
        );
        assert_eq!(for_terminal("two\nlines\tok"), "two\nlines\tok");
        assert_eq!(field("two\nlines\tok"), "two\\u{a}lines\\u{9}ok");
        // Plain text, accents and other scripts pass as they are.
        assert!(matches!(for_terminal("modèle ✓ 模型"), Cow::Borrowed(_)));
    }
}
