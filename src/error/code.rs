//! The stable error codes, as a type.
//!
//! Each code is written as the same `E_…` text everywhere: in messages, in
//! the JSON of the command line and of failure records, and by
//! [`ErrorCode::as_str`]. A program matches on the enum; a script on the
//! text.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A stable error code. Serialised as its `E_…` text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ErrorCode {
    /// `E_PERM_INVALID`: a manifest or another input is not acceptable.
    #[serde(rename = "E_PERM_INVALID")]
    PermInvalid,
    /// `E_RESOURCE_GEM_ID`: a gem id breaks the naming rules.
    #[serde(rename = "E_RESOURCE_GEM_ID")]
    GemId,
    /// `E_RESOURCE_SCHEME`: not `https://`, or a user name in the address.
    #[serde(rename = "E_RESOURCE_SCHEME")]
    Scheme,
    /// `E_RESOURCE_ADDRESS`: a local or internal-network address.
    #[serde(rename = "E_RESOURCE_ADDRESS")]
    Address,
    /// `E_RESOURCE_POLICY`: the user's network policy refuses the host.
    #[serde(rename = "E_RESOURCE_POLICY")]
    Policy,
    /// `E_RESOURCE_REDIRECTS`: too many redirects.
    #[serde(rename = "E_RESOURCE_REDIRECTS")]
    Redirects,
    /// `E_RESOURCE_HTTP`: an HTTP status other than success.
    #[serde(rename = "E_RESOURCE_HTTP")]
    Http,
    /// `E_RESOURCE_NETWORK`: DNS, connect, TLS, reset, timeout or proxy.
    #[serde(rename = "E_RESOURCE_NETWORK")]
    Network,
    /// `E_RESOURCE_SIZE`: more or fewer bytes than declared.
    #[serde(rename = "E_RESOURCE_SIZE")]
    Size,
    /// `E_RESOURCE_SHA256`: the bytes do not hash to the declared digest.
    #[serde(rename = "E_RESOURCE_SHA256")]
    Sha256,
    /// `E_RESOURCE_UNAVAILABLE`: every address of a resource failed.
    #[serde(rename = "E_RESOURCE_UNAVAILABLE")]
    Unavailable,
    /// `E_RESOURCE_DISK_SPACE`: not enough free space.
    #[serde(rename = "E_RESOURCE_DISK_SPACE")]
    DiskSpace,
    /// `E_RESOURCE_IO`: a local file operation failed.
    #[serde(rename = "E_RESOURCE_IO")]
    Io,
    /// `E_RESOURCE_CONFIG`: the configuration or a policy is invalid.
    #[serde(rename = "E_RESOURCE_CONFIG")]
    Config,
    /// `E_RESOURCE_NOT_FOUND`: no such gem or resource is installed.
    #[serde(rename = "E_RESOURCE_NOT_FOUND")]
    NotFound,
    /// `E_RESOURCE_CANCELLED`: the download was stopped.
    #[serde(rename = "E_RESOURCE_CANCELLED")]
    Cancelled,
    /// `E_RESOURCE_SHUTDOWN`: the service was shut down.
    #[serde(rename = "E_RESOURCE_SHUTDOWN")]
    Shutdown,
    /// `E_RESOURCE_RUNTIME`: the service was opened outside a Tokio runtime.
    #[serde(rename = "E_RESOURCE_RUNTIME")]
    Runtime,
    /// `E_RESOURCE_USAGE`: a command or an API request was malformed
    /// (wrong arguments, unknown method, params it cannot take).
    #[serde(rename = "E_RESOURCE_USAGE")]
    Usage,
    /// `E_RESOURCE_BUSY`: another service already holds the store.
    #[serde(rename = "E_RESOURCE_BUSY")]
    Busy,
    /// `E_RESOURCE_SERVICE`: the service listening on the store could not
    /// be reached, or its answer could not be read.
    #[serde(rename = "E_RESOURCE_SERVICE")]
    Service,
    /// `E_RESOURCE_OWNER`: the gem is kept by another installer, and
    /// installing this manifest would take it from them; nothing changed.
    #[serde(rename = "E_RESOURCE_OWNER")]
    Owner,
}

/// Every code, in the order of [`ErrorCode`]'s variants.
pub const CODES: &[ErrorCode] = &[
    ErrorCode::PermInvalid,
    ErrorCode::GemId,
    ErrorCode::Scheme,
    ErrorCode::Address,
    ErrorCode::Policy,
    ErrorCode::Redirects,
    ErrorCode::Http,
    ErrorCode::Network,
    ErrorCode::Size,
    ErrorCode::Sha256,
    ErrorCode::Unavailable,
    ErrorCode::DiskSpace,
    ErrorCode::Io,
    ErrorCode::Config,
    ErrorCode::NotFound,
    ErrorCode::Cancelled,
    ErrorCode::Shutdown,
    ErrorCode::Runtime,
    ErrorCode::Usage,
    ErrorCode::Busy,
    ErrorCode::Service,
    ErrorCode::Owner,
];

