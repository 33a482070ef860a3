//! Typed errors, each with a stable code.
//!
//! Two layers, as in the download path itself:
//! - [`AttemptError`]: why one address (the url or one mirror) failed. Wrapped
//!   in an [`Attempt`] that names the address and, after redirects, the hop
//!   where it failed.
//! - [`Error`]: what the caller of the library sees. A download that failed on
//!   every address is [`Error::Unavailable`], listing every attempt.
//!
//! Every error has a `code()` ([`ErrorCode`], written as `E_RESOURCE_…` or
//! `E_PERM_INVALID`) that programs and scripts can match on. The `Display`
//! of an [`Error`] is a sentence for people, without the code: it names the
//! resource, the address and the reason, e.g.
//! `resource "model": needs 392.9 MiB but only 1.0 KiB are free in
//! /data/store (after 0 B still to be written by downloads in progress)`.
//! Whoever shows it decides where the code goes (the command line prints
//! `CODE: message`; an app may show the sentence and log the code). The
//! details inside a message keep their own codes: each line of
//! [`Error::Unavailable`]'s list is an [`Attempt`], whose `Display` starts
//! with the attempt's code, as does each line of a [`ManifestError`].
//!
//! [`Error`] is cheap to clone (the one field that is not, an operating
//! system error, is shared behind an [`Arc`]): a download shared by several
//! callers hands each of them the same error, and every public function of
//! the crate returns this one type, so `?` works in an app that uses
//! [`Result`].

mod code;
pub mod data;
mod refusal;

use std::path::PathBuf;
use std::sync::Arc;

use url::Url;

use crate::manifest::ManifestError;

pub use crate::error::code::{ErrorCode, CODES};
pub(crate) use crate::error::refusal::NAME_RULE_REASONS;
pub use crate::error::refusal::{Blocked, PolicyError};

/// Why one address failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AttemptError {
    /// The address (or a redirect) is not `https://`.
    #[error("only https:// is allowed, got {scheme}://")]
    Scheme {
        /// The scheme that was refused.
        scheme: String,
    },
    /// The address (or a redirect) carries a user name or password, which
    /// would be sent as an authorization header and end up in logs.
    #[error("addresses with a user name or password are not allowed")]
    Credentials,
    /// The address names, or resolves to, a local or internal-network address.
    #[error("{0}")]
    Address(#[from] Blocked),
    /// The user's network policy does not permit the host.
    #[error(
        "host {} is not permitted by the network policy ({mode} mode)",
        shorten(host)
    )]
    Policy {
        /// The refused host.
        host: String,
        /// `allowlist` or `blocklist`.
        mode: &'static str,
    },
    /// The server redirected more often than allowed.
    #[error("too many redirects (more than {limit})")]
    Redirects {
        /// The number of redirects that were allowed.
        limit: usize,
    },
    /// The server answered with a status other than 200 (or a redirect).
    #[error("HTTP status {status}{}{}{}", reason_suffix(*.status), retry_after_suffix(*.retry_after), body_suffix(.body.as_deref()))]
    Http {
        /// The status code received.
        status: u16,
        /// The server's `Retry-After`, when it gave a valid one.
        retry_after: Option<std::time::Duration>,
        /// What a `401` or `403` said, when its body was short plain text
        /// or JSON (a gated file, an expired signature): control and
        /// format characters made spaces, at most 200 characters.
        body: Option<String>,
    },
    /// DNS, connect, TLS, reset or timeout.
    #[error("{}", shorten_to(reason, MAX_REASON_CHARS))]
    Network {
        /// What happened, with the underlying cause.
        reason: String,
    },
    /// The server's certificate failed verification (untrusted, expired,
    /// for another name, a refused signature algorithm): another try of
    /// the same address meets the same certificate, so the next address
    /// is tried at once. Its code is `E_RESOURCE_NETWORK`, as for any TLS
    /// failure.
    #[error("{}", shorten_to(reason, MAX_REASON_CHARS))]
    Certificate {
        /// What is wrong with the certificate, in words.
        reason: String,
    },
    /// The address's name does not exist (`NXDOMAIN`) or has no address:
    /// an answer, not an outage, so the next address is tried at once.
    /// Its code is `E_RESOURCE_NETWORK`.
    #[error("{}", shorten_to(reason, MAX_REASON_CHARS))]
    UnknownHost {
        /// What the lookup answered, in words.
        reason: String,
    },
    /// The proxy could not be reached or would not open a tunnel. The
    /// reason names the proxy, never its credentials.
    #[error("{reason}")]
    Proxy {
        /// The proxy's answer to `CONNECT`; `None` when it was not reached.
        status: Option<u16>,
        /// What happened.
        reason: String,
    },
    /// The server sent more or fewer bytes than declared.
    #[error("size mismatch: expected {}, {detail}", byte_count(*expected))]
    Size {
        /// The declared size.
        expected: u64,
        /// What was seen instead.
        detail: String,
    },
    /// The bytes received do not hash to the declared SHA-256.
    #[error("SHA-256 mismatch: expected {expected}, got {actual}")]
    Sha256 {
        /// The declared digest.
        expected: String,
        /// The digest of the bytes received.
        actual: String,
    },
}

