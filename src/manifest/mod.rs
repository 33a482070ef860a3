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

pub mod fill;
mod format_chars;
mod top_level;
pub(crate) use format_chars::is_format;
pub use top_level::{remarks, TOP_LEVEL_KEYS};

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use serde_json::{Map, Value};
use url::Url;

/// The largest manifest, in bytes, that [`parse_manifest`] accepts.
pub const MAX_MANIFEST_BYTES: usize = 1024 * 1024;

/// The error code every manifest problem is reported under.
const CODE: &str = "E_PERM_INVALID";
/// The most characters a quoted value may take in a message.
const QUOTE_LIMIT: usize = 100;
/// The most characters an `id` may have.
const MAX_ID_CHARS: usize = 128;
/// The most characters a `url` or mirror may have.
const MAX_URL_CHARS: usize = 2048;
/// The most mirrors a resource may list: enough for any real distribution,
/// few enough that one manifest cannot queue thousands of attempts.
pub const MAX_MIRRORS: usize = 16;
/// The most bytes [`Resource::file_name`] returns.
const MAX_FILE_NAME_BYTES: usize = 200;
/// The longest extension (dot included) kept when a file name is cut.
const MAX_KEPT_EXTENSION_BYTES: usize = 16;
/// The keys an entry may carry, in the order they are checked.
const KNOWN_KEYS: [&str; 7] = [
    "id",
    "url",
    "mirrors",
    "sha256",
    "size",
    "required",
    "description",
];

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
fn name_of(object: &serde_json::Map<String, Value>) -> Option<String> {
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
    fn single(path: &str, message: String) -> Self {
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

/// Reads a manifest file for [`parse_manifest`] without ever holding more
/// than the cap: the size is checked from the file's metadata first, then
/// at most one byte past [`MAX_MANIFEST_BYTES`] is read (enough for the
/// validator to report a file that grew in between). Anything but a regular
/// file (a folder, a FIFO, a device) is refused without being read.
pub fn read_manifest_file(path: &Path) -> crate::Result<Vec<u8>> {
    let io = |e| crate::Error::io("cannot read manifest", path, e);
    let not_regular = || {
        io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ))
    };
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(io(match manifest_named_like(path) {
                Some(near) => std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("no such file; did you mean {}?", near.display()),
                ),
                None => e,
            }))
        }
        Err(e) => return Err(io(e)),
    };
    if metadata.is_dir() {
        // A gem's folder given for its manifest.
        let inside = ["notochord.json", "manifest.json"]
            .iter()
            .map(|n| path.join(n))
            .find(|p| p.is_file());
        let hint = match inside {
            Some(file) => format!("a folder; did you mean {}?", file.display()),
            None => "a folder, with no notochord.json or manifest.json in it".to_string(),
        };
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            hint,
        )));
    }
    if !metadata.is_file() {
        return Err(not_regular());
    }
    if metadata.len() > MAX_MANIFEST_BYTES as u64 {
        return Err(ManifestError::single("manifest", too_large(metadata.len())).into());
    }
    read_regular_file(path, MAX_MANIFEST_BYTES as u64).map_err(io)
}

/// The manifest beside a file name that does not exist, when the name
/// reads as a misspelt `notochord.json` or `manifest.json` (at most two
/// edits, in any case) and that file is there.
fn manifest_named_like(path: &Path) -> Option<std::path::PathBuf> {
    let name = path.file_name()?.to_str()?.to_lowercase();
    if name.chars().count() > 64 {
        return None;
    }
    ["notochord.json", "manifest.json"]
        .iter()
        .filter(|known| strsim::damerau_levenshtein(&name, known) <= 2)
        .map(|known| path.with_file_name(known))
        .find(|candidate| candidate.is_file())
}

