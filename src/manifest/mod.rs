//! Validation of the `resources` list that a gem declares in its manifest
//! (`notochord.json` or `manifest.json`).
//!
//! The manifest is hostile input: every rule is checked, every problem is
//! reported (not only the first), and every value echoed back in a message is
//! JSON-style escaped and cut to at most 100 characters so that a manifest can
//! neither flood the terminal nor inject control characters into it.
//!
//! Each problem renders as one line,
//! `E_PERM_INVALID: manifest.<path>: <message>`. Entries are checked in index
//! order and the keys of an entry in a fixed order (unknown keys first, then
//! `id`, `url`, `mirrors`, `sha256`, `size`, `required`, `description`), so
//! the output is deterministic.

mod addresses;
mod encoding;
mod fields;
pub mod fill;
mod format_chars;
mod report;
mod structure;
#[cfg(test)]
mod test_entries;
mod top_level;
mod validation;

pub use addresses::{parse_https_url, MAX_MIRRORS};
pub use encoding::{
    parse_json, read_manifest_file, read_regular_file, without_bom, MAX_MANIFEST_BYTES, UTF8_BOM,
};
pub use fields::EMPTY_SHA256;
pub(crate) use format_chars::is_format;
pub use report::{ManifestError, Problem};
#[doc(hidden)]
pub use structure::manifest_json;
pub use structure::{Manifest, Resource, MAX_NAME_CHARS};
pub use top_level::{remarks, TOP_LEVEL_KEYS};
pub use validation::{parse_manifest, validate};