fn body_suffix(body: Option<&str>) -> String {
    body.map(|b| format!(": {b}")).unwrap_or_default()
}

fn reason_suffix(status: u16) -> String {
    reqwest::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .map(|r| format!(" {r}"))
        .unwrap_or_default()
}

fn retry_after_suffix(wait: Option<std::time::Duration>) -> String {
    wait.map(|w| format!(" (retry after {}s)", w.as_secs()))
        .unwrap_or_default()
}

impl AttemptError {
    /// The stable error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            AttemptError::Scheme { .. } | AttemptError::Credentials => ErrorCode::Scheme,
            AttemptError::Address(_) => ErrorCode::Address,
            AttemptError::Policy { .. } => ErrorCode::Policy,
            AttemptError::Redirects { .. } => ErrorCode::Redirects,
            AttemptError::Http { .. } => ErrorCode::Http,
            AttemptError::Network { .. }
            | AttemptError::Certificate { .. }
            | AttemptError::UnknownHost { .. }
            | AttemptError::Proxy { .. } => ErrorCode::Network,
            AttemptError::Size { .. } => ErrorCode::Size,
            AttemptError::Sha256 { .. } => ErrorCode::Sha256,
        }
    }
}

/// One failed try of one address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {address}{}: {error}", error.code(), hop_suffix(address, hop.as_ref()))]
pub struct Attempt {
    /// The address tried (the url or a mirror, as declared).
    pub address: Url,
    /// The redirect hop where it failed, when it is not `address` itself.
    pub hop: Option<Url>,
    /// Why it failed.
    pub error: AttemptError,
}

fn hop_suffix(address: &Url, hop: Option<&Url>) -> String {
    match hop {
        Some(hop) if hop != address => format!(" (redirected to {})", shorten(hop.as_str())),
        _ => String::new(),
    }
}

impl Attempt {
    /// The stable error code of this attempt.
    pub fn code(&self) -> ErrorCode {
        self.error.code()
    }
}

