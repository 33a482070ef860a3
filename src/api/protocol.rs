//! The local API's messages, defined once: the server answers with them,
//! the command line prints the same types with `--json`, and the client
//! reads them back. `PROTOCOL.md` describes them for other languages.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

pub use crate::error::data::{attempt_json, ErrorData};
use crate::error::{Error, ErrorCode};
use crate::net::policy::{Mode, Policy};
pub use crate::service::autofill::Autofilled;
use crate::service::GemStatus;

/// The protocol's version, answered by `hello`. A change that an old
/// client cannot read gets a new number.
pub const PROTOCOL: u32 = 1;

/// Longest request line the server reads (1 MiB, its `\n` excluded).
pub const MAX_LINE: usize = 1 << 20;

/// Connections a service accepts at most. Where the process may open
/// fewer files, fewer: the limit less [`RESERVED_DESCRIPTORS`] (the
/// service raises its soft limit to the hard one first). At the cap, the
/// connection idle the longest (no request in flight, no subscription) is
/// closed to make room; when none is idle within a few seconds (every one
/// has a request in flight), the new one is closed, and so are the next
/// ones at once while none is idle.
pub const MAX_CONNECTIONS: usize = 2048;

/// Open files kept for the store, the downloads and the configuration
/// when the cap of connections comes from the process's limit.
pub const RESERVED_DESCRIPTORS: u64 = 512;

/// Connections one client process (by its pid: `SO_PEERCRED` on Linux,
/// `LOCAL_PEERPID` on macOS, the pipe's client process on Windows) may
/// hold at once. At the cap, that process's connection idle the longest
/// is closed to make room (else the one that only holds subscriptions the
/// longest); when every one has a request in flight, the new one is
/// closed at once. Other processes always get in.
pub const MAX_CONNECTIONS_PER_PEER: usize = 256;

/// Subscriptions one connection may hold at once; one more is refused.
pub const MAX_SUBSCRIPTIONS: usize = 16;

/// Subscriptions one client process may hold over all its connections:
/// one more ends that process's oldest with a `lagged` notification.
pub const MAX_SUBSCRIPTIONS_PER_PEER: usize = 256;

/// Subscriptions the service holds for all its clients together: one
/// more ends the oldest with a `lagged` notification.
pub const MAX_SUBSCRIPTIONS_TOTAL: usize = 1024;

/// Messages queued for one connection before its subscriptions are
/// dropped with a `lagged` notification.
pub const CONNECTION_QUEUE: usize = 1024;

/// Bytes queued for one connection: past them its subscriptions are
/// dropped with `lagged`, and answers wait for the client to read.
pub const CONNECTION_QUEUE_BYTES: usize = 8 << 20;

/// Requests of one connection in flight at once, counted from when the
/// line is read until the answer is written to the socket (not merely
/// built): a batch counts as its number of requests. More wait (and the
/// connection reads no further line) until the client reads its answers,
/// so a client that does not read holds at most this many answers.
pub const MAX_IN_FLIGHT: usize = 64;

/// Requests of one client process in flight at once over all its
/// connections, counted as [`MAX_IN_FLIGHT`] is; `hello` is not counted.
pub const MAX_IN_FLIGHT_PER_PEER: usize = 256;

/// Bytes of request lines that all connections together may hold at once,
/// from their first byte until their answer is queued: a connection past
/// it waits (and its partial line's deadline runs).
pub const REQUEST_BYTES: usize = 64 << 20;

/// How long a request line may take once its first byte arrived: a
/// connection holding a partial line longer is closed.
pub const LINE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a new connection may stay silent before its first request:
/// then it is closed.
pub const FIRST_LINE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// How long writing to a client may make no progress: then the
/// connection is closed (a client that never reads).
pub const WRITE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Longest string `id` of a request; an `id` is a string, a number or
/// `null`.
pub const MAX_ID_CHARS: usize = 256;

/// JSON-RPC's code for a line that is not JSON.
pub const PARSE_ERROR: i64 = -32700;
/// JSON-RPC's code for JSON that is not a request.
pub const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC's code for an unknown method.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC's code for params a method cannot take.
pub const INVALID_PARAMS: i64 = -32602;
/// The code of every error of the library; `data` carries it.
pub const SERVICE_ERROR: i64 = -32000;
/// The code of a request cancelled by `$/cancelRequest` (LSP's
/// `RequestCancelled`); `data` carries `E_RESOURCE_CANCELLED` and whether
/// the download goes on.
pub const REQUEST_CANCELLED: i64 = -32800;

/// A request as read from a line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    /// Always `"2.0"`.
    pub jsonrpc: String,
    /// The caller's id for the answer; absent for a notification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Value>,
    /// The method.
    pub method: String,
    /// Its params (an object), when it takes any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
}

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcError {
    /// The JSON-RPC code (`-32000` for the library's errors).
    pub code: i64,
    /// The message, for people.
    pub message: String,
    /// The library's error: [`ErrorData`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<ErrorData>,
}

impl RpcError {
    /// A protocol error (parse, request, method, params), its `data`
    /// carrying `E_RESOURCE_USAGE`.
    pub fn usage(code: i64, message: impl Into<String>) -> RpcError {
        let message = message.into();
        RpcError {
            code,
            data: Some(ErrorData {
                code: ErrorCode::Usage,
                primary_cause: ErrorCode::Usage,
                message: message.clone(),
                details: Map::new(),
            }),
            message,
        }
    }

