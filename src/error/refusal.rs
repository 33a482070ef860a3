//! The refusals of the network rules, as error values: an address the
//! guard refused ([`Blocked`]) and a policy that could not be built
//! ([`PolicyError`]). They live here, at the bottom, so that every layer
//! can carry them without depending on the rules themselves.

/// Where a local test origin is let through, as the refusal of an address
/// says.
pub(crate) const ALLOW_ADDRESSES_HINT: &str =
    "for a local test origin, see `[dev] allow_addresses` in docs/configuration.md";

/// The same for a name the by-name rule refuses (`localhost`, `.local`, …):
/// no address range lets a name through, a fixed answer under `[dev]
/// resolve` does (the answer then passes the address rule).
pub(crate) const RESOLVE_HINT: &str = "for a local test origin, give the name a fixed answer under `[dev] resolve` and that address under `[dev] allow_addresses`, see docs/configuration.md";

/// The reasons the by-name rule gives (`LOCAL_SUFFIXES` in `net::guard`
/// names them from here): a name that only ever means a local or private
/// host, refused before any lookup.
pub(crate) const NAME_RULE_REASONS: [&str; 5] = [
    "local host name",
    "multicast DNS name (.local)",
    "private-use domain (.internal)",
    "home network domain (.home.arpa)",
    "local domain (.localdomain)",
];

/// Why an address is refused: `address` is the host or IP as text, `reason` a
/// short phrase such as "loopback", "private network (10.0.0.0/8)",
/// "link-local", "carrier-grade NAT", "local host name".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Blocked {
    /// The refused host name or IP address, as text.
    pub address: String,
    /// A short phrase saying which rule refused it.
    pub reason: String,
}

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let address = crate::error::shorten(&self.address);
        let reason = &self.reason;
        if reason.starts_with("malformed") {
            // Not an address at all: no setting lets it through.
            write!(f, "{address} is refused ({reason})")
        } else {
            let hint = if NAME_RULE_REASONS.contains(&reason.as_str()) {
                RESOLVE_HINT
            } else {
                ALLOW_ADDRESSES_HINT
            };
            write!(
                f,
                "{address} is a local or internal-network address ({reason}; {hint})"
            )
        }
    }
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

#[cfg(test)]
mod tests {
    use super::Blocked;

    #[test]
    fn a_local_address_or_name_points_to_the_settings_that_let_it_through() {
        let local = Blocked::new("127.0.0.1", "loopback").to_string();
        assert!(local.contains("[dev] allow_addresses"), "{local}");
        assert!(!local.contains("[dev] resolve"), "{local}");
        // A name: no address range lets it through, a fixed answer does.
        let name = Blocked::new("localhost", "local host name").to_string();
        assert!(name.contains("`[dev] resolve`"), "{name}");
        assert!(name.contains("`[dev] allow_addresses`"), "{name}");
        let malformed = Blocked::new("999.1.1.1", "malformed host name").to_string();
        assert_eq!(malformed, "999.1.1.1 is refused (malformed host name)");
    }
}