/// Reads at most `cap + 1` bytes of the regular file at `path` (one byte
/// past the cap lets the caller report a file that grew): the reader of
/// every file a user or a gem hands over (manifests, the configuration).
/// Anything but a regular file (a folder, a FIFO, a device) is refused
/// with `InvalidInput` without being read, and opening never waits for a
/// FIFO's writer.
pub fn read_regular_file(path: &Path, cap: u64) -> std::io::Result<Vec<u8>> {
    let not_regular =
        || std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file");
    if !std::fs::metadata(path)?.is_file() {
        return Err(not_regular());
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    // Should the file be swapped for a FIFO after the check, opening it
    // must not wait for a writer.
    crate::platform::never_wait(&mut options);
    let file = options.open(path)?;
    if !file.metadata()?.is_file() {
        return Err(not_regular());
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(file, cap + 1), &mut bytes)?;
    Ok(bytes)
}

/// The problem of a manifest of `len` bytes.
fn too_large(len: u64) -> String {
    format!("is {len} bytes, larger than the {MAX_MANIFEST_BYTES}-byte limit")
}

/// Validates raw bytes (checks the size cap first, then JSON, then object,
/// then resources).
pub fn parse_manifest(bytes: &[u8]) -> Result<Manifest, ManifestError> {
    validate(&parse_json(bytes)?)
}

/// Reads a manifest's bytes as JSON, as every reader of a manifest does:
/// at most [`MAX_MANIFEST_BYTES`], a leading UTF-8 byte-order mark
/// (which Windows editors write) skipped as RFC 8259 allows, and a syntax
/// error said with its most likely cause (a comment, a trailing comma).
/// Nothing of the manifest's rules is checked yet: [`validate`] does.
pub fn parse_json(bytes: &[u8]) -> Result<Value, ManifestError> {
    if bytes.len() > MAX_MANIFEST_BYTES {
        return Err(ManifestError::single(
            "manifest",
            too_large(bytes.len() as u64),
        ));
    }
    let bytes = without_bom(bytes);
    serde_json::from_slice(bytes).map_err(|error| {
        let hint = json_hint(bytes, &error);
        ManifestError::single("manifest", format!("is not valid JSON ({error}){hint}"))
    })
}

/// `bytes` without a leading UTF-8 byte-order mark, if they have one.
pub fn without_bom(bytes: &[u8]) -> &[u8] {
    bytes.strip_prefix(UTF8_BOM).unwrap_or(bytes)
}

/// The UTF-8 byte-order mark.
pub const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// What a JSON syntax error most likely means, for the two mistakes people
/// make most: a comment, or a trailing comma.
fn json_hint(bytes: &[u8], error: &serde_json::Error) -> &'static str {
    let text = String::from_utf8_lossy(bytes);
    let at = text
        .lines()
        .nth(error.line().saturating_sub(1))
        .and_then(|line| line.get(error.column().saturating_sub(1)..))
        .unwrap_or_default();
    if at.starts_with("//") || at.starts_with("/*") {
        "; JSON has no comments: remove them"
    } else if error.to_string().contains("trailing comma") {
        "; remove the comma before the closing bracket"
    } else {
        ""
    }
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

/// Collects problems with their paths.
#[derive(Default)]
struct Report {
    /// The problems found so far, in report order.
    problems: Vec<Problem>,
    /// Whether sizes and hashes are about to be filled in (auto-fill).
    to_be_filled: bool,
}

impl Report {
    /// Records `message` at `path`.
    fn add(&mut self, path: &str, message: String) {
        self.problems.push(Problem {
            path: path.to_string(),
            message,
        });
    }
}

/// Checks every entry of the `resources` array; returns the valid resources
/// (meaningful only when no problem was reported).
fn check_entries(entries: &[Value], report: &mut Report) -> Vec<Resource> {
    let mut resources = Vec::with_capacity(entries.len());
    let mut first_use: HashMap<String, usize> = HashMap::new();
    for (index, entry) in entries.iter().enumerate() {
        let path = format!("manifest.resources[{index}]");
        let Some(object) = entry.as_object() else {
            report.add(
                &path,
                format!("must be an object, got {}", type_name(entry)),
            );
            continue;
        };
        if let Some(resource) = check_entry(object, &path, index, &mut first_use, report) {
            resources.push(resource);
        }
    }
    resources
}

/// Checks one entry in the fixed key order; returns it when it is valid.
fn check_entry(
    object: &Map<String, Value>,
    path: &str,
    index: usize,
    first_use: &mut HashMap<String, usize>,
    report: &mut Report,
) -> Option<Resource> {
    let before = report.problems.len();
    // Sorted, so the order does not depend on how the JSON map keeps keys.
    let mut unknown: Vec<&String> = object
        .keys()
        .filter(|key| !KNOWN_KEYS.contains(&key.as_str()))
        .collect();
    unknown.sort();
    for key in unknown {
        let hint = match closest_key(key) {
            Some(known) => format!(" (did you mean `{known}`?)"),
            None => String::new(),
        };
        report.add(path, format!("unknown key {}{hint}", quote(key)));
    }

    let id = check_id(object.get("id"), path, index, first_use, report);
    let url = check_required_url(object.get("url"), &format!("{path}.url"), report);
    let mirrors = check_mirrors(
        object.get("mirrors"),
        url.as_ref(),
        &format!("{path}.mirrors"),
        report,
    );
    let sha256 = check_sha256(object.get("sha256"), &format!("{path}.sha256"), report);
    let size = check_size(object.get("size"), &format!("{path}.size"), report);
    if let (Some(0), Some(sha256), false) = (size, sha256.as_deref(), report.to_be_filled) {
        check_empty_file(sha256, &format!("{path}.size"), report);
    }
    let required = check_required(object.get("required"), &format!("{path}.required"), report);
    let description = check_description(
        object.get("description"),
        &format!("{path}.description"),
        report,
    );

    if report.problems.len() != before {
        return None;
    }
    Some(Resource {
        id: id?,
        url: url?,
        mirrors: mirrors?,
        sha256: sha256?,
        size: size?,
        required: required?,
        description: description?,
    })
}

/// Checks `id`, including uniqueness against the entries before it.
fn check_id(
    value: Option<&Value>,
    entry_path: &str,
    index: usize,
    first_use: &mut HashMap<String, usize>,
    report: &mut Report,
) -> Option<String> {
    let path = format!("{entry_path}.id");
    let text = required_string(value, &path, report)?;
    let length = text.chars().count();
    if text.is_empty() {
        report.add(&path, "must not be empty".to_string());
        return None;
    }
    if length > MAX_ID_CHARS {
        report.add(
            &path,
            format!("must be at most {MAX_ID_CHARS} characters, got {length}"),
        );
        return None;
    }
    if text.chars().any(char::is_control) {
        report.add(
            &path,
            format!("must not contain control characters, got {}", quote(text)),
        );
        return None;
    }
    if let Some(first) = first_use.get(text) {
        report.add(
            &path,
            format!(
                "duplicate id {} (first used by manifest.resources[{first}])",
                quote(text)
            ),
        );
        return None;
    }
    first_use.insert(text.to_string(), index);
    Some(text.to_string())
}

/// Checks the required `url`.
fn check_required_url(value: Option<&Value>, path: &str, report: &mut Report) -> Option<Url> {
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
fn check_mirrors(
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

/// Checks the required `sha256`.
fn check_sha256(value: Option<&Value>, path: &str, report: &mut Report) -> Option<String> {
    let text = required_string(value, path, report)?;
    let length = text.chars().count();
    let all_hex = text
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b.to_ascii_lowercase()));
    let upper = text.bytes().any(|b| b.is_ascii_uppercase());
    let message = if length != 64 {
        let unit = if length == 1 {
            "character"
        } else {
            "characters"
        };
        format!(
            "must be 64 lowercase hex digits, got {length} {unit}: {}",
            quote(text)
        )
    } else if all_hex && !upper {
        return Some(text.to_string());
    } else if all_hex {
        format!(
            "must be 64 lowercase hex digits (write it in lower-case), got {}",
            quote(text)
        )
    } else {
        format!("must be 64 lowercase hex digits, got {}", quote(text))
    };
    // `sha256:…` (as some tools print it): the digits alone are wanted.
    let message = match text.split_once(':') {
        Some((prefix, rest)) if prefix.eq_ignore_ascii_case("sha256") && rest.len() == 64 => {
            format!("{message} (drop the \"{prefix}:\" prefix)")
        }
        _ => message,
    };
    report.add(path, message);
    None
}

/// The known key an unknown one was most likely meant to be: the same
/// key in another case, or one at most two edits away (one for short
/// keys).
fn closest_key(key: &str) -> Option<&'static str> {
    if key.chars().count() > 64 {
        return None;
    }
    let lower = key.to_lowercase();
    KNOWN_KEYS
        .iter()
        .map(|known| (strsim::damerau_levenshtein(&lower, known), *known))
        .filter(|(distance, known)| *distance <= if known.len() <= 4 { 1 } else { 2 })
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, known)| known)
}

