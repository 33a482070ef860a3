//! Typed errors, each with a stable code.
//!
//! Two layers, as in the download path itself:
//! - [`AttemptError`]: why one address (the url or one mirror) failed. Wrapped
//!   in an [`Attempt`] that names the address and, after redirects, the hop
//!   where it failed.
//! - [`Error`]: what the caller of the library sees. A download that failed on
//!   every address is [`Error::Unavailable`], listing every attempt.
//!
//! Every error has a `code()` (`E_RESOURCE_…`, `E_PERM_INVALID`) that scripts
//! can match on; the `Display` text names the resource, the address and the
//! reason.

use std::path::PathBuf;

use url::Url;

use crate::guard::Blocked;
use crate::manifest::ManifestError;

/// Why one address failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
    #[error("HTTP status {status}{}{}", reason_suffix(*.status), retry_after_suffix(*.retry_after))]
    Http {
        /// The status code received.
        status: u16,
        /// The server's `Retry-After`, when it gave a valid one.
        retry_after: Option<std::time::Duration>,
    },
    /// DNS, connect, TLS, reset or timeout.
    #[error("{}", shorten_to(reason, MAX_REASON_CHARS))]
    Network {
        /// What happened, with the underlying cause.
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
    #[error("size mismatch: expected {expected} bytes, {detail}")]
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
    pub fn code(&self) -> &'static str {
        match self {
            AttemptError::Scheme { .. } | AttemptError::Credentials => "E_RESOURCE_SCHEME",
            AttemptError::Address(_) => "E_RESOURCE_ADDRESS",
            AttemptError::Policy { .. } => "E_RESOURCE_POLICY",
            AttemptError::Redirects { .. } => "E_RESOURCE_REDIRECTS",
            AttemptError::Http { .. } => "E_RESOURCE_HTTP",
            AttemptError::Network { .. } | AttemptError::Proxy { .. } => "E_RESOURCE_NETWORK",
            AttemptError::Size { .. } => "E_RESOURCE_SIZE",
            AttemptError::Sha256 { .. } => "E_RESOURCE_SHA256",
        }
    }

    /// Whether trying the same address again later may succeed
    /// (decided in [`crate::retry`]).
    pub fn is_transient(&self) -> bool {
        crate::retry::is_transient(self)
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
    pub fn code(&self) -> &'static str {
        self.error.code()
    }
}

/// Everything the library can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The manifest was rejected; nothing of it is used.
    #[error("{0}")]
    Manifest(#[from] ManifestError),
    /// One address checked or fetched on its own (auto-fill, `check-url`).
    #[error("{0}")]
    Attempt(Box<Attempt>),
    /// Every address of a resource failed.
    #[error(
        "{}: resource {resource:?}: every address failed{}",
        "E_RESOURCE_UNAVAILABLE",
        list_attempts(attempts)
    )]
    Unavailable {
        /// The resource id.
        resource: String,
        /// Each address tried, with its own reason, in order.
        attempts: Vec<Attempt>,
    },
    /// Another process sharing the store failed to download the same bytes
    /// from the same addresses while this call waited for it; its error,
    /// as it reported it, is this call's result.
    #[error("{message}")]
    FailedElsewhere {
        /// The other download's error code.
        code: &'static str,
        /// Its full message, with the reason for each address.
        message: String,
    },
    /// Not enough free space for the download; nothing was requested.
    #[error(
        "E_RESOURCE_DISK_SPACE: resource {resource:?}: needs {needed} bytes but only {available} bytes are free in {} (after {reserved} bytes still to be written by downloads in progress)",
        store.display()
    )]
    DiskSpace {
        /// The resource id.
        resource: String,
        /// The declared size.
        needed: u64,
        /// Free bytes on the store's file system.
        available: u64,
        /// Bytes other downloads in progress will still write.
        reserved: u64,
        /// The store folder.
        store: PathBuf,
    },
    /// A local file operation failed.
    #[error("E_RESOURCE_IO: {context} {}: {source}", path.display())]
    Io {
        /// What was being done.
        context: String,
        /// The file or folder concerned.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The configuration is invalid.
    #[error("E_RESOURCE_CONFIG: {0}")]
    Config(String),
    /// An input (a gem id, a SHA-256 in a record) is not acceptable.
    #[error("E_PERM_INVALID: {0}")]
    Invalid(String),
    /// No such gem or resource is installed.
    #[error("E_RESOURCE_NOT_FOUND: {0}")]
    NotFound(String),
    /// The download was stopped (uninstall or shutdown).
    #[error("E_RESOURCE_CANCELLED: resource {resource:?}: {reason}")]
    Cancelled {
        /// The resource id.
        resource: String,
        /// Why it was stopped.
        reason: String,
    },
}

impl From<Attempt> for Error {
    fn from(a: Attempt) -> Self {
        Error::Attempt(Box::new(a))
    }
}

fn list_attempts(attempts: &[Attempt]) -> String {
    attempts.iter().map(|a| format!("\n  - {a}")).collect()
}

impl Error {
    /// The stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Manifest(e) => e.code(),
            Error::Attempt(a) => a.code(),
            Error::Unavailable { .. } => "E_RESOURCE_UNAVAILABLE",
            Error::FailedElsewhere { code, .. } => code,
            Error::DiskSpace { .. } => "E_RESOURCE_DISK_SPACE",
            Error::Io { .. } => "E_RESOURCE_IO",
            Error::Config(_) => "E_RESOURCE_CONFIG",
            Error::Invalid(_) => "E_PERM_INVALID",
            Error::NotFound(_) => "E_RESOURCE_NOT_FOUND",
            Error::Cancelled { .. } => "E_RESOURCE_CANCELLED",
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
            source,
        }
    }
}

/// Every code [`Error::code`] can return, for reading one back from disk.
pub const CODES: &[&str] = &[
    "E_PERM_INVALID",
    "E_RESOURCE_SCHEME",
    "E_RESOURCE_ADDRESS",
    "E_RESOURCE_POLICY",
    "E_RESOURCE_REDIRECTS",
    "E_RESOURCE_HTTP",
    "E_RESOURCE_NETWORK",
    "E_RESOURCE_SIZE",
    "E_RESOURCE_SHA256",
    "E_RESOURCE_UNAVAILABLE",
    "E_RESOURCE_DISK_SPACE",
    "E_RESOURCE_IO",
    "E_RESOURCE_CONFIG",
    "E_RESOURCE_NOT_FOUND",
    "E_RESOURCE_CANCELLED",
];

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

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
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