    /// The library's `error`.
    pub fn of(error: &Error) -> RpcError {
        let data = ErrorData::of(error);
        let code = match error {
            Error::CallCancelled { .. } => REQUEST_CANCELLED,
            _ => SERVICE_ERROR,
        };
        RpcError {
            code,
            message: data.message.clone(),
            data: Some(data),
        }
    }

    /// This error as the library's [`Error`] (a client's view).
    pub fn into_error(self) -> Error {
        match self.data {
            Some(data) => Error::Remote(Box::new(data)),
            None => Error::Remote(Box::new(ErrorData {
                code: ErrorCode::Service,
                primary_cause: ErrorCode::Service,
                message: self.message,
                details: Map::new(),
            })),
        }
    }
}

/// A request's answer, as one line.
pub fn answer(id: Value, outcome: Result<Value, RpcError>) -> Value {
    match outcome {
        Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
        Err(error) => json!({ "jsonrpc": "2.0", "id": id, "error": error }),
    }
}

/// A notification from the server (`event`, `lagged`).
pub fn notification(method: &str, params: Value) -> Value {
    json!({ "jsonrpc": "2.0", "method": method, "params": params })
}

/// `hello`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// [`PROTOCOL`].
    pub protocol: u32,
    /// The crate's version.
    pub version: String,
    /// The store folder.
    pub store: PathBuf,
    /// The service's process.
    pub pid: u32,
    /// With a `nonce` in the request: HMAC-SHA256 of it, keyed with the
    /// secret of `service.json` (see [`crate::api::discovery::proof`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<String>,
}

/// Where a service listens on a store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceInfo {
    /// The socket (or named pipe).
    pub socket: String,
    /// The service's process.
    pub pid: u32,
}

/// `status`'s answer, and `status --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusResult {
    /// Every installed gem (or the one asked for).
    pub gems: Vec<GemStatus>,
    /// Stored and partial files no installed gem declares.
    pub undeclared_files: usize,
    /// The bytes they hold.
    pub undeclared_bytes: u64,
    /// The service listening on the store, `null` when none is.
    pub service: Option<ServiceInfo>,
    /// The store folder that was read (the one holding `store-v1`), so a
    /// reader sees which store a `--store` or a configuration named.
    /// Empty from a service older than this field.
    #[serde(default)]
    pub store: PathBuf,
}

/// `path`'s answer, and `path --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathResult {
    /// The gem.
    pub gem: String,
    /// The resource id.
    pub resource: String,
    /// The local path.
    pub path: PathBuf,
}

/// `uninstall`'s answer, and `uninstall --json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UninstallResult {
    /// The gem.
    pub gem: String,
    /// Whether it was installed (nothing was done when not).
    pub installed: bool,
    /// SHA-256s of files deleted.
    pub deleted: Vec<String>,
    /// SHA-256s kept because another installed gem declares them.
    pub kept: Vec<String>,
}

/// The answer of `download_now`, `cancel` and `retry`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Changed {
    /// Whether anything was started or stopped.
    pub changed: bool,
}

/// `policy`'s answer, and `set_policy`'s params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyBody {
    /// `allowlist` or `blocklist`.
    pub mode: Mode,
    /// The host patterns, as given.
    pub hosts: Vec<String>,
}

impl From<&Policy> for PolicyBody {
    fn from(p: &Policy) -> Self {
        PolicyBody {
            mode: p.mode(),
            hosts: p.hosts().to_vec(),
        }
    }
}

/// `subscribe`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscribed {
    /// This subscription's number on its connection.
    pub subscription: u64,
    /// The status taken after subscribing: every later change arrives as
    /// an event.
    pub status: Vec<GemStatus>,
}

/// Params naming a gem's resource.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResourceParams {
    /// The gem.
    pub gem: String,
    /// The resource id.
    pub id: String,
    /// With `path`: a token (a string or a number, as an `id`) under which
    /// the call's own events come as `$/progress` notifications while it
    /// waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Value>,
}

/// Params naming a gem, or none.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GemParams {
    /// The gem.
    #[serde(default)]
    pub gem: Option<String>,
}

/// `install`'s params.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InstallParams {
    /// The gem.
    pub gem: String,
    /// The manifest, as a JSON object.
    pub manifest: Value,
    /// Who installs it, as the registration keeps it: `"api"` (the
    /// default) or `"cli"` (the command line, through the service). A
    /// client can never claim a gems folder: only `serve` records those.
    #[serde(default)]
    pub installed_by: Option<String>,
    /// Take the gem over from whoever keeps it (`installed_by` becomes
    /// this caller's even when another installer keeps it). Without it,
    /// an unchanged manifest of someone else's gem leaves it theirs, and
    /// a changed one is refused with `E_RESOURCE_OWNER`.
    #[serde(default)]
    pub take_over: bool,
}

/// `autofill`'s params: a url, or a manifest.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AutofillParams {
    /// One address.
    #[serde(default)]
    pub url: Option<String>,
    /// A manifest, as a JSON object.
    #[serde(default)]
    pub manifest: Option<Value>,
    /// With a manifest: every resource, not only those lacking a value.
    #[serde(default)]
    pub all: bool,
    /// With a manifest: read each resource only until an address answers,
    /// without checking the mirrors.
    #[serde(default)]
    pub url_only: bool,
    /// A token (a string or a number, as an `id`) under which the call's
    /// progress comes as `$/progress` notifications, each value an
    /// [`crate::service::autofill::AutofillProgress`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Value>,
}

/// `unsubscribe`'s params.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UnsubscribeParams {
    /// One subscription; every one of the connection when absent.
    #[serde(default)]
    pub subscription: Option<u64>,
}