/// Checks the required `size`: a JSON integer that fits `u64`.
fn check_size(value: Option<&Value>, path: &str, report: &mut Report) -> Option<u64> {
    let Some(value) = value else {
        report.add(path, "is required".to_string());
        return None;
    };
    let shown = match value {
        Value::Number(number) => match number.as_u64() {
            Some(size) => return Some(size),
            None => cut(&number.to_string()),
        },
        Value::String(text) if text.trim().parse::<u64>().is_ok() => {
            format!("the string {} (remove the quotes)", quote(text))
        }
        other => type_name(other).to_string(),
    };
    report.add(path, format!("must be a non-negative integer, got {shown}"));
    None
}

/// The SHA-256 of no bytes at all.
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// A `size` of 0 promises the empty file, whose SHA-256 is known: any other
/// hash can never be met, and every download of it would fail.
fn check_empty_file(sha256: &str, path: &str, report: &mut Report) {
    if sha256 != EMPTY_SHA256 {
        report.add(
            path,
            format!(
                "is 0, but sha256 is not the empty file's ({EMPTY_SHA256}): no download can ever match both"
            ),
        );
    }
}

/// Checks the optional `required` flag (default false).
fn check_required(value: Option<&Value>, path: &str, report: &mut Report) -> Option<bool> {
    match value {
        None => Some(false),
        Some(Value::Bool(flag)) => Some(*flag),
        Some(other) => {
            report.add(path, format!("must be a boolean, got {}", type_name(other)));
            None
        }
    }
}

