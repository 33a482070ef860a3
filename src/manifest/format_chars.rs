//! The characters of Unicode's general category Cf (format): invisible
//! characters that change how the text around them is shown or joined,
//! the bidirectional embeddings, overrides, isolates and marks among them.
//! A name holding one reads as another (`U+202E` shows `exe.txt` for
//! `txt.exe`) or looks the same as a name without it (`U+200B`).
//!
//! The ranges are those of Unicode 15.1.

/// Every Cf code point, as inclusive ranges in ascending order.
const FORMAT: &[(char, char)] = &[
    ('\u{00AD}', '\u{00AD}'),
    ('\u{0600}', '\u{0605}'),
    ('\u{061C}', '\u{061C}'),
    ('\u{06DD}', '\u{06DD}'),
    ('\u{070F}', '\u{070F}'),
    ('\u{0890}', '\u{0891}'),
    ('\u{08E2}', '\u{08E2}'),
    ('\u{180E}', '\u{180E}'),
    ('\u{200B}', '\u{200F}'),
    ('\u{202A}', '\u{202E}'),
    ('\u{2060}', '\u{2064}'),
    ('\u{2066}', '\u{206F}'),
    ('\u{FEFF}', '\u{FEFF}'),
    ('\u{FFF9}', '\u{FFFB}'),
    ('\u{110BD}', '\u{110BD}'),
    ('\u{110CD}', '\u{110CD}'),
    ('\u{13430}', '\u{1343F}'),
    ('\u{1BCA0}', '\u{1BCA3}'),
    ('\u{1D173}', '\u{1D17A}'),
    ('\u{E0001}', '\u{E0001}'),
    ('\u{E0020}', '\u{E007F}'),
];

/// Whether `c` is a format character (general category Cf).
pub(crate) fn is_format(c: char) -> bool {
    FORMAT
        .binary_search_by(|&(low, high)| {
            if high < c {
                std::cmp::Ordering::Less
            } else if low > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ranges_are_sorted_and_apart() {
        for pair in FORMAT.windows(2) {
            assert!(pair[0].0 <= pair[0].1 && pair[0].1 < pair[1].0, "{pair:?}");
        }
    }

    #[test]
    fn format_characters_and_only_they_are_found() {
        for c in [
            '\u{202E}',
            '\u{200B}',
            '\u{200D}',
            '\u{2066}',
            '\u{FEFF}',
            '\u{E0041}',
            '\u{00AD}',
        ] {
            assert!(is_format(c), "{:04X}", c as u32);
        }
        for c in [
            'a',
            ' ',
            'é',
            '\u{200A}',
            '\u{2010}',
            '\u{FFFD}',
            '\u{1F600}',
        ] {
            assert!(!is_format(c), "{:04X}", c as u32);
        }
    }
}
