//! The refusals of the network rules, as error values: an address the
//! guard refused ([`Blocked`]) and a policy that could not be built
//! ([`PolicyError`]). They live here, at the bottom, so that every layer
//! can carry them without depending on the rules themselves.

/// Where a local test origin is let through, as the refusal says.
pub(crate) const ALLOW_ADDRESSES_HINT: &str =
    "for a local test origin, see `[dev] allow_addresses` in README";

/// Why an address is refused: `address` is the host or IP as text, `reason` a
/// short phrase such as "loopback", "private network (10.0.0.0/8)",
/// "link-local", "carrier-grade NAT", "local host name".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{} is a local or internal-network address ({reason}; {ALLOW_ADDRESSES_HINT})",
    crate::error::shorten(address)
)]
pub struct Blocked {
    /// The refused host name or IP address, as text.
    pub address: String,
    /// A short phrase saying which rule refused it.
    pub reason: String,
}

impl Blocked {
    pub(crate) fn new(address: impl Into<String>, reason: &str) -> Self {
        Self {
            address: address.into(),
            reason: reason.to_owned(),
        }
    }
}

/// Why a policy could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A host pattern is not an exact host or a `*.domain` wildcard.
    #[error("invalid host pattern {pattern:?}: {reason}")]
    InvalidPattern {
        /// The pattern as given.
        pattern: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}
