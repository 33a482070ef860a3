//! An error as data: what the local API's error objects and the command
//! line's `--json` errors carry.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::error::{Attempt, Error, ErrorCode};

/// An error as the API and `--json` give it: the code, the most specific
/// cause, the message, and what else the error knows (`resource`,
/// `attempts`, `needed_bytes`, `problems`, …).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorData {
    /// The error code.
    pub code: ErrorCode,
    /// The most specific code among its causes ([`Error::primary_cause`]).
    pub primary_cause: ErrorCode,
    /// The full message, never cut.
    pub message: String,
    /// The rest, by name.
    #[serde(flatten)]
    pub details: Map<String, Value>,
}

/// One address of a failure, as a record keeps it: what another process
/// reads back of a download that failed there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// The address tried.
    pub address: String,
    /// The error code.
    pub code: ErrorCode,
    /// Why it failed.
    pub reason: String,
}

impl ErrorData {
    /// What `error` says, as data.
    pub fn of(error: &Error) -> ErrorData {
        let mut details = Map::new();
        match error {
            Error::Remote(data) => return (**data).clone(),
            Error::Unavailable { resource, attempts } => {
                details.insert("resource".into(), json!(resource));
                details.insert(
                    "attempts".into(),
                    attempts.iter().map(attempt_json).collect(),
                );
            }
            Error::Attempt(a) => {
                details.insert("attempts".into(), json!([attempt_json(a)]));
            }
            Error::FailedElsewhere { attempts, .. } if !attempts.is_empty() => {
                details.insert("attempts".into(), json!(attempts));
            }
            Error::CallCancelled {
                resource,
                download_goes_on,
            } => {
                details.insert("resource".into(), json!(resource));
                let download = if *download_goes_on {
                    "continues"
                } else {
                    "stopped"
                };
                details.insert("download".into(), json!(download));
            }
            Error::DiskSpace {
                needed,
                available,
                reserved,
                held_by,
                ..
            } => {
                // The message says them in human units; here, in bytes.
                details.insert("needed_bytes".into(), json!(needed));
                details.insert("free_bytes".into(), json!(available));
                details.insert("reserved_bytes".into(), json!(reserved));
                if let Some(holder) = held_by {
                    holder.insert_into(&mut details);
                }
            }
            Error::Busy { pid, socket, .. } => {
                // Who holds the store, for a program to connect to it.
                details.insert("pid".into(), json!(pid));
                details.insert("socket".into(), json!(socket));
            }
            Error::Manifest(m) => {
                let problems = m
                    .problems
                    .iter()
                    .map(|p| match &m.file {
                        Some(file) => json!({ "file": file, "path": p.path, "message": p.message }),
                        None => json!({ "path": p.path, "message": p.message }),
                    })
                    .collect();
                details.insert("problems".into(), problems);
            }
            _ => {}
        }
        ErrorData {
            code: error.code(),
            primary_cause: error.primary_cause(),
            message: error.to_string(),
            details,
        }
    }
}

/// Whose download in progress holds most of the disk space a refused
/// download needed ([`Error::DiskSpace`]): what the holder of its lane said
/// about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReservedBy {
    /// A download for a gem (the service's, or `path`, `sync` or
    /// `install` working in their own process).
    Gem {
        /// The gem's id.
        gem: String,
        /// The process downloading, when its description says it.
        pid: Option<u32>,
    },
    /// A download for no gem: `fetch`, or a program calling
    /// [`crate::download()`].
    Fetch {
        /// The process downloading, when its description says it (a
        /// description written by an earlier version does not).
        pid: Option<u32>,
    },
}

impl ReservedBy {
    /// `reserved_by` of a download for no gem: `<` and `>` are in no gem
    /// id, so it never names a gem.
    pub const FETCH: &'static str = "<fetch>";

    /// Adds `reserved_by` (the gem's id, or [`ReservedBy::FETCH`]),
    /// `reserved_by_kind` (`"gem"` or `"fetch"`) and `reserved_by_pid`
    /// (when known) to an error's details.
    fn insert_into(&self, details: &mut Map<String, Value>) {
        let (by, kind, pid) = match self {
            ReservedBy::Gem { gem, pid } => (gem.as_str(), "gem", pid),
            ReservedBy::Fetch { pid } => (Self::FETCH, "fetch", pid),
        };
        details.insert("reserved_by".into(), json!(by));
        details.insert("reserved_by_kind".into(), json!(kind));
        if let Some(pid) = pid {
            details.insert("reserved_by_pid".into(), json!(pid));
        }
    }
}

impl std::fmt::Display for ReservedBy {
    /// `gem "ocr"`, `a fetch in process 1234`, `a fetch`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReservedBy::Gem { gem, .. } => write!(f, "gem {gem:?}"),
            ReservedBy::Fetch { pid: Some(pid) } => write!(f, "a fetch in process {pid}"),
            ReservedBy::Fetch { pid: None } => f.write_str("a fetch"),
        }
    }
}

/// One address's failure as JSON: `address`, `hop`, `code`, `reason`.
pub fn attempt_json(a: &Attempt) -> Value {
    json!({
        "address": a.address.as_str(),
        "hop": a.hop.as_ref().map(|h| h.as_str()),
        "code": a.code(),
        "reason": a.error.to_string(),
    })
}
