//! Reading a manifest: the file (regular files only, never more than the
//! size cap), and its bytes as JSON (a UTF-8 byte-order mark skipped, a
//! syntax error said with its most likely cause).

use std::path::Path;

use serde_json::Value;

use super::report::ManifestError;

/// The largest manifest, in bytes, that
/// [`parse_manifest`](super::parse_manifest) accepts.
pub const MAX_MANIFEST_BYTES: usize = 1024 * 1024;

/// Reads a manifest file for [`parse_manifest`](super::parse_manifest)
/// without ever holding more than the cap: the size is checked from the
/// file's metadata first, then at most one byte past [`MAX_MANIFEST_BYTES`]
/// is read (enough for the validator to report a file that grew in
/// between). Anything but a regular file (a folder, a FIFO, a device) is
/// refused without being read.
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

/// Reads a manifest's bytes as JSON, as every reader of a manifest does:
/// at most [`MAX_MANIFEST_BYTES`], a leading UTF-8 byte-order mark
/// (which Windows editors write) skipped as RFC 8259 allows, and a syntax
/// error said with its most likely cause (a comment, a trailing comma).
/// Nothing of the manifest's rules is checked yet:
/// [`validate`](super::validate) does.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::test_entries::*;

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
}