/// Everything the library can fail with. Cheap to clone.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The manifest was rejected; nothing of it is used. One line per
    /// problem, `path: message` (the [`ManifestError`] itself keeps the code
    /// on each line).
    #[error("{}", list_problems(.0))]
    Manifest(#[from] ManifestError),
    /// One address checked or fetched on its own (auto-fill, `check-url`):
    /// the address, the hop and the reason (the [`Attempt`] itself keeps its
    /// code in front).
    #[error("{}{}: {}", .0.address, hop_suffix(&.0.address, .0.hop.as_ref()), .0.error)]
    Attempt(Box<Attempt>),
    /// Every address of a resource failed.
    #[error(
        "resource {resource:?}: every address failed{}{}",
        list_attempts(attempts),
        declared_advice(attempts)
    )]
    Unavailable {
        /// The resource id.
        resource: String,
        /// Each address tried, with its own reason, in order.
        attempts: Vec<Attempt>,
    },
    /// Another process sharing the store failed to download the same bytes
    /// from the same addresses while this call waited for it; its error,
    /// as it reported it, is this call's result. Build it with
    /// [`Error::failed_elsewhere`], which drops a leading `E_…: ` that an
    /// earlier version wrote into the message.
    #[error("{message}")]
    FailedElsewhere {
        /// The other download's error code.
        code: ErrorCode,
        /// Its most specific cause (`E_RESOURCE_POLICY` when the policy
        /// refused an address), as it recorded it.
        primary_cause: ErrorCode,
        /// Each address it tried, with its code and reason, as recorded
        /// (empty from a record of an earlier version).
        attempts: Vec<data::AttemptRecord>,
        /// Its full message, with the reason for each address.
        message: String,
    },
    /// Not enough free space for the download; nothing was requested.
    #[error(
        "resource {resource:?}: needs {} but only {} {} free in {} (after {} still to be written by downloads in progress{})",
        human_bytes(*needed),
        human_bytes(*available),
        if *available == 1 { "is" } else { "are" },
        store.display(),
        human_bytes(*reserved),
        match held_by {
            Some(holder) => format!(", most of it reserved by {holder}"),
            None => String::new(),
        }
    )]
    DiskSpace {
        /// The resource id.
        resource: String,
        /// The declared size.
        needed: u64,
        /// Free bytes on the store's file system.
        available: u64,
        /// Bytes other downloads in progress count (see
        /// [`crate::store::lanes`]).
        reserved: u64,
        /// Whose download in progress counts the most, when that stands in
        /// the way (the file alone fits) and its holder said who it is.
        held_by: Option<data::ReservedBy>,
        /// The store folder.
        store: PathBuf,
    },
    /// A write failed because the file system is full (`ENOSPC`) or the
    /// user's quota is used up (`EDQUOT`); its code is
    /// `E_RESOURCE_DISK_SPACE`.
    #[error(
        "{context} {}: no space left ({source}): needs {} more, {} free",
        path.display(),
        human_bytes(*needed),
        human_bytes(*available)
    )]
    DiskFull {
        /// What was being done.
        context: String,
        /// The file being written.
        path: PathBuf,
        /// Bytes still to be written when it failed.
        needed: u64,
        /// Free bytes on the file system when it failed.
        available: u64,
        /// The operating system's error.
        source: Arc<std::io::Error>,
    },
    /// A local file operation failed.
    #[error("{context} {}: {source}", path.display())]
    Io {
        /// What was being done.
        context: String,
        /// The file or folder concerned.
        path: PathBuf,
        /// The operating system's error, shared so that the error clones.
        source: Arc<std::io::Error>,
    },
    /// The configuration (or a network policy built by the app) is invalid.
    #[error("{0}")]
    Config(String),
    /// An input (a SHA-256 in a record, a file to import) is not acceptable.
    #[error("{0}")]
    Invalid(String),
    /// A gem id breaks the rules of
    /// [`check_gem_id`](crate::store::registry::check_gem_id).
    #[error("invalid gem id {id:?}: {reason}")]
    GemId {
        /// The id as given (shortened when long).
        id: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// No such gem or resource is installed.
    #[error("{0}")]
    NotFound(String),
    /// The download was stopped before it finished, by
    /// [`crate::Resources::cancel`] or by an uninstall or upgrade after
    /// which no gem declares the file (`E_RESOURCE_CANCELLED`). A call
    /// waiting for a download that [`crate::Resources::shutdown`] stopped
    /// gets [`Error::Shutdown`] instead; the download module's own
    /// [`crate::download_with`] returns this when its token is cancelled.
    #[error("resource {resource:?}: {reason}")]
    Cancelled {
        /// The resource id.
        resource: String,
        /// Why it was stopped.
        reason: String,
    },
    /// The caller's own wait was cancelled ([`crate::Resources::path_until`],
    /// the local API's `$/cancelRequest`); `download_goes_on` says whether
    /// the download went on for others (another caller waits, or a gem
    /// requires the file) or stopped, its bytes kept for the next call
    /// (`E_RESOURCE_CANCELLED`).
    #[error(
        "resource {resource:?}: the call was cancelled; {}",
        if *download_goes_on {
            "the download goes on (another caller waits for it, or a gem requires the file)"
        } else {
            "the download stopped (no other caller waited for it); its bytes are kept for the next call"
        }
    )]
    CallCancelled {
        /// The resource id.
        resource: String,
        /// Whether the download went on without this caller.
        download_goes_on: bool,
    },
    /// The service was shut down ([`crate::Resources::shutdown`]); it takes
    /// no more calls. Open a new one to continue.
    #[error("the resource service was shut down; open it again to continue")]
    Shutdown,
    /// [`crate::Resources::open`] was called outside a Tokio runtime.
    #[error("the resource service needs a Tokio runtime for its downloads: open it inside one, or pass one with Resources::open_with_handle")]
    NoRuntime,
    /// A [`crate::Blocking`] call was made on a thread of a Tokio runtime
    /// (inside an async task, or a runtime's `block_on` or blocking
    /// thread), where blocking would stall or deadlock the runtime.
    #[error("Blocking::{call} was called on a thread of a Tokio runtime, where waiting would stall it: await Resources::{call} there instead, or call Blocking::{call} from a thread of your own")]
    BlockingInRuntime {
        /// The method called (`path`, `install`, …).
        call: &'static str,
    },
    /// The service listening on the store answered with an error: its code,
    /// cause and message as it sent them ([`data::ErrorData`]).
    #[error("{}", .0.message)]
    Remote(Box<data::ErrorData>),
    /// The service listening on the store could not be reached, or it
    /// answered with something that is not the protocol
    /// (`E_RESOURCE_SERVICE`).
    #[error("the service at {socket}: {reason}")]
    Service {
        /// Its socket.
        socket: String,
        /// What went wrong.
        reason: String,
    },
    /// A call that changes the store was cut off: the service went away
    /// before it answered, so whether it was applied is not known
    /// (`E_RESOURCE_SERVICE`). It is not sent again on its own (see
    /// [`crate::api::election`]); read the state once the next service
    /// runs, and call again if need be.
    #[error("the service at {socket} went away before it answered `{method}` ({reason}); whether it was done is not known: check once the next service runs, and try again if need be")]
    CutOff {
        /// The socket of the service that went away.
        socket: String,
        /// The call cut off.
        method: String,
        /// How it was lost.
        reason: String,
    },
    /// Another service already holds the store (`E_RESOURCE_BUSY`).
    #[error("another service (process {pid}) already holds the store {}; stop it first, or use it through its socket", store.display())]
    Busy {
        /// The store folder.
        store: PathBuf,
        /// The process holding it (0 when it did not say).
        pid: u32,
        /// The socket (or named pipe) its service listens on, when it said.
        socket: Option<String>,
    },
    /// A request the API cannot take (`E_RESOURCE_USAGE`).
    #[error("{0}")]
    Usage(String),
    /// The gem is kept by another installer, and installing this manifest
    /// would change it and take it from them (`E_RESOURCE_OWNER`). Nothing
    /// changed. A manifest like theirs installs, and leaves the gem theirs;
    /// a take-over ([`crate::Resources::install_taking_over`], the command
    /// line's `install --take-over`, the local API's `take_over: true`)
    /// makes it the caller's.
    #[error(
        "gem {gem:?} is kept by {owner}, and this manifest differs from theirs: installing it would take the gem from them; change it where they keep it{}, or take the gem over (`install --take-over`; the local API's `take_over: true`)",
        if owner.starts_with("serve's gems folder ") { " (its folder in the gems folder)" } else { "" }
    )]
    Owned {
        /// The gem.
        gem: String,
        /// Who keeps it, for people (`serve's gems folder /srv/gems`, `the
        /// local API`).
        owner: String,
    },
}

