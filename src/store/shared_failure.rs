//! The last failed download of each SHA-256, for callers in other
//! processes that waited on it (`locks/<sha256>.failed.json`).

use super::Store;
use crate::error::Error;

/// The last failed download of one SHA-256, shared with other processes.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SharedFailure {
    /// When it failed, nanoseconds since the Unix epoch.
    pub at_ns: u128,
    /// The size its manifest declared.
    pub size: u64,
    /// The addresses it tried (url, then mirrors).
    pub addresses: Vec<String>,
    /// Its error code.
    #[serde(skip, default = "unavailable")]
    pub code: crate::error::ErrorCode,
    /// The code as written.
    code_text: String,
    /// Its most specific cause ([`crate::Error::primary_cause`]); its
    /// code in records of earlier versions.
    #[serde(skip, default = "unavailable")]
    pub primary_cause: crate::error::ErrorCode,
    /// The cause as written (empty in records of earlier versions).
    #[serde(default)]
    primary_cause_text: String,
    /// Each address tried, with its code and reason (empty in records of
    /// earlier versions).
    #[serde(default)]
    pub attempts: Vec<crate::error::data::AttemptRecord>,
    /// Its full message.
    pub message: String,
}

impl SharedFailure {
    /// The failure as this process's error: the same code, cause,
    /// attempts and message.
    pub fn to_error(&self) -> Error {
        Error::failed_elsewhere_with(
            self.code,
            self.primary_cause,
            self.attempts.clone(),
            self.message.clone(),
        )
    }
}

impl Store {
    fn failure_name(sha256: &str) -> String {
        format!("{sha256}.failed.json")
    }

    /// Records a failed download of `sha256` declared as `size` bytes (best
    /// effort: only callers waiting in other processes read it). The message
    /// is cut to 16 KiB. Call with a lane of the file held.
    pub fn record_failure(&self, sha256: &str, size: u64, addresses: &[String], error: &Error) {
        let record = SharedFailure {
            at_ns: now_ns(),
            size,
            addresses: addresses.to_vec(),
            code: error.code(),
            code_text: error.code().as_str().to_string(),
            primary_cause: error.primary_cause(),
            primary_cause_text: error.primary_cause().as_str().to_string(),
            attempts: crate::store::registry::FailureRecord::from_error(error).attempts,
            message: crate::error::shorten_to(
                &error.to_string(),
                crate::store::MAX_FAILURE_MESSAGE_CHARS,
            ),
        };
        let Ok(bytes) = serde_json::to_vec(&record) else {
            return;
        };
        // Best effort: only callers waiting in other processes read it,
        // once they hold a lane of the file, so never while it is written
        // (this caller holds one); a torn record (a crash) does not parse
        // and counts as none. Written in place: no temporary file.
        let _ = self
            .locks()
            .write_in_place(&Store::failure_name(sha256), &bytes);
    }

    /// Forgets the failure of `sha256`. Call with a lane of the file held.
    pub fn clear_failure(&self, sha256: &str) {
        let _ = self.locks().remove_file(&Store::failure_name(sha256));
    }

    /// The failure of `sha256` declared as `size` bytes, from the same
    /// `addresses`, recorded at or after `since`, if any: a download that
    /// failed because its manifest declared a wrong size is not the result
    /// of one that declares the right one. Call with a lane of the file held.
    pub fn failure_since(
        &self,
        sha256: &str,
        size: u64,
        addresses: &[String],
        since: std::time::SystemTime,
    ) -> Option<SharedFailure> {
        let bytes = self
            .locks()
            .read_own(&Store::failure_name(sha256), MAX_SHARED_FAILURE_BYTES)
            .ok()?;
        let record = parse_shared_failure(&bytes)?;
        let since_ns = since
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        (record.at_ns >= since_ns && record.size == size && record.addresses == addresses)
            .then_some(record)
    }
}

/// Longest shared failure record read back (its message is cut to 16 KiB
/// characters, which may take 4 bytes each, plus its addresses).
const MAX_SHARED_FAILURE_BYTES: u64 = 1 << 20;

fn unavailable() -> crate::error::ErrorCode {
    crate::error::ErrorCode::Unavailable
}

/// Reads a shared failure record as [`Store::failure_since`] does: `None`
/// unless it parses and carries a known error code. An entry point for the
/// fuzz targets and property tests.
#[doc(hidden)]
pub fn parse_shared_failure(bytes: &[u8]) -> Option<SharedFailure> {
    let mut record: SharedFailure = serde_json::from_slice(bytes).ok()?;
    record.code = record.code_text.parse().ok()?;
    record.primary_cause = record.primary_cause_text.parse().unwrap_or(record.code);
    Some(record)
}

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}