/// Checks the optional `description`.
fn check_description(
    value: Option<&Value>,
    path: &str,
    report: &mut Report,
) -> Option<Option<String>> {
    match value {
        None => Some(None),
        Some(Value::String(text)) => match text.chars().find_map(unsafe_class) {
            None => Some(Some(text.clone())),
            Some(class) => {
                report.add(
                    path,
                    format!("must not contain {class}, got {}", quote(text)),
                );
                None
            }
        },
        Some(other) => {
            report.add(path, format!("must be a string, got {}", type_name(other)));
            None
        }
    }
}

/// The class of a character that text shown to a person must not carry,
/// or `None` for an ordinary one: control characters (C0, DEL, C1: a
/// terminal reads ESC and CSI as commands) and the bidirectional
/// formatting characters (embeddings, overrides, isolates and marks),
/// which make text display in another order than it reads.
fn unsafe_class(c: char) -> Option<&'static str> {
    match c {
        _ if c.is_control() => Some("control characters"),
        '\u{202A}'..='\u{202E}'
        | '\u{2066}'..='\u{2069}'
        | '\u{200E}'
        | '\u{200F}'
        | '\u{061C}' => Some("bidirectional formatting characters"),
        _ => None,
    }
}

/// Returns the string at a required key, reporting a missing key or a wrong
/// type.
fn required_string<'a>(
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
fn type_name(value: &Value) -> &'static str {
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
fn quote(text: &str) -> String {
    format!("\"{}\"", limit_pieces(text.chars().map(escape_char)))
}