impl From<Attempt> for Error {
    fn from(a: Attempt) -> Self {
        Error::Attempt(Box::new(a))
    }
}

impl From<PolicyError> for Error {
    fn from(e: PolicyError) -> Self {
        Error::Config(format!("network.hosts: {e}"))
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::Config(e.0)
    }
}

/// Why configuration text was refused ([`crate::Config::parse`]): the line
/// and the key, and what is wrong. Converts into [`Error::Config`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl From<String> for ConfigError {
    fn from(message: String) -> Self {
        ConfigError(message)
    }
}

fn list_problems(manifest: &ManifestError) -> String {
    manifest
        .problems
        .iter()
        .map(|p| format!("{}: {}", p.place(manifest.file.as_deref()), p.message))
        .collect::<Vec<_>>()
        .join("\n")
}

fn list_attempts(attempts: &[Attempt]) -> String {
    attempts.iter().map(|a| format!("\n  - {a}")).collect()
}

/// Where the manifest's file goes in the advice of an
/// [`Error::Unavailable`] whose addresses all served the same other bytes
/// than declared: a caller that knows the file (the command line's
/// `install`) puts its name in its place.
pub const MANIFEST_FILE: &str = "<manifest file>";

/// Whether every one of `attempts` refused the bytes for the values the
/// manifest declares, and every address served the same other bytes (the
/// same SHA-256, or the same size): the manifest's values are what is
/// wrong, not an address.
pub fn declared_values_wrong(attempts: &[Attempt]) -> bool {
    let Some(first) = attempts.first() else {
        return false;
    };
    attempts.iter().all(|a| match (&first.error, &a.error) {
        (AttemptError::Sha256 { actual: x, .. }, AttemptError::Sha256 { actual: y, .. }) => x == y,
        (AttemptError::Size { detail: x, .. }, AttemptError::Size { detail: y, .. }) => x == y,
        _ => false,
    })
}