impl ErrorCode {
    /// The code's text, e.g. `E_RESOURCE_POLICY`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::PermInvalid => "E_PERM_INVALID",
            ErrorCode::GemId => "E_RESOURCE_GEM_ID",
            ErrorCode::Scheme => "E_RESOURCE_SCHEME",
            ErrorCode::Address => "E_RESOURCE_ADDRESS",
            ErrorCode::Policy => "E_RESOURCE_POLICY",
            ErrorCode::Redirects => "E_RESOURCE_REDIRECTS",
            ErrorCode::Http => "E_RESOURCE_HTTP",
            ErrorCode::Network => "E_RESOURCE_NETWORK",
            ErrorCode::Size => "E_RESOURCE_SIZE",
            ErrorCode::Sha256 => "E_RESOURCE_SHA256",
            ErrorCode::Unavailable => "E_RESOURCE_UNAVAILABLE",
            ErrorCode::DiskSpace => "E_RESOURCE_DISK_SPACE",
            ErrorCode::Io => "E_RESOURCE_IO",
            ErrorCode::Config => "E_RESOURCE_CONFIG",
            ErrorCode::NotFound => "E_RESOURCE_NOT_FOUND",
            ErrorCode::Cancelled => "E_RESOURCE_CANCELLED",
            ErrorCode::Shutdown => "E_RESOURCE_SHUTDOWN",
            ErrorCode::Runtime => "E_RESOURCE_RUNTIME",
            ErrorCode::Usage => "E_RESOURCE_USAGE",
            ErrorCode::Busy => "E_RESOURCE_BUSY",
            ErrorCode::Service => "E_RESOURCE_SERVICE",
            ErrorCode::Owner => "E_RESOURCE_OWNER",
        }
    }

    /// How specific an address's failure code is about the cause, highest
    /// first; [`crate::Error::primary_cause`] picks the highest among a
    /// failure's attempts. The order, and why:
    ///
    /// 1. `E_RESOURCE_POLICY`: the user's own setting; only the user can
    ///    change it, and the app can say so ("blocked by your network
    ///    policy").
    /// 2. `E_RESOURCE_ADDRESS`: the address is local or internal; never
    ///    fetched, whatever the settings.
    /// 3. `E_RESOURCE_SCHEME`: the manifest declares a refused address.
    /// 4. `E_RESOURCE_SHA256`, then `E_RESOURCE_SIZE`: the server answered
    ///    with the wrong bytes (the gem's manifest or the server is wrong).
    /// 5. `E_RESOURCE_REDIRECTS`, then `E_RESOURCE_HTTP`: the server
    ///    answered, but not with the file.
    /// 6. `E_RESOURCE_NETWORK`: the server could not be reached; often
    ///    passing, and the least telling.
    ///
    /// Codes that never describe one address rank 0.
    pub fn specificity(self) -> u8 {
        match self {
            ErrorCode::Policy => 8,
            ErrorCode::Address => 7,
            ErrorCode::Scheme => 6,
            ErrorCode::Sha256 => 5,
            ErrorCode::Size => 4,
            ErrorCode::Redirects => 3,
            ErrorCode::Http => 2,
            ErrorCode::Network => 1,
            _ => 0,
        }
    }

    /// The most specific of `codes` (the first of equals), if any.
    pub fn most_specific(codes: impl IntoIterator<Item = ErrorCode>) -> Option<ErrorCode> {
        codes
            .into_iter()
            .fold(None, |best: Option<ErrorCode>, code| match best {
                Some(b) if b.specificity() >= code.specificity() => Some(b),
                _ => Some(code),
            })
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The text is not one of [`CODES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown error code {0:?}")]
pub struct UnknownCode(pub String);

impl FromStr for ErrorCode {
    type Err = UnknownCode;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        CODES
            .iter()
            .copied()
            .find(|c| c.as_str() == text)
            .ok_or_else(|| UnknownCode(text.to_string()))
    }
}

impl PartialEq<str> for ErrorCode {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ErrorCode {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_lists_every_code() {
        let readme = include_str!("../../docs/errors.md");
        for code in CODES {
            assert!(
                readme.contains(&format!("`{}`", code.as_str())),
                "docs/errors.md does not list {}",
                code.as_str()
            );
        }
    }

    #[test]
    fn every_code_serialises_as_its_text_and_reads_back() {
        for code in CODES {
            let json = serde_json::to_string(code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), *code);
            assert_eq!(code.as_str().parse::<ErrorCode>().unwrap(), *code);
            assert_eq!(code.to_string(), code.as_str());
        }
        assert!("E_NOPE".parse::<ErrorCode>().is_err());
    }

    #[test]
    fn the_most_specific_code_wins_whatever_the_order() {
        use ErrorCode::*;
        assert_eq!(
            ErrorCode::most_specific([Network, Policy, Http]),
            Some(Policy)
        );
        assert_eq!(ErrorCode::most_specific([Policy, Address]), Some(Policy));
        assert_eq!(ErrorCode::most_specific([Http, Network]), Some(Http));
        assert_eq!(ErrorCode::most_specific([Size, Sha256]), Some(Sha256));
        assert_eq!(ErrorCode::most_specific([]), None);
    }
}