/// Cuts an unquoted value (such as a number's text) to [`QUOTE_LIMIT`]
/// characters, ending in `…` when cut.
fn cut(text: &str) -> String {
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

/// Serde helpers that write a URL as its text and read it back by the `url`
/// rules.
mod url_text {
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
mod url_text_list {
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
    use serde_json::json;

    const HASH: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn base_entry() -> Value {
        json!({
            "id": "ocr-model",
            "url": "https://cdn.example.com/models/ocr-v3.onnx",
            "sha256": HASH,
            "size": 123
        })
    }

    fn entry_with(key: &str, value: Value) -> Value {
        let mut entry = base_entry();
        entry[key] = value;
        entry
    }

    fn entry_without(key: &str) -> Value {
        let mut entry = base_entry();
        if let Some(object) = entry.as_object_mut() {
            object.remove(key);
        }
        entry
    }

    fn lines(value: &Value) -> Vec<String> {
        match validate(value) {
            Ok(manifest) => panic!("expected problems, got {manifest:?}"),
            Err(error) => error.to_string().lines().map(str::to_string).collect(),
        }
    }

    fn bytes_lines(bytes: &[u8]) -> Vec<String> {
        match parse_manifest(bytes) {
            Ok(manifest) => panic!("expected problems, got {manifest:?}"),
            Err(error) => error.to_string().lines().map(str::to_string).collect(),
        }
    }

    /// The single problem line of a manifest holding just `entry`.
    fn entry_line(entry: Value) -> String {
        let found = lines(&json!({ "resources": [entry] }));
        assert_eq!(found.len(), 1, "{found:#?}");
        found[0].clone()
    }

    fn one_resource(entry: Value) -> Resource {
        let manifest = validate(&json!({ "resources": [entry] })).unwrap();
        assert_eq!(manifest.resources.len(), 1);
        manifest.resources[0].clone()
    }

    fn resource_at(url: &str) -> Resource {
        one_resource(entry_with("url", json!(url)))
    }

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
    fn entry_must_be_an_object() {
        let found = lines(&json!({ "resources": [
            base_entry(), 1, "x", null, [], true
        ] }));
        assert_eq!(
            found,
            [
                "E_PERM_INVALID: manifest.resources[1]: must be an object, got number",
                "E_PERM_INVALID: manifest.resources[2]: must be an object, got string",
                "E_PERM_INVALID: manifest.resources[3]: must be an object, got null",
                "E_PERM_INVALID: manifest.resources[4]: must be an object, got array",
                "E_PERM_INVALID: manifest.resources[5]: must be an object, got boolean",
            ]
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

    #[test]
    fn top_level_must_be_json() {
        assert_eq!(
            bytes_lines(b"{\"resources\": [}"),
            ["E_PERM_INVALID: manifest: is not valid JSON (expected value at line 1 column 16)"]
        );
        assert_eq!(
            bytes_lines(b""),
            ["E_PERM_INVALID: manifest: is not valid JSON (EOF while parsing a value at line 1 column 0)"]
        );
    }

    #[test]
    fn too_big_is_rejected_before_parsing() {
        let big = vec![b'x'; 2_000_000];
        assert_eq!(
            bytes_lines(&big),
            ["E_PERM_INVALID: manifest: is 2000000 bytes, larger than the 1048576-byte limit"]
        );
        let error = parse_manifest(&big).unwrap_err();
        assert_eq!(error.code(), "E_PERM_INVALID");
        assert_eq!(error.problems[0].path, "manifest");
    }

    #[test]
    fn exactly_at_the_limit_is_parsed() {
        let mut text = b"{\"resources\": []}".to_vec();
        text.resize(MAX_MANIFEST_BYTES, b' ');
        assert!(parse_manifest(&text).unwrap().resources.is_empty());
        text.push(b' ');
        assert_eq!(
            bytes_lines(&text),
            ["E_PERM_INVALID: manifest: is 1048577 bytes, larger than the 1048576-byte limit"]
        );
    }

    #[test]
    fn unknown_keys_are_reported_first() {
        let mut entry = entry_with("colour", json!("red"));
        entry["id"] = json!(7);
        let found = lines(&json!({ "resources": [base_entry(), base_entry(), entry] }));
        // The duplicate ids of entries 0 and 1 come first, in index order.
        assert_eq!(
            found,
            [
                "E_PERM_INVALID: manifest.resources[1].id: duplicate id \"ocr-model\" (first used by manifest.resources[0])",
                "E_PERM_INVALID: manifest.resources[2]: unknown key \"colour\"",
                "E_PERM_INVALID: manifest.resources[2].id: must be a string, got number",
            ]
        );
    }

    #[test]
    fn unknown_key_names_are_escaped() {
        assert_eq!(
            entry_line(entry_with("a\u{1b}[31mb", json!(1))),
            "E_PERM_INVALID: manifest.resources[0]: unknown key \"a\\u{1b}[31mb\""
        );
    }

    #[test]
    fn required_fields_are_required() {
        for key in ["id", "url", "sha256", "size"] {
            assert_eq!(
                entry_line(entry_without(key)),
                format!("E_PERM_INVALID: manifest.resources[0].{key}: is required")
            );
        }
    }

    #[test]
    fn empty_entry_reports_every_required_field() {
        assert_eq!(
            lines(&json!({ "resources": [{}] })),
            [
                "E_PERM_INVALID: manifest.resources[0].id: is required",
                "E_PERM_INVALID: manifest.resources[0].url: is required",
                "E_PERM_INVALID: manifest.resources[0].sha256: is required",
                "E_PERM_INVALID: manifest.resources[0].size: is required",
            ]
        );
    }

    #[test]
    fn wrong_types_are_reported() {
        let cases = [
            ("id", json!(1), "id: must be a string, got number"),
            ("id", json!(null), "id: must be a string, got null"),
            (
                "url",
                json!(["https://x/y"]),
                "url: must be a string, got array",
            ),
            ("url", json!(null), "url: must be a string, got null"),
            (
                "mirrors",
                json!("https://x/y"),
                "mirrors: must be an array, got string",
            ),
            (
                "mirrors",
                json!(null),
                "mirrors: must be an array, got null",
            ),
            (
                "mirrors",
                json!([1]),
                "mirrors[0]: must be a string, got number",
            ),
            ("sha256", json!({}), "sha256: must be a string, got object"),
            (
                "size",
                json!("12"),
                "size: must be a non-negative integer, got the string \"12\" (remove the quotes)",
            ),
            (
                "size",
                json!(null),
                "size: must be a non-negative integer, got null",
            ),
            (
                "size",
                json!(true),
                "size: must be a non-negative integer, got boolean",
            ),
            (
                "required",
                json!("yes"),
                "required: must be a boolean, got string",
            ),
            (
                "required",
                json!(null),
                "required: must be a boolean, got null",
            ),
            (
                "required",
                json!(1),
                "required: must be a boolean, got number",
            ),
            (
                "description",
                json!(5),
                "description: must be a string, got number",
            ),
            (
                "description",
                json!(null),
                "description: must be a string, got null",
            ),
        ];
        for (key, value, message) in cases {
            assert_eq!(
                entry_line(entry_with(key, value)),
                format!("E_PERM_INVALID: manifest.resources[0].{message}")
            );
        }
    }

    #[test]
    fn id_rules() {
        assert_eq!(
            entry_line(entry_with("id", json!(""))),
            "E_PERM_INVALID: manifest.resources[0].id: must not be empty"
        );
        assert_eq!(
            entry_line(entry_with("id", json!("a\nb"))),
            "E_PERM_INVALID: manifest.resources[0].id: must not contain control characters, got \"a\\nb\""
        );
        assert_eq!(
            entry_line(entry_with("id", json!("é".repeat(129)))),
            "E_PERM_INVALID: manifest.resources[0].id: must be at most 128 characters, got 129"
        );
        assert_eq!(
            one_resource(entry_with("id", json!("é".repeat(128))))
                .id
                .chars()
                .count(),
            128
        );
    }

    #[test]
    fn description_refuses_control_characters_of_every_class() {
        for (text, shown) in [
            ("a\u{1b}]0;owned\u{7}b", "\"a\\u{1b}]0;owned\\u{7}b\""),
            ("line\nbreak", "\"line\\nbreak\""),
            ("tab\there", "\"tab\\there\""),
            ("del\u{7f}", "\"del\\u{7f}\""),
            ("csi\u{9b}31m", "\"csi\\u{9b}31m\""),
        ] {
            assert_eq!(
                entry_line(entry_with("description", json!(text))),
                format!("E_PERM_INVALID: manifest.resources[0].description: must not contain control characters, got {shown}"),
                "{text:?}"
            );
        }
    }

    #[test]
    fn description_refuses_bidirectional_formatting_characters() {
        for c in [
            '\u{202A}', '\u{202E}', '\u{2066}', '\u{2069}', '\u{200E}', '\u{200F}', '\u{061C}',
        ] {
            let text = format!("model{c}fdp.exe");
            let line = entry_line(entry_with("description", json!(text)));
            assert!(
                line.starts_with("E_PERM_INVALID: manifest.resources[0].description: must not contain bidirectional formatting characters, got \"model"),
                "{c:?}: {line}"
            );
        }
    }

    #[test]
    fn description_keeps_ordinary_text_of_any_script() {
        let text = "OCR 模型 — modèle, نموذج, 🙂";
        let resource = one_resource(entry_with("description", json!(text)));
        assert_eq!(resource.description.as_deref(), Some(text));
    }

    #[test]
    fn duplicate_ids_name_the_first_use() {
        let found = lines(&json!({ "resources": [
            entry_with("id", json!("a")),
            entry_with("id", json!("ocr-model")),
            entry_with("id", json!("b")),
            entry_with("id", json!("ocr-model")),
            entry_with("id", json!("ocr-model")),
        ] }));
        assert_eq!(
            found,
            [
                "E_PERM_INVALID: manifest.resources[3].id: duplicate id \"ocr-model\" (first used by manifest.resources[1])",
                "E_PERM_INVALID: manifest.resources[4].id: duplicate id \"ocr-model\" (first used by manifest.resources[1])",
            ]
        );
    }

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
    fn sha256_rules() {
        let upper = HASH.to_uppercase();
        let rule = "must be 64 lowercase hex digits";
        let cases = [
            (
                "ABC".to_string(),
                format!("{rule}, got 3 characters: \"ABC\""),
            ),
            (
                upper.clone(),
                format!("{rule} (write it in lower-case), got \"{upper}\""),
            ),
            (
                HASH[..63].to_string(),
                format!("{rule}, got 63 characters: \"{}\"", &HASH[..63]),
            ),
            (
                format!("{HASH}0"),
                format!("{rule}, got 65 characters: \"{HASH}0\""),
            ),
            (
                format!("{}g", &HASH[..63]),
                format!("{rule}, got \"{}g\"", &HASH[..63]),
            ),
            (String::new(), format!("{rule}, got 0 characters: \"\"")),
            ("a".to_string(), format!("{rule}, got 1 character: \"a\"")),
        ];
        for (value, message) in cases {
            assert_eq!(
                entry_line(entry_with("sha256", json!(value))),
                format!("E_PERM_INVALID: manifest.resources[0].sha256: {message}")
            );
        }
    }

    #[test]
    fn a_key_close_to_a_known_one_gets_a_suggestion() {
        for (key, known) in [
            ("descripton", "description"),
            ("Description", "description"),
            ("SHA256", "sha256"),
            ("sha-256", "sha256"),
            ("mirror", "mirrors"),
            ("urll", "url"),
            ("requierd", "required"),
        ] {
            assert_eq!(
                entry_line(entry_with(key, json!("x"))),
                format!("E_PERM_INVALID: manifest.resources[0]: unknown key \"{key}\" (did you mean `{known}`?)"),
                "{key}"
            );
        }
        for key in ["colour", "checksum", "name", "ab"] {
            assert_eq!(
                entry_line(entry_with(key, json!("x"))),
                format!("E_PERM_INVALID: manifest.resources[0]: unknown key \"{key}\""),
            );
        }
    }

    #[test]
    fn size_forms() {
        let empty = json!({ "id": "a", "url": "https://h/a", "sha256": EMPTY_SHA256, "size": 0 });
        assert_eq!(one_resource(empty).size, 0);
        // A size of 0 with another file's hash can never be met.
        assert!(entry_line(entry_with("size", json!(0))).starts_with(
            "E_PERM_INVALID: manifest.resources[0].size: is 0, but sha256 is not the empty file's"
        ));
        let max: Value = serde_json::from_str("18446744073709551615").unwrap();
        assert_eq!(one_resource(entry_with("size", max)).size, u64::MAX);
        let cases = [
            ("1.5", "1.5"),
            ("-1", "-1"),
            ("1e3", "1000.0"),
            ("\"12\"", "the string \"12\" (remove the quotes)"),
            ("\"twelve\"", "string"),
            ("18446744073709551616", "1.8446744073709552e+19"),
            ("0.0", "0.0"),
            ("-0", "-0.0"),
        ];
        for (text, shown) in cases {
            let value: Value = serde_json::from_str(text).unwrap();
            assert_eq!(
                entry_line(entry_with("size", value)),
                format!("E_PERM_INVALID: manifest.resources[0].size: must be a non-negative integer, got {shown}"),
                "{text}"
            );
        }
    }

    #[test]
    fn size_forms_from_raw_text() {
        let text = format!(
            r#"{{"resources": [{{"id": "a", "url": "https://h/a", "sha256": "{HASH}", "size": 18446744073709551616}}]}}"#
        );
        assert_eq!(
            bytes_lines(text.as_bytes()),
            ["E_PERM_INVALID: manifest.resources[0].size: must be a non-negative integer, got 1.8446744073709552e+19"]
        );
    }

    #[test]
    fn several_errors_in_key_order_and_entry_order() {
        let first = json!({
            "zeta": 1,
            "alpha": 2,
            "description": 3,
            "required": "no",
            "size": -1,
            "sha256": "ABC",
            "mirrors": ["ftp://x/y"],
            "url": "http://cdn.example.com/a.bin",
            "id": ""
        });
        let second = json!({"url": "https://h/a", "sha256": HASH, "size": 1});
        assert_eq!(
            lines(&json!({ "resources": [first, second, 4] })),
            [
                "E_PERM_INVALID: manifest.resources[0]: unknown key \"alpha\"",
                "E_PERM_INVALID: manifest.resources[0]: unknown key \"zeta\"",
                "E_PERM_INVALID: manifest.resources[0].id: must not be empty",
                "E_PERM_INVALID: manifest.resources[0].url: must start with https://, got \"http://cdn.example.com/a.bin\"",
                "E_PERM_INVALID: manifest.resources[0].mirrors[0]: must start with https://, got \"ftp://x/y\"",
                "E_PERM_INVALID: manifest.resources[0].sha256: must be 64 lowercase hex digits, got 3 characters: \"ABC\"",
                "E_PERM_INVALID: manifest.resources[0].size: must be a non-negative integer, got -1",
                "E_PERM_INVALID: manifest.resources[0].required: must be a boolean, got string",
                "E_PERM_INVALID: manifest.resources[0].description: must be a string, got number",
                "E_PERM_INVALID: manifest.resources[1].id: is required",
                "E_PERM_INVALID: manifest.resources[4]: must be an object, got number".replace("[4]", "[2]").as_str(),
            ]
        );
    }

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

    #[test]
    fn parse_https_url_accepts_good_addresses() {
        let url = parse_https_url("https://cdn.example.com:8443/a/b.bin?x=1#f").unwrap();
        assert_eq!(url.host_str(), Some("cdn.example.com"));
        assert_eq!(url.port(), Some(8443));
        assert!(parse_https_url("https://[::1]/a").is_ok());
        assert!(parse_https_url("https://127.0.0.1/a").is_ok());
    }

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