/// The line that says how to correct the manifest, when
/// [`declared_values_wrong`].
fn declared_advice(attempts: &[Attempt]) -> String {
    if !declared_values_wrong(attempts) {
        return String::new();
    }
    let what = match attempts.first().map(|a| &a.error) {
        Some(AttemptError::Size { .. }) => "size",
        _ => "sha256",
    };
    let which = if attempts.len() == 1 {
        format!("its address serves a file whose {what} is not the manifest's")
    } else {
        format!("every address serves the same file, whose {what} is not the manifest's")
    };
    format!(
        "\n  {which} (a wrong value, or the file changed): `gem-resources autofill --manifest {MANIFEST_FILE} --all --write` writes the size and sha256 it serves into the manifest"
    )
}

impl Error {
    /// The stable error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Manifest(_) | Error::Invalid(_) => ErrorCode::PermInvalid,
            Error::Attempt(a) => a.code(),
            Error::Unavailable { .. } => ErrorCode::Unavailable,
            Error::FailedElsewhere { code, .. } => *code,
            Error::DiskSpace { .. } | Error::DiskFull { .. } => ErrorCode::DiskSpace,
            Error::Io { .. } => ErrorCode::Io,
            Error::Config(_) => ErrorCode::Config,
            Error::GemId { .. } => ErrorCode::GemId,
            Error::NotFound(_) => ErrorCode::NotFound,
            Error::Cancelled { .. } | Error::CallCancelled { .. } => ErrorCode::Cancelled,
            Error::Shutdown => ErrorCode::Shutdown,
            Error::NoRuntime => ErrorCode::Runtime,
            Error::BlockingInRuntime { .. } => ErrorCode::Runtime,
            Error::Remote(data) => data.code,
            Error::Service { .. } | Error::CutOff { .. } => ErrorCode::Service,
            Error::Busy { .. } => ErrorCode::Busy,
            Error::Usage(_) => ErrorCode::Usage,
            Error::Owned { .. } => ErrorCode::Owner,
        }
    }

    /// The code that best says why: for [`Error::Unavailable`], the most
    /// specific code among its attempts (see [`ErrorCode::specificity`]),
    /// so that a settings page can say "blocked by your network policy"
    /// rather than "unavailable"; for every other error, [`Error::code`].
    pub fn primary_cause(&self) -> ErrorCode {
        match self {
            Error::Unavailable { attempts, .. } => {
                ErrorCode::most_specific(attempts.iter().map(Attempt::code))
                    .unwrap_or(ErrorCode::Unavailable)
            }
            Error::Remote(data) => data.primary_cause,
            Error::FailedElsewhere { primary_cause, .. } => *primary_cause,
            other => other.code(),
        }
    }

    /// Builds an [`Error::FailedElsewhere`] from another process's record.
    /// A message that starts with its own code (`E_…: `, as earlier
    /// versions wrote it) loses that prefix, so that the message is a
    /// sentence like every other error's and the code is not shown twice.
    pub fn failed_elsewhere(code: ErrorCode, message: String) -> Self {
        Error::failed_elsewhere_with(code, code, Vec::new(), message)
    }

    /// [`Error::failed_elsewhere`] with the record's most specific cause
    /// and its attempts, so that this process records and reports the
    /// failure as the one that saw it did.
    pub fn failed_elsewhere_with(
        code: ErrorCode,
        primary_cause: ErrorCode,
        attempts: Vec<data::AttemptRecord>,
        message: String,
    ) -> Self {
        let message = message
            .strip_prefix(code.as_str())
            .and_then(|rest| rest.strip_prefix(": "))
            .map(str::to_string)
            .unwrap_or(message);
        Error::FailedElsewhere {
            code,
            primary_cause,
            attempts,
            message,
        }
    }

    /// Builds an [`Error::Io`].
    pub fn io(
        context: impl Into<String>,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Error::Io {
            context: context.into(),
            path: path.into(),
            source: Arc::new(source),
        }
    }
}

/// The most characters [`shorten`] keeps of a text taken from a server.
const MAX_SERVER_TEXT_CHARS: usize = 256;

/// The most characters a network failure's reason keeps: it may quote a
/// server's URL inside an error chain, so it gets a cap of its own.
pub(crate) const MAX_REASON_CHARS: usize = 1024;

/// Cuts a text taken from a server (a redirect's Location, a hop's URL or
/// host) to about 256 characters, so that a hostile server cannot blow up a
/// message or a failure record. A cut text ends with `…` and the original
/// length, e.g. `https://evil.test/aaaa… (204800 characters)`.
pub(crate) fn shorten(text: &str) -> String {
    shorten_to(text, MAX_SERVER_TEXT_CHARS)
}

/// [`shorten`] with an explicit limit, in characters.
pub(crate) fn shorten_to(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        None => text.to_string(),
        Some((cut, _)) => format!("{}… ({} characters)", &text[..cut], text.chars().count()),
    }
}

/// Whether `e` says the file system is full or the quota used up (the
/// standard library maps `ENOSPC`/`EDQUOT` and their Windows equivalents to
/// these kinds).
pub(crate) fn is_disk_full(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

/// A byte count for people, in binary units: `512 B`, `1.2 GiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A byte count in a message: exact, and for people as well from 1 KiB
/// on (`9027584 bytes (8.6 MiB)`), so that it can be compared with the
/// sizes shown beside it.
pub(crate) fn byte_count(n: u64) -> String {
    if n < 1024 {
        format!("{n} bytes")
    } else {
        format!("{n} bytes ({})", human_bytes(n))
    }
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    #[test]
    fn a_byte_count_is_exact_and_for_people_too() {
        assert_eq!(byte_count(512), "512 bytes");
        assert_eq!(byte_count(9_027_584), "9027584 bytes (8.6 MiB)");
        let e = AttemptError::Size {
            expected: 67_108_864,
            detail: format!("received more than {}", byte_count(3_915_776)),
        };
        assert_eq!(
            e.to_string(),
            "size mismatch: expected 67108864 bytes (64.0 MiB), received more than 3915776 bytes (3.7 MiB)"
        );
    }

    use super::*;

    #[test]
    fn shorten_keeps_short_text_and_cuts_long_text_at_a_char_boundary() {
        assert_eq!(shorten("https://a.test/x"), "https://a.test/x");
        let exact = "a".repeat(256);
        assert_eq!(shorten(&exact), exact);
        let long = "é".repeat(300);
        let cut = shorten(&long);
        assert_eq!(cut, format!("{}… (300 characters)", "é".repeat(256)));
    }

    fn attempt(error: AttemptError) -> Attempt {
        Attempt {
            address: Url::parse("https://cdn.test/m.bin").unwrap(),
            hop: Some(Url::parse("https://other.test/m.bin").unwrap()),
            error,
        }
    }

    #[test]
    fn no_error_displays_its_code_in_front() {
        let gone = attempt(AttemptError::Http {
            status: 404,
            retry_after: None,
            body: None,
        });
        let manifest = ManifestError::new(vec![crate::manifest::Problem {
            path: "manifest.resources[0].url".to_string(),
            message: "must start with https://".to_string(),
        }]);
        let errors = [
            Error::Manifest(manifest),
            Error::from(gone.clone()),
            Error::Unavailable {
                resource: "m".to_string(),
                attempts: vec![gone.clone()],
            },
            Error::failed_elsewhere(ErrorCode::Http, "elsewhere".to_string()),
            Error::DiskSpace {
                resource: "m".to_string(),
                needed: 10,
                available: 1,
                reserved: 0,
                held_by: None,
                store: PathBuf::from("/store"),
            },
            Error::io("cannot read", "/store/x", std::io::Error::other("gone")),
            Error::Config("network.mode: bad".to_string()),
            Error::Invalid("not a SHA-256".to_string()),
            Error::GemId {
                id: "../x".to_string(),
                reason: "must start with a letter or a digit",
            },
            Error::NotFound("gem \"g\" is not installed".to_string()),
            Error::Cancelled {
                resource: "m".to_string(),
                reason: "uninstalled".to_string(),
            },
            Error::Shutdown,
            Error::NoRuntime,
            Error::BlockingInRuntime { call: "path" },
        ];
        for err in &errors {
            let text = err.to_string();
            assert!(!text.starts_with("E_"), "{text}");
            assert!(!text.contains(&format!("{}:", err.code())), "{text}");
        }
        assert_eq!(
            errors[0].to_string(),
            "manifest.resources[0].url: must start with https://"
        );
        assert_eq!(
            errors[1].to_string(),
            "https://cdn.test/m.bin (redirected to https://other.test/m.bin): HTTP status 404 Not Found"
        );
        // The attempts listed are details and keep their codes.
        assert_eq!(
            errors[2].to_string(),
            format!("resource \"m\": every address failed\n  - {gone}")
        );
        assert!(gone.to_string().starts_with("E_RESOURCE_HTTP: "));
    }

    #[test]
    fn byte_counts_read_in_binary_units() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1024), "1.0 KiB");
        assert_eq!(human_bytes(1_288_490_188), "1.2 GiB");
        assert_eq!(human_bytes(u64::MAX), "16384.0 PiB");
    }

    #[test]
    fn a_failure_shared_by_another_process_loses_its_code_in_front() {
        let old = Error::failed_elsewhere(
            ErrorCode::Unavailable,
            "E_RESOURCE_UNAVAILABLE: resource \"m\": every address failed".to_string(),
        );
        assert_eq!(old.to_string(), "resource \"m\": every address failed");
        assert_eq!(old.code(), ErrorCode::Unavailable);
        let new = Error::failed_elsewhere(ErrorCode::Io, "cannot write /x: full".to_string());
        assert_eq!(new.to_string(), "cannot write /x: full");
        // Only its own code is taken off, and only in front.
        let other = Error::failed_elsewhere(ErrorCode::Io, "E_RESOURCE_HTTP: x".to_string());
        assert_eq!(other.to_string(), "E_RESOURCE_HTTP: x");
    }

    #[test]
    fn an_attempt_names_a_long_redirect_target_shortened() {
        let long = format!("https://evil.test/{}", "a".repeat(200_000));
        let attempt = Attempt {
            address: Url::parse("https://cdn.test/m.bin").unwrap(),
            hop: Some(Url::parse(&long).unwrap()),
            error: AttemptError::Network {
                reason: format!("error sending request for url ({long})"),
            },
        };
        let text = attempt.to_string();
        assert!(text.len() < 2000, "{} bytes", text.len());
        assert!(
            text.contains("(redirected to https://evil.test/aaa"),
            "{text}"
        );
        assert!(text.contains("(200018 characters)"), "{text}");
        let policy = AttemptError::Policy {
            host: "x".repeat(10_000),
            mode: "allowlist",
        };
        assert!(policy.to_string().len() < 400);
    }
}
